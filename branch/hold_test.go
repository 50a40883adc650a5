package branch

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// A held branch is written by the kernel's overlayfs over the layers Hold
// gives: overlayfs reads the ancestors' markers, the view reads what
// overlayfs wrote once the hold is released, and the commits carry it into
// the base as the same change made through the view would.
func TestHoldOverlay(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting overlayfs outside a user namespace needs root")
	}
	s, base := newStore(t)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(base, "e"), 0o755))
	must(os.WriteFile(filepath.Join(base, "e", "y"), []byte("y"), 0o644))
	must(os.WriteFile(filepath.Join(base, "g"), []byte("g"), 0o644))
	p, _ := s.Create("p", MainName)
	write(t, p, "pfile", "p")
	must(p.Unlink("g"))
	c, _ := s.Create("c", "p")

	ls, err := s.Hold("c")
	must(err)
	want := []string{s.deltaDir("p"), base}
	var lower []string
	for _, d := range ls.Lower {
		lower = append(lower, d.Path)
	}
	if ls.Upper.Path != s.deltaDir("c") || !slices.Equal(lower, want) || ls.Work.Path == "" {
		t.Fatalf("layers %+v, want upper %s over %v", ls, s.deltaDir("c"), want)
	}
	if _, err := c.Mkdir("z", 0o755, me); !errors.Is(err, ErrHeld) {
		t.Errorf("mkdir in the held view: %v, want ErrHeld", err)
	}
	if _, err := s.Commit("c"); !errors.Is(err, ErrBusy) {
		t.Errorf("commit of the held branch: %v, want ErrBusy", err)
	}
	if _, err := s.Create("cc", "c"); !errors.Is(err, ErrBusy) {
		t.Errorf("child of the held branch: %v, want ErrBusy", err)
	}
	if _, err := s.Hold("c"); !errors.Is(err, ErrBusy) {
		t.Errorf("second hold: %v, want ErrBusy", err)
	}

	mnt := t.TempDir()
	opts := "lowerdir=" + strings.Join(lower, ":") + ",upperdir=" + ls.Upper.Path + ",workdir=" + ls.Work.Path + ",userxattr"
	must(unix.Mount("overlay", mnt, "overlay", 0, opts))
	mounted := true
	defer func() {
		if mounted {
			unix.Unmount(mnt, unix.MNT_DETACH)
		}
	}()
	in := func(rel string) string { return filepath.Join(mnt, rel) }
	if _, err := os.Lstat(in("g")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("overlayfs shows g, which p deleted: %v", err)
	}
	if data, err := os.ReadFile(in("pfile")); err != nil || string(data) != "p" {
		t.Errorf("overlayfs reads p's pfile: %q, %v", data, err)
	}
	must(os.Remove(in("f")))
	must(os.WriteFile(in("d/x"), []byte("x2"), 0o644))
	must(os.RemoveAll(in("e")))
	must(os.Mkdir(in("e"), 0o750))
	must(os.WriteFile(in("e/new"), []byte("n"), 0o644))
	must(os.WriteFile(in("new"), []byte("new"), 0o644))
	must(os.Rename(in("pfile"), in("d/moved")))
	must(unix.Setxattr(in("d/moved"), "user.mine", []byte("m"), 0))
	must(unix.Unmount(mnt, 0))
	mounted = false
	must(s.Release("c", ls.Work.Path))
	if _, err := os.Lstat(ls.Work.Path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the work directory outlived the release: %v", err)
	}

	for rel, want := range map[string]string{"d/x": "x2", "e/new": "n", "new": "new", "d/moved": "p"} {
		if got := readView(t, c, rel); got != want {
			t.Errorf("view c reads %s = %q, want %q", rel, got, want)
		}
	}
	for _, rel := range []string{"f", "g", "e/y", "pfile"} {
		if _, err := c.Lookup(rel); !errors.Is(err, unix.ENOENT) {
			t.Errorf("view c shows %s: %v", rel, err)
		}
	}
	if names, err := c.ListXattr("d/moved"); err != nil || !slices.Equal(names, []string{"user.mine"}) {
		t.Errorf("view c lists the xattrs of d/moved as %v, %v", names, err)
	}
	d, err := s.Diff("c")
	must(err)
	if !slices.Contains(d.Deleted, "f") || !slices.Contains(d.Deleted, "pfile") || !slices.Contains(d.Modified, "e/") ||
		!slices.Contains(d.Modified, "d/x") || !slices.Contains(d.Added, "new") {
		t.Errorf("diff %+v", d)
	}
	if _, err := c.Mkdir("z", 0o755, me); err != nil {
		t.Errorf("mkdir after the release: %v", err)
	}
	if _, err := s.Commit("c"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Commit("p"); err != nil {
		t.Fatal(err)
	}
	var got []string
	filepath.Walk(base, func(path string, fi os.FileInfo, err error) error {
		rel, _ := filepath.Rel(base, path)
		got = append(got, rel)
		names, _ := listXattrs(path)
		for _, n := range names {
			if IsInternalXattr(n) {
				t.Errorf("base %s carries %s", rel, n)
			}
		}
		return nil
	})
	if s := strings.Join(got, " "); s != ". d d/moved d/x e e/new new z" {
		t.Errorf("base holds %s", s)
	}
	if fi, err := os.Stat(filepath.Join(base, "e")); err != nil || fi.Mode().Perm() != 0o750 {
		t.Errorf("base e: %v, %v", fi, err)
	}
}
