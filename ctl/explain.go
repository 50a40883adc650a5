package ctl

import (
	"errors"
	"fmt"
	"syscall"

	"github.com/branchfs/branchfs/branch"
)

// Explain turns an error of verb op on branch name into one line naming
// the branch and the cause. An errno the daemon answered is told by the
// error table of package branch (branch.ErrorOf), read in the light of
// op; the errno, and the table's error, stay reachable (errors.Is) for
// exit statuses and callers.
func Explain(op, name string, err error) error {
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		return fmt.Errorf("%s %s: %w", op, branch.Quote(name), err)
	}
	return &Error{fmt.Sprintf("%s %s: %s", op, branch.Quote(name), message(op, errno)), errno, errorOf(op, errno)}
}

// errorOf is the error of the table that errno stands for when op
// answered it, or nil.
func errorOf(op string, errno syscall.Errno) error {
	switch {
	case op == CmdHold && errno == syscall.EDQUOT:
		return branch.ErrQuotaHold
	case op == CmdPublish && errno == syscall.EINVAL:
		return branch.ErrInvalidData
	case op == CmdCommit && !commitErrno(errno):
		// A commit's ENOSPC, EROFS, EEXIST or EPERM is its filesystem's
		// (a full disk, an immutable file), not a branch error of that
		// errno.
		return nil
	}
	return branch.ErrorOf(errno)
}

// commitErrno: the errnos of a commit that are the branch's, not its
// filesystem's.
func commitErrno(errno syscall.Errno) bool {
	return errno == syscall.ESTALE || errno == syscall.EBUSY || errno == syscall.EINVAL ||
		errno == syscall.EUCLEAN || errno == syscall.ENOENT || errno == syscall.EIDRM
}

// message is errno in words, as verb op answered it.
func message(op string, errno syscall.Errno) string {
	msg := errno.Error()
	if e := errorOf(op, errno); e != nil {
		msg = e.Error()
	}
	switch {
	case op == CmdCreate && errno == syscall.EBUSY:
		// The new branch would see writes that still reach its parent,
		// through passthrough or a kernel-path run's overlayfs.
		msg = "the parent is busy: files are open for writing with passthrough in it, or a kernel-path run holds it (a run inside a run needs the outer one on --data-path fuse)"
	case op == CmdHold && errno == syscall.EOPNOTSUPP:
		msg = "the store cannot hold overlayfs's markers (see the warning of mount)"
	case op == CmdCommit && (errno == syscall.ENOTCONN || errno == syscall.ECONNABORTED):
		msg += " (the daemon stopped during the commit; the next mount finishes it or rolls it back)"
	case op == CmdCommit && errno != syscall.EUCLEAN:
		msg += " (nothing was committed)"
	}
	return msg
}

// Error is an errno a daemon answered, told in words; errors.Is finds the
// errno, and the error of branch's table it stands for.
type Error struct {
	msg   string
	errno syscall.Errno
	err   error // of branch's table, or nil
}

func (e *Error) Error() string { return e.msg }

func (e *Error) Unwrap() []error {
	if e.err == nil {
		return []error{e.errno}
	}
	return []error{e.errno, e.err}
}
