package fs_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/branchfs/branchfs/branch"
	"github.com/branchfs/branchfs/ctl"
	"golang.org/x/sys/unix"
)

// controlOp runs one branch ioctl on path ("ioctl", create|commit|abort),
// or writes one command to the control file path ("ctl"), for helper
// processes.
func controlOp(kind, path, op string) error {
	if kind == "ctl" {
		return os.WriteFile(path, []byte(op), 0)
	}
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	switch op {
	case "create":
		_, err = ctl.IoctlCreate(f)
	case "commit":
		err = ctl.IoctlCommit(f)
	case "abort":
		err = ctl.IoctlAbort(f)
	default:
		err = errors.New("unknown ioctl " + op)
	}
	return err
}

// asUser runs this test binary's fsop helper as uid and gid 65534 (with
// the given supplementary groups) and returns its answer: "ok" or the
// error.
func asUser(t *testing.T, groups, dir, op string, args ...string) string {
	t.Helper()
	cmd := exec.Command("setpriv", append(privArgs(groups), helper)...)
	cmd.Env = append(os.Environ(), "BRANCHFS_FSOP="+strings.Join(append([]string{dir, op}, args...), "\x1f"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helper: %v: %s", err, out)
	}
	return strings.TrimSpace(string(out))
}

func privArgs(groups string) []string {
	args := []string{"--reuid=65534", "--regid=65534"}
	if groups == "" {
		return append(args, "--clear-groups")
	}
	return append(args, "--groups="+groups)
}

// cliAs runs the branchfs command as uid 65534 and returns its exit status
// and stderr.
func cliAs(t *testing.T, groups string, args ...string) (int, string) {
	t.Helper()
	cmd := exec.Command("setpriv", append(append(privArgs(groups), binary), args...)...)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode(), string(out)
	}
	if err != nil {
		t.Fatalf("running branchfs: %v", err)
	}
	return 0, string(out)
}

type listEntry struct {
	Name  string `json:"name"`
	State string `json:"state"`
}

func (m *mount) list(extra ...string) []listEntry {
	m.t.Helper()
	var out []listEntry
	must(m.t, json.Unmarshal([]byte(m.ok(append([]string{"list", m.mnt, "--json"}, extra...)...)), &out))
	return out
}

func (m *mount) listNames(extra ...string) string {
	var names []string
	for _, e := range m.list(extra...) {
		names = append(names, e.Name+":"+e.State)
	}
	return strings.Join(names, " ")
}

// TestControlAuthorized: a user who neither mounted nor is root controls no
// branch by any path; a member of the mount's control group does.
func TestControlAuthorized(t *testing.T) {
	m := newMount(t, "")
	victim := m.create("victim")
	m.create("other")
	writeFile(t, filepath.Join(victim, "file"), "victim's\n")
	before := m.listNames()
	for _, c := range []struct{ path, op string }{
		{"@victim/file", "commit"},
		{"@victim/dir", "abort"},
		{"@victim", "commit"},
		{"@other", "abort"},
		{"", "create"},
		{"file", "create"},
		{"@victim/file", "create"},
	} {
		if got := asUser(t, "", m.mnt, "ioctl", c.path, c.op); got != syscall.EPERM.Error() {
			t.Errorf("ioctl %s on %s as nobody: %s, want EPERM", c.op, c.path, got)
		}
	}
	for _, c := range []struct{ path, cmd string }{
		{".branchfs_ctl", "create:x"}, {"@victim/.branchfs_ctl", "commit"}, {"@other/.branchfs_ctl", "abort"},
	} {
		if got := asUser(t, "", m.mnt, "ctl", c.path, c.cmd); !strings.HasSuffix(got, syscall.EACCES.Error()) {
			t.Errorf("%s to %s as nobody: %s, want EACCES", c.cmd, c.path, got)
		}
	}
	for _, args := range [][]string{
		{"create", "x", m.mnt},
		{"create", "y", m.mnt, "--parent", "victim"},
		{"commit", victim},
		{"abort", m.view("other")},
	} {
		if code, out := cliAs(t, "", args...); code == 0 {
			t.Errorf("nobody ran branchfs %v: %s", args, out)
		}
	}
	if after := m.listNames(); after != before {
		t.Errorf("branches changed from %q to %q", before, after)
	}
	wantContent(t, filepath.Join(m.base, "file"), "base file\n")

	// With --control-group, its members may; others still may not.
	m.ok("unmount", m.mnt)
	m.mounted = false
	m.args = []string{"--control-group", "4242"}
	m.start()
	fi, err := os.Stat(filepath.Join(m.mnt, ".branchfs_ctl"))
	must(t, err)
	if st := fi.Sys().(*syscall.Stat_t); fi.Mode().Perm() != 0o660 || st.Gid != 4242 {
		t.Errorf("control file: mode %v gid %d, want 0660 and the control group", fi.Mode(), st.Gid)
	}
	if got := asUser(t, "", m.mnt, "ioctl", "@other", "abort"); got != syscall.EPERM.Error() {
		t.Errorf("abort by a non-member: %s, want EPERM", got)
	}
	if got := asUser(t, "4242", m.mnt, "ioctl", "", "create"); got != "ok" {
		t.Errorf("create by a member: %s", got)
	}
	if code, out := cliAs(t, "4242", "abort", m.view("other")); code != 0 {
		t.Errorf("abort by a member: exit %d: %s", code, out)
	}
	if code, out := cliAs(t, "4242", "commit", victim); code != 0 {
		t.Errorf("commit by a member: exit %d: %s", code, out)
	}
	wantContent(t, filepath.Join(m.base, "file"), "victim's\n")
}

