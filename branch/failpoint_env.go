//go:build branchfs_failpoints

package branch

import (
	"os"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// With the branchfs_failpoints build tag, which only tests use,
// BRANCHFS_FAILPOINT is a comma-separated list of STEP (the daemon dies at
// STEP, as by kill -9) and STEP=ERRNO (STEP fails with enospc, eperm or eio).
func init() {
	spec := os.Getenv("BRANCHFS_FAILPOINT")
	if spec == "" {
		return
	}
	points := map[string]error{}
	for _, p := range strings.Split(spec, ",") {
		step, errName, _ := strings.Cut(p, "=")
		switch errName {
		case "":
			points[step] = nil
		case "enospc":
			points[step] = unix.ENOSPC
		case "eperm":
			points[step] = unix.EPERM
		case "eio":
			points[step] = unix.EIO
		default:
			panic("BRANCHFS_FAILPOINT: unknown error " + errName)
		}
	}
	failHook = func(s string) error {
		errno, ok := points[s]
		if !ok {
			return nil
		}
		if errno != nil {
			return errno
		}
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {}
	}
}
