package branch

import (
	"errors"
	"path"

	"golang.org/x/sys/unix"
)

// Open opens rel with open(2) flags. Opening for writing copies the file
// up first (without its data under O_TRUNC). The entry returned describes
// the file that was opened.
func (v *View) Open(rel string, flags int) (*File, *Entry, error) {
	var e *Entry
	var err error
	if OpensForWrite(flags) {
		e, err = v.CopyUp(rel, flags&unix.O_TRUNC == 0)
	} else {
		if fd, e := v.openRead(rel, flags); e != nil {
			return v.newFile(fd, flags, e), e, nil
		}
		e, err = v.Lookup(rel)
	}
	if err != nil {
		return nil, nil, err
	}
	fd, err := v.layers[e.Layer].open(rel, flags&openFlags|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, e, err
	}
	if flags&unix.O_TRUNC != 0 && e.Layer == 0 {
		v.recount(fd)
	}
	return v.newFile(fd, flags, e), e, nil
}

// openRead opens a regular file for reading the short way: straight from
// the first layer of its directory that has it, with the attributes taken
// from the open descriptor. Anything else (a tombstone, which fails to
// open, a symlink, a special file, an error) returns nil for Open's
// general path to decide.
func (v *View) openRead(rel string, flags int) (int, *Entry) {
	dir, _ := path.Split(rel)
	dl, err := v.dirLayers(trimSlash(dir))
	if err != nil {
		return -1, nil
	}
	for _, i := range dl {
		// O_NONBLOCK: a FIFO put there since the lookup must not hang us.
		fd, err := v.layers[i].open(rel, flags&openFlags|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
		if errors.Is(err, unix.ENOENT) {
			continue
		}
		if err != nil {
			return -1, nil
		}
		e := &Entry{Layer: i}
		if unix.Fstat(fd, &e.Stat) != nil || e.Stat.Mode&unix.S_IFMT != unix.S_IFREG {
			unix.Close(fd)
			return -1, nil
		}
		e.partLinks(rel)
		if flags&unix.O_NONBLOCK == 0 {
			if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFL, flags&openFlags&^unix.O_ACCMODE); err != nil {
				unix.Close(fd)
				return -1, nil
			}
		}
		return fd, e
	}
	return -1, nil
}

// OpensForWrite reports open(2) flags that open a file for writing, O_TRUNC
// included: Open copies the file up first if it is Lower.
func OpensForWrite(flags int) bool { return flags&(unix.O_WRONLY|unix.O_RDWR|unix.O_TRUNC) != 0 }

// openFlags are the open(2) flags passed on to the underlying file. The
// kernel adds internal bits (such as __FMODE_EXEC when a file is executed)
// that openat2 refuses.
const openFlags = unix.O_ACCMODE | unix.O_APPEND | unix.O_DIRECT | unix.O_DIRECTORY | unix.O_DSYNC |
	unix.O_SYNC | unix.O_NOATIME | unix.O_NONBLOCK | unix.O_LARGEFILE | unix.O_TRUNC
