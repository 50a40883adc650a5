package branch

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// The calls of an open File, each against the base of newStore (f =
// "base") seen from branch b: what it returns, what the branch shows after,
// and the base unchanged on the disk whatever happened.
func TestFileOps(t *testing.T) {
	for _, c := range []struct {
		name string
		do   func(t *testing.T, s *Store, v *View) error
		err  error
		want string // what b shows at f after a success; "" to skip
	}{
		{name: "seek to the end of a lower file", do: func(t *testing.T, s *Store, v *View) error {
			f := openIn(t, v, "f", unix.O_RDONLY)
			end, err := f.Seek(0, unix.SEEK_END)
			if err == nil && end != 4 {
				t.Errorf("seek to the end: %d, want 4", end)
			}
			return err
		}, want: "base"},
		{name: "seek to data", do: func(t *testing.T, s *Store, v *View) error {
			f := openIn(t, v, "f", unix.O_RDWR)
			_, err := f.Seek(5, unix.SEEK_DATA)
			return err
		}, err: unix.ENXIO},
		{name: "sync", do: func(t *testing.T, s *Store, v *View) error {
			f := openIn(t, v, "f", unix.O_RDWR)
			if _, err := f.WriteAt([]byte("B"), 0); err != nil {
				return err
			}
			if err := f.Sync(true); err != nil {
				return err
			}
			return f.Sync(false)
		}, want: "Base"},
		{name: "allocate", do: func(t *testing.T, s *Store, v *View) error {
			f := openIn(t, v, "f", unix.O_RDWR)
			if err := f.Allocate(0, 0, 8192); err != nil {
				return err
			}
			if st, err := f.Stat(); err != nil || st.Size != 8192 {
				t.Errorf("size after fallocate: %d, %v", st.Size, err)
			}
			return nil
		}, want: "base" + string(make([]byte, 252))},
		{name: "allocate through a lower file opened for reading", do: func(t *testing.T, s *Store, v *View) error {
			return openIn(t, v, "f", unix.O_RDONLY).Allocate(0, 0, 8192)
		}, err: unix.EBADF},
		{name: "copy from a lower file", do: func(t *testing.T, s *Store, v *View) error {
			src := openIn(t, v, "f", unix.O_RDONLY)
			dst, _, err := v.Create("g", unix.O_WRONLY, 0o644, me)
			if err != nil {
				return err
			}
			defer dst.Close()
			n, err := dst.CopyFrom(src, 1, 0, 100)
			if err == nil && n != 3 {
				t.Errorf("copied %d bytes, want 3", n)
			}
			if got := readView(t, v, "g"); got != "ase" {
				t.Errorf("g = %q after the copy", got)
			}
			return err
		}, want: "base"},
		{name: "copy between views", do: func(t *testing.T, s *Store, v *View) error {
			w, err := s.Create("w", MainName)
			mustOK(t, err)
			write(t, w, "f", "from w")
			src := openIn(t, w, "f", unix.O_RDONLY)
			dst := openIn(t, v, "f", unix.O_WRONLY)
			_, err = dst.CopyFrom(src, 0, 0, 6)
			return err
		}, want: "from w"},
		{name: "copy into a stale view", do: func(t *testing.T, s *Store, v *View) error {
			w, err := s.Create("w", MainName)
			mustOK(t, err)
			src := openIn(t, w, "f", unix.O_RDONLY)
			dst := openIn(t, v, "f", unix.O_WRONLY)
			mustCommit(t, s, "w") // v is stale now: the first sibling won
			_, err = dst.CopyFrom(src, 0, 0, 4)
			return err
		}, err: ErrStale},
		{name: "copy from a stale view", do: func(t *testing.T, s *Store, v *View) error {
			_, err := s.Create("w", MainName)
			mustOK(t, err)
			src := openIn(t, v, "f", unix.O_RDONLY)
			mustCommit(t, s, "w") // v is stale, main is writable again
			dst := openIn(t, s.Main(), "d/x", unix.O_WRONLY)
			_, err = dst.CopyFrom(src, 0, 0, 4)
			return err
		}, err: ErrStale},
		{name: "copy into a view that has a child", do: func(t *testing.T, s *Store, v *View) error {
			src := openIn(t, v, "f", unix.O_RDONLY)
			dst := openIn(t, v, "d/x", unix.O_WRONLY)
			_, err := s.Create("child", "b")
			mustOK(t, err)
			_, err = dst.CopyFrom(src, 0, 0, 4)
			return err
		}, err: ErrFrozen},
		{name: "the descriptor is the file's", do: func(t *testing.T, s *Store, v *View) error {
			f := openIn(t, v, "f", unix.O_RDONLY)
			var st unix.Stat_t
			mustOK(t, unix.Fstat(f.Fd(), &st))
			if fst, err := f.Stat(); err != nil || fst.Ino != st.Ino || fst.Dev != st.Dev {
				t.Errorf("Fd is inode %d of %d, Stat says %d of %d (%v)", st.Ino, st.Dev, fst.Ino, fst.Dev, err)
			}
			return nil
		}, want: "base"},
		{name: "calls after a commit", do: func(t *testing.T, s *Store, v *View) error {
			f := openIn(t, v, "f", unix.O_RDWR)
			mustCommit(t, s, "b")
			for _, err := range []error{f.Sync(false), f.Allocate(0, 0, 1), func() error { _, err := f.Seek(0, 0); return err }()} {
				if !errors.Is(err, ErrGone) {
					t.Errorf("got %v, want ErrGone", err)
				}
			}
			_, err := f.Stat()
			return err
		}, err: ErrGone},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, base := newStore(t)
			v, err := s.Create("b", MainName)
			mustOK(t, err)
			before := diskTree(t, base)
			err = c.do(t, s, v)
			if c.err == nil && err != nil || c.err != nil && !errors.Is(err, c.err) {
				t.Fatalf("got %v, want %v", err, c.err)
			}
			if c.want != "" {
				if got := readView(t, v, "f"); got != c.want {
					t.Errorf("b shows f = %q, want %q", got, c.want)
				}
			}
			if !errors.Is(v.Check(), ErrGone) { // unless b itself was committed into it
				if d := diffTrees(before, diskTree(t, base)); d != "" {
					t.Errorf("the base changed: %s", d)
				}
			}
		})
	}
}

