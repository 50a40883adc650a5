package fs_test

// What a view's end or staleness does to what is in flight or held: open
// files with or without a name, copies still running, directories a process
// holds, and a new branch that takes the old one's name.

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/branchfs/branchfs/ctl"
	"golang.org/x/sys/unix"
)

// TestEndedViewUnlinkedOpenFile: a file of a branch that a process holds
// open after unlinking it answers nothing from the kernel's cache once the
// branch is aborted, or made stale by a sibling's commit: fstat and read
// fail with ESTALE, as they do for an open file that still has its name.
func TestEndedViewUnlinkedOpenFile(t *testing.T) {
	for _, how := range []string{"abort", "stale"} {
		t.Run(how, func(t *testing.T) {
			m := newMount(t, "off")
			b := m.create("b")
			var other string
			if how == "stale" {
				other = m.create("c")
			}
			p := filepath.Join(b, "gone")
			f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o644)
			must(t, err)
			defer f.Close()
			if _, err := f.WriteString("cached\n"); err != nil {
				t.Fatal(err)
			}
			must(t, os.Remove(p))
			buf := make([]byte, 64)
			if _, err := f.ReadAt(buf, 0); err != nil && err.Error() != "EOF" {
				t.Fatal(err)
			}
			var st unix.Stat_t
			must(t, unix.Fstat(int(f.Fd()), &st)) // attributes cached again
			if how == "abort" {
				must(t, ioctl(t, b, ctl.IoctlAbort))
			} else {
				writeFile(t, filepath.Join(other, "x"), "x\n")
				must(t, ioctl(t, other, ctl.IoctlCommit))
			}
			if err := unix.Fstat(int(f.Fd()), &st); !errors.Is(err, syscall.ESTALE) {
				t.Errorf("fstat of an unlinked file held open: %v, want ESTALE", err)
			}
			if n, err := f.ReadAt(buf, 0); !errors.Is(err, syscall.ESTALE) {
				t.Errorf("read of an unlinked file held open: %q %v, want ESTALE", buf[:n], err)
			}
		})
	}
}

// copyInFlight mounts a base holding a sparse file of 128 MiB, makes
// branch b, starts a copy_file_range of the file into the new file copy of
// b, and returns once the file below has grown, with a channel that gets
// the copy's result.
func copyInFlight(t *testing.T) (m *mount, b string, done <-chan error) {
	t.Helper()
	const size = 128 << 20
	m = newMount(t, "off")
	bf, err := os.Create(filepath.Join(m.base, "big"))
	must(t, err)
	must(t, bf.Truncate(size))
	bf.Close()
	b = m.create("b")
	in, err := os.Open(filepath.Join(b, "big"))
	must(t, err)
	t.Cleanup(func() { in.Close() })
	out, err := os.OpenFile(filepath.Join(b, "copy"), os.O_WRONLY|os.O_CREATE, 0o644)
	must(t, err)
	t.Cleanup(func() { out.Close() })
	result := make(chan error, 1)
	go func() {
		_, err := unix.CopyFileRange(int(in.Fd()), nil, int(out.Fd()), nil, size, 0)
		result <- err
	}()
	for {
		found := false
		filepath.Walk(m.store, func(p string, fi os.FileInfo, err error) error {
			found = found || err == nil && fi.Name() == "copy" && fi.Size() > 0
			return nil
		})
		if found {
			return m, b, result
		}
		select {
		case err := <-result:
			t.Skipf("the copy ended (%v) before it was seen", err)
		default:
		}
	}
}

// TestCopyRangeEndsWithCommit: a copy_file_range into a branch's file that
// is still copying when the branch's commit returns writes nothing into
// the base after that: the commit holds all of the branch or none of it.
func TestCopyRangeEndsWithCommit(t *testing.T) {
	m, b, done := copyInFlight(t)
	must(t, ioctl(t, b, ctl.IoctlCommit))
	var st unix.Stat_t
	must(t, unix.Stat(filepath.Join(m.base, "copy"), &st))
	atCommit := st.Size
	err := <-done
	must(t, unix.Stat(filepath.Join(m.base, "copy"), &st))
	if st.Size != atCommit {
		t.Errorf("the base's copy grew from %d to %d bytes after the commit returned (copy_file_range: %v)",
			atCommit, st.Size, err)
	}
}

