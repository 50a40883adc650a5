// Package transport carries FUSE requests between the kernel and a go-fuse
// RawFileSystem: the daemon's own request loop (Loop), and the answers it
// gives below go-fuse's node API (Wrap). It decides nothing about
// branches.
//
// Locking. The lock tree, outermost first: a lock is taken only while
// holding none or only locks above it on its path, and internal/lockcheck
// checks that in race-enabled builds.
//
//	rawDirs.mu              across a directory read without a handle
//	  (the file system's)   branch.Store.mu and what nests in it (package fs)
//	Loop.directMu           the requests being answered directly
//	Loop.bufMu              the free buffers
//
// The last two are leaves, each taken alone around no call, by the reader
// and workers in Loop.answer and Serve.
//
// The reader is a lock of its own kind: Loop.Serve has one, and while it
// answers a request, no other is read, not even an INTERRUPT, a FORGET or
// the one a notification waits for. So it waits for nothing that may wait
// for the reader, and for nothing long. Requests that may take long go to
// workers: by their opcode and arguments (the opcode table, opcodes.go),
// or because the file system, called on the reader, answered OnWorker
// (reader.go): a command that would wait for a lock, a change that would
// copy up. Those it answers itself may wait only for a lock whose holder
// needs nothing from the reader, and then for no longer than the holder's
// work: in branchfs, branch.Store.mu shared, whose exclusive holders
// (create, commit, abort) read nothing through the mount and send no
// notification under it; every operation of a view waits for a commit
// anyway. A file system's notification that may wait for a request runs
// inside ServeWhile.
package transport

