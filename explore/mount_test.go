package explore

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Every test here mounts for real through the branchfs binary and runs
// commands in branches; they need root and /dev/fuse.

var binary string // branchfs, built for the tests

var (
	unmounts      sync.WaitGroup
	unmountFailed atomic.Bool
)

func TestMain(m *testing.M) {
	if mb := os.Getenv(envHog); mb != "" {
		hog(mb) // a candidate of TestLimits
	}
	if os.Getenv("BRANCHFS_TEST_USERNS") != "" {
		os.Exit(m.Run()) // TestUserNamespace, as an ordinary user
	}
	if os.Getenv("BRANCHFS_TEST_FOREIGN") != "" {
		binary = os.Getenv("BRANCHFS_TEST_BINARY")
		os.Exit(m.Run()) // TestForeignDaemon, in a mount namespace of its own
	}
	if os.Geteuid() != 0 {
		fmt.Println("skipping run tests: they need root")
		os.Exit(0)
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		fmt.Println("skipping run tests: no /dev/fuse")
		os.Exit(0)
	}
	dir, err := os.MkdirTemp("", "branchfs-bin")
	if err != nil {
		panic(err)
	}
	os.Chmod(dir, 0o755) // TestUnprivilegedRun runs it as nobody
	// The QEMU guest, which has no Go, gives a binary built for it.
	if binary = os.Getenv("BRANCHFS_TEST_BINARY"); binary == "" {
		binary = filepath.Join(dir, "branchfs")
		cmd := exec.Command("go", "build", "-o", binary, "../cmd/branchfs")
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
		if err := cmd.Run(); err != nil {
			fmt.Println("building branchfs:", err)
			os.Exit(1)
		}
	}
	code := m.Run()
	unmounts.Wait()
	if unmountFailed.Load() {
		code = 1
	}
	os.RemoveAll(dir)
	os.Exit(code)
}

type testMount struct {
	*Mount
	base, mnt string
	store     string
}

// mountT mounts a fresh base holding "file" (base) and "dir/a".
func mountT(t testing.TB) *testMount {
	t.Helper()
	dir, err := os.MkdirTemp("", "explore-test")
	must(t, err)
	tm := &testMount{base: filepath.Join(dir, "base"), mnt: filepath.Join(dir, "mnt"), store: filepath.Join(dir, "store")}
	must(t, os.MkdirAll(filepath.Join(tm.base, "dir"), 0o755))
	must(t, os.MkdirAll(tm.mnt, 0o755))
	must(t, os.WriteFile(filepath.Join(tm.base, "file"), []byte("base\n"), 0o644))
	must(t, os.WriteFile(filepath.Join(tm.base, "dir", "a"), []byte("a\n"), 0o644))
	out, err := exec.Command(binary, "mount", "--base", tm.base, "--store", tm.store, tm.mnt).CombinedOutput()
	if err != nil {
		t.Fatalf("mount: %v: %s", err, out)
	}
	t.Cleanup(func() { unmountLater(tm.mnt, dir) })
	m, err := Open(tm.mnt)
	must(t, err)
	tm.Mount = m
	return tm
}

// unmountLater unmounts mnt and removes dir on a goroutine: unmounting
// waits a second or two for the daemon to exit, which the next tests need
// not wait for. TestMain waits for them all.
func unmountLater(mnt, dir string) {
	unmounts.Add(1)
	go func() {
		defer unmounts.Done()
		if out, err := exec.Command(binary, "unmount", mnt).CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "unmount %s: %v: %s\n", mnt, err, out)
			unmountFailed.Store(true)
			unix.Unmount(mnt, unix.MNT_DETACH)
		}
		os.RemoveAll(dir)
	}()
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func readFile(t testing.TB, p string) string {
	t.Helper()
	data, err := os.ReadFile(p)
	must(t, err)
	return string(data)
}

// token is a string unique to one test, to find the processes it started
// by their command lines.
func token(t testing.TB) string {
	return fmt.Sprintf("TOKEN%d%s", os.Getpid(), strings.NewReplacer("/", "_", " ", "_").Replace(t.Name()))
}

// daemon is shell code that leaves a process behind the way a daemon
// does: setsid, then a double fork; it carries tok in its command line.
// The shell that runs it touches ready once the process is there.
func daemon(tok, ready string) string {
	return fmt.Sprintf(`setsid sh -c '(sh -c "touch %s.d; sleep 1000; : %s" &) ; :' ; until [ -e %s.d ]; do :; done; touch %s`, ready, tok, ready, ready)
}

// withToken lists the processes on the machine whose command line holds tok.
func withToken(tok string) []string {
	var found []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		data, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && bytes.Contains(data, []byte(tok)) && e.Name() != fmt.Sprint(os.Getpid()) {
			found = append(found, e.Name()+": "+strings.ReplaceAll(string(data), "\x00", " "))
		}
	}
	return found
}

// noneLeft fails the test if anything of a run is left: a process with
// tok, a cgroup, a record, or a live branch other than those in keep.
func (tm *testMount) noneLeft(t testing.TB, tok string, keep ...string) {
	t.Helper()
	if p := withToken(tok); len(p) > 0 {
		t.Errorf("processes left: %q", p)
	}
	if root, err := cgroupRoot(); err == nil {
		ents, _ := os.ReadDir(filepath.Join(root, cgroupsDir))
		for _, e := range ents {
			if e.IsDir() && strings.Contains(e.Name(), fmt.Sprintf("-%d-", os.Getpid())) {
				t.Errorf("cgroup left: %s", e.Name())
			}
		}
	}
	ents, _ := os.ReadDir(recordsPath())
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), fmt.Sprintf("%d-", os.Getpid())) {
			t.Errorf("record left: %s", e.Name())
		}
	}
	list, err := tm.List()
	must(t, err)
	for _, b := range list {
		if b.Name != "main" && b.State != "committed" && !contains(keep, b.Name) {
			t.Errorf("branch left: %s (%s)", b.Name, b.State)
		}
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// eventually waits for cond, up to 10 seconds.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func sh(script string) []string { return []string{"sh", "-c", script} }
