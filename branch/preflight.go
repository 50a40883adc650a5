package branch

import (
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// Inode flags (FS_IOC_GETFLAGS) under which the kernel refuses to rename,
// replace or change a file, even for root: chattr +i and +a.
const (
	fsImmutableFl = 0x10
	fsAppendFl    = 0x20
)

// preflight checks, before anything moves, what would stop a step that can
// be known in advance: an immutable or append-only file or directory that a
// step renames, replaces or changes, or a directory a step writes that is
// on a read-only filesystem or (for a daemon without root) not writable.
// What cannot be checked (space for a directory to grow, I/O errors) makes
// the commit roll back instead.
func (c *commitRun) preflight() error {
	dirs := map[*dirCache]map[string]bool{c.src: {}, c.target: {}}
	checkDir := func(d *dirCache, rel string) error {
		dir := filepath.Dir("/" + rel)[1:]
		if dirs[d][dir] {
			return nil
		}
		dirs[d][dir] = true
		fd, err := d.l.open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
		if isNotExist(err) {
			return nil // made by an earlier step
		}
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		if err := checkFlags(fd, d.l.dir, dir); err != nil {
			return err
		}
		if err := unix.Faccessat(fd, ".", unix.W_OK|unix.X_OK, unix.AT_EACCESS); err != nil {
			return &os.PathError{Op: "commit", Path: filepath.Join(d.l.dir, dir), Err: err}
		}
		return nil
	}
	checkEntry := func(d *dirCache, rel string) error {
		pfd, name, err := d.parent(rel)
		if isNotExist(err) {
			return nil
		}
		if err != nil {
			return err
		}
		// statx reports the two flags, where the filesystem says so, in
		// one call, without opening the file.
		var stx unix.Statx_t
		if err := unix.Statx(pfd, name, unix.AT_SYMLINK_NOFOLLOW, unix.STATX_TYPE, &stx); isNotExist(err) {
			return nil
		} else if err != nil {
			return err
		}
		const flags = unix.STATX_ATTR_IMMUTABLE | unix.STATX_ATTR_APPEND
		if stx.Attributes_mask&flags == flags {
			if stx.Attributes&flags != 0 {
				return fmt.Errorf("%s is immutable or append-only (chattr): %w", filepath.Join(d.l.dir, rel), unix.EPERM)
			}
			return nil
		}
		// Only regular files and directories carry these flags, and only
		// they can be opened without side effects.
		if t := uint32(stx.Mode) & unix.S_IFMT; t != unix.S_IFREG && t != unix.S_IFDIR {
			return nil
		}
		fd, err := unix.Openat(pfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil // the step itself will tell
		}
		defer unix.Close(fd)
		return checkFlags(fd, d.l.dir, rel)
	}
	for _, o := range c.j.Ops {
		if err := checkDir(c.target, o.Dst); err != nil {
			return err
		}
		if err := checkEntry(c.target, o.Dst); err != nil {
			return err
		}
		if o.Src != "" {
			if err := checkDir(c.src, o.Src); err != nil {
				return err
			}
			if err := checkEntry(c.src, o.Src); err != nil {
				return err
			}
		}
	}
	return nil
}

// checkFlags fails with EPERM if the file open at fd is immutable or
// append-only. Filesystems without the flags have none set.
func checkFlags(fd int, root, rel string) error {
	flags, err := unix.IoctlGetUint32(fd, unix.FS_IOC_GETFLAGS)
	if err != nil || flags&(fsImmutableFl|fsAppendFl) == 0 {
		return nil
	}
	return fmt.Errorf("%s is immutable or append-only (chattr): %w", filepath.Join(root, rel), unix.EPERM)
}
