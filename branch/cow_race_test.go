package branch

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// A copy-up that finds the name taken in the top layer when it puts its
// copy in place lost to a concurrent copy-up of the same entry: it keeps
// the winner's copy, succeeds, and leaves nothing of its own.
func TestCopyUpLosesRace(t *testing.T) {
	for _, c := range []struct {
		name   string
		rel    string
		winner func(p string) error // makes the winner's copy at p
		want   string               // what the view shows at rel after
	}{
		{"file", "f", func(p string) error { return os.WriteFile(p, []byte("winner"), 0o644) }, "file winner"},
		{"symlink", "l", func(p string) error { return os.Symlink("winner", p) }, "link winner"},
		{"directory", "d", func(p string) error { return os.Mkdir(p, 0o755) }, "dir"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, base := newStore(t)
			mustOK(t, os.Symlink("f", filepath.Join(base, "l")))
			v := mustCreate(t, s, "b", MainName)
			write(t, v, "own", "o") // the delta's root exists
			fired := false
			setFailHook(t, func(step string) error {
				if step == "copyup-staged" && !fired {
					fired = true
					return c.winner(filepath.Join(s.deltaDir("b"), c.rel))
				}
				return nil
			})
			e, err := v.CopyUp(c.rel, true)
			if !fired {
				t.Fatal("the copy-up passed no copyup-staged")
			}
			if err != nil || e.Lower() {
				t.Fatalf("copy-up: %v (entry %+v)", err, e)
			}
			failHook = nil
			if got := shows(t, v, c.rel); got != c.want {
				t.Errorf("%s shows %q, want the winner's %q", c.rel, got, c.want)
			}
			if ents, err := os.ReadDir(filepath.Join(s.Dir(), "tmp")); err != nil || len(ents) != 0 {
				t.Errorf("STORE/tmp holds %v, %v", ents, err)
			}
			var st unix.Stat_t
			mustOK(t, unix.Lstat(filepath.Join(base, "f"), &st))
			if st.Nlink != 1 {
				t.Errorf("the base's f has %d links", st.Nlink)
			}
		})
	}
}
