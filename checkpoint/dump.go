package checkpoint

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/branchfs/branchfs/branch"
	"github.com/branchfs/branchfs/explore"
	"github.com/branchfs/branchfs/internal/phase"
)

// Tiers of a checkpoint's memory.
const (
	TierFull      = "full"       // every page
	TierSoftDirty = "soft-dirty" // pages written since the previous checkpoint, by the kernel's soft-dirty bits
	// Pages the pagemap shows present and anonymous (those CRIU dumps)
	// that differ from the previous checkpoint's: where the kernel has no
	// soft-dirty bits, or the previous dump did not track memory.
	TierAnon = "anon-pagemap"
)

// DumpOptions tell Checkpoint what to dump and how.
type DumpOptions struct {
	PID          int  // root of the tree: a process of a run in the branch; 0: the run's command
	LeaveRunning bool // the tree goes on after the dump (else it is killed)
	Incremental  bool // only pages written since the previous checkpoint, where the kernel can tell
	// Watch, if set, is called with the directory CRIU dumps into just
	// before CRIU starts, and the function it returns as soon as CRIU has
	// exited (dumped: it succeeded), before the image is published (the
	// directory is then renamed): for an upload that runs while CRIU
	// writes. An error from Watch fails the checkpoint before the dump.
	Watch func(dir string) (done func(dumped bool), err error)
}

// freezeTimeout bounds the wait for a run's tree to stop before a dump.
const freezeTimeout = 10 * time.Second

// HoldName is the child branch that keeps a checkpointed branch's files
// frozen.
func HoldName(name string) string { return name + "-checkpoint" }

