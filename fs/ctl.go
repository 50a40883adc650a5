package fs

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"

	"github.com/branchfs/branchfs/branch"
	"github.com/branchfs/branchfs/ctl"
	"github.com/branchfs/branchfs/fs/transport"
	"github.com/branchfs/branchfs/internal/lockcheck"
	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// The control file at the root of every view serves the protocol of
// package ctl: the same actions as the ioctls, as text (VERB or VERB:ARG,
// space around it ignored). Reading it returns the answer to the last
// command written on that handle (the new name, a ctl.Status or a
// branch.Diff as JSON), or the Status. A name (create:NAME) is taken as
// written, or, when it starts with a double quote, as a JSON string
// (ctl.QuoteArg).

func (n *Node) controlInode(ctx context.Context, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	c := &ctlNode{fsys: n.fsys, view: n.view}
	c.fillAttr(&out.Attr)
	out.SetEntryTimeout(n.fsys.opts.Timeout)
	ino, gen := uint64(ctl.ControlIno), n.StableAttr().Gen
	return n.NewInode(ctx, c, gofs.StableAttr{Mode: syscall.S_IFREG, Ino: ino, Gen: gen}), 0
}

type ctlNode struct {
	gofs.Inode
	fsys *FS
	view *branch.View
}

// fillAttr: the kernel lets the mount's user, and the control group when
// there is one, open the control file; the daemon checks each command too.
func (c *ctlNode) fillAttr(a *fuse.Attr) {
	a.Mode = syscall.S_IFREG | 0o600
	a.Nlink = 1
	a.Owner = fuse.Owner{Uid: c.fsys.owner, Gid: uint32(os.Getegid())}
	if g := c.fsys.opts.ControlGroup; g != nil {
		a.Mode |= 0o060
		a.Gid = *g
	}
	t := uint64(c.fsys.start.Unix())
	a.Atime, a.Mtime, a.Ctime = t, t, t
}

func (c *ctlNode) Getattr(ctx context.Context, fh gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	c.fillAttr(&out.Attr)
	return 0
}

// Setattr accepts the truncation that `echo cmd > .branchfs_ctl` asks for.
func (c *ctlNode) Setattr(ctx context.Context, fh gofs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if in.Valid&^(fuse.FATTR_SIZE|fuse.FATTR_FH|fuse.FATTR_LOCKOWNER) != 0 {
		return syscall.EPERM
	}
	c.fillAttr(&out.Attr)
	out.Ino = c.StableAttr().Ino // see finishSetattr
	return 0
}

func (c *ctlNode) Open(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	return &ctlHandle{ctl: c}, fuse.FOPEN_DIRECT_IO, 0
}

func (c *ctlNode) Ioctl(ctx context.Context, f gofs.FileHandle, cmd uint32, arg uint64, input, output []byte) (int32, syscall.Errno) {
	return c.fsys.ioctl(ctx, c.view, cmd, arg, output)
}

func (n *Node) Ioctl(ctx context.Context, f gofs.FileHandle, cmd uint32, arg uint64, input, output []byte) (int32, syscall.Errno) {
	return n.fsys.ioctl(ctx, n.view, cmd, arg, output)
}

// A ctlHandle holds the answer to its last command (resp), which a write
// sets without a lock, since a write on the request loop's reader cannot
// wait once its command has run. mu makes the first reads without one
// run a single list between them.
type ctlHandle struct {
	ctl  *ctlNode
	mu   lockcheck.Mutex[lockcheck.CtlAnswer]
	resp atomic.Pointer[[]byte]
}

func (h *ctlHandle) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	resp := h.resp.Load()
	if resp == nil {
		if transport.OnReader(ctx) {
			return nil, transport.OnWorker // the list waits for the store's lock
		}
		h.mu.Lock()
		if resp = h.resp.Load(); resp == nil {
			list, err := h.ctl.fsys.command(ctx, h.ctl.view, ctl.CmdList)
			if err != nil {
				h.mu.Unlock()
				return nil, toErrno(err)
			}
			resp = &list
			h.resp.Store(resp)
		}
		h.mu.Unlock()
	}
	r := *resp
	if off >= int64(len(r)) {
		return fuse.ReadResultData(nil), 0
	}
	return fuse.ReadResultData(r[off:min(off+int64(len(dest)), int64(len(r)))]), 0
}

