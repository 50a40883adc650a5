package fs

import (
	"time"

	"github.com/branchfs/branchfs/branch"
	"github.com/branchfs/branchfs/ctl"
)

// The kernel keeps every inode it looked up until memory pressure makes it
// forget them, and the daemon keeps a node for each: a stat of every file
// of a 10k-file tree in 100 branches is a million nodes, most of them in
// branches nobody touches any more. Past a budget (Options.MaxInodes) the
// daemon drops the least recently used branch views from the kernel's
// caches, as memory pressure would; the kernel then forgets their inodes
// and the next access to such a view looks its names up again. Files that
// are open, and working directories, stay.

// DefaultMaxInodes bounds the inodes the kernel holds through branch views
// before idle views are trimmed: about 60 MB of the daemon's live heap.
const DefaultMaxInodes = 100_000

type viewUse struct {
	nodes int   // nodes made for the view and not yet forgotten
	last  int64 // when the view last made a node (monotonic nanoseconds)
}

// nodeMade counts a node the kernel now knows, and starts a trim when the
// branch views hold more than the budget.
func (f *FS) nodeMade(n *Node) {
	if n.view.IsMain() {
		return // one view, the size of the base: not what multiplies
	}
	f.mu.Lock()
	n.counted = true
	u := f.use[n.view]
	if u == nil {
		u = &viewUse{}
		f.use[n.view] = u
	}
	u.nodes++
	u.last = time.Since(f.start).Nanoseconds()
	f.nodes++
	over := f.opts.MaxInodes > 0 && f.nodes > f.opts.MaxInodes
	f.mu.Unlock()
	if over && f.trimming.CompareAndSwap(false, true) {
		go f.trim()
	}
}

func (f *FS) nodeForgotten(n *Node) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !n.counted {
		return
	}
	n.counted = false
	if u := f.use[n.view]; u != nil {
		u.nodes--
		f.nodes--
		if u.nodes <= 0 {
			f.nodes -= u.nodes
			delete(f.use, n.view)
		}
	}
}

// trim drops least recently used branch views from the kernel's caches
// until what remains fits in three quarters of the budget. Forgets arrive
// after the invalidation returns, so it counts what it asked to drop.
func (f *FS) trim() {
	defer f.trimming.Store(false)
	dropped := map[*branch.View]bool{}
	asked := 0
	for {
		f.mu.Lock()
		var victim *branch.View
		var oldest int64
		for v, u := range f.use {
			if dropped[v] {
				continue
			}
			if victim == nil || u.last < oldest {
				victim, oldest = v, u.last
			}
		}
		remaining := f.nodes - asked
		if victim != nil {
			asked += f.use[victim].nodes
		}
		f.mu.Unlock()
		if victim == nil || remaining <= f.opts.MaxInodes*3/4 {
			return
		}
		dropped[victim] = true
		f.root.NotifyEntry(ctl.BranchPrefix + victim.Name())
	}
}
