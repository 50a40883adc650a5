package branch

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"

	"github.com/branchfs/branchfs/internal/lockcheck"
	"golang.org/x/sys/unix"
)

// Markers (store format 3) are those of the kernel's overlayfs, so that a
// delta is an overlayfs layer as it stands and an overlayfs upper layer is
// a delta (design.md, Markers). A tombstone is a 0/0 character device, a
// whiteout, which any user may make (Linux 5.8); an opaque directory (one
// deleted and made again in a branch, which hides everything below it at
// the same path) carries opaqueXattr = "y", overlayfs's own marker under
// its userxattr option. No user file can pass for either: a branch view
// refuses to make a 0/0 character device or to copy one up, and refuses
// internal xattrs, which copies drop. Format 1 (0/0 devices, and
// trusted.branchfs.opaque) and format 2 (empty files carrying
// user.branchfs.whiteout, and user.branchfs.opaque) are converted by Open
// (markers.go).
const opaqueXattr = "user.overlay.opaque"

// overlayPrefix starts the names of the xattrs overlayfs keeps for itself
// in its upper layer under userxattr: opaque, origin and impure (copy-up
// bookkeeping), uuid, and user.overlay.overlay.* for a user's own
// user.overlay.* xattrs, which it escapes. Views neither show nor take
// them, and a commit into the base drops them (layer.scrub).
const overlayPrefix = "user.overlay."

// IsInternalXattr reports names that belong to branchfs or to overlayfs
// and are never shown through a view nor accepted from one.
func IsInternalXattr(name string) bool {
	return strings.HasPrefix(name, overlayPrefix) || strings.HasPrefix(name, "trusted.overlay.") ||
		strings.HasPrefix(name, "user.branchfs.") || strings.HasPrefix(name, "trusted.branchfs.")
}

// layer is one directory of a view's stack: the base, or a branch's delta.
// Every access is resolved beneath its root with openat2, so neither a
// symlink nor ".." in the underlying tree can lead outside it.
//
// A branch's delta directory is made at the branch's first write, not at
// its creation: until then the layer is absent, holds nothing, and creating
// a branch costs one append to the state log.
type layer struct {
	dir   string
	dev   uint64
	delta bool // whiteouts and opaque markers are meaningful here

	mu     lockcheck.Mutex[lockcheck.LayerMake] // serializes making an absent layer's directory
	rootFd atomic.Int64                         // O_PATH descriptor of dir; -1 while absent or closed
	dirs   dirFds                               // of a view's own delta layer (see dirFd)
}

// dirFds keeps O_PATH descriptors of the directories of a view's own delta
// layer that requests named last: tar, cp and rm work in one directory
// after another, and each name of one then costs an *at call on it, not a
// walk of the path from the root with an open and a close. Only the view
// changes its own layer, and every change of a directory (mkdir, rmdir,
// rename, a copy-up, a child's commit) calls View.invalidate, which
// forgets them; a request that took a descriptor before runs concurrently
// with that change, and may see the directory as it was.
type dirFds struct {
	mu   lockcheck.Mutex[lockcheck.LayerDirs]
	ents [4]*dirFd
	next int    // the entry replaced next
	gen  uint64 // counts forget calls
}

type dirFd struct {
	rel  string
	fd   int
	refs int  // holders of fd, the cache not included
	gone bool // out of the cache: the last holder closes fd
}