// TestCreateBadBuffer: a create whose name buffer cannot be written fails
// with EFAULT and makes no branch.
func TestCreateBadBuffer(t *testing.T) {
	m := newMount(t, "")
	before := m.listNames()
	ro, err := unix.Mmap(-1, 0, 4096, unix.PROT_READ, unix.MAP_PRIVATE|unix.MAP_ANON)
	must(t, err)
	defer unix.Munmap(ro)
	for _, addr := range []uintptr{0, uintptr(unsafe.Pointer(&ro[0]))} {
		err := ioctl(t, m.mnt, func(f *os.File) error {
			_, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), ctl.FS_IOC_BRANCH_CREATE, addr)
			return errno
		})
		wantErrno(t, err, syscall.EFAULT)
	}
	if after := m.listNames(); after != before {
		t.Errorf("a failed create changed the branches from %q to %q", before, after)
	}
}

// TestCreateIntoFileOfTheMount: a create whose name buffer lies in a page,
// not yet read, of a file of the mount itself is answered. Reaching the
// buffer reads the file through the mount, which the request loop's reader
// must then be free to answer (callerBufferPresent).
func TestCreateIntoFileOfTheMount(t *testing.T) {
	m := newMount(t, "off") // a passthrough file's pages are read below the mount
	must(t, os.WriteFile(filepath.Join(m.base, "page"), make([]byte, 4096), 0o644))
	f, err := os.Open(filepath.Join(m.mnt, "page"))
	must(t, err)
	defer f.Close()
	mem, err := unix.Mmap(int(f.Fd()), 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE)
	must(t, err)
	defer unix.Munmap(mem)
	done := make(chan error, 1)
	go func() {
		done <- ioctl(t, m.mnt, func(f *os.File) error {
			if _, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), ctl.FS_IOC_BRANCH_CREATE, uintptr(unsafe.Pointer(&mem[0]))); errno != 0 {
				return errno
			}
			return nil
		})
	}()
	select {
	case err := <-done:
		must(t, err)
	case <-time.After(opBound):
		var st unix.Stat_t
		must(t, unix.Stat(m.mnt, &st))
		abortConnection(st.Dev) // free the waiting process before failing
		t.Fatal("a create into a page of a file of the mount got no answer")
	}
	name := string(bytes.TrimRight(mem[:ctl.NameBufSize], "\x00"))
	if _, err := os.Stat(m.view(name)); err != nil {
		t.Errorf("the branch the create named: %v", err)
	}
}

