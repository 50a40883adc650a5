package branch

import (
	"errors"
	"testing"
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
