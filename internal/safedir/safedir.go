// Package safedir checks, and makes, directories that nobody but root and
// the effective user can change: where branchfs keeps what it later
// trusts (a store, the records of runs). A directory is such when it and
// every directory above it is owned by root or the user and is writable
// by neither its group nor others; a sticky directory (as /tmp) may be
// writable by others on the way, since only the owner of an entry there
// can move it, and the entry on the way is root's or the user's. This is
// the rule of ssh's StrictModes, with the exception Debian's ssh makes for
// a group that is the user's alone (user private groups, where umask 002
// makes directories group-writable).
//
// The path's symbolic links are resolved first, and the resolved path is
// then walked one directory at a time from /, each opened without
// following a link and checked through its descriptor: a link that
// appears meanwhile is refused, not followed. Callers use the resolved
// path, which nobody else can change once it is checked.
package safedir

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Error says which directory is not safe and why.
type Error struct {
	Path string
	Why  string
}

func (e *Error) Error() string { return e.Path + " " + e.Why }

// Check checks that nobody but root and the effective user can change the
// directory path or any directory above it (see the package comment), and
// returns path with its symbolic links resolved.
func Check(path string) (string, error) {
	return walk(path, false)
}

// Make is Check for a directory that is made, with mode 0700, if it is
// missing, and so are missing directories above it.
func Make(path string) (string, error) {
	return walk(path, true)
}

// MakePrivate is Make for a directory that must be the user's alone: its
// owner is the user and its mode 0700 (a looser mode is tightened).
func MakePrivate(path string) (string, error) {
	real, err := walk(path, true)
	if err != nil {
		return real, err
	}
	fd, err := unix.Open(real, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return real, &os.PathError{Op: "open", Path: real, Err: err}
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return real, &os.PathError{Op: "stat", Path: real, Err: err}
	}
	if st.Uid != uint32(os.Geteuid()) {
		return real, &Error{real, fmt.Sprintf("is owned by uid %d, not by you", st.Uid)}
	}
	if st.Mode&0o7077 != 0 {
		if err := unix.Fchmod(fd, 0o700); err != nil {
			return real, &os.PathError{Op: "chmod", Path: real, Err: err}
		}
	}
	return real, nil
}

// resolve returns the absolute, clean path with the symbolic links of its
// longest existing prefix resolved. A link on the way must be root's or
// the user's, in a directory that only they can change (a sticky one
// too, where only a link's owner may replace it), as the directories
// are: a link someone else made or could change would let them choose
// the directory, one of root's with a tmp in it, say, which a store
// empties.
func resolve(path string) (string, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", err
	}
	for links := 0; ; links++ {
		link, rest, err := firstLink(abs)
		if err != nil || link == "" {
			return abs, err
		}
		if links == 40 {
			return "", &os.PathError{Op: "resolve", Path: path, Err: unix.ELOOP}
		}
		if err := checkLink(link); err != nil {
			return "", err
		}
		target, err := os.Readlink(link)
		if err != nil {
			return "", err
		}
		if !filepath.IsAbs(target) {
			target = filepath.Join(filepath.Dir(link), target)
		}
		abs = filepath.Join(target, rest)
	}
}

// firstLink returns the first prefix of the absolute, clean path that is
// a symbolic link, and the rest of path after it; "" if there is none up
// to the first component that does not exist.
func firstLink(path string) (string, string, error) {
	cur := "/"
	names := strings.Split(strings.TrimPrefix(path, "/"), "/")
	for i, name := range names {
		if name == "" {
			continue
		}
		cur = filepath.Join(cur, name)
		fi, err := os.Lstat(cur)
		if errors.Is(err, os.ErrNotExist) {
			return "", "", nil
		}
		if err != nil {
			return "", "", err
		}
		if fi.Mode()&os.ModeSymlink != 0 {
			return cur, filepath.Join(names[i+1:]...), nil
		}
	}
	return "", "", nil
}

// checkLink checks that nobody but root and the user can have made or can
// change the symbolic link at link, a path without links before its last
// component.
func checkLink(link string) error {
	fd, err := walkResolved(filepath.Dir(link), false, false)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstatat(fd, filepath.Base(link), &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return &os.PathError{Op: "lstat", Path: link, Err: err}
	}
	if st.Mode&unix.S_IFMT == unix.S_IFLNK && st.Uid != 0 && st.Uid != uint32(os.Geteuid()) {
		return &Error{link, fmt.Sprintf("is a symbolic link owned by uid %d, not by root or you", st.Uid)}
	}
	return nil
}

