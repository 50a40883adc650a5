package fs

import (
	"context"
	"strings"
	"syscall"

	"github.com/branchfs/branchfs/branch"
	"github.com/branchfs/branchfs/internal/lockcheck"
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
	openMu     lockcheck.Mutex[lockcheck.NodeOpen]
	openDirect int
	openPass   int
	// file is the file n stands for (View.Identity); under openMu. It
	// starts as n's identity and moves to the file's copy when n keeps
	// its name through a copy-up (Node.adopt): every name of n shows that
	// file. Path operations find it through any of n's names.
	file fileID
	// linked: n's file may have several names. n then stands for that
	// file only, whatever one of its names shows later; under openMu.
	linked bool
	// bound: a handle of this inode used passthrough, so the kernel (or
	// go-fuse, until its release completes) may still tie the inode to
	// the file it then stood for as its backing file, and pass any open
	// of the inode to it: n stands for that file for good, and a copy of
	// it, or another file its names come to show, is another inode.
	// Under openMu.
	bound bool
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

// fileID is a file's identity in a view (View.Identity).
type fileID struct{ ino, gen uint64 }

func identity(v *branch.View, e *branch.Entry) fileID {
	ino, gen := v.Identity(e)
	return fileID{ino, gen}
}

// newChild makes the inode for entry e of n's view, shown by name.
func (n *Node) newChild(ctx context.Context, name string, e *branch.Entry, out *fuse.EntryOut) *gofs.Inode {
	id := identity(n.view, e)
	child := &Node{fsys: n.fsys, view: n.view, file: id, linked: linked(e)}
	n.fsys.setEntry(out, e)
	in := n.NewInode(ctx, child, gofs.StableAttr{Mode: e.Stat.Mode & syscall.S_IFMT, Ino: id.ino, Gen: id.gen})
	if in.Operations() == child {
		n.fsys.nodeMade(child)
	}
	// go-fuse puts the new inode under name without unlinking the one it
	// had there: that one would keep name as a parent, and its path
	// operations (Node.rel) would reach the file name shows now.
	if old := n.GetChild(name); old != nil && old != in {
		n.RmChild(name)
	}
	return in
}

// setEntry fills out for entry e: its attributes, and how long the kernel
// may take the name for the inode without asking again. A file of a lower
// layer that may be passed through gets no time at all: once a passthrough
// open has bound its inode to it (Node.bound), its copy-up gives the name
// another inode, which the kernel must find at the caller's next walk. The
// drop that Node.replaced sends cannot reach the kernel before the reply
// that caused it is in, and the caller's next call often came first.
func (f *FS) setEntry(out *fuse.EntryOut, e *branch.Entry) {
	fillAttr(&out.Attr, &e.Stat)
	if e.Lower() && e.Stat.Mode&syscall.S_IFMT == syscall.S_IFREG && f.passthroughAllowed(false, e.Stat.Size) {
		return
	}
	out.SetEntryTimeout(f.opts.Timeout)
}

// linked reports a file with several names: a lower layer's show one name
// each (branch.Entry's partLinks).
func linked(e *branch.Entry) bool { return e.Stat.Nlink > 1 && !e.IsDir() }

// same reports whether e is the file n stands for.
func (n *Node) same(e *branch.Entry) bool {
	id := identity(n.view, e)
	n.openMu.Lock()
	defer n.openMu.Unlock()
	return n.file == id
}

// adopt reports whether n stands for e's file, which one of n's names
// shows, making it so where it may: a directory keeps its inode whatever
// its top copy (working directories stay), and a file its inode through
// its copy-up (inode numbers stay), unless n is bound to the file it had
// or stands for a file that another name still shows.
func (n *Node) adopt(e *branch.Entry) bool {
	id := identity(n.view, e)
	n.openMu.Lock()
	defer n.openMu.Unlock()
	if n.file != id && !n.IsDir() && (n.bound || n.linked) {
		return false
	}
	n.file = id
	n.linked = n.linked || linked(e)
	return true
}
