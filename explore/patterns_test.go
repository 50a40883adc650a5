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
)

// Eight candidates race, each leaving a daemon behind and writing its
// index at the mount's usual path: exactly one commits, every time, and
// no loser's process is left.
func TestSpeculateOneWinner(t *testing.T) {
	tm := mountT(t)
	tok := token(t)
	for round := range 3 {
		dir := t.TempDir()
		cands := make([][]string, 8)
		for i := range cands {
			cands[i] = sh(daemon(tok, filepath.Join(dir, strconv.Itoa(i))) + `; echo $BRANCHFS_INDEX > ` + tm.mnt + `/winner; echo $BRANCHFS_INDEX >> ` + tm.mnt + `/all`)
		}
		// The first three fail, to lose as failures too.
		for i := range 3 {
			cands[i] = sh(daemon(tok, filepath.Join(dir, strconv.Itoa(i))) + `; exit 1`)
		}
		out, err := tm.Speculate(context.Background(), cands, Options{})
		must(t, err)
		if !out.Committed || out.Winner == nil || *out.Winner < 3 {
			t.Fatalf("round %d: outcome %+v", round, out)
		}
		w := *out.Winner
		if got := strings.TrimSpace(readFile(t, filepath.Join(tm.mnt, "winner"))); got != strconv.Itoa(w) {
			t.Errorf("round %d: winner file %s, outcome %d", round, got, w)
		}
		if got := strings.TrimSpace(readFile(t, filepath.Join(tm.mnt, "all"))); got != strconv.Itoa(w) {
			t.Errorf("round %d: all = %q: more than one commit", round, got)
		}
		committed := 0
		for i, r := range out.Results {
			if r.Committed {
				committed++
			}
			if i != w && !r.Aborted {
				t.Errorf("round %d: loser %d: %+v", round, i, r)
			}
		}
		if committed != 1 {
			t.Errorf("round %d: %d committed", round, committed)
		}
		tm.noneLeft(t, tok)
		os.Remove(filepath.Join(tm.mnt, "all"))
	}
}

// best-of-n commits the highest score a candidate wrote to fd 3; a
// failure's score does not count, and without a score a success counts 1.
func TestBestOfNPicksHighestScore(t *testing.T) {
	tm := mountT(t)
	cands := [][]string{
		Shell(`echo 3 >&3; echo 0 > ` + tm.mnt + `/picked`),
		Shell(`echo 9 >&3; echo 1 > ` + tm.mnt + `/picked; exit 1`), // fails: its 9 does not count
		Shell(`echo 7.5 >&3; echo 2 > ` + tm.mnt + `/picked`),
		Shell(`echo 3 > ` + tm.mnt + `/picked`), // no score: 1
	}
	out, err := tm.BestOfN(context.Background(), cands, true, Options{})
	must(t, err)
	if out.Winner == nil || *out.Winner != 2 || !out.Committed {
		t.Fatalf("outcome %+v", out)
	}
	if got := readFile(t, filepath.Join(tm.mnt, "picked")); got != "2\n" {
		t.Errorf("picked = %q", got)
	}
	if s := out.Results[0].Score; s == nil || *s != 3 {
		t.Errorf("score 0 = %v", s)
	}
	// Without commit, the best is reported and nothing changes.
	out, err = tm.BestOfN(context.Background(), [][]string{Shell(`echo 1 >&3; echo x > ` + tm.mnt + `/picked`), Shell(`echo 2 >&3`)}, false, Options{})
	must(t, err)
	if out.Winner == nil || *out.Winner != 1 || out.Committed {
		t.Errorf("no-commit outcome %+v", out)
	}
	if got := readFile(t, filepath.Join(tm.mnt, "picked")); got != "2\n" {
		t.Errorf("no-commit: picked = %q", got)
	}
	tm.noneLeft(t, token(t))
}

