package branch

import (
	"errors"
	"strconv"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// File is a file of a view, opened by View.Open or View.Create. It keeps
// the view's rules for an open file: every call fails once the branch can
// no longer be used (Check), every change also while the view may not be
// written (CheckWritable), changes reach only a file in the view's top
// layer, and branchfs's own xattrs stay hidden.
type File struct {
	view  *View
	fd    atomic.Int64 // the file read and changed; Detaching.Attach replaces it
	first int          // the descriptor opened, kept open until Close
	write bool         // opened for writing
	appnd bool         // O_APPEND: every write goes to the end
	top   atomic.Bool  // the file is in the view's top layer
}

func (v *View) newFile(fd, flags int, e *Entry) *File {
	f := &File{view: v, first: fd, write: OpensForWrite(flags), appnd: flags&unix.O_APPEND != 0}
	f.fd.Store(int64(fd))
	f.top.Store(!e.Lower())
	return f
}

// cur is the descriptor of the file f reads and changes now.
func (f *File) cur() int { return int(f.fd.Load()) }

// Fd is the open descriptor, for the kernel to read a file of the top or a
// lower layer directly (passthrough). It stays the File's.
func (f *File) Fd() int { return f.first }

// Writable reports a file opened for writing.
func (f *File) Writable() bool { return f.write }

// InTop reports that the file is the view's own copy: changes through the
// File reach no other view.
func (f *File) InTop() bool { return f.top.Load() }

// Close closes the descriptors.
func (f *File) Close() error {
	if fd := f.cur(); fd != f.first {
		unix.Close(fd)
	}
	return unix.Close(f.first)
}

// Detaching is a copy of a lower layer's file for the Files open on it
// once the view no longer shows its name: a change through them must reach
// neither the lower layer nor any name, while on a local filesystem the
// open file stays changeable. The copy is an unnamed file (O_TMPFILE) in
// the view's top layer with the file's data, mode, owner, times and xattrs,
// which the Files read and change from then on; it goes with the last of
// them. It is made in three steps (BeginDetach, Copy, Attach), so that the
// copy of a large file, the long one, needs none of the caller's locks
// that keep the Files open: Copy reads a descriptor of its own.
type Detaching struct {
	view *View
	src  int // the file copied, a descriptor of Detaching's own; -1 once copied
	out  int // the copy; -1 until made and once attached
}

// BeginDetach starts a copy of the file f reads, open for reading on a
// file of a lower layer.
// Preconditions: f stays open for the call (the caller's lock keeps it
// from Close), not after.
func (v *View) BeginDetach(f *File) (*Detaching, error) {
	src, err := unix.FcntlInt(uintptr(f.cur()), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	return &Detaching{view: v, src: src, out: -1}, nil
}

// Copy makes the copy. Without O_TMPFILE on the top layer's filesystem it
// fails with ESTALE, as the change did before. Unnamed, the copy counts
// for nothing, but must fit (quota.go): else ErrQuota.
// Preconditions: the view is locked (View.Lock) from Copy through Attach
// or Discard, so that no commit or child's creation comes between the copy
// and its use; Copy is called once.
func (d *Detaching) Copy() error {
	src := d.src
	d.src = -1
	defer unix.Close(src)
	v := d.view
	if err := v.beginWrite(); err != nil {
		return err
	}
	var st unix.Stat_t
	if err := unix.Fstat(src, &st); err != nil {
		return err
	}
	out, err := v.layers[0].open("", unix.O_TMPFILE|unix.O_RDWR, 0o600)
	if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EISDIR) {
		return unix.ESTALE
	}
	if err != nil {
		return err
	}
	err = v.grow(out, func(int64) int64 { return st.Size }, func() error { return fillCopy(src, out, &st, true) })
	if err != nil {
		unix.Close(out)
		return err
	}
	d.out = out
	return nil
}

// Attach gives files the copy Copy made; they share it. Attached, d holds
// nothing more.
// Preconditions: Copy succeeded; files are open for reading on the file
// BeginDetach was given, none of them attached yet, and nothing closes or
// attaches them meanwhile (the caller's lock). ReadAt, Stat and the like
// may run on them meanwhile: they read either file, of the same data.
func (d *Detaching) Attach(files []*File) error {
	if len(files) == 0 {
		return nil
	}
	fds := []int{d.out}
	for range files[1:] {
		fd, err := unix.FcntlInt(uintptr(d.out), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			for _, fd := range fds[1:] {
				unix.Close(fd)
			}
			return err
		}
		fds = append(fds, fd)
	}
	for i, f := range files {
		f.fd.Store(int64(fds[i]))
		f.top.Store(true)
	}
	d.out = -1
	return nil
}

// Discard drops what d still holds: the copy, where another detach or a
// file opened in the top layer won meanwhile, or after an error.
func (d *Detaching) Discard() {
	for _, fd := range []int{d.src, d.out} {
		if fd >= 0 {
			unix.Close(fd)
		}
	}
	d.src, d.out = -1, -1
}

// change checks that a change through f may be made.
func (f *File) change() error {
	if err := f.view.CheckWritable(); err != nil {
		return err
	}
	if !f.top.Load() {
		return unix.EBADF // a lower layer's file, opened for reading
	}
	return nil
}

// ReadAt is pread(2).
func (f *File) ReadAt(buf []byte, off int64) (int, error) {
	if err := f.view.Check(); err != nil {
		return 0, err
	}
	return unix.Pread(f.cur(), buf, off)
}

// lockWritable takes the store's lock shared, as every view operation
// does, and checks that f's view may be written: no commit or child's
// creation, which take the lock exclusively, comes between the check and
// the change the caller makes, even one made on a goroutine of its own (a
// long copy_file_range, a fallocate). Unlock with f.view.Unlock.
func (f *File) lockWritable() error {
	f.view.store.mu.RLock()
	if err := f.view.CheckWritable(); err != nil {
		f.view.store.mu.RUnlock()
		return err
	}
	return nil
}

// WriteAt is pwrite(2).
func (f *File) WriteAt(data []byte, off int64) (int, error) {
	if err := f.lockWritable(); err != nil {
		return 0, err
	}
	defer f.view.Unlock()
	fd := f.cur()
	var n int
	err := f.view.grow(fd, func(size int64) int64 {
		if f.appnd {
			return size + int64(len(data))
		}
		return off + int64(len(data))
	}, func() (err error) {
		n, err = unix.Pwrite(fd, data, off)
		return err
	})
	return n, err
}

// CopyFrom is copy_file_range(2) of at most n bytes from src at offIn to f
// at offOut: the kernel copies, and the data never passes through the
// daemon. EOPNOTSUPP where the filesystems under the two files cannot copy
// between them; the kernel then copies by reads and writes. (ENOSYS would
// make it stop asking for good.)
func (f *File) CopyFrom(src *File, offIn, offOut int64, n int) (int, error) {
	if err := f.lockWritable(); err != nil {
		return 0, err
	}
	defer f.view.Unlock()
	if err := src.view.Check(); err != nil {
		return 0, err
	}
	fd, in := f.cur(), src.cur()
	var c int
	err := f.view.grow(fd, func(int64) int64 {
		var st unix.Stat_t
		if unix.Fstat(in, &st) != nil {
			return offOut + int64(n)
		}
		return offOut + min(int64(n), max(st.Size-offIn, 0))
	}, func() (err error) {
		c, err = unix.CopyFileRange(in, &offIn, fd, &offOut, n, 0)
		return err
	})
	if errors.Is(err, unix.EXDEV) || errors.Is(err, unix.ENOSYS) {
		err = unix.EOPNOTSUPP
	}
	return c, err
}

// Stat is fstat(2).
func (f *File) Stat() (unix.Stat_t, error) {
	var st unix.Stat_t
	if err := f.view.Check(); err != nil {
		return st, err
	}
	err := unix.Fstat(f.cur(), &st)
	return st, err
}

// Sync is fsync(2), or fdatasync(2) with dataOnly.
func (f *File) Sync(dataOnly bool) error {
	if err := f.view.Check(); err != nil {
		return err
	}
	if dataOnly {
		return unix.Fdatasync(f.cur())
	}
	return unix.Fsync(f.cur())
}

// Allocate is fallocate(2).
func (f *File) Allocate(mode uint32, off, size int64) error {
	if err := f.lockWritable(); err != nil {
		return err
	}
	defer f.view.Unlock()
	fd := f.cur()
	keep := mode&unix.FALLOC_FL_KEEP_SIZE != 0
	if keep && mode&unix.FALLOC_FL_PUNCH_HOLE == 0 && f.view.Limited() {
		// Blocks past the end that the size does not show: a limit
		// counts sizes (quota.go), so it could not count them.
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			return err
		}
		if off+size > f.view.store.roundUp(st.Size) {
			return unix.EOPNOTSUPP
		}
	}
	return f.view.grow(fd, func(cur int64) int64 {
		switch {
		case mode&unix.FALLOC_FL_INSERT_RANGE != 0:
			return cur + size
		case keep || mode&unix.FALLOC_FL_COLLAPSE_RANGE != 0:
			return cur
		}
		return off + size
	}, func() error { return unix.Fallocate(fd, mode, off, size) })
}

