package fs

import (
	"context"
	"strings"
	"syscall"

	"github.com/branchfs/branchfs/branch"
	"github.com/branchfs/branchfs/fs/transport"
	"golang.org/x/sys/unix"
)

func (n *Node) Getxattr(ctx context.Context, attr string, dest []byte) (uint32, syscall.Errno) {
	lock := n.view.Lock
	if n.viewRoot && strings.HasPrefix(attr, "system.posix_acl_") {
		lock = n.view.LockRoot // see LockRoot
	}
	if err := lock(); err != nil {
		return 0, toErrno(err)
	}
	defer n.view.Unlock()
	if len(dest) == 0 {
		dest = nil
	}
	// The kernel asks for security.capability before every write and
	// chown that follows a change of attributes (transport/killpriv.go): an open
	// file answers without a lookup.
	var sz uint32
	errno, ok := n.withTop(false, func(h *fileHandle) (errno syscall.Errno) {
		sz, errno = getxattr(dest, func(buf []byte) (int, error) { return h.f.GetXattr(attr, buf) })
		return errno
	})
	if ok {
		return sz, errno
	}
	rel, ok := n.rel()
	if !ok {
		errno, ok := n.withLower(func(h *fileHandle) (errno syscall.Errno) {
			sz, errno = getxattr(dest, func(buf []byte) (int, error) { return h.f.GetXattr(attr, buf) })
			return errno
		})
		if !ok {
			return 0, syscall.ESTALE
		}
		return sz, errno
	}
	return getxattr(dest, func(buf []byte) (int, error) { return n.view.GetXattr(rel, attr, buf) })
}

// getxattr answers a getxattr into dest with get, or with the size needed
// and ERANGE.
func getxattr(dest []byte, get func(buf []byte) (int, error)) (uint32, syscall.Errno) {
	sz, err := get(dest)
	if err == unix.ERANGE {
		sz, err = get(nil)
		if err == nil {
			return uint32(sz), syscall.ERANGE
		}
	}
	return uint32(sz), toErrno(err)
}

func (n *Node) Listxattr(ctx context.Context, dest []byte) (uint32, syscall.Errno) {
	if err := n.view.Lock(); err != nil {
		return 0, toErrno(err)
	}
	defer n.view.Unlock()
	var names []string
	var err error
	if _, open := n.withTop(false, func(h *fileHandle) syscall.Errno {
		names, err = h.f.ListXattr()
		return 0
	}); !open {
		rel, ok := n.rel()
		if ok {
			names, err = n.view.ListXattr(rel)
		} else if _, open := n.withLower(func(h *fileHandle) syscall.Errno {
			names, err = h.f.ListXattr()
			return 0
		}); !open {
			return 0, syscall.ESTALE
		}
	}
	if err != nil {
		return 0, toErrno(err)
	}
	var buf []byte
	for _, name := range names {
		buf = append(append(buf, name...), 0)
	}
	if len(dest) == 0 {
		return uint32(len(buf)), 0
	}
	if len(buf) > len(dest) {
		return uint32(len(buf)), syscall.ERANGE
	}
	return uint32(copy(dest, buf)), 0
}

func (n *Node) Setxattr(ctx context.Context, attr string, data []byte, flags uint32) syscall.Errno {
	return n.changeAttr(ctx, func(rel string) error { return n.view.SetXattr(rel, attr, data, int(flags)) },
		func(f *branch.File) error { return f.SetXattr(attr, data, int(flags)) })
}

func (n *Node) Removexattr(ctx context.Context, attr string) syscall.Errno {
	return n.changeAttr(ctx, func(rel string) error { return n.view.RemoveXattr(rel, attr) },
		func(f *branch.File) error { return f.RemoveXattr(attr) })
}

// changeAttr runs a change that may copy the node up, or changeOpen on an
// open handle of the node's file in the top layer: fsetxattr and
// fremovexattr reach the daemon without a handle, and act on the open file
// also once its name is gone or another file's, as on a local filesystem
// (withOrphan).
func (n *Node) changeAttr(ctx context.Context, change func(rel string) error, changeOpen func(f *branch.File) error) syscall.Errno {
	if err := n.view.Lock(); err != nil {
		return toErrno(err)
	}
	defer n.view.Unlock()
	if errno, ok := n.withTop(false, func(h *fileHandle) syscall.Errno { return toErrno(changeOpen(h.f)) }); ok {
		return errno
	}
	rel, ok := n.rel()
	if !ok {
		if transport.OnReader(ctx) {
			return transport.OnWorker // it may copy the file up
		}
		return n.withOrphan(false, func(h *fileHandle) syscall.Errno { return toErrno(changeOpen(h.f)) })
	}
	before, err := n.view.Stat(rel)
	if err != nil {
		return toErrno(err)
	}
	if before.Lower() && transport.OnReader(ctx) {
		return transport.OnWorker // a copy-up
	}
	if err := change(rel); err != nil {
		return toErrno(err)
	}
	if before.Lower() {
		n.replaced()
	}
	return 0
}
