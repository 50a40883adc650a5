package explore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The candidates of a wave start their commands together: the first to
// run finds every sibling's branch already made, and not one of them
// committed.
func TestWaveStartsTogether(t *testing.T) {
	tm := mountT(t)
	tm.SetDataPath(DataPathFUSE) // the view, whose control file lists the branches
	const n = 6
	cands := make([][]string, n)
	for i := range cands {
		cands[i] = Shell(`sleep 1000`)
	}
	// The first candidate counts the live branches its control file
	// lists (main and the wave) and wins with that count.
	cands[0] = Shell(`n=$(grep -c '"state": "live"' .branchfs_ctl); echo "$n" > count`)
	out, err := tm.Speculate(context.Background(), cands, Options{})
	must(t, err)
	if out.Winner == nil || *out.Winner != 0 {
		t.Fatalf("outcome %+v", out)
	}
	if got := strings.TrimSpace(readFile(t, filepath.Join(tm.mnt, "count"))); got != strconv.Itoa(n+1) {
		t.Errorf("the first candidate saw %s live branches, want %d: the wave did not start together", got, n+1)
	}
	tm.noneLeft(t, token(t))
}

// MaxParallel caps the candidates running at once; the rest wait their
// turn and all run. Each candidate's timeout counts from its own start.
func TestMaxParallelAndCandidateTimeout(t *testing.T) {
	tm := mountT(t)
	dir := t.TempDir()
	cmd := Shell(`touch ` + dir + `/run.$BRANCHFS_INDEX; sleep 0.2; ls ` + dir + ` | grep -c '^run\.' > ` + dir + `/seen.$BRANCHFS_INDEX; rm ` + dir + `/run.$BRANCHFS_INDEX; echo $BRANCHFS_INDEX >&3`)
	out, err := tm.BestOfN(context.Background(), [][]string{cmd, cmd, cmd, cmd, cmd}, true, Options{MaxParallel: 2})
	must(t, err)
	if out.Winner == nil || *out.Winner != 4 {
		t.Fatalf("outcome %+v", out)
	}
	for i, r := range out.Results {
		seen := strings.TrimSpace(readFile(t, filepath.Join(dir, "seen."+strconv.Itoa(i))))
		if n, _ := strconv.Atoi(seen); n < 1 || n > 2 || !r.Success() {
			t.Errorf("candidate %d saw %s running, result %+v", i, seen, r)
		}
	}
	// A candidate timeout ends the slow one only; with one place, the
	// quick one starts after it and has its own time.
	out, err = tm.BestOfN(context.Background(), [][]string{Shell(`sleep 1000`), Shell(`echo 2 >&3`)}, true,
		Options{MaxParallel: 1, CandidateTimeout: 300 * time.Millisecond})
	must(t, err)
	if r := out.Results[0]; !r.TimedOut || r.Status() != 124 || !r.Aborted {
		t.Errorf("slow candidate: %+v", r)
	}
	if out.Winner == nil || *out.Winner != 1 || out.Results[1].TimedOut {
		t.Errorf("outcome %+v, quick candidate %+v", out, out.Results[1])
	}
	tm.noneLeft(t, token(t))
}

// Speculate gives up the candidates still waiting for a place once one
// commits: they never start.
func TestQueuedCandidatesNotStarted(t *testing.T) {
	tm := mountT(t)
	dir := t.TempDir()
	cands := [][]string{Shell(`true`), Shell(`touch ` + dir + `/ran1`), Shell(`touch ` + dir + `/ran2`)}
	out, err := tm.Speculate(context.Background(), cands, Options{MaxParallel: 1})
	must(t, err)
	if out.Winner == nil || *out.Winner != 0 {
		t.Fatalf("outcome %+v", out)
	}
	for _, i := range []int{1, 2} {
		if r := out.Results[i]; !r.NotStarted || r.Success() || r.Branch != "" {
			t.Errorf("queued candidate %d: %+v", i, r)
		}
		if _, err := os.Stat(filepath.Join(dir, "ran"+strconv.Itoa(i))); err == nil {
			t.Errorf("queued candidate %d ran", i)
		}
	}
	tm.noneLeft(t, token(t))
}

