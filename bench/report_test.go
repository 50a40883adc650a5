package main

import "testing"

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
