// Package branch holds the semantics of branchfs: the on-disk store of
// branches, the layered lookup through a branch's ancestors, copy-up,
// tombstones, epochs and the crash-safe commit journal. It imports no FUSE
// package, so tools that only need branches (commit, diff, run) can use it
// directly.
//
// Store layout:
//
//	STORE/branchfs.json        format version and base path
//	STORE/lock                 flock held by the daemon that owns the store
//	STORE/log                  the state log: branches, epochs, commit journal
//	STORE/deltas/NAME/         files the branch changed; tombstones; opaque dirs
//	                           (made at the branch's first write)
//	STORE/branches/NAME/       reserved for per-branch data such as
//	                           checkpointed process memory (images/)
//	STORE/tmp/, STORE/trash/   staging for creation and deletion
//	STORE/stage/               commits' stages (stage.go)
//	STORE/base-stages/NAME     a stage this store made in the base (stage.go)
//
// Locking. The lock tree, outermost first: a lock is taken only while
// holding none or only locks above it on its path, and internal/lockcheck
// checks that in race-enabled builds.
//
//	Store.mu
//	  layer.mu       making a branch's delta directory at its first write
//	  View.cacheMu   a view's cache of directory layering
//	  dirFds.mu      a delta layer's kept directory descriptors
//	  Store.quotaMu  what deltas use (quota.go), across the system call of
//	                 a change it charges
//
// Every view operation holds Store.mu shared, from its first lookup to its
// last change (View.Lock, LockRoot), and so does every change to an open
// File's data (File.lockWritable); create, commit, abort, hold, release and
// close hold it exclusively, so that no operation sees half of a commit.
// The locks below it are leaves: nothing is taken under them. The server's
// locks that nest around or inside Store.mu are drawn where they live, in
// packages fs and fs/transport.
//
// No goroutine takes Store.mu while it holds it, shared or not: Go's
// RWMutex lets no reader past a waiting writer, and the writer waits for
// the first hold, so a second would wait for ever. Methods named ...Locked,
// and those whose "Preconditions:" say so, expect the caller to hold
// Store.mu and never take it. Background work (emptying the trash) takes it
// only when it is free (TryLock): waiting, it would hold up every operation
// behind the longest one in flight. Nothing walks a tree under it that it
// need not: List counts deltas after releasing it.
package branch

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/branchfs/branchfs/internal/lockcheck"
	"github.com/branchfs/branchfs/internal/safedir"
	"github.com/google/renameio/v2"
	"golang.org/x/sys/unix"
)

// State of a branch.
type State int32

const (
	Live State = iota
	Stale
	Committed
	Aborted
)

func (s State) String() string {
	switch s {
	case Live:
		return "live"
	case Stale:
		return "stale"
	case Committed:
		return "committed"
	}
	return "aborted"
}

// err is what using a branch in state s fails with: nothing while it is
// live, ErrStale once a sibling committed first, ErrGone once it ended.
func (s State) err() error {
	switch s {
	case Live:
		return nil
	case Stale:
		return ErrStale
	}
	return ErrGone
}

// formatVersion 3 marks tombstones and opaque directories as overlayfs
// does (layer.go); Open converts a store of format 1 or 2 (markers.go).
const formatVersion = 3

type storeMeta struct {
	Version int    `json:"version"`
	Base    string `json:"base"`
}

type branchMeta struct {
	Name        string
	Parent      string
	ParentEpoch uint64 // the parent's epoch when this branch was made
	Epoch       uint64 // commits received from children
	Committed   bool
	Created     time.Time
	MaxStorage  int64 // the delta's own storage limit in bytes; 0: none (quota.go)
}

// branch is one node of the branch tree; main is the root and shows the base.
type branch struct {
	meta         branchMeta
	parent       *branch
	kids         map[string]*branch // children in any state; changed under Store.mu
	state        atomic.Int32
	liveChildren atomic.Int32
	view         *View
	// held is the work directory of the kernel-path run that holds the
	// branch (hold.go), nil when none does; changed under Store.mu.
	held atomic.Pointer[string]
	// use is the count of the delta, nil unless a storage limit counts
	// it (quota.go); set under Store.mu held exclusively and quotaMu.
	use *usage
}

func (b *branch) Name() string  { return b.meta.Name }
func (b *branch) State() State  { return State(b.state.Load()) }
func (b *branch) isMain() bool  { return b.parent == nil }
func (b *branch) epoch() uint64 { return b.meta.Epoch }

