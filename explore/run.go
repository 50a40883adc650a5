package explore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/branchfs/branchfs/branch"
	"github.com/branchfs/branchfs/ctl"
	"github.com/branchfs/branchfs/internal/memfd"
)

// Action is what becomes of a run's branch when its command ends.
type Action string

const (
	Commit Action = "commit" // apply the branch to its parent
	Abort  Action = "abort"  // drop the branch
	Keep   Action = "keep"   // leave the branch as it is
)

// Containment says how a run's processes are held together.
const (
	// ContainCgroup: a cgroup v2 of the run's own, ended with cgroup.kill,
	// inside a PID namespace of its own.
	ContainCgroup = "cgroup"
	// ContainPIDNS: a PID namespace alone, where no cgroup could be
	// written; ending its first process ends every other.
	ContainPIDNS = "pid namespace"
)

// Environment variables every command in a run finds.
const (
	EnvBranch   = ctl.EnvBranch       // the branch's name
	EnvIndex    = "BRANCHFS_INDEX"    // the candidate's index in a pattern, 0 for run
	EnvView     = ctl.EnvView         // where the command sees its branch: the mount point
	EnvFeedback = "BRANCHFS_FEEDBACK" // reflexion and cascaded: earlier attempts' output
	EnvDepth    = "BRANCHFS_DEPTH"    // tree and beam: the level, from 0
	EnvRoot     = ctl.EnvRoot         // where they reach the main view, and MNT/@NAME under it
)

// Spec describes one run.
type Spec struct {
	Args []string // the command and its arguments
	Env  []string // the command's environment; nil: this process's
	// Working directory: "" for the mount point, which shows the branch.
	// A directory inside the mount point, a branch's view, the base
	// directory or a Binds path is the same place in the branch; one
	// outside all of them is allowed, with a warning (Result.Warnings,
	// and Warn): relative writes there escape the branch.
	Dir string
	// Warn, when set, is told of what the run warns of, before the
	// command starts.
	Warn func(msg string)

	// The command's standard streams; nil: /dev/null. Writers other than
	// an *os.File are written from a goroutine of the run's own: give
	// concurrent runs separate writers, or one safe for concurrent use.
	Stdin          io.Reader
	Stdout, Stderr io.Writer

	Branch string // run in this existing branch; "": create one
	Parent string // parent of the created branch; "": the branch the mount point shows (main, but inside a run)
	Name   string // name of the created branch; "": generated

	Binds   []string      // more paths to show the branch at, besides the mount point and the base directory
	Timeout time.Duration // end the run after this long; 0: no limit
	// MaxStorage limits what the branch's own changes hold, in bytes
	// (Mount.SetLimit): writes beyond it fail with EDQUOT. 0: no limit of
	// the run's own. A run under a storage limit takes the FUSE path,
	// where the daemon counts every write.
	MaxStorage int64
	Limits     Limits // memory, processes and CPU of the run's processes together

	// What to do with the branch when the command exits 0 (default
	// Commit) and otherwise (default Abort for a branch the run created,
	// Keep for a given Branch). Start leaves the choice to the caller.
	OnSuccess, OnFailure Action

	Index int  // BRANCHFS_INDEX
	Score bool // give the command fd 3 to write a score to

	// DataPath is how the command reaches the branch's files; "": the
	// Mount's (SetDataPath), by default auto.
	DataPath DataPath

	// LastPID, when above zero, is written to the run's ns_last_pid
	// before the command starts, so that the command's PID is above it:
	// a restored process tree (checkpoint) needs its own PIDs free.
	LastPID int

	gate *os.File   // the read end of a group's gate: the command starts when it closes
	keep *kept      // Options.KeepOutput: the tails that go into the Result
	warn *sync.Once // a pattern's candidates warn once, not each
}

// kept is what a run keeps of its output for its Result.
type kept struct{ stdout, stderr tail }

