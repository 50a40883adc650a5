package branch

import (
	"errors"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// What a view allows in each state of its branch: Lock for any operation,
// LockRoot for the root's attributes (which a stale branch keeps, so that
// it can still be reached and aborted), CheckWritable for a change. A Lock
// that succeeds holds the store's lock shared until Unlock; one that fails
// holds nothing.
func TestViewStates(t *testing.T) {
	for _, c := range []struct {
		name                  string
		view                  func(t *testing.T, s *Store) *View
		main                  bool
		lock, lockRoot, write error
	}{
		{name: "main", main: true, view: func(t *testing.T, s *Store) *View { return s.Main() }},
		{name: "main with a branch", main: true, write: ErrFrozen, view: func(t *testing.T, s *Store) *View {
			mustCreate(t, s, "b", MainName)
			return s.Main()
		}},
		{name: "live", view: func(t *testing.T, s *Store) *View { return mustCreate(t, s, "b", MainName) }},
		{name: "with a child", write: ErrFrozen, view: func(t *testing.T, s *Store) *View {
			v := mustCreate(t, s, "b", MainName)
			mustCreate(t, s, "c", "b")
			return v
		}},
		{name: "stale", lock: ErrStale, write: ErrStale, view: func(t *testing.T, s *Store) *View {
			v := mustCreate(t, s, "b", MainName)
			mustCreate(t, s, "w", MainName)
			mustCommit(t, s, "w")
			return v
		}},
		{name: "below a stale parent", lock: ErrStale, write: ErrStale, view: func(t *testing.T, s *Store) *View {
			mustCreate(t, s, "p", MainName)
			v := mustCreate(t, s, "b", "p")
			mustCreate(t, s, "w", MainName)
			mustCommit(t, s, "w")
			return v
		}},
		{name: "committed", lock: ErrGone, lockRoot: ErrGone, write: ErrGone, view: func(t *testing.T, s *Store) *View {
			v := mustCreate(t, s, "b", MainName)
			mustCommit(t, s, "b")
			return v
		}},
		{name: "aborted", lock: ErrGone, lockRoot: ErrGone, write: ErrGone, view: func(t *testing.T, s *Store) *View {
			v := mustCreate(t, s, "b", MainName)
			mustAbort(t, s, "b")
			return v
		}},
		{name: "aborted with its parent", lock: ErrGone, lockRoot: ErrGone, write: ErrGone, view: func(t *testing.T, s *Store) *View {
			mustCreate(t, s, "p", MainName)
			v := mustCreate(t, s, "b", "p")
			if _, err := s.Abort("p", true); err != nil {
				t.Fatal(err)
			}
			return v
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, _ := newStore(t)
			v := c.view(t, s)
			if v.IsMain() != c.main || c.main && v.Name() != MainName || !c.main && v.Name() != "b" {
				t.Errorf("IsMain %v, Name %q", v.IsMain(), v.Name())
			}
			check := c.lock
			if errors.Is(check, ErrStale) || errors.Is(check, ErrGone) {
				if err := v.Check(); err != check {
					t.Errorf("Check: %v, want %v", err, check)
				}
			}
			if err := v.CheckWritable(); !errors.Is(err, c.write) || c.write == nil && err != nil {
				t.Errorf("CheckWritable: %v, want %v", err, c.write)
			}
			for _, l := range []struct {
				name string
				lock func() error
				want error
			}{{"Lock", v.Lock, c.lock}, {"LockRoot", v.LockRoot, c.lockRoot}} {
				err := l.lock()
				if err != l.want {
					t.Errorf("%s: %v, want %v", l.name, err, l.want)
				}
				held := !s.mu.TryLock()
				if !held {
					s.mu.Unlock()
				}
				if held != (err == nil) {
					t.Errorf("%s returned %v and the store's lock is held: %v", l.name, err, held)
				}
				if err == nil {
					v.Unlock()
					if !s.mu.TryLock() {
						t.Fatalf("the store's lock is held after %s and Unlock", l.name)
					}
					s.mu.Unlock()
				}
			}
		})
	}
}

func mustCreate(t *testing.T, s *Store, name, parent string) *View {
	t.Helper()
	v, err := s.Create(name, parent)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// Every change through a view that may not be written fails with the
// view's error before it touches anything: the view shows what it showed,
// and neither the base nor the store's deltas change on the disk. A view
// that has a child refuses each change itself; one that can no longer be
// used is refused by Lock, and a stale one's changes refuse even without.
func TestWritesRefusedByState(t *testing.T) {
	writes := []struct {
		name string
		do   func(v *View) error
	}{
		{"open for writing", func(v *View) error { _, _, err := v.Open("f", unix.O_WRONLY); return err }},
		{"copy-up", func(v *View) error { _, err := v.CopyUp("d/x", true); return err }},
		{"create", func(v *View) error { _, _, err := v.Create("n", unix.O_WRONLY, 0o644, me); return err }},
		{"create in a directory of the view's own", func(v *View) error {
			_, _, err := v.Create("own/n", unix.O_WRONLY|unix.O_EXCL, 0o644, me)
			return err
		}},
		{"mkdir", func(v *View) error { _, err := v.Mkdir("n", 0o755, me); return err }},
		{"mknod", func(v *View) error { _, err := v.Mknod("n", unix.S_IFIFO|0o644, 0, me); return err }},
		{"symlink", func(v *View) error { _, err := v.Symlink("f", "n", me); return err }},
		{"link", func(v *View) error { _, err := v.Link("f", "n"); return err }},
		{"unlink", func(v *View) error { return v.Unlink("f") }},
		{"unlink in a directory of the view's own", func(v *View) error { return v.Unlink("own/y") }},
		{"rmdir", func(v *View) error { return v.Rmdir("own") }},
		{"rename", func(v *View) error { return v.Rename("f", "n", 0) }},
		{"chmod", func(v *View) error { return v.Chmod("f", 0o600) }},
		{"chown", func(v *View) error { return v.Chown("f", -1, -1) }},
		{"truncate", func(v *View) error { return v.Truncate("f", 0) }},
		{"utimens", func(v *View) error { return v.Utimens("f", unix.Timespec{}, unix.Timespec{}) }},
		{"setxattr", func(v *View) error { return v.SetXattr("f", "user.a", []byte("1"), 0) }},
		{"removexattr", func(v *View) error { return v.RemoveXattr("own", "user.own") }},
	}
	for _, state := range []struct {
		name string
		make func(t *testing.T, s *Store, v *View)
		err  error
	}{
		{"with a child", func(t *testing.T, s *Store, v *View) { mustCreate(t, s, "c", "b") }, ErrFrozen},
		{"stale", func(t *testing.T, s *Store, v *View) {
			mustCreate(t, s, "w", MainName)
			mustCommit(t, s, "w")
		}, ErrStale},
		{"aborted", func(t *testing.T, s *Store, v *View) { mustAbort(t, s, "b") }, ErrGone},
	} {
		for _, w := range writes {
			t.Run(state.name+"/"+w.name, func(t *testing.T) {
				s, base := newStore(t)
				v := mustCreate(t, s, "b", MainName)
				_, err := v.Mkdir("own", 0o755, me)
				mustOK(t, err)
				write(t, v, "own/y", "y")
				mustOK(t, v.SetXattr("own", "user.own", []byte("1"), 0))
				var shown map[string]string
				if state.err == ErrFrozen { // a stale view cannot be read
					shown = viewTree(t, v, "", nil)
				}
				state.make(t, s, v)
				baseBefore, storeBefore := diskTree(t, base), diskTree(t, filepath.Join(s.Dir(), "deltas"))
				// As the FUSE glue calls it: under Lock, which a view
				// that can no longer be used refuses.
				err = v.Lock()
				if err == nil {
					err = w.do(v)
					v.Unlock()
				}
				if !errors.Is(err, state.err) {
					t.Fatalf("got %v, want %v", err, state.err)
				}
				// A stale view's layers are still there: the operation
				// itself refuses too.
				if state.err == ErrStale {
					if err := w.do(v); !errors.Is(err, state.err) {
						t.Fatalf("without Lock: got %v, want %v", err, state.err)
					}
				}
				if d := diffTrees(baseBefore, diskTree(t, base)); d != "" {
					t.Errorf("the base changed: %s", d)
				}
				if d := diffTrees(storeBefore, diskTree(t, filepath.Join(s.Dir(), "deltas"))); d != "" {
					t.Errorf("the deltas changed: %s", d)
				}
				if shown != nil {
					if d := diffTrees(shown, viewTree(t, v, "", nil)); d != "" {
						t.Errorf("the view changed: %s", d)
					}
				}
			})
		}
	}
}
