package checkpoint

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// CloneDir is where a restored clone finds who it is: files id, index and
// branch, on a read-only tmpfs of its mount namespace alone.
const CloneDir = "/run/branchfs/clone"

// The clone's starter is this program again, the command of the clone's
// run, found by its environment before main runs (as explore's helper is).
const envClone = "BRANCHFS_CLONE_INIT"

func init() {
	if cfg, ok := os.LookupEnv(envClone); ok {
		cloneMain(cfg)
	}
}

// cloneConfig is what Restore tells a clone's starter.
type cloneConfig struct {
	CRIU    string `json:"criu"`
	Images  string `json:"images"`
	Log     string `json:"log"`
	PIDFile string `json:"pidfile"`
	ID      string `json:"id"`
	Index   int    `json:"index"`
	Branch  string `json:"branch"`
}

// The starter's report on its stdout, one line: "ok PID" once the tree is
// restored, or "error: WHY".
const reportOK = "ok"

// cloneMain shows the clone who it is, restores the tree as a sibling
// (so that it is this process's child), reports, and waits for the tree's
// root, exiting as it does.
func cloneMain(raw string) {
	report := os.Stdout
	fail := func(format string, a ...any) {
		fmt.Fprintf(report, "error: "+format+"\n", a...)
		os.Exit(126)
	}
	var cfg cloneConfig
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		fail("bad configuration: %v", err)
	}
	os.Unsetenv(envClone)
	if err := os.MkdirAll(CloneDir, 0o755); err != nil {
		fail("%v", err)
	}
	if err := unix.Mount("branchfs-clone", CloneDir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=0755,size=64k"); err != nil {
		fail("mounting %s: %v", CloneDir, err)
	}
	for name, v := range map[string]string{"id": cfg.ID, "index": strconv.Itoa(cfg.Index), "branch": cfg.Branch} {
		if err := os.WriteFile(filepath.Join(CloneDir, name), []byte(v+"\n"), 0o644); err != nil {
			fail("%v", err)
		}
	}
	if err := unix.Mount("", CloneDir, "", unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		fail("%v", err)
	}
	// The work directory (-W) takes CRIU's stats file, which must not
	// land in the images every clone shares.
	cmd := exec.Command(cfg.CRIU, "restore", "-D", cfg.Images, "-W", filepath.Dir(cfg.Log), "-o", cfg.Log, "-v4",
		"--shell-job", "--restore-detached", "--restore-sibling", "--pidfile", cfg.PIDFile,
		"--manage-cgroups=ignore")
	if err := cmd.Run(); err != nil {
		fail("criu restore: %s", logError(cfg.Log))
	}
	data, err := os.ReadFile(cfg.PIDFile)
	if err != nil {
		fail("criu restore left no pid file: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		fail("criu restore's pid file: %v", err)
	}
	w := bufio.NewWriter(report)
	fmt.Fprintf(w, "%s %d\n", reportOK, pid)
	w.Flush()
	// The report pipe must not stay open: the runner reads to its end.
	null, _ := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	unix.Dup2(int(null.Fd()), 1)
	unix.Dup2(int(null.Fd()), 2)
	var ws syscall.WaitStatus
	for {
		_, err := syscall.Wait4(pid, &ws, 0, nil)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			os.Exit(125)
		}
		break
	}
	if ws.Signaled() {
		os.Exit(128 + int(ws.Signal()))
	}
	os.Exit(ws.ExitStatus())
}