// Result is how a run ended.
type Result struct {
	Branch     string  `json:"branch"`
	Index      int     `json:"index"`
	ExitCode   int     `json:"exit_code"`        // -1 when a signal ended it
	Signal     string  `json:"signal,omitempty"` // e.g. "killed"
	TimedOut   bool    `json:"timed_out,omitempty"`
	Duration   float64 `json:"duration_seconds"`
	Outcome    Action  `json:"outcome,omitempty"` // commit, abort or keep
	Committed  bool    `json:"committed"`
	Aborted    bool    `json:"aborted"`
	DeltaFiles int64   `json:"delta_files"`
	// StorageRefused counts the writes a storage limit refused in the
	// branch (Spec.MaxStorage, the mount's): EDQUOT to the command.
	StorageRefused int64    `json:"storage_refused,omitempty"`
	DeltaBytes     int64    `json:"delta_bytes"`
	Containment    string   `json:"containment"`
	DataPath       DataPath `json:"data_path,omitempty"` // kernel or fuse
	Fallback       string   `json:"fallback,omitempty"`  // why auto took the FUSE path
	// Stale: a sibling's commit made the branch stale during a kernel-path
	// run, and the run's processes were killed for it.
	Stale      bool     `json:"stale,omitempty"`
	NoCgroup   string   `json:"no_cgroup,omitempty"` // why a PID namespace alone holds the processes
	Score      *float64 `json:"score,omitempty"`
	Error      string   `json:"error,omitempty"`       // the command could not start, its score was no number, or the branch could not be ended as asked
	NotStarted bool     `json:"not_started,omitempty"` // a pattern ended before this candidate's turn came
	Warnings   []string `json:"warnings,omitempty"`
	Stdout     string   `json:"stdout,omitempty"` // Options.KeepOutput: the last 64 KiB of each
	Stderr     string   `json:"stderr,omitempty"`
	// LimitsHit names the Spec.Limits the run ran into: "memory" when the
	// kernel killed a process of it for want of memory, "pids" when a
	// fork failed for the process limit (StorageRefused tells of
	// MaxStorage).
	LimitsHit  []string `json:"limits_hit,omitempty"`
	CPUSeconds float64  `json:"cpu_seconds,omitempty"` // CPU time its processes took (with a cgroup)

	sig syscall.Signal
}

// Success reports whether the command exited 0 in time, with a score (if
// it wrote one) that is a number.
func (r *Result) Success() bool {
	return r.ExitCode == 0 && !r.TimedOut && r.Error == "" && !r.NotStarted
}

// Status is a shell's exit status for the run: the command's, 128+N when
// signal N ended it, 124 on a timeout (as timeout(1)), 127 when it could
// not start, 3 when it was killed because its branch went stale (as a
// commit of a stale branch exits).
func (r *Result) Status() int {
	switch {
	case r.Stale:
		return 3
	case r.TimedOut:
		return 124
	case r.sig != 0:
		return 128 + int(r.sig)
	case r.ExitCode < 0:
		return 127
	}
	return r.ExitCode
}

// Proc is a started run.
type Proc struct {
	m        *Mount
	spec     Spec
	name     string
	created  bool
	rec      string // the record's path
	cg       *cgroup
	noCgroup string // why there is no cgroup
	cmd      *exec.Cmd
	status   *os.File
	score    chan scoreResult
	warnings []string
	watched  bool          // the daemon watches this process for the run
	pidns    string        // the run's PID namespace, as /proc/PID/ns/pid names it
	ready    chan struct{} // closed when the helper is set up
	released chan struct{} // closed when the command may start (at once without a gate)

	mu       sync.Mutex
	start    time.Time
	timedOut bool
	done     chan struct{}
	res      *Result
	ended    bool
}

var nameSeq struct {
	sync.Mutex
	n int
}

// genName makes a branch name no other process makes: prefix, this
// process's id, a random part and a sequence number.
func genName(prefix string) string {
	nameSeq.Lock()
	nameSeq.n++
	n := nameSeq.n
	nameSeq.Unlock()
	return fmt.Sprintf("%s-%d-%s-%d", prefix, os.Getpid(), randomHex(), n)
}

// Start creates the branch (unless spec.Branch names one) and starts the
// command in it. Call Wait, then one of Commit, Abort or Keep.
func (m *Mount) Start(ctx context.Context, spec Spec) (*Proc, error) {
	p, err := m.start(ctx, spec)
	if err == nil {
		p.release()
	}
	return p, err
}

