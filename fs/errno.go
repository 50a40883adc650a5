package fs

import (
	"errors"
	"log"
	"syscall"

	"github.com/branchfs/branchfs/branch"
	"github.com/branchfs/branchfs/fs/transport"
)

// toErrno is the one place internal errors become FUSE errnos, by the
// table in package branch. A command that would have waited on the
// request loop's reader (branch.ErrWouldWait) is answered again on a
// worker.
func toErrno(err error) syscall.Errno {
	if err == nil {
		return 0
	}
	if errors.Is(err, branch.ErrWouldWait) {
		return transport.OnWorker
	}
	if errno, ok := branch.Errno(err); ok {
		return errno
	}
	log.Printf("unexpected error: %v", err)
	return syscall.EIO
}
