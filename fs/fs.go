// Package fs serves a branch store over FUSE: the base at the mount point,
// each branch at MNT/@NAME. It is glue: every decision about what a path
// means is made in package branch.
//
// Locking. The lock tree, outermost first: a lock is taken only while
// holding none or only locks above it on its path, and internal/lockcheck
// checks that in race-enabled builds.
//
//	transport's rawDirs.mu      across a directory read without a handle
//	ctlHandle.mu                a control handle's answer, across the list it runs
//	  branch.Store.mu           through View.Lock and LockRoot (Node.begin), and
//	                            in the Store methods the commands call
//	    (branch's own leaves)   package branch
//	    Node.openMu             a node's open handles (Node.tops, lowers, file)
//	      FS.passMu             handles that write through passthrough
//	    FS.mu                   nodes and open handles by view (trim.go)
//	    FS.holdMu               the holds of kernel-path runs (hold.go)
//	    FS.runMu                the runners that watch their runs (watch.go)
//
// rawDirs.mu and ctlHandle.mu never nest. The locks under Store.mu may also
// be taken alone; FS.passMu, FS.mu, FS.holdMu and FS.runMu are leaves.
//
// A request takes Store.mu once, in Node.begin or View.Lock: under it, call
// view methods and the store's ...Locked methods, never a Store method that
// locks. Most requests are answered on the request loop's only reader
// (package transport), which reads nothing else while it waits: nothing
// may wait, holding Store.mu, for a request to be answered. So no
// notification goes to the kernel under it (the kernel may wait for a
// directory lock that a process holds while its request waits to be read):
// a copy-up notifies from a goroutine of its own (Node.replaced), and the
// commands notify after the store's lock is released, inside
// Loop.ServeWhile. The commands themselves take the store's lock
// exclusively and so wait for every operation in flight: on the reader
// they only try it (Store.TryCommit and others), and when it is held, or
// a command would wait for anything else, they answer
// transport.OnWorker, to be answered again on a worker (ctl.go). So do
// changes of attributes that would copy up (attr.go, xattr.go).
package fs

