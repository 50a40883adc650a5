package remote

import (
	"context"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"
)

// progress draws a bar of bytes done on a terminal, redrawn in place five
// times a second; with no writer it only counts.
type progress struct {
	w     io.Writer
	label string
	total atomic.Int64
	done  atomic.Int64
	start time.Time
	stop  chan struct{}
	wg    sync.WaitGroup
}

func newProgress(w io.Writer, label string) *progress {
	p := &progress{w: w, label: label, start: time.Now(), stop: make(chan struct{})}
	if w != nil {
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			t := time.NewTicker(200 * time.Millisecond)
			defer t.Stop()
			for {
				select {
				case <-p.stop:
					return
				case <-t.C:
					p.draw()
				}
			}
		}()
	}
	return p
}

func (p *progress) add(n int64) { p.done.Add(n) }

func (p *progress) draw() {
	done, total := p.done.Load(), p.total.Load()
	pct := 100
	if total > 0 {
		pct = int(min(100, done*100/total))
	}
	const width = 30
	bar := make([]byte, width)
	for i := range bar {
		bar[i] = ' '
		if i < pct*width/100 {
			bar[i] = '='
		}
	}
	rate := float64(done) / max(time.Since(p.start).Seconds(), 1e-3)
	fmt.Fprintf(p.w, "\r%s [%s] %3d%% %s/%s %s/s\x1b[K", p.label, bar, pct, bytesOf(done), bytesOf(total), bytesOf(int64(rate)))
}

// end stops the bar and clears its line.
func (p *progress) end() {
	if p.w == nil {
		return
	}
	close(p.stop)
	p.wg.Wait()
	fmt.Fprint(p.w, "\r\x1b[K")
}

// bytesOf prints n bytes in binary units.
func bytesOf(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	v, u := float64(n)/unit, 0
	for v >= unit && u < 4 {
		v /= unit
		u++
	}
	return fmt.Sprintf("%.1f %ciB", v, "KMGTP"[u])
}

// BytesOf prints n bytes in binary units, as the summaries do.
func BytesOf(n int64) string { return bytesOf(n) }

// parallel calls fn(i) for every i below n from jobs goroutines, and
// returns the first error, after which no new call starts.
func parallel(ctx context.Context, n, jobs int, fn func(ctx context.Context, i int) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(jobs, n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := fn(ctx, i); err != nil {
					cancel(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	return context.Cause(ctx)
}
