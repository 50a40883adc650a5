package branch

import (
	"encoding/binary"
	"hash/fnv"
	"path"
	"sync"
	"unsafe"

	"github.com/branchfs/branchfs/internal/lockcheck"
	"golang.org/x/sys/unix"
)

// View is what one branch shows: its delta over its ancestors' deltas over
// the base. Paths are relative to the view root, "" being the root. The main
// view has the base as its only, writable, layer.
//
// Preconditions: the methods that look up or change paths (all but Name,
// IsMain, Check, CheckWritable, Lock, LockRoot and Unlock) run between Lock
// (or LockRoot) and Unlock, which hold the store's lock shared for the
// whole operation: a commit, which holds it exclusively, then never moves a
// file between an operation's lookup and its change.
type View struct {
	store  *Store
	br     *branch
	layers []*layer // top (writable) first
	id     uint64

	cacheMu  lockcheck.Mutex[lockcheck.ViewCache]
	cacheGen uint64
	dirs     map[string][]int  // directory -> indices of the layers it merges
	links    map[string]uint64 // merged directory -> subdirectories it lists (countLinks)
}

func (s *Store) newView(b *branch, layers []*layer) *View {
	return &View{store: s, br: b, layers: layers, id: s.nextView.Add(1) - 1, dirs: map[string][]int{},
		links: map[string]uint64{}}
}

// Name is the branch the view shows.
func (v *View) Name() string { return v.br.meta.Name }

// IsMain reports the view of the base.
func (v *View) IsMain() bool { return v.br.isMain() }

// Check fails with ErrStale or ErrGone once the branch can no longer be used.
func (v *View) Check() error { return v.br.State().err() }

// CheckWritable also refuses writes to a view that has live children: they
// see it as their lower layer, which must not move under them; to a view a
// kernel-path run holds, whose delta the kernel writes (hold.go); and to both
// sides of a commit that could neither finish nor roll back. It changes
// nothing: a write through a handle already open on the top layer needs no
// more than this check.
func (v *View) CheckWritable() error {
	if err := v.Check(); err != nil {
		return err
	}
	if v.br.liveChildren.Load() > 0 {
		return ErrFrozen
	}
	if v.br.held.Load() != nil {
		return ErrHeld
	}
	if c := v.store.unfinished.Load(); c != nil && (c.j.Name == v.br.meta.Name || c.j.Parent == v.br.meta.Name) {
		return ErrUnfinished
	}
	if j := v.store.owedDone.Load(); j != nil && j.Parent == v.br.meta.Name {
		return ErrUnfinished
	}
	return nil
}

// beginWrite is CheckWritable for an operation that writes to the top
// layer by path: it also makes the top layer's directory.
func (v *View) beginWrite() error {
	if err := v.CheckWritable(); err != nil {
		return err
	}
	return v.makeTop()
}

// makeTop makes the top layer's directory if nothing was written to the
// branch yet; its root starts as a copy of the root it covers.
func (v *View) makeTop() error {
	top := v.layers[0]
	if top.present() {
		return nil
	}
	below := v.layers[v.rootLayer()]
	st, err := below.lstat("")
	if err != nil {
		return err
	}
	return top.make(v.store.tmpName(), &st)
}

// rootLayer is the top-most layer whose directory exists; the base always
// does.
func (v *View) rootLayer() int {
	i := 0
	for !v.layers[i].present() && i < len(v.layers)-1 {
		i++
	}
	return i
}

// rootDirs returns the layers the root merges: every layer from the
// top-most present one down. No layer hides the root, so this needs no
// lookup.
func (v *View) rootDirs() []int {
	top := v.rootLayer()
	dirs := make([]int, 0, len(v.layers)-top)
	for i := top; i < len(v.layers); i++ {
		dirs = append(dirs, i)
	}
	return dirs
}

// Lock takes the store lock shared for the duration of a view operation.
func (v *View) Lock() error {
	v.store.mu.RLock()
	if err := v.Check(); err != nil {
		v.store.mu.RUnlock()
		return err
	}
	return nil
}

