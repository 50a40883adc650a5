package main

import (
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"github.com/branchfs/branchfs/ctl"
)

// Systems, in the order the tables list them.
const (
	sysNative   = "native ext4"
	sysMain     = "branchfs main"
	sysBranch   = "branchfs branch"
	sysOverlay  = "fuse-overlayfs"
	sysKOverlay = "overlayfs (kernel)"
	sysFloor    = "FUSE floor (no daemon can be faster)"
)

func (b *bench) add(group, cas, system, unit string, samples []float64) {
	b.results = append(b.results, result{Group: group, Case: cas, System: system, Unit: unit, Samples: samples})
	r := b.results[len(b.results)-1]
	fmt.Printf("%-10s %-34s %-34s %10.1f %s\n", group, cas, system, r.median(), unit)
}

func usSince(start time.Time) float64 { return float64(time.Since(start).Nanoseconds()) / 1e3 }

// createLatency: branch creation through the ioctl and the CLI, against
// the size of the base, with fuse-overlayfs's mount of a fresh upper layer
// (its way to start a branch) for reference. Every base is made, written
// back and mounted before any is measured, so that no base's setup or
// removal runs under another's measurement. Each base gets a hundred ioctl
// creates, the bases taking turns.
func (b *bench) createLatency() {
	sizes := []int{100, 1000, 10000, 100000}
	if b.quick {
		sizes = []int{100, 1000}
	}
	bases := make([]string, len(sizes))
	mnts := make([]string, len(sizes))
	for i, n := range sizes {
		bases[i] = b.dir(fmt.Sprintf("create-base-%d", n))
		makeTree(bases[i], n)
	}
	syncFS() // setup's writeback must not land in the measurements
	for i, n := range sizes {
		mnts[i] = b.mountBranchfs(fmt.Sprintf("create-%d", n), bases[i], "auto")
	}
	syncFS() // and the mounts' own writes (store logs)
	ioctlUs := make([][]float64, len(sizes))
	cliUs := make([][]float64, len(sizes))
	ovl := make([][]float64, len(sizes))
	// Base sizes take turns (see turns), as systems do elsewhere: a
	// passing disturbance (in one run, the whole block of the largest
	// base's creates took 92 µs against 28 for the others) then falls on
	// all sizes alike instead of making one look slow. Each create also
	// finds its daemon idle since its last turn but for the open of the
	// control file just before, as an agent's would, which costs more
	// than creates back to back (see README).
	for r := 0; r < 100; r++ {
		for _, i := range turns(r, len(mnts)) {
			_, d := createBranch(mnts[i])
			ioctlUs[i] = append(ioctlUs[i], float64(d.Nanoseconds())/1e3)
		}
	}
	for r := 0; r < 10; r++ {
		for _, i := range turns(r, len(mnts)) {
			start := time.Now()
			must(run(mnts[i], nil, b.bin, "create", "cli"+strconv.Itoa(r), mnts[i]))
			cliUs[i] = append(cliUs[i], usSince(start))
		}
	}
	for _, mnt := range mnts {
		b.unmount(mnt)
	}
	for r := 0; r < 5; r++ {
		for i, n := range sizes {
			start := time.Now()
			m := b.mountOverlay(fmt.Sprintf("create-ovl-%d-%d", n, r), bases[i])
			ovl[i] = append(ovl[i], usSince(start))
			b.unmount(m)
		}
	}
	for i, n := range sizes {
		cas := fmt.Sprintf("create, base of %d files", n)
		b.add("create", cas, "branchfs ioctl", "µs", ioctlUs[i])
		b.add("create", cas, "branchfs CLI", "µs", cliUs[i])
		b.add("create", cas, sysOverlay+" mount", "µs", ovl[i])
		os.RemoveAll(bases[i])
	}
}

