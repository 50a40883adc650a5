package branch

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// Directories whose mode matters to the daemon's own moves, as any user:
// a read-only directory of the base (whose copy an ordinary user's daemon
// cannot rename into the delta as it is: it gets u+w for the move only),
// and a set-group-ID one (whose group and set-group-ID bit what is made in
// it inherits, over a tombstone too). Each change shows in the branch with
// the directories' modes as they were, and the base stays as it was.
func TestDirectoryModes(t *testing.T) {
	modeOf := func(t *testing.T, v *View, rel string) uint32 {
		t.Helper()
		return entryOf(t, v, rel).Stat.Mode &^ unix.S_IFMT
	}
	for _, c := range []struct {
		name   string
		change func(t *testing.T, v *View)
		want   map[string]string
		modes  map[string]uint32
	}{
		{"read-only directory's mode", func(t *testing.T, v *View) { mustOK(t, v.Chmod("ro", 0o500)) },
			map[string]string{"ro/x": "file x"}, map[string]uint32{"ro": 0o500}},
		{"read-only directory's times", func(t *testing.T, v *View) {
			mustOK(t, v.Utimens("ro2", unix.Timespec{Sec: 1e9}, unix.Timespec{Sec: 1e9}))
			if m := entryOf(t, v, "ro2").Stat.Mtim; m.Sec != 1e9 {
				t.Errorf("ro2's mtime: %v", m)
			}
		}, map[string]string{"ro2/y": "file y"}, map[string]uint32{"ro2": 0o500}},
		{"file added to a read-only directory", func(t *testing.T, v *View) {
			mustOK(t, v.Chmod("ro", 0o755))
			write(t, v, "ro/new", "n")
			mustOK(t, v.Chmod("ro", 0o555))
		}, map[string]string{"ro/new": "file n", "ro/x": "file x"}, map[string]uint32{"ro": 0o555}},
		{"file made in a set-group-ID directory", func(t *testing.T, v *View) { write(t, v, "sg/new", "n") },
			map[string]string{"sg/new": "file n"}, map[string]uint32{"sg": 0o2755}},
		{"directory made over a tombstone in a set-group-ID directory", func(t *testing.T, v *View) {
			mustOK(t, v.Unlink("sg/x"))
			_, err := v.Mkdir("sg/x", 0o755, me)
			mustOK(t, err)
		}, map[string]string{"sg/x": "dir"}, map[string]uint32{"sg": 0o2755, "sg/x": 0o2755}},
		{"file made over a tombstone in a set-group-ID directory", func(t *testing.T, v *View) {
			mustOK(t, v.Unlink("sg/x"))
			f, _, err := v.Create("sg/x", unix.O_WRONLY|unix.O_EXCL, 0o640, me)
			mustOK(t, err)
			f.Close()
		}, map[string]string{"sg/x": "file "}, map[string]uint32{"sg/x": 0o640}},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, base := newStore(t)
			for _, d := range []struct {
				dir, file string
				mode      uint32
			}{{"ro", "x", 0o555}, {"ro2", "y", 0o500}, {"sg", "x", 0o2755}} {
				p := filepath.Join(base, d.dir)
				mustOK(t, os.Mkdir(p, 0o755))
				mustOK(t, os.WriteFile(filepath.Join(p, d.file), []byte(d.file), 0o644))
				mustOK(t, unix.Chmod(p, d.mode))
			}
			t.Cleanup(func() { chmodTree(base); chmodTree(s.Dir()) })
			v := mustCreate(t, s, "b", MainName)
			before := diskTree(t, base)
			c.change(t, v)
			for rel, want := range c.want {
				if got := shows(t, v, rel); got != want {
					t.Errorf("%s shows %q, want %q", rel, got, want)
				}
			}
			for rel, want := range c.modes {
				if got := modeOf(t, v, rel); got != want {
					t.Errorf("%s has mode %o, want %o", rel, got, want)
				}
			}
			if d := diffTrees(before, diskTree(t, base)); d != "" {
				t.Errorf("the base changed: %s", d)
			}
			// The parent shows it all after a commit, or, where an
			// ordinary user may not write the base's directory, the
			// commit is refused and nothing changes.
			want := viewTree(t, v, "", nil)
			_, err := s.Commit("b")
			if errors.Is(err, unix.EACCES) && os.Geteuid() != 0 {
				if d := diffTrees(before, diskTree(t, base)); d != "" {
					t.Errorf("a refused commit changed the base: %s", d)
				}
				return
			}
			mustOK(t, err)
			if d := diffTrees(want, viewTree(t, s.Main(), "", nil)); d != "" {
				t.Errorf("main shows other than b did: %s", d)
			}
		})
	}
}

// chmodTree gives the owner write permission on every directory below
// root, for t.TempDir's removal.
func chmodTree(root string) {
	filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.IsDir() {
			os.Chmod(p, fi.Mode().Perm()|0o700)
		}
		return nil
	})
}

// A commit into a base whose root the daemon may not write, from a store
// apart from it, cannot make its stage there: without root it fails before
// anything moves and says where; as root it happens.
func TestCommitIntoReadOnlyBaseRoot(t *testing.T) {
	s, base := newStoreApart(t)
	v := mustCreate(t, s, "b", MainName)
	write(t, v, "d/x", "changed")
	mustOK(t, os.Chmod(base, 0o555))
	t.Cleanup(func() { os.Chmod(base, 0o755) })
	before := diskTree(t, base)
	_, err := s.Commit("b")
	if os.Geteuid() == 0 {
		mustOK(t, err)
		if got := shows(t, s.Main(), "d/x"); got != "file changed" {
			t.Errorf("d/x after the commit: %s", got)
		}
		return
	}
	var pe *os.PathError
	if !errors.Is(err, unix.EACCES) || !errors.As(err, &pe) || pe.Path != base && filepath.Dir(pe.Path) != base {
		t.Fatalf("commit: %v, want EACCES naming %s or a path in it", err, base)
	}
	if d := diffTrees(before, diskTree(t, base)); d != "" {
		t.Errorf("the refused commit changed the base: %s", d)
	}
	if got := shows(t, v, "d/x"); got != "file changed" {
		t.Errorf("b after the refused commit: %s", got)
	}
}
