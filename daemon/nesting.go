package daemon

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// CheckNesting refuses a base, store and mount point inside one another.
// A store inside the base is reachable through every view (a commit could
// move the live store's own files), and one inside the mount point, or a
// mount point inside the base, makes the daemon serve requests on its own
// mount, which deadlocks it. Each is compared by device and inode with
// every ancestor of the others, so bind mounts and symbolic links do not
// hide a nesting.
func CheckNesting(base, store, mnt string) error {
	paths := []struct{ what, path string }{{"base", base}, {"store", store}, {"mount point", mnt}}
	for _, in := range paths {
		for _, outer := range paths {
			if in.what == outer.what {
				continue
			}
			inside, err := within(in.path, outer.path)
			if err != nil {
				return err
			}
			if inside {
				return fmt.Errorf("the %s %s is inside the %s %s; choose places outside one another", in.what, in.path, outer.what, outer.path)
			}
		}
	}
	return nil
}

// within reports whether p, or the nearest of its ancestors that exists,
// is dir or lies below it. A dir that does not exist holds nothing.
func within(p, dir string) (bool, error) {
	var dst syscall.Stat_t
	if err := syscall.Stat(dir, &dst); err != nil {
		if os.IsNotExist(err) {
			return false, nil
		}
		return false, fmt.Errorf("%s: %w", dir, err)
	}
	p, err := filepath.Abs(p)
	if err != nil {
		return false, err
	}
	for d := p; ; d = filepath.Dir(d) {
		var st syscall.Stat_t
		if syscall.Stat(d, &st) == nil && st.Dev == dst.Dev && st.Ino == dst.Ino {
			return true, nil
		}
		if d == "/" {
			return false, nil
		}
	}
}
