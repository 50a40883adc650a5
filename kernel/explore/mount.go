package explore

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/branchfs/branchfs/branch"
	"github.com/branchfs/branchfs/fs"
	"github.com/branchfs/branchfs/internal/safedir"
	"github.com/branchfs/branchfs/kernel"
	"golang.org/x/sys/unix"
)

const fuseSuperMagic = 0x65735546

// Mount is a branchfs mount point, seen from its main view.
type Mount struct {
	dir   string // absolute path of the mount point
	base  string // the directory it shows, as the daemon was given it
	store string // the daemon's store directory
	// owner is the user whose daemon serves the mount (-1: not known).
	// What the daemon of another user than root and this one says (its
	// base, its store, the layers of a branch) is not acted on: see
	// trusted.
	owner int
	// dataPath is the runs' default (SetDataPath); "": auto.
	dataPath DataPath
	warnings []string // the daemon's, when MountAt started it
	// Inside a run, the mount point shows the run's branch (shows), and
	// the main view and MNT/@NAME are reached at root (EnvRoot); else
	// both are "".
	root, shows string
}

// Open checks that dir is the mount point of a branchfs mount (its main
// view) and returns it.
func Open(dir string) (*Mount, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	m := &Mount{dir: filepath.Clean(abs)}
	data, err := m.command(branch.MainName, "list")
	if errors.Is(err, os.ErrPermission) {
		// The control file's mode, or the daemon, let only those who
		// may control branches in.
		return nil, &notAllowedError{dir}
	}
	if err != nil {
		return nil, fmt.Errorf("%s is not the mount point of a branchfs mount: %w", dir, err)
	}
	// A branch's view has a control file too, but no @NAME entries.
	var st struct {
		View  string `json:"view"`
		Base  string `json:"base"`
		Store string `json:"store"`
	}
	if err := json.Unmarshal(data, &st); err != nil {
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	if st.View != branch.MainName {
		if err := m.inRun(st.View, st.Store); err != nil {
			return nil, err
		}
	}
	m.base, m.store = st.Base, st.Store
	m.owner = fuseOwner(m.dir)
	return m, nil
}

// inRun takes m, whose mount point shows branch view of the mount whose
// store is store, as the mount point of a run in that branch, as a
// command of the run sees it (EnvView, EnvBranch), with the main view at
// EnvRoot: branches made through m are the run's branch's children by
// default, and runs through m run inside the run.
func (m *Mount) inRun(view, store string) error {
	root := os.Getenv(EnvRoot)
	if root == "" || os.Getenv(EnvBranch) != view || filepath.Clean(os.Getenv(EnvView)) != m.dir {
		return fmt.Errorf("%s is the view of branch %s; give the mount point", m.dir, branch.Quote(view))
	}
	main := &Mount{dir: root}
	data, err := main.command(branch.MainName, fs.CmdList)
	var st struct {
		View  string `json:"view"`
		Store string `json:"store"`
	}
	if err != nil || json.Unmarshal(data, &st) != nil || st.View != branch.MainName || st.Store != store {
		return fmt.Errorf("%s is the view of branch %s, and %s=%s no main view of its mount", m.dir, branch.Quote(view), EnvRoot, root)
	}
	m.root, m.shows = root, view
	return nil
}

// home is the branch the mount point shows: main, or a run's.
func (m *Mount) home() string {
	if m.shows != "" {
		return m.shows
	}
	return branch.MainName
}

// rootDir is where the main view is, with MNT/@NAME under it.
func (m *Mount) rootDir() string {
	if m.root != "" {
		return m.root
	}
	return m.dir
}

// trusted reports whether the mount's daemon is root's or this user's.
// Another user's daemon (one that lets others in, with user_allow_other)
// could name any directory as its base, its store or a branch's layers,
// and a run or checkpoint of this user's would bind the branch over it,
// mount overlayfs on it or write process images there.
func (m *Mount) trusted() bool {
	return m.owner == 0 || m.owner == os.Geteuid()
}

// fuseOwner is the user_id of the FUSE mount at dir, from
// /proc/self/mountinfo (the kernel's record of who mounted), or -1. The
// mount is found by its ID, which links and bind mounts do not hide.
func fuseOwner(dir string) int {
	id, err := branch.MountID(dir)
	if err != nil {
		return -1
	}
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return -1
	}
	for line := range strings.Lines(string(data)) {
		// ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTS [OPTIONAL...] - FSTYPE SOURCE SUPEROPTS
		pre, post, ok := strings.Cut(strings.TrimSpace(line), " - ")
		pf, qf := strings.Fields(pre), strings.Fields(post)
		if !ok || len(pf) < 5 || len(qf) < 3 || pf[0] != strconv.FormatUint(id, 10) || !strings.HasPrefix(qf[0], "fuse") {
			continue
		}
		for o := range strings.SplitSeq(qf[2], ",") {
			if v, ok := strings.CutPrefix(o, "user_id="); ok {
				if n, err := strconv.Atoi(v); err == nil {
					return n
				}
			}
		}
	}
	return -1
}

