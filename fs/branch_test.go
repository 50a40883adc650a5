package fs_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/branchfs/branchfs/ctl"
	"golang.org/x/sys/unix"
)

// ioctl opens path and runs one of the branch ioctls on it.
func ioctl(t *testing.T, path string, do func(*os.File) error) error {
	t.Helper()
	f, err := os.Open(path)
	must(t, err)
	defer f.Close()
	return do(f)
}

func createVia(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	must(t, err)
	defer f.Close()
	name, err := ctl.IoctlCreate(f)
	must(t, err)
	return name
}

func TestCopyOnWriteIsolation(t *testing.T) {
	m := newMount(t, "")
	b1, b2 := m.create("b1"), m.create("b2")
	writeFile(t, filepath.Join(b1, "file"), "changed in b1\n")
	writeFile(t, filepath.Join(b1, "dir", "new"), "new in b1\n")
	must(t, os.Chmod(filepath.Join(b1, "dir", "a"), 0o600))
	must(t, unix.Setxattr(filepath.Join(b1, "dir", "sub", "b"), "user.k", []byte("v"), 0))
	for _, root := range []string{m.base, m.mnt, b2} {
		wantContent(t, filepath.Join(root, "file"), "base file\n")
		wantMissing(t, filepath.Join(root, "dir", "new"))
		fi, err := os.Stat(filepath.Join(root, "dir", "a"))
		must(t, err)
		if fi.Mode().Perm() != 0o644 {
			t.Errorf("%s: chmod leaked: %v", root, fi.Mode())
		}
		if _, err := unix.Getxattr(filepath.Join(root, "dir", "sub", "b"), "user.k", nil); err == nil {
			t.Errorf("%s: setxattr leaked", root)
		}
	}
	wantContent(t, filepath.Join(b1, "file"), "changed in b1\n")
	// Creation is O(1): nothing of the base is copied.
	out := m.ok("list", m.mnt, "--json")
	if !strings.Contains(out, `"name":"b2","parent":"main","state":"live","epoch":0,"delta_bytes":0,"delta_files":0`) {
		t.Errorf("fresh branch b2 is not empty: %s", out)
	}
}

func TestTombstonesAndOpaqueDirs(t *testing.T) {
	m := newMount(t, "")
	b := m.create("b")
	must(t, os.Remove(filepath.Join(b, "file")))
	must(t, os.RemoveAll(filepath.Join(b, "dir")))
	wantMissing(t, filepath.Join(b, "file"))
	wantMissing(t, filepath.Join(b, "dir"))
	must(t, os.Mkdir(filepath.Join(b, "dir"), 0o755))
	if ents, _ := os.ReadDir(filepath.Join(b, "dir")); len(ents) != 0 {
		t.Fatalf("recreated dir shows the old entries: %v", ents)
	}
	writeFile(t, filepath.Join(b, "dir", "fresh"), "fresh\n")
	writeFile(t, filepath.Join(b, "file"), "reborn\n")
	wantContent(t, filepath.Join(m.base, "dir", "a"), "a\n")
	m.ok("commit", b)
	// The kernel has the view's root cached; the name is gone at once.
	wantMissing(t, b)
	ents, err := os.ReadDir(filepath.Join(m.base, "dir"))
	must(t, err)
	if len(ents) != 1 || ents[0].Name() != "fresh" {
		t.Errorf("base dir after commit = %v, want [fresh]", ents)
	}
	wantContent(t, filepath.Join(m.base, "file"), "reborn\n")
	wantContent(t, filepath.Join(m.mnt, "dir", "fresh"), "fresh\n")
	// Nothing internal reaches the base.
	filepath.Walk(m.base, func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			t.Errorf("tombstone left in base: %s", p)
		}
		if names, _ := listxattr(p); strings.Contains(names, "branchfs") {
			t.Errorf("internal xattr left in base: %s %q", p, names)
		}
		return nil
	})
}

func listxattr(p string) (string, error) {
	buf := make([]byte, 4096)
	n, err := unix.Llistxattr(p, buf)
	if err != nil {
		return "", err
	}
	return string(buf[:n]), nil
}

func TestRenameBaseDirectories(t *testing.T) {
	m := newMount(t, "")
	b := m.create("b")
	must(t, os.Rename(filepath.Join(b, "dir"), filepath.Join(b, "moved")))
	wantMissing(t, filepath.Join(b, "dir"))
	wantContent(t, filepath.Join(b, "moved", "sub", "b"), "b\n")
	must(t, os.Rename(filepath.Join(b, "file"), filepath.Join(b, "moved", "file")))
	wantContent(t, filepath.Join(b, "moved", "file"), "base file\n")
	wantContent(t, filepath.Join(m.base, "dir", "a"), "a\n")
	m.ok("commit", b)
	wantMissing(t, filepath.Join(m.base, "dir"))
	wantMissing(t, filepath.Join(m.base, "file"))
	wantContent(t, filepath.Join(m.base, "moved", "a"), "a\n")
	wantContent(t, filepath.Join(m.base, "moved", "sub", "b"), "b\n")
	wantContent(t, filepath.Join(m.base, "moved", "file"), "base file\n")
}

func TestHardlinkOfBaseFile(t *testing.T) {
	m := newMount(t, "")
	b := m.create("b")
	must(t, os.Link(filepath.Join(b, "file"), filepath.Join(b, "file2")))
	var s1, s2 syscall.Stat_t
	must(t, syscall.Stat(filepath.Join(b, "file"), &s1))
	must(t, syscall.Stat(filepath.Join(b, "file2"), &s2))
	if s1.Ino != s2.Ino || s1.Nlink != 2 {
		t.Errorf("link in branch: ino %d/%d nlink %d", s1.Ino, s2.Ino, s1.Nlink)
	}
	must(t, syscall.Stat(filepath.Join(m.base, "file"), &s1))
	if s1.Nlink != 1 {
		t.Errorf("base file got a link: nlink %d", s1.Nlink)
	}
	m.ok("commit", b)
	must(t, syscall.Stat(filepath.Join(m.base, "file"), &s1))
	must(t, syscall.Stat(filepath.Join(m.base, "file2"), &s2))
	if s1.Ino != s2.Ino || s1.Nlink != 2 {
		t.Errorf("after commit: ino %d/%d nlink %d", s1.Ino, s2.Ino, s1.Nlink)
	}
}

