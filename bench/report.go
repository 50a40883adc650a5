package main

import (
	"fmt"
	"math"
	"os"
	"os/exec"
	"runtime"
	"sort"
	"strings"
	"time"
)

type result struct {
	Group, Case, System, Unit string
	Samples                   []float64
}

func (r result) sorted() []float64 {
	s := append([]float64(nil), r.Samples...)
	sort.Float64s(s)
	return s
}

func (r result) median() float64 {
	s := r.sorted()
	if len(s) == 0 {
		return math.NaN()
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// fasterRounds counts the rounds in which r took less than other. Samples
// of one workload are in round order and the systems take turns within a
// round, so this pairs measurements taken a fraction of a second apart:
// a count near half says two medians differ by noise.
func fasterRounds(r, other result) (won, rounds int) {
	rounds = min(len(r.Samples), len(other.Samples))
	for i := range rounds {
		if r.Samples[i] < other.Samples[i] {
			won++
		}
	}
	return won, rounds
}

// roundRatio is the median over rounds of r's figure divided by other's in
// the same round, with a confidence interval of at least 95% (from six
// rounds on) that assumes nothing about the distribution: sorted, the
// ratios from the k-th lowest to the k-th highest, k the largest rank at
// which a fair coin tossed once per round comes up heads fewer than k
// times with probability at most 2.5%. An interval that holds 1 says the
// run cannot tell the two apart.
func roundRatio(r, other result) (median, lo, hi float64) {
	n := min(len(r.Samples), len(other.Samples))
	if n == 0 {
		return math.NaN(), math.NaN(), math.NaN()
	}
	ratios := make([]float64, n)
	for i := range n {
		ratios[i] = r.Samples[i] / other.Samples[i]
	}
	median = result{Samples: ratios}.median()
	sort.Float64s(ratios)
	k := 0 // 0-based rank
	pmf := math.Pow(0.5, float64(n))
	for tail := pmf; k+1 < n-1-k && tail+pmf*float64(n-k)/float64(k+1) <= 0.025; {
		pmf *= float64(n-k) / float64(k+1)
		tail += pmf
		k++
	}
	return median, ratios[k], ratios[n-1-k]
}

func (r result) min() float64 { return r.sorted()[0] }
func (r result) max() float64 { s := r.sorted(); return s[len(s)-1] }

func (b *bench) find(cas, system string) (result, bool) {
	for _, r := range b.results {
		if r.Case == cas && r.System == system {
			return r, true
		}
	}
	return result{}, false
}

// target is one goal of the suite and how this run did against it.
type target struct {
	goal, measured string
	ok             bool
	known          bool
}

func (b *bench) targets() []target {
	var out []target
	med := func(cas, system string) (float64, bool) {
		r, ok := b.find(cas, system)
		return r.median(), ok
	}
	check := func(goal string, ok bool, format string, args ...any) {
		out = append(out, target{goal, fmt.Sprintf(format, args...), ok, true})
	}
	// Flat means at every size, not only the ends: the dearest size
	// within the target's bound and within 1.5x of the cheapest.
	if lo, hi, n := b.spread("create", "branchfs ioctl", func(string) bool { return true }); n > 0 {
		// Creates on this machine fall in two modes, 25-35 µs and 60-80
		// µs, in proportions that differ from one mount to the next even
		// over the same base, which moves a median by up to 40 µs: so
		// within 1.5x or within 40 µs.
		check("create via ioctl ≤ 100 µs at every base size from 100 to 100k files, flat (max ≤ 1.5x min or min + 40 µs)",
			hi <= 100 && (hi <= 1.5*lo || hi-lo <= 40),
			"%.0f–%.0f µs across %d base sizes", lo, hi, n)
	}
	if c1, ok := med("commit of 1 MB", "branchfs ioctl"); ok {
		check("commit of 1 MB ≤ 0.5 ms", c1 <= 500, "%.0f µs", c1)
	}
	if lo, hi, n := b.spread("commit", "branchfs ioctl", func(cas string) bool {
		return !strings.Contains(cas, "files") // one file of each size
	}); n > 0 {
		check("commit ≤ 0.5 ms at every file size from 1 KB to 100 MB, flat (max ≤ 1.5x min)",
			hi <= 500 && hi <= 1.5*lo, "%.0f–%.0f µs across %d file sizes", lo, hi, n)
	}
	if a1, ok := med("abort of 1 MB", "branchfs ioctl"); ok {
		check("abort of 1 MB ≤ 0.5 ms", a1 <= 500, "%.0f µs", a1)
	}
	for _, kind := range []string{"unmodified file", "copied-up file"} {
		for _, cache := range []string{"cold", "warm"} {
			cas := kind + ", " + cache + " cache"
			nr, ok1 := b.find(cas, sysNative)
			pr, ok2 := b.find(cas, sysBranch)
			if ok1 && ok2 {
				n, p := nr.median(), pr.median()
				rm, lo, hi := roundRatio(pr, nr)
				check(fmt.Sprintf("%s reads in a branch view ≥ 95%% of native (%s)", kind, cache), p >= 0.95*n,
					"%.0f%% of native (%.0f vs %.0f MB/s; within a round %.0f%%, 95%% CI %.0f–%.0f%%)",
					100*p/n, p, n, 100*rm, 100*lo, 100*hi)
			}
		}
	}
	for _, r := range b.results {
		if r.Group != "metadata" || r.System != sysBranch {
			continue
		}
		n, _ := med(r.Case, sysNative)
		ovl, _ := b.find(r.Case, sysOverlay)
		o := ovl.median()
		v := r.median()
		won, rounds := fasterRounds(r, ovl)
		rm, lo, hi := roundRatio(r, ovl)
		check(r.Case+": ≤ 1.5x native and faster than fuse-overlayfs", v <= 1.5*n && v < o,
			"%.2fx native, %.2fx fuse-overlayfs (faster in %d of %d rounds; ratio within a round %.2f, 95%% CI %.2f–%.2f)",
			v/n, v/o, won, rounds, rm, lo, hi)
	}
	if v, ok := med("build cmd/gofmt from the extracted tree", sysBranch); ok {
		n, _ := med("build cmd/gofmt from the extracted tree", sysNative)
		check("source-tree build in a branch ≤ 1.1x native", v <= 1.1*n, "%.2fx native", v/n)
	}
	if r, ok := b.find(caseWrite, sysBranch); ok {
		nr, _ := b.find(caseWrite, sysNative)
		v, n := r.median(), nr.median()
		rm, lo, hi := roundRatio(r, nr)
		check("a new file written and fsynced in a branch ≥ 0.8x native", v >= 0.8*n,
			"%.2fx native (%.0f vs %.0f MB/s; within a round %.2f, 95%% CI %.2f–%.2f)", v/n, v, n, rm, lo, hi)
	}
	if r, ok := b.find(caseExtract, sysBranch); ok {
		n, _ := med(caseExtract, sysNative)
		ovl, _ := b.find(caseExtract, sysOverlay)
		won, rounds := fasterRounds(r, ovl)
		v, o := r.median(), ovl.median()
		check("extracting Go's src/ in a branch ≤ 2x native and faster than fuse-overlayfs", v <= 2*n && v < o,
			"%.2fx native, %.2fx fuse-overlayfs (faster in %d of %d rounds)", v/n, v/o, won, rounds)
	}
	for _, cas := range []string{caseCopy, caseRemove} {
		if v, ok := med(cas, sysBranch); ok {
			n, _ := med(cas, sysNative)
			check(cas+" in a branch ≤ 2x native", v <= 2*n, "%.2fx native", v/n)
		}
	}
	b.kernelPathTargets(check)
	if d1, ok := med("first stat of a file, depth 1", sysBranch); ok {
		d16, _ := med("first stat of a file, depth 16", sysBranch)
		check("depth-16 lookups ≤ 1.2x depth 1", d16 <= 1.2*d1, "%.2fx (%.1f vs %.1f µs)", d16/d1, d16, d1)
	}
	for _, r := range b.results {
		if r.Group == "memory" && strings.Contains(r.Case, "after") {
			check("daemon RSS ≤ 150 MB with 100 branches over a 10k-file base", r.median() <= 150, "%.0f MB (%s)", r.median(), r.Case)
		}
	}
	return out
}

// spread is the lowest and highest median of system's results in group
// whose case passes keep, and how many there were.
func (b *bench) spread(group, system string, keep func(cas string) bool) (lo, hi float64, n int) {
	for _, r := range b.results {
		if r.Group != group || r.System != system || !keep(r.Case) {
			continue
		}
		m := r.median()
		if n == 0 || m < lo {
			lo = m
		}
		if n == 0 || m > hi {
			hi = m
		}
		n++
	}
	return lo, hi, n
}

// loadAverage is /proc/loadavg's first three figures.
func loadAverage() string {
	data, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(data))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

func machine() string {
	cpu := "unknown CPU"
	if data, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(data), "\n") {
			if strings.HasPrefix(line, "model name") {
				cpu = strings.TrimSpace(strings.SplitN(line, ":", 2)[1])
				break
			}
		}
	}
	kernel, _ := exec.Command("uname", "-r").Output()
	mem := ""
	if data, err := os.ReadFile("/proc/meminfo"); err == nil {
		mem = strings.Fields(strings.Split(string(data), "\n")[0])[1] + " kB RAM"
	}
	return fmt.Sprintf("%s, %d cores, %s, Linux %s", cpu, runtime.NumCPU(), mem, strings.TrimSpace(string(kernel)))
}

