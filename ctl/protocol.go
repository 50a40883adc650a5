package ctl

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/branchfs/branchfs/branch"
)

// ControlName is the control file at the root of every view.
const ControlName = ".branchfs_ctl"

// ControlIno is the inode number of every control file, clear of real
// inode numbers: clients (OpenControl) and the kernel's branch() check it
// to tell the control file from a user's file of the same name.
const ControlIno = 0xffff_0000_0000_0000

// BranchPrefix starts the name of a branch's view in the mount's root:
// MNT/@NAME.
const BranchPrefix = "@"

// FSType is the type of a branchfs mount in the mount table.
const FSType = "fuse.branchfs"

// FuseSuperMagic is what statfs(2) answers as the type of any FUSE
// filesystem (FUSE_SUPER_MAGIC).
const FuseSuperMagic = 0x65735546

// Verbs of the control file.
const (
	CmdCreate = "create" // create[:NAME]: a child of the view
	CmdCommit = "commit" // the view into its parent
	CmdAbort  = "abort"  // abort[:recursive]: the view's branch
	CmdList   = "list"   // list[:all]: a Status; all adds finished branches
	CmdDiff   = "diff"   // the view's branch.Diff
	CmdDelta  = "delta"  // the view's branch.Delta, as JSON
	// CmdHold holds the view's branch for the caller's kernel-path run
	// and answers its branch.Layers (fs/hold.go); CmdRelease ends a hold
	// whose process has exited or asks for it, else fails with EBUSY.
	CmdHold    = "hold"
	CmdRelease = "release"
	// CmdLimit sets the storage limit of the view's branch's own delta,
	// limit:BYTES (0: none; branch.Store.SetLimit).
	CmdLimit = "limit"
	// CmdWatch makes the daemon watch the caller, a run's runner: should
	// it die with the run unfinished, the daemon ends the run
	// (watch:WatchArg as JSON; fs/watch.go). CmdUnwatch ends the caller's
	// watch of the view's branch.
	CmdWatch   = "watch"
	CmdUnwatch = "unwatch"
	// CmdPublish moves an entry staged in the store into the view's
	// branch's data (publish:PublishArg as JSON; branch.Store.PublishData)
	// and answers its generation.
	CmdPublish = "publish"
)

// Args of the verbs that take a fixed one.
const (
	ArgRecursive = "recursive"
	ArgAll       = "all"
)

// Status is the answer to CmdList.
type Status struct {
	View     string        `json:"view"` // the branch whose view was asked
	Base     string        `json:"base"`
	Store    string        `json:"store"`
	Branches []branch.Info `json:"branches"` // main first
}

// WatchArg is CmdWatch's argument.
type WatchArg struct {
	// Abort: abort the branch should the runner die (a branch the run
	// made); else keep it (a branch it was given).
	Abort bool `json:"abort,omitempty"`
	// Cgroup is the run's cgroup v2, to kill should the runner die: a
	// cgroup of runs (branchfs.runs/NAME) that the caller owns.
	Cgroup string `json:"cgroup,omitempty"`
}

// PublishArg is CmdPublish's argument.
type PublishArg struct {
	Area   string `json:"area"`   // the branch's data area: "images", say
	Staged string `json:"staged"` // the entry's base name in the store's stage (branch.StageData)
}

// Environment variables a run's commands find (explore sets them), which
// Open and the CLI read to work inside a run.
const (
	EnvBranch = "BRANCHFS_BRANCH" // the run's branch's name
	EnvView   = "BRANCHFS_VIEW"   // where the command sees its branch: the mount point
	// EnvRoot is where a run's commands reach the mount's main view, and
	// through it MNT/@NAME of any branch (the mount point shows the
	// run's branch): an empty directory beside the run records, over
	// which the run binds the main view. Open and the CLI take it there,
	// to make and run branches inside the run.
	EnvRoot = "BRANCHFS_ROOT"
)

// QuoteArg is a name as a control command's argument: a JSON string,
// which carries any name.
func QuoteArg(name string) string {
	q, _ := json.Marshal(name)
	return string(q)
}

// UnquoteArg undoes QuoteArg; an argument that starts with no double
// quote is taken as it is.
func UnquoteArg(arg string) (string, error) {
	if !strings.HasPrefix(arg, `"`) {
		return arg, nil
	}
	var name string
	if err := json.Unmarshal([]byte(arg), &name); err != nil {
		return "", fmt.Errorf("%w: bad quoted name %s", branch.ErrInvalidName, arg)
	}
	return name, nil
}
