package fs_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// The kernel path of runs (docs/processes.md), checked as the FUSE views
// are: the POSIX table and the conformance scripts run inside a
// kernel-path run, whose processes see the branch through the kernel's
// overlayfs over the store's layers, and the random operations run there
// and in a FUSE view of a twin mount, whose committed bases must be equal.
// Inside the run the checks are this test binary again: envInRun names
// the directory they work in, envInRunOut a file for what they report.
const (
	envInRun    = "BRANCHFS_TEST_IN_RUN"
	envInRunOut = "BRANCHFS_TEST_IN_RUN_OUT"
)

// inKernelRun runs test (this binary, -test.run) as the command of a
// kernel-path run in branch (a new one when ""), which is kept, and
// returns its name and what the command wrote to envInRunOut. The command
// works in the run's MNT; it must pass.
func (m *mount) inKernelRun(test, branch string, env ...string) (string, []byte) {
	m.t.Helper()
	out := filepath.Join(m.t.TempDir(), "out")
	args := []string{"run", "--data-path", "kernel", "--on-success", "keep", "--json"}
	if branch != "" {
		args = append(args, "--branch", branch)
	}
	args = append(args, m.mnt, "--", helper, "-test.run=^"+test+"$", "-test.v")
	cmd := exec.Command(binary, args...)
	cmd.Env = append(append(os.Environ(), envInRun+"="+m.mnt, envInRunOut+"="+out), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var rec struct {
		Branch   string `json:"branch"`
		DataPath string `json:"data_path"`
	}
	json.Unmarshal(stdout.Bytes(), &rec)
	if err != nil || rec.DataPath != "kernel" || !strings.Contains(stderr.String(), "--- PASS: "+test) {
		m.t.Fatalf("%s in a kernel-path run: %v; record %s\n%s", test, err, stdout.String(), stderr.String())
	}
	data, _ := os.ReadFile(out)
	return rec.Branch, data
}

// TestPOSIXKernelPath runs the POSIX table inside a kernel-path run, then
// commits what it left.
func TestPOSIXKernelPath(t *testing.T) {
	if dir := os.Getenv(envInRun); dir != "" {
		for name, check := range posixChecks {
			t.Run(name, func(t *testing.T) {
				d := filepath.Join(dir, "t-kernel-"+name)
				must(t, os.Mkdir(d, 0o755))
				check(t, d)
			})
		}
		return
	}
	m := newMount(t, "")
	name, _ := m.inKernelRun("TestPOSIXKernelPath", "")
	m.ok("commit", m.view(name))
	for name := range posixChecks {
		if _, err := os.Lstat(filepath.Join(m.base, "t-kernel-"+name)); err != nil {
			t.Errorf("base after the commit: %v", err)
		}
	}
}

// TestConformanceKernelPath runs the conformance scripts inside a
// kernel-path run and requires native ext4's transcripts.
func TestConformanceKernelPath(t *testing.T) {
	if dir := os.Getenv(envInRun); dir != "" {
		got := map[string][]string{}
		for name, script := range conformanceScripts {
			d := filepath.Join(dir, "c-"+name)
			must(t, os.Mkdir(d, 0o755))
			got[name] = runScript(t, d, script)
		}
		data, _ := json.Marshal(got)
		must(t, os.WriteFile(os.Getenv(envInRunOut), data, 0o644))
		return
	}
	m := newMount(t, "")
	_, data := m.inKernelRun("TestConformanceKernelPath", "")
	var got map[string][]string
	must(t, json.Unmarshal(data, &got))
	native := t.TempDir()
	must(t, os.Chmod(native, 0o755))
	for name, script := range conformanceScripts {
		nd := filepath.Join(native, "c-"+name)
		must(t, os.Mkdir(nd, 0o755))
		want := runScript(t, nd, script)
		for i := range script {
			if i >= len(got[name]) || want[i] != got[name][i] {
				t.Errorf("%s step %d %v %v: native %q, kernel path %q", name, i, script[i].op, script[i].args, want[i], got[name])
				break
			}
		}
	}
}

// TestRandomKernelPath applies the same random operations in a kernel-path
// run of a nested branch and in a FUSE view of the same branch of a twin
// mount, whose outer branch was changed through its view first (so that
// overlayfs reads markers the daemon wrote). Every operation must end the
// same way but one: overlayfs refuses to rename a directory a lower layer
// shows (EXDEV, which mv answers by copying); such an operation is left
// out on both sides. Then the trees must be equal (names, types, modes,
// owners, contents, xattrs, link counts), and after both commits the two
// bases.
func TestRandomKernelPath(t *testing.T) {
	if dir := os.Getenv(envInRun); dir != "" {
		var seed int64
		fmt.Sscan(os.Getenv("BRANCHFS_TEST_SEED"), &seed)
		rng := rand.New(rand.NewSource(seed))
		var results []string
		for i := 0; i < randomKernelOps; i++ {
			results = append(results, kernelRandomOp(rng).run(dir, nil))
		}
		data, _ := json.Marshal(results)
		must(t, os.WriteFile(os.Getenv(envInRunOut), data, 0o644))
		return
	}
	for seed := int64(1); seed <= randomSeeds; seed++ {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			twin := func() *mount {
				m := newMount(t, "")
				seedTree(t, m.base, seed)
				outer := m.create("outer")
				// Tombstones, an opaque directory and a copy-up in a
				// middle layer, written by the daemon.
				must(t, os.Remove(filepath.Join(outer, "d0", "f1")))
				must(t, os.RemoveAll(filepath.Join(outer, "d3")))
				must(t, os.MkdirAll(filepath.Join(outer, "d3", "sub"), 0o750))
				writeFile(t, filepath.Join(outer, "d3", "f0"), "outer\n")
				writeFile(t, filepath.Join(outer, "top"), "outer top\n")
				must(t, unix.Setxattr(filepath.Join(outer, "d1", "f2"), "user.outer", []byte("o"), 0))
				m.create("inner", "outer")
				return m
			}
			fuse, kernel := twin(), twin()
			_, data := kernel.inKernelRun("TestRandomKernelPath", "inner", fmt.Sprintf("BRANCHFS_TEST_SEED=%d", seed))
			var kres []string
			must(t, json.Unmarshal(data, &kres))
			rng := rand.New(rand.NewSource(seed))
			var log []string
			skipped := 0
			for i := 0; i < randomKernelOps; i++ {
				op := kernelRandomOp(rng)
				if kres[i] == errText(syscall.EXDEV) && strings.HasPrefix(op.desc, "rename") {
					log = append(log, op.desc+" -> kernel path EXDEV, left out")
					skipped++
					continue
				}
				fres := op.run(fuse.view("inner"), nil)
				log = append(log, fmt.Sprintf("%s -> fuse %s, kernel %s", op.desc, fres, kres[i]))
				if fres != kres[i] {
					t.Fatalf("op %d: %s: FUSE view %s, kernel path %s\n%s", i, op.desc, fres, kres[i], strings.Join(log, "\n"))
				}
			}
			t.Logf("%d of %d operations left out (EXDEV)", skipped, randomKernelOps)
			compare := func(what, a, b string, dirLinks bool) {
				t.Helper()
				if diff := compareFull(a, b, dirLinks); diff != "" {
					t.Fatalf("%s: %s\n%s", what, diff, strings.Join(log, "\n"))
				}
			}
			compare("the branches", fuse.view("inner"), kernel.view("inner"), false)
			for _, m := range []*mount{fuse, kernel} {
				m.ok("commit", m.view("inner"))
			}
			compare("outer after the commits", fuse.view("outer"), kernel.view("outer"), false)
			for _, m := range []*mount{fuse, kernel} {
				m.ok("commit", m.view("outer"))
			}
			compare("the bases after the commits", fuse.base, kernel.base, true)
		})
	}
}

