package branch

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// quotaStore opens a store over a base holding "big" (three blocks and a
// byte) and "f" (four bytes), with the mount's storage limit max blocks.
func quotaStore(t *testing.T, max int64) (s *Store, dir, base string) {
	t.Helper()
	dir = t.TempDir()
	base = filepath.Join(dir, "base")
	os.MkdirAll(filepath.Join(base, "d"), 0o755)
	var sfs unix.Statfs_t
	if err := unix.Statfs(dir, &sfs); err != nil {
		t.Fatal(err)
	}
	blk := sfs.Bsize
	os.WriteFile(filepath.Join(base, "big"), make([]byte, 3*blk+1), 0o644)
	os.WriteFile(filepath.Join(base, "f"), []byte("base"), 0o644)
	s, err := Open(filepath.Join(dir, "store"), base, Options{MaxStorage: max * blk})
	if err != nil {
		t.Fatal(err)
	}
	if s.block != blk {
		t.Fatalf("block %d, want %d", s.block, blk)
	}
	t.Cleanup(func() { s.Close() })
	return s, dir, base
}

// exact fails unless what the store counts for each branch named, and for
// the mount, is what a fresh walk of the deltas finds.
func exact(t *testing.T, s *Store, step string, names ...string) {
	t.Helper()
	var sum int64
	for _, n := range names {
		used, _, err := s.Storage(n)
		if err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		if walk := s.MeasureStorage(n); used != walk {
			t.Fatalf("%s: %s counts %d bytes, a walk finds %d", step, n, used, walk)
		}
		sum += used
	}
	if total, _, _ := s.Storage(""); total != sum {
		t.Fatalf("%s: the mount counts %d bytes, its branches %d", step, total, sum)
	}
}

func openW(t *testing.T, v *View, rel string, flags int) *File {
	t.Helper()
	f, _, err := v.Open(rel, unix.O_RDWR|flags)
	if errors.Is(err, unix.ENOENT) {
		f, _, err = v.Create(rel, unix.O_RDWR|flags, 0o644, me)
	}
	if err != nil {
		t.Fatalf("open %s: %v", rel, err)
	}
	return f
}

func isQuota(err error) bool {
	errno, ok := Errno(err)
	return errors.Is(err, ErrQuota) && ok && errno == syscall.EDQUOT
}

