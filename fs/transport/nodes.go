package transport

import (
	"github.com/branchfs/branchfs/branch"
	"github.com/branchfs/branchfs/internal/lockcheck"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// nodes is what Serve's reader must know of a request's node before it
// reads more than the header, to choose who answers it (opcodes): whether
// the node has a handle open for writing (notWriterChange), and whether it
// is a node of SlowFiles's file (slowFile). Both are kept in this one place,
// by nodeCalls, from the file system's own calls that make and drop
// handles and nodes, whoever parsed the request: answerDirect or go-fuse.
type nodes struct {
	// Handles open for writing: by file handle (their node IDs) and by
	// node ID (how many).
	writeMu   lockcheck.Mutex[lockcheck.LoopWriters]
	writeFhs  map[uint64]uint64
	writeNids map[uint64]int

	// The kernel's lookups of each node ID of SlowFiles's inode number,
	// counted from LOOKUPs to FORGETs. Node IDs are not reused while the
	// kernel holds one.
	slowIno   uint64
	slowMu    lockcheck.Mutex[lockcheck.LoopSlow]
	slowNodes map[uint64]uint64
}

func (n *nodes) hasWriter(nid uint64) bool {
	n.writeMu.Lock()
	defer n.writeMu.Unlock()
	return n.writeNids[nid] > 0
}

func (n *nodes) isSlow(nid uint64) bool {
	n.slowMu.Lock()
	defer n.slowMu.Unlock()
	return n.slowNodes[nid] > 0
}

// opened records handle fh of node nid, if open for writing.
func (n *nodes) opened(nid, fh uint64, flags uint32) {
	if fh == 0 || !branch.OpensForWrite(int(flags)) {
		return // no handle of its own to follow to its release
	}
	n.writeMu.Lock()
	defer n.writeMu.Unlock()
	if n.writeFhs == nil {
		n.writeFhs, n.writeNids = map[uint64]uint64{}, map[uint64]int{}
	}
	n.writeFhs[fh] = nid
	n.writeNids[nid]++
}

// released drops handle fh, before its release is answered.
func (n *nodes) released(fh uint64) {
	n.writeMu.Lock()
	defer n.writeMu.Unlock()
	if nid, ok := n.writeFhs[fh]; ok {
		delete(n.writeFhs, fh)
		if n.writeNids[nid]--; n.writeNids[nid] <= 0 {
			delete(n.writeNids, nid)
		}
	}
}

// looked counts a lookup of node nid, whose inode number is ino.
func (n *nodes) looked(nid, ino uint64) {
	if n.slowIno == 0 || nid == 0 || ino != n.slowIno {
		return
	}
	n.slowMu.Lock()
	defer n.slowMu.Unlock()
	n.slowNodes[nid]++
}

// forgot takes count of the kernel's lookups of node nid off the record.
func (n *nodes) forgot(nid, count uint64) {
	if n.slowIno == 0 {
		return
	}
	n.slowMu.Lock()
	defer n.slowMu.Unlock()
	if c, ok := n.slowNodes[nid]; ok {
		if c <= count {
			delete(n.slowNodes, nid)
		} else {
			n.slowNodes[nid] = c - count
		}
	}
}

// nodeCalls is the file system as the loop calls it: its calls that make
// or drop handles and nodes keep the loop's record (nodes). go-fuse passes
// each FORGET of a BATCH_FORGET to Forget.
type nodeCalls struct {
	fuse.RawFileSystem
	n *nodes
}

func (c *nodeCalls) Lookup(cancel <-chan struct{}, h *fuse.InHeader, name string, out *fuse.EntryOut) fuse.Status {
	st := c.RawFileSystem.Lookup(cancel, h, name, out)
	if st.Ok() {
		c.n.looked(out.NodeId, out.Ino)
	}
	return st
}

func (c *nodeCalls) Forget(nid, nlookup uint64) {
	c.n.forgot(nid, nlookup)
	c.RawFileSystem.Forget(nid, nlookup)
}

func (c *nodeCalls) Open(cancel <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	st := c.RawFileSystem.Open(cancel, in, out)
	if st.Ok() {
		c.n.opened(in.NodeId, out.Fh, in.Flags)
	}
	return st
}

func (c *nodeCalls) Create(cancel <-chan struct{}, in *fuse.CreateIn, name string, out *fuse.CreateOut) fuse.Status {
	st := c.RawFileSystem.Create(cancel, in, name, out)
	if st.Ok() {
		c.n.opened(out.NodeId, out.Fh, in.Flags)
	}
	return st
}

func (c *nodeCalls) Release(cancel <-chan struct{}, in *fuse.ReleaseIn) {
	c.n.released(in.Fh)
	c.RawFileSystem.Release(cancel, in)
}