// Unlock releases what Lock took.
func (v *View) Unlock() { v.store.mu.RUnlock() }

// LockRoot is Lock for reading the attributes and ACLs of the view's root,
// which a stale branch keeps: the kernel checks them on the way to its
// control file, and a stale branch must stay reachable to be aborted.
func (v *View) LockRoot() error {
	v.store.mu.RLock()
	if err := v.Check(); err != nil && err != ErrStale {
		v.store.mu.RUnlock()
		return err
	}
	return nil
}

// invalidate forgets cached directory layering and link counts after the
// namespace changed.
func (v *View) invalidate() {
	v.forgetLayering(true)
}

// copiedUp forgets cached directory layering after a directory's copy-up,
// which changes what it merges but not what it lists.
func (v *View) copiedUp() {
	v.forgetLayering(false)
}

func (v *View) forgetLayering(links bool) {
	v.cacheMu.Lock()
	v.cacheGen++
	clear(v.dirs)
	if links {
		clear(v.links)
	}
	v.cacheMu.Unlock()
	v.layers[0].dirs.forget()
}

// Entry is what a path resolves to in a view.
type Entry struct {
	Layer int         // index of the layer that supplies the entry
	Stat  unix.Stat_t // from that layer
	dirs  []int       // for a directory, every layer it merges, top first
	root  bool        // the view's root
	// apart is the path of a name that a lower layer shows for a file
	// with several names (see partLinks).
	apart string
}

// partLinks makes an entry that a layer below the top shows, for a file
// with several names, stand for this name alone: a copy-up copies one name
// (as overlayfs without an index does), so in a branch the names are files
// of their own from the start, each with one link and an identity of its
// own (Identity). Were they one file to the kernel, a write through one
// name would copy up whichever name the kernel had for it.
func (e *Entry) partLinks(rel string) {
	if e.Lower() && e.Stat.Nlink > 1 && e.Stat.Mode&unix.S_IFMT != unix.S_IFDIR {
		e.apart = rel
		e.Stat.Nlink = 1
	}
}

// Lower reports an entry that a layer below the top shows: the first change
// to it copies it up.
func (e *Entry) Lower() bool { return e.Layer != 0 }

// IsDir reports a directory entry.
func (e *Entry) IsDir() bool { return e.Stat.Mode&unix.S_IFMT == unix.S_IFDIR }

// Identity is a stable identity for the file behind an entry: its inode
// number, and a generation that tells views and devices apart so that the
// same base file seen through two views, or a file and its copy-up, are
// different inodes to the kernel.
func (v *View) Identity(e *Entry) (ino, gen uint64) {
	if e.root {
		// The root keeps its identity when the branch's first write makes
		// its delta directory.
		return v.store.baseIno, v.id<<8 | v.store.devs[v.store.base.dev]
	}
	gen = v.id<<8 | v.store.devs[v.layers[e.Layer].dev]
	if e.apart != "" {
		// The inode number stays the file's, as readdir shows it; the
		// generation tells the names apart, its top bit from the others.
		h := fnv.New64a()
		h.Write(binary.LittleEndian.AppendUint64(nil, gen))
		h.Write([]byte(e.apart))
		gen = h.Sum64() | 1<<63
	}
	return e.Stat.Ino, gen
}

// Lookup resolves rel; for a directory, it also finds every layer the
// directory merges.
func (v *View) Lookup(rel string) (*Entry, error) { return v.resolve(rel, true) }

// Stat resolves rel like Lookup but stops at the layer that supplies the
// entry (the Entry has no merged layers). A directory's attributes are its
// top copy's, but for its link count (countLinks).
func (v *View) Stat(rel string) (*Entry, error) {
	e, err := v.resolve(rel, false)
	if err == nil && e.IsDir() {
		err = v.countLinks(rel, e)
	}
	return e, err
}

