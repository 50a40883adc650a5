package branch

import (
	"errors"
	"os"
	"path"

	"golang.org/x/sys/unix"
)

// Owner is who a new file belongs to: the calling process.
type Owner struct{ Uid, Gid uint32 }

// Open opens rel with open(2) flags. Opening for writing copies the file
// up first (without its data under O_TRUNC). The entry returned describes
// the file that was opened.
func (v *View) Open(rel string, flags int) (*File, *Entry, error) {
	var e *Entry
	var err error
	if OpensForWrite(flags) {
		e, err = v.CopyUp(rel, flags&unix.O_TRUNC == 0)
	} else {
		if fd, e := v.openRead(rel, flags); e != nil {
			return v.newFile(fd, flags, e), e, nil
		}
		e, err = v.Lookup(rel)
	}
	if err != nil {
		return nil, nil, err
	}
	fd, err := v.layers[e.Layer].open(rel, flags&openFlags|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, e, err
	}
	if flags&unix.O_TRUNC != 0 && e.Layer == 0 {
		v.recount(fd)
	}
	return v.newFile(fd, flags, e), e, nil
}

// openRead opens a regular file for reading the short way: straight from
// the first layer of its directory that has it, with the attributes taken
// from the open descriptor. Anything else (a tombstone, which fails to
// open, a symlink, a special file, an error) returns nil for Open's
// general path to decide.
func (v *View) openRead(rel string, flags int) (int, *Entry) {
	dir, _ := path.Split(rel)
	dl, err := v.dirLayers(trimSlash(dir))
	if err != nil {
		return -1, nil
	}
	for _, i := range dl {
		// O_NONBLOCK: a FIFO put there since the lookup must not hang us.
		fd, err := v.layers[i].open(rel, flags&openFlags|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
		if errors.Is(err, unix.ENOENT) {
			continue
		}
		if err != nil {
			return -1, nil
		}
		e := &Entry{Layer: i}
		if unix.Fstat(fd, &e.Stat) != nil || e.Stat.Mode&unix.S_IFMT != unix.S_IFREG {
			unix.Close(fd)
			return -1, nil
		}
		e.partLinks(rel)
		if flags&unix.O_NONBLOCK == 0 {
			if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFL, flags&openFlags&^unix.O_ACCMODE); err != nil {
				unix.Close(fd)
				return -1, nil
			}
		}
		return fd, e
	}
	return -1, nil
}

// OpensForWrite reports open(2) flags that open a file for writing, O_TRUNC
// included: Open copies the file up first if it is Lower.
func OpensForWrite(flags int) bool { return flags&(unix.O_WRONLY|unix.O_RDWR|unix.O_TRUNC) != 0 }

// openFlags are the open(2) flags passed on to the underlying file. The
// kernel adds internal bits (such as __FMODE_EXEC when a file is executed)
// that openat2 refuses.
const openFlags = unix.O_ACCMODE | unix.O_APPEND | unix.O_DIRECT | unix.O_DIRECTORY | unix.O_DSYNC |
	unix.O_SYNC | unix.O_NOATIME | unix.O_NONBLOCK | unix.O_LARGEFILE | unix.O_TRUNC

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

// whiteout records in the top layer that rel is deleted: a tombstone made
// whole in STORE/tmp replaces what the top layer has there, if anything, in
// one rename. Removing that first and then making the tombstone would show
// what lies below in between, and for good after a crash there.
func (v *View) whiteout(rel, op string) error {
	dir, _ := path.Split(rel)
	if err := v.ensureDir(trimSlash(dir)); err != nil {
		return err
	}
	pfd, name, err := v.layers[0].parent(rel)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	t, err := v.store.stageWhiteout()
	if err != nil {
		return err
	}
	return v.store.install(op, t, pfd, name)
}