// TestCopyRangeFrozenByChild: a branch made while its parent's
// copy_file_range is still copying sees its parent's file as it was when
// it was made: the parent is frozen from then on.
func TestCopyRangeFrozenByChild(t *testing.T) {
	m, _, done := copyInFlight(t)
	c := m.create("c", "b")
	var st unix.Stat_t
	must(t, unix.Stat(filepath.Join(c, "copy"), &st))
	atCreate := st.Size
	err := <-done
	// A new name: the kernel has not cached its attributes.
	must(t, os.Link(filepath.Join(c, "copy"), filepath.Join(c, "copy2")))
	must(t, unix.Stat(filepath.Join(c, "copy2"), &st))
	if st.Size != atCreate {
		t.Errorf("the child's copy grew from %d to %d bytes after it was made (copy_file_range in the parent: %v)",
			atCreate, st.Size, err)
	}
}

// TestSameNameAfterEnd: a branch made under the name of one just aborted
// or committed, while a directory of the old one is held, is a branch of
// its own at once: MNT/@NAME shows it, and the held directory stays the
// old one's (ESTALE).
func TestSameNameAfterEnd(t *testing.T) {
	for _, how := range []string{"abort", "commit"} {
		t.Run(how, func(t *testing.T) {
			m := newMount(t, "off")
			for i := 0; i < 20; i++ {
				b := m.create("b")
				writeFile(t, filepath.Join(b, "dir", "mine"), "old\n")
				wd, err := os.Open(filepath.Join(b, "dir"))
				must(t, err)
				readFile(t, filepath.Join(b, "dir", "a"))
				if how == "abort" {
					must(t, ioctl(t, b, ctl.IoctlAbort))
				} else {
					must(t, ioctl(t, b, ctl.IoctlCommit))
				}
				b2 := m.create("b")
				writeFile(t, filepath.Join(b2, "dir", "new"), "new\n")
				if _, err := os.Stat(filepath.Join(b2, "dir", "new")); err != nil {
					t.Fatalf("round %d: new branch: %v", i, err)
				}
				var st unix.Stat_t
				if err := unix.Fstatat(int(wd.Fd()), "new", &st, 0); !errors.Is(err, syscall.ESTALE) {
					t.Errorf("round %d: a name below the old branch's held directory: %v, want ESTALE", i, err)
				}
				wd.Close()
				must(t, ioctl(t, b2, ctl.IoctlAbort))
				if how == "commit" {
					must(t, os.Remove(filepath.Join(m.base, "dir", "mine")))
				}
			}
		})
	}
}

// TestEndedViewSubdirOpen: once an abort returns, opening a directory the
// kernel knows below a held directory of the branch fails with ESTALE.
func TestEndedViewSubdirOpen(t *testing.T) {
	m := newMount(t, "off")
	opened := 0
	for i := 0; i < 20; i++ {
		b := m.create("b")
		must(t, os.MkdirAll(filepath.Join(b, "dir", "sub"), 0o755))
		wd, err := os.Open(filepath.Join(b, "dir"))
		must(t, err)
		if _, err := os.Stat(filepath.Join(b, "dir", "sub")); err != nil {
			t.Fatal(err)
		}
		must(t, ioctl(t, b, ctl.IoctlAbort))
		fd, err := unix.Openat(int(wd.Fd()), "sub", unix.O_RDONLY|unix.O_DIRECTORY, 0)
		if err == nil {
			opened++
			unix.Close(fd)
		} else if !errors.Is(err, syscall.ESTALE) {
			t.Errorf("open: %v, want ESTALE", err)
		}
		wd.Close()
	}
	if opened > 0 {
		t.Errorf("%d of 20 opens of a known directory below a held one succeeded after the abort returned", opened)
	}
}