import (
	"fmt"
	"log"
	"os"
	"sync/atomic"
	"time"

	"github.com/branchfs/branchfs/branch"
	"github.com/branchfs/branchfs/fs/transport"
	"github.com/branchfs/branchfs/internal/lockcheck"
	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// Passthrough says where the kernel may read files directly.
type Passthrough string

const (
	// PassthroughAuto uses passthrough for files opened read-only in every
	// view. In a branch view such a handle keeps reading the file it
	// opened after the branch goes stale, as an open file on overlayfs
	// does; every request the daemon sees on a stale branch fails with
	// ESTALE. Through the daemon, reads in a branch ran at 0.7-0.9x native.
	PassthroughAuto Passthrough = "auto"
	// PassthroughOn is the same as PassthroughAuto, which it once
	// extended to branch views.
	PassthroughOn Passthrough = "on"
	// PassthroughOff never uses it.
	PassthroughOff Passthrough = "off"
)

// DefaultPassthroughMinSize is the CLI's default Options.PassthroughMinSize.
// Below it, reads from the mount's page cache cost no more than
// passthrough, and they keep the file's cached attributes valid.
const DefaultPassthroughMinSize = 1 << 20

// DefaultTimeout is the kernel's cache lifetime for names and attributes.
const DefaultTimeout = time.Hour

// Options configure a mount.
type Options struct {
	Passthrough Passthrough
	// PassthroughMinSize: smaller files are read through the mount's
	// page cache even where passthrough is on; 0 passes every file.
	PassthroughMinSize int64
	Debug              bool
	// Timeout is how long the kernel caches names and attributes. Every
	// change made through branchfs (writes, copy-ups, commits, staleness)
	// is pushed to the kernel as it happens, so this only bounds how long
	// changes made to the base behind branchfs's back stay unseen.
	Timeout time.Duration
	// MaxInodes is how many inodes the kernel may hold through all views
	// before idle branch views are dropped from its caches (trim.go); 0
	// means DefaultMaxInodes, below 0 no limit.
	MaxInodes int
	// ControlGroup, when set, is a group whose members may create, commit
	// and abort branches besides the user who mounted and root
	// (authorize.go).
	ControlGroup *uint32
	// ListBranches shows the @NAME entries of live branches in the listing
	// of the mount's root, for clients that find branches that way.
	ListBranches bool
}

// FS is a mounted branch store.
type FS struct {
	store *branch.Store
	opts  Options
	root  *Node
	mnt   string
	loop  *transport.Loop
	start time.Time
	owner uint32 // the user who mounted: the daemon's

	mu  lockcheck.Mutex[lockcheck.Nodes]
	use map[*branch.View]*viewUse
	// open holds the nodes with open file handles, by view: those whose
	// names are gone are in no tree that notifyTree walks.
	open  map[*branch.View]map[*Node]int
	nodes int // nodes the kernel knows through branch views (trim.go)

	trimming atomic.Bool

	passMu      lockcheck.Mutex[lockcheck.PassWriters]
	passWriters map[string]int // by view name: handles that write through passthrough

	holdMu lockcheck.Mutex[lockcheck.Holds]
	holds  map[string]*holder // by branch name: kernel-path runs (hold.go)

	runMu   lockcheck.Mutex[lockcheck.Runners]
	runners map[int]*runner // by process ID: runs whose runner is watched (watch.go)
}

// Mount serves store at mnt until it is unmounted.
func Mount(mnt string, store *branch.Store, opts Options) (*FS, error) {
	if opts.Passthrough == "" {
		opts.Passthrough = PassthroughAuto
	}
	if os.Geteuid() != 0 {
		// The kernel takes backing files only from a daemon with
		// CAP_SYS_ADMIN.
		opts.Passthrough = PassthroughOff
	}
	if opts.Timeout == 0 {
		opts.Timeout = DefaultTimeout
	}
	if opts.MaxInodes == 0 {
		opts.MaxInodes = DefaultMaxInodes
	}
	f := &FS{store: store, opts: opts, start: time.Now(), owner: uint32(os.Geteuid()), use: map[*branch.View]*viewUse{}}
	f.root = &Node{fsys: f, view: store.Main(), viewRoot: true}
	if err := store.Main().Lock(); err != nil {
		return nil, err
	}
	root, err := store.Main().Lookup("")
	store.Main().Unlock()
	if err != nil {
		return nil, err
	}
	ino, gen := store.Main().Identity(root)
	t := opts.Timeout
	mo := fuse.MountOptions{
		AllowOther: allowOther(),
		FsName:     store.Base(),
		Name:       "branchfs",
		// The kernel checks permissions against the attributes and POSIX
		// ACLs we report, as it would on the underlying filesystem.
		// Without EnableAcl it would ignore ACLs in its checks, and ask
		// us for them on every getxattr instead of caching them.
		Options:   []string{"default_permissions"},
		EnableAcl: true,
		MaxWrite:  1 << 20,
		// Reads answer with bytes already read (pread): one writev to
		// the device beats a detour through a pipe.
		DisableSplice: true,
		MaxReadAhead:  1 << 20,
		// O_TRUNC comes with the open instead of as a setattr after it,
		// so that rewriting a base file in a branch copies none of its
		// old bytes up first. Setuid and setgid are dropped here
		// (transport/killpriv.go), which spares a GETXATTR before every write;
		// and setgid on an ACL change, which SETXATTR_EXT flags. The
		// umask is applied here too (transport/umask.go).
		ExtraCapabilities: fuse.CAP_ATOMIC_O_TRUNC | fuse.CAP_HANDLE_KILLPRIV_V2 | fuse.CAP_SETXATTR_EXT |
			fuse.CAP_DONT_MASK,
		Debug: opts.Debug,
	}
	if opts.Passthrough == PassthroughOff {
		mo.DisabledCapabilities |= fuse.CAP_PASSTHROUGH
	}
	// The entries' timeouts are set per entry (Node.setEntry).
	nodeFS := gofs.NewNodeFS(f.root, &gofs.Options{
		MountOptions:    mo,
		AttrTimeout:     &t,
		NegativeTimeout: &t,
		RootStableAttr:  &gofs.StableAttr{Ino: ino, Gen: gen},
		// A mode without permission bits is the file's own: go-fuse
		// would otherwise show 0644 or 0755, and the kernel grant them.
		NullPermissions: true,
		Logger:          log.New(os.Stderr, "branchfs: ", log.LstdFlags),
	})
	f.mnt = mnt
	fd, err := mountDevice(mnt, &mo)
	if err != nil {
		return nil, fmt.Errorf("mount: %w", err)
	}
	loop, err := transport.NewLoop(fd, transport.Wrap(nodeFS), mo)
	if err != nil {
		Unmount(mnt, true)
		return nil, err
	}
	f.loop = loop
	go loop.Serve()
	return f, nil
}

// Unmount unmounts the file system, retrying while the kernel still
// counts it busy, and waits for the request loop to end.
func (f *FS) Unmount() error {
	if err := Unmount(f.mnt, false); err != nil {
		return err
	}
	f.Wait()
	return nil
}

// Wait waits for the request loop to end: the file system was unmounted.
func (f *FS) Wait() { <-f.loop.Done() }
