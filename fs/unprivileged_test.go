package fs_test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// userUID is the ordinary user the unprivileged tests run as.
const userUID = 65534

// inHome runs a command as userUID with home as its home directory and
// returns its combined output; it fails the test unless the command
// succeeds.
func inHome(t *testing.T, home string, name string, args ...string) string {
	t.Helper()
	out, err := tryInHome(home, name, args...)
	if err != nil {
		t.Fatalf("%s %s as uid %d: %v: %s", name, strings.Join(args, " "), userUID, err, out)
	}
	return out
}

func tryInHome(home string, name string, args ...string) (string, error) {
	cmd := exec.Command("setpriv", append([]string{"--reuid=65534", "--regid=65534", "--clear-groups", "--",
		name}, args...)...)
	cmd.Env = []string{"HOME=" + home, "PATH=" + os.Getenv("PATH"), "GORACE=" + os.Getenv("GORACE")}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// mountEntry returns the /proc/mounts line of the file system mounted at
// mnt, or "".
func mountEntry(t *testing.T, mnt string) string {
	t.Helper()
	data, err := os.ReadFile("/proc/mounts")
	must(t, err)
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) > 1 && f[1] == mnt {
			return line
		}
	}
	return ""
}

// An ordinary user mounts and unmounts through fusermount3, with the
// default store under ~/.local/state, and works with branches: create,
// write, delete, read, commit, and mount again after the daemon is killed. Without user_allow_other in /etc/fuse.conf the
// mount is the user's alone.
func TestUnprivilegedMount(t *testing.T) {
	if _, err := exec.LookPath("fusermount3"); err != nil {
		t.Fatal("fusermount3 (Debian package fuse3) is needed: .ci/run installs it")
	}
	if fi, err := os.Stat("/dev/fuse"); err != nil || fi.Mode().Perm()&0o006 != 0o006 {
		t.Fatalf("/dev/fuse must be open to every user, as udev makes it on Debian (.ci/run does): %v %v", fi.Mode(), err)
	}
	dir := t.TempDir()
	must(t, os.Chmod(dir, 0o755))
	must(t, os.Chmod(filepath.Dir(dir), 0o755))
	home := filepath.Join(dir, "home")
	base, mnt := filepath.Join(home, "base"), filepath.Join(home, "mnt")
	must(t, os.MkdirAll(mnt, 0o755))
	sampleTree(t, base)
	giveHome(t, home, mnt)

	inHome(t, home, binary, "mount", "--base", base, mnt)
	entry := mountEntry(t, mnt)
	if !strings.Contains(entry, "fuse.branchfs") || !strings.Contains(entry, "user_id=65534") {
		t.Fatalf("mount entry %q: want a fuse.branchfs mount of uid 65534", entry)
	}
	conf, _ := os.ReadFile("/etc/fuse.conf")
	if !bytes.Contains(conf, []byte("\nuser_allow_other")) && strings.Contains(entry, "allow_other") {
		t.Errorf("mount entry %q: allow_other without user_allow_other in /etc/fuse.conf", entry)
	}
	pidFile, err := filepath.Glob(filepath.Join(home, ".local", "state", "branchfs", "*", "daemon.pid"))
	if err != nil || len(pidFile) != 1 {
		t.Fatalf("default store under ~/.local/state/branchfs: %v %v", pidFile, err)
	}

	inHome(t, home, binary, "create", "b", mnt)
	b := filepath.Join(mnt, "@b")
	inHome(t, home, "sh", "-c", `echo changed > "$0"/file && mkdir "$0"/new && echo new > "$0"/new/f &&
		rm "$0"/link && rm -r "$0"/dir/sub && rm -r "$0"/dir && mkdir "$0"/dir && echo again > "$0"/dir/a`, b)
	if got := inHome(t, home, "ls", "-A", filepath.Join(b, "dir")); got != "a\n" {
		t.Errorf("directory made again in the branch lists %q", got)
	}
	if got := inHome(t, home, "cat", filepath.Join(b, "file"), filepath.Join(b, "new", "f")); got != "changed\nnew\n" {
		t.Errorf("branch files read %q", got)
	}
	if got := inHome(t, home, "cat", filepath.Join(mnt, "file")); got != "base file\n" {
		t.Errorf("main view before the commit reads %q", got)
	}
	wantContent(t, filepath.Join(base, "file"), "base file\n")
	inHome(t, home, binary, "commit", b)
	wantContent(t, filepath.Join(base, "file"), "changed\n")
	wantContent(t, filepath.Join(base, "new", "f"), "new\n")
	wantMissing(t, filepath.Join(base, "link"))
	wantMissing(t, filepath.Join(base, "dir", "sub"))
	wantContent(t, filepath.Join(base, "dir", "a"), "again\n")
	if got := inHome(t, home, "cat", filepath.Join(mnt, "new", "f")); got != "new\n" {
		t.Errorf("main view after the commit reads %q", got)
	}
	var st unix.Stat_t
	must(t, unix.Stat(filepath.Join(base, "new", "f"), &st))
	if st.Uid != userUID {
		t.Errorf("committed file belongs to uid %d, want %d", st.Uid, userUID)
	}

	// A daemon killed mid-work: the user mounts again over its dead
	// mount, and the branch is there.
	inHome(t, home, binary, "create", "c", mnt)
	inHome(t, home, "sh", "-c", `echo kept > "$0"/kept`, filepath.Join(mnt, "@c"))
	data, err := os.ReadFile(pidFile[0])
	must(t, err)
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	must(t, err)
	must(t, unix.Kill(pid, unix.SIGKILL))
	for {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil || bytes.Contains(stat, []byte(") Z ")) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	inHome(t, home, binary, "mount", "--base", base, mnt)
	if got := inHome(t, home, "cat", filepath.Join(mnt, "@c", "kept")); got != "kept\n" {
		t.Errorf("branch after the remount reads %q", got)
	}

	inHome(t, home, binary, "unmount", mnt)
	if entry := mountEntry(t, mnt); entry != "" {
		t.Errorf("still mounted after unmount: %q", entry)
	}
}

// giveHome gives the ordinary user everything under home and unmounts mnt,
// if a test left it mounted, when the test ends.
func giveHome(t *testing.T, home, mnt string) {
	must(t, filepath.Walk(home, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, userUID, userUID)
	}))
	t.Cleanup(func() {
		if mountEntry(t, mnt) != "" {
			tryInHome(home, binary, "unmount", mnt)
			unix.Unmount(mnt, unix.MNT_DETACH)
		}
	})
}
