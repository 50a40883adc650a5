package branch

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"golang.org/x/sys/unix"
)

// TestFileRules checks what an open file of a view allows, by what the
// view is at the time and where the file lies, against the base of
// newStore (f = "base").
func TestFileRules(t *testing.T) {
	changes := []struct {
		name string
		do   func(f *File) error
	}{
		{"chmod", func(f *File) error { return f.Chmod(0o600) }},
		{"chown", func(f *File) error { return f.Chown(-1, -1) }},
		{"truncate", func(f *File) error { return f.Truncate(1, false) }},
		{"truncate by name", func(f *File) error { return f.Truncate(1, true) }},
		{"utimens", func(f *File) error {
			return f.Utimens(unix.Timespec{Sec: 1}, unix.Timespec{Sec: 1})
		}},
		{"setxattr", func(f *File) error { return f.SetXattr("user.test", []byte("1"), 0) }},
		{"removexattr", func(f *File) error { return f.RemoveXattr("user.absent") }},
	}
	for _, c := range []struct {
		name  string
		flags int
		state func(t *testing.T, s *Store, v *View) // after the open
		read  error                                 // of ReadAt, Stat, GetXattr
		write error                                 // of WriteAt and Allocate
		chg   error                                 // of every change
	}{
		{name: "base file read", flags: unix.O_RDONLY, write: unix.EBADF, chg: unix.EBADF},
		{name: "opened for writing", flags: unix.O_RDWR, chg: unix.ENODATA},
		{name: "frozen", flags: unix.O_RDWR, chg: ErrFrozen, write: ErrFrozen,
			state: func(t *testing.T, s *Store, v *View) {
				if _, err := s.Create("child", "b"); err != nil {
					t.Fatal(err)
				}
			}},
		{name: "stale", flags: unix.O_RDWR, read: ErrStale, write: ErrStale, chg: ErrStale,
			state: func(t *testing.T, s *Store, v *View) {
				if _, err := s.Create("sibling", MainName); err != nil {
					t.Fatal(err)
				}
				if _, err := s.Commit("sibling"); err != nil {
					t.Fatal(err)
				}
			}},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, base := newStore(t)
			v, err := s.Create("b", MainName)
			if err != nil {
				t.Fatal(err)
			}
			f, e, err := v.Open("f", c.flags)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if f.InTop() == e.Lower() || f.Writable() != (c.flags != unix.O_RDONLY) {
				t.Errorf("InTop %v Writable %v for an entry of layer %d opened with %#x", f.InTop(), f.Writable(), e.Layer, c.flags)
			}
			if c.state != nil {
				c.state(t, s, v)
			}
			before := treeOf(t, base)
			is := func(what string, err, want error) {
				t.Helper()
				// removexattr of a name that is not there is the one
				// change that fails where it may be made.
				if want == unix.ENODATA && what != "removexattr" {
					want = nil
				}
				if want == nil && err != nil || want != nil && !errors.Is(err, want) {
					t.Errorf("%s: %v, want %v", what, err, want)
				}
			}
			_, err = f.ReadAt(make([]byte, 4), 0)
			is("read", err, c.read)
			_, err = f.Stat()
			is("stat", err, c.read)
			_, err = f.WriteAt([]byte("w"), 0)
			is("write", err, c.write)
			for _, ch := range changes {
				is(ch.name, ch.do(f), c.chg)
			}
			if d := diffTrees(before, treeOf(t, base)); d != "" {
				t.Errorf("the base changed: %s", d)
			}
		})
	}
}

// An open file neither shows nor takes branchfs's own xattrs.
func TestFileHidesInternalXattrs(t *testing.T) {
	s, _ := newStore(t)
	v, _ := s.Create("b", MainName)
	f, _, err := v.Open("f", unix.O_RDWR)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := unix.Setxattr(filepath.Join(s.deltaDir("b"), "f"), "user.branchfs.test", []byte("1"), 0); err != nil {
		t.Fatal(err)
	}
	if err := f.SetXattr("user.shown", []byte("1"), 0); err != nil {
		t.Fatal(err)
	}
	names, err := f.ListXattr()
	if err != nil || !slices.Equal(names, []string{"user.shown"}) {
		t.Errorf("ListXattr = %q, %v; want user.shown alone", names, err)
	}
	if _, err := f.GetXattr("user.branchfs.test", nil); !errors.Is(err, unix.ENODATA) {
		t.Errorf("GetXattr of an internal xattr: %v, want ENODATA", err)
	}
	for _, err := range []error{f.SetXattr("user.branchfs.x", nil, 0), f.RemoveXattr("user.branchfs.test")} {
		if !errors.Is(err, unix.EPERM) {
			t.Errorf("change of an internal xattr: %v, want EPERM", err)
		}
	}
}