// start is Start, with the command held at spec.gate when there is one;
// release lets it go.
func (m *Mount) start(ctx context.Context, spec Spec) (*Proc, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("run: %w", err)
	}
	if len(spec.Args) == 0 || spec.Args[0] == "" {
		return nil, errors.New("run: no command")
	}
	if spec.MaxStorage < 0 {
		return nil, fmt.Errorf("run: negative MaxStorage %d", spec.MaxStorage)
	}
	if spec.Timeout < 0 {
		return nil, fmt.Errorf("run: negative timeout %v", spec.Timeout)
	}
	if spec.LastPID < 0 {
		return nil, fmt.Errorf("run: negative LastPID %d", spec.LastPID)
	}
	if err := spec.Limits.check(); err != nil {
		return nil, fmt.Errorf("run: %w", err)
	}
	if spec.OnSuccess != "" {
		if err := ValidAction(spec.OnSuccess, true); err != nil {
			return nil, fmt.Errorf("run: OnSuccess: %w", err)
		}
	}
	if spec.OnFailure != "" {
		if err := ValidAction(spec.OnFailure, false); err != nil {
			return nil, fmt.Errorf("run: OnFailure: %w", err)
		}
	}
	if spec.Branch != "" && (spec.Parent != "" || spec.Name != "") {
		return nil, errors.New("run: a branch to run in, or a parent and name for a new one, not both")
	}
	if spec.Branch != "" {
		if err := ctl.CheckBranchName(spec.Branch); err != nil {
			return nil, fmt.Errorf("run: %w", err)
		}
		info, err := m.Info(spec.Branch)
		if errors.Is(err, syscall.ENOENT) {
			return nil, fmt.Errorf("run: %w", &branch.BranchError{Op: "run in", Branch: spec.Branch, Err: branch.ErrGone})
		}
		if err != nil {
			return nil, fmt.Errorf("run: %w", err)
		}
		switch info.State {
		case branch.Live.String():
		case branch.Stale.String():
			return nil, fmt.Errorf("run: %w", &branch.BranchError{Op: "run in", Branch: spec.Branch, Err: branch.ErrStale})
		default:
			return nil, fmt.Errorf("run: %w", &branch.BranchError{Op: "run in", Branch: spec.Branch, Err: branch.ErrGone})
		}
	}
	if spec.Name != "" {
		if err := ctl.CheckBranchName(spec.Name); err != nil {
			return nil, fmt.Errorf("run: %w", err)
		}
	}
	dir := spec.Dir
	if dir == "" {
		dir = m.Dir()
	}
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	binds := make([]string, 0, len(spec.Binds))
	for _, b := range spec.Binds {
		abs, err := filepath.Abs(b)
		if err != nil {
			return nil, err
		}
		if fi, err := os.Stat(abs); err != nil || !fi.IsDir() {
			return nil, fmt.Errorf("run: --bind %s: not a directory", b)
		}
		binds = append(binds, abs)
	}
	p := newProc(m, spec, spec.Branch)
	if p.name == "" {
		p.name = spec.Name
		if p.name == "" {
			p.name = genName("run")
		}
		p.created = true
	}
	if !p.sees(dir, binds) {
		w := fmt.Sprintf("working directory %s is outside %s: what the command writes there escapes the branch", dir, m.Dir())
		p.warnings = append(p.warnings, w)
		if spec.Warn != nil {
			once := spec.warn
			if once == nil {
				once = new(sync.Once)
			}
			once.Do(func() { spec.Warn(w) })
		}
	}
	rec := newRecord(m.Dir(), p.name, p.created)
	root, cgErr := cgroupRoot()
	if cgErr == nil {
		rec.Cgroup = filepath.Join(root, cgroupsDir, cgroupName(p.name))
	}
	startJanitor()
	if p.rec, err = writeRecord(rec); err != nil {
		return nil, err
	}
	fail := func(err error) (*Proc, error) {
		p.end()
		return nil, err
	}
	if p.created {
		if _, err := m.Create(spec.Parent, p.name); err != nil {
			p.created = false
			return fail(fmt.Errorf("run: %w", err))
		}
	}
	if spec.MaxStorage > 0 {
		if err := m.SetLimit(p.name, spec.MaxStorage); err != nil {
			return fail(fmt.Errorf("run: %w", err))
		}
	}
	if cgErr == nil {
		p.cg, cgErr = newCgroup(root, rec.Cgroup, spec.Limits)
	}
	if cgErr != nil {
		if !spec.Limits.Zero() {
			// A limit that cannot be had is an error, never a run
			// without it.
			return fail(fmt.Errorf("run: limits (%s) cannot be enforced: %w", spec.Limits, cgErr))
		}
		p.noCgroup = cgErr.Error()
	}
	p.register()
	if err := p.startHelper(dir, binds); err != nil {
		return fail(fmt.Errorf("run: %w", err))
	}
	go p.wait(ctx)
	return p, nil
}