func (h *ctlHandle) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	resp, err := h.ctl.fsys.command(ctx, h.ctl.view, strings.TrimSpace(string(data)))
	if err != nil {
		return 0, toErrno(err)
	}
	h.resp.Store(&resp)
	return uint32(len(data)), 0
}

func (h *ctlHandle) Ioctl(ctx context.Context, cmd uint32, arg uint64, input, output []byte) (int32, syscall.Errno) {
	return h.ctl.fsys.ioctl(ctx, h.ctl.view, cmd, arg, output)
}

func (f *FS) ioctl(ctx context.Context, v *branch.View, cmd uint32, arg uint64, output []byte) (int32, syscall.Errno) {
	switch cmd {
	case ctl.FS_IOC_BRANCH_CREATE, ctl.FS_IOC_BRANCH_COMMIT, ctl.FS_IOC_BRANCH_ABORT:
	default:
		return 0, syscall.ENOTTY
	}
	wait := !transport.OnReader(ctx)
	if cmd == ctl.FS_IOC_BRANCH_CREATE && !wait {
		// The kernel copies the name out after the reply; a buffer it
		// cannot write to must fail before the branch exists. Reaching
		// into the caller's memory, or only taking its lock, may wait
		// for a fault in a page of a file of this very mount, which the
		// reader would never answer: that is left to a worker.
		return 0, transport.OnWorker
	}
	if err := f.authorize(ctx); err != nil {
		return 0, toErrno(err)
	}
	switch cmd {
	case ctl.FS_IOC_BRANCH_CREATE:
		if errno := callerBufferWritable(ctx, arg, len(output)); errno != 0 {
			return 0, errno
		}
		name, err := f.create(v, "", wait)
		if err != nil {
			return 0, toErrno(err)
		}
		clear(output)
		copy(output[:len(output)-1], name)
		return 0, 0
	case ctl.FS_IOC_BRANCH_COMMIT:
		return 0, toErrno(f.commit(v, wait))
	case ctl.FS_IOC_BRANCH_ABORT:
		return 0, toErrno(f.abort(v, false, wait))
	}
	return 0, syscall.ENOTTY
}

// command runs one control-file command for view v. On the request
// loop's reader (transport.OnReader) only create, commit and abort run,
// and only if the store's lock is free at once; the others may wait for
// it, or for the daemon's own files, and fail with branch.ErrWouldWait.
func (f *FS) command(ctx context.Context, v *branch.View, cmd string) ([]byte, error) {
	verb, arg, _ := strings.Cut(cmd, ":")
	wait := !transport.OnReader(ctx)
	if !wait && verb != ctl.CmdCreate && verb != ctl.CmdCommit && verb != ctl.CmdAbort {
		return nil, branch.ErrWouldWait
	}
	if err := f.authorize(ctx); err != nil {
		return nil, err
	}
	switch {
	case verb == ctl.CmdCreate:
		name, err := ctl.UnquoteArg(arg)
		if err != nil {
			return nil, err
		}
		name, err = f.create(v, name, wait)
		return []byte(name + "\n"), err
	case verb == ctl.CmdCommit && arg == "":
		return nil, f.commit(v, wait)
	case verb == ctl.CmdAbort && (arg == "" || arg == ctl.ArgRecursive):
		return nil, f.abort(v, arg == ctl.ArgRecursive, wait)
	case verb == ctl.CmdList && (arg == "" || arg == ctl.ArgAll):
		st := ctl.Status{View: v.Name(), Base: f.store.Base(), Store: f.store.Dir(), Branches: f.store.List(arg == ctl.ArgAll)}
		return json.MarshalIndent(&st, "", "  ")
	case verb == ctl.CmdHold && arg == "":
		return f.hold(ctx, v)
	case verb == ctl.CmdRelease && arg == "":
		return nil, f.releaseCmd(ctx, v)
	case verb == ctl.CmdWatch:
		return nil, f.watch(ctx, v, arg)
	case verb == ctl.CmdUnwatch && arg == "":
		return nil, f.unwatch(ctx, v)
	case verb == ctl.CmdLimit:
		return nil, f.limit(v, arg)
	case verb == ctl.CmdPublish:
		var a ctl.PublishArg
		if err := json.Unmarshal([]byte(arg), &a); err != nil {
			return nil, fmt.Errorf("%w: publish argument %q", branch.ErrInvalidData, arg)
		}
		gen, err := f.store.PublishData(v.Name(), a.Area, a.Staged)
		if err != nil {
			return nil, err
		}
		return []byte(strconv.Itoa(gen) + "\n"), nil
	case verb == ctl.CmdDiff && arg == "":
		d, err := f.store.Diff(v.Name())
		if err != nil {
			return nil, err
		}
		return json.MarshalIndent(d, "", "  ")
	case verb == ctl.CmdDelta && arg == "":
		d, err := f.store.Delta(v.Name())
		if err != nil {
			return nil, err
		}
		return json.Marshal(d)
	}
	return nil, fmt.Errorf("unknown control command %q: %w", cmd, syscall.EINVAL)
}

