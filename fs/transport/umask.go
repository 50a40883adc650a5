package transport

import (
	"github.com/hanwen/go-fuse/v2/fuse"
)

// aclUmask applies the caller's umask to the mode of a new file, directory
// or node, unless the parent directory has a default ACL: then, as on the
// filesystem below, the default ACL alone decides, and the umask is not
// used. With CAP_DONT_MASK the kernel leaves this to us and sends the
// umask; without it, the kernel would apply the umask always. The daemon's
// own umask is 0.
type aclUmask struct {
	fuse.RawFileSystem
}

func (a *aclUmask) Create(cancel <-chan struct{}, in *fuse.CreateIn, name string, out *fuse.CreateOut) fuse.Status {
	in.Mode = a.mask(cancel, in.InHeader, in.Mode, in.Umask)
	return a.RawFileSystem.Create(cancel, in, name, out)
}

func (a *aclUmask) Mkdir(cancel <-chan struct{}, in *fuse.MkdirIn, name string, out *fuse.EntryOut) fuse.Status {
	in.Mode = a.mask(cancel, in.InHeader, in.Mode, in.Umask)
	return a.RawFileSystem.Mkdir(cancel, in, name, out)
}

func (a *aclUmask) Mknod(cancel <-chan struct{}, in *fuse.MknodIn, name string, out *fuse.EntryOut) fuse.Status {
	in.Mode = a.mask(cancel, in.InHeader, in.Mode, in.Umask)
	return a.RawFileSystem.Mknod(cancel, in, name, out)
}

// mask returns mode without the umask's bits, unless the directory the
// request names (parent) has a default ACL.
func (a *aclUmask) mask(cancel <-chan struct{}, parent fuse.InHeader, mode, umask uint32) uint32 {
	if umask&0o777 == 0 {
		return mode
	}
	if _, st := a.RawFileSystem.GetXAttr(cancel, &parent, "system.posix_acl_default", nil); st.Ok() {
		return mode
	}
	return mode &^ (umask & 0o777)
}
