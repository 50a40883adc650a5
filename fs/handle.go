package fs

import (
	"context"
	"slices"
	"syscall"

	"github.com/branchfs/branchfs/branch"
	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

func (n *Node) Open(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	rel, errno := n.begin()
	if errno != 0 {
		return nil, 0, errno
	}
	defer n.view.Unlock()
	f, e, err := n.view.Open(rel, int(flags))
	if err != nil {
		return nil, 0, toErrno(err)
	}
	same := n.same(e)
	if !same && n.isBound() {
		// n's name shows another file than the one the kernel may pass
		// n's opens to (a copy, made by this open for writing or
		// before): that file is another inode (Node.child). ESTALE
		// makes the kernel look the name up again and retry the open
		// on it.
		f.Close()
		n.replaced()
		return nil, 0, syscall.ESTALE
	}
	if same && f.Writable() && n.view.Limited() && n.passing() {
		f.Close()
		return nil, 0, syscall.EBUSY
	}
	h, fuseFlags := n.newHandle(f, same, e.Stat.Size, flags)
	return h.forGoFuse(), fuseFlags, 0
}

// newHandle wraps f, of size bytes, opened with flags, and decides
// passthrough. An inode's opens must all use passthrough or none of them,
// and passthrough is only ever offered for the file the inode stands for
// (same), which it is then bound to (Node.bound).
func (n *Node) newHandle(f *branch.File, same bool, size int64, flags uint32) (*fileHandle, uint32) {
	h := &fileHandle{node: n, f: f}
	n.fsys.nodeOpened(n, 1)
	n.openMu.Lock()
	defer n.openMu.Unlock()
	switch {
	case f.Writable():
		n.tops = append([]*fileHandle{h}, n.tops...)
	case f.InTop():
		n.tops = append(n.tops, h)
	default:
		n.lowers = append(n.lowers, h)
	}
	switch {
	case !same:
	case n.openPass > 0:
		// A writer must join the passthrough readers; under a storage
		// limit only files of lower layers, which no writer of this
		// inode reaches, are passed through (below), or were before the
		// limit was set: its writes then pass the limit by, and are
		// refused (Node.Open).
		h.pass = true
	case n.openDirect > 0:
	case f.InTop() && n.view.Limited():
		// The writes of a writer that joined it would bypass the
		// daemon, which counts them (branch/quota.go).
	default:
		h.pass = n.fsys.passthroughAllowed(f.Writable(), size)
	}
	if h.pass {
		n.openPass++
		n.bound = true
		if f.Writable() {
			n.fsys.addPassWriter(n.view, 1)
		}
		return h, 0
	}
	n.openDirect++
	// The kernel may keep the file's pages from one open to the next:
	// writes reach it through this mount, and commits and staleness
	// invalidate what they change (afterCommit, notifyTree).
	if flags&syscall.O_ACCMODE == syscall.O_WRONLY {
		// Nothing reads or maps the file through a write-only handle,
		// so its writes need not pass through the mount's page cache:
		// each WRITE carries the caller's own pages, one copy of the
		// data less (a new file written in 64 KiB blocks took 0.6x
		// native through the cache). The kernel writes back and drops
		// the cached pages of the range around each write, so that
		// other handles read what it wrote.
		return h, fuse.FOPEN_KEEP_CACHE | fuse.FOPEN_DIRECT_IO
	}
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

// hasOpen reports that n has open handles.
func (n *Node) hasOpen() bool {
	n.openMu.Lock()
	defer n.openMu.Unlock()
	return n.openDirect+n.openPass > 0
}

// passing reports that n has handles that pass through: a writer would
// join them (newHandle).
func (n *Node) passing() bool {
	n.openMu.Lock()
	defer n.openMu.Unlock()
	return n.openPass > 0
}

// isBound reports that a handle of n used passthrough (Node.bound).
func (n *Node) isBound() bool {
	n.openMu.Lock()
	defer n.openMu.Unlock()
	return n.bound
}

// passthroughAllowed: read-only opens of files of at least
// PassthroughMinSize bytes, unless the mode is off. Small files are
// better served from the mount's own page cache: each passthrough read
// makes the kernel drop the file's atime, so that the next stat of the
// file costs a GETATTR round trip (git status in the main view sent one
// per file it had read the time before).
func (f *FS) passthroughAllowed(write bool, size int64) bool {
	if write || size < f.opts.PassthroughMinSize {
		return false
	}
	return f.opts.Passthrough != PassthroughOff
}

// withTop runs fn on one of n's open handles on its file in the view's top
// layer (one open for writing if write is set), with openMu held so that
// Release cannot close the descriptor meanwhile. Without such a handle it
// reports false and does not run fn.
func (n *Node) withTop(write bool, fn func(h *fileHandle) syscall.Errno) (syscall.Errno, bool) {
	n.openMu.Lock()
	defer n.openMu.Unlock()
	if len(n.tops) == 0 || write && !n.tops[0].f.Writable() {
		return 0, false
	}
	return fn(n.tops[0]), true
}

// withLower is withTop for n's open handles on a file of a lower layer:
// a read of the extended attributes of a file whose name is gone
// (fgetxattr of an unlinked open file, which carries no handle) answers
// from one of them, as on a local filesystem.
func (n *Node) withLower(fn func(h *fileHandle) syscall.Errno) (syscall.Errno, bool) {
	n.openMu.Lock()
	defer n.openMu.Unlock()
	if len(n.lowers) == 0 {
		return 0, false
	}
	return fn(n.lowers[0]), true
}

// withOrphan runs fn as withTop does, for n whose name is gone from the
// view: if n's only open handles read a lower layer's file, they first get
// a copy of it in the view's top layer (branch.Detaching), so that a
// change through them reaches neither the lower layer nor a name, as a
// change of an unlinked open file on a local filesystem reaches no name.
// The copy is made without openMu, which requests on the request loop's
// reader take (withTop): held for the copy of a large file, one of them
// would hold up the whole mount. Two detaches at once both copy; the
// first to finish gives its copy, the other discards its own. Without
// open handles it answers ESTALE.
// Preconditions: the view is locked; not on the request loop's reader.
func (n *Node) withOrphan(write bool, fn func(h *fileHandle) syscall.Errno) syscall.Errno {
	if errno, ok := n.withTop(write, fn); ok {
		return errno
	}
	if errno := n.detach(); errno != 0 {
		return errno
	}
	if errno, ok := n.withTop(write, fn); ok {
		return errno
	}
	return syscall.ESTALE
}

// detach gives n's open handles on a lower layer's file a copy of their
// own, unless n has handles on a file of the top layer by the time it is
// made. Preconditions: the view is locked.
func (n *Node) detach() syscall.Errno {
	n.openMu.Lock()
	if len(n.tops) > 0 || len(n.lowers) == 0 {
		n.openMu.Unlock()
		return 0
	}
	// The copy reads a descriptor of its own: Release may close the
	// handle's meanwhile.
	d, err := n.view.BeginDetach(n.lowers[0].f)
	n.openMu.Unlock()
	if err != nil {
		return toErrno(err)
	}
	defer d.Discard()
	err = d.Copy()
	n.openMu.Lock()
	defer n.openMu.Unlock()
	if len(n.tops) > 0 || len(n.lowers) == 0 {
		return 0 // another detach won, or no handle is left to give it
	}
	if err != nil {
		return toErrno(err)
	}
	files := make([]*branch.File, len(n.lowers))
	for i, h := range n.lowers {
		files[i] = h.f
	}
	if err := d.Attach(files); err != nil {
		return toErrno(err)
	}
	n.tops, n.lowers = n.lowers, nil
	return 0
}

// forgetTops stops n's open handles from answering for n's name: a commit
// has put another file there. They stay open on the file they had.
func (n *Node) forgetTops() {
	n.openMu.Lock()
	n.tops = nil
	n.openMu.Unlock()
}

// fileHandle adapts an open file of a view to go-fuse; the file keeps the
// view's rules (branch.File), the handle the node's bookkeeping of open
// files and passthrough.
type fileHandle struct {
	node *Node
	f    *branch.File
	pass bool
}

// passHandle is a handle whose reads and writes the kernel passes to its
// file. Only it offers go-fuse a descriptor: while an inode has a backing
// file registered, go-fuse hands it to every open of the inode that offers
// one, whatever file the open is of, and it keeps it registered until the
// release of the last handle it went to has run, just after ours
// (Release): a handle the daemon serves must not offer one.
type passHandle struct{ *fileHandle }

func (h passHandle) PassthroughFd() (int, bool) { return h.f.Fd(), true }

// forGoFuse is h as go-fuse is to see it.
func (h *fileHandle) forGoFuse() gofs.FileHandle {
	if h.pass {
		return passHandle{h}
	}
	return h
}

// handleOf is the fileHandle go-fuse passes back as fh, if any.
func handleOf(fh gofs.FileHandle) (*fileHandle, bool) {
	switch h := fh.(type) {
	case *fileHandle:
		return h, true
	case passHandle:
		return h.fileHandle, true
	}
	return nil, false
}

func (h *fileHandle) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	n, err := h.f.ReadAt(dest, off)
	if err != nil {
		return nil, toErrno(err)
	}
	return fuse.ReadResultData(dest[:n]), 0
}

func (h *fileHandle) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	n, err := h.f.WriteAt(data, off)
	if err != nil {
		return uint32(max(n, 0)), toErrno(err)
	}
	return uint32(n), 0
}

