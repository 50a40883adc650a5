package transport

import (
	"context"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// OnWorker is what a file system answers, on Serve's reader, to a request
// it would have to wait for or work on long (a command waiting for a lock,
// a copy-up), having done nothing of it: the loop then answers the
// request again on a worker. So the file system alone decides, from what
// it knows at the time, what the reader may answer; the loop keeps no
// record of its own about nodes or handles. It is ERESTARTNOINTR, which
// never reaches user space, so no errno from below is taken for it.
const OnWorker = syscall.Errno(513)

// OnReader says whether ctx is that of a request Serve's reader answers:
// one of the calls of readerCalls, which may answer OnWorker.
func OnReader(ctx context.Context) bool { return ctx.Done() == readerCancel }

// readerCancel stands, in the calls of readerCalls, for the cancel
// channel of a request Serve's reader answers. It is never closed: the
// file system waits on no cancel channel.
var readerCancel = make(chan struct{})

// readerCalls is the file system as the loop calls it: its calls that may
// answer OnWorker are told, by their cancel channel (OnReader), whether
// Serve's reader makes them, whoever parsed the request (answerDirect or
// go-fuse).
type readerCalls struct {
	fuse.RawFileSystem
	l *Loop
}

func (c *readerCalls) cancel(h *fuse.InHeader, cancel <-chan struct{}) <-chan struct{} {
	if h.Unique == c.l.readerReq.Load() {
		return readerCancel
	}
	return cancel
}

func (c *readerCalls) SetAttr(cancel <-chan struct{}, in *fuse.SetAttrIn, out *fuse.AttrOut) fuse.Status {
	return c.RawFileSystem.SetAttr(c.cancel(&in.InHeader, cancel), in, out)
}

func (c *readerCalls) SetXAttr(cancel <-chan struct{}, in *fuse.SetXAttrIn, attr string, data []byte) fuse.Status {
	return c.RawFileSystem.SetXAttr(c.cancel(&in.InHeader, cancel), in, attr, data)
}

func (c *readerCalls) RemoveXAttr(cancel <-chan struct{}, h *fuse.InHeader, attr string) fuse.Status {
	return c.RawFileSystem.RemoveXAttr(c.cancel(h, cancel), h, attr)
}

func (c *readerCalls) Read(cancel <-chan struct{}, in *fuse.ReadIn, buf []byte) (fuse.ReadResult, fuse.Status) {
	return c.RawFileSystem.Read(c.cancel(&in.InHeader, cancel), in, buf)
}

func (c *readerCalls) Write(cancel <-chan struct{}, in *fuse.WriteIn, data []byte) (uint32, fuse.Status) {
	return c.RawFileSystem.Write(c.cancel(&in.InHeader, cancel), in, data)
}

func (c *readerCalls) Ioctl(cancel <-chan struct{}, in *fuse.IoctlIn, inbuf []byte, out *fuse.IoctlOut, outbuf []byte) fuse.Status {
	return c.RawFileSystem.Ioctl(c.cancel(&in.InHeader, cancel), in, inbuf, out, outbuf)
}

func (c *readerCalls) Writev(cancel <-chan struct{}, in *fuse.WriteIn, data [][]byte) (uint32, fuse.Status) {
	return c.RawFileSystem.Writev(c.cancel(&in.InHeader, cancel), in, data)
}
