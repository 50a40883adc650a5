package branch

import (
	"errors"
	"os"
	"path"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// opaqueXattr marks a delta directory that hides everything below it at the
// same path (a directory deleted and recreated in the branch). The trusted
// namespace needs CAP_SYS_ADMIN, so unprivileged daemons use user.
var opaqueXattr = func() string {
	if os.Geteuid() == 0 {
		return "trusted.branchfs.opaque"
	}
	return "user.branchfs.opaque"
}()

// IsInternalXattr reports names that belong to branchfs and are never shown
// through a view nor accepted from one.
func IsInternalXattr(name string) bool {
	return strings.HasPrefix(name, "trusted.branchfs.") || strings.HasPrefix(name, "user.branchfs.")
}

// layer is one directory of a view's stack: the base, or a branch's delta.
// Every access is resolved beneath its root with openat2, so neither a
// symlink nor ".." in the underlying tree can lead outside it.
type layer struct {
	dir   string
	fd    int // O_PATH directory descriptor of dir
	dev   uint64
	delta bool // whiteouts and opaque markers are meaningful here
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
	return &layer{dir: dir, fd: fd, dev: st.Dev, delta: delta}, nil
}

func (l *layer) close() {
	if l.fd >= 0 {
		unix.Close(l.fd)
		l.fd = -1
	}
}

const resolveBeneath = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS

// open opens rel beneath the layer root. rel "" is the root itself.
func (l *layer) open(rel string, flags int, mode uint32) (int, error) {
	if rel == "" {
		rel = "."
	}
	how := unix.OpenHow{Flags: uint64(flags | unix.O_CLOEXEC), Mode: uint64(mode), Resolve: resolveBeneath}
	if flags&(unix.O_CREAT|unix.O_TMPFILE) == 0 {
		how.Mode = 0
	}
	for {
		fd, err := unix.Openat2(l.fd, rel, &how)
		if err == unix.EINTR || err == unix.EAGAIN {
			continue
		}
		return fd, err
	}
}

// lstat stats rel without following a final symlink.
func (l *layer) lstat(rel string) (unix.Stat_t, error) {
	var st unix.Stat_t
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

// isOpaque reports whether the directory rel is marked opaque.
func (l *layer) isOpaque(rel string) bool {
	if !l.delta {
		return false
	}
	fd, err := l.open(rel, unix.O_PATH|unix.O_NOFOLLOW|unix.O_DIRECTORY, 0)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	_, err = unix.Getxattr(procPath(fd), opaqueXattr, nil)
	return err == nil
}

func (l *layer) setOpaque(rel string) error {
	fd, err := l.open(rel, unix.O_PATH|unix.O_NOFOLLOW|unix.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Setxattr(procPath(fd), opaqueXattr, []byte("y"), 0)
}

// isWhiteout reports a tombstone: a 0/0 character device, as overlayfs uses.
func isWhiteout(st *unix.Stat_t) bool {
	return st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == 0
}

// procPath names an O_PATH descriptor so that calls without an *at form
// (chmod, xattrs) act on exactly the file it refers to.
func procPath(fd int) string {
	return "/proc/self/fd/" + strconv.Itoa(fd)
}

func isNotExist(err error) bool {
	return errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR)
}

// joinRel joins a view-relative directory and a name.
func joinRel(dir, name string) string {
	if dir == "" {
		return name
	}
	return dir + "/" + name
}
