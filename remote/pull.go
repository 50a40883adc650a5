package remote

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync/atomic"

	"github.com/branchfs/branchfs/branch"
	"golang.org/x/sys/unix"
)

// Fetch reads and checks the manifest at loc.
func Fetch(ctx context.Context, b *Bucket, loc Location) (*Manifest, error) {
	data, err := b.Get(ctx, loc.Key)
	if IsNotFound(err) {
		return nil, fmt.Errorf("no branch was pushed to %s", loc)
	}
	if err != nil {
		return nil, err
	}
	m, err := decodeManifest(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", loc, err)
	}
	return m, nil
}

// Target is where a pull makes its branch: a child of the branch whose
// view is ParentView, made by Create (which returns the new branch's
// view) and dropped by Abort if the pull fails.
type Target struct {
	ParentView string
	Create     func() (view string, err error)
	Abort      func() error
}

// BaseError lists the paths where the parent a pull is made onto shows
// other versions than the branch's parent showed when it was pushed.
type BaseError struct {
	Paths []string // each "PATH: how it differs"
}

func (e *BaseError) Error() string {
	const shown = 10
	list := strings.Join(e.Paths[:min(len(e.Paths), shown)], "; ")
	if len(e.Paths) > shown {
		list += fmt.Sprintf("; and %d more", len(e.Paths)-shown)
	}
	n := "1 path"
	if len(e.Paths) != 1 {
		n = fmt.Sprintf("%d paths", len(e.Paths))
	}
	return fmt.Sprintf("the base differs from the one the branch was pushed from at %s (here vs there): %s; nothing was pulled (--force pulls anyway)", n, list)
}

// CheckBase compares what parentView shows at each path of m with what
// the branch's parent showed, and returns what it found: the versions
// here, by path, and a *BaseError if any differs.
func CheckBase(ctx context.Context, m *Manifest, parentView string, jobs int) (map[string]Version, error) {
	pv, err := openView(parentView)
	if err != nil {
		return nil, err
	}
	defer pv.close()
	here := make([]Version, len(m.Entries))
	err = parallel(ctx, len(m.Entries), jobs, func(ctx context.Context, i int) (err error) {
		here[i], err = pv.version(m.Entries[i].Path)
		return err
	})
	if err != nil {
		return nil, err
	}
	found := map[string]Version{}
	var bad []string
	for i, e := range m.Entries {
		found[e.Path] = here[i]
		if d := here[i].differs(e.Base); d != "" {
			bad = append(bad, e.Path+": "+d)
		}
	}
	if bad != nil {
		return found, &BaseError{bad}
	}
	return found, nil
}

// Pull makes the branch m (read from loc) through t: the branch is
// created, then every path of m is made in its view, as a program would
// make it, and its files written from the bucket's chunks, each checked
// against its name. A pull that fails aborts the branch it made: there is
// the whole branch or none.
func Pull(ctx context.Context, b *Bucket, loc Location, m *Manifest, t Target, o Options) (st *Stats, err error) {
	recv0, req0 := b.received.Load(), b.requests.Load()
	here, err := CheckBase(ctx, m, t.ParentView, o.jobs())
	if err != nil && !(o.Force && errors.As(err, new(*BaseError))) {
		return nil, err
	}
	dir, err := t.Create()
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			if aerr := t.Abort(); aerr != nil {
				err = fmt.Errorf("%w; aborting the branch it made: %v", err, aerr)
			}
		}
	}()
	v, err := openView(dir)
	if err != nil {
		return nil, err
	}
	defer v.close()
	p := &puller{b: b, loc: loc, v: v, here: here, made: map[string]bool{}}
	for i := range m.Entries {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if err := p.make(&m.Entries[i]); err != nil {
			return nil, fmt.Errorf("making %s: %w", m.Entries[i].Path, err)
		}
	}
	bar := newProgress(o.Progress, "pull "+m.Branch)
	defer bar.end()
	var jobs []pullJob
	chunks := map[string]bool{}
	st = &Stats{Paths: len(m.Entries)}
	for i := range m.Entries {
		e := &m.Entries[i]
		st.Bytes += e.Size
		if !p.made[e.Path] || e.Type != "file" || len(e.Chunks) == 0 {
			continue
		}
		f := &pulledFile{e: e}
		f.left.Store(int32(len(e.Chunks)))
		off := int64(0)
		for _, c := range e.Chunks {
			jobs = append(jobs, pullJob{f, off, c})
			chunks[c.Hash] = true
			off += c.Size
			bar.total.Add(c.Size)
		}
	}
	st.Chunks = len(chunks)
	// Largest first, so that a large file's chunks do not trail alone.
	sort.SliceStable(jobs, func(i, j int) bool { return jobs[i].c.Size > jobs[j].c.Size })
	err = parallel(ctx, len(jobs), o.jobs(), func(ctx context.Context, i int) error {
		return p.fetch(ctx, jobs[i], bar)
	})
	if err != nil {
		return nil, err
	}
	// Metadata after the data (a write would change the times, and a
	// read-only mode would stop it): a file the pull wrote got its own
	// from the descriptor that wrote its last chunk (finish); the other
	// entries get theirs here. Directories last, deepest first, as what
	// is made in them changes their times.
	err = parallel(ctx, len(m.Entries), o.jobs(), func(ctx context.Context, i int) error {
		e := &m.Entries[i]
		if e.Kind == branch.DeltaDeleted || e.Type == "dir" || p.made[e.Path] && e.Type == "file" && len(e.Chunks) > 0 {
			return nil
		}
		return p.setMeta(e, true, p.made[e.Path])
	})
	if err != nil {
		return nil, err
	}
	for i := len(m.Entries) - 1; i >= 0; i-- {
		e := &m.Entries[i]
		if e.Type != "dir" {
			continue
		}
		// A directory that only holds changes keeps the mode, owner
		// and xattrs the parent here gives it.
		if err := p.setMeta(e, e.Kind != branch.DeltaDir || p.made[e.Path], p.made[e.Path]); err != nil {
			return nil, err
		}
	}
	st.Received, st.Requests = b.received.Load()-recv0, b.requests.Load()-req0
	return st, nil
}

