// Package lockcheck places every lock of branchfs's daemon in one order and,
// in builds with the race detector (the tests'), checks it on every
// acquisition: a goroutine that takes a lock while it holds that lock, or
// one at or after it in the order, panics, naming both locks and where each
// was taken. Taking a read lock twice counts: a writer that waits between
// the two makes the second wait for the first, which waits for the writer.
// Elsewhere the types are the sync package's mutexes and cost nothing more.
//
// The order, outermost first; a lock is taken only while holding locks
// above it, and locks of one rank never nest:
//
//	RawDirs, CtlAnswer  held across a call that takes Store
//	Store               branch.Store.mu
//	NodeOpen            fs Node.openMu
//	leaves              under any of those, around nothing
//
// go-fuse's own locks are not covered: the file system never calls go-fuse
// with one of the locks here held and then takes another of them inside.
package lockcheck

// A Rank places a lock in the order: the type parameter of Mutex and
// RWMutex is one of the rank types below.
type Rank interface {
	rank() (order int, name string)
}

// The ranks. Those of one order never nest.
type (
	// RawDirs is fs/transport's rawDirs.mu, held across a directory read.
	RawDirs struct{}
	// CtlAnswer is fs's ctlHandle.mu, held across the list command a read
	// of the control file runs.
	CtlAnswer struct{}
	// Store is branch.Store.mu.
	Store struct{}
	// NodeOpen is fs's Node.openMu.
	NodeOpen struct{}

	// Leaves: none is held while another lock is taken.

	// PassWriters is fs's FS.passMu (under NodeOpen).
	PassWriters struct{}
	// Nodes is fs's FS.mu.
	Nodes struct{}
	// Holds is fs's FS.holdMu.
	Holds struct{}
	// Runners is fs's FS.runMu.
	Runners struct{}
	// ViewCache is branch's View.cacheMu.
	ViewCache struct{}
	// LayerMake is branch's layer.mu.
	LayerMake struct{}
	// LayerDirs is branch's dirFds.mu.
	LayerDirs struct{}
	// Quota is branch's Store.quotaMu, held across the system call of a
	// change it charges (quota.go) and nothing else.
	Quota struct{}
	// LoopDirect and LoopBufs are fs/transport's Loop.directMu and bufMu.
	LoopDirect struct{}
	LoopBufs   struct{}
)

const (
	outer = iota + 1
	store
	nodeOpen
	leaf
)

func (RawDirs) rank() (int, string)     { return outer, "transport rawDirs.mu" }
func (CtlAnswer) rank() (int, string)   { return outer, "fs ctlHandle.mu" }
func (Store) rank() (int, string)       { return store, "branch Store.mu" }
func (NodeOpen) rank() (int, string)    { return nodeOpen, "fs Node.openMu" }
func (PassWriters) rank() (int, string) { return leaf, "fs FS.passMu" }
func (Nodes) rank() (int, string)       { return leaf, "fs FS.mu" }
func (Holds) rank() (int, string)       { return leaf, "fs FS.holdMu" }
func (Runners) rank() (int, string)     { return leaf, "fs FS.runMu" }
func (ViewCache) rank() (int, string)   { return leaf, "branch View.cacheMu" }
func (LayerMake) rank() (int, string)   { return leaf, "branch layer.mu" }
func (LayerDirs) rank() (int, string)   { return leaf, "branch dirFds.mu" }
func (Quota) rank() (int, string)       { return leaf, "branch Store.quotaMu" }
func (LoopDirect) rank() (int, string)  { return leaf, "transport Loop.directMu" }
func (LoopBufs) rank() (int, string)    { return leaf, "transport Loop.bufMu" }
