package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/branchfs/branchfs/explore"
	"github.com/spf13/cobra"
)

// exitStatus makes main exit with a status of its own choosing, after
// printing nothing (the command's output said it all).
type exitStatus int

func (e exitStatus) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

// limitFlags are the limits of a run, or of each candidate of a pattern.
type limitFlags struct {
	memory sizeValue
	pids   int
	cpus   float64
}

func (f *limitFlags) add(c *cobra.Command, what string) {
	c.Flags().Var(&f.memory, "memory", "the most memory "+what+" may use, e.g. 512M (its cgroup's memory.max; past it the kernel kills a process of it)")
	c.Flags().IntVar(&f.pids, "pids", 0, "the most processes and threads "+what+" may have at once (pids.max; a fork past it fails)")
	c.Flags().Float64Var(&f.cpus, "cpus", 0, "the CPU time "+what+" may take, in CPUs, e.g. 0.5 (cpu.max)")
}

// limits are the flags' limits. One this machine cannot enforce fails the
// run when it starts, with the reason.
func (f *limitFlags) limits() explore.Limits {
	return explore.Limits{Memory: int64(f.memory), Pids: f.pids, CPUs: f.cpus}
}

// limitsHit says which limits a run or candidate ran into, or "".
func limitsHit(r *explore.Result) string {
	if len(r.LimitsHit) == 0 {
		return ""
	}
	return "hit its " + strings.Join(r.LimitsHit, " and ") + " limit"
}

// warn prints a run's warnings, for Spec.Warn and Options.Warn.
func warn(what string) func(string) {
	return func(msg string) { fmt.Fprintf(os.Stderr, "branchfs: %s: warning: %s\n", what, msg) }
}

// warnContainment says, once, when a PID namespace alone held the
// processes of a run or a pattern's candidates.
func warnContainment(what string, rs []*explore.Result) {
	for _, r := range rs {
		if r != nil && !r.NotStarted && r.Containment != "" && r.Containment != explore.ContainCgroup {
			fmt.Fprintf(os.Stderr, "branchfs: %s: processes held by a %s only (no cgroup: %s)\n", what, r.Containment, r.NoCgroup)
			return
		}
	}
}

// interruptible cancels ctx on SIGINT, SIGTERM and SIGHUP, so that a run
// ends its processes and branches before branchfs exits (with 128+N).
func interruptible() (context.Context, func() int) {
	ctx, cancel := context.WithCancel(context.Background())
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	var got syscall.Signal
	done := make(chan struct{})
	go func() {
		select {
		case s := <-sigs:
			got = s.(syscall.Signal)
			cancel()
		case <-done:
		}
	}()
	return ctx, func() int {
		close(done)
		signal.Stop(sigs)
		if got != 0 {
			return 128 + int(got)
		}
		return 0
	}
}

