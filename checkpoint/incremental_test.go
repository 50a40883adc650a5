package checkpoint

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// The anon-pagemap tier keeps only the pages that differ from the
// previous image, and the image it leaves reads back as the full one.
func TestDedupeKeepsOnlyChangedPages(t *testing.T) {
	top := t.TempDir()
	prev, next := filepath.Join(top, "1"), filepath.Join(top, "2")
	for _, d := range []string{prev, next} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	fill := func(vals ...byte) []byte {
		var b []byte
		for _, v := range vals {
			b = append(b, bytes.Repeat([]byte{v}, pageSize)...)
		}
		return b
	}
	if err := writePagemapFile(pagemapPath(prev, 7), 1, []pmEntry{{vaddr: 0x10000, pages: 4, flags: pePresent | peLazy}}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(prev, "pages-1.img"), fill(1, 2, 3, 4), 0o600); err != nil {
		t.Fatal(err)
	}
	// Now: page 1 and 3 changed, a new page at 0x20000, a new process 8.
	if err := writePagemapFile(pagemapPath(next, 7), 2, []pmEntry{
		{vaddr: 0x10000, pages: 4, flags: pePresent | peLazy}, {vaddr: 0x20000, pages: 1, flags: pePresent}}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(next, "pages-2.img"), fill(1, 9, 3, 9, 5), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := writePagemapFile(pagemapPath(next, 8), 3, []pmEntry{{vaddr: 0x10000, pages: 1, flags: pePresent}}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(next, "pages-3.img"), fill(1), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := dedupe(next, prev); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../1", filepath.Join(next, "parent")); err != nil {
		t.Fatal(err)
	}
	if n := countPages(next); n != 4 { // 9, 9, 5 of process 7 and process 8's page
		t.Fatalf("%d pages kept", n)
	}
	pm, err := openPagemap(next, 7)
	if err != nil {
		t.Fatal(err)
	}
	defer pm.close()
	buf := make([]byte, 5*pageSize)
	if err := pm.readPages(0x10000, buf[:4*pageSize]); err != nil {
		t.Fatal(err)
	}
	if err := pm.readPages(0x20000, buf[4*pageSize:]); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf, fill(1, 9, 3, 9, 5)) {
		t.Fatal("the incremental image does not read back as the full one")
	}
}
