package explore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/branchfs/branchfs/branch"
)

// The exploration patterns of the Python branching library
// (multikernel/branching), with commands as candidates. Every candidate
// is a run: its own branch, mount namespace, PID namespace and cgroup.
// A candidate succeeds when it exits 0 in time; where a pattern scores,
// a candidate writes its score (a number) to fd 3, and one that writes
// nothing scores 1 on success and 0 on failure, as in branching. Nothing
// a pattern makes outlives it: losers' processes are ended and their
// branches aborted before it returns, on error too.

// Options are what every pattern takes.
type Options struct {
	Parent         string        // the branch the candidates branch from; "": main
	Timeout        time.Duration // for the whole pattern (per level in Tree and Beam); 0: none
	Dir            string        // working directory of the candidates; "": this process's
	Env            []string      // candidates' environment; nil: this process's
	Binds          []string      // more paths to show each candidate's branch at
	Stdout, Stderr io.Writer     // where candidates' output goes; nil: discarded
}

// Outcome is how a pattern ended.
type Outcome struct {
	Pattern   string    `json:"pattern"`
	Committed bool      `json:"committed"`
	Winner    *int      `json:"winner"` // index into Results, null when none won
	Results   []*Result `json:"results"`
	Matches   []Match   `json:"matches,omitempty"` // Tournament
}

// Match is one judgement of a Tournament: indices into Results.
type Match struct {
	A      int `json:"a"`
	B      int `json:"b"`
	Winner int `json:"winner"`
}

// WinnerResult is the winning candidate's result, or nil.
func (o *Outcome) WinnerResult() *Result {
	if o.Winner == nil {
		return nil
	}
	return o.Results[*o.Winner]
}

func (o *Outcome) win(i int) { o.Winner = &i; o.Committed = true }

// Shell makes a candidate of a shell command line.
func Shell(line string) []string { return []string{"sh", "-c", line} }

func checkCommands(what string, cmds [][]string) error {
	if len(cmds) == 0 {
		return fmt.Errorf("%s: no candidates", what)
	}
	if len(cmds) > 1024 {
		return fmt.Errorf("%s: %d candidates, at most 1024", what, len(cmds))
	}
	for i, c := range cmds {
		if len(c) == 0 || c[0] == "" {
			return fmt.Errorf("%s: candidate %d is empty", what, i)
		}
	}
	return nil
}

func (o *Options) spec(pattern string, args []string, parent string, index int, extraEnv ...string) Spec {
	env := o.Env
	if env == nil {
		env = os.Environ()
	}
	env = append(env[:len(env):len(env)], extraEnv...)
	if parent == "" {
		parent = o.Parent
	}
	return Spec{Args: args, Env: env, Dir: o.Dir, Binds: o.Binds, Stdout: o.Stdout, Stderr: o.Stderr,
		Parent: parent, Name: genName(pattern), Index: index, Score: true}
}

func (o *Options) check(m *Mount) error {
	if o.Parent != "" && o.Parent != branch.MainName {
		info, err := m.Info(o.Parent)
		if err != nil {
			return err
		}
		if info.State != branch.Live.String() {
			return fmt.Errorf("parent %s is %s", o.Parent, info.State)
		}
	}
	if o.Timeout < 0 {
		return errors.New("negative timeout")
	}
	return nil
}

// group is a set of runs started together.
type group struct {
	m     *Mount
	procs []*Proc
}

// startAll starts one run per spec; on any failure it ends those started.
func (m *Mount) startAll(ctx context.Context, specs []Spec) (*group, error) {
	g := &group{m: m}
	for _, s := range specs {
		p, err := m.Start(ctx, s)
		if err != nil {
			g.abortAll()
			return nil, err
		}
		g.procs = append(g.procs, p)
	}
	return g, nil
}

// abortAll ends every run of the group and drops its branch.
func (g *group) abortAll() {
	for _, p := range g.procs {
		p.Kill()
	}
	for _, p := range g.procs {
		p.Abort()
	}
}

// results waits for every run.
func (g *group) results() []*Result {
	out := make([]*Result, len(g.procs))
	for i, p := range g.procs {
		out[i] = p.Wait()
	}
	return out
}

// scoreOf is a candidate's score: what it wrote to fd 3, else 1 on
// success and 0 on failure.
func scoreOf(r *Result) float64 {
	if r.Score != nil {
		return *r.Score
	}
	if r.Success() {
		return 1
	}
	return 0
}

