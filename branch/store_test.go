package branch

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

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
	s, err := Open(filepath.Join(dir, "store"), base, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, base
}

func write(t *testing.T, v *View, rel, data string) {
	t.Helper()
	f, _, err := v.Open(rel, unix.O_WRONLY|unix.O_TRUNC)
	if errors.Is(err, unix.ENOENT) {
		f, _, err = v.Create(rel, unix.O_WRONLY, 0o644, me)
	}
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt([]byte(data), 0)
	f.Close()
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
	if _, err := s.Abort("b", false); err != nil {
		t.Fatal(err)
	}
}

// Abort and commit name the branches they drop, so that the FUSE glue can
// tell the kernel that their views are gone.
func TestDroppedBranchesNamed(t *testing.T) {
	s, _ := newStore(t)
	for _, b := range [][2]string{{"p", MainName}, {"c", "p"}, {"d", "c"}, {"a", MainName}, {"a1", "a"}, {"a2", "a"}} {
		if _, err := s.Create(b[0], b[1]); err != nil {
			t.Fatal(err)
		}
	}
	dropped, err := s.Abort("p", true)
	if err != nil || !slices.Equal(dropped, []string{"d", "c", "p"}) {
		t.Errorf("recursive abort dropped %v, %v; want [d c p]", dropped, err)
	}
	if _, err := s.Commit("a1"); err != nil {
		t.Fatal(err)
	}
	res, err := s.Commit("a")
	if err != nil {
		t.Fatal(err)
	}
	// a1 committed into a, which leaves no view; a2 lost to it.
	if !slices.Equal(res.Dropped, []string{"a2"}) {
		t.Errorf("commit dropped %v, want [a2]", res.Dropped)
	}
}

func TestValidateName(t *testing.T) {
	long := strings.Repeat("é", NameMax/2) // 254 bytes
	for _, ok := range []string{"a", "fix-1", "A.b_c", "a b", "c++", "@x", ".x", "...", "é", "名前", " x\n", "\"'$(x)", long} {
		if err := ValidateName(ok); err != nil {
			t.Errorf("%q refused: %v", ok, err)
		}
	}
	for _, bad := range []string{"", ".", "..", "a/b", "/", "a\x00b", "\xff", long + "x"} {
		if err := ValidateName(bad); !errors.Is(err, ErrInvalidName) {
			t.Errorf("%q accepted", bad)
		}
	}
	for name, want := range map[string]string{"fix-1": "fix-1", "a b": `"a b"`, "x\ny": `"x\ny"`, "é": "é", `a"b`: `"a\"b"`, "\xff": `"\xff"`} {
		if got := Quote(name); got != want {
			t.Errorf("Quote(%q) = %s, want %s", name, got, want)
		}
	}
}

