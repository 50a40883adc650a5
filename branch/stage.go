package branch

import (
	"errors"
	"log"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// A commit's stage holds what its steps replace until the commit is done
// or rolled back (commit.go), each entry under a name that starts with the
// commit's tag. It must be on the target's mount, since the steps are
// renames: for a target that is a delta, STORE/stage; for the base, the
// same when the store is on the base's mount. STORE/stage persists (making
// and moving a directory per commit cost more than the rest of a small
// one).
//
// Otherwise (a store on another filesystem, or a base that is a mount root
// of its own, as a bind mount is) the commit first copies what it moves
// into the base, before its journal is written, so that its steps are
// renames still, and stages in the base: in a directory of its own,
// BASE/StageName-TAG, which docs/design.md describes. makeBaseStage makes
// it, openBaseStage finds it again for a replay, and clearStage removes
// it, or else sweepBaseStages later; STORE/base-stages/NAME records it
// (with its inode number) from before its mkdirat until it is removed.

// StageName starts the name of every stage in the base's root (and was,
// alone, the one stage directory of earlier versions). No view shows such
// a name at its root or lets one be made there, so no branch can commit it.
const StageName = ".branchfs-commit-stage"

// isStageName reports the view paths that no view shows.
func isStageName(rel string) bool {
	return strings.HasPrefix(rel, StageName) && !strings.Contains(rel, "/")
}

// MountID identifies the mount that holds path: renames work within one
// mount only, even between two bind mounts of one filesystem.
func MountID(path string) (uint64, error) {
	var stx unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, path, 0, unix.STATX_MNT_ID, &stx); err != nil {
		return 0, &os.PathError{Op: "statx", Path: path, Err: err}
	}
	return stx.Mnt_id, nil
}

// syncDir flushes directory dir's entries to the disk.
func syncDir(dir string) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Fsync(fd)
}

// stageRecords is the directory of the store's records of its stages in
// the base.
func (s *Store) stageRecords() string { return filepath.Join(s.dir, "base-stages") }

// errForeignStage: the entry at a stage's name is not the directory the
// daemon made there.
var errForeignStage = errors.New("not the stage directory this store made")

