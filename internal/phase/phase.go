// Package phase prints when the steps of a command end, to standard
// error, while BRANCHFS_PHASES is set: for finding where a command's time
// goes where no profiler is at hand (the QEMU guest). Each line is
// "branchfs: phase SECONDS WHAT", SECONDS since the process started.
package phase

import (
	"fmt"
	"os"
	"time"
)

// Env turns the lines on.
const Env = "BRANCHFS_PHASES"

var (
	on    = os.Getenv(Env) != ""
	start = time.Now()
)

// On reports whether the lines are printed.
func On() bool { return on }

// Mark prints that what (a format, with args) is done.
func Mark(what string, args ...any) {
	if !on {
		return
	}
	// One write a line, so that lines from goroutines do not mix.
	fmt.Fprintf(os.Stderr, "branchfs: phase %.3f %s\n", time.Since(start).Seconds(), fmt.Sprintf(what, args...))
}
