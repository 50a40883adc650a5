package branch

import (
	"errors"
	"os"
	"path"

	"golang.org/x/sys/unix"
)

// Owner is who a new file belongs to: the calling process.
type Owner struct{ Uid, Gid uint32 }

// prepareNew readies the top layer for a new entry at rel and returns the
// top-layer parent directory and name. hidden reports a tombstone in the top
// layer at that name: the new entry must replace it (see makeNew), and a
// new directory must be opaque.
func (v *View) prepareNew(rel string) (pfd int, name string, hidden bool, err error) {
	if err := v.beginWrite(); err != nil {
		return -1, "", false, err
	}
	if rel == "" {
		return -1, "", false, unix.EEXIST
	}
	if isStageName(rel) {
		return -1, "", false, unix.EPERM
	}
	dir, name := path.Split(rel)
	dir = trimSlash(dir)
	dl, err := v.dirLayers(dir)
	if err != nil {
		return -1, "", false, err
	}
	_, tomb, err := v.lookupTomb(dl, rel, name, false)
	if err == nil {
		return -1, "", false, unix.EEXIST
	}
	if !errors.Is(err, unix.ENOENT) {
		return -1, "", false, err
	}
	hidden = tomb == 0
	top := v.layers[0]
	if pfd, err = top.open(dir, unix.O_PATH|unix.O_DIRECTORY, 0); isNotExist(err) {
		if err := v.ensureDir(dir); err != nil {
			return -1, "", false, err
		}
		pfd, err = top.open(dir, unix.O_PATH|unix.O_DIRECTORY, 0)
	}
	if err != nil {
		return -1, "", false, err
	}
	return pfd, name, hidden, nil
}

// makeNew calls mk to make a new entry at name in directory pfd. Over a
// tombstone (hidden), mk makes it in a staging directory that gives new
// entries what pfd would, and a rename swaps it for the tombstone: removing
// the tombstone first would show what it hides until the entry is made, and
// for good if the daemon died in between.
func (v *View) makeNew(pfd int, name string, hidden bool, op string, mk func(dirfd int, name string) error) error {
	if !hidden {
		return mk(pfd, name)
	}
	dir, dfd, err := v.store.stageDir(pfd)
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	defer unix.Close(dfd)
	if err := mk(dfd, "new"); err != nil {
		return err
	}
	return v.store.install(op, dir+"/new", pfd, name)
}

// own gives a new entry to its creator, or else removes it: an operation
// that fails leaves nothing (a daemon without root can give entries to no
// one else). A set-group-ID directory decides the group itself; chown
// clears set-id bits, so mode is put back after.
func own(pfd int, name string, o Owner, mode uint32) error {
	var st unix.Stat_t
	if err := unix.Fstatat(pfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return err
	}
	_, err := ownStat(pfd, name, &st, o, mode)
	if err != nil {
		unmake(pfd, name, &st)
	}
	return err
}

// unmake removes name, an entry of pfd whose making failed half-way.
func unmake(pfd int, name string, st *unix.Stat_t) {
	flags := 0
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		flags = unix.AT_REMOVEDIR
	}
	unix.Unlinkat(pfd, name, flags)
}