// Checkpoint dumps the process tree running in branch name (see
// DumpOptions) into a new image of the branch and returns its meta.
func Checkpoint(m *explore.Mount, name string, o DumpOptions) (ImageMeta, error) {
	var meta ImageMeta
	criu, err := Available()
	if err != nil {
		return meta, err
	}
	if err := branch.ValidateName(name); err != nil {
		return meta, err
	}
	info, err := m.Info(name)
	if err != nil {
		return meta, err
	}
	if info.State != branch.Live.String() {
		return meta, fmt.Errorf("branch %s is %s", name, info.State)
	}
	helper, root, err := target(name, o.PID)
	if err != nil {
		return meta, err
	}
	store, err := m.Store()
	if err != nil {
		return meta, err
	}
	unlock, err := lockImages(store, name)
	if err != nil {
		return meta, err
	}
	defer unlock()
	meta = ImageMeta{Branch: name, Tier: TierFull, RootPID: nsPID(root), MaxPID: treeMaxPID(root),
		LeftAlive: o.LeaveRunning, TrackMem: o.LeaveRunning && softDirty()}
	// The tiers of --incremental, best first: soft-dirty, the pagemap's
	// anonymous pages compared with the previous image, and a full dump
	// when there is no previous image.
	var prev ImageMeta
	var prevDir string
	if o.Incremental {
		prev, prevDir, err = LatestImage(store, name)
		switch {
		case errors.Is(err, os.ErrNotExist):
		case err != nil:
			return meta, fmt.Errorf("--incremental: %w", err)
		case !prev.LeftAlive || prev.RootPID != meta.RootPID:
			return meta, fmt.Errorf("--incremental: the previous checkpoint (%d) is of another process tree, or did not leave it running", prev.Gen)
		case prev.TrackMem:
			meta.Tier, meta.Parent = TierSoftDirty, prev.Gen
		default:
			meta.Tier, meta.Parent = TierAnon, prev.Gen
		}
	}
	// The tree stops first, then its branch goes read-only (the hold),
	// then CRIU dumps it: the tree never runs while its branch is
	// read-only, so the checkpoint is one it does not notice. CRIU is
	// told of the frozen cgroup (--freeze-cgroup): it seizes every task
	// there, thaws the cgroup to run its code in the seized tasks, and
	// freezes it again, as it found it; the tree then goes on
	// (--leave-running) or is killed, and the cgroup is thawed.
	cgroup, thaw, err := explore.FreezeRun(root, freezeTimeout)
	if err != nil {
		return meta, fmt.Errorf("checkpoint: stopping the tree of process %d: %w", root, err)
	}
	defer thaw()
	// The hold freezes the branch's files before the memory is taken.
	hold := HoldName(name)
	madeHold := false
	if hi, err := m.Info(hold); err != nil || hi.State != branch.Live.String() {
		if err == nil {
			m.Abort(hold, true) // a stale one, from an earlier checkpoint
		}
		if _, err := m.Create(name, hold); err != nil {
			return meta, fmt.Errorf("freezing the files of %s: %w", name, err)
		}
		madeHold = true
	}
	meta.Hold = hold
	fail := func(err error) (ImageMeta, error) {
		if madeHold {
			m.Abort(hold, true)
		}
		return meta, err
	}
	staged, err := branch.StageData(store)
	if err != nil {
		return fail(err)
	}
	defer os.RemoveAll(staged) // gone once published
	log := filepath.Join(staged, "dump.log")
	// Cgroups are not restored (each clone stays in its run's), so their
	// properties are not dumped either.
	args := []string{"dump", "-t", strconv.Itoa(meta.RootPID), "-D", staged, "-o", log, "-v4", "--shell-job",
		"--manage-cgroups=ignore", "--freeze-cgroup", cgroup}
	// Without --leave-running the tree is left stopped and killed here,
	// once CRIU is done: CRIU killing it would end the run, and with its
	// PID namespace CRIU itself, before it finished.
	if o.LeaveRunning {
		args = append(args, "--leave-running")
	} else {
		args = append(args, "--leave-stopped")
	}
	if meta.TrackMem {
		args = append(args, "--track-mem")
	}
	if meta.Tier == TierSoftDirty {
		// Relative to -D, which is STORE/tmp/X.
		args = append(args, "--prev-images-dir", filepath.Join("..", "..", "branches", name, "images", strconv.Itoa(meta.Parent)))
	}
	// CRIU runs in the run's mount and PID namespaces, where the tree's
	// paths and PIDs are what it will find again in each clone.
	nsenter, err := exec.LookPath("nsenter")
	if err != nil {
		return fail(errors.New("checkpoint: nsenter (util-linux or busybox) is needed"))
	}
	cmd := exec.Command(nsenter, append([]string{"-t", strconv.Itoa(helper), "-m", "-p", "--", criu}, args...)...)
	watched := func(bool) {}
	if o.Watch != nil {
		if watched, err = o.Watch(staged); err != nil {
			return fail(err)
		}
	}
	phase.Mark("criu starts")
	out, err := cmd.CombinedOutput()
	phase.Mark("criu exited")
	watched(err == nil)
	if !o.LeaveRunning {
		syscall.Kill(root, syscall.SIGKILL) // the run ends with it
	}
	if err != nil {
		// The staged image goes; its log stays beside the branch's images.
		if at, err := publishFiles(m, store, name, FailedDumpsArea, log); err == nil {
			log = at[filepath.Base(log)]
		}
		why := logError(log)
		if strings.HasPrefix(why, "no log") {
			// CRIU did not get as far as its log (or nsenter did not
			// start it): what it or nsenter printed says why.
			why = fmt.Sprintf("%v, and no log: %s", err, firstError(out))
		}
		return fail(fmt.Errorf("criu dump of process %d failed: %s", root, why))
	}
	if meta.Parent != 0 {
		// The parent link CRIU made is relative to the staging place.
		link := filepath.Join(staged, "parent")
		os.Remove(link)
		if err := os.Symlink(filepath.Join("..", strconv.Itoa(meta.Parent)), link); err != nil {
			return fail(err)
		}
	}
	if meta.Tier == TierAnon {
		if err := dedupe(staged, prevDir); err != nil {
			return fail(fmt.Errorf("comparing with checkpoint %d: %w", prev.Gen, err))
		}
	}
	meta.Pages = countPages(staged)
	phase.Mark("pages counted")
	// The log is kept with the image, under a name CRIU does not read.
	meta, err = publishImage(m, staged, meta)
	if err != nil {
		return fail(err)
	}
	phase.Mark("image published")
	return meta, nil
}

// countPages counts the pages a dump wrote (its pages-*.img files).
func countPages(dir string) int64 {
	files, _ := filepath.Glob(filepath.Join(dir, "pages-*.img"))
	var n int64
	for _, f := range files {
		if fi, err := os.Stat(f); err == nil {
			n += fi.Size() / int64(syscall.Getpagesize())
		}
	}
	return n
}
