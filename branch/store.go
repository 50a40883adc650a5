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
// Locking. The lock order, outermost first; a lock is taken only while
// holding locks above it, and internal/lockcheck checks that in
// race-enabled builds:
//
//	Store.mu
//	  layer.mu       making a branch's delta directory at its first write
//	  View.cacheMu   a view's cache of directory layering
//	  dirFds.mu      a delta layer's kept directory descriptors
//
// Every view operation holds Store.mu shared, from its first lookup to its
// last change (View.Lock, LockRoot), and so does every change to an open
// File's data (File.lockWritable); create, commit, abort, hold, release and
// close hold it exclusively, so that no operation sees half of a commit.
// The locks below it are leaves: nothing is taken under them. Package fs
// nests locks of its own inside Store.mu (see its documentation).
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
	"slices"
	"sort"
	"strconv"
	"strings"
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

// load replays the state log, finishes a commit that a crash interrupted,
// drops what a crash left half made, and writes the log anew.
func (s *Store) load() error {
	recs, err := readLog(s.logPath())
	if err != nil {
		return err
	}
	s.main = &branch{meta: branchMeta{Name: MainName}}
	var pending *logRecord
	for i := range recs {
		r := &recs[i]
		switch r.Op {
		case logBranch:
			if r.Name == MainName {
				s.main.meta.Epoch = r.Epoch
				continue
			}
			s.branches[r.Name] = &branch{meta: branchMeta{Name: r.Name, Parent: r.Parent,
				ParentEpoch: r.ParentEpoch, Epoch: r.Epoch, Committed: r.Committed, Created: r.Created,
				MaxStorage: r.MaxStorage}}
		case logCreate:
			s.branches[r.Name] = &branch{meta: branchMeta{Name: r.Name, Parent: r.Parent,
				ParentEpoch: r.ParentEpoch, Created: r.Created, MaxStorage: r.MaxStorage}}
		case logLimit:
			if b := s.branches[r.Name]; b != nil {
				b.meta.MaxStorage = r.MaxStorage
			}
		case logAbort:
			if b := s.branches[r.Name]; b != nil {
				s.remember(finishedInfo(&b.meta, Aborted, r.Finished))
			}
			delete(s.branches, r.Name)
		case logCommit:
			pending = r
		case logUndone:
			pending = nil
		case logDone:
			if pending != nil {
				s.committed(pending, r.Finished)
			}
			pending = nil
		case logFinished:
			st := Aborted
			if r.Committed {
				st = Committed
			}
			s.remember(Info{Name: r.Name, Parent: r.Parent, State: st.String(), Epoch: r.Epoch, Created: r.Created, Finished: r.Finished})
		}
	}
	if pending != nil {
		done, err := s.replayCommit(pending)
		if err != nil {
			return fmt.Errorf("the commit of %s was interrupted and can neither finish nor roll back; fix the cause and mount again: %w", pending.Name, err)
		}
		if done {
			s.committed(pending, time.Now().UTC())
		}
	}
	// What commits that finished, rolled back or never started left.
	if err := s.clearStages(); err != nil {
		return err
	}
	// A committed branch is only a name now; its stale children went with
	// it (below, as orphans).
	for name, b := range s.branches {
		if b.meta.Committed {
			delete(s.branches, name)
		}
	}
	s.noteNames(recs)
	// A branch whose parent is gone was being aborted (aborts drop
	// children first, but a crash may stop one anywhere).
	for changed := true; changed; {
		changed = false
		for name, b := range s.branches {
			if b.meta.Parent != MainName && s.branches[b.meta.Parent] == nil {
				delete(s.branches, name)
				changed = true
			}
		}
	}
	// A delta with no branch was being created.
	ents, err := os.ReadDir(filepath.Join(s.dir, "deltas"))
	if err != nil {
		return err
	}
	for _, e := range ents {
		if b := s.branches[e.Name()]; b == nil || b.meta.Committed {
			if err := s.trash(s.deltaDir(e.Name())); err != nil {
				return err
			}
		}
	}
	if err := s.link(); err != nil {
		return err
	}
	if err := s.rewriteLog(); err != nil {
		return err
	}
	s.main.view = s.newView(s.main, []*layer{s.base})
	for _, n := range s.sortedNames() {
		if b := s.branches[n]; b.State() != Committed {
			if err := s.openView(b); err != nil {
				return err
			}
			s.count(b)
		}
	}
	return nil
}

