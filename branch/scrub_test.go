package branch

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// deltaContents lists what a delta directory holds below root, sorted:
// each path, with "!" for a tombstone and "*" for an opaque directory.
func deltaContents(t *testing.T, root string) string {
	t.Helper()
	var out []string
	err := filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err != nil || p == root {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		var st unix.Stat_t
		if unix.Lstat(p, &st) == nil && isWhiteout(&st) {
			rel += "!"
		}
		if _, err := unix.Lgetxattr(p, opaqueXattr, nil); err == nil {
			rel += "*"
		}
		if names, _ := listXattrs(p); slices.ContainsFunc(names, func(n string) bool {
			return strings.HasPrefix(n, overlayPrefix) && n != opaqueXattr && !strings.HasPrefix(n, originXattr)
		}) {
			rel += "+" // overlayfs's bookkeeping
		}
		out = append(out, rel)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(out)
	return strings.Join(out, " ")
}

// TestScrub removes the markers of a tree from a branch's delta as a
// commit into the base does, against the base of newStore (f, d/x) and
// d/sub/z.
func TestScrub(t *testing.T) {
	must := func(t *testing.T, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	// remake deletes dir and what it holds, and makes it again: opaque.
	var remove func(t *testing.T, v *View, dir string)
	remove = func(t *testing.T, v *View, dir string) {
		t.Helper()
		ents, err := v.ReadDir(dir)
		must(t, err)
		for _, e := range ents {
			if p := JoinRel(dir, e.Name); e.Type == unix.DT_DIR {
				remove(t, v, p)
			} else {
				must(t, v.Unlink(p))
			}
		}
		must(t, v.Rmdir(dir))
	}
	remake := func(t *testing.T, v *View, dir string) {
		t.Helper()
		remove(t, v, dir)
		_, err := v.Mkdir(dir, 0o755, me)
		must(t, err)
	}
	for _, c := range []struct {
		name          string
		change        func(t *testing.T, v *View)
		rel           string
		root          bool
		before, after string // deltaContents of the delta
	}{
		{name: "tombstone", rel: "d", root: true,
			change: func(t *testing.T, v *View) { must(t, v.Unlink("d/x")) },
			before: "d d/x!", after: "d"},
		{name: "opaque root", rel: "d", root: true,
			change: func(t *testing.T, v *View) { remake(t, v, "d"); write(t, v, "d/y", "y") },
			before: "d* d/y", after: "d d/y"},
		{name: "opaque root kept", rel: "d", root: false,
			change: func(t *testing.T, v *View) { remake(t, v, "d"); write(t, v, "d/y", "y") },
			before: "d* d/y", after: "d* d/y"},
		{name: "nested", rel: "d", root: false,
			change: func(t *testing.T, v *View) { remake(t, v, "d/sub"); must(t, v.Unlink("d/x")) },
			before: "d d/sub* d/x!", after: "d d/sub"},
		{name: "empty file", rel: "d", root: true,
			change: func(t *testing.T, v *View) { write(t, v, "d/empty", ""); must(t, v.Unlink("d/x")) },
			before: "d d/empty d/x!", after: "d d/empty"},
		{name: "a file", rel: "f", root: true,
			change: func(t *testing.T, v *View) { write(t, v, "f", "") },
			before: "f", after: "f"},
		{name: "beside the tree", rel: "d", root: true,
			change: func(t *testing.T, v *View) { must(t, v.Unlink("d/x")); must(t, v.Unlink("f")) },
			before: "d d/x! f!", after: "d f!"},
		{name: "overlayfs bookkeeping", rel: "d", root: false,
			change: func(t *testing.T, v *View) {
				// What overlayfs leaves after a copy-up of d/x and a
				// rename of it into the new d/n: origin on each copy,
				// impure on the directories that hold one.
				write(t, v, "d/x", "x2")
				_, err := v.Mkdir("d/n", 0o755, me)
				must(t, err)
				write(t, v, "d/n/y", "y")
				write(t, v, "d/n/z", "z")
				delta := v.store.deltaDir("b")
				for _, p := range []string{"d", "d/x", "d/n", "d/n/y"} {
					must(t, unix.Setxattr(filepath.Join(delta, p), overlayPrefix+"origin", []byte{}, 0))
				}
				must(t, unix.Setxattr(filepath.Join(delta, "d"), impureXattr, []byte("y"), 0))
				must(t, unix.Setxattr(filepath.Join(delta, "d/n"), impureXattr, []byte("y"), 0))
				must(t, unix.Setxattr(filepath.Join(delta, "d/n/z"), "user.keep", []byte("k"), 0))
			},
			before: "d+ d/n+ d/n/y+ d/n/z d/x+", after: "d d/n d/n/y d/n/z d/x"},
		{name: "missing", rel: "nothing", root: true,
			change: func(t *testing.T, v *View) { must(t, v.Unlink("f")) },
			before: "f!", after: "f!"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, base := newStore(t)
			must(t, os.MkdirAll(filepath.Join(base, "d", "sub"), 0o755))
			must(t, os.WriteFile(filepath.Join(base, "d", "sub", "z"), []byte("z"), 0o644))
			v, err := s.Create("b", MainName)
			must(t, err)
			c.change(t, v)
			delta := s.deltaDir("b")
			if got := deltaContents(t, delta); got != c.before {
				t.Fatalf("delta before the scrub: %q, want %q", got, c.before)
			}
			must(t, v.layers[0].scrub(c.rel, c.root))
			if got := deltaContents(t, delta); got != c.after {
				t.Errorf("delta after the scrub: %q, want %q", got, c.after)
			}
		})
	}
}