// Seek is lseek(2).
func (f *File) Seek(off int64, whence int) (int64, error) {
	if err := f.view.Check(); err != nil {
		return 0, err
	}
	return unix.Seek(f.cur(), off, whence)
}

// Truncate is ftruncate(2); byName makes it truncate(2) of the open file,
// for a request made by name, which leaves it to the filesystem below
// whether the times change (ext4 changes them, ramfs does not).
func (f *File) Truncate(size int64, byName bool) error {
	if err := f.change(); err != nil {
		return err
	}
	fd := f.cur()
	return f.view.grow(fd, func(int64) int64 { return size }, func() error {
		if byName {
			return unix.Truncate("/proc/self/fd/"+strconv.Itoa(fd), size)
		}
		return unix.Ftruncate(fd, size)
	})
}

// Chmod is fchmod(2) of the permission bits.
func (f *File) Chmod(mode uint32) error {
	if err := f.change(); err != nil {
		return err
	}
	return unix.Fchmod(f.cur(), mode&07777)
}

// Chown is fchown(2).
func (f *File) Chown(uid, gid int) error {
	if err := f.change(); err != nil {
		return err
	}
	return unix.Fchown(f.cur(), uid, gid)
}

// Utimens sets the times as utimensat(2) does.
func (f *File) Utimens(atime, mtime unix.Timespec) error {
	if err := f.change(); err != nil {
		return err
	}
	return unix.UtimesNanoAt(f.cur(), "", []unix.Timespec{atime, mtime}, unix.AT_EMPTY_PATH)
}

