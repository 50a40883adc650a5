// Command remote measures push and pull against a plain upload and
// download of the same bytes to the same S3 server (SeaweedFS on
// loopback, scripts/seaweedfs.sh), and the bytes a second push of a
// branch moves after 1% of its files changed. It writes
// bench/results/remote.md. As root (it mounts):
//
//	go run ./bench/remote
//
// The lazy restore from a bucket is measured in the QEMU guest, where CRIU
// runs (BRANCHFS_CRIU_BENCH=remote make qemu-test: qemu/criu-remote-bench.sh).
package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"flag"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/branchfs/branchfs/ctl"
	"github.com/branchfs/branchfs/remote"
)

const (
	key    = "branchfs-bench"
	secret = "branchfs-bench-secret"
	jobs   = remote.DefaultJobs
)

type bench struct {
	work, bin, endpoint string
	env                 []string
	b                   *remote.Bucket
	mounts              []string
	lines               []string
}

func main() {
	out := flag.String("out", "bench/results/remote.md", "where the report goes")
	runs := flag.Int("runs", 3, "runs of each measure (the median is reported)")
	only := flag.String("only", "", "measure only this: big, small or second (default: all)")
	flag.Parse()
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "bench/remote: needs root (FUSE mounts)")
		os.Exit(1)
	}
	work, err := os.MkdirTemp("/var/tmp", "branchfs-bench-remote")
	must(err)
	b := &bench{work: work, bin: filepath.Join(work, "branchfs")}
	defer func() {
		b.cleanup()
		if r := recover(); r != nil {
			fmt.Fprintln(os.Stderr, "bench/remote:", r)
			os.Exit(1)
		}
	}()
	build := exec.Command("go", "build", "-o", b.bin, "./cmd/branchfs")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		fail("building branchfs: %v: %s", err, out)
	}
	loadBefore := loadAverage()
	server := b.startServer()
	defer func() { server.Process.Kill(); server.Wait() }() // before the cleanup
	start := time.Now()

	if *only == "" || *only == "big" {
		big := b.branch("big", func(v string) { writeFiles(v, 4, 64<<20) })
		b.throughput("4 files of 64 MiB", big, *runs)
	}
	if *only == "" || *only == "small" {
		small := b.branch("small", func(v string) { writeFiles(v, 4096, 16<<10) })
		b.throughput("4096 files of 16 KiB in 64 directories", small, *runs)
	}
	if *only == "" || *only == "second" {
		b.secondPush(*runs)
	}

	var r strings.Builder
	fmt.Fprintf(&r, "# Push and pull through an S3 server\n\n")
	fmt.Fprintf(&r, "- command: `%s`\n", strings.Join(append([]string{"go run ./bench/remote"}, os.Args[1:]...), " "))
	fmt.Fprintf(&r, "- run: %s, %.0f s; SeaweedFS (weed server -s3) on loopback, one process; %d requests in flight for\n",
		time.Now().UTC().Format("2006-01-02 15:04 UTC"), time.Since(start).Seconds(), jobs)
	fmt.Fprintf(&r, "  every measure; the branch and the plain files on one ext4 (or whatever holds /var/tmp); median of %d runs\n", *runs)
	fmt.Fprintf(&r, "- plain upload: each file of the branch, read through the branch's view, PUT as an object of its own; plain\n")
	fmt.Fprintf(&r, "  download: each object GET and written to a native directory. Push and pull do the same bytes as chunks,\n")
	fmt.Fprintf(&r, "  with hashing, the manifest, the base's versions (push) and writes through the FUSE view (pull)\n")
	loadAfter := loadAverage()
	fmt.Fprintf(&r, "- load average (1, 5, 15 min; %d CPUs) before: %s; after: %s\n", runtime.NumCPU(), loadBefore, loadAfter)
	if l := load1(loadBefore); l > 0.5 {
		fmt.Fprintf(&r, "- **the machine was loaded** (a 1-minute load of %.2f before this run began): the absolute figures suffer;\n", l)
		fmt.Fprintf(&r, "  the ratios, each side measured in turn under the same load, hold better\n")
	}
	fmt.Fprintf(&r, "- how these figures came to be, and earlier ones: [docs/performance-history.md](../../docs/performance-history.md#push-and-pull)\n")
	fmt.Fprintf(&r, "\n| measure | ratio | raw |\n| --- | --- | --- |\n")
	for _, l := range b.lines {
		fmt.Fprintln(&r, l)
	}
	must(os.MkdirAll(filepath.Dir(*out), 0o755))
	must(os.WriteFile(*out, []byte(r.String()), 0o644))
	fmt.Print(r.String())
}

