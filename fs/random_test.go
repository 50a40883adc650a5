package fs_test

import (
	"fmt"
	"io/fs"
	"math/rand"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// TestRandomOperations applies the same random operations to a native
// directory and to a nested branch whose base holds the same tree, and
// requires the same tree after every round; then it commits both levels and
// requires the base to equal the native directory. Most operations land on
// files and directories that exist only in the base, so copy-up, tombstones,
// opaque directories and renames of base directories are all exercised.
func TestRandomOperations(t *testing.T) {
	for seed := int64(1); seed <= randomSeeds; seed++ {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			m := newMount(t, "")
			native := t.TempDir()
			sampleTree(t, native)
			seedTree(t, m.base, seed)
			seedTree(t, native, seed)
			m.create("outer")
			inner := m.create("inner", "outer")
			rng := rand.New(rand.NewSource(seed))
			var log []string
			for round := 0; round < 12; round++ {
				for i := 0; i < 25; i++ {
					op := randomOp(rng, native)
					if op == nil {
						continue
					}
					ne := op.run(native)
					be := op.run(inner)
					log = append(log, fmt.Sprintf("%s -> native %v, branch %v", op.desc, ne, be))
					if (ne == nil) != (be == nil) {
						t.Fatalf("round %d: %s: native %v, branch %v\n%s", round, op.desc, ne, be, strings.Join(log, "\n"))
					}
					if os.Getenv("BRANCHFS_RANDOM_EVERY_OP") != "" {
						if diff := compareTrees(native, inner); diff != "" {
							t.Fatalf("round %d: after %s: %s\n%s", round, op.desc, diff, strings.Join(log, "\n"))
						}
					}
				}
				if diff := compareTrees(native, inner); diff != "" {
					t.Fatalf("round %d: trees differ: %s\nops:\n%s", round, diff, strings.Join(log, "\n"))
				}
			}
			m.ok("commit", inner)
			if diff := compareTrees(native, m.view("outer")); diff != "" {
				t.Fatalf("after committing inner into outer: %s", diff)
			}
			m.ok("commit", m.view("outer"))
			if diff := compareTrees(native, m.base); diff != "" {
				t.Fatalf("after committing into the base: %s", diff)
			}
		})
	}
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

type randomOperation struct {
	desc string
	run  func(root string) error
}

// names the operations pick from: some exist in the seed, some do not.
var randomNames = []string{"d0", "d1", "d2", "d3", "d0/f0", "d0/f1", "d1/f2", "d2/f3", "d3/f0",
	"d0/sub", "d1/sub/deep", "d2/sub", "top", "new", "d0/new", "d1/sub/new", "n1", "n2/x"}

func randomOp(rng *rand.Rand, native string) *randomOperation {
	pick := func() string { return randomNames[rng.Intn(len(randomNames))] }
	a, b := pick(), pick()
	data := fmt.Sprintf("data %d\n", rng.Intn(1000))
	switch rng.Intn(11) {
	case 0, 1:
		return &randomOperation{"write " + a, func(r string) error {
			return os.WriteFile(filepath.Join(r, a), []byte(data), 0o644)
		}}
	case 2:
		return &randomOperation{"append " + a, func(r string) error {
			f, err := os.OpenFile(filepath.Join(r, a), os.O_WRONLY|os.O_APPEND, 0)
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = f.WriteString(data)
			return err
		}}
	case 3:
		return &randomOperation{"unlink " + a, func(r string) error { return syscall.Unlink(filepath.Join(r, a)) }}
	case 4:
		return &randomOperation{"rmdir " + a, func(r string) error { return syscall.Rmdir(filepath.Join(r, a)) }}
	case 5:
		return &randomOperation{"rm -rf " + a, func(r string) error { return os.RemoveAll(filepath.Join(r, a)) }}
	case 6:
		return &randomOperation{"mkdir " + a, func(r string) error { return syscall.Mkdir(filepath.Join(r, a), 0o755) }}
	case 7, 8:
		if strings.HasPrefix(b, a+"/") || strings.HasPrefix(a, b+"/") {
			return nil // a rename into itself: EINVAL on both, not interesting
		}
		flags := []uint{0, 0, unix.RENAME_NOREPLACE, unix.RENAME_EXCHANGE}[rng.Intn(4)]
		return &randomOperation{fmt.Sprintf("rename(%d) %s %s", flags, a, b), func(r string) error {
			return unix.Renameat2(unix.AT_FDCWD, filepath.Join(r, a), unix.AT_FDCWD, filepath.Join(r, b), flags)
		}}
	case 9:
		return &randomOperation{"link " + a + " " + b, func(r string) error {
			return syscall.Link(filepath.Join(r, a), filepath.Join(r, b))
		}}
	default:
		mode := uint32(0o600 + rng.Intn(0o177))
		return &randomOperation{fmt.Sprintf("chmod %o %s", mode, a), func(r string) error {
			return syscall.Chmod(filepath.Join(r, a), mode)
		}}
	}
}

// compareTrees describes the first difference between two trees: names,
// types, modes, contents, link counts (between files of the tree).
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

func snapshotTree(root string) (map[string]string, error) {
	out := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		rel, _ := filepath.Rel(root, p)
		if rel == "." || strings.HasPrefix(rel, ".branchfs") {
			return nil
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return fmt.Errorf("lstat %s: %w", p, err)
		}
		desc := fmt.Sprintf("type %o mode %o nlink %d", st.Mode&unix.S_IFMT, st.Mode&07777, st.Nlink)
		if st.Mode&unix.S_IFMT == unix.S_IFDIR {
			desc = fmt.Sprintf("dir mode %o", st.Mode&07777)
		} else if st.Mode&unix.S_IFMT == unix.S_IFREG {
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			desc += " " + string(data)
		}
		out[rel] = desc
		return nil
	})
	return out, err
}

// randomSeeds is how many random sequences TestRandomOperations runs;
// BRANCHFS_RANDOM_SEEDS raises it for a longer hunt.
var randomSeeds = func() int64 {
	var n int64 = 4
	fmt.Sscan(os.Getenv("BRANCHFS_RANDOM_SEEDS"), &n)
	return n
}()