// TestAbortedNameGone: once abort returns, MNT/@NAME is gone, for live and
// stale branches, also when the kernel had it cached.
func TestAbortedNameGone(t *testing.T) {
	m := newMount(t, "")
	for i := 0; i < 10; i++ {
		a, b := m.create("a"), m.create("b")
		readFile(t, filepath.Join(a, "dir", "a"))
		readFile(t, filepath.Join(b, "dir", "a"))
		writeFile(t, filepath.Join(a, "new"), "x")
		m.ok("commit", a)
		m.ok("abort", b) // stale
		c := m.create("c")
		readFile(t, filepath.Join(c, "file"))
		m.ok("abort", c)
		for _, p := range []string{a, b, c} {
			// access(F_OK) only walks the path: a name the kernel still
			// holds passes without asking the daemon.
			if err := unix.Access(p, unix.F_OK); !errors.Is(err, unix.ENOENT) {
				t.Fatalf("round %d: access %s after its end: %v", i, p, err)
			}
			if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("round %d: %s after its end: %v", i, p, err)
			}
		}
	}
}

// TestStaleBranchOfUserBase: with a base that root does not own, the
// kernel asks for the stale branch root's ACL on the way to its control
// file; the stale branch can still be committed (exit 3) and aborted.
func TestStaleBranchOfUserBase(t *testing.T) {
	m := newMount(t, "")
	must(t, filepath.Walk(m.base, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, 1000, 1000)
	}))
	a, b := m.create("a"), m.create("b")
	writeFile(t, filepath.Join(a, "file"), "a\n")
	readFile(t, filepath.Join(b, "dir", "a"))
	m.ok("commit", a)
	if _, errOut, code := m.cli("commit", b); code != 3 {
		t.Errorf("commit of the stale branch: exit %d, want 3: %s", code, errOut)
	}
	m.ok("abort", filepath.Join(b, "dir"))
	wantMissing(t, b)
	if got := m.listNames(); got != "main:live" {
		t.Errorf("list after the abort: %s", got)
	}
}

// TestControlFileByIdentity: the CLI never takes a user's file named
// .branchfs_ctl for the control file, inside a view or outside a mount.
func TestControlFileByIdentity(t *testing.T) {
	m := newMount(t, "")
	userCtl := filepath.Join(m.base, "dir", "sub", ".branchfs_ctl")
	writeFile(t, userCtl, "user's\n")
	b := m.create("b")
	writeFile(t, filepath.Join(b, "dir", "new"), "n\n")
	if out := m.ok("diff", filepath.Join(b, "dir", "sub")); out != "A dir/new\n" {
		t.Errorf("diff: %q", out)
	}
	m.ok("abort", filepath.Join(b, "dir", "sub"))
	wantMissing(t, b)
	wantContent(t, userCtl, "user's\n")

	outside := t.TempDir()
	fake := filepath.Join(outside, ".branchfs_ctl")
	writeFile(t, fake, "not ours\n")
	for _, args := range [][]string{{"commit", outside}, {"abort", outside}, {"diff", outside}, {"list", outside}, {"create", "x", outside}} {
		_, errOut, code := m.cli(args...)
		if code != 1 || !strings.Contains(errOut, "is not inside a branchfs mount") {
			t.Errorf("%v: exit %d: %q", args, code, errOut)
		}
	}
	wantContent(t, fake, "not ours\n")
}

// TestMountPointCommands: run, the patterns and unmount, given a path
// inside a mount that is not its mount point, say where the mount point is
// and change nothing.
func TestMountPointCommands(t *testing.T) {
	m := newMount(t, "")
	b := m.create("b")
	for _, p := range []string{filepath.Join(m.mnt, "dir"), b} {
		for _, args := range [][]string{{"run", p, "--", "true"}, {"speculate", "-c", "true", p}, {"unmount", p}} {
			_, errOut, code := m.cli(args...)
			if want := p + " is inside the branchfs mount at " + m.mnt; code != 1 || !strings.Contains(errOut, want) {
				t.Errorf("%v: exit %d: %q, want %q", args, code, errOut, want)
			}
		}
	}
	if out := m.ok("list", m.mnt); strings.Count(out, "\n") != 3 {
		t.Errorf("list after the refused commands:\n%s", out)
	}
}

