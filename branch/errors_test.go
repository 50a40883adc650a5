package branch

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// The error table: every sentinel is its errno on the wire however it is
// wrapped, an errno stands for the sentinel a client is told of, and
// anything else is no errno at all.
func TestErrnoTable(t *testing.T) {
	type errnoCase struct {
		err   error
		errno syscall.Errno
		back  error // ErrorOf(errno): the first sentinel with that errno
	}
	table := []errnoCase{
		{ErrStale, syscall.ESTALE, ErrStale},
		{ErrGone, syscall.ESTALE, ErrStale},
		{ErrNotFound, syscall.ENOENT, ErrNotFound},
		{ErrFrozen, syscall.EROFS, ErrFrozen},
		{ErrHeld, syscall.EROFS, ErrFrozen},
		{ErrBusy, syscall.EBUSY, ErrBusy},
		{ErrExists, syscall.EEXIST, ErrExists},
		{ErrTooMany, syscall.ENOSPC, ErrTooMany},
		{ErrUnfinished, syscall.EUCLEAN, ErrUnfinished},
		{ErrInvalidName, syscall.EINVAL, ErrInvalidName},
		{ErrMainView, syscall.EINVAL, ErrInvalidName},
		{ErrQuota, syscall.EDQUOT, ErrQuota},
		{ErrQuotaHold, syscall.EDQUOT, ErrQuota},
		{ErrInvalidLimit, syscall.EINVAL, ErrInvalidName},
		{ErrInvalidData, syscall.EINVAL, ErrInvalidName},
		{ErrReplaced, syscall.EIDRM, ErrReplaced},
		// Errors outside the table stand for the errno they wrap.
		{errDeviceIsMarker, syscall.EPERM, nil},
		{&os.PathError{Op: "open", Path: "x", Err: unix.ENOTDIR}, syscall.ENOTDIR, nil},
		{unix.EXDEV, syscall.EXDEV, nil},
	}
	for _, e := range errnos {
		if !slices.ContainsFunc(table, func(c errnoCase) bool { return c.err == e.err }) {
			t.Errorf("%v is in the error table and not in this test's", e.err)
		}
	}
	for _, c := range table {
		wrapped := []error{
			c.err,
			&BranchError{"commit", "b", c.err},
			fmt.Errorf("step 3: %w", &BranchError{"abort", "b", c.err}),
			errors.Join(errors.New("first"), c.err),
		}
		for _, err := range wrapped {
			if errno, ok := Errno(err); !ok || errno != c.errno {
				t.Errorf("Errno(%v) = %v, %v; want %v", err, errno, ok, c.errno)
			}
		}
		if got := ErrorOf(c.errno); c.back != nil && got != c.back {
			t.Errorf("ErrorOf(%v) = %v, want %v", c.errno, got, c.back)
		}
	}
	for _, err := range []error{nil, errors.New("plain"), fs.ErrClosed, fmt.Errorf("wrapped: %w", errors.New("plain"))} {
		if errno, ok := Errno(err); ok {
			t.Errorf("Errno(%v) = %v, want none", err, errno)
		}
	}
	for _, errno := range []syscall.Errno{0, syscall.EPERM, syscall.EIO, syscall.ENOTDIR} {
		if err := ErrorOf(errno); err != nil {
			t.Errorf("ErrorOf(%v) = %v, want nil: no sentinel has it", errno, err)
		}
	}
	// Every sentinel's message is its own: the CLI tells them apart by it.
	seen := map[string]error{}
	for _, e := range errnos {
		if other, dup := seen[e.err.Error()]; dup {
			t.Errorf("%v and %v have one message", e.err, other)
		}
		seen[e.err.Error()] = e.err
	}
}

func TestBranchErrorNamesTheBranch(t *testing.T) {
	err := &BranchError{Op: "commit", Branch: "fix-2", Err: ErrStale}
	if got, want := err.Error(), "commit fix-2: "+ErrStale.Error(); got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	var be *BranchError
	if !errors.As(fmt.Errorf("ctl: %w", err), &be) || be.Branch != "fix-2" || be.Op != "commit" {
		t.Errorf("errors.As found %+v", be)
	}
	if !errors.Is(err, ErrStale) || errors.Is(err, ErrGone) {
		t.Errorf("BranchError unwraps to the wrong sentinel")
	}
}

