package main

import (
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
)

// A cacheEvictor empties the CPUs' caches of whatever a timed step would
// find there, by writing to every cache line of a buffer twice the size of
// the largest cache, from one goroutine per CPU (each writes a share, so
// each core's own caches are emptied too).
//
// Commit and abort are timed right after their delta was written and
// synced. Writing 100 MB through the mount evicts the code and data that a
// commit runs on from the caches; writing 1 MB does not. Left to itself the
// table compared those cache states, not the work of the commit: a 1 MB
// commit after 400 MB of unrelated writes to memory took as long as a
// 100 MB one (docs/performance-history.md). Every timed step starts from
// emptied caches instead, whatever its size.
type cacheEvictor struct {
	buf []byte
}

// fallbackCacheBytes is the largest cache assumed when sysfs tells none.
const fallbackCacheBytes = 512 << 20

func newCacheEvictor() *cacheEvictor {
	n := largestCache("/sys/devices/system/cpu/cpu0/cache")
	if n <= 0 {
		n = fallbackCacheBytes
	}
	e := &cacheEvictor{buf: make([]byte, 2*n)}
	e.evict() // faults the buffer in, so that later passes only write
	return e
}

// evict writes one byte of every 64-byte line of the buffer.
func (e *cacheEvictor) evict() {
	cpus := runtime.NumCPU()
	share := (len(e.buf)/cpus + 63) &^ 63
	var wg sync.WaitGroup
	for off := 0; off < len(e.buf); off += share {
		part := e.buf[off:min(off+share, len(e.buf))]
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < len(part); i += 64 {
				part[i]++
			}
		}()
	}
	wg.Wait()
}

// largestCache is the size in bytes of the largest cache listed under dir
// (sysfs: index*/size, as "491520K"), or 0 if none can be read.
func largestCache(dir string) int {
	sizes, _ := filepath.Glob(filepath.Join(dir, "index*", "size"))
	largest := 0
	for _, p := range sizes {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		if n := parseCacheSize(strings.TrimSpace(string(b))); n > largest {
			largest = n
		}
	}
	return largest
}

// parseCacheSize reads a sysfs cache size: a number of bytes, or of KiB,
// MiB or GiB with the suffix K, M or G. It returns 0 for anything else.
func parseCacheSize(s string) int {
	unit := 1
	switch {
	case strings.HasSuffix(s, "K"):
		unit = 1 << 10
	case strings.HasSuffix(s, "M"):
		unit = 1 << 20
	case strings.HasSuffix(s, "G"):
		unit = 1 << 30
	}
	if unit != 1 {
		s = s[:len(s)-1]
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		return 0
	}
	return n * unit
}
