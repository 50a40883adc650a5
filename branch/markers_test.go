package branch

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// A 0/0 character device is a tombstone in a delta (an overlayfs
// whiteout): a branch makes none and copies none up (EPERM, as overlayfs
// refuses to make one); the base's own is shown, and a commit leaves it.
func TestZeroDeviceInBranch(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("chmod of another's device needs root")
	}
	s, base := newStore(t)
	if err := unix.Mknod(filepath.Join(base, "dev00"), unix.S_IFCHR|0o644, 0); err != nil {
		t.Fatal(err)
	}
	v, _ := s.Create("b", MainName)
	if e, err := v.Lookup("dev00"); err != nil || e.Layer == 0 || e.Stat.Mode != unix.S_IFCHR|0o644 {
		t.Fatalf("the base's 0/0 device in a branch: %+v, %v", e, err)
	}
	if err := v.Chmod("dev00", 0o600); !errors.Is(err, unix.EPERM) {
		t.Errorf("chmod (a copy-up) of the base's 0/0 device: %v, want EPERM", err)
	}
	if _, err := v.Mknod("mine", unix.S_IFCHR|0o640, 0, Owner{}); !errors.Is(err, unix.EPERM) {
		t.Errorf("mknod of a 0/0 device in a branch: %v, want EPERM", err)
	}
	if _, err := v.Mknod("null", unix.S_IFCHR|0o640, uint32(unix.Mkdev(1, 3)), Owner{}); err != nil {
		t.Errorf("mknod of another device in a branch: %v", err)
	}
	if _, err := s.Commit("b"); err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(base, "dev00"), &st); err != nil || st.Mode != unix.S_IFCHR|0o644 {
		t.Errorf("base dev00 after the commit: %v (mode %o)", err, st.Mode)
	}
	if _, err := s.Main().Mknod("main00", unix.S_IFCHR|0o600, 0, Owner{}); err != nil {
		t.Errorf("mknod of a 0/0 device in the main view: %v", err)
	}
}

// A store of format 1 (0/0 character devices for tombstones, trusted
// xattrs for opaque directories, as root made them) is converted when it is
// opened, and means what it meant.
func TestFormat1StoreConverted(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("trusted xattrs need root")
	}
	s, base := newStore(t)
	os.MkdirAll(filepath.Join(base, "e"), 0o755)
	os.WriteFile(filepath.Join(base, "e", "old"), nil, 0o644)
	v, _ := s.Create("b", MainName)
	write(t, v, "new", "n") // makes the delta
	dir, delta := s.Dir(), s.deltaDir("b")
	s.Close()
	// What format 1 wrote for "rm f d/x; rm -r e; mkdir e".
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(unix.Mknod(filepath.Join(delta, "f"), unix.S_IFCHR, 0))
	must(os.Mkdir(filepath.Join(delta, "d"), 0o755))
	must(unix.Mknod(filepath.Join(delta, "d", "x"), unix.S_IFCHR, 0))
	must(os.Mkdir(filepath.Join(delta, "e"), 0o755))
	must(unix.Setxattr(filepath.Join(delta, "e"), v1Opaque, []byte("y"), 0))
	meta := filepath.Join(dir, "branchfs.json")
	data, _ := os.ReadFile(meta)
	must(os.WriteFile(meta, []byte(strings.Replace(string(data), `"version": 3`, `"version": 1`, 1)), 0o600))

	s, err := Open(dir, base, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var m storeMeta
	data, _ = os.ReadFile(meta)
	if json.Unmarshal(data, &m) != nil || m.Version != formatVersion {
		t.Errorf("branchfs.json after conversion: %s", data)
	}
	if got, want := deltaContents(t, delta), "d d/x! e* f! new"; got != want {
		t.Errorf("delta after the conversion: %q, want %q", got, want)
	}
	filepath.Walk(delta, func(p string, fi os.FileInfo, err error) error {
		if _, err := unix.Lgetxattr(p, v1Opaque, nil); err == nil {
			t.Errorf("format 1 opaque marker left: %s", p)
		}
		return nil
	})
	v, _ = s.View("b")
	for _, rel := range []string{"f", "d/x", "e/old"} {
		if _, err := v.Lookup(rel); !errors.Is(err, unix.ENOENT) {
			t.Errorf("%s: %v, want ENOENT", rel, err)
		}
	}
	if _, err := v.Lookup("e"); err != nil {
		t.Errorf("e: %v", err)
	}
	if _, err := s.Commit("b"); err != nil {
		t.Fatal(err)
	}
	for _, rel := range []string{"f", "d/x", "e/old"} {
		if _, err := os.Lstat(filepath.Join(base, rel)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("base %s after commit: %v", rel, err)
		}
	}
}

