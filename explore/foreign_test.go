package explore

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestForeignDaemon: root's runs and checkpoints do not act on what the
// daemon of another user's mount says (user 65534 mounts with
// user_allow_other, so root may use the mount): no base of its naming is
// covered by the branch in a run, no layers of its naming are mounted
// (runs take the FUSE path), and its store takes none of root's
// checkpoints. The test runs itself again in a mount namespace of its
// own, whose /etc/fuse.conf allows user_allow_other.
func TestForeignDaemon(t *testing.T) {
	dir := os.Getenv("BRANCHFS_TEST_FOREIGN")
	if dir == "" {
		if _, err := exec.LookPath("fusermount3"); err != nil {
			t.Skip("no fusermount3")
		}
		if fi, err := os.Stat("/dev/fuse"); err != nil || fi.Mode().Perm()&0o006 != 0o006 {
			t.Skip("/dev/fuse is not open to every user")
		}
		if _, err := os.Stat("/etc/fuse.conf"); err != nil {
			t.Skip("no /etc/fuse.conf to cover")
		}
		dir := t.TempDir()
		must(t, os.Chmod(dir, 0o755))
		must(t, os.Chmod(filepath.Dir(dir), 0o755))
		must(t, os.Chown(dir, 65534, 65534))
		self, err := os.Executable()
		must(t, err)
		cmd := exec.Command("unshare", "--mount", "--propagation", "private", self, "-test.run=^TestForeignDaemon$", "-test.v")
		cmd.Env = append(os.Environ(), "BRANCHFS_TEST_FOREIGN="+dir, "BRANCHFS_TEST_BINARY="+binary)
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "--- PASS: TestForeignDaemon") {
			t.Fatalf("in a mount namespace of its own: %v\n%s", err, out)
		}
		return
	}
	conf := filepath.Join(dir, "fuse.conf")
	must(t, os.WriteFile(conf, []byte("user_allow_other\n"), 0o644))
	must(t, unix.Mount(conf, "/etc/fuse.conf", "", unix.MS_BIND, ""))
	base, mnt := filepath.Join(dir, "base"), filepath.Join(dir, "mnt")
	as := func(args ...string) {
		t.Helper()
		cmd := exec.Command("setpriv", append([]string{"--reuid=65534", "--regid=65534", "--clear-groups", "--"}, args...)...)
		cmd.Dir = dir
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + dir, "XDG_RUNTIME_DIR=" + filepath.Join(dir, "xdg")}
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%q as uid 65534: %v: %s", args, err, out)
		}
	}
	as("sh", "-c", "mkdir -p base mnt xdg && echo base > base/f")
	as(binary, "mount", "--base", base, mnt)
	t.Cleanup(func() { as(binary, "unmount", mnt) })

	// Through a link too, the mount is known to be uid 65534's.
	link := filepath.Join(dir, "link")
	must(t, os.Symlink(mnt, link))
	for _, p := range []string{mnt, link} {
		m, err := Open(p)
		must(t, err)
		if store, err := m.Store(); err == nil || !strings.Contains(err.Error(), "runs as uid 65534") {
			t.Errorf("the store of uid 65534's daemon, through %s: %q, %v", p, store, err)
		}
	}
	m, err := Open(mnt)
	must(t, err)
	// The base is not covered: the command sees the base itself there.
	var st unix.Stat_t
	must(t, unix.Stat(base, &st))
	res, err := m.Run(context.Background(), Spec{Args: sh(fmt.Sprintf(`[ "$(stat -c %%d:%%i %s)" = %d:%d ]`, base, st.Dev, st.Ino)), Dir: "/"})
	must(t, err)
	if res.ExitCode != 0 || res.DataPath != DataPathFUSE {
		t.Errorf("root's run in uid 65534's mount: exit %d (1: the base was covered), data path %s", res.ExitCode, res.DataPath)
	}
	if _, err := m.Run(context.Background(), Spec{Args: sh("true"), Dir: "/", DataPath: DataPathKernel}); err == nil {
		t.Errorf("root's run took the kernel path in uid 65534's mount")
	}
}
