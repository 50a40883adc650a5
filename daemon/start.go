package daemon

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/branchfs/branchfs/branch"
	"github.com/branchfs/branchfs/fs"
	"golang.org/x/sys/unix"
)

// Prepare checks where a mount is to go before its daemon starts: a mount
// whose daemon died is cleared (mounting again over it is what a restart
// means), the base and mount point must be directories, and the base, store
// and mount point must lie outside one another. It makes nothing: a mount
// refused here leaves no store behind.
func Prepare(mnt, base, store string) error {
	if DeadMount(mnt) {
		if err := fs.Unmount(mnt, true); err != nil {
			return fmt.Errorf("mount %s: clearing the dead mount: %w", mnt, err)
		}
	}
	for _, d := range []struct{ what, path string }{{"base", base}, {"mount point", mnt}} {
		if err := isDir(d.what, d.path); err != nil {
			return fmt.Errorf("mount: %w", err)
		}
	}
	if err := CheckNesting(base, store, mnt); err != nil {
		return fmt.Errorf("mount: %w", err)
	}
	return nil
}

// isDir says in words why path, the mount's what, cannot serve as a
// directory.
func isDir(what, path string) error {
	fi, err := os.Stat(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("the %s %s does not exist", what, path)
	case err != nil:
		return fmt.Errorf("the %s: %w", what, err)
	case !fi.IsDir():
		return fmt.Errorf("the %s %s is not a directory", what, path)
	}
	return nil
}

// Start starts cmd, a daemon that calls Serve with its ready descriptor
// as fd 3, detached (a session of its own, its output appended to
// STORE/daemon.log), and returns once it reports that mnt answers, or
// with the error it reports. Its warnings go to warn. It makes the store
// directory first (branch.MakeStoreDir).
func Start(cmd *exec.Cmd, mnt, store string, warn func(string)) error {
	store, err := branch.MakeStoreDir(store)
	if err != nil {
		return fmt.Errorf("mount: %w", err)
	}
	logf, err := os.OpenFile(filepath.Join(store, "daemon.log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	defer r.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.ExtraFiles = append([]*os.File{w}, cmd.ExtraFiles...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		w.Close()
		return err
	}
	w.Close()
	done := make(chan string, 1)
	go func() {
		// Warnings come first, each on a line of its own, then "ok" or
		// the error.
		br := bufio.NewReader(r)
		for {
			line, _ := br.ReadString('\n')
			line = strings.TrimSpace(line)
			rest, ok := strings.CutPrefix(line, "warning: ")
			if !ok {
				done <- line
				return
			}
			if warn != nil {
				warn(rest)
			}
		}
	}()
	select {
	case msg := <-done:
		if msg == "ok" {
			// A program that mounts from Go (MountAt) lives on as the
			// daemon's parent: reap it when it exits.
			go cmd.Wait()
			return nil
		}
		cmd.Wait()
		if msg == "" {
			msg = "daemon exited; see " + filepath.Join(store, "daemon.log")
		}
		return fmt.Errorf("mount %s: %s", mnt, msg)
	case <-time.After(60 * time.Second):
		cmd.Process.Kill()
		return fmt.Errorf("mount %s: daemon did not answer within 60s", mnt)
	}
}

// Unmount unmounts mnt and waits for the daemon that served it from store
// to exit: the next mount of the store needs it gone, so it waits however
// long its last writes take, calling waiting (when not nil) after 10
// seconds. A dead daemon's mount is detached.
func Unmount(mnt, store string, waiting func(pid int)) error {
	var pid int
	if store != "" {
		data, _ := os.ReadFile(filepath.Join(store, pidFile))
		pid, _ = strconv.Atoi(strings.TrimSpace(string(data)))
	}
	conn := fuseConn(mnt)
	if err := fs.Unmount(mnt, DeadMount(mnt)); err != nil {
		return err
	}
	if pid <= 0 || waitExit(pid, 10*time.Second) {
		return nil
	}
	// A copy of the mount in another mount namespace (a run's, or any
	// process's that unshared its mounts meanwhile) keeps the connection,
	// and so the daemon, alive. Root ends the connection: the copies then
	// fail with ENOTCONN and the daemon exits as after an unmount.
	if conn != "" && os.WriteFile(conn, []byte("1"), 0) == nil && waitExit(pid, 10*time.Second) {
		return nil
	}
	if waiting != nil {
		waiting(pid)
	}
	waitExit(pid, 0)
	return nil
}

// fuseConn is the abort file of the FUSE connection mounted at mnt in the
// fusectl filesystem, named by the mount's device number, or "" where
// there is none to be had (fusectl not mounted, or not a FUSE mount). The
// stat takes what the kernel has cached (AT_STATX_DONT_SYNC): asking the
// daemon would wait for one that does not answer.
func fuseConn(mnt string) string {
	var stx unix.Statx_t
	if unix.Statx(unix.AT_FDCWD, mnt, unix.AT_STATX_DONT_SYNC, 0, &stx) != nil || stx.Dev_major != 0 {
		return ""
	}
	const dir = "/sys/fs/fuse/connections"
	p := dir + "/" + strconv.FormatUint(uint64(stx.Dev_minor), 10) + "/abort"
	if _, err := os.Stat(p); err != nil && os.Geteuid() == 0 {
		// systemd mounts fusectl there; a container may not have.
		unix.Mount("fusectl", dir, "fusectl", 0, "")
	}
	if _, err := os.Stat(p); err != nil {
		return ""
	}
	return p
}

// waitExit waits up to timeout (0: for ever) for process pid to exit and
// reports whether it did. A pidfd becomes readable the moment it does, so
// the command returns then rather than at the next tick of a polling
// loop; without a pidfd (kernels before 5.3) it polls.
func waitExit(pid int, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	fd, err := unix.PidfdOpen(pid, 0)
	if err == nil {
		defer unix.Close(fd)
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		for {
			ms := -1
			if timeout > 0 {
				left := time.Until(deadline)
				if left <= 0 {
					return false
				}
				ms = int(left.Milliseconds()) + 1
			}
			n, err := unix.Poll(fds, ms)
			if err != unix.EINTR {
				return err != nil || n > 0
			}
		}
	}
	if errors.Is(err, unix.ESRCH) {
		return true // already gone
	}
	for syscall.Kill(pid, 0) == nil {
		if timeout > 0 && time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}

// DeadMount reports a FUSE mount whose daemon is gone. statfs always asks
// the daemon, where stat may be answered from the kernel's cache.
func DeadMount(mnt string) bool {
	var st syscall.Statfs_t
	return errors.Is(syscall.Statfs(mnt, &st), syscall.ENOTCONN)
}