// dirFd returns an O_PATH descriptor of directory rel beneath the layer
// root, and the function that gives it back. A delta layer's descriptors
// are kept for the next request (dirFds); use it only for a view's own
// layer. Preconditions: the view is locked (View.Lock).
func (l *layer) dirFd(rel string) (int, func(), error) {
	if rel == "" {
		if fd := l.fd(); fd >= 0 {
			return fd, func() {}, nil
		}
		return -1, nil, unix.ENOENT
	}
	if !l.delta {
		fd, err := l.open(rel, unix.O_PATH|unix.O_DIRECTORY, 0)
		if err != nil {
			return -1, nil, err
		}
		return fd, func() { unix.Close(fd) }, nil
	}
	c := &l.dirs
	c.mu.Lock()
	for _, d := range c.ents {
		if d != nil && d.rel == rel {
			d.refs++
			c.mu.Unlock()
			return d.fd, func() { c.put(d) }, nil
		}
	}
	gen := c.gen
	c.mu.Unlock()
	fd, err := l.open(rel, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return -1, nil, err
	}
	d := &dirFd{rel: rel, fd: fd, refs: 1}
	c.mu.Lock()
	if c.gen != gen {
		d.gone = true // opened before a change: not for later requests
	} else {
		if old := c.ents[c.next]; old != nil {
			c.drop(old)
		}
		c.ents[c.next] = d
		c.next = (c.next + 1) % len(c.ents)
	}
	c.mu.Unlock()
	return fd, func() { c.put(d) }, nil
}

func (c *dirFds) put(d *dirFd) {
	c.mu.Lock()
	if d.refs--; d.refs == 0 && d.gone {
		unix.Close(d.fd)
	}
	c.mu.Unlock()
}

// drop takes d out of the cache. Preconditions: c.mu held.
func (c *dirFds) drop(d *dirFd) {
	d.gone = true
	if d.refs == 0 {
		unix.Close(d.fd)
	}
}

// forget drops every kept descriptor: directories of the layer changed.
func (c *dirFds) forget() {
	c.mu.Lock()
	c.gen++
	for i, d := range c.ents {
		if d != nil {
			c.drop(d)
			c.ents[i] = nil
		}
	}
	c.mu.Unlock()
}

func openLayer(dir string, delta bool) (*layer, error) {
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: dir, Err: err}
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, err
	}
	l := &layer{dir: dir, dev: st.Dev, delta: delta}
	l.rootFd.Store(int64(fd))
	return l, nil
}

// absentLayer stands for a delta directory not made yet, on device dev.
func absentLayer(dir string, dev uint64) *layer {
	l := &layer{dir: dir, dev: dev, delta: true}
	l.rootFd.Store(-1)
	return l
}

func (l *layer) fd() int       { return int(l.rootFd.Load()) }
func (l *layer) present() bool { return l.fd() >= 0 }

func (l *layer) close() {
	l.dirs.forget()
	if fd := l.rootFd.Swap(-1); fd >= 0 {
		unix.Close(int(fd))
	}
}

// make creates an absent layer's directory with the mode, owner and times
// of like (the root it covers), in tmp and then renamed into place, so that
// a crash never leaves a half-made root.
func (l *layer) make(tmp string, like *unix.Stat_t) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.present() {
		return nil
	}
	if err := unix.Mkdir(tmp, like.Mode&07777); err != nil {
		return err
	}
	err := unix.Chown(tmp, int(like.Uid), int(like.Gid))
	if err == nil {
		err = unix.Chmod(tmp, like.Mode&07777)
	}
	if err == nil {
		err = unix.UtimesNano(tmp, []unix.Timespec{like.Atim, like.Mtim})
	}
	if err == nil {
		err = unix.Rename(tmp, l.dir)
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	fd, err := unix.Open(l.dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: l.dir, Err: err}
	}
	l.rootFd.Store(int64(fd))
	return nil
}

const resolveBeneath = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS

// maxWalk is the longest path one openat2 resolves: the kernel refuses
// paths of PATH_MAX bytes or more.
const maxWalk = unix.PathMax - 1

// open opens rel beneath the layer root. rel "" is the root itself.
func (l *layer) open(rel string, flags int, mode uint32) (int, error) {
	if rel == "" {
		rel = "."
	}
	how := unix.OpenHow{Flags: uint64(flags | unix.O_CLOEXEC), Mode: uint64(mode), Resolve: resolveBeneath}
	if flags&(unix.O_CREAT|unix.O_TMPFILE) == 0 {
		how.Mode = 0
	}
	root := l.fd()
	if root < 0 {
		return -1, unix.ENOENT
	}
	if len(rel) > maxWalk {
		return walkLong(root, rel, &how)
	}
	return openat2(root, rel, &how)
}

