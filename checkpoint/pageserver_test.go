package checkpoint

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
)

// An image of process 7 with 6 pages at 0x10000, the pages at 0x12000
// and 0x13000 in the parent image, the others here; page p holds bytes
// of value p+1 (in whichever image holds it).
func writeTestImages(t *testing.T) string {
	t.Helper()
	top := t.TempDir()
	parent, child := filepath.Join(top, "1"), filepath.Join(top, "2")
	for _, d := range []string{parent, child} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	page := func(p int) []byte { return bytes.Repeat([]byte{byte(p + 1)}, pageSize) }
	const base = 0x10000
	// The parent: every page, one entry.
	if err := writePagemapFile(pagemapPath(parent, 7), 1, []pmEntry{{vaddr: base, pages: 6, flags: pePresent | peLazy}}); err != nil {
		t.Fatal(err)
	}
	var pp []byte
	for p := 0; p < 6; p++ {
		pp = append(pp, bytes.Repeat([]byte{0xee}, pageSize)...) // stale: the child has newer ones
	}
	copy(pp[2*pageSize:], page(2))
	copy(pp[3*pageSize:], page(3))
	if err := os.WriteFile(filepath.Join(parent, "pages-1.img"), pp, 0o600); err != nil {
		t.Fatal(err)
	}
	entries := []pmEntry{
		{vaddr: base, pages: 2, flags: pePresent | peLazy},
		{vaddr: base + 2*pageSize, pages: 2, flags: peParent | peLazy},
		{vaddr: base + 4*pageSize, pages: 2, flags: pePresent}, // not lazy (a stack, say)
	}
	if err := writePagemapFile(pagemapPath(child, 7), 3, entries); err != nil {
		t.Fatal(err)
	}
	cp := append(append(append(page(0), page(1)...), page(4)...), page(5)...)
	if err := os.WriteFile(filepath.Join(child, "pages-3.img"), cp, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../1", filepath.Join(child, "parent")); err != nil {
		t.Fatal(err)
	}
	return child
}

func request(t *testing.T, c io.ReadWriter, cmd, nr uint32, vaddr, pid uint64) {
	t.Helper()
	b := binary.LittleEndian.AppendUint32(nil, cmd)
	b = binary.LittleEndian.AppendUint32(b, nr)
	b = binary.LittleEndian.AppendUint64(b, vaddr)
	b = binary.LittleEndian.AppendUint64(b, pid)
	if _, err := c.Write(b); err != nil {
		t.Fatal(err)
	}
}

// The page server answers CRIU's requests from the images, parents
// included, and reports the one-page requests (faults) in order.
func TestPageServerServesAndRecords(t *testing.T) {
	dir := writeTestImages(t)
	ours, theirs := net.Pipe()
	type result struct {
		ws     []wsPage
		served int64
		err    error
	}
	res := make(chan result, 1)
	go func() {
		ws, n, err := servePages(ours, dir)
		res <- result{ws, n, err}
	}()
	for _, q := range []struct {
		nr    uint32
		vaddr uint64
	}{{1, 0x13000}, {1, 0x10000}, {4, 0x11000}} {
		request(t, theirs, psIOVGet, q.nr, q.vaddr, 7)
		hdr := make([]byte, psHeaderSize)
		if _, err := io.ReadFull(theirs, hdr); err != nil {
			t.Fatal(err)
		}
		if cmd := binary.LittleEndian.Uint32(hdr); cmd != psIOVAddF|pePresent<<psCmdBits {
			t.Fatalf("answer's cmd %#x", cmd)
		}
		if binary.LittleEndian.Uint32(hdr[4:]) != q.nr || binary.LittleEndian.Uint64(hdr[8:]) != q.vaddr || binary.LittleEndian.Uint64(hdr[16:]) != 7 {
			t.Fatalf("answer's header %x does not echo the request", hdr)
		}
		data := make([]byte, q.nr*pageSize)
		if _, err := io.ReadFull(theirs, data); err != nil {
			t.Fatal(err)
		}
		for i := uint32(0); i < q.nr; i++ {
			want := byte((q.vaddr-0x10000)/pageSize) + byte(i) + 1
			if got := data[i*pageSize]; got != want || data[(i+1)*pageSize-1] != want {
				t.Fatalf("page %#x: got %d, want %d", q.vaddr+uint64(i)*pageSize, got, want)
			}
		}
	}
	request(t, theirs, psIOVClose, 0, 0, 0)
	ack := make([]byte, 4)
	if _, err := io.ReadFull(theirs, ack); err != nil || binary.LittleEndian.Uint32(ack) != 0 {
		t.Fatalf("close: %x %v", ack, err)
	}
	r := <-res
	if r.err != nil || r.served != 6 {
		t.Fatalf("served %d pages: %v", r.served, r.err)
	}
	if len(r.ws) != 2 || r.ws[0] != (wsPage{7, 0x13000}) || r.ws[1] != (wsPage{7, 0x10000}) {
		t.Fatalf("working set %v", r.ws)
	}
	// A page no image holds ends the session with an error.
	ours, theirs = net.Pipe()
	go func() {
		_, _, err := servePages(ours, dir)
		ours.Close()
		res <- result{err: err}
	}()
	request(t, theirs, psIOVGet, 1, 0x90000, 7)
	io.Copy(io.Discard, theirs)
	if r := <-res; r.err == nil {
		t.Fatal("a page outside the image was served")
	}
}

// The prefetch view makes the working set's pages eager and keeps every
// other page, and the pages file's order, as they were.
func TestPrefetchMakesTheWorkingSetEager(t *testing.T) {
	dir := writeTestImages(t)
	ws := []wsPage{{7, 0x13000}, {7, 0x10000}, {7, 0x14000}}
	formatted := formatWorkingSet(ws)
	if err := os.WriteFile(filepath.Join(dir, WorkingSetName), formatted, 0o600); err != nil {
		t.Fatal(err)
	}
	back, err := readWorkingSet(dir)
	if err != nil || len(back) != 3 || back[0] != ws[0] {
		t.Fatalf("working set read back as %v: %v", back, err)
	}
	dest := t.TempDir()
	eager, err := prefetchImages(dir, dest, back)
	if err != nil {
		t.Fatal(err)
	}
	if eager != 2 { // 0x14000 was not lazy to begin with
		t.Fatalf("%d pages made eager", eager)
	}
	_, entries, err := readPagemapFile(pagemapPath(dest, 7))
	if err != nil {
		t.Fatal(err)
	}
	want := []pmEntry{
		{vaddr: 0x10000, pages: 1, flags: pePresent, off: 0},
		{vaddr: 0x11000, pages: 1, flags: pePresent | peLazy, off: pageSize},
		{vaddr: 0x12000, pages: 1, flags: peParent | peLazy},
		{vaddr: 0x13000, pages: 1, flags: peParent},
		{vaddr: 0x14000, pages: 2, flags: pePresent, off: 2 * pageSize},
	}
	if len(entries) != len(want) {
		t.Fatalf("entries %+v", entries)
	}
	for i := range want {
		if entries[i] != want[i] {
			t.Fatalf("entry %d: %+v, want %+v", i, entries[i], want[i])
		}
	}
	// The rest of the image is the original's, the parent too.
	pm, err := openPagemap(dest, 7)
	if err != nil {
		t.Fatal(err)
	}
	defer pm.close()
	buf := make([]byte, pageSize)
	if err := pm.readPages(0x12000, buf); err != nil || buf[0] != 3 {
		t.Fatalf("page 0x12000 through the view: %d %v", buf[0], err)
	}
}
