package branch

import (
	iofs "io/fs"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// Storage limits. A mount's limit (Options.MaxStorage) bounds what all
// branches' deltas hold together, a branch's own (SetLimit) what its delta
// holds. What counts is the size of every regular file with a name in the
// delta, rounded up to the store filesystem's block, once per inode (hard
// links count once): exactly what a walk of the delta finds, on any
// filesystem and at any time. Allocated blocks (st_blocks) would drift
// from that: filesystems allocate, preallocate and free blocks after the
// write that caused them (delayed allocation, XFS's speculative
// preallocation, extent tree blocks), so a count kept from the changes
// themselves would no longer equal a walk, and a write could not be judged
// before it is made. Directories, symlinks, device nodes and tombstones
// hold names, not data, and are not counted; the filesystem's inodes bound
// them.
//
// The count is made by a walk of each counted delta when the store opens,
// so that it is exact after a crash by construction, and is kept from then
// on by every change that can make a delta's files longer or shorter or
// take their last name: writes, copy_file_range, fallocate and truncates
// of open files (File), copy-up, O_TRUNC opens, truncates by name, unlink
// and rename over a file (View). A commit into a branch counts the
// parent's delta again by a walk; a commit into main and an abort drop the
// branch's count. A change that would take a count past its limit fails
// with ErrQuota (EDQUOT) and changes nothing. A file with no name left (open
// after its unlink, or a descriptor's private copy, Detaching) counts for
// nothing, but a write to it is refused when its whole size would not fit.

// usage is what a counted branch's delta holds.
type usage struct {
	limit int64            // the branch's own limit; 0: none (the mount's may apply)
	bytes int64            // the sum of files
	files map[uint64]int64 // inode -> its count, for the files that count for something
	// refused counts the changes a limit refused since the count began
	// (at Open or SetLimit), for runs to report.
	refused int64
}

// counted reports whether b's delta is counted: the mount or b has a limit.
// Preconditions: s.mu held.
func (s *Store) counted(b *branch) bool {
	return !b.isMain() && (s.opts.MaxStorage > 0 || b.meta.MaxStorage > 0)
}

// roundUp is n bytes rounded up to the store's block.
func (s *Store) roundUp(n int64) int64 {
	return (max(n, 0) + s.block - 1) / s.block * s.block
}

// cost is what a file whose attributes are st counts for.
func (s *Store) cost(st *unix.Stat_t) int64 {
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Nlink == 0 {
		return 0
	}
	return s.roundUp(st.Size)
}

// setCost sets what inode ino of u's delta counts for.
// Preconditions: s.quotaMu held.
func (s *Store) setCost(u *usage, ino uint64, c int64) {
	old := u.files[ino]
	if c == 0 {
		delete(u.files, ino)
	} else {
		u.files[ino] = c
	}
	u.bytes += c - old
	s.used += c - old
}

// fits reports whether extra more bytes in u's delta stay within the
// branch's limit and the mount's. Preconditions: s.quotaMu held.
func (s *Store) fits(u *usage, extra int64) bool {
	if extra <= 0 {
		return true
	}
	if u.limit > 0 && u.bytes+extra > u.limit {
		return false
	}
	return s.opts.MaxStorage <= 0 || s.used+extra <= s.opts.MaxStorage
}

// grow makes change, a change to fd, a file of the view's top layer, that
// leaves it at most end(size) bytes long where size is its size now (nil:
// no longer than it is), if that fits the limits, and counts the file as
// it is after. The count's lock is held across the change, so that two
// changes never both fit where only one does; it is a leaf, and change
// may take no lock.
// Preconditions: the store's lock held (View.Lock, File.lockWritable) or
// the file is open (File.change).
func (v *View) grow(fd int, end func(size int64) int64, change func() error) error {
	u := v.br.use
	if u == nil {
		return change()
	}
	s := v.store
	s.quotaMu.Lock()
	defer s.quotaMu.Unlock()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return change()
	}
	if end != nil {
		// A file without a name counts for nothing: all of it must fit.
		want := max(s.roundUp(end(st.Size)), s.roundUp(st.Size))
		if !s.fits(u, want-u.files[st.Ino]) {
			u.refused++
			return ErrQuota
		}
	}
	err := change()
	if unix.Fstat(fd, &st) == nil {
		s.setCost(u, st.Ino, s.cost(&st))
	}
	return err
}

// recount counts fd, a file of the view's top layer, as it is now: after a
// change that can only have shortened it (an O_TRUNC open).
func (v *View) recount(fd int) { v.grow(fd, nil, func() error { return nil }) }

// unnamed is called before a change that may take the last name of name,
// an entry of directory pfd of the view's top layer; the function it
// returns, called after the change whatever its outcome, stops counting
// the file if no name is left to it.
func (v *View) unnamed(pfd int, name string) func() {
	u := v.br.use
	if u == nil {
		return func() {}
	}
	fd, err := unix.Openat(pfd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return func() {}
	}
	return func() {
		defer unix.Close(fd)
		var st unix.Stat_t
		if unix.Fstat(fd, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
			return
		}
		v.store.quotaMu.Lock()
		v.store.setCost(u, st.Ino, v.store.cost(&st))
		v.store.quotaMu.Unlock()
	}
}

