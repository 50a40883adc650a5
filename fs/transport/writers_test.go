package transport

import (
	"syscall"
	"testing"
	"unsafe"

	"github.com/hanwen/go-fuse/v2/fuse"
)

func bytesOf[T any](v *T) []byte { return unsafe.Slice((*byte)(unsafe.Pointer(v)), unsafe.Sizeof(*v)) }

// reply is an answer of status with out after the header, as the
// ProtocolServer writes it.
func reply[T any](status int32, out *T) []byte {
	h := fuse.OutHeader{Status: status}
	return append(append([]byte{}, bytesOf(&h)...), bytesOf(out)...)
}

// A SETATTR, SETXATTR or REMOVEXATTR of a node with a handle open for
// writing is answered on the reader, from the CREATE or OPEN that opened it
// until its RELEASE; any other still goes to a goroutine of its own.
func TestWriterChangeOnReader(t *testing.T) {
	l := &Loop{}
	answer := func(req, rep []byte) {
		l.trackWriters(req, nil)
		l.trackWriters(req, rep)
	}
	setattr := func(nid uint64) []byte {
		in := fuse.SetAttrIn{}
		in.Opcode, in.NodeId = opSetattr, nid
		return bytesOf(&in)
	}
	onReader := func(nid uint64) bool {
		req := setattr(nid)
		if !mayBlock(req) {
			t.Fatal("mayBlock no longer sends every SETATTR to a goroutine")
		}
		return l.writerChange(req)
	}
	xattrOnReader := func(op uint32, nid uint64) bool {
		in := fuse.InHeader{Opcode: op, NodeId: nid}
		req := bytesOf(&in)
		if !mayBlock(req) {
			t.Fatal("mayBlock no longer sends every SETXATTR and REMOVEXATTR to a goroutine")
		}
		return l.writerChange(req)
	}
	release := func(nid, fh uint64) {
		in := fuse.ReleaseIn{Fh: fh}
		in.Opcode, in.NodeId = opRelease, nid
		answer(bytesOf(&in), reply(0, &struct{}{}))
	}
	open := func(nid, fh uint64, flags uint32, status int32) {
		in := fuse.OpenIn{Flags: flags}
		in.Opcode, in.NodeId = opOpen, nid
		answer(bytesOf(&in), reply(status, &fuse.OpenOut{Fh: fh}))
	}

	create := fuse.CreateIn{Flags: syscall.O_WRONLY | syscall.O_CREAT | syscall.O_EXCL}
	create.Opcode, create.NodeId = opCreate, 1
	out := fuse.CreateOut{}
	out.NodeId, out.Fh = 7, 3
	answer(bytesOf(&create), reply(0, &out))
	if !onReader(7) || !xattrOnReader(opSetxattr, 7) || !xattrOnReader(opRemovexattr, 7) {
		t.Error("SETATTR, SETXATTR or REMOVEXATTR of a file just created for writing goes to a goroutine")
	}
	open(8, 4, syscall.O_RDONLY, 0)
	open(9, 6, syscall.O_WRONLY, -int32(syscall.EACCES))
	if onReader(1) || onReader(8) || onReader(9) {
		t.Error("SETATTR of a directory, of a file open for reading or of a failed open on the reader")
	}
	open(7, 5, syscall.O_RDWR, 0)
	release(7, 3)
	if !onReader(7) {
		t.Error("SETATTR after one of two writers' release goes to a goroutine")
	}
	release(7, 5)
	release(8, 4)
	if onReader(7) || xattrOnReader(opSetxattr, 7) {
		t.Error("SETATTR or SETXATTR after the last writer's release on the reader")
	}
}

// A COPY_FILE_RANGE of at most smallCopy bytes is answered on the reader, a
// larger one on a goroutine of its own.
func TestSmallCopyOnReader(t *testing.T) {
	for _, c := range []struct {
		len   uint64
		block bool
	}{{7, false}, {smallCopy, false}, {smallCopy + 1, true}, {1 << 40, true}} {
		in := fuse.CopyFileRangeIn{Len: c.len}
		in.Opcode = opCopyFileRange
		if got := mayBlock(bytesOf(&in)); got != c.block {
			t.Errorf("COPY_FILE_RANGE of %d bytes: mayBlock %v, want %v", c.len, got, c.block)
		}
	}
}
