package transport

import (
	"syscall"

	"github.com/branchfs/branchfs/internal/lockcheck"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// Opening a directory costs the caller a round trip to the daemon, and
// tools walk trees opening every directory. rawDirs answers the kernel's
// first OPENDIR with ENOSYS, after which it sends none: it opens
// directories by itself, keeps their listings (FOPEN_CACHE_DIR and
// FOPEN_KEEP_CACHE are the defaults then) and reads them, when its copy is
// missing, with file handle 0. rawDirs gives those reads a handle of the
// node file system, one per directory, and drops it at the end of the
// listing (an empty reply: offsets are positions in it). A stale view
// still fails: its cached listings are invalidated and the reads that
// follow answer ESTALE.
type rawDirs struct {
	fuse.RawFileSystem

	// mu is held for the whole of a handle-0 read, around the node file
	// system's: two readers (Loop.ServeWhile) listing one directory at
	// once would share its handle, and one would release it under the
	// other. Reads come one at a time from the loop's one reader anyway.
	mu   lockcheck.Mutex[lockcheck.RawDirs]
	open map[uint64]uint64 // directory node -> handle serving handle-0 reads
}

// maxOpenDirs bounds handles left by listings nobody read to the end.
const maxOpenDirs = 4096

func newRawDirs(fs fuse.RawFileSystem) *rawDirs {
	return &rawDirs{RawFileSystem: fs, open: map[uint64]uint64{}}
}

func (r *rawDirs) OpenDir(cancel <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	return fuse.ENOSYS
}

func (r *rawDirs) ReadDir(cancel <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	return r.read(cancel, in, out, r.RawFileSystem.ReadDir)
}

func (r *rawDirs) ReadDirPlus(cancel <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	return r.read(cancel, in, out, r.RawFileSystem.ReadDirPlus)
}

type readDirFunc func(cancel <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status

func (r *rawDirs) read(cancel <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList, read readDirFunc) fuse.Status {
	if in.Fh != 0 {
		return read(cancel, in, out)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	fh, st := r.handleLocked(cancel, in)
	if !st.Ok() {
		return st
	}
	withFh := *in
	withFh.Fh = fh
	st = read(cancel, &withFh, out)
	if !st.Ok() || out.Offset == in.Offset { // an error, or the end
		r.releaseLocked(in.NodeId, fh)
	}
	return st
}

// handleLocked returns the handle for reads of directory in.NodeId, a new
// one for a read from the start.
// Preconditions: r.mu held.
func (r *rawDirs) handleLocked(cancel <-chan struct{}, in *fuse.ReadIn) (uint64, fuse.Status) {
	fh, ok := r.open[in.NodeId]
	if ok && in.Offset != 0 {
		return fh, fuse.OK // the bridge seeks if another reader moved it
	}
	if ok {
		r.releaseLocked(in.NodeId, fh)
	}
	var oo fuse.OpenOut
	st := r.RawFileSystem.OpenDir(cancel, &fuse.OpenIn{InHeader: in.InHeader, Flags: syscall.O_RDONLY}, &oo)
	if !st.Ok() {
		return 0, st
	}
	if len(r.open) >= maxOpenDirs {
		for node, h := range r.open {
			r.RawFileSystem.ReleaseDir(&fuse.ReleaseIn{InHeader: fuse.InHeader{NodeId: node}, Fh: h})
		}
		clear(r.open)
	}
	r.open[in.NodeId] = oo.Fh
	return oo.Fh, fuse.OK
}

// releaseLocked drops handle fh of directory node.
// Preconditions: r.mu held.
func (r *rawDirs) releaseLocked(node, fh uint64) {
	delete(r.open, node)
	r.RawFileSystem.ReleaseDir(&fuse.ReleaseIn{InHeader: fuse.InHeader{NodeId: node}, Fh: fh})
}