// Each sentinel as the store gives it: the operation that meets it fails
// with it (and so with its errno on the wire), names the branch where it
// can, and changes nothing: neither the base nor the store's state, nor
// what any view shows. A finished branch is only a name in the history:
// the store answers for it as for one it never had, and a view still held
// of it is gone.
func TestErrorsFromTheStore(t *testing.T) {
	var held *View // a view that outlives its branch
	for _, c := range []struct {
		name  string
		setup func(t *testing.T, s *Store) // after newStore, and branches a (of main) and a1 (of a)
		do    func(s *Store) error
		err   error
		// branch is the name a BranchError must carry; "" where the
		// error needs none.
		branch string
	}{
		{name: "commit of a stale branch", err: ErrStale, branch: "s",
			setup: staleSibling, do: func(s *Store) error { _, err := s.Commit("s"); return err }},
		{name: "create below a stale branch", err: ErrStale, branch: "s",
			setup: staleSibling, do: func(s *Store) error { _, err := s.Create("x", "s"); return err }},
		{name: "write to a stale branch", err: ErrStale,
			setup: staleSibling, do: func(s *Store) error { return viewOf(s, "s").Unlink("f") }},
		{name: "read of a stale branch", err: ErrStale,
			setup: staleSibling, do: func(s *Store) error { return viewOf(s, "s").Lock() }},
		{name: "commit of a committed branch", err: ErrNotFound, branch: "a1",
			setup: func(t *testing.T, s *Store) { mustCommit(t, s, "a1") },
			do:    func(s *Store) error { _, err := s.Commit("a1"); return err }},
		{name: "abort of a committed branch", err: ErrNotFound, branch: "a1",
			setup: func(t *testing.T, s *Store) { mustCommit(t, s, "a1") },
			do:    func(s *Store) error { _, err := s.Abort("a1", false); return err }},
		{name: "view of a committed branch", err: ErrNotFound, branch: "a1",
			setup: func(t *testing.T, s *Store) { mustCommit(t, s, "a1") },
			do:    func(s *Store) error { _, err := s.View("a1"); return err }},
		{name: "diff of a committed branch", err: ErrNotFound, branch: "a1",
			setup: func(t *testing.T, s *Store) { mustCommit(t, s, "a1") },
			do:    func(s *Store) error { _, err := s.Diff("a1"); return err }},
		{name: "create below a committed branch", err: ErrNotFound, branch: "a1",
			setup: func(t *testing.T, s *Store) { mustCommit(t, s, "a1") },
			do:    func(s *Store) error { _, err := s.Create("x", "a1"); return err }},
		{name: "a view held past its commit", err: ErrGone,
			setup: func(t *testing.T, s *Store) { held = viewOf(s, "a1"); mustCommit(t, s, "a1") },
			do:    func(s *Store) error { return held.Unlink("f") }},
		{name: "a view held past its abort", err: ErrGone,
			setup: func(t *testing.T, s *Store) { held = viewOf(s, "a1"); mustAbort(t, s, "a1") },
			do:    func(s *Store) error { return held.Lock() }},
		{name: "view of an unknown branch", err: ErrNotFound, branch: "nope",
			do: func(s *Store) error { _, err := s.View("nope"); return err }},
		{name: "commit of an unknown branch", err: ErrNotFound, branch: "nope",
			do: func(s *Store) error { _, err := s.Commit("nope"); return err }},
		{name: "abort of an unknown branch", err: ErrNotFound, branch: "nope",
			do: func(s *Store) error { _, err := s.Abort("nope", true); return err }},
		{name: "create below an unknown branch", err: ErrNotFound, branch: "nope",
			do: func(s *Store) error { _, err := s.Create("x", "nope"); return err }},
		{name: "diff of an unknown branch", err: ErrNotFound, branch: "nope",
			do: func(s *Store) error { _, err := s.Diff("nope"); return err }},
		{name: "write to a branch with children", err: ErrFrozen,
			do: func(s *Store) error { return viewOf(s, "a").Unlink("f") }},
		{name: "write to main with children", err: ErrFrozen,
			do: func(s *Store) error { _, err := s.Main().Mkdir("new", 0o755, me); return err }},
		{name: "write to a held branch", err: ErrHeld,
			setup: holdStep("a1"), do: func(s *Store) error { return viewOf(s, "a1").Unlink("f") }},
		{name: "commit of a held branch", err: ErrBusy, branch: "a1",
			setup: holdStep("a1"), do: func(s *Store) error { _, err := s.Commit("a1"); return err }},
		{name: "create below a held branch", err: ErrBusy, branch: "a1",
			setup: holdStep("a1"), do: func(s *Store) error { _, err := s.Create("x", "a1"); return err }},
		{name: "hold of a held branch", err: ErrBusy, branch: "a1",
			setup: holdStep("a1"), do: func(s *Store) error { _, err := s.Hold("a1"); return err }},
		{name: "hold of a branch with children", err: ErrFrozen, branch: "a",
			do: func(s *Store) error { _, err := s.Hold("a"); return err }},
		{name: "hold of main", err: ErrMainView, branch: MainName,
			do: func(s *Store) error { _, err := s.Hold(MainName); return err }},
		{name: "hold of an unknown branch", err: ErrNotFound, branch: "nope",
			do: func(s *Store) error { _, err := s.Hold("nope"); return err }},
		{name: "commit of a branch with children", err: ErrBusy, branch: "a",
			do: func(s *Store) error { _, err := s.Commit("a"); return err }},
		{name: "abort of a branch with children", err: ErrBusy, branch: "a",
			do: func(s *Store) error { _, err := s.Abort("a", false); return err }},
		{name: "create of a branch that exists", err: ErrExists, branch: "a1",
			do: func(s *Store) error { _, err := s.Create("a1", MainName); return err }},
		{name: "create of main", err: ErrExists, branch: MainName,
			do: func(s *Store) error { _, err := s.Create(MainName, "a"); return err }},
		{name: "create of a bad name", err: ErrInvalidName,
			do: func(s *Store) error { _, err := s.Create("../x", MainName); return err }},
		{name: "commit of main", err: ErrMainView, branch: MainName,
			do: func(s *Store) error { _, err := s.Commit(MainName); return err }},
		{name: "diff of main", err: ErrMainView, branch: MainName,
			do: func(s *Store) error { _, err := s.Diff(MainName); return err }},
		{name: "abort of main", err: ErrMainView, branch: MainName,
			do: func(s *Store) error { _, err := s.Abort(MainName, true); return err }},
		{name: "one branch too many", err: ErrTooMany, branch: "x",
			setup: func(t *testing.T, s *Store) { s.opts.MaxBranches = 2 },
			do:    func(s *Store) error { _, err := s.Create("x", MainName); return err }},
		{name: "commit that can neither finish nor roll back", err: ErrUnfinished, branch: "a1",
			setup: func(t *testing.T, s *Store) {
				write(t, viewOf(s, "a1"), "f", "a1")
				setFailHook(t, func(step string) error {
					if strings.HasPrefix(step, "commit-step-") || step == "commit-undo" {
						return unix.EIO
					}
					return nil
				})
			},
			do: func(s *Store) error { _, err := s.Commit("a1"); return err }},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, base := newStore(t)
			for _, b := range [][2]string{{"a", MainName}, {"a1", "a"}} {
				if _, err := s.Create(b[0], b[1]); err != nil {
					t.Fatal(err)
				}
			}
			if c.setup != nil {
				c.setup(t, s)
			}
			unfinished := s.unfinished.Load() != nil
			baseBefore, list := diskTree(t, base), s.List(true)
			views := map[string]map[string]string{}
			for _, in := range list {
				if v, err := s.View(in.Name); err == nil && v.Check() == nil {
					views[in.Name] = viewTree(t, v, "", nil)
				}
			}
			err := c.do(s)
			if !errors.Is(err, c.err) {
				t.Fatalf("got %v, want %v", err, c.err)
			}
			want, _ := Errno(c.err)
			if errno, ok := Errno(err); !ok || errno != want {
				t.Errorf("on the wire: %v, %v; want %v", errno, ok, want)
			}
			var be *BranchError
			if c.branch != "" && (!errors.As(err, &be) || be.Branch != c.branch) {
				t.Errorf("%v does not name branch %s", err, c.branch)
			}
			if c.err == ErrUnfinished {
				// The one error that leaves something to settle: the
				// commit half done, which the next commit or mount ends.
				if unfinished || s.unfinished.Load() == nil {
					t.Errorf("the commit is not the one left unfinished")
				}
				return
			}
			if d := diffTrees(baseBefore, diskTree(t, base)); d != "" {
				t.Errorf("the base changed: %s", d)
			}
			if got := names(s.List(true)); got != names(list) {
				t.Errorf("branches %s, were %s", got, names(list))
			}
			for name, before := range views {
				v, err := s.View(name)
				if err != nil {
					t.Fatalf("view %s: %v", name, err)
				}
				if d := diffTrees(before, viewTree(t, v, "", nil)); d != "" {
					t.Errorf("view %s changed: %s", name, d)
				}
			}
		})
	}
}

