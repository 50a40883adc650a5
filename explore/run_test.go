package explore

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/branchfs/branchfs/ctl"
)

// A command that writes at the workspace's usual path (the mount point,
// the base directory, a --bind path, or relative to a working directory
// inside the mount) writes into its branch, not the base.
func TestRunWritesAtUsualPath(t *testing.T) {
	tm := mountT(t)
	extra := t.TempDir() // where some tool sees the workspace
	var out bytes.Buffer
	res, err := tm.Run(context.Background(), Spec{
		Args:      sh(`echo new > ` + tm.mnt + `/file; echo b > ` + tm.base + `/dir/b; echo e > ` + extra + `/e; echo rel > c; pwd; echo $BRANCHFS_BRANCH $BRANCHFS_INDEX $BRANCHFS_VIEW`),
		Dir:       filepath.Join(tm.mnt, "dir"),
		Binds:     []string{extra},
		Stdout:    &out,
		OnSuccess: Keep,
	})
	must(t, err)
	if !res.Success() || res.Outcome != Keep || res.Containment != ContainCgroup {
		t.Fatalf("result %+v", res)
	}
	view := tm.View(res.Branch)
	if got, want := out.String(), filepath.Join(tm.mnt, "dir")+"\n"+res.Branch+" 0 "+tm.mnt+"\n"; got != want {
		t.Errorf("output %q, want %q", got, want)
	}
	for p, want := range map[string]string{"file": "new\n", "dir/b": "b\n", "dir/c": "rel\n", "e": "e\n"} {
		if got := readFile(t, filepath.Join(view, p)); got != want {
			t.Errorf("branch %s = %q, want %q", p, got, want)
		}
	}
	if got := readFile(t, filepath.Join(tm.base, "file")); got != "base\n" {
		t.Errorf("base file = %q: the run wrote to the base", got)
	}
	for _, p := range []string{filepath.Join(tm.base, "dir/b"), filepath.Join(tm.base, "dir/c"), filepath.Join(extra, "e")} {
		if _, err := os.Stat(p); err == nil {
			t.Errorf("%s exists: the run wrote past its branch", p)
		}
	}
	if res.DeltaFiles == 0 || res.DeltaBytes == 0 {
		t.Errorf("delta %d files, %d bytes", res.DeltaFiles, res.DeltaBytes)
	}
	// A working directory in the branch's own view is the same place.
	out.Reset()
	_, err = tm.Run(context.Background(), Spec{Args: sh("pwd; cat c"), Dir: filepath.Join(view, "dir"), Branch: res.Branch, Stdout: &out, OnSuccess: Keep})
	must(t, err)
	if got, want := out.String(), filepath.Join(tm.mnt, "dir")+"\nrel\n"; got != want {
		t.Errorf("in the view: output %q, want %q", got, want)
	}
	// Committing puts it all in the base.
	must(t, tm.Commit(res.Branch))
	if got := readFile(t, filepath.Join(tm.base, "dir", "c")); got != "rel\n" {
		t.Errorf("after commit: base dir/c = %q", got)
	}
	tm.noneLeft(t, token(t))
}

// A grandchild that setsid()s and double-forks is gone once the run ends,
// whether its branch is committed or aborted, and so are the cgroup, the
// record and the branch.
func TestDaemonGoneAfterRun(t *testing.T) {
	tm := mountT(t)
	tok := token(t)
	for _, code := range []int{0, 1} {
		ready := filepath.Join(t.TempDir(), "ready")
		res, err := tm.Run(context.Background(), Spec{Args: sh(daemon(tok, ready) + "; exit " + strconv.Itoa(code))})
		must(t, err)
		if _, err := os.Stat(ready); err != nil {
			t.Fatalf("the daemon did not start: %v", err)
		}
		if res.ExitCode != code || (code == 0) != res.Committed || (code != 0) != res.Aborted {
			t.Errorf("exit %d: result %+v", code, res)
		}
		tm.noneLeft(t, tok)
	}
}