func runCmd() *cobra.Command {
	var branchName, parent, onSuccess, onFailure, dataPath string
	var timeout time.Duration
	var maxStorage sizeValue
	var asJSON bool
	var binds []string
	var lim limitFlags
	c := &cobra.Command{
		Use:   "run MNT -- CMD ARGS...",
		Short: "Run CMD in a branch in which MNT shows the branch; commit or abort it when CMD ends",
		Long: `Run CMD in a new branch of MNT (a child of --parent, default main), or in the existing branch
--branch NAME. CMD runs in a private mount namespace in which MNT itself (and each --bind PATH) shows
the branch, with its working directory moved into the branch when it was inside MNT. Every process it
starts ends with it. When CMD exits 0 the branch is committed (--on-success keep leaves it); otherwise
a branch the run made is aborted (--on-failure keep leaves it; a --branch is kept unless told).
Its output and exit status are CMD's. --data-path kernel mounts the kernel's overlayfs over the branch's
layers in the run (native speed; the branch's view MNT/@NAME is read-only until the run ends); fuse binds
the view; auto (the default) takes the kernel path where it can and says once on stderr when not.`,
		Example: `  branchfs run /mnt/p -- make test
  branchfs run --on-success keep --timeout 10m /mnt/p -- ./agent.sh
  branchfs run --branch try1 --bind "$HOME/project" /mnt/p -- make`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			dash := cmd.ArgsLenAtDash()
			if dash != 1 || len(args) < 2 {
				return errors.New("run: usage: branchfs run [flags] MNT -- CMD ARGS")
			}
			if branchName != "" && parent != "" {
				return errors.New("run: --branch and --parent exclude each other")
			}
			spec := explore.Spec{Args: args[1:], Branch: branchName, Parent: parent, Binds: binds, Timeout: timeout,
				MaxStorage: int64(maxStorage),
				OnSuccess:  explore.Action(onSuccess), OnFailure: explore.Action(onFailure),
				Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr, Warn: warn("run")}
			if err := explore.ValidAction(spec.OnSuccess, true); err != nil {
				return fmt.Errorf("run: --on-success: %w", err)
			}
			if onFailure != "" {
				if err := explore.ValidAction(spec.OnFailure, false); err != nil {
					return fmt.Errorf("run: --on-failure: %w", err)
				}
			}
			spec.Dir, _ = os.Getwd()
			spec.Limits = lim.limits()
			var err error
			if spec.DataPath, err = explore.ParseDataPath(dataPath); err != nil {
				return fmt.Errorf("run: --%w", err)
			}
			if timeout < 0 {
				return fmt.Errorf("run: --timeout must not be negative")
			}
			m, err := openMount(args[0])
			if err != nil {
				return fmt.Errorf("run: %w", err)
			}
			if asJSON {
				// The record is the only thing on stdout.
				spec.Stdout = os.Stderr
			}
			ctx, stop := interruptible()
			res, err := m.Run(ctx, spec)
			sig := stop()
			if res == nil {
				return err
			}
			warnContainment("run", []*explore.Result{res})
			if res.StorageRefused > 0 {
				fmt.Fprintf(os.Stderr, "branchfs: run: the storage limit refused %d writes (EDQUOT)\n", res.StorageRefused)
			}
			if res.Error != "" && err == nil {
				fmt.Fprintf(os.Stderr, "branchfs: run: %s\n", res.Error)
			}
			if hit := limitsHit(res); hit != "" {
				fmt.Fprintf(os.Stderr, "branchfs: run: the command %s (%s)\n", hit, spec.Limits)
			}
			if asJSON {
				json.NewEncoder(os.Stdout).Encode(res)
			} else if res.Outcome == explore.Keep {
				fmt.Fprintf(os.Stderr, "branchfs: run: kept branch %s at %s\n", res.Branch, m.View(res.Branch))
			}
			if sig != 0 {
				return exitStatus(sig)
			}
			if err != nil {
				return err
			}
			if s := res.Status(); s != 0 {
				return exitStatus(s)
			}
			return nil
		},
	}
	c.Flags().StringVar(&branchName, "branch", "", "run in this existing branch")
	c.Flags().StringVar(&parent, "parent", "", "parent of the new branch (default main)")
	c.Flags().StringVar(&onSuccess, "on-success", "commit", "commit or keep the branch when CMD exits 0")
	c.Flags().StringVar(&onFailure, "on-failure", "", "abort or keep the branch otherwise (default: abort a new branch, keep a --branch)")
	c.Flags().DurationVar(&timeout, "timeout", 0, "end the run after this long (e.g. 30s)")
	c.Flags().Var(&maxStorage, "max-storage", "limit what the branch's own changes hold to SIZE bytes (512K, 10G): writes beyond it fail with EDQUOT; the run takes the FUSE path")
	c.Flags().BoolVar(&asJSON, "json", false, "print a JSON record of the run on stdout (CMD's stdout goes to stderr)")
	c.Flags().StringArrayVar(&binds, "bind", nil, "also show the branch at this path (repeatable)")
	lim.add(c, "the run")
	c.Flags().StringVar(&dataPath, "data-path", string(explore.DataPathAuto), "kernel (overlayfs in the run), fuse (the branch's view) or auto")
	return c
}