func walk(path string, create bool) (string, error) {
	real, err := resolve(path)
	if err != nil {
		return "", err
	}
	fd, err := walkResolved(real, create, true)
	if err == nil {
		unix.Close(fd)
	}
	return real, err
}

// walkResolved walks real, a path without symbolic links, from / and
// returns the last directory open (O_PATH); strict: the last is checked
// as the directory asked about, else as one on the way.
func walkResolved(real string, create, strict bool) (fd int, err error) {
	fd, err = unix.Open("/", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, &os.PathError{Op: "open", Path: "/", Err: err}
	}
	defer func() {
		if err != nil {
			unix.Close(fd)
		}
	}()
	var names []string
	if real != "/" {
		names = strings.Split(real[1:], "/")
	}
	cur := "/"
	for i := 0; ; i++ {
		if err := checkDir(fd, cur, strict && i == len(names)); err != nil {
			return fd, err
		}
		if i == len(names) {
			return fd, nil
		}
		name := names[i]
		cur = filepath.Join(cur, name)
		next, err := openDir(fd, name)
		if errors.Is(err, unix.ENOENT) && create {
			// Made here, under a directory that is safe: nobody
			// else can have made it meanwhile, or replace it.
			if err = unix.Mkdirat(fd, name, 0o700); err == nil || errors.Is(err, unix.EEXIST) {
				next, err = openDir(fd, name)
			}
		}
		switch {
		case errors.Is(err, unix.ELOOP):
			return fd, &Error{cur, "is a symbolic link"}
		case errors.Is(err, unix.ENOTDIR):
			return fd, &Error{cur, "is not a directory"}
		case err != nil:
			return fd, &os.PathError{Op: "open", Path: cur, Err: err}
		}
		unix.Close(fd)
		fd = next
	}
}

func openDir(dirfd int, name string) (int, error) {
	return unix.Openat(dirfd, name, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
}

// checkDir checks the directory open at fd, named path; last says it is
// the one asked about, not a directory on the way to it.
func checkDir(fd int, path string, last bool) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return &os.PathError{Op: "stat", Path: path, Err: err}
	}
	if st.Uid != 0 && st.Uid != uint32(os.Geteuid()) {
		return &Error{path, fmt.Sprintf("is owned by uid %d, not by root or you", st.Uid)}
	}
	if st.Mode&0o022 == 0 || !last && st.Mode&unix.S_ISVTX != 0 {
		return nil
	}
	if st.Mode&0o002 == 0 && privateGroup(st.Gid) && !hasACL(fd) {
		return nil
	}
	who := "others"
	if st.Mode&0o002 == 0 {
		who = "its group"
		if hasACL(fd) {
			who = "the users and groups its ACL names"
		}
	}
	return &Error{path, fmt.Sprintf("is writable by %s (mode %04o)", who, st.Mode&0o7777)}
}

// hasACL reports whether the directory open at fd has an access ACL:
// its group bits are then the ACL's mask, which may let named users and
// groups write, not only the owning group.
func hasACL(fd int) bool {
	_, err := unix.Getxattr("/proc/self/fd/"+strconv.Itoa(fd), "system.posix_acl_access", nil)
	return err == nil
}

// privateGroup reports whether group gid is the effective user's alone:
// /etc/group lists no other member, and /etc/passwd gives it to no other
// user as their primary group.
func privateGroup(gid uint32) bool {
	me := uint32(os.Geteuid())
	passwd, err := os.ReadFile("/etc/passwd")
	if err != nil {
		return false
	}
	name := ""
	for line := range strings.Lines(string(passwd)) {
		// name:password:uid:gid:gecos:home:shell
		f := strings.Split(strings.TrimSpace(line), ":")
		if len(f) < 4 {
			continue
		}
		uid, err1 := strconv.ParseUint(f[2], 10, 32)
		g, err2 := strconv.ParseUint(f[3], 10, 32)
		if err1 != nil || err2 != nil {
			continue
		}
		if uint32(uid) == me {
			name = f[0]
		} else if uint32(g) == gid {
			return false
		}
	}
	group, err := os.ReadFile("/etc/group")
	if err != nil || name == "" {
		return false
	}
	for line := range strings.Lines(string(group)) {
		// name:password:gid:members
		f := strings.Split(strings.TrimSpace(line), ":")
		if len(f) < 4 {
			continue
		}
		if g, err := strconv.ParseUint(f[2], 10, 32); err != nil || uint32(g) != gid {
			continue
		}
		for m := range strings.SplitSeq(f[3], ",") {
			if m != "" && m != name {
				return false
			}
		}
		return true
	}
	return false
}
