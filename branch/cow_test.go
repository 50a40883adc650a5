package branch

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestCopyUp copies entries of the base of newStore (f = "base", d/x) up
// into a branch, as fs does before the kernel opens a file again.
func TestCopyUp(t *testing.T) {
	for _, c := range []struct {
		rel      string
		withData bool
		frozen   bool
		err      error
		top      string // what the top layer holds at rel afterwards; "/" a directory
	}{
		{rel: "f", withData: true, top: "base"},
		{rel: "f", withData: false, top: ""},
		{rel: "d", withData: true, top: "/"},
		{rel: "d/x", withData: true, top: "x"},
		{rel: "nothing", withData: true, err: unix.ENOENT},
		{rel: "f", withData: true, frozen: true, err: ErrFrozen},
	} {
		t.Run(c.rel, func(t *testing.T) {
			s, base := newStore(t)
			v, err := s.Create("b", MainName)
			if err != nil {
				t.Fatal(err)
			}
			if c.frozen {
				if _, err := s.Create("child", "b"); err != nil {
					t.Fatal(err)
				}
			}
			before := treeOf(t, base)
			e, err := v.CopyUp(c.rel, c.withData)
			if c.err != nil {
				if !errors.Is(err, c.err) {
					t.Fatalf("CopyUp: %v, want %v", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if e.Lower() {
				t.Errorf("entry of layer %d after the copy-up", e.Layer)
			}
			p := filepath.Join(s.deltaDir("b"), c.rel)
			if c.top == "/" {
				if fi, err := os.Stat(p); err != nil || !fi.IsDir() {
					t.Errorf("top %s: %v", c.rel, err)
				}
				if _, err := os.Lstat(filepath.Join(p, "x")); !os.IsNotExist(err) {
					t.Errorf("a directory's copy-up copied its entries: %v", err)
				}
			} else if data, err := os.ReadFile(p); err != nil || string(data) != c.top {
				t.Errorf("top %s = %q, %v; want %q", c.rel, data, err, c.top)
			}
			if again, err := v.CopyUp(c.rel, true); err != nil || again.Lower() {
				t.Errorf("second copy-up: %v", err)
			}
			if d := diffTrees(before, treeOf(t, base)); d != "" {
				t.Errorf("the base changed: %s", d)
			}
		})
	}
}