// payDoneLocked records the "done" a commit owes, if any (recordDone).
// Preconditions: s.mu held exclusively.
func (s *Store) payDoneLocked() {
	if j := s.owedDone.Load(); j != nil {
		s.recordDone(j)
	}
}

// committed records in the branches read from the log that the commit
// journaled in r has happened, at t.
// Preconditions: during load, before the store is shared.
func (s *Store) committed(r *logRecord, t time.Time) {
	if b := s.branches[r.Name]; b != nil {
		b.meta.Committed = true
		s.remember(finishedInfo(&b.meta, Committed, t))
	}
	if r.Parent == MainName {
		s.main.meta.Epoch = r.NewEpoch
	} else if p := s.branches[r.Parent]; p != nil {
		p.meta.Epoch = r.NewEpoch
	}
}

// link connects every branch to its parent and derives its state: a branch
// is stale when its parent moved on since it was made, or is not live.
// Preconditions: during load, before the store is shared.
func (s *Store) link() error {
	var resolve func(b *branch) error
	resolve = func(b *branch) error {
		if b.parent != nil {
			return nil
		}
		p := s.main
		if b.meta.Parent != MainName {
			p = s.branches[b.meta.Parent]
			if p == nil {
				return fmt.Errorf("branch %s: parent %s is missing", b.meta.Name, b.meta.Parent)
			}
			if err := resolve(p); err != nil {
				return err
			}
		}
		s.adopt(p, b)
		switch {
		case b.meta.Committed:
			b.state.Store(int32(Committed))
		case p.State() != Live || p.epoch() != b.meta.ParentEpoch:
			b.state.Store(int32(Stale))
		default:
			p.liveChildren.Add(1)
		}
		return nil
	}
	for _, n := range s.sortedNames() {
		if err := resolve(s.branches[n]); err != nil {
			return err
		}
	}
	return nil
}