type puller struct {
	b    *Bucket
	loc  Location
	v    *view
	here map[string]Version // what the parent showed, where CheckBase looked
	made map[string]bool    // entries made anew (files: to be written)
}

// pulledFile is a file a pull writes: its entry, and the chunks of it
// not yet written.
type pulledFile struct {
	e    *Entry
	left atomic.Int32
}

// pullJob is a chunk to write into a file.
type pullJob struct {
	f   *pulledFile
	off int64
	c   Chunk
}

// chunkJob is a chunk to write into a file of a checkpoint image.
type chunkJob struct {
	path string
	off  int64
	c    Chunk
}

// make makes e's path what the branch had there, but a file's content
// and the metadata: tombstones by removing, an opaque directory by
// removing and making again, the rest by making it where it is missing or
// of another type. A file whose content the parent already shows is kept
// (the metadata pass copies it up), not downloaded.
func (p *puller) make(e *Entry) error {
	switch e.Kind {
	case branch.DeltaDeleted:
		return p.v.removeAll(e.Path)
	case branch.DeltaOpaque:
		if err := p.v.removeAll(e.Path); err != nil {
			return err
		}
	}
	st, err := p.v.lstat(e.Path)
	switch {
	case missing(err):
	case err != nil:
		return err
	case e.Type == "dir" && typeOf(st.Mode) == "dir":
		return nil
	case e.Type == "file" && typeOf(st.Mode) == "file" && p.sameContent(e):
		return nil
	default:
		if err := p.v.removeAll(e.Path); err != nil {
			return err
		}
	}
	p.made[e.Path] = true
	pfd, name, err := p.v.parent(e.Path)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	switch e.Type {
	case "dir":
		return unix.Mkdirat(pfd, name, 0o700)
	case "file":
		if len(e.Chunks) == 1 {
			return nil // made with its content, once fetched (fetch)
		}
		fd, err := unix.Openat(pfd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err == nil {
			unix.Close(fd)
		}
		return err
	case "symlink":
		return unix.Symlinkat(e.Target, pfd, name)
	default:
		return unix.Mknodat(pfd, name, modeOf(e.Type)|0o600, int(e.Rdev))
	}
}

// sameContent reports whether the parent shows e's content at its path.
func (p *puller) sameContent(e *Entry) bool {
	h, ok := p.here[e.Path]
	if !ok {
		var err error
		if h, err = p.v.version(e.Path); err != nil {
			return false
		}
	}
	return h.Type == "file" && h.Size == e.Size && h.SHA256 == e.SHA256
}

// fetch downloads one chunk, checks it against its name and writes it
// into its file. A file of one chunk is made with it, with the mode it
// ends with but its special bits, so that nothing else need open it; the
// chunk written last gives the file its metadata from the descriptor
// that wrote it (finish).
func (p *puller) fetch(ctx context.Context, j pullJob, bar *progress) error {
	data, err := p.b.Get(ctx, p.loc.chunkKey(j.c.Hash))
	if err != nil {
		return err
	}
	if int64(len(data)) != j.c.Size || hashOf(data) != j.c.Hash {
		return fmt.Errorf("chunk %s in %s is damaged: its content does not match its name", j.c.Hash, p.loc)
	}
	e := j.f.e
	flags, mode := unix.O_WRONLY, uint32(0)
	if len(e.Chunks) == 1 {
		flags, mode = flags|unix.O_CREAT|unix.O_EXCL, e.Mode&0o777
	}
	f, err := p.v.openFile(e.Path, flags, mode)
	if err != nil {
		return err
	}
	defer f.Close()
	fd := int(f.Fd())
	// Its owner and mode before the write: the kernel still holds the
	// attributes that made it, which the write makes it ask for again.
	var made *unix.Stat_t
	if flags&unix.O_CREAT != 0 {
		made = new(unix.Stat_t)
		if err := unix.Fstat(fd, made); err != nil {
			return err
		}
	}
	if _, err := f.WriteAt(data, j.off); err != nil {
		return err
	}
	if j.f.left.Add(-1) == 0 {
		if err := finish(fd, e, made); err != nil {
			return err
		}
	}
	if err := f.Close(); err != nil {
		return err
	}
	bar.add(j.c.Size)
	return nil
}

// finish gives a file the pull made and wrote its owner, mode, xattrs and
// times through fd, a descriptor that wrote it; st is its status before
// the write, if known.
func finish(fd int, e *Entry, st *unix.Stat_t) error {
	if err := setOwnerModeXattrs(fd, e, true, st); err != nil {
		return pathError("setting the metadata of", e.Path, err)
	}
	ts := []unix.Timespec{unix.NsecToTimespec(e.Atime), unix.NsecToTimespec(e.Mtime)}
	if err := unix.UtimesNanoAt(fd, "", ts, unix.AT_EMPTY_PATH); err != nil {
		return pathError("setting the times of", e.Path, err)
	}
	return nil
}

// setMeta gives e's path the owner (as root), mode and xattrs the branch
// had, if all, and its times; made says the pull made the entry, so it has
// no xattrs of its own. Each call acts on the entry itself through a
// descriptor: none follows a symlink.
func (p *puller) setMeta(e *Entry, all, made bool) error {
	pfd, name, err := p.v.parent(e.Path)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	fd, err := unix.Openat(pfd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return pathError("open", e.Path, err)
	}
	defer unix.Close(fd)
	if all {
		if err := setOwnerModeXattrs(fd, e, made, nil); err != nil {
			return pathError("setting the metadata of", e.Path, err)
		}
	}
	ts := []unix.Timespec{unix.NsecToTimespec(e.Atime), unix.NsecToTimespec(e.Mtime)}
	if err := unix.UtimesNanoAt(pfd, name, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return pathError("setting the times of", e.Path, err)
	}
	return nil
}

// setOwnerModeXattrs gives the entry open at fd (O_PATH or not) the
// owner, mode and xattrs of e; made says the pull made it, st, if not
// nil, is its status.
func setOwnerModeXattrs(fd int, e *Entry, made bool, st *unix.Stat_t) error {
	if st == nil {
		st = new(unix.Stat_t)
		if err := unix.Fstat(fd, st); err != nil {
			return err
		}
	}
	root := os.Geteuid() == 0
	mode := st.Mode & 07777
	if root && (st.Uid != e.UID || st.Gid != e.GID) {
		// Before the mode: a chown clears set-user-ID bits.
		if err := unix.Fchownat(fd, "", int(e.UID), int(e.GID), unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return err
		}
		mode = 1 << 31 // to be set whatever it is
	}
	if e.Type == "symlink" {
		return nil // no mode, and no user xattrs
	}
	var have []string
	if !made {
		var err error
		if have, err = listXattrs(procPath(fd)); err != nil {
			return err
		}
	}
	var remove, set []string
	for _, n := range have {
		if _, keep := e.Xattrs[n]; !keep {
			remove = append(remove, n)
		}
	}
	for n := range e.Xattrs {
		if !root && (strings.HasPrefix(n, "trusted.") || strings.HasPrefix(n, "security.")) {
			continue // only root may set them, as with tar
		}
		if !made {
			if cur, err := getXattr(procPath(fd), n); err == nil && bytes.Equal(cur, e.Xattrs[n]) {
				continue
			}
		}
		set = append(set, n)
	}
	sort.Strings(set)
	// The xattrs before the mode, which may be read-only: changing a
	// user xattr needs write permission, which only root does without.
	// The owner makes the file writable to itself for that while.
	if len(remove)+len(set) > 0 && !root && mode&0o200 == 0 {
		if err := unix.Chmod(procPath(fd), mode|0o200); err != nil {
			return err
		}
		mode |= 0o200
	}
	for _, n := range remove {
		if err := unix.Removexattr(procPath(fd), n); err != nil && !errors.Is(err, unix.ENODATA) {
			return err
		}
	}
	for _, n := range set {
		if err := unix.Setxattr(procPath(fd), n, e.Xattrs[n], 0); err != nil {
			return fmt.Errorf("xattr %s: %w", n, err)
		}
	}
	if mode != e.Mode {
		if err := unix.Chmod(procPath(fd), e.Mode); err != nil {
			return err
		}
	}
	return nil
}
