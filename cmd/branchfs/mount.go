package main

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/branchfs/branchfs/branch"
	"github.com/branchfs/branchfs/ctl"
	"github.com/branchfs/branchfs/daemon"
	"github.com/branchfs/branchfs/fs"
	"github.com/branchfs/branchfs/internal/safedir"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"
)

func mountCmd() *cobra.Command {
	var base, store, passthrough, controlGroup string
	var foreground, debug, durable, listBranches bool
	var readyFd, maxBranches, maxInodes int
	var passthroughMinSize int64
	var maxStorage sizeValue
	var cacheTimeout time.Duration
	c := &cobra.Command{
		Use:   "mount --base DIR MNT",
		Short: "Mount DIR at MNT; branches appear at MNT/@NAME",
		Long: `Show directory DIR (the base) at MNT and serve its branches at MNT/@NAME, from a daemon that runs
until unmount (--foreground: in this process). MNT is the main view: writes there go to DIR. The store
(--store) keeps each branch's changes and the log that makes commits crash-safe; mounting the same
store again finds its branches as they were, and finishes or undoes a commit a crash interrupted.
Mounting over a mount whose daemon died replaces it.`,
		Example: `  branchfs mount --base ~/project /mnt/p
  branchfs mount --base /srv/data --store /var/lib/branchfs/data --max-branches 64 /mnt/data`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			mnt, err := filepath.Abs(args[0])
			if err != nil {
				return err
			}
			if passthroughMinSize < 0 {
				return fmt.Errorf("mount: --passthrough-min-size must be 0 or more, not %d", passthroughMinSize)
			}
			switch fs.Passthrough(passthrough) {
			case fs.PassthroughAuto, fs.PassthroughOn, fs.PassthroughOff:
			default:
				return fmt.Errorf("mount: --passthrough must be auto, on or off, not %q", passthrough)
			}
			opts := fs.Options{Passthrough: fs.Passthrough(passthrough), PassthroughMinSize: passthroughMinSize, Debug: debug, Timeout: cacheTimeout, MaxInodes: maxInodes, ListBranches: listBranches}
			if controlGroup != "" {
				gid, err := lookupGroup(controlGroup)
				if err != nil {
					return fmt.Errorf("mount: --control-group: %w", err)
				}
				opts.ControlGroup = &gid
			}
			if store == "" {
				if store, err = defaultStore(mnt, base); err != nil {
					return err
				}
			}
			if err := daemon.Prepare(mnt, base, store); err != nil {
				return err
			}
			if !foreground {
				return startDaemon(mnt, store)
			}
			var ready *os.File
			if readyFd >= 0 {
				ready = os.NewFile(uintptr(readyFd), "ready")
			}
			return daemon.Serve(daemon.Config{Mnt: mnt, Base: base, Store: store, FS: opts, Durable: durable, MaxBranches: maxBranches, MaxStorage: int64(maxStorage)}, ready)
		},
	}
	c.Flags().StringVar(&base, "base", "", "directory to show at the mount point (required)")
	c.MarkFlagRequired("base")
	c.Flags().StringVar(&store, "store", "", "where branches are kept (default: one directory per mount point under /var/lib/branchfs or $XDG_STATE_HOME/branchfs); --storage is another name for it")
	c.Flags().BoolVar(&foreground, "foreground", false, "serve in this process instead of starting a daemon")
	aliasStorage(c)
	c.Flags().StringVar(&passthrough, "passthrough", "auto", "kernel passthrough for read-only opens in every view: auto or on (the same), off; bare --passthrough means on")
	c.Flags().Lookup("passthrough").NoOptDefVal = string(fs.PassthroughOn)
	c.Flags().BoolVar(&listBranches, "list-branches", false, "show the @NAME entries of live branches in the listing of MNT (hidden by default, so that tools walking MNT do not walk every branch)")
	c.Flags().Int64Var(&passthroughMinSize, "passthrough-min-size", fs.DefaultPassthroughMinSize, "files smaller than this many bytes are read through the mount's page cache instead of passthrough, which saves the round trip a stat costs after each passthrough read; 0: pass every file through")
	c.Flags().BoolVar(&debug, "debug", false, "log every FUSE request")
	c.Flags().Var(&maxStorage, "max-storage", "limit what all branches' changes hold together to SIZE bytes (512K, 10G: powers of 1024): file sizes rounded up to blocks, each file once; writes beyond it fail with EDQUOT; 0: no limit")
	c.Flags().IntVar(&maxBranches, "max-branches", 0, "refuse to create more than this many unfinished (live or stale) branches; 0: no limit")
	c.Flags().DurationVar(&cacheTimeout, "cache-timeout", fs.DefaultTimeout, "how long the kernel caches names and attributes; changes made through branchfs reach it at once, this bounds how long changes made to the base directly stay unseen")
	c.Flags().IntVar(&maxInodes, "max-inodes", fs.DefaultMaxInodes, "inodes the kernel may hold through all views before the least recently used branch views are dropped from its caches; -1: no limit")
	c.Flags().BoolVar(&durable, "durable", false, "flush each commit's journal record to the disk before the commit moves anything, so that commits stay all-or-nothing across power loss and kernel crashes too (a daemon crash never needs it); costs one disk flush per commit")
	c.Flags().StringVar(&controlGroup, "control-group", "", "group (name or GID) whose members may also create, commit and abort branches; by default only the user who mounted and root may")
	c.Flags().IntVar(&readyFd, "ready-fd", -1, "descriptor to report readiness on (internal)")
	c.Flags().MarkHidden("ready-fd")
	return c
}