// TestStorageLimit: a change past the mount's or a branch's limit fails
// with EDQUOT and changes nothing; everything else goes on working, and
// space given back can be used again.
func TestStorageLimit(t *testing.T) {
	s, _, base := quotaStore(t, 8)
	blk := s.block
	v, err := s.Create("b", MainName)
	if err != nil {
		t.Fatal(err)
	}
	a := openW(t, v, "a", 0)
	defer a.Close()
	if _, err := a.WriteAt(make([]byte, 8*blk), 0); err != nil {
		t.Fatal(err)
	}
	if n, err := a.WriteAt([]byte("x"), 8*blk); !isQuota(err) || n != 0 {
		t.Fatalf("a write past the limit: %d, %v; want EDQUOT", n, err)
	}
	if st, _ := a.Stat(); st.Size != 8*blk {
		t.Fatalf("the refused write changed the size to %d", st.Size)
	}
	// A copy-up that does not fit is refused before anything is copied.
	if _, _, err := v.Open("big", unix.O_RDWR); !isQuota(err) {
		t.Fatalf("copy-up past the limit: %v", err)
	}
	if err := v.Chmod("f", 0o600); !isQuota(err) {
		t.Fatalf("chmod copying up past the limit: %v", err)
	}
	if e, err := v.Lookup("big"); err != nil || !e.Lower() {
		t.Fatalf("big after the refused copy-up: %v, %+v", err, e)
	}
	if err := a.Allocate(unix.FALLOC_FL_KEEP_SIZE, 0, 20*blk); !errors.Is(err, unix.EOPNOTSUPP) {
		t.Fatalf("preallocation past the size under a limit: %v", err)
	}
	if err := a.Allocate(0, 0, 9*blk); !isQuota(err) {
		t.Fatalf("fallocate past the limit: %v", err)
	}
	// What counts no data still works, and so do reads and shrinking.
	if _, err := v.Mkdir("dir", 0o755, me); err != nil {
		t.Fatal(err)
	}
	if _, err := v.Symlink("a", "link", me); err != nil {
		t.Fatal(err)
	}
	if got := readView(t, v, "f"); got != "base" {
		t.Fatalf("read %q", got)
	}
	if err := a.Truncate(4*blk, false); err != nil {
		t.Fatal(err)
	}
	exact(t, s, "truncated", "b")
	big := openW(t, v, "big", unix.O_APPEND)
	if _, err := big.WriteAt(make([]byte, blk), 0); !isQuota(err) {
		// 4 blocks of a and 4 of big (3 and a byte): a block more
		// makes a fifth.
		t.Fatalf("an append past the limit: %v", err)
	}
	big.Close()
	exact(t, s, "copied up", "b")
	if b, _ := os.ReadFile(filepath.Join(base, "big")); len(b) != int(3*blk+1) {
		t.Fatalf("the base changed: %d bytes", len(b))
	}
	// A second branch shares the mount's limit.
	w, err := s.Create("c", MainName)
	if err != nil {
		t.Fatal(err)
	}
	c := openW(t, w, "c", 0)
	if _, err := c.WriteAt([]byte("x"), 0); !isQuota(err) {
		t.Fatalf("a write in another branch past the mount's limit: %v", err)
	}
	if err := v.Unlink("a"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WriteAt(make([]byte, 4*blk), 0); err != nil {
		t.Fatalf("after the unlink: %v", err)
	}
	c.Close()
	exact(t, s, "two branches", "b", "c")
	// A branch's own limit, below the mount's room.
	if err := s.SetLimit("c", 5*blk); err != nil {
		t.Fatal(err)
	}
	if err := v.Unlink("big"); err != nil {
		t.Fatal(err)
	}
	c = openW(t, w, "c", unix.O_APPEND)
	if _, err := c.WriteAt(make([]byte, blk), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WriteAt([]byte("x"), 0); !isQuota(err) {
		t.Fatalf("a write past the branch's own limit: %v", err)
	}
	c.Close()
	if err := s.SetLimit("c", -1); !errors.Is(err, ErrInvalidLimit) {
		t.Fatalf("a negative limit: %v", err)
	}
	if err := s.SetLimit(MainName, 1); !errors.Is(err, ErrMainView) {
		t.Fatalf("a limit for main: %v", err)
	}
	exact(t, s, "own limit", "b", "c")
}

// TestStorageExact: what a limit counts equals a walk of the deltas after
// each kind of change, commits, aborts and a new Open.
func TestStorageExact(t *testing.T) {
	s, dir, base := quotaStore(t, 1<<30)
	blk := s.block
	v, err := s.Create("b", MainName)
	if err != nil {
		t.Fatal(err)
	}
	step := func(name string, do func() error, names ...string) {
		t.Helper()
		if err := do(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if len(names) == 0 {
			names = []string{"b"}
		}
		exact(t, s, name, names...)
	}
	fwrite := func(rel string, off int64, n int, flags int) func() error {
		return func() error {
			f := openW(t, v, rel, flags)
			defer f.Close()
			_, err := f.WriteAt(make([]byte, n), off)
			return err
		}
	}
	step("new file", fwrite("n", 0, 100, 0))
	step("copy-up by open", fwrite("f", 1, 1, 0))
	step("copy-up by chmod", func() error { return v.Chmod("big", 0o600) })
	step("sparse truncate by name", func() error { return v.Truncate("n", 10*blk+3) })
	step("shrinking truncate", func() error {
		f := openW(t, v, "n", 0)
		defer f.Close()
		return f.Truncate(blk, false)
	})
	step("O_TRUNC open", fwrite("big", 0, 0, unix.O_TRUNC))
	step("hard link", func() error { _, err := v.Link("n", "n2"); return err })
	step("write through one name", fwrite("n2", 5*blk, 1, 0))
	step("unlink one name", func() error { return v.Unlink("n") })
	step("rename over a file", func() error {
		if err := fwrite("r", 0, int(3*blk), 0)(); err != nil {
			return err
		}
		return v.Rename("r", "n2", 0)
	})
	step("rename a base file over a file", func() error {
		if err := fwrite("r", 0, int(2*blk), 0)(); err != nil {
			return err
		}
		os.WriteFile(filepath.Join(base, "d", "x"), make([]byte, 2*blk), 0o644)
		return v.Rename("d/x", "r", 0)
	})
	step("unlink over a base file", func() error { return v.Unlink("f") })
	step("fallocate", func() error {
		f := openW(t, v, "al", 0)
		defer f.Close()
		return f.Allocate(0, 0, 3*blk)
	})
	step("copy_file_range", func() error {
		in, _, err := v.Open("r", unix.O_RDONLY)
		if err != nil {
			return err
		}
		defer in.Close()
		out := openW(t, v, "cfr", 0)
		defer out.Close()
		_, err = out.CopyFrom(in, 0, blk, int(4*blk))
		return err
	})
	// A file with no name counts for nothing; its writes still must fit.
	step("write after unlink", func() error {
		f := openW(t, v, "gone", 0)
		defer f.Close()
		if err := v.Unlink("gone"); err != nil {
			return err
		}
		if _, err := f.WriteAt(make([]byte, blk), 0); err != nil {
			return err
		}
		if _, err := f.WriteAt([]byte("x"), (1<<30)*blk); !isQuota(err) {
			t.Errorf("a write to a file with no name past the limit: %v", err)
		}
		return nil
	})
	// A child's commit moves its delta into b's; an abort drops it.
	if _, err := s.Create("c", "b"); err != nil {
		t.Fatal(err)
	}
	w, _ := s.View("c")
	cw := func(rel string, n int) func() error {
		return func() error {
			f := openW(t, w, rel, unix.O_TRUNC)
			defer f.Close()
			_, err := f.WriteAt(make([]byte, n), 0)
			return err
		}
	}
	step("child writes", cw("al", int(blk)), "b", "c")
	step("child writes more", cw("new", int(2*blk)), "b", "c")
	step("commit into a branch", func() error { _, err := s.Commit("c"); return err })
	if _, err := s.Create("d", "b"); err != nil {
		t.Fatal(err)
	}
	w, _ = s.View("d")
	step("another child writes", cw("new", int(7*blk)), "b", "d")
	step("abort", func() error { _, err := s.Abort("d", false); return err })
	if _, err := s.Create("e", "b"); err != nil {
		t.Fatal(err)
	}
	w, _ = s.View("e")
	step("a third child writes", cw("e", int(blk)), "b", "e")
	used, _, _ := s.Storage("b")
	if used == 0 {
		t.Fatal("nothing counted")
	}
	// A new Open counts by a walk: the same, and a branch's own limit
	// outlives it.
	if err := s.SetLimit("e", 3*blk); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s, err = Open(filepath.Join(dir, "store"), base, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if u, _, _ := s.Storage("b"); u != -1 {
		t.Fatalf("b counted without a limit: %d", u)
	}
	if u, max, _ := s.Storage("e"); max != 3*blk || u != s.MeasureStorage("e") {
		t.Fatalf("e after a new Open: %d of %d", u, max)
	}
	s.Close()
	s, err = Open(filepath.Join(dir, "store"), base, Options{MaxStorage: 1 << 40})
	if err != nil {
		t.Fatal(err)
	}
	exact(t, s, "a new Open", "b", "e")
	if u, _, _ := s.Storage("b"); u != used {
		t.Fatalf("b after a new Open: %d, before %d", u, used)
	}
	// A kernel-path run would write unseen: refused.
	if _, err := s.Hold("e"); !errors.Is(err, ErrQuotaHold) {
		t.Fatalf("hold of a counted branch: %v", err)
	}
}

// TestStorageStatfs: statfs in a counted branch shows the room its limits
// leave.
func TestStorageStatfs(t *testing.T) {
	s, _, _ := quotaStore(t, 64)
	blk := s.block
	v, err := s.Create("b", MainName)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.SetLimit("b", 16*blk); err != nil {
		t.Fatal(err)
	}
	f := openW(t, v, "a", 0)
	defer f.Close()
	if _, err := f.WriteAt(make([]byte, 4*blk), 0); err != nil {
		t.Fatal(err)
	}
	st, err := v.Statfs()
	if err != nil {
		t.Fatal(err)
	}
	if room := int64(st.Bavail) * st.Frsize; room != 12*blk || int64(st.Blocks)*st.Frsize != 16*blk {
		t.Fatalf("statfs in b: %d of %d bytes free; want %d of %d", room, int64(st.Blocks)*st.Frsize, 12*blk, 16*blk)
	}
	// The mount's limit, when it leaves less.
	w, _ := s.Create("c", MainName)
	g := openW(t, w, "g", 0)
	defer g.Close()
	if _, err := g.WriteAt(make([]byte, 56*blk), 0); err != nil {
		t.Fatal(err)
	}
	st, _ = v.Statfs()
	if room := int64(st.Bavail) * st.Frsize; room != 4*blk {
		t.Fatalf("statfs in b under the mount's limit: %d bytes free; want %d", room, 4*blk)
	}
	if st, _ := s.Main().Statfs(); int64(st.Bavail)*st.Frsize <= 4*blk {
		t.Fatalf("main, which no limit counts, shows %d bytes free", int64(st.Bavail)*st.Frsize)
	}
}
