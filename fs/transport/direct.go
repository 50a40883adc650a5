package transport

import (
	"bytes"
	"log"
	"runtime"
	"unsafe"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// answerDirect answers the requests a small-file workload is made of
// (LOOKUP, GETATTR, SETATTR, CREATE, OPEN, MKDIR, UNLINK, RMDIR, WRITE,
// COPY_FILE_RANGE, RELEASE, GETXATTR, LISTXATTR, REMOVEXATTR, FORGET) without go-fuse's
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
	out := b.out
	hdr := int(unsafe.Sizeof(fuse.OutHeader{}))
	var st fuse.Status
	outSize := 0
	switch h.Opcode {
	case opLookup:
		name := cString(req[unsafe.Sizeof(*h):])
		if h.NodeId == fuse.FUSE_ROOT_ID && name == pollHackName {
			return 0, false
		}
		eo := zeroed[fuse.EntryOut](out[hdr:])
		st, outSize = l.call(func() fuse.Status { return l.raw.Lookup(l.never, h, name, eo) }), int(unsafe.Sizeof(*eo))
	case opGetattr:
		in, _, ok := argOf[fuse.GetAttrIn](req)
		if !ok {
			return 0, false
		}
		ao := zeroed[fuse.AttrOut](out[hdr:])
		st, outSize = l.call(func() fuse.Status { return l.raw.GetAttr(l.never, in, ao) }), int(unsafe.Sizeof(*ao))
	case opSetattr:
		in, _, ok := argOf[fuse.SetAttrIn](req)
		if !ok {
			return 0, false
		}
		ao := zeroed[fuse.AttrOut](out[hdr:])
		st, outSize = l.call(func() fuse.Status { return l.raw.SetAttr(l.never, in, ao) }), int(unsafe.Sizeof(*ao))
	case opCreate:
		in, rest, ok := argOf[fuse.CreateIn](req)
		if !ok {
			return 0, false
		}
		name := cString(rest)
		co := zeroed[fuse.CreateOut](out[hdr:])
		st, outSize = l.call(func() fuse.Status { return l.raw.Create(l.never, in, name, co) }), int(unsafe.Sizeof(*co))
	case opMkdir:
		in, rest, ok := argOf[fuse.MkdirIn](req)
		if !ok {
			return 0, false
		}
		name := cString(rest)
		eo := zeroed[fuse.EntryOut](out[hdr:])
		st, outSize = l.call(func() fuse.Status { return l.raw.Mkdir(l.never, in, name, eo) }), int(unsafe.Sizeof(*eo))
	case opUnlink, opRmdir:
		name := cString(req[unsafe.Sizeof(*h):])
		if h.Opcode == opUnlink {
			st = l.call(func() fuse.Status { return l.raw.Unlink(l.never, h, name) })
		} else {
			st = l.call(func() fuse.Status { return l.raw.Rmdir(l.never, h, name) })
		}
	case opWrite:
		in, data, ok := argOf[fuse.WriteIn](req)
		if !ok {
			return 0, false
		}
		wo := zeroed[fuse.WriteOut](out[hdr:])
		b.iov[0] = data
		st = l.call(func() (st fuse.Status) {
			// As go-fuse: Writev, or Write where that is not implemented.
			if wo.Size, st = l.raw.Writev(l.never, in, b.iov[:]); st == fuse.ENOSYS {
				wo.Size, st = l.raw.Write(l.never, in, data)
			}
			return st
		})
		b.iov[0] = nil
		outSize = int(unsafe.Sizeof(*wo))
	case opRelease:
		in, _, ok := argOf[fuse.ReleaseIn](req)
		if !ok {
			return 0, false
		}
		l.call(func() fuse.Status { l.raw.Release(l.never, in); return fuse.OK })
	case opGetxattr, opListxattr:
		in, rest, ok := argOf[fuse.GetXAttrIn](req)
		if !ok || !l.directXattr || hdr+int(in.Size) > len(out) {
			return 0, false
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
			xo := zeroed[fuse.GetXAttrOut](out[hdr:])
			st = l.call(func() (st fuse.Status) { xo.Size, st = get(nil); return st })
			if st == fuse.ERANGE {
				st = fuse.OK // no size is too small for the length
			}
			outSize = int(unsafe.Sizeof(*xo))
		} else {
			var n uint32
			st = l.call(func() (st fuse.Status) { n, st = get(out[hdr : hdr+int(in.Size)]); return st })
			outSize = int(min(n, in.Size))
		}
	case opRemovexattr:
		if !l.directXattr {
			return 0, false
		}
		name := cString(req[unsafe.Sizeof(*h):])
		st = l.call(func() fuse.Status { return l.raw.RemoveXAttr(l.never, h, name) })
	case opOpen:
		in, _, ok := argOf[fuse.OpenIn](req)
		if !ok {
			return 0, false
		}
		oo := zeroed[fuse.OpenOut](out[hdr:])
		st, outSize = l.call(func() fuse.Status { return l.raw.Open(l.never, in, oo) }), int(unsafe.Sizeof(*oo))
	case opCopyFileRange:
		in, _, ok := argOf[fuse.CopyFileRangeIn](req)
		if !ok {
			return 0, false
		}
		wo := zeroed[fuse.WriteOut](out[hdr:])
		st = l.call(func() (st fuse.Status) { wo.Size, st = l.raw.CopyFileRange(l.never, in); return st })
		outSize = int(unsafe.Sizeof(*wo))
	case opForget:
		in, _, ok := argOf[fuse.ForgetIn](req)
		if !ok || l.rememberInodes {
			return 0, false
		}
		l.call(func() fuse.Status { l.raw.Forget(h.NodeId, in.Nlookup); return fuse.OK })
		return 0, true // no reply
	default:
		return 0, false
	}
	if st != fuse.OK {
		outSize = 0 // an error carries nothing after the header
	}
	oh := (*fuse.OutHeader)(unsafe.Pointer(&out[0]))
	*oh = fuse.OutHeader{Length: uint32(hdr + outSize), Status: -int32(st), Unique: h.Unique}
	return hdr + outSize, true
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
