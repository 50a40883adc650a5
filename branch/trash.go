package branch

import (
	"errors"
	"path/filepath"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// trash moves a directory out of the way atomically; it is removed later.
func (s *Store) trash(dir string) error {
	err := unix.Rename(dir, s.trashName())
	if err != nil && !errors.Is(err, unix.ENOENT) {
		return err
	}
	s.emptyTrashLater()
	return nil
}

// trashDeltaLater moves the delta of a branch whose commit or abort is
// already in the journal to the trash after the reply, with the emptying
// of the trash. Until then it is only in the way of a new branch of the
// same name (Create moves it first), and after a crash load trashes a
// delta that outlived its branch. Preconditions: s.mu held exclusively.
func (s *Store) trashDeltaLater(name string) {
	s.leftovers = append(s.leftovers, name)
	s.emptyTrashLater()
}

// trashLeftovers moves every delta trashDeltaLater was given to the trash.
// One that cannot move stays where it is, for load. Preconditions: s.mu
// held exclusively.
func (s *Store) trashLeftovers() {
	for _, name := range s.leftovers {
		s.trash(s.deltaDir(name))
		s.trashBranchData(name)
	}
	s.leftovers = nil
}

// tmpName is a fresh name in STORE/tmp, which Open empties.
func (s *Store) tmpName() string { return s.freshName("tmp") }

func (s *Store) trashName() string { return s.freshName("trash") }

func (s *Store) freshName(sub string) string {
	return filepath.Join(s.dir, sub, strconv.FormatUint(s.trashSeq.Add(1), 36)+"-"+strconv.FormatInt(time.Now().UnixNano(), 36))
}

// discardAt moves name in directory pfd (on the store's filesystem) into
// the trash: one rename, whatever its size. Freeing its blocks happens in
// the background.
func (s *Store) discardAt(pfd int, name string) error {
	err := unix.Renameat(pfd, name, unix.AT_FDCWD, s.trashName())
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if errors.Is(err, unix.EXDEV) {
		return removeAt(pfd, name)
	}
	return err
}

// trashDelay keeps the freeing of a commit's or abort's leftovers off the
// disk and CPU while that operation, and the next of a burst, runs.
const trashDelay = 20 * time.Millisecond

// emptyTrashLater starts one background removal of the trash's contents.
func (s *Store) emptyTrashLater() {
	if s.emptying.CompareAndSwap(false, true) {
		time.AfterFunc(trashDelay, s.emptyTrash)
	}
}

func (s *Store) emptyTrash() {
	// Again while more arrives, a few times: an entry that cannot be
	// removed must not keep it spinning. The store's lock only when
	// nothing holds it: waiting for it, this background job would hold up
	// every view operation that comes after it (Go's RWMutex lets no
	// reader past a waiting writer) for as long as the longest one in
	// flight, a copy-up of a large file, say.
	swept := false
	for pass := 0; pass < 3; pass++ {
		if s.mu.TryLock() {
			s.trashLeftovers()
			if !swept && s.stagesLeft.Load() && !s.closed {
				s.sweepBaseStages()
			}
			swept = true
			s.mu.Unlock()
		}
		if emptyDir(filepath.Join(s.dir, "trash")) == 0 {
			break
		}
	}
	s.emptying.Store(false)
	more := true // unknown while the lock is held: look again later
	if s.mu.TryLock() {
		more = len(s.leftovers) > 0
		s.mu.Unlock()
	}
	if more {
		s.emptyTrashLater()
	}
}
