package transport

import (
	"syscall"
	"testing"
	"unsafe"

	"github.com/hanwen/go-fuse/v2/fuse"
)

func bytesOf[T any](v *T) []byte { return unsafe.Slice((*byte)(unsafe.Pointer(v)), unsafe.Sizeof(*v)) }

// handles is a file system whose OPEN and CREATE answer with the handle,
// node ID and status set in it, for the loop's record of nodes.
type handles struct {
	fuse.RawFileSystem
	fh, nid uint64
	st      fuse.Status
}

func (h *handles) Open(_ <-chan struct{}, _ *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	out.Fh = h.fh
	return h.st
}

func (h *handles) Create(_ <-chan struct{}, _ *fuse.CreateIn, _ string, out *fuse.CreateOut) fuse.Status {
	out.Fh, out.NodeId = h.fh, h.nid
	return h.st
}

// A SETATTR, SETXATTR or REMOVEXATTR of a node with a handle open for
// writing is answered on the reader, from the CREATE or OPEN that opened it
// until its RELEASE; any other still goes to a goroutine of its own.
func TestWriterChangeOnReader(t *testing.T) {
	l := &Loop{}
	fs := &handles{RawFileSystem: fuse.NewDefaultRawFileSystem()}
	calls := &nodeCalls{fs, &l.nodes}
	onReader := func(op uint32, nid uint64) bool {
		in := fuse.SetAttrIn{}
		in.Opcode, in.NodeId = op, nid
		return !l.toWorker(bytesOf(&in))
	}
	setattrOnReader := func(nid uint64) bool { return onReader(opSetattr, nid) }
	release := func(nid, fh uint64) {
		in := fuse.ReleaseIn{Fh: fh}
		in.Opcode, in.NodeId = opRelease, nid
		calls.Release(nil, &in)
	}
	open := func(nid, fh uint64, flags uint32, st fuse.Status) {
		in := fuse.OpenIn{Flags: flags}
		in.Opcode, in.NodeId = opOpen, nid
		fs.fh, fs.st = fh, st
		calls.Open(nil, &in, &fuse.OpenOut{})
	}
	if setattrOnReader(7) || onReader(opSetxattr, 7) || onReader(opRemovexattr, 7) {
		t.Fatal("the opcode table no longer sends every SETATTR, SETXATTR and REMOVEXATTR of a node without writers to a goroutine")
	}

	create := fuse.CreateIn{Flags: syscall.O_WRONLY | syscall.O_CREAT | syscall.O_EXCL}
	create.Opcode, create.NodeId = opCreate, 1
	fs.nid, fs.fh, fs.st = 7, 3, fuse.OK
	calls.Create(nil, &create, "f", &fuse.CreateOut{})
	if !setattrOnReader(7) || !onReader(opSetxattr, 7) || !onReader(opRemovexattr, 7) {
		t.Error("SETATTR, SETXATTR or REMOVEXATTR of a file just created for writing goes to a goroutine")
	}
	open(8, 4, syscall.O_RDONLY, fuse.OK)
	open(9, 6, syscall.O_WRONLY, fuse.EACCES)
	if setattrOnReader(1) || setattrOnReader(8) || setattrOnReader(9) {
		t.Error("SETATTR of a directory, of a file open for reading or of a failed open on the reader")
	}
	open(7, 5, syscall.O_RDWR, fuse.OK)
	release(7, 3)
	if !setattrOnReader(7) {
		t.Error("SETATTR after one of two writers' release goes to a goroutine")
	}
	release(7, 5)
	release(8, 4)
	if setattrOnReader(7) || onReader(opSetxattr, 7) {
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
		if got := (&Loop{}).toWorker(bytesOf(&in)); got != c.block {
			t.Errorf("COPY_FILE_RANGE of %d bytes: toWorker %v, want %v", c.len, got, c.block)
		}
	}
}
