package explore

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// runCLI runs the branchfs binary and returns its stdout, stderr and exit
// status.
func runCLI(t *testing.T, dir string, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(binary, args...)
	cmd.Dir = dir
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("%q: %v", args, err)
	}
	return stdout.String(), stderr.String(), cmd.ProcessState.ExitCode()
}

// run --branch on a branch that is stale or gone exits 3, as every branch
// command does; a kept branch is named; flags are named as typed.
func TestRunCLIWords(t *testing.T) {
	tm := mountT(t)
	for _, name := range []string{"a", "b"} {
		_, err := tm.Create("", name)
		must(t, err)
	}
	must(t, tm.Commit("a")) // b is stale now
	for _, name := range []string{"b", "nosuch"} {
		_, stderr, code := runCLI(t, "/", "run", "--branch", name, tm.mnt, "--", "true")
		if code != 3 || !strings.HasPrefix(stderr, "branchfs: run: ") {
			t.Errorf("run --branch %s: exit %d: %s", name, code, stderr)
		}
	}
	must(t, tm.Abort("b", false))
	_, stderr, code := runCLI(t, tm.mnt, "run", "--on-success", "keep", tm.mnt, "--", "true")
	if code != 0 || !strings.Contains(stderr, "kept branch run-") || !strings.Contains(stderr, tm.mnt+"/@run-") {
		t.Errorf("kept: exit %d: %q", code, stderr)
	}
	for _, b := range listNames(t, tm) {
		if strings.HasPrefix(b, "run-") {
			must(t, tm.Abort(b, false))
		}
	}
	for flag, value := range map[string]string{"--on-success": "abort", "--on-failure": "commit"} {
		_, stderr, code = runCLI(t, "/", "run", flag, value, tm.mnt, "--", "true")
		if code != 1 || !strings.Contains(stderr, flag+": ") {
			t.Errorf("%s %s: exit %d: %q", flag, value, code, stderr)
		}
	}
	// A working directory outside the mount is warned of.
	_, stderr, code = runCLI(t, "/", "run", tm.mnt, "--", "true")
	if code != 0 || !strings.Contains(stderr, "warning: working directory / is outside "+tm.mnt) {
		t.Errorf("outside: exit %d: %q", code, stderr)
	}
	tm.noneLeft(t, token(t))
}

func listNames(t *testing.T, tm *testMount) []string {
	list, err := tm.List()
	must(t, err)
	var names []string
	for _, b := range list {
		names = append(names, b.Name)
	}
	return names
}

// The pattern subcommands keep each candidate's output apart: lines with
// the candidate's index, files of their own, or fields of --json; they
// take --max-parallel and --candidate-timeout, and report a bad score.
func TestPatternsCLIOutput(t *testing.T) {
	tm := mountT(t)
	cmd := `echo out$BRANCHFS_INDEX; echo err$BRANCHFS_INDEX >&2; [ $BRANCHFS_INDEX = 1 ] && { echo nonsense >&3; exit 0; }; [ $BRANCHFS_INDEX = 2 ] && sleep 1000; echo $BRANCHFS_INDEX >&3`
	stdout, stderr, code := runCLI(t, tm.mnt, "best-of-n", "--candidate-timeout", "300ms", "--max-parallel", "2", "-n", "4", tm.mnt, "--", "sh", "-c", cmd)
	if code != 0 {
		t.Fatalf("exit %d: %s %s", code, stdout, stderr)
	}
	for _, want := range []string{"[0] out0\n", "[3] out3\n", "winner: 3 ", "[1] fail exit 0: score on fd 3: \"nonsense\" is not a finite number", "[2] fail exit -1 (killed) timed out"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("stdout lacks %q:\n%s", want, stdout)
		}
	}
	if !strings.Contains(stderr, "[1] err1\n") {
		t.Errorf("stderr %q", stderr)
	}
	dir := t.TempDir()
	stdout, stderr, code = runCLI(t, tm.mnt, "speculate", "--json", "--output-dir", dir, "-n", "3", tm.mnt, "--", "sh", "-c", `echo out$BRANCHFS_INDEX; echo err$BRANCHFS_INDEX >&2; [ $BRANCHFS_INDEX = 2 ]`)
	var out Outcome
	if err := json.Unmarshal([]byte(stdout), &out); err != nil || code != 0 || stderr != "" {
		t.Fatalf("exit %d: %v: %s %s", code, err, stdout, stderr)
	}
	for i, r := range out.Results {
		want := "out" + string(rune('0'+i)) + "\n"
		if r.Stdout != want || readFile(t, filepath.Join(dir, string(rune('0'+i))+".out")) != want ||
			readFile(t, filepath.Join(dir, string(rune('0'+i))+".err")) != "err"+string(rune('0'+i))+"\n" {
			t.Errorf("candidate %d: %+v", i, r)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "3.out")); err == nil {
		t.Error("a fourth output file")
	}
	for _, args := range [][]string{
		{"speculate", "--max-parallel", "-1", "-c", "true", tm.mnt},
		{"speculate", "--candidate-timeout", "-1s", "-c", "true", tm.mnt},
		{"speculate", "--output-dir", "/nonexistent", "-c", "true", tm.mnt},
	} {
		_, stderr, code := runCLI(t, "/", args...)
		if code != 1 || !strings.HasPrefix(stderr, "branchfs: speculate: ") {
			t.Errorf("%q: exit %d: %s", args, code, stderr)
		}
	}
	tm.noneLeft(t, token(t))
}