// Store owns the branches of one mount.
type Store struct {
	// mu is held shared by every view operation and exclusively by create,
	// commit and abort, so that no operation sees half of a commit and a
	// child never starts from half of a parent's write.
	mu       lockcheck.RWMutex[lockcheck.Store]
	dir      string
	lockFile *os.File
	meta     storeMeta
	log      *stateLog
	base     *layer
	baseIno  uint64 // inode number of the base root, which every view root reports
	main     *branch
	branches map[string]*branch // every branch but main, including committed ones
	devs     map[uint64]uint64  // device number -> small index for inode identity
	nextView atomic.Uint64
	trashSeq atomic.Uint64
	emptying atomic.Bool
	autoName int // the last generated name's number (freeName)
	// history holds the latest branches that finished (were committed or
	// aborted), newest last, for List; at most historyMax. Changed under mu.
	history []Info
	// compactAt is the log size past which it is rewritten as a snapshot
	// (compactLocked).
	compactAt int64
	// leftovers names finished branches whose deltas still wait for the
	// trash (see trashDeltaLater); changed under mu.
	leftovers []string
	// unfinished is a commit that failed and could not roll back (see
	// commit.go); changed under mu, read by CheckWritable.
	unfinished atomic.Pointer[commitRun]
	// apart: the store is on another mount than the base, so commits into
	// the base copy (stage.go).
	apart bool
	// owedDone is the journal of a commit that happened but whose "done"
	// could not be recorded (Store.recordDone); changed under mu.
	owedDone atomic.Pointer[logRecord]
	// stagesLeft: a stage in the base may wait for removal
	// (sweepBaseStages).
	stagesLeft atomic.Bool
	// closed: Close has begun; changed under mu.
	closed bool

	// quotaMu guards the counts of deltas (branch.use's contents and
	// used), across the change each counts (quota.go); a leaf.
	quotaMu lockcheck.Mutex[lockcheck.Quota]
	used    int64 // what the counted deltas hold together
	block   int64 // the store filesystem's block, to which sizes round up

	opts Options
	// noMarkers says why the store cannot hold tombstones (checkMarkers).
	noMarkers error
}

// Options are how a store behaves for the mount that opens it.
type Options struct {
	// Durable flushes a commit's journal record to the disk before the
	// commit moves anything. Without it a commit is all-or-nothing across
	// crashes of the daemon (the record is in the page cache, which
	// outlives the process) but not across power loss.
	Durable bool
	// MaxBranches, when above zero, limits how many branches may be live
	// or stale at once; Create fails with ErrTooMany beyond it.
	MaxBranches int
	// MaxStorage, when above zero, limits what all branches' deltas hold
	// together, in bytes (quota.go); changes beyond it fail with ErrQuota.
	MaxStorage int64
}

// Open opens (creating if needed) the store in dir for the base directory
// base, finishing any commit a crash interrupted.
func Open(dir, base string, o Options) (*Store, error) {
	base, err := filepath.Abs(base)
	if err != nil {
		return nil, err
	}
	if dir, err = filepath.Abs(dir); err != nil {
		return nil, err
	}
	if fi, err := os.Stat(base); err != nil {
		return nil, fmt.Errorf("base: %w", err)
	} else if !fi.IsDir() {
		return nil, fmt.Errorf("base %s is not a directory", base)
	}
	if dir, err = MakeStoreDir(dir); err != nil {
		return nil, err
	}
	for _, sub := range []string{"deltas", "tmp", "trash", "stage", "base-stages"} {
		if _, err := safedir.Make(filepath.Join(dir, sub)); err != nil {
			return nil, fmt.Errorf("store %s: %w", dir, err)
		}
	}
	s := &Store{dir: dir, opts: o, branches: map[string]*branch{}, devs: map[uint64]uint64{}}
	if err := s.lock(); err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			s.Close()
		}
	}()
	if err := s.loadMeta(base); err != nil {
		return nil, err
	}
	if s.base, err = openLayer(base, false); err != nil {
		return nil, err
	}
	s.devIndex(s.base.dev)
	var sst unix.Stat_t
	if err := unix.Fstat(s.base.fd(), &sst); err != nil {
		return nil, err
	}
	s.baseIno = sst.Ino
	storeMnt, err := MountID(dir)
	if err != nil {
		return nil, err
	}
	baseMnt, err := MountID(base)
	if err != nil {
		return nil, err
	}
	s.apart = storeMnt != baseMnt
	var sfs unix.Statfs_t
	if err := unix.Statfs(filepath.Join(dir, "deltas"), &sfs); err != nil {
		return nil, err
	}
	s.block = max(sfs.Bsize, 512)
	// Leftovers of creations and deletions a crash interrupted.
	emptyDir(filepath.Join(dir, "tmp"))
	if err := s.checkMarkers(); err != nil {
		return nil, err
	}
	if s.meta.Version != formatVersion {
		if err := s.upgradeMarkers(); err != nil {
			return nil, err
		}
	}
	if err := s.load(); err != nil {
		return nil, err
	}
	s.emptyTrashLater()
	ok = true
	return s, nil
}