// readOpenedBefore checks a read of f, opened read-only before its branch
// went stale or ended: through the daemon (--passthrough off) it fails with
// ESTALE; with passthrough (the default) the kernel reads the file f
// opened, as overlayfs's open files do, and that still holds want.
func readOpenedBefore(t *testing.T, mode string, f *os.File, want string) {
	t.Helper()
	buf := make([]byte, 64)
	n, err := f.ReadAt(buf, 0)
	if mode == "off" {
		if !errors.Is(err, syscall.ESTALE) {
			t.Errorf("read of %s opened before: %q %v, want ESTALE", f.Name(), buf[:n], err)
		}
		return
	}
	if string(buf[:n]) != want || err != io.EOF {
		t.Errorf("read of %s opened before: %q %v, want %q", f.Name(), buf[:n], err, want)
	}
}

func TestStaleBranch(t *testing.T) {
	for _, mode := range []string{"", "off"} {
		t.Run("passthrough="+mode, func(t *testing.T) { testStaleBranch(t, mode) })
	}
}

func testStaleBranch(t *testing.T, mode string) {
	m := newMount(t, mode)
	b1, b2 := m.create("b1"), m.create("b2")
	writeFile(t, filepath.Join(b2, "mine"), "b2\n")
	r, err := os.Open(filepath.Join(b2, "file"))
	must(t, err)
	defer r.Close()
	w, err := os.OpenFile(filepath.Join(b2, "mine"), os.O_RDWR, 0)
	must(t, err)
	defer w.Close()
	writeFile(t, filepath.Join(b1, "file"), "b1 wins\n")
	m.ok("commit", b1)
	buf := make([]byte, 16)
	readOpenedBefore(t, mode, r, "base file\n")
	_, err = w.WriteAt([]byte("late"), 0)
	wantErrno(t, err, syscall.ESTALE)
	_, err = w.ReadAt(buf, 0)
	wantErrno(t, err, syscall.ESTALE)
	_, err = os.Stat(filepath.Join(b2, "mine"))
	wantErrno(t, err, syscall.ESTALE)
	_, err = os.Create(filepath.Join(b2, "newer"))
	wantErrno(t, err, syscall.ESTALE)
	_, errOut, code := m.cli("commit", b2)
	if code != 3 || !strings.Contains(errOut, "b2") || !strings.Contains(errOut, "stale") {
		t.Errorf("commit of stale branch: exit %d, %q; want exit 3 naming b2", code, errOut)
	}
	wantContent(t, filepath.Join(m.base, "file"), "b1 wins\n")
	wantMissing(t, filepath.Join(m.base, "mine"))
	m.ok("abort", b2)
	if out := m.ok("list", m.mnt); strings.Contains(out, "b2") {
		t.Errorf("aborted branch still listed:\n%s", out)
	}
}

// TestConcurrentCommits: of 16 siblings committing at once, exactly one wins.
func TestConcurrentCommits(t *testing.T) {
	m := newMount(t, "")
	for round := 0; round < 5; round++ {
		var views []string
		for i := 0; i < 16; i++ {
			name := createVia(t, filepath.Join(m.mnt, ".branchfs_ctl"))
			v := m.view(name)
			writeFile(t, filepath.Join(v, "winner"), name)
			views = append(views, v)
		}
		files := make([]*os.File, len(views))
		for i, v := range views {
			f, err := os.Open(filepath.Join(v, "winner"))
			must(t, err)
			files[i] = f
		}
		var wg sync.WaitGroup
		start := make(chan struct{})
		errs := make([]error, len(views))
		for i, f := range files {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				errs[i] = ctl.IoctlCommit(f)
			}()
		}
		close(start)
		wg.Wait()
		for _, f := range files {
			f.Close()
		}
		winners := 0
		var winner string
		for i, err := range errs {
			switch {
			case err == nil:
				winners++
				winner = filepath.Base(views[i])[1:]
			case !errors.Is(err, syscall.ESTALE):
				t.Errorf("round %d: commit %s: %v, want ESTALE", round, views[i], err)
			}
		}
		if winners != 1 {
			t.Fatalf("round %d: %d winners", round, winners)
		}
		wantContent(t, filepath.Join(m.base, "winner"), winner)
		for _, v := range views {
			if filepath.Base(v)[1:] != winner {
				must(t, ioctl(t, filepath.Join(v, ".branchfs_ctl"), ctl.IoctlAbort))
			}
		}
	}
}

func TestFrozenOrigin(t *testing.T) {
	m := newMount(t, "")
	writeFile(t, filepath.Join(m.mnt, "before"), "writable without branches\n")
	b1 := m.create("b1")
	_, err := os.Create(filepath.Join(m.mnt, "after"))
	wantErrno(t, err, syscall.EROFS)
	wantContent(t, filepath.Join(m.mnt, "file"), "base file\n")
	b2 := m.create("b2", "b1")
	_, err = os.Create(filepath.Join(b1, "x"))
	wantErrno(t, err, syscall.EROFS)
	writeFile(t, filepath.Join(b2, "x"), "nested\n")
	_, errOut, code := m.cli("abort", b1)
	if code != 1 || !strings.Contains(errOut, "live child") {
		t.Errorf("abort with live child: exit %d %q", code, errOut)
	}
	m.ok("commit", b2)
	wantContent(t, filepath.Join(b1, "x"), "nested\n")
	wantMissing(t, filepath.Join(m.mnt, "x"))
	writeFile(t, filepath.Join(b1, "y"), "b1 writable again\n")
	m.ok("commit", b1)
	wantContent(t, filepath.Join(m.base, "x"), "nested\n")
	wantContent(t, filepath.Join(m.base, "y"), "b1 writable again\n")
	writeFile(t, filepath.Join(m.mnt, "after"), "main writable again\n")
}

func TestAbortRecursive(t *testing.T) {
	m := newMount(t, "")
	p := m.create("p")
	c := m.create("c", "p")
	writeFile(t, filepath.Join(c, "f"), "x")
	for _, v := range []string{p, c} {
		_, err := os.Stat(v) // so that the kernel holds both roots
		must(t, err)
	}
	m.ok("abort", "--recursive", p)
	// Both names are gone at once, not only once the kernel has dropped
	// the views, which follows the reply.
	wantMissing(t, c)
	wantMissing(t, p)
	out := m.ok("list", m.mnt)
	if strings.Contains(out, "p ") || strings.Contains(out, "c ") {
		t.Errorf("branches left after recursive abort:\n%s", out)
	}
	wantMissing(t, m.view("c"))
	writeFile(t, filepath.Join(m.mnt, "f"), "main is writable again")
}

