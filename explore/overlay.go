package explore

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/branchfs/branchfs/branch"
	"github.com/branchfs/branchfs/ctl"
	"golang.org/x/sys/unix"
)

// DataPath is how a run's processes reach the branch's files.
type DataPath string

const (
	// DataPathAuto takes the kernel path where the kernel's overlayfs can
	// serve the run, else the FUSE path, and says why once on stderr.
	DataPathAuto DataPath = "auto"
	// DataPathKernel mounts overlayfs over the branch's layers in the
	// run's mount namespace: the kernel serves every file at native
	// speed, and the daemon holds the branch (its view is read-only)
	// until the run ends. A run that cannot have it fails.
	DataPathKernel DataPath = "kernel"
	// DataPathFUSE binds the branch's view, served by the daemon.
	DataPathFUSE DataPath = "fuse"
)

// ParseDataPath checks a data path given by name.
func ParseDataPath(s string) (DataPath, error) {
	switch p := DataPath(s); p {
	case DataPathAuto, DataPathKernel, DataPathFUSE:
		return p, nil
	case "":
		return DataPathAuto, nil
	}
	return "", fmt.Errorf("data path %q is not kernel, fuse or auto", s)
}

// mountView shows the branch at every target, in the helper's mount
// namespace: on the kernel path an overlayfs over the branch's layers,
// else its view. It returns the path taken, and why the kernel path was
// not when auto fell back.
func mountView(cfg *initConfig) (DataPath, string, error) {
	fallback := ""
	if cfg.DataPath != DataPathFUSE {
		mfd, err := kernelView(cfg)
		if err == nil {
			defer unix.Close(mfd)
			return DataPathKernel, "", attach(mfd, cfg.Targets)
		}
		if cfg.DataPath == DataPathKernel {
			return "", "", fmt.Errorf("kernel path: %w", err)
		}
		fallback = err.Error()
	}
	// Once MNT is covered, MNT/@NAME no longer resolves: hold the view
	// open and bind it by descriptor. It is opened only now: a hold the
	// kernel path gave back dropped the kernel's entry of the view, and a
	// descriptor of a dropped entry cannot be bound (ENOENT).
	vfd, err := unix.Open(cfg.View, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", "", fmt.Errorf("opening the view %s: %w", cfg.View, err)
	}
	defer unix.Close(vfd)
	src := fmt.Sprintf("/proc/self/fd/%d", vfd)
	for _, t := range cfg.Targets {
		if err := unix.Mount(src, t, "", unix.MS_BIND, ""); err != nil {
			return "", "", fmt.Errorf("binding the view over %s: %w", t, err)
		}
	}
	return DataPathFUSE, fallback, nil
}

// kernelView holds the branch for this process (the daemon kills it should
// the branch go stale, and releases the hold when it is gone) and makes
// an overlayfs of its layers, not yet attached. It returns the mount's
// descriptor.
func kernelView(cfg *initConfig) (int, error) {
	ls, err := ctl.Hold(cfg.View)
	if err != nil {
		return -1, err
	}
	mfd, err := mountLayers(ls)
	if err != nil {
		// The FUSE path may take over: the view must take writes.
		ctl.Release(cfg.View)
	}
	return mfd, err
}

// mountLayers opens and checks the layers the daemon named and makes an
// overlayfs of them.
func mountLayers(ls *branch.Layers) (int, error) {
	dirs := append([]branch.Dir{ls.Upper, ls.Work}, ls.Lower...)
	paths := make([]string, len(dirs))
	for i, d := range dirs {
		// The layers are given to overlayfs as the directories opened
		// and checked here, by their descriptors' /proc paths: nothing
		// can swap a path's component in between.
		fd, err := unix.Open(d.Path, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return -1, fmt.Errorf("layer %s: %w", d.Path, err)
		}
		defer unix.Close(fd)
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			return -1, err
		}
		if st.Dev != d.Dev || st.Ino != d.Ino {
			return -1, fmt.Errorf("layer %s is not the directory the daemon holds (another mount namespace?)", d.Path)
		}
		paths[i] = "/proc/self/fd/" + strconv.Itoa(fd)
	}
	return mountOverlay(paths[0], paths[1], paths[2:])
}

// mountOverlay makes an overlayfs of the layers (directories' paths) with
// the options branchfs's format needs: userxattr, root's too, so that the
// markers are user xattrs (branch/layer.go), and none of the features that
// write what branchfs does not read (redirects, metacopy, an index).
func mountOverlay(upper, work string, lower []string) (int, error) {
	fsfd, err := unix.Fsopen("overlay", unix.FSOPEN_CLOEXEC)
	if err != nil {
		if errors.Is(err, unix.ENODEV) {
			return -1, errors.New("the kernel has no overlayfs")
		}
		return -1, fmt.Errorf("overlayfs: %w", err)
	}
	defer unix.Close(fsfd)
	why := func(step string, err error) error {
		if msg := fsLog(fsfd); msg != "" {
			return fmt.Errorf("overlayfs %s: %w (%s)", step, err, msg)
		}
		return fmt.Errorf("overlayfs %s: %w", step, err)
	}
	// One layer a call (Linux 6.8): no limit on their number but
	// overlayfs's own (500); before, all in one value of at most 256 bytes.
	for i, l := range lower {
		if err := unix.FsconfigSetString(fsfd, "lowerdir+", l); err != nil {
			if i > 0 || !errors.Is(err, unix.EINVAL) {
				return -1, why("lower layer", err)
			}
			fsLog(fsfd)
			if err := unix.FsconfigSetString(fsfd, "lowerdir", strings.Join(lower, ":")); err != nil {
				return -1, why(fmt.Sprintf("%d lower layers", len(lower)), err)
			}
			break
		}
	}
	for _, o := range [][2]string{{"upperdir", upper}, {"workdir", work}, {"index", "off"},
		{"metacopy", "off"}, {"redirect_dir", "nofollow"}} {
		if err := unix.FsconfigSetString(fsfd, o[0], o[1]); err != nil {
			return -1, why(o[0], err)
		}
	}
	if err := unix.FsconfigSetFlag(fsfd, "userxattr"); err != nil {
		return -1, why("userxattr (Linux 5.11)", err)
	}
	if err := unix.FsconfigCreate(fsfd); err != nil {
		return -1, why("mount", err)
	}
	mfd, err := unix.Fsmount(fsfd, unix.FSMOUNT_CLOEXEC, 0)
	if err != nil {
		return -1, why("mount", err)
	}
	return mfd, nil
}