// notAllowedError: the caller is not one who may control the mount's
// branches (the user who mounted, root, the mount's control group). It is
// EPERM, as the daemon answers such a caller.
type notAllowedError struct{ dir string }

func (e *notAllowedError) Error() string { return e.dir + ": permission denied" }
func (e *notAllowedError) Unwrap() error { return syscall.EPERM }

// Dir is the mount point.
func (m *Mount) Dir() string { return m.dir }

// Base is the directory the mount shows.
func (m *Mount) Base() string { return m.base }

// Store is the daemon's store directory (per-branch data such as
// checkpoint images lives in it). It fails unless the daemon is root's or
// this user's and only they can change the store (safedir).
func (m *Mount) Store() (string, error) {
	if !m.trusted() {
		return "", fmt.Errorf("%s: its daemon runs as uid %d, not as root or you: its store is not used", m.dir, m.owner)
	}
	if _, err := safedir.Check(m.store); err != nil {
		return "", fmt.Errorf("store of %s: %w", m.dir, err)
	}
	return m.store, nil
}

// View is the path of a branch's view: the mount point for main, else
// MNT/@NAME.
//
// Inside a run (EnvRoot), the mount point is the run's branch's view, and
// the others are under EnvRoot.
func (m *Mount) View(name string) string {
	if name == "" {
		name = branch.MainName
	}
	switch {
	case name == m.home():
		return m.dir
	case name == branch.MainName:
		return m.rootDir()
	}
	return filepath.Join(m.rootDir(), fs.BranchPrefix+name)
}

// control opens the control file of a branch's view, making sure it is one.
func (m *Mount) control(name string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(m.View(name), fs.ControlName), os.O_RDWR|syscall.O_NOFOLLOW, 0)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) && name != branch.MainName {
			return nil, fmt.Errorf("branch %s: %w", branch.Quote(name), syscall.ENOENT)
		}
		return nil, err
	}
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(f.Fd()), &st); err != nil || st.Type != fuseSuperMagic {
		f.Close()
		return nil, fmt.Errorf("%s is not a branchfs view", m.View(name))
	}
	return f, nil
}

