package branch

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// me owns what the tests make, so that they run as any user.
var me = Owner{Uid: uint32(os.Geteuid()), Gid: uint32(os.Getegid())}

// treeOf describes every entry below root: type, mode and content.
func treeOf(t *testing.T, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		desc := fi.Mode().String()
		if fi.Mode().IsRegular() {
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			desc += " " + string(data)
		}
		out[rel] = desc
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// stagesIn lists the names of commits' stages in the base's root.
func stagesIn(t *testing.T, base string) []string {
	t.Helper()
	ents, err := os.ReadDir(base)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), StageName) {
			out = append(out, e.Name())
		}
	}
	return out
}

func diffTrees(a, b map[string]string) string {
	var d []string
	for p, x := range a {
		if y, ok := b[p]; !ok {
			d = append(d, "-"+p)
		} else if x != y {
			d = append(d, fmt.Sprintf("~%s (%s -> %s)", p, x, y))
		}
	}
	for p := range b {
		if _, ok := a[p]; !ok {
			d = append(d, "+"+p)
		}
	}
	return strings.Join(d, " ")
}

// viewTree describes what view v shows below rel.
func viewTree(t *testing.T, v *View, rel string, out map[string]string) map[string]string {
	t.Helper()
	if out == nil {
		out = map[string]string{}
	}
	ents, err := v.ReadDir(rel)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		p := JoinRel(rel, e.Name)
		en, err := v.Lookup(p)
		if err != nil {
			t.Fatal(err)
		}
		out[p] = strconv.FormatUint(uint64(en.Stat.Mode), 8)
		switch en.Stat.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			viewTree(t, v, p, out)
		case unix.S_IFREG:
			f, _, err := v.Open(p, unix.O_RDONLY)
			if err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, 4096)
			n, _ := f.ReadAt(buf, 0)
			f.Close()
			out[p] += " " + string(buf[:max(n, 0)])
		}
	}
	return out
}

// changeMuch gives branch v a commit of many steps of every kind: files
// replaced and added, a tombstone, a new tree, a directory replaced by a
// new one, and a directory whose mode changes.
func changeMuch(t *testing.T, v *View) {
	t.Helper()
	write(t, v, "f", "from branch")
	write(t, v, "d/new", "new")
	if err := v.Unlink("d/x"); err != nil {
		t.Fatal(err)
	}
	if _, err := v.Mkdir("n", 0o755, me); err != nil {
		t.Fatal(err)
	}
	if _, err := v.Mkdir("n/deep", 0o700, me); err != nil {
		t.Fatal(err)
	}
	write(t, v, "n/deep/y", "y")
	if err := v.Chmod("d", 0o711); err != nil {
		t.Fatal(err)
	}
	if err := v.Unlink("e/z"); err != nil {
		t.Fatal(err)
	}
	if err := v.Rmdir("e"); err != nil {
		t.Fatal(err)
	}
	if _, err := v.Mkdir("e", 0o755, me); err != nil {
		t.Fatal(err)
	}
	write(t, v, "e/w", "w")
}

// layouts are where a test's store goes: on the base's mount, or apart
// from it (in /dev/shm, a tmpfs), where commits into the base copy.
var layouts = []string{"same", "apart"}

