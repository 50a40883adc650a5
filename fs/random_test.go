package fs_test

import (
	"fmt"
	"io/fs"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// TestRandomOperations applies the same random operations to a native
// directory and to a nested branch whose base holds the same tree, and
// requires the same answer from every operation and the same tree after
// every round; then it commits both levels and requires the base to equal
// the native directory. Most operations land on files and directories that
// exist only in the base, so copy-up, tombstones, opaque directories and
// renames of base directories are all exercised; every file is read
// through passthrough (newMount passes every file through), also while it
// is linked, copied up or renamed over.
func TestRandomOperations(t *testing.T) {
	for seed := int64(1); seed <= randomSeeds; seed++ {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			m, native, inner := randomSetup(t, seed, 0)
			if diff := randomRounds(seed, native, inner); diff != "" {
				t.Fatal(diff)
			}
			randomCommit(t, m, native, inner)
		})
	}
}

// TestRandomOperationsUnprivileged is TestRandomOperations with the
// operations made by an ordinary user (randomUID, through setpriv) in a
// tree it mostly owns, beside files of root's, some of them private, in
// directories anyone may write: the mount is root's, with passthrough.
func TestRandomOperationsUnprivileged(t *testing.T) {
	for seed := int64(1); seed <= (randomSeeds+1)/2; seed++ {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			m, native, inner := randomSetup(t, seed, randomUID)
			cmd := exec.Command("setpriv", "--reuid="+strconv.Itoa(randomUID), "--regid="+strconv.Itoa(randomUID),
				"--clear-groups", "--", helper)
			cmd.Env = append(os.Environ(), fmt.Sprintf("BRANCHFS_RANDOM=%d\x1f%s\x1f%s", seed, native, inner))
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("operations as uid %d: %v\n%s", randomUID, err, out)
			}
			randomCommit(t, m, native, inner)
		})
	}
}

// randomUID is the ordinary user of TestRandomOperationsUnprivileged.
const randomUID = 1000

// randomHelper runs randomRounds and exits, when this binary was started
// as the helper process of TestRandomOperationsUnprivileged.
func randomHelper() {
	spec := os.Getenv("BRANCHFS_RANDOM")
	if spec == "" {
		return
	}
	f := strings.Split(spec, "\x1f")
	seed, _ := strconv.ParseInt(f[0], 10, 64)
	if diff := randomRounds(seed, f[1], f[2]); diff != "" {
		fmt.Println(diff)
		os.Exit(1)
	}
	os.Exit(0)
}

// randomSetup mounts a base and makes a native directory holding the same
// tree (owned by owner, but for root's files), and a branch inside a
// branch of it; it returns the mount, the native directory and the inner
// branch.
func randomSetup(t *testing.T, seed int64, owner int) (*mount, string, string) {
	m := newMount(t, "")
	native := t.TempDir()
	must(t, os.Chmod(native, 0o755))
	sampleTree(t, native)
	for _, root := range []string{m.base, native} {
		seedTree(t, root, seed)
		if owner != 0 {
			giveTree(t, root, owner)
		}
	}
	m.create("outer")
	return m, native, m.create("inner", "outer")
}

// randomCommit commits the inner branch into the outer and that into the
// base, and requires each to equal the native directory.
func randomCommit(t *testing.T, m *mount, native, inner string) {
	m.ok("commit", inner)
	if diff := compareTrees(native, m.view("outer")); diff != "" {
		t.Fatalf("after committing inner into outer: %s", diff)
	}
	m.ok("commit", m.view("outer"))
	if diff := compareTrees(native, m.base); diff != "" {
		t.Fatalf("after committing into the base: %s", diff)
	}
}