// Reflexion retries until success, feeding each attempt the last one's
// output, or a critique's.
func TestReflexionFeedsBack(t *testing.T) {
	tm := mountT(t)
	cmd := Shell(`echo "try $BRANCHFS_INDEX after [$BRANCHFS_FEEDBACK]" > ` + tm.mnt + `/log; echo out$BRANCHFS_INDEX; [ "$BRANCHFS_INDEX" = 2 ]`)
	out, err := tm.Reflexion(context.Background(), cmd, 5, nil, Options{})
	must(t, err)
	if !out.Committed || *out.Winner != 2 || len(out.Results) != 3 {
		t.Fatalf("outcome %+v", out)
	}
	if got := readFile(t, filepath.Join(tm.mnt, "log")); got != "try 2 after [out1]\n" {
		t.Errorf("log = %q", got)
	}
	// A critique runs in the failed branch and sees its files.
	out, err = tm.Reflexion(context.Background(), cmd, 2, Shell(`echo "critique of $(cat log)"`), Options{Dir: tm.mnt})
	must(t, err)
	if out.Committed || len(out.Results) != 2 {
		t.Fatalf("outcome %+v", out)
	}
	if got := readFile(t, filepath.Join(tm.mnt, "log")); got != "try 2 after [out1]\n" {
		t.Errorf("log changed by failed attempts: %q", got)
	}
	tm.noneLeft(t, token(t))
}

// Cascaded widens on failure, with the failures' output as feedback.
func TestCascadedWidens(t *testing.T) {
	tm := mountT(t)
	// Succeeds in wave 2 (indices 3..6) at index 5, the first to see two
	// failures' feedback from wave 1 ... or more.
	cmd := Shell(`echo fail$BRANCHFS_INDEX; n=$(printf %s "$BRANCHFS_FEEDBACK" | grep -c fail); [ "$BRANCHFS_INDEX" = 5 ] && echo "$n" > ` + tm.mnt + `/seen; test -e ` + tm.mnt + `/seen`)
	out, err := tm.Cascaded(context.Background(), cmd, []int{1, 2, 4}, 0, Options{})
	must(t, err)
	if !out.Committed || *out.Winner != 5 || len(out.Results) != 7 {
		t.Fatalf("outcome winner %v, %d results", out.Winner, len(out.Results))
	}
	if got := readFile(t, filepath.Join(tm.mnt, "seen")); got != "3\n" {
		t.Errorf("feedback held %q failures, want 3", got)
	}
	// Long output: the feedback is cut to what the environment can hold.
	out, err = tm.Cascaded(context.Background(), Shell(`head -c 100000 /dev/zero | tr '\0' x; [ -n "$BRANCHFS_FEEDBACK" ] && [ $BRANCHFS_INDEX = 2 ]`), []int{1, 1, 1}, 0, Options{})
	must(t, err)
	if !out.Committed || *out.Winner != 2 {
		t.Errorf("long feedback: winner %v: %+v", out.Winner, out.Results[2])
	}
	tm.noneLeft(t, token(t))
}

// Tournament: the judge sees both views and picks; the last one commits.
func TestTournament(t *testing.T) {
	tm := mountT(t)
	cands := [][]string{
		Shell(`echo 4 > ` + tm.mnt + `/v`),
		Shell(`echo 8 > ` + tm.mnt + `/v`),
		Shell(`exit 1`),
		Shell(`echo 6 > ` + tm.mnt + `/v`),
		Shell(`echo 2 > ` + tm.mnt + `/v`),
	}
	judge := Shell(`[ $(cat $1/v) -ge $(cat $2/v) ] && echo 0 || echo 1`)
	judge = append(judge, "judge")
	out, err := tm.Tournament(context.Background(), cands, judge, Options{})
	must(t, err)
	if !out.Committed || *out.Winner != 1 || len(out.Matches) != 3 {
		t.Fatalf("outcome %+v", out)
	}
	if got := readFile(t, filepath.Join(tm.mnt, "v")); got != "8\n" {
		t.Errorf("v = %q", got)
	}
	// A judge that answers nonsense is an error, and leaves nothing.
	_, err = tm.Tournament(context.Background(), cands[:2], Shell(`echo maybe`), Options{})
	if err == nil || !strings.Contains(err.Error(), "maybe") {
		t.Errorf("bad judge: %v", err)
	}
	if got := readFile(t, filepath.Join(tm.mnt, "v")); got != "8\n" {
		t.Errorf("after a bad judge: v = %q", got)
	}
	tm.noneLeft(t, token(t))
}

