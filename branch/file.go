package branch

import (
	"strconv"

	"golang.org/x/sys/unix"
)

// File is a file of a view, opened by View.Open or View.Create. It keeps
// the view's rules for an open file: every call fails once the branch can
// no longer be used (Check), every change also while the view may not be
// written (CheckWritable), changes reach only a file in the view's top
// layer, and branchfs's own xattrs stay hidden.
type File struct {
	view  *View
	fd    int
	write bool // opened for writing
	top   bool // the file is in the view's top layer
}

func (v *View) newFile(fd, flags int, e *Entry) *File {
	return &File{view: v, fd: fd, write: OpensForWrite(flags), top: !e.Lower()}
}

// Fd is the open descriptor, for the kernel to read a file of the top or a
// lower layer directly (passthrough). It stays the File's.
func (f *File) Fd() int { return f.fd }

// Writable reports a file opened for writing.
func (f *File) Writable() bool { return f.write }

// InTop reports that the file is the view's own copy: changes through the
// File reach no other view.
func (f *File) InTop() bool { return f.top }

// Close closes the descriptor.
func (f *File) Close() error { return unix.Close(f.fd) }

// change checks that a change through f may be made.
func (f *File) change() error {
	if err := f.view.CheckWritable(); err != nil {
		return err
	}
	if !f.top {
		return unix.EBADF // a lower layer's file, opened for reading
	}
	return nil
}

// ReadAt is pread(2).
func (f *File) ReadAt(buf []byte, off int64) (int, error) {
	if err := f.view.Check(); err != nil {
		return 0, err
	}
	return unix.Pread(f.fd, buf, off)
}

// WriteAt is pwrite(2).
func (f *File) WriteAt(data []byte, off int64) (int, error) {
	if err := f.view.CheckWritable(); err != nil {
		return 0, err
	}
	return unix.Pwrite(f.fd, data, off)
}

// Stat is fstat(2).
func (f *File) Stat() (unix.Stat_t, error) {
	var st unix.Stat_t
	if err := f.view.Check(); err != nil {
		return st, err
	}
	err := unix.Fstat(f.fd, &st)
	return st, err
}

// Sync is fsync(2), or fdatasync(2) with dataOnly.
func (f *File) Sync(dataOnly bool) error {
	if err := f.view.Check(); err != nil {
		return err
	}
	if dataOnly {
		return unix.Fdatasync(f.fd)
	}
	return unix.Fsync(f.fd)
}

// Allocate is fallocate(2).
func (f *File) Allocate(mode uint32, off, size int64) error {
	if err := f.view.CheckWritable(); err != nil {
		return err
	}
	return unix.Fallocate(f.fd, mode, off, size)
}

// Seek is lseek(2).
func (f *File) Seek(off int64, whence int) (int64, error) {
	if err := f.view.Check(); err != nil {
		return 0, err
	}
	return unix.Seek(f.fd, off, whence)
}

// Truncate is ftruncate(2); byName makes it truncate(2) of the open file,
// for a request made by name, which leaves it to the filesystem below
// whether the times change (ext4 changes them, ramfs does not).
func (f *File) Truncate(size int64, byName bool) error {
	if err := f.change(); err != nil {
		return err
	}
	if byName {
		return unix.Truncate("/proc/self/fd/"+strconv.Itoa(f.fd), size)
	}
	return unix.Ftruncate(f.fd, size)
}

// Chmod is fchmod(2) of the permission bits.
func (f *File) Chmod(mode uint32) error {
	if err := f.change(); err != nil {
		return err
	}
	return unix.Fchmod(f.fd, mode&07777)
}

// Chown is fchown(2).
func (f *File) Chown(uid, gid int) error {
	if err := f.change(); err != nil {
		return err
	}
	return unix.Fchown(f.fd, uid, gid)
}

// Utimens sets the times as utimensat(2) does.
func (f *File) Utimens(atime, mtime unix.Timespec) error {
	if err := f.change(); err != nil {
		return err
	}
	return unix.UtimesNanoAt(f.fd, "", []unix.Timespec{atime, mtime}, unix.AT_EMPTY_PATH)
}

// GetXattr is View.GetXattr for the open file.
func (f *File) GetXattr(name string, buf []byte) (int, error) {
	if err := f.view.Check(); err != nil {
		return 0, err
	}
	if IsInternalXattr(name) {
		return 0, unix.ENODATA
	}
	n, err := unix.Fgetxattr(f.fd, name, buf)
	return n, noACL(name, err)
}

// ListXattr is View.ListXattr for the open file.
func (f *File) ListXattr() ([]string, error) {
	if err := f.view.Check(); err != nil {
		return nil, err
	}
	all, err := xattrNames(func(buf []byte) (int, error) { return unix.Flistxattr(f.fd, buf) })
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
	return unix.Fsetxattr(f.fd, name, val, flags)
}

// RemoveXattr is View.RemoveXattr for the open file.
func (f *File) RemoveXattr(name string) error {
	if err := f.change(); err != nil {
		return err
	}
	if IsInternalXattr(name) {
		return unix.EPERM
	}
	return unix.Fremovexattr(f.fd, name)
}