// unnamedRel is unnamed for rel in the top layer.
func (v *View) unnamedRel(rel string) func() {
	if v.br.use == nil || !v.layers[0].delta {
		return func() {}
	}
	pfd, name, err := v.layers[0].parent(rel)
	if err != nil {
		return func() {}
	}
	defer unix.Close(pfd)
	return v.unnamed(pfd, name)
}

// measure counts the delta in directory dir by a walk: each regular file
// once, whatever its names.
func (s *Store) measure(dir string) (map[uint64]int64, int64) {
	files := map[uint64]int64{}
	var total int64
	filepath.WalkDir(dir, func(p string, d iofs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return nil // a directory the daemon may not read holds nothing it can count
		}
		var st unix.Stat_t
		if unix.Lstat(p, &st) != nil {
			return nil
		}
		if c := s.cost(&st); c > 0 && files[st.Ino] == 0 {
			files[st.Ino] = c
			total += c
		}
		return nil
	})
	return files, total
}

// count starts or redoes the count of b's delta, by a walk, or stops it
// when b is no longer counted. Preconditions: s.mu held exclusively, or
// during load.
func (s *Store) count(b *branch) {
	s.quotaMu.Lock()
	defer s.quotaMu.Unlock()
	if u := b.use; u != nil {
		s.used -= u.bytes
		b.use = nil
	}
	if b.view == nil || !s.counted(b) {
		return
	}
	files, total := s.measure(s.deltaDir(b.meta.Name))
	b.use = &usage{limit: b.meta.MaxStorage, bytes: total, files: files}
	s.used += total
}

// uncount stops counting b, which ended. Preconditions: s.mu held
// exclusively.
func (s *Store) uncount(b *branch) {
	s.quotaMu.Lock()
	defer s.quotaMu.Unlock()
	if u := b.use; u != nil {
		s.used -= u.bytes
		b.use = nil
	}
}

// SetLimit sets the storage limit of live branch name's own delta to max
// bytes (0: none). A limit below what the delta holds already refuses
// every change that would make it hold more. It is refused while a
// kernel-path run holds the branch, whose writes the daemon does not see.
func (s *Store) SetLimit(name string, max int64) error {
	if max < 0 {
		return &BranchError{"limit", name, ErrInvalidLimit}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	b, err := s.lookupBranch(name)
	if err != nil {
		return err
	}
	if b.isMain() {
		return &BranchError{"limit", name, ErrMainView}
	}
	if err := b.State().err(); err != nil {
		return &BranchError{"limit", name, err}
	}
	if b.held.Load() != nil {
		return &BranchError{"limit", name, ErrBusy}
	}
	if _, err := s.log.append(&logRecord{Op: logLimit, Name: name, MaxStorage: max}, false); err != nil {
		return err
	}
	b.meta.MaxStorage = max
	if u := b.use; u != nil && s.counted(b) {
		s.quotaMu.Lock()
		u.limit = max
		s.quotaMu.Unlock()
	} else {
		s.count(b)
	}
	s.compactLocked()
	return nil
}

// Storage is what the deltas a storage limit counts hold and the limits:
// those of branch name when it is not "", else the mount's. used is -1
// for a branch that no limit counts.
func (s *Store) Storage(name string) (used, limit int64, err error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	s.quotaMu.Lock()
	defer s.quotaMu.Unlock()
	if name == "" {
		return s.used, s.opts.MaxStorage, nil
	}
	b, err := s.lookupBranch(name)
	if err != nil {
		return 0, 0, err
	}
	if b.use == nil {
		return -1, b.meta.MaxStorage, nil
	}
	return b.use.bytes, b.meta.MaxStorage, nil
}

// MeasureStorage counts the delta of branch name afresh by a walk, as
// Open does: what Storage must say.
func (s *Store) MeasureStorage(name string) int64 {
	_, total := s.measure(s.deltaDir(name))
	return total
}

// limitStatfs makes st, the base filesystem's figures, show no more room
// than the limits that count b's delta leave, and no more size than they
// allow. Reads b.use under quotaMu, which count changes it under too: a
// statfs takes no view lock.
func (s *Store) limitStatfs(b *branch, st *unix.Statfs_t) {
	s.quotaMu.Lock()
	defer s.quotaMu.Unlock()
	u := b.use
	unit := st.Frsize
	if u == nil || unit <= 0 {
		return
	}
	room, size := int64(-1), int64(-1)
	if u.limit > 0 {
		room, size = max(u.limit-u.bytes, 0), u.limit
	}
	if m := s.opts.MaxStorage; m > 0 && (room < 0 || m-s.used < room) {
		room, size = max(m-s.used, 0), u.bytes+max(m-s.used, 0)
	}
	if room < 0 {
		return
	}
	st.Bfree = min(st.Bfree, uint64(room/unit))
	st.Bavail = min(st.Bavail, uint64(room/unit))
	st.Blocks = min(st.Blocks, uint64(size/unit))
}

// Limited reports that a storage limit counts the view's delta: its
// writes must reach the daemon, and none may pass through.
func (v *View) Limited() bool { return v.br.use != nil }
