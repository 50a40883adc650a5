package explore

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// envHog makes this test binary a candidate that takes memory: as many
// MiB as it says, touched page by page, then waits to be killed.
const envHog = "BRANCHFS_TEST_HOG"

func hog(mb string) {
	n, _ := strconv.Atoi(mb)
	var keep [][]byte
	for i := 0; i < n; i++ {
		b := make([]byte, 1<<20)
		for j := 0; j < len(b); j += 4096 {
			b[j] = 1
		}
		keep = append(keep, b)
	}
	fmt.Println("hog: holding", len(keep), "MiB")
	for {
		time.Sleep(time.Hour)
	}
}

// hogCmd is a command that takes mb MiB of memory.
func hogCmd(mb int) []string {
	self, _ := os.Executable()
	return []string{"env", envHog + "=" + strconv.Itoa(mb), self}
}

// controllersHere reports whether the runner's cgroup has the memory,
// pids and cpu controllers: in the QEMU guest, and where a hierarchy
// delegates them.
func controllersHere() bool {
	root, err := cgroupRoot()
	if err != nil {
		return false
	}
	data, _ := os.ReadFile(filepath.Join(root, "cgroup.controllers"))
	f := strings.Fields(string(data))
	return slices.Contains(f, "memory") && slices.Contains(f, "pids") && slices.Contains(f, "cpu")
}

// Where the hierarchy gives no memory, pids or cpu controller (this
// host's), asking for a limit fails at once, saying so in one line, and
// leaves nothing: never a run without its limit.
func TestLimitsUnavailable(t *testing.T) {
	if controllersHere() {
		t.Skip("the controllers are here; TestLimits tests them")
	}
	tm := mountT(t)
	dir := t.TempDir()
	for _, l := range []Limits{{Memory: 64 << 20}, {Pids: 10}, {CPUs: 0.5}} {
		_, err := tm.Run(context.Background(), Spec{Args: sh("touch " + dir + "/ran"), Limits: l})
		if err == nil || !strings.Contains(err.Error(), "cannot be enforced") || !strings.Contains(err.Error(), "controller") {
			t.Errorf("%s: %v", l, err)
		}
		if _, err := tm.Speculate(context.Background(), [][]string{sh("touch " + dir + "/ran")}, Options{Limits: l}); err == nil {
			t.Errorf("speculate %s: no error", l)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "ran")); err == nil {
		t.Error("a command ran without its limit")
	}
	_, stderr, code := runCLI(t, tm.mnt, "run", "--memory", "64M", tm.mnt, "--", "true")
	if code != 1 || !strings.HasPrefix(stderr, "branchfs: run: limits (memory 64M) cannot be enforced: ") || strings.Count(stderr, "\n") != 1 {
		t.Errorf("run --memory: exit %d: %q", code, stderr)
	}
	tm.noneLeft(t, token(t))
}

// Bad limits are refused before anything starts.
func TestLimitsBadInput(t *testing.T) {
	tm := mountT(t)
	for _, l := range []Limits{{Memory: -1}, {Memory: 100}, {Pids: -1}, {Pids: 1}, {CPUs: -1}, {CPUs: 0.001}} {
		if _, err := tm.Run(context.Background(), Spec{Args: sh("true"), Limits: l}); err == nil {
			t.Errorf("%+v: no error", l)
		}
	}
	for _, args := range [][]string{{"--memory", "lots"}, {"--pids", "-2"}, {"--cpus", "-1"}} {
		_, stderr, code := runCLI(t, tm.mnt, append(append([]string{"run"}, args...), tm.mnt, "--", "true")...)
		if code != 1 || !strings.Contains(stderr, args[0]) && !strings.HasPrefix(stderr, "branchfs: run: ") || strings.Count(stderr, "\n") != 1 {
			t.Errorf("%q: exit %d: %q", args, code, stderr)
		}
	}
	tm.noneLeft(t, token(t))
}

// Each limit holds and is reported: a candidate that takes memory without
// end is killed by the kernel at its limit, a fork bomb gets no more
// processes than its limit, a spinner no more CPU time; a candidate within
// its limits wins. Needs the controllers: the QEMU guest runs it.
func TestLimits(t *testing.T) {
	if !controllersHere() {
		t.Skip("no memory, pids and cpu controllers here (the QEMU guest has them)")
	}
	tm := mountT(t)
	res, err := tm.Run(context.Background(), Spec{Args: hogCmd(256), Limits: Limits{Memory: 48 << 20}, Timeout: time.Minute})
	must(t, err)
	if res.Success() || res.Signal != "killed" || !slices.Equal(res.LimitsHit, []string{"memory"}) || res.TimedOut {
		t.Errorf("memory hog: %+v", res)
	}
	// Within its limit, the same program runs.
	res, err = tm.Run(context.Background(), Spec{Args: hogCmd(8), Limits: Limits{Memory: 128 << 20}, Timeout: 2 * time.Second})
	must(t, err)
	if !res.TimedOut || len(res.LimitsHit) != 0 {
		t.Errorf("hog within its limit: %+v", res)
	}
	dir := t.TempDir()
	res, err = tm.Run(context.Background(), Spec{
		// Counted before each fork, with builtins alone: a shell may
		// give up at the fork that fails.
		Args:   sh(`i=0; while [ $i -lt 100 ]; do set -- /proc/[0-9]*; echo $# > ` + dir + `/procs; sleep 1000 & i=$((i+1)); done`),
		Limits: Limits{Pids: 20}, Timeout: time.Minute,
	})
	must(t, err)
	procs, _ := strconv.Atoi(strings.TrimSpace(readFile(t, filepath.Join(dir, "procs"))))
	if !slices.Equal(res.LimitsHit, []string{"pids"}) || procs > 20 || procs < 10 {
		t.Errorf("fork bomb: %d processes, %+v", procs, res)
	}
	res, err = tm.Run(context.Background(), Spec{Args: sh(`while :; do :; done`), Limits: Limits{CPUs: 0.2}, Timeout: 4 * time.Second})
	must(t, err)
	t.Logf("spinner with cpus 0.2: %.2f CPU seconds in %.2f s", res.CPUSeconds, res.Duration)
	// Unlimited, it would take one CPU; the helper's start counts too.
	if !res.TimedOut || res.CPUSeconds > 0.5*res.Duration || res.CPUSeconds < 0.05 {
		t.Errorf("spinner: %.2f CPU seconds in %.2f s: %+v", res.CPUSeconds, res.Duration, res)
	}
	// Per candidate, in a pattern and through the CLI.
	self, _ := os.Executable()
	stdout, stderr, code := runCLI(t, tm.mnt, "best-of-n", "--json", "--memory", "48M", "--pids", "50",
		"-c", "env "+envHog+"=256 "+self, "-c", "echo 1 >&3", tm.mnt)
	var out Outcome
	if err := json.Unmarshal([]byte(stdout), &out); err != nil || code != 0 {
		t.Fatalf("best-of-n: exit %d: %v: %s", code, err, stderr)
	}
	if out.Winner == nil || *out.Winner != 1 || !slices.Equal(out.Results[0].LimitsHit, []string{"memory"}) {
		t.Errorf("best-of-n: %s", stdout)
	}
	stdout, _, _ = runCLI(t, tm.mnt, "best-of-n", "--memory", "48M", "-c", "env "+envHog+"=256 "+self, tm.mnt)
	if !strings.Contains(stdout, "[0] fail exit -1 (killed) hit its memory limit") {
		t.Errorf("best-of-n text: %s", stdout)
	}
	tm.noneLeft(t, token(t))
}
