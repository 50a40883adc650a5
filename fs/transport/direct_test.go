package transport

import (
	"bytes"
	"fmt"
	"syscall"
	"testing"
	"unsafe"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// callRecorder records each RawFileSystem call with what it was given,
// fills its answer with a pattern, and answers status.
type callRecorder struct {
	fuse.RawFileSystem
	calls  []string
	status fuse.Status
	xattr  []byte
}

func (r *callRecorder) rec(method string, in any, name string, data ...[]byte) {
	r.calls = append(r.calls, fmt.Sprintf("%s %+v %q %q", method, in, name, data))
}

// fill writes a pattern over every other byte of out: a file system sets
// some fields of its answer and leaves the others zero.
func fill[T any](out *T) {
	b := bytesOf(out)
	for i := 0; i < len(b); i += 2 {
		b[i] = byte(i*7 + 3)
	}
}

func (r *callRecorder) Lookup(_ <-chan struct{}, h *fuse.InHeader, name string, out *fuse.EntryOut) fuse.Status {
	r.rec("Lookup", *h, name)
	fill(out)
	return r.status
}

func (r *callRecorder) GetAttr(_ <-chan struct{}, in *fuse.GetAttrIn, out *fuse.AttrOut) fuse.Status {
	r.rec("GetAttr", *in, "")
	fill(out)
	return r.status
}

func (r *callRecorder) SetAttr(_ <-chan struct{}, in *fuse.SetAttrIn, out *fuse.AttrOut) fuse.Status {
	r.rec("SetAttr", *in, "")
	fill(out)
	return r.status
}

func (r *callRecorder) Create(_ <-chan struct{}, in *fuse.CreateIn, name string, out *fuse.CreateOut) fuse.Status {
	r.rec("Create", *in, name)
	fill(out)
	return r.status
}

func (r *callRecorder) Mkdir(_ <-chan struct{}, in *fuse.MkdirIn, name string, out *fuse.EntryOut) fuse.Status {
	r.rec("Mkdir", *in, name)
	fill(out)
	return r.status
}

func (r *callRecorder) Unlink(_ <-chan struct{}, h *fuse.InHeader, name string) fuse.Status {
	r.rec("Unlink", *h, name)
	return r.status
}

func (r *callRecorder) Rmdir(_ <-chan struct{}, h *fuse.InHeader, name string) fuse.Status {
	r.rec("Rmdir", *h, name)
	return r.status
}

func (r *callRecorder) Writev(_ <-chan struct{}, in *fuse.WriteIn, data [][]byte) (uint32, fuse.Status) {
	r.rec("Writev", *in, "", data...)
	return 1234, r.status
}

func (r *callRecorder) Release(_ <-chan struct{}, in *fuse.ReleaseIn) {
	r.rec("Release", *in, "")
}

func (r *callRecorder) GetXAttr(_ <-chan struct{}, h *fuse.InHeader, name string, dest []byte) (uint32, fuse.Status) {
	r.rec("GetXAttr", *h, name, []byte(fmt.Sprint(len(dest))))
	if len(dest) < len(r.xattr) {
		return uint32(len(r.xattr)), fuse.ERANGE
	}
	return uint32(copy(dest, r.xattr)), r.status
}

func (r *callRecorder) ListXAttr(_ <-chan struct{}, h *fuse.InHeader, dest []byte) (uint32, fuse.Status) {
	r.rec("ListXAttr", *h, "", []byte(fmt.Sprint(len(dest))))
	if len(dest) < len(r.xattr) {
		return uint32(len(r.xattr)), fuse.ERANGE
	}
	return uint32(copy(dest, r.xattr)), r.status
}

func (r *callRecorder) RemoveXAttr(_ <-chan struct{}, h *fuse.InHeader, name string) fuse.Status {
	r.rec("RemoveXAttr", *h, name)
	return r.status
}

func (r *callRecorder) Open(_ <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	r.rec("Open", *in, "")
	fill(out)
	return r.status
}

func (r *callRecorder) CopyFileRange(_ <-chan struct{}, in *fuse.CopyFileRangeIn) (uint32, fuse.Status) {
	r.rec("CopyFileRange", *in, "")
	return 4321, r.status
}

func (r *callRecorder) Forget(nodeid, nlookup uint64) {
	r.rec("Forget", nodeid, fmt.Sprint(nlookup))
}

// TestDirectMatchesGoFuse sends each request answerDirect takes, with
// each outcome, both to go-fuse's ProtocolServer and to answerDirect, and
// checks that the file system sees the same calls and the kernel gets
// the same reply, byte for byte; and that what answerDirect leaves to
// go-fuse it does leave.
func TestDirectMatchesGoFuse(t *testing.T) {
	viaGoFuse := &callRecorder{RawFileSystem: fuse.NewDefaultRawFileSystem()}
	direct := &callRecorder{RawFileSystem: fuse.NewDefaultRawFileSystem()}
	ps := initedServer(t, viaGoFuse)
	want := make([]byte, 1<<18)
	l := &Loop{raw: direct, direct: true, directXattr: true, never: make(chan struct{})}
	b := &loopBuf{out: make([]byte, 1<<18)}

	hdr := int(unsafe.Sizeof(fuse.InHeader{}))
	xattrIn := func(size uint32) int {
		return int(unsafe.Sizeof(fuse.GetXAttrIn{})) | int(size)<<32
	}
	type req struct {
		op      uint32
		argSize int // with the argument's first word in bits 32 and up
		payload string
	}
	taken := []req{
		{opLookup, hdr, "name\x00"},
		{opLookup, hdr, "unterminated"},
		{opGetattr, int(unsafe.Sizeof(fuse.GetAttrIn{})), ""},
		{opSetattr, int(unsafe.Sizeof(fuse.SetAttrIn{})), ""},
		{opCreate, int(unsafe.Sizeof(fuse.CreateIn{})) | (syscall.O_WRONLY|syscall.O_EXCL)<<32, "new\x00"},
		{opMkdir, int(unsafe.Sizeof(fuse.MkdirIn{})) | 0o755<<32, "d\x00"},
		{opUnlink, hdr, "gone\x00"},
		{opRmdir, hdr, "d\x00"},
		{opWrite, int(unsafe.Sizeof(fuse.WriteIn{})) | 5<<32, "hello"},
		{opRelease, int(unsafe.Sizeof(fuse.ReleaseIn{})) | 7<<32, ""},
		{opGetxattr, xattrIn(0), "user.a\x00"},
		{opGetxattr, xattrIn(3), "user.a\x00"},
		{opGetxattr, xattrIn(100), "user.a\x00"},
		{opListxattr, xattrIn(0), ""},
		{opListxattr, xattrIn(2), ""},
		{opListxattr, xattrIn(64), ""},
		{opRemovexattr, hdr, "user.a\x00"},
		{opOpen, int(unsafe.Sizeof(fuse.OpenIn{})) | syscall.O_RDONLY<<32, ""},
		{opCopyFileRange, int(unsafe.Sizeof(fuse.CopyFileRangeIn{})) | 9<<32, ""},
		{opForget, int(unsafe.Sizeof(fuse.ForgetIn{})) | 2<<32, ""},
	}
	for _, status := range []fuse.Status{fuse.OK, fuse.ENOENT, fuse.EACCES} {
		for _, c := range taken {
			argSize, arg := c.argSize&0xffffffff, uint32(c.argSize>>32)
			r := request(c.op, argSize, arg, c.payload)
			(*fuse.InHeader)(unsafe.Pointer(&r[0])).NodeId = 5
			what := fmt.Sprintf("opcode %d %q, status %v", c.op, c.payload, status)
			viaGoFuse.status, direct.status = status, status
			viaGoFuse.xattr, direct.xattr = []byte("value"), []byte("value")
			viaGoFuse.calls, direct.calls = nil, nil
			for i := range want {
				want[i], b.out[i] = 0xaa, 0xaa
			}
			wn, st := ps.HandleRequest([][]byte{r}, [][]byte{want})
			if !st.Ok() {
				t.Fatalf("%s: go-fuse: %v", what, st)
			}
			gn, ok := l.answerDirect(b, append([]byte{}, r...))
			if !ok {
				t.Errorf("%s: left to go-fuse", what)
				continue
			}
			if fmt.Sprint(direct.calls) != fmt.Sprint(viaGoFuse.calls) {
				t.Errorf("%s: file system got\n%v\nwant (go-fuse)\n%v", what, direct.calls, viaGoFuse.calls)
			}
			if !bytes.Equal(b.out[:gn], want[:wn]) {
				t.Errorf("%s: reply\n%x\nwant (go-fuse)\n%x", what, b.out[:gn], want[:wn])
			}
		}
	}

	for _, c := range []struct {
		what string
		r    []byte
		l    *Loop
	}{
		{"an opcode it does not take (SETXATTR)", request(opSetxattr, hdr+8, 1, "user.a\x00v"), l},
		{"a request with extensions", func() []byte {
			r := request(opMkdir, int(unsafe.Sizeof(fuse.MkdirIn{})), 0o755, "d\x00\x00\x00\x00\x00\x00\x00\x00\x00")
			(*fuse.InHeader)(unsafe.Pointer(&r[0])).TotalExtlen = 1
			return r
		}(), l},
		{"a short request", request(opSetattr, hdr+8, 0, ""), l},
		{"go-fuse's poll lookup", request(opLookup, hdr, 0, pollHackName+"\x00"), l},
		{"a request when go-fuse logs them", request(opLookup, hdr, 0, "name\x00"), &Loop{raw: direct}},
		{"a GETXATTR larger than the buffer", request(opGetxattr, int(unsafe.Sizeof(fuse.GetXAttrIn{})), 1<<20, "user.a\x00"), l},
	} {
		direct.calls = nil
		if _, ok := c.l.answerDirect(b, c.r); ok || len(direct.calls) > 0 {
			t.Errorf("%s: answered (calls %v), want it left to go-fuse", c.what, direct.calls)
		}
	}
}

// An INTERRUPT of a request being answered directly, on Serve's reader or
// on a worker, gets no reply: go-fuse, which does not know the request,
// would answer EAGAIN, and the kernel would send it again at once until
// the request was answered. Any other still goes to go-fuse.
func TestInterruptOfDirectRequest(t *testing.T) {
	ps := initedServer(t, fuse.NewDefaultRawFileSystem())
	var p [2]int
	if err := syscall.Pipe2(p[:], syscall.O_NONBLOCK|syscall.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(p[0])
	defer syscall.Close(p[1])
	l := &Loop{fd: p[1], ps: ps, raw: fuse.NewDefaultRawFileSystem(), never: make(chan struct{})}
	l.readerUnique.Store(7)
	l.directOthers = []uint64{5}
	interrupt := func(unique uint64) (replied bool) {
		in := fuse.InterruptIn{InHeader: fuse.InHeader{Opcode: opInterrupt, Unique: 9}, Unique: unique}
		in.Length = uint32(unsafe.Sizeof(in))
		b := &loopBuf{in: make([]byte, 4096), out: make([]byte, 4096)}
		l.answer(b, copy(b.in, bytesOf(&in)), false)
		n, _ := syscall.Read(p[0], b.out)
		return n > 0
	}
	if interrupt(7) {
		t.Error("an INTERRUPT of the reader's own request was answered")
	}
	if interrupt(5) {
		t.Error("an INTERRUPT of a worker's direct request was answered")
	}
	if !interrupt(8) {
		t.Error("an INTERRUPT of another request got no reply from go-fuse")
	}
}