// countLinks sets the link count of directory entry e at rel to the one
// the kernel gives the directory the view shows: 2 and one for each
// subdirectory it lists. A directory that merges layers lists more than
// its top copy holds; the count is kept until the namespace changes.
func (v *View) countLinks(rel string, e *Entry) error {
	dirs, err := v.dirLayers(rel)
	if err != nil || len(dirs) < 2 {
		return err
	}
	v.cacheMu.Lock()
	n, ok := v.links[rel]
	gen := v.cacheGen
	v.cacheMu.Unlock()
	if !ok {
		if n, err = v.subdirs(rel, dirs); err != nil {
			return err
		}
		v.cacheMu.Lock()
		if v.cacheGen == gen {
			v.links[rel] = n
		}
		v.cacheMu.Unlock()
	}
	e.Stat.Nlink = 2 + n
	return nil
}

// subdirs counts the subdirectories that directory rel, which merges
// layers dirs, lists.
func (v *View) subdirs(rel string, dirs []int) (uint64, error) {
	ents, err := v.listLayers(rel, dirs, nil)
	if err != nil {
		return 0, err
	}
	var n uint64
	for _, d := range ents {
		if d.Type == unix.DT_UNKNOWN {
			st, err := v.layers[d.Layer].lstat(JoinRel(rel, d.Name))
			if err != nil {
				return 0, err
			}
			if st.Mode&unix.S_IFMT == unix.S_IFDIR {
				d.Type = unix.DT_DIR
			}
		}
		if d.Type == unix.DT_DIR {
			n++
		}
	}
	return n, nil
}

func (v *View) resolve(rel string, merge bool) (*Entry, error) {
	if rel == "" {
		dirs := v.rootDirs()
		st, err := v.layers[dirs[0]].lstat("")
		if err != nil {
			return nil, err
		}
		return &Entry{Layer: dirs[0], Stat: st, dirs: dirs, root: true}, nil
	}
	dir, name := path.Split(rel)
	dl, err := v.dirLayers(trimSlash(dir))
	if err != nil {
		return nil, err
	}
	return v.lookupIn(dl, rel, name, merge)
}

func trimSlash(s string) string {
	if len(s) > 0 && s[len(s)-1] == '/' {
		return s[:len(s)-1]
	}
	return s
}

// lookupIn walks the layers of rel's parent, top first, stopping at the
// first tombstone, non-directory or opaque directory; without merge, at the
// first entry.
func (v *View) lookupIn(parentLayers []int, rel, name string, merge bool) (*Entry, error) {
	e, _, err := v.lookupTomb(parentLayers, rel, name, merge)
	return e, err
}

// lookupTomb is lookupIn that also names the layer whose tombstone ended
// the walk, or -1.
func (v *View) lookupTomb(parentLayers []int, rel, name string, merge bool) (*Entry, int, error) {
	if name == "." || name == ".." || name == "" {
		return nil, -1, unix.EINVAL
	}
	if isStageName(rel) {
		return nil, -1, unix.ENOENT
	}
	var e *Entry
	tomb := -1
	for _, i := range parentLayers {
		st, tombHere, opaque, err := v.probe(i, rel, merge)
		if isNotExist(err) {
			continue
		}
		if err != nil {
			return nil, -1, err
		}
		if tombHere {
			tomb = i
			break
		}
		isDir := st.Mode&unix.S_IFMT == unix.S_IFDIR
		if e == nil {
			e = &Entry{Layer: i, Stat: st}
			if !isDir {
				e.partLinks(rel)
			}
			if !isDir || !merge {
				return e, -1, nil
			}
		} else if !isDir {
			break
		}
		e.dirs = append(e.dirs, i)
		if opaque {
			break
		}
	}
	if e == nil {
		return nil, tomb, unix.ENOENT
	}
	return e, tomb, nil
}

