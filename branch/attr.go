package branch

import (
	"path"

	"golang.org/x/sys/unix"
)

// inTopDir calls fn with the top-layer parent, name and attributes of rel,
// if rel's directory is one only the top layer shows: then no layer below
// can show the name, it needs no copy-up and its removal no tombstone.
// The name is looked up in the directory opened once: an openat2, an
// fstatat and a close besides fn's call, against a lookup through the
// layers (three calls, six for a directory, whose opaque mark is read),
// an open and a close. It answers ENOENT for a missing name or a
// tombstone. ok false: the directory is not the top layer's alone, or
// cannot be opened; the caller takes the general way.
func (v *View) inTopDir(rel string, fn func(pfd int, name string, st *unix.Stat_t) error) (err error, ok bool) {
	dir, name := path.Split(rel)
	if name == "" || name == "." || name == ".." || isStageName(rel) {
		return nil, false
	}
	dir = trimSlash(dir)
	if !v.topAlone(dir) {
		return nil, false
	}
	top := v.layers[0]
	pfd, done, err := top.dirFd(dir)
	if err != nil {
		return nil, false
	}
	defer done()
	var st unix.Stat_t
	if err := unix.Fstatat(pfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return err, true
	}
	if top.delta && isWhiteout(&st) {
		return unix.ENOENT, true
	}
	return fn(pfd, name, &st), true
}

// topAlone says whether directory dir is shown by the top layer alone (one
// the view made, or any in a view of one layer): no layer below can show a
// name in it.
func (v *View) topAlone(dir string) bool {
	dl, err := v.dirLayers(dir)
	return err == nil && len(dl) == 1 && dl[0] == 0
}

// topEntry copies rel up and calls fn with its top-layer parent and name.
func (v *View) topEntry(rel string, withData bool, fn func(pfd int, name string) error) error {
	if err := v.beginWrite(); err != nil {
		return err
	}
	if err, ok := v.inTopDir(rel, func(pfd int, name string, _ *unix.Stat_t) error { return fn(pfd, name) }); ok {
		return err
	}
	if _, err := v.copyUp(rel, withData); err != nil {
		return err
	}
	pfd, name, err := v.layers[0].parent(rel)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	if name == "" {
		name = "."
	}
	return fn(pfd, name)
}

// Chmod changes the mode bits of rel.
func (v *View) Chmod(rel string, mode uint32) error {
	return v.topEntry(rel, true, func(pfd int, name string) error { return chmodAt(pfd, name, mode&07777) })
}

// Chown changes owner and group; -1 leaves one unchanged.
func (v *View) Chown(rel string, uid, gid int) error {
	return v.topEntry(rel, true, func(pfd int, name string) error {
		return unix.Fchownat(pfd, name, uid, gid, unix.AT_SYMLINK_NOFOLLOW)
	})
}

// Truncate sets the size of regular file rel. It is truncate(2), not
// ftruncate(2): the kernel leaves it to the filesystem whether a truncate
// by name changes the times (ext4 does, ramfs does not).
func (v *View) Truncate(rel string, size int64) error {
	return v.topEntry(rel, size > 0, func(pfd int, name string) error {
		fd, err := unix.Openat(pfd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		return v.grow(fd, func(int64) int64 { return size }, func() error { return unix.Truncate(procPath(fd), size) })
	})
}

// Utimens sets access and modification times; UTIME_OMIT keeps one.
func (v *View) Utimens(rel string, atime, mtime unix.Timespec) error {
	return v.topEntry(rel, true, func(pfd int, name string) error {
		return unix.UtimesNanoAt(pfd, name, []unix.Timespec{atime, mtime}, unix.AT_SYMLINK_NOFOLLOW)
	})
}

// Readlink returns the target of symlink rel.
func (v *View) Readlink(rel string) (string, error) {
	e, err := v.Stat(rel)
	if err != nil {
		return "", err
	}
	return v.layers[e.Layer].readlink(rel)
}

// Statfs reports on the filesystem that holds the base; in a branch that
// a storage limit counts, no more room than the limits leave (quota.go),
// so that df and tools that check for space see them.
func (v *View) Statfs() (unix.Statfs_t, error) {
	var st unix.Statfs_t
	if err := unix.Fstatfs(v.store.base.fd(), &st); err != nil {
		return st, err
	}
	v.store.limitStatfs(v.br, &st)
	return st, nil
}
