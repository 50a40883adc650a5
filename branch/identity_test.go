package branch

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

type identity struct{ ino, gen uint64 }

func identityOf(t *testing.T, v *View, rel string) identity {
	t.Helper()
	ino, gen := v.Identity(entryOf(t, v, rel))
	return identity{ino, gen}
}

// Identity tells the kernel which entries are one inode: the same file
// through two views is two, a file and its copy-up are two, the root stays
// itself when the branch's first write makes its delta, and the names of a
// file with several links are one file in the main view but files of their
// own in a branch (one link each, the inode number readdir shows, their
// own generation).
func TestIdentity(t *testing.T) {
	s, base := newStore(t)
	mustOK(t, os.Link(filepath.Join(base, "f"), filepath.Join(base, "f2")))
	b := mustCreate(t, s, "b", MainName)
	main := s.Main()

	root := identityOf(t, b, "")
	if mroot := identityOf(t, main, ""); mroot == root || mroot.ino != root.ino {
		t.Errorf("roots of main and b: %v and %v; want one inode number, two generations", mroot, root)
	}
	lower := identityOf(t, b, "d/x")
	if m := identityOf(t, main, "d/x"); m == lower || m.ino != lower.ino {
		t.Errorf("d/x in main and b: %v and %v; want one inode number, two generations", m, lower)
	}
	write(t, b, "d/x", "changed")
	if up := identityOf(t, b, "d/x"); up == lower {
		t.Errorf("d/x keeps its identity %v when copied up", up)
	}
	if after := identityOf(t, b, ""); after != root {
		t.Errorf("b's root was %v, is %v after its first write", root, after)
	}

	mf, mf2 := identityOf(t, main, "f"), identityOf(t, main, "f2")
	if mf != mf2 {
		t.Errorf("two names of one file in main: %v and %v", mf, mf2)
	}
	f, f2 := entryOf(t, b, "f"), entryOf(t, b, "f2")
	bf, bf2 := identityOf(t, b, "f"), identityOf(t, b, "f2")
	if f.Stat.Nlink != 1 || f2.Stat.Nlink != 1 || bf == bf2 || bf.ino != bf2.ino || bf.gen>>63 != 1 || bf2.gen>>63 != 1 {
		t.Errorf("two names of a lower file in b: %d and %d links, identities %v and %v; want one link each, "+
			"one inode number, two generations with the top bit", f.Stat.Nlink, f2.Stat.Nlink, bf, bf2)
	}
	if again := identityOf(t, b, "f"); again != bf {
		t.Errorf("f's identity changed between lookups: %v, %v", bf, again)
	}

	// A listing's entries are what their lookups are.
	for _, v := range []*View{main, b} {
		ents, err := v.ReadDirPlus("", func(name string) bool { return name == "d" })
		mustOK(t, err)
		seen := 0
		for i := range ents {
			d := &ents[i]
			if d.Name == "d" {
				if d.Stat != nil {
					t.Errorf("%s: the skipped d has attributes", v.Name())
				}
				continue
			}
			if d.Stat == nil {
				t.Errorf("%s: %s listed without attributes", v.Name(), d.Name)
				continue
			}
			e := d.Entry()
			ino, gen := v.Identity(e)
			if want := identityOf(t, v, d.Name); (identity{ino, gen}) != want || d.Ino != ino {
				t.Errorf("%s: %s listed as %v (d_ino %d), looked up as %v", v.Name(), d.Name, identity{ino, gen}, d.Ino, want)
			}
			if want := entryOf(t, v, d.Name); e.Stat.Nlink != want.Stat.Nlink || e.Stat.Size != want.Stat.Size {
				t.Errorf("%s: %s listed with %d links, %d bytes; looked up with %d, %d", v.Name(), d.Name,
					e.Stat.Nlink, e.Stat.Size, want.Stat.Nlink, want.Stat.Size)
			}
			seen++
		}
		if seen != 2 {
			t.Errorf("%s: listed %d files of f and f2", v.Name(), seen)
		}
	}
	if _, err := b.ReadDirPlus("f", nil); err != unix.ENOTDIR {
		t.Errorf("ReadDirPlus of a file: %v", err)
	}
}
