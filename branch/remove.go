package branch

import (
	"path"

	"golang.org/x/sys/unix"
)

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
