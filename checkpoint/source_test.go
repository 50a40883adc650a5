package checkpoint

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
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
	filled, err := src.fillPages(context.Background(), []wsPage{{7, 0x12000}})
	if err != nil {
		t.Fatal(err)
	}
	if filled != 3 || o.read != 3*pageSize {
		t.Fatalf("filled %d pages, read %d bytes; want 3 pages", filled, o.read)
	}
	got, err := os.ReadFile(filepath.Join(local, "pages-1.img"))
	if err != nil || len(got) != 8*pageSize {
		t.Fatalf("local pages file: %d bytes, %v", len(got), err)
	}
	for p := range 8 {
		want := byte(0)
		if p == 2 || p >= 6 {
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