// TestDiffShowsDirectoryMeta: diff lists a directory whose mode, owner or
// xattrs the commit changes, and not one that only gained an entry.
func TestDiffShowsDirectoryMeta(t *testing.T) {
	m := newMount(t, "")
	b := m.create("b")
	must(t, os.Chmod(filepath.Join(b, "dir"), 0o700))
	must(t, unix.Setxattr(filepath.Join(b, "dir", "sub"), "user.note", []byte("v"), 0))
	must(t, os.Mkdir(filepath.Join(b, "other"), 0o755))
	must(t, os.Mkdir(filepath.Join(m.base, "plain"), 0o755))
	writeFile(t, filepath.Join(b, "plain", "new"), "n\n")
	want := "A other/\nA plain/new\nM dir/\nM dir/sub/\n"
	if out := m.ok("diff", b); out != want {
		t.Errorf("diff:\n%s\nwant:\n%s", out, want)
	}
	m.ok("commit", b)
	fi, err := os.Stat(filepath.Join(m.base, "dir"))
	must(t, err)
	if fi.Mode().Perm() != 0o700 {
		t.Errorf("commit left dir at %v", fi.Mode())
	}
}

// TestNestingRefused: a store inside the base or the mount point, and a
// mount point inside the base, are refused with a clear error.
func TestNestingRefused(t *testing.T) {
	dir := t.TempDir()
	base, mnt, store := filepath.Join(dir, "base"), filepath.Join(dir, "mnt"), filepath.Join(dir, "store")
	sampleTree(t, base)
	must(t, os.Mkdir(mnt, 0o755))
	must(t, os.Mkdir(filepath.Join(base, "m"), 0o755))
	link := filepath.Join(dir, "link")
	must(t, os.Symlink(base, link))
	m := &mount{t: t}
	for _, c := range []struct{ store, mnt, want string }{
		{filepath.Join(base, ".st"), mnt, "store"},
		{filepath.Join(link, "deeper", ".st"), mnt, "store"},
		{filepath.Join(mnt, ".st"), mnt, "store"},
		{store, filepath.Join(base, "m"), "mount point"},
		{store, base, "mount point"},
		{filepath.Join(base, "m", ".st"), filepath.Join(base, "m"), "store"},
	} {
		_, errOut, code := m.cli("mount", "--base", base, "--store", c.store, c.mnt)
		if code != 1 || !strings.Contains(errOut, "the "+c.want+" ") || !strings.Contains(errOut, "is inside the") {
			t.Errorf("store %s, mount point %s: exit %d: %q", c.store, c.mnt, code, errOut)
		}
		if code == 0 {
			unix.Unmount(c.mnt, unix.MNT_DETACH)
		}
		data, _ := os.ReadFile("/proc/self/mountinfo")
		if strings.Contains(string(data), dir) {
			t.Fatalf("store %s, mount point %s: mounted", c.store, c.mnt)
		}
	}
	if _, err := os.Stat(filepath.Join(base, ".st")); err == nil {
		t.Errorf("a refused mount made its store in the base")
	}
}

// TestMountBadPaths: a base or mount point that is missing or not a
// directory is refused in one line that says so, before the store is made
// (the branching library's tests match "does not exist").
func TestMountBadPaths(t *testing.T) {
	dir := t.TempDir()
	base, mnt, file := filepath.Join(dir, "base"), filepath.Join(dir, "mnt"), filepath.Join(dir, "file")
	sampleTree(t, base)
	must(t, os.Mkdir(mnt, 0o755))
	writeFile(t, file, "x")
	missing := filepath.Join(dir, "nosuch")
	m := &mount{t: t}
	for i, c := range []struct{ base, mnt, want string }{
		{missing, mnt, "the base " + missing + " does not exist"},
		{file, mnt, "the base " + file + " is not a directory"},
		{base, missing, "the mount point " + missing + " does not exist"},
		{base, file, "the mount point " + file + " is not a directory"},
	} {
		store := filepath.Join(dir, "store"+strconv.Itoa(i))
		_, errOut, code := m.cli("mount", "--base", c.base, "--storage", store, c.mnt)
		if code != 1 || !strings.Contains(errOut, c.want) || strings.Count(errOut, "\n") != 1 {
			t.Errorf("base %s, mount point %s: exit %d: %q; want %q", c.base, c.mnt, code, errOut, c.want)
		}
		if code == 0 {
			unix.Unmount(c.mnt, unix.MNT_DETACH)
		}
		if _, err := os.Stat(store); !os.IsNotExist(err) {
			t.Errorf("base %s, mount point %s: the refused mount made its store (%v)", c.base, c.mnt, err)
		}
	}
}

