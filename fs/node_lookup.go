package fs

import (
	"context"
	"strings"
	"syscall"
	"time"

	"github.com/branchfs/branchfs/branch"
	"github.com/branchfs/branchfs/ctl"
	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

func (n *Node) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	if n.viewRoot {
		if name == ctl.ControlName {
			return n.controlInode(ctx, out)
		}
		if n.view.IsMain() && strings.HasPrefix(name, ctl.BranchPrefix) {
			in, errno := n.lookupBranch(ctx, name[len(ctl.BranchPrefix):], out)
			if errno == syscall.ENOENT {
				in, errno = n.lookupEntry(ctx, name, out)
			}
			if errno == syscall.ENOENT {
				// The kernel keeps no negative entry for a branch name,
				// so that creating the branch need not drop one. go-fuse
				// turns ENOENT into a cached negative entry only when the
				// entry timeout is still zero.
				out.SetEntryTimeout(time.Nanosecond)
			}
			return in, errno
		}
	}
	return n.lookupEntry(ctx, name, out)
}

// lookupEntry finds name in n's directory of its view.
func (n *Node) lookupEntry(ctx context.Context, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	rel, errno := n.begin()
	if errno != 0 {
		return nil, errno
	}
	defer n.view.Unlock()
	e, err := n.view.Stat(branch.JoinRel(rel, name))
	if err != nil {
		return nil, toErrno(err)
	}
	return n.child(ctx, name, e, out), 0
}

// child returns the inode for name, which resolved to e: the one the
// kernel has for the name if that inode stands for e's file (Node.adopt),
// else another, so that one file is one inode to the kernel and one inode
// one file.
func (n *Node) child(ctx context.Context, name string, e *branch.Entry, out *fuse.EntryOut) *gofs.Inode {
	if c := n.GetChild(name); c != nil && c.StableAttr().Mode == e.Stat.Mode&syscall.S_IFMT {
		if cn, ok := c.Operations().(*Node); ok && cn.adopt(e) {
			n.fsys.setEntry(out, e)
			return c
		}
	}
	return n.newChild(ctx, name, e, out)
}

// lookupBranch finds the root of branch view name.
func (n *Node) lookupBranch(ctx context.Context, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	if branch.ValidateName(name) != nil || name == branch.MainName {
		return nil, syscall.ENOENT
	}
	v, err := n.fsys.store.View(name)
	if err != nil {
		return nil, syscall.ENOENT
	}
	// A stale branch stays reachable: it can still be aborted.
	if err := v.LockRoot(); err != nil {
		return nil, syscall.ENOENT
	}
	e, err := v.Stat("")
	v.Unlock()
	if err != nil {
		return nil, toErrno(err)
	}
	n.fsys.setEntry(out, e)
	// The kernel looks the name up again when its entry times out, or when
	// a request answered ESTALE (Open after a passthrough read does). It
	// must get the node it holds: a new one would have a node ID the
	// kernel does not know, and the notifications for the view go to the
	// node in the tree (FS.viewRoot). go-fuse would answer with the old
	// node ID anyway, since the identity is the same, and drop the new one.
	if c := n.GetChild(ctl.BranchPrefix + name); c != nil {
		if cn, ok := c.Operations().(*Node); ok && cn.viewRoot && cn.view == v {
			return c, 0
		}
	}
	ino, gen := v.Identity(e)
	root := &Node{fsys: n.fsys, view: v, viewRoot: true}
	in := n.NewInode(ctx, root, gofs.StableAttr{Mode: syscall.S_IFDIR, Ino: ino, Gen: gen})
	n.fsys.nodeMade(root)
	return in, 0
}

func (n *Node) OnForget() {
	n.fsys.nodeForgotten(n)
}

func (n *Node) Readlink(ctx context.Context) ([]byte, syscall.Errno) {
	rel, errno := n.begin()
	if errno != 0 {
		return nil, errno
	}
	defer n.view.Unlock()
	target, err := n.view.Readlink(rel)
	if err != nil {
		return nil, toErrno(err)
	}
	return []byte(target), 0
}

func (n *Node) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	if err := n.view.Check(); err != nil {
		return toErrno(err)
	}
	st, err := n.view.Statfs()
	if err != nil {
		return toErrno(err)
	}
	out.Blocks, out.Bfree, out.Bavail = st.Blocks, st.Bfree, st.Bavail
	out.Files, out.Ffree = st.Files, st.Ffree
	out.Bsize, out.Frsize = uint32(st.Bsize), uint32(st.Frsize)
	out.NameLen = uint32(st.Namelen)
	return 0
}

// Access is answered by the kernel (default_permissions); this only
// keeps stale views failing.
func (n *Node) Access(ctx context.Context, mask uint32) syscall.Errno {
	if err := n.view.Check(); err != nil {
		return toErrno(err)
	}
	return 0
}
