package daemon

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/branchfs/branchfs/ctl"
	"github.com/branchfs/branchfs/fs"
	"github.com/branchfs/branchfs/internal/memfd"
)

// MountOptions configure a mount made by MountAt.
type MountOptions struct {
	// Store is where the branches are kept (required): mounting the same
	// store again brings them back, and finishes or undoes a commit that
	// a crash interrupted. It must lie outside the base and the mount
	// point, and on the base's filesystem for commits to move by rename.
	Store       string
	MaxBranches int // unfinished (live or stale) branches at most; 0: no limit
	// MaxStorage limits what all branches' changes hold together, in
	// bytes (sizes rounded up to the store's blocks, each file once):
	// writes beyond it fail with EDQUOT. 0: no limit. Spec.MaxStorage
	// limits one run's branch.
	MaxStorage   int64
	Durable      bool // flush each commit's journal record to the disk first (power loss)
	ListBranches bool // list the @NAME entries of live branches in the mount point
}

// The daemon that MountAt starts is this program, started again with
// envDaemon set; package initialization catches it, as explore's does a
// run's helper. Its configuration, a Config, comes on daemonConfigFd.
const (
	envDaemon      = "BRANCHFS_MOUNT_DAEMON"
	daemonReadyFd  = 3
	daemonConfigFd = 4
)

func init() {
	if _, ok := os.LookupEnv(envDaemon); ok {
		runDaemon()
	}
}

// MountAt shows the directory base at mnt, as `branchfs mount` does, and
// returns once the mount answers; explore.Open(mnt) then runs commands in
// its branches. The daemon that serves it is a
// process of its own, in a session of its own: this program, started
// again (package initialization catches it before main, as it does a
// run's helper), so no branchfs binary is needed, and the mount neither
// shares this program's memory, signals and fate nor deadlocks it (a
// process serving a FUSE mount must not wait on that mount itself). The
// mount outlives the program until Unmount; the daemon's log is
// STORE/daemon.log. Root mounts directly; another user needs fusermount3
// on PATH.
//
// A program that mounts so holds the daemon (this package, with go-fuse);
// one that only uses mounts (explore, ctl) does not.
func MountAt(base, mnt string, o MountOptions) (*Mounted, error) {
	if base == "" || mnt == "" {
		return nil, errors.New("mount: no base directory or mount point")
	}
	if o.Store == "" {
		return nil, errors.New("mount: MountOptions.Store is required")
	}
	if o.MaxBranches < 0 {
		return nil, fmt.Errorf("mount: negative MaxBranches %d", o.MaxBranches)
	}
	if o.MaxStorage < 0 {
		return nil, fmt.Errorf("mount: negative MaxStorage %d", o.MaxStorage)
	}
	var err error
	cfg := Config{Durable: o.Durable, MaxBranches: o.MaxBranches, MaxStorage: o.MaxStorage,
		FS: fs.Options{Passthrough: fs.PassthroughAuto, PassthroughMinSize: fs.DefaultPassthroughMinSize,
			Timeout: fs.DefaultTimeout, MaxInodes: fs.DefaultMaxInodes, ListBranches: o.ListBranches}}
	for _, p := range []struct {
		to   *string
		from string
	}{{&cfg.Base, base}, {&cfg.Mnt, mnt}, {&cfg.Store, o.Store}} {
		if *p.to, err = filepath.Abs(p.from); err != nil {
			return nil, err
		}
	}
	if err := Prepare(cfg.Mnt, cfg.Base, cfg.Store); err != nil {
		return nil, err
	}
	cfgFile, err := memfd.JSON("branchfs-daemon", cfg)
	if err != nil {
		return nil, err
	}
	defer cfgFile.Close()
	cmd := exec.Command("/proc/self/exe")
	cmd.Args = []string{"branchfs-daemon", cfg.Mnt}
	// Its environment is this program's (PATH finds fusermount3), but
	// for a race-detecting build's second of sleep at exit.
	cmd.Env = append(os.Environ(), envDaemon+"=1", "GORACE=atexit_sleep_ms=0")
	cmd.Dir = "/"
	cmd.ExtraFiles = []*os.File{cfgFile} // after the ready descriptor Start adds
	var warnings []string
	if err := Start(cmd, cfg.Mnt, cfg.Store, func(w string) { warnings = append(warnings, w) }); err != nil {
		return nil, err
	}
	if _, err := ctl.Open(cfg.Mnt); err != nil {
		Unmount(cfg.Mnt, cfg.Store, nil)
		return nil, err
	}
	return &Mounted{Dir: cfg.Mnt, Store: cfg.Store, Warnings: warnings}, nil
}

// Mounted is a mount that MountAt made.
type Mounted struct {
	Dir, Store string // absolute
	// Warnings are what the daemon warned of when it mounted (a store
	// that cannot hold overlayfs's markers, say).
	Warnings []string
}

// Unmount unmounts the mount and waits for its daemon to exit. The
// branches stay in the store for the next mount.
func (m *Mounted) Unmount() error {
	if err := Unmount(m.Dir, m.Store, nil); err != nil {
		return fmt.Errorf("unmount %s: %w", m.Dir, err)
	}
	return nil
}

func runDaemon() {
	os.Unsetenv(envDaemon)
	ready := os.NewFile(daemonReadyFd, "ready")
	var cfg Config
	if err := json.NewDecoder(os.NewFile(daemonConfigFd, "config")).Decode(&cfg); err != nil {
		fmt.Fprintln(ready, "daemon: bad configuration:", err)
		os.Exit(1)
	}
	if err := Serve(cfg, ready); err != nil {
		fmt.Fprintln(os.Stderr, "branchfs:", err)
		os.Exit(1)
	}
	os.Exit(0)
}