func newProc(m *Mount, spec Spec, name string) *Proc {
	return &Proc{m: m, spec: spec, name: name, done: make(chan struct{}),
		ready: make(chan struct{}), released: make(chan struct{})}
}

// rootMountpoint is the empty directory that runs bind the main view over
// (EnvRoot), made as needed beside the records' directory; "" when it
// cannot be made, and the runs go without.
func rootMountpoint() string {
	d := filepath.Join(filepath.Dir(recordsPath()), "root")
	if err := os.Mkdir(d, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		if os.MkdirAll(filepath.Dir(d), 0o700) != nil || os.Mkdir(d, 0o755) != nil {
			return ""
		}
	}
	if fi, err := os.Lstat(d); err != nil || !fi.IsDir() {
		return ""
	}
	return d
}

// release lets the command start once the helper is set up.
func (p *Proc) release() { close(p.released) }

// sees reports whether dir is a place the run shows its branch at.
func (p *Proc) sees(dir string, binds []string) bool {
	for _, d := range append([]string{p.m.Dir(), p.m.View(p.name), p.m.Base()}, binds...) {
		if d != "" && (dir == d || strings.HasPrefix(dir, strings.TrimSuffix(d, "/")+"/")) {
			return true
		}
	}
	return false
}

// rebase maps a path inside MNT/@NAME to the same place under MNT, which
// shows the branch in the run.
func (p *Proc) rebase(dir string) string {
	view := p.m.View(p.name)
	if dir == view || strings.HasPrefix(dir, view+"/") {
		return p.m.Dir() + dir[len(view):]
	}
	return dir
}

