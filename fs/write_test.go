package fs_test

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Write-only handles write past the mount's page cache (FOPEN_DIRECT_IO):
// what they write is not cached twice, and handles that read through the
// cache see it at once.
func TestWriteOnlyHandles(t *testing.T) {
	// Without passthrough, reads go through the mount's page cache.
	m := newMount(t, "off")
	b := m.create("b")
	page := os.Getpagesize()

	// A new file written through a write-only handle: none of its pages
	// are in the mount's page cache afterwards.
	p := filepath.Join(b, "new")
	data := bytes.Repeat([]byte("0123456789abcdef"), 16*page/16)
	must(t, os.WriteFile(p, data, 0o644))
	r, err := os.Open(p)
	must(t, err)
	defer r.Close()
	mem, err := unix.Mmap(int(r.Fd()), 0, len(data), unix.PROT_READ, unix.MAP_SHARED)
	must(t, err)
	defer unix.Munmap(mem)
	resident := make([]byte, len(data)/page)
	if _, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&mem[0])), uintptr(len(mem)),
		uintptr(unsafe.Pointer(&resident[0]))); errno != 0 {
		t.Fatal(errno)
	}
	for i, v := range resident {
		if v&1 != 0 {
			t.Fatalf("page %d of a file written through a write-only handle is in the mount's page cache", i)
		}
	}

	// Cached pages of a reader: a write-only handle's writes replace
	// them, and reach past the end.
	if !bytes.Equal(mem, data) { // faults the pages in
		t.Fatal("the mapping does not show the file")
	}
	got := make([]byte, len(data))
	if _, err := r.ReadAt(got, 0); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read %v", err)
	}
	w, err := os.OpenFile(p, os.O_WRONLY, 0)
	must(t, err)
	defer w.Close()
	patch := bytes.Repeat([]byte("w"), 100)
	_, err = w.WriteAt(patch, int64(page)+10)
	must(t, err)
	_, err = w.WriteAt(patch, int64(len(data)))
	must(t, err)
	want := append(append([]byte{}, data...), patch...)
	copy(want[page+10:], patch)
	if !bytes.Equal(mem, want[:len(data)]) {
		t.Error("the reader's mapping does not show the write")
	}
	got = make([]byte, len(want)+1)
	if n, _ := r.ReadAt(got, 0); !bytes.Equal(got[:n], want) {
		t.Errorf("the reader read %d bytes, not the %d written", n, len(want))
	}
	fi, err := r.Stat()
	must(t, err)
	if fi.Size() != int64(len(want)) {
		t.Errorf("size through the reader %d, want %d", fi.Size(), len(want))
	}
}
