package remote

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path"
	"strconv"
	"strings"

	"github.com/branchfs/branchfs/branch"
	"golang.org/x/sys/unix"
)

// view is a branch's view (MNT or MNT/@NAME), walked as any program
// walks it, except that every path is resolved beneath its root and
// through no symlink: a manifest comes from a bucket, and a branch may
// hold a symlink where a directory was, so neither may lead a pull's
// writes, or a push's reads, out of the view.
type view struct {
	dir  string
	root int // O_PATH descriptor of dir
}

func openView(dir string) (*view, error) {
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: dir, Err: err}
	}
	return &view{dir: dir, root: fd}, nil
}

func (v *view) close() { unix.Close(v.root) }

const beneath = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS

// at opens rel beneath the root.
func (v *view) at(rel string, flags int, mode uint32) (int, error) {
	if rel == "" {
		rel = "."
	}
	how := unix.OpenHow{Flags: uint64(flags | unix.O_CLOEXEC | unix.O_NOFOLLOW), Resolve: beneath}
	if flags&unix.O_CREAT != 0 {
		how.Mode = uint64(mode)
	}
	for {
		fd, err := unix.Openat2(v.root, rel, &how)
		if err == unix.EINTR || err == unix.EAGAIN {
			continue
		}
		if err != nil {
			return -1, &os.PathError{Op: "open", Path: path.Join(v.dir, rel), Err: err}
		}
		return fd, nil
	}
}

// parent opens the directory holding rel, for the *at calls on its name.
func (v *view) parent(rel string) (int, string, error) {
	dir, name := path.Split(rel)
	fd, err := v.at(strings.TrimSuffix(dir, "/"), unix.O_PATH|unix.O_DIRECTORY, 0)
	return fd, name, err
}

// lstat stats rel without following it.
func (v *view) lstat(rel string) (unix.Stat_t, error) {
	var st unix.Stat_t
	pfd, name, err := v.parent(rel)
	if err != nil {
		return st, err
	}
	defer unix.Close(pfd)
	if err := unix.Fstatat(pfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return st, &os.PathError{Op: "stat", Path: path.Join(v.dir, rel), Err: err}
	}
	return st, nil
}

// missing reports an error that says a path is not there: no entry, or a
// directory on its way that is no directory (or a symlink, which a view's
// layering never follows either).
func missing(err error) bool {
	return errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP)
}

// version is what the view shows at rel, as a manifest records a base.
func (v *view) version(rel string) (Version, error) {
	st, err := v.lstat(rel)
	if missing(err) {
		return Version{Type: absent}, nil
	}
	if err != nil {
		return Version{}, err
	}
	ver := Version{Type: typeOf(st.Mode)}
	switch ver.Type {
	case "file":
		f, err := v.openFile(rel, unix.O_RDONLY, 0)
		if err != nil {
			return Version{}, err
		}
		defer f.Close()
		h := sha256.New()
		n, err := io.Copy(h, f)
		if err != nil {
			return Version{}, err
		}
		ver.Size, ver.SHA256 = n, hex.EncodeToString(h.Sum(nil))
	case "symlink":
		if ver.Target, err = v.readlink(rel); err != nil {
			return Version{}, err
		}
	}
	return ver, nil
}

func (v *view) openFile(rel string, flags int, mode uint32) (*os.File, error) {
	fd, err := v.at(rel, flags, mode)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), path.Join(v.dir, rel)), nil
}

func (v *view) readlink(rel string) (string, error) {
	pfd, name, err := v.parent(rel)
	if err != nil {
		return "", err
	}
	defer unix.Close(pfd)
	for size := 256; ; size *= 2 {
		buf := make([]byte, size)
		n, err := unix.Readlinkat(pfd, name, buf)
		if err != nil {
			return "", &os.PathError{Op: "readlink", Path: path.Join(v.dir, rel), Err: err}
		}
		if n < size {
			return string(buf[:n]), nil
		}
	}
}