// best is the index of the best-scoring success among rs, or -1; the first
// of equals wins.
func best(rs []*Result) int {
	b := -1
	for i, r := range rs {
		if r.Success() && (b < 0 || scoreOf(r) > scoreOf(rs[b])) {
			b = i
		}
	}
	return b
}

func withTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if d > 0 {
		return context.WithTimeout(ctx, d)
	}
	return context.WithCancel(ctx)
}

// Speculate runs the candidates at once, each in a branch of its own; the
// first to succeed commits, and the others are killed and aborted at once.
func (m *Mount) Speculate(ctx context.Context, cands [][]string, o Options) (*Outcome, error) {
	if err := checkCommands("speculate", cands); err != nil {
		return nil, err
	}
	if err := o.check(m); err != nil {
		return nil, fmt.Errorf("speculate: %w", err)
	}
	return m.race(ctx, "speculate", cands, o, 0, nil)
}

// race is Speculate, with the candidates' indices starting at base; when
// failed is not nil it gets the output of each candidate that failed
// before the winner committed.
func (m *Mount) race(ctx context.Context, pattern string, cands [][]string, o Options, base int, failed func(out string)) (*Outcome, error) {
	ctx, cancel := withTimeout(ctx, o.Timeout)
	defer cancel()
	specs := make([]Spec, len(cands))
	outs := make([]*tail, len(cands))
	for i, c := range cands {
		specs[i] = o.spec(pattern, c, "", base+i)
		if failed != nil {
			outs[i] = &tail{}
			specs[i].Stdout = teeTo(o.Stdout, outs[i])
			specs[i].Stderr = teeTo(o.Stderr, outs[i])
		}
	}
	g, err := m.startAll(ctx, specs)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", pattern, err)
	}
	out := &Outcome{Pattern: pattern, Results: make([]*Result, len(cands))}
	done := make(chan int, len(cands))
	for i, p := range g.procs {
		go func() { <-p.Done(); done <- i }()
	}
	won := false
	for range g.procs {
		i := <-done
		p := g.procs[i]
		out.Results[i] = p.Wait()
		if won || !p.Wait().Success() {
			if !won && failed != nil {
				failed(outs[i].String())
			}
			continue
		}
		// The first success commits; the others lose now, whatever
		// they are doing.
		if err := p.Commit(); err != nil {
			p.Wait().Error = err.Error()
			continue
		}
		won = true
		out.win(i)
		for _, q := range g.procs {
			if q != p {
				q.Kill()
			}
		}
	}
	for i, p := range g.procs {
		if out.Winner == nil || *out.Winner != i {
			if err := p.Abort(); err != nil {
				p.Wait().Error = err.Error()
			}
		}
	}
	return out, nil
}

// BestOfN runs the candidates at once to the end (or the timeout), and
// commits the success with the highest score (the first of equals); with
// commit false it aborts them all, for the scores alone.
func (m *Mount) BestOfN(ctx context.Context, cands [][]string, commit bool, o Options) (*Outcome, error) {
	if err := checkCommands("best-of-n", cands); err != nil {
		return nil, err
	}
	if err := o.check(m); err != nil {
		return nil, fmt.Errorf("best-of-n: %w", err)
	}
	return m.bestOf(ctx, "best-of-n", cands, commit, o, "", 0, nil)
}

// bestOf runs cands as children of parent ("" for o.Parent) and keeps the
// best-scoring success: committed when commit, else aborted. extra adds
// environment variables.
func (m *Mount) bestOf(ctx context.Context, pattern string, cands [][]string, commit bool, o Options, parent string, depth int, extra []string) (*Outcome, error) {
	ctx, cancel := withTimeout(ctx, o.Timeout)
	defer cancel()
	specs := make([]Spec, len(cands))
	for i, c := range cands {
		specs[i] = o.spec(pattern, c, parent, i, extra...)
	}
	g, err := m.startAll(ctx, specs)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", pattern, err)
	}
	out := &Outcome{Pattern: pattern, Results: g.results()}
	b := best(out.Results)
	for i, p := range g.procs {
		if i == b && commit {
			if err := p.Commit(); err != nil {
				out.Results[i].Error = err.Error()
			} else {
				out.win(i)
				continue
			}
		}
		if err := p.Abort(); err != nil {
			out.Results[i].Error = err.Error()
		}
	}
	if !commit && b >= 0 {
		out.Winner = &b
	}
	return out, nil
}

