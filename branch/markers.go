package branch

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// Making markers so that a crash never leaves one half made, nor a name
// half replaced: whatever replaces an entry of a delta (a tombstone, an
// opaque directory, a file made where a tombstone stood) is built whole in
// STORE/tmp, which Open empties, and put in place by one rename. A crash
// before the rename leaves the view as it was; after it, as the operation
// left it.

// stageWhiteout makes a tombstone in STORE/tmp and returns its path.
func (s *Store) stageWhiteout() (string, error) {
	if s.noMarkers != nil {
		return "", s.noMarkers
	}
	p := s.tmpName()
	fd, err := unix.Open(p, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return "", err
	}
	err = unix.Fsetxattr(fd, whiteoutXattr, []byte("y"), 0)
	unix.Close(fd)
	if err != nil {
		unix.Unlink(p)
		return "", err
	}
	return p, nil
}

// install puts the entry at path staged (in the store, on the layer's
// filesystem) at name in directory pfd, atomically replacing what is there.
// What it replaced is removed; a crash leaves it in STORE/tmp. op names the
// operation for failpoints.
func (s *Store) install(op, staged string, pfd int, name string) error {
	err := failpoint(op + "-staged")
	if err == nil {
		err = renameStaged(staged, pfd, name, unix.RENAME_NOREPLACE)
	}
	if errors.Is(err, unix.EEXIST) {
		// RENAME_EXCHANGE swaps any two entries, a directory and a
		// file too, and neither has to be empty.
		if err = renameStaged(staged, pfd, name, unix.RENAME_EXCHANGE); err == nil {
			// Done: an error injected here only leaves the replaced
			// entry in STORE/tmp, as a crash would.
			failpoint(op + "-placed")
		}
	}
	if err != nil {
		removeAt(unix.AT_FDCWD, staged)
		return err
	}
	// What was replaced; Open empties STORE/tmp if this fails.
	removeAt(unix.AT_FDCWD, staged)
	return nil
}

// placeNew renames the entry at path staged to name in directory pfd,
// unless something is there: then it fails with EEXIST and removes staged.
func (s *Store) placeNew(op, staged string, pfd int, name string) error {
	err := failpoint(op + "-staged")
	if err == nil {
		err = renameStaged(staged, pfd, name, unix.RENAME_NOREPLACE)
	}
	if err != nil {
		removeAt(unix.AT_FDCWD, staged)
	}
	return err
}

// renameStaged is renameat2 of staged to name in pfd. Moving a directory
// to another parent needs write permission on it, which a daemon without
// CAP_DAC_OVERRIDE lacks on a read-only one: such directories get u+w for
// the move only. (One from the view, swapped out, is removed after.)
func renameStaged(staged string, pfd int, name string, flags uint) error {
	err := unix.Renameat2(unix.AT_FDCWD, staged, pfd, name, flags)
	if !errors.Is(err, unix.EACCES) {
		return err
	}
	mode := func(dirfd int, name string) (uint32, bool) {
		var st unix.Stat_t
		if unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW) != nil ||
			st.Mode&unix.S_IFMT != unix.S_IFDIR || st.Mode&0o200 != 0 {
			return 0, false
		}
		return st.Mode & 07777, chmodAt(dirfd, name, st.Mode&07777|0o200) == nil
	}
	m, changed := mode(unix.AT_FDCWD, staged)
	other := false
	if flags&unix.RENAME_EXCHANGE != 0 {
		_, other = mode(pfd, name)
	}
	if !changed && !other {
		return err
	}
	if err = unix.Renameat2(unix.AT_FDCWD, staged, pfd, name, flags); err != nil {
		return err
	}
	if changed {
		return chmodAt(pfd, name, m)
	}
	return nil
}