// copyChunk is the most one COPY_FILE_RANGE copies.
const copyChunk = 8 << 20

// CopyFileRange copies between two open files of the mount in the kernel
// (copy_file_range(2) on the files below): cp, for one, asks first, and
// without it the kernel falls back to a READ and a WRITE round trip per
// 128 KiB.
func (n *Node) CopyFileRange(ctx context.Context, fhIn gofs.FileHandle, offIn uint64, out *gofs.Inode,
	fhOut gofs.FileHandle, offOut uint64, size uint64, flags uint64) (uint32, syscall.Errno) {
	in, ok1 := handleOf(fhIn)
	to, ok2 := handleOf(fhOut)
	if !ok1 || !ok2 || flags != 0 {
		return 0, syscall.EOPNOTSUPP
	}
	// A bounded part at a time, under the store's lock (CopyFrom), so that
	// a commit or a child's creation waits for no more than that; the
	// caller asks again for the rest.
	c, err := to.f.CopyFrom(in.f, int64(offIn), int64(offOut), int(min(size, copyChunk)))
	if err != nil {
		return uint32(max(c, 0)), toErrno(err)
	}
	return uint32(c), 0
}

func (h *fileHandle) Getattr(ctx context.Context, out *fuse.AttrOut) syscall.Errno {
	st, err := h.f.Stat()
	if err != nil {
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
	return toErrno(h.f.Sync(flags&1 != 0))
}

func (h *fileHandle) Allocate(ctx context.Context, off, size uint64, mode uint32) syscall.Errno {
	return toErrno(h.f.Allocate(mode, int64(off), int64(size)))
}

func (h *fileHandle) Lseek(ctx context.Context, off uint64, whence uint32) (uint64, syscall.Errno) {
	n, err := h.f.Seek(int64(off), int(whence))
	return uint64(n), toErrno(err)
}

func (h *fileHandle) Release(ctx context.Context) syscall.Errno {
	n := h.node
	n.openMu.Lock()
	n.tops = slices.DeleteFunc(n.tops, func(t *fileHandle) bool { return t == h })
	n.lowers = slices.DeleteFunc(n.lowers, func(t *fileHandle) bool { return t == h })
	if h.pass {
		n.openPass--
		if h.f.Writable() {
			n.fsys.addPassWriter(n.view, -1)
		}
	} else {
		n.openDirect--
	}
	n.openMu.Unlock()
	n.fsys.nodeOpened(n, -1)
	return toErrno(h.f.Close())
}

// nodeOpened counts n's open handles by view (FS.open).
func (f *FS) nodeOpened(n *Node, d int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.open == nil {
		f.open = map[*branch.View]map[*Node]int{}
	}
	m := f.open[n.view]
	if m == nil {
		m = map[*Node]int{}
		f.open[n.view] = m
	}
	if m[n] += d; m[n] <= 0 {
		delete(m, n)
		if len(m) == 0 {
			delete(f.open, n.view)
		}
	}
}