func TestMaxBranches(t *testing.T) {
	s, _ := newStore(t)
	s.Close()
	s, err := Open(s.Dir(), s.Base(), Options{MaxBranches: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, name := range []string{"a", "b"} {
		if _, err := s.Create(name, MainName); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Create("c", MainName); !errors.Is(err, ErrTooMany) {
		t.Fatalf("third create: %v, want ErrTooMany", err)
	}
	// Finished branches do not count.
	if _, err := s.Abort("a", false); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Create("c", MainName); err != nil {
		t.Fatalf("create after abort: %v", err)
	}
}

// A branch's delta directory appears at its first write; until then the
// branch works as an empty one, across a remount too.
func TestDeltaMadeAtFirstWrite(t *testing.T) {
	s, base := newStore(t)
	p, err := s.Create("p", MainName)
	if err != nil {
		t.Fatal(err)
	}
	delta := filepath.Join(s.Dir(), "deltas", "p")
	if _, err := os.Lstat(delta); !os.IsNotExist(err) {
		t.Fatalf("delta of an unwritten branch: %v", err)
	}
	rootBefore, _ := p.Lookup("")
	inoBefore, genBefore := p.Identity(rootBefore)
	c, err := s.Create("c", "p") // a child over an absent layer
	if err != nil {
		t.Fatal(err)
	}
	if ents, err := c.ReadDir(""); err != nil || len(ents) != 2 {
		t.Fatalf("listing through absent layers: %v %v", ents, err)
	}
	// Remount: the unwritten branches come back, still without deltas.
	dir := s.Dir()
	s.Close()
	if s, err = Open(dir, base, Options{}); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if c, err = s.View("c"); err != nil {
		t.Fatal(err)
	}
	write(t, c, "new", "c")
	if _, err := s.Commit("c"); err != nil {
		t.Fatal(err)
	}
	if p, err = s.View("p"); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Lstat(delta); err != nil || !fi.IsDir() {
		t.Fatalf("a commit into an unwritten branch makes its delta: %v", err)
	}
	base0, _ := os.Lstat(base)
	if fi, _ := os.Lstat(delta); fi.Mode() != base0.Mode() {
		t.Errorf("delta root %v, base root %v", fi.Mode(), base0.Mode())
	}
	rootAfter, _ := p.Lookup("")
	if ino, gen := p.Identity(rootAfter); ino != inoBefore || gen>>8 != genBefore>>8 {
		t.Errorf("root identity changed with the first write: %d/%d, was %d/%d", ino, gen, inoBefore, genBefore)
	}
	if _, err := s.Commit("p"); err != nil {
		t.Fatal(err)
	}
	if data, err := os.ReadFile(filepath.Join(base, "new")); err != nil || string(data) != "c" {
		t.Errorf("base/new after two commits: %q %v", data, err)
	}
	// An unwritten branch commits and aborts as an empty one.
	e, _ := s.Create("e", MainName)
	if _, err := s.Commit(e.Name()); err != nil {
		t.Errorf("commit of an unwritten branch: %v", err)
	}
	a, _ := s.Create("a", MainName)
	if _, err := s.Abort(a.Name(), false); err != nil {
		t.Errorf("abort of an unwritten branch: %v", err)
	}
}

// The delta of a finished branch goes to the trash after the commit or
// abort returns; a new branch of the same name must not meet it.
func TestFinishedDeltaLeavesLater(t *testing.T) {
	s, _ := newStore(t)
	for _, finish := range []string{"abort", "commit"} {
		v, err := s.Create("x", MainName)
		if err != nil {
			t.Fatal(err)
		}
		write(t, v, "f", "from the first x")
		write(t, v, "d/new", "new")
		if finish == "abort" {
			_, err = s.Abort("x", false)
		} else {
			_, err = s.Commit("x")
		}
		if err != nil {
			t.Fatal(err)
		}
		want := "base"
		if finish == "commit" {
			want = "from the first x"
		}
		v, err = s.Create("x", MainName)
		if err != nil {
			t.Fatalf("after %s: %v", finish, err)
		}
		write(t, v, "g", "second x")
		if got := readView(t, v, "f"); got != want {
			t.Errorf("after %s: the new x reads f = %q, want %q", finish, got, want)
		}
		if finish == "abort" {
			if _, err := v.Lookup("d/new"); !errors.Is(err, unix.ENOENT) {
				t.Errorf("the aborted branch's d/new shows in the new x: %v", err)
			}
		}
		if _, err := s.Abort("x", false); err != nil {
			t.Fatal(err)
		}
	}
	// Everything finished leaves the store soon after.
	deadline := time.Now().Add(5 * time.Second)
	for {
		deltas, _ := os.ReadDir(filepath.Join(s.Dir(), "deltas"))
		trash, _ := os.ReadDir(filepath.Join(s.Dir(), "trash"))
		if len(deltas)+len(trash) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("left in the store: %d deltas, %d trash entries", len(deltas), len(trash))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func readView(t *testing.T, v *View, rel string) string {
	t.Helper()
	f, _, err := v.Open(rel, unix.O_RDONLY)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 256)
	n, _ := f.ReadAt(buf, 0)
	return string(buf[:max(n, 0)])
}

// Stat stops at the layer that supplies an entry; it must agree with
// Lookup, which goes on to the layers a directory merges.
func TestStatAgreesWithLookup(t *testing.T) {
	s, base := newStore(t)
	os.MkdirAll(filepath.Join(base, "e", "sub"), 0o755)
	a, _ := s.Create("a", MainName)
	if err := a.Chmod("d", 0o700); err != nil { // a copy of d over base's d
		t.Fatal(err)
	}
	if err := a.Unlink("f"); err != nil { // a tombstone
		t.Fatal(err)
	}
	if err := a.Rmdir("e/sub"); err != nil {
		t.Fatal(err)
	}
	if err := a.Rmdir("e"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Mkdir("e", 0o750, me); err != nil { // opaque over base's e
		t.Fatal(err)
	}
	if _, err := a.Mkdir("n", 0o755, me); err != nil { // only in the delta
		t.Fatal(err)
	}
	b, _ := s.Create("b", "a")
	for _, v := range []*View{a, b} {
		for _, rel := range []string{"", "d", "d/x", "e", "e/sub", "f", "n"} {
			want, werr := v.Lookup(rel)
			got, gerr := v.Stat(rel)
			if !errors.Is(gerr, unix.ENOENT) != !errors.Is(werr, unix.ENOENT) || (gerr == nil) != (werr == nil) {
				t.Errorf("%s %q: Stat error %v, Lookup error %v", v.Name(), rel, gerr, werr)
				continue
			}
			if werr == nil && (got.Layer != want.Layer || got.Stat.Ino != want.Stat.Ino || got.Stat.Mode != want.Stat.Mode) {
				t.Errorf("%s %q: Stat layer %d mode %o, Lookup layer %d mode %o",
					v.Name(), rel, got.Layer, got.Stat.Mode, want.Layer, want.Stat.Mode)
			}
		}
	}
	if e, err := b.Stat("d"); err != nil || e.Stat.Mode&0o777 != 0o700 {
		t.Errorf("b sees d as %v, %v; want a's copy, mode 700", e, err)
	}
	if _, err := b.Stat("e/sub"); !errors.Is(err, unix.ENOENT) {
		t.Errorf("e/sub under an opaque e: %v, want ENOENT", err)
	}
}

// Xattrs come from the layer that shows a name, through getxattrat(2)
// where the kernel has it and through /proc paths where it does not.
func TestXattrsOfShownLayer(t *testing.T) {
	for _, procPaths := range []bool{false, true} {
		noXattrAt.Store(procPaths)
		s, base := newStore(t)
		for _, rel := range []string{"f", "d/x", "d"} {
			if err := unix.Setxattr(filepath.Join(base, rel), "user.k", []byte("base"), 0); err != nil {
				t.Fatal(err)
			}
		}
		a, _ := s.Create("a", MainName)
		if err := a.SetXattr("d/x", "user.k", []byte("a"), 0); err != nil {
			t.Fatal(err)
		}
		if err := a.Unlink("f"); err != nil {
			t.Fatal(err)
		}
		if err := a.Rmdir("d/x"); !errors.Is(err, unix.ENOTDIR) {
			t.Fatalf("rmdir of a file: %v", err)
		}
		b, _ := s.Create("b", "a")
		for _, c := range []struct {
			v       *View
			rel     string
			want    string
			wantErr error
		}{
			{s.Main(), "f", "base", nil}, {s.Main(), "d/x", "base", nil}, {a, "d/x", "a", nil}, {b, "d/x", "a", nil},
			{a, "d", "base", nil}, {a, "f", "", unix.ENOENT}, {b, "f", "", unix.ENOENT}, {a, "d/nope", "", unix.ENOENT},
		} {
			buf := make([]byte, 16)
			n, err := c.v.GetXattr(c.rel, "user.k", buf)
			if !errors.Is(err, c.wantErr) || (err == nil && string(buf[:n]) != c.want) {
				t.Errorf("proc paths %v: %s %q: %q, %v; want %q, %v", procPaths, c.v.Name(), c.rel, buf[:max(n, 0)], err, c.want, c.wantErr)
			}
			names, err := c.v.ListXattr(c.rel)
			if !errors.Is(err, c.wantErr) || (err == nil && !slices.Equal(names, []string{"user.k"})) {
				t.Errorf("proc paths %v: list %s %q: %q, %v", procPaths, c.v.Name(), c.rel, names, err)
			}
		}
		if n, err := a.GetXattr("d/x", "user.k", nil); n != 1 || err != nil {
			t.Errorf("size of a's user.k: %d, %v; want 1", n, err)
		}
		if _, err := a.GetXattr("d/x", "user.k", make([]byte, 0, 1)[:0:0]); err != nil {
			t.Errorf("size query with an empty buffer: %v", err)
		}
	}
	noXattrAt.Store(false)
}
