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

// A copy keeps its source's xattrs and mode together, whatever the mode
// and whoever copies: a copy-up of a read-only file by an ordinary user
// (who may set xattrs only on a file it may write), and a commit from a
// store apart from the base of a file with capabilities (which chown
// clears) as root.
func TestCopyKeepsXattrsAndMode(t *testing.T) {
	// VFS_CAP_REVISION_2, effective, CAP_NET_RAW permitted.
	caps := []byte{0, 0, 0, 2, 0, 0x20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
	root := os.Geteuid() == 0
	for _, c := range []struct {
		name  string
		apart bool
	}{{"copy-up", false}, {"commit apart", true}} {
		t.Run(c.name, func(t *testing.T) {
			var s *Store
			var base string
			if c.apart {
				s, base = newStoreApart(t)
			} else {
				s, base = newStore(t)
			}
			p := filepath.Join(base, "ro")
			mustOK(t, os.WriteFile(p, []byte("ro"), 0o644))
			if err := unix.Setxattr(p, "user.k", []byte("v"), 0); errors.Is(err, unix.EOPNOTSUPP) {
				t.Skip("no user xattrs")
			}
			if root {
				mustOK(t, unix.Setxattr(p, "security.capability", caps, 0))
			}
			mustOK(t, os.Chmod(p, 0o444))
			v := mustCreate(t, s, "b", MainName)
			if _, err := v.CopyUp("ro", true); err != nil {
				t.Fatal(err)
			}
			got := filepath.Join(s.deltaDir("b"), "ro")
			if c.apart {
				// The commit replaces the base's file by the branch's copy.
				mustOK(t, os.Chmod(p, 0o644))
				mustOK(t, unix.Removexattr(p, "user.k"))
				if root {
					mustOK(t, unix.Removexattr(p, "security.capability"))
				}
				mustOK(t, os.Chmod(p, 0o444))
				mustCommit(t, s, "b")
				got = p
			}
			if val, err := getXattr(got, "user.k"); err != nil || string(val) != "v" {
				t.Errorf("user.k = %q, %v; want v", val, err)
			}
			if root {
				if val, err := getXattr(got, "security.capability"); err != nil || len(val) == 0 {
					t.Errorf("security.capability = %x, %v; want it kept", val, err)
				}
			}
			var st unix.Stat_t
			mustOK(t, unix.Stat(got, &st))
			if st.Mode&07777 != 0o444 {
				t.Errorf("mode %o, want 444", st.Mode&07777)
			}
		})
	}
}

// A copy-up whose source is no longer of the type its lookup found (a file
// of the base replaced by a FIFO in between, whose open would block) fails
// with ESTALE and copies nothing.
func TestCopyUpSourceChanged(t *testing.T) {
	s, base := newStore(t)
	v := mustCreate(t, s, "b", MainName)
	e, err := v.Lookup("f")
	if err != nil {
		t.Fatal(err)
	}
	mustOK(t, os.Remove(filepath.Join(base, "f")))
	mustOK(t, unix.Mkfifo(filepath.Join(base, "f"), 0o644))
	mustOK(t, v.beginWrite())
	if c, err := v.startCopyUp("f", e, true); !errors.Is(err, unix.ESTALE) {
		if c != nil {
			c.close()
		}
		t.Fatalf("startCopyUp of a file become a FIFO: %v, want ESTALE", err)
	}
	if _, err := os.Lstat(filepath.Join(s.deltaDir("b"), "f")); !os.IsNotExist(err) {
		t.Errorf("the delta holds f: %v", err)
	}
}