// commitAbort: commit and abort of deltas of various sizes through the
// ioctls, with native rename of the same files as the floor.
func (b *bench) commitAbort() {
	base := b.dir("commit-base")
	makeTree(base, 1000)
	mnt := b.mountBranchfs("commit", base, "auto")
	scratch := b.dir("commit-native")
	type delta struct {
		name  string
		files int
		size  int64
	}
	deltas := []delta{{"1 KB", 1, 1 << 10}, {"100 KB", 1, 100 << 10}, {"1 MB", 1, 1 << 20},
		{"100 MB", 1, 100 << 20}, {"1000 files of 1 KB", 1000, 1 << 10}}
	rounds := 15
	if b.quick {
		deltas[3] = delta{"10 MB", 1, 10 << 20}
		rounds = 3
	}
	type step struct {
		delta
		action string
	}
	var steps []step
	for _, d := range deltas {
		steps = append(steps, step{d, "commit"}, step{d, "abort"})
	}
	// Sizes and actions take turns (see turns): in blocks, a size would
	// also measure the moment its block ran at, such as the writeback and
	// block freeing that 100 MB deltas leave behind for whatever follows.
	// Each timed step starts with the CPUs' caches emptied (cacheEvictor).
	caches := newCacheEvictor()
	us, native := make([][]float64, len(steps)), make([][]float64, len(steps))
	for r := 0; r < rounds; r++ {
		for _, i := range turns(r, len(steps)) {
			st := steps[i]
			name, _ := createBranch(mnt)
			view := filepath.Join(mnt, ctl.BranchPrefix+name)
			for k := 0; k < st.files; k++ {
				makeFile(filepath.Join(view, fmt.Sprintf("delta-%d", k)), st.size)
			}
			do := ctl.IoctlCommit
			if st.action == "abort" {
				do = ctl.IoctlAbort
			}
			settle(b.storeDir("commit"), name)
			caches.evict()
			// A client opens the control file, then sends the
			// ioctl; only the ioctl is timed. The open comes after
			// settle's sync, which takes time in proportion to the
			// delta, and after the caches are emptied: the first
			// request after an idle stretch costs more than the
			// next here (a native rename took 600 µs after 100 ms
			// idle instead of 380; a 1 MB commit 700 instead of
			// 360): timed right after the sync, the table would
			// compare sync lengths, not delta sizes. The native
			// floor gets an lstat instead.
			f, err := os.Open(filepath.Join(view, ctl.ControlName))
			must(err)
			start := time.Now()
			must(do(f))
			us[i] = append(us[i], usSince(start))
			f.Close()
			if st.action == "commit" {
				// The floor: the same files renamed natively, over the
				// ones of the same size that this step's last round
				// renamed. Those keep a second name until the renames
				// are timed: the commit moves what it replaces aside
				// and frees it in the background, and a rename that
				// freed a 100 MB file would time the freeing (21 ms
				// here, against 15 µs for the rename).
				kept := filepath.Join(scratch, "kept")
				must(os.MkdirAll(kept, 0o755))
				for k := 0; k < st.files; k++ {
					makeFile(filepath.Join(scratch, fmt.Sprintf("n-%d", k)), st.size)
					old := filepath.Join(base, fmt.Sprintf("native-%d-%d", i, k))
					if err := os.Link(old, filepath.Join(kept, strconv.Itoa(k))); err != nil && !os.IsNotExist(err) {
						must(err)
					}
				}
				settle("", "")
				caches.evict()
				_, err := os.Lstat(filepath.Join(scratch, "n-0"))
				must(err)
				start = time.Now()
				for k := 0; k < st.files; k++ {
					must(os.Rename(filepath.Join(scratch, fmt.Sprintf("n-%d", k)), filepath.Join(base, fmt.Sprintf("native-%d-%d", i, k))))
				}
				native[i] = append(native[i], usSince(start))
				must(os.RemoveAll(kept))
			}
		}
	}
	for i, st := range steps {
		cas := st.action + " of " + st.name
		b.add(st.action, cas, "branchfs ioctl", "µs", us[i])
		if native[i] != nil {
			b.add(st.action, cas, sysNative+" rename", "µs", native[i])
		}
	}
	b.unmount(mnt)
}