// meta reads what the view shows at rel but a file's content.
func (v *view) meta(rel string) (Meta, error) {
	st, err := v.lstat(rel)
	if err != nil {
		return Meta{}, err
	}
	m := metaOf(&st)
	if m.Type == "symlink" {
		if m.Target, err = v.readlink(rel); err != nil {
			return Meta{}, err
		}
	}
	if m.Xattrs, err = v.xattrs(rel); err != nil {
		return Meta{}, err
	}
	return m, nil
}

func metaOf(st *unix.Stat_t) Meta {
	m := Meta{
		Type: typeOf(st.Mode), Mode: st.Mode & 07777, UID: st.Uid, GID: st.Gid,
		Atime: st.Atim.Nano(), Mtime: st.Mtim.Nano(),
	}
	switch m.Type {
	case "file":
		m.Size = st.Size
	case "char", "block":
		m.Rdev = st.Rdev
	}
	return m
}

// procPath names an O_PATH descriptor for the calls that have no *at
// form: the magic link leads to the file itself, a symlink included.
func procPath(fd int) string { return "/proc/self/fd/" + strconv.Itoa(fd) }

// xattrs reads the xattrs a view shows at rel (it hides its own).
func (v *view) xattrs(rel string) (map[string][]byte, error) {
	fd, err := v.at(rel, unix.O_PATH, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	names, err := listXattrs(procPath(fd))
	if err != nil {
		return nil, &os.PathError{Op: "listxattr", Path: path.Join(v.dir, rel), Err: err}
	}
	var out map[string][]byte
	for _, n := range names {
		val, err := getXattr(procPath(fd), n)
		if errors.Is(err, unix.ENODATA) {
			continue // removed since the listing
		}
		if err != nil {
			return nil, &os.PathError{Op: "getxattr " + n, Path: path.Join(v.dir, rel), Err: err}
		}
		if out == nil {
			out = map[string][]byte{}
		}
		out[n] = val
	}
	return out, nil
}

func listXattrs(p string) ([]string, error) {
	for {
		n, err := unix.Listxattr(p, nil)
		if errors.Is(err, unix.EOPNOTSUPP) {
			return nil, nil
		}
		if err != nil || n == 0 {
			return nil, err
		}
		buf := make([]byte, n)
		n, err = unix.Listxattr(p, buf)
		if errors.Is(err, unix.ERANGE) {
			continue
		}
		if err != nil {
			return nil, err
		}
		var names []string
		for _, s := range strings.Split(string(buf[:n]), "\x00") {
			if s != "" && !branch.IsInternalXattr(s) {
				names = append(names, s)
			}
		}
		return names, nil
	}
}

func getXattr(p, name string) ([]byte, error) {
	for {
		n, err := unix.Getxattr(p, name, nil)
		if err != nil {
			return nil, err
		}
		buf := make([]byte, n)
		n, err = unix.Getxattr(p, name, buf)
		if errors.Is(err, unix.ERANGE) {
			continue
		}
		if err != nil {
			return nil, err
		}
		return buf[:n], nil
	}
}

// removeAll removes rel and, for a directory, everything in it, through
// the view; rel missing is no error.
func (v *view) removeAll(rel string) error {
	pfd, name, err := v.parent(rel)
	if missing(err) {
		return nil
	}
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	if err := removeAt(pfd, name); err != nil && !missing(err) {
		return &os.PathError{Op: "remove", Path: path.Join(v.dir, rel), Err: err}
	}
	return nil
}

func removeAt(dirfd int, name string) error {
	err := unix.Unlinkat(dirfd, name, 0)
	if err != unix.EISDIR && err != unix.EPERM {
		return err
	}
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	d := os.NewFile(uintptr(fd), name)
	defer d.Close()
	// All names first: removing entries while reading would move the
	// offsets the listing goes on from.
	names, err := d.Readdirnames(-1)
	if err != nil {
		return err
	}
	for _, n := range names {
		if err := removeAt(fd, n); err != nil && err != unix.ENOENT {
			return err
		}
	}
	return unix.Unlinkat(dirfd, name, unix.AT_REMOVEDIR)
}