// sortedNames lists the branches but main, by name. Preconditions: s.mu
// held.
func (s *Store) sortedNames() []string {
	names := make([]string, 0, len(s.branches))
	for n := range s.branches {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// noteNames raises the generated-name counter past every name of the form
// freeName makes that the log mentions, so that none is handed out again.
// Preconditions: during load, before the store is shared.
func (s *Store) noteNames(recs []logRecord) {
	for i := range recs {
		r := &recs[i]
		s.autoName = max(s.autoName, r.AutoName)
		if n, ok := strings.CutPrefix(r.Name, autoPrefix); ok {
			if k, err := strconv.Atoi(n); err == nil {
				s.autoName = max(s.autoName, k)
			}
		}
	}
}

// rewriteLog replaces the log with a snapshot of the state and opens it
// for appending. Preconditions: s.mu held exclusively or not yet shared;
// no commit is journaled without its "done" (the snapshot would drop it).
func (s *Store) rewriteLog() error {
	l, err := writeSnapshot(s.logPath(), s.snapshot())
	if l == nil {
		return err
	}
	if s.log != nil {
		s.log.close()
	}
	s.log = l
	// Rewriting costs about what the snapshot holds; waiting for the log
	// to grow by as much again keeps the cost per record constant.
	s.compactAt = max(compactMin, 2*l.off)
	return err
}

// compactMin is the smallest log that is compacted while mounted.
const compactMin = 256 << 10

// compactLocked rewrites a log that outgrew compactAt as a snapshot, which
// holds unfinished branches only: committed and aborted ones leave it.
// Not while a failed commit waits to be settled: its journal must stay.
// A failure leaves the old log in place, which stays valid.
// Preconditions: as rewriteLog.
func (s *Store) compactLocked() {
	if s.log.off > s.compactAt && s.unfinished.Load() == nil {
		s.rewriteLog()
	}
}

// snapshot is the state as log records, parents before their children.
// Preconditions: s.mu held.
func (s *Store) snapshot() []logRecord {
	recs := []logRecord{{Op: logBranch, Name: MainName, Epoch: s.main.epoch(), AutoName: s.autoName}}
	for _, h := range s.history {
		recs = append(recs, logRecord{Op: logFinished, Name: h.Name, Parent: h.Parent, Epoch: h.Epoch,
			Committed: h.State == Committed.String(), Created: h.Created, Finished: h.Finished})
	}
	var add func(p *branch)
	add = func(p *branch) {
		for _, c := range s.children(p) {
			m := c.meta
			recs = append(recs, logRecord{Op: logBranch, Name: m.Name, Parent: m.Parent, ParentEpoch: m.ParentEpoch,
				Epoch: m.Epoch, Committed: m.Committed, Created: m.Created, MaxStorage: m.MaxStorage})
			add(c)
		}
	}
	add(s.main)
	return recs
}

// openView builds b's layer stack: its delta over its parent's stack.
// Preconditions: s.mu held exclusively, or during load.
func (s *Store) openView(b *branch) error {
	if b.view != nil {
		return nil
	}
	if b.parent.view == nil {
		if err := s.openView(b.parent); err != nil {
			return err
		}
	}
	top, err := openLayer(s.deltaDir(b.meta.Name), true)
	if isNotExist(err) {
		top, err = absentLayer(s.deltaDir(b.meta.Name), s.base.dev), nil // nothing written yet
	}
	if err != nil {
		return fmt.Errorf("branch %s: %w", b.meta.Name, err)
	}
	s.devIndex(top.dev)
	b.view = s.newView(b, append([]*layer{top}, b.parent.view.layers...))
	return nil
}

// devIndex gives device dev a small number, for Identity. Preconditions:
// s.mu held exclusively, or during load.
func (s *Store) devIndex(dev uint64) uint64 {
	if i, ok := s.devs[dev]; ok {
		return i
	}
	i := uint64(len(s.devs))
	s.devs[dev] = i
	return i
}

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

// Create makes a new live branch name, a child of parent. An empty name
// picks a free one. Creation is O(1): the new delta is empty.
func (s *Store) Create(name, parent string) (*View, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.payDoneLocked()
	if c := s.unfinished.Load(); c != nil && (c.j.Name == parent || c.j.Parent == parent) {
		if _, err := s.settleLocked(); err != nil {
			return nil, &BranchError{"create child of", parent, err}
		}
	}
	if name == "" {
		name = s.freeName()
	}
	if err := ValidateName(name); err != nil {
		return nil, err
	}
	if name == MainName {
		return nil, &BranchError{"create", name, ErrExists}
	}
	if s.branches[name] != nil {
		return nil, &BranchError{"create", name, ErrExists}
	}
	p, err := s.lookupBranch(parent)
	if err != nil {
		return nil, err
	}
	if s.opts.MaxBranches > 0 && s.countUnfinished() >= s.opts.MaxBranches {
		return nil, &BranchError{"create", name, ErrTooMany}
	}
	if err := p.State().err(); err != nil {
		return nil, &BranchError{"create child of", parent, err}
	}
	if p.held.Load() != nil {
		return nil, &BranchError{"create child of", parent, ErrBusy}
	}
	b := &branch{meta: branchMeta{
		Name: name, Parent: p.meta.Name, ParentEpoch: p.epoch(), Created: time.Now().UTC(),
	}}
	if slices.Contains(s.leftovers, name) {
		s.trashLeftovers() // a finished branch's delta, in the new one's place
	}
	// The delta directory is made at the first write (View.beginWrite).
	m := &b.meta
	rec := logRecord{Op: logCreate, Name: name, Parent: m.Parent, ParentEpoch: m.ParentEpoch, Created: m.Created}
	if _, err := s.log.append(&rec, false); err != nil {
		return nil, err
	}
	top := absentLayer(s.deltaDir(name), s.base.dev)
	s.devIndex(top.dev)
	b.view = s.newView(b, append([]*layer{top}, p.view.layers...))
	s.branches[name] = b
	s.adopt(p, b)
	p.liveChildren.Add(1)
	s.count(b)
	s.compactLocked()
	return b.view, nil
}

// countUnfinished counts the branches that are live or stale.
// Preconditions: s.mu held.
func (s *Store) countUnfinished() int {
	n := 0
	for _, b := range s.branches {
		if st := b.State(); st == Live || st == Stale {
			n++
		}
	}
	return n
}

// autoPrefix starts the names freeName makes.
const autoPrefix = "branch-"

// freeName makes a name no branch of the store had: the counter outlives
// mounts (snapshot, noteNames).
// Preconditions: s.mu held exclusively.
func (s *Store) freeName() string {
	for {
		s.autoName++
		n := autoPrefix + strconv.Itoa(s.autoName)
		if s.branches[n] == nil {
			return n
		}
	}
}

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

// Abort drops a branch and its delta. A branch with live children is
// refused with ErrBusy unless recursive; stale descendants go with it. It
// returns the names of the branches dropped, descendants first.
func (s *Store) Abort(name string, recursive bool) ([]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, err := s.lookupBranch(name)
	if err != nil {
		return nil, err
	}
	if b.isMain() {
		return nil, &BranchError{"abort", name, ErrMainView}
	}
	s.payDoneLocked()
	if c := s.unfinished.Load(); c != nil && c.j.Name == name {
		// Its delta is half moved: first finish or undo that.
		if _, err := s.settleLocked(); err != nil {
			return nil, &BranchError{"abort", name, err}
		}
	}
	if b.State() == Committed {
		return nil, &BranchError{"abort", name, ErrGone}
	}
	if b.liveChildren.Load() > 0 && !recursive {
		return nil, &BranchError{"abort", name, ErrBusy}
	}
	dropped, err := s.drop(b, nil)
	if err == nil {
		s.compactLocked()
	}
	return dropped, err
}

// drop removes b and all its descendants, and appends the names of those
// that had views to dropped. Preconditions: s.mu held exclusively.
func (s *Store) drop(b *branch, dropped []string) ([]string, error) {
	dropped, err := s.dropChildren(b, dropped)
	if err != nil {
		return dropped, err
	}
	// The record first: a delta left behind by a crash has no branch and
	// is removed at the next mount.
	now := time.Now().UTC()
	if _, err := s.log.append(&logRecord{Op: logAbort, Name: b.meta.Name, Finished: now}, false); err != nil {
		return dropped, err
	}
	s.trashDeltaLater(b.meta.Name)
	if b.State() == Live {
		b.parent.liveChildren.Add(-1)
	}
	s.retire(b, Aborted)
	s.remove(b)
	s.remember(finishedInfo(&b.meta, Aborted, now))
	return append(dropped, b.meta.Name), nil
}

// dropChildren drops b's descendants (see drop).
func (s *Store) dropChildren(b *branch, dropped []string) ([]string, error) {
	for _, c := range s.children(b) {
		var err error
		if dropped, err = s.drop(c, dropped); err != nil {
			return dropped, err
		}
	}
	return dropped, nil
}

// historyMax bounds the finished branches List shows.
const historyMax = 32

// remember adds a branch that finished to the history, which the log's
// snapshots keep (logFinished). Preconditions: s.mu held exclusively, or
// during load.
func (s *Store) remember(in Info) {
	if len(s.history) >= historyMax {
		s.history = slices.Delete(s.history, 0, len(s.history)-historyMax+1)
	}
	s.history = append(s.history, in)
}

// finishedInfo describes for the history a branch that ended in state st
// at t.
func finishedInfo(m *branchMeta, st State, t time.Time) Info {
	return Info{Name: m.Name, Parent: m.Parent, State: st.String(), Epoch: m.Epoch, Created: m.Created, Finished: t}
}

// adopt makes b a child of p. Preconditions: s.mu held exclusively, or
// during load.
func (s *Store) adopt(p, b *branch) {
	b.parent = p
	if p.kids == nil {
		p.kids = map[string]*branch{}
	}
	p.kids[b.meta.Name] = b
}

// remove forgets b. Preconditions: s.mu held exclusively.
func (s *Store) remove(b *branch) {
	delete(s.branches, b.meta.Name)
	if b.parent != nil {
		delete(b.parent.kids, b.meta.Name)
	}
}

// retire ends b in state st and closes its view. Preconditions: s.mu held
// exclusively.
func (s *Store) retire(b *branch, st State) {
	s.uncount(b)
	b.state.Store(int32(st))
	if b.view != nil {
		b.view.layers[0].close()
		b.view = nil
	}
}

// children lists b's children in any state, by name.
// Preconditions: s.mu held.
func (s *Store) children(b *branch) []*branch {
	out := make([]*branch, 0, len(b.kids))
	for _, c := range b.kids {
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].meta.Name < out[j].meta.Name })
	return out
}

