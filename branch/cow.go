package branch

import (
	"errors"
	"path"

	"golang.org/x/sys/unix"
)

// CopyUp gives rel a copy of its own in the view's top layer, as the first
// change to it does, and returns the new entry; withData false leaves the
// copy empty, for a change that truncates it. Opening for writing copies
// up by itself (Open).
func (v *View) CopyUp(rel string, withData bool) (*Entry, error) {
	if err := v.beginWrite(); err != nil {
		return nil, err
	}
	return v.copyUp(rel, withData)
}

// copyUp makes rel exist in the top layer with the data (unless withData
// is false), mode, owner, times and xattrs it shows now, and returns the
// new entry. It is a no-op for entries already in the top layer.
// Preconditions: beginWrite succeeded.
func (v *View) copyUp(rel string, withData bool) (*Entry, error) {
	e, err := v.Lookup(rel)
	if err != nil || !e.Lower() {
		return e, err
	}
	if e.IsDir() {
		if err := v.ensureDir(rel); err != nil {
			return nil, err
		}
		return v.Lookup(rel)
	}
	dir, name := path.Split(rel)
	dir = trimSlash(dir)
	if err := v.ensureDir(dir); err != nil {
		return nil, err
	}
	top := v.layers[0]
	pfd, err := top.open(dir, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(pfd)
	restore := saveTimes(pfd)
	src := v.layers[e.Layer]
	switch e.Stat.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		err = v.copyFile(src, rel, e, top, dir, pfd, name, withData)
	case unix.S_IFLNK:
		err = v.copySymlink(src, rel, e, pfd, name)
	default:
		err = v.copySpecial(src, rel, e, pfd, name)
	}
	if errors.Is(err, unix.EEXIST) {
		err = nil // a concurrent copy-up of the same file won
	}
	if err != nil {
		return nil, err
	}
	restore()
	return v.Lookup(rel)
}

