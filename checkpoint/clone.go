package checkpoint

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/branchfs/branchfs/branch"
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
	// Lazy restores with CRIU's lazy pages and our page server; Pages
	// is where the page server reads (Images may be a prefetch view of
	// it), and Record asks it to save the working set there.
	Lazy   bool   `json:"lazy,omitempty"`
	Pages  string `json:"pages,omitempty"`
	Record bool   `json:"record,omitempty"`
	// PageSocket, when set, is where Restore serves the pages itself
	// (an image kept elsewhere, Source): the lazy-pages daemon gets a
	// connection to it instead of a page server in the starter.
	PageSocket string `json:"page_socket,omitempty"`
}

// The starter's report on its stdout, one line: "ok PID MS" once the tree
// is restored (MS: how long criu restore took), or "error: WHY".
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
	// land in the images every clone shares, and the lazy-pages socket.
	work := filepath.Dir(cfg.Log)
	args := []string{"restore", "-D", cfg.Images, "-W", work, "-o", cfg.Log, "-v4",
		"--shell-job", "--restore-detached", "--restore-sibling", "--pidfile", cfg.PIDFile,
		"--manage-cgroups=ignore"}
	var served chan error
	if cfg.Lazy {
		var err error
		if served, err = startLazyPages(cfg, work); err != nil {
			fail("%v", err)
		}
		args = append(args, "--lazy-pages")
	}
	cmd := exec.Command(cfg.CRIU, args...)
	began := time.Now()
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
	fmt.Fprintf(w, "%s %d %.1f\n", reportOK, pid, float64(time.Since(began).Microseconds())/1000)
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
	if served != nil {
		// The daemon ends once the tree is gone; the page server then
		// has the whole working set to save.
		<-served
	}
	if ws.Signaled() {
		os.Exit(128 + int(ws.Signal()))
	}
	os.Exit(ws.ExitStatus())
}

// startLazyPages starts CRIU's lazy-pages daemon in work (where the
// restorer finds its socket) with our page server on the other end of a
// socket pair (or Restore's, at cfg.PageSocket), and returns once the
// daemon listens. The channel gets the page server's end: after the
// daemon closed the session, the working set is saved (cfg.Record) in
// the image.
func startLazyPages(cfg cloneConfig, work string) (chan error, error) {
	var ours, theirs *os.File
	if cfg.PageSocket != "" {
		sock, done, err := socketPath(cfg.PageSocket)
		if err != nil {
			return nil, err
		}
		c, err := net.Dial("unix", sock)
		done()
		if err != nil {
			return nil, fmt.Errorf("the page server: %v", err)
		}
		theirs, err = c.(*net.UnixConn).File()
		c.Close()
		if err != nil {
			return nil, err
		}
	} else {
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return nil, err
		}
		ours, theirs = os.NewFile(uintptr(fds[0]), "page-server"), os.NewFile(uintptr(fds[1]), "lazy-pages")
	}
	status, statusW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	log := filepath.Join(work, "lazy-pages.log")
	// ExtraFiles are fds 3 and 4 of the daemon.
	lazy := exec.Command(cfg.CRIU, "lazy-pages", "-D", cfg.Images, "-W", work, "-o", log, "-v4",
		"--page-server", "--ps-socket", "3", "--status-fd", "4")
	lazy.ExtraFiles = []*os.File{theirs, statusW}
	err = lazy.Start()
	theirs.Close()
	statusW.Close()
	if err != nil {
		return nil, fmt.Errorf("criu lazy-pages: %v", err)
	}
	b := make([]byte, 1)
	_, err = status.Read(b)
	status.Close()
	if err != nil {
		lazy.Process.Kill()
		lazy.Wait()
		return nil, fmt.Errorf("criu lazy-pages: %s", logError(log))
	}
	done := make(chan error, 1)
	if ours == nil {
		// Restore serves the pages, and saves the working set.
		go func() { done <- lazy.Wait() }()
		return done, nil
	}
	go func() {
		ws, pages, err := servePages(ours, cfg.Pages)
		ours.Close()
		lazy.Wait()
		if err == nil && cfg.Record && len(ws) > 0 {
			_, err = branch.AddDataFile(cfg.Pages, WorkingSetName, formatWorkingSet(ws))
		}
		if err != nil {
			// Where a lazy clone's trouble is told: beside its logs.
			os.WriteFile(filepath.Join(work, "page-server.log"), []byte(err.Error()+"\n"), 0o600)
		} else {
			os.WriteFile(filepath.Join(work, "page-server.log"),
				[]byte(fmt.Sprintf("served %d pages, %d of them faulted in\n", pages, len(ws))), 0o600)
		}
		done <- err
	}()
	return done, nil
}
