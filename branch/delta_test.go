package branch

import (
	"fmt"
	"strings"
	"testing"
)

// TestDelta lists what each kind of change puts in a branch's delta, in the
// format's own terms, against the base of newStore (f, d/x): a directory
// before its entries, names in byte order.
func TestDelta(t *testing.T) {
	must := func(t *testing.T, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		name   string
		change func(t *testing.T, v *View)
		want   string // "path:kind" items, space-separated
	}{
		{"nothing", func(t *testing.T, v *View) {}, ""},
		{"file changed", func(t *testing.T, v *View) { write(t, v, "f", "new") }, "f:entry"},
		{"file deleted", func(t *testing.T, v *View) { must(t, v.Unlink("d/x")) }, "d:dir d/x:deleted"},
		{"new file in a base directory", func(t *testing.T, v *View) { write(t, v, "d/new", "n") }, "d:dir d/new:entry"},
		{"directory's mode", func(t *testing.T, v *View) { must(t, v.Chmod("d", 0o700)) }, "d:dir-changed"},
		{"new tree", func(t *testing.T, v *View) {
			_, err := v.Mkdir("n", 0o755, me)
			must(t, err)
			write(t, v, "n/y", "y")
		}, "n:dir-changed n/y:entry"},
		{"directory made again", func(t *testing.T, v *View) {
			must(t, v.Unlink("d/x"))
			must(t, v.Rmdir("d"))
			_, err := v.Mkdir("d", 0o755, me)
			must(t, err)
			write(t, v, "d/z", "z")
		}, "d:opaque d/z:entry"},
		{"symlink", func(t *testing.T, v *View) {
			_, err := v.Symlink("f", "l", me)
			must(t, err)
		}, "l:entry"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, _ := newStore(t)
			v, err := s.Create("b", MainName)
			must(t, err)
			c.change(t, v)
			items, err := s.Delta("b")
			must(t, err)
			var got []string
			for _, it := range items {
				got = append(got, fmt.Sprintf("%s:%s", it.Path, it.Kind))
			}
			if g := strings.Join(got, " "); g != c.want {
				t.Errorf("delta %q, want %q", g, c.want)
			}
		})
	}
	s, _ := newStore(t)
	if _, err := s.Delta(MainName); err == nil {
		t.Error("a delta of main")
	}
}
