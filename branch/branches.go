package branch

import (
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// Create makes a new live branch name, a child of parent. An empty name
// picks a free one. Creation is O(1): the new delta is empty.
func (s *Store) Create(name, parent string) (*View, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.createLocked(name, parent)
}

// TryCreate is Create for a caller that must not wait for the store's
// lock (the FUSE request loop's only reader): while another holds it, it
// fails with ErrWouldWait and does nothing.
func (s *Store) TryCreate(name, parent string) (*View, error) {
	if !s.mu.TryLock() {
		return nil, ErrWouldWait
	}
	defer s.mu.Unlock()
	return s.createLocked(name, parent)
}

// Preconditions: s.mu held exclusively.
func (s *Store) createLocked(name, parent string) (*View, error) {
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

// Abort drops a branch and its delta. A branch with live children is
// refused with ErrBusy unless recursive; stale descendants go with it. It
// returns the names of the branches dropped, descendants first.
func (s *Store) Abort(name string, recursive bool) ([]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.abortLocked(name, recursive)
}

// TryAbort is Abort as TryCreate is Create.
func (s *Store) TryAbort(name string, recursive bool) ([]string, error) {
	if !s.mu.TryLock() {
		return nil, ErrWouldWait
	}
	defer s.mu.Unlock()
	return s.abortLocked(name, recursive)
}

// Preconditions: s.mu held exclusively.
func (s *Store) abortLocked(name string, recursive bool) ([]string, error) {
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
