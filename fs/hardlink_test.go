package fs_test

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestHardlinkedBaseFiles: two names of one base file are two files in a
// branch (its copy-up parts them, as overlayfs without an index does), so
// a write through one name lands in that name only, each shows one link,
// and unlinking one leaves the other, open or not, with its link.
func TestHardlinkedBaseFiles(t *testing.T) {
	m := newMount(t, "")
	must(t, os.Link(filepath.Join(m.base, "file"), filepath.Join(m.base, "same")))
	b := m.create("b")
	// The kernel knows both names before the write, as after an ls -l.
	for _, n := range []string{"same", "file"} {
		_, err := os.Lstat(filepath.Join(b, n))
		must(t, err)
	}
	writeFile(t, filepath.Join(b, "file"), "changed\n")
	wantContent(t, filepath.Join(b, "file"), "changed\n")
	wantContent(t, filepath.Join(b, "same"), "base file\n")
	for _, n := range []string{"file", "same"} {
		var st unix.Stat_t
		must(t, unix.Lstat(filepath.Join(b, n), &st))
		if st.Nlink != 1 {
			t.Errorf("%s in the branch: nlink %d, want 1", n, st.Nlink)
		}
	}
	if out := m.ok("diff", b); out != "M file\n" {
		t.Errorf("diff = %q, want %q", out, "M file\n")
	}

	// Open one name for writing, unlink the other: the open one keeps
	// its name and its link.
	f, err := os.OpenFile(filepath.Join(b, "same"), os.O_WRONLY|os.O_APPEND, 0)
	must(t, err)
	must(t, os.Remove(filepath.Join(b, "file")))
	var st unix.Stat_t
	must(t, unix.Fstat(int(f.Fd()), &st))
	if st.Nlink != 1 {
		t.Errorf("open same after unlinking file: nlink %d, want 1", st.Nlink)
	}
	_, err = f.WriteString("more\n")
	must(t, err)
	must(t, f.Close())
	wantContent(t, filepath.Join(b, "same"), "base file\nmore\n")
	wantMissing(t, filepath.Join(b, "file"))
	// The base is untouched until the commit.
	wantContent(t, filepath.Join(m.base, "file"), "base file\n")
	m.ok("commit", b)
	wantContent(t, filepath.Join(m.base, "same"), "base file\nmore\n")
	wantMissing(t, filepath.Join(m.base, "file"))
}
