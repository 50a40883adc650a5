package fs_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/branchfs/branchfs/ctl"
	"golang.org/x/sys/unix"
)

// opBound is how long one operation on the mount may take before a
// watchdog calls the daemon hung: far more than any of them takes on a
// busy machine under the race detector.
const opBound = 30 * time.Second

// watchdog runs workers that each do operations on a mount, and fails the
// test, instead of hanging it, when one operation does not finish within
// opBound. The daemon then dumps its goroutines' stacks into its log, for
// the report, and the mount's FUSE connection is aborted, which frees
// every process waiting on it; the workers return and the mount can be
// removed.
type watchdog struct {
	t     *testing.T
	m     *mount
	dev   uint64 // the mount's device: its FUSE connection
	wg    sync.WaitGroup
	stop  atomic.Bool // a hang was found: the workers stop
	mu    sync.Mutex
	busy  map[string]time.Time // worker -> when its current operation began
	doing map[string]string    // worker -> that operation
}

func newWatchdog(t *testing.T, m *mount) *watchdog {
	var st unix.Stat_t
	must(t, unix.Stat(m.mnt, &st))
	return &watchdog{t: t, m: m, dev: st.Dev, busy: map[string]time.Time{}, doing: map[string]string{}}
}

// run starts worker name, which calls step for each of its operations
// until step returns false.
func (d *watchdog) run(name string, fn func(step func(op string, do func() error) bool)) {
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		fn(func(op string, do func() error) bool {
			if d.stop.Load() {
				return false
			}
			d.mu.Lock()
			d.busy[name], d.doing[name] = time.Now(), op
			d.mu.Unlock()
			err := do()
			d.mu.Lock()
			delete(d.busy, name)
			d.mu.Unlock()
			if err != nil && !d.stop.Load() {
				d.t.Errorf("%s: %s: %v", name, op, err)
			}
			return err == nil && !d.stop.Load()
		})
	}()
}

// wait waits for the workers to finish, or for one operation to outlast
// opBound.
func (d *watchdog) wait() {
	done := make(chan struct{})
	go func() { d.wg.Wait(); close(done) }()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-done:
			return
		case <-tick.C:
		}
		d.mu.Lock()
		var hung []string
		for w, since := range d.busy {
			if time.Since(since) > opBound {
				hung = append(hung, fmt.Sprintf("%s: %s", w, d.doing[w]))
			}
		}
		d.mu.Unlock()
		if len(hung) > 0 {
			d.stop.Store(true)
			stacks := d.freeMount()
			<-done
			d.t.Fatalf("the daemon stopped answering: no reply within %v to %s\ndaemon's goroutines:\n%s",
				opBound, strings.Join(hung, "; "), stacks)
		}
	}
}