func openat2(dirfd int, rel string, how *unix.OpenHow) (int, error) {
	for {
		fd, err := unix.Openat2(dirfd, rel, how)
		if err == unix.EINTR || err == unix.EAGAIN {
			continue
		}
		return fd, err
	}
}

// walkLong opens a path longer than one openat2 takes, as the filesystem
// below allows (a view's paths are relative to its root, not to a working
// directory deep in it as the caller's are): directories of up to maxWalk
// bytes at a time, each walk beneath the directory the last one reached,
// so no step can leave the layer.
func walkLong(root int, rel string, how *unix.OpenHow) (int, error) {
	dir := unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: resolveBeneath}
	cur := root
	defer func() {
		if cur != root {
			unix.Close(cur)
		}
	}()
	for len(rel) > maxWalk {
		cut := strings.LastIndexByte(rel[:maxWalk+1], '/')
		if cut <= 0 {
			return -1, unix.ENAMETOOLONG // one name longer than any filesystem takes
		}
		next, err := openat2(cur, rel[:cut], &dir)
		if err != nil {
			return -1, err
		}
		if cur != root {
			unix.Close(cur)
		}
		cur, rel = next, rel[cut+1:]
	}
	return openat2(cur, rel, how)
}

// lstat stats rel without following a final symlink. The root and the
// names right under it take one fstatat instead of an open, an fstat and a
// close: a single name has no earlier component that a symlink or ".."
// could lead elsewhere.
func (l *layer) lstat(rel string) (unix.Stat_t, error) {
	var st unix.Stat_t
	if !strings.Contains(rel, "/") && rel != "." && rel != ".." {
		root := l.fd()
		if root < 0 {
			return st, unix.ENOENT
		}
		err := unix.Fstatat(root, rel, &st, unix.AT_SYMLINK_NOFOLLOW|unix.AT_EMPTY_PATH)
		return st, err
	}
	fd, err := l.open(rel, unix.O_PATH|unix.O_NOFOLLOW, 0)
	if err != nil {
		return st, err
	}
	err = unix.Fstat(fd, &st)
	unix.Close(fd)
	return st, err
}

// parent opens the directory holding rel and returns it with rel's last
// component, for the *at system calls that act on a single name.
func (l *layer) parent(rel string) (int, string, error) {
	dir, name := path.Split(rel)
	fd, err := l.open(strings.TrimSuffix(dir, "/"), unix.O_PATH|unix.O_DIRECTORY, 0)
	return fd, name, err
}

// isOpaque reports whether the directory rel (not the root) is marked opaque.
func (l *layer) isOpaque(rel string) bool {
	if !l.delta {
		return false
	}
	pfd, name, err := l.parent(rel)
	if err != nil {
		return false
	}
	defer unix.Close(pfd)
	return opaqueAt(pfd, name)
}

// opaqueAt reports whether name in directory dirfd carries the opaque
// marker: overlayfs takes only "y" for one.
func opaqueAt(dirfd int, name string) bool {
	var buf [2]byte
	n, err := getxattrAt(dirfd, name, opaqueXattr, buf[:])
	return err == nil && n == 1 && buf[0] == 'y'
}

func (l *layer) setOpaque(rel string) error {
	fd, err := l.open(rel, unix.O_PATH|unix.O_NOFOLLOW|unix.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Setxattr(procPath(fd), opaqueXattr, []byte("y"), 0)
}

// isWhiteout reports whether an entry of a delta whose attributes are st
// is a tombstone. This is the one test of a tombstone: the lookup, the
// listing, the commit and the scrub all use it.
func isWhiteout(st *unix.Stat_t) bool {
	return st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == 0
}

// isWhiteoutRel is isWhiteout for an entry of this layer.
func (l *layer) isWhiteoutRel(st *unix.Stat_t) bool { return l.delta && isWhiteout(st) }

// procPath names an O_PATH descriptor so that calls without an *at form
// (chmod, xattrs) act on exactly the file it refers to.
func procPath(fd int) string {
	return "/proc/self/fd/" + strconv.Itoa(fd)
}

func isNotExist(err error) bool {
	return errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR)
}

