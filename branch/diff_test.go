package branch

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

// TestDiff lists what each kind of change in a branch makes Diff say,
// against the base of newStore (f, d/x).
func TestDiff(t *testing.T) {
	must := func(t *testing.T, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		name                     string
		change                   func(t *testing.T, v *View)
		added, modified, deleted string // space-separated, sorted
	}{
		{name: "nothing", change: func(t *testing.T, v *View) {}},
		{name: "new file", change: func(t *testing.T, v *View) { write(t, v, "g", "g") },
			added: "g"},
		{name: "file changed", change: func(t *testing.T, v *View) { write(t, v, "f", "new") },
			modified: "f"},
		{name: "file deleted", change: func(t *testing.T, v *View) { must(t, v.Unlink("d/x")) },
			deleted: "d/x"},
		{name: "new tree", change: func(t *testing.T, v *View) {
			_, err := v.Mkdir("n", 0o755, me)
			must(t, err)
			write(t, v, "n/y", "y")
		}, added: "n/ n/y"},
		{name: "new file in a base directory", change: func(t *testing.T, v *View) { write(t, v, "d/new", "n") },
			added: "d/new"},
		{name: "directory's mode", change: func(t *testing.T, v *View) { must(t, v.Chmod("d", 0o700)) },
			modified: "d/"},
		{name: "directory's xattr", change: func(t *testing.T, v *View) { must(t, v.SetXattr("d", "user.test", []byte("1"), 0)) },
			modified: "d/"},
		{name: "directory made again", change: func(t *testing.T, v *View) {
			must(t, v.Unlink("d/x"))
			must(t, v.Rmdir("d"))
			_, err := v.Mkdir("d", 0o755, me)
			must(t, err)
		}, modified: "d/"},
		{name: "file made and deleted", change: func(t *testing.T, v *View) {
			write(t, v, "g", "g")
			must(t, v.Unlink("g"))
		}},
		{name: "renamed", change: func(t *testing.T, v *View) { must(t, v.Rename("f", "d/f", 0)) },
			added: "d/f", deleted: "f"},
		{name: "directory replaces a file", change: func(t *testing.T, v *View) {
			must(t, v.Unlink("f"))
			_, err := v.Mkdir("f", 0o755, me)
			must(t, err)
		}, modified: "f/"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, _ := newStore(t)
			v, err := s.Create("b", MainName)
			must(t, err)
			c.change(t, v)
			d, err := s.Diff("b")
			must(t, err)
			if d.Branch != "b" || d.Parent != MainName {
				t.Errorf("diff of %s against %s", d.Branch, d.Parent)
			}
			for _, l := range []struct {
				what string
				got  []string
				want string
			}{{"added", d.Added, c.added}, {"modified", d.Modified, c.modified}, {"deleted", d.Deleted, c.deleted}} {
				slices.Sort(l.got)
				if got := strings.Join(l.got, " "); got != l.want {
					t.Errorf("%s: %q, want %q", l.what, got, l.want)
				}
			}
		})
	}
}

// TestDiffNested diffs a child branch against its parent branch, not the
// base.
func TestDiffNested(t *testing.T) {
	s, _ := newStore(t)
	p, _ := s.Create("p", MainName)
	write(t, p, "g", "from p")
	c, err := s.Create("c", "p")
	if err != nil {
		t.Fatal(err)
	}
	write(t, c, "h", "from c")
	if err := c.Unlink("g"); err != nil {
		t.Fatal(err)
	}
	d, err := s.Diff("c")
	if err != nil {
		t.Fatal(err)
	}
	if d.Parent != "p" || strings.Join(d.Added, " ") != "h" || strings.Join(d.Deleted, " ") != "g" || len(d.Modified) != 0 {
		t.Errorf("diff of c: %+v", d)
	}
}

func TestDiffRefused(t *testing.T) {
	s, _ := newStore(t)
	if _, err := s.Create("b", MainName); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Abort("b", false); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		want error
	}{
		{MainName, ErrMainView},
		{"nothing", ErrNotFound},
		{"b", ErrNotFound}, // aborted: forgotten
	} {
		if _, err := s.Diff(c.name); !errors.Is(err, c.want) {
			t.Errorf("Diff(%q) = %v, want %v", c.name, err, c.want)
		}
	}
}
