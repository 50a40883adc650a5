package branch

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

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
