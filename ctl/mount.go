package ctl

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/branchfs/branchfs/branch"
	"github.com/branchfs/branchfs/internal/safedir"
	"golang.org/x/sys/unix"
)

// Mount is a client's handle on a branchfs mount, seen from its main
// view: it names views and sends the daemon commands.
type Mount struct {
	dir   string // absolute path of the mount point
	base  string // the directory it shows, as the daemon was given it
	store string // the daemon's store directory
	// owner is the user whose daemon serves the mount (-1: not known).
	// What the daemon of another user than root and this one says (its
	// base, its store, the layers of a branch) is not acted on: see
	// Trusted.
	owner int
	// Inside a run, the mount point shows the run's branch (shows), and
	// the main view and MNT/@NAME are reached at root (EnvRoot); else
	// both are "".
	root, shows string
}

// Open checks that dir is the mount point of a branchfs mount (its main
// view, or inside a run the run's mount point) and returns it.
func Open(dir string) (*Mount, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	m := &Mount{dir: filepath.Clean(abs)}
	st, err := ReadStatus(m.dir, false)
	if errors.Is(err, os.ErrPermission) {
		// The control file's mode, or the daemon, let only those who
		// may control branches in.
		return nil, &notAllowedError{dir}
	}
	if err != nil {
		return nil, fmt.Errorf("%s is not the mount point of a branchfs mount: %w", dir, err)
	}
	// A branch's view has a control file too, but no @NAME entries.
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
	st, err := ReadStatus(root, false)
	if err != nil || st.View != branch.MainName || st.Store != store {
		return fmt.Errorf("%s is the view of branch %s, and %s=%s no main view of its mount", m.dir, branch.Quote(view), EnvRoot, root)
	}
	m.root, m.shows = root, view
	return nil
}