// Reflexion runs cmd in a branch up to retries times, one after another,
// until it succeeds (and commits). Each attempt after the first finds the
// feedback on the one before in BRANCHFS_FEEDBACK: what critique printed,
// run in the failed attempt's branch, or without critique the failed
// attempt's own output (its last 64 KiB).
func (m *Mount) Reflexion(ctx context.Context, cmd []string, retries int, critique []string, o Options) (*Outcome, error) {
	if err := checkCommands("reflexion", [][]string{cmd}); err != nil {
		return nil, err
	}
	if retries < 1 {
		return nil, fmt.Errorf("reflexion: retries must be 1 or more, not %d", retries)
	}
	if critique != nil && (len(critique) == 0 || critique[0] == "") {
		return nil, errors.New("reflexion: empty critique command")
	}
	if err := o.check(m); err != nil {
		return nil, fmt.Errorf("reflexion: %w", err)
	}
	ctx, cancel := withTimeout(ctx, o.Timeout)
	defer cancel()
	out := &Outcome{Pattern: "reflexion"}
	feedback := ""
	for i := 0; i < retries && ctx.Err() == nil; i++ {
		var t tail
		s := o.spec("reflexion", cmd, "", i, EnvFeedback+"="+feedback)
		s.Stdout, s.Stderr = teeTo(o.Stdout, &t), teeTo(o.Stderr, &t)
		p, err := m.Start(ctx, s)
		if err != nil {
			return out, fmt.Errorf("reflexion: attempt %d: %w", i, err)
		}
		r := p.Wait()
		out.Results = append(out.Results, r)
		if r.Success() {
			if err := p.Commit(); err == nil {
				out.win(i)
				return out, nil
			} else {
				r.Error = err.Error()
			}
		}
		feedback = strings.TrimSpace(t.String())
		if critique != nil {
			var c tail
			cs := o.spec("", critique, "", i, EnvFeedback+"="+feedback)
			cs.Parent, cs.Name, cs.Branch, cs.Score = "", "", p.Branch(), false
			cs.Stdout, cs.Stderr = &c, o.Stderr
			if cp, err := m.Start(ctx, cs); err == nil {
				cp.Wait()
				cp.Keep()
				feedback = strings.TrimSpace(c.String())
			}
		}
		if err := p.Abort(); err != nil {
			r.Error = err.Error()
		}
	}
	return out, nil
}

// Cascaded runs waves of cmd, fanOut[w] at once in wave w, each wave as
// Speculate (the first success commits and ends the pattern). A failed
// candidate's output joins the feedback that every later candidate finds
// in BRANCHFS_FEEDBACK, separated by lines of "---" (the last 64 KiB of
// it). waveTimeout bounds
// each wave, o.Timeout all of them.
func (m *Mount) Cascaded(ctx context.Context, cmd []string, fanOut []int, waveTimeout time.Duration, o Options) (*Outcome, error) {
	if err := checkCommands("cascaded", [][]string{cmd}); err != nil {
		return nil, err
	}
	if len(fanOut) == 0 {
		return nil, errors.New("cascaded: no waves")
	}
	for _, n := range fanOut {
		if n < 1 || n > 1024 {
			return nil, fmt.Errorf("cascaded: a wave of %d candidates: 1 to 1024", n)
		}
	}
	if waveTimeout < 0 {
		return nil, errors.New("cascaded: negative wave timeout")
	}
	if err := o.check(m); err != nil {
		return nil, fmt.Errorf("cascaded: %w", err)
	}
	ctx, cancel := withTimeout(ctx, o.Timeout)
	defer cancel()
	out := &Outcome{Pattern: "cascaded"}
	var feedback []string
	base := 0
	for _, n := range fanOut {
		if ctx.Err() != nil {
			break
		}
		cands := make([][]string, n)
		for i := range cands {
			cands[i] = cmd
		}
		wo := o
		wo.Timeout = waveTimeout
		// One environment string may hold 128 KiB (MAX_ARG_STRLEN): keep
		// the latest 64 KiB of feedback.
		fb := strings.Join(feedback, "\n---\n")
		fb = fb[max(0, len(fb)-tailMax):]
		wo.Env = append(o.environ(), EnvFeedback+"="+fb)
		var mu sync.Mutex
		w, err := m.race(ctx, "cascaded", cands, wo, base, func(s string) {
			if s = strings.TrimSpace(s); s != "" {
				mu.Lock()
				feedback = append(feedback, s)
				mu.Unlock()
			}
		})
		if err != nil {
			return out, err
		}
		out.Results = append(out.Results, w.Results...)
		if w.Committed {
			out.win(base + *w.Winner)
			return out, nil
		}
		base += n
	}
	return out, nil
}