// A branch's name shows at once in every case the kernel may have cached
// something under it: nothing (looked up before, not there), a base file
// of that name, and the root of a view of that name just aborted.
func TestBranchNameShowsAtOnce(t *testing.T) {
	m := newMount(t, "")
	for i := 0; i < 2; i++ {
		wantMissing(t, m.view("x"))
	}
	x := m.create("x")
	wantContent(t, filepath.Join(x, "file"), "base file\n")

	writeFile(t, filepath.Join(m.base, "@y"), "a base file named @y\n")
	wantContent(t, m.view("y"), "a base file named @y\n")
	y := m.create("y")
	if fi, err := os.Stat(y); err != nil || !fi.IsDir() {
		t.Fatalf("%s after create: %v, %v; want the branch root", y, fi, err)
	}

	// Through the control files, so that the create follows the abort
	// within the moment before the kernel drops the old root.
	writeFile(t, filepath.Join(x, "mine"), "x\n")
	writeFile(t, filepath.Join(x, ".branchfs_ctl"), "abort")
	writeFile(t, filepath.Join(m.mnt, ".branchfs_ctl"), "create:x")
	wantContent(t, filepath.Join(x, "file"), "base file\n")
	wantMissing(t, filepath.Join(x, "mine"))
}

// TestNotifyWhileRootLookupsWait: a commit that drops names in the mount
// root, and a create that has to drop one the kernel holds (the root of a
// branch just committed), tell the kernel so while lookups in the mount
// root wait for their answers. The kernel drops a name under its
// directory's lock, which a lookup holds until answered: with no other
// reader the two would wait for each other.
func TestNotifyWhileRootLookupsWait(t *testing.T) {
	m := newMount(t, "")
	var st unix.Stat_t
	must(t, unix.Stat(m.mnt, &st))
	stop := make(chan struct{})
	var lookups sync.WaitGroup
	lookups.Add(1)
	go func() {
		defer lookups.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
				os.Lstat(filepath.Join(m.mnt, fmt.Sprintf("missing-%d", i))) // a new name each time: no negative entry
			}
		}
	}()
	done := make(chan error, 1)
	go func() {
		done <- func() error {
			x := m.view("x")
			ctl := filepath.Join(m.mnt, ".branchfs_ctl")
			if err := os.WriteFile(ctl, []byte("create:x"), 0o644); err != nil {
				return err
			}
			for i := 0; i < 100; i++ {
				if err := os.WriteFile(filepath.Join(x, fmt.Sprintf("new-%d", i)), nil, 0o644); err != nil {
					return err
				}
				if err := os.WriteFile(filepath.Join(x, ".branchfs_ctl"), []byte("commit"), 0o644); err != nil {
					return err
				}
				// While the kernel may still hold the committed
				// branch's root: the create must drop it.
				if err := os.WriteFile(ctl, []byte("create:x"), 0o644); err != nil {
					return err
				}
			}
			return nil
		}()
	}()
	select {
	case err := <-done:
		must(t, err)
	case <-time.After(time.Minute):
		abortConnection(st.Dev) // free the waiting processes before failing
		t.Error("notifications and lookups in the mount root wait for each other")
	}
	close(stop)
	lookups.Wait()
}

// TestCopyUpHoldsUpNoOtherRequest: the first open for writing of a large
// base file, or the first change of its attributes, copies it up, which
// takes a while; the daemon answers other requests meanwhile (on the
// request loop's reader, an open for writing goes to a worker by its
// flags, a change of attributes when the file system finds it would copy
// up: transport.OnWorker).
func TestCopyUpHoldsUpNoOtherRequest(t *testing.T) {
	m := newMount(t, "")
	bigFile(t, filepath.Join(m.base, "big"), 256)
	for i, c := range []struct {
		what   string
		change func(p string) error
	}{
		{"open for writing", openForWriting},
		{"chmod", func(p string) error { return os.Chmod(p, 0o600) }},
		{"utimes", func(p string) error { return os.Chtimes(p, time.Unix(1, 0), time.Unix(1, 0)) }},
		{"setxattr", func(p string) error { return unix.Setxattr(p, "user.k", []byte("v"), 0) }},
	} {
		t.Run(c.what, func(t *testing.T) {
			notHeldUp(t, "lookups waited for the copy-up of another file ("+c.what+")", func(try int) bool {
				x := m.create(fmt.Sprintf("x%d-%d", i, try))
				_, changed := copyUpInFlight(t, m, filepath.Join(x, "big"), c.change)
				lookUpMissing(t, x)
				select {
				case err := <-changed:
					must(t, err)
					return true
				default:
					must(t, <-changed)
					return false
				}
			})
		})
	}
}

// notHeldUp runs try, which reports whether a copy ended before the
// requests made meanwhile were answered, until one did not, and fails
// with what if three did in a row. The copy runs in the kernel while the
// requests need this process and the daemon on a CPU: on a busy machine
// it can end first without having held them up, but a copy that holds
// them up ends first every time.
func notHeldUp(t *testing.T, what string, try func(n int) bool) {
	t.Helper()
	const tries = 3
	for n := 0; n < tries; n++ {
		if !try(n) {
			return
		}
	}
	t.Fatalf("%s, %d times out of %d", what, tries, tries)
}

// lookUpMissing looks up names in dir that nobody asked for yet: each one
// a request to the daemon.
func lookUpMissing(t *testing.T, dir string) {
	t.Helper()
	for i := 0; i < 5; i++ {
		if _, err := os.Lstat(filepath.Join(dir, fmt.Sprintf("missing-%d", i))); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("lookup of a missing name: %v", err)
		}
	}
}

// openForWriting opens p for writing and closes it.
func openForWriting(p string) error {
	f, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err == nil {
		f.Close()
	}
	return err
}

// bigFile writes a file of mib MiB.
func bigFile(t *testing.T, p string, mib int) {
	t.Helper()
	f, err := os.Create(p)
	must(t, err)
	chunk := bytes.Repeat([]byte("x"), 1<<20)
	for i := 0; i < mib; i++ {
		_, err := f.Write(chunk)
		must(t, err)
	}
	must(t, f.Close())
}