func (p *Proc) startHelper(dir string, binds []string) error {
	env := p.spec.Env
	if env == nil {
		env = os.Environ()
	}
	env = append(env[:len(env):len(env)],
		EnvBranch+"="+p.name, EnvIndex+"="+strconv.Itoa(p.spec.Index), EnvView+"="+p.m.Dir())
	// The base directory shows the branch too: a tool that has the
	// project's own path baked in must not write past the branch. (Not
	// a base that another user's daemon names: Mount.Trusted.)
	targets := []string{p.m.Dir()}
	if fi, err := os.Stat(p.m.Base()); p.m.Trusted() && filepath.IsAbs(p.m.Base()) && p.m.Base() != p.m.Dir() && err == nil && fi.IsDir() {
		targets = []string{p.m.Base(), p.m.Dir()}
	}
	dp, err := p.dataPath()
	if err != nil {
		return err
	}
	cfg := initConfig{
		View: p.m.View(p.name), Targets: append(targets, binds...), DataPath: dp,
		Dir: p.rebase(dir), Args: p.spec.Args, Env: env, Score: p.spec.Score, LastPID: p.spec.LastPID,
		Gate: p.spec.gate != nil, Root: p.m.View(branch.MainName), RootAt: rootMountpoint(),
	}
	attr := &syscall.SysProcAttr{
		Cloneflags: syscall.CLONE_NEWNS | syscall.CLONE_NEWPID,
		// Should this process die without ending the run (SIGKILL), the
		// helper dies, and with it, as PID 1, the namespace.
		Pdeathsig: syscall.SIGKILL,
	}
	if os.Geteuid() != 0 {
		// New namespaces need CAP_SYS_ADMIN: an ordinary user gets it
		// in a user namespace of its own, mapped to itself, for the
		// helper alone (it drops it before the command starts).
		cfg.UserNS = true
		uid, gid := os.Geteuid(), os.Getegid()
		attr.Cloneflags |= syscall.CLONE_NEWUSER
		attr.UidMappings = []syscall.SysProcIDMap{{ContainerID: uid, HostID: uid, Size: 1}}
		attr.GidMappings = []syscall.SysProcIDMap{{ContainerID: gid, HostID: gid, Size: 1}}
		attr.AmbientCaps = helperCaps
	}
	if p.cg != nil {
		attr.UseCgroupFD = true
		attr.CgroupFD = int(p.cg.fd.Fd())
	}
	cfgFile, err := memfd.JSON("branchfs-run", &cfg)
	if err != nil {
		return err
	}
	defer cfgFile.Close()
	statusR, statusW, err := os.Pipe()
	if err != nil {
		return err
	}
	defer statusW.Close()
	extra := []*os.File{statusW, nil, cfgFile}
	if p.spec.gate != nil {
		extra = append(extra, p.spec.gate)
	}
	var scoreW *os.File
	if p.spec.Score {
		var scoreR *os.File
		if scoreR, scoreW, err = os.Pipe(); err != nil {
			statusR.Close()
			return err
		}
		defer scoreW.Close()
		extra[scoreFd-statusFd] = scoreW
		p.score = make(chan scoreResult, 1)
		go readScore(scoreR, p.score)
	}
	cmd := exec.Command("/proc/self/exe")
	cmd.Args = []string{"branchfs-init", p.name}
	// A race-detecting build sleeps a second at exit by default: the
	// helper exits as its command does.
	cmd.Env = []string{envInit + "=1", "GORACE=atexit_sleep_ms=0"}
	cmd.Dir = "/"
	cmd.Stdin, cmd.Stdout, cmd.Stderr = p.spec.Stdin, p.spec.Stdout, p.spec.Stderr
	cmd.ExtraFiles = extra
	cmd.SysProcAttr = attr
	err = cmd.Start()
	if err != nil && p.cg != nil && p.spec.Limits.Zero() {
		// The kernel or the hierarchy may refuse CLONE_INTO_CGROUP
		// (another user's cgroup, say): fall back to the namespace alone.
		p.dropCgroup()
		p.noCgroup = "starting in the cgroup: " + err.Error()
		attr.UseCgroupFD = false
		cmd = &exec.Cmd{Path: cmd.Path, Args: cmd.Args, Env: cmd.Env, Dir: cmd.Dir,
			Stdin: cmd.Stdin, Stdout: cmd.Stdout, Stderr: cmd.Stderr, ExtraFiles: extra, SysProcAttr: attr}
		err = cmd.Start()
	}
	if err != nil {
		statusR.Close()
		return fmt.Errorf("starting the run's helper: %w", err)
	}
	p.cmd, p.status = cmd, statusR
	p.pidns, _ = os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", cmd.Process.Pid))
	return nil
}

type scoreResult struct {
	v   *float64
	err error
}

// readScore reads what a command wrote to fd 3: nothing, or numbers, of
// which the last counts. Anything else is an error, not a success.
func readScore(r *os.File, out chan<- scoreResult) {
	defer r.Close()
	var t tail
	io.Copy(&t, r) // all of it: a writer must not block on a full pipe
	f := strings.Fields(t.String())
	if len(f) == 0 {
		out <- scoreResult{}
		return
	}
	last := f[len(f)-1]
	v, err := strconv.ParseFloat(last, 64)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
		if len(last) > 40 {
			last = last[:40] + "..."
		}
		out <- scoreResult{err: fmt.Errorf("score on fd 3: %q is not a finite number", last)}
		return
	}
	out <- scoreResult{v: &v}
}

func (p *Proc) dropCgroup() {
	if p.cg != nil {
		p.cg.fd.Close()
		killCgroup(p.cg.dir)
		p.cg = nil
	}
}

// kill ends every process of the run.
func (p *Proc) kill() {
	if p.cg != nil {
		os.WriteFile(filepath.Join(p.cg.dir, "cgroup.kill"), []byte("1"), 0)
	}
	if p.cmd != nil && p.cmd.Process != nil {
		p.cmd.Process.Kill()
	}
}