// formatStore makes a store of branch b, whose delta holds new, and
// returns it closed with the store and delta directories, the base, and a
// function that sets the version in branchfs.json.
func formatStore(t *testing.T) (dir, delta, base string, setVersion func(int)) {
	s, base := newStore(t)
	os.MkdirAll(filepath.Join(base, "e"), 0o755)
	os.WriteFile(filepath.Join(base, "e", "old"), nil, 0o644)
	v, _ := s.Create("b", MainName)
	write(t, v, "new", "n") // makes the delta
	dir, delta = s.Dir(), s.deltaDir("b")
	s.Close()
	meta := filepath.Join(dir, "branchfs.json")
	return dir, delta, base, func(n int) {
		data, _ := os.ReadFile(meta)
		var m storeMeta
		json.Unmarshal(data, &m)
		m.Version = n
		data, _ = json.Marshal(&m)
		if err := os.WriteFile(meta, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// A store of format 2 (empty files carrying user.branchfs.whiteout,
// user.branchfs.opaque) is converted when it is opened: its tombstones
// become 0/0 devices, its opaque directories carry overlayfs's marker.
func TestFormat2StoreConverted(t *testing.T) {
	dir, delta, base, setVersion := formatStore(t)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	tomb := func(p string) {
		must(os.WriteFile(p, nil, 0o600))
		must(unix.Setxattr(p, v2Whiteout, []byte("y"), 0))
	}
	// What format 2 wrote for "rm f d/x; rm -r e; mkdir e".
	tomb(filepath.Join(delta, "f"))
	must(os.Mkdir(filepath.Join(delta, "d"), 0o755))
	tomb(filepath.Join(delta, "d", "x"))
	must(os.Mkdir(filepath.Join(delta, "e"), 0o755))
	must(unix.Setxattr(filepath.Join(delta, "e"), v2Opaque, []byte("y"), 0))
	setVersion(2)
	s, err := Open(dir, base, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.meta.Version != formatVersion {
		t.Errorf("format after the conversion: %d", s.meta.Version)
	}
	if got, want := deltaContents(t, delta), "d d/x! e* f! new"; got != want {
		t.Errorf("delta after the conversion: %q, want %q", got, want)
	}
	if _, err := unix.Lgetxattr(filepath.Join(delta, "e"), v2Opaque, nil); err == nil {
		t.Error("format 2 opaque marker left")
	}
	v, _ := s.View("b")
	for _, rel := range []string{"f", "d/x", "e/old"} {
		if _, err := v.Lookup(rel); !errors.Is(err, unix.ENOENT) {
			t.Errorf("%s: %v, want ENOENT", rel, err)
		}
	}
}

// A 0/0 device in a format 2 delta was a user's device, which format 3
// cannot hold: Open fails naming it, and the store stays at format 2.
func TestFormat2DeviceRefused(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("an ordinary user's mknod of a 0/0 device needs Linux 5.8; as root always")
	}
	dir, delta, base, setVersion := formatStore(t)
	if err := unix.Mknod(filepath.Join(delta, "dev"), unix.S_IFCHR|0o600, 0); err != nil {
		t.Fatal(err)
	}
	setVersion(2)
	if s, err := Open(dir, base, Options{}); err == nil || !strings.Contains(err.Error(), "dev is a 0/0 character device") {
		if s != nil {
			s.Close()
		}
		t.Fatalf("Open = %v, want an error naming dev", err)
	}
	data, _ := os.ReadFile(filepath.Join(dir, "branchfs.json"))
	var m storeMeta
	if json.Unmarshal(data, &m) != nil || m.Version != 2 {
		t.Errorf("branchfs.json after the refused conversion: %s", data)
	}
}

// A store on a filesystem without user xattrs (ramfs) works until a
// deletion needs a tombstone: that fails with EOPNOTSUPP, says why, and
// changes nothing.
func TestStoreWithoutXattrs(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting ramfs needs root")
	}
	dir := t.TempDir()
	if err := unix.Mount("none", dir, "ramfs", 0, ""); err != nil {
		t.Skip("no ramfs:", err)
	}
	defer unix.Unmount(dir, unix.MNT_DETACH)
	base := filepath.Join(dir, "base")
	os.MkdirAll(filepath.Join(base, "d"), 0o755)
	os.WriteFile(filepath.Join(base, "f"), []byte("base"), 0o644)
	s, err := Open(filepath.Join(dir, "store"), base, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.MarkerError(); err == nil || !strings.Contains(err.Error(), "extended attributes") {
		t.Errorf("MarkerError = %v, want one about extended attributes", err)
	}
	v, _ := s.Create("b", MainName)
	write(t, v, "f", "changed")
	for what, err := range map[string]error{
		"unlink":      v.Unlink("f"),
		"rmdir":       v.Rmdir("d"),
		"rename file": v.Rename("f", "g", 0),
		"rename dir":  v.Rename("d", "e", 0),
	} {
		if !errors.Is(err, unix.EOPNOTSUPP) || !strings.Contains(err.Error(), "extended attributes") {
			t.Errorf("%s: %v, want EOPNOTSUPP saying why", what, err)
		}
	}
	if got := readView(t, v, "f"); got != "changed" {
		t.Errorf("f = %q after the failed deletions", got)
	}
	for _, rel := range []string{"d", "f"} {
		if _, err := v.Lookup(rel); err != nil {
			t.Errorf("%s after the failed deletions: %v", rel, err)
		}
	}
	for _, rel := range []string{"g", "e"} {
		if _, err := v.Lookup(rel); !errors.Is(err, unix.ENOENT) {
			t.Errorf("%s after the failed renames: %v", rel, err)
		}
	}
}

// As an unprivileged user, on tmpfs: tombstones, opaque directories and
// the replacements of both are made and read. The test runs itself again
// as nobody.
func TestMarkersUnprivilegedOnTmpfs(t *testing.T) {
	if dir := os.Getenv("BRANCHFS_TEST_MARKERS_DIR"); dir != "" {
		markersAsUser(t, dir)
		return
	}
	if os.Geteuid() != 0 {
		t.Skip("mounting tmpfs and changing user need root")
	}
	dir := t.TempDir()
	if err := unix.Mount("none", dir, "tmpfs", 0, "mode=1777"); err != nil { // sticky, as /tmp
		t.Skip("no tmpfs:", err)
	}
	defer unix.Unmount(dir, unix.MNT_DETACH)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "branch.test")
	data, err := os.ReadFile(exe)
	if err == nil {
		err = os.WriteFile(bin, data, 0o755)
	}
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(filepath.Dir(dir), 0o755)
	cmd := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
		bin, "-test.run=^TestMarkersUnprivilegedOnTmpfs$", "-test.v")
	cmd.Env = append(os.Environ(), "BRANCHFS_TEST_MARKERS_DIR="+dir, "HOME="+dir)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS") {
		t.Fatalf("as nobody: %v\n%s", err, out)
	}
}