// copyUpInFlight changes p, a large file of a branch's lower layer, by
// change (openForWriting, say), and returns once the daemon is copying it
// up: copying reports whether it still is, and changed the change's
// outcome once it is done.
func copyUpInFlight(t *testing.T, m *mount, p string, change func(p string) error) (copying func() bool, changed <-chan error) {
	t.Helper()
	pid, err := os.ReadFile(filepath.Join(m.store, "daemon.pid"))
	must(t, err)
	fds := filepath.Join("/proc", strings.TrimSpace(string(pid)), "fd")
	// The copy goes to an unnamed file in the delta until it is complete.
	copying = func() bool {
		entries, _ := os.ReadDir(fds)
		for _, e := range entries {
			target, _ := os.Readlink(filepath.Join(fds, e.Name()))
			if strings.HasPrefix(target, m.store) && strings.HasSuffix(target, " (deleted)") {
				return true
			}
		}
		return false
	}
	done := make(chan error, 1)
	go func() { done <- change(p) }()
	for deadline := time.Now().Add(10 * time.Second); !copying(); {
		select {
		case err := <-done:
			t.Fatalf("the change returned (%v) before its copy-up was seen", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("no copy-up seen")
		}
	}
	return copying, done
}

func TestBadInput(t *testing.T) {
	m := newMount(t, "")
	for _, name := range []string{"", ".", "..", "a/b", "a\nb/c", strings.Repeat("x", 255), "\xff", "main"} {
		_, errOut, code := m.cli("create", name, m.mnt)
		if code != 1 || errOut == "" || strings.Count(errOut, "\n") != 1 {
			t.Errorf("create %q: exit %d, stderr %q; want exit 1 and one line", name, code, errOut)
		}
	}
	m.ok("create", strings.Repeat("x", 254), m.mnt)
	_, errOut, code := m.cli("create", strings.Repeat("x", 254), m.mnt)
	if code != 1 || !strings.Contains(errOut, "exists") {
		t.Errorf("duplicate name: exit %d %q", code, errOut)
	}
	// Commit and abort of the main view are refused.
	wantErrno(t, ioctl(t, filepath.Join(m.mnt, "file"), ctl.IoctlCommit), syscall.EINVAL)
	wantErrno(t, ioctl(t, filepath.Join(m.mnt, ".branchfs_ctl"), ctl.IoctlAbort), syscall.EINVAL)
	if _, _, code := m.cli("commit", m.mnt); code != 1 {
		t.Errorf("commit of main view: exit %d", code)
	}
	// Unknown ioctls are ENOTTY, as on any file.
	wantErrno(t, ioctl(t, filepath.Join(m.mnt, "file"), func(f *os.File) error {
		_, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), 'b'<<8|9, 0)
		return errno
	}), syscall.ENOTTY)
	// The CLI refuses paths outside a mount.
	if _, _, code := m.cli("commit", m.base); code != 1 {
		t.Errorf("commit outside a mount: exit %d", code)
	}
	if out := m.ok("list", m.mnt, "--json"); strings.Count(out, `"name"`) != 2 {
		t.Errorf("bad input changed the branch list: %s", out)
	}
}

// TestNoEscape: nothing outside the base is reached through symlinks, in
// the base or planted in a delta.
func TestNoEscape(t *testing.T) {
	m := newMount(t, "")
	outside := t.TempDir()
	writeFile(t, filepath.Join(outside, "secret"), "outside\n")
	must(t, os.Symlink(outside, filepath.Join(m.base, "out")))
	b := m.create("b")
	// Replace the symlink with a directory in the branch and commit: the
	// commit removes the link, never what it points to.
	must(t, os.Remove(filepath.Join(b, "out")))
	must(t, os.Mkdir(filepath.Join(b, "out"), 0o755))
	writeFile(t, filepath.Join(b, "out", "secret"), "inside\n")
	m.ok("commit", b)
	wantContent(t, filepath.Join(outside, "secret"), "outside\n")
	wantContent(t, filepath.Join(m.base, "out", "secret"), "inside\n")
	// A symlink planted in a delta where a directory was is not followed.
	b2 := m.create("b2")
	writeFile(t, filepath.Join(b2, "dir", "mine"), "x")
	delta := filepath.Join(m.store, "deltas", "b2")
	must(t, os.RemoveAll(filepath.Join(delta, "dir")))
	must(t, os.Symlink(outside, filepath.Join(delta, "dir")))
	_, err := os.ReadFile(filepath.Join(b2, "dir", "secret"))
	if err == nil {
		t.Errorf("read through a planted symlink succeeded")
	}
	if err := os.WriteFile(filepath.Join(b2, "dir", "secret"), []byte("pwned"), 0o644); err == nil {
		t.Errorf("write through a planted symlink succeeded")
	}
	wantContent(t, filepath.Join(outside, "secret"), "outside\n")
}

// TestPassthroughCopyUp: a branch's writes never land in the base, even
// while another process holds the base file open with passthrough.
func TestPassthroughCopyUp(t *testing.T) {
	for _, mode := range []string{"auto", "on"} {
		t.Run(mode, func(t *testing.T) {
			m := newMount(t, mode)
			mainReader, err := os.Open(filepath.Join(m.mnt, "file"))
			must(t, err)
			defer mainReader.Close()
			b := m.create("b")
			branchReader, err := os.Open(filepath.Join(b, "file"))
			must(t, err)
			defer branchReader.Close()
			w, err := os.OpenFile(filepath.Join(b, "file"), os.O_RDWR, 0)
			must(t, err)
			_, err = w.WriteAt([]byte("BRANCH!!!"), 0)
			must(t, err)
			must(t, w.Close())
			wantContent(t, filepath.Join(m.base, "file"), "base file\n")
			wantContent(t, filepath.Join(m.mnt, "file"), "base file\n")
			wantContent(t, filepath.Join(b, "file"), "BRANCH!!!\n")
			buf := make([]byte, 10)
			n, _ := mainReader.ReadAt(buf, 0)
			if string(buf[:n]) != "base file\n" {
				t.Errorf("main reader sees %q", buf[:n])
			}
		})
	}
}

// In a branch view (passthrough by default), a writer that joins a
// passthrough reader of a file in the branch's own layer writes through
// passthrough too, as the kernel requires, out of the daemon's sight: the
// branch can be neither committed nor branched until it closes, or its
// writes would reach the parent's file or the child.
func TestBranchPassthroughWriterHoldsCommit(t *testing.T) {
	m := newMount(t, "")
	b := m.create("b")
	writeFile(t, filepath.Join(b, "mine"), "one\n")
	r, err := os.Open(filepath.Join(b, "mine")) // passthrough
	must(t, err)
	defer r.Close()
	w, err := os.OpenFile(filepath.Join(b, "mine"), os.O_WRONLY, 0)
	must(t, err)
	_, err = w.WriteAt([]byte("two\n"), 0)
	must(t, err)
	wantErrno(t, ioctl(t, b, ctl.IoctlCommit), syscall.EBUSY)
	if _, _, code := m.cli("create", "c", m.mnt, "--parent", "b"); code == 0 {
		t.Errorf("created a child of a branch with a passthrough writer open")
	}
	wantContent(t, filepath.Join(m.base, "file"), "base file\n")
	wantMissing(t, filepath.Join(m.base, "mine"))
	must(t, w.Close())
	m.ok("commit", b)
	wantContent(t, filepath.Join(m.base, "mine"), "two\n")
}

