package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
	"unsafe"

	"github.com/branchfs/branchfs/ctl"
	"golang.org/x/sys/unix"
)

// bench holds the work directory and the branchfs binary under test.
type bench struct {
	work    string
	bin     string
	mounts  []string
	quick   bool
	results []result
	// loadStart is the load average when the run began (report).
	loadStart string
}

func (b *bench) dir(name string) string {
	d := filepath.Join(b.work, name)
	must(os.MkdirAll(d, 0o755))
	return d
}

// mountBranchfs mounts base with its own store and returns the mount point.
func (b *bench) mountBranchfs(name, base, passthrough string) string {
	return b.mountBranchfsStore(name, base, b.storeDir(name), passthrough)
}

// mountBranchfsStore is mountBranchfs with the store at store.
func (b *bench) mountBranchfsStore(name, base, store, passthrough string) string {
	mnt := b.dir(name + "-mnt")
	out, err := exec.Command(b.bin, "mount", "--base", base, "--store", store, "--passthrough", passthrough, mnt).CombinedOutput()
	if err != nil {
		fail("mount branchfs: %v: %s", err, out)
	}
	b.mounts = append(b.mounts, mnt)
	return mnt
}

// storeDir is the branch store of the mount mountBranchfs made as name.
func (b *bench) storeDir(name string) string { return filepath.Join(b.work, name+"-store") }

// mountOverlay mounts base read-only below a fresh upper directory, with
// fuse-overlayfs.
func (b *bench) mountOverlay(name, base string) string {
	return b.mountOverlayDirs(false, name, base, b.dir(name+"-upper"), b.dir(name+"-work"))
}

// mountKernelOverlay is mountOverlay with the kernel's overlayfs: the
// reference a FUSE design must approach.
func (b *bench) mountKernelOverlay(name, base string) string {
	return b.mountOverlayDirs(true, name, base, b.dir(name+"-upper"), b.dir(name+"-work"))
}

// mountOverlayDirs mounts base read-only below upper, with work as the
// overlay's work directory (both made if missing), with the kernel's
// overlayfs if kernel is set, else with fuse-overlayfs.
func (b *bench) mountOverlayDirs(kernel bool, name, base, upper, work string) string {
	must(os.MkdirAll(upper, 0o755))
	must(os.MkdirAll(work, 0o755))
	mnt := b.dir(name + "-mnt")
	opts := "lowerdir=" + base + ",upperdir=" + upper + ",workdir=" + work
	what, cmd := "fuse-overlayfs", exec.Command("fuse-overlayfs", "-o", opts, mnt)
	if kernel {
		what, cmd = "overlayfs", exec.Command("mount", "-t", "overlay", "overlay", "-o", opts, mnt)
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		fail("mount %s: %v: %s", what, err, out)
	}
	b.mounts = append(b.mounts, mnt)
	return mnt
}

