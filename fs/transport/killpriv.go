package transport

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// Wrap adds to fs the answers the daemon gives below go-fuse's node API:
// dropping setuid and setgid (killPriv), the umask under default ACLs
// (aclUmask) and directories the kernel opens by itself (rawDirs).
func Wrap(fs fuse.RawFileSystem) fuse.RawFileSystem {
	return &killPriv{&aclUmask{newRawDirs(fs)}}
}

// killPriv drops setuid and setgid where the kernel asks the daemon to
// (CAP_HANDLE_KILLPRIV_V2): writes, truncates and O_TRUNC opens by callers
// without CAP_FSETID. The daemon does these as root, so the filesystem
// below keeps the bits; without this, an O_TRUNC open would keep them too,
// since with atomic O_TRUNC the kernel sends no setattr after it. In
// return the kernel stops asking for security.capability before every
// write (one GETXATTR round trip each), and asks once per attribute
// refresh instead; it still removes capabilities itself.
type killPriv struct {
	fuse.RawFileSystem
}

// Writes come as Writev, or as Write where that is not implemented.
func (k *killPriv) Writev(cancel <-chan struct{}, in *fuse.WriteIn, data [][]byte) (uint32, fuse.Status) {
	if st := k.beforeWrite(cancel, in); !st.Ok() {
		return 0, st
	}
	return k.RawFileSystem.Writev(cancel, in, data)
}

func (k *killPriv) Write(cancel <-chan struct{}, in *fuse.WriteIn, data []byte) (uint32, fuse.Status) {
	if st := k.beforeWrite(cancel, in); !st.Ok() {
		return 0, st
	}
	return k.RawFileSystem.Write(cancel, in, data)
}

func (k *killPriv) beforeWrite(cancel <-chan struct{}, in *fuse.WriteIn) fuse.Status {
	if in.WriteFlags&fuse.WRITE_KILL_SUIDGID == 0 {
		return fuse.OK
	}
	return k.kill(cancel, in.InHeader, in.Fh, nil)
}

func (k *killPriv) Open(cancel <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	st := k.RawFileSystem.Open(cancel, in, out)
	if st.Ok() && in.Mode&fuse.OPEN_KILL_SUIDGID != 0 {
		if st = k.kill(cancel, in.InHeader, out.Fh, nil); !st.Ok() {
			k.RawFileSystem.Release(cancel, &fuse.ReleaseIn{InHeader: in.InHeader, Fh: out.Fh})
		}
	}
	return st
}

// Create: the kernel asks for the bits to be dropped on every O_TRUNC
// create without O_EXCL, not knowing whether the name exists; only a file
// that existed loses them, as on the filesystem below. Trying O_EXCL first
// tells which.
func (k *killPriv) Create(cancel <-chan struct{}, in *fuse.CreateIn, name string, out *fuse.CreateOut) fuse.Status {
	if in.OpenFlags&fuse.OPEN_KILL_SUIDGID == 0 || in.Flags&syscall.O_EXCL != 0 {
		return k.RawFileSystem.Create(cancel, in, name, out)
	}
	excl := *in
	excl.Flags |= syscall.O_EXCL
	if st := k.RawFileSystem.Create(cancel, &excl, name, out); st != fuse.Status(syscall.EEXIST) {
		return st
	}
	st := k.RawFileSystem.Create(cancel, in, name, out)
	if st.Ok() {
		h := in.InHeader
		h.NodeId = out.NodeId
		attr := fuse.AttrOut{Attr: out.Attr}
		if st = k.kill(cancel, h, out.Fh, &attr); st.Ok() {
			out.Attr = attr.Attr
		} else {
			k.RawFileSystem.Release(cancel, &fuse.ReleaseIn{InHeader: h, Fh: out.Fh})
			k.RawFileSystem.Forget(out.NodeId, 1)
		}
	}
	return st
}

// SetattrChanges are the attributes a setattr can change; without any, it
// is the kernel's own attempt to drop setuid before a write
// (file_remove_privs), which it leaves to us. Writes through passthrough
// reach the daemon only this way, and the backing file is written as
// root, which keeps the bits.
const SetattrChanges = fuse.FATTR_MODE | fuse.FATTR_UID | fuse.FATTR_GID | fuse.FATTR_SIZE |
	fuse.FATTR_ATIME | fuse.FATTR_MTIME | fuse.FATTR_ATIME_NOW | fuse.FATTR_MTIME_NOW | fuse.FATTR_CTIME