// watch ends the run when ctx ends or, once the command has started (the
// helper is set up and the run released), when its timeout passes.
func (p *Proc) watch(ctx context.Context, exited <-chan struct{}) {
	end := func(timedOut bool) {
		p.mu.Lock()
		p.timedOut = timedOut
		p.mu.Unlock()
		p.kill()
	}
	for _, c := range []chan struct{}{p.released, p.ready} {
		select {
		case <-c:
		case <-exited:
			return
		case <-ctx.Done():
			end(errors.Is(ctx.Err(), context.DeadlineExceeded))
			return
		}
	}
	p.mu.Lock()
	p.start = time.Now()
	p.mu.Unlock()
	var timeout <-chan time.Time
	if p.spec.Timeout > 0 {
		t := time.NewTimer(p.spec.Timeout)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case <-ctx.Done():
		end(errors.Is(ctx.Err(), context.DeadlineExceeded))
	case <-timeout:
		end(true)
	case <-exited:
	}
}

func (p *Proc) wait(ctx context.Context) {
	exited := make(chan struct{}) // the command has ended
	go p.watch(ctx, exited)
	// The helper reports once it is set up, then how the command ended.
	dec := json.NewDecoder(p.status)
	var mounted, st initStatus
	for {
		st = initStatus{}
		if err := dec.Decode(&st); err != nil {
			st = initStatus{Exit: -1, Signal: int(syscall.SIGKILL)}
			break
		}
		if st.DataPath != "" {
			mounted = st
			continue
		}
		if !st.Ready {
			break
		}
		close(p.ready)
	}
	close(exited)
	p.cmd.Wait()
	p.status.Close()
	// The helper was PID 1: its exit ended the namespace. The cgroup also
	// holds anything that left it (setns), so end that too.
	p.kill()
	p.mu.Lock()
	var dur time.Duration
	if !p.start.IsZero() {
		dur = time.Since(p.start)
	}
	p.mu.Unlock()
	res := &Result{Branch: p.name, Index: p.spec.Index, ExitCode: st.Exit, Error: st.Error,
		Duration: dur.Seconds(), Containment: ContainPIDNS, NoCgroup: p.noCgroup, Warnings: p.warnings,
		DataPath: mounted.DataPath, Fallback: mounted.Fallback}
	if p.cg != nil {
		res.Containment = ContainCgroup
		res.LimitsHit, res.CPUSeconds = limitsHit(p.cg.dir, p.spec.Limits)
		p.cg.fd.Close()
		if err := killCgroup(p.cg.dir); err != nil && res.Error == "" {
			res.Error = err.Error()
		}
	}
	// Runs inside the run died with it: end what they left (their
	// branches, children of this one, which could not be committed
	// with them) before this one is ended.
	if p.pidns != "" {
		reapNamespace(p.pidns)
	}
	if st.Signal != 0 {
		res.sig = syscall.Signal(st.Signal)
		res.Signal = res.sig.String()
	}
	if res.DataPath == DataPathKernel {
		p.endKernelPath(res)
	}
	if res.Fallback != "" {
		fallbackOnce.Do(func() {
			fmt.Fprintf(os.Stderr, "branchfs: run: the kernel's overlayfs cannot serve runs here (%s); using the FUSE path\n", res.Fallback)
		})
	}
	p.mu.Lock()
	res.TimedOut = p.timedOut
	p.mu.Unlock()
	if k := p.spec.keep; k != nil {
		res.Stdout, res.Stderr = k.stdout.String(), k.stderr.String()
	}
	if p.score != nil {
		s := <-p.score
		res.Score = s.v
		if s.err != nil && res.Error == "" {
			res.Error = s.err.Error()
		}
	}
	p.res = res
	close(p.done)
}

// Branch is the name of the run's branch.
func (p *Proc) Branch() string { return p.name }

// Pid is the helper's process ID, PID 1 of the run's namespace.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Done is closed once the command has ended and every process of the run
// is gone.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Kill ends the run's processes now; Wait then returns.
func (p *Proc) Kill() { p.kill() }

// Wait waits for the command to end, then ends every process it left and
// returns how it went. The branch stays until Commit, Abort or Keep.
func (p *Proc) Wait() *Result {
	<-p.done
	return p.res
}

// Commit waits for the run, then applies its branch to the parent. On
// failure (syscall.ESTALE: a sibling won) the branch stays.
func (p *Proc) Commit() error {
	r := p.Wait()
	if p.name == "" {
		return errors.New("commit: the run never started")
	}
	p.delta(r)
	err := p.m.Commit(p.name)
	if err == nil {
		r.Outcome, r.Committed = Commit, true
		p.end()
	}
	return err
}

