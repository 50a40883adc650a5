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

// The operations of a view, without FUSE: each case runs in the main view,
// in a branch of main, and in a branch of a branch that wrote a file of its
// own. Where it succeeds it must show what the case wants; where it fails it
// must fail with the case's error and change nothing the view shows. In
// every branch, whatever the outcome, the base and the parent branch stay
// as they were, on the disk: owner, mode, times, size, data, link count,
// symlink target and xattrs.

// opsViews are the views a case runs in: m the main view, b a branch of
// main, n a branch of a branch.
const opsViews = "mbn"

type opCase struct {
	name  string
	views string // of opsViews; "" for all
	// setup prepares, through the view or in the base directly.
	setup func(t *testing.T, v *View, base string)
	do    func(t *testing.T, v *View, base string) error
	err   error             // wanted, by errors.Is; nil for success
	want  map[string]string // after a success: path -> what shows says
	check func(t *testing.T, v *View, base string)
}

// shows describes what v shows at rel: "absent", "dir", "fifo", "link
// TARGET" or "file DATA".
func shows(t *testing.T, v *View, rel string) string {
	t.Helper()
	e, err := v.Lookup(rel)
	if errors.Is(err, unix.ENOENT) {
		return "absent"
	}
	if err != nil {
		t.Fatalf("lookup %s: %v", rel, err)
	}
	switch e.Stat.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		return "dir"
	case unix.S_IFIFO:
		return "fifo"
	case unix.S_IFLNK:
		target, err := v.Readlink(rel)
		if err != nil {
			t.Fatalf("readlink %s: %v", rel, err)
		}
		return "link " + target
	case unix.S_IFREG:
		return "file " + readView(t, v, rel)
	}
	return fmt.Sprintf("mode %o", e.Stat.Mode)
}