// Home is the branch the mount point shows: main, or inside a run the
// run's.
func (m *Mount) Home() string {
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

// Owner is the user whose daemon serves the mount, from the mount table
// (the kernel's record of who mounted), or -1.
func (m *Mount) Owner() int { return m.owner }

// Trusted reports whether the mount's daemon is root's or this user's.
// Another user's daemon (one that lets others in, with user_allow_other)
// could name any directory as its base, its store or a branch's layers,
// and a run or checkpoint of this user's would bind the branch over it,
// mount overlayfs on it or write process images there.
func (m *Mount) Trusted() bool {
	return m.owner == 0 || m.owner == os.Geteuid()
}

// fuseOwner is the user_id of the FUSE mount at dir, or -1. The mount is
// found by its ID, which links and bind mounts do not hide.
func fuseOwner(dir string) int {
	id, err := branch.MountID(dir)
	if err != nil {
		return -1
	}
	ms, err := Mounts()
	if err != nil {
		return -1
	}
	for _, e := range ms {
		if e.ID != id || !strings.HasPrefix(e.FSType, "fuse") {
			continue
		}
		if v, ok := e.SuperOption("user_id"); ok {
			if n, err := strconv.Atoi(v); err == nil {
				return n
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
	if !m.Trusted() {
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
	case name == m.Home():
		return m.dir
	case name == branch.MainName:
		return m.rootDir()
	}
	return filepath.Join(m.rootDir(), BranchPrefix+name)
}

// Control opens the control file of a branch's view (OpenControl); the
// error wraps syscall.ENOENT when there is no such branch.
func (m *Mount) Control(name string) (*os.File, error) {
	f, err := OpenControl(m.View(name))
	if errors.Is(err, os.ErrNotExist) && name != branch.MainName {
		return nil, fmt.Errorf("branch %s: %w", branch.Quote(name), syscall.ENOENT)
	}
	return f, err
}

// Command writes one command to the control file of a branch's view and
// returns the answer.
func (m *Mount) Command(name, cmd string) ([]byte, error) {
	data, err := Command(m.View(name), cmd)
	if errors.Is(err, os.ErrNotExist) && name != branch.MainName {
		return nil, fmt.Errorf("branch %s: %w", branch.Quote(name), syscall.ENOENT)
	}
	return data, err
}

// Create makes a child of parent ("": the branch the mount point shows,
// main but inside a run; "main": the base) and returns its
// name. An empty name lets the daemon pick one (FS_IOC_BRANCH_CREATE);
// a given name goes through the control file, which the ioctl cannot
// carry.
func (m *Mount) Create(parent, name string) (string, error) {
	if parent == "" {
		parent = m.Home()
	}
	if parent != branch.MainName {
		if err := branch.ValidateName(parent); err != nil {
			return "", fmt.Errorf("create: parent: %w", err)
		}
	}
	if name == "" {
		f, err := m.Control(parent)
		if err != nil {
			return "", fmt.Errorf("create in %s: %w", parent, err)
		}
		defer f.Close()
		name, err := IoctlCreate(f)
		if err != nil {
			return "", fmt.Errorf("create in %s: %w", parent, err)
		}
		return name, nil
	}
	if err := branch.ValidateName(name); err != nil {
		return "", fmt.Errorf("create: %w", err)
	}
	if _, err := m.Command(parent, CmdCreate+":"+QuoteArg(name)); err != nil {
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
	if err := CheckBranchName(name); err != nil {
		return fmt.Errorf("limit: %w", err)
	}
	if _, err := m.Command(name, CmdLimit+":"+strconv.FormatInt(max, 10)); err != nil {
		return fmt.Errorf("limit %s: %w", name, err)
	}
	return nil
}

// Commit applies a branch to its parent (FS_IOC_BRANCH_COMMIT); the error
// wraps syscall.ESTALE when a sibling committed first.
func (m *Mount) Commit(name string) error {
	if err := CheckBranchName(name); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	f, err := m.Control(name)
	if err != nil {
		return fmt.Errorf("commit %s: %w", branch.Quote(name), err)
	}
	defer f.Close()
	if err := IoctlCommit(f); err != nil {
		return fmt.Errorf("commit %s: %w", branch.Quote(name), err)
	}
	return nil
}

// Abort drops a branch (FS_IOC_BRANCH_ABORT). With recursive, its live
// child branches go too (the ioctl refuses them with EBUSY).
func (m *Mount) Abort(name string, recursive bool) error {
	if err := CheckBranchName(name); err != nil {
		return fmt.Errorf("abort: %w", err)
	}
	if recursive {
		if _, err := m.Command(name, CmdAbort+":"+ArgRecursive); err != nil {
			return fmt.Errorf("abort %s: %w", branch.Quote(name), err)
		}
		return nil
	}
	f, err := m.Control(name)
	if err != nil {
		return fmt.Errorf("abort %s: %w", branch.Quote(name), err)
	}
	defer f.Close()
	if err := IoctlAbort(f); err != nil {
		return fmt.Errorf("abort %s: %w", branch.Quote(name), err)
	}
	return nil
}

// List describes every branch of the mount, main first.
func (m *Mount) List() ([]branch.Info, error) {
	st, err := ReadStatus(m.View(branch.MainName), false)
	if err != nil {
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

// Hold holds branch name for this process's kernel-path run and returns
// its layers (Hold).
func (m *Mount) Hold(name string) (*branch.Layers, error) { return Hold(m.View(name)) }

// Release ends this process's hold of branch name (Release).
func (m *Mount) Release(name string) error { return Release(m.View(name)) }

// Watch asks the daemon to end the run in branch name should this
// process, its runner, die first (CmdWatch).
func (m *Mount) Watch(name string, w WatchArg) error {
	arg, err := json.Marshal(w)
	if err != nil {
		return err
	}
	_, err = m.Command(name, CmdWatch+":"+string(arg))
	return err
}

// Unwatch ends this process's watch of branch name (CmdUnwatch).
func (m *Mount) Unwatch(name string) error {
	_, err := m.Command(name, CmdUnwatch)
	return err
}

// Publish moves the entry staged at staged (a directory that
// branch.StageData made in the store) into area of branch name's data, as
// its next generation, which it returns. The daemon does it, under the
// store's lock, while the branch is live (CmdPublish).
func (m *Mount) Publish(name, area, staged string) (int, error) {
	arg, err := json.Marshal(PublishArg{Area: area, Staged: filepath.Base(staged)})
	if err != nil {
		return 0, err
	}
	data, err := m.Command(name, CmdPublish+":"+string(arg))
	if err != nil {
		return 0, Explain(CmdPublish, name, err)
	}
	gen, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		return 0, fmt.Errorf("publish in %s: the daemon answered %q", branch.Quote(name), data)
	}
	return gen, nil
}

// CheckBranchName refuses main and invalid names where a branch is meant.
func CheckBranchName(name string) error {
	if name == branch.MainName {
		return fmt.Errorf("%s: %w", branch.Quote(name), branch.ErrMainView)
	}
	return branch.ValidateName(name)
}

// MountOfStore is the mount point of the branchfs mount that keeps its
// branches in store.
func MountOfStore(store string) (string, error) {
	ms, err := Mounts()
	if err != nil {
		return "", err
	}
	for _, e := range ms {
		if e.FSType != FSType {
			continue
		}
		if st, err := ReadStatus(e.Point, false); err == nil && SameDir(st.Store, store) {
			return e.Point, nil
		}
	}
	return "", fmt.Errorf("no branchfs mount keeps its branches in %s", store)
}

// SameDir reports whether a and b are one directory.
func SameDir(a, b string) bool {
	var sa, sb unix.Stat_t
	return unix.Stat(a, &sa) == nil && unix.Stat(b, &sb) == nil && sa.Dev == sb.Dev && sa.Ino == sb.Ino
}

// Assume is a handle on dir as the main view of a mount, taken on trust:
// no daemon is asked, Base and Store are empty and Owner is unknown. Its
// views are where a mount has them (DIR/@NAME); its commands fail unless
// a daemon answers there. For tests that lay a directory out as a mount.
func Assume(dir string) *Mount {
	return &Mount{dir: filepath.Clean(dir), owner: -1}
}
