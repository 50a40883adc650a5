package checkpoint

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// EnvCRIU names the criu binary to use instead of the one in PATH.
const EnvCRIU = "BRANCHFS_CRIU"

// ErrUnavailable is wrapped by every error that says CRIU cannot run here.
var ErrUnavailable = errors.New("process checkpoints need CRIU")

// Available returns the path of a criu binary that passes `criu check` on
// this kernel, or an error of one line that says what is needed. It is
// worked out once per process.
func Available() (string, error) { return available() }

var available = sync.OnceValues(probe)

func probe() (string, error) {
	name := os.Getenv(EnvCRIU)
	if name == "" {
		name = "criu"
	}
	path, err := exec.LookPath(name)
	if err != nil {
		return "", fmt.Errorf("%w: no criu binary found (install criu; kernels from 6.13 on need CRIU 4.1 or later)", ErrUnavailable)
	}
	out, err := exec.Command(path, "check").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("%w that works on kernel %s: `%s check` fails (%s); kernels from 6.13 on need CRIU 4.1 or later",
			ErrUnavailable, kernelRelease(), path, firstError(out))
	}
	return path, nil
}

// softDirty reports whether CRIU can track dirty memory on this kernel
// (the soft-dirty bits of /proc/PID/pagemap).
var softDirty = sync.OnceValue(func() bool {
	path, err := available()
	if err != nil {
		return false
	}
	return exec.Command(path, "check", "--feature", "mem_dirty_track").Run() == nil
})

func kernelRelease() string {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return "?"
	}
	return unix.ByteSliceToString(u.Release[:])
}

// firstError is the first "Error" line of CRIU's output or log, or its
// last line, trimmed.
func firstError(out []byte) string {
	var last string
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		// CRIU's "exited, status=N" lines are about a helper process; the
		// cause comes after them.
		if strings.Contains(line, "Error") && !strings.Contains(line, "exited, status=") {
			return line
		}
		last = line
	}
	if last == "" {
		return "no output"
	}
	return last
}

// logError quotes the first error of a CRIU log file.
func logError(path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return "no log: " + err.Error()
	}
	return firstError(data) + " (log: " + path + ")"
}