// limit sets the storage limit of v's branch to arg bytes.
func (f *FS) limit(v *branch.View, arg string) error {
	n, err := strconv.ParseInt(arg, 10, 64)
	if err != nil || n < 0 {
		return fmt.Errorf("%w %q", branch.ErrInvalidLimit, arg)
	}
	f.settleHold(v.Name())
	if f.passWriting(v) {
		// Those writes bypass the daemon, which counts them.
		return fmt.Errorf("files are open for writing with passthrough in %s: %w", v.Name(), syscall.EBUSY)
	}
	return f.store.SetLimit(v.Name(), n)
}

// create, commit and abort run a command for view v. Unless wait, they
// fail with branch.ErrWouldWait, having done nothing, rather than wait
// for the store's lock (as settling a kernel-path run's hold would).
func (f *FS) create(v *branch.View, name string, wait bool) (string, error) {
	if !f.settleHoldOrRefuse(v.Name(), wait) {
		return "", branch.ErrWouldWait
	}
	if f.passWriting(v) {
		// Those writes would reach the view's files under the new branch.
		return "", fmt.Errorf("files are open for writing with passthrough in %s: %w", v.Name(), syscall.EBUSY)
	}
	create := f.store.Create
	if !wait {
		create = f.store.TryCreate
	}
	child, err := create(name, v.Name())
	if err != nil {
		return "", err
	}
	// The kernel caches no negative entry for a branch name (Lookup), but
	// it may hold a base file of that name, or a gone view's root that
	// something still holds (a working directory there).
	if f.root.GetChild(ctl.BranchPrefix+child.Name()) != nil {
		f.loop.ServeWhile(func() { f.root.NotifyEntry(ctl.BranchPrefix + child.Name()) })
	}
	f.branchesChanged()
	return child.Name(), nil
}

// branchesChanged drops the kernel's listing of the mount's root when it
// shows the branches (Options.ListBranches).
func (f *FS) branchesChanged() {
	if f.opts.ListBranches {
		// The kernel drops the cached listing page by page, waiting for
		// each page's lock, which a getdents copying into a buffer that
		// faults in a page of this mount may hold.
		f.loop.ServeWhile(func() { f.root.NotifyContent(0, 0) })
	}
}

func (f *FS) commit(v *branch.View, wait bool) error {
	if f.passWriting(v) {
		// Those writes would go on reaching the committed files.
		return fmt.Errorf("files are open for writing with passthrough in %s: %w", v.Name(), syscall.EBUSY)
	}
	if !f.settleHoldOrRefuse(v.Name(), wait) {
		return branch.ErrWouldWait
	}
	commit := f.store.Commit
	if !wait {
		commit = f.store.TryCommit
	}
	res, err := commit(v.Name())
	if err != nil {
		return err
	}
	// A stale branch's kernel-path run cannot be told ESTALE: it ends.
	f.killHolders(append(res.Stale, res.Dropped...))
	f.loop.ServeWhile(func() { f.afterCommit(v.Name(), res) })
	f.branchesChanged()
	return nil
}

func (f *FS) abort(v *branch.View, recursive, wait bool) error {
	abort := f.store.Abort
	if !wait {
		abort = f.store.TryAbort
	}
	dropped, err := abort(v.Name(), recursive)
	if err != nil {
		return err
	}
	f.killHolders(dropped)
	f.loop.ServeWhile(func() { f.viewsEnded(dropped) })
	f.branchesChanged()
	return nil
}
