package explore

import (
	"bufio"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
)

// Limits bound what a run's processes, together, may use; each zero
// means no limit. Memory, Pids and CPUs are the run's cgroup's memory.max,
// pids.max and cpu.max: they need a cgroup v2 whose memory, pids and cpu
// controllers the hierarchy gives the runner (its own cgroup's
// cgroup.controllers), and a run that asks for one that cannot be had
// fails to start, with the reason; none is ever dropped in silence.
type Limits struct {
	// Memory is the most memory, in bytes, the run's processes may use
	// (memory.max; memory.swap.max 0 where there is swap): past it, the
	// kernel reclaims, then kills a process of the run (the OOM killer).
	Memory int64 `json:"memory,omitempty"`
	// Pids is the most processes and threads the run may have at once
	// (pids.max); a fork past it fails with EAGAIN.
	Pids int `json:"pids,omitempty"`
	// CPUs is the CPU time the run may take per unit of wall time, in
	// CPUs (cpu.max; 0.5 is half of one CPU, 2 two of them).
	CPUs float64 `json:"cpus,omitempty"`
}

// Zero reports whether l sets no limit.
func (l Limits) Zero() bool { return l == Limits{} }

func (l Limits) check() error {
	switch {
	case l.Memory < 0:
		return fmt.Errorf("negative memory limit %d", l.Memory)
	case l.Memory > 0 && l.Memory < 1<<20:
		// Less cannot hold the run's helper.
		return fmt.Errorf("memory limit %d bytes: 1 MiB at least", l.Memory)
	case l.Pids < 0:
		return fmt.Errorf("negative process limit %d", l.Pids)
	case l.Pids > 0 && l.Pids < 2:
		// The helper is one, the command another.
		return fmt.Errorf("process limit %d: 2 at least (the run's helper and its command)", l.Pids)
	case l.CPUs < 0 || math.IsNaN(l.CPUs) || math.IsInf(l.CPUs, 0):
		return fmt.Errorf("CPU limit %v: a positive number of CPUs", l.CPUs)
	case l.CPUs > 0 && l.CPUs*cpuPeriod < 1000:
		return fmt.Errorf("CPU limit %v: 0.01 CPU at least", l.CPUs)
	}
	return nil
}

// controllers are the cgroup controllers l needs.
func (l Limits) controllers() []string {
	var c []string
	if l.Memory > 0 {
		c = append(c, "memory")
	}
	if l.Pids > 0 {
		c = append(c, "pids")
	}
	if l.CPUs > 0 {
		c = append(c, "cpu")
	}
	return c
}

// cpuPeriod is cpu.max's period, in microseconds (the kernel's default).
const cpuPeriod = 100000

// enableControllers makes the controllers l needs available to the
// cgroups of runs in dir (the runs' directory, under root, the runner's
// own cgroup): enabled in root's and dir's cgroup.subtree_control.
func enableControllers(root, dir string, l Limits) error {
	want := l.controllers()
	if len(want) == 0 {
		return nil
	}
	avail, err := os.ReadFile(filepath.Join(root, "cgroup.controllers"))
	if err != nil {
		return fmt.Errorf("cgroup %s: %w", root, err)
	}
	have := strings.Fields(string(avail))
	for _, c := range want {
		if !slices.Contains(have, c) {
			return fmt.Errorf("the %s controller is not delegated to cgroup %s (its cgroup.controllers: %q)", c, root, strings.TrimSpace(string(avail)))
		}
	}
	for _, d := range []string{root, dir} {
		on, err := os.ReadFile(filepath.Join(d, "cgroup.subtree_control"))
		if err != nil {
			return fmt.Errorf("cgroup %s: %w", d, err)
		}
		var add []string
		for _, c := range want {
			if !slices.Contains(strings.Fields(string(on)), c) {
				add = append(add, "+"+c)
			}
		}
		if len(add) == 0 {
			continue
		}
		if err := os.WriteFile(filepath.Join(d, "cgroup.subtree_control"), []byte(strings.Join(add, " ")), 0); err != nil {
			if errors.Is(err, syscall.EBUSY) {
				// cgroup v2 gives controllers only to children of a
				// cgroup that holds no process of its own.
				return fmt.Errorf("cannot enable %s in cgroup %s: it holds processes (start the runner in a cgroup of its own, delegated)", strings.Join(add, " "), d)
			}
			return fmt.Errorf("cannot enable %s in cgroup %s: %w", strings.Join(add, " "), d, err)
		}
	}
	return nil
}

// setLimits writes l into the run's cgroup, before any process is in it.
func setLimits(dir string, l Limits) error {
	write := func(file, value string) error {
		if err := os.WriteFile(filepath.Join(dir, file), []byte(value), 0); err != nil {
			return fmt.Errorf("cgroup %s: %s: %w", dir, file, err)
		}
		return nil
	}
	if l.Memory > 0 {
		if err := write("memory.max", strconv.FormatInt(l.Memory, 10)); err != nil {
			return err
		}
		// Swap would let the run use more than its limit; a kernel
		// without swap has no such file.
		if _, err := os.Stat(filepath.Join(dir, "memory.swap.max")); err == nil {
			if err := write("memory.swap.max", "0"); err != nil {
				return err
			}
		}
	}
	if l.Pids > 0 {
		if err := write("pids.max", strconv.Itoa(l.Pids)); err != nil {
			return err
		}
	}
	if l.CPUs > 0 {
		quota := int64(math.Round(l.CPUs * cpuPeriod))
		if err := write("cpu.max", fmt.Sprintf("%d %d", quota, cpuPeriod)); err != nil {
			return err
		}
	}
	return nil
}

// limitsHit reads from the run's cgroup which of its limits it ran into:
// "memory" when the OOM killer killed a process of it (memory.events
// oom_kill), "pids" when a fork failed for pids.max (pids.events max).
// cpu is the CPU time the run's processes took, in seconds (cpu.stat).
func limitsHit(dir string, l Limits) (hit []string, cpu float64) {
	if l.Memory > 0 && eventCount(filepath.Join(dir, "memory.events"), "oom_kill") > 0 {
		hit = append(hit, "memory")
	}
	if l.Pids > 0 && eventCount(filepath.Join(dir, "pids.events"), "max") > 0 {
		hit = append(hit, "pids")
	}
	return hit, float64(eventCount(filepath.Join(dir, "cpu.stat"), "usage_usec")) / 1e6
}

// eventCount is the number after key in a flat-keyed cgroup file.
func eventCount(path, key string) int64 {
	f, err := os.Open(path)
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), " "); ok && k == key {
			n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n
		}
	}
	return 0
}

// String is l as flags would give it: "memory 64 MiB, pids 100, cpus 0.5".
func (l Limits) String() string {
	var parts []string
	if l.Memory > 0 {
		parts = append(parts, "memory "+formatSize(l.Memory))
	}
	if l.Pids > 0 {
		parts = append(parts, "pids "+strconv.Itoa(l.Pids))
	}
	if l.CPUs > 0 {
		parts = append(parts, "cpus "+strconv.FormatFloat(l.CPUs, 'g', -1, 64))
	}
	return strings.Join(parts, ", ")
}

// formatSize is n bytes in the largest binary unit that holds it whole
// ("64M"), else in bytes.
func formatSize(n int64) string {
	for _, u := range []struct {
		shift uint
		name  string
	}{{40, "T"}, {30, "G"}, {20, "M"}, {10, "K"}} {
		if n >= 1<<u.shift && n%(1<<u.shift) == 0 {
			return strconv.FormatInt(n>>u.shift, 10) + u.name
		}
	}
	return strconv.FormatInt(n, 10)
}
