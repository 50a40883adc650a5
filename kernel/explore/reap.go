package explore

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Every run writes a record before it makes anything (branch, cgroup), and
// removes it once it has ended all of it. A record whose owner process is
// gone (killed with SIGKILL, say) is the work of a reaper: the janitor
// process each owner starts, which waits for the owner to die, and Reap,
// which every branchfs command calls. The records live in
// /run/branchfs/runs for root, else $XDG_RUNTIME_DIR/branchfs/runs, else
// $TMPDIR/branchfs-UID/runs.

// record is what a run leaves for the reaper.
type record struct {
	Owner      int    `json:"owner"`
	OwnerStart uint64 `json:"owner_start"` // start time, against pid reuse
	OwnerPIDNS string `json:"owner_pidns"` // the PID namespace Owner is a number in
	Mount      string `json:"mount"`
	Branch     string `json:"branch"`
	Created    bool   `json:"created"` // abort the branch: the run made it
	Cgroup     string `json:"cgroup,omitempty"`
}

func recordsDir() string {
	if os.Geteuid() == 0 {
		return "/run/branchfs/runs"
	}
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		return filepath.Join(d, "branchfs", "runs")
	}
	return filepath.Join(os.TempDir(), "branchfs-"+strconv.Itoa(os.Geteuid()), "runs")
}

// writeRecord writes r atomically and returns its path.
func writeRecord(r *record) (string, error) {
	dir := recordsDir()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("run records: %w", err)
	}
	data, err := json.Marshal(r)
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, fmt.Sprintf("%d-%d-%s.json", r.Owner, r.OwnerStart, randomHex()))
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return "", fmt.Errorf("run records: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("run records: %w", err)
	}
	return path, nil
}

func randomHex() string {
	var b [4]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// procStart is the start time of a process (field 22 of /proc/PID/stat),
// or 0 when it is gone or a zombie.
func procStart(pid int) uint64 {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	// The command name (field 2) may hold spaces; it ends at the last ')'.
	i := strings.LastIndexByte(string(data), ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(data[i+1:]))
	if len(f) < 20 || f[0] == "Z" || f[0] == "X" {
		return 0
	}
	n, _ := strconv.ParseUint(f[19], 10, 64)
	return n
}

var selfStart = sync.OnceValue(func() uint64 { return procStart(os.Getpid()) })

// selfPIDNS names this process's PID namespace ("pid:[4026531836]"): a
// record's owner number means something only in its own namespace.
var selfPIDNS = sync.OnceValue(func() string {
	ns, _ := os.Readlink("/proc/self/ns/pid")
	return ns
})

// newRecord describes a run of this process.
func newRecord(mount, branch string, created bool) *record {
	return &record{Owner: os.Getpid(), OwnerStart: selfStart(), OwnerPIDNS: selfPIDNS(), Mount: mount, Branch: branch, Created: created}
}

// Reap ends what runs whose process is gone left behind: their processes,
// cgroups and the branches they created. It returns the first error and
// goes on past it. Every branchfs command calls it; it costs one directory
// read when there is nothing to do.
func Reap() error {
	ents, err := os.ReadDir(recordsDir())
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return err
	}
	var first error
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		path := filepath.Join(recordsDir(), e.Name())
		data, err := os.ReadFile(path)
		if err != nil {
			continue // reaped meanwhile
		}
		var r record
		if err := json.Unmarshal(data, &r); err != nil {
			os.Remove(path)
			continue
		}
		if r.OwnerPIDNS != selfPIDNS() || procStart(r.Owner) == r.OwnerStart {
			continue // its owner runs, or is not ours to judge
		}
		if err := r.undo(); err != nil && first == nil {
			first = err
		}
		os.Remove(path)
	}
	return first
}

// undo ends the run's processes and cgroup and drops the branch it made.
func (r *record) undo() error {
	var first error
	if r.Cgroup != "" {
		first = killCgroup(r.Cgroup)
	}
	if r.Created {
		m, err := Open(r.Mount)
		if err == nil {
			err = m.Abort(r.Branch, true)
		}
		if err != nil && !errors.Is(err, syscall.ENOENT) && first == nil {
			first = fmt.Errorf("reaping branch %s of %s: %w", r.Branch, r.Mount, err)
		}
	}
	return first
}

// The janitor: one process per owner, outside the owner's session (a
// Ctrl-C does not reach it) and outside every run's cgroup. It holds the
// read end of a pipe from the owner. Shutdown writes "q" and closes it:
// the janitor exits. Any other end of the pipe means the owner died: the
// janitor waits until it is gone, then reaps.
const envJanitor = "BRANCHFS_RUN_JANITOR"

var janitor struct {
	sync.Mutex
	started bool
	w       *os.File
	done    chan struct{}
}

func startJanitor() {
	janitor.Lock()
	defer janitor.Unlock()
	if janitor.started {
		return
	}
	janitor.started = true
	r, w, err := os.Pipe()
	if err != nil {
		return
	}
	defer r.Close()
	cmd := exec.Command("/proc/self/exe")
	cmd.Args = []string{"branchfs-janitor"}
	cmd.Env = []string{envJanitor + "=" + strconv.Itoa(os.Getpid())}
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		cmd.Env = append(cmd.Env, "XDG_RUNTIME_DIR="+d)
	}
	if d := os.Getenv("TMPDIR"); d != "" {
		cmd.Env = append(cmd.Env, "TMPDIR="+d)
	}
	cmd.Dir = "/" // hold no mount busy
	cmd.ExtraFiles = []*os.File{r}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if cmd.Start() != nil {
		w.Close()
		return
	}
	janitor.w, janitor.done = w, make(chan struct{})
	// Waiting leaves no zombie should it exit early; after this process
	// is gone, init reaps it.
	go func() { cmd.Wait(); close(janitor.done) }()
}

// Shutdown tells this process's janitor that every run has ended, and
// waits (a second at most) for it to exit, so that nothing of the runs
// outlives the program. Call it when the program is done with runs; a
// later Start starts no janitor, and a run killed after goes unreaped
// until the next Reap.
func Shutdown() {
	janitor.Lock()
	defer janitor.Unlock()
	janitor.started = true
	if janitor.w == nil {
		return
	}
	janitor.w.Write([]byte("q"))
	janitor.w.Close()
	janitor.w = nil
	select {
	case <-janitor.done:
	case <-time.After(time.Second):
	}
}

func runJanitor(owner string) {
	pid, err := strconv.Atoi(owner)
	if err != nil {
		os.Exit(2)
	}
	var b [1]byte
	if n, _ := os.NewFile(3, "owner").Read(b[:]); n == 1 && b[0] == 'q' {
		os.Exit(0)
	}
	// The pipe ends as the owner's descriptors close, before it is
	// gone: wait for that.
	if fd, err := unix.PidfdOpen(pid, 0); err == nil {
		for {
			_, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, -1)
			if err != unix.EINTR {
				break
			}
		}
	}
	Reap()
	os.Exit(0)
}