func commit() string {
	out, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return "unknown"
	}
	rev := strings.TrimSpace(string(out))
	if st, _ := exec.Command("git", "status", "--porcelain", "--untracked-files=no").Output(); len(st) > 0 {
		rev += " (with uncommitted changes)"
	}
	return rev
}

func (b *bench) writeReport(path, command string, elapsed time.Duration) error {
	var w strings.Builder
	fmt.Fprintf(&w, "# branchfs benchmark results\n\n")
	fmt.Fprintf(&w, "- command: `%s`\n- commit: %s\n- date: %s\n- machine: %s\n- work directory filesystem: %s\n- run time: %s\n",
		command, commit(), time.Now().UTC().Format("2006-01-02 15:04 UTC"), machine(), fsType(b.work), elapsed.Round(time.Second))
	// Other work on the machine moves every figure; the run's own load is
	// about 1.
	fmt.Fprintf(&w, "- load average (1, 5, 15 min): %s at the start, %s at the end\n\n", b.loadStart, loadAverage())
	fmt.Fprintf(&w, "Every system ran in this one process, on the same files: native ext4 (the work directory itself; in the tree and write workloads, "+
		"an ext4 file system made for it, as for every other system there), "+
		"the branchfs main view and a branch view (default flags), fuse-overlayfs and the kernel's overlayfs over "+
		"the same base, a kernel-path run, and for extraction the cheapest FUSE daemon there can be "+
		"(bench/floor/fuse-floor.c, which keeps nothing). Medians, with min and max, of the repetitions listed in "+
		"`bench/workloads.go`.\n\n")
	fmt.Fprintf(&w, "## Targets\n\n| target | this run | |\n| --- | --- | --- |\n")
	for _, t := range b.targets() {
		verdict := "met"
		if !t.ok {
			verdict = "**missed**"
		}
		fmt.Fprintf(&w, "| %s | %s | %s |\n", t.goal, t.measured, verdict)
	}
	groups := []string{}
	seen := map[string]bool{}
	for _, r := range b.results {
		if !seen[r.Group] {
			seen[r.Group] = true
			groups = append(groups, r.Group)
		}
	}
	for _, g := range groups {
		fmt.Fprintf(&w, "\n## %s\n\n| case | system | median | min | max | unit | vs native |\n| --- | --- | ---: | ---: | ---: | --- | ---: |\n", g)
		for _, r := range b.results {
			if r.Group != g {
				continue
			}
			ratio := ""
			if n, ok := b.find(r.Case, sysNative); ok && r.System != sysNative {
				ratio = fmt.Sprintf("%.2fx", r.median()/n.median())
			}
			fmt.Fprintf(&w, "| %s | %s | %s | %s | %s | %s | %s |\n", r.Case, r.System, num(r.median()), num(r.min()), num(r.max()), r.Unit, ratio)
		}
	}
	return os.WriteFile(path, []byte(w.String()), 0o644)
}