// Tree: each level's best commits into the tree's branch; expand prints
// the next level from there; the whole commits at the end.
func TestTreeLevels(t *testing.T) {
	tm := mountT(t)
	strategies := [][]string{
		Shell(`echo a > ` + tm.mnt + `/path; echo 1 >&3`),
		Shell(`echo b > ` + tm.mnt + `/path; echo 2 >&3`),
	}
	// The next level appends to what won: two choices, the second better.
	expand := Shell(`p=$(cat ` + tm.mnt + `/path); echo "echo $p-x$BRANCHFS_DEPTH > ` + tm.mnt + `/path; echo 1 >&3"; echo "echo $p-y$BRANCHFS_DEPTH > ` + tm.mnt + `/path; echo 5 >&3"`)
	out, err := tm.Tree(context.Background(), strategies, expand, 3, Options{})
	must(t, err)
	if !out.Committed || len(out.Results) != 6 || *out.Winner != 5 {
		t.Fatalf("outcome %+v", out)
	}
	if got := readFile(t, filepath.Join(tm.mnt, "path")); got != "b-y1-y2\n" {
		t.Errorf("path = %q", got)
	}
	// A level with no success aborts the whole tree.
	out, err = tm.Tree(context.Background(), strategies, Shell(`echo false`), 2, Options{})
	must(t, err)
	if out.Committed || out.Winner != nil {
		t.Errorf("failed level: outcome %+v", out)
	}
	if got := readFile(t, filepath.Join(tm.mnt, "path")); got != "b-y1-y2\n" {
		t.Errorf("after a failed tree: path = %q", got)
	}
	tm.noneLeft(t, token(t))
}

// Beam keeps the best branches of each level, across beams, and commits
// the best leaf with its ancestors.
func TestBeamKeepsBest(t *testing.T) {
	tm := mountT(t)
	strategies := [][]string{
		Shell(`echo a > ` + tm.mnt + `/path; echo 1 >&3`),
		Shell(`echo b > ` + tm.mnt + `/path; echo 3 >&3`),
		Shell(`echo c > ` + tm.mnt + `/path; echo 2 >&3`),
	}
	// Children score by their parent: a's score 9, others 1 and 4.
	expand := Shell(`p=$(cat ` + tm.mnt + `/path); case $p in a) s=9;; b) s=1;; *) s=4;; esac; echo "echo $p-1 > ` + tm.mnt + `/path; echo $s >&3"; echo "echo $p-2 > ` + tm.mnt + `/path; exit 1"`)
	out, err := tm.Beam(context.Background(), strategies, expand, 2, 2, Options{})
	must(t, err)
	// Width 2 keeps b and c at level 0 (a is dropped): c-1 (4) beats b-1.
	if !out.Committed || out.WinnerResult() == nil {
		t.Fatalf("outcome %+v", out)
	}
	if got := readFile(t, filepath.Join(tm.mnt, "path")); got != "c-1\n" {
		t.Errorf("path = %q", got)
	}
	tm.noneLeft(t, token(t))
}