// mountFloor mounts the cheapest FUSE daemon there can be
// (bench/floor/fuse-floor.c: it answers every request and keeps nothing)
// and returns its mount point and what unmounts it: the floor under any
// FUSE daemon's extraction here (docs/performance.md, "The floor").
func (b *bench) mountFloor(name string) (string, func()) {
	bin := filepath.Join(b.work, "fuse-floor")
	if _, err := os.Stat(bin); err != nil {
		if out, err := exec.Command("cc", "-O2", "-Wall", "-pthread", "-o", bin, "bench/floor/fuse-floor.c").CombinedOutput(); err != nil {
			fail("building bench/floor/fuse-floor.c: %v: %s", err, out)
		}
	}
	mnt := b.dir(name + "-mnt")
	// On CPU 0, as the extraction into it is (tree): a daemon and its
	// caller on different CPUs wake each other with an interrupt that is a
	// VM exit here, and the scheduler does not always keep them together
	// by itself; the floor is the best case.
	cmd := exec.Command("taskset", "-c", "0", bin, "serve", mnt)
	must(cmd.Start())
	for !isMounted(mnt, "fuse.fuse-floor") {
		if cmd.ProcessState != nil {
			fail("fuse-floor ended before it mounted %s", mnt)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return mnt, func() {
		if err := unix.Unmount(mnt, 0); err != nil {
			unix.Unmount(mnt, unix.MNT_DETACH)
		}
		cmd.Wait()
	}
}

// isMounted says whether a file system of type fstype is mounted at mnt.
func isMounted(mnt, fstype string) bool {
	ms, _ := ctl.Mounts()
	for _, m := range ms {
		if m.Point == mnt && m.FSType == fstype {
			return true
		}
	}
	return false
}

func (b *bench) unmount(mnt string) {
	if err := exec.Command(b.bin, "unmount", mnt).Run(); err != nil {
		if err := exec.Command("fusermount3", "-u", mnt).Run(); err != nil {
			unix.Unmount(mnt, unix.MNT_DETACH)
		}
	}
	for i, m := range b.mounts {
		if m == mnt {
			b.mounts = append(b.mounts[:i], b.mounts[i+1:]...)
			break
		}
	}
}

func (b *bench) unmountAll() {
	for len(b.mounts) > 0 {
		b.unmount(b.mounts[len(b.mounts)-1])
	}
}

// daemonPid finds the branchfs daemon serving mnt.
func daemonPid(mnt string) int {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		cmd, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(bytes.TrimRight(cmd, "\x00")), "\x00")
		if len(args) > 2 && strings.HasSuffix(args[0], "branchfs") && args[1] == "mount" && args[len(args)-1] == mnt {
			var pid int
			fmt.Sscan(e.Name(), &pid)
			return pid
		}
	}
	return 0
}

func rssMB(pid int) float64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, "VmRSS:") {
			var kb float64
			fmt.Sscan(strings.TrimPrefix(line, "VmRSS:"), &kb)
			return kb / 1024
		}
	}
	return 0
}

// createBranch makes a child of the view at root through the ioctl and
// returns its name and how long the ioctl took.
func createBranch(root string) (string, time.Duration) {
	f, err := os.Open(filepath.Join(root, ctl.ControlName))
	must(err)
	defer f.Close()
	start := time.Now()
	name, err := ctl.IoctlCreate(f)
	d := time.Since(start)
	must(err)
	return name, d
}

// dropCaches empties the page, dentry and inode caches, for cold reads.
func dropCaches() {
	unix.Sync()
	must(os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0o200))
}

// makeTree makes n small files in directories of at most 100.
func makeTree(root string, n int) {
	for i := 0; i < n; i++ {
		d := filepath.Join(root, fmt.Sprintf("d%03d", i/100))
		if i%100 == 0 {
			must(os.MkdirAll(d, 0o755))
		}
		must(os.WriteFile(filepath.Join(d, fmt.Sprintf("f%03d.txt", i%100)), []byte(fmt.Sprintf("file %d\n", i)), 0o644))
	}
}

// makeFile writes a file of size bytes that compresses and dedups badly.
func makeFile(p string, size int64) {
	f, err := os.Create(p)
	must(err)
	defer f.Close()
	block := make([]byte, 1<<20)
	var x uint64 = 0x9e3779b97f4a7c15
	for off := int64(0); off < size; off += int64(len(block)) {
		for i := 0; i < len(block); i += 8 {
			x ^= x << 13
			x ^= x >> 7
			x ^= x << 17
			*(*uint64)(unsafe.Pointer(&block[i])) = x
		}
		n := min(int64(len(block)), size-off)
		_, err := f.Write(block[:n])
		must(err)
	}
}

func run(dir string, env []string, name string, args ...string) error {
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, lastLines(out, 5))
	}
	return nil
}

func lastLines(out []byte, n int) string {
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func must(err error) {
	if err != nil {
		fail("%v", err)
	}
}

func fail(format string, args ...any) {
	panic(fmt.Sprintf(format, args...))
}
