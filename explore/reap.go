package explore

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/branchfs/branchfs/branch"
	"github.com/branchfs/branchfs/internal/safedir"
	"golang.org/x/sys/unix"
)

// Every run writes a record before it makes anything (branch, cgroup), and
// removes it once it has ended all of it. A record whose owner process is
// gone (killed with SIGKILL, say) is the work of a reaper: the janitor
// process each owner starts, which waits for the owner to die, and Reap,
// which every branchfs command calls. The records live in
// /run/branchfs/runs for root, else $XDG_RUNTIME_DIR/branchfs/runs, else
// $TMPDIR/branchfs-UID/runs. A record tells the reaper which branch to
// abort and which cgroup to kill, so nobody else may plant one: the
// directory is the user's own, mode 0700, and only root and the user can
// change a directory above it (safedir; a name someone else made on the
// way, in /tmp say, is refused, not used); a record the user does not own
// is ignored, and one naming a cgroup that is not a run's is dropped.

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

func recordsPath() string {
	if os.Geteuid() == 0 {
		return "/run/branchfs/runs"
	}
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		return filepath.Join(d, "branchfs", "runs")
	}
	return filepath.Join(os.TempDir(), "branchfs-"+strconv.Itoa(os.Geteuid()), "runs")
}

// recordsDir makes the records' directory if it is missing and returns
// it, checked (see above), with its links resolved.
func recordsDir() (string, error) {
	dir, err := safedir.MakePrivate(recordsPath())
	if err != nil {
		return "", fmt.Errorf("run records: %w", err)
	}
	return dir, nil
}

// writeRecord writes r atomically and returns its path.
func writeRecord(r *record) (string, error) {
	dir, err := recordsDir()
	if err != nil {
		return "", err
	}
	data, err := json.Marshal(r)
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, fmt.Sprintf("%d-%d-%s.json", r.Owner, r.OwnerStart, randomHex()))
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err == nil {
		_, err = f.Write(data)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("run records: %w", err)
	}
	return path, nil
}

// readRecord reads the record at path. It returns nil for a file that is
// not a regular file of this user's, which the reaper ignores, and
// errBadRecord for one of the user's that is not a valid record.
func readRecord(path string) (*record, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return nil, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Uid != uint32(os.Geteuid()) {
		return nil, nil
	}
	data, err := io.ReadAll(io.LimitReader(f, 64<<10))
	if err != nil {
		return nil, err
	}
	var r record
	if json.Unmarshal(data, &r) != nil || !r.valid() {
		return nil, errBadRecord
	}
	return &r, nil
}

var errBadRecord = errors.New("not a run record")

// valid checks what the reaper acts on: a mount point's absolute path,
// a branch name, and a cgroup of runs (cgroupsDir/NAME in the cgroup v2
// hierarchy), where a run of this program made its own.
func (r *record) valid() bool {
	if !filepath.IsAbs(r.Mount) || filepath.Clean(r.Mount) != r.Mount || branch.ValidateName(r.Branch) != nil {
		return false
	}
	if r.Cgroup == "" {
		return true
	}
	mnt, err := cgroup2Mount()
	if err != nil || filepath.Clean(r.Cgroup) != r.Cgroup || !strings.HasPrefix(r.Cgroup, mnt+"/") {
		return false
	}
	return filepath.Base(filepath.Dir(r.Cgroup)) == cgroupsDir && filepath.Base(r.Cgroup) == cgroupName(r.Branch)
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
// goes on past it. Every branchfs command calls it; when there is nothing
// to do it costs a check of the records' directory and one read of it.
func Reap() error {
	return reap(func(r *record) bool {
		// Its owner is gone, and is ours to judge.
		return r.OwnerPIDNS == selfPIDNS() && procStart(r.Owner) != r.OwnerStart
	})
}

// reapNamespace ends what runs whose owners were in PID namespace ns left:
// runs inside a run, which has ended, and with it every process of its
// namespace.
func reapNamespace(ns string) error {
	return reap(func(r *record) bool { return r.OwnerPIDNS == ns })
}

// reap undoes the records that match and removes them.
func reap(match func(*record) bool) error {
	if _, err := os.Lstat(recordsPath()); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	dir, err := recordsDir()
	if err != nil {
		return err
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	var first error
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		path := filepath.Join(dir, e.Name())
		r, err := readRecord(path)
		if errors.Is(err, errBadRecord) {
			os.Remove(path)
			continue
		}
		if r == nil {
			continue // reaped meanwhile, or not the user's
		}
		if !match(r) {
			continue
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
	// Inside a run, the records name the run's mount point, which the
	// janitor opens as its runner does (Mount.inRun).
	for _, v := range []string{EnvRoot, EnvView, EnvBranch} {
		if d, ok := os.LookupEnv(v); ok {
			cmd.Env = append(cmd.Env, v+"="+d)
		}
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