// randomRounds applies the random operations of seed to both trees and
// returns the first difference, with the operations so far, or "".
func randomRounds(seed int64, native, branch string) string {
	rng := rand.New(rand.NewSource(seed))
	var log []string
	var held []*os.File
	defer func() {
		for _, f := range held {
			f.Close()
		}
	}()
	for round := 0; round < 12; round++ {
		for i := 0; i < 25; i++ {
			op := randomOp(rng)
			if op == nil {
				continue
			}
			ne, be := op.run(native, &held), op.run(branch, &held)
			log = append(log, fmt.Sprintf("%s -> native %s, branch %s", op.desc, ne, be))
			if ne != be {
				return fmt.Sprintf("round %d: %s: native %s, branch %s\n%s", round, op.desc, ne, be, strings.Join(log, "\n"))
			}
			if os.Getenv("BRANCHFS_RANDOM_EVERY_OP") != "" {
				if diff := compareTrees(native, branch); diff != "" {
					return fmt.Sprintf("round %d: after %s: %s\n%s", round, op.desc, diff, strings.Join(log, "\n"))
				}
			}
		}
		if diff := compareTrees(native, branch); diff != "" {
			return fmt.Sprintf("round %d: trees differ: %s\nops:\n%s", round, diff, strings.Join(log, "\n"))
		}
		for _, f := range held {
			f.Close()
		}
		held = nil
	}
	return ""
}

func seedTree(t *testing.T, root string, seed int64) {
	rng := rand.New(rand.NewSource(seed * 1000))
	for d := 0; d < 4; d++ {
		dir := filepath.Join(root, fmt.Sprintf("d%d", d))
		must(t, os.MkdirAll(filepath.Join(dir, "sub"), 0o755))
		for f := 0; f < 4; f++ {
			writeFile(t, filepath.Join(dir, fmt.Sprintf("f%d", f)), fmt.Sprintf("base %d %d %d\n", d, f, rng.Int()))
		}
		writeFile(t, filepath.Join(dir, "sub", "deep"), "deep\n")
	}
	writeFile(t, filepath.Join(root, "top"), "top\n")
}

// giveTree gives root's tree to owner, directories open to everyone as in
// a shared workspace, but for root's own files: f3 of every directory, and
// d3/f2 and d1/sub/deep, which stay private to root.
func giveTree(t *testing.T, root string, owner int) {
	must(t, filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		switch {
		case fi.IsDir():
			must(t, os.Chmod(p, 0o777))
			if rel != "." {
				must(t, os.Lchown(p, owner, owner))
			}
		case rel == "d3/f2" || rel == "d1/sub/deep":
			must(t, os.Chmod(p, 0o600))
		case filepath.Base(rel) != "f3":
			must(t, os.Lchown(p, owner, owner))
		}
		return nil
	}))
}

type randomOperation struct {
	desc string
	// run applies the operation under root and returns what it saw: "ok",
	// an errno, or what it read. Files it opens to hold go to held, which
	// the round closes at its end.
	run func(root string, held *[]*os.File) string
}

// names the operations pick from: some exist in the seed, some do not.
var randomNames = []string{"d0", "d1", "d2", "d3", "d0/f0", "d0/f1", "d1/f2", "d2/f3", "d3/f0", "d3/f2", "d0/f3",
	"d0/sub", "d1/sub/deep", "d2/sub", "top", "new", "d0/new", "d1/sub/new", "n1", "n2/x"}

func randomOp(rng *rand.Rand) *randomOperation { return randomOpOf(rng, 18) }

// basicRandomOp picks among the changes by name only: writes, removals,
// mkdir, renames, links and chmod.
func basicRandomOp(rng *rand.Rand) *randomOperation { return randomOpOf(rng, 11) }