// recordHidden records which directory of the base a removal of rel hides
// (hiddenXattr), if the base has one there and the store keeps xattrs.
func (v *View) recordHidden(rel string) error {
	base := v.layers[len(v.layers)-1]
	fd, err := base.open(rel, unix.O_PATH|unix.O_NOFOLLOW|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil
	}
	defer unix.Close(fd)
	origin, err := originOf(fd, rel)
	if err != nil {
		return nil
	}
	dir, name := path.Split(rel)
	dir = trimSlash(dir)
	if err := v.ensureDir(dir); err != nil {
		return err
	}
	pfd, err := v.layers[0].open(dir, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	unix.Setxattr(procPath(pfd), hiddenXattr(name), []byte(origin), 0)
	return nil
}

// Unlink removes a non-directory.
func (v *View) Unlink(rel string) error {
	if err := v.beginWrite(); err != nil {
		return err
	}
	if err, ok := v.unlinkInTop(rel); ok {
		return err
	}
	e, err := v.Lookup(rel)
	if err != nil {
		return err
	}
	if e.IsDir() {
		return unix.EISDIR
	}
	defer v.unnamedRel(rel)()
	if v.lowerHas(rel) {
		return v.whiteout(rel, "unlink")
	}
	pfd, name, err := v.layers[0].parent(rel)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	return unix.Unlinkat(pfd, name, 0)
}

// unlinkInTop is Unlink for a name whose directory only the top layer
// shows (inTopDir): four system calls, against six the general way.
func (v *View) unlinkInTop(rel string) (err error, ok bool) {
	return v.inTopDir(rel, func(pfd int, name string, st *unix.Stat_t) error {
		if st.Mode&unix.S_IFMT == unix.S_IFDIR {
			return unix.EISDIR
		}
		defer v.unnamed(pfd, name)()
		return unix.Unlinkat(pfd, name, 0)
	})
}

// Rmdir removes an empty directory.
func (v *View) Rmdir(rel string) error {
	if err := v.beginWrite(); err != nil {
		return err
	}
	if rel == "" {
		return unix.EBUSY
	}
	e, err := v.Lookup(rel)
	if err != nil {
		return err
	}
	if !e.IsDir() {
		return unix.ENOTDIR
	}
	if ents, err := v.ReadDir(rel); err != nil {
		return err
	} else if len(ents) > 0 {
		return unix.ENOTEMPTY
	}
	defer v.invalidate()
	if v.lowerHas(rel) {
		if err := v.recordHidden(rel); err != nil {
			return err
		}
		// The top layer's copy, which holds only tombstones, goes with
		// the same rename that puts the tombstone in its place.
		return v.whiteout(rel, "rmdir")
	}
	// Nothing lies below: the tombstones in the top layer's copy hide
	// nothing, and removing them first shows nothing.
	if err := v.clearTombstones(rel); err != nil {
		return err
	}
	pfd, name, err := v.layers[0].parent(rel)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	return unix.Unlinkat(pfd, name, unix.AT_REMOVEDIR)
}

// clearTombstones empties a top-layer directory that shows no entries, so
// the directory itself can be removed or replaced.
func (v *View) clearTombstones(rel string) error {
	top := v.layers[0]
	if !top.delta {
		return nil
	}
	fd, err := top.open(rel, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	names, err := fdNames(fd)
	if err != nil {
		return err
	}
	for _, n := range names {
		var st unix.Stat_t
		if err := unix.Fstatat(fd, n, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			continue
		}
		if !isWhiteout(&st) {
			return unix.ENOTEMPTY
		}
		if err := unix.Unlinkat(fd, n, 0); err != nil {
			return err
		}
	}
	return nil
}

// bringUp makes rel wholly present in the top layer before it moves: a file
// is copied up, a directory that merges lower layers is copied recursively
// and made opaque.
func (v *View) bringUp(rel string, e *Entry) error {
	if !e.IsDir() {
		_, err := v.copyUp(rel, true)
		return err
	}
	if len(e.dirs) == 1 && e.dirs[0] == 0 {
		return nil
	}
	if err := v.ensureDir(rel); err != nil {
		return err
	}
	ents, err := v.ReadDir(rel)
	if err != nil {
		return err
	}
	for _, d := range ents {
		child := JoinRel(rel, d.Name)
		ce, err := v.Lookup(child)
		if err != nil {
			return err
		}
		if err := v.bringUp(child, ce); err != nil {
			return err
		}
	}
	pfd, err := v.layers[0].open(rel, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	restore := saveTimes(pfd)
	unix.Close(pfd)
	if err := v.store.setOpaque(v.layers[0], rel); err != nil {
		return err
	}
	restore()
	v.invalidate()
	return nil
}

// Rename moves oldRel to newRel; flags are renameat2's NOREPLACE and
// EXCHANGE. Files and directories that exist only below the top layer are
// brought up first; a tombstone is left where the old name showed a lower
// entry.
func (v *View) Rename(oldRel, newRel string, flags uint) error {
	if err := v.beginWrite(); err != nil {
		return err
	}
	if flags&^uint(unix.RENAME_NOREPLACE|unix.RENAME_EXCHANGE) != 0 {
		return unix.EINVAL
	}
	if isStageName(newRel) {
		return unix.EPERM
	}
	eo, err := v.Lookup(oldRel)
	if err != nil {
		return err
	}
	en, err := v.Lookup(newRel)
	if err != nil && !errors.Is(err, unix.ENOENT) {
		return err
	}
	exchange := flags&unix.RENAME_EXCHANGE != 0
	if oldRel == newRel {
		if flags&unix.RENAME_NOREPLACE != 0 {
			return unix.EEXIST
		}
		return nil // a name renamed onto itself: nothing happens
	}
	switch {
	case en != nil && flags&unix.RENAME_NOREPLACE != 0:
		return unix.EEXIST
	case en == nil && exchange:
		return unix.ENOENT
	case en != nil && !exchange && en.IsDir():
		if !eo.IsDir() {
			return unix.EISDIR
		}
		if ents, err := v.ReadDir(newRel); err != nil {
			return err
		} else if len(ents) > 0 {
			return unix.ENOTEMPTY
		}
	case en != nil && !exchange && eo.IsDir():
		return unix.ENOTDIR
	}
	if en != nil && en.Layer == eo.Layer && en.Stat.Ino == eo.Stat.Ino && eo.apart == "" {
		return nil // two names of one file: rename does nothing
	}
	if err := v.bringUp(oldRel, eo); err != nil {
		return err
	}
	if exchange {
		if err := v.bringUp(newRel, en); err != nil {
			return err
		}
	}
	newDir, _ := path.Split(newRel)
	if err := v.ensureDir(trimSlash(newDir)); err != nil {
		return err
	}
	top := v.layers[0]
	defer v.invalidate()
	if !exchange {
		defer v.unnamedRel(newRel)() // what the new name showed may have no name left
		// Base directories the rename hides, at either name.
		for _, rel := range []string{oldRel, newRel} {
			if err := v.recordHidden(rel); err != nil {
				return err
			}
		}
	}
	// A directory that lands where a lower layer has the name must hide
	// it; in an exchange that holds for both sides. The mark goes on first,
	// where it hides nothing yet: a directory that merged lower ones was
	// made opaque by bringUp, so one without it has nothing below.
	if eo.IsDir() && v.lowerHas(newRel) {
		if err := v.store.setOpaque(top, oldRel); err != nil {
			return err
		}
	}
	if exchange && en.IsDir() && v.lowerHas(oldRel) {
		if err := v.store.setOpaque(top, newRel); err != nil {
			return err
		}
	}
	opfd, oname, err := top.parent(oldRel)
	if err != nil {
		return err
	}
	defer unix.Close(opfd)
	npfd, nname, err := top.parent(newRel)
	if err != nil {
		return err
	}
	defer unix.Close(npfd)
	if exchange {
		return unix.Renameat2(opfd, oname, npfd, nname, flags)
	}
	needTombstone := v.lowerHas(oldRel)
	tomb := false
	if st, err := top.lstat(newRel); err == nil && top.delta {
		tomb = isWhiteout(&st)
		if !tomb && st.Mode&unix.S_IFMT == unix.S_IFDIR {
			// Empty in the view, but its tombstones stop rename(2): a
			// tombstone takes its place first.
			if err := v.whiteout(newRel, "rename"); err != nil {
				return err
			}
			tomb = true
		}
	} else if err != nil && !isNotExist(err) {
		return err
	}
	if !tomb && needTombstone && eo.IsDir() {
		// A tombstone in the free name, to swap with (below).
		if err := v.whiteout(newRel, "rename"); err != nil {
			return err
		}
		tomb = true
	}
	switch {
	case tomb:
		// Swapping with the tombstone moves the entry and leaves the
		// tombstone at the old name, in one step.
		if err := unix.Renameat2(opfd, oname, npfd, nname, unix.RENAME_EXCHANGE); err != nil {
			return err
		}
		if !needTombstone { // it would hide nothing
			failpoint("rename-exchanged") // done: a failure here changes nothing
			return unix.Unlinkat(opfd, oname, 0)
		}
		return nil
	case !needTombstone:
		return unix.Renameat2(opfd, oname, npfd, nname, flags)
	}
	// A non-directory whose old name needs a tombstone: a second link
	// takes the new name (replacing what is there), then the tombstone
	// replaces the old one. In between both names show the file, as
	// rename(2) allows; never the file below.
	t, err := v.store.stageWhiteout()
	if err != nil {
		return err
	}
	tmp := v.store.tmpName()
	err = unix.Linkat(opfd, oname, unix.AT_FDCWD, tmp, 0)
	if err == nil {
		err = unix.Renameat2(unix.AT_FDCWD, tmp, npfd, nname, flags)
	}
	if err != nil {
		unix.Unlink(tmp)
		unix.Unlink(t)
		return err
	}
	failpoint("rename-linked") // a kill here leaves both names; errors are for commits
	return unix.Renameat(unix.AT_FDCWD, t, opfd, oname)
}

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

// GetXattr reads an extended attribute into buf (nil: report its size).
func (v *View) GetXattr(rel, name string, buf []byte) (int, error) {
	if IsInternalXattr(name) {
		return 0, unix.ENODATA
	}
	var n int
	err := v.atShown(rel, func(dirfd int, base string) (err error) {
		n, err = getxattrAt(dirfd, base, name, buf)
		return err
	})
	return n, noACL(name, err)
}

// noACL: a filesystem without POSIX ACLs (ramfs, tmpfs without them)
// answers EOPNOTSUPP for an ACL, where the kernel expects ENODATA, "none":
// it would fail every permission check that reads the ACL, a non-owner's
// read of a world-readable file included.
func noACL(name string, err error) error {
	if err == unix.EOPNOTSUPP && (name == "system.posix_acl_access" || name == "system.posix_acl_default") {
		return unix.ENODATA
	}
	return err
}

// ListXattr lists extended attribute names, without internal ones.
func (v *View) ListXattr(rel string) ([]string, error) {
	var all []string
	err := v.atShown(rel, func(dirfd int, base string) (err error) {
		all, err = xattrNames(func(buf []byte) (int, error) { return listxattrAt(dirfd, base, buf) })
		return err
	})
	return withoutInternal(all), err
}

func withoutInternal(names []string) []string {
	var out []string
	for _, n := range names {
		if !IsInternalXattr(n) {
			out = append(out, n)
		}
	}
	return out
}

// SetXattr sets an extended attribute, copying rel up first.
func (v *View) SetXattr(rel, name string, val []byte, flags int) error {
	if IsInternalXattr(name) {
		return unix.EPERM
	}
	return v.topEntry(rel, true, func(pfd int, n string) error {
		fd, err := unix.Openat(pfd, n, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		return unix.Setxattr(procPath(fd), name, val, flags)
	})
}

// RemoveXattr removes an extended attribute, copying rel up first.
func (v *View) RemoveXattr(rel, name string) error {
	if IsInternalXattr(name) {
		return unix.EPERM
	}
	if _, err := v.GetXattr(rel, name, nil); err != nil {
		return err
	}
	return v.topEntry(rel, true, func(pfd int, n string) error {
		fd, err := unix.Openat(pfd, n, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		return unix.Removexattr(procPath(fd), name)
	})
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
