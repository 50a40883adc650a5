package remote

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// userUID is the ordinary user the unprivileged tests run as.
const userUID = 65534

// asUser runs a command as userUID with home as its home directory and
// env added, and fails the test unless it succeeds.
func asUser(t *testing.T, home string, env []string, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command("setpriv", append([]string{"--reuid=65534", "--regid=65534", "--clear-groups", "--", name}, args...)...)
	cmd.Env = append(append(env, "HOME="+home, "PATH="+os.Getenv("PATH")), "GORACE="+os.Getenv("GORACE"))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s as uid %d: %v: %s", name, strings.Join(args, " "), userUID, err, out.String())
	}
	return out.String()
}

// An ordinary user exchanges a branch between two mounts of their own:
// the pull runs as the user, through the daemon's checks, and makes
// every file the branch holds, read-only ones included, with its mode,
// xattrs and times (an ordinary user may change the xattrs of no file
// that is read-only to it).
func TestUnprivilegedExchange(t *testing.T) {
	needMount(t)
	if _, err := exec.LookPath("fusermount3"); err != nil {
		t.Fatal("fusermount3 (Debian package fuse3) is needed: .ci/run installs it")
	}
	w := sharedWeed(t)
	bucket := w.bucket(t)
	dir := t.TempDir()
	must(t, os.Chmod(dir, 0o755))
	must(t, os.Chmod(filepath.Dir(dir), 0o755))
	home := filepath.Join(dir, "home")
	baseA, baseB := filepath.Join(home, "baseA"), filepath.Join(home, "baseB")
	mntA, mntB := filepath.Join(home, "mntA"), filepath.Join(home, "mntB")
	for _, d := range []string{baseA, baseB, mntA, mntB} {
		must(t, os.MkdirAll(d, 0o755))
	}
	for _, b := range []string{baseA, baseB} {
		must(t, os.WriteFile(filepath.Join(b, "keep"), []byte("in the base\n"), 0o644))
		must(t, os.WriteFile(filepath.Join(b, "robase"), []byte("read-only in the base\n"), 0o444))
	}
	must(t, filepath.Walk(home, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, userUID, userUID)
	}))
	for _, m := range []string{mntA, mntB} {
		t.Cleanup(func() {
			// The user's mounts are theirs alone: root cannot even stat them.
			exec.Command("fusermount3", "-u", "-z", m).Run()
			unix.Unmount(m, unix.MNT_DETACH)
		})
	}
	env := w.env()
	asUser(t, home, nil, binary, "mount", "--base", baseA, "--store", filepath.Join(home, "storeA"), mntA)
	asUser(t, home, nil, binary, "mount", "--base", baseB, "--store", filepath.Join(home, "storeB"), mntB)
	asUser(t, home, nil, binary, "create", "work", mntA)
	v := filepath.Join(mntA, "@work")
	asUser(t, home, nil, "sh", "-c", `cd "$0" && mkdir -p d/e && echo one > d/e/f && chmod 640 d/e/f &&
		head -c 3000000 /dev/urandom > big && setfattr -n user.k -v big big && chmod 400 big &&
		echo ro > ro && setfattr -n user.k -v ro ro && chmod 444 ro && chmod 500 d/e &&
		touch -d 2001-02-03 ro && chmod 644 robase && setfattr -n user.k -v robase robase && chmod 444 robase`, v)
	asUser(t, home, env, binary, "push", v, "s3://"+bucket+"/work")
	asUser(t, home, env, binary, "pull", "s3://"+bucket+"/work", mntB)
	// Only the user sees the user's mounts.
	list := `cd "$0" && find . ! -name . ! -type d -printf '%p %y %m %U:%G %s %T@\n' | sort &&
		find . ! -name . -type d -printf '%p %m %U:%G\n' | sort && find . -type f | sort | xargs sha256sum &&
		find . ! -name . | sort | xargs getfattr -h -d -m user.`
	want := asUser(t, home, nil, "sh", "-c", list, v)
	got := asUser(t, home, nil, "sh", "-c", list, filepath.Join(mntB, "@work"))
	for _, w := range []string{"./ro f 444 65534:65534 3 981158400.", "./big f 400", "./d/e 500", "user.k=\"ro\"", "user.k=\"big\"", "user.k=\"robase\""} {
		if !strings.Contains(want, w) {
			t.Fatalf("the branch on the first mount does not show %q:\n%s", w, want)
		}
	}
	if got != want {
		t.Errorf("the pulled branch shows\n%s\nthe pushed one\n%s", got, want)
	}
}
