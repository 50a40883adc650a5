package branch

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// viewTreeFull is viewTree with symlink targets, FIFOs and user xattrs:
// what a commit must carry over as the branch showed it.
func viewTreeFull(t *testing.T, v *View) map[string]string {
	t.Helper()
	out := viewTree(t, v, "", nil)
	for p := range out {
		switch e := entryOf(t, v, p); e.Stat.Mode & unix.S_IFMT {
		case unix.S_IFLNK:
			target, err := v.Readlink(p)
			mustOK(t, err)
			out[p] += " -> " + target
		case unix.S_IFIFO:
			out[p] += " fifo"
		}
		names, err := v.ListXattr(p)
		if errors.Is(err, unix.EPERM) || errors.Is(err, unix.EOPNOTSUPP) {
			continue // user xattrs of a symlink
		}
		mustOK(t, err)
		sort.Strings(names)
		for _, n := range names {
			buf := make([]byte, 256)
			k, err := v.GetXattr(p, n, buf)
			mustOK(t, err)
			out[p] += " " + n + "=" + string(buf[:k])
		}
	}
	return out
}

// A commit of every kind of entry and change, into main and into a parent
// branch, with the store on the base's mount and apart from it: afterwards
// the parent shows exactly what the branch showed, and no marker of the
// branch's (a tombstone, an opaque mark) reaches the base.
func TestCommitKinds(t *testing.T) {
	must := mustOK
	for _, c := range []struct {
		name   string
		change func(t *testing.T, v *View)
	}{
		{"symlink", func(t *testing.T, v *View) { _, err := v.Symlink("f", "s", me); must(t, err) }},
		{"FIFO", func(t *testing.T, v *View) { _, err := v.Mknod("q", unix.S_IFIFO|0o600, 0, me); must(t, err) }},
		{"new tree of every kind", func(t *testing.T, v *View) {
			_, err := v.Mkdir("n", 0o750, me)
			must(t, err)
			_, err = v.Mkdir("n/sub", 0o700, me)
			must(t, err)
			write(t, v, "n/sub/file", "deep")
			_, err = v.Symlink("../f", "n/link", me)
			must(t, err)
			_, err = v.Mknod("n/q", unix.S_IFIFO|0o640, 0, me)
			must(t, err)
			must(t, v.SetXattr("n/sub", "user.tag", []byte("t"), 0))
		}},
		{"directory moved with a deletion in it", func(t *testing.T, v *View) {
			write(t, v, "d/y", "y")
			must(t, v.Unlink("d/x"))
			must(t, v.Rename("d", "e", 0))
		}},
		{"directory made again", func(t *testing.T, v *View) {
			must(t, v.Unlink("d/x"))
			must(t, v.Rmdir("d"))
			_, err := v.Mkdir("d", 0o700, me)
			must(t, err)
			_, err = v.Symlink("x", "d/x", me)
			must(t, err)
		}},
		{"symlink replaces a file", func(t *testing.T, v *View) {
			must(t, v.Unlink("f"))
			_, err := v.Symlink("d/x", "f", me)
			must(t, err)
		}},
		{"file replaces a directory", func(t *testing.T, v *View) {
			must(t, v.Unlink("d/x"))
			must(t, v.Rmdir("d"))
			write(t, v, "d", "now a file")
		}},
		{"attributes", func(t *testing.T, v *View) {
			must(t, v.Chmod("f", 0o600))
			must(t, v.SetXattr("f", "user.a", []byte("1"), 0))
			must(t, v.SetXattr("d", "user.b", []byte("2"), 0))
			must(t, v.Chmod("d", 0o711))
		}},
		{"xattr removed from a directory", func(t *testing.T, v *View) { must(t, v.RemoveXattr("d", "user.old")) }},
		{"the root's attributes", func(t *testing.T, v *View) {
			must(t, v.SetXattr("", "user.r", []byte("r"), 0))
			must(t, v.Chmod("", 0o750))
		}},
		{"two names of one file", func(t *testing.T, v *View) {
			_, err := v.Link("f", "g")
			must(t, err)
			write(t, v, "g", "both")
		}},
	} {
		for _, layout := range layouts {
			for _, into := range []string{MainName, "p"} {
				t.Run(c.name+"/"+layout+"/into-"+into, func(t *testing.T) {
					var s *Store
					var base string
					if layout == "apart" {
						s, base = newStoreApart(t)
					} else {
						s, base = newStore(t)
					}
					mustOK(t, os.Symlink("f", filepath.Join(base, "l")))
					mustOK(t, unix.Setxattr(filepath.Join(base, "d"), "user.old", []byte("o"), 0))
					parent := s.Main()
					if into == "p" {
						parent = mustCreate(t, s, "p", MainName)
						write(t, parent, "pf", "p")
					}
					b := mustCreate(t, s, "b", into)
					c.change(t, b)
					want := viewTreeFull(t, b)
					if _, err := s.Commit("b"); err != nil {
						t.Fatal(err)
					}
					if d := diffTrees(want, viewTreeFull(t, parent)); d != "" {
						t.Errorf("%s shows other than b did: %s", into, d)
					}
					if into == MainName {
						for p, desc := range diskTree(t, base) {
							var st unix.Stat_t
							mustOK(t, unix.Lstat(filepath.Join(base, p), &st))
							if isWhiteout(&st) || strings.Contains(desc, overlayPrefix) {
								t.Errorf("a branch's marker in the base: %s %s", p, desc)
							}
						}
					}
					// And it stays so at the next mount.
					s = reopen(t, s)
					parent = s.Main()
					if into == "p" {
						parent = viewOf(s, "p")
					}
					if d := diffTrees(want, viewTreeFull(t, parent)); d != "" {
						t.Errorf("%s after a new mount: %s", into, d)
					}
				})
			}
		}
	}
}

