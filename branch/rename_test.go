package branch

import (
	"errors"
	"testing"

	"golang.org/x/sys/unix"
)

// TestRenameWithoutFUSE renames through a branch's view: what the view
// shows afterwards, the error for a refused rename, and the base left as
// it was in every case.
func TestRenameWithoutFUSE(t *testing.T) {
	for _, c := range []struct {
		name     string
		setup    func(t *testing.T, v *View)
		old, new string
		flags    uint
		err      error
		want     map[string]string // path in the view -> content ("" for a directory)
		gone     []string
	}{
		{name: "base file", old: "f", new: "g",
			want: map[string]string{"g": "base"}, gone: []string{"f"}},
		{name: "base file over base file", old: "d/x", new: "f",
			want: map[string]string{"f": "x"}, gone: []string{"d/x"}},
		{name: "base directory", old: "d", new: "e",
			want: map[string]string{"e": "", "e/x": "x"}, gone: []string{"d", "d/x"}},
		{name: "branch file", old: "new", new: "d/new",
			setup: func(t *testing.T, v *View) { write(t, v, "new", "n") },
			want:  map[string]string{"d/new": "n"}, gone: []string{"new"}},
		{name: "copied-up file", old: "f", new: "d/f",
			setup: func(t *testing.T, v *View) { write(t, v, "f", "changed") },
			want:  map[string]string{"d/f": "changed"}, gone: []string{"f"}},
		{name: "onto a tombstone", old: "f", new: "d/x",
			setup: func(t *testing.T, v *View) {
				if err := v.Unlink("d/x"); err != nil {
					t.Fatal(err)
				}
			},
			want: map[string]string{"d/x": "base"}, gone: []string{"f"}},
		{name: "exchange", old: "f", new: "d/x", flags: unix.RENAME_EXCHANGE,
			want: map[string]string{"f": "x", "d/x": "base"}},
		{name: "noreplace onto a file", old: "f", new: "d/x", flags: unix.RENAME_NOREPLACE, err: unix.EEXIST,
			want: map[string]string{"f": "base", "d/x": "x"}},
		{name: "noreplace", old: "f", new: "h", flags: unix.RENAME_NOREPLACE,
			want: map[string]string{"h": "base"}, gone: []string{"f"}},
		{name: "file onto a directory", old: "f", new: "d", err: unix.EISDIR,
			want: map[string]string{"f": "base", "d/x": "x"}},
		{name: "directory onto a file", old: "d", new: "f", err: unix.ENOTDIR,
			want: map[string]string{"f": "base", "d/x": "x"}},
		{name: "directory onto a non-empty one", old: "e", new: "d", err: unix.ENOTEMPTY,
			setup: func(t *testing.T, v *View) {
				if _, err := v.Mkdir("e", 0o755, me); err != nil {
					t.Fatal(err)
				}
			},
			want: map[string]string{"e": "", "d/x": "x"}},
		{name: "directory into itself", old: "d", new: "d/sub", err: unix.EINVAL,
			want: map[string]string{"d/x": "x"}, gone: []string{"d/sub"}},
		{name: "missing source", old: "nothing", new: "g", err: unix.ENOENT,
			gone: []string{"nothing", "g"}},
		{name: "missing target directory", old: "f", new: "no/g", err: unix.ENOENT,
			want: map[string]string{"f": "base"}},
		{name: "deleted source", old: "d/x", new: "g", err: unix.ENOENT,
			setup: func(t *testing.T, v *View) {
				if err := v.Unlink("d/x"); err != nil {
					t.Fatal(err)
				}
			},
			gone: []string{"d/x", "g"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, base := newStore(t)
			v, err := s.Create("b", MainName)
			if err != nil {
				t.Fatal(err)
			}
			if c.setup != nil {
				c.setup(t, v)
			}
			before := treeOf(t, base)
			err = v.Rename(c.old, c.new, c.flags)
			if c.err == nil && err != nil || c.err != nil && !errors.Is(err, c.err) {
				t.Fatalf("Rename(%q, %q, %#x) = %v, want %v", c.old, c.new, c.flags, err, c.err)
			}
			for p, want := range c.want {
				e, err := v.Lookup(p)
				if err != nil {
					t.Errorf("%s: %v", p, err)
					continue
				}
				if e.IsDir() != (want == "") {
					t.Errorf("%s: mode %o", p, e.Stat.Mode)
				} else if want != "" {
					if got := readView(t, v, p); got != want {
						t.Errorf("%s = %q, want %q", p, got, want)
					}
				}
			}
			for _, p := range c.gone {
				if _, err := v.Lookup(p); !errors.Is(err, unix.ENOENT) {
					t.Errorf("%s after the rename: %v, want ENOENT", p, err)
				}
			}
			if d := diffTrees(before, treeOf(t, base)); d != "" {
				t.Errorf("the base changed: %s", d)
			}
			// The listing agrees with the lookups.
			got := viewTree(t, v, "", nil)
			for _, p := range c.gone {
				if _, ok := got[p]; ok {
					t.Errorf("%s listed after the rename", p)
				}
			}
			for p := range c.want {
				if _, ok := got[p]; !ok {
					t.Errorf("%s not listed after the rename", p)
				}
			}
		})
	}
}
