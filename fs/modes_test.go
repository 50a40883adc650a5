package fs_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// nobody runs a command as an unprivileged user.
func nobody(args ...string) (string, error) {
	out, err := exec.Command("setpriv", append([]string{"--reuid=65534", "--regid=65534", "--clear-groups"}, args...)...).CombinedOutput()
	return string(out), err
}

// statMode asks the daemon, not the kernel's cache, for a file's mode.
func statMode(t *testing.T, p string) uint32 {
	t.Helper()
	var stx unix.Statx_t
	must(t, unix.Statx(unix.AT_FDCWD, p, unix.AT_SYMLINK_NOFOLLOW|unix.AT_STATX_FORCE_SYNC, unix.STATX_MODE, &stx))
	return uint32(stx.Mode) & 0o7777
}

// TestModeZero: files and directories with no permission bits are shown
// and enforced as on the base, in every view, whether they come from the
// base, a create with mode 0 or a chmod 0 in the view.
func TestModeZero(t *testing.T) {
	m := newMount(t, "")
	must(t, os.Mkdir(filepath.Join(m.base, "closed"), 0o755))
	writeFile(t, filepath.Join(m.base, "closed", "f"), "inside\n")
	writeFile(t, filepath.Join(m.base, "secret"), "secret\n")
	must(t, os.Chmod(filepath.Join(m.base, "secret"), 0))
	must(t, os.Chmod(filepath.Join(m.base, "closed"), 0))
	// A view is writable until it has a branch of its own.
	views := []struct{ name, dir string }{{"main", m.mnt}, {"branch", "b1"}, {"nested", "b2"}}
	for i, view := range views {
		name, v := view.name, view.dir
		switch i {
		case 1:
			v = m.create(v)
		case 2:
			v = m.create(v, "b1")
		}
		t.Run(name, func(t *testing.T) {
			for _, p := range []string{"secret", "closed"} {
				if mode := statMode(t, filepath.Join(v, p)); mode != 0 {
					t.Errorf("%s: mode %o, want 0", p, mode)
				}
			}
			if out, err := nobody("cat", filepath.Join(v, "secret")); err == nil || !strings.Contains(out, "Permission denied") {
				t.Errorf("nobody read a mode 0 file: %v %s", err, out)
			}
			if out, err := nobody("ls", filepath.Join(v, "closed")); err == nil || !strings.Contains(out, "Permission denied") {
				t.Errorf("nobody listed a mode 0 directory: %v %s", err, out)
			}
			if out, err := nobody("cat", filepath.Join(v, "closed", "f")); err == nil || !strings.Contains(out, "Permission denied") {
				t.Errorf("nobody read through a mode 0 directory: %v %s", err, out)
			}
			d := filepath.Join(v, "made-in-"+name)
			must(t, os.Mkdir(d, 0o755))
			for _, flag := range []int{unix.O_RDONLY, unix.O_WRONLY, unix.O_RDWR} {
				p := filepath.Join(d, "new"+strings.Repeat("x", flag))
				fd, err := unix.Open(p, unix.O_CREAT|unix.O_EXCL|flag, 0)
				must(t, err)
				var st unix.Stat_t
				must(t, unix.Fstat(fd, &st))
				unix.Close(fd)
				if st.Mode&0o7777 != 0 || statMode(t, p) != 0 {
					t.Errorf("created with mode 0 (flags %d): fstat %o, stat %o", flag, st.Mode&0o7777, statMode(t, p))
				}
			}
			writeFile(t, filepath.Join(d, "f"), "mine\n")
			must(t, os.Chmod(filepath.Join(d, "f"), 0))
			must(t, os.Mkdir(filepath.Join(d, "sub"), 0o755))
			must(t, os.Chmod(filepath.Join(d, "sub"), 0))
			for _, p := range []string{"f", "sub"} {
				if mode := statMode(t, filepath.Join(d, p)); mode != 0 {
					t.Errorf("%s after chmod 0: mode %o", p, mode)
				}
			}
			if out, err := nobody("cat", filepath.Join(d, "f")); err == nil || !strings.Contains(out, "Permission denied") {
				t.Errorf("nobody read a file chmod 0 in the view: %v %s", err, out)
			}
			if out, err := nobody("ls", filepath.Join(d, "sub")); err == nil || !strings.Contains(out, "Permission denied") {
				t.Errorf("nobody listed a directory chmod 0 in the view: %v %s", err, out)
			}
		})
	}
}