// ownStat is own for an entry whose attributes st the caller has already
// read. It reports whether it changed them.
func ownStat(pfd int, name string, st *unix.Stat_t, o Owner, mode uint32) (changed bool, err error) {
	if st.Uid == o.Uid && st.Gid == o.Gid {
		// Right whether or not the directory is set-group-ID: the
		// group it would impose is the one the entry has.
		return false, nil
	}
	gid := int(o.Gid)
	var dst unix.Stat_t
	if unix.Fstat(pfd, &dst) == nil && dst.Mode&unix.S_ISGID != 0 {
		gid = int(st.Gid)
	}
	if st.Uid == o.Uid && st.Gid == uint32(gid) {
		return false, nil
	}
	if err := unix.Fchownat(pfd, name, int(o.Uid), gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return false, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFLNK && mode&(unix.S_ISUID|unix.S_ISGID) != 0 {
		return true, chmodAt(pfd, name, mode&07777)
	}
	return true, nil
}

// Create makes and opens a regular file.
func (v *View) Create(rel string, flags int, mode uint32, o Owner) (*File, *Entry, error) {
	if f, e, ok := v.createInTop(rel, flags, mode, o); ok {
		return f, e, nil
	}
	pfd, name, hidden, err := v.prepareNew(rel)
	if errors.Is(err, unix.EEXIST) && flags&unix.O_EXCL == 0 {
		return v.Open(rel, flags)
	}
	if err != nil {
		return nil, nil, err
	}
	defer unix.Close(pfd)
	fd := -1
	e := &Entry{Layer: 0}
	err = v.makeNew(pfd, name, hidden, "create", func(dfd int, name string) error {
		var err error
		fd, err = unix.Openat(dfd, name, flags&openFlags|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, mode)
		if err != nil {
			return err
		}
		err = unix.Fstat(fd, &e.Stat)
		if err == nil {
			var changed bool
			if changed, err = ownStat(dfd, name, &e.Stat, o, mode); changed && err == nil {
				err = unix.Fstat(fd, &e.Stat)
			}
		}
		if err != nil {
			unix.Unlinkat(dfd, name, 0)
		}
		return err
	})
	if err != nil {
		if fd >= 0 {
			unix.Close(fd)
		}
		return nil, nil, err
	}
	return v.newFile(fd, flags, e), e, nil
}

// createInTop is Create for a name whose directory only the top layer
// shows (one the view made, or any in a view of one layer): no layer below
// can show the name, so the exclusive create is its lookup too. That takes
// an openat in the directory's kept descriptor (layer.dirFd) and an fstat,
// against a lookup, an open of the directory, the create and a close. ok
// false: the name exists (perhaps as a tombstone), the directory is not
// the top layer's alone or something failed, and Create takes the general
// way, which finds out which.
func (v *View) createInTop(rel string, flags int, mode uint32, o Owner) (f *File, e *Entry, ok bool) {
	if rel == "" || isStageName(rel) || v.beginWrite() != nil {
		return nil, nil, false
	}
	dir, name := path.Split(rel)
	if !v.topAlone(trimSlash(dir)) {
		return nil, nil, false
	}
	top, pfd := v.layers[0], -1
	var fd int
	var err error
	if top.delta {
		var done func()
		if pfd, done, err = top.dirFd(trimSlash(dir)); err != nil {
			return nil, nil, false
		}
		defer done()
		fd, err = unix.Openat(pfd, name, flags&openFlags|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, mode)
	} else { // the main view's base: one openat2, the directory not kept
		fd, err = top.open(rel, flags&openFlags|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW, mode&07777) // openat2 refuses S_IFREG
	}
	if err != nil {
		return nil, nil, false
	}
	e = &Entry{Layer: 0}
	err = unix.Fstat(fd, &e.Stat)
	if err == nil && (e.Stat.Uid != o.Uid || e.Stat.Gid != o.Gid) {
		if pfd < 0 {
			if pfd, _, err = top.parent(rel); err == nil {
				defer unix.Close(pfd)
			}
		}
		if err == nil {
			var changed bool
			if changed, err = ownStat(pfd, name, &e.Stat, o, mode); changed && err == nil {
				err = unix.Fstat(fd, &e.Stat)
			}
		}
	}
	if err != nil {
		if pfd >= 0 {
			unix.Unlinkat(pfd, name, 0)
		}
		unix.Close(fd)
		return nil, nil, false
	}
	return v.newFile(fd, flags, e), e, true
}

// Mkdir makes a directory. One made where a deleted one stood is opaque.
func (v *View) Mkdir(rel string, mode uint32, o Owner) (*Entry, error) {
	pfd, name, hidden, err := v.prepareNew(rel)
	if err != nil {
		return nil, err
	}
	defer unix.Close(pfd)
	err = v.makeNew(pfd, name, hidden, "mkdir", func(dfd int, name string) error {
		if err := unix.Mkdirat(dfd, name, mode); err != nil {
			return err
		}
		if hidden { // made where one was deleted: nothing below shows in it
			if err := setxattrAt(dfd, name, opaqueXattr, []byte("y")); err != nil {
				return err
			}
		}
		return own(dfd, name, o, mode)
	})
	v.invalidate()
	if err != nil {
		return nil, err
	}
	return v.Stat(rel)
}

// Mknod makes a fifo, socket or device node.
func (v *View) Mknod(rel string, mode, dev uint32, o Owner) (*Entry, error) {
	if !v.IsMain() && mode&unix.S_IFMT == unix.S_IFCHR && dev == 0 {
		return nil, errDeviceIsMarker
	}
	pfd, name, hidden, err := v.prepareNew(rel)
	if err != nil {
		return nil, err
	}
	defer unix.Close(pfd)
	err = v.makeNew(pfd, name, hidden, "mknod", func(dfd int, name string) error {
		if err := unix.Mknodat(dfd, name, mode, int(dev)); err != nil {
			return err
		}
		return own(dfd, name, o, mode)
	})
	if err != nil {
		return nil, err
	}
	return v.Stat(rel)
}

// Symlink makes a symbolic link at rel pointing to target.
func (v *View) Symlink(target, rel string, o Owner) (*Entry, error) {
	pfd, name, hidden, err := v.prepareNew(rel)
	if err != nil {
		return nil, err
	}
	defer unix.Close(pfd)
	err = v.makeNew(pfd, name, hidden, "symlink", func(dfd int, name string) error {
		if err := unix.Symlinkat(target, dfd, name); err != nil {
			return err
		}
		return own(dfd, name, o, 0)
	})
	if err != nil {
		return nil, err
	}
	return v.Stat(rel)
}

// Link makes newRel another name of oldRel, copying oldRel up first.
func (v *View) Link(oldRel, newRel string) (*Entry, error) {
	if err := v.beginWrite(); err != nil {
		return nil, err
	}
	if _, err := v.copyUp(oldRel, true); err != nil {
		return nil, err
	}
	pfd, name, hidden, err := v.prepareNew(newRel)
	if err != nil {
		return nil, err
	}
	defer unix.Close(pfd)
	opfd, oname, err := v.layers[0].parent(oldRel)
	if err != nil {
		return nil, err
	}
	defer unix.Close(opfd)
	err = v.makeNew(pfd, name, hidden, "link", func(dfd int, name string) error {
		return unix.Linkat(opfd, oname, dfd, name, 0)
	})
	if err != nil {
		return nil, err
	}
	return v.Stat(newRel)
}
