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
	Parent           string        // the branch the candidates branch from; "": main
	Timeout          time.Duration // for the whole pattern (per level in Tree and Beam); 0: none
	CandidateTimeout time.Duration // for each candidate, from when its command starts; 0: none
	// MaxStorage limits what each candidate's branch holds of its own
	// changes, in bytes, as Spec.MaxStorage; 0: none.
	MaxStorage int64
	Limits     Limits // for each candidate: its memory, processes and CPU
	// MaxParallel caps the candidates that run at once; the others wait
	// for a place, in order. 0: all at once. However many there are,
	// the candidates that start together start their commands together,
	// once every one of them is set up.
	MaxParallel int
	Dir         string   // working directory of the candidates, as Spec.Dir; "": the mount point
	Env         []string // candidates' environment; nil: this process's
	Binds       []string // more paths to show each candidate's branch at

	// Stdout and Stderr take every candidate's output (nil: discarded),
	// one write at a time: a bytes.Buffer is fine, lines of two
	// candidates may interleave. Output, when set, gives each candidate
	// writers of its own instead (by its Result's index; a nil writer
	// discards), written only by that candidate's run.
	Stdout, Stderr io.Writer
	Output         func(index int) (stdout, stderr io.Writer)
	// Warn, when set, is told of the candidates' warnings (Spec.Warn),
	// each once.
	Warn func(msg string)
	// KeepOutput keeps the last 64 KiB of each candidate's stdout and
	// stderr in its Result, as well.
	KeepOutput bool

	warn *sync.Once // the candidates' warnings are written once
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

// spec is the Spec of candidate index. Its output goes to Output's
// writers, else to the shared ones (which prepare made safe to share).
func (o *Options) spec(pattern string, args []string, parent string, index int, extraEnv ...string) Spec {
	env := o.Env
	if env == nil {
		env = os.Environ()
	}
	env = append(env[:len(env):len(env)], extraEnv...)
	if parent == "" {
		parent = o.Parent
	}
	s := Spec{Args: args, Env: env, Dir: o.Dir, Binds: o.Binds, Stdout: o.Stdout, Stderr: o.Stderr,
		Parent: parent, Name: genName(pattern), Index: index, Score: true, Timeout: o.CandidateTimeout, MaxStorage: o.MaxStorage, Warn: o.Warn, warn: o.warn,
		Limits: o.Limits}
	if o.Output != nil {
		s.Stdout, s.Stderr = o.Output(index)
	}
	if o.KeepOutput {
		s.keep = &kept{}
		s.Stdout, s.Stderr = teeTo(s.Stdout, &s.keep.stdout), teeTo(s.Stderr, &s.keep.stderr)
	}
	return s
}

// prepare makes the shared writers safe for the candidates' concurrent
// runs: one lock for both, as they may be one writer.
func (o Options) prepare() Options {
	o.warn = new(sync.Once)
	if o.Stdout == nil && o.Stderr == nil {
		return o
	}
	mu := new(sync.Mutex)
	if o.Stdout != nil {
		o.Stdout = &lockedWriter{mu: mu, w: o.Stdout}
	}
	if o.Stderr != nil {
		o.Stderr = &lockedWriter{mu: mu, w: o.Stderr}
	}
	return o
}

// lockedWriter serializes writes to w.
type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func (o *Options) check(m *Mount) error {
	switch {
	case o.Timeout < 0:
		return fmt.Errorf("negative timeout %v", o.Timeout)
	case o.CandidateTimeout < 0:
		return fmt.Errorf("negative candidate timeout %v", o.CandidateTimeout)
	case o.MaxStorage < 0:
		return fmt.Errorf("negative MaxStorage %d", o.MaxStorage)
	case o.MaxParallel < 0:
		return fmt.Errorf("negative MaxParallel %d", o.MaxParallel)
	}
	if err := o.Limits.check(); err != nil {
		return err
	}
	if o.Parent != "" && o.Parent != branch.MainName {
		info, err := m.Info(o.Parent)
		if err != nil {
			return err
		}
		if info.State != branch.Live.String() {
			return fmt.Errorf("parent %s is %s", o.Parent, info.State)
		}
	}
	return nil
}

