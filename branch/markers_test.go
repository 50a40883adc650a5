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

// A 0/0 character device of the user's is a device in every layer, not a
// tombstone: it survives a copy-up and a commit.
func TestUserDeviceIsNotTombstone(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mknod of a device in the base needs root")
	}
	s, base := newStore(t)
	if err := unix.Mknod(filepath.Join(base, "dev00"), unix.S_IFCHR|0o644, 0); err != nil {
		t.Fatal(err)
	}
	v, _ := s.Create("b", MainName)
	if err := v.Chmod("dev00", 0o600); err != nil {
		t.Fatalf("chmod of a copied-up 0/0 device: %v", err)
	}
	e, err := v.Lookup("dev00")
	if err != nil || e.Layer != 0 || e.Stat.Mode != unix.S_IFCHR|0o600 {
		t.Fatalf("dev00 after copy-up: %+v, %v", e, err)
	}
	if _, err := v.Mknod("mine", unix.S_IFCHR|0o640, 0, Owner{}); err != nil {
		t.Fatalf("mknod of a 0/0 device in a view: %v", err)
	}
	names := map[string]bool{}
	ents, err := v.ReadDir("")
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range ents {
		names[d.Name] = true
	}
	if !names["dev00"] || !names["mine"] {
		t.Errorf("listing lacks the devices: %v", names)
	}
	if _, err := s.Commit("b"); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"dev00", "mine"} {
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(base, n), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR {
			t.Errorf("base %s after commit: %v (mode %o)", n, err, st.Mode)
		}
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
	must(os.WriteFile(meta, []byte(strings.Replace(string(data), `"version": 2`, `"version": 1`, 1)), 0o600))

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
	filepath.Walk(delta, func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			t.Errorf("format 1 tombstone left: %s", p)
		}
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
	if err := unix.Mount("none", dir, "tmpfs", 0, "mode=0777"); err != nil {
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
