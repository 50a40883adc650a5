package transport

import (
	"testing"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// Reads and writes of the files SlowFiles names go to workers while the
// kernel holds their node, counted from LOOKUP replies to FORGETs single
// and batched; every IOCTL goes to a worker; other files' stay.
func TestSlowFiles(t *testing.T) {
	const ino = 0xffff_0000_0000_0000
	l := &Loop{}
	l.SlowFiles(ino)
	answer := func(req, rep []byte) {
		l.trackSlow(req, nil)
		if rep != nil {
			l.trackSlow(req, rep)
		}
	}
	lookup := func(nid, ino uint64, status int32) {
		in := fuse.InHeader{Opcode: opLookup, NodeId: 1}
		out := fuse.EntryOut{NodeId: nid}
		out.Ino = ino
		answer(bytesOf(&in), reply(status, &out))
	}
	forget := func(nid, n uint64) {
		in := fuse.ForgetIn{Nlookup: n}
		in.Opcode, in.NodeId = opForget, nid
		answer(bytesOf(&in), nil)
	}
	batchForget := func(ones ...forgetOne) {
		in := batchForgetIn{Count: uint32(len(ones))}
		in.Opcode = opBatchForget
		req := bytesOf(&in)
		for i := range ones {
			req = append(req, bytesOf(&ones[i])...)
		}
		answer(req, nil)
	}
	slow := func(op uint32, nid uint64) bool {
		in := fuse.InHeader{Opcode: op, NodeId: nid}
		return l.slow(bytesOf(&in))
	}

	lookup(5, ino, 0)
	lookup(5, ino, 0)
	lookup(6, 1234, 0)               // another file
	lookup(7, ino, -int32(fuse.EIO)) // failed: no node
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
	if len(l.slowNodes) != 0 {
		t.Errorf("nodes kept: %v", l.slowNodes)
	}
	lookup(8, ino, 0)
	forget(8, 1)
	if len(l.slowNodes) != 0 {
		t.Errorf("nodes kept: %v", l.slowNodes)
	}
	if l := (&Loop{}); l.slow(bytesOf(&fuse.InHeader{Opcode: opIoctl})) {
		t.Error("without SlowFiles an IOCTL goes to a worker")
	}
}
