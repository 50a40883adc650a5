package branch

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// The store works without FUSE: these drive views directly.

func newStore(t testing.TB) (*Store, string) {
	t.Helper()
	dir := t.TempDir()
	base := filepath.Join(dir, "base")
	if err := os.MkdirAll(filepath.Join(base, "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(base, "f"), []byte("base"), 0o644)
	os.WriteFile(filepath.Join(base, "d", "x"), []byte("x"), 0o644)
	s, err := Open(filepath.Join(dir, "store"), base)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, base
}

func write(t *testing.T, v *View, rel, data string) {
	t.Helper()
	fd, _, err := v.Open(rel, unix.O_WRONLY|unix.O_TRUNC)
	if errors.Is(err, unix.ENOENT) {
		fd, _, err = v.Create(rel, unix.O_WRONLY, 0o644, Owner{})
	}
	if err != nil {
		t.Fatal(err)
	}
	unix.Write(fd, []byte(data))
	unix.Close(fd)
}

func TestCommitWithoutFUSE(t *testing.T) {
	s, base := newStore(t)
	a, err := s.Create("a", MainName)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := s.Create("b", MainName)
	write(t, a, "f", "from a")
	if err := a.Unlink("d/x"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Lookup("d/x"); !errors.Is(err, unix.ENOENT) {
		t.Errorf("tombstoned name: %v", err)
	}
	if err := s.Main().Unlink("f"); !errors.Is(err, ErrFrozen) {
		t.Errorf("write to frozen main: %v", err)
	}
	if _, err := s.Commit("a"); err != nil {
		t.Fatal(err)
	}
	if data, _ := os.ReadFile(filepath.Join(base, "f")); string(data) != "from a" {
		t.Errorf("base f = %q", data)
	}
	if _, err := os.Stat(filepath.Join(base, "d", "x")); !os.IsNotExist(err) {
		t.Errorf("base d/x: %v", err)
	}
	if _, err := s.Commit("b"); !errors.Is(err, ErrStale) {
		t.Errorf("commit of loser: %v, want ErrStale", err)
	}
	if err := b.Check(); !errors.Is(err, ErrStale) {
		t.Errorf("loser view: %v", err)
	}
	if err := s.Abort("b", false); err != nil {
		t.Fatal(err)
	}
}

func TestValidateName(t *testing.T) {
	for _, ok := range []string{"a", "fix-1", "A.b_c", string(make127())} {
		if err := ValidateName(ok); err != nil {
			t.Errorf("%q refused: %v", ok, err)
		}
	}
	for _, bad := range []string{"", ".x", "a/b", "a b", "é", string(make127()) + "x"} {
		if err := ValidateName(bad); !errors.Is(err, ErrInvalidName) {
			t.Errorf("%q accepted", bad)
		}
	}
}

func make127() []byte {
	b := make([]byte, 127)
	for i := range b {
		b[i] = 'n'
	}
	return b
}

func TestMaxBranches(t *testing.T) {
	s, _ := newStore(t)
	s.MaxBranches = 2
	for _, name := range []string{"a", "b"} {
		if _, err := s.Create(name, MainName); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Create("c", MainName); !errors.Is(err, ErrTooMany) {
		t.Fatalf("third create: %v, want ErrTooMany", err)
	}
	// Finished branches do not count.
	if err := s.Abort("a", false); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Create("c", MainName); err != nil {
		t.Fatalf("create after abort: %v", err)
	}
}
