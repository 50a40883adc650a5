package branch

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"golang.org/x/sys/unix"
)

// What Hold gives and what Release ends, without mounting overlayfs (as
// any user): the layers by path with their identity, a fresh empty work
// directory with the branch's data, a view that refuses writes meanwhile,
// and after Release a view that shows what was written into its delta
// behind it.
func TestHoldAndRelease(t *testing.T) {
	s, base := newStore(t)
	p := mustCreate(t, s, "p", MainName)
	write(t, p, "pf", "p")
	mustCreate(t, s, "empty", "p") // an ancestor nothing was written to
	v := mustCreate(t, s, "b", "empty")
	if got := shows(t, v, "d/x"); got != "file x" { // d's layering is cached now
		t.Fatalf("d/x: %s", got)
	}
	ls, err := s.Hold("b")
	mustOK(t, err)
	for _, d := range append([]Dir{ls.Upper, ls.Work}, ls.Lower...) {
		var st unix.Stat_t
		if err := unix.Stat(d.Path, &st); err != nil || st.Dev != d.Dev || st.Ino != d.Ino || st.Mode&unix.S_IFMT != unix.S_IFDIR {
			t.Errorf("%s: %v, device %d inode %d mode %o; Hold says %d, %d", d.Path, err, st.Dev, st.Ino, st.Mode, d.Dev, d.Ino)
		}
	}
	var lower []string
	for _, d := range ls.Lower {
		lower = append(lower, d.Path)
	}
	if ls.Upper.Path != s.deltaDir("b") || !slices.Equal(lower, []string{s.deltaDir("p"), base}) {
		t.Errorf("layers: upper %s over %q", ls.Upper.Path, lower)
	}
	if filepath.Dir(ls.Work.Path) != s.workRoot("b") {
		t.Errorf("work directory %s is not in %s", ls.Work.Path, s.workRoot("b"))
	}
	if ents, err := os.ReadDir(ls.Work.Path); err != nil || len(ents) != 0 {
		t.Errorf("work directory: %v, %v; want it empty", ents, err)
	}
	if l := s.List(false); !slices.ContainsFunc(l, func(in Info) bool { return in.Name == "b" && in.Held }) {
		t.Errorf("List does not show b held: %+v", l)
	}
	if err := v.CheckWritable(); !errors.Is(err, ErrHeld) {
		t.Errorf("CheckWritable of the held view: %v", err)
	}
	// What the run writes, behind the view.
	mustOK(t, os.Mkdir(filepath.Join(ls.Upper.Path, "d"), 0o755))
	mustOK(t, os.WriteFile(filepath.Join(ls.Upper.Path, "d", "run"), []byte("run"), 0o644))

	mustOK(t, s.Release("b", "/nonexistent/not-the-hold"))
	if err := v.CheckWritable(); !errors.Is(err, ErrHeld) {
		t.Errorf("a release with another work directory ended the hold: %v", err)
	}
	mustOK(t, s.Release("b", ls.Work.Path))
	if err := v.CheckWritable(); err != nil {
		t.Errorf("the released view: %v", err)
	}
	if _, err := os.Lstat(ls.Work.Path); !os.IsNotExist(err) {
		t.Errorf("work directory after the release: %v", err)
	}
	for rel, want := range map[string]string{"d/run": "file run", "d/x": "file x", "pf": "file p"} {
		if got := shows(t, v, rel); got != want {
			t.Errorf("%s shows %q after the release, want %q", rel, got, want)
		}
	}
	write(t, v, "after", "a")
}

// A work directory that a killed daemon's run left, with overlayfs's
// mode-0 directory in it, goes at the next hold; and a branch that ended
// during its hold still has its work directory removed at release.
func TestHoldLeftovers(t *testing.T) {
	s, _ := newStore(t)
	mustCreate(t, s, "b", MainName)
	ls, err := s.Hold("b")
	mustOK(t, err)
	inner := filepath.Join(ls.Work.Path, "work")
	mustOK(t, os.Mkdir(inner, 0o700))
	mustOK(t, os.WriteFile(filepath.Join(inner, "f"), nil, 0o600))
	mustOK(t, os.Chmod(inner, 0))
	t.Cleanup(func() { os.Chmod(inner, 0o700) })

	s = reopen(t, s) // the daemon was killed: nothing holds b now
	ls2, err := s.Hold("b")
	mustOK(t, err)
	if _, err := os.Lstat(ls.Work.Path); !os.IsNotExist(err) {
		t.Errorf("the old work directory: %v", err)
	}
	if ls2.Work.Path == ls.Work.Path {
		t.Error("the new hold reuses the old work directory")
	}
	if _, err := s.Abort("b", false); err != nil {
		t.Fatal(err)
	}
	mustOK(t, s.Release("b", ls2.Work.Path))
	if _, err := os.Lstat(ls2.Work.Path); !os.IsNotExist(err) {
		t.Errorf("work directory after the release of an aborted branch: %v", err)
	}
}
