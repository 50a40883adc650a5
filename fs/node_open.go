package fs

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/branchfs/branchfs/branch"
	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

func (n *Node) Open(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	rel, errno := n.begin()
	if errno != 0 {
		return nil, 0, errno
	}
	defer n.view.Unlock()
	if branch.OpensForWrite(int(flags)) && n.passthroughUsed() {
		e, err := n.view.Stat(rel)
		if err != nil {
			return nil, 0, toErrno(err)
		}
		if e.Lower() && n.identical(e) {
			// The file is about to be copied up, and the kernel reads or
			// has read this inode's backing file (the lower one)
			// directly: the copy must be another inode, or the kernel
			// would send our writes to the lower file, and could never
			// pass reads of the copy through. ESTALE makes the kernel
			// look the name up again and retry the open on the new inode.
			fd, _, err := n.view.Open(rel, int(flags))
			if err != nil {
				return nil, 0, toErrno(err)
			}
			unix.Close(fd)
			n.replaced()
			return nil, 0, syscall.ESTALE
		}
	}
	fd, e, err := n.view.Open(rel, int(flags))
	if err != nil {
		return nil, 0, toErrno(err)
	}
	h, fuseFlags := n.newHandle(fd, int(flags), n.identical(e), e.Stat.Size, !e.Lower())
	return h, fuseFlags, 0
}

// newHandle wraps fd, the file in the view's top layer if top, and decides
// passthrough. An inode's opens must all use passthrough or none of them,
// and passthrough is only ever offered for the file the inode stands for,
// never for a copy made since.
func (n *Node) newHandle(fd, flags int, identical bool, size int64, top bool) (*fileHandle, uint32) {
	h := &fileHandle{node: n, view: n.view, fd: fd, write: branch.OpensForWrite(flags)}
	n.openMu.Lock()
	defer n.openMu.Unlock()
	switch {
	case h.write:
		n.tops = append([]*fileHandle{h}, n.tops...)
	case top:
		n.tops = append(n.tops, h)
	}
	switch {
	case !identical:
	case n.openPass > 0:
		h.pass = true
	case n.openDirect > 0:
	default:
		h.pass = n.passthroughAllowed(flags, size)
	}
	if h.pass {
		n.openPass++
		n.passUsed = true
		if h.write {
			n.fsys.addPassWriter(n.view, 1)
		}
		return h, 0
	}
	n.openDirect++
	// The kernel may keep the file's pages from one open to the next:
	// writes reach it through this mount, and commits and staleness
	// invalidate what they change (afterCommit, notifyTree).
	return h, fuse.FOPEN_KEEP_CACHE
}

// addPassWriter counts handles of view v that write through passthrough
// (a writer joins an inode's passthrough readers, as the kernel requires).
// Their writes reach v's files without the daemon, so v may neither be
// branched nor committed while they are open: the writes would reach the
// child, or after the commit the parent's file.
func (f *FS) addPassWriter(v *branch.View, d int) {
	f.passMu.Lock()
	defer f.passMu.Unlock()
	if f.passWriters == nil {
		f.passWriters = map[string]int{}
	}
	f.passWriters[v.Name()] += d
	if f.passWriters[v.Name()] == 0 {
		delete(f.passWriters, v.Name())
	}
}

// passWriting reports that handles of view v write through passthrough.
func (f *FS) passWriting(v *branch.View) bool {
	f.passMu.Lock()
	defer f.passMu.Unlock()
	return f.passWriters[v.Name()] > 0
}

// passthroughUsed reports that a handle of n used passthrough.
func (n *Node) passthroughUsed() bool {
	n.openMu.Lock()
	defer n.openMu.Unlock()
	return n.passUsed
}

// passthroughAllowed: read-only opens of files of at least
// PassthroughMinSize bytes, unless the mode is off. Small files are
// better served from the mount's own page cache: each passthrough read
// makes the kernel drop the file's atime, so that the next stat of the
// file costs a GETATTR round trip (git status in the main view sent one
// per file it had read the time before).
func (n *Node) passthroughAllowed(flags int, size int64) bool {
	if branch.OpensForWrite(flags) || size < n.fsys.opts.PassthroughMinSize {
		return false
	}
	return n.fsys.opts.Passthrough != PassthroughOff
}