func (o *Options) environ() []string {
	if o.Env != nil {
		return o.Env[:len(o.Env):len(o.Env)]
	}
	return os.Environ()
}

// Tournament runs the candidates at once to the end, then narrows the
// successes to one by pairs, in order (an odd one out goes through): the
// judge runs with the two branches' views (MNT/@NAME) as its last two
// arguments and prints 0 when the first wins, 1 when the second does. The
// last one left commits.
func (m *Mount) Tournament(ctx context.Context, cands [][]string, judge []string, o Options) (*Outcome, error) {
	if err := checkCommands("tournament", cands); err != nil {
		return nil, err
	}
	if len(judge) == 0 || judge[0] == "" {
		return nil, errors.New("tournament: no judge")
	}
	if err := o.check(m); err != nil {
		return nil, fmt.Errorf("tournament: %w", err)
	}
	ctx, cancel := withTimeout(ctx, o.Timeout)
	defer cancel()
	specs := make([]Spec, len(cands))
	for i, c := range cands {
		specs[i] = o.spec("tournament", c, "", i)
	}
	g, err := m.startAll(ctx, specs)
	if err != nil {
		return nil, fmt.Errorf("tournament: %w", err)
	}
	out := &Outcome{Pattern: "tournament", Results: g.results()}
	var alive []int
	for i, r := range out.Results {
		if r.Success() {
			alive = append(alive, i)
		}
	}
	var jerr error
	for len(alive) > 1 && jerr == nil {
		var next []int
		for k := 0; k+1 < len(alive) && jerr == nil; k += 2 {
			a, b := alive[k], alive[k+1]
			var pick int
			pick, jerr = m.judge(ctx, judge, g.procs[a].Branch(), g.procs[b].Branch(), o)
			w := a
			if pick == 1 {
				w = b
			}
			out.Matches = append(out.Matches, Match{A: a, B: b, Winner: w})
			next = append(next, w)
		}
		if len(alive)%2 == 1 {
			next = append(next, alive[len(alive)-1])
		}
		alive = next
	}
	for i, p := range g.procs {
		if jerr == nil && len(alive) == 1 && alive[0] == i {
			if err := p.Commit(); err == nil {
				out.win(i)
				continue
			} else {
				out.Results[i].Error = err.Error()
			}
		}
		if err := p.Abort(); err != nil {
			out.Results[i].Error = err.Error()
		}
	}
	if jerr != nil {
		return out, fmt.Errorf("tournament: %w", jerr)
	}
	return out, nil
}