func markersAsUser(t *testing.T, dir string) {
	base := filepath.Join(dir, "base")
	os.MkdirAll(filepath.Join(base, "d", "sub"), 0o755)
	os.WriteFile(filepath.Join(base, "f"), []byte("base"), 0o644)
	os.WriteFile(filepath.Join(base, "d", "x"), []byte("x"), 0o644)
	os.WriteFile(filepath.Join(base, "g"), []byte("g"), 0o644)
	s, err := Open(filepath.Join(dir, "store"), base, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	v, _ := s.Create("b", MainName)
	steps := []struct {
		what string
		err  error
	}{
		{"unlink f", v.Unlink("f")},
		{"unlink d/x", v.Unlink("d/x")},
		{"rmdir d/sub", v.Rmdir("d/sub")},
		{"rmdir d", v.Rmdir("d")},
		{"mkdir d", func() error { _, err := v.Mkdir("d", 0o755, me); return err }()},
		{"rename g", v.Rename("g", "d/g", 0)},
	}
	for _, st := range steps {
		if st.err != nil {
			t.Fatalf("%s: %v", st.what, st.err)
		}
	}
	ents, err := v.ReadDir("")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, d := range ents {
		names = append(names, d.Name)
	}
	if strings.Join(names, " ") != "d" {
		t.Errorf("root lists %v, want [d]", names)
	}
	if ents, _ := v.ReadDir("d"); len(ents) != 1 || ents[0].Name != "g" {
		t.Errorf("the new d lists %v, want only g", ents)
	}
	if _, err := s.Commit("b"); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadDir(base)
	if len(got) != 1 || got[0].Name() != "d" {
		t.Errorf("base after commit: %v", got)
	}
	if got, _ := os.ReadDir(filepath.Join(base, "d")); len(got) != 1 || got[0].Name() != "g" {
		t.Errorf("base d after commit: %v", got)
	}
}

// What overlayfs keeps for itself in a delta it wrote (origin on what it
// copied up, impure on the directories that hold such files) stays out of
// the base and of a parent's delta: a commit drops it from the files it
// moves one by one and from the trees that move into the base, and keeps
// the user's own xattrs.
func TestCommitDropsOverlayBookkeeping(t *testing.T) {
	s, base := newStore(t)
	for _, d := range []string{"d", "d/deep"} {
		os.MkdirAll(filepath.Join(base, d), 0o755)
	}
	for _, f := range []string{"f", "d/x", "d/deep/z"} {
		os.WriteFile(filepath.Join(base, f), []byte("base"), 0o644)
	}
	p, _ := s.Create("p", MainName)
	write(t, p, "d/x", "p") // p's d is merged with c's, c's d/deep moves whole
	c, _ := s.Create("c", "p")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	// As a kernel-path run leaves them: f and d/x and d/deep/z copied up,
	// new/y renamed there from the base.
	write(t, c, "f", "c")
	write(t, c, "d/x", "c")
	write(t, c, "d/deep/z", "c")
	_, err := c.Mkdir("new", 0o755, me)
	must(err)
	write(t, c, "new/y", "y")
	delta := s.deltaDir("c")
	mark := func(rel string, impure bool) {
		p := filepath.Join(delta, rel)
		must(unix.Setxattr(p, overlayPrefix+"origin", []byte("fh"), 0))
		if impure {
			must(unix.Setxattr(p, impureXattr, []byte("y"), 0))
		}
	}
	must(unix.Setxattr(delta, impureXattr, []byte("y"), 0))
	mark("f", false)
	mark("d", true)
	mark("d/x", false)
	mark("d/deep", true)
	mark("d/deep/z", false)
	must(unix.Setxattr(filepath.Join(delta, "new"), impureXattr, []byte("y"), 0))
	mark("new/y", false)
	must(unix.Setxattr(filepath.Join(delta, "new/y"), "user.mine", []byte("m"), 0))
	if _, err := s.Commit("c"); err != nil {
		t.Fatal(err)
	}
	// Into p's delta: the files moved one by one are clean; the trees
	// that moved whole keep their marks, impure telling where to look.
	pd := s.deltaDir("p")
	for _, rel := range []string{"f", "d/x"} {
		if names, _ := listXattrs(filepath.Join(pd, rel)); len(names) != 0 {
			t.Errorf("p's %s after the commit carries %v", rel, names)
		}
	}
	if _, err := unix.Getxattr(filepath.Join(pd, "d/deep"), impureXattr, nil); err != nil {
		t.Errorf("p's d/deep lost its impure mark: %v", err)
	}
	if _, err := s.Commit("p"); err != nil {
		t.Fatal(err)
	}
	filepath.Walk(base, func(path string, fi os.FileInfo, err error) error {
		names, _ := listXattrs(path)
		rel, _ := filepath.Rel(base, path)
		want := 0
		if rel == "new/y" {
			want = 1
		}
		if len(names) != want {
			t.Errorf("base %s after the commits carries %v", rel, names)
		}
		return nil
	})
}