func TestRemountKeepsBranches(t *testing.T) {
	m := newMount(t, "")
	b := m.create("keep")
	writeFile(t, filepath.Join(b, "file"), "kept\n")
	must(t, os.Remove(filepath.Join(b, "link")))
	m.ok("unmount", m.mnt)
	m.mounted = false
	m.start()
	wantContent(t, filepath.Join(b, "file"), "kept\n")
	wantMissing(t, filepath.Join(b, "link"))
	_, err := os.Create(filepath.Join(m.mnt, "x"))
	wantErrno(t, err, syscall.EROFS)
	m.ok("commit", b)
	wantContent(t, filepath.Join(m.base, "file"), "kept\n")
}

func TestControlFileText(t *testing.T) {
	m := newMount(t, "")
	ctl := filepath.Join(m.mnt, ".branchfs_ctl")
	fi, err := os.Stat(ctl)
	must(t, err)
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("control file mode %v, want 0600", fi.Mode())
	}
	writeFile(t, ctl, "create:viatext")
	writeFile(t, filepath.Join(m.view("viatext"), "t"), "text\n")
	writeFile(t, filepath.Join(m.view("viatext"), ".branchfs_ctl"), "commit")
	wantContent(t, filepath.Join(m.base, "t"), "text\n")
	err = os.WriteFile(ctl, []byte("explode"), 0o600)
	wantErrno(t, err, syscall.EINVAL)
	if ents, _ := os.ReadDir(m.mnt); len(ents) > 0 {
		for _, e := range ents {
			if e.Name() == ".branchfs_ctl" || strings.HasPrefix(e.Name(), "@") {
				t.Errorf("readdir of the mount shows %s", e.Name())
			}
		}
	}
}

func TestNoDescriptorLeaks(t *testing.T) {
	m := newMount(t, "")
	round := func(prefix string) {
		for i := 0; i < 10; i++ {
			b := m.create(prefix + strconv.Itoa(i))
			writeFile(t, filepath.Join(b, "file"), "x")
			readFile(t, filepath.Join(b, "dir", "a"))
			if i < 9 {
				m.ok("abort", b)
			} else {
				m.ok("commit", b)
			}
		}
	}
	// The first round warms go-fuse's pools (splice pipes and the like).
	round("warm")
	before := m.daemonFds()
	round("leak")
	round("more")
	if after := m.daemonFds(); after > before {
		t.Errorf("daemon descriptors grew from %d to %d", before, after)
	}
}

// TestCClient builds the C example against prototype/include/branchfs.h
// and drives a mount with it, as existing ioctl clients would.
func TestCClient(t *testing.T) {
	cc, err := exec.LookPath("cc")
	if err != nil {
		t.Skip("no C compiler")
	}
	m := newMount(t, "")
	bin := filepath.Join(t.TempDir(), "ioctl_client")
	out, err := exec.Command(cc, "-Wall", "-Werror", "-I../prototype/include", "-o", bin, "../prototype/examples/ioctl_client.c").CombinedOutput()
	if err != nil {
		t.Fatalf("cc: %v\n%s", err, out)
	}
	out, err = exec.Command(bin, m.mnt, "from-c", "hello from C").CombinedOutput()
	if err != nil {
		t.Fatalf("ioctl_client: %v\n%s", err, out)
	}
	wantContent(t, filepath.Join(m.base, "from-c"), "hello from C")
}

// TestBranchRootAttributes: a branch's root has the mode, owner and times
// of its parent's root, so access to it is decided as for the base.
func TestBranchRootAttributes(t *testing.T) {
	m := newMount(t, "")
	must(t, os.Chown(m.base, 1000, 1000))
	must(t, os.Chmod(m.base, 0o750))
	mt := time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC)
	must(t, os.Chtimes(m.base, mt, mt))
	b := m.create("b")
	var st syscall.Stat_t
	must(t, syscall.Stat(b, &st))
	if st.Uid != 1000 || st.Gid != 1000 || st.Mode&07777 != 0o750 || st.Mtim.Sec != mt.Unix() {
		t.Errorf("branch root: %d:%d mode %o mtime %d; want 1000:1000 0750 %d", st.Uid, st.Gid, st.Mode&07777, st.Mtim.Sec, mt.Unix())
	}
	out, err := exec.Command("setpriv", "--reuid", "1000", "--regid", "1000", "--clear-groups", "touch", filepath.Join(b, "mine")).CombinedOutput()
	if err != nil {
		t.Errorf("owner of the base cannot write the branch root: %v %s", err, out)
	}
}

// TestWorkingDirectorySurvivesCopyUp: a process working inside a base
// directory of a branch keeps its directory when writing there copies the
// directory up, after the kernel looks the name up again.
func TestWorkingDirectorySurvivesCopyUp(t *testing.T) {
	m := newMount(t, "")
	b := m.create("b")
	var before, after syscall.Stat_t
	must(t, syscall.Stat(filepath.Join(b, "dir"), &before))
	script := `cd "$1/dir" && echo one > new1 && sleep 1.3 && ls "$1/dir" >/dev/null && echo two > new2 && cat new1 new2 a && ls sub`
	out, err := exec.Command("sh", "-c", script, "sh", b).CombinedOutput()
	if err != nil || string(out) != "one\ntwo\na\nb\n" {
		t.Errorf("shell working in %s/dir: %v\n%s", b, err, out)
	}
	must(t, syscall.Stat(filepath.Join(b, "dir"), &after))
	if before.Ino != after.Ino {
		t.Errorf("copy-up changed the directory's inode: %d -> %d", before.Ino, after.Ino)
	}
}

// TestListingsAfterCommit: the kernel keeps directory listings; a commit
// must show in them at once, in main and in a parent branch.
func TestListingsAfterCommit(t *testing.T) {
	m := newMount(t, "")
	names := func(dir string) string {
		ents, err := os.ReadDir(dir)
		must(t, err)
		var out []string
		for _, e := range ents {
			out = append(out, e.Name())
		}
		return strings.Join(out, " ")
	}
	p := m.create("p")
	c := m.create("c", "p")
	before := names(filepath.Join(p, "dir"))
	names(filepath.Join(m.mnt, "dir"))
	writeFile(t, filepath.Join(c, "dir", "added"), "x")
	must(t, os.Remove(filepath.Join(c, "dir", "a")))
	m.ok("commit", c)
	if got, want := names(filepath.Join(p, "dir")), "added sub"; got != want {
		t.Errorf("parent branch listing after commit = %q (before %q), want %q", got, before, want)
	}
	m.ok("commit", p)
	if got, want := names(filepath.Join(m.mnt, "dir")), "added sub"; got != want {
		t.Errorf("main listing after commit = %q, want %q", got, want)
	}
}