// group is a set of runs: the first wave (up to max at once) starts
// together, the rest one by one as places free up, unless the group is
// stopped first.
type group struct {
	m     *Mount
	ctx   context.Context
	specs []Spec
	max   int

	mu      sync.Mutex
	procs   []*Proc // nil until started (or given up)
	stopped bool
	ended   []chan struct{} // closed when candidate i's Proc is set and done
	free    chan struct{}   // a place freed up
	// held: a candidate's place frees up only when the pattern says so
	// (next), once it has dealt with its end: a race's winner commits
	// before anyone waiting starts.
	held bool
}

// startAll starts the first wave of runs, holding each command at a gate
// until every run of the wave is set up; the others start as earlier ones
// end. On a failure in the first wave it ends those started. Candidates
// given up (stop) before their turn end as NotStarted.
func (m *Mount) startAll(ctx context.Context, specs []Spec, max int) (*group, error) {
	return m.startGroup(ctx, specs, max, false)
}

func (m *Mount) startGroup(ctx context.Context, specs []Spec, max int, held bool) (*group, error) {
	if max <= 0 || max > len(specs) {
		max = len(specs)
	}
	g := &group{m: m, ctx: ctx, specs: specs, max: max, held: held, procs: make([]*Proc, len(specs)),
		ended: make([]chan struct{}, len(specs)), free: make(chan struct{}, len(specs))}
	for i := range g.ended {
		g.ended[i] = make(chan struct{})
	}
	if err := g.startWave(0, max); err != nil {
		return nil, err
	}
	go g.schedule(max)
	return g, nil
}

// startWave starts specs[from:to] held at one gate, waits until each is
// set up (or has ended), then opens the gate.
func (g *group) startWave(from, to int) error {
	gateR, gateW, err := os.Pipe()
	if err != nil {
		return err
	}
	defer gateW.Close()
	var started []*Proc
	for i := from; i < to; i++ {
		s := g.specs[i]
		s.gate = gateR
		p, err := g.m.start(g.ctx, s)
		if err != nil {
			gateR.Close()
			for _, q := range started {
				q.Kill()
			}
			for _, q := range started {
				q.release()
				q.Abort()
			}
			return err
		}
		started = append(started, p)
	}
	gateR.Close()
	for _, p := range started {
		select {
		case <-p.ready:
		case <-p.done:
		}
	}
	g.mu.Lock()
	for k, p := range started {
		g.procs[from+k] = p
		go g.watch(from + k)
	}
	g.mu.Unlock()
	gateW.Close()
	for _, p := range started {
		p.release()
	}
	return nil
}

// watch marks candidate i ended, and its place free unless held, once
// its run is done.
func (g *group) watch(i int) {
	<-g.procs[i].Done()
	close(g.ended[i])
	if !g.held {
		g.next()
	}
}

// next frees up a place for a candidate waiting.
func (g *group) next() { g.free <- struct{}{} }

// schedule starts the candidates after the first wave, each as a place
// frees up; a start that fails ends that candidate with the error.
func (g *group) schedule(next int) {
	for ; next < len(g.specs); next++ {
		<-g.free
		g.mu.Lock()
		if g.stopped || g.ctx.Err() != nil {
			g.mu.Unlock()
			break
		}
		p, err := g.m.Start(g.ctx, g.specs[next])
		if err != nil {
			p = notStarted(g.m, g.specs[next], err.Error())
		}
		g.procs[next] = p
		go g.watch(next)
		g.mu.Unlock()
	}
	g.mu.Lock()
	for ; next < len(g.specs); next++ {
		g.procs[next] = notStarted(g.m, g.specs[next], "")
		close(g.ended[next])
	}
	g.mu.Unlock()
}

