package explore

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// When the runner and its janitor are both killed, the daemon itself ends
// the run at once: the branch is aborted and main writable again, with no
// branchfs command run since (the record is still there for a reaper). A
// branch the run was given stays.
func TestDaemonEndsOrphanedRun(t *testing.T) {
	tm := mountT(t)
	tok := token(t)
	for _, args := range [][]string{{tm.mnt}, {"--branch", "given", tm.mnt}} {
		if args[0] == "--branch" {
			_, err := tm.Create("", "given")
			must(t, err)
		}
		ready := filepath.Join(t.TempDir(), "ready")
		cmd := exec.Command(binary, append(append([]string{"run"}, args...), "--", "sh", "-c", daemon(tok, ready)+"; sleep 1000")...)
		cmd.Dir = tm.mnt
		must(t, cmd.Start())
		eventually(t, "the run", func() bool { _, err := os.Stat(ready); return err == nil })
		pid := cmd.Process.Pid
		var name string
		for _, b := range listNames(t, tm) {
			if strings.HasPrefix(b, "run-"+strconv.Itoa(pid)+"-") {
				name = b
			}
		}
		janitors := janitorsOf(pid)
		if len(janitors) != 1 {
			t.Fatalf("janitors of %d: %v", pid, janitors)
		}
		j, _ := strconv.Atoi(janitors[0])
		must(t, syscall.Kill(j, syscall.SIGKILL))
		must(t, syscall.Kill(pid, syscall.SIGKILL))
		cmd.Wait()
		eventually(t, "the run's end", func() bool {
			if len(withToken(tok)) > 0 {
				return false
			}
			for _, b := range listNames(t, tm) {
				if b == name && name != "" {
					return false
				}
			}
			return true
		})
		if name == "" && !contains(listNames(t, tm), "given") {
			t.Error("the given branch was aborted")
		}
		if name != "" {
			// main writes again.
			must(t, os.WriteFile(filepath.Join(tm.mnt, "after"), []byte("x"), 0o644))
		}
		dir, _ := recordsDir()
		ents, _ := os.ReadDir(dir)
		found := false
		for _, e := range ents {
			found = found || strings.HasPrefix(e.Name(), strconv.Itoa(pid)+"-")
		}
		if !found {
			t.Log("a reaper ran meanwhile: the daemon's part is not shown")
		}
		must(t, Reap())
	}
	must(t, tm.Abort("given", false))
	tm.noneLeft(t, tok)
}
