package fs

import (
	"context"
	"syscall"

	"github.com/branchfs/branchfs/branch"
	"github.com/branchfs/branchfs/fs/transport"
	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

func (n *Node) Setattr(ctx context.Context, fh gofs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	// An open file needs no path: its name may be another file's by now.
	if err := n.view.Lock(); err != nil {
		return toErrno(err)
	}
	defer n.view.Unlock()
	if h, ok := handleOf(fh); ok && h.f.Writable() {
		return n.setattrFd(ctx, h, in, out)
	}
	_, resize := in.GetSize() // ftruncate needs a descriptor open for writing
	if errno, ok := n.withTop(resize, func(h *fileHandle) syscall.Errno { return n.setattrFd(ctx, h, in, out) }); ok {
		return errno
	}
	rel, ok := n.rel()
	if !ok {
		if transport.OnReader(ctx) {
			return transport.OnWorker // it may copy the file up
		}
		return n.withOrphan(resize, func(h *fileHandle) syscall.Errno { return n.setattrFd(ctx, h, in, out) })
	}
	v := n.view
	before, err := v.Stat(rel)
	if err != nil {
		return toErrno(err)
	}
	if before.Lower() && transport.OnReader(ctx) {
		return transport.OnWorker // a copy-up
	}
	if err := applySetattr(in, pathAttrs{v, rel}); err != nil {
		return toErrno(err)
	}
	after, err := v.Stat(rel)
	if err != nil {
		return toErrno(err)
	}
	if after.Layer != before.Layer {
		n.replaced()
	}
	fillAttr(&out.Attr, &after.Stat)
	n.finishSetattr(out)
	return 0
}

// setattrFd applies a setattr through h, a handle on the file itself in the
// view's top layer: the common case of tar, cp -p and editors needs no
// lookups.
func (n *Node) setattrFd(ctx context.Context, h *fileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	_, withFh := in.GetFh()
	if err := applySetattr(in, fileAttrs{h.f, !withFh}); err != nil {
		return toErrno(err)
	}
	errno := h.Getattr(ctx, out)
	n.finishSetattr(out)
	return errno
}

// finishSetattr completes a setattr's answer as go-fuse (v2.12.1)
// completes a getattr's and not a setattr's. The kernel takes the inode
// number from every answer: left zero, stat shows inode 0 until the
// next getattr, and du and find, which compare a directory's number
// with what ".." gives after tar has set the directory's times, fail.
// The timeout lets the kernel keep the answer as long as a getattr's:
// without it, tar and cp -p cost a getattr after every chmod, chown and
// utimes.
func (n *Node) finishSetattr(out *fuse.AttrOut) {
	out.Ino = n.StableAttr().Ino
	out.SetTimeout(n.fsys.opts.Timeout)
}

// attrChanger applies the parts of a setattr, by path or by descriptor.
type attrChanger interface {
	truncate(size int64) error
	chmod(mode uint32) error
	chown(uid, gid int) error
	utimens(atime, mtime unix.Timespec) error
}

// applySetattr applies what in asks for, in the order of the system calls.
// A setattr that changes nothing is a chown(-1, -1), or the kernel's
// removal of privileges before a write (transport/killpriv.go): on the
// filesystem below both change the ctime, which chown(-1, -1) there does.
func applySetattr(in *fuse.SetAttrIn, c attrChanger) error {
	if in.Valid&transport.SetattrChanges == 0 {
		return c.chown(-1, -1)
	}
	if size, ok := in.GetSize(); ok {
		if err := c.truncate(int64(size)); err != nil {
			return err
		}
	}
	if mode, ok := in.GetMode(); ok {
		if err := c.chmod(mode); err != nil {
			return err
		}
	}
	uid, uok := in.GetUID()
	gid, gok := in.GetGID()
	if uok || gok {
		u, g := -1, -1
		if uok {
			u = int(uid)
		}
		if gok {
			g = int(gid)
		}
		if err := c.chown(u, g); err != nil {
			return err
		}
	}
	if in.Valid&(fuse.FATTR_ATIME|fuse.FATTR_MTIME) != 0 {
		at := timespec(in.Valid, fuse.FATTR_ATIME, fuse.FATTR_ATIME_NOW, in.Atime, in.Atimensec)
		mt := timespec(in.Valid, fuse.FATTR_MTIME, fuse.FATTR_MTIME_NOW, in.Mtime, in.Mtimensec)
		return c.utimens(at, mt)
	}
	return nil
}

// pathAttrs changes a name of a view, copying it up first.
type pathAttrs struct {
	v   *branch.View
	rel string
}

func (p pathAttrs) truncate(size int64) error        { return p.v.Truncate(p.rel, size) }
func (p pathAttrs) chmod(mode uint32) error          { return p.v.Chmod(p.rel, mode) }
func (p pathAttrs) chown(uid, gid int) error         { return p.v.Chown(p.rel, uid, gid) }
func (p pathAttrs) utimens(a, m unix.Timespec) error { return p.v.Utimens(p.rel, a, m) }

// fileAttrs changes an open file; byName for a request made by name (see
// branch.File.Truncate).
type fileAttrs struct {
	f      *branch.File
	byName bool
}

func (c fileAttrs) truncate(size int64) error        { return c.f.Truncate(size, c.byName) }
func (c fileAttrs) chmod(mode uint32) error          { return c.f.Chmod(mode) }
func (c fileAttrs) chown(uid, gid int) error         { return c.f.Chown(uid, gid) }
func (c fileAttrs) utimens(a, m unix.Timespec) error { return c.f.Utimens(a, m) }

func timespec(valid, set, now uint32, sec uint64, nsec uint32) unix.Timespec {
	switch {
	case valid&set == 0:
		return unix.Timespec{Nsec: unix.UTIME_OMIT}
	case valid&now != 0:
		return unix.Timespec{Nsec: unix.UTIME_NOW}
	}
	return unix.Timespec{Sec: int64(sec), Nsec: int64(nsec)}
}

// fillAttr is fuse.Attr.FromStat without the inode number: the kernel
// takes that from the node's identity (View.Identity), which a copy-up
// keeps and which go-fuse fills in, warning where the two differ.
func fillAttr(a *fuse.Attr, st *unix.Stat_t) {
	a.Size = uint64(st.Size)
	a.Blocks = uint64(st.Blocks)
	a.Atime, a.Atimensec = uint64(st.Atim.Sec), uint32(st.Atim.Nsec)
	a.Mtime, a.Mtimensec = uint64(st.Mtim.Sec), uint32(st.Mtim.Nsec)
	a.Ctime, a.Ctimensec = uint64(st.Ctim.Sec), uint32(st.Ctim.Nsec)
	a.Mode = st.Mode
	a.Nlink = uint32(st.Nlink)
	a.Owner = fuse.Owner{Uid: st.Uid, Gid: st.Gid}
	a.Rdev = uint32(st.Rdev)
	a.Blksize = uint32(st.Blksize)
}

// Getattr answers for the file n's name stands for now: the kernel keeps
// one set of attributes per inode. When the request names no handle, as
// from stat and fstat alike, go-fuse passes any open handle of the inode,
// and one opened before a copy-up or before a child's commit replaced the
// file is another file. Only an inode whose name is gone answers from its
// handle.
func (n *Node) Getattr(ctx context.Context, fh gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	if errno, ok := n.withTop(false, func(h *fileHandle) syscall.Errno { return h.Getattr(ctx, out) }); ok {
		return errno
	}
	if n.viewRoot {
		if err := n.view.LockRoot(); err != nil {
			return toErrno(err)
		}
		defer n.view.Unlock()
		e, err := n.view.Stat("")
		if err != nil {
			return toErrno(err)
		}
		fillAttr(&out.Attr, &e.Stat)
		return 0
	}
	rel, errno := n.begin()
	if h, ok := handleOf(fh); ok && errno == syscall.ESTALE {
		return h.Getattr(ctx, out)
	}
	if errno != 0 {
		return errno
	}
	defer n.view.Unlock()
	e, err := n.view.Stat(rel)
	if err != nil {
		return toErrno(err)
	}
	fillAttr(&out.Attr, &e.Stat)
	return 0
}