// stageDir makes a directory in STORE/tmp in which new entries get what
// they would get in directory pfd: its group where it is set-group-ID, and
// its default ACL. It returns its path and an O_PATH descriptor of it.
func (s *Store) stageDir(pfd int) (string, int, error) {
	var st unix.Stat_t
	if err := unix.Fstat(pfd, &st); err != nil {
		return "", -1, err
	}
	p := s.tmpName()
	if err := unix.Mkdir(p, 0o700); err != nil {
		return "", -1, err
	}
	fd, err := unix.Open(p, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err == nil && st.Mode&unix.S_ISGID != 0 {
		if err = unix.Chown(procPath(fd), -1, int(st.Gid)); err == nil {
			err = unix.Chmod(procPath(fd), 0o700|unix.S_ISGID)
		}
	}
	if err == nil {
		const acl = "system.posix_acl_default"
		if val, gerr := getXattr(procPath(pfd), acl); gerr == nil {
			err = unix.Setxattr(procPath(fd), acl, val, 0)
		}
	}
	if err != nil {
		if fd >= 0 {
			unix.Close(fd)
		}
		os.RemoveAll(p)
		return "", -1, err
	}
	return p, fd, nil
}

// setxattrAt sets attribute attr of name in directory dirfd, without
// following a symlink.
func setxattrAt(dirfd int, name, attr string, val []byte) error {
	fd, err := unix.Openat(dirfd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Setxattr(procPath(fd), attr, val, 0)
}

// checkXattrs finds out whether the store's filesystem can hold the user
// xattrs that mark tombstones and opaque directories. Where it cannot
// (ramfs), a branch works until it would need one: deleting or renaming
// what a lower layer has then fails with EOPNOTSUPP and changes nothing,
// and MarkerError says why.
func (s *Store) checkXattrs() error {
	p := s.tmpName()
	fd, err := unix.Open(p, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	err = unix.Fsetxattr(fd, whiteoutXattr, []byte("y"), 0)
	unix.Close(fd)
	unix.Unlink(p)
	if err != nil {
		s.noMarkers = fmt.Errorf("store %s: its filesystem cannot hold user extended attributes, which mark files deleted in a branch; choose another --store: %w", s.dir, err)
	}
	return nil
}

// MarkerError is nil, or says why this store cannot record deletions of
// lower files (see checkXattrs).
func (s *Store) MarkerError() error { return s.noMarkers }

// setOpaque is layer.setOpaque, failing at once where the store cannot.
func (s *Store) setOpaque(l *layer, rel string) error {
	if s.noMarkers != nil {
		return s.noMarkers
	}
	return l.setOpaque(rel)
}

// v1Opaque is the opaque marker a format 1 store made as root.
const v1Opaque = "trusted.branchfs.opaque"

// upgradeMarkers converts the tombstones and opaque markers of a format 1
// store in place: every 0/0 character device in a delta becomes a tombstone
// and trusted.branchfs.opaque becomes opaqueXattr. Format 1 took every 0/0
// device in a delta for a tombstone, so nothing changes meaning. Each step
// is atomic and may run again; the format is recorded once all are done.
func (s *Store) upgradeMarkers() error {
	deltas := filepath.Join(s.dir, "deltas")
	ents, err := os.ReadDir(deltas)
	if err != nil {
		return err
	}
	for _, e := range ents {
		fd, err := unix.Open(filepath.Join(deltas, e.Name()), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		err = s.upgradeDir(fd)
		unix.Close(fd)
		if err != nil {
			return fmt.Errorf("converting the markers of branch %s: %w", e.Name(), err)
		}
	}
	s.meta.Version = formatVersion
	return s.writeMeta()
}

func (s *Store) upgradeDir(fd int) error {
	names, err := fdNames(fd)
	if err != nil {
		return err
	}
	for _, n := range names {
		var st unix.Stat_t
		if err := unix.Fstatat(fd, n, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return err
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFCHR:
			if st.Rdev != 0 {
				continue
			}
			t, err := s.stageWhiteout()
			if err != nil {
				return err
			}
			if err := unix.Renameat(unix.AT_FDCWD, t, fd, n); err != nil {
				return err
			}
		case unix.S_IFDIR:
			cfd, err := unix.Openat(fd, n, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err != nil {
				return err
			}
			err = upgradeOpaque(cfd)
			if err == nil {
				err = s.upgradeDir(cfd)
			}
			unix.Close(cfd)
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// upgradeOpaque sets the new marker before it removes the old one.
func upgradeOpaque(fd int) error {
	if _, err := unix.Fgetxattr(fd, v1Opaque, nil); err != nil {
		return nil // absent, or a store made without root, which has none
	}
	if err := unix.Fsetxattr(fd, opaqueXattr, []byte("y"), 0); err != nil {
		return err
	}
	return unix.Fremovexattr(fd, v1Opaque)
}
