package branch

import (
	"errors"
	"fmt"
	"syscall"
)

// Errors callers match with errors.Is. The FUSE glue answers each with its
// errno from errnos, and the CLI turns the errno back into its message.
var (
	ErrStale  = errors.New("branch is stale: a sibling committed first")
	ErrGone   = errors.New("branch no longer exists")
	ErrFrozen = errors.New("view has live child branches and is read-only")
	// ErrBusy: the one message for EBUSY, which the daemon also answers
	// while files of the branch are open for writing through passthrough.
	ErrBusy = errors.New("branch is busy: it has live child branches, a kernel-path run holds it, or files open for writing through passthrough")
	// ErrHeld: the view of a branch a kernel-path run holds is read-only
	// until the run ends (hold.go).
	ErrHeld        = errors.New("a kernel-path run writes this branch; its view is read-only until the run ends")
	ErrExists      = errors.New("branch already exists")
	ErrNotFound    = errors.New("no such branch")
	ErrInvalidName = errors.New("invalid branch name")
	ErrMainView    = errors.New("the main view cannot be committed or aborted")
	ErrTooMany     = errors.New("too many unfinished branches (see mount --max-branches)")
	// ErrUnfinished: a commit failed and so did its rollback; the branch
	// and its parent are read-only until a commit retried or the next
	// mount finishes or rolls it back.
	ErrUnfinished = errors.New("a commit could neither finish nor roll back; retry the commit once its cause is fixed")
	// ErrQuota: a change would take a branch's delta, or all of a
	// mount's, past its storage limit (quota.go).
	ErrQuota = errors.New("disk quota exceeded: the storage limit of the branch or of the mount (--max-storage)")
	// ErrQuotaHold: a kernel-path run writes the delta without the
	// daemon, which could not hold it to the limit.
	ErrQuotaHold = errors.New("a storage limit counts this branch's delta, which a kernel-path run would write unseen")
	// ErrInvalidLimit: a storage limit below zero.
	ErrInvalidLimit = errors.New("invalid storage limit")
	// ErrInvalidData: a per-branch data entry to publish that is not one
	// (data.go).
	ErrInvalidData = errors.New("invalid data entry")
	// ErrReplaced: where others may rename in the base, a directory the
	// branch changed or removed is no longer the one at its name there.
	ErrReplaced = errors.New("a directory of the base that the branch changed or removed was replaced by another at its name since")
	// ErrWouldWait: TryCreate, TryCommit or TryAbort found the store's
	// lock held and did nothing. It never reaches a client, so it is not
	// in errnos: package fs answers the request again where it may wait.
	ErrWouldWait = errors.New("the store's lock is held")
)

// errDeviceIsMarker: in a branch a 0/0 character device is a tombstone (an
// overlayfs whiteout), so none is made or copied up there, as overlayfs
// makes none. (Not in errnos: EPERM has other causes.)
var errDeviceIsMarker = fmt.Errorf("a 0/0 character device marks a deletion in a branch: %w", syscall.EPERM)

// errnos is the one table of what each error is on the wire. Where two
// errors share an errno, the first is the one a client is told of.
var errnos = []struct {
	err   error
	errno syscall.Errno
}{
	{ErrStale, syscall.ESTALE},
	{ErrGone, syscall.ESTALE}, // the branch behind a handle or cached name is gone
	{ErrNotFound, syscall.ENOENT},
	{ErrFrozen, syscall.EROFS},
	{ErrHeld, syscall.EROFS},
	{ErrBusy, syscall.EBUSY},
	{ErrExists, syscall.EEXIST},
	{ErrTooMany, syscall.ENOSPC},
	{ErrUnfinished, syscall.EUCLEAN}, // the commit's two sides need settling
	{ErrInvalidName, syscall.EINVAL},
	{ErrQuota, syscall.EDQUOT},
	{ErrQuotaHold, syscall.EDQUOT},
	{ErrInvalidLimit, syscall.EINVAL},
	{ErrInvalidData, syscall.EINVAL},
	{ErrMainView, syscall.EINVAL},
	{ErrReplaced, syscall.EIDRM},
}

// Errno is the errno that stands for err on the wire: its sentinel's, or
// the errno it wraps. ok is false for any other error.
func Errno(err error) (errno syscall.Errno, ok bool) {
	for _, e := range errnos {
		if errors.Is(err, e.err) {
			return e.errno, true
		}
	}
	if errors.As(err, &errno) {
		return errno, true
	}
	return 0, false
}

// ErrorOf is the sentinel error that errno stands for, or nil.
func ErrorOf(errno syscall.Errno) error {
	for _, e := range errnos {
		if e.errno == errno {
			return e.err
		}
	}
	return nil
}

// BranchError names the branch an operation failed on.
type BranchError struct {
	Op     string
	Branch string
	Err    error
}

func (e *BranchError) Error() string { return fmt.Sprintf("%s %s: %v", e.Op, Quote(e.Branch), e.Err) }
func (e *BranchError) Unwrap() error { return e.Err }
