package remote

import (
	"bytes"
	"context"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/branchfs/branchfs/checkpoint"
)

// A checkpoint image goes to the bucket with its branch and comes back
// whole for an eager restore, without its memory for a lazy one, whose
// ranges are read by ranged GETs, each block once for every reader; the
// first working set saved is the one kept.
func TestImageThroughTheBucket(t *testing.T) {
	w := sharedWeed(t)
	bucket := w.bucket(t)
	b := w.connect(t, bucket, w.Endpoint)
	ctx := context.Background()

	img := t.TempDir()
	files := map[string][]byte{
		"pages-1.img":   randomBytes(6<<20+123*4096, 5),
		"pagemap-7.img": randomBytes(300, 6),
		"core-7.img":    randomBytes(2000, 7),
	}
	for n, data := range files {
		must(t, os.WriteFile(filepath.Join(img, n), data, 0o600))
	}
	must(t, os.Symlink("..", filepath.Join(img, "parent-link"))) // not a file: not pushed
	views := t.TempDir()
	loc := Location{bucket, "ck/job"}
	meta := checkpoint.ImageMeta{Gen: 3, Branch: "job", Tier: "full", RootPID: 7, Pages: 1659}
	_, st, err := Push(ctx, b, loc, Source{Name: "job", Parent: "main", View: views, ParentView: views,
		Image: &Image{Meta: meta, Dir: img}}, Options{})
	must(t, err)
	if st.Bytes != int64(len(files["pages-1.img"])+2300) {
		t.Errorf("pushed %d bytes", st.Bytes)
	}
	m, err := Fetch(ctx, b, loc)
	must(t, err)
	if m.Checkpoint == nil || m.Checkpoint.Image.Gen != 3 || len(m.Checkpoint.Files) != 3 {
		t.Fatalf("manifest's checkpoint: %+v", m.Checkpoint)
	}

	eager := t.TempDir()
	_, err = FetchImage(ctx, b, loc, m, eager, false, Options{})
	must(t, err)
	for n, data := range files {
		got, err := os.ReadFile(filepath.Join(eager, n))
		if err != nil || !bytes.Equal(got, data) {
			t.Errorf("%s fetched: %d bytes, %v", n, len(got), err)
		}
	}
	lazy := t.TempDir()
	_, err = FetchImage(ctx, b, loc, m, lazy, true, Options{})
	must(t, err)
	if _, err := os.Stat(filepath.Join(lazy, "pages-1.img")); !os.IsNotExist(err) {
		t.Errorf("a lazy fetch fetched the pages: %v", err)
	}
	if _, err := os.Stat(filepath.Join(lazy, "core-7.img")); err != nil {
		t.Errorf("a lazy fetch left out the rest: %v", err)
	}

	cache := NewBlockCache(64 << 20)
	pages := files["pages-1.img"]
	r := rand.New(rand.NewPCG(1, 2))
	for range 50 {
		rd, err := OpenImageFile(ctx, b, loc, m, "pages-1.img", cache)
		must(t, err)
		off := r.Int64N(int64(len(pages)))
		n := min(int64(len(pages))-off, 1+r.Int64N(3<<20))
		buf := make([]byte, n)
		if _, err := rd.ReadAt(buf, off); err != nil || !bytes.Equal(buf, pages[off:off+n]) {
			t.Fatalf("ReadAt(%d, %d): %v, or other bytes", n, off, err)
		}
	}
	// Without a cache, a page is one request of one page.
	direct, err := OpenImageFile(ctx, b, loc, m, "pages-1.img", nil)
	must(t, err)
	_, recv0, req0 := b.Moved()
	page := make([]byte, 4096)
	for _, off := range []int64{0, 400 << 10, 5 << 20} {
		if _, err := direct.ReadAt(page, off); err != nil || !bytes.Equal(page, pages[off:off+4096]) {
			t.Fatalf("direct ReadAt(4096, %d): %v, or other bytes", off, err)
		}
	}
	if _, recv, req := b.Moved(); req-req0 != 3 || recv-recv0 != 3*4096 {
		t.Errorf("three pages read directly took %d requests, %d bytes", req-req0, recv-recv0)
	}
	// and a long read one request for each chunk it spans.
	off, n := int64(1<<20+512), int64(3<<20)
	spanned := 0
	for _, f := range m.Checkpoint.Files {
		at := int64(0)
		for _, c := range f.Chunks {
			if f.Name == "pages-1.img" && at < off+n && at+c.Size > off {
				spanned++
			}
			at += c.Size
		}
	}
	_, recv0, req0 = b.Moved()
	long := make([]byte, n)
	if _, err := direct.ReadAt(long, off); err != nil || !bytes.Equal(long, pages[off:off+n]) {
		t.Fatalf("direct ReadAt(%d, %d): %v, or other bytes", n, off, err)
	}
	if _, recv, req := b.Moved(); req-req0 != int64(spanned) || recv-recv0 != n {
		t.Errorf("%d bytes over %d chunks read directly took %d requests, %d bytes", n, spanned, req-req0, recv-recv0)
	}
	// Through a cache, a long read (CRIU's background copy asks for up
	// to 4 MiB) is also one request for each chunk it spans, not one for
	// each block, and leaves its blocks for the reads after it.
	fresh, err := OpenImageFile(ctx, b, loc, m, "pages-1.img", NewBlockCache(64<<20))
	must(t, err)
	_, _, req0 = b.Moved()
	if _, err := fresh.ReadAt(long, off); err != nil || !bytes.Equal(long, pages[off:off+n]) {
		t.Fatalf("cached ReadAt(%d, %d): %v, or other bytes", n, off, err)
	}
	for at := off; at < off+n; at += 64 << 10 {
		if _, err := fresh.ReadAt(page, at); err != nil || !bytes.Equal(page, pages[at:at+4096]) {
			t.Fatalf("cached ReadAt(4096, %d) after the long read: %v, or other bytes", at, err)
		}
	}
	if _, _, req := b.Moved(); req-req0 != int64(spanned) {
		t.Errorf("%d bytes over %d chunks, then pages in them, read through a cache took %d requests", n, spanned, req-req0)
	}
	// Another reader of a range read before costs no request.
	_, _, before := b.Moved()
	rd, err := OpenImageFile(ctx, b, loc, m, "pages-1.img", cache)
	must(t, err)
	buf := make([]byte, 4096)
	for off := int64(0); off < 1<<20; off += 4096 {
		_, err := rd.ReadAt(buf, off)
		must(t, err)
	}
	_, _, mid := b.Moved()
	for off := int64(0); off < 1<<20; off += 4096 {
		_, err := rd.ReadAt(buf, off)
		must(t, err)
	}
	if _, _, after := b.Moved(); after != mid || mid-before > 1<<20/blockSize+1 {
		t.Errorf("reading 1 MiB page by page took %d requests, again %d", mid-before, after-mid)
	}
	if _, err := rd.ReadAt(buf, int64(len(pages))-100); err == nil {
		t.Error("a read past the end succeeded")
	}

	ws, err := WorkingSet(ctx, b, loc, m)
	if err != nil || ws != nil {
		t.Fatalf("a working set before any was saved: %q %v", ws, err)
	}
	must(t, SaveWorkingSet(ctx, b, loc, m, []byte("7 10000\n")))
	must(t, SaveWorkingSet(ctx, b, loc, m, []byte("7 20000\n")))
	if ws, err := WorkingSet(ctx, b, loc, m); err != nil || string(ws) != "7 10000\n" {
		t.Fatalf("working set %q, %v", ws, err)
	}
}