// A timeout ends the whole tree, daemon included, and says so.
func TestTimeoutEndsTree(t *testing.T) {
	tm := mountT(t)
	tok := token(t)
	// The timeout must fall after the daemon started: on a loaded
	// machine, try again with a longer one.
	for d := 300 * time.Millisecond; ; d *= 2 {
		ready := filepath.Join(t.TempDir(), "ready")
		res, err := tm.Run(context.Background(), Spec{Args: sh(daemon(tok, ready) + "; sleep 1000"), Timeout: d})
		must(t, err)
		if !res.TimedOut || res.Status() != 124 || !res.Aborted {
			t.Errorf("result %+v, status %d", res, res.Status())
		}
		tm.noneLeft(t, tok)
		if _, err := os.Stat(ready); err == nil {
			break
		}
		if d > 10*time.Second {
			t.Fatal("the daemon did not start in 10 s")
		}
	}
}

// Siblings run in separate PID namespaces: one cannot signal the other.
func TestSiblingsCannotSignal(t *testing.T) {
	tm := mountT(t)
	tok := token(t)
	dir := t.TempDir()
	victim, err := tm.Start(context.Background(), Spec{Args: sh("touch " + dir + "/up; sleep 1000; : " + tok)})
	must(t, err)
	eventually(t, "the victim to start", func() bool { return len(withToken(tok)) > 0 })
	// Its process ID as this process sees it, and as it sees itself.
	pid := strings.SplitN(withToken(tok)[0], ":", 2)[0]
	var out bytes.Buffer
	// Kept, not committed: a commit would make the victim stale, and the
	// daemon would end a kernel-path victim for that.
	res, err := tm.Run(context.Background(), Spec{
		Args:   sh("kill -9 " + pid + " 2>/dev/null || echo refused; test -e /proc/" + pid + " || echo unseen"),
		Stdout: &out, Stderr: &out, OnSuccess: Keep,
	})
	must(t, err)
	must(t, tm.Abort(res.Branch, true))
	select {
	case <-victim.Done():
		t.Fatalf("the sibling killed the victim: %s", out.String())
	default:
	}
	if len(withToken(tok)) == 0 {
		t.Fatalf("victim gone: %s", out.String())
	}
	if out.String() != "refused\nunseen\n" || !res.Success() {
		t.Errorf("attacker: %q, %+v", out.String(), res)
	}
	victim.Kill()
	must(t, victim.Abort())
	tm.noneLeft(t, tok)
}

// A run's branch can be kept, and an existing branch run in again; bad
// input changes nothing.
func TestRunBadInput(t *testing.T) {
	tm := mountT(t)
	ctx := context.Background()
	for _, spec := range []Spec{
		{},
		{Args: []string{"true"}, Branch: "nosuch"},
		{Args: []string{"true"}, Branch: "main"},
		{Args: []string{"true"}, Branch: "x", Parent: "y"},
		{Args: []string{"true"}, Name: "bad/name"},
		{Args: []string{"true"}, Parent: "nosuch"},
		{Args: []string{"true"}, Binds: []string{"/nonexistent"}},
		{Args: []string{""}},
		{Args: []string{"true"}, OnSuccess: Abort},
		{Args: []string{"true"}, OnFailure: Commit},
		{Args: []string{"true"}, OnSuccess: "later"},
		{Args: []string{"true"}, Timeout: -time.Second},
		{Args: []string{"true"}, LastPID: -1},
	} {
		if res, err := tm.Run(ctx, spec); err == nil {
			t.Errorf("%+v: no error, result %+v", spec, res)
		}
	}
	// A command that cannot start is a failure, with the reason.
	res, err := tm.Run(ctx, Spec{Args: []string{"/nonexistent/cmd"}})
	must(t, err)
	if res.Success() || res.Status() != 127 || !strings.Contains(res.Error, "nonexistent") || !res.Aborted {
		t.Errorf("missing command: %+v", res)
	}
	tm.noneLeft(t, token(t))
}