// ensureDir makes directory rel exist in the top layer, copying the
// metadata of the directory it shows, and its parents likewise.
func (v *View) ensureDir(rel string) error {
	top := v.layers[0]
	if st, err := top.lstat(rel); err == nil {
		if st.Mode&unix.S_IFMT == unix.S_IFDIR {
			return nil
		}
		return unix.ENOTDIR
	} else if !isNotExist(err) {
		return err
	}
	e, err := v.Lookup(rel)
	if err != nil {
		return err
	}
	if !e.IsDir() {
		return unix.ENOTDIR
	}
	dir, name := path.Split(rel)
	dir = trimSlash(dir)
	if err := v.ensureDir(dir); err != nil {
		return err
	}
	pfd, err := top.open(dir, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	restore := saveTimes(pfd)
	defer restore()
	// Owner, mode, times, xattrs and origin all come from the one
	// directory opened here: where others may rename in the lower layer,
	// the one e was looked up from may be another by now.
	src := v.layers[e.Layer]
	sfd, err := src.open(rel, unix.O_PATH|unix.O_NOFOLLOW|unix.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	defer unix.Close(sfd)
	var st unix.Stat_t
	if err := unix.Fstat(sfd, &st); err != nil {
		return err
	}
	// Made whole in STORE/tmp and then renamed into place: a crash never
	// leaves a copy with the wrong owner, mode or xattrs.
	staged := v.store.tmpName()
	if err := unix.Mkdir(staged, st.Mode&07777); err != nil {
		return err
	}
	copyXattrs(sfd, unix.AT_FDCWD, staged)
	if e.Layer == len(v.layers)-1 {
		// A store without xattrs goes without the check.
		if origin, err := originOf(sfd, rel); err == nil {
			unix.Setxattr(staged, originXattr, []byte(origin), 0)
		}
	}
	err = setOwnerTimes(unix.AT_FDCWD, staged, &st)
	if err == nil {
		err = chmodAt(unix.AT_FDCWD, staged, st.Mode&07777)
	}
	if err == nil {
		err = v.store.placeNew("copyup", staged, pfd, name)
	} else {
		unix.Rmdir(staged)
	}
	if errors.Is(err, unix.EEXIST) {
		err = nil // a concurrent copy-up won
	}
	v.copiedUp()
	return err
}

// saveTimes returns a function that puts back the times of directory fd,
// for changes that are internal to branchfs and must not show.
func saveTimes(fd int) func() {
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil {
		return func() {}
	}
	return func() {
		ts := []unix.Timespec{st.Atim, st.Mtim}
		unix.UtimesNanoAt(fd, ".", ts, unix.AT_SYMLINK_NOFOLLOW)
	}
}

func setOwnerTimes(pfd int, name string, st *unix.Stat_t) error {
	if err := unix.Fchownat(pfd, name, int(st.Uid), int(st.Gid), unix.AT_SYMLINK_NOFOLLOW); err != nil && !errors.Is(err, unix.EPERM) {
		return err
	}
	return unix.UtimesNanoAt(pfd, name, []unix.Timespec{st.Atim, st.Mtim}, unix.AT_SYMLINK_NOFOLLOW)
}

// chmodAt changes the mode of name without following a symlink there.
func chmodAt(pfd int, name string, mode uint32) error {
	fd, err := unix.Openat(pfd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT == unix.S_IFLNK {
		return unix.EOPNOTSUPP
	}
	return unix.Chmod(procPath(fd), mode)
}

func (v *View) copyFile(src *layer, rel string, e *Entry, top *layer, dir string, pfd int, name string, withData bool) error {
	in, err := src.open(rel, unix.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	defer unix.Close(in)
	out, err := top.open(dir, unix.O_TMPFILE|unix.O_RDWR, e.Stat.Mode&07777)
	if err != nil {
		return err
	}
	defer unix.Close(out)
	var size int64
	if withData {
		size = e.Stat.Size
	}
	// Counted once it has its name; a limit it would pass refuses it
	// before anything is copied.
	return v.grow(out, func(int64) int64 { return size }, func() error {
		if err := fillCopy(in, out, &e.Stat, withData); err != nil {
			return err
		}
		// The copy gets its name only once complete: a crash leaves nothing.
		if err := failpoint("copyup-staged"); err != nil {
			return err
		}
		err := unix.Linkat(out, "", pfd, name, unix.AT_EMPTY_PATH)
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EPERM) {
			err = unix.Linkat(unix.AT_FDCWD, procPath(out), pfd, name, unix.AT_SYMLINK_FOLLOW)
		}
		return err
	})
}

// fillCopy gives out, a new file, the data (unless withData is false),
// owner, mode, xattrs and times of in, whose status is st.
func fillCopy(in, out int, st *unix.Stat_t, withData bool) error {
	if withData {
		if err := copyData(in, out, st.Size); err != nil {
			return err
		}
	}
	if err := unix.Fchown(out, int(st.Uid), int(st.Gid)); err != nil && !errors.Is(err, unix.EPERM) {
		return err
	}
	// chown clears set-id bits, so the mode goes after it.
	if err := unix.Fchmod(out, st.Mode&07777); err != nil {
		return err
	}
	copyXattrs(in, out, "")
	return unix.UtimesNanoAt(unix.AT_FDCWD, procPath(out), []unix.Timespec{st.Atim, st.Mtim}, 0)
}

// copyData clones the file where the filesystem can, else copies it
// extent by extent so that holes stay holes.
func copyData(in, out int, size int64) error {
	if err := unix.IoctlFileClone(out, in); err == nil {
		return nil
	}
	if err := unix.Ftruncate(out, size); err != nil {
		return err
	}
	var off int64
	for off < size {
		data, err := unix.Seek(in, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break
		}
		if err != nil {
			data = off // no SEEK_DATA: copy everything
		}
		hole, err := unix.Seek(in, data, unix.SEEK_HOLE)
		if err != nil {
			hole = size
		}
		for data < hole {
			src, dst := data, data
			n, err := unix.CopyFileRange(in, &src, out, &dst, int(min(hole-data, 1<<30)), 0)
			if errors.Is(err, unix.EXDEV) || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EOPNOTSUPP) {
				// Another filesystem than the source's (a store apart
				// from the base) may refuse: copy through memory.
				n, err = copyThrough(in, out, data, min(hole-data, 1<<20))
			}
			if err != nil {
				return err
			}
			if n == 0 {
				return nil
			}
			data += int64(n)
		}
		off = hole
	}
	return nil
}

// copyThrough copies n bytes at off from in to out with read and write.
func copyThrough(in, out int, off, n int64) (int, error) {
	buf := make([]byte, n)
	got, err := unix.Pread(in, buf, off)
	if err != nil || got == 0 {
		return 0, err
	}
	return unix.Pwrite(out, buf[:got], off)
}

// copySymlink and copySpecial make the copy in STORE/tmp and rename it into
// place once whole, as ensureDir does.
func (v *View) copySymlink(src *layer, rel string, e *Entry, pfd int, name string) error {
	target, err := src.readlink(rel)
	if err != nil {
		return err
	}
	staged := v.store.tmpName()
	if err := unix.Symlink(target, staged); err != nil {
		return err
	}
	if err := setOwnerTimes(unix.AT_FDCWD, staged, &e.Stat); err != nil {
		unix.Unlink(staged)
		return err
	}
	return v.store.placeNew("copyup", staged, pfd, name)
}

func (v *View) copySpecial(src *layer, rel string, e *Entry, pfd int, name string) error {
	if isWhiteout(&e.Stat) {
		return errDeviceIsMarker // a base's own: in the delta it would be a tombstone
	}
	staged := v.store.tmpName()
	if err := unix.Mknod(staged, e.Stat.Mode, int(e.Stat.Rdev)); err != nil {
		return err
	}
	if sfd, err := src.open(rel, unix.O_PATH|unix.O_NOFOLLOW, 0); err == nil {
		copyXattrs(sfd, unix.AT_FDCWD, staged)
		unix.Close(sfd)
	}
	err := setOwnerTimes(unix.AT_FDCWD, staged, &e.Stat)
	if err == nil {
		err = chmodAt(unix.AT_FDCWD, staged, e.Stat.Mode&07777)
	}
	if err != nil {
		unix.Unlink(staged)
		return err
	}
	return v.store.placeNew("copyup", staged, pfd, name)
}

// copyXattrs copies the xattrs of src (any descriptor) to dst: the file
// itself when name is "", else name beneath directory dst. Internal markers
// are not copied; xattrs the destination refuses are skipped.
func copyXattrs(src, dst int, name string) {
	names, err := listXattrs(procPath(src))
	if err != nil {
		return
	}
	target := procPath(dst)
	if name != "" {
		fd, err := unix.Openat(dst, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return
		}
		defer unix.Close(fd)
		target = procPath(fd)
	}
	for _, n := range names {
		if IsInternalXattr(n) {
			continue
		}
		val, err := getXattr(procPath(src), n)
		if err != nil {
			continue
		}
		unix.Setxattr(target, n, val, 0)
	}
}