// Past --max-inodes, the least recently used branch views are dropped from
// the kernel's caches: the kernel forgets their inodes, and they work as
// before, open files and working directories included.
func TestIdleViewsTrimmed(t *testing.T) {
	dir := t.TempDir()
	must(t, os.Chmod(dir, 0o755))
	m := &mount{t: t, base: filepath.Join(dir, "base"), store: filepath.Join(dir, "store"),
		mnt: filepath.Join(dir, "mnt"), args: []string{"--max-inodes", "60", "--debug"}}
	must(t, os.MkdirAll(m.mnt, 0o755))
	sampleTree(t, m.base)
	for i := 0; i < 40; i++ {
		writeFile(t, filepath.Join(m.base, "dir", fmt.Sprintf("f%02d", i)), fmt.Sprintf("%d\n", i))
	}
	m.start()
	t.Cleanup(m.cleanup)
	first := m.create("first")
	held, err := os.Open(filepath.Join(first, "dir", "f07"))
	must(t, err)
	defer held.Close()
	var before unix.Stat_t
	must(t, unix.Lstat(filepath.Join(first, "dir", "f08"), &before))
	statAll := func(view string) {
		for i := 0; i < 40; i++ {
			if _, err := os.Lstat(filepath.Join(view, "dir", fmt.Sprintf("f%02d", i))); err != nil {
				t.Fatal(err)
			}
		}
	}
	statAll(first)
	for i := 0; i < 4; i++ {
		statAll(m.create(fmt.Sprintf("b%d", i)))
	}
	// Forgets arrive after the invalidation; give them a moment.
	deadline := time.Now().Add(5 * time.Second)
	for {
		log, _ := os.ReadFile(filepath.Join(m.store, "daemon.log"))
		if bytes.Contains(log, []byte("FORGET")) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the kernel forgot no inode past the budget")
		}
		time.Sleep(50 * time.Millisecond)
	}
	data := make([]byte, 16)
	if n, err := held.ReadAt(data, 0); string(data[:n]) != "7\n" {
		t.Errorf("open file in a trimmed view: %q %v", data[:n], err)
	}
	var after unix.Stat_t
	must(t, unix.Lstat(filepath.Join(first, "dir", "f08"), &after))
	if after.Ino != before.Ino {
		t.Errorf("inode number changed across a trim: %d, was %d", after.Ino, before.Ino)
	}
	if got := readFile(t, filepath.Join(first, "dir", "f39")); got != "39\n" {
		t.Errorf("file in a trimmed view: %q", got)
	}
	writeFile(t, filepath.Join(first, "dir", "f39"), "changed\n")
	m.ok("commit", first)
	if got := readFile(t, filepath.Join(m.base, "dir", "f39")); got != "changed\n" {
		t.Errorf("commit from a trimmed view: base has %q", got)
	}
}

// Files below --passthrough-min-size are read through the mount's page
// cache. A passthrough read makes the kernel drop the file's atime, so the
// stat after it costs a GETATTR; the file above the size shows that this
// test sees that cost.
func TestSmallFilesSkipPassthrough(t *testing.T) {
	dir := t.TempDir()
	must(t, os.Chmod(dir, 0o755))
	m := &mount{t: t, base: filepath.Join(dir, "base"), store: filepath.Join(dir, "store"),
		mnt: filepath.Join(dir, "mnt"), args: []string{"--passthrough-min-size", "8", "--debug"}}
	must(t, os.MkdirAll(m.mnt, 0o755))
	sampleTree(t, m.base) // file: 10 bytes, dir/a: 2
	m.start()
	t.Cleanup(m.cleanup)
	log := filepath.Join(m.store, "daemon.log")
	getattrsAfterRead := func(name string) int {
		p := filepath.Join(m.mnt, name)
		readFile(t, p)
		_, err := os.Stat(p)
		must(t, err)
		must(t, os.Truncate(log, 0))
		readFile(t, p)
		_, err = os.Stat(p)
		must(t, err)
		data, err := os.ReadFile(log)
		must(t, err)
		return bytes.Count(data, []byte("GETATTR"))
	}
	if n := getattrsAfterRead("file"); n == 0 {
		t.Errorf("file passed through: no GETATTR after a read and a stat")
	}
	if n := getattrsAfterRead(filepath.Join("dir", "a")); n != 0 {
		t.Errorf("small file: %d GETATTRs after a read and a stat, want 0", n)
	}
}

// A write through passthrough reaches the backing file without the
// daemon; an unprivileged writer must still drop setuid and setgid, as on
// the filesystem below.
func TestPassthroughWriteDropsSetuid(t *testing.T) {
	m := newMount(t, "auto")
	native := t.TempDir()
	must(t, os.Chmod(native, 0o755))
	// Made in the base, so that no handle of the mount's is still
	// releasing (asynchronously) when the reader opens it.
	for _, dir := range []string{native, m.base} {
		writeFile(t, filepath.Join(dir, "suid"), "data\n")
		must(t, unix.Chmod(filepath.Join(dir, "suid"), 0o6777)) // os.Chmod drops 06000
	}
	held, err := os.Open(filepath.Join(m.mnt, "suid")) // passthrough in main
	must(t, err)
	defer held.Close()
	script := []step{as(65534, 65534, "write", "suid"), root("stat", "suid", "mode")}
	want, got := runScript(t, native, script), runScript(t, m.mnt, script)
	if !slices.Equal(want, got) {
		t.Errorf("unprivileged write beside a passthrough reader: native %q, main view %q", want, got)
	}
}