// Ctrl-C and kill -9 of `branchfs run` leave nothing behind: no process,
// cgroup, record or branch.
func TestInterruptedRunLeavesNothing(t *testing.T) {
	tm := mountT(t)
	tok := token(t)
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGKILL} {
		ready := filepath.Join(t.TempDir(), "ready")
		cmd := exec.Command(binary, "run", tm.mnt, "--", "sh", "-c", daemon(tok, ready)+"; sleep 1000")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		must(t, cmd.Start())
		eventually(t, "the daemon", func() bool { _, err := os.Stat(ready); return err == nil })
		cmd.Process.Signal(sig)
		err := cmd.Wait()
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			t.Fatalf("%v: %v", sig, err)
		}
		if sig == syscall.SIGINT && ee.ExitCode() != 130 {
			t.Errorf("SIGINT: exit %d, want 130: %s", ee.ExitCode(), stderr.String())
		}
		pid := cmd.Process.Pid
		// After SIGKILL the janitor cleans up, once it sees the run gone.
		eventually(t, "nothing left", func() bool {
			if len(withToken(tok)) > 0 {
				return false
			}
			ents, _ := os.ReadDir(recordsPath())
			for _, e := range ents {
				if strings.HasPrefix(e.Name(), strconv.Itoa(pid)+"-") {
					return false
				}
			}
			list, err := tm.List()
			return err == nil && len(list) == 1
		})
		if root, err := cgroupRoot(); err == nil {
			ents, _ := os.ReadDir(filepath.Join(root, cgroupsDir))
			for _, e := range ents {
				if strings.Contains(e.Name(), "-"+strconv.Itoa(pid)+"-") {
					t.Errorf("%v: cgroup left: %s", sig, e.Name())
				}
			}
		}
	}
}

// Where no cgroup can be made, the PID namespace alone ends the tree, and
// the result says so.
func TestPIDNamespaceFallback(t *testing.T) {
	tm := mountT(t)
	saved := cgroupRoot
	cgroupRoot = func() (string, error) { return "", errors.New("test: no cgroups") }
	defer func() { cgroupRoot = saved }()
	tok := token(t)
	ready := filepath.Join(t.TempDir(), "ready")
	res, err := tm.Run(context.Background(), Spec{Args: sh(daemon(tok, ready) + "; exit 1")})
	must(t, err)
	if res.Containment != ContainPIDNS || !strings.Contains(res.NoCgroup, "no cgroups") || !res.Aborted {
		t.Errorf("result %+v", res)
	}
	tm.noneLeft(t, tok)
}

// The CLI prints the run's record with --json, and exits with the
// command's status.
func TestRunCLI(t *testing.T) {
	tm := mountT(t)
	cmd := exec.Command(binary, "run", "--json", "--on-failure", "keep", tm.mnt, "--", "sh", "-c", "echo out; echo x > "+tm.mnt+"/new; exit 7")
	cmd.Dir = tm.mnt
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 7 {
		t.Fatalf("exit: %v: %s", err, stderr.String())
	}
	// Its janitor is gone when it has exited.
	if j := janitorsOf(cmd.Process.Pid); len(j) > 0 {
		t.Errorf("janitor left: %v", j)
	}
	var res Result
	must(t, json.Unmarshal(stdout.Bytes(), &res))
	if res.ExitCode != 7 || res.Outcome != Keep || res.DeltaFiles != 1 || res.Containment != ContainCgroup || stderr.String() != "out\n" {
		t.Errorf("record %s, stderr %q", stdout.String(), stderr.String())
	}
	if got := readFile(t, filepath.Join(tm.View(res.Branch), "new")); got != "x\n" {
		t.Errorf("kept branch: new = %q", got)
	}
	for _, args := range [][]string{
		{"run", tm.mnt},
		{"run", tm.mnt, "true"},
		{"run", "--on-success", "abort", tm.mnt, "--", "true"},
		{"run", "--branch", "x", "--parent", "y", tm.mnt, "--", "true"},
		{"run", "/", "--", "true"},
		{"run", tm.View(res.Branch), "--", "true"},
	} {
		out, err := exec.Command(binary, args...).CombinedOutput()
		if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.HasPrefix(string(out), "branchfs: run: ") {
			t.Errorf("%q: %v: %s", args, err, out)
		}
	}
	must(t, tm.Abort(res.Branch, false))
	tm.noneLeft(t, token(t))
}

