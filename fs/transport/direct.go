package transport

import (
	"bytes"
	"log"
	"runtime"
	"unsafe"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// answerDirect answers the requests a small-file workload is made of (those
// with a direct answer in the opcode table: LOOKUP, GETATTR, SETATTR,
// CREATE, OPEN, MKDIR, UNLINK, RMDIR, WRITE, COPY_FILE_RANGE, RELEASE,
// GETXATTR, LISTXATTR, REMOVEXATTR, FORGET) without go-fuse's
// ProtocolServer.HandleRequest, which allocates a request of about 900
// bytes and a channel for each: three quarters of what the daemon
// allocated during an extraction of Go's src/, and of the collections
// that followed. It parses each as go-fuse v2.12.1 does (the same
// structures, the same RawFileSystem method, the same reply:
// TestDirectMatchesGoFuse) into req's own buffer and out.
//
// It reports false for a request it leaves to HandleRequest: any other
// opcode, a request carrying extensions, one too short for its
// structure, and every request when go-fuse logs them (--debug). The
// requests it answers are not in go-fuse's table of requests in flight,
// so an INTERRUPT for one gets EAGAIN, which makes the kernel send it
// again until the request is answered: Loop.answer keeps the requests
// answered here, and an INTERRUPT of one gets no reply
// (Loop.interruptsDirect).
func (l *Loop) answerDirect(b *loopBuf, req []byte) (size int, ok bool) {
	if !l.direct || len(req) < int(unsafe.Sizeof(fuse.InHeader{})) {
		return 0, false
	}
	h := (*fuse.InHeader)(unsafe.Pointer(&req[0]))
	if h.TotalExtlen != 0 || h.NodeId == pollHackInode {
		return 0, false
	}
	op := opcodeOf(req)
	if op.direct == nil {
		return 0, false
	}
	st, outSize, ok := op.direct(l, b, h, req)
	if !ok {
		return 0, false
	}
	if op.noReply {
		return 0, true
	}
	if st != fuse.OK {
		outSize = 0 // an error carries nothing after the header
	}
	hdr := int(unsafe.Sizeof(fuse.OutHeader{}))
	oh := (*fuse.OutHeader)(unsafe.Pointer(&b.out[0]))
	*oh = fuse.OutHeader{Length: uint32(hdr + outSize), Status: -int32(st), Unique: h.Unique}
	return hdr + outSize, true
}

// hdr is the size of a reply's header, after which its structure goes.
const hdr = int(unsafe.Sizeof(fuse.OutHeader{}))

// The opcodes' direct answers (opcode.direct).

func directLookup(l *Loop, b *loopBuf, h *fuse.InHeader, req []byte) (fuse.Status, int, bool) {
	name := cString(req[unsafe.Sizeof(*h):])
	if h.NodeId == fuse.FUSE_ROOT_ID && name == pollHackName {
		return 0, 0, false
	}
	eo := zeroed[fuse.EntryOut](b.out[hdr:])
	return l.call(func() fuse.Status { return l.raw.Lookup(l.never, h, name, eo) }), int(unsafe.Sizeof(*eo)), true
}

func directGetattr(l *Loop, b *loopBuf, h *fuse.InHeader, req []byte) (fuse.Status, int, bool) {
	in, _, ok := argOf[fuse.GetAttrIn](req)
	if !ok {
		return 0, 0, false
	}
	ao := zeroed[fuse.AttrOut](b.out[hdr:])
	return l.call(func() fuse.Status { return l.raw.GetAttr(l.never, in, ao) }), int(unsafe.Sizeof(*ao)), true
}

func directSetattr(l *Loop, b *loopBuf, h *fuse.InHeader, req []byte) (fuse.Status, int, bool) {
	in, _, ok := argOf[fuse.SetAttrIn](req)
	if !ok {
		return 0, 0, false
	}
	ao := zeroed[fuse.AttrOut](b.out[hdr:])
	return l.call(func() fuse.Status { return l.raw.SetAttr(l.never, in, ao) }), int(unsafe.Sizeof(*ao)), true
}

func directCreate(l *Loop, b *loopBuf, h *fuse.InHeader, req []byte) (fuse.Status, int, bool) {
	in, rest, ok := argOf[fuse.CreateIn](req)
	if !ok {
		return 0, 0, false
	}
	name := cString(rest)
	co := zeroed[fuse.CreateOut](b.out[hdr:])
	return l.call(func() fuse.Status { return l.raw.Create(l.never, in, name, co) }), int(unsafe.Sizeof(*co)), true
}

func directMkdir(l *Loop, b *loopBuf, h *fuse.InHeader, req []byte) (fuse.Status, int, bool) {
	in, rest, ok := argOf[fuse.MkdirIn](req)
	if !ok {
		return 0, 0, false
	}
	name := cString(rest)
	eo := zeroed[fuse.EntryOut](b.out[hdr:])
	return l.call(func() fuse.Status { return l.raw.Mkdir(l.never, in, name, eo) }), int(unsafe.Sizeof(*eo)), true
}

func directUnlink(l *Loop, b *loopBuf, h *fuse.InHeader, req []byte) (fuse.Status, int, bool) {
	name := cString(req[unsafe.Sizeof(*h):])
	return l.call(func() fuse.Status { return l.raw.Unlink(l.never, h, name) }), 0, true
}

func directRmdir(l *Loop, b *loopBuf, h *fuse.InHeader, req []byte) (fuse.Status, int, bool) {
	name := cString(req[unsafe.Sizeof(*h):])
	return l.call(func() fuse.Status { return l.raw.Rmdir(l.never, h, name) }), 0, true
}

func directWrite(l *Loop, b *loopBuf, h *fuse.InHeader, req []byte) (fuse.Status, int, bool) {
	in, data, ok := argOf[fuse.WriteIn](req)
	if !ok {
		return 0, 0, false
	}
	wo := zeroed[fuse.WriteOut](b.out[hdr:])
	b.iov[0] = data
	st := l.call(func() (st fuse.Status) {
		// As go-fuse: Writev, or Write where that is not implemented.
		if wo.Size, st = l.raw.Writev(l.never, in, b.iov[:]); st == fuse.ENOSYS {
			wo.Size, st = l.raw.Write(l.never, in, data)
		}
		return st
	})
	b.iov[0] = nil
	return st, int(unsafe.Sizeof(*wo)), true
}

func directRelease(l *Loop, b *loopBuf, h *fuse.InHeader, req []byte) (fuse.Status, int, bool) {
	in, _, ok := argOf[fuse.ReleaseIn](req)
	if !ok {
		return 0, 0, false
	}
	l.call(func() fuse.Status { l.raw.Release(l.never, in); return fuse.OK })
	return fuse.OK, 0, true
}

// directGetxattr answers GETXATTR and LISTXATTR.
func directGetxattr(l *Loop, b *loopBuf, h *fuse.InHeader, req []byte) (fuse.Status, int, bool) {
	in, rest, ok := argOf[fuse.GetXAttrIn](req)
	if !ok || !l.directXattr || hdr+int(in.Size) > len(b.out) {
		return 0, 0, false
	}
	var name string
	if h.Opcode == opGetxattr {
		name = cString(rest)
	}
	get := func(dest []byte) (n uint32, st fuse.Status) {
		if h.Opcode == opGetxattr {
			return l.raw.GetXAttr(l.never, h, name, dest)
		}
		return l.raw.ListXAttr(l.never, h, dest)
	}
	// Two requests in one, as for getxattr(2): with a size of 0 the
	// value's length in a structure, otherwise the value itself.
	if in.Size == 0 {
		xo := zeroed[fuse.GetXAttrOut](b.out[hdr:])
		st := l.call(func() (st fuse.Status) { xo.Size, st = get(nil); return st })
		if st == fuse.ERANGE {
			st = fuse.OK // no size is too small for the length
		}
		return st, int(unsafe.Sizeof(*xo)), true
	}
	var n uint32
	st := l.call(func() (st fuse.Status) { n, st = get(b.out[hdr : hdr+int(in.Size)]); return st })
	return st, int(min(n, in.Size)), true
}

func directRemovexattr(l *Loop, b *loopBuf, h *fuse.InHeader, req []byte) (fuse.Status, int, bool) {
	if !l.directXattr {
		return 0, 0, false
	}
	name := cString(req[unsafe.Sizeof(*h):])
	return l.call(func() fuse.Status { return l.raw.RemoveXAttr(l.never, h, name) }), 0, true
}

func directOpen(l *Loop, b *loopBuf, h *fuse.InHeader, req []byte) (fuse.Status, int, bool) {
	in, _, ok := argOf[fuse.OpenIn](req)
	if !ok {
		return 0, 0, false
	}
	oo := zeroed[fuse.OpenOut](b.out[hdr:])
	return l.call(func() fuse.Status { return l.raw.Open(l.never, in, oo) }), int(unsafe.Sizeof(*oo)), true
}

func directCopyFileRange(l *Loop, b *loopBuf, h *fuse.InHeader, req []byte) (fuse.Status, int, bool) {
	in, _, ok := argOf[fuse.CopyFileRangeIn](req)
	if !ok {
		return 0, 0, false
	}
	wo := zeroed[fuse.WriteOut](b.out[hdr:])
	st := l.call(func() (st fuse.Status) { wo.Size, st = l.raw.CopyFileRange(l.never, in); return st })
	return st, int(unsafe.Sizeof(*wo)), true
}

func directForget(l *Loop, b *loopBuf, h *fuse.InHeader, req []byte) (fuse.Status, int, bool) {
	in, _, ok := argOf[fuse.ForgetIn](req)
	if !ok || l.rememberInodes {
		return 0, 0, false
	}
	l.call(func() fuse.Status { l.raw.Forget(h.NodeId, in.Nlookup); return fuse.OK })
	return fuse.OK, 0, true
}

// call runs fn as go-fuse runs a file system's method: a panic is logged
// with its stack and answered EIO, and the daemon goes on.
func (l *Loop) call(fn func() fuse.Status) (st fuse.Status) {
	defer func() {
		if r := recover(); r != nil {
			buf := make([]byte, 64<<10)
			log.Printf("panic in FS handler: %v\n%s", r, buf[:runtime.Stack(buf, false)])
			st = fuse.EIO
		}
	}()
	return fn()
}

// argOf casts req to the request structure T, which begins with the
// header, and returns what follows it.
func argOf[T any](req []byte) (*T, []byte, bool) {
	n := int(unsafe.Sizeof(*new(T)))
	if len(req) < n {
		return nil, nil, false
	}
	return (*T)(unsafe.Pointer(&req[0])), req[n:], true
}

// zeroed clears the reply structure T at the start of b and returns it.
func zeroed[T any](b []byte) *T {
	p := (*T)(unsafe.Pointer(&b[0]))
	var zero T
	*p = zero
	return p
}

// cString is the name at the start of b, as go-fuse reads it: up to the
// first NUL, all of b without one. Converting it copies it: the file
// system keeps names.
func cString(b []byte) string {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	return string(b)
}

// From go-fuse's poll.go (unexported): a lookup of this name in the
// root, or any request for this node, is go-fuse's own, answered by it.
const (
	pollHackName  = ".go-fuse-epoll-hack"
	pollHackInode = ^uint64(0)
)
