package fs_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/branchfs/branchfs/ctl"
	"golang.org/x/sys/unix"
)

// Every test here mounts for real through the branchfs binary, as a user
// would. They need root and /dev/fuse.

// binary is branchfs built for the tests; helper is a copy of this test
// binary that other users can run.
var binary, helper string

func TestMain(m *testing.M) {
	fsopHelper()
	randomHelper()
	exchangeHelper()
	if os.Getenv(envInRun) != "" {
		// Checks inside a run (kernelpath_test.go), by this binary.
		helper = os.Args[0]
		os.Exit(m.Run())
	}
	if os.Geteuid() != 0 {
		fmt.Println("skipping mount tests: they need root")
		os.Exit(0)
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		fmt.Println("skipping mount tests: no /dev/fuse")
		os.Exit(0)
	}
	// Every race-built process (the CLI, the daemon, helpers) would sleep
	// a second as it exits; the tests run hundreds of them.
	if g := os.Getenv("GORACE"); !strings.Contains(g, "atexit_sleep_ms") {
		os.Setenv("GORACE", strings.TrimSpace(g+" atexit_sleep_ms=0"))
	}
	dir, err := os.MkdirTemp("", "branchfs-bin")
	if err != nil {
		panic(err)
	}
	// Helper processes run as other users: they must reach the binaries.
	os.Chmod(dir, 0o755)
	binary = filepath.Join(dir, "branchfs")
	helper = filepath.Join(dir, "fs.test")
	if data, err := os.ReadFile(os.Args[0]); err == nil {
		os.WriteFile(helper, data, 0o755)
	}
	// The failpoints of branch/failpoint_env.go exist only with this tag.
	args := []string{"build", "-tags", "branchfs_failpoints", "-o", binary}
	if raceBuild {
		args = append(args, "-race")
	}
	cmd := exec.Command("go", append(args, "../cmd/branchfs")...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		fmt.Println("building branchfs:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

type mount struct {
	t                *testing.T
	base, store, mnt string
	passthrough      string
	env              []string
	args             []string // more mount flags
	mounted          bool
}

// newMount mounts a fresh base holding a small sample tree.
func newMount(t *testing.T, passthrough string, env ...string) *mount {
	t.Helper()
	dir := t.TempDir()
	// Other users must reach the mount, as they would a shared workspace.
	must(t, os.Chmod(dir, 0o755))
	must(t, os.Chmod(filepath.Dir(dir), 0o755))
	m := &mount{t: t, base: filepath.Join(dir, "base"), store: filepath.Join(dir, "store"),
		mnt: filepath.Join(dir, "mnt"), passthrough: passthrough, env: env}
	must(t, os.MkdirAll(m.mnt, 0o755))
	sampleTree(t, m.base)
	m.start()
	t.Cleanup(m.cleanup)
	return m
}

// sampleTree makes the small tree every test base starts with.
func sampleTree(t *testing.T, root string) {
	must(t, os.MkdirAll(filepath.Join(root, "dir", "sub"), 0o755))
	writeFile(t, filepath.Join(root, "file"), "base file\n")
	writeFile(t, filepath.Join(root, "dir", "a"), "a\n")
	writeFile(t, filepath.Join(root, "dir", "sub", "b"), "b\n")
	must(t, os.Symlink("file", filepath.Join(root, "link")))
}

func (m *mount) start() {
	m.t.Helper()
	if m.passthrough == "" {
		m.passthrough = "auto"
	}
	// The sample files are tiny: pass them through, so that the tests
	// reach the passthrough paths, unless a test sets its own size.
	args := []string{"mount", "--base", m.base, "--passthrough", m.passthrough}
	if m.store != "" { // else the default store
		args = append(args, "--store", m.store)
	}
	if !slices.ContainsFunc(m.args, func(a string) bool { return strings.HasPrefix(a, "--passthrough-min-size") }) {
		args = append(args, "--passthrough-min-size", "0")
	}
	args = append(args, m.args...)
	cmd := exec.Command(binary, append(args, m.mnt)...)
	cmd.Env = append(os.Environ(), m.env...)
	if out, err := cmd.CombinedOutput(); err != nil {
		m.t.Fatalf("mount: %v: %s", err, out)
	}
	m.mounted = true
}

func (m *mount) cleanup() {
	if !m.mounted {
		return
	}
	if _, _, code := m.cli("unmount", m.mnt); code != 0 {
		unix.Unmount(m.mnt, unix.MNT_DETACH)
	}
	m.mounted = false
	// lockcheck reports a lock taken out of order (internal/lockcheck).
	if log, err := os.ReadFile(filepath.Join(m.store, "daemon.log")); err == nil &&
		(bytes.Contains(log, []byte("DATA RACE")) || bytes.Contains(log, []byte("lockcheck:"))) {
		m.t.Errorf("daemon log reports a data race or a lock taken out of order:\n%s", log)
	}
}

// waitDead waits for the daemon to die; the kernel keeps its mount,
// answering ENOTCONN, until it is detached.
func (m *mount) waitDead() {
	m.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var st unix.Statfs_t
		err := unix.Statfs(m.mnt, &st)
		if errors.Is(err, unix.ENOTCONN) || err == nil && st.Type != ctl.FuseSuperMagic {
			break
		}
		if time.Now().After(deadline) {
			m.t.Fatalf("daemon did not die: statfs %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The kernel closes a dying process's files one by one: the store's
	// lock may outlive its FUSE connection for a moment.
	f, err := os.Open(filepath.Join(m.store, "lock"))
	if err != nil {
		return
	}
	defer f.Close()
	for unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) != nil {
		if time.Now().After(deadline) {
			m.t.Fatalf("daemon did not die: the store is still locked")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// cli runs the branchfs command and returns stdout, stderr and exit status.
func (m *mount) cli(args ...string) (string, string, int) {
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(binary, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		m.t.Fatalf("running branchfs: %v", err)
	}
	return stdout.String(), stderr.String(), code
}

// ok runs the CLI and fails the test unless it succeeds.
func (m *mount) ok(args ...string) string {
	m.t.Helper()
	out, errOut, code := m.cli(args...)
	if code != 0 {
		m.t.Fatalf("branchfs %s: exit %d: %s", strings.Join(args, " "), code, errOut)
	}
	return out
}

func (m *mount) create(name string, parent ...string) string {
	m.t.Helper()
	args := []string{"create", name, m.mnt}
	if len(parent) > 0 {
		args = append(args, "--parent", parent[0])
	}
	m.ok(args...)
	return m.view(name)
}

func (m *mount) view(name string) string { return filepath.Join(m.mnt, "@"+name) }

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func writeFile(t *testing.T, p, content string) {
	t.Helper()
	must(t, os.WriteFile(p, []byte(content), 0o644))
}

func inodeNumber(t *testing.T, p string) uint64 {
	t.Helper()
	var st unix.Stat_t
	must(t, unix.Lstat(p, &st))
	return st.Ino
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	data, err := os.ReadFile(p)
	must(t, err)
	return string(data)
}

func wantContent(t *testing.T, p, want string) {
	t.Helper()
	if got := readFile(t, p); got != want {
		t.Errorf("%s = %q, want %q", p, got, want)
	}
}

func wantErrno(t *testing.T, err error, want syscall.Errno) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Errorf("got error %v, want %v", err, want)
	}
}

func wantMissing(t *testing.T, p string) {
	t.Helper()
	if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s: got %v, want it missing", p, err)
	}
}

// openFds counts the daemon's open descriptors, to find leaks.
func (m *mount) daemonFds() int {
	m.t.Helper()
	data, err := os.ReadFile(filepath.Join(m.store, "daemon.pid"))
	must(m.t, err)
	ents, err := os.ReadDir("/proc/" + strings.TrimSpace(string(data)) + "/fd")
	must(m.t, err)
	return len(ents)
}
