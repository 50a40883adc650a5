package fs

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/branchfs/branchfs/branch"
	"github.com/branchfs/branchfs/ctl"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// Holds of kernel-path runs (branch/hold.go). The process that writes
// ctl.CmdHold to a branch's control file (a run's first process, which then
// mounts overlayfs over the layers it gets) holds the branch until it is
// gone: the daemon keeps a pidfd of it, releases the hold when it exits,
// and kills it when the branch goes stale or is aborted, since the kernel
// cannot answer ESTALE inside the run. Killing a run's first process ends
// its PID namespace, and with it every process of the run.

// holder is one hold: the holding process and the hold's work directory.
type holder struct {
	name  string
	work  string
	pid   int // the holding process, in the daemon's PID namespace
	pidfd int
	once  sync.Once // release
}

// hold holds view v's branch for the caller and returns the layers, as
// JSON, for ctl.CmdHold.
func (f *FS) hold(ctx context.Context, v *branch.View) ([]byte, error) {
	tgid, err := callerProcess(ctx)
	if err != nil {
		return nil, fmt.Errorf("hold: %w", err)
	}
	pidfd, err := unix.PidfdOpen(tgid, 0)
	if err != nil {
		return nil, fmt.Errorf("hold: %w", err)
	}
	if f.passWriting(v) {
		unix.Close(pidfd)
		return nil, fmt.Errorf("files are open for writing with passthrough in %s: %w", v.Name(), syscall.EBUSY)
	}
	f.settleHold(v.Name())
	ls, err := f.store.Hold(v.Name())
	if err != nil {
		unix.Close(pidfd)
		return nil, err
	}
	h := &holder{name: v.Name(), work: ls.Work.Path, pid: tgid, pidfd: pidfd}
	f.holdMu.Lock()
	if f.holds == nil {
		f.holds = map[string]*holder{}
	}
	f.holds[h.name] = h
	f.holdMu.Unlock()
	go f.watchHolder(h)
	return json.Marshal(ls)
}

// callerProcess is the process that made the request.
func callerProcess(ctx context.Context) (int, error) {
	c, ok := fuse.FromContext(ctx)
	if !ok || c.Pid == 0 {
		return 0, fmt.Errorf("the caller is not visible from the daemon's PID namespace: %w", syscall.EPERM)
	}
	return threadGroup(int(c.Pid))
}

// threadGroup is the process that thread tid belongs to: a request names
// the calling thread.
func threadGroup(tid int) (int, error) {
	fh, err := os.Open("/proc/" + strconv.Itoa(tid) + "/status")
	if err != nil {
		return 0, err
	}
	defer fh.Close()
	sc := bufio.NewScanner(fh)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "Tgid:"); ok {
			return strconv.Atoi(strings.TrimSpace(v))
		}
	}
	return 0, fmt.Errorf("no Tgid in /proc/%d/status", tid)
}

// watchHolder releases h's hold once its process has exited.
func (f *FS) watchHolder(h *holder) {
	fds := []unix.PollFd{{Fd: int32(h.pidfd), Events: unix.POLLIN}}
	for {
		if _, err := unix.Poll(fds, -1); err != unix.EINTR {
			break
		}
	}
	f.release(h)
}

// exited reports whether h's process has exited.
func (h *holder) exited() bool {
	fds := []unix.PollFd{{Fd: int32(h.pidfd), Events: unix.POLLIN}}
	n, err := unix.Poll(fds, 0)
	return err == nil && n > 0
}

// settleHoldOrRefuse is settleHold for a command that may wait (wait),
// and otherwise reports false while branch name has a hold at all: a
// command that must not wait cannot release one (it takes the store's
// lock). A hold made after the check is refused by the store (ErrBusy).
func (f *FS) settleHoldOrRefuse(name string, wait bool) bool {
	if wait {
		f.settleHold(name)
		return true
	}
	f.holdMu.Lock()
	defer f.holdMu.Unlock()
	return f.holds[name] == nil
}

// settleHold releases the hold of branch name now if its process has
// exited, so that a command that follows the run's end finds it released
// whether or not watchHolder got there first. It reports whether the
// branch is still held.
func (f *FS) settleHold(name string) bool {
	f.holdMu.Lock()
	h := f.holds[name]
	f.holdMu.Unlock()
	if h == nil {
		return false
	}
	if !h.exited() {
		return true
	}
	f.release(h)
	return false
}

// release ends h's hold: the branch's view writes again, and everything
// the kernel cached of it goes, since the run wrote its delta behind it.
func (f *FS) release(h *holder) {
	h.once.Do(func() {
		f.holdMu.Lock()
		if f.holds[h.name] == h {
			delete(f.holds, h.name)
		}
		f.holdMu.Unlock()
		if err := f.store.Release(h.name, h.work); err != nil {
			log.Printf("releasing branch %s from its kernel-path run: %v", h.name, err)
		}
		unix.Close(h.pidfd)
		f.loop.ServeWhile(func() { f.viewChanged(h.name) })
	})
}

// releaseCmd answers ctl.CmdRelease: the hold of v's branch ends now if its
// process has exited or is the caller (a run that could not mount
// overlayfs after all, and goes on with the view); else EBUSY.
func (f *FS) releaseCmd(ctx context.Context, v *branch.View) error {
	if !f.settleHold(v.Name()) {
		return nil
	}
	f.holdMu.Lock()
	h := f.holds[v.Name()]
	f.holdMu.Unlock()
	if pid, err := callerProcess(ctx); err == nil && h != nil && h.pid == pid {
		f.release(h)
		return nil
	}
	return fmt.Errorf("release %s: %w", v.Name(), branch.ErrBusy)
}

// killHolders kills the processes that hold any of the branches named:
// they went stale or were dropped. Each release follows its exit.
func (f *FS) killHolders(names []string) {
	f.holdMu.Lock()
	var hs []*holder
	for _, n := range names {
		if h := f.holds[n]; h != nil {
			hs = append(hs, h)
		}
	}
	f.holdMu.Unlock()
	for _, h := range hs {
		if err := unix.PidfdSendSignal(h.pidfd, unix.SIGKILL, nil, 0); err != nil && err != unix.ESRCH {
			log.Printf("killing the kernel-path run of branch %s: %v", h.name, err)
		}
	}
}

// viewChanged drops everything the kernel caches of the view of branch
// name, which stays valid: names present and missing, attributes, and the
// pages of files, open ones included; the next access asks the daemon.
func (f *FS) viewChanged(name string) {
	if f.root.GetChild(ctl.BranchPrefix+name) != nil {
		f.root.NotifyEntry(ctl.BranchPrefix + name)
	}
	if r := f.viewRoot(name); r != nil {
		notifyTree(&r.Inode)
	}
	var nodes []*Node
	f.mu.Lock()
	for v, m := range f.open {
		if v.Name() == name {
			for n := range m {
				nodes = append(nodes, n)
			}
		}
	}
	f.mu.Unlock()
	for _, n := range nodes {
		n.forgetTops()
		n.NotifyContent(0, 0)
	}
}
