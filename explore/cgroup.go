package explore

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/branchfs/branchfs/ctl"
	"golang.org/x/sys/unix"
)

// cgroupsDir is the name of the directory, under the cgroup of the process
// that starts runs, that holds one cgroup per run.
const cgroupsDir = "branchfs.runs"

// cgroupRoot finds where runs' cgroups go: the cgroup v2 hierarchy (from
// /proc/self/mountinfo, wherever it is mounted: /sys/fs/cgroup, or
// /sys/fs/cgroup/unified beside v1 controllers) joined with this process's
// own cgroup (the "0::" line of /proc/self/cgroup). Read once.
var cgroupRoot = sync.OnceValues(func() (string, error) {
	mnt, err := cgroup2Mount()
	if err != nil {
		return "", err
	}
	data, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", err
	}
	for line := range strings.Lines(string(data)) {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "0::"); ok {
			return filepath.Join(mnt, rest), nil
		}
	}
	return "", errors.New("no cgroup v2 entry in /proc/self/cgroup")
})

func cgroup2Mount() (string, error) {
	ms, err := ctl.Mounts()
	if err != nil {
		return "", err
	}
	for _, m := range ms {
		if m.FSType == "cgroup2" && m.Root == "/" {
			return m.Point, nil
		}
	}
	return "", errors.New("no cgroup v2 hierarchy is mounted")
}

// cgroupName is the name of the cgroup of a run in branch: the branch's
// own when it is plain (as generated names are), which reads well in the
// cgroup tree, else a digest of it: a cgroup name may hold no newline,
// and one with a space or a quote reads badly in /proc/PID/cgroup.
func cgroupName(branch string) string {
	for _, c := range []byte(branch) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.') {
			sum := sha256.Sum256([]byte(branch))
			return "branch-" + hex.EncodeToString(sum[:12])
		}
	}
	return branch
}

// cgroup is the cgroup of one run.
type cgroup struct {
	dir string
	fd  *os.File // the directory, for clone3's CLONE_INTO_CGROUP
}

// newCgroup makes the cgroup at dir (its parent made as needed), under
// root, the runner's own, with limits l.
func newCgroup(root, dir string, l Limits) (*cgroup, error) {
	for range 3 {
		// A concurrent run's removeCgroup may drop an empty parent
		// between the two mkdirs.
		if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
			return nil, err
		}
		if err := enableControllers(root, filepath.Dir(dir), l); err != nil {
			if errors.Is(err, os.ErrNotExist) {
				continue
			}
			return nil, err
		}
		err := os.Mkdir(dir, 0o755)
		if err == nil {
			break
		}
		if !errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
	}
	fd, err := os.Open(dir)
	if err != nil {
		os.Remove(dir)
		return nil, err
	}
	// cgroup.kill arrived in Linux 5.14; without it a run would not end
	// its tree, so say so now.
	if _, err := os.Stat(filepath.Join(dir, "cgroup.kill")); err != nil {
		fd.Close()
		os.Remove(dir)
		return nil, fmt.Errorf("no cgroup.kill: %w", err)
	}
	if err := setLimits(dir, l); err != nil {
		fd.Close()
		os.Remove(dir)
		return nil, err
	}
	return &cgroup{dir: dir, fd: fd}, nil
}

// killCgroup kills every process in the cgroup at dir and its children,
// waits until none is left, and removes it (and its parent when that is
// empty). A missing cgroup is not an error.
func killCgroup(dir string) error {
	// Freezing first stops a forking tree from racing the kill; the kill
	// itself is atomic against forks in the kernel, so this is belt and
	// braces for kernels that ignore frozen tasks' pending kills.
	os.WriteFile(filepath.Join(dir, "cgroup.freeze"), []byte("1"), 0)
	if err := os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("cgroup %s: kill: %w", dir, err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := removeCgroupTree(dir)
		if err == nil || errors.Is(err, os.ErrNotExist) {
			break
		}
		if !errors.Is(err, syscall.EBUSY) || time.Now().After(deadline) {
			return fmt.Errorf("cgroup %s: remove: %w", dir, err)
		}
		// Killed tasks leave the cgroup as they exit: wait for
		// "populated 0", which the kernel reports in cgroup.events.
		waitUnpopulated(dir, time.Until(deadline))
	}
	os.Remove(filepath.Dir(dir)) // the runs' directory, when it is empty
	return nil
}

// removeCgroupTree removes a cgroup and the child cgroups a command made.
func removeCgroupTree(dir string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if e.IsDir() {
			if err := removeCgroupTree(filepath.Join(dir, e.Name())); err != nil {
				return err
			}
		}
	}
	return syscall.Rmdir(dir)
}

// waitUnpopulated waits until cgroup.events says "populated 0" or d passes.
// The kernel signals a change of that file as POLLPRI.
func waitUnpopulated(dir string, d time.Duration) { waitEvent(dir, "populated 0", d) }

// waitEvent waits, at most d, until the cgroup at dir reports event (a
// line of cgroup.events, such as "frozen 1"), and says whether it did.
func waitEvent(dir, event string, d time.Duration) bool {
	f, err := os.Open(filepath.Join(dir, "cgroup.events"))
	if err != nil {
		return false
	}
	defer f.Close()
	deadline := time.Now().Add(d)
	buf := make([]byte, 256)
	for {
		n, err := f.ReadAt(buf, 0)
		if n == 0 && err != nil {
			return false
		}
		if bytes.Contains(buf[:n], []byte(event)) {
			return true
		}
		if !time.Now().Before(deadline) {
			return false
		}
		// The kernel notifies a change of cgroup.events as POLLPRI.
		unix.Poll([]unix.PollFd{{Fd: int32(f.Fd()), Events: unix.POLLPRI}}, 50)
	}
}

// FreezeRun freezes the cgroup of the run that process pid belongs to,
// with cgroup v2's freezer (every task of it stops at its next return to
// user space; a fatal signal still ends it), waits, at most d, until all
// of it is frozen, and returns the cgroup's directory and the function
// that thaws it. It fails when pid is in no run's cgroup: a run that has
// none cannot be frozen.
func FreezeRun(pid int, d time.Duration) (dir string, thaw func() error, err error) {
	dir, err = cgroupOf(pid)
	if err != nil {
		return "", nil, err
	}
	if filepath.Base(filepath.Dir(dir)) != cgroupsDir {
		return "", nil, fmt.Errorf("process %d is in no run's cgroup (it is in %s)", pid, dir)
	}
	freeze := filepath.Join(dir, "cgroup.freeze")
	thaw = func() error { return os.WriteFile(freeze, []byte("0"), 0) }
	if err := os.WriteFile(freeze, []byte("1"), 0); err != nil {
		return "", nil, fmt.Errorf("freezing cgroup %s: %w", dir, err)
	}
	if !waitEvent(dir, "frozen 1", d) {
		thaw()
		return "", nil, fmt.Errorf("cgroup %s did not freeze within %v", dir, d)
	}
	return dir, thaw, nil
}

// cgroupOf is the directory of process pid's cgroup v2.
func cgroupOf(pid int) (string, error) {
	mnt, err := cgroup2Mount()
	if err != nil {
		return "", err
	}
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return "", err
	}
	for line := range strings.Lines(string(data)) {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "0::"); ok {
			return filepath.Join(mnt, rest), nil
		}
	}
	return "", fmt.Errorf("process %d: no cgroup v2 entry in /proc/%d/cgroup", pid, pid)
}
