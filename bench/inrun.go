package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/branchfs/branchfs/ctl"
)

// Workloads inside a kernel-path run (sysRun): the run's command is this
// program again (workerArg), which does what the bench asks on its stdin,
// one JSON request a line, and answers each on its stdout with the seconds
// it took. The run starts once per system and round; only the work inside
// it is timed, as on the other systems, so that the run's own start and
// end (namespaces, the hold, the mount) are not.

const (
	sysRun    = "branchfs run (kernel path)"
	workerArg = "in-run"
)

type workerRequest struct {
	Op   string   `json:"op"`             // exec, read, write, openrw
	Dir  string   `json:"dir,omitempty"`  // exec: where
	Args []string `json:"args,omitempty"` // exec: the command
	Env  []string `json:"env,omitempty"`  // exec: more environment
	Sync []string `json:"sync,omitempty"` // exec: file systems to syncfs before and after (timed after)
	Path string   `json:"path,omitempty"` // read, write, openrw
	Cold bool     `json:"cold,omitempty"` // read
	Size int64    `json:"size,omitempty"` // write
}

type workerAnswer struct {
	Seconds float64 `json:"seconds"`
	Error   string  `json:"error,omitempty"`
}

// worker is the bench's end of a run's worker.
type worker struct {
	cmd *exec.Cmd
	in  io.Closer // the worker's stdin
	enc *json.Encoder
	dec *json.Decoder
}

// startWorker starts a kernel-path run in branch name of the mount at mnt
// whose command is the worker; the run keeps the branch.
func (b *bench) startWorker(mnt, name string) *worker {
	exe, err := os.Executable()
	must(err)
	cmd := exec.Command(b.bin, "run", "--data-path", "kernel", "--on-success", "keep", "--branch", name, mnt, "--", exe, workerArg)
	cmd.Dir = mnt // the worker's requests name absolute paths; this keeps run from warning
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	must(err)
	out, err := cmd.StdoutPipe()
	must(err)
	must(cmd.Start())
	w := &worker{cmd: cmd, in: in, enc: json.NewEncoder(in), dec: json.NewDecoder(out)}
	w.do(workerRequest{Op: "exec", Dir: mnt, Args: []string{"true"}}) // up and mounted
	return w
}

// do sends one request and returns the seconds it took.
func (w *worker) do(req workerRequest) float64 {
	must(w.enc.Encode(&req))
	var a workerAnswer
	if err := w.dec.Decode(&a); err != nil {
		fail("the run's worker: %v", err)
	}
	if a.Error != "" {
		fail("the run's worker: %s", a.Error)
	}
	return a.Seconds
}

// end ends the worker, and with it the run, which keeps its branch.
func (w *worker) end() {
	w.in.Close()
	if err := w.cmd.Wait(); err != nil {
		fail("the run: %v", err)
	}
}

// runWorker serves the requests of the bench, inside a run.
func runWorker() {
	dec := json.NewDecoder(bufio.NewReader(os.Stdin))
	enc := json.NewEncoder(os.Stdout)
	for {
		var req workerRequest
		if err := dec.Decode(&req); err != nil {
			return // stdin closed: the run ends
		}
		a := workerAnswer{}
		func() {
			defer func() {
				if r := recover(); r != nil {
					a.Error = fmt.Sprint(r)
				}
			}()
			switch req.Op {
			case "exec":
				// As the bench's own: one sync -f of them all.
				syncfs := func() {
					if len(req.Sync) > 0 {
						exec.Command("sync", append([]string{"-f"}, req.Sync...)...).Run()
					}
				}
				syncfs()
				start := time.Now()
				if err := run(req.Dir, req.Env, req.Args[0], req.Args[1:]...); err != nil {
					a.Error = err.Error()
				}
				syncfs()
				a.Seconds = time.Since(start).Seconds()
			case "read":
				a.Seconds = readFile(req.Path, req.Cold)
			case "write":
				a.Seconds = writeFile(req.Path, req.Size)
				os.Remove(req.Path)
			case "openrw":
				start := time.Now()
				f, err := os.OpenFile(req.Path, os.O_RDWR, 0)
				if err != nil {
					a.Error = err.Error()
					return
				}
				f.Close()
				a.Seconds = time.Since(start).Seconds()
			default:
				a.Error = "unknown request " + req.Op
			}
		}()
		enc.Encode(&a)
	}
}

