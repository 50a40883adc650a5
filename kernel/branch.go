// Package kernel holds the Go bindings of the branch() system call of the
// kernel patches in prototype/patches: its numbers, its argument layouts,
// and the calls. The FS_IOC_BRANCH_* ioctls that a branchfs daemon answers
// are package ctl's.
package kernel

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The branch() system call of the patches in prototype/patches. The kernel
// announces it in SysfsDir; without that directory nothing is called.
const (
	SysBranch  = 500 // x86_64 only
	ABIVersion = 3
	SysfsDir   = "/sys/kernel/branch"

	BR_CREATE = 1
	BR_COMMIT = 2
	BR_ABORT  = 3

	BR_FS        = 1 << 0
	BR_MEMORY    = 1 << 1 // reserved: EOPNOTSUPP
	BR_ISOLATE   = 1 << 2
	BR_CLOSE_FDS = 1 << 3

	BR_NAME_MAX     = 256 // a name of up to 254 bytes (branch.NameMax) and its NUL
	BR_MAX_BRANCHES = 64
)

// CreateAttr is the create member of union branch_attr.
type CreateAttr struct {
	Flags       uint32
	MountFd     int32
	NBranches   uint32
	_           uint32
	ChildPids   uint64 // *int32
	BranchNames uint64 // *[n][BR_NAME_MAX]byte
	Pidfds      uint64 // *int32, may be 0
}

// EndAttr is the commit and abort member of union branch_attr. CtlFd must
// be -1: the kernel knows the caller's branch.
type EndAttr struct {
	Flags uint32
	CtlFd int32
}

// ErrNoSyscall says that the running kernel does not have branch(): the
// marker directory is missing or names another number or ABI.
var ErrNoSyscall = errors.New("branch(): not in this kernel (no " + SysfsDir + "; boot a kernel with prototype/patches)")

// Available reports whether the running kernel has branch() under the
// number and ABI this package speaks. It returns an error wrapping
// syscall.ENOSYS when not. The kernel cannot change under a running
// process, so the marker is read once.
func Available() error { return available() }

var available = sync.OnceValue(checkAvailable)

func checkAvailable() error {
	if runtime.GOARCH != "amd64" {
		return fmt.Errorf("%w: %w", ErrNoSyscall, syscall.ENOSYS)
	}
	abi, err1 := readInt(SysfsDir + "/abi_version")
	nr, err2 := readInt(SysfsDir + "/syscall_nr")
	if err1 != nil || err2 != nil {
		return fmt.Errorf("%w: %w", ErrNoSyscall, syscall.ENOSYS)
	}
	if abi != ABIVersion || nr != SysBranch {
		return fmt.Errorf("branch(): kernel has ABI %d at number %d, this program speaks ABI %d at %d: %w",
			abi, nr, ABIVersion, SysBranch, syscall.ENOSYS)
	}
	return nil
}

func readInt(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}

// Branch calls branch(op, attr, size) after checking that the kernel has it.
func Branch(op int, attr unsafe.Pointer, size uintptr) (int, error) {
	if err := Available(); err != nil {
		return -1, err
	}
	// BR_CREATE returns in the children too, where only this thread of the
	// Go runtime exists: a raw call does not touch the scheduler.
	r, _, errno := unix.RawSyscall(SysBranch, uintptr(op), uintptr(attr), size)
	if errno != 0 {
		return -1, errno
	}
	return int(r), nil
}

// Child is one child that BranchCreate forked.
type Child struct {
	Pid   int
	Name  string
	Pidfd int // O_CLOEXEC, for waiting without races; the caller closes it
}

// BranchCreate forks n children, each in a new branch of the branchfs
// mounted at mnt (an open directory, the mount's root). It returns index 0
// and the children in the caller, and the child's index 1..n in each child.
//
// A child of a Go program is a copy of one thread of it, as after fork(2):
// it must do nothing but async-signal-safe work and system calls (the Go
// runtime's other threads are gone). Call it from a locked OS thread.
func BranchCreate(mnt *os.File, n int, flags uint32) (int, []Child, error) {
	if n < 1 || n > BR_MAX_BRANCHES {
		return -1, nil, syscall.EINVAL
	}
	pids := make([]int32, n)
	pidfds := make([]int32, n)
	names := make([]byte, n*BR_NAME_MAX)
	attr := CreateAttr{
		Flags:       flags,
		MountFd:     int32(mnt.Fd()),
		NBranches:   uint32(n),
		ChildPids:   uint64(uintptr(unsafe.Pointer(&pids[0]))),
		BranchNames: uint64(uintptr(unsafe.Pointer(&names[0]))),
		Pidfds:      uint64(uintptr(unsafe.Pointer(&pidfds[0]))),
	}
	idx, err := Branch(BR_CREATE, unsafe.Pointer(&attr), unsafe.Sizeof(attr))
	runtime.KeepAlive(pids)
	runtime.KeepAlive(pidfds)
	runtime.KeepAlive(names)
	if err != nil || idx != 0 {
		return idx, nil, err
	}
	children := make([]Child, n)
	for i := range children {
		name := names[i*BR_NAME_MAX : (i+1)*BR_NAME_MAX]
		children[i] = Child{Pid: int(pids[i]), Name: string(bytes.TrimRight(name, "\x00")), Pidfd: int(pidfds[i])}
	}
	return 0, children, nil
}

// endAttr is the attribute of commit and abort: the caller's branch.
var endAttr = EndAttr{CtlFd: -1}

// BranchCommit commits the caller's branch and returns 0, or the errno:
// syscall.ESTALE when a sibling won. On success every sibling and its
// descendants are killed.
//
// BranchCommit and BranchAbort are for a child of BranchCreate, which
// must run no Go runtime code: they make the system call and nothing else
// (no stack growth, no interface value, no check of the kernel, which
// BranchCreate made). A child that called a wrapper without these limits
// hung in the guest, as a child of a threaded program that takes a lock
// another thread held at the fork does.
//
//go:nosplit
func BranchCommit() syscall.Errno {
	_, _, errno := unix.RawSyscall(SysBranch, BR_COMMIT, uintptr(unsafe.Pointer(&endAttr)), unsafe.Sizeof(endAttr))
	return errno
}

// BranchAbort drops the caller's branch, ends every other task in it and
// ends the caller as if killed by SIGABRT; it returns only with an errno.
//
//go:nosplit
func BranchAbort() syscall.Errno {
	_, _, errno := unix.RawSyscall(SysBranch, BR_ABORT, uintptr(unsafe.Pointer(&endAttr)), unsafe.Sizeof(endAttr))
	return errno
}