// Each candidate's output goes to writers of its own, or into its Result,
// and a writer shared by all of them loses nothing (run with -race).
func TestCandidateOutputApart(t *testing.T) {
	tm := mountT(t)
	const n = 4
	cmd := Shell(`i=0; while [ $i -lt 500 ]; do echo out$BRANCHFS_INDEX; echo err$BRANCHFS_INDEX >&2; i=$((i+1)); done`)
	cands := [][]string{cmd, cmd, cmd, cmd}
	outs, errs := make([]bytes.Buffer, n), make([]bytes.Buffer, n)
	out, err := tm.BestOfN(context.Background(), cands, false, Options{
		Output:     func(i int) (io.Writer, io.Writer) { return &outs[i], &errs[i] },
		KeepOutput: true,
	})
	must(t, err)
	for i := range n {
		wantOut, wantErr := strings.Repeat(fmt.Sprintf("out%d\n", i), 500), strings.Repeat(fmt.Sprintf("err%d\n", i), 500)
		if outs[i].String() != wantOut || errs[i].String() != wantErr {
			t.Errorf("candidate %d: stdout %d bytes, stderr %d bytes, not its own output", i, outs[i].Len(), errs[i].Len())
		}
		if r := out.Results[i]; r.Stdout != wantOut || r.Stderr != wantErr {
			t.Errorf("candidate %d: Result holds %d and %d bytes", i, len(r.Stdout), len(r.Stderr))
		}
	}
	var shared bytes.Buffer
	_, err = tm.BestOfN(context.Background(), cands, false, Options{Stdout: &shared, Stderr: &shared})
	must(t, err)
	for i := range n {
		if got := strings.Count(shared.String(), fmt.Sprintf("out%d\n", i)); got != 500 {
			t.Errorf("shared writer: %d lines of candidate %d, want 500", got, i)
		}
	}
	tm.noneLeft(t, token(t))
}

// A score that is no number is an error of that candidate, not a
// success, whatever its exit status.
func TestBadScoreIsAFailure(t *testing.T) {
	tm := mountT(t)
	out, err := tm.BestOfN(context.Background(), [][]string{
		Shell(`echo high >&3; echo 0 > picked`),
		Shell(`echo NaN >&3; echo 1 > picked`),
		Shell(`echo 0.5 >&3; echo 2 > picked`),
	}, true, Options{})
	must(t, err)
	if out.Winner == nil || *out.Winner != 2 {
		t.Fatalf("outcome %+v", out)
	}
	for _, i := range []int{0, 1} {
		if r := out.Results[i]; r.Success() || !strings.Contains(r.Error, "not a finite number") || !r.Aborted {
			t.Errorf("candidate %d: %+v", i, r)
		}
	}
	if got := readFile(t, filepath.Join(tm.mnt, "picked")); got != "2\n" {
		t.Errorf("picked = %q", got)
	}
	tm.noneLeft(t, token(t))
}

// A context ends a pattern and a run: every candidate is ended, every
// branch aborted, and the error says why.
func TestContextCancels(t *testing.T) {
	tm := mountT(t)
	tok := token(t)
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		for len(withToken(tok)) < 2 {
			time.Sleep(5 * time.Millisecond)
		}
		cancel()
	}()
	cand := Shell(`sleep 1000; : ` + tok)
	out, err := tm.Speculate(ctx, [][]string{cand, cand}, Options{})
	if !errors.Is(err, context.Canceled) || out == nil || out.Committed {
		t.Fatalf("speculate: %v, %+v", err, out)
	}
	for _, r := range out.Results {
		if !r.Aborted {
			t.Errorf("candidate %+v", r)
		}
	}
	ctx, cancel = context.WithCancel(context.Background())
	go func() {
		for len(withToken(tok)) < 1 {
			time.Sleep(5 * time.Millisecond)
		}
		cancel()
	}()
	res, err := tm.Run(ctx, Spec{Args: cand})
	if !errors.Is(err, context.Canceled) || res == nil || !res.Aborted {
		t.Errorf("run: %v, %+v", err, res)
	}
	if _, err := tm.Run(ctx, Spec{Args: Shell("touch " + dir + "/ran")}); !errors.Is(err, context.Canceled) {
		t.Errorf("run with an ended context: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "ran")); err == nil {
		t.Error("a run with an ended context ran")
	}
	tm.noneLeft(t, tok)
}