// randomKernelOps is how many operations one seed of TestRandomKernelPath
// applies.
const randomKernelOps = 300

// kernelRandomOp is basicRandomOp's operations and those on owners and
// xattrs.
func kernelRandomOp(rng *rand.Rand) *randomOperation {
	pick := func() string { return randomNames[rng.Intn(len(randomNames))] }
	switch rng.Intn(14) {
	case 0:
		a, v := pick(), fmt.Sprint(rng.Intn(3))
		return &randomOperation{"setxattr " + a + " " + v, func(r string, _ *[]*os.File) string {
			return errText(unix.Lsetxattr(filepath.Join(r, a), "user.k"+v, []byte("v"+v), 0))
		}}
	case 1:
		a, v := pick(), fmt.Sprint(rng.Intn(3))
		return &randomOperation{"removexattr " + a + " " + v, func(r string, _ *[]*os.File) string {
			return errText(unix.Lremovexattr(filepath.Join(r, a), "user.k"+v))
		}}
	case 2:
		a, id := pick(), []int{0, 1000, 65534}[rng.Intn(3)]
		return &randomOperation{fmt.Sprintf("chown %d %s", id, a), func(r string, _ *[]*os.File) string {
			return errText(os.Lchown(filepath.Join(r, a), id, id))
		}}
	}
	for {
		if op := basicRandomOp(rng); op != nil {
			return op
		}
	}
}