// openIn opens rel in v for the rest of the test.
func openIn(t *testing.T, v *View, rel string, flags int) *File {
	t.Helper()
	f, _, err := v.Open(rel, flags)
	if err != nil {
		t.Fatalf("open %s: %v", rel, err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// Detach gives the files open on a lower file whose name went a copy of
// their own: they share it, can change it, and neither the base nor any
// name of the view sees the change.
func TestDetach(t *testing.T) {
	s, base := newStore(t)
	v, err := s.Create("b", MainName)
	mustOK(t, err)
	mustOK(t, os.Chmod(filepath.Join(base, "f"), 0o640))
	mustOK(t, unix.Setxattr(filepath.Join(base, "f"), "user.kept", []byte("k"), 0))
	before := diskTree(t, base)
	f1, f2 := openIn(t, v, "f", unix.O_RDONLY), openIn(t, v, "f", unix.O_RDONLY)
	if f1.InTop() || f2.InTop() {
		t.Fatal("a lower file opened for reading is in the top layer")
	}
	mustOK(t, v.Unlink("f"))
	mustOK(t, detach(v, f1, f2))
	if !f1.InTop() || !f2.InTop() {
		t.Errorf("detached files not in the top layer: %v, %v", f1.InTop(), f2.InTop())
	}
	st, err := f1.Stat()
	if err != nil || st.Mode != unix.S_IFREG|0o640 || st.Size != 4 || st.Nlink != 0 {
		t.Errorf("the copy: mode %o, size %d, %d links (%v); want the file's mode and size, no name", st.Mode, st.Size, st.Nlink, err)
	}
	buf := make([]byte, 8)
	if n, err := f1.GetXattr("user.kept", buf); err != nil || string(buf[:n]) != "k" {
		t.Errorf("the copy's xattr: %q, %v", buf[:max(n, 0)], err)
	}
	if _, err := f1.WriteAt([]byte("BA"), 0); err != nil {
		t.Fatalf("write through a detached file: %v", err)
	}
	if n, err := f2.ReadAt(buf, 0); err != nil && n == 0 || !bytes.Equal(buf[:n], []byte("BAse")) {
		t.Errorf("the other file reads %q, %v; want the shared copy, BAse", buf[:max(n, 0)], err)
	}
	if d := diffTrees(before, diskTree(t, base)); d != "" {
		t.Errorf("the base changed: %s", d)
	}
	if got := shows(t, v, "f"); got != "absent" {
		t.Errorf("b shows f: %s", got)
	}
	write(t, v, "f", "new")
	if n, _ := f2.ReadAt(buf, 0); string(buf[:max(n, 0)]) != "BAse" {
		t.Errorf("a new file at the name changed the detached one: %q", buf[:max(n, 0)])
	}
	// A view that may not be written detaches nothing.
	g := openIn(t, v, "d/x", unix.O_RDONLY)
	mustOK(t, v.Unlink("d/x"))
	if _, err := s.Create("child", "b"); err != nil {
		t.Fatal(err)
	}
	if err := detach(v, g); !errors.Is(err, ErrFrozen) || g.InTop() {
		t.Errorf("detach in a view with a child: %v (in top %v), want ErrFrozen", err, g.InTop())
	}
}

// detach gives files a copy of their own in its three steps, as one lock
// holder would.
func detach(v *View, files ...*File) error {
	d, err := v.BeginDetach(files[0])
	if err != nil {
		return err
	}
	defer d.Discard()
	if err := d.Copy(); err != nil {
		return err
	}
	return d.Attach(files)
}

// The copy a detach makes reads a descriptor of its own: the file it
// began with may be closed before the copy (a handle released meanwhile)
// and the copy goes to the files left. A copy discarded, refused by a
// limit, or attached and closed leaves no descriptor open.
func TestDetachingOutlivesItsFile(t *testing.T) {
	s, _, base := quotaStore(t, 2)
	mustOK(t, os.WriteFile(filepath.Join(base, "d", "x"), []byte("x"), 0o644))
	v, err := s.Create("b", MainName)
	mustOK(t, err)
	f1, _, err := v.Open("f", unix.O_RDONLY)
	mustOK(t, err)
	f2, _, err := v.Open("f", unix.O_RDONLY)
	mustOK(t, err)
	mustOK(t, v.Unlink("f"))
	fds := func() int {
		ents, err := os.ReadDir("/proc/self/fd")
		mustOK(t, err)
		return len(ents)
	}
	before := fds() - 2 // without f1 and f2
	d, err := v.BeginDetach(f1)
	mustOK(t, err)
	mustOK(t, f1.Close())
	mustOK(t, d.Copy())
	mustOK(t, d.Attach([]*File{f2}))
	d.Discard() // attached: nothing left to drop
	if !f2.InTop() {
		t.Error("the file left is not in the top layer after the attach")
	}
	buf := make([]byte, 8)
	if n, err := f2.ReadAt(buf, 0); string(buf[:max(n, 0)]) != "base" {
		t.Errorf("the copy reads %q, %v; want base", buf[:max(n, 0)], err)
	}
	if _, err := f2.WriteAt([]byte("B"), 0); err != nil {
		t.Errorf("a write to the copy: %v", err)
	}
	mustOK(t, f2.Close())
	if n := fds(); n != before {
		t.Errorf("%d descriptors open after the attached copy's file closed, want %d", n, before)
	}
	// big is three blocks and a byte: its copy does not fit the limit
	// of two.
	g, _, err := v.Open("big", unix.O_RDONLY)
	mustOK(t, err)
	mustOK(t, v.Unlink("big"))
	d, err = v.BeginDetach(g)
	mustOK(t, err)
	if err := d.Copy(); !isQuota(err) || g.InTop() {
		t.Errorf("a copy past the limit: %v (in top %v), want ErrQuota", err, g.InTop())
	}
	d.Discard()
	// A copy another detach beat, discarded after the copy or before.
	h, _, err := v.Open("d/x", unix.O_RDONLY)
	mustOK(t, err)
	mustOK(t, v.Unlink("d/x"))
	d, err = v.BeginDetach(h)
	mustOK(t, err)
	mustOK(t, d.Copy())
	d.Discard()
	d, err = v.BeginDetach(h)
	mustOK(t, err)
	d.Discard()
	if h.InTop() {
		t.Error("a discarded copy was attached")
	}
	exact(t, s, "unnamed copies", "b")
	mustOK(t, g.Close())
	mustOK(t, h.Close())
	if n := fds(); n != before {
		t.Errorf("%d descriptors open after discarded detaches, want %d", n, before)
	}
}
