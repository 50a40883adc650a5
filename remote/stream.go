package remote

import (
	"context"
	"errors"
	"os"
	"sync"
	"unsafe"

	"github.com/branchfs/branchfs/internal/phase"
	"golang.org/x/sys/unix"
)

// ImageStream uploads the files of a checkpoint image while CRIU writes
// them: each file's chunks as soon as CRIU closes it (inotify's
// IN_CLOSE_WRITE on the directory it dumps into), so that the upload runs
// alongside the rest of the dump instead of after it. It only fills the
// bucket with chunks: the push that follows the dump (Push, with the
// stream in its Source) reads the published image, takes from the stream
// every file that has not changed since it was uploaded, reads the others
// again, and writes the manifest last. A dump that fails leaves chunks in
// the bucket and no manifest, as a push that stops on the way does.
type ImageStream struct {
	up   *uploader
	bar  *progress
	ino  *os.File // the inotify descriptor, read by watch
	dir  int      // O_PATH descriptor of the directory: it is renamed when published
	done chan struct{}
	// Files being read, waited for by stop; slots bounds them.
	reading sync.WaitGroup
	slots   chan struct{}
	// aborted: Abort ran (it may run after Push closed the stream).
	aborted bool

	// What the bucket had moved when the stream began, for Push's Stats.
	sent0, recv0, req0 int64

	mu    sync.Mutex
	files map[string]streamed
}

// streamed is a file of the image the stream uploaded, and the identity
// of the file it read: another one, or one written since, is read again.
type streamed struct {
	ImageFile
	id fileID
}

type fileID struct {
	ino, size   int64
	mtime, ctim unix.Timespec
}

func idOf(st *unix.Stat_t) fileID {
	return fileID{int64(st.Ino), st.Size, st.Mtim, st.Ctim}
}

// streamFiles is how many files a stream reads at once: as many as a
// dump's memory files closed together want, each with a chunker's buffer
// and its chunks in flight (the requests are the uploader's to bound).
const streamFiles = 4

// NewImageStream readies a stream into the bucket at loc; Watch starts it.
func NewImageStream(ctx context.Context, b *Bucket, loc Location, o Options) *ImageStream {
	s := &ImageStream{up: newUploader(ctx, b, loc, o.jobs()), bar: newProgress(o.Progress, "upload checkpoint"),
		dir: -1, slots: make(chan struct{}, streamFiles), files: map[string]streamed{}}
	s.sent0, s.recv0, s.req0 = b.Moved()
	return s
}

// Watch starts uploading each file closed after writing in dir, the
// directory CRIU is about to dump into (checkpoint.DumpOptions.Watch).
// The function it returns is called once CRIU has exited: if the dump
// failed, it ends the watch and the uploads; else the watch goes on
// until the push takes it, and uploads what the dump wrote last.
//
// Where the watch cannot be had (no inotify instance or watch left to
// this user), nothing is uploaded during the dump: the push after it
// sends everything, as it would without a stream.
func (s *ImageStream) Watch(dir string) (func(dumped bool), error) {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return func(bool) {}, nil
	}
	if _, err := unix.InotifyAddWatch(fd, dir, unix.IN_CLOSE_WRITE|unix.IN_MOVED_TO|unix.IN_ONLYDIR); err != nil {
		unix.Close(fd)
		return func(bool) {}, nil
	}
	if s.dir, err = unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0); err != nil {
		unix.Close(fd)
		return nil, &os.PathError{Op: "open", Path: dir, Err: err}
	}
	// Non-blocking, so that Go's poller waits for it and Close wakes it.
	s.ino = os.NewFile(uintptr(fd), "inotify")
	s.done = make(chan struct{})
	go s.watch()
	return func(dumped bool) {
		if !dumped {
			s.up.cancel(errors.New("the dump failed"))
			s.stop()
		}
	}, nil
}

// stop ends the watch and waits for the files it is reading.
func (s *ImageStream) stop() {
	if s.ino != nil {
		s.ino.Close()
		<-s.done
		s.ino = nil
	}
}

// watch reads the events and uploads each file named, several at a time:
// a file is read and hashed as soon as it is closed, not after the one
// before it is up. (One at a time, a dump's second memory file, closed
// last, waited for the first to be read and was read by the push after
// the dump instead: in the guest, 1.4 s of the 3.1 s from CRIU's exit to
// the manifest.)
func (s *ImageStream) watch() {
	defer close(s.done)
	defer s.reading.Wait()
	// The chunks the manifest there names are in the bucket: no upload
	// asks about them. (Here, not before the dump, which waits for no
	// request; Push reads the set once the watch is over.)
	if err := s.up.knowManifest(s.up.ctx); err != nil {
		s.up.cancel(err)
		return
	}
	phase.Mark("stream: manifest known")
	buf := make([]byte, 64<<10)
	for {
		n, err := s.ino.Read(buf)
		if err != nil {
			return // closed by stop
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			name := unix.ByteSliceToString(buf[off+unix.SizeofInotifyEvent : off+unix.SizeofInotifyEvent+int(ev.Len)])
			off += unix.SizeofInotifyEvent + int(ev.Len)
			if ev.Mask&unix.IN_ISDIR != 0 || name == "" || s.up.ctx.Err() != nil {
				continue
			}
			// An error here is the upload's (it cancels the stream) or a
			// file that went: the push reads what is left again.
			s.slots <- struct{}{}
			s.reading.Add(1)
			go func() {
				defer func() { <-s.slots; s.reading.Done() }()
				s.upload(name)
			}()
		}
	}
}

// upload reads the file name of the directory, hands its chunks to the
// uploader and notes what it read.
func (s *ImageStream) upload(name string) {
	fd, err := unix.Openat(s.dir, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	var before, after unix.Stat_t
	if unix.Fstat(fd, &before) != nil || before.Mode&unix.S_IFMT != unix.S_IFREG {
		return
	}
	s.bar.total.Add(before.Size)
	phase.Mark("stream: %s closed (%d bytes)", name, before.Size)
	chunks, sum, size, err := pushStream(s.up.ctx, f, s.up, s.bar)
	phase.Mark("stream: %s read", name)
	if err != nil || unix.Fstat(fd, &after) != nil || idOf(&after) != idOf(&before) || after.Size != size {
		return
	}
	s.mu.Lock()
	s.files[name] = streamed{ImageFile{Name: name, Size: size, SHA256: sum, Chunks: chunks}, idOf(&after)}
	s.mu.Unlock()
}

// file returns what the stream uploaded of the file st describes, if it
// is the one it read, unchanged.
func (s *ImageStream) file(name string, st *unix.Stat_t) (ImageFile, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f, ok := s.files[name]
	if !ok || f.id != idOf(st) {
		return ImageFile{}, false
	}
	return f.ImageFile, true
}

// close ends the watch and releases what it holds but the uploader.
func (s *ImageStream) close() {
	s.stop()
	if s.dir >= 0 {
		unix.Close(s.dir)
		s.dir = -1
	}
	if s.bar != nil {
		s.bar.end()
		s.bar = nil
	}
}

// Abort ends a stream no push will take (the dump failed): its watch,
// and the uploads in flight.
func (s *ImageStream) Abort() {
	if s.aborted {
		return
	}
	s.aborted = true
	s.up.cancel(errors.New("the checkpoint failed"))
	s.close()
	s.up.wait()
}

// Streamed reports how many files the stream uploaded.
func (s *ImageStream) Streamed() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.files)
}