// probe looks rel up in layer i: its attributes, whether it is a tombstone
// and, for a directory if merge is set, whether it is opaque. In the view's
// own layer, a name below the root is looked up in its directory's kept
// descriptor (layer.dirFd): one fstatat, against an open, an fstat and a
// close, and the opaque mark without another open and close.
func (v *View) probe(i int, rel string, merge bool) (st unix.Stat_t, tomb, opaque bool, err error) {
	l := v.layers[i]
	dir, name := path.Split(rel)
	if i != 0 || !l.delta || dir == "" {
		if st, err = l.lstat(rel); err != nil {
			return st, false, false, err
		}
		if l.isWhiteoutRel(&st) {
			return st, true, false, nil
		}
		return st, false, merge && st.Mode&unix.S_IFMT == unix.S_IFDIR && l.isOpaque(rel), nil
	}
	pfd, done, err := l.dirFd(trimSlash(dir))
	if err != nil {
		return st, false, false, err
	}
	defer done()
	if err = unix.Fstatat(pfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return st, false, false, err
	}
	if isWhiteout(&st) {
		return st, true, false, nil
	}
	if merge && st.Mode&unix.S_IFMT == unix.S_IFDIR {
		opaque = opaqueAt(pfd, name)
	}
	return st, false, opaque, nil
}

// atShown calls fn with a directory (O_PATH) and a name in it that stand
// for rel in the layer that shows it, for the *at system calls: one walk
// of rel's parent, where a Stat and then an open of rel take two. The
// view root is "." in its top directory.
func (v *View) atShown(rel string, fn func(dirfd int, name string) error) error {
	dir, name := path.Split(rel)
	dir = trimSlash(dir)
	var layers []int
	if rel == "" {
		name, layers = ".", v.rootDirs()[:1]
	} else {
		if name == "." || name == ".." {
			return unix.EINVAL
		}
		var err error
		if layers, err = v.dirLayers(dir); err != nil {
			return err
		}
	}
	for _, i := range layers {
		l := v.layers[i]
		var pfd int
		var done func()
		var err error
		if i == 0 { // the view's own layer: its kept descriptor (layer.dirFd)
			pfd, done, err = l.dirFd(dir)
		} else if pfd, err = l.open(dir, unix.O_PATH|unix.O_DIRECTORY, 0); err == nil {
			done = func() { unix.Close(pfd) }
		}
		if isNotExist(err) {
			continue
		}
		if err != nil {
			return err
		}
		if l.delta {
			var st unix.Stat_t
			err = unix.Fstatat(pfd, name, &st, unix.AT_SYMLINK_NOFOLLOW)
			if err == nil && isWhiteout(&st) {
				done()
				return unix.ENOENT
			}
		}
		if err == nil {
			// In the base, fn's ENOENT tells that the name is not there.
			err = fn(pfd, name)
		}
		done()
		if !isNotExist(err) {
			return err
		}
	}
	return unix.ENOENT
}

// dirLayers returns the layers that directory rel merges, top first.
func (v *View) dirLayers(rel string) ([]int, error) {
	if rel == "" {
		return v.rootDirs(), nil
	}
	v.cacheMu.Lock()
	dl, ok := v.dirs[rel]
	gen := v.cacheGen
	v.cacheMu.Unlock()
	if ok {
		return dl, nil
	}
	parent, name := path.Split(rel)
	pl, err := v.dirLayers(trimSlash(parent))
	if err != nil {
		return nil, err
	}
	e, err := v.lookupIn(pl, rel, name, true)
	if err != nil {
		return nil, err
	}
	if !e.IsDir() {
		return nil, unix.ENOTDIR
	}
	v.cacheMu.Lock()
	if v.cacheGen == gen {
		v.dirs[rel] = e.dirs
	}
	v.cacheMu.Unlock()
	return e.dirs, nil
}

// lowerHas reports whether a layer below the top shows something at rel,
// that is, whether removing rel from the top needs a tombstone.
func (v *View) lowerHas(rel string) bool {
	if len(v.layers) == 1 {
		return false
	}
	dir, name := path.Split(rel)
	dl, err := v.dirLayers(trimSlash(dir))
	if err != nil {
		return false
	}
	var lower []int
	for _, i := range dl {
		if i > 0 {
			lower = append(lower, i)
		}
	}
	_, err = v.lookupIn(lower, rel, name, false)
	return err == nil
}