// notStarted is a Proc that never ran.
func notStarted(m *Mount, s Spec, why string) *Proc {
	p := newProc(m, s, "")
	p.ended = true
	p.res = &Result{Index: s.Index, ExitCode: -1, NotStarted: why == "", Error: why}
	close(p.done)
	return p
}

// done is closed when candidate i has ended; proc(i) is then set.
func (g *group) done(i int) <-chan struct{} { return g.ended[i] }

func (g *group) proc(i int) *Proc {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.procs[i]
}

// stop gives up the candidates not started yet, and kills the running
// ones except keep (-1: none).
func (g *group) stop(keep int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.stopped = true
	for i, p := range g.procs {
		if p != nil && i != keep {
			p.Kill()
		}
	}
}

// results waits for every run.
func (g *group) results() []*Result {
	out := make([]*Result, len(g.specs))
	for i := range g.specs {
		<-g.done(i)
		out[i] = g.proc(i).Wait()
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

// cancelled is err, or, when the caller's ctx ended the pattern before a
// candidate committed, ctx's error.
func cancelled(ctx context.Context, what string, out *Outcome, err error) (*Outcome, error) {
	if err == nil && ctx.Err() != nil && (out == nil || !out.Committed) {
		err = fmt.Errorf("%s: %w", what, ctx.Err())
	}
	return out, err
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
	out, err := m.race(ctx, "speculate", cands, o.prepare(), 0, nil)
	return cancelled(ctx, "speculate", out, err)
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
			specs[i].Stdout = teeTo(specs[i].Stdout, outs[i])
			specs[i].Stderr = teeTo(specs[i].Stderr, outs[i])
		}
	}
	g, err := m.startGroup(ctx, specs, o.MaxParallel, true)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", pattern, err)
	}
	out := &Outcome{Pattern: pattern, Results: make([]*Result, len(cands))}
	done := make(chan int, len(cands))
	for i := range specs {
		go func() { <-g.done(i); done <- i }()
	}
	for range specs {
		i := <-done
		p := g.proc(i)
		r := p.Wait()
		out.Results[i] = r
		if out.Committed || !r.Success() {
			if !out.Committed && failed != nil && !r.NotStarted {
				failed(outs[i].String())
			}
			g.next()
			continue
		}
		// The first success commits; the others lose now, whatever
		// they are doing, and those still waiting never start.
		if err := p.Commit(); err != nil {
			r.Error = err.Error()
			g.next()
			continue
		}
		out.win(i)
		g.stop(i)
		g.next()
	}
	for i := range specs {
		if out.Winner == nil || *out.Winner != i {
			if err := g.proc(i).Abort(); err != nil {
				out.Results[i].Error = err.Error()
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
	out, err := m.bestOf(ctx, "best-of-n", cands, commit, o.prepare(), "", 0, nil)
	return cancelled(ctx, "best-of-n", out, err)
}

// bestOf runs cands as children of parent ("" for o.Parent), with indices
// from base, and keeps the best-scoring success: committed when commit,
// else aborted. extra adds environment variables.
func (m *Mount) bestOf(ctx context.Context, pattern string, cands [][]string, commit bool, o Options, parent string, base int, extra []string) (*Outcome, error) {
	ctx, cancel := withTimeout(ctx, o.Timeout)
	defer cancel()
	specs := make([]Spec, len(cands))
	for i, c := range cands {
		specs[i] = o.spec(pattern, c, parent, base+i, extra...)
	}
	g, err := m.startAll(ctx, specs, o.MaxParallel)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", pattern, err)
	}
	out := &Outcome{Pattern: pattern, Results: g.results()}
	b := best(out.Results)
	for i := range specs {
		p := g.proc(i)
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
	out, err := m.reflexion(ctx, cmd, retries, critique, o.prepare())
	return cancelled(ctx, "reflexion", out, err)
}

func (m *Mount) reflexion(ctx context.Context, cmd []string, retries int, critique []string, o Options) (*Outcome, error) {
	ctx, cancel := withTimeout(ctx, o.Timeout)
	defer cancel()
	out := &Outcome{Pattern: "reflexion"}
	feedback := ""
	for i := 0; i < retries && ctx.Err() == nil; i++ {
		var t tail
		s := o.spec("reflexion", cmd, "", i, EnvFeedback+"="+feedback)
		s.Stdout, s.Stderr = teeTo(s.Stdout, &t), teeTo(s.Stderr, &t)
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
			cs.Parent, cs.Name, cs.Branch, cs.Score, cs.keep, cs.MaxStorage = "", "", p.Branch(), false, nil, 0
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
// it). waveTimeout bounds each wave, o.Timeout all of them.
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
	out, err := m.cascaded(ctx, cmd, fanOut, waveTimeout, o.prepare())
	return cancelled(ctx, "cascaded", out, err)
}

func (m *Mount) cascaded(ctx context.Context, cmd []string, fanOut []int, waveTimeout time.Duration, o Options) (*Outcome, error) {
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
	out, err := m.tournament(ctx, cands, judge, o.prepare())
	return cancelled(ctx, "tournament", out, err)
}

func (m *Mount) tournament(ctx context.Context, cands [][]string, judge []string, o Options) (*Outcome, error) {
	ctx, cancel := withTimeout(ctx, o.Timeout)
	defer cancel()
	specs := make([]Spec, len(cands))
	for i, c := range cands {
		specs[i] = o.spec("tournament", c, "", i)
	}
	g, err := m.startAll(ctx, specs, o.MaxParallel)
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
			pick, jerr = m.judge(ctx, judge, g.proc(a).Branch(), g.proc(b).Branch(), o)
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
	for i := range specs {
		p := g.proc(i)
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
	s.Parent, s.Name, s.Branch, s.Score, s.keep, s.Timeout, s.MaxStorage = "", "", name, false, nil, 0, 0
	s.Stdout, s.Stderr = &t, o.Stderr
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
// when one has none. Results hold every level's candidates in order, and
// a candidate's index (BRANCHFS_INDEX) is its place there.
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
	out, err := m.tree(ctx, strategies, expand, depth, o.prepare())
	return cancelled(ctx, "tree", out, err)
}

func (m *Mount) tree(ctx context.Context, strategies [][]string, expand []string, depth int, o Options) (*Outcome, error) {
	if depth == 1 {
		return m.bestOf(ctx, "tree", strategies, true, o, "", 0, []string{EnvDepth + "=0"})
	}
	root, release, err := m.hold(o.Parent, "tree")
	if err != nil {
		return nil, fmt.Errorf("tree: %w", err)
	}
	defer release()
	out := &Outcome{Pattern: "tree"}
	level := strategies
	for d := 0; d < depth && len(level) > 0; d++ {
		lo, err := m.bestOf(ctx, "tree", level, true, o, root, len(out.Results), []string{EnvDepth + "=" + strconv.Itoa(d)})
		if err != nil {
			m.Abort(root, true)
			return out, err
		}
		out.Results = append(out.Results, lo.Results...)
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
	path, err := writeRecord(newRecord(m.Dir(), name, true))
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
	out, err := m.beam(ctx, strategies, expand, width, depth, o.prepare())
	return cancelled(ctx, "beam", out, err)
}

func (m *Mount) beam(ctx context.Context, strategies [][]string, expand []string, width, depth int, o Options) (*Outcome, error) {
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
		g, err := m.startAll(lctx, specs, o.MaxParallel)
		if err != nil {
			cancel()
			return fail(err)
		}
		rs := g.results()
		cancel()
		first := len(nodes)
		for i := range specs {
			nodes = append(nodes, node{p: g.proc(i), parent: tasks[i].parent})
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
	path, err := writeRecord(newRecord(m.Dir(), name, true))
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
