package transport

import (
	"unsafe"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// notifyInvalEntry is FUSE_NOTIFY_INVAL_ENTRY, sent as a reply's error
// field with unique 0 (linux/fuse.h; go-fuse does not export it).
const notifyInvalEntry = 3

// RootID is the node ID of the mount's root.
const RootID = 1

// ExpireEntry makes the kernel's entry for name in directory parent (a node
// ID) expire without dropping it: the next walk through it asks the
// daemon, and the dentry and what hangs below it are freed then, or when
// memory runs short, instead of here. Dropping a name (go-fuse's
// NotifyEntry) evicts at once every inode below it that nothing holds,
// pages included: 10 ms for a 100 MB file written through the mount. It
// returns false when the kernel cannot expire only (before Linux 6.2),
// and the caller must drop the name instead.
func (l *Loop) ExpireEntry(parent uint64, name string) bool {
	if !l.expireOnly {
		return false
	}
	type invalEntryOut struct { // struct fuse_notify_inval_entry_out
		Parent  uint64
		NameLen uint32
		Flags   uint32
	}
	hdr, body := int(unsafe.Sizeof(fuse.OutHeader{})), int(unsafe.Sizeof(invalEntryOut{}))
	buf := make([]byte, hdr+body+len(name)+1) // the name ends in a NUL
	*(*fuse.OutHeader)(unsafe.Pointer(&buf[0])) = fuse.OutHeader{Length: uint32(len(buf)), Status: notifyInvalEntry}
	*(*invalEntryOut)(unsafe.Pointer(&buf[hdr])) = invalEntryOut{Parent: parent, NameLen: uint32(len(name)), Flags: fuse.EXPIRE_ONLY}
	copy(buf[hdr+body:], name)
	// ENOENT: the kernel holds no such entry, which is as good.
	_, err := unix.Write(l.fd, buf)
	return err == nil || err == unix.ENOENT
}
