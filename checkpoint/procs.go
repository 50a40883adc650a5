package checkpoint

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// A run's helper is started with the arguments "branchfs-init NAME"
// (package explore), PID 1 of the run's PID namespace; the run's command
// is its child.
const helperArg0 = "branchfs-init"

func cmdline(pid int) []string {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return nil
	}
	return strings.Split(strings.TrimSuffix(string(data), "\x00"), "\x00")
}

func isHelperOf(pid int, name string) bool {
	a := cmdline(pid)
	return len(a) == 2 && a[0] == helperArg0 && a[1] == name
}

// statusField is a field of /proc/PID/status.
func statusField(pid int, field string) string {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

func ppid(pid int) int {
	n, _ := strconv.Atoi(statusField(pid, "PPid"))
	return n
}

// nsPID is a process's PID in its innermost PID namespace.
func nsPID(pid int) int {
	f := strings.Fields(statusField(pid, "NSpid"))
	if len(f) == 0 {
		return 0
	}
	n, _ := strconv.Atoi(f[len(f)-1])
	return n
}

// runHelper finds the helper of the run in branch name.
func runHelper(name string) (int, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err == nil && isHelperOf(pid, name) {
			return pid, nil
		}
	}
	return 0, fmt.Errorf("no `branchfs run` is running in branch %s", name)
}

// children lists a process's children (of all its threads).
func children(pid int) []int {
	var out []int
	tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	for _, t := range tasks {
		data, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "task", t.Name(), "children"))
		for _, f := range bytes.Fields(data) {
			if n, err := strconv.Atoi(string(f)); err == nil {
				out = append(out, n)
			}
		}
	}
	return out
}

// treeMaxPID is the highest PID or thread ID, as its PID namespace
// numbers it, of the tree rooted at pid.
func treeMaxPID(pid int) int {
	maxPID := 0
	tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	for _, t := range tasks {
		tid, err := strconv.Atoi(t.Name())
		if err != nil {
			continue
		}
		if n := nsPID(tid); n > maxPID {
			maxPID = n
		}
	}
	for _, c := range children(pid) {
		if n := treeMaxPID(c); n > maxPID {
			maxPID = n
		}
	}
	return maxPID
}

// target finds what to dump for branch name: the tree rooted at pid (a
// process of a run in that branch), or at the run's command when pid is
// 0. It returns the run's helper and the root.
func target(name string, pid int) (helper, root int, err error) {
	if pid == 0 {
		if helper, err = runHelper(name); err != nil {
			return 0, 0, err
		}
		kids := children(helper)
		if len(kids) == 0 {
			return 0, 0, fmt.Errorf("the run in branch %s has no command running", name)
		}
		return helper, kids[0], nil
	}
	if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err != nil {
		return 0, 0, fmt.Errorf("no process %d", pid)
	}
	for p := ppid(pid); p > 1; p = ppid(p) {
		if isHelperOf(p, name) {
			return p, pid, nil
		}
	}
	return 0, 0, fmt.Errorf("process %d is not in a `branchfs run` of branch %s", pid, name)
}