func num(v float64) string {
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.2f", v)
}

// fsType names the filesystem as the mount table does: statfs cannot tell
// ext4 from ext2 and ext3, which share one magic number.
func fsType(dir string) string {
	out, err := exec.Command("findmnt", "-n", "-o", "FSTYPE", "-T", dir).Output()
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(out))
}

// writeSVG draws the medians as bars: latencies on a log scale, and
// throughput and metadata times relative to native.
func (b *bench) writeSVG(path string) error {
	type bar struct {
		label string
		value float64
		text  string
	}
	var lat, rel []bar
	for _, r := range b.results {
		switch {
		case (r.Group == "create" || r.Group == "commit" || r.Group == "abort") && r.Unit == "µs":
			lat = append(lat, bar{r.Case + " — " + r.System, r.median(), num(r.median()) + " µs"})
		case r.Group == "read" || r.Group == "write" || r.Group == "metadata" || r.Group == "build":
			if n, ok := b.find(r.Case, sysNative); ok && r.System != sysNative {
				v := r.median() / n.median()
				if r.Unit == "MB/s" {
					v = n.median() / r.median() // time relative to native
				}
				rel = append(rel, bar{r.Case + " — " + r.System, v, fmt.Sprintf("%.2fx", v)})
			}
		}
	}
	const rowH, labelW, barW = 18, 560, 420
	h := (len(lat)+len(rel))*rowH + 120
	var w strings.Builder
	fmt.Fprintf(&w, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="11">`+"\n", labelW+barW+80, h)
	fmt.Fprintf(&w, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	y := 20
	section := func(title string, bars []bar, scale func(float64) float64, color string) {
		fmt.Fprintf(&w, `<text x="4" y="%d" font-size="13" font-weight="bold">%s</text>`+"\n", y, title)
		y += 10
		for _, br := range bars {
			bw := math.Max(1, scale(br.value)*barW)
			fmt.Fprintf(&w, `<text x="%d" y="%d" text-anchor="end">%s</text>`, labelW-6, y+12, escape(br.label))
			fmt.Fprintf(&w, `<rect x="%d" y="%d" width="%.1f" height="%d" fill="%s"/>`, labelW, y+2, bw, rowH-4, color)
			fmt.Fprintf(&w, `<text x="%.1f" y="%d">%s</text>`+"\n", float64(labelW)+bw+4, y+12, br.text)
			y += rowH
		}
		y += 30
	}
	section("Latency (µs, log scale: 1 µs to 1 s)", lat, func(v float64) float64 { return math.Max(0, math.Log10(math.Max(v, 1))/6) }, "#4477aa")
	section("Time relative to native ext4 (1.0 = native; bar ends at 4x)", rel, func(v float64) float64 { return math.Min(v, 4) / 4 }, "#cc6677")
	w.WriteString("</svg>\n")
	return os.WriteFile(path, []byte(w.String()), 0o644)
}

func escape(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(s)
}
