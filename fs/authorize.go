package fs

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// Who may control branches. Creating, committing and aborting a branch
// (and listing and diffing them through the control file) is allowed to
// the user who mounted, to root, and to the members of Options.ControlGroup
// when the mount names one. The ioctls are answered on every file of every
// view, which any user who can open a file may call, so the daemon checks
// the caller of each request: the kernel's permission checks on the
// control file do not cover them.

// errNotAllowed says that the caller may not control branches.
var errNotAllowed = fmt.Errorf("only the user who mounted, root and the mount's control group may control branches: %w", syscall.EPERM)

// authorize fails with errNotAllowed unless the request's caller may
// control branches.
func (f *FS) authorize(ctx context.Context) error {
	c, ok := fuse.FromContext(ctx)
	if !ok {
		return errNotAllowed
	}
	if c.Uid == 0 || c.Uid == f.owner {
		return nil
	}
	g := f.opts.ControlGroup
	if g == nil {
		return errNotAllowed
	}
	if c.Gid == *g || inSupplementaryGroup(c, *g) {
		return nil
	}
	return errNotAllowed
}

// inSupplementaryGroup reads the caller's groups from /proc: the request
// carries only its filesystem uid and gid. The process must still be the
// caller (same filesystem uid), not another that reused its pid.
func inSupplementaryGroup(c *fuse.Caller, gid uint32) bool {
	if c.Pid == 0 {
		return false // not visible from the daemon's pid namespace
	}
	f, err := os.Open("/proc/" + strconv.FormatUint(uint64(c.Pid), 10) + "/status")
	if err != nil {
		return false
	}
	defer f.Close()
	uidOK, member := false, false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		key, val, _ := strings.Cut(sc.Text(), ":")
		fields := strings.Fields(val)
		switch key {
		case "Uid": // real, effective, saved, filesystem
			uidOK = len(fields) == 4 && fields[3] == strconv.FormatUint(uint64(c.Uid), 10)
		case "Groups":
			for _, g := range fields {
				if g == strconv.FormatUint(uint64(gid), 10) {
					member = true
				}
			}
		}
	}
	return uidOK && member
}

// callerBufferWritable checks that the caller's buffer of n bytes at addr
// can be written: the kernel copies an ioctl's output there only after the
// reply, so a bad buffer would turn a completed action into EFAULT. It
// writes back what the buffer holds. Where the daemon may not reach the
// caller's memory, only a NULL buffer is caught.
func callerBufferWritable(ctx context.Context, addr uint64, n int) syscall.Errno {
	if addr == 0 {
		return syscall.EFAULT
	}
	c, ok := fuse.FromContext(ctx)
	if !ok || c.Pid == 0 || n == 0 {
		return 0
	}
	buf := make([]byte, n)
	local := []unix.Iovec{{Base: &buf[0]}}
	local[0].SetLen(n)
	remote := []unix.RemoteIovec{{Base: uintptr(addr), Len: n}}
	if _, err := unix.ProcessVMReadv(int(c.Pid), local, remote, 0); err != nil {
		if err == unix.EFAULT {
			return syscall.EFAULT
		}
		return 0
	}
	if _, err := unix.ProcessVMWritev(int(c.Pid), local, remote, 0); err == unix.EFAULT {
		return syscall.EFAULT
	}
	return 0
}
