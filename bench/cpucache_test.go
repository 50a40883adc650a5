package main

import (
	"os"
	"path/filepath"
	"testing"
)

func TestParseCacheSize(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int
	}{{"48K", 48 << 10}, {"491520K", 480 << 20}, {"2M", 2 << 20}, {"1G", 1 << 30}, {"4096", 4096},
		{"", 0}, {"K", 0}, {"12X", 0}, {"-1K", 0}} {
		if got := parseCacheSize(c.in); got != c.want {
			t.Errorf("parseCacheSize(%q) = %d, want %d", c.in, got, c.want)
		}
	}
}

// The evictor must outsize the largest cache, not the first or last listed.
func TestLargestCache(t *testing.T) {
	dir := t.TempDir()
	for name, size := range map[string]string{"index0": "48K\n", "index1": "64K\n", "index2": "2048K\n", "index3": "491520K\n", "index4": "1024K\n"} {
		if err := os.MkdirAll(filepath.Join(dir, name), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name, "size"), []byte(size), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if got := largestCache(dir); got != 480<<20 {
		t.Errorf("largestCache = %d, want %d", got, 480<<20)
	}
	if got := largestCache(t.TempDir()); got != 0 {
		t.Errorf("largestCache of an empty directory = %d, want 0", got)
	}
}

// Every line of the buffer is written, from every CPU's share.
func TestCacheEvictorWritesEveryLine(t *testing.T) {
	e := &cacheEvictor{buf: make([]byte, 1<<20+3*64)}
	e.evict()
	for i := 0; i < len(e.buf); i += 64 {
		if e.buf[i] != 1 {
			t.Fatalf("line at %d written %d times, want 1", i, e.buf[i])
		}
	}
}
