package transport

import (
	"unsafe"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// SlowFiles sends to workers the reads and writes of the files whose inode
// number is ino, and every IOCTL: the file system answers commands there
// that may wait long for a lock (fs's control files, whose commands take
// the store's lock exclusively and so wait for every operation in flight),
// and the reader would read no other request meanwhile. Call it before
// Serve.
func (l *Loop) SlowFiles(ino uint64) {
	l.slowIno, l.slowNodes = ino, map[uint64]uint64{}
}

// slow says whether req is one that SlowFiles sends to workers.
func (l *Loop) slow(req []byte) bool {
	h := (*fuse.InHeader)(unsafe.Pointer(&req[0]))
	if l.slowIno == 0 {
		return false
	}
	switch h.Opcode {
	case opIoctl:
		return true
	case opRead, opWrite:
		l.slowMu.Lock()
		defer l.slowMu.Unlock()
		return l.slowNodes[h.NodeId] > 0
	}
	return false
}

// trackSlow keeps slow's record of the nodes of SlowFiles's inode number:
// from a LOOKUP's reply, and from a FORGET or BATCH_FORGET before it is
// answered (reply nil). Node IDs are not reused while the kernel holds one.
func (l *Loop) trackSlow(req, reply []byte) {
	if l.slowIno == 0 {
		return
	}
	h := (*fuse.InHeader)(unsafe.Pointer(&req[0]))
	hdr := int(unsafe.Sizeof(fuse.OutHeader{}))
	switch {
	case h.Opcode == opLookup && reply != nil && len(reply) >= hdr+int(unsafe.Sizeof(fuse.EntryOut{})) &&
		(*fuse.OutHeader)(unsafe.Pointer(&reply[0])).Status == 0:
		out := (*fuse.EntryOut)(unsafe.Pointer(&reply[hdr]))
		if out.NodeId != 0 && out.Ino == l.slowIno {
			l.slowMu.Lock()
			l.slowNodes[out.NodeId]++
			l.slowMu.Unlock()
		}
	case h.Opcode == opForget && reply == nil && len(req) >= int(unsafe.Sizeof(fuse.ForgetIn{})):
		l.forgetSlow(h.NodeId, (*fuse.ForgetIn)(unsafe.Pointer(&req[0])).Nlookup)
	case h.Opcode == opBatchForget && reply == nil && len(req) >= int(unsafe.Sizeof(batchForgetIn{})):
		in := (*batchForgetIn)(unsafe.Pointer(&req[0]))
		rest := req[unsafe.Sizeof(*in):]
		for i := 0; i < int(in.Count) && len(rest) >= int(unsafe.Sizeof(forgetOne{})); i++ {
			one := (*forgetOne)(unsafe.Pointer(&rest[0]))
			l.forgetSlow(one.NodeId, one.Nlookup)
			rest = rest[unsafe.Sizeof(*one):]
		}
	}
}

// forgetSlow takes n of the kernel's lookups of node off slow's record.
func (l *Loop) forgetSlow(node, n uint64) {
	l.slowMu.Lock()
	defer l.slowMu.Unlock()
	if c, ok := l.slowNodes[node]; ok {
		if c <= n {
			delete(l.slowNodes, node)
		} else {
			l.slowNodes[node] = c - n
		}
	}
}

// batchForgetIn and forgetOne are struct fuse_batch_forget_in and struct
// fuse_forget_one of linux/fuse.h (go-fuse does not export them).
type batchForgetIn struct {
	fuse.InHeader
	Count uint32
	Dummy uint32
}

type forgetOne struct {
	NodeId  uint64
	Nlookup uint64
}