// commitTimed commits the branch name of the mount at mnt through the
// ioctl and returns the seconds the ioctl took.
func commitTimed(mnt, name string) float64 {
	f, err := os.Open(filepath.Join(mnt, ctl.BranchPrefix+name, ctl.ControlName))
	must(err)
	defer f.Close()
	start := time.Now()
	must(ctl.IoctlCommit(f))
	return time.Since(start).Seconds()
}

// kernelPathTargets are the goals of a kernel-path run (sysRun), each
// against native ext4 in the same rounds, and its commit against the same
// change's made through a view.
func (b *bench) kernelPathTargets(check func(goal string, ok bool, format string, args ...any)) {
	ratio := func(cas, system string) (v float64, rm, lo, hi float64, ok bool) {
		r, ok1 := b.find(cas, system)
		n, ok2 := b.find(cas, sysNative)
		if !ok1 || !ok2 {
			return 0, 0, 0, 0, false
		}
		rm, lo, hi = roundRatio(r, n)
		return r.median() / n.median(), rm, lo, hi, true
	}
	for _, cas := range []string{caseExtract, caseCopy, caseRemove} {
		if v, rm, lo, hi, ok := ratio(cas, sysRun); ok {
			k, _, _, _, _ := ratio(cas, sysKOverlay)
			check(cas+" in a kernel-path run ≤ 1.5x native", v <= 1.5,
				"%.2fx native (within a round %.2f, 95%% CI %.2f–%.2f; the kernel's overlayfs alone %.2fx)", v, rm, lo, hi, k)
		}
	}
	if v, rm, lo, hi, ok := ratio(caseWrite, sysRun); ok {
		// Against overlayfs alone too: what the run adds to the kernel's
		// own cost, which the disk's moods would otherwise hide.
		k, _, _, _, _ := ratio(caseWrite, sysKOverlay)
		r, _ := b.find(caseWrite, sysRun)
		o, _ := b.find(caseWrite, sysKOverlay)
		km, klo, khi := roundRatio(r, o)
		check("a new file written and fsynced in a kernel-path run ≥ 0.9x native", v >= 0.9,
			"%.2fx native (within a round %.2f, 95%% CI %.2f–%.2f); the kernel's overlayfs alone %.2fx, "+
				"the run against it within a round %.2f (95%% CI %.2f–%.2f)", v, rm, lo, hi, k, km, klo, khi)
	}
	for _, kind := range []string{"unmodified file", "copied-up file"} {
		for _, cache := range []string{"cold", "warm"} {
			if v, rm, lo, hi, ok := ratio(kind+", "+cache+" cache", sysRun); ok {
				check(fmt.Sprintf("%s reads in a kernel-path run ≥ 97%% of native (%s)", kind, cache), v >= 0.97,
					"%.0f%% of native (within a round %.0f%%, 95%% CI %.0f–%.0f%%)", 100*v, 100*rm, 100*lo, 100*hi)
			}
		}
	}
	if v, _, _, _, ok := ratio("build cmd/gofmt from the extracted tree", sysRun); ok {
		check("source-tree build in a kernel-path run ≤ 1.05x native", v <= 1.05, "%.2fx native", v)
	}
	if r, ok := b.find(caseCommitTree, sysRun); ok {
		f, _ := b.find(caseCommitTree, sysBranch)
		rm, lo, hi := roundRatio(r, f)
		check("committing what a kernel-path run wrote ≤ 2x the commit of the same change made through a view",
			r.median() <= 2*f.median(), "%.2fx (%.1f vs %.1f ms; within a round %.2f, 95%% CI %.2f–%.2f)",
			r.median()/f.median(), r.median(), f.median(), rm, lo, hi)
	}
	if r, ok := b.find(caseExtract, sysBranch); ok {
		o, _ := b.find(caseExtract, sysOverlay)
		won, rounds := fasterRounds(r, o)
		floor := "no floor measured"
		if f, ok := b.find(caseExtract, sysFloor); ok {
			rm, lo, hi := roundRatio(r, f)
			floor = fmt.Sprintf("%.2fx the FUSE floor (%.1f vs %.1f s; within a round %.2f, 95%% CI %.2f–%.2f)",
				r.median()/f.median(), r.median(), f.median(), rm, lo, hi)
		}
		check("extracting Go's src/ in a branch view faster than fuse-overlayfs in every round", won == rounds,
			"faster in %d of %d rounds (%.2fx fuse-overlayfs); %s", won, rounds, r.median()/o.median(), floor)
	}
}
