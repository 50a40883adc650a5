package branch

import (
	"errors"
	"fmt"
)

// Errors callers match with errors.Is. The FUSE glue maps each to one errno.
var (
	ErrStale       = errors.New("branch is stale: a sibling committed first")
	ErrGone        = errors.New("branch no longer exists")
	ErrFrozen      = errors.New("view has live child branches and is read-only")
	ErrBusy        = errors.New("branch has live child branches")
	ErrExists      = errors.New("branch already exists")
	ErrNotFound    = errors.New("no such branch")
	ErrInvalidName = errors.New("invalid branch name")
	ErrMainView    = errors.New("the main view cannot be committed or aborted")
	ErrTooMany     = errors.New("too many unfinished branches (see mount --max-branches)")
	// ErrUnfinished: a commit failed and so did its rollback; the branch
	// and its parent are read-only until a commit retried or the next
	// mount finishes or rolls it back.
	ErrUnfinished = errors.New("a commit could neither finish nor roll back; retry the commit once its cause is fixed")
)

// BranchError names the branch an operation failed on.
type BranchError struct {
	Op     string
	Branch string
	Err    error
}

func (e *BranchError) Error() string { return fmt.Sprintf("%s %s: %v", e.Op, e.Branch, e.Err) }
func (e *BranchError) Unwrap() error { return e.Err }
