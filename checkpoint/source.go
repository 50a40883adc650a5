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
}

func (s *Source) open(dir, name string) (PagesFile, error) { return s.Pages(name) }

// fillPages writes into the pages files of dir what CRIU reads from them
// itself in a lazy restore: the pages of entries that are not lazy, and
// those of the working set ws, which the prefetch makes eager. It
// returns the pages it wrote.
func (s *Source) fillPages(ctx context.Context, ws []wsPage) (int64, error) {
	want := map[int]map[uint64]bool{}
	for _, p := range ws {
		if want[p.pid] == nil {
			want[p.pid] = map[uint64]bool{}
		}
		want[p.pid][p.vaddr] = true
	}
	maps, err := filepath.Glob(filepath.Join(s.Dir, "pagemap-*.img"))
	if err != nil {
		return 0, err
	}
	type piece struct {
		name     string
		dst      *os.File
		off, len int64
	}
	var pieces []piece
	var files []*os.File
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	const maxPiece = 1 << 20
	var filled int64
	for _, m := range maps {
		pid, err := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(filepath.Base(m), "pagemap-"), ".img"))
		if err != nil {
			continue
		}
		id, entries, err := readPagemapFile(m)
		if err != nil {
			return 0, err
		}
		name := pagesName(id)
		f, err := os.OpenFile(filepath.Join(s.Dir, name), os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			return 0, err
		}
		files = append(files, f)
		var size int64
		add := func(off, n int64) {
			for n > 0 {
				k := min(n, maxPiece)
				pieces = append(pieces, piece{name, f, off, k})
				off, n = off+k, n-k
			}
		}
		for _, e := range entries {
			if e.flags&pePresent == 0 {
				continue
			}
			size = max(size, e.off+int64(e.pages)*pageSize)
			if e.flags&peLazy == 0 {
				add(e.off, int64(e.pages)*pageSize)
				filled += int64(e.pages)
				continue
			}
			for i := int64(0); i < int64(e.pages); {
				if !want[pid][e.vaddr+uint64(i)*pageSize] {
					i++
					continue
				}
				j := i + 1
				for j < int64(e.pages) && want[pid][e.vaddr+uint64(j)*pageSize] {
					j++
				}
				add(e.off+i*pageSize, (j-i)*pageSize)
				filled += j - i
				i = j
			}
		}
		// Holes where the rest will be: CRIU reads none of it.
		if err := f.Truncate(size); err != nil {
			return 0, err
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
	for range max(1, min(4*s.Jobs, len(pieces))) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, maxPiece)
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
		return 0, err
	default:
	}
	return filled, ctx.Err()
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
