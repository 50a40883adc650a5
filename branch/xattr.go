package branch

import (
	"runtime"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Reading xattrs, two ways. By a directory and a name (getxattrAt,
// listxattrAt), for lookups, which have no descriptor of the name; and by
// the /proc path of a descriptor (listXattrs, getXattr), which copy-up and
// commit hold open on the file, O_PATH (for which f*xattr fail).
//
// Reading the xattrs of a name in a directory: getxattrat(2) and
// listxattrat(2) (Linux 6.13) take a directory descriptor and a name, as
// the other *at calls do. Before them the way was to open the name O_PATH
// and pass its /proc/self/fd path, which costs an open, a close and a walk
// through procfs and a magic link. Neither follows a final symlink.

// noXattrAt is set once the kernel has answered ENOSYS.
var noXattrAt atomic.Bool

// xattrArgs is the kernel's struct xattr_args.
type xattrArgs struct {
	value uint64
	size  uint32
	flags uint32
}

// getxattrAt reads attribute attr of name in directory dirfd into buf
// (empty: reports its size).
func getxattrAt(dirfd int, name, attr string, buf []byte) (int, error) {
	if noXattrAt.Load() {
		return viaProcPath(dirfd, name, func(p string) (int, error) { return unix.Getxattr(p, attr, buf) })
	}
	np, err := unix.BytePtrFromString(name)
	if err != nil {
		return 0, err
	}
	ap, err := unix.BytePtrFromString(attr)
	if err != nil {
		return 0, err
	}
	args := xattrArgs{size: uint32(len(buf))}
	if len(buf) > 0 {
		args.value = uint64(uintptr(unsafe.Pointer(&buf[0])))
	}
	n, _, errno := unix.Syscall6(unix.SYS_GETXATTRAT, uintptr(dirfd), uintptr(unsafe.Pointer(np)),
		unix.AT_SYMLINK_NOFOLLOW, uintptr(unsafe.Pointer(ap)), uintptr(unsafe.Pointer(&args)), unsafe.Sizeof(args))
	runtime.KeepAlive(buf)
	if errno == unix.ENOSYS {
		noXattrAt.Store(true)
		return getxattrAt(dirfd, name, attr, buf)
	}
	if errno != 0 {
		return 0, errno
	}
	return int(n), nil
}

// listxattrAt lists the attribute names of name in directory dirfd into
// buf (empty: reports the list's size).
func listxattrAt(dirfd int, name string, buf []byte) (int, error) {
	if noXattrAt.Load() {
		return viaProcPath(dirfd, name, func(p string) (int, error) { return unix.Listxattr(p, buf) })
	}
	np, err := unix.BytePtrFromString(name)
	if err != nil {
		return 0, err
	}
	var list unsafe.Pointer
	if len(buf) > 0 {
		list = unsafe.Pointer(&buf[0])
	}
	n, _, errno := unix.Syscall6(unix.SYS_LISTXATTRAT, uintptr(dirfd), uintptr(unsafe.Pointer(np)),
		unix.AT_SYMLINK_NOFOLLOW, uintptr(list), uintptr(len(buf)), 0)
	runtime.KeepAlive(buf)
	if errno == unix.ENOSYS {
		noXattrAt.Store(true)
		return listxattrAt(dirfd, name, buf)
	}
	if errno != 0 {
		return 0, errno
	}
	return int(n), nil
}

// viaProcPath calls fn with the /proc path of name in dirfd, opened O_PATH.
func viaProcPath(dirfd int, name string, fn func(p string) (int, error)) (int, error) {
	fd, err := unix.Openat(dirfd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	return fn(procPath(fd))
}

// listXattrs lists the xattr names of path p.
func listXattrs(p string) ([]string, error) {
	return xattrNames(func(buf []byte) (int, error) { return unix.Listxattr(p, buf) })
}

// xattrNames returns the names list reports, a listxattr(2) of a path or of
// a descriptor.
func xattrNames(list func(buf []byte) (int, error)) ([]string, error) {
	sz, err := list(nil)
	if err != nil || sz == 0 {
		return nil, err
	}
	buf := make([]byte, sz)
	sz, err = list(buf)
	if err != nil {
		return nil, err
	}
	var names []string
	start := 0
	for i := 0; i < sz; i++ {
		if buf[i] == 0 {
			if i > start {
				names = append(names, string(buf[start:i]))
			}
			start = i + 1
		}
	}
	return names, nil
}

// getXattr reads xattr name of path p whole.
func getXattr(p, name string) ([]byte, error) {
	sz, err := unix.Getxattr(p, name, nil)
	if err != nil {
		return nil, err
	}
	buf := make([]byte, sz)
	sz, err = unix.Getxattr(p, name, buf)
	if err != nil {
		return nil, err
	}
	return buf[:sz], nil
}

// GetXattr reads an extended attribute into buf (nil: report its size).
func (v *View) GetXattr(rel, name string, buf []byte) (int, error) {
	if IsInternalXattr(name) {
		return 0, unix.ENODATA
	}
	var n int
	err := v.atShown(rel, func(dirfd int, base string) (err error) {
		n, err = getxattrAt(dirfd, base, name, buf)
		return err
	})
	return n, noACL(name, err)
}

// noACL: a filesystem without POSIX ACLs (ramfs, tmpfs without them)
// answers EOPNOTSUPP for an ACL, where the kernel expects ENODATA, "none":
// it would fail every permission check that reads the ACL, a non-owner's
// read of a world-readable file included.
func noACL(name string, err error) error {
	if err == unix.EOPNOTSUPP && (name == "system.posix_acl_access" || name == "system.posix_acl_default") {
		return unix.ENODATA
	}
	return err
}

// ListXattr lists extended attribute names, without internal ones.
func (v *View) ListXattr(rel string) ([]string, error) {
	var all []string
	err := v.atShown(rel, func(dirfd int, base string) (err error) {
		all, err = xattrNames(func(buf []byte) (int, error) { return listxattrAt(dirfd, base, buf) })
		return err
	})
	return withoutInternal(all), err
}

func withoutInternal(names []string) []string {
	var out []string
	for _, n := range names {
		if !IsInternalXattr(n) {
			out = append(out, n)
		}
	}
	return out
}

// SetXattr sets an extended attribute, copying rel up first.
func (v *View) SetXattr(rel, name string, val []byte, flags int) error {
	if IsInternalXattr(name) {
		return unix.EPERM
	}
	return v.topEntry(rel, true, func(pfd int, n string) error {
		fd, err := unix.Openat(pfd, n, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		return unix.Setxattr(procPath(fd), name, val, flags)
	})
}

// RemoveXattr removes an extended attribute, copying rel up first.
func (v *View) RemoveXattr(rel, name string) error {
	if IsInternalXattr(name) {
		return unix.EPERM
	}
	if _, err := v.GetXattr(rel, name, nil); err != nil {
		return err
	}
	return v.topEntry(rel, true, func(pfd int, n string) error {
		fd, err := unix.Openat(pfd, n, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		return unix.Removexattr(procPath(fd), name)
	})
}
