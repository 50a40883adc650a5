package fs

import (
	"context"
	"strings"
	"sync"
	"syscall"

	"github.com/branchfs/branchfs/branch"
	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// Node is a file, directory or special file of one view.
type Node struct {
	gofs.Inode
	fsys     *FS
	view     *branch.View
	viewRoot bool
	counted  bool // in the trim budget (trim.go); under fsys.mu

	// Open handles by kind: the kernel requires every open of an inode to
	// agree on passthrough with the ones already open.
	openMu     sync.Mutex
	openDirect int
	openPass   int
	// passUsed: a handle of this inode used passthrough, so the kernel
	// (or go-fuse, until its release completes) may still tie the inode
	// to the file it then stood for; a copy of that file must be another
	// inode.
	passUsed bool
	// tops: the open handles whose descriptor is this inode's file in the
	// view's top layer (every handle for writing, and those for reading
	// a file already there), the ones for writing first. Setattr, getattr
	// and xattr requests carry no handle (fchown, fchmod, futimens, fstat
	// and fgetxattr reach the daemon as path operations), and tar sends five
	// of them per file: by descriptor they cost one system call each
	// instead of a walk through the view's layers. It also keeps them on
	// the open file once its name has been given to another, as on a
	// local file system. Release removes its handle under openMu before
	// closing it.
	tops []*fileHandle
	// lowers: the open handles for reading a file of a lower layer. Once
	// n's name is gone, a change through them gets them a copy of their
	// own (detachLowers), which makes them tops.
	lowers []*fileHandle
}

// rel is the node's path within its view; false once the node has been
// replaced (copied up) or removed.
func (n *Node) rel() (string, bool) {
	var parts []string
	cur := &n.Inode
	for {
		if nd, ok := cur.Operations().(*Node); ok && nd.viewRoot {
			break
		}
		name, parent := cur.Parent()
		if parent == nil {
			return "", false
		}
		parts = append(parts, name)
		cur = parent
	}
	for i, j := 0, len(parts)-1; i < j; i, j = i+1, j-1 {
		parts[i], parts[j] = parts[j], parts[i]
	}
	return strings.Join(parts, "/"), true
}

// begin locks the view for one operation and returns the node's path.
func (n *Node) begin() (string, syscall.Errno) {
	if err := n.view.Lock(); err != nil {
		return "", toErrno(err)
	}
	rel, ok := n.rel()
	if !ok {
		n.view.Unlock()
		return "", syscall.ESTALE
	}
	return rel, 0
}

// newChild makes the inode for entry e of n's view.
func (n *Node) newChild(ctx context.Context, e *branch.Entry, out *fuse.EntryOut) *gofs.Inode {
	ino, gen := n.view.Identity(e)
	child := &Node{fsys: n.fsys, view: n.view}
	fillAttr(&out.Attr, &e.Stat)
	in := n.NewInode(ctx, child, gofs.StableAttr{Mode: e.Stat.Mode & syscall.S_IFMT, Ino: ino, Gen: gen})
	if in.Operations() == child {
		n.fsys.nodeMade(child)
	}
	return in
}

// identical reports whether e is the file this node stands for.
func (n *Node) identical(e *branch.Entry) bool {
	ino, gen := n.view.Identity(e)
	sa := n.StableAttr()
	return sa.Ino == ino && sa.Gen == gen
}
