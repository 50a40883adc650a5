// Package fs serves a branch store over FUSE: the base at the mount point,
// each branch at MNT/@NAME. It is glue: every decision about what a path
// means is made in package branch.
package fs

import (
	"context"
	"log"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/branchfs/branchfs/branch"
	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// ControlName is the control file at the root of every view.
const ControlName = ".branchfs_ctl"

// BranchPrefix starts the name of a branch view in the mount root.
const BranchPrefix = "@"

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
	loop  *requestLoop
	start time.Time
	owner uint32 // the user who mounted: the daemon's

	mu    sync.Mutex
	use   map[*branch.View]*viewUse
	nodes int // nodes the kernel knows through branch views (trim.go)

	trimming atomic.Bool

	passMu      sync.Mutex
	passWriters map[string]int // by view name: handles that write through passthrough
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
	root, err := store.Main().Lookup("")
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
		// (killpriv.go), which spares a GETXATTR before every write;
		// and setgid on an ACL change, which SETXATTR_EXT flags. The
		// umask is applied here too (umask.go).
		ExtraCapabilities: fuse.CAP_ATOMIC_O_TRUNC | fuse.CAP_HANDLE_KILLPRIV_V2 | fuse.CAP_SETXATTR_EXT |
			fuse.CAP_DONT_MASK,
		Debug: opts.Debug,
	}
	if opts.Passthrough == PassthroughOff {
		mo.DisabledCapabilities |= fuse.CAP_PASSTHROUGH
	}
	nodeFS := gofs.NewNodeFS(f.root, &gofs.Options{
		MountOptions:    mo,
		EntryTimeout:    &t,
		AttrTimeout:     &t,
		NegativeTimeout: &t,
		RootStableAttr:  &gofs.StableAttr{Ino: ino, Gen: gen},
		// A mode without permission bits is the file's own: go-fuse
		// would otherwise show 0644 or 0755, and the kernel grant them.
		NullPermissions: true,
		Logger:          log.New(os.Stderr, "branchfs: ", log.LstdFlags),
	})
	raw := &killPriv{&aclUmask{newRawDirs(nodeFS)}}
	f.mnt = mnt
	loop, err := newRequestLoop(raw, mnt, mo)
	if err != nil {
		return nil, err
	}
	f.loop = loop
	go loop.serve()
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
func (f *FS) Wait() { <-f.loop.done }

// Node is a file, directory or special file of one view.
type Node struct {
	gofs.Inode
	fsys     *FS
	view     *branch.View
	viewRoot bool
	counted  bool // in the trim budget (trim.go); under fsys.mu

	// Open handles by kind: the kernel requires every open of an inode to
	// agree on passthrough with the ones already open.
	openMu     sync.Mutex
	openDirect int
	openPass   int
	// passUsed: a handle of this inode used passthrough, so the kernel
	// (or go-fuse, until its release completes) may still tie the inode
	// to the file it then stood for; a copy of that file must be another
	// inode.
	passUsed bool
	// tops: the open handles whose descriptor is this inode's file in the
	// view's top layer (every handle for writing, and those for reading
	// a file already there), the ones for writing first. Setattr, getattr
	// and xattr requests carry no handle (fchown, fchmod, futimens, fstat
	// and fgetxattr reach the daemon as path operations), and tar sends five
	// of them per file: by descriptor they cost one system call each
	// instead of a walk through the view's layers. It also keeps them on
	// the open file once its name has been given to another, as on a
	// local file system. Release removes its handle under openMu before
	// closing it.
	tops []*fileHandle
}

// rel is the node's path within its view; false once the node has been
// replaced (copied up) or removed.
func (n *Node) rel() (string, bool) {
	var parts []string
	cur := &n.Inode
	for {
		if nd, ok := cur.Operations().(*Node); ok && nd.viewRoot {
			break
		}
		name, parent := cur.Parent()
		if parent == nil {
			return "", false
		}
		parts = append(parts, name)
		cur = parent
	}
	for i, j := 0, len(parts)-1; i < j; i, j = i+1, j-1 {
		parts[i], parts[j] = parts[j], parts[i]
	}
	return strings.Join(parts, "/"), true
}

// begin locks the view for one operation and returns the node's path.
func (n *Node) begin() (string, syscall.Errno) {
	if err := n.view.Lock(); err != nil {
		return "", toErrno(err)
	}
	rel, ok := n.rel()
	if !ok {
		n.view.Unlock()
		return "", syscall.ESTALE
	}
	return rel, 0
}

func (n *Node) childRel(rel, name string) string {
	if rel == "" {
		return name
	}
	return rel + "/" + name
}

// newChild makes the inode for entry e of n's view.
func (n *Node) newChild(ctx context.Context, e *branch.Entry, out *fuse.EntryOut) *gofs.Inode {
	ino, gen := n.view.Identity(e)
	child := &Node{fsys: n.fsys, view: n.view}
	fillAttr(&out.Attr, &e.Stat)
	in := n.NewInode(ctx, child, gofs.StableAttr{Mode: e.Stat.Mode & syscall.S_IFMT, Ino: ino, Gen: gen})
	if in.Operations() == child {
		n.fsys.nodeMade(child)
	}
	return in
}

