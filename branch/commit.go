package branch

import (
	"errors"
	"fmt"
	"os"
	"path"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// A commit moves a branch's delta into its parent: into the base directory
// itself when the parent is main, else into the parent's delta. It is a redo
// log: the plan is appended to the state log before anything moves (and
// flushed to the disk first with Store.Durable), every step can run again
// after a crash with the same result, and Open replays a commit that has no
// "done" record. A crash before the plan is written leaves the branch live
// and the parent untouched; after it, the commit is finished on the next
// mount. Moves are renames within one filesystem, so their cost does not
// depend on file size.

type opKind string

const (
	// opRemove deletes Dst recursively (a tombstone committed into main).
	opRemove opKind = "remove"
	// opReplace moves Src over Dst, removing what Dst held first. Once Src
	// is gone the move has happened, which makes the step repeatable.
	opReplace opKind = "replace"
	// opMeta sets a directory's mode, owner, times and xattrs.
	opMeta opKind = "meta"
)

type dirMeta struct {
	Mode   uint32            `json:"mode"`
	Uid    uint32            `json:"uid"`
	Gid    uint32            `json:"gid"`
	Atime  int64             `json:"atime_ns"`
	Mtime  int64             `json:"mtime_ns"`
	Xattrs map[string][]byte `json:"xattrs,omitempty"`
}

type op struct {
	Kind opKind `json:"kind"`
	Src  string `json:"src,omitempty"` // relative to the branch's delta
	Dst  string `json:"dst"`           // relative to the target
	// Opaque: the moved directory must hide what lies below the target.
	Opaque bool `json:"opaque,omitempty"`
	// Scrub: the moved tree lands in the base, where tombstones and opaque
	// markers mean nothing and must not stay.
	Scrub bool     `json:"scrub,omitempty"`
	Meta  *dirMeta `json:"meta,omitempty"`
}

// failpoint kills the process, as kill -9 would, at a named step.
func (s *Store) failpoint(name string) {
	if s.Failpoint != "" && s.Failpoint == name {
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {}
	}
}

// CommitResult tells what a commit changed, for cache invalidation.
type CommitResult struct {
	Parent string
	Paths  []string // top-most changed paths, relative to the parent view
	Stale  []string // siblings and their descendants that lost
	// Dropped lists the branch's own stale children, which go with it.
	Dropped []string
}

// Commit applies branch name's delta to its parent. The first sibling to
// commit wins; the others, and their descendants, become stale.
func (s *Store) Commit(name string) (*CommitResult, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, err := s.lookupBranch(name)
	if err != nil {
		return nil, err
	}
	if b.isMain() {
		return nil, &BranchError{"commit", name, ErrMainView}
	}
	switch b.State() {
	case Stale:
		return nil, &BranchError{"commit", name, ErrStale}
	case Committed, Aborted:
		return nil, &BranchError{"commit", name, ErrGone}
	}
	if b.liveChildren.Load() > 0 {
		return nil, &BranchError{"commit", name, ErrBusy}
	}
	p := b.parent
	target := p.view.layers[0]
	src := b.view.layers[0]
	j := &logRecord{Op: logCommit, Name: name, Parent: p.meta.Name, NewEpoch: p.epoch() + 1}
	srcDirs, targetDirs := newDirCache(src), newDirCache(target)
	defer srcDirs.close()
	defer targetDirs.close()
	if src.present() {
		// The replay of the journal needs the target's directory too.
		if err := p.view.makeTop(); err != nil {
			return nil, &BranchError{"commit", name, err}
		}
		if err := planDir(srcDirs, targetDirs, "", !p.isMain(), j); err != nil {
			return nil, &BranchError{"commit", name, err}
		}
	}
	s.failpoint("commit-planned")
	if err := s.log.append(j, s.Durable); err != nil {
		return nil, &BranchError{"commit", name, err}
	}
	s.failpoint("commit-journaled")
	// Decided: from here the commit completes, now or on the next mount.
	res := &CommitResult{Parent: p.meta.Name}
	for _, o := range j.Ops {
		res.Paths = append(res.Paths, o.Dst)
	}
	if p.liveChildren.Load() > 1 {
		for _, c := range p.kids { // committed siblings pile up under main: no sorting
			if c != b && c.State() == Live {
				res.Stale = append(res.Stale, s.markStale(c)...)
			}
		}
	}
	p.meta.Epoch = j.NewEpoch
	b.meta.Committed = true
	p.liveChildren.Add(-1)
	err = s.apply(j, srcDirs, targetDirs)
	s.retire(b, Committed)
	if err != nil {
		return nil, &BranchError{"commit", name, fmt.Errorf("applying the journal (the next mount finishes it): %w", err)}
	}
	if res.Dropped, err = s.finish(j); err != nil {
		return nil, &BranchError{"commit", name, err}
	}
	if p.view != nil {
		p.view.invalidate()
	}
	return res, nil
}

// markStale makes c and its live descendants stale. The caller holds s.mu.
func (s *Store) markStale(c *Branch) []string {
	out := []string{c.meta.Name}
	if c.State() == Live {
		c.parent.liveChildren.Add(-1)
	}
	c.state.Store(int32(Stale))
	for _, g := range s.children(c) {
		if g.State() == Live {
			out = append(out, s.markStale(g)...)
		}
	}
	return out
}

// planDir lists the steps that merge src's directory rel into target's.
// Tombstones go first so that a name is never briefly doubled.
func planDir(srcDirs, targetDirs *dirCache, rel string, targetIsDelta bool, j *logRecord) error {
	src, target := srcDirs.l, targetDirs.l
	sfd, err := src.open(rel, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	defer srcDirs.keep(rel, sfd)
	names, err := fdNames(sfd)
	if err != nil {
		return err
	}
	// Names are single components, so stats relative to the two
	// directories (each opened beneath its layer root) cannot escape.
	tfd, err := target.open(rel, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
	switch {
	case isNotExist(err):
		tfd = -1
	case err != nil:
		return err
	default:
		defer targetDirs.keep(rel, tfd)
	}
	var later []op
	for _, n := range names {
		p := joinRel(rel, n)
		var st, tst unix.Stat_t
		if err := unix.Fstatat(sfd, n, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return err
		}
		targetHas := false
		if tfd >= 0 {
			terr := unix.Fstatat(tfd, n, &tst, unix.AT_SYMLINK_NOFOLLOW)
			if terr != nil && !isNotExist(terr) {
				return terr
			}
			targetHas = terr == nil
		}
		switch {
		case isWhiteout(&st) && !targetIsDelta:
			if targetHas {
				j.Ops = append(j.Ops, op{Kind: opRemove, Dst: p})
			}
		case isWhiteout(&st):
			j.Ops = append(j.Ops, op{Kind: opReplace, Src: p, Dst: p})
		case st.Mode&unix.S_IFMT != unix.S_IFDIR:
			later = append(later, op{Kind: opReplace, Src: p, Dst: p})
		default:
			opaque := src.isOpaque(p)
			targetDir := targetHas && tst.Mode&unix.S_IFMT == unix.S_IFDIR && !(targetIsDelta && isWhiteout(&tst))
			if targetDir && !opaque {
				if err := planDir(srcDirs, targetDirs, p, targetIsDelta, j); err != nil {
					return err
				}
				m, err := readDirMeta(src, p, &st)
				if err != nil {
					return err
				}
				later = append(later, op{Kind: opMeta, Dst: p, Meta: m})
				continue
			}
			later = append(later, op{
				Kind: opReplace, Src: p, Dst: p,
				Opaque: targetIsDelta && (opaque || targetHas),
				Scrub:  !targetIsDelta,
			})
		}
	}
	j.Ops = append(j.Ops, later...)
	return nil
}

func readDirMeta(l *layer, rel string, st *unix.Stat_t) (*dirMeta, error) {
	m := &dirMeta{Mode: st.Mode & 07777, Uid: st.Uid, Gid: st.Gid, Atime: st.Atim.Nano(), Mtime: st.Mtim.Nano()}
	fd, err := l.open(rel, unix.O_PATH|unix.O_NOFOLLOW|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	names, _ := listXattrs(procPath(fd))
	for _, n := range names {
		if IsInternalXattr(n) {
			continue
		}
		if v, err := getXattr(procPath(fd), n); err == nil {
			if m.Xattrs == nil {
				m.Xattrs = map[string][]byte{}
			}
			m.Xattrs[n] = v
		}
	}
	return m, nil
}

// apply runs a journal's steps; every one may already have happened.
func (s *Store) apply(j *logRecord, src, target *dirCache) error {
	for i, o := range j.Ops {
		var err error
		switch o.Kind {
		case opRemove:
			target.forget(o.Dst)
			err = s.discard(target.l, o.Dst)
		case opReplace:
			err = s.replace(src, target, o)
		case opMeta:
			err = target.l.setDirMeta(o.Dst, o.Meta)
		default:
			err = fmt.Errorf("unknown journal step %q", o.Kind)
		}
		if err != nil {
			return fmt.Errorf("step %d (%s %s): %w", i, o.Kind, o.Dst, err)
		}
		s.failpoint("commit-step-" + strconv.Itoa(i))
	}
	s.failpoint("commit-applied")
	return nil
}

func (s *Store) replace(src, target *dirCache, o op) error {
	spfd, sname, err := src.parent(o.Src)
	if err != nil && !isNotExist(err) {
		return err
	}
	if err == nil {
		var st unix.Stat_t
		if err := unix.Fstatat(spfd, sname, &st, unix.AT_SYMLINK_NOFOLLOW); err == nil {
			tpfd, tname, err := target.parent(o.Dst)
			if err != nil {
				return err
			}
			if st.Mode&unix.S_IFMT == unix.S_IFDIR {
				// A tree moves: nothing open may stay in it. (Only a
				// directory has anything open below it.)
				src.forget(o.Src)
				target.forget(o.Dst)
			}
			// What the target held goes to the trash first: renaming over
			// a file would make ext4 flush the new file's data.
			err = s.discardAt(tpfd, tname)
			if err == nil {
				err = unix.Renameat(spfd, sname, tpfd, tname)
			}
			if err != nil {
				return err
			}
		} else if !isNotExist(err) {
			return err
		}
	}
	if o.Opaque {
		return target.l.setOpaque(o.Dst)
	}
	if o.Scrub {
		return target.l.scrub(o.Dst)
	}
	return nil
}

// dirCache keeps the directories one commit works in open from planning to
// its last step, so that each is opened once. A commit is a few dozen
// system calls, and right after the machine idled each costs tens of µs.
type dirCache struct {
	l   *layer
	fds map[string]int // by path relative to the layer root
}

// dirCacheMax bounds the descriptors one commit holds.
const dirCacheMax = 256

func newDirCache(l *layer) *dirCache { return &dirCache{l: l, fds: map[string]int{}} }

// keep takes fd, a directory open at rel. When full it closes another one:
// steps come directory by directory, so any will do.
func (c *dirCache) keep(rel string, fd int) {
	if old, ok := c.fds[rel]; ok {
		unix.Close(old)
	} else if len(c.fds) >= dirCacheMax {
		for p, fd := range c.fds {
			unix.Close(fd)
			delete(c.fds, p)
			break
		}
	}
	c.fds[rel] = fd
}

// parent is layer.parent; the cache owns the descriptor.
func (c *dirCache) parent(rel string) (int, string, error) {
	dir, name := path.Split(rel)
	dir = strings.TrimSuffix(dir, "/")
	if fd, ok := c.fds[dir]; ok {
		return fd, name, nil
	}
	fd, err := c.l.open(dir, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return -1, name, err
	}
	c.keep(dir, fd)
	return fd, name, nil
}

// forget closes what is open at or below rel, which is about to move.
func (c *dirCache) forget(rel string) {
	for p, fd := range c.fds {
		if p == rel || strings.HasPrefix(p, rel+"/") {
			unix.Close(fd)
			delete(c.fds, p)
		}
	}
}

func (c *dirCache) close() {
	for p, fd := range c.fds {
		unix.Close(fd)
		delete(c.fds, p)
	}
}

// removeAll deletes rel and everything below it, beneath the layer root.
func (l *layer) removeAll(rel string) error {
	pfd, name, err := l.parent(rel)
	if isNotExist(err) {
		return nil
	}
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	return removeAt(pfd, name)
}

func removeAt(pfd int, name string) error {
	err := unix.Unlinkat(pfd, name, 0)
	if err == nil || errors.Is(err, unix.ENOENT) {
		return nil
	}
	if !errors.Is(err, unix.EISDIR) && !errors.Is(err, unix.EPERM) {
		return err
	}
	fd, err := unix.Openat(pfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	names, err := fdNames(fd)
	if err == nil {
		for _, n := range names {
			if err = removeAt(fd, n); err != nil {
				break
			}
		}
	}
	unix.Close(fd)
	if err != nil {
		return err
	}
	if err := unix.Unlinkat(pfd, name, unix.AT_REMOVEDIR); err != nil && !errors.Is(err, unix.ENOENT) {
		return err
	}
	return nil
}

// scrub removes tombstones and opaque markers from a tree moved into the
// base, where nothing lies below to hide.
func (l *layer) scrub(rel string) error {
	st, err := l.lstat(rel)
	if isNotExist(err) || err == nil && st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return nil
	}
	if err != nil {
		return err
	}
	fd, err := l.open(rel, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.Removexattr(procPath(fd), opaqueXattr); err != nil && !errors.Is(err, unix.ENODATA) {
		return err
	}
	ents, err := l.readDirTyped(rel)
	if err != nil {
		return err
	}
	for _, d := range ents {
		switch d.Type {
		case syscall.DT_CHR:
			var cst unix.Stat_t
			if unix.Fstatat(fd, d.Name, &cst, unix.AT_SYMLINK_NOFOLLOW) == nil && isWhiteout(&cst) {
				if err := unix.Unlinkat(fd, d.Name, 0); err != nil {
					return err
				}
			}
		case syscall.DT_DIR:
			if err := l.scrub(joinRel(rel, d.Name)); err != nil {
				return err
			}
		}
	}
	return nil
}

func (l *layer) setDirMeta(rel string, m *dirMeta) error {
	pfd, name, err := l.parent(rel)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	if name == "" {
		name = "."
	}
	if err := unix.Fchownat(pfd, name, int(m.Uid), int(m.Gid), unix.AT_SYMLINK_NOFOLLOW); err != nil && !errors.Is(err, unix.EPERM) {
		return err
	}
	if err := chmodAt(pfd, name, m.Mode); err != nil {
		return err
	}
	fd, err := unix.Openat(pfd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	old, _ := listXattrs(procPath(fd))
	for _, n := range old {
		if _, keep := m.Xattrs[n]; !keep && !IsInternalXattr(n) {
			unix.Removexattr(procPath(fd), n)
		}
	}
	for n, v := range m.Xattrs {
		if err := unix.Setxattr(procPath(fd), n, v, 0); err != nil {
			return err
		}
	}
	ts := []unix.Timespec{unix.NsecToTimespec(m.Atime), unix.NsecToTimespec(m.Mtime)}
	return unix.UtimesNanoAt(pfd, name, ts, unix.AT_SYMLINK_NOFOLLOW)
}

// finish drops the branch's stale children, records that the commit is
// done, and leaves what is left of the delta (directories that were merged
// into existing ones) for the trash. Each step may be repeated. It returns
// the names of the branches dropped.
func (s *Store) finish(j *logRecord) ([]string, error) {
	var dropped []string
	if b := s.branches[j.Name]; b != nil {
		var err error
		if dropped, err = s.dropChildren(b, nil); err != nil {
			return dropped, err
		}
	}
	s.failpoint("commit-epoch")
	if err := s.log.append(&logRecord{Op: logDone, Name: j.Name}, false); err != nil {
		return dropped, err
	}
	s.trashDeltaLater(j.Name)
	return dropped, nil
}

// replayCommit finishes a commit that a crash interrupted, from its record
// alone, before the branches are linked.
func (s *Store) replayCommit(j *logRecord) error {
	src, err := openLayer(s.deltaDir(j.Name), true)
	if isNotExist(err) {
		return nil // every step had happened: the delta was already trashed
	}
	if err != nil {
		return err
	}
	defer src.close()
	targetDir := s.meta.Base
	if j.Parent != MainName {
		targetDir = s.deltaDir(j.Parent)
	}
	target, err := openLayer(targetDir, j.Parent != MainName)
	if isNotExist(err) && j.Parent != MainName {
		// Made before the journal record, but lost with it unflushed.
		var root unix.Stat_t
		if err = unix.Fstat(s.base.fd(), &root); err == nil {
			target = absentLayer(targetDir, s.base.dev)
			err = target.make(s.tmpName(), &root)
		}
	}
	if err != nil {
		return err
	}
	defer target.close()
	srcDirs, targetDirs := newDirCache(src), newDirCache(target)
	defer srcDirs.close()
	defer targetDirs.close()
	if err := s.apply(j, srcDirs, targetDirs); err != nil {
		return err
	}
	return s.trash(s.deltaDir(j.Name))
}

// names lists every name in a layer directory, tombstones included.
func (l *layer) names(rel string) ([]string, error) {
	fd, err := l.open(rel, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	return fdNames(fd)
}

func fdNames(fd int) ([]string, error) {
	var names []string
	err := getdents(fd, func(d *unix.Dirent, name string) { names = append(names, name) })
	return names, err
}

// readDirTyped lists a layer directory with entry types, tombstones included.
func (l *layer) readDirTyped(rel string) ([]DirEntry, error) {
	return l.readDirMerge(rel, 0, nil, nil, nil, false)
}

// Diff describes what a branch changed relative to its parent.
type Diff struct {
	Branch   string   `json:"branch"`
	Parent   string   `json:"parent"`
	Added    []string `json:"added"`
	Modified []string `json:"modified"`
	Deleted  []string `json:"deleted"`
}

// Diff lists the paths a live or stale branch added, changed and deleted.
func (s *Store) Diff(name string) (*Diff, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	b, err := s.lookupBranch(name)
	if err != nil {
		return nil, err
	}
	if b.isMain() {
		return nil, &BranchError{"diff", name, ErrMainView}
	}
	if b.view == nil {
		return nil, &BranchError{"diff", name, ErrGone}
	}
	d := &Diff{Branch: name, Parent: b.parent.meta.Name, Added: []string{}, Modified: []string{}, Deleted: []string{}}
	if !b.view.layers[0].present() {
		return d, nil
	}
	err = diffDir(b.view.layers[0], b.parent.view, "", d)
	return d, err
}

func diffDir(src *layer, parent *View, rel string, d *Diff) error {
	names, err := src.names(rel)
	if err != nil {
		return err
	}
	for _, n := range names {
		p := joinRel(rel, n)
		st, err := src.lstat(p)
		if err != nil {
			return err
		}
		pe, perr := parent.Lookup(p)
		switch {
		case isWhiteout(&st):
			if perr == nil {
				d.Deleted = append(d.Deleted, p)
			}
		case perr != nil:
			d.Added = append(d.Added, p+suffix(&st))
			if st.Mode&unix.S_IFMT == unix.S_IFDIR {
				if err := diffDir(src, parent, p, d); err != nil {
					return err
				}
			}
		case st.Mode&unix.S_IFMT == unix.S_IFDIR:
			if !pe.IsDir() || src.isOpaque(p) || dirMetaChanged(src, parent, p, &st, pe) {
				d.Modified = append(d.Modified, p+"/")
			}
			if err := diffDir(src, parent, p, d); err != nil {
				return err
			}
		default:
			d.Modified = append(d.Modified, p)
		}
	}
	return nil
}

// dirMetaChanged reports whether the commit's meta step for directory p
// changes what the parent shows: its mode, owner or xattrs. (Its times
// change with every entry added or removed, and say nothing more.)
func dirMetaChanged(src *layer, parent *View, p string, st *unix.Stat_t, pe *Entry) bool {
	if st.Mode&07777 != pe.Stat.Mode&07777 || st.Uid != pe.Stat.Uid || st.Gid != pe.Stat.Gid {
		return true
	}
	m, err := readDirMeta(src, p, st)
	if err != nil {
		return false
	}
	names, err := parent.ListXattr(p)
	if err != nil || len(names) != len(m.Xattrs) {
		return err == nil
	}
	for _, n := range names {
		v, ok := m.Xattrs[n]
		if !ok {
			return true
		}
		sz, err := parent.GetXattr(p, n, nil)
		if err != nil {
			return true
		}
		buf := make([]byte, sz)
		if sz, err = parent.GetXattr(p, n, buf); err != nil || string(buf[:sz]) != string(v) {
			return true
		}
	}
	return false
}

func suffix(st *unix.Stat_t) string {
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return "/"
	}
	return ""
}