func viewOf(s *Store, name string) *View {
	v, err := s.View(name)
	if err != nil {
		panic(err)
	}
	return v
}

// staleSibling makes branch s of main, and makes it stale: its sibling
// a's child a1 goes first, then a.
func staleSibling(t *testing.T, s *Store) {
	if _, err := s.Create("s", MainName); err != nil {
		t.Fatal(err)
	}
	mustCommit(t, s, "a1")
	mustCommit(t, s, "a")
	if err := viewOf(s, "s").Check(); !errors.Is(err, ErrStale) {
		t.Fatalf("s: %v, want stale", err)
	}
}

func holdStep(name string) func(t *testing.T, s *Store) {
	return func(t *testing.T, s *Store) {
		if _, err := s.Hold(name); err != nil {
			t.Fatal(err)
		}
	}
}

func mustCommit(t *testing.T, s *Store, name string) {
	t.Helper()
	if _, err := s.Commit(name); err != nil {
		t.Fatal(err)
	}
}

func mustAbort(t *testing.T, s *Store, name string) {
	t.Helper()
	if _, err := s.Abort(name, false); err != nil {
		t.Fatal(err)
	}
}

// An error of the layer below, where a view meets it, reaches the caller
// as that errno, with the path it concerns where the store adds one.
func TestErrorsOfTheDisk(t *testing.T) {
	s, base := newStore(t)
	_, err := Open(filepath.Join(t.TempDir(), "store"), filepath.Join(base, "f"), Options{})
	if err == nil || !strings.Contains(err.Error(), "not a directory") {
		t.Errorf("a store over a file: %v", err)
	}
	_, err = Open(filepath.Join(t.TempDir(), "store"), filepath.Join(base, "nothing"), Options{})
	if errno, _ := Errno(err); errno != syscall.ENOENT {
		t.Errorf("a store over nothing: %v (errno %v)", err, errno)
	}
	if _, err := Open(s.Dir(), base, Options{}); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Errorf("a second daemon on one store: %v", err)
	}
	if err := s.MarkerError(); err != nil {
		t.Errorf("a store on %s cannot hold markers: %v", s.Dir(), err)
	}
	meta := filepath.Join(s.Dir(), "branchfs.json")
	good, err := os.ReadFile(meta)
	mustOK(t, err)
	s.Close()
	for bad, want := range map[string]string{
		`{"version": 99, "base": "` + base + `"}`: "unsupported format version 99",
		`{"version": `: "unexpected end of JSON input",
	} {
		mustOK(t, os.WriteFile(meta, []byte(bad), 0o600))
		if s2, err := Open(s.Dir(), base, Options{}); err == nil || !strings.Contains(err.Error(), want) {
			if s2 != nil {
				s2.Close()
			}
			t.Errorf("a store whose branchfs.json is %s: %v, want %q", bad, err, want)
		}
		if data, _ := os.ReadFile(meta); string(data) != bad {
			t.Errorf("the refused store's branchfs.json became %s", data)
		}
	}
	mustOK(t, os.WriteFile(meta, good, 0o600))
	// A log that cannot be rewritten (here its temporary name is taken
	// by a directory) stops the mount, which would otherwise lose it.
	mustOK(t, os.Mkdir(s.logPath()+".tmp", 0o700))
	if s2, err := Open(s.Dir(), base, Options{}); err == nil || !strings.Contains(err.Error(), "log.tmp") {
		if s2 != nil {
			s2.Close()
		}
		t.Errorf("a store whose log cannot be rewritten: %v", err)
	}
	mustOK(t, os.Remove(s.logPath()+".tmp"))
	if _, err := MountID(filepath.Join(base, "nothing")); !errors.Is(err, unix.ENOENT) {
		t.Errorf("MountID of a missing path: %v", err)
	}
	other := filepath.Join(t.TempDir(), "other")
	mustOK(t, os.Mkdir(other, 0o755))
	if _, err := Open(s.Dir(), other, Options{}); err == nil || !strings.Contains(err.Error(), "belongs to base") {
		t.Errorf("a store opened over another base: %v", err)
	}
}