import (
	"fmt"
	"log"
	"os"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/branchfs/branchfs/internal/lockcheck"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// Loop reads the kernel's requests: the daemon's loop of its own, instead of
// go-fuse's Serve. go-fuse's readers wait in read(2) as ordinary system
// calls; the Go runtime then takes the blocked reader's P back (sysmon
// polls every 20 µs while it does), and a woken reader whose P is gone, or
// held by another reader blocked in read(2), has to wait for a thread
// handoff. Per request that woke one or two more threads on other CPUs,
// each wake costing tens of µs on a small VM, and kept sysmon busy: 60% of
// the daemon's CPU during git status.
//
// A Loop has one reader at a time. It waits in ppoll(2) made as a raw
// system call, which the runtime does not see: the goroutine keeps its P,
// nothing is handed off and no other thread wakes; the kernel wakes the
// reader, which answers and waits again, as a single-threaded C daemon
// does. A request that may take long (a copy-up, an fsync) is answered
// by the goroutine that read it, after it has made another the reader
// (lead), so that it holds up no other request.
//
// The runtime still has to be able to stop the reader, to collect garbage
// or to preempt it: it does so with a signal, which ends ppoll with EINTR
// (poll calls are never restarted), after which the reader waits in
// read(2), an ordinary system call, in which the runtime can scan and
// stop it without its help. (Yielding and polling again instead, the
// reader was back in ppoll before a garbage collector on the same CPU saw
// it stopped: with both on one CPU, the collector signalled it thousands
// of times a second, and the daemon spun for minutes.) A reader idle for
// fastWait blocks in read(2) too, so that an idle daemon lets the runtime
// sleep; the first request after that pays the handoff. With one P
// (GOMAXPROCS=1) the reader always waits in read(2): kept in ppoll, the
// P would be no one else's, and a request answered off the reader could
// not go on until a request came or the runtime preempted the reader.
type Loop struct {
	fd  int
	ps  *fuse.ProtocolServer
	raw fuse.RawFileSystem

	// On the heap, where they stay put, for the raw ppoll.
	pfd  [1]unix.PollFd
	idle unix.Timespec

	bufSize int
	bufMu   lockcheck.Mutex[lockcheck.LoopBufs]
	bufs    []*loopBuf // free buffers

	// The requests being answered off the reader; the reader's turn, for
	// a worker waiting for it (unbuffered: taken only by one waiting);
	// closed by the reader that finds the file system unmounted; closed
	// when Serve has answered its last request.
	workers sync.WaitGroup
	turn    chan struct{}
	ended   chan struct{}
	done    chan struct{}

	// The request Serve's reader is answering (0 when none), for
	// readerCalls.
	readerReq atomic.Uint64

	expireOnly bool // the kernel can expire a name without dropping it (ExpireEntry)

	// For answerDirect (direct.go): whether it answers at all (not when
	// go-fuse logs requests), and GETXATTR and FORGET as go-fuse would
	// with these options; the cancel channel it passes, never closed.
	direct, directXattr, rememberInodes bool
	never                               chan struct{}
	// The requests being answered directly (interruptsDirect): by
	// Serve's reader (0 when none), and by workers and ServeWhile's readers.
	readerUnique atomic.Uint64
	directMu     lockcheck.Mutex[lockcheck.LoopDirect]
	directOthers []uint64
}

// fastWait is how long the reader waits keeping its P before it waits the
// ordinary way.
const fastWait = time.Second

// A loopBuf holds one request and its reply. The largest request is a
// write of MaxWrite bytes, the largest reply a read of as many.
type loopBuf struct {
	in, out []byte
	iov     [1][]byte // a WRITE's data, for Writev (answerDirect)
}

// NewLoop answers INIT on fd, the /dev/fuse descriptor of a mount just
// made with the options mo, for raw; Serve then answers its requests. On
// an error the caller unmounts.
func NewLoop(fd int, raw fuse.RawFileSystem, mo fuse.MountOptions) (*Loop, error) {
	// The server reads and answers INIT from the descriptor, and hands
	// itself to raw.Init: the nodes send notifications and register
	// passthrough files through it. Its Serve is never called.
	mo.DirectMount = false // the /dev/fd/N mount point is not to be mounted
	l := &Loop{fd: fd, done: make(chan struct{}), turn: make(chan struct{}), ended: make(chan struct{}),
		bufSize: mo.MaxWrite + os.Getpagesize()} // headers and argument structures fit in a page
	raw = &readerCalls{raw, l}
	srv, err := fuse.NewServer(raw, fmt.Sprintf("/dev/fd/%d", fd), &mo)
	if err != nil {
		return nil, err
	}
	l.ps, l.raw = fuse.NewProtocolServer(raw, &mo), raw
	l.pfd[0] = unix.PollFd{Fd: int32(fd), Events: unix.POLLIN}
	// The protocol server parses requests by the kernel's version and the
	// flags negotiated at INIT: give it the same INIT the server answered.
	init := srv.KernelSettings()
	l.expireOnly = init.Flags64()&fuse.CAP_HAS_EXPIRE_ONLY != 0
	l.direct, l.never = !mo.Debug, make(chan struct{})
	l.directXattr = !mo.DisableXAttrs && !mo.IgnoreSecurityLabels
	l.rememberInodes = mo.RememberInodes
	b := l.getBuf()
	if _, st := l.ps.HandleRequest([][]byte{unsafe.Slice((*byte)(unsafe.Pointer(init)), unsafe.Sizeof(*init))}, [][]byte{b.out}); !st.Ok() {
		return nil, fmt.Errorf("init: %v", st)
	}
	l.putBuf(b)
	return l, nil
}

// Serve answers requests until the file system is unmounted.
func (l *Loop) Serve() {
	defer close(l.done)
	l.lead()
	<-l.ended
	l.workers.Wait()
	l.raw.OnUnmount()
}

// workerIdle is how long a worker waits for its next turn as the reader
// before it ends.
const workerIdle = 5 * time.Second

// lead is the reader: it reads requests and answers them until one must
// be answered off the reader (toWorker, OnWorker). It then hands the
// reading on to a worker (handOn) and answers that request itself, at
// once and on the CPU that read it, while the next reader wakes on
// another: handed to a worker to answer, the request waited for that
// wake-up, about 100 µs on this VM. Then it is a worker waiting for its
// turn to read again. It returns once the file system is unmounted, or
// when it has waited workerIdle in vain. A goroutine kept for the next
// turn keeps the stack the last request grew; a new one per request grew
// and copied its stack each time through go-fuse, fs and branch.
func (l *Loop) lead() {
	idle := time.NewTimer(workerIdle)
	idle.Stop()
	b := l.getBuf()
	for {
		n, err := l.read(b.in)
		if err == unix.ENOENT || err == unix.EINTR {
			continue // the request was interrupted before we read it
		}
		if err != nil {
			if err != unix.ENODEV {
				log.Printf("reading requests: %v", err)
			}
			l.putBuf(b)
			close(l.ended)
			return
		}
		if !l.toWorker(b.in[:n]) && l.answer(b, n, true) {
			continue
		}
		l.workers.Add(1)
		l.handOn()
		l.answer(b, n, false)
		l.putBuf(b)
		l.workers.Done()
		idle.Reset(workerIdle)
		select {
		case <-l.turn:
			idle.Stop()
		case <-idle.C:
			return
		case <-l.ended:
			return
		}
		b = l.getBuf()
	}
}

// handOn makes another goroutine the reader: a worker waiting for its
// turn, or a new one.
func (l *Loop) handOn() {
	select {
	case l.turn <- struct{}{}:
	default:
		go l.lead()
	}
}

// read waits for a request and reads it into buf.
func (l *Loop) read(buf []byte) (int, error) {
	if runtime.GOMAXPROCS(0) > 1 {
		l.pfd[0].Revents = 0
		l.idle = unix.NsecToTimespec(int64(fastWait)) // ppoll leaves the time left in it
		_, _, errno := unix.RawSyscall6(unix.SYS_PPOLL, uintptr(unsafe.Pointer(&l.pfd[0])), 1,
			uintptr(unsafe.Pointer(&l.idle)), 0, 0, 0)
		if errno != 0 && errno != unix.EINTR {
			return 0, errno
		}
	}
	// A request (POLLIN), the end of the connection (POLLERR, and read
	// says ENODEV), fastWait without one, or a signal (EINTR: most
	// likely the runtime asking to stop this goroutine, to collect
	// garbage or because it has run for 10 ms without rescheduling):
	// read blocks then, as an ordinary system call the runtime can hand
	// the P off from, and which signals do not end.
	return unix.Read(l.fd, buf)
}

// answer handles the request in b.in[:n] and writes the reply, the
// commonest requests itself (answerDirect), the others through go-fuse.
// onReader says whether it runs on Serve's reader; it then reports false,
// having written nothing, when the file system answered OnWorker.
func (l *Loop) answer(b *loopBuf, n int, onReader bool) bool {
	req := b.in[:n]
	if l.interruptsDirect(req) {
		return true
	}
	unique := (*fuse.InHeader)(unsafe.Pointer(&req[0])).Unique
	if onReader {
		l.readerReq.Store(unique)
		defer l.readerReq.Store(0)
		l.readerUnique.Store(unique)
	} else {
		l.directMu.Lock()
		l.directOthers = append(l.directOthers, unique)
		l.directMu.Unlock()
	}
	size, direct := l.answerDirect(b, req)
	if onReader {
		l.readerUnique.Store(0)
	} else {
		l.directMu.Lock()
		i := slices.Index(l.directOthers, unique)
		l.directOthers = slices.Delete(l.directOthers, i, i+1)
		l.directMu.Unlock()
	}
	st := fuse.OK
	if !direct {
		size, st = l.ps.HandleRequest([][]byte{req}, [][]byte{b.out})
	}
	if size >= hdr && (*fuse.OutHeader)(unsafe.Pointer(&b.out[0])).Status == -int32(OnWorker) {
		if onReader {
			return false
		}
		// Only the reader's calls may answer it (OnReader).
		log.Printf("opcode %d answered OnWorker off the reader", (*fuse.InHeader)(unsafe.Pointer(&req[0])).Opcode)
		(*fuse.OutHeader)(unsafe.Pointer(&b.out[0])).Status = -int32(syscall.EIO)
	}
	if size == 0 {
		if st.Ok() {
			return true // no reply wanted (FORGET, INTERRUPT)
		}
		// A request go-fuse could not parse: the caller still waits.
		h := (*fuse.OutHeader)(unsafe.Pointer(&b.out[0]))
		*h = fuse.OutHeader{Length: uint32(unsafe.Sizeof(*h)), Status: -int32(syscall.EIO),
			Unique: (*fuse.InHeader)(unsafe.Pointer(&req[0])).Unique}
		size = int(h.Length)
	}
	// ENOENT: the caller was interrupted and the kernel dropped the request.
	if _, err := unix.Write(l.fd, b.out[:size]); err != nil && err != unix.ENOENT && err != unix.ENODEV {
		log.Printf("writing reply: %v", err)
	}
	return true
}

// interruptsDirect says whether req is an INTERRUPT of a request being
// answered directly, which go-fuse does not know of: it would answer
// EAGAIN, after which the kernel sends the INTERRUPT again at once, over
// and over until the request is answered (a copy-up, say). It gets no
// reply, which the kernel allows, and the request ends when its answer
// comes. The file system never waits on the cancel channel go-fuse would
// have closed.
func (l *Loop) interruptsDirect(req []byte) bool {
	h := (*fuse.InHeader)(unsafe.Pointer(&req[0]))
	if h.Opcode != opInterrupt || len(req) < int(unsafe.Sizeof(fuse.InterruptIn{})) {
		return false
	}
	u := (*fuse.InterruptIn)(unsafe.Pointer(&req[0])).Unique
	if u == 0 {
		return false
	}
	if u == l.readerUnique.Load() {
		return true
	}
	l.directMu.Lock()
	defer l.directMu.Unlock()
	return slices.Contains(l.directOthers, u)
}

// ServeWhile runs fn, which writes to the kernel something it may have to
// wait for, with a second reader answering requests meanwhile. Dropping a
// name takes its directory's lock in the kernel, which a caller may hold
// while its request waits to be read: the lookup of another name in that
// directory, say. With the one reader busy in fn, neither would go on.
func (l *Loop) ServeWhile(fn func()) {
	var done atomic.Bool
	l.workers.Add(1)
	go func() {
		defer l.workers.Done()
		b := l.getBuf()
		defer l.putBuf(b)
		// It leaves after the first request read once fn is done.
		for !done.Load() {
			n, err := unix.Read(l.fd, b.in)
			if err == unix.ENOENT || err == unix.EINTR {
				continue
			}
			if err != nil {
				return
			}
			l.answer(b, n, false)
		}
	}()
	fn()
	done.Store(true)
}

// Done is closed when Serve has answered its last request.
func (l *Loop) Done() <-chan struct{} { return l.done }

func (l *Loop) getBuf() *loopBuf {
	l.bufMu.Lock()
	defer l.bufMu.Unlock()
	if n := len(l.bufs); n > 0 {
		b := l.bufs[n-1]
		l.bufs = l.bufs[:n-1]
		return b
	}
	return &loopBuf{in: make([]byte, l.bufSize), out: make([]byte, l.bufSize)}
}

// maxFreeBufs bounds the buffers kept for later requests: a burst of
// concurrent slow requests leaves no lasting 2 MiB apiece.
const maxFreeBufs = 4

func (l *Loop) putBuf(b *loopBuf) {
	l.bufMu.Lock()
	if len(l.bufs) < maxFreeBufs {
		l.bufs = append(l.bufs, b)
	}
	l.bufMu.Unlock()
}