// lookupGroup takes a group name or number.
func lookupGroup(g string) (uint32, error) {
	if n, err := strconv.ParseUint(g, 10, 32); err == nil {
		return uint32(n), nil
	}
	grp, err := user.LookupGroup(g)
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseUint(grp.Gid, 10, 32)
	return uint32(n), err
}

// defaultStore gives every mount point a store of its own: under
// /var/lib/branchfs (root) or $XDG_STATE_HOME/branchfs when that is on the
// base's mount, else in a hidden directory beside the base when that is
// and only root and this user can change it, else under the former all
// the same. A store on the base's mount commits
// with renames alone; one elsewhere (the base a mount root of its own, as a
// bind mount is, or the state directory on a tmpfs) copies what a commit
// moves into the base first (see branch.StageName).
func defaultStore(mnt, base string) (string, error) {
	base, err := filepath.Abs(base)
	if err != nil {
		return "", err
	}
	dir := "/var/lib/branchfs"
	if os.Geteuid() != 0 {
		state := os.Getenv("XDG_STATE_HOME")
		if state == "" {
			home, err := os.UserHomeDir()
			if err != nil {
				return "", err
			}
			state = filepath.Join(home, ".local", "state")
		}
		dir = filepath.Join(state, "branchfs")
	}
	sum := sha256.Sum256([]byte(mnt))
	name := strings.Trim(strings.ReplaceAll(mnt, "/", "-"), "-")
	if len(name) > 60 {
		name = name[len(name)-60:]
	}
	name += "-" + hex.EncodeToString(sum[:4])
	if sameMount(dir, base) {
		return filepath.Join(dir, name), nil
	}
	if beside := filepath.Dir(base); sameMount(beside, base) && unix.Access(beside, unix.W_OK) == nil && safeDir(beside) {
		return filepath.Join(beside, ".branchfs-"+filepath.Base(base)+"-"+name), nil
	}
	return filepath.Join(dir, name), nil
}

// safeDir reports whether only root and this user can change dir and the
// directories above it: a store may be made there (branch.MakeStoreDir).
// The parent of a base in a shared place (/tmp, a group's workspace) is
// not such a directory.
func safeDir(dir string) bool {
	_, err := safedir.Check(dir)
	return err == nil
}