// settle writes back the data the workload wrote (a commit moves files; it
// does not flush them) and waits for the store's background removal of
// earlier commits' and aborts' leftovers (the deltas of finished branches,
// then the trash), so that a timed step pays for neither. live is the one
// branch whose delta stays.
func settle(store, live string) {
	for i := 0; store != "" && i < 500; i++ {
		trash, _ := os.ReadDir(filepath.Join(store, "trash"))
		deltas, _ := os.ReadDir(filepath.Join(store, "deltas"))
		if len(trash) == 0 && (len(deltas) == 0 || len(deltas) == 1 && deltas[0].Name() == live) {
			break
		}
		time.Sleep(2 * time.Millisecond)
	}
	syncFS()
}

func syncFS() { exec.Command("sync").Run() }

// throughput: sequential reads in 64 KiB blocks, cold and warm, of a file
// unmodified and copied up, and the copy-up itself.
func (b *bench) throughput() {
	size := int64(512 << 20)
	if b.quick {
		size = 64 << 20
	}
	base := b.dir("io-base")
	makeFile(filepath.Join(base, "big"), size)
	syncFS()
	auto := b.mountBranchfs("io-auto", base, "auto")
	ovl := b.mountOverlay("io-ovl", base)
	kovl := b.mountKernelOverlay("io-kovl", base)
	ba, _ := createBranch(auto)
	br, _ := createBranch(auto)
	rw := b.startWorker(auto, br)
	views := []view{
		{sysNative, base, nil}, {sysMain, auto, nil}, {sysBranch, filepath.Join(auto, ctl.BranchPrefix+ba), nil},
		{sysOverlay, ovl, nil}, {sysKOverlay, kovl, nil}, {sysRun, auto, rw},
	}
	mb := float64(size) / (1 << 20)
	for _, cache := range []string{"cold", "warm"} {
		readRounds(views, func(v view, s []float64) {
			b.add("read", "unmodified file, "+cache+" cache", v.system, "MB/s", s)
		}, mb, cache == "cold")
	}
	// Copy the file up, then read the copy.
	for _, v := range views[2:] {
		if v.w != nil {
			s := v.w.do(workerRequest{Op: "openrw", Path: filepath.Join(v.dir, "big")})
			b.add("copy-up", fmt.Sprintf("copy-up of %.0f MB on first write", mb), v.system, "ms", []float64{s * 1e3})
			continue
		}
		start := time.Now()
		f, err := os.OpenFile(filepath.Join(v.dir, "big"), os.O_RDWR, 0)
		must(err)
		f.Close()
		b.add("copy-up", fmt.Sprintf("copy-up of %.0f MB on first write", mb), v.system, "ms", []float64{usSince(start) / 1e3})
	}
	// Natively, read the very copy that the branch view with passthrough
	// reads, in its delta, as the unmodified file's rounds read one file
	// on every system. A copy of its own would compare two page caches:
	// the sizes of the folios that readahead gets differ from file to
	// file, and with them warm reads, by up to 5% between native copies of
	// one file here.
	views[0].dir = filepath.Join(b.storeDir("io-auto"), "deltas", ba)
	_, err := os.Stat(filepath.Join(views[0].dir, "big"))
	must(err)
	for _, cache := range []string{"cold", "warm"} {
		readRounds(append(views[:1:1], views[2:]...), func(v view, s []float64) {
			b.add("read", "copied-up file, "+cache+" cache", v.system, "MB/s", s)
		}, mb, cache == "cold")
	}
	rw.end()
	b.unmount(auto)
	b.unmount(ovl)
	b.unmount(kovl)
}

