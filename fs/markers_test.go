package fs_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// TestUnprivilegedTombstones: an ordinary user's daemon makes tombstones
// (0/0 character devices, as overlayfs's whiteouts) and opaque directories
// (deletions, a directory deleted and made again, a rename of a base
// directory), and refuses to make a 0/0 device in a branch, where it would
// be a deletion; the commit applies all of it.
func TestUnprivilegedTombstones(t *testing.T) {
	if _, err := exec.LookPath("fusermount3"); err != nil {
		t.Fatal("fusermount3 (Debian package fuse3) is needed: .ci/run installs it")
	}
	dir := t.TempDir()
	must(t, os.Chmod(dir, 0o755))
	must(t, os.Chmod(filepath.Dir(dir), 0o755))
	home := filepath.Join(dir, "home")
	base, mnt := filepath.Join(home, "base"), filepath.Join(home, "mnt")
	must(t, os.MkdirAll(mnt, 0o755))
	sampleTree(t, base)
	must(t, os.MkdirAll(filepath.Join(base, "tree", "deep"), 0o755))
	writeFile(t, filepath.Join(base, "tree", "deep", "t"), "t\n")
	giveHome(t, home, mnt)
	inHome(t, home, binary, "mount", "--base", base, mnt)
	inHome(t, home, binary, "create", "b", mnt)
	b := filepath.Join(mnt, "@b")
	inHome(t, home, "sh", "-ec", `cd "$0"
rm file link
rm -r dir
mkdir dir
echo fresh > dir/fresh
mv tree moved
! mknod dev c 0 0`, b)
	if got := inHome(t, home, "ls", "-A", b); got != "dir\nmoved\n" {
		t.Errorf("branch lists %q", got)
	}
	if got := inHome(t, home, "ls", "-A", filepath.Join(b, "dir")); got != "fresh\n" {
		t.Errorf("dir made again lists %q, want only fresh", got)
	}
	if got := inHome(t, home, "cat", filepath.Join(b, "moved", "deep", "t")); got != "t\n" {
		t.Errorf("moved/deep/t reads %q", got)
	}
	// The markers need no privilege: the tombstones are 0/0 devices of
	// the user's.
	tombs := 0
	filepath.Walk(filepath.Join(home, ".local", "state", "branchfs"), func(p string, fi os.FileInfo, err error) error {
		if st, ok := fi.Sys().(*syscall.Stat_t); err == nil && ok && fi.Mode()&os.ModeCharDevice != 0 {
			if st.Rdev != 0 || st.Uid != userUID {
				t.Errorf("%s: device %x of uid %d in the store", p, st.Rdev, st.Uid)
			}
			tombs++
		}
		return nil
	})
	if tombs == 0 {
		t.Error("no tombstone in the store")
	}
	inHome(t, home, binary, "commit", b)
	ents, err := os.ReadDir(base)
	must(t, err)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if strings.Join(names, " ") != "dir moved" {
		t.Errorf("base after the commit holds %v", names)
	}
	wantContent(t, filepath.Join(base, "dir", "fresh"), "fresh\n")
	wantMissing(t, filepath.Join(base, "dir", "a"))
	wantContent(t, filepath.Join(base, "moved", "deep", "t"), "t\n")
	inHome(t, home, binary, "unmount", mnt)
}

// TestStoreWithoutXattrsWarns: a base and store on ramfs, which holds no
// user xattrs, mount with a warning that says so; deleting a base file in
// a branch then fails with EOPNOTSUPP and leaves it.
func TestStoreWithoutXattrsWarns(t *testing.T) {
	dir := t.TempDir()
	must(t, unix.Mount("ramfs", dir, "ramfs", 0, "mode=755"))
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	m := &mount{t: t, base: filepath.Join(dir, "base"), store: filepath.Join(dir, "store"), mnt: filepath.Join(dir, "mnt")}
	must(t, os.MkdirAll(m.mnt, 0o755))
	sampleTree(t, m.base)
	out, err := exec.Command(binary, "mount", "--base", m.base, "--store", m.store, m.mnt).CombinedOutput()
	if err != nil {
		t.Fatalf("mount: %v: %s", err, out)
	}
	m.mounted = true
	t.Cleanup(m.cleanup)
	if !strings.Contains(string(out), "warning:") || !strings.Contains(string(out), "extended attributes") {
		t.Errorf("mount says %q; want a warning about extended attributes", out)
	}
	b := m.create("b")
	wantErrno(t, os.Remove(filepath.Join(b, "file")), unix.EOPNOTSUPP)
	wantContent(t, filepath.Join(b, "file"), "base file\n")
	writeFile(t, filepath.Join(b, "new"), "new\n") // what needs no tombstone works
	must(t, os.Remove(filepath.Join(b, "new")))
}
