package fs

import (
	"context"
	"syscall"

	"github.com/branchfs/branchfs/branch"
	"github.com/branchfs/branchfs/ctl"
	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// OpendirHandle opens a directory whose listing the kernel may keep
// (FOPEN_CACHE_DIR, FOPEN_KEEP_CACHE): its changes through branchfs reach
// the kernel as they happen, and commits into the view invalidate what they
// change. The listing is made when the kernel first reads, which it does not
// while its cached copy is good.
func (n *Node) OpendirHandle(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	_, errno := n.begin()
	if errno != 0 {
		return nil, 0, errno
	}
	n.view.Unlock()
	return &dirHandle{node: n}, fuse.FOPEN_CACHE_DIR | fuse.FOPEN_KEEP_CACHE, 0
}

// dirHandle is an open directory: the listing, with every entry's
// attributes, taken at the first read.
type dirHandle struct {
	node *Node
	ents []branch.DirEntry // nil until the first read
	pos  int               // next entry; an offset handed to the kernel is pos after it
}

func (h *dirHandle) list() syscall.Errno {
	n := h.node
	rel, errno := n.begin()
	if errno != 0 {
		return errno
	}
	defer n.view.Unlock()
	// The kernel holds an inode for most names of a directory it lists
	// again (after memory pressure dropped its copy of the listing): their
	// attributes would cost a system call each and change nothing.
	known := n.Children()
	ents, err := n.view.ReadDirPlus(rel, func(name string) bool { return known[name] != nil })
	if err != nil {
		return toErrno(err)
	}
	h.ents = make([]branch.DirEntry, 0, len(ents)+2)
	h.ents = append(h.ents, branch.DirEntry{Name: ".", Type: syscall.DT_DIR}, branch.DirEntry{Name: "..", Type: syscall.DT_DIR})
	for _, d := range ents {
		if !(n.viewRoot && d.Name == ctl.ControlName) {
			h.ents = append(h.ents, d)
		}
	}
	if n == n.fsys.root && n.fsys.opts.ListBranches {
		// Without attributes: READDIRPLUS leaves them to a lookup.
		ino := n.StableAttr().Ino
		for _, name := range n.fsys.store.LiveNamesLocked() {
			h.ents = append(h.ents, branch.DirEntry{Name: ctl.BranchPrefix + name, Type: syscall.DT_DIR, Ino: ino})
		}
	}
	return 0
}

func (h *dirHandle) Readdirent(ctx context.Context) (*fuse.DirEntry, syscall.Errno) {
	if err := h.node.view.Check(); err != nil {
		return nil, toErrno(err)
	}
	if h.ents == nil {
		if errno := h.list(); errno != 0 {
			return nil, errno
		}
	}
	if h.pos >= len(h.ents) {
		return nil, 0
	}
	d := &h.ents[h.pos]
	h.pos++
	return &fuse.DirEntry{Name: d.Name, Mode: uint32(d.Type) << 12, Ino: d.Ino, Off: uint64(h.pos)}, 0
}

// Seekdir moves to offset off, a position in the listing. A handle may be
// new to the reader that asks for it: the kernel reads directories it
// opened itself with handle 0, and transport gives such a read at an
// offset a new handle when another reader's listing ended; that handle
// makes its listing first, or it would start over and that reader would
// never see the end.
func (h *dirHandle) Seekdir(ctx context.Context, off uint64) syscall.Errno {
	if h.ents == nil && off > 0 {
		if errno := h.list(); errno != 0 {
			return errno
		}
	}
	h.pos = int(min(off, uint64(len(h.ents))))
	return 0
}

// Lookup answers READDIRPLUS for the entry Readdirent just produced, from
// the attributes taken at the first read.
func (h *dirHandle) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	n := h.node
	if err := n.view.Check(); err != nil {
		return nil, toErrno(err)
	}
	if h.pos == 0 || h.ents[h.pos-1].Name != name {
		return n.Lookup(ctx, name, out)
	}
	d := &h.ents[h.pos-1]
	if d.Stat == nil {
		// A name whose inode the kernel holds (list): for an error,
		// go-fuse sends the entry without a node ID, which the kernel
		// lists without touching the inode it has. Should it no longer
		// have one, it looks the name up when it is used.
		return nil, syscall.EEXIST
	}
	return n.child(ctx, name, d.Entry(), out), 0
}

func (h *dirHandle) Releasedir(ctx context.Context, flags uint32) {}