// fsLog reads what the filesystem said about a failed step: the kernel
// keeps it on the context's descriptor, one message a read.
func fsLog(fsfd int) string {
	var msgs []string
	buf := make([]byte, 1024)
	for {
		n, err := unix.Read(fsfd, buf)
		if err != nil || n <= 0 {
			break
		}
		m := strings.TrimSpace(string(buf[:n]))
		// "e overlay: ...": the severity letter first.
		if len(m) > 2 && m[1] == ' ' {
			m = m[2:]
		}
		msgs = append(msgs, m)
	}
	return strings.Join(msgs, "; ")
}

// attach puts the detached mount mfd at the first target and binds it over
// the others.
func attach(mfd int, targets []string) error {
	if err := unix.MoveMount(mfd, "", unix.AT_FDCWD, targets[0], unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("mounting the branch over %s: %w", targets[0], err)
	}
	for _, t := range targets[1:] {
		if err := unix.Mount(targets[0], t, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("binding the branch over %s: %w", t, err)
		}
	}
	return nil
}

// fallbackOnce: auto says once per process that it took the FUSE path.
var fallbackOnce sync.Once

// SetDataPath sets the data path of the runs started through m (and so of
// the patterns) whose Spec names none.
func (m *Mount) SetDataPath(p DataPath) { m.dataPath = p }

// dataPath is the run's data path. The kernel path mounts the layers the
// daemon names, so auto takes it only from a daemon of root's or this
// user's (Mount.trusted), and kernel fails with another's.
func (p *Proc) dataPath() (DataPath, error) {
	dp := DataPathAuto
	switch {
	case p.spec.DataPath != "":
		dp = p.spec.DataPath
	case p.m.dataPath != "":
		dp = p.m.dataPath
	}
	switch {
	case p.spec.MaxStorage > 0 && dp == DataPathKernel:
		return "", fmt.Errorf("kernel path: %w", branch.ErrQuotaHold)
	case p.spec.MaxStorage > 0:
		return DataPathFUSE, nil // the daemon counts what the run writes
	case p.m.Trusted() || dp == DataPathFUSE:
		return dp, nil
	case dp == DataPathKernel:
		return "", fmt.Errorf("kernel path: the daemon of %s runs as uid %d, not as root or you", p.m.Dir(), p.m.Owner())
	}
	return DataPathFUSE, nil
}

// endKernelPath settles a kernel-path run whose processes are all gone:
// the daemon releases the branch (its view then shows what the run wrote),
// and a run killed because its branch went stale reports so.
func (p *Proc) endKernelPath(r *Result) {
	// A daemon gone (killed, unmounted) holds nothing: the run's writes
	// are in the store, for the next mount.
	p.m.Release(p.name)
	if r.sig == syscall.SIGKILL && !r.TimedOut {
		if info, err := p.m.Info(p.name); err == nil && info.State == branch.Stale.String() {
			r.Stale = true
		}
	}
}

// helperCaps are the capabilities an ordinary user's helper keeps in the
// run's user namespace, over the user's own files only, until it starts
// the command: CAP_SYS_ADMIN for its mounts, and what overlayfs, which
// works on its layers with the credentials of whoever mounted it, needs
// there: its work directory has mode 0, and copy-up keeps modes, owners,
// set-id bits, times and xattrs.
var helperCaps = []uintptr{unix.CAP_SYS_ADMIN, unix.CAP_DAC_OVERRIDE, unix.CAP_DAC_READ_SEARCH,
	unix.CAP_FOWNER, unix.CAP_FSETID, unix.CAP_CHOWN}

// daemonGone reports an error of a mount whose daemon is gone (killed,
// or its connection aborted).
func daemonGone(err error) bool {
	return errors.Is(err, syscall.ENOTCONN) || errors.Is(err, syscall.ECONNABORTED)
}

// keepForRemount ends a run whose daemon went away meanwhile: the branch
// and what the run wrote are in the store (on the kernel path the run
// went on without the daemon), and the next mount of the store shows it.
// The record goes, so that no reaper aborts the branch.
func (p *Proc) keepForRemount(err error) error {
	p.res.Outcome = Keep
	p.created = false
	p.end()
	return fmt.Errorf("%w; branch %s stays in the store: mount it again to commit or abort it", err, p.name)
}