// TestFinishedBranchesLeave: committed and aborted branches leave list
// (list --all shows them, also after a remount), the log stays bounded,
// generated names never come back, not after a remount either.
func TestFinishedBranchesLeave(t *testing.T) {
	m := newMount(t, "")
	ctlFile := filepath.Join(m.mnt, ".branchfs_ctl")
	seen := map[string]bool{}
	gen := func() string {
		t.Helper()
		f, err := os.Open(ctlFile)
		must(t, err)
		defer f.Close()
		name, err := ctl.IoctlCreate(f)
		must(t, err)
		if seen[name] {
			t.Fatalf("generated name %s handed out twice", name)
		}
		seen[name] = true
		return name
	}
	for i := 0; i < 3; i++ {
		a, b := gen(), gen()
		writeFile(t, filepath.Join(m.view(a), "f"), "x")
		m.ok("commit", m.view(a))
		m.ok("abort", m.view(b))
	}
	if got := m.listNames(); got != "main:live" {
		t.Errorf("list after commits and aborts: %s", got)
	}
	all := m.listNames("--all")
	if strings.Count(all, ":committed") != 3 || strings.Count(all, ":aborted") != 3 {
		t.Errorf("list --all: %s", all)
	}
	m.ok("unmount", m.mnt)
	m.start()
	if again := m.listNames("--all"); again != all {
		t.Errorf("list --all after a remount: %s, was %s", again, all)
	}
	for i := 0; i < 3; i++ {
		m.ok("abort", m.view(gen()))
	}
	// Many more rounds: the log is compacted as it goes.
	name := "n" + strings.Repeat("x", 100)
	for i := 0; i < 1500; i++ {
		must(t, os.WriteFile(ctlFile, []byte("create:"+name), 0))
		must(t, os.WriteFile(filepath.Join(m.view(name), ".branchfs_ctl"), []byte("abort"), 0))
	}
	fi, err := os.Stat(filepath.Join(m.store, "log"))
	must(t, err)
	log := readFile(t, filepath.Join(m.store, "log"))
	if used := len(strings.TrimRight(log, "\x00")); used > 300<<10 {
		t.Errorf("log holds %d bytes (file %d) after 1500 aborted branches", used, fi.Size())
	}
	if got := m.listNames(); got != "main:live" {
		t.Errorf("list: %s", got)
	}
	// The latest 32 finished, through compactions and a remount.
	m.ok("unmount", m.mnt)
	m.start()
	if all := m.listNames("--all"); strings.Count(all, name+":aborted") != 32 {
		t.Errorf("list --all after compactions and a remount: %s", all)
	}
}

// TestNameErrorsShowCharacters: a bad name's error quotes the character
// it holds; a name of any script is a good one.
func TestNameErrorsShowCharacters(t *testing.T) {
	m := newMount(t, "")
	_, errOut, code := m.cli("create", "a/b", m.mnt)
	if code != 1 || !strings.Contains(errOut, "'/'") {
		t.Errorf("create a/b: exit %d: %q", code, errOut)
	}
	// A name is as free as a file name: letters of any script are fine.
	m.ok("create", "café", m.mnt)
	if _, err := os.Stat(m.view("café")); err != nil {
		t.Errorf("create café: %v", err)
	}
}

