package transport

import (
	"testing"
	"unsafe"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// lookups is a file system whose LOOKUP answers with the node ID, inode
// number and status set in it.
type lookups struct {
	fuse.RawFileSystem
	nid, ino uint64
	st       fuse.Status
}

func (f *lookups) Lookup(_ <-chan struct{}, _ *fuse.InHeader, _ string, out *fuse.EntryOut) fuse.Status {
	out.NodeId, out.Ino = f.nid, f.ino
	return f.st
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

// Reads and writes of the files SlowFiles names go to workers while the
// kernel holds their node, counted from LOOKUPs to FORGETs single and
// batched (as go-fuse passes them on); every IOCTL goes to a worker;
// other files' stay.
func TestSlowFiles(t *testing.T) {
	const ino = 0xffff_0000_0000_0000
	l := &Loop{}
	l.SlowFiles(ino)
	fs := &lookups{RawFileSystem: fuse.NewDefaultRawFileSystem()}
	calls := &nodeCalls{fs, &l.nodes}
	ps := initedServer(t, calls)
	out := make([]byte, 1<<18)
	lookup := func(nid, ino uint64, st fuse.Status) {
		fs.nid, fs.ino, fs.st = nid, ino, st
		calls.Lookup(nil, &fuse.InHeader{Opcode: opLookup, NodeId: 1}, "f", &fuse.EntryOut{})
	}
	forget := func(nid, n uint64) {
		in := fuse.ForgetIn{Nlookup: n}
		in.Opcode, in.NodeId, in.Length = opForget, nid, uint32(unsafe.Sizeof(in))
		ps.HandleRequest([][]byte{bytesOf(&in)}, [][]byte{out})
	}
	batchForget := func(ones ...forgetOne) {
		in := batchForgetIn{Count: uint32(len(ones))}
		in.Opcode = opBatchForget
		req := bytesOf(&in)
		for i := range ones {
			req = append(req, bytesOf(&ones[i])...)
		}
		(*fuse.InHeader)(unsafe.Pointer(&req[0])).Length = uint32(len(req))
		ps.HandleRequest([][]byte{req}, [][]byte{out})
	}
	slow := func(op uint32, nid uint64) bool {
		in := fuse.InHeader{Opcode: op, NodeId: nid}
		return l.toWorker(bytesOf(&in))
	}

	lookup(5, ino, fuse.OK)
	lookup(5, ino, fuse.OK)
	lookup(6, 1234, fuse.OK) // another file
	lookup(7, ino, fuse.EIO) // failed: no node
	lookup(0, ino, fuse.OK)  // a negative entry: no node
	if !slow(opWrite, 5) || !slow(opRead, 5) {
		t.Error("a slow file's read or write stays on the reader")
	}
	if slow(opWrite, 6) || slow(opWrite, 7) || slow(opGetattr, 5) {
		t.Error("a request that is not a slow file's read or write goes to a worker")
	}
	if !slow(opIoctl, 6) {
		t.Error("an IOCTL stays on the reader")
	}
	forget(5, 1)
	if !slow(opWrite, 5) {
		t.Error("the node went with the first of its two lookups")
	}
	batchForget(forgetOne{NodeId: 6, Nlookup: 1}, forgetOne{NodeId: 5, Nlookup: 1})
	if slow(opWrite, 5) {
		t.Error("a forgotten node stays slow")
	}
	if len(l.nodes.slowNodes) != 0 {
		t.Errorf("nodes kept: %v", l.nodes.slowNodes)
	}
	lookup(8, ino, fuse.OK)
	forget(8, 1)
	if len(l.nodes.slowNodes) != 0 {
		t.Errorf("nodes kept: %v", l.nodes.slowNodes)
	}
	if l := (&Loop{}); l.toWorker(bytesOf(&fuse.InHeader{Opcode: opIoctl})) {
		t.Error("without SlowFiles an IOCTL goes to a worker")
	}
}