// randomOpOf picks among the first kinds of operation.
func randomOpOf(rng *rand.Rand, kinds int) *randomOperation {
	pick := func() string { return randomNames[rng.Intn(len(randomNames))] }
	a, b := pick(), pick()
	data := fmt.Sprintf("data %d\n", rng.Intn(1000))
	op := func(desc string, fn func(p, q string) error) *randomOperation {
		return &randomOperation{desc, func(r string, _ *[]*os.File) string {
			return errText(fn(filepath.Join(r, a), filepath.Join(r, b)))
		}}
	}
	switch rng.Intn(kinds) {
	case 0, 1:
		return op("write "+a, func(p, _ string) error { return os.WriteFile(p, []byte(data), 0o644) })
	case 2:
		return op("append "+a, func(p, _ string) error {
			f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = f.WriteString(data)
			return err
		})
	case 3:
		return op("unlink "+a, func(p, _ string) error { return syscall.Unlink(p) })
	case 4:
		return op("rmdir "+a, func(p, _ string) error { return syscall.Rmdir(p) })
	case 5:
		return op("rm -rf "+a, func(p, _ string) error { return os.RemoveAll(p) })
	case 6:
		return op("mkdir "+a, func(p, _ string) error { return syscall.Mkdir(p, 0o755) })
	case 7, 8:
		if strings.HasPrefix(b, a+"/") || strings.HasPrefix(a, b+"/") {
			return nil // a rename into itself: EINVAL on both, not interesting
		}
		flags := []uint{0, 0, unix.RENAME_NOREPLACE, unix.RENAME_EXCHANGE}[rng.Intn(4)]
		return op(fmt.Sprintf("rename(%d) %s %s", flags, a, b), func(p, q string) error {
			return unix.Renameat2(unix.AT_FDCWD, p, unix.AT_FDCWD, q, flags)
		})
	case 9, 11:
		return op("link "+a+" "+b, func(p, q string) error { return syscall.Link(p, q) })
	case 10:
		mode := uint32(0o600 + rng.Intn(0o177))
		return op(fmt.Sprintf("chmod %o %s", mode, a), func(p, _ string) error { return syscall.Chmod(p, mode) })
	case 12:
		// A read binds the file's inode to its backing file
		// (passthrough); a held one keeps it bound for the round.
		hold := rng.Intn(2) == 0
		return &randomOperation{fmt.Sprintf("read %s (held %v)", a, hold), func(r string, held *[]*os.File) string {
			f, err := os.Open(filepath.Join(r, a))
			if err != nil {
				return errText(err)
			}
			data := make([]byte, 64)
			n, err := f.Read(data)
			if hold {
				*held = append(*held, f)
			} else {
				f.Close()
			}
			if err != nil {
				return errText(err)
			}
			return strconv.Quote(string(data[:n]))
		}}
	case 13:
		return &randomOperation{"stat " + a, func(r string, _ *[]*os.File) string {
			var st unix.Stat_t
			if err := unix.Lstat(filepath.Join(r, a), &st); err != nil {
				return errText(err)
			}
			desc := fmt.Sprintf("mode %o nlink %d size %d", st.Mode, st.Nlink, st.Size)
			if st.Mtim.Sec < 1<<20 { // set by utimes below, not by a write
				desc += fmt.Sprintf(" mtime %d", st.Mtim.Sec)
			}
			return desc
		}}
	case 14:
		sec := int64(rng.Intn(1 << 20))
		return op(fmt.Sprintf("utimes %d %s", sec, a), func(p, _ string) error {
			return unix.UtimesNano(p, []unix.Timespec{{Sec: sec}, {Sec: sec}})
		})
	case 15:
		value := fmt.Sprint(rng.Intn(10))
		return op("setxattr user.k="+value+" "+a, func(p, _ string) error { return unix.Setxattr(p, "user.k", []byte(value), 0) })
	case 16:
		off, n := int64(rng.Intn(8)), int64(1+rng.Intn(8))
		return op(fmt.Sprintf("zero %s %d+%d", a, off, n), func(p, _ string) error {
			f, err := os.OpenFile(p, os.O_RDWR, 0)
			if err != nil {
				return err
			}
			defer f.Close()
			return unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_ZERO_RANGE|unix.FALLOC_FL_KEEP_SIZE, off, n)
		})
	default:
		offIn, offOut, n := int64(rng.Intn(6)), int64(rng.Intn(6)), 1+rng.Intn(6)
		return &randomOperation{fmt.Sprintf("copy_file_range %s@%d %s@%d %d", a, offIn, b, offOut, n),
			func(r string, _ *[]*os.File) string {
				// The output first: a descriptor that passes a base
				// file through before its copy-up stays another inode
				// (docs/design.md).
				out, err := os.OpenFile(filepath.Join(r, b), os.O_WRONLY, 0)
				if err != nil {
					return errText(err)
				}
				defer out.Close()
				in, err := os.Open(filepath.Join(r, a))
				if err != nil {
					return errText(err)
				}
				defer in.Close()
				oi, oo := offIn, offOut
				c, err := unix.CopyFileRange(int(in.Fd()), &oi, int(out.Fd()), &oo, n, 0)
				if err != nil {
					return errText(err)
				}
				return fmt.Sprintf("copied %d", c)
			}}
	}
}