// diskTree describes every entry below root as the disk has it, in more
// detail than treeOf: what a branch's write must never change below it.
func diskTree(t *testing.T, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		desc := fmt.Sprintf("%o %d:%d n%d s%d m%d.%d", st.Mode, st.Uid, st.Gid, st.Nlink, st.Size, st.Mtim.Sec, st.Mtim.Nsec)
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFREG:
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			desc += " " + string(data)
		case unix.S_IFLNK:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			desc += " -> " + target
		}
		names, _ := listXattrs(p)
		sort.Strings(names)
		for _, n := range names {
			val, _ := getXattr(p, n)
			desc += fmt.Sprintf(" %s=%q", n, val)
		}
		out[rel] = desc
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func mustOK(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// opsViewOf makes the view a case runs in, over the base of newStore (f =
// "base", d/x = "x"), and returns a function that fails the test if the
// base or the parent branch changed on the disk since it was called.
func opsViewOf(t *testing.T, kind byte) (v *View, base string, unchanged func() func()) {
	s, base := newStore(t)
	switch kind {
	case 'm':
		return s.Main(), base, func() func() { return func() {} }
	case 'b':
		v, err := s.Create("b", MainName)
		mustOK(t, err)
		return v, base, func() func() {
			before := diskTree(t, base)
			return func() {
				if d := diffTrees(before, diskTree(t, base)); d != "" {
					t.Errorf("the base changed: %s", d)
				}
			}
		}
	}
	p, err := s.Create("p", MainName)
	mustOK(t, err)
	write(t, p, "pf", "p")
	v, err = s.Create("c", "p")
	mustOK(t, err)
	return v, base, func() func() {
		before, pBefore := diskTree(t, base), diskTree(t, s.deltaDir("p"))
		return func() {
			if d := diffTrees(before, diskTree(t, base)); d != "" {
				t.Errorf("the base changed: %s", d)
			}
			if d := diffTrees(pBefore, diskTree(t, s.deltaDir("p"))); d != "" {
				t.Errorf("the parent's delta changed: %s", d)
			}
		}
	}
}

func runOpCases(t *testing.T, cases []opCase) {
	for _, c := range cases {
		views := c.views
		if views == "" {
			views = opsViews
		}
		for _, kind := range []byte(views) {
			t.Run(c.name+"/"+string(kind), func(t *testing.T) {
				v, base, unchanged := opsViewOf(t, kind)
				if c.setup != nil {
					c.setup(t, v, base)
				}
				shown := viewTree(t, v, "", nil)
				check := unchanged()
				err := c.do(t, v, base)
				check()
				if c.err != nil {
					if !errors.Is(err, c.err) {
						t.Fatalf("got %v, want %v", err, c.err)
					}
					if d := diffTrees(shown, viewTree(t, v, "", nil)); d != "" {
						t.Errorf("a failed operation changed the view: %s", d)
					}
					return
				}
				if err != nil {
					t.Fatalf("got %v, want success", err)
				}
				for rel, want := range c.want {
					if got := shows(t, v, rel); got != want {
						t.Errorf("%s shows %q, want %q", rel, got, want)
					}
				}
				if c.check != nil {
					c.check(t, v, base)
				}
			})
		}
	}
}

// Short forms for the cases' steps.
func unlinkStep(rel string) func(t *testing.T, v *View, base string) {
	return func(t *testing.T, v *View, base string) { mustOK(t, v.Unlink(rel)) }
}

func mkdirStep(rels ...string) func(t *testing.T, v *View, base string) {
	return func(t *testing.T, v *View, base string) {
		for _, rel := range rels {
			if _, err := v.Mkdir(rel, 0o755, me); err != nil {
				t.Fatal(err)
			}
		}
	}
}

func steps(fns ...func(t *testing.T, v *View, base string)) func(t *testing.T, v *View, base string) {
	return func(t *testing.T, v *View, base string) {
		for _, fn := range fns {
			fn(t, v, base)
		}
	}
}

func writeStep(rel, data string) func(t *testing.T, v *View, base string) {
	return func(t *testing.T, v *View, base string) { write(t, v, rel, data) }
}

// baseSymlink and baseFifo put a symlink l -> f and a FIFO p in the base.
func baseSymlink(t *testing.T, v *View, base string) {
	mustOK(t, os.Symlink("f", filepath.Join(base, "l")))
}

func baseFifo(t *testing.T, v *View, base string) {
	mustOK(t, unix.Mkfifo(filepath.Join(base, "p"), 0o640))
}

func entryOf(t *testing.T, v *View, rel string) *Entry {
	t.Helper()
	e, err := v.Lookup(rel)
	if err != nil {
		t.Fatalf("lookup %s: %v", rel, err)
	}
	return e
}

// inTop fails the test unless v's own layer supplies each of rels.
func inTop(rels ...string) func(t *testing.T, v *View, base string) {
	return func(t *testing.T, v *View, base string) {
		t.Helper()
		for _, rel := range rels {
			if e := entryOf(t, v, rel); e.Lower() {
				t.Errorf("%s is still in layer %d, not copied up", rel, e.Layer)
			}
		}
	}
}

func TestOpsMakeNames(t *testing.T) {
	fifo := func(rel string) func(t *testing.T, v *View, base string) error {
		return func(t *testing.T, v *View, base string) error {
			_, err := v.Mknod(rel, unix.S_IFIFO|0o640, 0, me)
			return err
		}
	}
	symlink := func(target, rel string) func(t *testing.T, v *View, base string) error {
		return func(t *testing.T, v *View, base string) error { _, err := v.Symlink(target, rel, me); return err }
	}
	link := func(old, rel string) func(t *testing.T, v *View, base string) error {
		return func(t *testing.T, v *View, base string) error { _, err := v.Link(old, rel); return err }
	}
	mkdir := func(rel string) func(t *testing.T, v *View, base string) error {
		return func(t *testing.T, v *View, base string) error { _, err := v.Mkdir(rel, 0o750, me); return err }
	}
	create := func(rel string, flags int) func(t *testing.T, v *View, base string) error {
		return func(t *testing.T, v *View, base string) error {
			f, _, err := v.Create(rel, flags, 0o600, me)
			if err != nil {
				return err
			}
			defer f.Close()
			if flags&unix.O_ACCMODE != unix.O_RDONLY {
				_, err = f.WriteAt([]byte("B"), 0)
			}
			return err
		}
	}
	mode := func(rel string, want uint32) func(t *testing.T, v *View, base string) {
		return func(t *testing.T, v *View, base string) {
			if m := entryOf(t, v, rel).Stat.Mode; m != want {
				t.Errorf("%s has mode %o, want %o", rel, m, want)
			}
		}
	}
	runOpCases(t, []opCase{
		{name: "mknod fifo", do: fifo("q"), want: map[string]string{"q": "fifo"}, check: mode("q", unix.S_IFIFO|0o640)},
		{name: "mknod fifo in a lower directory", do: fifo("d/q"), want: map[string]string{"d/q": "fifo", "d/x": "file x"}},
		{name: "mknod fifo where a file was deleted", setup: unlinkStep("f"), do: fifo("f"), want: map[string]string{"f": "fifo"}},
		{name: "mknod over a name", do: fifo("f"), err: unix.EEXIST},
		{name: "mknod in a missing directory", do: fifo("nodir/q"), err: unix.ENOENT},
		{name: "mknod at a stage's name", do: fifo(StageName + "-x"), err: unix.EPERM},
		{name: "mknod of a deletion marker", views: "bn", err: unix.EPERM,
			do: func(t *testing.T, v *View, base string) error {
				_, err := v.Mknod("z", unix.S_IFCHR|0o600, 0, me)
				return err
			}},
		{name: "symlink", do: symlink("f", "s"), want: map[string]string{"s": "link f", "f": "file base"}},
		{name: "symlink in a lower directory", do: symlink("../f", "d/s"), want: map[string]string{"d/s": "link ../f"}},
		{name: "symlink where a file was deleted", setup: unlinkStep("d/x"), do: symlink("gone", "d/x"),
			want: map[string]string{"d/x": "link gone"}},
		{name: "symlink over a name", do: symlink("x", "d"), err: unix.EEXIST},
		{name: "symlink at the root", do: symlink("x", ""), err: unix.EEXIST},
		{name: "link of a lower file", do: link("f", "g"), want: map[string]string{"f": "file base", "g": "file base"},
			check: func(t *testing.T, v *View, base string) {
				f, g := entryOf(t, v, "f"), entryOf(t, v, "g")
				if f.Lower() || g.Lower() || f.Stat.Ino != g.Stat.Ino || f.Stat.Nlink != 2 {
					t.Errorf("f (layer %d, inode %d, %d links) and g (layer %d, inode %d) are not two names of one copy",
						f.Layer, f.Stat.Ino, f.Stat.Nlink, g.Layer, g.Stat.Ino)
				}
				write(t, v, "g", "via g")
				if got := shows(t, v, "f"); got != "file via g" {
					t.Errorf("f after a write through g: %q", got)
				}
			}},
		{name: "link where a file was deleted", setup: unlinkStep("d/x"), do: link("f", "d/x"),
			want: map[string]string{"d/x": "file base", "f": "file base"}},
		{name: "link onto a name", do: link("f", "d/x"), err: unix.EEXIST},
		{name: "link of a missing name", do: link("nothing", "g"), err: unix.ENOENT},
		{name: "link of a directory", do: link("d", "e"), err: unix.EPERM},
		{name: "mkdir", do: mkdir("e"), want: map[string]string{"e": "dir"}, check: mode("e", unix.S_IFDIR|0o750)},
		{name: "mkdir where a directory was removed", setup: steps(unlinkStep("d/x"), func(t *testing.T, v *View, base string) {
			mustOK(t, v.Rmdir("d"))
		}), do: mkdir("d"), want: map[string]string{"d": "dir", "d/x": "absent"},
			check: func(t *testing.T, v *View, base string) {
				if ents, err := v.ReadDir("d"); err != nil || len(ents) != 0 {
					t.Errorf("d made again lists %v, %v; want nothing", ents, err)
				}
			}},
		{name: "mkdir over a name", do: mkdir("f"), err: unix.EEXIST},
		{name: "mkdir below a file", do: mkdir("f/e"), err: unix.ENOTDIR},
		{name: "create", do: create("n", unix.O_WRONLY|unix.O_EXCL), want: map[string]string{"n": "file B"},
			check: mode("n", unix.S_IFREG|0o600)},
		{name: "create in a lower directory", do: create("d/n", unix.O_RDWR|unix.O_EXCL), want: map[string]string{"d/n": "file B"}},
		{name: "create in a directory of the view's own", setup: mkdirStep("e"), do: create("e/n", unix.O_WRONLY),
			want: map[string]string{"e/n": "file B"}},
		{name: "create where a file was deleted", setup: unlinkStep("f"), do: create("f", unix.O_WRONLY|unix.O_EXCL),
			want: map[string]string{"f": "file B"}, check: mode("f", unix.S_IFREG|0o600)},
		{name: "create of a lower file without O_EXCL opens it", do: create("f", unix.O_RDWR),
			want: map[string]string{"f": "file Base"}, check: mode("f", unix.S_IFREG|0o644)},
		{name: "create of a lower file with O_EXCL", do: create("f", unix.O_WRONLY|unix.O_EXCL), err: unix.EEXIST},
		{name: "create in a missing directory", do: create("nodir/n", unix.O_WRONLY), err: unix.ENOENT},
		{name: "create at a stage's name", do: create(StageName+"-x", unix.O_WRONLY), err: unix.EPERM},
	})
}

func TestOpsRemoveNames(t *testing.T) {
	unlink := func(rel string) func(t *testing.T, v *View, base string) error {
		return func(t *testing.T, v *View, base string) error { return v.Unlink(rel) }
	}
	rmdir := func(rel string) func(t *testing.T, v *View, base string) error {
		return func(t *testing.T, v *View, base string) error { return v.Rmdir(rel) }
	}
	runOpCases(t, []opCase{
		{name: "unlink of a lower file", do: unlink("d/x"), want: map[string]string{"d/x": "absent", "d": "dir"},
			check: func(t *testing.T, v *View, base string) {
				if ents, err := v.ReadDir("d"); err != nil || len(ents) != 0 {
					t.Errorf("d lists %v, %v after its one file went", ents, err)
				}
			}},
		{name: "unlink of a copied-up file", setup: writeStep("f", "changed"), do: unlink("f"), want: map[string]string{"f": "absent"}},
		{name: "unlink in a directory of the view's own", setup: steps(mkdirStep("e"), writeStep("e/n", "n")),
			do: unlink("e/n"), want: map[string]string{"e/n": "absent", "e": "dir"}},
		{name: "unlink of a lower symlink", setup: baseSymlink, do: unlink("l"), want: map[string]string{"l": "absent", "f": "file base"}},
		{name: "unlink of a directory", do: unlink("d"), err: unix.EISDIR},
		{name: "unlink of a directory of the view's own", setup: mkdirStep("e"), do: unlink("e"), err: unix.EISDIR},
		{name: "unlink of a missing name", do: unlink("nothing"), err: unix.ENOENT},
		{name: "unlink of a deleted name", setup: unlinkStep("f"), do: unlink("f"), err: unix.ENOENT},
		{name: "rmdir of an emptied lower directory", setup: unlinkStep("d/x"), do: rmdir("d"), want: map[string]string{"d": "absent"}},
		{name: "rmdir of a directory of the view's own", setup: mkdirStep("e", "e/e2"), do: rmdir("e/e2"),
			want: map[string]string{"e/e2": "absent", "e": "dir"}},
		{name: "rmdir of a directory that holds only tombstones",
			setup: steps(unlinkStep("d/x"), func(t *testing.T, v *View, base string) { mustOK(t, v.Rename("d", "e", 0)) }),
			do:    rmdir("e"), want: map[string]string{"e": "absent", "d": "absent"}},
		{name: "rmdir of the root", do: rmdir(""), err: unix.EBUSY},
		{name: "rmdir of a file", do: rmdir("f"), err: unix.ENOTDIR},
		{name: "rmdir of a non-empty directory", do: rmdir("d"), err: unix.ENOTEMPTY},
		{name: "rmdir of a missing name", do: rmdir("nothing"), err: unix.ENOENT},
	})
}

func TestOpsRenameCases(t *testing.T) {
	rename := func(old, new string, flags uint) func(t *testing.T, v *View, base string) error {
		return func(t *testing.T, v *View, base string) error { return v.Rename(old, new, flags) }
	}
	runOpCases(t, []opCase{
		{name: "unknown flag", do: rename("f", "g", unix.RENAME_WHITEOUT), err: unix.EINVAL},
		{name: "to a stage's name", do: rename("f", StageName+"-x", 0), err: unix.EPERM},
		{name: "of a missing name", do: rename("nothing", "g", 0), err: unix.ENOENT},
		{name: "below a file", do: rename("d/x", "f/x", 0), err: unix.ENOTDIR},
		{name: "onto itself", do: rename("f", "f", 0), want: map[string]string{"f": "file base"}},
		{name: "onto itself without replacing", do: rename("f", "f", unix.RENAME_NOREPLACE), err: unix.EEXIST},
		{name: "exchange with a missing name", do: rename("f", "g", unix.RENAME_EXCHANGE), err: unix.ENOENT},
		{name: "one name of a file onto another", setup: func(t *testing.T, v *View, base string) {
			_, err := v.Link("f", "g")
			mustOK(t, err)
		}, do: rename("f", "g", 0), want: map[string]string{"f": "file base", "g": "file base"}},
		{name: "directory onto an emptied lower one",
			setup: steps(unlinkStep("d/x"), mkdirStep("e"), writeStep("e/y", "y")),
			do:    rename("e", "d", 0), want: map[string]string{"d/y": "file y", "d/x": "absent", "e": "absent"}},
		{name: "exchange of two directories", setup: steps(mkdirStep("e"), writeStep("e/y", "y")),
			do:   rename("d", "e", unix.RENAME_EXCHANGE),
			want: map[string]string{"d/y": "file y", "d/x": "absent", "e/x": "file x", "e/y": "absent"}},
		{name: "lower symlink", setup: baseSymlink, do: rename("l", "d/l", 0),
			want: map[string]string{"d/l": "link f", "l": "absent"}},
		{name: "lower FIFO", setup: baseFifo, do: rename("p", "q", 0), want: map[string]string{"q": "fifo", "p": "absent"}},
		{name: "file onto a file of the view's own", setup: writeStep("n", "n"), do: rename("f", "n", 0),
			want: map[string]string{"n": "file base", "f": "absent"}},
	})
}

func TestOpsChangeAttributes(t *testing.T) {
	mtime := func(rel string, sec int64) func(t *testing.T, v *View, base string) {
		return func(t *testing.T, v *View, base string) {
			if m := entryOf(t, v, rel).Stat.Mtim; m.Sec != sec || m.Nsec != 0 {
				t.Errorf("%s has mtime %v, want %d", rel, m, sec)
			}
		}
	}
	runOpCases(t, []opCase{
		{name: "chmod", do: func(t *testing.T, v *View, base string) error { return v.Chmod("f", 0o600) },
			want: map[string]string{"f": "file base"},
			check: steps(inTop("f"), func(t *testing.T, v *View, base string) {
				if m := entryOf(t, v, "f").Stat.Mode; m != unix.S_IFREG|0o600 {
					t.Errorf("mode %o", m)
				}
			})},
		{name: "chmod of a lower directory", do: func(t *testing.T, v *View, base string) error { return v.Chmod("d", 0o700) },
			want: map[string]string{"d/x": "file x"},
			check: func(t *testing.T, v *View, base string) {
				if m := entryOf(t, v, "d").Stat.Mode; m != unix.S_IFDIR|0o700 {
					t.Errorf("mode %o", m)
				}
			}},
		{name: "chmod of a symlink", setup: baseSymlink, err: unix.EOPNOTSUPP,
			do: func(t *testing.T, v *View, base string) error { return v.Chmod("l", 0o600) }},
		{name: "chown to the owner it has", do: func(t *testing.T, v *View, base string) error {
			return v.Chown("f", int(me.Uid), int(me.Gid))
		}, want: map[string]string{"f": "file base"}, check: inTop("f")},
		{name: "chown that changes nothing copies a symlink up", setup: baseSymlink,
			do:   func(t *testing.T, v *View, base string) error { return v.Chown("l", -1, -1) },
			want: map[string]string{"l": "link f"}, check: inTop("l")},
		{name: "chown that changes nothing copies a FIFO up", setup: baseFifo,
			do:   func(t *testing.T, v *View, base string) error { return v.Chown("p", -1, -1) },
			want: map[string]string{"p": "fifo"},
			check: steps(inTop("p"), func(t *testing.T, v *View, base string) {
				if m := entryOf(t, v, "p").Stat.Mode; m != unix.S_IFIFO|0o640 {
					t.Errorf("the copied FIFO has mode %o", m)
				}
			})},
		{name: "chown of a missing name", do: func(t *testing.T, v *View, base string) error { return v.Chown("nothing", -1, -1) },
			err: unix.ENOENT},
		{name: "truncate", do: func(t *testing.T, v *View, base string) error { return v.Truncate("f", 2) },
			want: map[string]string{"f": "file ba"}, check: inTop("f")},
		{name: "truncate to nothing", do: func(t *testing.T, v *View, base string) error { return v.Truncate("d/x", 0) },
			want: map[string]string{"d/x": "file "}, check: inTop("d/x")},
		{name: "truncate longer", do: func(t *testing.T, v *View, base string) error { return v.Truncate("f", 6) },
			want: map[string]string{"f": "file base\x00\x00"}},
		{name: "truncate of a file of the view's own", setup: mkdirStep("e"),
			do: func(t *testing.T, v *View, base string) error {
				write(t, v, "e/n", "nnn")
				return v.Truncate("e/n", 1)
			}, want: map[string]string{"e/n": "file n"}},
		{name: "truncate of a directory", do: func(t *testing.T, v *View, base string) error { return v.Truncate("d", 0) },
			err: unix.EISDIR},
		{name: "truncate of a missing name", do: func(t *testing.T, v *View, base string) error { return v.Truncate("nothing", 0) },
			err: unix.ENOENT},
		{name: "utimens", do: func(t *testing.T, v *View, base string) error {
			return v.Utimens("f", unix.Timespec{Sec: 1e9}, unix.Timespec{Sec: 2e9})
		}, check: steps(inTop("f"), mtime("f", 2e9), func(t *testing.T, v *View, base string) {
			if a := entryOf(t, v, "f").Stat.Atim; a.Sec != 1e9 {
				t.Errorf("atime %v", a)
			}
		})},
		{name: "utimens of the modification time alone", do: func(t *testing.T, v *View, base string) error {
			return v.Utimens("d/x", unix.Timespec{Nsec: unix.UTIME_OMIT}, unix.Timespec{Sec: 3e9})
		}, check: mtime("d/x", 3e9)},
		{name: "utimens of a symlink", setup: baseSymlink, do: func(t *testing.T, v *View, base string) error {
			return v.Utimens("l", unix.Timespec{Sec: 1e9}, unix.Timespec{Sec: 1e9})
		}, want: map[string]string{"l": "link f"}, check: mtime("l", 1e9)},
		{name: "utimens of a missing name", do: func(t *testing.T, v *View, base string) error {
			return v.Utimens("nothing", unix.Timespec{}, unix.Timespec{})
		}, err: unix.ENOENT},
	})
}

func TestOpsReadAndXattrs(t *testing.T) {
	readlink := func(rel, want string) func(t *testing.T, v *View, base string) error {
		return func(t *testing.T, v *View, base string) error {
			got, err := v.Readlink(rel)
			if err == nil && got != want {
				t.Errorf("readlink %s = %q, want %q", rel, got, want)
			}
			return err
		}
	}
	getx := func(rel, name, want string) func(t *testing.T, v *View, base string) {
		return func(t *testing.T, v *View, base string) {
			t.Helper()
			buf := make([]byte, 64)
			n, err := v.GetXattr(rel, name, buf)
			if want == "" {
				if !errors.Is(err, unix.ENODATA) {
					t.Errorf("getxattr %s %s: %q, %v; want ENODATA", rel, name, buf[:max(n, 0)], err)
				}
				return
			}
			if err != nil || string(buf[:n]) != want {
				t.Errorf("getxattr %s %s = %q, %v; want %q", rel, name, buf[:max(n, 0)], err, want)
			}
			if size, err := v.GetXattr(rel, name, nil); err != nil || size != len(want) {
				t.Errorf("getxattr %s %s's size = %d, %v; want %d", rel, name, size, err, len(want))
			}
		}
	}
	listx := func(rel string, want ...string) func(t *testing.T, v *View, base string) {
		return func(t *testing.T, v *View, base string) {
			t.Helper()
			names, err := v.ListXattr(rel)
			sort.Strings(names)
			if err != nil || !slices.Equal(names, want) {
				t.Errorf("listxattr %s = %q, %v; want %q", rel, names, err, want)
			}
		}
	}
	baseXattr := func(t *testing.T, v *View, base string) {
		mustOK(t, unix.Setxattr(filepath.Join(base, "f"), "user.a", []byte("1"), 0))
	}
	runOpCases(t, []opCase{
		{name: "readlink of a lower symlink", setup: baseSymlink, do: readlink("l", "f")},
		{name: "readlink of the longest target", setup: func(t *testing.T, v *View, base string) {
			mustOK(t, os.Symlink(strings.Repeat("t/", 2047)+"t", filepath.Join(base, "long")))
		}, do: readlink("long", strings.Repeat("t/", 2047)+"t")},
		{name: "readlink of a symlink of the view's own", setup: func(t *testing.T, v *View, base string) {
			_, err := v.Symlink("d/x", "s", me)
			mustOK(t, err)
		}, do: readlink("s", "d/x")},
		{name: "readlink of a file", do: readlink("f", ""), err: unix.EINVAL},
		{name: "readlink of a missing name", do: readlink("nothing", ""), err: unix.ENOENT},
		{name: "setxattr", do: func(t *testing.T, v *View, base string) error {
			return v.SetXattr("f", "user.b", []byte("2"), 0)
		}, want: map[string]string{"f": "file base"}, check: steps(inTop("f"), getx("f", "user.b", "2"), listx("f", "user.b"))},
		{name: "setxattr on a directory", do: func(t *testing.T, v *View, base string) error {
			return v.SetXattr("d", "user.b", []byte("2"), 0)
		}, check: steps(getx("d", "user.b", "2"), listx("d", "user.b"), listx("d/x"))},
		{name: "setxattr that may not replace", setup: baseXattr, err: unix.EEXIST, do: func(t *testing.T, v *View, base string) error {
			return v.SetXattr("f", "user.a", []byte("2"), unix.XATTR_CREATE)
		}},
		{name: "setxattr of an internal name", err: unix.EPERM, do: func(t *testing.T, v *View, base string) error {
			return v.SetXattr("f", opaqueXattr, []byte("y"), 0)
		}},
		{name: "getxattr of an internal name", setup: func(t *testing.T, v *View, base string) {
			mustOK(t, unix.Setxattr(filepath.Join(base, "d"), "user.branchfs.x", []byte("1"), 0))
		}, do: func(t *testing.T, v *View, base string) error { return nil },
			check: steps(getx("d", "user.branchfs.x", ""), listx("d"))},
		{name: "removexattr of a lower file's", setup: baseXattr, do: func(t *testing.T, v *View, base string) error {
			return v.RemoveXattr("f", "user.a")
		}, want: map[string]string{"f": "file base"}, check: steps(getx("f", "user.a", ""), listx("f"))},
		{name: "removexattr of a missing one", err: unix.ENODATA, do: func(t *testing.T, v *View, base string) error {
			return v.RemoveXattr("f", "user.none")
		}},
		{name: "removexattr of an internal name", err: unix.EPERM, do: func(t *testing.T, v *View, base string) error {
			return v.RemoveXattr("d", opaqueXattr)
		}},
		{name: "removexattr of a missing name", err: unix.ENOENT, do: func(t *testing.T, v *View, base string) error {
			return v.RemoveXattr("nothing", "user.a")
		}},
		{name: "xattrs of the root", do: func(t *testing.T, v *View, base string) error {
			return v.SetXattr("", "user.r", []byte("r"), 0)
		}, check: steps(getx("", "user.r", "r"), listx("", "user.r"))},
		{name: "lookup of a dot name", err: unix.EINVAL, do: func(t *testing.T, v *View, base string) error {
			_, err := v.Lookup("d/.")
			return err
		}},
		{name: "xattrs of a dot-dot name", err: unix.EINVAL, do: func(t *testing.T, v *View, base string) error {
			_, err := v.GetXattr("d/..", "user.a", nil)
			return err
		}},
		{name: "lookup of a name longer than any filesystem takes", err: unix.ENAMETOOLONG,
			do: func(t *testing.T, v *View, base string) error {
				_, err := v.Lookup("d/" + strings.Repeat("n", 5000))
				return err
			}},
		{name: "statfs", do: func(t *testing.T, v *View, base string) error {
			st, err := v.Statfs()
			var want unix.Statfs_t
			mustOK(t, unix.Statfs(base, &want))
			if err == nil && (st.Type != want.Type || st.Bsize != want.Bsize || st.Blocks != want.Blocks || st.Fsid != want.Fsid) {
				t.Errorf("statfs = %+v, want the base's %+v", st, want)
			}
			return err
		}},
	})
}

func TestOpsOpen(t *testing.T) {
	open := func(rel string, flags int, data string) func(t *testing.T, v *View, base string) error {
		return func(t *testing.T, v *View, base string) error {
			f, e, err := v.Open(rel, flags)
			if err != nil {
				return err
			}
			defer f.Close()
			if f.InTop() != !e.Lower() {
				t.Errorf("InTop %v for an entry of layer %d", f.InTop(), e.Layer)
			}
			if data != "" {
				_, err = f.WriteAt([]byte(data), 0)
			}
			return err
		}
	}
	runOpCases(t, []opCase{
		{name: "for writing copies up with the data", do: open("f", unix.O_WRONLY, "B"),
			want: map[string]string{"f": "file Base"}, check: inTop("f")},
		{name: "with O_TRUNC copies up without it", do: open("d/x", unix.O_WRONLY|unix.O_TRUNC, "y"),
			want: map[string]string{"d/x": "file y"}, check: inTop("d/x")},
		{name: "for reading leaves the file below", do: open("f", unix.O_RDONLY, ""),
			check: func(t *testing.T, v *View, base string) {
				if e := entryOf(t, v, "f"); !v.IsMain() && !e.Lower() {
					t.Errorf("f was copied up by a read")
				}
			}},
		{name: "of a directory", do: open("d", unix.O_RDONLY|unix.O_DIRECTORY, "")},
		{name: "of a FIFO for reading, without waiting", setup: baseFifo, do: open("p", unix.O_RDONLY|unix.O_NONBLOCK, "")},
		{name: "of a missing name", do: open("nothing", unix.O_RDONLY, ""), err: unix.ENOENT},
		{name: "of a deleted name", setup: unlinkStep("f"), do: open("f", unix.O_RDWR, ""), err: unix.ENOENT},
		{name: "of a directory for writing", do: open("d", unix.O_RDWR, ""), err: unix.EISDIR},
		{name: "below a file", do: open("f/x", unix.O_RDONLY, ""), err: unix.ENOTDIR},
	})
}

// A view keeps the last few of its own directories open (layer.dirFd):
// working in more of them than it keeps, one after another and again,
// every name lands in its own directory.
func TestOwnDirectoriesInTurn(t *testing.T) {
	s, _ := newStore(t)
	v := mustCreate(t, s, "b", MainName)
	n := len(v.layers[0].dirs.ents) + 3
	for i := range n {
		if _, err := v.Mkdir(fmt.Sprint("e", i), 0o755, me); err != nil {
			t.Fatal(err)
		}
	}
	for round := range 2 {
		for i := range n {
			write(t, v, fmt.Sprintf("e%d/f%d", i, round), fmt.Sprint(i, round))
		}
	}
	for i := range n {
		for round := range 2 {
			rel := fmt.Sprintf("e%d/f%d", i, round)
			if got, want := shows(t, v, rel), fmt.Sprint("file ", i, round); got != want {
				t.Errorf("%s shows %q, want %q", rel, got, want)
			}
		}
		if ents, err := v.ReadDir(fmt.Sprint("e", i)); err != nil || len(ents) != 2 {
			t.Errorf("e%d lists %v, %v", i, ents, err)
		}
		mustOK(t, v.Unlink(fmt.Sprintf("e%d/f0", i)))
	}
	for i := range n {
		if got := shows(t, v, fmt.Sprintf("e%d/f0", i)); got != "absent" {
			t.Errorf("e%d/f0 after its unlink: %s", i, got)
		}
	}
}
