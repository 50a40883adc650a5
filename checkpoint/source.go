package checkpoint

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Source is a checkpoint image kept elsewhere than in the branch's store
// (an object store: package remote), for RestoreOptions.From. Dir holds
// its files; where Pages is set, its pages files there may hold only
// what the restore fills in (fillPages), and the rest is read through
// Pages when a lazy clone faults it in, by a page server in Restore's
// process shared by every clone, so that a page is fetched once for all.
type Source struct {
	Meta ImageMeta
	Dir  string
	// Pages opens a pages file (pages-ID.img) of the image for the page
	// server; nil: Dir's are whole. Fill opens one for fillPages, which
	// reads exactly the pages it needs (a working set is spread over the
	// whole memory: the neighbours of one page are seldom wanted, as a
	// fault's are); nil: Pages.
	Pages, Fill func(name string) (PagesFile, error)
	// WorkingSet is a recorded working set to prefetch (WorkingSetName's
	// format), if any, and WorkingSetFrom where it was found; else Dir's
	// own, if any.
	WorkingSet     []byte
	WorkingSetFrom string
	// SaveWorkingSet keeps the working set the first lazy restore
	// records, where the next one finds it.
	SaveWorkingSet func([]byte) error
	// Jobs is how many reads fillPages keeps in flight.
	Jobs int
	// Requests, if set, counts the requests made to where the image is
	// kept so far (for Outcome.Requests).
	Requests func() int64
}

func (s *Source) open(dir, name string) (PagesFile, error) { return s.Pages(name) }

// What fillPages reads at a time. Reads far apart each cost a request,
// whose price is mostly fixed (a round trip; under TCG, the guest's CPU
// for HTTP and signing: about 18 ms, while 64 KiB come through in about
// as long); the pages between two wanted ones are read for nothing. So two
// wanted spans of a pages file at most readGap apart are read as one, of
// at most readLimit bytes (the buffer of each read in flight).
const (
	readGap   = 64 << 10
	readLimit = 1 << 20
)

// span is len bytes at off of a pages file.
type span struct{ off, len int64 }

func (s span) end() int64 { return s.off + s.len }

// coalesce returns the reads that cover spans: sorted, the overlapping and
// touching ones joined, those longer than limit cut into reads of limit
// bytes, and any two at most gap apart joined while the read stays within
// limit. What is read for nothing is at most gap for each read saved.
func coalesce(spans []span, gap, limit int64) []span {
	in := make([]span, 0, len(spans))
	for _, s := range spans {
		if s.len > 0 {
			in = append(in, s)
		}
	}
	sort.Slice(in, func(i, j int) bool { return in[i].off < in[j].off })
	// Maximal runs of wanted bytes.
	var runs []span
	for _, s := range in {
		if n := len(runs); n > 0 && s.off <= runs[n-1].end() {
			runs[n-1].len = max(runs[n-1].end(), s.end()) - runs[n-1].off
			continue
		}
		runs = append(runs, s)
	}
	var out []span
	for _, r := range runs {
		for r.len > 0 {
			piece := span{r.off, min(r.len, limit)}
			r = span{piece.end(), r.len - piece.len}
			if n := len(out); n > 0 && piece.off-out[n-1].end() <= gap && piece.end()-out[n-1].off <= limit {
				out[n-1].len = piece.end() - out[n-1].off
				continue
			}
			out = append(out, piece)
		}
	}
	return out
}

// Fill says what fillPages did: the pages it wrote that CRIU reads
// itself, the reads it made for them (coalesced), the bytes those read,
// and how long it took.
type Fill struct {
	Pages int64   `json:"pages"`
	Reads int64   `json:"reads"`
	Bytes int64   `json:"bytes"`
	MS    float64 `json:"ms"`
}