// Abort waits for the run, then drops its branch and any child branches
// it made.
func (p *Proc) Abort() error {
	r := p.Wait()
	if p.name == "" {
		return nil // it never started: there is no branch
	}
	p.delta(r)
	err := p.m.Abort(p.name, true)
	if err == nil || errors.Is(err, syscall.ENOENT) {
		r.Outcome, r.Aborted = Abort, true
		p.end()
		return nil
	}
	return err
}

// Keep waits for the run and leaves its branch as it is.
func (p *Proc) Keep() {
	r := p.Wait()
	if p.name == "" {
		return
	}
	p.delta(r)
	r.Outcome = Keep
	p.created = false
	p.end()
}

func (p *Proc) delta(r *Result) {
	if info, err := p.m.Info(p.name); err == nil {
		r.DeltaFiles, r.DeltaBytes, r.StorageRefused = info.DeltaFiles, info.DeltaBytes, info.StorageRefused
	}
}

// end drops the run's record; before Start succeeded, it also undoes what
// Start made.
func (p *Proc) end() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ended {
		return
	}
	p.ended = true
	if p.cmd == nil {
		p.dropCgroup()
		if p.created {
			p.m.Abort(p.name, true)
		}
	}
	if p.watched {
		p.m.Unwatch(p.name) // gone with its branch, if that is gone
	}
	if p.rec != "" {
		os.Remove(p.rec)
	}
}

// register asks the daemon to end the run should this process die first:
// kill its cgroup and abort the branch it made (fs/watch.go), at once,
// where the janitor and Reap would come later or not at all. A daemon
// that cannot leaves it to them.
func (p *Proc) register() {
	w := ctl.WatchArg{Abort: p.created}
	if p.cg != nil {
		w.Cgroup = p.cg.dir
	}
	if p.m.Watch(p.name, w) == nil {
		p.watched = true
	}
}

// Run runs a command in a branch and ends the branch as spec says.
// The error is about the branch (it could not be made, committed or
// aborted); how the command went is in the Result.
//
// When ctx ends before the command does, the run's processes are killed,
// its branch is ended as for a failure, and the error wraps ctx.Err().
func (m *Mount) Run(ctx context.Context, spec Spec) (*Result, error) {
	p, err := m.Start(ctx, spec)
	if err != nil {
		return nil, err
	}
	r, err := p.Finish(spec.OnSuccess, spec.OnFailure)
	if err == nil && ctx.Err() != nil && !r.Success() {
		err = ctx.Err()
	}
	if err != nil {
		err = fmt.Errorf("run: %w", err)
	}
	return r, err
}

// Finish waits for the run and ends its branch: onSuccess when the command
// exited 0 in time (default Commit), onFailure otherwise (default Abort
// for a branch the run created, else Keep). A failed commit is a failure:
// onFailure applies, and the error says why.
func (p *Proc) Finish(onSuccess, onFailure Action) (*Result, error) {
	r := p.Wait()
	if onSuccess == "" {
		onSuccess = Commit
	}
	if onFailure == "" {
		onFailure = Keep
		if p.created {
			onFailure = Abort
		}
	}
	var err error
	if r.Success() {
		if onSuccess == Keep {
			p.Keep()
			return r, nil
		}
		if err = p.Commit(); err == nil {
			return r, nil
		}
	}
	if daemonGone(err) {
		return r, p.keepForRemount(err)
	}
	switch onFailure {
	case Abort:
		if aerr := p.Abort(); daemonGone(aerr) {
			return r, p.keepForRemount(aerr)
		} else if aerr != nil && err == nil {
			err = aerr
		}
	default:
		p.Keep()
	}
	return r, err
}

// ValidAction checks an action given by name for onSuccess (commit, keep)
// or onFailure (abort, keep).
func ValidAction(a Action, success bool) error {
	switch {
	case a == Keep, success && a == Commit, !success && a == Abort:
		return nil
	case success:
		return fmt.Errorf("%q is not commit or keep", a)
	}
	return fmt.Errorf("%q is not abort or keep", a)
}