// MakeStoreDir makes the store directory dir, mode 0700, if it is missing,
// and returns it with its symbolic links resolved. It fails if someone
// other than root and this user could change it, or any directory above
// it (safedir): they could swap in a delta of their own, whose tombstones
// and files a commit would apply to the base. The error names the
// directory and says why.
func MakeStoreDir(dir string) (string, error) {
	real, err := safedir.Make(dir)
	var e *safedir.Error
	if errors.As(err, &e) && (e.Path == dir || e.Path == real) {
		return "", fmt.Errorf("store %w", err)
	}
	if err != nil {
		return "", fmt.Errorf("store %s: %w", dir, err)
	}
	return real, nil
}

// emptyDir removes what dir holds and says how many entries it found.
func emptyDir(dir string) int {
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		removeTree(filepath.Join(dir, e.Name()))
	}
	return len(ents)
}

func (s *Store) lock() error {
	f, err := os.OpenFile(filepath.Join(s.dir, "lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		return fmt.Errorf("store %s is in use by another branchfs daemon", s.dir)
	}
	s.lockFile = f
	return nil
}

func (s *Store) loadMeta(base string) error {
	p := filepath.Join(s.dir, "branchfs.json")
	data, err := os.ReadFile(p)
	if errors.Is(err, os.ErrNotExist) {
		s.meta = storeMeta{Version: formatVersion, Base: base}
		return s.writeMeta()
	}
	if err != nil {
		return err
	}
	if err := json.Unmarshal(data, &s.meta); err != nil {
		return fmt.Errorf("%s: %w", p, err)
	}
	if s.meta.Version < 1 || s.meta.Version > formatVersion {
		return fmt.Errorf("%s: unsupported format version %d", p, s.meta.Version)
	}
	if s.meta.Base != base {
		return fmt.Errorf("store %s belongs to base %s, not %s", s.dir, s.meta.Base, base)
	}
	return nil
}

func (s *Store) writeMeta() error {
	data, _ := json.MarshalIndent(&s.meta, "", "  ")
	return renameio.WriteFile(filepath.Join(s.dir, "branchfs.json"), append(data, '\n'), 0o600)
}

func (s *Store) logPath() string             { return filepath.Join(s.dir, "log") }
func (s *Store) deltaDir(name string) string { return filepath.Join(s.dir, "deltas", name) }

// Close releases the store lock and layer descriptors. Its error is the
// state log's or the lock file's close failing.
func (s *Store) Close() error {
	s.mu.Lock()
	s.trashLeftovers()
	s.closed = true
	s.mu.Unlock()
	for _, b := range s.branches {
		if b.view != nil {
			b.view.layers[0].close()
		}
	}
	if s.base != nil {
		s.base.close()
	}
	var errs []error
	if s.log != nil {
		errs = append(errs, s.log.close())
	}
	if s.lockFile != nil {
		errs = append(errs, s.lockFile.Close())
	}
	return errors.Join(errs...)
}

// Dir is the store directory.
func (s *Store) Dir() string { return s.dir }

// Base is the base directory.
func (s *Store) Base() string { return s.meta.Base }

// Main is the view of the base.
func (s *Store) Main() *View { return s.main.view }

// View returns the view of a live or stale branch.
func (s *Store) View(name string) (*View, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	b, err := s.lookupBranch(name)
	if err != nil {
		return nil, err
	}
	if b.view == nil {
		return nil, &BranchError{"open", name, ErrGone}
	}
	return b.view, nil
}

// lookupBranch finds branch name, main included, in any state.
// Preconditions: s.mu held.
func (s *Store) lookupBranch(name string) (*branch, error) {
	if name == MainName {
		return s.main, nil
	}
	b := s.branches[name]
	if b == nil {
		return nil, &BranchError{"find", name, ErrNotFound}
	}
	return b, nil
}