// sameMount reports whether dir (or its nearest existing parent) is on the
// mount that holds base, where renames between the two work.
func sameMount(dir, base string) bool {
	bm, err := branch.MountID(base)
	if err != nil {
		return true // mount reports the bad base
	}
	for d := dir; ; d = filepath.Dir(d) {
		if dm, err := branch.MountID(d); err == nil {
			return dm == bm
		}
		if d == "/" {
			return false
		}
	}
}

// startDaemon runs "mount --foreground" detached and returns once it
// reports that the mount answers, or with the error it reports.
func startDaemon(mnt, store string) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	args := append([]string{"mount", "--foreground", "--ready-fd", "3", "--store", store}, daemonArgs()...)
	return daemon.Start(exec.Command(self, args...), mnt, store, func(w string) { fmt.Fprintln(os.Stderr, "branchfs: warning:", w) })
}

// daemonArgs passes this command's own flags and argument on to the daemon.
func daemonArgs() []string {
	var out []string
	args := os.Args[2:]
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--storage" || strings.HasPrefix(a, "--storage=") {
			a = strings.Replace(a, "--storage", "--store", 1)
		}
		if a == "--store" || a == "--foreground" || a == "--ready-fd" {
			if a != "--foreground" {
				i++
			}
			continue
		}
		if strings.HasPrefix(a, "--store=") || strings.HasPrefix(a, "--ready-fd=") || strings.HasPrefix(a, "--foreground=") {
			continue
		}
		out = append(out, a)
	}
	return out
}

func unmountCmd() *cobra.Command {
	var store string
	c := &cobra.Command{
		Use:   "unmount MNT",
		Short: "Unmount MNT and wait for its daemon to exit",
		Long: `Unmount the mount at MNT and wait for its daemon to exit. Branches stay in the store: mounting it
again shows them. --store finds the daemon of a mount that no longer answers.`,
		Example: `  branchfs unmount /mnt/p`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if _, err := mountPoint(args[0]); err != nil {
				return fmt.Errorf("unmount: %w", err)
			}
			mnt, err := filepath.Abs(args[0])
			if err != nil {
				return err
			}
			if info, err := ctl.ReadStatus(mnt, false); err == nil {
				store = info.Store
			}
			waiting := func(pid int) { fmt.Fprintf(os.Stderr, "unmount: waiting for the daemon (pid %d) to exit\n", pid) }
			if err := daemon.Unmount(mnt, store, waiting); err != nil {
				return fmt.Errorf("unmount %s: %w", mnt, err)
			}
			return nil
		},
	}
	c.Flags().StringVar(&store, "store", "", "the mount's store, to find its daemon when MNT does not answer; --storage is another name for it")
	aliasStorage(c)
	return c
}

// joinPassthroughValue turns mount's "--passthrough MODE" into
// "--passthrough=MODE": a bare --passthrough means on, so the flag takes
// its value only in the joined form, and "--passthrough on" would read
// "on" as the mount point.
func joinPassthroughValue(args []string) []string {
	if len(args) == 0 || args[0] != "mount" {
		return args
	}
	out := make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		if args[i] == "--" {
			return append(out, args[i:]...)
		}
		if args[i] == "--passthrough" && i+1 < len(args) {
			switch fs.Passthrough(args[i+1]) {
			case fs.PassthroughAuto, fs.PassthroughOn, fs.PassthroughOff:
				out = append(out, "--passthrough="+args[i+1])
				i++
				continue
			}
		}
		out = append(out, args[i])
	}
	return out
}

// aliasStorage makes --storage another name for --store: the reference
// implementation's, which its clients pass.
func aliasStorage(c *cobra.Command) {
	c.Flags().SetNormalizeFunc(func(_ *pflag.FlagSet, name string) pflag.NormalizedName {
		if name == "storage" {
			name = "store"
		}
		return pflag.NormalizedName(name)
	})
}
