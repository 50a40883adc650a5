package checkpoint

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// The page server: ours, in Go, serving the pages of a checkpoint to
// CRIU's lazy-pages daemon (`criu lazy-pages --page-server --ps-socket
// FD`), which holds the restored processes' userfaultfds and copies in
// what we send. CRIU 3.17 offers two ways to plug into a lazy restore:
// the userfaultfds themselves (handed over a UNIX socket by the restorer
// to the daemon, which then also has to follow fork, remap and unmap
// events), or the page-server protocol the daemon speaks for post-copy
// migration. We speak the second: it is small and stable (one request
// and answer shape), and it leaves the userfaultfd bookkeeping to CRIU.
//
// The protocol (criu/page-xfer.c): every message starts with a 24-byte
// header, little-endian {cmd u32, nr_pages u32, vaddr u64, dst_id u64}.
// The daemon asks PS_IOV_GET for nr_pages at vaddr of process dst_id
// (its PID in the image); the server answers with the same header whose
// cmd is PS_IOV_ADD_F carrying PE_PRESENT in its upper 16 bits, then the
// pages. Answers go in the order of the requests. PS_IOV_CLOSE (or
// PS_IOV_FORCE_CLOSE) ends the session; the server answers a 32-bit 0.
const (
	psIOVAddF       = 6
	psIOVGet        = 7
	psIOVClose      = 0x1023
	psIOVForceClose = 0x1024
	psCmdBits       = 16
	psHeaderSize    = 24
)

// WorkingSetName is the file, in an image's directory, that lists the
// pages a clone faulted in on the first lazy restore of that image, in
// the order it faulted them: one "PID VADDR" line each (hex address).
const WorkingSetName = "workingset"

// A page of the working set.
type wsPage struct {
	pid   int
	vaddr uint64
}

// servePages answers the lazy-pages daemon on conn from the images in
// dir until it closes the session. It returns the pages the restored
// processes faulted in, in order: the daemon asks for a single page on a
// fault and for 16 pages or more when it copies the rest in the
// background (criu/uffd.c), so one-page requests are the faults (save
// the odd one-page remainder of a background copy).
func servePages(conn io.ReadWriter, dir string) ([]wsPage, int64, error) {
	return servePagesWith(conn, dir, openLocal)
}

// servePagesWith is servePages reading the pages through open.
func servePagesWith(conn io.ReadWriter, dir string, open pagesOpener) ([]wsPage, int64, error) {
	maps := map[int]*pagemap{}
	defer func() {
		for _, pm := range maps {
			pm.close()
		}
	}()
	var faults []wsPage
	var served int64
	r := bufio.NewReader(conn)
	hdr := make([]byte, psHeaderSize)
	var buf []byte
	for {
		if _, err := io.ReadFull(r, hdr); err != nil {
			if err == io.EOF {
				return faults, served, nil // the daemon went without closing
			}
			return faults, served, err
		}
		cmd := binary.LittleEndian.Uint32(hdr)
		nr := binary.LittleEndian.Uint32(hdr[4:])
		vaddr := binary.LittleEndian.Uint64(hdr[8:])
		pid := int(binary.LittleEndian.Uint64(hdr[16:]))
		switch cmd & (1<<psCmdBits - 1) {
		case psIOVClose, psIOVForceClose:
			_, err := conn.Write([]byte{0, 0, 0, 0})
			return faults, served, err
		case psIOVGet:
		default:
			return faults, served, fmt.Errorf("page server: unknown command %#x", cmd)
		}
		pm, ok := maps[pid]
		if !ok {
			var err error
			if pm, err = openPagemapWith(dir, pid, open); err != nil {
				return faults, served, fmt.Errorf("page server: process %d: %w", pid, err)
			}
			maps[pid] = pm
		}
		if nr == 0 || nr > 1<<20 {
			return faults, served, fmt.Errorf("page server: %d pages asked for", nr)
		}
		if nr == 1 {
			faults = append(faults, wsPage{pid, vaddr})
		}
		out := int(psHeaderSize + nr*pageSize)
		if cap(buf) < out {
			buf = make([]byte, out)
		}
		buf = buf[:out]
		binary.LittleEndian.PutUint32(buf, psIOVAddF|pePresent<<psCmdBits)
		copy(buf[4:], hdr[4:])
		if err := pm.readPages(vaddr, buf[psHeaderSize:]); err != nil {
			return faults, served, fmt.Errorf("page server: process %d: %w", pid, err)
		}
		if _, err := conn.Write(buf); err != nil {
			return faults, served, err
		}
		served += int64(nr)
	}
}

// formatWorkingSet is the working set file's content.
func formatWorkingSet(ws []wsPage) []byte {
	var b bytes.Buffer
	for _, p := range ws {
		fmt.Fprintf(&b, "%d %x\n", p.pid, p.vaddr)
	}
	return b.Bytes()
}

// readWorkingSet reads an image's working set; a missing file is an
// empty set.
func readWorkingSet(dir string) ([]wsPage, error) {
	data, err := os.ReadFile(filepath.Join(dir, WorkingSetName))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return parseWorkingSet(data)
}

// parseWorkingSet reads a working set file's content.
func parseWorkingSet(data []byte) ([]wsPage, error) {
	var ws []wsPage
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		pid, err1 := strconv.Atoi(f[0])
		vaddr, err2 := strconv.ParseUint(f[1], 16, 64)
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("%s: bad line %q", WorkingSetName, line)
		}
		ws = append(ws, wsPage{pid, vaddr})
	}
	return ws, nil
}

// prefetchImages makes, in dest, a view of image dir in which the pages
// of the working set ws are no longer lazy, so that `criu restore
// --lazy-pages` copies them in before the tree runs and only the rest
// comes through the page server. Every file is a symbolic link into dir
// except the pagemaps it rewrites. It returns how many pages it made
// eager.
func prefetchImages(dir, dest string, ws []wsPage) (int64, error) {
	want := map[int]map[uint64]bool{}
	for _, p := range ws {
		if want[p.pid] == nil {
			want[p.pid] = map[uint64]bool{}
		}
		want[p.pid][p.vaddr] = true
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0, err
	}
	for _, e := range ents {
		if err := os.Symlink(filepath.Join(dir, e.Name()), filepath.Join(dest, e.Name())); err != nil {
			return 0, err
		}
	}
	pids := make([]int, 0, len(want))
	for pid := range want {
		pids = append(pids, pid)
	}
	sort.Ints(pids)
	var eager int64
	for _, pid := range pids {
		id, entries, err := readPagemapFile(pagemapPath(dir, pid))
		if err != nil {
			return 0, err
		}
		var out []pmEntry
		for _, e := range entries {
			if e.flags&peLazy == 0 {
				out = append(out, e)
				continue
			}
			// Split the entry into runs of pages in and out of the set.
			for i := uint32(0); i < e.pages; {
				in := want[pid][e.vaddr+uint64(i)*pageSize]
				j := i + 1
				for j < e.pages && want[pid][e.vaddr+uint64(j)*pageSize] == in {
					j++
				}
				run := pmEntry{vaddr: e.vaddr + uint64(i)*pageSize, pages: j - i, flags: e.flags}
				if in {
					run.flags &^= peLazy
					eager += int64(run.pages)
				}
				out = append(out, run)
				i = j
			}
		}
		path := pagemapPath(dest, pid)
		if err := os.Remove(path); err != nil {
			return 0, err
		}
		if err := writePagemapFile(path, id, out); err != nil {
			return 0, err
		}
	}
	return eager, nil
}
