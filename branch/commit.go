package branch

import (
	"errors"
	"fmt"
	"log"
	"path"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// A commit moves a branch's delta into its parent: into the base directory
// itself when the parent is main, else into the parent's delta. It is all
// or nothing, on a crash and on an error alike:
//
//   - Before anything moves, it plans every step, checks what can be known
//     to stop one (preflight.go) and reserves the state log's space for
//     its records.
//   - The plan (the journal) is appended to the state log, flushed to the
//     disk first with Options.Durable.
//   - Each step is a rename. What a step replaces or removes in the target
//     moves into the stage, not away, so every step can be undone; every
//     step and its undo can also run again with the same result.
//   - If a step fails, the steps run so far are undone in reverse and the
//     journal is erased: the branch and the target are as before. If the
//     rollback fails too, the branch and the target stay read-only
//     (ErrUnfinished) until a later commit finishes or rolls it back.
//   - Once every step has happened the commit has happened, whatever
//     follows: a "done" record, and what the stage holds goes to the
//     trash. A "done" that cannot be written leaves the target read-only
//     until it is (see owedDone), so that nothing written there can meet
//     the commit again at the next mount.
//
// A mount that finds a journal without "done" finishes the commit, or, if a
// step fails again, rolls it back; if neither works the mount fails and says
// why, so that nothing can write the target in between.
// Moves are renames within one filesystem, so their cost does not depend
// on file size.

type opKind string

const (
	// opRemove moves Dst aside (a tombstone committed into main).
	opRemove opKind = "remove"
	// opReplace moves Src over Dst, moving what Dst held aside first.
	// Once Src is gone the move has happened, which makes the step
	// repeatable.
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
	// Dev and Ino, when set, are the directory the meta is for, as the
	// commit planned: another put at its name meanwhile gets none of it.
	Dev uint64 `json:"dev,omitempty"`
	Ino uint64 `json:"ino,omitempty"`
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
	Old   *dirMeta `json:"old,omitempty"` // opMeta: what a rollback puts back
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
// commit wins; the others, and their descendants, become stale. It fails
// exactly when the commit did not happen.
func (s *Store) Commit(name string) (*CommitResult, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.commitLocked(name)
}

// TryCommit is Commit as TryCreate is Create.
func (s *Store) TryCommit(name string) (*CommitResult, error) {
	if !s.mu.TryLock() {
		return nil, ErrWouldWait
	}
	defer s.mu.Unlock()
	return s.commitLocked(name)
}

// Preconditions: s.mu held exclusively.
func (s *Store) commitLocked(name string) (*CommitResult, error) {
	s.payDoneLocked()
	var settled *CommitResult
	if c := s.unfinished.Load(); c != nil {
		res, err := s.settleLocked()
		if err != nil {
			return nil, &BranchError{"commit", name, err}
		}
		if res != nil && c.j.Name == name {
			return res, nil // this commit, retried: it has happened now
		}
		settled = res
	}
	b, err := s.lookupBranch(name)
	if err != nil {
		return nil, err
	}
	if b.isMain() {
		return nil, &BranchError{"commit", name, ErrMainView}
	}
	if err := b.State().err(); err != nil {
		return nil, &BranchError{"commit", name, err}
	}
	if b.liveChildren.Load() > 0 || b.held.Load() != nil {
		return nil, &BranchError{"commit", name, ErrBusy}
	}
	p := b.parent
	target := p.view.layers[0]
	src := b.view.layers[0]
	j := &logRecord{Op: logCommit, Name: name, Parent: p.meta.Name, NewEpoch: p.epoch() + 1}
	c := &commitRun{s: s, j: j, src: newDirCache(src), target: newDirCache(target), stage: -1, reached: -1}
	defer func() {
		if s.unfinished.Load() != c {
			c.close()
		}
	}()
	if src.present() {
		// The replay of the journal needs the target's directory too.
		if err := p.view.makeTop(); err != nil {
			return nil, &BranchError{"commit", name, err}
		}
		if err := planDir(c.src, c.target, "", !p.isMain(), j); err != nil {
			return nil, &BranchError{"commit", name, err}
		}
	}
	if err := s.prepare(c); err != nil {
		c.clearStage()
		return nil, &BranchError{"commit", name, err}
	}
	at, err := s.log.append(j, s.opts.Durable)
	if err == nil {
		err = failpoint("commit-journaled")
	}
	if err == nil {
		err = c.apply()
	}
	if err != nil {
		// The record may be on the disk even when its append failed.
		return nil, &BranchError{"commit", name, s.rollbackLocked(c, at, err)}
	}
	res := s.completeLocked(c)
	if settled != nil && settled.Parent == res.Parent {
		// The kernel's caches must hear of both.
		res.Paths = append(res.Paths, settled.Paths...)
		res.Stale = append(res.Stale, settled.Stale...)
		res.Dropped = append(res.Dropped, settled.Dropped...)
	}
	return res, nil
}

// prepare does what a commit can do before its journal is written, so that
// a failure here changes nothing: it checks the steps, makes the stage and
// reserves the log's space. Preconditions: s.mu held exclusively.
func (s *Store) prepare(c *commitRun) error {
	if err := failpoint("commit-planned"); err != nil {
		return err
	}
	if err := c.preflight(); err != nil {
		return err
	}
	toBase := c.j.Parent == MainName
	c.j.Copied = toBase && s.apart
	if !c.j.Copied {
		// Tombstones and opaque markers inside a tree that moves into the
		// base hide nothing in the branch's view (the base has nothing
		// below them, or the tree's root is opaque), so they go now,
		// undone by nothing. (A copy leaves them out.)
		for _, o := range c.j.Ops {
			if o.Scrub {
				if err := c.src.l.scrub(o.Src, false); err != nil {
					return err
				}
			}
		}
		if err := c.dropBookkeeping(); err != nil {
			return err
		}
	}
	if err := s.makeStage(c); err != nil {
		return err
	}
	if err := c.copyIn(); err != nil {
		return err
	}
	if err := failpoint("commit-staged"); err != nil {
		return err
	}
	// The journal and the "done" after it are written into space that is
	// already the log's, so neither can fail for want of it.
	line, err := encodeRecord(c.j)
	if err != nil {
		return err
	}
	return s.log.reserve(int64(len(line)) + 512)
}

// copyIn copies what each step of a commit into a base apart from the
// store moves there into the stage (stage.go), flushed to the disk with
// Options.Durable.
func (c *commitRun) copyIn() error {
	if !c.j.Copied || c.stage < 0 {
		return nil
	}
	for i, o := range c.j.Ops {
		if o.Kind != opReplace {
			continue
		}
		spfd, sname, err := c.src.parent(o.Src)
		if err != nil {
			return err
		}
		if err := copyTree(spfd, sname, c.stage, copiedName(c.j.Tag, i)); err != nil {
			return err
		}
	}
	if c.s.opts.Durable {
		return unix.Syncfs(c.stage)
	}
	return nil
}

// dropBookkeeping removes what overlayfs keeps for itself (copy-up
// bookkeeping, see layer.scrub) from the files the commit moves one by one,
// so that what a kernel-path run wrote commits as the same change made
// through a view does; a tree that moves into the base is scrubbed whole,
// and one that moves into a delta takes its impure marks along. Only the
// files of an impure directory can have any. They are in no view, so this
// needs no undo.
func (c *commitRun) dropBookkeeping() error {
	impure := map[string]bool{}
	for _, o := range c.j.Ops {
		if o.Kind != opReplace {
			continue
		}
		pfd, name, err := c.src.parent(o.Src)
		if err != nil {
			return err
		}
		dir := path.Dir(o.Src)
		imp, ok := impure[dir]
		if !ok {
			_, err := unix.Getxattr(procPath(pfd), impureXattr, nil)
			imp = err == nil
			impure[dir] = imp
		}
		var st unix.Stat_t
		if !imp || unix.Fstatat(pfd, name, &st, unix.AT_SYMLINK_NOFOLLOW) != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
			continue
		}
		if err := dropOverlayXattrsAt(pfd, name); err != nil {
			return err
		}
	}
	return nil
}

// rollbackLocked undoes the steps of a commit that failed with cause and
// erases its journal (which starts at at in the log). It returns the error
// the commit reports: cause, or ErrUnfinished when the rollback failed too.
// Preconditions: s.mu held exclusively.
func (s *Store) rollbackLocked(c *commitRun, at int64, cause error) error {
	// Whatever the undo leaves, names moved in both layers, and what the
	// two views keep of their directories (layering, kept descriptors) may
	// name what moved.
	defer func() {
		for _, name := range []string{c.j.Name, c.j.Parent} {
			if b, err := s.lookupBranch(name); err == nil && b.view != nil {
				b.view.invalidate()
			}
		}
	}()
	err := c.undo()
	if err == nil {
		err = failpoint("commit-rolled-back")
	}
	if err == nil {
		if err = s.log.erase(at); err != nil {
			// Records came after the journal (a rollback retried later).
			_, err = s.log.append(&logRecord{Op: logUndone, Name: c.j.Name}, false)
		}
	}
	if err != nil {
		c.at = at
		s.unfinished.Store(c)
		log.Printf("commit %s failed (%v) and rolling it back failed too (%v): it and %s are read-only until a commit or the next mount finishes or rolls it back", c.j.Name, cause, err, c.j.Parent)
		return fmt.Errorf("%w (%v; rolling back: %v)", ErrUnfinished, cause, err)
	}
	c.clearStage()
	log.Printf("commit %s failed (%v) and was rolled back", c.j.Name, cause)
	return cause
}

// settleLocked tries again to finish, or else to roll back, a commit whose
// rollback failed. It returns the commit's result if it finished, nil if it
// rolled back. Preconditions: s.mu held exclusively.
func (s *Store) settleLocked() (*CommitResult, error) {
	c := s.unfinished.Load()
	err := c.apply()
	if err == nil {
		s.unfinished.Store(nil)
		defer c.close()
		return s.completeLocked(c), nil
	}
	if err := s.rollbackLocked(c, c.at, err); errors.Is(err, ErrUnfinished) {
		return nil, err
	}
	s.unfinished.Store(nil)
	c.close()
	return nil, nil
}

// completeLocked records a commit all of whose steps have happened.
// Nothing here makes the commit fail: it has happened. Preconditions: s.mu
// held exclusively.
func (s *Store) completeLocked(c *commitRun) *CommitResult {
	j := c.j
	b := s.branches[j.Name]
	p := b.parent
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
	s.retire(b, Committed)
	res.Dropped = s.finish(c)
	// A committed branch is only a name now.
	s.remove(b)
	s.remember(finishedInfo(&b.meta, Committed, time.Now().UTC()))
	if p.view != nil {
		p.view.invalidate()
		if p.use != nil {
			s.count(p) // the delta moved into the parent's
		}
	}
	return res
}

// markStale makes c and its live descendants stale, a sibling having
// committed first, and returns their names. Preconditions: s.mu held
// exclusively.
func (s *Store) markStale(c *branch) []string {
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
		p := JoinRel(rel, n)
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
				if err := checkHidden(sfd, n, p, &tst); err != nil {
					return err
				}
				j.Ops = append(j.Ops, op{Kind: opRemove, Dst: p})
			}
		case isWhiteout(&st):
			j.Ops = append(j.Ops, op{Kind: opReplace, Src: p, Dst: p})
		case st.Mode&unix.S_IFMT != unix.S_IFDIR:
			if targetHas && !targetIsDelta {
				if err := checkHidden(sfd, n, p, &tst); err != nil {
					return err
				}
			}
			later = append(later, op{Kind: opReplace, Src: p, Dst: p})
		default:
			opaque := src.isOpaque(p)
			targetDir := targetHas && tst.Mode&unix.S_IFMT == unix.S_IFDIR && !(targetIsDelta && isWhiteout(&tst))
			if targetDir && !opaque {
				if !targetIsDelta {
					if err := checkOrigin(sfd, n, p, &tst); err != nil {
						return err
					}
				}
				if err := planDir(srcDirs, targetDirs, p, targetIsDelta, j); err != nil {
					return err
				}
				m, err := readDirMeta(src, p, &st)
				if err != nil {
					return err
				}
				was, err := readDirMeta(target, p, &tst)
				if err != nil {
					return err
				}
				// Both for the directory planned with (origin, if
				// known, is the same one).
				m.Dev, m.Ino = tst.Dev, tst.Ino
				was.Dev, was.Ino = tst.Dev, tst.Ino
				later = append(later, op{Kind: opMeta, Dst: p, Meta: m, Old: was})
				continue
			}
			if targetHas && !targetIsDelta {
				if err := checkHidden(sfd, n, p, &tst); err != nil {
					return err
				}
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

// checkOrigin checks that the base's directory at path rel (tst, as the
// plan found it) is the one the branch's directory name in sfd was copied
// from, if that says which (originXattr).
func checkOrigin(sfd int, name, rel string, tst *unix.Stat_t) error {
	fd, err := unix.Openat(sfd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	want, err := getXattr(procPath(fd), originXattr)
	if err != nil {
		return nil // copied before origins were kept, or made by overlayfs
	}
	dev, ino, path, ok := parseOrigin(string(want))
	if !ok || path != rel {
		return nil // moved in the branch: its name says nothing of its origin
	}
	if tst.Dev != dev || tst.Ino != ino {
		return fmt.Errorf("%s: %w", rel, ErrReplaced)
	}
	return nil
}

// checkHidden checks that what the base has at name (tst, path rel), if
// a directory, is the one the branch removed there, if its directory sfd
// says which (hiddenXattr): a step that removes or replaces it moves the
// whole tree away.
func checkHidden(sfd int, name, rel string, tst *unix.Stat_t) error {
	if tst.Mode&unix.S_IFMT != unix.S_IFDIR {
		return nil
	}
	want, err := getXattr(procPath(sfd), hiddenXattr(name))
	if err != nil {
		return nil
	}
	dev, ino, path, ok := parseOrigin(string(want))
	if ok && path == rel && (tst.Dev != dev || tst.Ino != ino) {
		return fmt.Errorf("%s: %w", rel, ErrReplaced)
	}
	return nil
}

func parseOrigin(v string) (dev, ino uint64, path string, ok bool) {
	f := strings.SplitN(v, ":", 3)
	if len(f) != 3 {
		return 0, 0, "", false
	}
	dev, err1 := strconv.ParseUint(f[0], 10, 64)
	ino, err2 := strconv.ParseUint(f[1], 10, 64)
	return dev, ino, f[2], err1 == nil && err2 == nil
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

// commitRun is one commit's work: its journal and the directories it works
// in, open.
type commitRun struct {
	s           *Store
	j           *logRecord
	src, target *dirCache
	stage       int   // j.Stage, O_PATH; -1 without one
	at          int64 // where the journal starts in the log, once written
	// reached is the last step apply started: undo leaves the ones after
	// it, which cannot have happened. After a crash it is not known.
	reached int
}

func (c *commitRun) close() {
	c.src.close()
	c.target.close()
	if c.stage >= 0 {
		unix.Close(c.stage)
		c.stage = -1
	}
}

// srcAt names what step i (opReplace) moves: the delta's entry, or its
// copy in the stage.
func (c *commitRun) srcAt(i int, o op) (int, string, error) {
	if c.j.Copied && c.stage < 0 {
		return -1, "", unix.ENOENT
	}
	if c.j.Copied {
		return c.stage, copiedName(c.j.Tag, i), nil
	}
	return c.src.parent(o.Src)
}

// apply runs a journal's steps; every one may already have happened.
func (c *commitRun) apply() error {
	for i, o := range c.j.Ops {
		c.reached = max(c.reached, i)
		var err error
		switch o.Kind {
		case opRemove:
			c.target.forget(o.Dst)
			var pfd int
			var name string
			if pfd, name, err = c.target.parent(o.Dst); err == nil {
				err = c.aside(i, pfd, name)
			} else if isNotExist(err) {
				err = nil
			}
		case opReplace:
			err = c.replace(i, o)
		case opMeta:
			err = c.target.l.setDirMeta(o.Dst, o.Meta)
		default:
			err = fmt.Errorf("unknown journal step %q", o.Kind)
		}
		if err == nil {
			err = failpoint("commit-step-" + strconv.Itoa(i))
		}
		if err != nil {
			return fmt.Errorf("step %d (%s %s): %w", i, o.Kind, o.Dst, err)
		}
	}
	if err := failpoint("commit-applied"); err != nil {
		return err
	}
	// The opaque markers of trees now in the base mean nothing there.
	// Removing one needs no space; one left behind is harmless.
	for _, o := range c.j.Ops {
		if o.Scrub {
			if fd, err := c.target.l.open(o.Dst, unix.O_PATH|unix.O_NOFOLLOW|unix.O_DIRECTORY, 0); err == nil {
				unix.Removexattr(procPath(fd), opaqueXattr)
				unix.Close(fd)
			}
		}
	}
	return nil
}

// aside moves name in directory pfd of the target into the stage for step
// i; nothing there is no error. Without a stage (a journal written before
// stages existed) it goes to the trash, for good.
func (c *commitRun) aside(i int, pfd int, name string) error {
	if c.stage < 0 {
		return c.s.discardAt(pfd, name)
	}
	err := unix.Renameat2(pfd, name, c.stage, asideName(c.j.Tag, i), unix.RENAME_NOREPLACE)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	return err
}

func (c *commitRun) replace(i int, o op) error {
	spfd, sname, err := c.srcAt(i, o)
	if isNotExist(err) {
		return nil
	}
	if err != nil {
		return err
	}
	var st unix.Stat_t
	if err := unix.Fstatat(spfd, sname, &st, unix.AT_SYMLINK_NOFOLLOW); isNotExist(err) {
		return nil // moved already
	} else if err != nil {
		return err
	}
	tpfd, tname, err := c.target.parent(o.Dst)
	if err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		// A tree moves: nothing open may stay in it. (Only a directory
		// has anything open below it.)
		c.src.forget(o.Src)
		c.target.forget(o.Dst)
		if o.Opaque {
			// Set before the move, so that the rollback need not unset
			// it: it hides nothing more in the branch (Opaque is set only
			// where its parent has no directory to hide).
			if err := c.src.l.setOpaque(o.Src); err != nil {
				return err
			}
		}
	}
	// What the target held moves aside first; renaming over a file would
	// also make ext4 flush the new file's data.
	if err := c.aside(i, tpfd, tname); err != nil {
		return err
	}
	return unix.Renameat2(spfd, sname, tpfd, tname, unix.RENAME_NOREPLACE)
}

// undo reverses what apply did, in reverse order; every step it finds not
// done it leaves. Directory metadata goes back last, after the renames in
// those directories.
func (c *commitRun) undo() error {
	if err := failpoint("commit-undo"); err != nil {
		return err
	}
	for i := c.reached; i >= 0; i-- {
		o := c.j.Ops[i]
		if o.Kind == opMeta {
			continue
		}
		if err := c.undoMove(i, o); err != nil {
			return fmt.Errorf("undoing step %d (%s %s): %w", i, o.Kind, o.Dst, err)
		}
	}
	for i, o := range c.j.Ops[:c.reached+1] {
		if o.Kind == opMeta && o.Old != nil {
			if err := c.target.l.setDirMeta(o.Dst, o.Old); err != nil {
				return fmt.Errorf("undoing step %d (%s %s): %w", i, o.Kind, o.Dst, err)
			}
		}
	}
	return nil
}

func (c *commitRun) undoMove(i int, o op) error {
	if c.stage < 0 {
		return errors.New("no stage to roll back from")
	}
	tpfd, tname, err := c.target.parent(o.Dst)
	if err != nil {
		return err
	}
	c.target.forget(o.Dst)
	if o.Kind == opReplace {
		spfd, sname, err := c.srcAt(i, o)
		if err != nil {
			return err
		}
		c.src.forget(o.Src)
		var st unix.Stat_t
		if err := unix.Fstatat(spfd, sname, &st, unix.AT_SYMLINK_NOFOLLOW); isNotExist(err) {
			err = unix.Renameat2(tpfd, tname, spfd, sname, unix.RENAME_NOREPLACE)
			if err != nil && !errors.Is(err, unix.ENOENT) {
				return err
			}
		} else if err != nil {
			return err
		}
	}
	err = unix.Renameat2(c.stage, asideName(c.j.Tag, i), tpfd, tname, unix.RENAME_NOREPLACE)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	return err
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

// finish drops the branch's stale children, records that the commit is
// done, and leaves what the stage holds and what is left of the delta
// (directories that were merged into existing ones) for the trash. Nothing
// here can undo the commit: an error is logged. It returns the names of the
// branches dropped.
// Preconditions: s.mu held exclusively.
func (s *Store) finish(c *commitRun) []string {
	dropped, err := s.dropChildren(s.branches[c.j.Name], nil)
	if err != nil {
		log.Printf("commit %s: dropping its stale children: %v", c.j.Name, err)
	}
	err = s.recordDone(c.j)
	if err != nil {
		log.Printf("commit %s: recording that it is done: %v; %s stays read-only until that is recorded", c.j.Name, err, c.j.Parent)
	}
	if err == nil || c.j.StageIno == 0 {
		c.clearStage()
	} else {
		// Until the "done" is recorded, a stage in the base is how a
		// replay tells that every step happened (replayCommit).
		s.stagesLeft.Store(true)
	}
	s.trashDeltaLater(c.j.Name)
	return dropped
}

// recordDone appends the "done" of the commit journaled in j, or else
// rewrites the log as a snapshot, which has no journal left; if neither
// works the done is owed (owedDone), and the commit's parent is read-only
// until a later create, commit or abort pays it. Preconditions: s.mu held
// exclusively.
func (s *Store) recordDone(j *logRecord) error {
	err := failpoint("commit-epoch")
	if err == nil {
		_, err = s.log.append(&logRecord{Op: logDone, Name: j.Name, Finished: time.Now().UTC()}, false)
	}
	if err == nil {
		s.owedDone.Store(nil)
		return nil
	}
	serr := failpoint("commit-rewrite-log")
	if serr == nil {
		serr = s.rewriteLog()
	}
	if serr != nil {
		s.owedDone.Store(j)
		return fmt.Errorf("%v; rewriting the log: %v", err, serr)
	}
	s.owedDone.Store(nil)
	return nil
}

// replayCommit finishes a commit that a crash (or a failed rollback)
// interrupted, from its record alone, before the branches are linked; if a
// step fails it rolls the commit back. It reports whether the commit
// happened, and fails only when it could neither finish nor roll back.
func (s *Store) replayCommit(j *logRecord) (bool, error) {
	src, err := openLayer(s.deltaDir(j.Name), true)
	if isNotExist(err) {
		return true, nil // every step had happened: the delta was already trashed
	}
	if err != nil {
		return false, err
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
		return false, err
	}
	defer target.close()
	c := &commitRun{s: s, j: j, src: newDirCache(src), target: newDirCache(target), stage: -1, reached: len(j.Ops) - 1}
	defer c.close()
	switch {
	case j.Stage == "":
	case !j.Copied:
		if c.stage, err = unix.Open(j.Stage, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0); err != nil {
			return false, err
		}
	default:
		// A stage in the base is used only if it is still the one the
		// commit made: only then can what it holds, and what it lacks,
		// be trusted.
		c.stage, err = s.openBaseStage(j)
		if errors.Is(err, errForeignStage) || isNotExist(err) {
			return s.redoCommit(c, err)
		}
		if err != nil {
			return false, fmt.Errorf("its stage %s: %w", j.Stage, err)
		}
	}
	if err := c.apply(); err != nil {
		if uerr := c.undo(); uerr != nil {
			return false, fmt.Errorf("%v; rolling it back: %w", err, uerr)
		}
		log.Printf("the unfinished commit of %s failed again (%v) and was rolled back", j.Name, err)
		c.clearStage()
		return false, nil
	}
	c.clearStage()
	return true, s.trash(s.deltaDir(j.Name))
}

// redoCommit finishes commit c, journaled with a stage in the base that
// is missing or not the one it made (why), from the branch's delta, which
// such a commit leaves whole until it is done: it copies anew into a new
// stage and runs every step again. A step that had happened is done again
// with the same content. None can be rolled back, since what the steps
// that happened replaced was in the old stage: if a step fails, the mount
// fails and says why, and the next one tries again.
func (s *Store) redoCommit(c *commitRun, why error) (bool, error) {
	old := c.j.Stage
	log.Printf("the unfinished commit of %s: its stage %s is missing or not the one it made (%v); finishing the commit from the branch's delta", c.j.Name, old, why)
	err := s.makeStage(c)
	if err == nil {
		err = c.copyIn()
	}
	if err == nil {
		err = c.apply()
	}
	// What the new stage holds is either the copies, which the next try
	// makes again, or what the steps replaced, which the commit removes.
	c.clearStage()
	if err != nil {
		return false, fmt.Errorf("its stage %s is missing or not the one it made (%v), and finishing it from the branch's delta failed: %w", old, why, err)
	}
	return true, s.trash(s.deltaDir(c.j.Name))
}