// freeMount makes the daemon dump its goroutines and die, aborts the
// mount's FUSE connection, and returns the dump, or the kernel's stacks of
// the daemon's threads if it does not die.
func (d *watchdog) freeMount() string {
	logName := filepath.Join(d.m.store, "daemon.log")
	before, _ := os.ReadFile(logName)
	pid := 0
	if data, err := os.ReadFile(filepath.Join(d.m.store, "daemon.pid")); err == nil {
		pid, _ = strconv.Atoi(strings.TrimSpace(string(data)))
	}
	dead := func() bool {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		return err != nil || bytes.Contains(stat, []byte(") Z "))
	}
	waitDead := func(d time.Duration) bool {
		for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			if dead() {
				return true
			}
		}
		return false
	}
	// The kernel's stacks of the daemon's threads and of this process's
	// that wait in FUSE.
	var kernelStacks strings.Builder
	for _, who := range []string{strconv.Itoa(pid), "self"} {
		tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%s/task/*", who))
		for _, task := range tasks {
			stack, _ := os.ReadFile(filepath.Join(task, "stack"))
			if bytes.Contains(stack, []byte("fuse")) {
				fmt.Fprintf(&kernelStacks, "thread %s of %s, in the kernel:\n%s", filepath.Base(task), who, stack)
			}
		}
	}
	if pid > 0 {
		syscall.Kill(pid, syscall.SIGQUIT)
		waitDead(5 * time.Second)
	}
	abortConnection(d.dev)
	if pid > 0 && !waitDead(10*time.Second) {
		syscall.Kill(pid, syscall.SIGKILL)
	}
	after, _ := os.ReadFile(logName)
	return kernelStacks.String() + ownGoroutines(string(after[min(len(before), len(after)):]))
}

// ownGoroutines keeps, of a goroutine dump, the goroutines in branchfs's
// code or go-fuse's.
func ownGoroutines(dump string) string {
	var out []string
	for _, g := range strings.Split(dump, "\n\n") {
		if strings.Contains(g, "branchfs/branchfs/") || strings.Contains(g, "go-fuse") {
			out = append(out, g)
		}
	}
	if len(out) == 0 {
		return dump
	}
	return strings.Join(out, "\n\n")
}

// abortConnection aborts the FUSE connection of the mount on device dev,
// which ends every request waiting on it with ENOTCONN.
func abortConnection(dev uint64) {
	conns := "/sys/fs/fuse/connections"
	if err := unix.Mount("fusectl", conns, "fusectl", 0, ""); err == nil {
		defer unix.Unmount(conns, 0)
	}
	os.WriteFile(fmt.Sprintf("%s/%d/abort", conns, unix.Minor(dev)), []byte("1"), 0o200)
}

// TestListingBesideBranchChanges: with --list-branches, listings of the
// mount's root and lookups of the names they show go on beside branches
// being created, aborted and committed; no operation waits for another for
// good. It found three ways to stop answering: a listing took the store's
// lock shared twice (through the view, then to list the branches), and an
// abort's emptying of the trash that asked for it exclusively in between
// blocked the second, on the daemon's only reader, within seconds, and
// every process touching the mount with it; two listings of the root at
// once, one on the reader a commit or abort adds (Loop.ServeWhile),
// released each other's directory handle (EIO); and a listing read on at
// an offset after another's had ended started over, for ever.
func TestListingBesideBranchChanges(t *testing.T) {
	dir := t.TempDir()
	must(t, os.Chmod(dir, 0o755))
	m := &mount{t: t, base: filepath.Join(dir, "base"), store: filepath.Join(dir, "store"),
		mnt: filepath.Join(dir, "mnt"), args: []string{"--list-branches"}, env: []string{"GOTRACEBACK=all"}}
	must(t, os.MkdirAll(m.mnt, 0o755))
	sampleTree(t, m.base)
	m.start()
	t.Cleanup(m.cleanup)
	d := newWatchdog(t, m)
	rootCtl := filepath.Join(m.mnt, ".branchfs_ctl")
	var changers atomic.Int32
	changers.Store(2)
	for i := range 2 {
		d.run(fmt.Sprintf("lister %d", i), func(step func(string, func() error) bool) {
			for changers.Load() > 0 {
				var ents []os.DirEntry
				if !step("list the root", func() (err error) { ents, err = os.ReadDir(m.mnt); return err }) {
					return
				}
				for _, e := range ents {
					if strings.HasPrefix(e.Name(), "@") {
						// A branch listed may be gone by now.
						step("look up "+e.Name(), func() error {
							if _, err := os.Lstat(filepath.Join(m.mnt, e.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
								return err
							}
							return nil
						})
					}
				}
			}
		})
	}
	d.run("create and abort", func(step func(string, func() error) bool) {
		defer changers.Add(-1)
		for range 100 {
			var name string
			ok := step("create", func() error {
				f, err := os.Open(rootCtl)
				if err != nil {
					return err
				}
				defer f.Close()
				name, err = ctl.IoctlCreate(f)
				return err
			}) && step("abort @"+name, func() error {
				return os.WriteFile(filepath.Join(m.view(name), ".branchfs_ctl"), []byte("abort"), 0)
			})
			if !ok {
				return
			}
		}
	})
	d.run("create, write and commit", func(step func(string, func() error) bool) {
		defer changers.Add(-1)
		for i := range 30 {
			name := fmt.Sprintf("c%d", i)
			v := m.view(name)
			ok := step("create @"+name, func() error { return os.WriteFile(rootCtl, []byte("create:"+name), 0) }) &&
				step("write in @"+name, func() error { return os.WriteFile(filepath.Join(v, "f"+name), []byte(name), 0o644) }) &&
				step("commit @"+name, func() error { return os.WriteFile(filepath.Join(v, ".branchfs_ctl"), []byte("commit"), 0) })
			if !ok {
				return
			}
		}
	})
	d.wait()
	for i := range 30 {
		wantContent(t, filepath.Join(m.base, fmt.Sprintf("fc%d", i)), fmt.Sprintf("c%d", i))
	}
	if got := m.listNames(); got != "main:live" {
		t.Errorf("branches left: %s", got)
	}
}

// TestCommandHoldsUpNoOtherRequest: a command that waits for the store's
// lock (a create, behind the copy-up of a large file in another branch,
// which holds the lock shared) holds up no request that does not need the
// lock: a statfs of the mount is answered meanwhile. Answered on the
// request loop's only reader, the command made it read nothing until the
// copy-up had ended.
func TestCommandHoldsUpNoOtherRequest(t *testing.T) {
	for _, via := range []string{"ioctl", "control file"} {
		t.Run(via, func(t *testing.T) {
			dir := t.TempDir()
			must(t, os.Chmod(dir, 0o755))
			// --debug logs each request as it is read.
			m := &mount{t: t, base: filepath.Join(dir, "base"), store: filepath.Join(dir, "store"),
				mnt: filepath.Join(dir, "mnt"), args: []string{"--debug"}}
			must(t, os.MkdirAll(m.mnt, 0o755))
			sampleTree(t, m.base)
			bigFile(t, filepath.Join(m.base, "big"), 256)
			m.start()
			t.Cleanup(m.cleanup)
			x := m.create("x")
			copying, opened := copyUpInFlight(t, m, filepath.Join(x, "big"), openForWriting)
			logName := filepath.Join(m.store, "daemon.log")
			logged, _ := os.ReadFile(logName)
			op := map[string]string{"ioctl": ": IOCTL ", "control file": ": WRITE "}[via]
			created := make(chan error, 1)
			go func() {
				ctl := filepath.Join(m.mnt, ".branchfs_ctl")
				if via == "ioctl" {
					created <- controlOp("ioctl", ctl, "create")
				} else {
					created <- os.WriteFile(ctl, []byte("create:y"), 0)
				}
			}()
			// Until the daemon has read the command.
			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
				data, _ := os.ReadFile(logName)
				if bytes.Contains(data[len(logged):], []byte(op)) {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("the daemon did not read the command")
				}
			}
			if !copying() {
				t.Fatal("the copy-up ended before the command was read: the test proves nothing")
			}
			var st unix.Statfs_t
			must(t, unix.Statfs(m.mnt, &st))
			if !copying() {
				t.Error("a statfs waited for a command, which waited for the copy-up of another file")
			}
			must(t, <-opened)
			must(t, <-created)
		})
	}
}
