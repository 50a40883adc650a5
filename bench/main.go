// Command bench measures branchfs against native ext4 and fuse-overlayfs,
// every system side by side in one process, and writes
// bench/results/RESULTS.md and bench/results/results.svg.
//
//	go run ./bench            # the full suite (as root; needs fuse-overlayfs)
//	go run ./bench -quick     # smaller sizes, for a smoke run
package main

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

func runtimeGOROOT() string {
	out, err := exec.Command("go", "env", "GOROOT").Output()
	must(err)
	return strings.TrimSpace(string(out))
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == workerArg {
		runWorker() // inside a run: see inrun.go
		return
	}
	out := flag.String("out", "bench/results", "where RESULTS.md and results.svg go")
	quick := flag.Bool("quick", false, "smaller sizes, for a smoke run")
	only := flag.String("only", "", "run only these workloads (comma-separated: create,commit,io,write,meta,tree,build,depth,memory)")
	flag.Parse()
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "bench: needs root (FUSE mounts, dropping caches)")
		os.Exit(1)
	}
	if _, err := exec.LookPath("fuse-overlayfs"); err != nil {
		fmt.Fprintln(os.Stderr, "bench: needs fuse-overlayfs (apt-get install fuse-overlayfs)")
		os.Exit(1)
	}
	work, err := os.MkdirTemp("/var/tmp", "branchfs-bench")
	must(err)
	os.Chmod(work, 0o755)
	b := &bench{work: work, quick: *quick, bin: filepath.Join(work, "branchfs"), loadStart: loadAverage()}
	build := exec.Command("go", "build", "-o", b.bin, "./cmd/branchfs")
	build.Env = append(os.Environ(), "CGO_ENABLED=0") // as make build does
	if out, err := build.CombinedOutput(); err != nil {
		fail("building branchfs: %v: %s", err, out)
	}
	start := time.Now()
	defer func() {
		b.unmountAll()
		os.RemoveAll(work)
		if r := recover(); r != nil {
			fmt.Fprintln(os.Stderr, "bench:", r)
			os.Exit(1)
		}
	}()
	workloads := []struct {
		name string
		fn   func()
	}{{"create", b.createLatency}, {"commit", b.commitAbort}, {"io", b.throughput}, {"write", b.write},
		{"meta", b.metadata}, {"tree", b.tree}, {"build", b.build}, {"depth", b.lookupDepth}, {"memory", b.memory}}
	for _, w := range workloads {
		if *only == "" || strings.Contains(","+*only+",", ","+w.name+",") {
			w.fn()
		}
	}
	must(os.MkdirAll(*out, 0o755))
	command := "go run ./bench " + strings.Join(os.Args[1:], " ")
	must(b.writeReport(filepath.Join(*out, "RESULTS.md"), strings.TrimSpace(command), time.Since(start)))
	must(b.writeSVG(filepath.Join(*out, "results.svg")))
	fmt.Println("wrote", filepath.Join(*out, "RESULTS.md"), "and", filepath.Join(*out, "results.svg"))
}
