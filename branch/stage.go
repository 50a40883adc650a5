package branch

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// A commit's stage holds what its steps replace until the commit is done
// or rolled back (commit.go), each entry under a name that starts with the
// commit's tag. It must be on the target's mount, since the steps are
// renames: for a target that is a delta, STORE/stage; for the base, the
// same when the store is on the base's mount. Otherwise (a store on another
// filesystem, or a base that is a mount root of its own, as a bind mount
// is) the stage is BASE/StageName, and the commit first copies what it
// moves into the base there, before its journal is written, so that its
// steps are renames still. The stage directories persist (making and
// moving a directory per commit cost more than the rest of a small one);
// the one in the base only while a commit into it runs.

// StageName is the directory at the base's root that holds the stages of
// commits into a base on another mount than the store. No view shows it or
// lets it be made, so no branch can commit it.
const StageName = ".branchfs-commit-stage"

// isStageName reports the view path that no view shows.
func isStageName(rel string) bool { return rel == StageName }

// MountID identifies the mount that holds path: renames work within one
// mount only, even between two bind mounts of one filesystem.
func MountID(path string) (uint64, error) {
	var stx unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, path, 0, unix.STATX_MNT_ID, &stx); err != nil {
		return 0, &os.PathError{Op: "statx", Path: path, Err: err}
	}
	return stx.Mnt_id, nil
}

// baseStages is the stage directory in the base.
func (s *Store) baseStages() string { return filepath.Join(s.meta.Base, StageName) }

// stageFor returns the stage directory of a commit into the base (toBase)
// or into a delta, making the base's.
func (s *Store) stageFor(toBase bool) (string, error) {
	if !toBase || !s.apart {
		return filepath.Join(s.dir, "stage"), nil
	}
	root := s.baseStages()
	if err := unix.Mkdir(root, 0o700); err != nil && !errors.Is(err, unix.EEXIST) {
		return "", err
	}
	return root, nil
}

// clearStage removes what the commit left in its stage: what its steps
// replaced (to the trash, or at once where there is none: the base's), and
// copies a rollback left. Nothing here can fail the commit.
func (c *commitRun) clearStage() {
	if c.stage < 0 {
		return
	}
	inBase := c.j.Stage == c.s.baseStages()
	for i, o := range c.j.Ops {
		names := []string{asideName(c.j.Tag, i)}
		if c.j.Copied && o.Kind == opReplace {
			names = append(names, copiedName(c.j.Tag, i))
		}
		for _, n := range names {
			if inBase {
				removeAt(c.stage, n)
			} else {
				c.s.discardAt(c.stage, n)
			}
		}
	}
	if inBase {
		unix.Rmdir(c.j.Stage) // unless another commit's entries are there
	}
}

// clearStages empties the stage directories; only while no commit runs.
func (s *Store) clearStages() error {
	dir := filepath.Join(s.dir, "stage")
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if err := s.trash(filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	if _, err := os.Lstat(s.baseStages()); os.IsNotExist(err) {
		return nil
	}
	return os.RemoveAll(s.baseStages())
}

// asideName is where step i of the commit tagged tag puts what it
// replaces, in the stage.
func asideName(tag string, i int) string { return tag + "-" + strconv.Itoa(i) }

// copiedName is where a commit into a base on another mount copies what
// step i moves there, in the stage.
func copiedName(tag string, i int) string { return tag + "-new-" + strconv.Itoa(i) }

// copyTree copies sname in directory sfd (a delta) to dname in directory
// dfd (a stage): data, mode, owner, times and xattrs, without tombstones or
// opaque markers, which mean nothing in the base.
func copyTree(sfd int, sname string, dfd int, dname string) error {
	var st unix.Stat_t
	if err := unix.Fstatat(sfd, sname, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return err
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		if err := unix.Mkdirat(dfd, dname, 0o700); err != nil {
			return err
		}
		in, err := unix.Openat(sfd, sname, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(in)
		out, err := unix.Openat(dfd, dname, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(out)
		names, err := fdNames(in)
		if err != nil {
			return err
		}
		for _, n := range names {
			var cst unix.Stat_t
			if err := unix.Fstatat(in, n, &cst, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				return err
			}
			if isWhiteout(in, n, &cst) {
				continue
			}
			if err := copyTree(in, n, out, n); err != nil {
				return err
			}
		}
		copyXattrs(in, dfd, dname)
	case unix.S_IFREG:
		in, err := unix.Openat(sfd, sname, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(in)
		out, err := unix.Openat(dfd, dname, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return err
		}
		defer unix.Close(out)
		if err := copyData(in, out, st.Size); err != nil {
			return err
		}
		copyXattrs(in, out, "")
	case unix.S_IFLNK:
		target := make([]byte, st.Size+1)
		n, err := unix.Readlinkat(sfd, sname, target)
		if err != nil {
			return err
		}
		if err := unix.Symlinkat(string(target[:n]), dfd, dname); err != nil {
			return err
		}
		return setOwnerTimes(dfd, dname, &st)
	default:
		if err := unix.Mknodat(dfd, dname, st.Mode, int(st.Rdev)); err != nil {
			return err
		}
		if fd, err := unix.Openat(sfd, sname, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0); err == nil {
			copyXattrs(fd, dfd, dname)
			unix.Close(fd)
		}
	}
	// chown clears set-id bits, so the mode goes after it; times last.
	if err := unix.Fchownat(dfd, dname, int(st.Uid), int(st.Gid), unix.AT_SYMLINK_NOFOLLOW); err != nil && !errors.Is(err, unix.EPERM) {
		return err
	}
	if err := chmodAt(dfd, dname, st.Mode&07777); err != nil {
		return err
	}
	return unix.UtimesNanoAt(dfd, dname, []unix.Timespec{st.Atim, st.Mtim}, unix.AT_SYMLINK_NOFOLLOW)
}