// TestReferenceClientFlags: the reference implementation's spellings work:
// --storage for --store (mount and unmount), -p for --parent, a bare
// --passthrough, and --list-branches shows live branches in MNT's listing.
func TestReferenceClientFlags(t *testing.T) {
	dir := t.TempDir()
	base, store, mnt := filepath.Join(dir, "base"), filepath.Join(dir, "store"), filepath.Join(dir, "mnt")
	sampleTree(t, base)
	must(t, os.Mkdir(mnt, 0o755))
	m := &mount{t: t, base: base, store: store, mnt: mnt}
	m.ok("mount", "--base", base, "--storage", store, "--passthrough", "--list-branches", mnt)
	m.mounted = true
	t.Cleanup(m.cleanup)
	if _, err := os.Stat(filepath.Join(store, "log")); err != nil {
		t.Fatalf("--storage did not place the store: %v", err)
	}
	m.create("p")
	m.ok("create", "kid", mnt, "-p", "p")
	m.create("other")
	names := func() string {
		ents, err := os.ReadDir(mnt)
		must(t, err)
		var out []string
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), "@") {
				out = append(out, e.Name())
			}
		}
		return strings.Join(out, " ")
	}
	// p has a live child: p is live too, and all three are listed.
	if got := names(); got != "@kid @other @p" {
		t.Errorf("root listing shows %q", got)
	}
	m.ok("abort", m.view("other"))
	if got := names(); got != "@kid @p" {
		t.Errorf("root listing after an abort shows %q", got)
	}
	list := m.list()
	if len(list) != 3 || list[1].Name != "kid" {
		t.Errorf("list: %v", list)
	}
	data, err := os.ReadFile("/proc/self/mountinfo")
	must(t, err)
	if !strings.Contains(string(data), mnt) {
		t.Fatal("not mounted")
	}
	m.ok("unmount", mnt, "--storage", store)
	m.mounted = false
	data, err = os.ReadFile("/proc/self/mountinfo")
	must(t, err)
	if strings.Contains(string(data), mnt+" ") {
		t.Errorf("unmount --storage left the mount")
	}
	// The daemon log tells the passthrough mode it was given.
	m.ok("mount", "--base", base, "--store", store, "--passthrough", "off", mnt)
	m.mounted = true
	if got := names(); got != "" {
		t.Errorf("without --list-branches the root listing shows %q", got)
	}
}

// TestListCountsAndMessages: list counts the files a branch wrote (not
// the directories copied up on the way, nor tombstones) and gives main no
// creation time; the CLI tells each error once, in the core's words.
func TestListCountsAndMessages(t *testing.T) {
	m := newMount(t, "")
	b := m.create("b")
	writeFile(t, filepath.Join(b, "dir", "sub", "b"), "changed\n")
	must(t, os.Remove(filepath.Join(b, "file")))
	var list []map[string]any
	must(t, json.Unmarshal([]byte(m.ok("list", m.mnt, "--json")), &list))
	if len(list) != 2 || list[1]["delta_files"] != float64(1) || list[1]["delta_bytes"] != float64(len("changed\n")) {
		t.Errorf("list: %v, want b with 1 file of 8 bytes", list)
	}
	if _, ok := list[0]["created"]; ok {
		t.Errorf("main has a creation time: %v", list[0])
	}
	if out := m.ok("list", m.mnt); !strings.Contains(out, "1 file, 8 bytes") {
		t.Errorf("list:\n%s", out)
	}

	s := m.create("s")
	m.ok("commit", b)
	_, errOut, code := m.cli("commit", s)
	if want := "branchfs: commit s: " + branch.ErrStale.Error() + " (nothing was committed)\n"; code != 3 || errOut != want {
		t.Errorf("commit of a stale branch: exit %d: %q, want %q", code, errOut, want)
	}
	for _, op := range []string{"commit", "abort", "diff"} {
		_, errOut, code := m.cli(op, m.view("nosuch"))
		if want := "branchfs: " + op + " nosuch: " + branch.ErrNotFound.Error(); code != 1 || !strings.HasPrefix(errOut, want) {
			t.Errorf("%s of no branch: exit %d: %q, want %q", op, code, errOut, want)
		}
	}
	m.ok("create", "x", m.mnt)
	_, errOut, _ = m.cli("create", "x", m.mnt)
	if want := "branchfs: create x: " + branch.ErrExists.Error() + "\n"; errOut != want {
		t.Errorf("create of a taken name: %q, want %q", errOut, want)
	}
}

// TestRunNotAllowed: a user who may not control the mount's branches is
// told so by the commands that run processes in branches, not that the
// mount is none.
func TestRunNotAllowed(t *testing.T) {
	m := newMount(t, "")
	m.create("victim")
	for _, args := range [][]string{
		{"run", m.mnt, "--", "true"},
		{"speculate", m.mnt, "-c", "true"},
		{"checkpoint", "victim", m.mnt, "--run-id", "victim"},
		{"restore", "victim", m.mnt},
	} {
		code, out := cliAs(t, "", args...)
		if want := m.mnt + ": permission denied"; code != 1 || !strings.Contains(out, want) || strings.Count(out, "\n") != 1 {
			t.Errorf("branchfs %s as nobody: exit %d: %q, want one line with %q", args[0], code, out, want)
		}
	}
}
