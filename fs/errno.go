package fs

import (
	"log"
	"syscall"

	"github.com/branchfs/branchfs/branch"
)

// toErrno is the one place internal errors become FUSE errnos, by the
// table in package branch.
func toErrno(err error) syscall.Errno {
	if err == nil {
		return 0
	}
	if errno, ok := branch.Errno(err); ok {
		return errno
	}
	log.Printf("unexpected error: %v", err)
	return syscall.EIO
}