// withTop runs fn on one of n's open handles on its file in the view's top
// layer (one open for writing if write is set), with openMu held so that
// Release cannot close the descriptor meanwhile. Without such a handle it
// reports false and does not run fn.
func (n *Node) withTop(write bool, fn func(h *fileHandle) syscall.Errno) (syscall.Errno, bool) {
	n.openMu.Lock()
	defer n.openMu.Unlock()
	if len(n.tops) == 0 || write && !n.tops[0].write {
		return 0, false
	}
	return fn(n.tops[0]), true
}

// forgetTops stops n's open handles from answering for n's name: a commit
// has put another file there. They stay open on the file they had.
func (n *Node) forgetTops() {
	n.openMu.Lock()
	n.tops = nil
	n.openMu.Unlock()
}

func (n *Node) Setattr(ctx context.Context, fh gofs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	// An open file needs no path: its name may be another file's by now.
	if err := n.view.Lock(); err != nil {
		return toErrno(err)
	}
	defer n.view.Unlock()
	if h, ok := fh.(*fileHandle); ok && h.write {
		return n.setattrFd(ctx, h, in, out)
	}
	_, resize := in.GetSize() // ftruncate needs a descriptor open for writing
	if errno, ok := n.withTop(resize, func(h *fileHandle) syscall.Errno { return n.setattrFd(ctx, h, in, out) }); ok {
		return errno
	}
	rel, ok := n.rel()
	if !ok {
		return syscall.ESTALE
	}
	v := n.view
	before, err := v.Stat(rel)
	if err != nil {
		return toErrno(err)
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
	if err := n.view.CheckWritable(); err != nil {
		return toErrno(err)
	}
	var c attrChanger = fdAttrs(h.fd)
	if _, ok := in.GetFh(); !ok {
		c = fdByName(h.fd)
	}
	if err := applySetattr(in, c); err != nil {
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
// removal of privileges before a write (killpriv.go): on the filesystem
// below both change the ctime, which chown(-1, -1) there does.
func applySetattr(in *fuse.SetAttrIn, c attrChanger) error {
	if in.Valid&setattrChanges == 0 {
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

// fdAttrs changes the file open on a descriptor.
type fdAttrs int

// fdByName changes the file open on a descriptor for a request by name:
// truncate(2), unlike ftruncate(2), leaves it to the filesystem whether
// the times change (ext4 changes them, ramfs does not).
type fdByName int

func (fd fdByName) truncate(size int64) error {
	return unix.Truncate("/proc/self/fd/"+strconv.Itoa(int(fd)), size)
}
func (fd fdByName) chmod(mode uint32) error          { return fdAttrs(fd).chmod(mode) }
func (fd fdByName) chown(uid, gid int) error         { return fdAttrs(fd).chown(uid, gid) }
func (fd fdByName) utimens(a, m unix.Timespec) error { return fdAttrs(fd).utimens(a, m) }

func (fd fdAttrs) truncate(size int64) error { return unix.Ftruncate(int(fd), size) }
func (fd fdAttrs) chmod(mode uint32) error   { return unix.Fchmod(int(fd), mode&07777) }
func (fd fdAttrs) chown(uid, gid int) error  { return unix.Fchown(int(fd), uid, gid) }
func (fd fdAttrs) utimens(a, m unix.Timespec) error {
	return unix.UtimesNanoAt(int(fd), "", []unix.Timespec{a, m}, unix.AT_EMPTY_PATH)
}

func timespec(valid, set, now uint32, sec uint64, nsec uint32) unix.Timespec {
	switch {
	case valid&set == 0:
		return unix.Timespec{Nsec: unix.UTIME_OMIT}
	case valid&now != 0:
		return unix.Timespec{Nsec: unix.UTIME_NOW}
	}
	return unix.Timespec{Sec: int64(sec), Nsec: int64(nsec)}
}

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
	// chown that follows a change of attributes (killpriv.go): an open
	// file answers without a lookup.
	var sz uint32
	errno, ok := n.withTop(false, func(h *fileHandle) (errno syscall.Errno) {
		sz, errno = getxattr(dest, func(buf []byte) (int, error) { return branch.FdGetXattr(h.fd, attr, buf) })
		return errno
	})
	if ok {
		return sz, errno
	}
	rel, ok := n.rel()
	if !ok {
		return 0, syscall.ESTALE
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
		names, err = branch.FdListXattr(h.fd)
		return 0
	}); !open {
		rel, ok := n.rel()
		if !ok {
			return 0, syscall.ESTALE
		}
		names, err = n.view.ListXattr(rel)
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
	return n.changeAttr(func(rel string) error { return n.view.SetXattr(rel, attr, data, int(flags)) },
		func(fd int) error { return branch.FdSetXattr(fd, attr, data, int(flags)) })
}

func (n *Node) Removexattr(ctx context.Context, attr string) syscall.Errno {
	return n.changeAttr(func(rel string) error { return n.view.RemoveXattr(rel, attr) },
		func(fd int) error { return branch.FdRemoveXattr(fd, attr) })
}

// changeAttr runs a change that may copy the node up, or changeFd on an
// open handle of the node's file in the top layer: fsetxattr and
// fremovexattr reach the daemon without a handle, and act on the open file
// also once its name is gone or another file's, as on a local filesystem.
func (n *Node) changeAttr(change func(rel string) error, changeFd func(fd int) error) syscall.Errno {
	if err := n.view.Lock(); err != nil {
		return toErrno(err)
	}
	defer n.view.Unlock()
	if errno, ok := n.withTop(false, func(h *fileHandle) syscall.Errno {
		if err := n.view.CheckWritable(); err != nil {
			return toErrno(err)
		}
		return toErrno(changeFd(h.fd))
	}); ok {
		return errno
	}
	rel, ok := n.rel()
	if !ok {
		return syscall.ESTALE
	}
	before, err := n.view.Stat(rel)
	if err != nil {
		return toErrno(err)
	}
	if err := change(rel); err != nil {
		return toErrno(err)
	}
	if before.Lower() {
		n.replaced()
	}
	return 0
}

// fileHandle is an open file of a view. Every call checks the view first,
// so that handles on a stale branch fail with ESTALE.
type fileHandle struct {
	node  *Node
	view  *branch.View
	fd    int
	write bool
	pass  bool
}

func (h *fileHandle) PassthroughFd() (int, bool) { return h.fd, h.pass }

func (h *fileHandle) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	if err := h.view.Check(); err != nil {
		return nil, toErrno(err)
	}
	n, err := unix.Pread(h.fd, dest, off)
	if err != nil {
		return nil, toErrno(err)
	}
	return fuse.ReadResultData(dest[:n]), 0
}

func (h *fileHandle) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	if err := h.view.CheckWritable(); err != nil {
		return 0, toErrno(err)
	}
	n, err := unix.Pwrite(h.fd, data, off)
	if err != nil {
		return uint32(max(n, 0)), toErrno(err)
	}
	return uint32(n), 0
}

func (h *fileHandle) Getattr(ctx context.Context, out *fuse.AttrOut) syscall.Errno {
	if err := h.view.Check(); err != nil {
		return toErrno(err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(h.fd, &st); err != nil {
		return toErrno(err)
	}
	fillAttr(&out.Attr, &st)
	return 0
}

// Flush answers ENOSYS, after which the kernel sends no more FLUSH
// requests: close(2) then costs no round trip. Nothing is buffered here, so
// there is nothing to flush; writes report their own errors.
func (h *fileHandle) Flush(ctx context.Context) syscall.Errno {
	return syscall.ENOSYS
}

func (h *fileHandle) Fsync(ctx context.Context, flags uint32) syscall.Errno {
	if err := h.view.Check(); err != nil {
		return toErrno(err)
	}
	if flags&1 != 0 {
		return toErrno(unix.Fdatasync(h.fd))
	}
	return toErrno(unix.Fsync(h.fd))
}

func (h *fileHandle) Allocate(ctx context.Context, off, size uint64, mode uint32) syscall.Errno {
	if err := h.view.CheckWritable(); err != nil {
		return toErrno(err)
	}
	return toErrno(unix.Fallocate(h.fd, mode, int64(off), int64(size)))
}

func (h *fileHandle) Lseek(ctx context.Context, off uint64, whence uint32) (uint64, syscall.Errno) {
	if err := h.view.Check(); err != nil {
		return 0, toErrno(err)
	}
	n, err := unix.Seek(h.fd, int64(off), int(whence))
	return uint64(n), toErrno(err)
}

func (h *fileHandle) Release(ctx context.Context) syscall.Errno {
	n := h.node
	n.openMu.Lock()
	n.tops = slices.DeleteFunc(n.tops, func(t *fileHandle) bool { return t == h })
	if h.pass {
		n.openPass--
		if h.write {
			n.fsys.addPassWriter(h.view, -1)
		}
	} else {
		n.openDirect--
	}
	n.openMu.Unlock()
	return toErrno(unix.Close(h.fd))
}