// Once a child's commit has replaced a file, the handles opened on it before
// are no longer that name's file: changes by name reach the committed file.
func TestAttrsByNameAfterChildCommit(t *testing.T) {
	m := newMount(t, "")
	for _, parent := range []string{"main", "p"} {
		root := m.mnt
		if parent != "main" {
			root = m.create(parent)
			writeFile(t, filepath.Join(root, "file"), "in p\n") // into p's own layer
		}
		p := filepath.Join(root, "file")
		// The writer first: a reader that came first could use
		// passthrough, and the writer with it, which main refuses to
		// branch under.
		w, err := os.OpenFile(p, os.O_WRONLY, 0)
		must(t, err)
		r, err := os.Open(p)
		must(t, err)
		c := m.create("c-"+parent, parent)
		writeFile(t, filepath.Join(c, "file"), "from the child\n")
		m.ok("commit", c)
		must(t, os.Chmod(p, 0o600))
		must(t, unix.Setxattr(p, "user.k", []byte("v"), 0))
		var st unix.Stat_t
		must(t, unix.Stat(p, &st))
		if st.Mode&0o777 != 0o600 {
			t.Errorf("%s: chmod by name after the commit left mode %o", parent, st.Mode&0o777)
		}
		if _, err := unix.Getxattr(p, "user.k", nil); err != nil {
			t.Errorf("%s: getxattr by name after the commit: %v", parent, err)
		}
		wantContent(t, p, "from the child\n")
		r.Close()
		w.Close()
	}
}

// A reader opened before a copy-up keeps the file it opened, the base's;
// the name, and stat by name, show the copy.
func TestStatWhileOpenForReading(t *testing.T) {
	m := newMount(t, "")
	views := []string{m.mnt} // main before it has branches: not frozen
	check := func(view string) {
		p := filepath.Join(view, "file")
		before, err := os.Stat(p)
		must(t, err)
		r, err := os.Open(p)
		must(t, err)
		defer r.Close()
		appendLine := func() {
			w, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
			must(t, err)
			_, err = w.WriteString("more\n")
			must(t, err)
			must(t, w.Close())
		}
		appendLine() // copies the file up in a branch
		fi, err := os.Stat(p)
		must(t, err)
		if fi.Size() != before.Size()+5 {
			t.Errorf("%s: stat by name after a write: size %d, want %d", view, fi.Size(), before.Size()+5)
		}
		must(t, os.Chmod(p, 0o600))
		appendLine()
		fi, err = os.Stat(p)
		must(t, err)
		if fi.Size() != before.Size()+10 || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: stat by name after chmod and a write: size %d, mode %v; want size %d, mode 0600",
				view, fi.Size(), fi.Mode(), before.Size()+10)
		}
	}
	check(views[0])
	b1 := m.create("b1")
	b2 := m.create("b2", "b1")
	check(b2)
	m.ok("abort", b2)
	check(b1)
}

// TestBaseFileACLs: the ACL of a base file grants and denies in every
// view, comes along when the file is copied up, changes in a branch only
// there, and holds in the main view as soon as a commit changes it,
// though the kernel caches ACLs. A base directory's default ACL applies
// to files made in it in a branch.
func TestBaseFileACLs(t *testing.T) {
	m := newMount(t, "")
	p := filepath.Join(m.base, "secret")
	writeFile(t, p, "base")
	must(t, os.Chmod(p, 0o600))
	must(t, unix.Setxattr(p, "system.posix_acl_access", encodeACL("u::6,u:65534:6,g::0,m::6,o::0"), 0))
	must(t, os.Mkdir(filepath.Join(m.base, "shared"), 0o775))
	must(t, unix.Setxattr(filepath.Join(m.base, "shared"), "system.posix_acl_default", encodeACL("u::7,g::7,o::5"), 0))
	b := m.create("b")
	check := func(when string, dir string, script []step, want ...string) {
		t.Helper()
		if got := runScript(t, dir, script); !slices.Equal(got, want) {
			t.Errorf("%s: got %q, want %q", when, got, want)
		}
	}
	readers := []step{as(65534, 65534, "open", "secret", "r"), as(65533, 65533, "open", "secret", "r")}
	check("main view", m.mnt, readers, "ok", "permission denied")
	check("branch", b, readers, "ok", "permission denied")
	check("write in branch", b, []step{as(65534, 65534, "write", "secret"), root("getacl", "secret")},
		"ok", "u::6,u:65534:6,g::0,m::6,o::0")
	wantContent(t, filepath.Join(b, "secret"), "basex")
	wantContent(t, p, "base")
	check("ACL changed in branch", b, append([]step{root("setacl", "secret", "u::6,g::0,o::0")}, readers...),
		"ok", "permission denied", "permission denied")
	check("main view after", m.mnt, readers, "ok", "permission denied")
	// The base directory's default ACL, not the umask, decides.
	check("create under a default ACL", b, []step{root("umask", "022", "create", "shared/new", "0666"),
		root("stat", "shared/new", "mode"), root("getacl", "shared/new")}, "ok", "mode=664", "no data available")
	check("setacl of another base file", b, []step{root("setacl", "file", "u::6,u:65533:4,g::4,m::4,o::4")}, "ok")
	if _, err := unix.Getxattr(filepath.Join(m.base, "file"), "system.posix_acl_access", nil); err != unix.ENODATA {
		t.Errorf("base file got an ACL from the branch: %v", err)
	}
	m.ok("commit", b)
	check("main view after commit", m.mnt, append(readers, root("getacl", "file")),
		"permission denied", "permission denied", "u::6,u:65533:4,g::4,m::4,o::4")
}

// When the kernel looks a branch's name up again, it must get the node it
// already holds: the cache notifications of a nested commit go to the node
// the daemon registered for the view. A write after a passthrough read
// answers ESTALE (Open), which makes the kernel look every name of the
// path up again, @p included.
func TestViewRootLookedUpAgain(t *testing.T) {
	m := newMount(t, "on")
	names := func(dir string) string {
		ents, err := os.ReadDir(dir)
		must(t, err)
		var out []string
		for _, e := range ents {
			out = append(out, e.Name())
		}
		return strings.Join(out, " ")
	}
	p := m.create("p")
	ino := inodeNumber(t, p)
	wantContent(t, filepath.Join(p, "file"), "base file\n") // passthrough
	writeFile(t, filepath.Join(p, "file"), "in p\n")        // ESTALE, then the copy
	if got := inodeNumber(t, p); got != ino {
		t.Fatalf("%s: inode %d after the lookup again, was %d", p, got, ino)
	}
	c := m.create("c", "p")
	names(filepath.Join(p, "dir"))
	writeFile(t, filepath.Join(c, "dir", "added"), "x")
	m.ok("commit", c)
	if got, want := names(filepath.Join(p, "dir")), "a added sub"; got != want {
		t.Errorf("parent branch listing after the child's commit = %q, want %q", got, want)
	}
}

// A sibling's commit makes a branch stale before it returns: what the
// kernel has cached of the stale view (pages an earlier handle read,
// attributes, names present and missing) is dropped before the reply, so
// every access that follows asks the daemon, which answers ESTALE. Reads
// of read-only handles opened before reach the daemon only without
// passthrough.
func TestStaleAtOnce(t *testing.T) {
	for _, mode := range []string{"", "off"} {
		t.Run("passthrough="+mode, func(t *testing.T) { testStaleAtOnce(t, mode) })
	}
}