// command writes one control-file command to a view and returns the answer.
func (m *Mount) command(name, cmd string) ([]byte, error) {
	f, err := m.control(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if _, err := f.Write([]byte(cmd)); err != nil {
		var errno syscall.Errno
		if errors.As(err, &errno) {
			return nil, errno
		}
		return nil, err
	}
	return io.ReadAll(io.NewSectionReader(f, 0, 1<<30))
}

// Create makes a child of parent ("": the branch the mount point shows,
// main but inside a run; "main": the base) and returns its
// name. An empty name lets the daemon pick one (FS_IOC_BRANCH_CREATE);
// a given name goes through the control file, which the ioctl cannot
// carry.
func (m *Mount) Create(parent, name string) (string, error) {
	if parent == "" {
		parent = m.home()
	}
	if parent != branch.MainName {
		if err := branch.ValidateName(parent); err != nil {
			return "", fmt.Errorf("create: parent: %w", err)
		}
	}
	if name == "" {
		f, err := m.control(parent)
		if err != nil {
			return "", fmt.Errorf("create in %s: %w", parent, err)
		}
		defer f.Close()
		name, err := kernel.Create(f)
		if err != nil {
			return "", fmt.Errorf("create in %s: %w", parent, err)
		}
		return name, nil
	}
	if err := branch.ValidateName(name); err != nil {
		return "", fmt.Errorf("create: %w", err)
	}
	if _, err := m.command(parent, fs.CmdCreate+":"+fs.QuoteArg(name)); err != nil {
		return "", fmt.Errorf("create %s in %s: %w", branch.Quote(name), branch.Quote(parent), err)
	}
	return name, nil
}

// SetLimit limits what branch name's own changes hold to max bytes (0:
// no limit of its own): writes beyond it, or beyond the mount's limit
// (mount --max-storage), fail with EDQUOT. Sizes count rounded up to the
// store's blocks, each file once. Kernel-path runs are refused in a
// branch under a limit: the daemon could not count their writes.
func (m *Mount) SetLimit(name string, max int64) error {
	if err := checkBranchName(name); err != nil {
		return fmt.Errorf("limit: %w", err)
	}
	if _, err := m.command(name, fs.CmdLimit+":"+strconv.FormatInt(max, 10)); err != nil {
		return fmt.Errorf("limit %s: %w", name, err)
	}
	return nil
}

// Commit applies a branch to its parent (FS_IOC_BRANCH_COMMIT); the error
// wraps syscall.ESTALE when a sibling committed first.
func (m *Mount) Commit(name string) error {
	if err := checkBranchName(name); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	f, err := m.control(name)
	if err != nil {
		return fmt.Errorf("commit %s: %w", branch.Quote(name), err)
	}
	defer f.Close()
	if err := kernel.Commit(f); err != nil {
		return fmt.Errorf("commit %s: %w", branch.Quote(name), err)
	}
	return nil
}

// Abort drops a branch (FS_IOC_BRANCH_ABORT). With recursive, its live
// child branches go too (the ioctl refuses them with EBUSY).
func (m *Mount) Abort(name string, recursive bool) error {
	if err := checkBranchName(name); err != nil {
		return fmt.Errorf("abort: %w", err)
	}
	if recursive {
		if _, err := m.command(name, "abort:recursive"); err != nil {
			return fmt.Errorf("abort %s: %w", branch.Quote(name), err)
		}
		return nil
	}
	f, err := m.control(name)
	if err != nil {
		return fmt.Errorf("abort %s: %w", branch.Quote(name), err)
	}
	defer f.Close()
	if err := kernel.Abort(f); err != nil {
		return fmt.Errorf("abort %s: %w", branch.Quote(name), err)
	}
	return nil
}

// List describes every branch of the mount, main first.
func (m *Mount) List() ([]branch.Info, error) {
	data, err := m.command(branch.MainName, "list")
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", m.dir, err)
	}
	var st struct {
		Branches []branch.Info `json:"branches"`
	}
	if err := json.Unmarshal(data, &st); err != nil {
		return nil, fmt.Errorf("list %s: %w", m.dir, err)
	}
	return st.Branches, nil
}

// Info describes one branch; the error wraps syscall.ENOENT when there is
// no such branch, or only a committed one of that name.
func (m *Mount) Info(name string) (branch.Info, error) {
	list, err := m.List()
	if err != nil {
		return branch.Info{}, err
	}
	for _, b := range list {
		if b.Name == name {
			return b, nil
		}
	}
	return branch.Info{}, fmt.Errorf("branch %s: %w", branch.Quote(name), syscall.ENOENT)
}

func checkBranchName(name string) error {
	if name == branch.MainName {
		return fmt.Errorf("%s: %w", branch.Quote(name), branch.ErrMainView)
	}
	return branch.ValidateName(name)
}
