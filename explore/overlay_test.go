package explore

import (
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

	"golang.org/x/sys/unix"
)

// waitFor is a shell loop that waits for file p.
func waitFor(p string) string { return "until [ -e " + p + " ]; do sleep 0.01; done" }

// A kernel-path run sees the branch through overlayfs at MNT and the
// base's path; while it runs, the branch's view refuses writes and the
// branch can be neither branched nor committed; once it ends the view
// shows what it wrote (also what the view had cached meanwhile) and takes
// writes again.
func TestKernelPathHoldsBranch(t *testing.T) {
	tm := mountT(t)
	dir := t.TempDir()
	started, proceed := filepath.Join(dir, "started"), filepath.Join(dir, "go")
	script := `set -e
grep -q " ` + tm.mnt + ` rw,[^ ]* - overlay " /proc/self/mountinfo
grep -q " ` + tm.base + ` rw,[^ ]* - overlay " /proc/self/mountinfo
echo one > new; rm file; echo b >> ` + tm.base + `/dir/a
touch ` + started + `; ` + waitFor(proceed) + `
echo two >> new`
	p, err := tm.Start(context.Background(), Spec{Args: sh(script), Dir: tm.mnt, DataPath: DataPathKernel})
	must(t, err)
	eventually(t, "the run to start", func() bool { _, err := os.Stat(started); return err == nil })
	view := tm.View(p.Branch())
	if got := readFile(t, filepath.Join(view, "dir", "a")); got != "a\n" && got != "a\nb\n" {
		t.Errorf("view reads dir/a = %q", got)
	}
	if err := os.WriteFile(filepath.Join(view, "x"), nil, 0o644); !errors.Is(err, syscall.EROFS) {
		t.Errorf("write to the held view: %v, want EROFS", err)
	}
	if info, err := tm.Info(p.Branch()); err != nil || !info.Held {
		t.Errorf("info %+v, %v: want held", info, err)
	}
	if _, err := tm.Create(p.Branch(), "kid"); !errors.Is(err, syscall.EBUSY) {
		t.Errorf("create a child of the held branch: %v, want EBUSY", err)
	}
	if err := tm.Commit(p.Branch()); !errors.Is(err, syscall.EBUSY) {
		t.Errorf("commit of the held branch: %v, want EBUSY", err)
	}
	must(t, os.WriteFile(proceed, nil, 0o644))
	r := p.Wait()
	if !r.Success() || r.DataPath != DataPathKernel || r.Fallback != "" {
		t.Fatalf("result %+v", r)
	}
	if got := readFile(t, filepath.Join(view, "new")); got != "one\ntwo\n" {
		t.Errorf("view reads new = %q after the run", got)
	}
	if got := readFile(t, filepath.Join(view, "dir", "a")); got != "a\nb\n" {
		t.Errorf("view reads dir/a = %q after the run", got)
	}
	if _, err := os.Stat(filepath.Join(view, "file")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("view shows file, which the run removed: %v", err)
	}
	must(t, os.WriteFile(filepath.Join(view, "x"), []byte("x"), 0o644))
	if info, err := tm.Info(p.Branch()); err != nil || info.Held {
		t.Errorf("info %+v, %v after the run", info, err)
	}
	must(t, p.Commit())
	if got := readFile(t, filepath.Join(tm.base, "new")); got != "one\ntwo\n" {
		t.Errorf("base new = %q", got)
	}
	if _, err := os.Stat(filepath.Join(tm.base, "file")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("base still has file: %v", err)
	}
	tm.noneLeft(t, token(t))
	// The work directory goes with the branch's data, to the trash.
	eventually(t, "the branch's data to go", func() bool {
		_, err := os.Stat(filepath.Join(tm.store, "branches", p.Branch()))
		return errors.Is(err, os.ErrNotExist)
	})
}