// JoinRel joins a view-relative directory and a name: the path of name in
// dir, "" being the view root.
func JoinRel(dir, name string) string {
	if dir == "" {
		return name
	}
	return dir + "/" + name
}

// scrub readies a tree that moves into the base, where nothing lies below
// to hide: it removes the tree's tombstones, its opaque markers (the root's
// own only when root is set) and what overlayfs keeps for itself. Overlayfs
// gives its copy-up bookkeeping only to what it copied up, and marks the
// directory that holds such an entry impure (it does so for a link or
// rename into a directory too), so only an impure directory's files need
// reading; every directory does.
func (l *layer) scrub(rel string, root bool) error {
	st, err := l.lstat(rel)
	if isNotExist(err) || err == nil && st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return nil
	}
	if err != nil {
		return err
	}
	fd, err := l.open(rel, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	impure, err := dropOverlayXattrs(procPath(fd), !root)
	if err != nil {
		return err
	}
	ents, err := l.readDirTyped(rel)
	if err != nil {
		return err
	}
	for _, d := range ents {
		typ := d.Type
		var cst unix.Stat_t
		if typ == syscall.DT_UNKNOWN || typ == syscall.DT_CHR {
			if err := unix.Fstatat(fd, d.Name, &cst, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				return err
			}
			typ = uint8((cst.Mode & unix.S_IFMT) >> 12)
		}
		switch {
		case typ == syscall.DT_CHR && isWhiteout(&cst):
			if err := unix.Unlinkat(fd, d.Name, 0); err != nil {
				return err
			}
		case typ == syscall.DT_DIR:
			if err := l.scrub(JoinRel(rel, d.Name), true); err != nil {
				return err
			}
		case typ == syscall.DT_REG && impure:
			if err := dropOverlayXattrsAt(fd, d.Name); err != nil {
				return err
			}
		}
	}
	return nil
}

// impureXattr marks a directory of overlayfs's upper layer that holds
// entries with copy-up bookkeeping (see scrub).
const impureXattr = overlayPrefix + "impure"

// originXattr, on a directory a view copied up from the base, says which
// directory that was: "DEV:INO:PATH". Where others may rename in the base,
// one of them can put another directory at that name before the commit,
// a private one of root's say, which the commit's setting of the
// branch's owner and mode would then give away (planDir refuses). Under
// overlayPrefix, so that a commit into the base drops it and no view
// shows it.
const originXattr = overlayPrefix + "branchfs.origin"

// hiddenXattr names the record, on the top layer's copy of a directory,
// of the base's directory name in it that the view removed (Rmdir): its
// originXattr value, which a commit checks before it removes or replaces
// the directory at that name in the base, as for originXattr.
func hiddenXattr(name string) string {
	sum := sha256.Sum256([]byte(name))
	return originXattr + "." + hex.EncodeToString(sum[:8])
}

// originOf is the value of originXattr for directory rel, open at fd.
func originOf(fd int, rel string) (string, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return "", err
	}
	return fmt.Sprintf("%d:%d:%s", st.Dev, st.Ino, rel), nil
}

// dropOverlayXattrs removes overlayfs's xattrs from the file at path p (a
// /proc path of a descriptor), but the opaque marker when keepOpaque, and
// reports whether the file was marked impure.
func dropOverlayXattrs(p string, keepOpaque bool) (impure bool, err error) {
	names, err := listXattrs(p)
	if errors.Is(err, unix.EOPNOTSUPP) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	for _, n := range names {
		if !strings.HasPrefix(n, overlayPrefix) || keepOpaque && n == opaqueXattr {
			continue
		}
		impure = impure || n == impureXattr
		if err := unix.Removexattr(p, n); err != nil && !errors.Is(err, unix.ENODATA) {
			return impure, err
		}
	}
	return impure, nil
}