// DirEntry is one name of a merged directory listing.
type DirEntry struct {
	Name  string
	Type  uint8 // DT_* from getdents
	Ino   uint64
	Layer int          // the layer that shows it
	Stat  *unix.Stat_t // with ReadDirPlus, unless skipped
	apart string       // as Entry's
}

// Entry is what a listed name resolves to; the listing must come from
// ReadDirPlus.
func (d *DirEntry) Entry() *Entry { return &Entry{Layer: d.Layer, Stat: *d.Stat, apart: d.apart} }

// ReadDir lists directory rel: the union of its layers, without tombstoned
// names and without duplicates, top layer first.
func (v *View) ReadDir(rel string) ([]DirEntry, error) { return v.readDir(rel, nil) }

// ReadDirPlus is ReadDir with the attributes of every entry that skip does
// not name, taken from the directory already open: one system call a name.
func (v *View) ReadDirPlus(rel string, skip func(name string) bool) ([]DirEntry, error) {
	return v.readDir(rel, skip)
}

// readDir lists rel; with skip, as ReadDirPlus.
func (v *View) readDir(rel string, skip func(name string) bool) ([]DirEntry, error) {
	e, err := v.Lookup(rel)
	if err != nil {
		return nil, err
	}
	if !e.IsDir() {
		return nil, unix.ENOTDIR
	}
	out, err := v.listLayers(rel, e.dirs, skip)
	if err != nil {
		return nil, err
	}
	merged := len(e.dirs) > 1
	for i := range out {
		d := &out[i]
		if d.Stat == nil {
			continue
		}
		e := Entry{Layer: d.Layer, Stat: *d.Stat}
		switch {
		case e.IsDir() && merged:
			// Only a directory that merges layers may hold one
			// that does.
			if err := v.countLinks(JoinRel(rel, d.Name), &e); err != nil {
				return nil, err
			}
		case d.Stat.Nlink > 1: // partLinks decides
			e.partLinks(JoinRel(rel, d.Name))
		}
		*d.Stat, d.apart = e.Stat, e.apart
	}
	return out, nil
}

// listLayers lists directory rel as layers dirs show it: their union
// without tombstoned names and without duplicates, top layer first, with
// the attributes of every entry that skip does not name (none without
// skip).
func (v *View) listLayers(rel string, dirs []int, skip func(name string) bool) ([]DirEntry, error) {
	var seen map[string]bool
	if len(dirs) > 1 {
		seen = map[string]bool{}
	}
	var out []DirEntry
	var err error
	for _, i := range dirs {
		if !v.layers[i].present() {
			continue
		}
		if out, err = v.layers[i].readDirMerge(rel, i, seen, out, skip, v.layers[i].delta); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// direntBufs holds getdents buffers: a fresh 32 KiB buffer per listing
// is zeroed by the allocator first, which costs more than listing a small
// directory.
var direntBufs = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// getdents calls fn for every entry of directory fd but "." and "..".
func getdents(fd int, fn func(d *unix.Dirent, name string)) error {
	bp := direntBufs.Get().(*[]byte)
	defer direntBufs.Put(bp)
	buf := *bp
	for {
		n, err := unix.Getdents(fd, buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		if n <= 0 {
			return nil
		}
		for off := 0; off < n; {
			d := (*unix.Dirent)(unsafe.Pointer(&buf[off]))
			off += int(d.Reclen)
			if name := direntName(d); name != "." && name != ".." {
				fn(d, name)
			}
		}
	}
}

func direntName(d *unix.Dirent) string {
	b := (*[256]byte)(unsafe.Pointer(&d.Name[0]))
	for i := 0; i < len(b); i++ {
		if b[i] == 0 {
			return string(b[:i])
		}
	}
	return string(b[:])
}