// A sibling's commit makes a kernel-path run's branch stale: the daemon
// ends all of the run's processes, and the run reports stale, exit 3, as
// the CLI's exit status too.
func TestKernelPathStaleSibling(t *testing.T) {
	tm := mountT(t)
	tok := token(t)
	ready := filepath.Join(t.TempDir(), "ready")
	loser, err := tm.Start(context.Background(), Spec{Args: sh(daemon(tok, ready) + "; sleep 1000"), DataPath: DataPathKernel})
	must(t, err)
	eventually(t, "the loser to start", func() bool { _, err := os.Stat(ready); return err == nil })
	if w, err := tm.Run(context.Background(), Spec{Args: sh("echo won > file")}); err != nil || !w.Committed {
		t.Fatalf("winner: %+v, %v", w, err)
	}
	r, err := loser.Finish("", "")
	if err != nil || !r.Stale || r.Status() != 3 || !r.Aborted {
		t.Errorf("loser %+v (status %d), %v", r, r.Status(), err)
	}
	tm.noneLeft(t, tok)

	// The CLI: the loser in the background, the winner committing.
	cliReady := filepath.Join(t.TempDir(), "cli-ready")
	cmd := exec.Command(binary, "run", "--data-path", "kernel", tm.mnt, "--", "sh", "-c", daemon(tok, cliReady)+"; sleep 1000")
	must(t, cmd.Start())
	eventually(t, "the CLI's run to start", func() bool { _, err := os.Stat(cliReady); return err == nil })
	out, err := exec.Command(binary, "run", tm.mnt, "--", "sh", "-c", "echo again > file").CombinedOutput()
	if err != nil {
		t.Fatalf("winner: %v: %s", err, out)
	}
	var ee *exec.ExitError
	if err := cmd.Wait(); !errors.As(err, &ee) || ee.ExitCode() != 3 {
		t.Errorf("the stale run exited %v, want status 3", err)
	}
	tm.noneLeft(t, tok)
}

// kill -9 of the daemon during a kernel-path run: the run goes on and
// writes, its branch stays in the store, and after a new mount its writes
// are there to commit.
func TestKernelPathDaemonKilled(t *testing.T) {
	tm := mountT(t)
	dir := t.TempDir()
	started, proceed := filepath.Join(dir, "started"), filepath.Join(dir, "go")
	p, err := tm.Start(context.Background(), Spec{
		Args: sh("echo before > one; touch " + started + "; " + waitFor(proceed) + "; echo after > two; rm file"),
		Dir:  tm.mnt, DataPath: DataPathKernel})
	must(t, err)
	eventually(t, "the run to start", func() bool { _, err := os.Stat(started); return err == nil })
	pid, err := strconv.Atoi(strings.TrimSpace(readFile(t, filepath.Join(tm.store, "daemon.pid"))))
	must(t, err)
	must(t, syscall.Kill(pid, syscall.SIGKILL))
	eventually(t, "the daemon to die", func() bool { return syscall.Kill(pid, 0) != nil })
	must(t, os.WriteFile(proceed, nil, 0o644))
	r, err := p.Finish("", "")
	if !r.Success() || err == nil || !strings.Contains(err.Error(), "stays in the store") {
		t.Fatalf("result %+v, %v", r, err)
	}
	unix.Unmount(tm.mnt, unix.MNT_DETACH)
	if out, err := exec.Command(binary, "mount", "--base", tm.base, "--store", tm.store, tm.mnt).CombinedOutput(); err != nil {
		t.Fatalf("mount again: %v: %s", err, out)
	}
	m, err := Open(tm.mnt)
	must(t, err)
	if got := readFile(t, filepath.Join(m.View(p.Branch()), "two")); got != "after\n" {
		t.Errorf("the branch's two = %q after the new mount", got)
	}
	must(t, m.Commit(p.Branch()))
	for name, want := range map[string]string{"one": "before\n", "two": "after\n"} {
		if got := readFile(t, filepath.Join(tm.base, name)); got != want {
			t.Errorf("base %s = %q", name, got)
		}
	}
	if _, err := os.Stat(filepath.Join(tm.base, "file")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("base still has file: %v", err)
	}
}