// GetXattr is View.GetXattr for the open file.
func (f *File) GetXattr(name string, buf []byte) (int, error) {
	if err := f.view.Check(); err != nil {
		return 0, err
	}
	if IsInternalXattr(name) {
		return 0, unix.ENODATA
	}
	n, err := unix.Fgetxattr(f.cur(), name, buf)
	return n, noACL(name, err)
}

// ListXattr is View.ListXattr for the open file.
func (f *File) ListXattr() ([]string, error) {
	if err := f.view.Check(); err != nil {
		return nil, err
	}
	all, err := xattrNames(func(buf []byte) (int, error) { return unix.Flistxattr(f.cur(), buf) })
	return withoutInternal(all), err
}

// SetXattr is View.SetXattr for the open file.
func (f *File) SetXattr(name string, val []byte, flags int) error {
	if err := f.change(); err != nil {
		return err
	}
	if IsInternalXattr(name) {
		return unix.EPERM
	}
	return unix.Fsetxattr(f.cur(), name, val, flags)
}

// RemoveXattr is View.RemoveXattr for the open file.
func (f *File) RemoveXattr(name string) error {
	if err := f.change(); err != nil {
		return err
	}
	if IsInternalXattr(name) {
		return unix.EPERM
	}
	return unix.Fremovexattr(f.cur(), name)
}