func (b *bench) cleanup() {
	for i := len(b.mounts) - 1; i >= 0; i-- {
		exec.Command(b.bin, "unmount", b.mounts[i]).Run()
	}
	os.RemoveAll(b.work)
}

// startServer runs SeaweedFS and waits until it stores an object.
func (b *bench) startServer() *exec.Cmd {
	port := freePortRun(8)
	b.endpoint = "http://127.0.0.1:" + strconv.Itoa(port)
	cmd := exec.Command("./scripts/seaweedfs.sh", "serve", filepath.Join(b.work, "s3"), strconv.Itoa(port), key, secret)
	log, err := os.Create(filepath.Join(b.work, "server.log"))
	must(err)
	cmd.Stdout, cmd.Stderr = log, log
	must(cmd.Start())
	b.env = append(os.Environ(), "AWS_ACCESS_KEY_ID="+key, "AWS_SECRET_ACCESS_KEY="+secret, "AWS_REGION=us-east-1",
		"AWS_ENDPOINT_URL="+b.endpoint, "AWS_EC2_METADATA_DISABLED=true",
		"AWS_CONFIG_FILE=/nonexistent", "AWS_SHARED_CREDENTIALS_FILE=/nonexistent")
	for _, kv := range b.env[len(os.Environ()):] {
		k, v, _ := strings.Cut(kv, "=")
		os.Setenv(k, v)
	}
	deadline := time.Now().Add(30 * time.Minute) // the first run builds weed
	for {
		if err := b.makeBucket("ready"); err == nil {
			return cmd
		}
		if time.Now().After(deadline) {
			fail("the S3 server did not answer")
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// makeBucket makes a bucket with curl (SigV4), which remote does not do.
func (b *bench) makeBucket(name string) error {
	out, err := exec.Command("curl", "-fsS", "--aws-sigv4", "aws:amz:us-east-1:s3", "--user", key+":"+secret,
		"-X", "PUT", b.endpoint+"/"+name).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%v: %s", err, out)
	}
	bk, err := remote.Connect(context.Background(), name)
	if err != nil {
		return err
	}
	b.b = bk
	return bk.Put(context.Background(), "probe", []byte("ready"))
}

// mount mounts a fresh empty base and returns its mount point.
func (b *bench) mount(name string) string {
	base, mnt := filepath.Join(b.work, name, "base"), filepath.Join(b.work, name, "mnt")
	must(os.MkdirAll(base, 0o755))
	must(os.MkdirAll(mnt, 0o755))
	b.cli(nil, "mount", "--base", base, "--store", filepath.Join(b.work, name, "store"), mnt)
	b.mounts = append(b.mounts, mnt)
	return mnt
}

func (b *bench) cli(env []string, args ...string) string {
	cmd := exec.Command(b.bin, args...)
	cmd.Env = env
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		fail("branchfs %s: %v: %s", strings.Join(args, " "), err, errb.String())
	}
	return out.String()
}

// branch makes a branch of a mount of its own and fills it.
func (b *bench) branch(name string, fill func(view string)) string {
	mnt := b.mount("src-" + name)
	b.cli(nil, "create", name, mnt)
	v := filepath.Join(mnt, ctl.BranchPrefix+name)
	fill(v)
	return v
}

// writeFiles writes n files of size random bytes, in 64 directories when
// there are more than 64.
func writeFiles(dir string, n, size int) {
	buf := make([]byte, size)
	for i := range n {
		d := dir
		if n > 64 {
			d = filepath.Join(dir, fmt.Sprintf("d%02d", i%64))
			must(os.MkdirAll(d, 0o755))
		}
		rand.Read(buf)
		must(os.WriteFile(filepath.Join(d, fmt.Sprintf("f%05d", i)), buf, 0o644))
	}
}

func files(dir string) (paths []string, total int64) {
	must(filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			fi, err := d.Info()
			if err != nil {
				return err
			}
			paths = append(paths, p)
			total += fi.Size()
		}
		return nil
	}))
	return paths, total
}

type stats struct {
	Stats remote.Stats `json:"stats"`
}

func (b *bench) push(view, url string) remote.Stats {
	var s stats
	must(json.Unmarshal([]byte(b.cli(b.env, "push", "--json", view, url)), &s))
	return s.Stats
}

func dropCaches() {
	exec.Command("sync").Run()
	os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0)
}

