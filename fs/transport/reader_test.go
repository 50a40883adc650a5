package transport

import (
	"syscall"
	"testing"
	"unsafe"

	"github.com/hanwen/go-fuse/v2/fuse"
)

func bytesOf[T any](v *T) []byte { return unsafe.Slice((*byte)(unsafe.Pointer(v)), unsafe.Sizeof(*v)) }

// choosy answers SETATTR and IOCTL of node 7 with OnWorker when the
// reader asks (OnReader), and every other with OK; it records who asked.
type choosy struct {
	fuse.RawFileSystem
	calls []string
}

func (c *choosy) answer(cancel <-chan struct{}, nid uint64) fuse.Status {
	if OnReader(&fuse.Context{Cancel: cancel}) {
		c.calls = append(c.calls, "reader")
		if nid == 7 {
			return fuse.Status(OnWorker)
		}
		return fuse.OK
	}
	c.calls = append(c.calls, "worker")
	return fuse.OK
}

func (c *choosy) SetAttr(cancel <-chan struct{}, in *fuse.SetAttrIn, _ *fuse.AttrOut) fuse.Status {
	return c.answer(cancel, in.NodeId)
}

func (c *choosy) Ioctl(cancel <-chan struct{}, in *fuse.IoctlIn, _ []byte, _ *fuse.IoctlOut, _ []byte) fuse.Status {
	return c.answer(cancel, in.NodeId)
}

// A request the file system answers OnWorker on Serve's reader gets no
// reply there: answer reports it, and the worker's call, which is not
// told it is on the reader, answers it. Others get their reply on the
// reader. Both for requests answered directly and through go-fuse.
func TestOnWorkerHandsOff(t *testing.T) {
	var p [2]int
	if err := syscall.Pipe2(p[:], syscall.O_NONBLOCK|syscall.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(p[0])
	defer syscall.Close(p[1])
	fs := &choosy{RawFileSystem: fuse.NewDefaultRawFileSystem()}
	for _, direct := range []bool{true, false} {
		l := &Loop{fd: p[1], never: make(chan struct{}), direct: direct}
		l.raw = &readerCalls{fs, l}
		l.ps = initedServer(t, l.raw)
		b := &loopBuf{in: make([]byte, 4096), out: make([]byte, 4096)}
		reply := func() *fuse.OutHeader {
			n, _ := syscall.Read(p[0], b.out)
			if n < int(unsafe.Sizeof(fuse.OutHeader{})) {
				return nil
			}
			return (*fuse.OutHeader)(unsafe.Pointer(&b.out[0]))
		}
		for _, c := range []struct {
			what string
			req  []byte
		}{
			{"SETATTR", request(opSetattr, int(unsafe.Sizeof(fuse.SetAttrIn{})), 0, "")},
			{"IOCTL", request(opIoctl, int(unsafe.Sizeof(fuse.IoctlIn{})), 0, "")},
		} {
			n := copy(b.in, c.req)
			h := (*fuse.InHeader)(unsafe.Pointer(&b.in[0]))

			h.NodeId = 1
			fs.calls = nil
			if !l.answer(b, n, true) {
				t.Errorf("direct %v: a %s the file system answers on the reader was handed off", direct, c.what)
			}
			if r := reply(); r == nil || r.Status != 0 || r.Unique != h.Unique {
				t.Errorf("direct %v: %s answered on the reader: reply %+v", direct, c.what, r)
			}

			h.NodeId = 7
			fs.calls = nil
			if l.answer(b, n, true) {
				t.Errorf("direct %v: a %s answered OnWorker was not handed off", direct, c.what)
			}
			if r := reply(); r != nil {
				t.Errorf("direct %v: a %s handed off got a reply on the reader: %+v", direct, c.what, r)
			}
			if !l.answer(b, n, false) {
				t.Errorf("direct %v: a worker's answer to %s reported a handoff", direct, c.what)
			}
			if r := reply(); r == nil || r.Status != 0 || r.Unique != h.Unique {
				t.Errorf("direct %v: %s answered on a worker: reply %+v", direct, c.what, r)
			}
			if got := fs.calls; len(got) != 2 || got[0] != "reader" || got[1] != "worker" {
				t.Errorf("direct %v: %s reached the file system from %v, want reader then worker", direct, c.what, got)
			}
			if l.readerReq.Load() != 0 {
				t.Errorf("direct %v: the reader's request outlived its answer", direct)
			}
		}
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