// What Diff says of a directory whose xattrs a branch changed, against a
// base directory that has some: a directory copied up with nothing changed
// is no change.
func TestDiffDirectoryXattrs(t *testing.T) {
	for _, c := range []struct {
		name     string
		change   func(t *testing.T, v *View) error
		modified []string
	}{
		{"copied up alone", func(t *testing.T, v *View) error { return v.Chmod("d", 0o755) }, nil},
		{"value set again", func(t *testing.T, v *View) error { return v.SetXattr("d", "user.a", []byte("1"), 0) }, nil},
		{"value changed", func(t *testing.T, v *View) error { return v.SetXattr("d", "user.a", []byte("2"), 0) }, []string{"d/"}},
		{"one more", func(t *testing.T, v *View) error { return v.SetXattr("d", "user.c", []byte("3"), 0) }, []string{"d/"}},
		{"one removed", func(t *testing.T, v *View) error { return v.RemoveXattr("d", "user.a") }, []string{"d/"}},
		{"one swapped for another", func(t *testing.T, v *View) error {
			if err := v.RemoveXattr("d", "user.a"); err != nil {
				return err
			}
			return v.SetXattr("d", "user.c", []byte("1"), 0)
		}, []string{"d/"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, base := newStore(t)
			for _, x := range [][2]string{{"user.a", "1"}, {"user.b", "2"}} {
				mustOK(t, unix.Setxattr(filepath.Join(base, "d"), x[0], []byte(x[1]), 0))
			}
			mustOK(t, os.Chmod(filepath.Join(base, "d"), 0o755))
			v := mustCreate(t, s, "b", MainName)
			mustOK(t, c.change(t, v))
			if e := entryOf(t, v, "d"); e.Lower() {
				t.Fatal("d was not copied up")
			}
			d, err := s.Diff("b")
			mustOK(t, err)
			if !slices.Equal(d.Modified, c.modified) || len(d.Added)+len(d.Deleted) > 0 {
				t.Errorf("diff: %+v, want modified %q alone", d, c.modified)
			}
		})
	}
}

// A commit that works in more directories than it keeps open at once
// (dirCacheMax) carries every change.
func TestCommitManyDirectories(t *testing.T) {
	s, base := newStore(t)
	n := dirCacheMax + 20
	for i := range n {
		d := filepath.Join(base, fmt.Sprintf("m%03d", i))
		mustOK(t, os.Mkdir(d, 0o755))
		mustOK(t, os.WriteFile(filepath.Join(d, "f"), []byte("base"), 0o644))
	}
	b := mustCreate(t, s, "b", MainName)
	for i := range n {
		write(t, b, fmt.Sprintf("m%03d/f", i), fmt.Sprint("b ", i))
	}
	mustCommit(t, s, "b")
	for i := range n {
		p := filepath.Join(base, fmt.Sprintf("m%03d", i), "f")
		if data, err := os.ReadFile(p); err != nil || string(data) != fmt.Sprint("b ", i) {
			t.Fatalf("%s = %q, %v", p, data, err)
		}
	}
}