// An ordinary user's run gets its namespaces in a user namespace: the
// view is bound over the workspace path, and the command holds no
// capability. No daemon mounts as an ordinary user here, so the view is
// a plain directory; the test runs itself again as nobody for this.
func TestUserNamespace(t *testing.T) {
	if os.Getenv("BRANCHFS_TEST_USERNS") == "" {
		if out, err := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "unshare", "--user", "true").CombinedOutput(); err != nil {
			t.Skipf("this kernel gives an ordinary user no user namespace: %v: %s", err, out)
		}
		dir := t.TempDir()
		must(t, os.Chmod(dir, 0o777))
		must(t, os.Chmod(filepath.Dir(dir), 0o755))
		self, err := os.Executable()
		must(t, err)
		exe := filepath.Join(dir, "explore.test")
		data, err := os.ReadFile(self)
		must(t, err)
		must(t, os.WriteFile(exe, data, 0o755))
		cmd := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", exe, "-test.run=^TestUserNamespace$", "-test.v")
		cmd.Env = append(os.Environ(), "BRANCHFS_TEST_USERNS="+dir, "XDG_RUNTIME_DIR="+dir)
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "--- PASS: TestUserNamespace") {
			t.Fatalf("as nobody: %v\n%s", err, out)
		}
		return
	}
	dir := os.Getenv("BRANCHFS_TEST_USERNS")
	ws, view := filepath.Join(dir, "ws"), filepath.Join(dir, "ws", "@b")
	must(t, os.MkdirAll(view, 0o755))
	must(t, os.WriteFile(filepath.Join(view, "f"), []byte("view\n"), 0o644))
	var out bytes.Buffer
	p := newProc(&Mount{Mount: ctl.Assume(ws)}, Spec{Args: sh("cat f; grep CapEff /proc/self/status; id -u"), Stdout: &out, Stderr: &out}, "b")
	must(t, p.startHelper(ws, nil))
	p.release()
	go p.wait(context.Background())
	res := p.Wait()
	if want := "view\nCapEff:\t0000000000000000\n65534\n"; out.String() != want || !res.Success() {
		t.Errorf("output %q, want %q; %+v", out.String(), want, res)
	}
}

// An ordinary user mounts (through fusermount3) and runs: the processes
// are held by a PID namespace in a user namespace, since the cgroup
// hierarchy is root's, and the output says so; nothing is left.
func TestUnprivilegedRun(t *testing.T) {
	if _, err := exec.LookPath("fusermount3"); err != nil {
		t.Skip("no fusermount3")
	}
	if out, err := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "unshare", "--user", "true").CombinedOutput(); err != nil {
		t.Skipf("this kernel gives an ordinary user no user namespace: %v: %s", err, out)
	}
	dir := t.TempDir()
	must(t, os.Chmod(dir, 0o755))
	must(t, os.Chmod(filepath.Dir(dir), 0o755))
	must(t, os.Chown(dir, 65534, 65534))
	tok := token(t)
	script := `set -e; mkdir -p base mnt xdg; echo base > base/f
` + binary + ` mount --base base mnt
` + binary + ` run --json mnt -- sh -c '` + strings.ReplaceAll(daemon(tok, dir+"/ready"), "'", `'"'"'`) + `; echo x > ` + dir + `/base/f' > out || true
cat base/f
` + binary + ` speculate -c true mnt > spec.out 2>&1 || true
` + binary + ` run --memory 64M mnt -- true > limit.out 2>&1 || true
` + binary + ` unmount mnt`
	cmd := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "sh", "-c", script)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "HOME="+dir, "XDG_RUNTIME_DIR="+dir+"/xdg")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	var res Result
	must(t, json.Unmarshal([]byte(readFile(t, dir+"/out")), &res))
	if !res.Committed || res.Containment != ContainPIDNS || !strings.Contains(string(out), "processes held by a pid namespace only") || !strings.HasSuffix(string(out), "x\n") {
		t.Errorf("record %+v; output %s", res, out)
	}
	if got := readFile(t, dir+"/limit.out"); !strings.Contains(got, "branchfs: run: limits (memory 64M) cannot be enforced: ") {
		t.Errorf("run --memory as nobody: %s", got)
	}
	if got := readFile(t, dir+"/spec.out"); !strings.Contains(got, "branchfs: speculate: processes held by a pid namespace only") || !strings.Contains(got, "winner: 0") {
		t.Errorf("speculate as nobody: %s", got)
	}
	if p := withToken(tok); len(p) > 0 {
		t.Errorf("processes left: %q", p)
	}
}

// janitorsOf lists the janitor processes of owner.
func janitorsOf(owner int) []string {
	var found []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		env, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err == nil && bytes.Contains(env, []byte(envJanitor+"="+strconv.Itoa(owner)+"\x00")) {
			found = append(found, e.Name())
		}
	}
	return found
}
