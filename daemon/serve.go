// Package daemon serves a branchfs mount from a process of its own: the
// one `branchfs mount` starts, and the one MountAt starts (the program
// itself, started again). Serve is the daemon's side, Start
// the side that starts it and waits until the mount answers, Unmount the
// end of it.
package daemon

import (
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"syscall"

	"github.com/branchfs/branchfs/branch"
	"github.com/branchfs/branchfs/fs"
)

// Config is one mount: Base shown at Mnt, with its branches kept in Store.
type Config struct {
	Mnt, Base, Store string
	FS               fs.Options
	Durable          bool
	MaxBranches      int
	MaxStorage       int64 // bytes all branches' deltas may hold together; 0: no limit
}

// pidFile, in the store, holds the daemon's process ID while it serves.
const pidFile = "daemon.pid"

// Serve mounts cfg and serves it until it is unmounted or the process gets
// SIGINT or SIGTERM. On ready, when not nil, it reports as Start reads:
// warnings, each a line of its own, then "ok" or the error; it closes it.
func Serve(cfg Config, ready *os.File) error {
	fail := func(err error) error {
		if ready != nil {
			fmt.Fprintln(ready, err)
			ready.Close()
		}
		return err
	}
	// Modes come from the caller, already masked by the kernel.
	syscall.Umask(0)
	// The request loop's reader keeps a P while it waits for requests
	// (fs/transport/loop.go); everything else runs on the others. Requests spend
	// most of their time in system calls, which hold no P, and with more
	// Ps the runtime wakes more threads on other CPUs per request.
	if os.Getenv("GOMAXPROCS") == "" {
		runtime.GOMAXPROCS(1 + max(1, runtime.NumCPU()/4))
	}
	// The heap is mostly nodes that live as long as the kernel's inodes,
	// and at Go's default GOGC of 100 it grows to twice that before a
	// collection, RSS with it: 100 branches over a 10k-file base, all
	// stat'ed, ended at 118-172 MB over eight runs, against 90-96 MB at 50,
	// for about 6% more daemon CPU during the walk.
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(50)
	}
	st, err := branch.Open(cfg.Store, cfg.Base, branch.Options{Durable: cfg.Durable, MaxBranches: cfg.MaxBranches, MaxStorage: cfg.MaxStorage})
	if err != nil {
		return fail(err)
	}
	defer st.Close()
	if err := st.MarkerError(); err != nil {
		fmt.Fprintln(os.Stderr, "branchfs: warning:", err)
		if ready != nil {
			fmt.Fprintln(ready, "warning:", err)
		}
	}
	fsys, err := fs.Mount(cfg.Mnt, st, cfg.FS)
	if err != nil {
		return fail(fmt.Errorf("mount %s: %w", cfg.Mnt, err))
	}
	os.WriteFile(filepath.Join(cfg.Store, pidFile), []byte(strconv.Itoa(os.Getpid())+"\n"), 0o600)
	if ready != nil {
		fmt.Fprintln(ready, "ok")
		ready.Close()
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		<-sig
		fsys.Unmount()
	}()
	fsys.Wait()
	os.Remove(filepath.Join(cfg.Store, pidFile))
	return nil
}