// fillPages writes into the pages files of dir what CRIU reads from them
// itself in a lazy restore: the pages of entries that are not lazy, and
// those of the working set ws, which the prefetch makes eager. Its reads,
// coalesced, all go out at once, s.Jobs at a time, before the restore
// starts: none waits behind a fault.
func (s *Source) fillPages(ctx context.Context, ws []wsPage) (st Fill, err error) {
	defer func(start time.Time) { st.MS = ms(time.Since(start)) }(time.Now())
	want := map[int]map[uint64]bool{}
	for _, p := range ws {
		if want[p.pid] == nil {
			want[p.pid] = map[uint64]bool{}
		}
		want[p.pid][p.vaddr] = true
	}
	maps, err := filepath.Glob(filepath.Join(s.Dir, "pagemap-*.img"))
	if err != nil {
		return st, err
	}
	type piece struct {
		name string
		dst  *os.File
		span
	}
	var pieces []piece
	var files []*os.File
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	for _, m := range maps {
		pid, err := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(filepath.Base(m), "pagemap-"), ".img"))
		if err != nil {
			continue
		}
		id, entries, err := readPagemapFile(m)
		if err != nil {
			return st, err
		}
		name := pagesName(id)
		f, err := os.OpenFile(filepath.Join(s.Dir, name), os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			return st, err
		}
		files = append(files, f)
		var size int64
		var spans []span
		for _, e := range entries {
			if e.flags&pePresent == 0 {
				continue
			}
			size = max(size, e.off+int64(e.pages)*pageSize)
			if e.flags&peLazy == 0 {
				spans = append(spans, span{e.off, int64(e.pages) * pageSize})
				st.Pages += int64(e.pages)
				continue
			}
			for i := int64(0); i < int64(e.pages); i++ {
				if want[pid][e.vaddr+uint64(i)*pageSize] {
					spans = append(spans, span{e.off + i*pageSize, pageSize})
					st.Pages++
				}
			}
		}
		for _, sp := range coalesce(spans, readGap, readLimit) {
			pieces = append(pieces, piece{name, f, sp})
		}
		// Holes where the rest will be: CRIU reads none of it.
		if err := f.Truncate(size); err != nil {
			return st, err
		}
	}
	// Large pieces first, so that none trails alone.
	sort.SliceStable(pieces, func(i, j int) bool { return pieces[i].len > pieces[j].len })
	readers := map[string]PagesFile{}
	var mu sync.Mutex
	defer func() {
		for _, r := range readers {
			r.Close()
		}
	}()
	reader := func(name string) (PagesFile, error) {
		mu.Lock()
		defer mu.Unlock()
		if r, ok := readers[name]; ok {
			return r, nil
		}
		open := s.Fill
		if open == nil {
			open = s.Pages
		}
		r, err := open(name)
		if err == nil {
			readers[name] = r
		}
		return r, err
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 1)
	// Each piece is a request of its own: more of them in flight than
	// the transfers of whole files take.
	var largest int64
	if len(pieces) > 0 {
		largest = pieces[0].len
	}
	for range max(1, min(4*s.Jobs, len(pieces))) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, largest)
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= len(pieces) {
					return
				}
				p := pieces[i]
				r, err := reader(p.name)
				if err == nil {
					_, err = r.ReadAt(buf[:p.len], p.off)
				}
				if err == nil {
					_, err = p.dst.WriteAt(buf[:p.len], p.off)
				}
				if err != nil {
					select {
					case errs <- fmt.Errorf("%s at %d: %w", p.name, p.off, err):
					default:
					}
					return
				}
			}
		}()
	}
	wg.Wait()
	select {
	case err := <-errs:
		return st, err
	default:
	}
	st.Reads = int64(len(pieces))
	for _, p := range pieces {
		st.Bytes += p.len
	}
	return st, ctx.Err()
}

// pageServers serves the pages of a Source to the lazy clones of one
// restore, one session each, and saves the first working set recorded.
type pageServers struct {
	src    *Source
	record bool
	wg     sync.WaitGroup
	mu     sync.Mutex
	lns    []net.Listener
	saved  bool
}

// listen makes the socket a clone's lazy-pages daemon connects to, in the
// clone's data directory (root's, 0700), and serves its one session.
func (ps *pageServers) listen(data string) (string, error) {
	sock := filepath.Join(data, "pages.sock")
	os.Remove(sock)
	short, done, err := socketPath(sock)
	if err != nil {
		return "", err
	}
	ln, err := net.Listen("unix", short)
	done()
	if err != nil {
		return "", err
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false) // its directory goes with the clone's branch
	ps.mu.Lock()
	ps.lns = append(ps.lns, ln)
	ps.mu.Unlock()
	ps.wg.Add(1)
	go func() {
		defer ps.wg.Done()
		conn, err := ln.Accept()
		ln.Close()
		if err != nil {
			return // the clone never came to it
		}
		defer conn.Close()
		ws, pages, err := servePagesWith(conn, ps.src.Dir, ps.src.open)
		log := fmt.Sprintf("served %d pages, %d of them faulted in\n", pages, len(ws))
		if err == nil && ps.record && len(ws) > 0 && ps.src.SaveWorkingSet != nil {
			ps.mu.Lock()
			first := !ps.saved
			ps.saved = true
			ps.mu.Unlock()
			if first {
				err = ps.src.SaveWorkingSet(formatWorkingSet(ws))
			}
		}
		if err != nil {
			log = err.Error() + "\n"
		}
		os.WriteFile(filepath.Join(data, "page-server.log"), []byte(log), 0o600)
	}()
	return sock, nil
}

// close ends the sessions no clone came to and waits for the others.
func (ps *pageServers) close() {
	ps.mu.Lock()
	for _, ln := range ps.lns {
		ln.Close()
	}
	ps.mu.Unlock()
	ps.wg.Wait()
}

// socketPath is a path to the socket at p that fits a socket address
// (108 bytes): p, or one through a descriptor of its directory, which
// the returned function closes.
func socketPath(p string) (string, func(), error) {
	if len(p) < 100 {
		return p, func() {}, nil
	}
	d, err := os.Open(filepath.Dir(p))
	if err != nil {
		return "", nil, err
	}
	return fmt.Sprintf("/proc/self/fd/%d/%s", d.Fd(), filepath.Base(p)), func() { d.Close() }, nil
}