// write: a new file written in 64 KiB blocks and fsynced, on every system
// that can write. A write of 512 MiB takes about a third of a second here
// and is decided by the disk under it as much as by the system: in three
// full runs that wrote in the work directory, three times in a row per
// system, the kernel's overlayfs alone came out at 0.85x to 1.09x native
// (docs/performance-history.md, Written files). So the systems take turns
// (see turns); each system, each round, writes on an ext4 file system made
// for it on an image written in full beforehand (images), the images
// taking turns among the systems too; and before each write whatever is
// dirty is written back and the caches are dropped, so that no system
// writes while another's data is being written back, or into a page cache
// that another filled. Single writes still vary by about 5% here; over
// 21 rounds the interval of the ratio within a round spans a few percent
// either side.
func (b *bench) write() {
	size, rounds := int64(512<<20), 21
	if b.quick {
		size, rounds = 64<<20, 3
	}
	systems := []string{sysNative, sysMain, sysBranch, sysOverlay, sysKOverlay, sysRun}
	// Four times the file: ext4 then finds room for it as on a disk that
	// is not full, whatever it keeps for itself.
	imgs := b.newImages(len(systems), 4*size)
	defer imgs.remove()
	mb := float64(size) / (1 << 20)
	samples := make([][]float64, len(systems))
	for r := 0; r < rounds; r++ {
		for _, i := range turns(r, len(systems)) {
			fs, release := imgs.fresh(b, (i+r)%len(systems), fmt.Sprintf("write-fs-%d-%d", r, i))
			base := filepath.Join(fs, "base")
			must(os.Mkdir(base, 0o755))
			store := filepath.Join(fs, "store")
			var d, mnt string
			var w *worker
			switch systems[i] {
			case sysNative:
				d = filepath.Join(fs, "native")
				must(os.Mkdir(d, 0o755))
			case sysMain:
				mnt = b.mountBranchfsStore(fmt.Sprintf("write-main-%d", r), base, store, "auto")
				d = mnt
			case sysBranch:
				mnt = b.mountBranchfsStore(fmt.Sprintf("write-branch-%d", r), base, store, "auto")
				name, _ := createBranch(mnt)
				d = filepath.Join(mnt, ctl.BranchPrefix+name)
			case sysOverlay:
				mnt = b.mountOverlayDirs(false, fmt.Sprintf("write-ovl-%d", r), base, filepath.Join(fs, "upper"), filepath.Join(fs, "work"))
				d = mnt
			case sysKOverlay:
				mnt = b.mountOverlayDirs(true, fmt.Sprintf("write-kovl-%d", r), base, filepath.Join(fs, "upper"), filepath.Join(fs, "work"))
				d = mnt
			case sysRun:
				mnt = b.mountBranchfsStore(fmt.Sprintf("write-run-%d", r), base, store, "auto")
				name, _ := createBranch(mnt)
				w = b.startWorker(mnt, name)
				d = mnt // MNT shows the branch in the run
			}
			dropCaches()
			p := filepath.Join(d, "out")
			if w != nil {
				samples[i] = append(samples[i], mb/w.do(workerRequest{Op: "write", Path: p, Size: size}))
				w.end()
			} else {
				samples[i] = append(samples[i], mb/writeFile(p, size))
			}
			if mnt != "" {
				b.unmount(mnt)
			}
			release()
		}
	}
	for i, sys := range systems {
		b.add("write", caseWrite, sys, "MB/s", samples[i])
	}
}

// caseWrite is the write workload's case, which its targets name.
const caseWrite = "new file, written and fsynced"

// view is a system's directory; with w, a kernel-path run's, which w
// works in.
type view struct {
	system, dir string
	w           *worker
}

// read is readFile of the view's file p.
func (v view) read(p string, cold bool) float64 {
	if v.w != nil {
		return v.w.do(workerRequest{Op: "read", Path: p, Cold: cold})
	}
	return readFile(p, cold)
}

// turns is the order in which n systems (or depths, or base sizes) are
// measured in round r. They take turns round after round, so that the
// machine's drift (other tenants, writeback) falls on all of them alike,
// and in a shuffled order, the same in every run, so that none always
// follows the same one (a FUSE daemon's leftover work, or a freshly
// emptied cache, would fall on whichever system came next).
func turns(r, n int) []int {
	return rand.New(rand.NewPCG(uint64(r), uint64(n))).Perm(n)
}

// readRounds reads every view's "big" file in turns (see turns) and
// reports each view's throughputs. Warm reads take tens of
// milliseconds and vary by a fifth from one to the next here, against a
// passthrough cost of a few percent: they get the most rounds.
func readRounds(views []view, report func(v view, mbps []float64), mb float64, cold bool) {
	samples := make([][]float64, len(views))
	rounds := 101
	if cold {
		rounds = 31
	}
	for r := 0; r < rounds; r++ {
		for _, i := range turns(r, len(views)) {
			samples[i] = append(samples[i], mb/views[i].read(filepath.Join(views[i].dir, "big"), cold))
		}
	}
	for i, v := range views {
		report(v, samples[i])
	}
}