// compareTrees describes the first difference between two trees: names,
// types, modes, contents, user xattrs, link counts, and which names are
// one file.
func compareTrees(want, got string) string {
	w, err := snapshotTree(want)
	if err != nil {
		return "native: " + err.Error()
	}
	g, err := snapshotTree(got)
	if err != nil {
		return "branch: " + err.Error()
	}
	keys := map[string]bool{}
	for k := range w {
		keys[k] = true
	}
	for k := range g {
		keys[k] = true
	}
	var sorted []string
	for k := range keys {
		sorted = append(sorted, k)
	}
	sort.Strings(sorted)
	for _, k := range sorted {
		if w[k] != g[k] {
			return fmt.Sprintf("%s: native %q, branch %q", k, w[k], g[k])
		}
	}
	return ""
}

// snapshotTree describes every name below root. What the caller may not
// read is described by the error it gets.
func snapshotTree(root string) (map[string]string, error) {
	out := map[string]string{}
	names := map[uint64][]string{} // files with several links, by inode
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil && p == root {
			return fmt.Errorf("%s: %w", p, err)
		}
		rel, _ := filepath.Rel(root, p)
		if rel == "." || strings.HasPrefix(rel, ".branchfs") {
			return nil
		}
		if err != nil { // a directory the caller may not list
			out[rel] = "unlisted " + errText(err)
			return fs.SkipDir
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			out[rel] = "unstated " + errText(err) // in a directory the caller may not search
			return nil
		}
		desc := fmt.Sprintf("type %o mode %o nlink %d", st.Mode&unix.S_IFMT, st.Mode&07777, st.Nlink)
		if st.Mode&unix.S_IFMT == unix.S_IFDIR {
			desc = fmt.Sprintf("dir mode %o", st.Mode&07777)
		} else if st.Mode&unix.S_IFMT == unix.S_IFREG {
			data, err := os.ReadFile(p)
			if err != nil {
				desc += " unread " + errText(err)
			} else {
				desc += " " + string(data)
			}
			if st.Nlink > 1 {
				names[st.Ino] = append(names[st.Ino], rel)
			}
		}
		if st.Mode&unix.S_IFMT != unix.S_IFLNK {
			buf := make([]byte, 64)
			if n, err := unix.Lgetxattr(p, "user.k", buf); err == nil {
				desc += " user.k=" + string(buf[:n])
			}
		}
		out[rel] = desc
		return nil
	})
	for _, group := range names {
		sort.Strings(group)
		for _, n := range group {
			out[n] += " one file with " + strings.Join(group, ",")
		}
	}
	return out, err
}

// randomSeeds is how many random sequences TestRandomOperations runs (and
// half as many for TestRandomOperationsUnprivileged);
// BRANCHFS_RANDOM_SEEDS raises it for a longer hunt.
var randomSeeds = func() int64 {
	var n int64 = 4
	fmt.Sscan(os.Getenv("BRANCHFS_RANDOM_SEEDS"), &n)
	return n
}()
