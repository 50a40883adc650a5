package checkpoint

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// A one-image checkpoint of process 7: 8 pages at 0x10000, the first 6
// lazy, the last 2 not (a stack, say); page p holds bytes of value p+1.
func writeFlatImage(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	entries := []pmEntry{
		{vaddr: 0x10000, pages: 6, flags: pePresent | peLazy},
		{vaddr: 0x16000, pages: 2, flags: pePresent},
	}
	if err := writePagemapFile(pagemapPath(dir, 7), 1, entries); err != nil {
		t.Fatal(err)
	}
	var pages []byte
	for p := range 8 {
		pages = append(pages, bytes.Repeat([]byte{byte(p + 1)}, pageSize)...)
	}
	if err := os.WriteFile(filepath.Join(dir, "pages-1.img"), pages, 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}

// countingOpener opens pages files of dir, as a Source's Pages would open
// them in a bucket, and counts the bytes read.
type countingOpener struct {
	dir  string
	mu   sync.Mutex
	read int64
}

type countingFile struct {
	*os.File
	o *countingOpener
}

func (f countingFile) ReadAt(p []byte, off int64) (int, error) {
	f.o.mu.Lock()
	f.o.read += int64(len(p))
	f.o.mu.Unlock()
	return f.File.ReadAt(p, off)
}

func (o *countingOpener) open(name string) (PagesFile, error) {
	f, err := os.Open(filepath.Join(o.dir, name))
	return countingFile{f, o}, err
}

// A restore from an image kept elsewhere fills in what CRIU reads itself
// (pages that are not lazy, and the working set's) and leaves the rest as
// holes, for the page server; the page server reads those from the
// source, and the first working set recorded is saved, once.
func TestSourceFillsThenServes(t *testing.T) {
	remote := writeFlatImage(t)
	local := t.TempDir()
	data, err := os.ReadFile(pagemapPath(remote, 7))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(pagemapPath(local, 7), data, 0o600); err != nil {
		t.Fatal(err)
	}
	o := &countingOpener{dir: remote}
	var saved [][]byte
	src := &Source{Dir: local, Pages: o.open, Jobs: 3, SaveWorkingSet: func(b []byte) error {
		saved = append(saved, b)
		return nil
	}}
	// Page 2 and pages 6-7 are wanted; 3 pages apart, they are read in
	// one request, the 3 between them for nothing.
	fill, err := src.fillPages(context.Background(), []wsPage{{7, 0x12000}})
	if err != nil {
		t.Fatal(err)
	}
	if want := (Fill{Pages: 3, Reads: 1, Bytes: 6 * pageSize, MS: fill.MS}); fill != want || o.read != fill.Bytes {
		t.Fatalf("filled %+v, read %d bytes; want %+v", fill, o.read, want)
	}
	got, err := os.ReadFile(filepath.Join(local, "pages-1.img"))
	if err != nil || len(got) != 8*pageSize {
		t.Fatalf("local pages file: %d bytes, %v", len(got), err)
	}
	for p := range 8 {
		want := byte(0)
		if p >= 2 {
			want = byte(p + 1)
		}
		if got[p*pageSize] != want || got[(p+1)*pageSize-1] != want {
			t.Errorf("page %d of the local file holds %d, want %d", p, got[p*pageSize], want)
		}
	}

	ps := &pageServers{src: src, record: true}
	var socks []string
	// The second's path is too long for a socket address.
	for _, name := range []string{"clone", strings.Repeat("long", 30)} {
		data := filepath.Join(t.TempDir(), name)
		if err := os.Mkdir(data, 0o700); err != nil {
			t.Fatal(err)
		}
		sock, err := ps.listen(data)
		if err != nil {
			t.Fatal(err)
		}
		socks = append(socks, sock)
	}
	for _, sock := range socks {
		short, done, err := socketPath(sock)
		if err != nil {
			t.Fatal(err)
		}
		c, err := net.Dial("unix", short)
		done()
		if err != nil {
			t.Fatal(err)
		}
		request(t, c, psIOVGet, 1, 0x11000, 7)
		hdr := make([]byte, psHeaderSize)
		page := make([]byte, pageSize)
		if _, err := io.ReadFull(c, hdr); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(c, page); err != nil || page[0] != 2 {
			t.Fatalf("page 0x11000 served as %d: %v", page[0], err)
		}
		request(t, c, psIOVClose, 0, 0, 0)
		ack := make([]byte, 4)
		if _, err := io.ReadFull(c, ack); err != nil || binary.LittleEndian.Uint32(ack) != 0 {
			t.Fatalf("close: %x %v", ack, err)
		}
		c.Close()
	}
	ps.close()
	if len(saved) != 1 || string(saved[0]) != "7 11000\n" {
		t.Fatalf("working sets saved: %q", saved)
	}
}

// The reads of a working set: wanted spans of a pages file joined where
// they touch or lie at most gap apart, no read longer than limit.
func TestCoalesce(t *testing.T) {
	const gap, limit = 4, 16
	for _, c := range []struct {
		name string
		in   []span
		want []span
	}{
		{"none", nil, nil},
		{"empty spans dropped", []span{{5, 0}, {9, 0}}, nil},
		{"one", []span{{8, 2}}, []span{{8, 2}}},
		{"unsorted, touching", []span{{4, 2}, {0, 2}, {2, 2}}, []span{{0, 6}}},
		{"overlapping, one inside another", []span{{0, 10}, {2, 3}, {8, 4}}, []span{{0, 12}}},
		{"gap of exactly gap joined", []span{{0, 2}, {6, 2}}, []span{{0, 8}}},
		{"gap of gap+1 apart", []span{{0, 2}, {7, 2}}, []span{{0, 2}, {7, 2}}},
		{"chain of near ones", []span{{0, 1}, {4, 1}, {8, 1}, {12, 1}}, []span{{0, 13}}},
		{"chain cut at limit", []span{{0, 1}, {4, 1}, {8, 1}, {12, 1}, {15, 1}, {19, 1}}, []span{{0, 16}, {19, 1}}},
		{"long run cut into reads of limit", []span{{0, 40}}, []span{{0, 16}, {16, 16}, {32, 8}}},
		{"a long run's tail joins a near one", []span{{0, 20}, {22, 2}}, []span{{0, 16}, {16, 8}}},
		{"far apart: the worst case", []span{{0, 1}, {100, 1}, {200, 1}}, []span{{0, 1}, {100, 1}, {200, 1}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			in := append([]span(nil), c.in...)
			got := coalesce(c.in, gap, limit)
			if !slices.Equal(got, c.want) {
				t.Fatalf("coalesce(%v) = %v, want %v", c.in, got, c.want)
			}
			if !slices.Equal(in, c.in) {
				t.Fatalf("coalesce changed its input: %v", c.in)
			}
			// Every wanted byte read, no read past limit, no more
			// read for nothing than gap per read saved.
			var wanted, read int64
			for _, r := range got {
				if r.len > limit {
					t.Errorf("read %v is longer than %d", r, limit)
				}
				read += r.len
			}
			for _, r := range coalesce(c.in, 0, 1<<62) {
				wanted += r.len
				for b := r.off; b < r.end(); b++ {
					if !slices.ContainsFunc(got, func(g span) bool { return g.off <= b && b < g.end() }) {
						t.Fatalf("byte %d is wanted and not read", b)
					}
				}
			}
			// Without joining near ones: a read per run, or per limit.
			cut := len(coalesce(c.in, 0, limit))
			if saved := cut - len(got); read-wanted > int64(max(saved, 0))*gap {
				t.Errorf("read %d bytes for nothing, saving %d reads", read-wanted, saved)
			}
		})
	}
}

// synthPages is a pages file of any size that holds nothing on disk: byte
// i reads as byte(i/pageSize). Each read waits for gate, if set, and
// counts the reads in progress.
type synthPages struct {
	mu            sync.Mutex
	reads, inside int
	most          int
	gate          func(inside int)
}

func (s *synthPages) ReadAt(p []byte, off int64) (int, error) {
	s.mu.Lock()
	s.reads++
	s.inside++
	s.most = max(s.most, s.inside)
	in := s.inside
	s.mu.Unlock()
	if s.gate != nil {
		s.gate(in)
	}
	for i := range p {
		p[i] = byte((off + int64(i)) / pageSize)
	}
	s.mu.Lock()
	s.inside--
	s.mu.Unlock()
	return len(p), nil
}

func (s *synthPages) Close() error { return nil }

// fixedImage writes into a directory the pagemap of process 7 with one
// lazy entry of mib MiB at 0x10000000 and returns it and the working set
// of n pages spread evenly over it (the bench's "fixed" subject).
func fixedImage(t *testing.T, mib, n int) (string, []wsPage) {
	t.Helper()
	dir := t.TempDir()
	pages := mib << 20 / pageSize
	if err := writePagemapFile(pagemapPath(dir, 7), 1, []pmEntry{
		{vaddr: 0x10000000, pages: uint32(pages), flags: pePresent | peLazy},
	}); err != nil {
		t.Fatal(err)
	}
	var ws []wsPage
	for p := 0; p < pages; p += pages / n {
		ws = append(ws, wsPage{7, 0x10000000 + uint64(p)*pageSize})
	}
	return dir, ws
}

// A working set of fixed size spread over the whole memory costs one read
// a page whatever the memory's size (nothing near to join), the same
// number of pages in clusters one read a cluster; every page lands where
// CRIU reads it.
func TestFillReadsPerWorkingSet(t *testing.T) {
	for _, c := range []struct {
		mib, pages, cluster int
		reads               int64
	}{
		{64, 256, 1, 256},
		{256, 256, 1, 256},
		{1024, 256, 1, 256},
		{1024, 256, 16, 16}, // 16 runs of 16 pages
		{64, 4096, 1, 64},   // every 4th page: all of it read, 1 MiB a read
	} {
		t.Run(fmt.Sprintf("%dMiB_%dpages_in_runs_of_%d", c.mib, c.pages, c.cluster), func(t *testing.T) {
			dir, spread := fixedImage(t, c.mib, c.pages/c.cluster)
			var ws []wsPage
			for _, p := range spread {
				for i := range c.cluster {
					ws = append(ws, wsPage{p.pid, p.vaddr + uint64(i)*pageSize})
				}
			}
			sp := &synthPages{}
			src := &Source{Dir: dir, Jobs: 8, Pages: func(string) (PagesFile, error) { return sp, nil }}
			fill, err := src.fillPages(context.Background(), ws)
			if err != nil {
				t.Fatal(err)
			}
			if fill.Pages != int64(c.pages) || fill.Reads != c.reads || int64(sp.reads) != c.reads {
				t.Fatalf("filled %+v in %d reads; want %d pages in %d reads", fill, sp.reads, c.pages, c.reads)
			}
			f, err := os.Open(filepath.Join(dir, "pages-1.img"))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			b := make([]byte, 1)
			for _, p := range ws {
				off := int64(p.vaddr-0x10000000) + pageSize - 1
				if _, err := f.ReadAt(b, off); err != nil || b[0] != byte(off/pageSize) {
					t.Fatalf("page at %#x: %v %v", p.vaddr, b, err)
				}
			}
		})
	}
}

// The working set's reads all go out at once, as many as fillPages keeps
// in flight, before the restore: none waits for another (nor for a
// fault, which only the restore after it can make).
func TestFillReadsInParallel(t *testing.T) {
	dir, ws := fixedImage(t, 64, 256)
	const jobs = 4
	all := make(chan struct{})
	var once sync.Once
	sp := &synthPages{}
	sp.gate = func(inside int) {
		if inside == 4*jobs {
			once.Do(func() { close(all) })
		}
		select {
		case <-all:
		case <-time.After(time.Minute):
			// Reads one after another never get there.
		}
	}
	src := &Source{Dir: dir, Jobs: jobs, Pages: func(string) (PagesFile, error) { return sp, nil }}
	if _, err := src.fillPages(context.Background(), ws); err != nil {
		t.Fatal(err)
	}
	if sp.most != 4*jobs {
		t.Fatalf("at most %d reads in flight, want %d", sp.most, 4*jobs)
	}
}