// Info describes a branch for list.
type Info struct {
	Name       string    `json:"name"`
	Parent     string    `json:"parent"`
	State      string    `json:"state"`
	Epoch      uint64    `json:"epoch"`
	DeltaBytes int64     `json:"delta_bytes"`
	DeltaFiles int64     `json:"delta_files"`
	Created    time.Time `json:"created,omitzero"` // none for main
	// Held: a kernel-path run holds the branch (hold.go).
	Held bool `json:"held,omitempty"`
	// Finished is when a committed or aborted branch ended (history only).
	Finished time.Time `json:"finished,omitzero"`
	// MaxStorage is the branch's own storage limit, main's the mount's
	// (quota.go); StorageUsed what it counts, main's all deltas: nil
	// when no limit counts the branch.
	MaxStorage  int64  `json:"max_storage,omitempty"`
	StorageUsed *int64 `json:"storage_used,omitempty"`
	// StorageRefused counts the changes in the branch that a limit
	// refused (since the mount, or since its limit was set).
	StorageRefused int64 `json:"storage_refused,omitempty"`
}

// List describes main and every live or stale branch; with all, also the
// latest finished ones, oldest first (the log keeps them across mounts).
func (s *Store) List(all bool) []Info {
	s.mu.RLock()
	out := []Info{{Name: MainName, State: Live.String(), Epoch: s.main.epoch(), MaxStorage: s.opts.MaxStorage}}
	s.quotaMu.Lock()
	if s.opts.MaxStorage > 0 {
		used := s.used
		out[0].StorageUsed = &used
	}
	names := make([]string, 0, len(s.branches))
	for n := range s.branches {
		names = append(names, n)
	}
	sort.Strings(names)
	var open []int // the entries of out whose deltas are counted
	for _, n := range names {
		b := s.branches[n]
		if b.view != nil {
			open = append(open, len(out))
		}
		in := Info{Name: n, Parent: b.meta.Parent, State: b.State().String(), Epoch: b.epoch(),
			Created: b.meta.Created, Held: b.held.Load() != nil, MaxStorage: b.meta.MaxStorage}
		if b.use != nil {
			used := b.use.bytes
			in.StorageUsed, in.StorageRefused = &used, b.use.refused
		}
		out = append(out, in)
	}
	s.quotaMu.Unlock()
	if all {
		out = append(out, s.history...)
	}
	s.mu.RUnlock()
	// Counting walks each delta: under the lock, a commit would wait for
	// the walks, and every operation for the commit. A delta that changes
	// meanwhile counts what the walk saw.
	for _, i := range open {
		out[i].DeltaBytes, out[i].DeltaFiles = duTree(s.deltaDir(out[i].Name))
	}
	return out
}

// LiveNamesLocked lists the live branches, by name, for a view operation,
// which holds the store's lock already: taken again, a read lock would
// wait behind a writer that waits for the first.
// Preconditions: s.mu held (View.Lock).
func (s *Store) LiveNamesLocked() []string {
	s.mu.AssertHeld()
	var out []string
	for _, n := range s.sortedNames() {
		if s.branches[n].State() == Live {
			out = append(out, n)
		}
	}
	return out
}

// duTree counts the files a delta holds and their bytes: directories and
// tombstones are not files the branch wrote.
func duTree(dir string) (bytes, files int64) {
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		var st unix.Stat_t
		if unix.Lstat(p, &st) == nil && !isWhiteout(&st) {
			files++
			if st.Mode&unix.S_IFMT == unix.S_IFREG {
				bytes += st.Size
			}
		}
		return nil
	})
	return bytes, files
}