// dropOverlayXattrsAt is dropOverlayXattrs for a regular file name in
// directory dirfd, which has no opaque marker.
func dropOverlayXattrsAt(dirfd int, name string) error {
	fd, err := unix.Openat(dirfd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	_, err = dropOverlayXattrs(procPath(fd), false)
	return err
}

func (l *layer) setDirMeta(rel string, m *dirMeta) error {
	pfd, name, err := l.parent(rel)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	if name == "" {
		name = "."
	}
	// All through one descriptor, checked to be the directory the
	// commit planned for (m.Dev, m.Ino) if it knows which: one put at
	// the name meanwhile must not get the branch's owner and mode.
	fd, err := unix.Openat(pfd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if m.Ino != 0 && (st.Dev != m.Dev || st.Ino != m.Ino) {
		return fmt.Errorf("%s: %w", rel, ErrReplaced)
	}
	if err := unix.Fchownat(fd, "", int(m.Uid), int(m.Gid), unix.AT_EMPTY_PATH); err != nil && !errors.Is(err, unix.EPERM) {
		return err
	}
	if err := unix.Chmod(procPath(fd), m.Mode); err != nil {
		return err
	}
	old, _ := listXattrs(procPath(fd))
	for _, n := range old {
		if _, keep := m.Xattrs[n]; !keep && !IsInternalXattr(n) {
			unix.Removexattr(procPath(fd), n)
		}
	}
	for n, v := range m.Xattrs {
		if err := unix.Setxattr(procPath(fd), n, v, 0); err != nil {
			return err
		}
	}
	ts := []unix.Timespec{unix.NsecToTimespec(m.Atime), unix.NsecToTimespec(m.Mtime)}
	return unix.UtimesNanoAt(unix.AT_FDCWD, procPath(fd), ts, 0)
}

// names lists every name in a layer directory, tombstones included.
func (l *layer) names(rel string) ([]string, error) {
	fd, err := l.open(rel, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	return fdNames(fd)
}

func fdNames(fd int) ([]string, error) {
	var names []string
	err := getdents(fd, func(d *unix.Dirent, name string) { names = append(names, name) })
	return names, err
}

// readDirTyped lists a layer directory with entry types, tombstones included.
func (l *layer) readDirTyped(rel string) ([]DirEntry, error) {
	return l.readDirMerge(rel, 0, nil, nil, nil, false)
}

func (l *layer) readlink(rel string) (string, error) {
	pfd, name, err := l.parent(rel)
	if err != nil {
		return "", err
	}
	defer unix.Close(pfd)
	return readlinkAt(pfd, name)
}

// readlinkAt is the target of symlink name in directory dirfd, or of
// dirfd itself (an O_PATH descriptor of the link) when name is "".
func readlinkAt(dirfd int, name string) (string, error) {
	buf := make([]byte, 4096)
	for {
		n, err := unix.Readlinkat(dirfd, name, buf)
		if err != nil {
			return "", err
		}
		if n < len(buf) {
			return string(buf[:n]), nil
		}
		buf = make([]byte, 2*len(buf))
	}
}

// readDirMerge appends the entries of rel not yet in seen (nil: keep all),
// without tombstones when hideWhiteouts, with attributes as readDir's skip
// says.
func (l *layer) readDirMerge(rel string, index int, seen map[string]bool, out []DirEntry, skip func(string) bool, hideWhiteouts bool) ([]DirEntry, error) {
	fd, err := l.open(rel, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return out, err
	}
	defer unix.Close(fd)
	var firstErr error
	err = getdents(fd, func(d *unix.Dirent, name string) {
		if rel == "" && isStageName(name) {
			return
		}
		if seen != nil {
			if seen[name] {
				return
			}
			seen[name] = true
		}
		de := DirEntry{Name: name, Type: d.Type, Ino: d.Ino, Layer: index}
		plus := skip != nil && !skip(name)
		// A tombstone is a character device; the type may be unknown.
		maybeTomb := hideWhiteouts && (d.Type == syscall.DT_CHR || d.Type == syscall.DT_UNKNOWN)
		if plus || maybeTomb {
			var st unix.Stat_t
			if err := unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				if !isNotExist(err) && firstErr == nil {
					firstErr = err
				}
				return // gone since getdents
			}
			if maybeTomb && isWhiteout(&st) {
				return
			}
			if plus {
				de.Stat = &st
			}
		}
		out = append(out, de)
	})
	if err == nil {
		err = firstErr
	}
	return out, err
}