// judge runs the judge on two branches and returns 0 or 1.
func (m *Mount) judge(ctx context.Context, judge []string, a, b string, o Options) (int, error) {
	cmd := exec.CommandContext(ctx, judge[0], append(judge[1:len(judge):len(judge)], m.View(a), m.View(b))...)
	cmd.Env, cmd.Dir, cmd.Stderr = o.Env, o.Dir, o.Stderr
	// Its own process group, killed with it; it dies with this process.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	var stdout bytes.Buffer
	cmd.Stdout = &stdout
	err := cmd.Run()
	if cmd.Process != nil {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	if err != nil {
		return 0, fmt.Errorf("judge %s %s: %w", a, b, err)
	}
	switch strings.TrimSpace(stdout.String()) {
	case "0":
		return 0, nil
	case "1":
		return 1, nil
	}
	return 0, fmt.Errorf("judge %s %s printed %q, not 0 or 1", a, b, strings.TrimSpace(stdout.String()))
}

// expandIn runs expand in branch name (BRANCHFS_DEPTH=depth) and returns
// the commands it printed, one shell command line a line.
func (m *Mount) expandIn(ctx context.Context, expand []string, name string, depth int, o Options) ([][]string, error) {
	var t bytes.Buffer
	s := o.spec("", expand, "", 0, EnvDepth+"="+strconv.Itoa(depth))
	s.Parent, s.Name, s.Branch, s.Score = "", "", name, false
	s.Stdout = &t
	p, err := m.Start(ctx, s)
	if err != nil {
		return nil, err
	}
	r := p.Wait()
	p.Keep()
	if !r.Success() {
		return nil, fmt.Errorf("expand in %s: exit %d %s%s", name, r.ExitCode, r.Signal, r.Error)
	}
	var cmds [][]string
	for line := range strings.Lines(t.String()) {
		if line = strings.TrimSpace(line); line != "" {
			cmds = append(cmds, Shell(line))
		}
	}
	return cmds, nil
}

// Tree runs the strategies at once, as BestOfN. With an expand command and
// depth above 1, the levels happen in a root branch: each level's best
// commits into it, then expand runs there (BRANCHFS_DEPTH is the next
// level) and prints the next level's strategies, one shell command line a
// line; the root commits once every level has had a winner, or is aborted
// when one has none. Results hold every level's candidates in order.
func (m *Mount) Tree(ctx context.Context, strategies [][]string, expand []string, depth int, o Options) (*Outcome, error) {
	if err := checkCommands("tree", strategies); err != nil {
		return nil, err
	}
	if depth < 1 {
		return nil, fmt.Errorf("tree: depth must be 1 or more, not %d", depth)
	}
	if depth > 1 && len(expand) == 0 {
		return nil, errors.New("tree: depth above 1 needs an expand command")
	}
	if err := o.check(m); err != nil {
		return nil, fmt.Errorf("tree: %w", err)
	}
	if depth == 1 {
		out, err := m.bestOf(ctx, "tree", strategies, true, o, "", 0, []string{EnvDepth + "=0"})
		return out, err
	}
	root, release, err := m.hold(o.Parent, "tree")
	if err != nil {
		return nil, fmt.Errorf("tree: %w", err)
	}
	defer release()
	out := &Outcome{Pattern: "tree"}
	level := strategies
	for d := 0; d < depth && len(level) > 0; d++ {
		lo, err := m.bestOf(ctx, "tree", level, true, o, root, d, []string{EnvDepth + "=" + strconv.Itoa(d)})
		if err != nil {
			m.Abort(root, true)
			return out, err
		}
		for _, r := range lo.Results {
			r.Index = len(out.Results)
			out.Results = append(out.Results, r)
		}
		if !lo.Committed {
			out.Winner = nil
			return out, m.Abort(root, true)
		}
		w := len(out.Results) - len(lo.Results) + *lo.Winner
		out.Winner = &w
		if d+1 < depth {
			if level, err = m.expandIn(ctx, expand, root, d+1, o); err != nil {
				m.Abort(root, true)
				out.Winner = nil
				return out, fmt.Errorf("tree: %w", err)
			}
		}
	}
	if err := m.Commit(root); err != nil {
		m.Abort(root, true)
		out.Winner = nil
		return out, fmt.Errorf("tree: %w", err)
	}
	out.Committed = true
	return out, nil
}

// hold creates a branch for a pattern itself, with a record, so that it
// is reaped should this process die; release drops the record.
func (m *Mount) hold(parent, prefix string) (string, func(), error) {
	name := genName(prefix)
	path, err := writeRecord(newRecord(m.dir, name, true))
	if err != nil {
		return "", nil, err
	}
	startJanitor()
	if _, err := m.Create(parent, name); err != nil {
		os.Remove(path)
		return "", nil, err
	}
	return name, func() { os.Remove(path) }, nil
}

// Beam keeps the width best successes alive at each level: level 0 runs
// the strategies at once; at each next level expand runs in every
// surviving branch and prints its children's strategies, which run at once
// as child branches, and the width best of all of them survive (a branch
// none of whose children survives is dropped). After depth levels the best
// survivor commits into its parent, and so on up to Options.Parent;
// everything else is aborted.
func (m *Mount) Beam(ctx context.Context, strategies [][]string, expand []string, width, depth int, o Options) (*Outcome, error) {
	if err := checkCommands("beam", strategies); err != nil {
		return nil, err
	}
	if width < 1 || depth < 1 {
		return nil, fmt.Errorf("beam: width and depth must be 1 or more, not %d and %d", width, depth)
	}
	if depth > 1 && len(expand) == 0 {
		return nil, errors.New("beam: depth above 1 needs an expand command")
	}
	if err := o.check(m); err != nil {
		return nil, fmt.Errorf("beam: %w", err)
	}
	type node struct {
		p      *Proc
		parent int // index into out.Results, -1 for level 0
		rel    func()
	}
	out := &Outcome{Pattern: "beam"}
	var nodes []node // as out.Results
	var alive []int  // survivors of the last level, best first
	fail := func(err error) (*Outcome, error) {
		for _, n := range nodes {
			n.p.Kill()
		}
		for i := len(nodes) - 1; i >= 0; i-- {
			nodes[i].p.Abort()
			if nodes[i].rel != nil {
				nodes[i].rel()
			}
		}
		out.Winner = nil
		return out, fmt.Errorf("beam: %w", err)
	}
	type task struct {
		cmd    []string
		parent int
	}
	tasks := make([]task, len(strategies))
	for i, s := range strategies {
		tasks[i] = task{s, -1}
	}
	for d := 0; d < depth; d++ {
		if d > 0 {
			tasks = nil
			for _, a := range alive {
				cmds, err := m.expandIn(ctx, expand, nodes[a].p.Branch(), d, o)
				if err != nil {
					return fail(err)
				}
				for _, c := range cmds {
					tasks = append(tasks, task{c, a})
				}
			}
			if len(tasks) == 0 {
				break
			}
		}
		lctx, cancel := withTimeout(ctx, o.Timeout)
		specs := make([]Spec, len(tasks))
		for i, t := range tasks {
			parent := ""
			if t.parent >= 0 {
				parent = nodes[t.parent].p.Branch()
			}
			specs[i] = o.spec("beam", t.cmd, parent, len(nodes)+i, EnvDepth+"="+strconv.Itoa(d))
		}
		g, err := m.startAll(lctx, specs)
		if err != nil {
			cancel()
			return fail(err)
		}
		rs := g.results()
		cancel()
		first := len(nodes)
		for i, p := range g.procs {
			nodes = append(nodes, node{p: p, parent: tasks[i].parent})
			out.Results = append(out.Results, rs[i])
		}
		// The width best successes of this level survive, held by a
		// record each; the rest are dropped.
		var ok []int
		for i, r := range rs {
			if r.Success() {
				ok = append(ok, first+i)
			}
		}
		sort.SliceStable(ok, func(x, y int) bool { return scoreOf(out.Results[ok[x]]) > scoreOf(out.Results[ok[y]]) })
		if len(ok) > width {
			ok = ok[:width]
		}
		keep := map[int]bool{}
		for _, i := range ok {
			keep[i] = true
			if nodes[i].rel = m.holdExisting(nodes[i].p.Branch()); nodes[i].rel == nil {
				return fail(errors.New("cannot write a record"))
			}
			nodes[i].p.Keep()
		}
		for i := first; i < len(nodes); i++ {
			if !keep[i] {
				nodes[i].p.Abort()
			}
		}
		// A survivor of the level before with no surviving child goes.
		for _, a := range alive {
			has := false
			for _, i := range ok {
				if nodes[i].parent == a {
					has = true
				}
			}
			if !has {
				m.Abort(nodes[a].p.Branch(), true)
				nodes[a].rel()
			}
		}
		alive = ok
		if len(alive) == 0 {
			break
		}
	}
	if len(alive) == 0 {
		return out, nil
	}
	// Commit the best leaf, then each of its ancestors, into their
	// parents; everything else of the pattern is aborted first.
	chain := map[int]bool{}
	for i := alive[0]; i >= 0; i = nodes[i].parent {
		chain[i] = true
	}
	for i := len(nodes) - 1; i >= 0; i-- {
		if !chain[i] && nodes[i].rel != nil {
			m.Abort(nodes[i].p.Branch(), true)
			nodes[i].rel()
		}
	}
	for i := alive[0]; i >= 0; i = nodes[i].parent {
		if err := m.Commit(nodes[i].p.Branch()); err != nil {
			return fail(err)
		}
		nodes[i].rel()
		nodes[i].rel = nil
	}
	out.win(alive[0])
	return out, nil
}

// holdExisting writes a record for a branch a run made, so that it is
// reaped should this process die after the run; nil when it cannot.
func (m *Mount) holdExisting(name string) func() {
	path, err := writeRecord(newRecord(m.dir, name, true))
	if err != nil {
		return nil
	}
	var once sync.Once
	return func() { once.Do(func() { os.Remove(path) }) }
}

// tail keeps the last 64 KiB written to it.
type tail struct {
	mu  sync.Mutex
	buf []byte
}

const tailMax = 64 << 10

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if len(t.buf) > tailMax {
		t.buf = append(t.buf[:0], t.buf[len(t.buf)-tailMax:]...)
	}
	return len(p), nil
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.buf)
}

func teeTo(w io.Writer, t *tail) io.Writer {
	if w == nil {
		return t
	}
	return io.MultiWriter(w, t)
}