// TestRamfsBase: a base on a filesystem without xattrs or POSIX ACLs, and
// with its own rules for times (ramfs), serves every user as that
// filesystem does.
func TestRamfsBase(t *testing.T) {
	dir := t.TempDir()
	must(t, os.Chmod(dir, 0o755))
	must(t, os.Chmod(filepath.Dir(dir), 0o755))
	must(t, unix.Mount("ramfs", dir, "ramfs", 0, "mode=755"))
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	m := &mount{t: t, base: filepath.Join(dir, "base"), store: filepath.Join(dir, "store"), mnt: filepath.Join(dir, "mnt")}
	must(t, os.MkdirAll(m.mnt, 0o755))
	sampleTree(t, m.base)
	m.start()
	t.Cleanup(m.cleanup)
	views := []struct{ name, dir string }{{"main", m.mnt}, {"branch", "b1"}}
	for i, view := range views {
		v := view.dir
		if i == 1 {
			v = m.create(v)
		}
		t.Run(view.name, func(t *testing.T) {
			for _, p := range []string{"file", "dir/sub/b"} {
				if out, err := nobody("cat", filepath.Join(v, p)); err != nil {
					t.Errorf("nobody could not read world-readable %s: %v %s", p, err, out)
				}
			}
			wantContent(t, filepath.Join(v, "file"), "base file\n")
			must(t, os.Chmod(filepath.Join(v, "dir"), 0o777))
			out, err := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
				"sh", "-c", "umask 022; echo mine > "+filepath.Join(v, "dir", "mine")).CombinedOutput()
			if err != nil {
				t.Fatalf("nobody could not create in a 0777 directory: %v %s", err, out)
			}
			if mode := statMode(t, filepath.Join(v, "dir", "mine")); mode != 0o644 {
				t.Errorf("created with umask 022: mode %o, want 644", mode)
			}
			priv := filepath.Join(v, "private-"+view.name)
			writeFile(t, priv, "private\n")
			must(t, os.Chmod(priv, 0o600))
			if out, err := nobody("cat", priv); err == nil || !strings.Contains(out, "Permission denied") {
				t.Errorf("nobody read a 0600 file: %v %s", err, out)
			}
			if _, err := unix.Getxattr(filepath.Join(v, "file"), "system.posix_acl_access", nil); err != unix.ENODATA {
				t.Errorf("getxattr of the ACL: %v, want ENODATA (none)", err)
			}
			// truncate(2) leaves the times to the filesystem: ramfs keeps
			// them; also while the file is open (the daemon then uses the
			// open descriptor).
			for _, open := range []bool{false, true} {
				native := truncateChangesCtime(t, filepath.Join(dir, "native-"+view.name), open)
				inView := truncateChangesCtime(t, filepath.Join(v, "truncated"), open)
				if native != inView {
					t.Errorf("truncate(2), file open %v, changed the ctime: natively %v, in the view %v", open, native, inView)
				}
			}
		})
	}
}

// truncateChangesCtime makes file p and reports whether truncate(2) of it
// changes its ctime, with p open for writing meanwhile if open.
func truncateChangesCtime(t *testing.T, p string, open bool) bool {
	writeFile(t, p, "")
	if open {
		f, err := os.OpenFile(p, os.O_WRONLY, 0)
		must(t, err)
		defer f.Close()
	}
	var before, after unix.Stat_t
	must(t, unix.Stat(p, &before))
	time.Sleep(10 * time.Millisecond) // apart on a nanosecond clock
	must(t, unix.Truncate(p, 123))
	must(t, unix.Stat(p, &after))
	return before.Ctim != after.Ctim
}