// readFile reads p in 64 KiB blocks and returns the seconds it took.
func readFile(p string, cold bool) float64 {
	if cold {
		dropCaches()
	} else {
		readAll(p) // warm the cache once, untimed
	}
	return readAll(p)
}

func readAll(p string) float64 {
	f, err := os.Open(p)
	must(err)
	defer f.Close()
	buf := make([]byte, 64<<10)
	start := time.Now()
	for {
		_, err := f.Read(buf)
		if err == io.EOF {
			break
		}
		must(err)
	}
	return time.Since(start).Seconds()
}

func writeFile(p string, size int64) float64 {
	f, err := os.Create(p)
	must(err)
	buf := make([]byte, 64<<10)
	for i := range buf {
		buf[i] = byte(i * 7)
	}
	start := time.Now()
	for off := int64(0); off < size; off += int64(len(buf)) {
		_, err := f.Write(buf)
		must(err)
	}
	must(f.Sync())
	must(f.Close())
	return time.Since(start).Seconds()
}

// metadata: a stat of every file in a 10k-file tree, git status in a
// 10k-file repository, and extracting and building a real source tree.
func (b *bench) metadata() {
	base := b.dir("meta-base")
	n := 10000
	if b.quick {
		n = 2000
	}
	makeTree(filepath.Join(base, "tree"), n)
	repo := filepath.Join(base, "repo")
	makeTree(repo, n)
	gitEnv := []string{"GIT_AUTHOR_NAME=b", "GIT_AUTHOR_EMAIL=b@b", "GIT_COMMITTER_NAME=b", "GIT_COMMITTER_EMAIL=b@b"}
	must(run(repo, gitEnv, "git", "init", "-q"))
	must(run(repo, gitEnv, "git", "add", "."))
	must(run(repo, gitEnv, "git", "commit", "-qm", "tree"))
	syncFS()
	mnt := b.mountBranchfs("meta", base, "auto")
	ovl := b.mountOverlay("meta-ovl", base)
	name, _ := createBranch(mnt)
	views := []view{{sysNative, base, nil}, {sysMain, mnt, nil},
		{sysBranch, filepath.Join(mnt, ctl.BranchPrefix+name), nil}, {sysOverlay, ovl, nil}}
	// Systems take turns (see turns). Round 0 fills the caches and is not
	// counted. A round takes about a third of a second. git status varies
	// by a tenth from one round to the next here, while branchfs and
	// fuse-overlayfs differ by a few percent: with 24 rounds, which of the
	// two had the lower median changed from run to run.
	const rounds = 61
	walk := make([][]float64, len(views))
	status := make([][]float64, len(views))
	for r := 0; r < rounds; r++ {
		for _, i := range turns(r, len(views)) {
			v := views[i]
			start := time.Now()
			must(filepath.WalkDir(filepath.Join(v.dir, "tree"), func(p string, d fs.DirEntry, err error) error {
				if err == nil {
					_, err = os.Lstat(p)
				}
				return err
			}))
			if r > 0 {
				walk[i] = append(walk[i], usSince(start)/1e3)
			}
		}
		for _, i := range turns(r, len(views)) {
			v := views[i]
			start := time.Now()
			must(run(filepath.Join(v.dir, "repo"), gitEnv, "git", "status", "--porcelain"))
			if r > 0 {
				status[i] = append(status[i], usSince(start)/1e3)
			}
		}
	}
	for i, v := range views {
		b.add("metadata", fmt.Sprintf("stat walk of %d files, warm", n), v.system, "ms", walk[i])
	}
	for i, v := range views {
		b.add("metadata", fmt.Sprintf("git status, %d-file repository", n), v.system, "ms", status[i])
	}
	b.unmount(mnt)
	b.unmount(ovl)
}