// makeStage makes the stage of commit c: it sets c.stage and the journal's
// Stage, Tag and StageIno. A commit into the base apart from the store
// whose steps move nothing needs none.
func (s *Store) makeStage(c *commitRun) error {
	c.j.Tag = filepath.Base(s.freshName("stage"))
	if !c.j.Copied {
		c.j.Stage = filepath.Join(s.dir, "stage")
		fd, err := unix.Open(c.j.Stage, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		c.stage = fd
		return err
	}
	if !slices.ContainsFunc(c.j.Ops, func(o op) bool { return o.Kind != opMeta }) {
		return nil
	}
	for try := 0; ; try++ {
		err := s.makeBaseStage(c)
		if !errors.Is(err, unix.EEXIST) && !errors.Is(err, errForeignStage) || try == 8 {
			return err
		}
		c.j.Tag = filepath.Base(s.freshName("stage"))
	}
}

// makeBaseStage makes BASE/StageName-TAG for commit c (see above). It
// fails with EEXIST if an entry has that name.
func (s *Store) makeBaseStage(c *commitRun) error {
	name := StageName + "-" + c.j.Tag
	recPath := filepath.Join(s.stageRecords(), name)
	rec, err := os.OpenFile(recPath, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	defer rec.Close()
	if s.opts.Durable {
		// The journal names the stage too, but only once written.
		if err := syncDir(s.stageRecords()); err != nil {
			os.Remove(recPath)
			return err
		}
	}
	root := s.base.fd()
	// Where others may rename in the base's root (no sticky bit), one of
	// them can swap another directory of the daemon's user in at the
	// name before the open below, which the commit would then fill and
	// empty: what is opened must be empty and without write permission,
	// as made here (isFreshDir).
	if err := unix.Mkdirat(root, name, 0o500); err != nil {
		os.Remove(recPath)
		return &os.PathError{Op: "mkdir", Path: filepath.Join(s.meta.Base, name), Err: err}
	}
	c.j.Stage = filepath.Join(s.meta.Base, name)
	fd, err := s.openStage(name, 0)
	var st unix.Stat_t
	if err == nil {
		err = unix.Fstat(fd, &st)
		if err == nil && !isFreshDir(fd, &st) {
			err = errForeignStage
		}
		if err != nil {
			unix.Close(fd)
		}
	}
	if err != nil {
		// Replaced already: whatever is there now is someone else's,
		// and so may be the directory made here, wherever it went.
		os.Remove(recPath)
		log.Printf("%s: %v: left alone", c.j.Stage, err)
		return &os.PathError{Op: "open", Path: c.j.Stage, Err: err}
	}
	// A set-group-ID root passes its bit on, a default ACL its entries:
	// neither is wanted here (nor on the copies made here).
	err = unix.Fchmod(fd, 0o700)
	for _, acl := range []string{"system.posix_acl_default", "system.posix_acl_access"} {
		if err == nil {
			if e := unix.Fremovexattr(fd, acl); e != nil && !errors.Is(e, unix.ENODATA) && !errors.Is(e, unix.EOPNOTSUPP) {
				err = e
			}
		}
	}
	if err == nil {
		_, err = rec.WriteString(strconv.FormatUint(st.Ino, 10) + "\n")
	}
	if err != nil {
		unix.Close(fd)
		s.removeBaseStage(name, st.Ino) // an empty directory
		os.Remove(recPath)
		return &os.PathError{Op: "stage", Path: c.j.Stage, Err: err}
	}
	c.stage, c.j.StageIno = fd, st.Ino
	return nil
}

// isFreshDir reports whether the directory open at fd (st) is as
// makeBaseStage makes it: writable by nobody, not even its owner, and
// empty.
func isFreshDir(fd int, st *unix.Stat_t) bool {
	if st.Mode&0o277 != 0 {
		return false
	}
	dfd, err := unix.Openat(fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	defer unix.Close(dfd)
	names, err := fdNames(dfd)
	return err == nil && len(names) == 0
}

// isOwnDir reports whether st is a directory the daemon may have made as
// a stage: its user's, on the base's device, with no permission for
// anyone else (its own bits are 0700 once makeBaseStage has set them).
func (s *Store) isOwnDir(st *unix.Stat_t) bool {
	return st.Mode&unix.S_IFMT == unix.S_IFDIR && st.Uid == uint32(os.Geteuid()) &&
		st.Dev == s.base.dev && st.Mode&0o077 == 0
}

// openBaseStage opens the stage in the base that journal j names, checked
// to be the directory the commit made: it fails with errForeignStage if
// another entry has its name, ENOENT if none has.
func (s *Store) openBaseStage(j *logRecord) (int, error) {
	dir, name := filepath.Split(j.Stage)
	if filepath.Clean(dir) != s.meta.Base || !isStageName(name) || j.StageIno == 0 {
		// An earlier version's shared directory (or no stage in the
		// base at all): nothing vouches for what it holds.
		return -1, errForeignStage
	}
	return s.openStage(name, j.StageIno)
}

// openStage opens the stage name in the base's root if it is a directory
// the daemon may have made there with inode number ino (0: not known); it
// fails with errForeignStage if another entry has its name.
func (s *Store) openStage(name string, ino uint64) (int, error) {
	pfd, err := unix.Openat(s.base.fd(), name, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
		return -1, errForeignStage
	}
	if err != nil {
		return -1, err
	}
	defer unix.Close(pfd)
	var st unix.Stat_t
	if err := unix.Fstat(pfd, &st); err != nil {
		return -1, err
	}
	if !s.isOwnDir(&st) || ino != 0 && st.Ino != ino {
		return -1, errForeignStage
	}
	return unix.Openat(pfd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
}

// clearStage removes what the commit left in its stage: what its steps
// replaced (to the trash, or at once where there is none: the base's), and
// copies a rollback left; a stage in the base goes with them. Nothing here
// can fail the commit: a stage in the base that stays is removed later
// (sweepBaseStages).
func (c *commitRun) clearStage() {
	if c.stage < 0 {
		return
	}
	if c.j.StageIno != 0 {
		name := filepath.Base(c.j.Stage)
		err := failpoint("stage-remove")
		if err == nil {
			err = c.s.removeStageAt(c.stage, name, c.j.StageIno)
		}
		if err != nil {
			c.s.stagesLeft.Store(true)
			log.Printf("commit %s: removing its stage %s: %v; tried again after the next commit or abort, and at the next mount", c.j.Name, c.j.Stage, err)
			return
		}
		os.Remove(filepath.Join(c.s.stageRecords(), name))
		return
	}
	for i := range c.j.Ops {
		c.s.discardAt(c.stage, asideName(c.j.Tag, i))
	}
}

// removeBaseStage removes the stage in the base named name whose
// directory had inode number ino (0: not known). An entry of that name
// that is not that directory is someone else's and stays; it reports
// success then, as when there is none.
func (s *Store) removeBaseStage(name string, ino uint64) error {
	fd, err := s.openStage(name, ino)
	if errors.Is(err, errForeignStage) {
		log.Printf("%s is not the stage this store made there: left alone", filepath.Join(s.meta.Base, name))
		return nil
	}
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	return s.removeStageAt(fd, name, st.Ino)
}

// removeStageAt empties the stage directory fd, then removes its name from
// the base's root if that still names it (ino).
func (s *Store) removeStageAt(fd int, name string, ino uint64) error {
	dfd, err := unix.Openat(fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	names, err := fdNames(dfd)
	for _, n := range names {
		if err == nil {
			err = removeAt(dfd, n)
		}
	}
	unix.Close(dfd)
	if err != nil {
		return err
	}
	// Another directory put at its name would be someone else's; rmdir
	// removes only an empty one.
	var st unix.Stat_t
	err = unix.Fstatat(s.base.fd(), name, &st, unix.AT_SYMLINK_NOFOLLOW)
	if err == nil && st.Ino == ino && st.Dev == s.base.dev {
		err = unix.Unlinkat(s.base.fd(), name, unix.AT_REMOVEDIR)
	}
	if isNotExist(err) {
		err = nil
	}
	return err
}

// sweepBaseStages removes the store's stages in the base that no commit
// needs: all, at a mount after the replay; else all but the one of an
// unfinished commit and the one of a commit whose "done" is owed. A
// record whose stage stays is kept, to be tried again. Preconditions:
// s.mu held exclusively, or during load.
func (s *Store) sweepBaseStages() {
	s.stagesLeft.Store(false)
	ents, err := os.ReadDir(s.stageRecords())
	if err != nil {
		s.stagesLeft.Store(true)
		log.Printf("stages in the base: %v", err)
		return
	}
	keep := map[string]bool{}
	if c := s.unfinished.Load(); c != nil {
		keep[filepath.Base(c.j.Stage)] = true
	}
	if j := s.owedDone.Load(); j != nil {
		keep[filepath.Base(j.Stage)] = true
	}
	for _, e := range ents {
		name := e.Name()
		if keep[name] {
			s.stagesLeft.Store(true)
			continue
		}
		rec := filepath.Join(s.stageRecords(), name)
		data, _ := os.ReadFile(rec)
		ino, _ := strconv.ParseUint(strings.TrimSpace(string(data)), 10, 64)
		if !isStageName(name) {
			os.Remove(rec)
			continue
		}
		if ino == 0 {
			// A crash before the record got its inode number: the
			// stage was empty then, and nothing vouches for what has
			// its name now but that rmdir removes only what is empty.
			if err := unix.Unlinkat(s.base.fd(), name, unix.AT_REMOVEDIR); err != nil && !isNotExist(err) {
				log.Printf("%s: %v: left alone", filepath.Join(s.meta.Base, name), err)
			}
			os.Remove(rec)
			continue
		}
		if err := s.removeBaseStage(name, ino); err != nil {
			s.stagesLeft.Store(true)
			log.Printf("removing the stage %s: %v; tried again after the next commit or abort, and at the next mount", filepath.Join(s.meta.Base, name), err)
			continue
		}
		os.Remove(rec)
	}
}

// clearStages empties the store's stage directory and removes the store's
// stages in the base; only while no commit runs (during load).
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
	s.sweepBaseStages()
	return nil
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
	src := -1 // where the xattrs come from
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
			if isWhiteout(&cst) {
				continue
			}
			if err := copyTree(in, n, out, n); err != nil {
				return err
			}
		}
		src = in
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
		src = in
	case unix.S_IFLNK:
		target, err := readlinkAt(sfd, sname)
		if err != nil {
			return err
		}
		if err := unix.Symlinkat(target, dfd, dname); err != nil {
			return err
		}
	default:
		if err := unix.Mknodat(dfd, dname, st.Mode&unix.S_IFMT|0o600, int(st.Rdev)); err != nil {
			return err
		}
		if fd, err := unix.Openat(sfd, sname, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0); err == nil {
			defer unix.Close(fd)
			src = fd
		}
	}
	return copyMeta(src, &st, dfd, dname)
}
