package transport

import (
	"syscall"
	"unsafe"

	"github.com/branchfs/branchfs/branch"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// An opcode is how the loop treats one kind of FUSE request, all in one
// place: who answers it (Serve's reader, or a worker), and whether it is
// answered without go-fuse's ProtocolServer (answerDirect). An opcode not
// in the table is answered on the reader, by go-fuse. Whatever the table
// says, the file system may still send a request the reader makes to a
// worker (OnWorker).
type opcode struct {
	// worker says whether the request goes to a worker at once: one
	// that may take long enough to hold up others (a copy-up, a sync).
	// nil: never.
	worker func(l *Loop, req []byte) bool
	// direct parses and answers the request into b.out after the
	// header, as go-fuse v2.12.1 would (TestDirectMatchesGoFuse),
	// returning the status and the size of what follows the header;
	// false leaves the request to go-fuse. nil: always go-fuse.
	direct func(l *Loop, b *loopBuf, h *fuse.InHeader, req []byte) (st fuse.Status, size int, ok bool)
	// noReply: the kernel wants no answer (FORGET).
	noReply bool
}

// Opcodes from linux/fuse.h (go-fuse does not export them).
const (
	opLookup        = 1
	opForget        = 2
	opGetattr       = 3
	opSetattr       = 4
	opMkdir         = 9
	opUnlink        = 10
	opRmdir         = 11
	opRename        = 12
	opLink          = 13
	opOpen          = 14
	opRead          = 15
	opWrite         = 16
	opRelease       = 18
	opFsync         = 20
	opSetxattr      = 21
	opGetxattr      = 22
	opListxattr     = 23
	opRemovexattr   = 24
	opFsyncdir      = 30
	opCreate        = 35
	opInterrupt     = 36
	opIoctl         = 39
	opBatchForget   = 42
	opFallocate     = 43
	opRename2       = 45
	opCopyFileRange = 47
	opLast          = opCopyFileRange
)

var opcodes = [opLast + 1]opcode{
	opLookup:  {direct: directLookup},
	opForget:  {direct: directForget, noReply: true},
	opGetattr: {direct: directGetattr},
	// On the reader, unless the file system finds it would copy up
	// (OnWorker). tar sends three SETATTRs per file (times, owner,
	// mode), a third of the requests of an extraction, and cp -a a
	// SETXATTR of each file's ACL: made through a handle open for
	// writing, or on a file already in the branch's own layer, each
	// takes one system call, less than a handoff to another thread.
	opSetattr:     {direct: directSetattr},
	opSetxattr:    {},
	opRemovexattr: {direct: directRemovexattr},
	opMkdir:       {direct: directMkdir},
	opUnlink:      {direct: directUnlink},
	opRmdir:       {direct: directRmdir},
	// A rename or link may copy up; syncs and fallocate may take long.
	opRename:    {worker: always},
	opRename2:   {worker: always},
	opLink:      {worker: always},
	opFsync:     {worker: always},
	opFsyncdir:  {worker: always},
	opFallocate: {worker: always},
	// Opening for writing copies up.
	opOpen: {worker: openWorker, direct: directOpen},
	// O_EXCL makes a new file; without it an existing one may be opened
	// for writing.
	opCreate: {worker: createWorker, direct: directCreate},
	// A command (an IOCTL, or a control file's WRITE or READ) runs on
	// the reader when the store's lock is free at once; the file system
	// answers OnWorker otherwise.
	opRead:      {},
	opWrite:     {direct: directWrite},
	opIoctl:     {},
	opRelease:   {direct: directRelease},
	opGetxattr:  {direct: directGetxattr},
	opListxattr: {direct: directGetxattr},
	// Between files already open, the destination for writing: nothing
	// is copied up, and a small copy takes less than a handoff to
	// another thread would. cp asks for each file's size.
	opCopyFileRange: {worker: copyWorker, direct: directCopyFileRange},
}

// opcodeOf is req's entry of the table; the zero opcode for any other.
func opcodeOf(req []byte) opcode {
	if op := (*fuse.InHeader)(unsafe.Pointer(&req[0])).Opcode; op < uint32(len(opcodes)) {
		return opcodes[op]
	}
	return opcode{}
}

// toWorker says whether Serve hands req to a worker.
func (l *Loop) toWorker(req []byte) bool {
	w := opcodeOf(req).worker
	return w != nil && w(l, req)
}

func always(*Loop, []byte) bool { return true }

func openWorker(_ *Loop, req []byte) bool {
	in, _, ok := argOf[fuse.OpenIn](req)
	return ok && branch.OpensForWrite(int(in.Flags))
}

func createWorker(_ *Loop, req []byte) bool {
	in, _, ok := argOf[fuse.CreateIn](req)
	return ok && in.Flags&syscall.O_EXCL == 0
}

// smallCopy is the largest COPY_FILE_RANGE answered on the reader.
const smallCopy = 64 << 10

func copyWorker(_ *Loop, req []byte) bool {
	in, _, ok := argOf[fuse.CopyFileRangeIn](req)
	return !ok || in.Len > smallCopy
}
