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
	c, err := v.startCopyUp(rel, e, withData)
	if err != nil {
		return nil, err
	}
	defer c.close()
	restore := saveTimes(c.pfd)
	switch c.st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		err = c.viaTmpfile()
	case unix.S_IFLNK:
		err = c.viaStaging(c.makeSymlink)
	default:
		if isWhiteout(&c.st) {
			return nil, errDeviceIsMarker // a base's own: in the delta it would be a tombstone
		}
		err = c.viaStaging(c.makeNode)
	}
	if errors.Is(err, unix.EEXIST) {
		err = nil // a concurrent copy-up of the same entry won
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
	c, err := v.startCopyUp(rel, e, false)
	if err != nil {
		return err
	}
	defer c.close()
	restore := saveTimes(c.pfd)
	defer restore()
	if e.Layer == len(v.layers)-1 {
		// A store without xattrs goes without the check.
		c.origin, _ = originOf(c.sfd, rel)
	}
	err = c.viaStaging(func(staged string) error { return unix.Mkdir(staged, 0o700) })
	if errors.Is(err, unix.EEXIST) {
		err = nil // a concurrent copy-up won
	}
	v.copiedUp()
	return err
}

// A copyUpCtx carries one copy-up from the opening of its source to the
// naming of its copy. Everything the copy takes (type, data, owner, mode,
// times, xattrs, origin) comes from the one descriptor sfd: where others
// may rename in a lower layer, the entry rel was looked up as may be
// another by now, and a copy that mixed the two would give one file's data
// another's owner and mode (issue 39).
type copyUpCtx struct {
	v        *View
	sfd      int         // O_PATH descriptor of the source, opened once
	st       unix.Stat_t // the source's status, read through sfd
	withData bool        // copy a regular file's data, else leave it empty
	origin   string      // originXattr for a directory of the base, or ""
	pfd      int         // O_PATH descriptor of the copy's directory in the top layer
	name     string      // the copy's name in pfd
}

// startCopyUp makes the parents of rel exist in the top layer and opens
// both ends of rel's copy-up. The source must still be of the type e, its
// lookup, planned with: else ESTALE (a directory: ENOTDIR).
func (v *View) startCopyUp(rel string, e *Entry, withData bool) (*copyUpCtx, error) {
	dir, name := path.Split(rel)
	dir = trimSlash(dir)
	if err := v.ensureDir(dir); err != nil {
		return nil, err
	}
	pfd, err := v.layers[0].open(dir, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil, err
	}
	flags := unix.O_PATH | unix.O_NOFOLLOW
	if e.IsDir() {
		flags |= unix.O_DIRECTORY
	}
	sfd, err := v.layers[e.Layer].open(rel, flags, 0)
	if err != nil {
		unix.Close(pfd)
		return nil, err
	}
	c := &copyUpCtx{v: v, sfd: sfd, withData: withData, pfd: pfd, name: name}
	if err = unix.Fstat(sfd, &c.st); err == nil && c.st.Mode&unix.S_IFMT != e.Stat.Mode&unix.S_IFMT {
		err = unix.ESTALE
	}
	if err != nil {
		c.close()
		return nil, err
	}
	return c, nil
}

func (c *copyUpCtx) close() {
	unix.Close(c.sfd)
	unix.Close(c.pfd)
}

// viaTmpfile is the copy-up of a regular file: made in an unnamed file of
// the top layer (O_TMPFILE), it gets its name only once complete, so a
// crash leaves nothing.
func (c *copyUpCtx) viaTmpfile() error {
	in, err := unix.Open(procPath(c.sfd), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(in)
	out, err := unix.Openat(c.pfd, ".", unix.O_TMPFILE|unix.O_RDWR|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	defer unix.Close(out)
	var size int64
	if c.withData {
		size = c.st.Size
	}
	// Counted once it has its name; a limit it would pass refuses it
	// before anything is copied.
	return c.v.grow(out, func(int64) int64 { return size }, func() error {
		if err := fillCopy(in, out, &c.st, c.withData); err != nil {
			return err
		}
		if err := failpoint("copyup-staged"); err != nil {
			return err
		}
		err := unix.Linkat(out, "", c.pfd, c.name, unix.AT_EMPTY_PATH)
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EPERM) {
			err = unix.Linkat(unix.AT_FDCWD, procPath(out), c.pfd, c.name, unix.AT_SYMLINK_FOLLOW)
		}
		return err
	})
}

// viaStaging is the copy-up of what O_TMPFILE cannot make (directories,
// symlinks, devices, fifos, sockets): made whole at a fresh name in
// STORE/tmp by mk, then renamed into place, so a crash never leaves a
// copy with the wrong owner, mode or xattrs.
func (c *copyUpCtx) viaStaging(mk func(staged string) error) error {
	staged := c.v.store.tmpName()
	if err := mk(staged); err != nil {
		return err
	}
	if c.origin != "" {
		unix.Setxattr(staged, originXattr, []byte(c.origin), 0)
	}
	if err := copyMeta(c.sfd, &c.st, unix.AT_FDCWD, staged); err != nil {
		removeAt(unix.AT_FDCWD, staged)
		return err
	}
	return c.v.store.placeNew("copyup", staged, c.pfd, c.name)
}

func (c *copyUpCtx) makeSymlink(staged string) error {
	target, err := readlinkAt(c.sfd, "")
	if err != nil {
		return err
	}
	return unix.Symlink(target, staged)
}

func (c *copyUpCtx) makeNode(staged string) error {
	return unix.Mknod(staged, c.st.Mode&unix.S_IFMT|0o600, int(c.st.Rdev))
}

// fillCopy gives out, a new file, the data (unless withData is false) and
// the metadata (copyMeta) of in, whose status is st.
func fillCopy(in, out int, st *unix.Stat_t, withData bool) error {
	if withData {
		if err := copyData(in, out, st.Size); err != nil {
			return err
		}
	}
	return copyMeta(in, st, out, "")
}

// copyMeta gives a copy the owner, xattrs, mode and times of its source:
// src (any descriptor; -1 for no xattrs), whose status is st. The copy is
// dst itself when name is "", else name beneath directory dst (not
// followed). The order matters: chown clears set-id bits and file
// capabilities, so xattrs and mode follow it; an ordinary user may set
// xattrs only on a file it may write, so the mode follows them; every step
// before changes the times. A symlink takes owner and times only. xattrs
// the copy refuses are skipped, as is a chown the daemon may not make.
func copyMeta(src int, st *unix.Stat_t, dst int, name string) error {
	at, atName, follow := dst, name, unix.AT_SYMLINK_NOFOLLOW
	if name == "" {
		at, atName, follow = unix.AT_FDCWD, procPath(dst), 0
	}
	if err := unix.Fchownat(at, atName, int(st.Uid), int(st.Gid), follow); err != nil && !errors.Is(err, unix.EPERM) {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFLNK {
		if src >= 0 {
			copyXattrs(src, dst, name)
		}
		var err error
		if name == "" {
			err = unix.Fchmod(dst, st.Mode&07777)
		} else {
			err = chmodAt(dst, name, st.Mode&07777)
		}
		if err != nil {
			return err
		}
	}
	return unix.UtimesNanoAt(at, atName, []unix.Timespec{st.Atim, st.Mtim}, follow)
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
