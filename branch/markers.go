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
	return p, mknodWhiteout(p)
}

// mknodWhiteout makes a tombstone at p: a 0/0 character device with no
// permissions, as overlayfs makes its whiteouts. The kernel lets every
// user make one (Linux 5.8) for overlayfs's sake.
func mknodWhiteout(p string) error {
	return unix.Mknod(p, unix.S_IFCHR, 0)
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

// checkMarkers finds out whether the store's filesystem can hold
// tombstones (0/0 character devices, which a kernel before 5.8 lets only
// root make) and the user xattr that marks opaque directories. Where it
// cannot (ramfs has no user xattrs), a branch works until it would need
// one: deleting or renaming what a lower layer has then fails with
// EOPNOTSUPP and changes nothing, and MarkerError says why.
func (s *Store) checkMarkers() error {
	p := s.tmpName()
	if err := mknodWhiteout(p); err != nil {
		s.noMarkers = fmt.Errorf("store %s: cannot make the 0/0 character devices that mark files deleted in a branch (Linux 5.8 lets every user make them): %w", s.dir, errors.Join(err, unix.EOPNOTSUPP))
		return nil
	}
	unix.Unlink(p)
	if err := unix.Mkdir(p, 0o700); err != nil {
		return err
	}
	err := unix.Setxattr(p, opaqueXattr, []byte("y"), 0)
	unix.Rmdir(p)
	if err != nil {
		s.noMarkers = fmt.Errorf("store %s: its filesystem cannot hold user extended attributes, which mark directories made again in a branch; choose another --store: %w", s.dir, err)
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

// The markers of earlier formats (see layer.go).
const (
	v1Opaque   = "trusted.branchfs.opaque"
	v2Whiteout = "user.branchfs.whiteout"
	v2Opaque   = "user.branchfs.opaque"
)

// upgradeMarkers converts the tombstones and opaque markers of a store of
// format 1 or 2 in place: an empty file carrying v2Whiteout becomes a 0/0
// character device, and either opaque marker becomes opaqueXattr. A 0/0
// character device in a delta was a tombstone in format 1 and stays one; in
// format 2 it was a user's device, which format 3 cannot hold: the
// conversion stops and says where it is, having changed what it converted
// only. Each step is atomic and may run again; the format is recorded once
// all are done.
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
		err = s.upgradeDir(fd, "")
		unix.Close(fd)
		if err != nil {
			return fmt.Errorf("converting the markers of branch %s to format %d: %w", e.Name(), formatVersion, err)
		}
	}
	s.meta.Version = formatVersion
	return s.writeMeta()
}

func (s *Store) upgradeDir(fd int, rel string) error {
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
			if isWhiteout(&st) && s.meta.Version == 2 {
				return fmt.Errorf("%s is a 0/0 character device, which format %d reads as a deletion; remove it (or abort the branch) with the branchfs that made it", JoinRel(rel, n), formatVersion)
			}
		case unix.S_IFREG:
			if st.Size != 0 {
				continue
			}
			if _, err := getxattrAt(fd, n, v2Whiteout, nil); err != nil {
				continue
			}
			t := s.tmpName()
			if err := mknodWhiteout(t); err != nil {
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
				err = s.upgradeDir(cfd, JoinRel(rel, n))
			}
			unix.Close(cfd)
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// upgradeOpaque sets the new marker before it removes an old one.
func upgradeOpaque(fd int) error {
	for _, old := range []string{v1Opaque, v2Opaque} {
		if _, err := unix.Fgetxattr(fd, old, nil); err != nil {
			continue // absent, or a trusted xattr a user cannot read
		}
		if err := unix.Fsetxattr(fd, opaqueXattr, []byte("y"), 0); err != nil {
			return err
		}
		if err := unix.Fremovexattr(fd, old); err != nil {
			return err
		}
	}
	return nil
}
