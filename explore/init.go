package explore

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// The helper is the program itself, started again with envInit set: a
// process forked from a multithreaded Go program cannot set up mounts
// between fork and exec, so the runner clones it into new mount and PID
// namespaces (and its cgroup) and it does the rest as PID 1 there, in the
// manner of runc's and bwrap's init. Package initialization catches it
// before main runs, so every program that imports this package can start
// runs; nothing needs calling.
const envInit = "BRANCHFS_RUN_INIT"

func init() {
	if _, ok := os.LookupEnv(envInit); ok {
		runInit()
	}
	if owner, ok := os.LookupEnv(envJanitor); ok {
		runJanitor(owner)
	}
}

// initConfig is what the runner tells the helper.
type initConfig struct {
	View     string   `json:"view"`      // the branch's view, MNT/@NAME
	Targets  []string `json:"targets"`   // where to show the branch: the base, MNT and --bind paths
	DataPath DataPath `json:"data_path"` // Spec.DataPath
	Dir      string   `json:"dir"`       // working directory, after the binds
	Args     []string `json:"args"`
	Env      []string `json:"env"`
	Score    bool     `json:"score"` // fd 4 goes to the command as fd 3
	UserNS   bool     `json:"userns"`
	LastPID  int      `json:"last_pid,omitempty"` // Spec.LastPID
	Gate     bool     `json:"gate,omitempty"`     // wait for EOF on gateFd before starting the command
	Root     string   `json:"root,omitempty"`     // the mount's main view, shown at RootAt for runs inside the run
	RootAt   string   `json:"root_at,omitempty"`  // EnvRoot: an empty directory to bind it over
}

// initStatus is the helper's report on statusFd: one JSON object with the
// data path once the branch is mounted, one with Ready once the command
// can start, then one with how the command ended (or why it could not
// start).
type initStatus struct {
	Ready    bool     `json:"ready,omitempty"` // set up; the command starts (at the gate's opening)
	DataPath DataPath `json:"data_path,omitempty"`
	Fallback string   `json:"fallback,omitempty"` // why auto took the FUSE path
	Exit     int      `json:"exit"`
	Signal   int      `json:"signal,omitempty"`
	Error    string   `json:"error,omitempty"`
}

// The helper's descriptors. The configuration comes in a file rather
// than the environment, where one string may hold only 128 KiB.
const (
	statusFd = 3 // initStatus, written
	scoreFd  = 4 // passed on to the command as its fd 3
	configFd = 5 // initConfig, read
	gateFd   = 6 // Gate: closed by the runner to start the command
)

func runInit() {
	status := os.NewFile(statusFd, "status")
	for _, fd := range []int{statusFd, scoreFd, configFd, gateFd} {
		syscall.CloseOnExec(fd)
	}
	fail := func(format string, a ...any) {
		json.NewEncoder(status).Encode(initStatus{Exit: 127, Error: fmt.Sprintf(format, a...)})
		os.Exit(127)
	}
	var cfg initConfig
	if err := json.NewDecoder(os.NewFile(configFd, "config")).Decode(&cfg); err != nil {
		fail("helper: bad configuration: %v", err)
	}
	os.Unsetenv(envInit)
	// Mounts made here must not reach the rest of the system; mounts and
	// unmounts there still reach us (the FUSE mount going away, say).
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
		fail("making the mount namespace private: %v", err)
	}
	// Once the view covers the mount point, the main view (and every
	// @NAME) is reachable only through a descriptor held from before:
	// it is bound at RootAt, where the command, and a run inside the
	// run (whose mount namespace copies this one), finds it.
	rootFd := -1
	if cfg.Root != "" && cfg.RootAt != "" {
		rootFd, _ = unix.Open(cfg.Root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	}
	taken, fallback, err := mountView(&cfg)
	if err != nil {
		fail("%v", err)
	}
	if rootFd >= 0 {
		if unix.Mount(fmt.Sprintf("/proc/self/fd/%d", rootFd), cfg.RootAt, "", unix.MS_BIND, "") == nil {
			cfg.Env = append(cfg.Env, EnvRoot+"="+cfg.RootAt)
		}
		unix.Close(rootFd)
	}
	json.NewEncoder(status).Encode(initStatus{DataPath: taken, Fallback: fallback})
	// A /proc of the new PID namespace, so that ps and /proc/PID show the
	// run's own processes. Best effort: a container may forbid it.
	unix.Mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "")
	if cfg.LastPID > 0 {
		if err := os.WriteFile("/proc/sys/kernel/ns_last_pid", []byte(fmt.Sprint(cfg.LastPID)), 0); err != nil {
			fail("setting ns_last_pid: %v", err)
		}
	}
	if err := os.Chdir(cfg.Dir); err != nil {
		fail("working directory: %v", err)
	}
	path := cfg.Args[0]
	if !strings.Contains(path, "/") {
		for _, e := range cfg.Env {
			if v, ok := strings.CutPrefix(e, "PATH="); ok {
				os.Setenv("PATH", v)
			}
		}
		if path, err = exec.LookPath(cfg.Args[0]); err != nil {
			fail("%v", err)
		}
	}
	// Everything that can fail has: say so, and wait at the gate, so
	// that the candidates of one wave start their commands together.
	json.NewEncoder(status).Encode(initStatus{Ready: true})
	if cfg.Gate {
		var b [1]byte
		for {
			if _, err := syscall.Read(gateFd, b[:]); err != syscall.EINTR {
				break
			}
		}
		syscall.Close(gateFd)
	}
	files := []*os.File{os.Stdin, os.Stdout, os.Stderr}
	if cfg.Score {
		files = append(files, os.NewFile(scoreFd, "score"))
	}
	// The command gets no capability the helper held for its mounts in a
	// user namespace: drop them on the thread that forks it.
	runtime.LockOSThread()
	if cfg.UserNS {
		unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
		hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		var caps [2]unix.CapUserData
		if unix.Capget(&hdr, &caps[0]) == nil {
			caps[0].Inheritable, caps[1].Inheritable = 0, 0
			unix.Capset(&hdr, &caps[0])
		}
	}
	// The helper handles these so that it, as PID 1, does not die of
	// them, and passes on those that someone sent it on purpose; the
	// terminal's Ctrl-C and Ctrl-\ reach the command directly.
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGQUIT, syscall.SIGTERM, syscall.SIGHUP,
		syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGPIPE)
	p, err := os.StartProcess(path, cfg.Args, &os.ProcAttr{Env: cfg.Env, Files: files})
	if err != nil {
		fail("%v", err)
	}
	go func() {
		for s := range sigs {
			if s == syscall.SIGTERM || s == syscall.SIGHUP || s == syscall.SIGUSR1 || s == syscall.SIGUSR2 {
				p.Signal(s)
			}
		}
	}()
	// As PID 1, reap every orphan; when the command itself exits, exit:
	// the kernel then kills whatever is left in the namespace.
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, 0, nil)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			fail("waiting: %v", err)
		}
		if pid != p.Pid {
			continue
		}
		st := initStatus{Exit: ws.ExitStatus()}
		code := st.Exit
		if ws.Signaled() {
			st = initStatus{Exit: -1, Signal: int(ws.Signal())}
			code = 128 + st.Signal
		}
		json.NewEncoder(status).Encode(st)
		os.Exit(code)
	}
}
