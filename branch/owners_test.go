package branch

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// Who a new entry belongs to: the Owner the caller names, which a daemon
// without root can only be itself, except for the group that a
// set-group-ID directory imposes. Where the owner cannot be given, the
// operation fails with EPERM and leaves no entry behind, in the top
// layer's own directories (made by the view), in directories that merge
// a lower one, over a tombstone, and in the main view. As root every owner
// is given.
func TestOwners(t *testing.T) {
	root := os.Geteuid() == 0
	otherGid := me.Gid + 1
	kinds := []struct {
		name string
		make func(v *View, rel string, o Owner) error
	}{
		{"file", func(v *View, rel string, o Owner) error {
			f, _, err := v.Create(rel, unix.O_WRONLY|unix.O_EXCL, 0o640, o)
			if err == nil {
				f.Close()
			}
			return err
		}},
		{"directory", func(v *View, rel string, o Owner) error { _, err := v.Mkdir(rel, 0o750, o); return err }},
		{"fifo", func(v *View, rel string, o Owner) error { _, err := v.Mknod(rel, unix.S_IFIFO|0o640, 0, o); return err }},
		{"symlink", func(v *View, rel string, o Owner) error { _, err := v.Symlink("target", rel, o); return err }},
	}
	for _, where := range []struct {
		name  string
		view  string // "b" or main
		rel   string
		setup func(t *testing.T, v *View)
		setID bool // rel's directory is set-group-ID: the group is its
	}{
		{name: "own directory", view: "b", rel: "own/n", setup: mkdirOwn},
		{name: "lower directory", view: "b", rel: "d/n"},
		{name: "over a tombstone", view: "b", rel: "d/x", setup: func(t *testing.T, v *View) { mustOK(t, v.Unlink("d/x")) }},
		{name: "main", view: MainName, rel: "d/n"},
		{name: "set-group-ID directory", view: "b", rel: "sg/n", setID: true},
		{name: "set-group-ID directory of main", view: MainName, rel: "sg/n", setID: true},
	} {
		for _, o := range []struct {
			name  string
			owner Owner
		}{{"another group", Owner{me.Uid, otherGid}}, {"another user", Owner{me.Uid + 1, me.Gid}}} {
			for _, k := range kinds {
				t.Run(where.name+"/"+o.name+"/"+k.name, func(t *testing.T) {
					s, base := newStore(t)
					mustOK(t, os.Mkdir(filepath.Join(base, "sg"), 0o755))
					mustOK(t, unix.Chmod(filepath.Join(base, "sg"), 0o2755))
					v := s.Main()
					if where.view != MainName {
						v = mustCreate(t, s, where.view, MainName)
					}
					if where.setup != nil {
						where.setup(t, v)
					}
					shown := viewTree(t, v, "", nil)
					err := k.make(v, where.rel, o.owner)
					wantUid, wantGid := o.owner.Uid, o.owner.Gid
					if where.setID {
						wantGid = me.Gid // sg's group, the creator's
					}
					if !root && (wantUid != me.Uid || wantGid != me.Gid) {
						if !errors.Is(err, unix.EPERM) {
							t.Fatalf("got %v, want EPERM", err)
						}
						if d := diffTrees(shown, viewTree(t, v, "", nil)); d != "" {
							t.Errorf("a refused create changed the view: %s", d)
						}
						return
					}
					mustOK(t, err)
					e := entryOf(t, v, where.rel)
					if e.Stat.Uid != wantUid || e.Stat.Gid != wantGid {
						t.Errorf("owner %d:%d, want %d:%d", e.Stat.Uid, e.Stat.Gid, wantUid, wantGid)
					}
				})
			}
		}
	}
}

func mkdirOwn(t *testing.T, v *View) {
	if _, err := v.Mkdir("own", 0o755, me); err != nil {
		t.Fatal(err)
	}
}