// build extracts the machine's Go distribution (src and the toolchain) and
// builds cmd/gofmt and its dependencies from that source, with the build
// cache inside the system under test. A build takes about 15 s and two
// builds of one system here differ by up to a fifth, so each system builds
// three times, from an empty build cache each time, the systems
// taking turns as in the other workloads.
func (b *bench) build() {
	if b.quick {
		return // minutes, not seconds
	}
	goroot := runtimeGOROOT()
	tarball := filepath.Join(b.work, "go.tar")
	must(run(goroot, nil, "tar", "-cf", tarball, "--exclude=./pkg/obj", "--exclude=./test", "--exclude=./doc", "--exclude=./api", "--exclude=./misc", "."))
	wbase := b.dir("build-base")
	wmain := b.mountBranchfs("build-main", wbase, "auto")
	wb := b.mountBranchfs("build-branch", b.dir("build-base2"), "auto")
	name, _ := createBranch(wb)
	wovl := b.mountOverlay("build-ovl", b.dir("build-base3"))
	wkovl := b.mountKernelOverlay("build-kovl", b.dir("build-base4"))
	wr := b.mountBranchfs("build-run", b.dir("build-base5"), "auto")
	rname, _ := createBranch(wr)
	rw := b.startWorker(wr, rname)
	views := []view{{sysNative, b.dir("build-native"), nil}, {sysMain, wmain, nil},
		{sysBranch, filepath.Join(wb, ctl.BranchPrefix+name), nil}, {sysOverlay, wovl, nil}, {sysKOverlay, wkovl, nil},
		{sysRun, wr, rw}}
	for _, v := range views {
		root := filepath.Join(v.dir, "go")
		if v.w != nil {
			v.w.do(workerRequest{Op: "exec", Dir: v.dir, Args: []string{"mkdir", "-p", root}})
			syncFS()
			s := v.w.do(workerRequest{Op: "exec", Dir: root, Args: []string{"tar", "-xf", tarball}})
			b.add("build", "extract Go distribution", v.system, "s", []float64{s})
			continue
		}
		must(os.MkdirAll(root, 0o755))
		syncFS()
		start := time.Now()
		must(run(root, nil, "tar", "-xf", tarball))
		b.add("build", "extract Go distribution", v.system, "s", []float64{usSince(start) / 1e6})
	}
	samples := make([][]float64, len(views))
	for r := 0; r < 3; r++ {
		for _, i := range turns(r, len(views)) {
			root, cache := filepath.Join(views[i].dir, "go"), filepath.Join(views[i].dir, "cache")
			env := []string{"GOROOT=" + root, "GOCACHE=" + cache, "GOFLAGS=", "GOTOOLCHAIN=local", "CGO_ENABLED=0"}
			if w := views[i].w; w != nil {
				w.do(workerRequest{Op: "exec", Dir: views[i].dir, Args: []string{"rm", "-rf", cache}})
				syncFS()
				samples[i] = append(samples[i], w.do(workerRequest{Op: "exec", Dir: filepath.Join(root, "src"), Env: env,
					Args: []string{filepath.Join(root, "bin", "go"), "build", "-o", "/dev/null", "./cmd/gofmt"}}))
				continue
			}
			must(os.RemoveAll(cache))
			syncFS()
			start := time.Now()
			must(run(filepath.Join(root, "src"), env, filepath.Join(root, "bin", "go"), "build", "-o", "/dev/null", "./cmd/gofmt"))
			samples[i] = append(samples[i], usSince(start)/1e6)
		}
	}
	for i, v := range views {
		b.add("build", "build cmd/gofmt from the extracted tree", v.system, "s", samples[i])
	}
	rw.end()
	b.unmount(wmain)
	b.unmount(wb)
	b.unmount(wovl)
	b.unmount(wkovl)
	b.unmount(wr)
}

