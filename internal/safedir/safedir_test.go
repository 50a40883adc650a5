package safedir

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// The cases make directories as root and give some of them to uid 65534,
// the other user, as that user could have made them.
func TestCheck(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root, to give directories to another user")
	}
	const other = 65534
	top := t.TempDir()
	mk := func(rel string, mode uint32, uid int) string {
		p := filepath.Join(top, rel)
		must(t, os.MkdirAll(p, 0o700))
		must(t, os.Chown(p, uid, uid))
		must(t, unix.Chmod(p, mode)) // os.Chmod drops 01000
		return p
	}
	ok := mk("ok", 0o755, 0)
	mk("ok/sub", 0o700, 0)
	mk("sticky", 0o1777, 0)
	mk("sticky/mine", 0o700, 0)
	mk("sticky/theirs", 0o700, other)
	mk("open", 0o777, 0)
	mk("open/mine", 0o700, 0)
	mk("group", 0o775, 0)
	must(t, os.Chown(filepath.Join(top, "group"), 0, other)) // nobody's group, not root's alone
	mk("private", 0o775, 0)                                  // root's group: root's alone
	mk("private/mine", 0o700, 0)
	// Root's group is root's alone, but an ACL lets the other user write
	// (user::rwx user:65534:rwx group::rwx mask::rwx other::r-x).
	acl := mk("acl", 0o775, 0)
	must(t, unix.Setxattr(acl, "system.posix_acl_access", []byte{
		2, 0, 0, 0,
		0x01, 0, 7, 0, 0xff, 0xff, 0xff, 0xff,
		0x02, 0, 7, 0, byte(other & 0xff), byte(other >> 8), 0, 0,
		0x04, 0, 7, 0, 0xff, 0xff, 0xff, 0xff,
		0x10, 0, 7, 0, 0xff, 0xff, 0xff, 0xff,
		0x20, 0, 5, 0, 0xff, 0xff, 0xff, 0xff,
	}, 0))
	mk("theirs", 0o755, other)
	mk("theirs/mine", 0o700, 0)
	must(t, os.Symlink(filepath.Join(top, "ok", "sub"), filepath.Join(top, "link")))
	must(t, os.Symlink(filepath.Join(top, "theirs", "mine"), filepath.Join(top, "badlink")))
	// Links in a sticky directory: root's, and one the other user made
	// there to a directory of root's that is safe in itself.
	must(t, os.Symlink(filepath.Join(top, "ok", "sub"), filepath.Join(top, "sticky", "rootlink")))
	must(t, os.Symlink(filepath.Join(top, "ok", "sub"), filepath.Join(top, "sticky", "theirlink")))
	must(t, os.Lchown(filepath.Join(top, "sticky", "theirlink"), other, other))
	must(t, os.Symlink("../ok", filepath.Join(top, "sticky", "theirdirlink")))
	must(t, os.Lchown(filepath.Join(top, "sticky", "theirdirlink"), other, other))
	// Root's link in a directory the other user may write: it can be
	// replaced.
	must(t, os.Symlink(filepath.Join(top, "ok", "sub"), filepath.Join(top, "open", "rootlink")))
	for _, c := range []struct{ rel, want string }{
		{"ok/sub", ""},
		{"sticky/mine", ""},
		{"private/mine", ""},
		{"link", ""},
		{"sticky", "sticky is writable by others (mode 1777)"},
		{"sticky/theirs", "sticky/theirs is owned by uid 65534, not by root or you"},
		{"open/mine", "open is writable by others (mode 0777)"},
		{"group", "group is writable by its group (mode 0775)"},
		{"acl", "acl is writable by the users and groups its ACL names (mode 0775)"},
		{"theirs/mine", "theirs is owned by uid 65534, not by root or you"},
		{"badlink", "theirs is owned by uid 65534, not by root or you"},
		{"ok/missing", "no such file or directory"},
		{"sticky/rootlink", ""},
		{"sticky/theirlink", "sticky/theirlink is a symbolic link owned by uid 65534, not by root or you"},
		{"sticky/theirdirlink/sub", "sticky/theirdirlink is a symbolic link owned by uid 65534, not by root or you"},
		{"open/rootlink", "open is writable by others (mode 0777)"},
	} {
		_, err := Check(filepath.Join(top, c.rel))
		if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.HasSuffix(err.Error(), c.want)) {
			t.Errorf("%s: %v, want %q", c.rel, err, c.want)
		}
	}
	if real, err := Check(filepath.Join(top, "link")); err != nil || real != filepath.Join(ok, "sub") {
		t.Errorf("link resolves to %q (%v)", real, err)
	}

	// Make makes what is missing, 0700, but nothing under a directory
	// that is not safe.
	made := filepath.Join(top, "sticky", "new", "store")
	if _, err := Make(made); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{made, filepath.Dir(made)} {
		if fi, err := os.Stat(d); err != nil || fi.Mode().Perm() != 0o700 {
			t.Errorf("%s: %v %v, want mode 0700", d, fi.Mode(), err)
		}
	}
	if _, err := Make(filepath.Join(top, "open", "new")); err == nil {
		t.Errorf("Make under a directory open to others succeeded")
	}
	if _, err := os.Stat(filepath.Join(top, "open", "new")); err == nil {
		t.Errorf("Make made a directory under a directory open to others")
	}
	if _, err := Make(filepath.Join(top, "sticky", "theirdirlink", "new")); err == nil {
		t.Errorf("Make through another's link succeeded")
	}
	if _, err := os.Stat(filepath.Join(top, "ok", "new")); err == nil {
		t.Errorf("Make made a directory where another's link led")
	}

	// MakePrivate tightens the mode of the user's own directory and
	// refuses another's.
	loose := mk("ok/loose", 0o755, 0)
	if _, err := MakePrivate(loose); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(loose); fi.Mode().Perm() != 0o700 {
		t.Errorf("MakePrivate left mode %v", fi.Mode())
	}
	mk("ok/given", 0o700, other)
	if _, err := MakePrivate(filepath.Join(top, "ok", "given")); err == nil || !strings.Contains(err.Error(), "owned by uid 65534") {
		t.Errorf("MakePrivate of another's directory: %v", err)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
