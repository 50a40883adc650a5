package branch

import (
	"errors"
	"path"

	"golang.org/x/sys/unix"
)

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