// tree: what agents do to many small files, in a branch view against
// native, fuse-overlayfs and the kernel's overlayfs: extracting Go's src/
// (about 11k files; tar -x, then syncfs), copying the extracted tree within
// the view (cp -a, then syncfs) and removing the copy (rm -rf, then syncfs).
// The systems take turns (see turns). Each system, each round, works on an
// ext4 file system made for it (freshFS): in a directory where many files
// were deleted in the last minutes, ext4 passes over each of their inodes to
// allocate one (recently_deleted), and a native extraction in the bench's
// work directory took 8.4 s instead of 0.4 s, which pressed every ratio
// towards 1 (docs/performance-history.md).
func (b *bench) tree() {
	tarball := filepath.Join(b.work, "src.tar")
	src := "src"
	if b.quick {
		src = "src/go" // a tenth of it
	}
	must(run(runtimeGOROOT(), nil, "tar", "-cf", tarball, src))
	// The floor only extracts: it keeps nothing to copy or remove.
	systems := []string{sysNative, sysBranch, sysOverlay, sysKOverlay, sysRun, sysFloor}
	rounds := 5
	if b.quick {
		rounds = 2
	}
	extract, cp, rm := make([][]float64, len(systems)), make([][]float64, len(systems)), make([][]float64, len(systems))
	commits := make([][]float64, len(systems))
	for r := 0; r < rounds; r++ {
		for _, i := range turns(r, len(systems)) {
			fs, release := b.freshFS(fmt.Sprintf("tree-fs-%d-%d", r, i))
			base := filepath.Join(fs, "base")
			must(os.Mkdir(base, 0o755))
			var d string
			var mnt, name string
			var w *worker
			var unmountFloor func()
			switch systems[i] {
			case sysNative:
				d = filepath.Join(fs, "native")
			case sysBranch:
				mnt = b.mountBranchfsStore(fmt.Sprintf("tree-%d", r), base, filepath.Join(fs, "store"), "auto")
				name, _ = createBranch(mnt)
				d = filepath.Join(mnt, ctl.BranchPrefix+name, "x")
			case sysRun:
				mnt = b.mountBranchfsStore(fmt.Sprintf("tree-run-%d", r), base, filepath.Join(fs, "store"), "auto")
				name, _ = createBranch(mnt)
				w = b.startWorker(mnt, name)
				d = filepath.Join(mnt, "x") // MNT shows the branch in the run
			case sysOverlay:
				mnt = b.mountOverlayDirs(false, fmt.Sprintf("tree-ovl-%d", r), base, filepath.Join(fs, "upper"), filepath.Join(fs, "work"))
				d = filepath.Join(mnt, "x")
			case sysKOverlay:
				mnt = b.mountOverlayDirs(true, fmt.Sprintf("tree-kovl-%d", r), base, filepath.Join(fs, "upper"), filepath.Join(fs, "work"))
				d = filepath.Join(mnt, "x")
			case sysFloor:
				var floor string
				floor, unmountFloor = b.mountFloor(fmt.Sprintf("tree-floor-%d", r))
				d = filepath.Join(floor, "x")
			}
			if w != nil {
				w.do(workerRequest{Op: "exec", Dir: mnt, Args: []string{"mkdir", d}})
			} else {
				must(os.Mkdir(d, 0o755))
			}
			// syncfs of the view's file system and of the one under it,
			// not sync: that would also write back whatever else the
			// machine has dirty.
			syncDir := func() { exec.Command("sync", "-f", d, fs).Run() }
			timed := func(args ...string) float64 {
				if w != nil {
					return w.do(workerRequest{Op: "exec", Dir: d, Args: args, Sync: []string{d, fs}})
				}
				syncDir()
				start := time.Now()
				must(run(d, nil, args[0], args[1:]...))
				syncDir()
				return usSince(start) / 1e6
			}
			if unmountFloor != nil {
				// On the floor daemon's CPU (mountFloor); it keeps nothing
				// to copy or remove.
				extract[i] = append(extract[i], timed("taskset", "-c", "0", "tar", "-xf", tarball))
				unmountFloor()
				release()
				continue
			}
			extract[i] = append(extract[i], timed("tar", "-xf", tarball))
			cp[i] = append(cp[i], timed("cp", "-a", "src", "copy"))
			rm[i] = append(rm[i], timed("rm", "-rf", "copy"))
			if w != nil {
				w.end()
			}
			if name != "" {
				// What the branch holds now, the extracted tree, into
				// the base: the same change, made through the view or
				// by the kernel in a run.
				syncFS()
				commits[i] = append(commits[i], 1e3*commitTimed(mnt, name))
			}
			if mnt != "" {
				b.unmount(mnt)
			}
			release()
		}
	}
	for i, sys := range systems {
		b.add("tree", caseExtract, sys, "s", extract[i])
		if cp[i] == nil {
			continue // the floor
		}
		b.add("tree", caseCopy, sys, "s", cp[i])
		b.add("tree", caseRemove, sys, "s", rm[i])
		if commits[i] != nil {
			b.add("tree", caseCommitTree, sys, "ms", commits[i])
		}
	}
}