// Where overlayfs cannot serve (here a store without user xattrs, which
// could not hold its opaque markers), auto takes the FUSE path and says
// why; kernel fails and changes nothing.
func TestKernelPathFallback(t *testing.T) {
	dir := t.TempDir()
	must(t, unix.Mount("ramfs", dir, "ramfs", 0, "mode=755"))
	defer unix.Unmount(dir, unix.MNT_DETACH)
	base, store, mnt := filepath.Join(dir, "base"), filepath.Join(t.TempDir(), "store"), filepath.Join(t.TempDir(), "mnt")
	must(t, os.MkdirAll(base, 0o755))
	must(t, os.MkdirAll(mnt, 0o755))
	must(t, unix.Mount("ramfs", filepath.Dir(store), "ramfs", 0, "mode=755"))
	defer unix.Unmount(filepath.Dir(store), unix.MNT_DETACH)
	if out, err := exec.Command(binary, "mount", "--base", base, "--store", store, mnt).CombinedOutput(); err != nil {
		t.Fatalf("mount: %v: %s", err, out)
	}
	defer exec.Command(binary, "unmount", mnt).Run()
	m, err := Open(mnt)
	must(t, err)
	r, err := m.Run(context.Background(), Spec{Args: sh("echo x > " + mnt + "/f")})
	if err != nil || !r.Committed || r.DataPath != DataPathFUSE || !strings.Contains(r.Fallback, "markers") {
		t.Errorf("auto: %+v, %v", r, err)
	}
	if got := readFile(t, filepath.Join(base, "f")); got != "x\n" {
		t.Errorf("base f = %q", got)
	}
	r, err = m.Run(context.Background(), Spec{Args: sh("echo y > " + mnt + "/f"), DataPath: DataPathKernel})
	if err != nil || r.Success() || !strings.Contains(r.Error, "kernel path") || !r.Aborted {
		t.Errorf("kernel: %+v, %v", r, err)
	}
	if got := readFile(t, filepath.Join(base, "f")); got != "x\n" {
		t.Errorf("base f = %q after the failed kernel-path run", got)
	}
	data, _ := json.Marshal(r)
	t.Logf("record: %s", data)
}

// An ordinary user's kernel-path run: overlayfs in the run's user
// namespace. The run commits; a stale sibling's run exits 3 and leaves no
// process; with the daemon killed under it, a run goes on, and what it
// wrote is committed after a new mount.
func TestKernelPathUnprivileged(t *testing.T) {
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
	quote := func(s string) string { return "'" + strings.ReplaceAll(s, "'", `'"'"'`) + "'" }
	script := `set -e; mkdir -p base/d mnt xdg; echo base > base/f; echo a > base/d/a
B=` + binary + `
$B mount --base base mnt
$B run --json --data-path kernel mnt -- sh -c 'cd mnt; echo x > f; rm d/a; mkdir d/n' > out
$B run --data-path kernel mnt -- sh -c ` + quote(daemon(tok, dir+"/ready")+"; sleep 1000") + ` & loser=$!
until [ -e ready ]; do sleep 0.01; done
$B run mnt -- sh -c 'echo y > mnt/f'
status=0; wait $loser || status=$?
echo "loser $status"
cat base/f; ls base/d
$B create kb mnt >/dev/null
$B run --data-path kernel --branch kb mnt -- sh -c 'echo 1 > mnt/k1; touch started; until [ -e proceed ]; do sleep 0.01; done; echo 2 > mnt/k2' > kout 2>&1 & r=$!
until [ -e started ]; do sleep 0.01; done
pid=$(cat .local/state/branchfs/*/daemon.pid)
kill -9 $pid
while kill -0 $pid 2>/dev/null; do sleep 0.01; done
touch proceed
status=0; wait $r || status=$?
grep -q "stays in the store" kout
fusermount3 -u -z mnt
$B mount --base base mnt
$B commit mnt/@kb
cat base/k1 base/k2
$B unmount mnt`
	cmd := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "sh", "-c", script)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "HOME="+dir, "XDG_RUNTIME_DIR="+dir+"/xdg")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	var res Result
	must(t, json.Unmarshal([]byte(readFile(t, dir+"/out")), &res))
	if !res.Committed || res.DataPath != DataPathKernel {
		t.Errorf("record %+v; output %s", res, out)
	}
	if !strings.HasSuffix(string(out), "loser 3\ny\nn\n1\n2\n") {
		t.Errorf("output %s", out)
	}
	if p := withToken(tok); len(p) > 0 {
		t.Errorf("processes left: %q", p)
	}
}