// SetAttr: a truncate, or the empty setattr before a write. A chown
// carries the flag too, but the chown below already dropped what the
// filesystem drops on chown.
func (k *killPriv) SetAttr(cancel <-chan struct{}, in *fuse.SetAttrIn, out *fuse.AttrOut) fuse.Status {
	st := k.RawFileSystem.SetAttr(cancel, in, out)
	if !st.Ok() {
		return st
	}
	fh, _ := in.GetFh()
	switch {
	case in.Valid&fuse.FATTR_KILL_SUIDGID != 0 && in.Valid&(fuse.FATTR_UID|fuse.FATTR_GID|fuse.FATTR_MODE) == 0:
		return k.kill(cancel, in.InHeader, fh, out)
	case in.Valid&SetattrChanges == 0 && in.Caller.Uid != 0:
		// The kernel sends it for setuid and setgid only to callers
		// without CAP_FSETID, and for file capabilities (which it
		// removed already) to anyone: uid 0 stands for CAP_FSETID.
		return k.kill(cancel, in.InHeader, fh, out)
	}
	return st
}

// SetXAttr: an ACL change by a caller outside the file's group and
// without CAP_FSETID drops setgid, as the filesystem below would for that
// caller but not for the daemon. The kernel decides, and says so with
// SETXATTR_ACL_KILL_SGID (sent only with CAP_SETXATTR_EXT).
func (k *killPriv) SetXAttr(cancel <-chan struct{}, in *fuse.SetXAttrIn, attr string, data []byte) fuse.Status {
	st := k.RawFileSystem.SetXAttr(cancel, in, attr, data)
	if !st.Ok() || in.SetXAttrFlags&fuse.SETXATTR_ACL_KILL_SGID == 0 {
		return st
	}
	var out fuse.AttrOut
	if st := k.RawFileSystem.GetAttr(cancel, &fuse.GetAttrIn{InHeader: in.InHeader}, &out); !st.Ok() || out.Mode&syscall.S_ISGID == 0 {
		return st
	}
	set := fuse.SetAttrIn{SetAttrInCommon: fuse.SetAttrInCommon{InHeader: in.InHeader, Valid: fuse.FATTR_MODE, Mode: out.Mode &^ syscall.S_ISGID & 07777}}
	return k.RawFileSystem.SetAttr(cancel, &set, &out)
}

// kill drops setuid, and setgid where the kernel would for an
// unprivileged caller: with group execute, or when the caller is not in
// the file's group. out, if given, receives the attributes after.
func (k *killPriv) kill(cancel <-chan struct{}, h fuse.InHeader, fh uint64, out *fuse.AttrOut) fuse.Status {
	var attr fuse.AttrOut
	get := fuse.GetAttrIn{InHeader: h}
	if fh != 0 {
		get.Flags_, get.Fh_ = fuse.FUSE_GETATTR_FH, fh
	}
	if st := k.RawFileSystem.GetAttr(cancel, &get, &attr); !st.Ok() {
		return st
	}
	mode := attr.Mode
	var drop uint32
	if mode&syscall.S_ISUID != 0 {
		drop |= syscall.S_ISUID
	}
	if mode&syscall.S_ISGID != 0 && (mode&syscall.S_IXGRP != 0 || !callerInGroup(h.Caller, attr.Gid)) {
		drop |= syscall.S_ISGID
	}
	if drop == 0 || mode&syscall.S_IFMT != syscall.S_IFREG {
		if out != nil {
			*out = attr
		}
		return fuse.OK
	}
	set := fuse.SetAttrIn{SetAttrInCommon: fuse.SetAttrInCommon{InHeader: h, Valid: fuse.FATTR_MODE, Mode: mode &^ drop & 07777}}
	if fh != 0 {
		set.Valid |= fuse.FATTR_FH
		set.Fh = fh
	}
	if out == nil {
		out = &attr
	}
	return k.RawFileSystem.SetAttr(cancel, &set, out)
}

// callerInGroup: gid is the caller's group or one of its supplementary
// groups (read from /proc; only files with setgid and no group execute
// get here).
func callerInGroup(c fuse.Caller, gid uint32) bool {
	if c.Gid == gid {
		return true
	}
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", c.Pid))
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		groups, ok := strings.CutPrefix(sc.Text(), "Groups:")
		if !ok {
			continue
		}
		for _, g := range strings.Fields(groups) {
			if n, err := strconv.ParseUint(g, 10, 32); err == nil && uint32(n) == gid {
				return true
			}
		}
		return false
	}
	return false
}
