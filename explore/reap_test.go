package explore

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// TestPlantedRecords: records that someone else planted for a user (uid
// 1000, a member of root's mount's control group, without
// XDG_RUNTIME_DIR) make the user's next branchfs command neither abort
// the user's branch nor kill the cgroup they name (one the user may
// kill). The attacker (uid 65534) makes the predictable
// $TMPDIR/branchfs-1000/runs first, writable by all, and plants there;
// the user's run then refuses that directory and says why. A record in
// the user's own directory that the user does not own is ignored, and one
// that names a cgroup that is no run's is dropped.
func TestPlantedRecords(t *testing.T) {
	const victim = 1000
	tmp := t.TempDir() // the victim's $TMPDIR: a shared place, as /tmp
	must(t, unix.Chmod(tmp, 0o1777))
	must(t, os.Chmod(filepath.Dir(tmp), 0o755))
	dir, err := os.MkdirTemp("", "explore-test")
	must(t, err)
	base, mnt := filepath.Join(dir, "base"), filepath.Join(dir, "mnt")
	must(t, os.MkdirAll(base, 0o755))
	must(t, os.MkdirAll(mnt, 0o755))
	must(t, os.Chmod(dir, 0o755))
	if out, err := exec.Command(binary, "mount", "--base", base, "--store", filepath.Join(dir, "store"),
		"--control-group", fmt.Sprint(victim), mnt).CombinedOutput(); err != nil {
		t.Fatalf("mount: %v: %s", err, out)
	}
	t.Cleanup(func() { unmountLater(mnt, dir) })
	as := func(uid int, args ...string) (string, error) {
		cmd := exec.Command("setpriv", append([]string{fmt.Sprintf("--reuid=%d", uid), fmt.Sprintf("--regid=%d", uid),
			fmt.Sprintf("--groups=%d", uid), "--"}, args...)...)
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + tmp, "TMPDIR=" + tmp}
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	if out, err := as(victim, binary, "create", "work", mnt); err != nil {
		t.Fatalf("create as the victim: %v: %s", err, out)
	}

	// A cgroup of root's that the victim may kill, and a process in it.
	cgMount, err := cgroup2Mount()
	if err != nil {
		t.Skip(err)
	}
	cg := filepath.Join(cgMount, fmt.Sprintf("branchfs-test-%d", os.Getpid()))
	must(t, os.Mkdir(cg, 0o755))
	t.Cleanup(func() { killCgroup(cg) })
	for _, f := range []string{".", "cgroup.kill", "cgroup.freeze", "cgroup.procs"} {
		must(t, os.Chown(filepath.Join(cg, f), victim, victim))
	}
	cgFd, err := os.Open(cg)
	must(t, err)
	defer cgFd.Close()
	sleeper := exec.Command("sleep", "1000")
	sleeper.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(cgFd.Fd())}
	must(t, sleeper.Start())
	exited := make(chan struct{})
	go func() { sleeper.Wait(); close(exited) }()
	t.Cleanup(func() { sleeper.Process.Kill() })

	// A record of a run whose owner is gone.
	dead := exec.Command("true")
	must(t, dead.Run())
	rec := func(cgroup string) []byte {
		data, err := json.Marshal(&record{Owner: dead.Process.Pid, OwnerStart: 1, OwnerPIDNS: selfPIDNS(),
			Mount: mnt, Branch: "work", Created: true, Cgroup: cgroup})
		must(t, err)
		return data
	}
	check := func(when string) {
		t.Helper()
		if out, err := as(victim, binary, "list", mnt); err != nil || !strings.Contains(out, "work") {
			t.Errorf("%s: the victim's list: %v: %s", when, err, out)
		}
		select {
		case <-exited:
			t.Fatalf("%s: the victim's branchfs killed the cgroup a record named", when)
		default:
		}
		list, err := exec.Command(binary, "list", mnt).CombinedOutput()
		if err != nil || !strings.Contains(string(list), "work") {
			t.Fatalf("%s: the victim's branch is gone: %v: %s", when, err, list)
		}
	}

	attackerRuns := filepath.Join(tmp, fmt.Sprintf("branchfs-%d", victim), "runs")
	script := `mkdir -p -m 777 "$1" && chmod 777 "$(dirname "$1")" && cat > "$1/planted.json"`
	cmd := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "sh", "-c", script, "sh", attackerRuns)
	cmd.Stdin = strings.NewReader(string(rec(cg)))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the attacker's script: %v: %s", err, out)
	}
	check("planted in the attacker's directory")
	out, err := as(victim, binary, "run", mnt, "--", "true")
	if want := filepath.Dir(attackerRuns) + " is owned by uid 65534, not by root or you"; err == nil || !strings.Contains(out, want) {
		t.Errorf("the victim's run beside the attacker's records: %v: %s, want %q", err, out, want)
	}

	// The victim's own directory (the attacker's gone): a record of
	// someone else's in it, and one of the victim's that names a cgroup
	// no run made.
	must(t, os.RemoveAll(filepath.Dir(attackerRuns)))
	if out, err := as(victim, binary, "run", mnt, "--", "true"); err != nil {
		t.Fatalf("the victim's run: %v: %s", err, out)
	}
	for name, uid := range map[string]int{"theirs.json": 65534, "bad-cgroup.json": victim} {
		p := filepath.Join(attackerRuns, name)
		must(t, os.WriteFile(p, rec(cg), 0o600))
		must(t, os.Chown(p, uid, uid))
	}
	check("in the victim's own directory")
	if _, err := os.Stat(filepath.Join(attackerRuns, "bad-cgroup.json")); err == nil {
		t.Errorf("the record that names a cgroup no run made was kept")
	}
}