func testStaleAtOnce(t *testing.T, mode string) {
	m := newMount(t, mode)
	b1, b2 := m.create("b1"), m.create("b2")
	must(t, os.Mkdir(filepath.Join(b2, "made"), 0o755))
	writeFile(t, filepath.Join(b2, "mine"), "b2\n")
	var handles []*os.File
	for _, name := range []string{"file", "mine", "dir/a"} {
		f, err := os.Open(filepath.Join(b2, name))
		must(t, err)
		defer f.Close()
		if _, err := io.ReadAll(f); err != nil { // into the page cache
			t.Fatal(err)
		}
		handles = append(handles, f)
	}
	wd, err := os.Open(filepath.Join(b2, "dir"))
	must(t, err)
	defer wd.Close()
	for _, p := range []string{"missing", "dir/missing", "dir/sub/b"} {
		os.Lstat(filepath.Join(b2, p)) // cached: present or missing
	}
	os.ReadDir(filepath.Join(b2, "dir"))
	writeFile(t, filepath.Join(b1, "file"), "b1 wins\n")
	must(t, ioctl(t, b1, ctl.IoctlCommit))
	for i, f := range handles {
		readOpenedBefore(t, mode, f, []string{"base file\n", "b2\n", "a\n"}[i])
		if _, err := f.Stat(); !errors.Is(err, syscall.ESTALE) {
			t.Errorf("fstat of %s opened before: %v, want ESTALE", f.Name(), err)
		}
	}
	for _, p := range []string{"file", "dir", "dir/a", "dir/sub/b", "made", "missing", "dir/missing"} {
		if _, err := os.Lstat(filepath.Join(b2, p)); !errors.Is(err, syscall.ESTALE) {
			t.Errorf("stat %s: %v, want ESTALE", p, err)
		}
	}
	for _, p := range []string{"made", "dir", "dir/sub"} {
		if err := os.Mkdir(filepath.Join(b2, p), 0o755); !errors.Is(err, syscall.ESTALE) {
			t.Errorf("mkdir of existing %s: %v, want ESTALE", p, err)
		}
	}
	if _, err := os.ReadDir(filepath.Join(b2, "dir")); !errors.Is(err, syscall.ESTALE) {
		t.Errorf("listing: %v, want ESTALE", err)
	}
	if _, err := wd.ReadDir(-1); !errors.Is(err, syscall.ESTALE) {
		t.Errorf("listing of a directory opened before: %v, want ESTALE", err)
	}
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(wd.Fd()), &st); !errors.Is(err, syscall.ESTALE) {
		t.Errorf("fstatfs: %v, want ESTALE", err)
	}
	m.ok("abort", b2)
}

// An abort answers after the kernel dropped what it cached of the branch:
// a handle opened before reads nothing more from the kernel's pages (with
// passthrough, the file it opened: see readOpenedBefore).
func TestAbortedAtOnce(t *testing.T) {
	for _, mode := range []string{"", "off"} {
		t.Run("passthrough="+mode, func(t *testing.T) { testAbortedAtOnce(t, mode) })
	}
}

func testAbortedAtOnce(t *testing.T, mode string) {
	m := newMount(t, mode)
	b := m.create("b")
	writeFile(t, filepath.Join(b, "mine"), "mine\n")
	var handles []*os.File
	for _, name := range []string{"file", "mine"} {
		f, err := os.Open(filepath.Join(b, name))
		must(t, err)
		defer f.Close()
		if _, err := io.ReadAll(f); err != nil { // into the page cache
			t.Fatal(err)
		}
		handles = append(handles, f)
	}
	// A directory held open, as a working directory would be, with its
	// listing and a name below it cached.
	wd, err := os.Open(filepath.Join(b, "dir"))
	must(t, err)
	defer wd.Close()
	if _, err := wd.ReadDir(-1); err != nil {
		t.Fatal(err)
	}
	readFile(t, filepath.Join(b, "dir", "a"))
	must(t, ioctl(t, b, ctl.IoctlAbort))
	for i, f := range handles {
		readOpenedBefore(t, mode, f, []string{"base file\n", "mine\n"}[i])
		if _, err := f.Stat(); !errors.Is(err, syscall.ESTALE) {
			t.Errorf("fstat of %s opened before the abort: %v, want ESTALE", f.Name(), err)
		}
	}
	if _, err := wd.Seek(0, io.SeekStart); err != nil {
		t.Fatal(err)
	}
	if _, err := wd.ReadDir(-1); !errors.Is(err, syscall.ESTALE) {
		t.Errorf("listing of a directory opened before the abort: %v, want ESTALE", err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(wd.Fd()), &st); !errors.Is(err, syscall.ESTALE) {
		t.Errorf("fstat of a directory opened before the abort: %v, want ESTALE", err)
	}
	if fd, err := unix.Openat(int(wd.Fd()), "a", unix.O_RDONLY, 0); !errors.Is(err, syscall.ESTALE) {
		unix.Close(fd)
		t.Errorf("open of a name below a directory opened before the abort: %v, want ESTALE", err)
	}
}

// TestCopyFileRange: copy_file_range(2) in a branch view, from a file of
// the base the branch has not copied, and from the main view into the
// branch, copies the bytes asked for into the branch's file and changes
// nothing else.
func TestCopyFileRange(t *testing.T) {
	m := newMount(t, "")
	b := m.create("b")
	copyRange := func(from, to string, offIn int64, n int, want string) {
		t.Helper()
		in, err := os.Open(from)
		must(t, err)
		defer in.Close()
		out, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE, 0o644)
		must(t, err)
		defer out.Close()
		c, err := unix.CopyFileRange(int(in.Fd()), &offIn, int(out.Fd()), nil, n, 0)
		must(t, err)
		if c != len(want) {
			t.Errorf("copied %d bytes from %s, want %d", c, from, len(want))
		}
		out.Close()
		wantContent(t, to, want)
	}
	copyRange(filepath.Join(b, "file"), filepath.Join(b, "whole"), 0, 100, "base file\n")
	copyRange(filepath.Join(b, "file"), filepath.Join(b, "part"), 5, 3, "fil")
	copyRange(filepath.Join(m.mnt, "dir", "a"), filepath.Join(b, "dir", "a2"), 0, 100, "a\n")
	wantContent(t, filepath.Join(m.base, "file"), "base file\n")
	for _, p := range []string{"whole", "part", "dir/a2"} {
		wantMissing(t, filepath.Join(m.base, p))
	}
}