func newBigStore(t *testing.T, layout ...string) (*Store, string) {
	t.Helper()
	var s *Store
	var base string
	if len(layout) > 0 && layout[0] == "apart" {
		s, base = newStoreApart(t)
	} else {
		s, base = newStore(t)
	}
	for _, f := range []string{"e/z", "g1", "g2"} {
		os.MkdirAll(filepath.Join(base, filepath.Dir(f)), 0o755)
		if err := os.WriteFile(filepath.Join(base, f), []byte(f), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return s, base
}

// newStoreApart is newStore with the store on another mount than the base.
func newStoreApart(t *testing.T) (*Store, string) {
	t.Helper()
	dir := t.TempDir()
	store, err := os.MkdirTemp("/dev/shm", "branchfs-store")
	if err != nil {
		t.Skipf("no /dev/shm: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(store) })
	if a, _ := MountID(dir); a == 0 || a == func() uint64 { b, _ := MountID(store); return b }() {
		t.Skip("/dev/shm is on the mount of the test's temporary directory")
	}
	base := filepath.Join(dir, "base")
	if err := os.MkdirAll(filepath.Join(base, "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(base, "f"), []byte("base"), 0o644)
	os.WriteFile(filepath.Join(base, "d", "x"), []byte("x"), 0o644)
	s, err := Open(store, base, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, base
}

func setFailHook(t *testing.T, fn func(string) error) {
	failHook = fn
	t.Cleanup(func() { failHook = nil })
}

// failAt makes step fail with err.
func failAt(step string, err error) func(string) error {
	return func(s string) error {
		if s == step {
			return err
		}
		return nil
	}
}

// reopen closes s and opens its store again, as a new mount would.
func reopen(t *testing.T, s *Store) *Store {
	t.Helper()
	s.Close()
	s2, err := Open(s.Dir(), s.Base(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s2.Close() })
	return s2
}

// A commit that fails at any step, with ENOSPC or EPERM, leaves the base,
// the branch and its sibling as they were, reports the failure, and
// succeeds when tried again.
func TestCommitFailureRollsBack(t *testing.T) {
	// Every step a commit of changeMuch passes, in order.
	var points []string
	s, _ := newBigStore(t)
	b, _ := s.Create("b", MainName)
	changeMuch(t, b)
	setFailHook(t, func(step string) error {
		if step != "commit-epoch" {
			points = append(points, step)
		}
		return nil
	})
	if _, err := s.Commit("b"); err != nil {
		t.Fatal(err)
	}
	if len(points) < 8 {
		t.Fatalf("the commit passed only %v", points)
	}
	for _, point := range points {
		for _, errno := range []unix.Errno{unix.ENOSPC, unix.EPERM} {
			for _, layout := range layouts {
				t.Run(point+"-"+errno.Error()+"-"+layout, func(t *testing.T) {
					s, base := newBigStore(t, layout)
					b, _ := s.Create("b", MainName)
					sib, _ := s.Create("s", MainName)
					write(t, sib, "sibling", "s")
					changeMuch(t, b)
					baseBefore := treeOf(t, base)
					viewBefore := viewTree(t, b, "", nil)
					fired := false
					setFailHook(t, func(s string) error {
						if s == point {
							fired = true
							return errno
						}
						return nil
					})
					_, err := s.Commit("b")
					if !fired {
						t.Fatalf("step %s not reached: %v", point, err)
					}
					if !errors.Is(err, errno) {
						t.Fatalf("commit: %v, want %v", err, errno)
					}
					if d := diffTrees(baseBefore, treeOf(t, base)); d != "" {
						t.Errorf("base changed by a failed commit: %s", d)
					}
					if d := diffTrees(viewBefore, viewTree(t, b, "", nil)); d != "" {
						t.Errorf("branch changed by a failed commit: %s", d)
					}
					if b.Check() != nil || sib.Check() != nil {
						t.Errorf("branches not live after a failed commit: %v, %v", b.Check(), sib.Check())
					}
					// A new mount finds nothing to finish.
					s = reopen(t, s)
					if d := diffTrees(baseBefore, treeOf(t, base)); d != "" {
						t.Errorf("base changed by the next mount: %s", d)
					}
					failHook = nil
					if _, err := s.Commit("b"); err != nil {
						t.Fatalf("commit retried: %v", err)
					}
					after := treeOf(t, base)
					for p, want := range map[string]string{"f": "from branch", "d/new": "new", "n/deep/y": "y", "e/w": "w"} {
						if got := after[p]; !strings.HasSuffix(got, " "+want) {
							t.Errorf("base %s = %q after the retried commit, want %q", p, got, want)
						}
					}
					for _, p := range []string{"d/x", "e/z"} {
						if _, ok := after[p]; ok {
							t.Errorf("base %s still there after the retried commit", p)
						}
					}
					if after["d"] != "drwx--x--x" {
						t.Errorf("base d is %s after the retried commit", after["d"])
					}
					if left := stagesIn(t, base); len(left) > 0 {
						t.Errorf("stages left in the base: %v", left)
					}
				})
			}
		}
	}
}

// A commit whose every step happened reports success even when its "done"
// record cannot be written, and the next mount does not apply it again.
func TestCommitDoneRecordFails(t *testing.T) {
	for _, layout := range layouts {
		t.Run(layout, func(t *testing.T) { testCommitDoneRecordFails(t, layout) })
	}
}

func testCommitDoneRecordFails(t *testing.T, layout string) {
	s, base := newBigStore(t, layout)
	b, _ := s.Create("b", MainName)
	changeMuch(t, b)
	setFailHook(t, failAt("commit-epoch", unix.EIO))
	if _, err := s.Commit("b"); err != nil {
		t.Fatalf("commit that happened reports %v", err)
	}
	failHook = nil
	// The main view is writable again: a write there must survive the
	// next mount.
	write(t, s.Main(), "f", "after")
	s = reopen(t, s)
	if data, _ := os.ReadFile(filepath.Join(base, "f")); string(data) != "after" {
		t.Errorf("base f = %q after the next mount, want the write made after the commit", data)
	}
	if l := s.List(false); len(l) != 1 {
		t.Errorf("after the next mount list shows %v, want main alone (a committed branch leaves it)", l)
	}
}

// A commit that fails and cannot roll back either keeps both sides
// read-only until a retry finishes it; a new mount finishes it too.
func TestCommitRollbackFails(t *testing.T) {
	for _, remount := range []bool{false, true} {
		for _, layout := range layouts {
			t.Run(fmt.Sprint("remount=", remount, "-", layout), func(t *testing.T) {
				s, base := newBigStore(t, layout)
				b, _ := s.Create("b", MainName)
				sib, _ := s.Create("s", MainName)
				changeMuch(t, b)
				setFailHook(t, func(step string) error {
					if step == "commit-step-3" || step == "commit-undo" {
						return unix.EIO
					}
					return nil
				})
				if _, err := s.Commit("b"); !errors.Is(err, ErrUnfinished) {
					t.Fatalf("commit: %v, want ErrUnfinished", err)
				}
				if err := b.Unlink("f"); !errors.Is(err, ErrUnfinished) {
					t.Errorf("write to the branch: %v, want ErrUnfinished", err)
				}
				if _, err := s.Abort("b", false); !errors.Is(err, ErrUnfinished) {
					t.Errorf("abort of the branch: %v, want ErrUnfinished", err)
				}
				// A stage in the base is in no view, and cannot be made there.
				stages := stagesIn(t, base)
				if layout == "apart" && len(stages) != 1 {
					t.Errorf("stages in the base of an unfinished commit: %v", stages)
				}
				for _, v := range []*View{s.Main(), sib} {
					ents, err := v.ReadDir("")
					if err != nil {
						t.Fatal(err)
					}
					for _, e := range ents {
						if strings.HasPrefix(e.Name, StageName) {
							t.Errorf("%s listed in view %s", e.Name, v.Name())
						}
					}
					for _, name := range append(stages, StageName) {
						if _, err := v.Lookup(name); !errors.Is(err, unix.ENOENT) {
							t.Errorf("lookup of %s in view %s: %v", name, v.Name(), err)
						}
					}
				}
				for _, name := range []string{StageName, StageName + "-x"} {
					if _, err := sib.Mkdir(name, 0o755, me); !errors.Is(err, unix.EPERM) {
						t.Errorf("mkdir %s in a branch: %v, want EPERM", name, err)
					}
				}
				failHook = nil
				if remount {
					s = reopen(t, s)
					if l := s.List(false); len(l) != 2 || l[1].Name != "s" {
						t.Errorf("after the next mount list shows %v, want main and s (a committed branch leaves it)", l)
					}
				} else if _, err := s.Commit("b"); err != nil {
					t.Fatalf("commit retried: %v", err)
				}
				if data, _ := os.ReadFile(filepath.Join(base, "n", "deep", "y")); string(data) != "y" {
					t.Errorf("base n/deep/y = %q", data)
				}
				if _, err := os.Stat(filepath.Join(base, "d", "x")); !os.IsNotExist(err) {
					t.Errorf("base d/x: %v", err)
				}
				if !remount && !errors.Is(sib.Check(), ErrStale) {
					t.Errorf("sibling: %v, want stale", sib.Check())
				}
			})
		}
	}
}

// chattr runs chattr(1); it skips the test where the flags are not there.
func chattr(t *testing.T, flag, p string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("chattr needs root")
	}
	if out, err := exec.Command("chattr", flag, p).CombinedOutput(); err != nil {
		t.Skipf("chattr %s: %v: %s", flag, err, out)
	}
	t.Cleanup(func() { exec.Command("chattr", strings.Replace(flag, "+", "-", 1), p).Run() })
}

// An immutable or append-only file in the base stops the commit before
// anything moves, with EPERM.
func TestCommitImmutableTarget(t *testing.T) {
	for _, tc := range []struct{ flag, path string }{{"+i", "g2"}, {"+a", "g2"}, {"+i", "e"}, {"+a", "d"}} {
		t.Run(tc.flag+tc.path, func(t *testing.T) {
			if os.Geteuid() != 0 {
				t.Skip("chattr needs root")
			}
			s, base := newBigStore(t)
			b, _ := s.Create("b", MainName)
			changeMuch(t, b)
			write(t, b, "g1", "1")
			write(t, b, "g2", "2")
			chattr(t, tc.flag, filepath.Join(base, tc.path))
			before := treeOf(t, base)
			if _, err := s.Commit("b"); !errors.Is(err, unix.EPERM) {
				t.Fatalf("commit: %v, want EPERM", err)
			}
			if d := diffTrees(before, treeOf(t, base)); d != "" {
				t.Errorf("base changed by a refused commit: %s", d)
			}
			exec.Command("chattr", strings.Replace(tc.flag, "+", "-", 1), filepath.Join(base, tc.path)).Run()
			if _, err := s.Commit("b"); err != nil {
				t.Fatalf("commit once the flag is gone: %v", err)
			}
		})
	}
}

// A commit whose rollback failed, rolled back later when other records
// followed its journal: the log keeps those records and says the commit
// did not happen.
func TestCommitRolledBackLater(t *testing.T) {
	s, base := newBigStore(t)
	b, _ := s.Create("b", MainName)
	if _, err := s.Create("s", MainName); err != nil {
		t.Fatal(err)
	}
	changeMuch(t, b)
	before := treeOf(t, base)
	undoFails := true
	setFailHook(t, func(step string) error {
		switch {
		case step == "commit-step-3":
			return unix.ENOSPC
		case step == "commit-undo" && undoFails:
			return unix.EIO
		}
		return nil
	})
	if _, err := s.Commit("b"); !errors.Is(err, ErrUnfinished) {
		t.Fatalf("commit: %v, want ErrUnfinished", err)
	}
	if _, err := s.Create("later", "s"); err != nil {
		t.Fatal(err)
	}
	undoFails = false
	if _, err := s.Commit("b"); !errors.Is(err, unix.ENOSPC) {
		t.Fatalf("commit retried: %v, want ENOSPC", err)
	}
	if d := diffTrees(before, treeOf(t, base)); d != "" {
		t.Errorf("base after the rollback: %s", d)
	}
	failHook = nil
	s = reopen(t, s)
	if d := diffTrees(before, treeOf(t, base)); d != "" {
		t.Errorf("base after the next mount: %s", d)
	}
	states := map[string]string{}
	for _, in := range s.List(false) {
		states[in.Name] = in.State
	}
	if states["b"] != "live" || states["later"] != "live" {
		t.Errorf("after the next mount: %v, want b and later live", states)
	}
}

// A commit whose "done" can be neither appended nor written in a new log
// has happened, but keeps its parent read-only until a later operation
// records it; nothing written afterwards meets the commit again.
func TestCommitDoneOwed(t *testing.T) {
	s, base := newBigStore(t)
	b, _ := s.Create("b", MainName)
	if _, err := s.Create("s", MainName); err != nil {
		t.Fatal(err)
	}
	changeMuch(t, b)
	setFailHook(t, func(step string) error {
		if step == "commit-epoch" || step == "commit-rewrite-log" {
			return unix.EIO
		}
		return nil
	})
	if _, err := s.Commit("b"); err != nil {
		t.Fatalf("commit that happened reports %v", err)
	}
	if err := s.Main().Unlink("g1"); !errors.Is(err, ErrUnfinished) {
		t.Errorf("write to main while the done is owed: %v, want ErrUnfinished", err)
	}
	failHook = nil
	if _, err := s.Abort("s", false); err != nil {
		t.Fatal(err)
	}
	write(t, s.Main(), "f", "after")
	reopen(t, s)
	if data, _ := os.ReadFile(filepath.Join(base, "f")); string(data) != "after" {
		t.Errorf("base f = %q after the next mount, want the write made after the commit", data)
	}
}

// A commit into a parent branch (whose delta takes tombstones and opaque
// directories) that fails at any step leaves both views as they were, and
// then succeeds.
func TestNestedCommitFailureRollsBack(t *testing.T) {
	setup := func(t *testing.T) (*Store, *View, *View) {
		s, _ := newBigStore(t)
		b, _ := s.Create("b", MainName)
		write(t, b, "f", "from b")
		if err := b.Unlink("d/x"); err != nil {
			t.Fatal(err)
		}
		if _, err := b.Mkdir("n", 0o755, me); err != nil {
			t.Fatal(err)
		}
		write(t, b, "n/old", "old")
		c, _ := s.Create("c", "b")
		write(t, c, "f", "from c")
		write(t, c, "d/x", "back")
		if err := c.Unlink("g1"); err != nil {
			t.Fatal(err)
		}
		if err := c.Unlink("n/old"); err != nil {
			t.Fatal(err)
		}
		if err := c.Rmdir("n"); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Mkdir("n", 0o700, me); err != nil {
			t.Fatal(err)
		}
		write(t, c, "n/new", "new")
		return s, b, c
	}
	var points []string
	s, _, _ := setup(t)
	setFailHook(t, func(step string) error {
		if step != "commit-epoch" {
			points = append(points, step)
		}
		return nil
	})
	if _, err := s.Commit("c"); err != nil {
		t.Fatal(err)
	}
	for _, point := range points {
		t.Run(point, func(t *testing.T) {
			s, b, c := setup(t)
			bBefore, cBefore := viewTree(t, b, "", nil), viewTree(t, c, "", nil)
			setFailHook(t, failAt(point, unix.ENOSPC))
			if _, err := s.Commit("c"); !errors.Is(err, unix.ENOSPC) {
				t.Fatalf("commit: %v, want ENOSPC", err)
			}
			if d := diffTrees(bBefore, viewTree(t, b, "", nil)); d != "" {
				t.Errorf("parent's view changed by a failed commit: %s", d)
			}
			if d := diffTrees(cBefore, viewTree(t, c, "", nil)); d != "" {
				t.Errorf("branch's view changed by a failed commit: %s", d)
			}
			failHook = nil
			if _, err := s.Commit("c"); err != nil {
				t.Fatalf("commit retried: %v", err)
			}
			if d := diffTrees(cBefore, viewTree(t, b, "", nil)); d != "" {
				t.Errorf("parent's view after the commit differs from the branch's before: %s", d)
			}
		})
	}
}
