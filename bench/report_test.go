package main

import (
	"fmt"
	"strings"
	"testing"
)

// The interval's ranks are the binomial ones: for 60 rounds, the 22nd
// lowest and 22nd highest of the per-round ratios (97.3% coverage); for 15,
// the 4th (96.5%); for 7 rounds, no narrower than the extremes (98.4%).
func TestRoundRatioRanks(t *testing.T) {
	for _, c := range []struct{ n, rank int }{{7, 1}, {15, 4}, {60, 22}, {61, 23}} {
		r := result{Samples: make([]float64, c.n)}
		other := result{Samples: make([]float64, c.n)}
		for i := range c.n {
			r.Samples[i] = float64(i + 1) // ratios 1, 2, ..., n
			other.Samples[i] = 1
		}
		median, lo, hi := roundRatio(r, other)
		if lo != float64(c.rank) || hi != float64(c.n+1-c.rank) {
			t.Errorf("%d rounds: interval %v–%v, want %d–%d", c.n, lo, hi, c.rank, c.n+1-c.rank)
		}
		if want := float64(c.n+1) / 2; median != want {
			t.Errorf("%d rounds: median %v, want %v", c.n, median, want)
		}
	}
}

// Flatness looks at every size: a dear size in the middle fails the
// target even when the smallest and the largest agree.
func TestFlatAtEverySize(t *testing.T) {
	create := func(us ...float64) *bench {
		b := &bench{}
		for i, v := range us {
			b.results = append(b.results, result{Group: "create", Case: fmt.Sprintf("create, base of %d files", i),
				System: "branchfs ioctl", Samples: []float64{v}})
		}
		return b
	}
	for _, c := range []struct {
		us []float64
		ok bool
	}{{[]float64{20, 22, 21, 20}, true}, {[]float64{20, 95, 21, 20}, false}, {[]float64{20, 57, 21, 20}, true}, {[]float64{20, 120, 21, 20}, false}} {
		ts := create(c.us...).targets()
		if len(ts) != 1 || ts[0].ok != c.ok {
			t.Errorf("creates %v: targets %+v, want one with ok=%v", c.us, ts, c.ok)
		}
	}
	b := &bench{}
	for _, c := range []struct {
		cas string
		us  float64
	}{{"commit of 1 KB", 180}, {"commit of 1 MB", 190}, {"commit of 100 KB", 400}, {"commit of 100 MB", 200}, {"commit of 1000 files of 1 KB", 37000}} {
		b.results = append(b.results, result{Group: "commit", Case: c.cas, System: "branchfs ioctl", Samples: []float64{c.us}})
	}
	found := false
	for _, tg := range b.targets() {
		if strings.HasPrefix(tg.goal, "commit ≤ 0.5 ms at every file size") {
			found = true
			if tg.ok {
				t.Errorf("a 400 µs commit of 100 KB between 180 µs ones passed: %+v", tg)
			}
		}
	}
	if !found {
		t.Error("no commit flatness target")
	}
}
