package fs_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestStoreOthersCanChange: root's mount refuses a store that user 65534
// could change: one the attacker made world-writable, with a link planted
// where the daemon's log goes, and root's own store in the attacker's
// directory, which the attacker may rename and replace (with a delta
// whose tombstone a commit would apply). The error names the directory
// and why; root writes nothing there. A store in a sticky directory such
// as /tmp is the mounting user's and is used.
func TestStoreOthersCanChange(t *testing.T) {
	// dir is a shared place, as /tmp is.
	dir := t.TempDir()
	must(t, unix.Chmod(dir, 0o1777))
	must(t, os.Chmod(filepath.Dir(dir), 0o755))
	base, mnt := filepath.Join(dir, "base"), filepath.Join(dir, "mnt")
	sampleTree(t, base)
	must(t, os.MkdirAll(mnt, 0o755))
	attack(t, `cd "$1" && mkdir -m 777 shared && mkdir -m 700 theirs && ln -s "$1/made-by-root" shared/daemon.log`, dir)
	must(t, os.Mkdir(filepath.Join(dir, "theirs", "store"), 0o700))
	mount := func(store string) (string, error) {
		out, err := exec.Command(binary, "mount", "--base", base, "--store", store, mnt).CombinedOutput()
		if err == nil {
			exec.Command(binary, "unmount", mnt).Run()
		}
		return string(out), err
	}
	for _, c := range []struct{ store, want string }{
		{filepath.Join(dir, "shared"), filepath.Join(dir, "shared") + " is owned by uid 65534, not by root or you"},
		{filepath.Join(dir, "theirs", "store"), filepath.Join(dir, "theirs") + " is owned by uid 65534, not by root or you"},
	} {
		out, err := mount(c.store)
		if err == nil || !strings.Contains(out, c.want) || strings.Count(strings.TrimSpace(out), "\n") != 0 {
			t.Errorf("mount --store %s: %v: %q, want one line with %q", c.store, err, out, c.want)
		}
	}
	// A link the attacker planted where root's store is to be, to a
	// directory of root's that is safe in itself, whose tmp a store's
	// opening empties: refused, and the directory left alone.
	victim := t.TempDir()
	must(t, os.Mkdir(filepath.Join(victim, "tmp"), 0o755))
	writeFile(t, filepath.Join(victim, "tmp", "precious"), "root's\n")
	attack(t, `ln -s "$1" "$2"`, victim, filepath.Join(dir, "planted"))
	want := filepath.Join(dir, "planted") + " is a symbolic link owned by uid 65534, not by root or you"
	if out, err := mount(filepath.Join(dir, "planted")); err == nil || !strings.Contains(out, want) {
		t.Errorf("mount --store through the attacker's link: %v: %q, want %q", err, out, want)
	}
	wantContent(t, filepath.Join(victim, "tmp", "precious"), "root's\n")
	if _, err := os.Stat(filepath.Join(victim, "branchfs.json")); err == nil {
		t.Errorf("root made a store where the attacker's link led")
	}
	if _, err := os.Lstat(filepath.Join(dir, "made-by-root")); err == nil {
		t.Errorf("root made the file the attacker's link named")
	}
	if ents, _ := os.ReadDir(filepath.Join(dir, "shared")); len(ents) != 1 {
		t.Errorf("root wrote into the attacker's store: %v", ents)
	}
	// The sticky directory itself holds root's store safely.
	if out, err := mount(filepath.Join(dir, "store")); err != nil {
		t.Errorf("mount --store in a sticky directory: %v: %s", err, out)
	}
}
