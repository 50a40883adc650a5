package fs

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"syscall"

	"github.com/branchfs/branchfs/branch"
	"github.com/branchfs/branchfs/ctl"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// Runs whose runner asked to be watched (ctl.CmdWatch). A run's processes end
// with its runner (the run's first process dies with it), but its branch
// and cgroup would wait for a reaper: the runner's janitor, or the next
// branchfs command, and until then the branch's parent is read-only. So
// the runner registers each run here: the daemon keeps a pidfd of the
// runner, and when the runner exits with runs still registered, it kills
// each one's cgroup and aborts (or keeps) its branch at once. A runner
// that ends a run itself unregisters it (ctl.CmdUnwatch) first.

// runner is a watched process and its runs, by view.
type runner struct {
	pid   int
	pidfd int
	runs  map[*branch.View]ctl.WatchArg
}

// watch registers the caller as the runner of a run in v's branch.
func (f *FS) watch(ctx context.Context, v *branch.View, arg string) error {
	var w ctl.WatchArg
	if err := json.Unmarshal([]byte(arg), &w); err != nil {
		return fmt.Errorf("watch: bad argument %q: %w", arg, syscall.EINVAL)
	}
	c, ok := fuse.FromContext(ctx)
	if !ok || c.Pid == 0 {
		return fmt.Errorf("watch: the caller is not visible from the daemon's PID namespace: %w", syscall.EPERM)
	}
	if w.Cgroup != "" {
		if err := runCgroup(w.Cgroup, c.Uid); err != nil {
			return fmt.Errorf("watch: %w", err)
		}
	}
	if err := v.Check(); err != nil {
		return err
	}
	pid, err := threadGroup(int(c.Pid))
	if err != nil {
		return fmt.Errorf("watch: %w", err)
	}
	f.runMu.Lock()
	defer f.runMu.Unlock()
	r := f.runners[pid]
	if r == nil {
		pidfd, err := unix.PidfdOpen(pid, 0)
		if err != nil {
			return fmt.Errorf("watch: %w", err)
		}
		r = &runner{pid: pid, pidfd: pidfd, runs: map[*branch.View]ctl.WatchArg{}}
		if f.runners == nil {
			f.runners = map[int]*runner{}
		}
		f.runners[pid] = r
		go f.watchRunner(r)
	}
	r.runs[v] = w
	return nil
}

// unwatch drops the caller's registration of a run in v's branch.
func (f *FS) unwatch(ctx context.Context, v *branch.View) error {
	c, ok := fuse.FromContext(ctx)
	if !ok || c.Pid == 0 {
		return nil
	}
	pid, err := threadGroup(int(c.Pid))
	if err != nil {
		return nil // gone: its watch ends with it
	}
	f.runMu.Lock()
	defer f.runMu.Unlock()
	if r := f.runners[pid]; r != nil {
		delete(r.runs, v)
	}
	return nil
}

// runCgroup checks that dir is a cgroup of runs that user uid owns, which
// the daemon may then kill for that user.
func runCgroup(dir string, uid uint32) error {
	if !filepath.IsAbs(dir) || filepath.Clean(dir) != dir || filepath.Base(filepath.Dir(dir)) != "branchfs.runs" {
		return fmt.Errorf("%s is not a cgroup of runs: %w", dir, syscall.EINVAL)
	}
	var sfs unix.Statfs_t
	var st unix.Stat_t
	if unix.Statfs(dir, &sfs) != nil || sfs.Type != unix.CGROUP2_SUPER_MAGIC || unix.Lstat(dir, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return fmt.Errorf("%s is not a cgroup v2: %w", dir, syscall.EINVAL)
	}
	if uid != 0 && st.Uid != uid {
		return fmt.Errorf("cgroup %s is not the caller's: %w", dir, syscall.EPERM)
	}
	return nil
}

// watchRunner waits for r's process to exit, then ends the runs it left.
func (f *FS) watchRunner(r *runner) {
	fds := []unix.PollFd{{Fd: int32(r.pidfd), Events: unix.POLLIN}}
	for {
		if _, err := unix.Poll(fds, -1); err != unix.EINTR {
			break
		}
	}
	f.runMu.Lock()
	delete(f.runners, r.pid)
	runs := r.runs
	r.runs = nil
	f.runMu.Unlock()
	unix.Close(r.pidfd)
	for v, w := range runs {
		if w.Cgroup != "" {
			// What left the run's PID namespace (setns) is in its cgroup.
			if err := os.WriteFile(filepath.Join(w.Cgroup, "cgroup.kill"), []byte("1"), 0); err != nil && !os.IsNotExist(err) {
				log.Printf("ending the run in branch %s whose runner died: %v", v.Name(), err)
			}
		}
		if !w.Abort {
			continue
		}
		// The branch the run made, unless it has ended and another of
		// that name was made since.
		if cur, err := f.store.View(v.Name()); err != nil || cur != v {
			continue
		}
		f.settleHold(v.Name())
		if err := f.abort(v, true, true); err != nil {
			log.Printf("aborting branch %s, whose runner died: %v", v.Name(), err)
		}
	}
}