// freshFS makes and mounts an ext4 file system of its own, in an image
// file in the work directory, and returns its root and what removes it.
func (b *bench) freshFS(name string) (string, func()) {
	img, root := filepath.Join(b.work, name+".img"), b.dir(name)
	f, err := os.Create(img)
	must(err)
	must(f.Truncate(8 << 30)) // sparse: only what is written takes space
	f.Close()
	must(run(b.work, nil, "mkfs.ext4", "-q", "-F", img))
	must(run(b.work, nil, "mount", "-o", "loop", img, root))
	return root, func() {
		unmountFS(root)
		os.Remove(img)
		os.Remove(root)
	}
}

// The tree workload's cases, which its targets name.
const (
	caseExtract = "extract Go's src/ (tar -x, syncfs)"
	caseCopy    = "copy it in the view (cp -a, syncfs)"
	caseRemove  = "remove the copy (rm -rf, syncfs)"
	// caseCommitTree: the commit, through the ioctl, of what the branch
	// then holds: the extracted tree.
	caseCommitTree = "commit the extracted src/ into the base"
)

// lookupDepth: first lookups of files through 1 to 16 nested branches.
func (b *bench) lookupDepth() {
	base := b.dir("depth-base")
	makeTree(base, 2000)
	syncFS()
	mnt := b.mountBranchfs("depth", base, "auto")
	depths := []int{1, 2, 4, 8, 16}
	views := make([]string, len(depths))
	parent := mnt
	for i, depth := 0, 0; i < len(depths); i++ {
		for depth < depths[i] {
			name, _ := createBranch(parent)
			parent = filepath.Join(mnt, ctl.BranchPrefix+name)
			depth++
		}
		views[i] = parent
	}
	// Depths take turns (see turns), as systems do elsewhere.
	samples := make([][]float64, len(depths))
	for r := 0; r < 7; r++ {
		for _, i := range turns(r, len(depths)) {
			dropCaches()
			start := time.Now()
			for f := 0; f < 2000; f++ {
				_, err := os.Lstat(filepath.Join(views[i], fmt.Sprintf("d%03d/f%03d.txt", f/100, f%100)))
				must(err)
			}
			samples[i] = append(samples[i], usSince(start)/2000)
		}
	}
	for i, depth := range depths {
		b.add("depth", fmt.Sprintf("first stat of a file, depth %d", depth), sysBranch, "µs", samples[i])
	}
	b.unmount(mnt)
}

// memory: the daemon's resident set with 100 live branches over a
// 10k-file base, before and after a stat of every file in every branch.
func (b *bench) memory() {
	base := b.dir("mem-base")
	files := 10000
	if b.quick {
		files = 1000
	}
	makeTree(base, files)
	mnt := b.mountBranchfs("mem", base, "auto")
	pid := daemonPid(mnt)
	var names []string
	for i := 0; i < 100; i++ {
		name, _ := createBranch(mnt)
		names = append(names, name)
	}
	b.add("memory", "daemon RSS, 100 live branches", "branchfs", "MB", []float64{rssMB(pid)})
	for _, name := range names {
		must(filepath.WalkDir(filepath.Join(mnt, ctl.BranchPrefix+name), func(p string, d fs.DirEntry, err error) error {
			if err == nil {
				_, err = os.Lstat(p)
			}
			return err
		}))
	}
	b.add("memory", fmt.Sprintf("daemon RSS, 100 branches after a stat of all %d files in each", files), "branchfs", "MB", []float64{rssMB(pid)})
	b.unmount(mnt)
}