// Bad input to any pattern is an error and changes nothing.
func TestPatternsBadInput(t *testing.T) {
	tm := mountT(t)
	ctx := context.Background()
	one := [][]string{Shell("true")}
	for name, f := range map[string]func() error{
		"speculate none":   func() error { _, err := tm.Speculate(ctx, nil, Options{}); return err },
		"speculate empty":  func() error { _, err := tm.Speculate(ctx, [][]string{{}}, Options{}); return err },
		"speculate parent": func() error { _, err := tm.Speculate(ctx, one, Options{Parent: "nosuch"}); return err },
		"best-of-n":        func() error { _, err := tm.BestOfN(ctx, one, true, Options{Timeout: -time.Second}); return err },
		"reflexion":        func() error { _, err := tm.Reflexion(ctx, Shell("true"), 0, nil, Options{}); return err },
		"cascaded":         func() error { _, err := tm.Cascaded(ctx, Shell("true"), []int{1, 0}, 0, Options{}); return err },
		"tournament":       func() error { _, err := tm.Tournament(ctx, one, nil, Options{}); return err },
		"tree":             func() error { _, err := tm.Tree(ctx, one, nil, 2, Options{}); return err },
		"beam":             func() error { _, err := tm.Beam(ctx, one, Shell("true"), 0, 2, Options{}); return err },
		"bad bind":         func() error { _, err := tm.Speculate(ctx, one, Options{Binds: []string{"/nonexistent"}}); return err },
		"max parallel":     func() error { _, err := tm.Speculate(ctx, one, Options{MaxParallel: -1}); return err },
		"candidate timeout": func() error {
			_, err := tm.BestOfN(ctx, one, true, Options{CandidateTimeout: -time.Second})
			return err
		},
		"empty command":   func() error { _, err := tm.BestOfN(ctx, [][]string{{""}}, true, Options{}); return err },
		"empty reflexion": func() error { _, err := tm.Reflexion(ctx, nil, 1, nil, Options{}); return err },
	} {
		if err := f(); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	list, err := tm.List()
	must(t, err)
	if len(list) != 1 {
		t.Errorf("branches: %+v", list)
	}
	tm.noneLeft(t, token(t))
}

// The pattern subcommands print the outcome with --json and exit 0 on a
// commit, 1 without; a Ctrl-C ends every candidate and branch.
func TestPatternsCLI(t *testing.T) {
	tm := mountT(t)
	tok := token(t)
	cmd := exec.Command(binary, "speculate", "--json", "-n", "3", tm.mnt, "--", "sh", "-c", `echo $BRANCHFS_INDEX > `+tm.mnt+`/w; [ $BRANCHFS_INDEX = 1 ]`)
	var stdout bytes.Buffer
	cmd.Stdout = &stdout
	must(t, cmd.Run())
	var out Outcome
	must(t, json.Unmarshal(stdout.Bytes(), &out))
	if !out.Committed || *out.Winner != 1 || len(out.Results) != 3 {
		t.Errorf("outcome %s", stdout.String())
	}
	err := exec.Command(binary, "best-of-n", "-c", "exit 1", tm.mnt).Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Errorf("no winner: %v", err)
	}
	for _, args := range [][]string{
		{"speculate", tm.mnt},
		{"speculate", "-n", "2", tm.mnt},
		{"speculate", "-n", "2", "-c", "true", tm.mnt, "--", "true"},
		{"reflexion", "--retries", "0", tm.mnt, "--", "true"},
		{"cascaded", "--fan-out", "0", tm.mnt, "--", "true"},
		{"tournament", "-n", "2", tm.mnt, "--", "true"},
		{"beam", "-c", "true", "--depth", "2", tm.mnt},
		{"tree", "-c", "true", "--parent", "nosuch", tm.mnt},
	} {
		out, err := exec.Command(binary, args...).CombinedOutput()
		if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.HasPrefix(string(out), "branchfs: "+args[0]+": ") {
			t.Errorf("%q: %v: %s", args, err, out)
		}
	}
	// Ctrl-C, and kill -9 (the janitor reaps), of a race and of a tree,
	// which holds a branch of its own between levels.
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGKILL} {
		for _, pattern := range []string{"speculate", "tree"} {
			dir := t.TempDir()
			args := []string{pattern, "-n", "4", tm.mnt, "--", "sh", "-c", daemon(tok, dir+"/r$BRANCHFS_INDEX") + "; sleep 1000"}
			if pattern == "tree" {
				args = append(args[:1], append([]string{"--depth", "2", "--expand", "true"}, args[1:]...)...)
			}
			c := exec.Command(binary, args...)
			must(t, c.Start())
			eventually(t, "the daemons", func() bool {
				m, _ := filepath.Glob(dir + "/r?")
				return len(m) == 4
			})
			c.Process.Signal(sig)
			err := c.Wait()
			if sig == syscall.SIGINT && (!errors.As(err, &ee) || ee.ExitCode() != 130) {
				t.Errorf("%s: Ctrl-C: %v", pattern, err)
			}
			deadline := time.Now().Add(10 * time.Second)
			for {
				list, err := tm.List()
				live := 0
				for _, b := range list {
					if b.State != "committed" {
						live++
					}
				}
				if len(withToken(tok)) == 0 && err == nil && live == 1 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%s, %v: left: %q, %+v, %v", pattern, sig, withToken(tok), list, err)
				}
				time.Sleep(5 * time.Millisecond)
			}
		}
	}
	tm.noneLeft(t, tok)
}
