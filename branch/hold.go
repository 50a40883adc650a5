package branch

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// Holding a branch for a kernel-path run (docs/processes.md, The kernel
// path). Such a run mounts the kernel's overlayfs over the branch's layers
// in its own mount namespace: its ancestors' deltas and the base below, its
// own delta as the upper layer, which the kernel then writes directly. The
// format of the markers is overlayfs's (layer.go), so the layers need no
// conversion either way. While the run holds the branch, nothing else may
// write its delta: its views refuse writes (ErrHeld), and it can be neither
// branched nor committed (ErrBusy). The daemon ties a hold to the process
// that asked for it and releases it when that process is gone.

// Layers are the directories a kernel-path run stacks with overlayfs, by
// absolute path as the daemon resolved them, with the device and inode
// number of each, so that the run can tell that it opened those.
type Layers struct {
	Upper Dir   `json:"upper"` // the branch's delta
	Work  Dir   `json:"work"`  // overlayfs's work directory, on the delta's filesystem, empty
	Lower []Dir `json:"lower"` // the ancestors' deltas that exist, nearest first, then the base
}

// Dir is a directory of Layers.
type Dir struct {
	Path string `json:"path"`
	Dev  uint64 `json:"dev"`
	Ino  uint64 `json:"ino"`
}

func statDir(path string, fd int) (Dir, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return Dir{}, err
	}
	return Dir{Path: path, Dev: st.Dev, Ino: st.Ino}, nil
}

// workRoot is where a branch's overlayfs work directories are made: with
// its other data, so that its end moves them to the trash.
func (s *Store) workRoot(name string) string {
	return filepath.Join(BranchDataDir(s.dir, name), "work")
}

// Hold marks live branch name as written by a kernel-path run, makes its
// delta directory and a fresh work directory, and returns the layers. A
// branch with live children, already held, or whose store cannot make the
// markers overlayfs writes is refused. Release ends the hold.
func (s *Store) Hold(name string) (*Layers, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, err := s.lookupBranch(name)
	if err != nil {
		return nil, err
	}
	if b.isMain() {
		return nil, &BranchError{"hold", name, ErrMainView}
	}
	v := b.view
	if v == nil {
		return nil, &BranchError{"hold", name, ErrGone}
	}
	if b.held.Load() != nil {
		return nil, &BranchError{"hold", name, ErrBusy}
	}
	if err := v.CheckWritable(); err != nil {
		return nil, &BranchError{"hold", name, err}
	}
	if s.noMarkers != nil {
		return nil, s.noMarkers
	}
	if b.use != nil {
		return nil, &BranchError{"hold", name, ErrQuotaHold}
	}
	if err := v.makeTop(); err != nil {
		return nil, &BranchError{"hold", name, err}
	}
	// An earlier hold's work directory is of no use: overlayfs empties
	// its own at mount, and one left by a killed daemon is stale.
	root := s.workRoot(name)
	if err := removeTree(root); err != nil {
		return nil, &BranchError{"hold", name, err}
	}
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, &BranchError{"hold", name, err}
	}
	work := filepath.Join(root, filepath.Base(s.freshName("tmp")))
	if err := unix.Mkdir(work, 0o700); err != nil {
		return nil, &BranchError{"hold", name, err}
	}
	wfd, err := unix.Open(work, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &BranchError{"hold", name, err}
	}
	defer unix.Close(wfd)
	ls := &Layers{}
	if ls.Work, err = statDir(work, wfd); err != nil {
		return nil, err
	}
	for i, l := range v.layers {
		if !l.present() {
			continue // an ancestor nothing was written to: an empty layer
		}
		d, err := statDir(l.dir, l.fd())
		if err != nil {
			return nil, err
		}
		if i == 0 {
			ls.Upper = d
		} else {
			ls.Lower = append(ls.Lower, d)
		}
	}
	b.held.Store(&work)
	return ls, nil
}

// Release ends the hold of branch name whose work directory is work (from
// Hold's Layers): its views write again, and show what the run wrote. It
// removes the work directory, also when the branch has ended meanwhile.
// Preconditions: the holding run is gone, its overlayfs unmounted.
func (s *Store) Release(name, work string) error {
	s.mu.Lock()
	if b, err := s.lookupBranch(name); err == nil && b.held.Load() != nil && *b.held.Load() == work {
		b.held.Store(nil)
		if b.view != nil {
			// The run changed the delta behind the view's caches.
			b.view.invalidate()
		}
	}
	s.mu.Unlock()
	return removeTree(work)
}

// removeTree removes p and everything below it, making directories
// searchable first: overlayfs leaves its work directory with mode 0.
func removeTree(p string) error {
	err := os.RemoveAll(p)
	if err == nil || !errors.Is(err, os.ErrPermission) {
		return err
	}
	filepath.WalkDir(p, func(q string, d os.DirEntry, err error) error {
		if d != nil && d.IsDir() {
			os.Chmod(q, 0o700)
		}
		if err != nil && d != nil && d.IsDir() {
			return filepath.SkipDir
		}
		return nil
	})
	if err := os.RemoveAll(p); err != nil {
		return fmt.Errorf("removing %s: %w", p, err)
	}
	return nil
}