// TestCreateInOwnDirectory checks a create in a directory that only the
// view's top layer shows, which skips the lookup through the layers: the
// owner it is made for, a set-group-ID directory's group, an existing name
// with and without O_EXCL, a directory made again where one was removed,
// and the main view, which has one layer; and an unlink there.
func TestCreateInOwnDirectory(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root, to create files for another owner")
	}
	s, _ := newStore(t)
	v, err := s.Create("b", MainName)
	if err != nil {
		t.Fatal(err)
	}
	nobody := Owner{Uid: 65534, Gid: 65534}
	if _, err := v.Mkdir("new", 0o755, me); err != nil {
		t.Fatal(err)
	}
	if _, err := v.Mkdir("sgid", 0o2775, Owner{Uid: 0, Gid: 100}); err != nil {
		t.Fatal(err)
	}
	create := func(v *View, rel string, flags int, o Owner) (*Entry, error) {
		t.Helper()
		f, e, err := v.Create(rel, flags, 0o640, o)
		if err == nil {
			f.WriteAt([]byte(rel), 0)
			f.Close()
		}
		return e, err
	}
	for _, c := range []struct {
		rel       string
		uid, gid  uint32
		otherView bool
	}{
		{rel: "new/f", uid: 65534, gid: 65534},
		{rel: "sgid/f", uid: 65534, gid: 100},
		{rel: "new2", uid: 65534, gid: 65534, otherView: true},
	} {
		w := v
		if c.otherView { // a main view with no branches, which may be written
			s2, _ := newStore(t)
			w = s2.Main()
		}
		e, err := create(w, c.rel, unix.O_WRONLY|unix.O_EXCL, nobody)
		if err != nil {
			t.Fatalf("%s: %v", c.rel, err)
		}
		if e.Stat.Uid != c.uid || e.Stat.Gid != c.gid || e.Stat.Mode != unix.S_IFREG|0o640 {
			t.Errorf("%s: made %d:%d mode %o, want %d:%d mode 100640", c.rel, e.Stat.Uid, e.Stat.Gid, e.Stat.Mode, c.uid, c.gid)
		}
		if _, err := create(w, c.rel, unix.O_WRONLY|unix.O_EXCL, nobody); !errors.Is(err, unix.EEXIST) {
			t.Errorf("%s again with O_EXCL: %v, want EEXIST", c.rel, err)
		}
		f, _, err := w.Create(c.rel, unix.O_RDONLY, 0o600, me)
		if err != nil {
			t.Fatalf("%s again without O_EXCL: %v", c.rel, err)
		}
		buf := make([]byte, 64)
		n, _ := f.ReadAt(buf, 0)
		f.Close()
		if string(buf[:n]) != c.rel {
			t.Errorf("%s again without O_EXCL reads %q, want the file made first", c.rel, buf[:n])
		}
	}
	// d is the base's; removed and made again, it shows nothing below.
	if err := v.Unlink("d/x"); err != nil {
		t.Fatal(err)
	}
	if err := v.Rmdir("d"); err != nil {
		t.Fatal(err)
	}
	if _, err := v.Mkdir("d", 0o755, me); err != nil {
		t.Fatal(err)
	}
	if _, err := create(v, "d/x", unix.O_WRONLY|unix.O_EXCL, me); err != nil {
		t.Fatalf("d/x in d made again: %v", err)
	}
	if got := readView(t, v, "d/x"); got != "d/x" {
		t.Errorf("d/x reads %q", got)
	}
	// So do changes by name, to a file and to a directory.
	if _, err := v.Mkdir("new/sub", 0o755, me); err != nil {
		t.Fatal(err)
	}
	if err := v.Chmod("new/f", 0o600); err != nil {
		t.Fatal(err)
	}
	mtime := unix.Timespec{Sec: 1000}
	if err := v.Utimens("new/sub", unix.Timespec{Nsec: unix.UTIME_OMIT}, mtime); err != nil {
		t.Fatal(err)
	}
	if e, err := v.Stat("new/f"); err != nil || e.Stat.Mode != unix.S_IFREG|0o600 {
		t.Errorf("new/f after chmod 600: %v %+v", err, e)
	}
	if e, err := v.Stat("new/sub"); err != nil || e.Stat.Mtim != mtime {
		t.Errorf("new/sub after utimens: %v %+v", err, e)
	}
	if err := v.Chmod("new/missing", 0o600); !errors.Is(err, unix.ENOENT) {
		t.Errorf("chmod of a missing name: %v, want ENOENT", err)
	}
	// Unlink in such directories takes the same short way.
	for _, c := range []struct {
		rel  string
		want error
	}{
		{"new/missing", unix.ENOENT}, {"d", unix.EISDIR}, {"new/f", nil}, {"new/f", unix.ENOENT}, {"d/x", nil},
	} {
		if err := v.Unlink(c.rel); !errors.Is(err, c.want) && !(err == nil && c.want == nil) {
			t.Errorf("unlink %s: %v, want %v", c.rel, err, c.want)
		}
	}
	for _, rel := range []string{"new/f", "d/x"} {
		if _, err := v.Stat(rel); !errors.Is(err, unix.ENOENT) {
			t.Errorf("%s after unlink: %v, want ENOENT", rel, err)
		}
	}
}

