package fs

import (
	"context"
	"syscall"

	"github.com/branchfs/branchfs/branch"
	"github.com/branchfs/branchfs/ctl"
	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

func caller(ctx context.Context) branch.Owner {
	if c, ok := fuse.FromContext(ctx); ok {
		return branch.Owner{Uid: c.Uid, Gid: c.Gid}
	}
	return branch.Owner{}
}

// reserved refuses to create or remove the control file's name.
func (n *Node) reserved(name string) bool { return n.viewRoot && name == ctl.ControlName }

// makeChild runs one of the calls that create an entry and returns its inode.
func (n *Node) makeChild(ctx context.Context, name string, out *fuse.EntryOut, make func(rel string) (*branch.Entry, error)) (*gofs.Inode, syscall.Errno) {
	if n.reserved(name) {
		return nil, syscall.EEXIST
	}
	rel, errno := n.begin()
	if errno != 0 {
		return nil, errno
	}
	defer n.view.Unlock()
	e, err := make(branch.JoinRel(rel, name))
	if err != nil {
		return nil, toErrno(err)
	}
	return n.newChild(ctx, name, e, out), 0
}

func (n *Node) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	return n.makeChild(ctx, name, out, func(rel string) (*branch.Entry, error) {
		return n.view.Mkdir(rel, mode, caller(ctx))
	})
}

func (n *Node) Mknod(ctx context.Context, name string, mode, dev uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	return n.makeChild(ctx, name, out, func(rel string) (*branch.Entry, error) {
		return n.view.Mknod(rel, mode, dev, caller(ctx))
	})
}

func (n *Node) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	return n.makeChild(ctx, name, out, func(rel string) (*branch.Entry, error) {
		return n.view.Symlink(target, rel, caller(ctx))
	})
}

func (n *Node) Link(ctx context.Context, target gofs.InodeEmbedder, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	src, ok := target.(*Node)
	if !ok || src.view != n.view {
		return nil, syscall.EXDEV
	}
	if n.reserved(name) {
		return nil, syscall.EEXIST
	}
	rel, errno := n.begin()
	if errno != 0 {
		return nil, errno
	}
	defer n.view.Unlock()
	srcRel, ok := src.rel()
	if !ok {
		return nil, syscall.ENOENT
	}
	e, err := n.view.Link(srcRel, branch.JoinRel(rel, name))
	if err != nil {
		return nil, toErrno(err)
	}
	// Both names are one inode, as the kernel expects of a link: the
	// source's, which stands for the linked file also when linking copied
	// it up, unless the source is bound to the file it copied
	// (Node.adopt). Then the copy is another inode, which the source's
	// name must show too: the kernel looks it up again.
	n.fsys.setEntry(out, e)
	if src.adopt(e) {
		return &src.Inode, 0
	}
	in := n.newChild(ctx, name, e, out)
	src.replaced()
	return in, 0
}

func (n *Node) Unlink(ctx context.Context, name string) syscall.Errno {
	if n.reserved(name) {
		return syscall.EPERM
	}
	rel, errno := n.begin()
	if errno != 0 {
		return errno
	}
	defer n.view.Unlock()
	return toErrno(n.view.Unlink(branch.JoinRel(rel, name)))
}

func (n *Node) Rmdir(ctx context.Context, name string) syscall.Errno {
	rel, errno := n.begin()
	if errno != 0 {
		return errno
	}
	defer n.view.Unlock()
	return toErrno(n.view.Rmdir(branch.JoinRel(rel, name)))
}

func (n *Node) Rename(ctx context.Context, name string, newParent gofs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	np, ok := newParent.(*Node)
	if !ok || np.view != n.view {
		return syscall.EXDEV
	}
	if n.reserved(name) || np.reserved(newName) {
		return syscall.EPERM
	}
	rel, errno := n.begin()
	if errno != 0 {
		return errno
	}
	defer n.view.Unlock()
	newRel, ok := np.rel()
	if !ok {
		return syscall.ENOENT
	}
	return toErrno(n.view.Rename(branch.JoinRel(rel, name), branch.JoinRel(newRel, newName), uint(flags)))
}

func (n *Node) Create(ctx context.Context, name string, flags, mode uint32, out *fuse.EntryOut) (*gofs.Inode, gofs.FileHandle, uint32, syscall.Errno) {
	if n.reserved(name) {
		return nil, nil, 0, syscall.EEXIST
	}
	rel, errno := n.begin()
	if errno != 0 {
		return nil, nil, 0, errno
	}
	defer n.view.Unlock()
	f, e, err := n.view.Create(branch.JoinRel(rel, name), int(flags), mode, caller(ctx))
	if err != nil {
		return nil, nil, 0, toErrno(err)
	}
	in := n.newChild(ctx, name, e, out)
	child := in.Operations().(*Node)
	if f.Writable() && n.view.Limited() && child.passing() {
		f.Close() // as Node.Open: its writes would pass the storage limit by
		return nil, nil, 0, syscall.EBUSY
	}
	h, fuseFlags := child.newHandle(f, true, 0, flags)
	return in, h.forGoFuse(), fuseFlags, 0
}
