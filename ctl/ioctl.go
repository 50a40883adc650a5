package ctl

import (
	"bytes"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The FS_IOC_BRANCH_* ioctls, answered by the daemon on any file of a
// view; C programs and the kernel's branch() use them too. The numbers are
// what _IOR('b', 0, char[128]), _IO('b', 1) and _IO('b', 2) encode;
// existing clients of this interface use exactly these.
const (
	// FS_IOC_BRANCH_CREATE creates a child of the view the file belongs
	// to and writes its name, NUL-padded, to a 128-byte buffer.
	FS_IOC_BRANCH_CREATE = iocRead<<30 | NameBufSize<<16 | 'b'<<8 // nr 0
	// FS_IOC_BRANCH_COMMIT commits the view into its parent; ESTALE when a
	// sibling committed first.
	FS_IOC_BRANCH_COMMIT = 'b'<<8 | 1
	// FS_IOC_BRANCH_ABORT drops the view's branch.
	FS_IOC_BRANCH_ABORT = 'b'<<8 | 2
)

const iocRead = 2 // _IOC_READ: the kernel writes to the caller's buffer

// NameBufSize is the size of the name buffer of FS_IOC_BRANCH_CREATE.
const NameBufSize = 128

// IoctlCreate makes a child of the view that f belongs to and returns its name.
func IoctlCreate(f *os.File) (string, error) {
	buf := make([]byte, NameBufSize)
	if err := ioctl(f, FS_IOC_BRANCH_CREATE, uintptr(unsafe.Pointer(&buf[0]))); err != nil {
		return "", err
	}
	return string(bytes.TrimRight(buf, "\x00")), nil
}

// IoctlCommit commits the view that f belongs to into its parent; the error is
// syscall.ESTALE when a sibling committed first.
func IoctlCommit(f *os.File) error { return ioctl(f, FS_IOC_BRANCH_COMMIT, 0) }

// IoctlAbort drops the branch of the view that f belongs to.
func IoctlAbort(f *os.File) error { return ioctl(f, FS_IOC_BRANCH_ABORT, 0) }

func ioctl(f *os.File, cmd, arg uintptr) error {
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), cmd, arg); errno != 0 {
		return errno
	}
	return nil
}