// throughput times push vs a plain upload, and pull vs a plain download,
// of the files of view.
func (b *bench) throughput(name, view string, runs int) {
	paths, total := files(view)
	var push, up, pull, down []float64
	for run := range runs {
		bucket := fmt.Sprintf("tp%d-%d", len(b.lines), run)
		must(b.makeBucket(bucket))
		dropCaches()
		t := time.Now()
		b.push(view, "s3://"+bucket+"/br/")
		push = append(push, time.Since(t).Seconds())

		dropCaches()
		t = time.Now()
		b.parallel(len(paths), func(i int) {
			data, err := os.ReadFile(paths[i])
			must(err)
			must(b.b.Put(context.Background(), "plain/"+strconv.Itoa(i), data))
		})
		up = append(up, time.Since(t).Seconds())

		mnt := b.mount(fmt.Sprintf("dst-%s-%d", bucket, run))
		dropCaches()
		t = time.Now()
		b.cli(b.env, "pull", "s3://"+bucket+"/br/"+filepath.Base(view)[1:], mnt)
		pull = append(pull, time.Since(t).Seconds())

		dst := filepath.Join(b.work, "plain-"+bucket)
		must(os.MkdirAll(dst, 0o755))
		dropCaches()
		t = time.Now()
		b.parallel(len(paths), func(i int) {
			data, err := b.b.Get(context.Background(), "plain/"+strconv.Itoa(i))
			must(err)
			must(os.WriteFile(filepath.Join(dst, strconv.Itoa(i)), data, 0o644))
		})
		exec.Command("sync").Run()
		down = append(down, time.Since(t).Seconds())
	}
	mb := float64(total) / (1 << 20)
	p, u, l, d := median(push), median(up), median(pull), median(down)
	b.lines = append(b.lines,
		fmt.Sprintf("| push vs plain upload, %s (%.0f MiB) | %.2f | %.0f vs %.0f MiB/s (%.2f vs %.2f s) |", name, mb, (mb/p)/(mb/u), mb/p, mb/u, p, u),
		fmt.Sprintf("| pull vs plain download, %s | %.2f | %.0f vs %.0f MiB/s (%.2f vs %.2f s) |", name, (mb/l)/(mb/d), mb/l, mb/d, l, d))
}

// secondPush: a branch of 1000 files of 64 KiB, pushed; 10 of them
// rewritten; pushed again to the same place.
func (b *bench) secondPush(runs int) {
	var first, second []float64
	var firstN, secondN []float64
	for run := range runs {
		v := b.branch(fmt.Sprintf("many%d", run), func(v string) { writeFiles(v, 1000, 64<<10) })
		bucket := fmt.Sprintf("second%d", run)
		must(b.makeBucket(bucket))
		url := "s3://" + bucket + "/br/many"
		s1 := b.push(v, url)
		paths, _ := files(v)
		buf := make([]byte, 64<<10)
		for _, p := range paths[:10] {
			rand.Read(buf)
			must(os.WriteFile(p, buf, 0o644))
		}
		s2 := b.push(v, url)
		first, second = append(first, float64(s1.Sent)), append(second, float64(s2.Sent))
		firstN, secondN = append(firstN, float64(s1.Requests)), append(secondN, float64(s2.Requests))
	}
	f, s := median(first), median(second)
	b.lines = append(b.lines, fmt.Sprintf("| bytes sent by a second push after 10 of 1000 files of 64 KiB changed, vs the first | %.4f | %s vs %s (%.0f vs %.0f requests) |",
		s/f, remote.BytesOf(int64(s)), remote.BytesOf(int64(f)), median(secondN), median(firstN)))
}

func (b *bench) parallel(n int, fn func(i int)) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range jobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				fn(i)
			}
		}()
	}
	wg.Wait()
}

// loadAverage is the first three fields of /proc/loadavg.
func loadAverage() string {
	data, err := os.ReadFile("/proc/loadavg")
	must(err)
	return strings.Join(strings.Fields(string(data))[:3], " ")
}

func load1(avg string) float64 {
	v, _ := strconv.ParseFloat(strings.Fields(avg)[0], 64)
	return v
}

func median(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	return s[len(s)/2]
}

func freePortRun(n int) int {
	for base := 21000; base < 60000; base += 97 {
		var ls []net.Listener
		for p := base; p < base+n; p++ {
			l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
			if err != nil {
				break
			}
			ls = append(ls, l)
		}
		for _, l := range ls {
			l.Close()
		}
		if len(ls) == n {
			return base
		}
	}
	fail("no free ports")
	return 0
}

func must(err error) {
	if err != nil {
		panic(err)
	}
}

// fail ends the run; main's deferred cleanup unmounts what it mounted.
func fail(format string, a ...any) { panic(fmt.Sprintf(format, a...)) }