// identical reports whether e is the file this node stands for.
func (n *Node) identical(e *branch.Entry) bool {
	ino, gen := n.view.Identity(e)
	sa := n.StableAttr()
	return sa.Ino == ino && sa.Gen == gen
}

func fillAttr(a *fuse.Attr, st *unix.Stat_t) {
	a.Size = uint64(st.Size)
	a.Blocks = uint64(st.Blocks)
	a.Atime, a.Atimensec = uint64(st.Atim.Sec), uint32(st.Atim.Nsec)
	a.Mtime, a.Mtimensec = uint64(st.Mtim.Sec), uint32(st.Mtim.Nsec)
	a.Ctime, a.Ctimensec = uint64(st.Ctim.Sec), uint32(st.Ctim.Nsec)
	a.Mode = st.Mode
	a.Nlink = uint32(st.Nlink)
	a.Owner = fuse.Owner{Uid: st.Uid, Gid: st.Gid}
	a.Rdev = uint32(st.Rdev)
	a.Blksize = uint32(st.Blksize)
}

// toErrno is the one place internal errors become FUSE errnos, by the
// table in package branch.
func toErrno(err error) syscall.Errno {
	if err == nil {
		return 0
	}
	if errno, ok := branch.Errno(err); ok {
		return errno
	}
	log.Printf("unexpected error: %v", err)
	return syscall.EIO
}

// replaced tells the kernel that the name of n now stands for another
// inode (after a copy-up). It runs on its own goroutine because the kernel
// may hold locks for the request that caused it.
func (n *Node) replaced() {
	name, parent := n.Parent()
	if parent == nil {
		return
	}
	go parent.NotifyEntry(name)
}

// afterCommit brings the kernel's caches in line with a commit: the parent
// view's changed names, and the views that now fail: the stale siblings,
// the committed branch and its stale children.
func (f *FS) afterCommit(branchName string, res *branch.CommitResult) {
	parentRoot := f.root
	if res.Parent != branch.MainName {
		parentRoot = f.viewRoot(res.Parent)
	}
	if parentRoot != nil {
		listed := map[*gofs.Inode]bool{}
		for _, p := range res.Paths {
			notifyPath(&parentRoot.Inode, p, listed)
		}
	}
	f.viewsFailing(append(append(res.Stale, res.Dropped...), branchName))
}

// viewsFailing drops everything the kernel caches of views whose every
// operation now fails in the daemon (the stale siblings of a commit, the
// branches a commit or abort ends), before the command's reply: names
// present and missing, attributes, and the pages that handles opened
// earlier would read. Once the command returns, nothing cached answers for
// them, and the name MNT/@NAME of a gone branch is gone. It costs the
// command the kernel's work of evicting the views' inodes and pages: a
// commit whose sibling holds 100 MB of written files and 5000 looked-up
// names took 7-27 ms instead of 0.3-5 ms (measured when this followed the
// reply).
// Preconditions: called inside loop.serveWhile (it drops names).
func (f *FS) viewsFailing(names []string) {
	for _, name := range names {
		// Dropping the root's name drops every name below it that
		// nothing holds, present or missing (only this reaches the
		// missing ones), and makes the kernel evict their inodes, pages
		// included: that is most of the cost.
		if f.root.GetChild(BranchPrefix+name) != nil {
			f.root.NotifyEntry(BranchPrefix + name)
		}
		// What remains is held: open files, working directories and the
		// directories above them.
		if r := f.viewRoot(name); r != nil {
			notifyTree(&r.Inode)
		}
	}
}

// viewRoot returns the root node of branch view name that the kernel
// holds, or nil: the one in the mount root's tree, which is the one
// go-fuse answered the kernel's lookups with.
func (f *FS) viewRoot(name string) *Node {
	if c := f.root.GetChild(BranchPrefix + name); c != nil {
		if n, ok := c.Operations().(*Node); ok && n.viewRoot && n.view.Name() == name {
			return n
		}
	}
	return nil
}

// notifyPath drops the kernel's entry for the top-most known component of
// p that changed, and the cached attributes of p itself. listed holds the
// directories whose attributes were dropped already: a commit of many
// files in one directory needs that once.
func notifyPath(root *gofs.Inode, p string, listed map[*gofs.Inode]bool) {
	cur := root
	parts := strings.Split(p, "/")
	for i, name := range parts {
		child := cur.GetChild(name)
		if i == len(parts)-1 || child == nil {
			if !listed[cur] {
				listed[cur] = true
				cur.NotifyContent(0, 0) // its attributes, and any listing kept
			}
			cur.NotifyEntry(name)
			if child != nil {
				// A name keeps its inode when the file behind it changes
				// (Node.child), so cached pages below must go too.
				notifyTree(child)
			}
			return
		}
		cur = child
	}
}

// notifyTree drops cached data and attributes of every known inode below
// root, so that the next access asks the daemon (and gets ESTALE, or the
// file a commit put there), and stops their open handles from answering
// for their names.
func notifyTree(root *gofs.Inode) {
	if n, ok := root.Operations().(*Node); ok {
		n.forgetTops()
	}
	root.NotifyContent(0, 0)
	for name, c := range root.Children() {
		notifyTree(c)
		root.NotifyEntry(name)
	}
}