// TestKeptDirectoriesFollowChanges: the descriptors of the view's own
// directories that requests keep (layer.dirFd) name what the path names
// after a rename, an rmdir and a mkdir of the directory, and after a
// child's commit replaced it.
func TestKeptDirectoriesFollowChanges(t *testing.T) {
	s, _ := newStore(t)
	v, err := s.Create("b", MainName)
	if err != nil {
		t.Fatal(err)
	}
	mk := func(v *View, rels ...string) {
		t.Helper()
		for _, rel := range rels {
			if _, err := v.Mkdir(rel, 0o755, me); err != nil {
				t.Fatalf("mkdir %s: %v", rel, err)
			}
		}
	}
	create := func(v *View, rel string) error {
		f, _, err := v.Create(rel, unix.O_WRONLY|unix.O_EXCL, 0o644, me)
		if err == nil {
			f.Close()
		}
		return err
	}
	exists := func(v *View, rel string, want bool) {
		t.Helper()
		if _, err := v.Stat(rel); (err == nil) != want {
			t.Errorf("stat %s: %v, want it there: %v", rel, err, want)
		}
	}
	mk(v, "a", "a/b")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(create(v, "a/b/f"))
	exists(v, "a/b/f", true)
	must(v.Rename("a/b", "a/c", 0))
	exists(v, "a/b/f", false)
	exists(v, "a/c/f", true)
	if err := create(v, "a/b/g"); !errors.Is(err, unix.ENOENT) {
		t.Errorf("create in a renamed directory's old name: %v, want ENOENT", err)
	}
	mk(v, "a/b")
	must(create(v, "a/b/g"))
	exists(v, "a/c/g", false)
	must(v.Unlink("a/b/g"))
	must(v.Rmdir("a/b"))
	exists(v, "a/b", false)
	if err := v.Unlink("a/b/g"); !errors.Is(err, unix.ENOENT) {
		t.Errorf("unlink in a removed directory: %v, want ENOENT", err)
	}
	// A child replaces a/c with a directory of its own.
	exists(v, "a/c/f", true)
	c, err := s.Create("c", "b")
	if err != nil {
		t.Fatal(err)
	}
	must(c.Unlink("a/c/f"))
	must(c.Rmdir("a/c"))
	mk(c, "a/c")
	must(create(c, "a/c/new"))
	if _, err := s.Commit("c"); err != nil {
		t.Fatal(err)
	}
	exists(v, "a/c/new", true)
	exists(v, "a/c/f", false)
	must(create(v, "a/c/g"))
	exists(v, "a/c/g", true)
}