func errText(err error) string {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return errno.Error()
	}
	if err != nil {
		return err.Error()
	}
	return "ok"
}

// compareFull is compareTrees with owners and xattrs too, and the link
// counts of directories when dirLinks (a view shows its own for a merged
// directory).
func compareFull(a, b string, dirLinks bool) string {
	snap := func(root string) (map[string]string, error) {
		out := map[string]string{}
		err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(root, p)
			var st unix.Stat_t
			if err := unix.Lstat(p, &st); err != nil {
				return err
			}
			desc := fmt.Sprintf("type %o mode %o owner %d:%d", st.Mode&unix.S_IFMT, st.Mode&07777, st.Uid, st.Gid)
			if st.Mode&unix.S_IFMT != unix.S_IFDIR || dirLinks {
				desc += fmt.Sprintf(" nlink %d", st.Nlink)
			}
			switch st.Mode & unix.S_IFMT {
			case unix.S_IFREG:
				data, err := os.ReadFile(p)
				if err != nil {
					return err
				}
				desc += " data " + string(data)
			case unix.S_IFLNK:
				t, _ := os.Readlink(p)
				desc += " -> " + t
			}
			if st.Mode&unix.S_IFMT != unix.S_IFLNK {
				sz, _ := unix.Llistxattr(p, nil)
				buf := make([]byte, sz)
				sz, _ = unix.Llistxattr(p, buf)
				names := strings.Split(strings.TrimRight(string(buf[:max(sz, 0)]), "\x00"), "\x00")
				sort.Strings(names)
				for _, n := range names {
					if n == "" || strings.HasPrefix(n, "security.") {
						continue
					}
					v := make([]byte, 256)
					vn, _ := unix.Lgetxattr(p, n, v)
					desc += fmt.Sprintf(" %s=%s", n, v[:max(vn, 0)])
				}
			}
			if rel != "." {
				out[rel] = desc
			}
			return nil
		})
		return out, err
	}
	wa, err := snap(a)
	if err != nil {
		return "FUSE: " + err.Error()
	}
	wb, err := snap(b)
	if err != nil {
		return "kernel path: " + err.Error()
	}
	var keys []string
	for k := range wa {
		keys = append(keys, k)
	}
	for k := range wb {
		if _, ok := wa[k]; !ok {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		if wa[k] != wb[k] {
			return fmt.Sprintf("%s: FUSE %q, kernel path %q", k, wa[k], wb[k])
		}
	}
	return ""
}

// TestHoldControl: a hold (ctl.CmdHold) makes the view read-only for as long
// as its process lives or until it releases it itself; another process's
// release fails with EBUSY while it lives. A run whose overlayfs mount
// fails after the hold goes on with the view this way.
func TestHoldControl(t *testing.T) {
	m := newMount(t, "")
	b := m.create("b")
	ctl := func(cmd string) error {
		f, err := os.OpenFile(filepath.Join(b, ".branchfs_ctl"), os.O_RDWR, 0)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = f.Write([]byte(cmd))
		return err
	}
	must(t, ctl("hold"))
	wantErrno(t, os.WriteFile(filepath.Join(b, "x"), nil, 0o644), syscall.EROFS)
	wantErrno(t, ctl("hold"), syscall.EBUSY)
	// (dash's echo reports any failed write as an I/O error.)
	if out, err := exec.Command("sh", "-c", "echo release > "+filepath.Join(b, ".branchfs_ctl")).CombinedOutput(); err == nil {
		t.Errorf("another process's release succeeded: %s", out)
	}
	wantErrno(t, os.WriteFile(filepath.Join(b, "x"), nil, 0o644), syscall.EROFS)
	must(t, ctl("release"))
	writeFile(t, filepath.Join(b, "x"), "x")
	// A holder that exits releases the hold.
	out, err := exec.Command("sh", "-c", "echo hold > "+filepath.Join(b, ".branchfs_ctl")).CombinedOutput()
	if err != nil {
		t.Fatalf("hold from a shell: %v: %s", err, out)
	}
	must(t, ctl("release"))
	writeFile(t, filepath.Join(b, "y"), "y")
}
