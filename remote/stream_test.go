package remote

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/branchfs/branchfs/checkpoint"
)

// An image stream uploads each file of a dump as soon as it is closed,
// while the dump goes on: here the "dump" writes its second file only
// once the first file's chunks are in the bucket, and so finishes only if
// they are. The push after it takes the files unchanged since they were
// uploaded from the stream, reads again one changed after, and writes
// the manifest last; the image comes back whole.
func TestImageStreamUploadsWhileDumping(t *testing.T) {
	w := sharedWeed(t)
	bucket := w.bucket(t)
	b := w.connect(t, bucket, w.Endpoint)
	ctx := context.Background()
	loc := Location{bucket, "ck/job"}

	store := t.TempDir()
	staged := filepath.Join(store, "staged")
	must(t, os.Mkdir(staged, 0o700))
	s := NewImageStream(ctx, b, loc, Options{})
	done, err := s.Watch(staged)
	must(t, err)
	files := map[string][]byte{
		"pages-1.img": randomBytes(3<<20, 11),
		"core-7.img":  randomBytes(2000, 12),
		"dump.log":    []byte("first words\n"),
	}
	for _, n := range []string{"pages-1.img", "core-7.img", "dump.log"} {
		must(t, os.WriteFile(filepath.Join(staged, n), files[n], 0o600))
		if n == "dump.log" {
			break
		}
		// The dump goes on only once this file's first chunk is in the
		// bucket: without the stream, it would wait for ever.
		first := loc.chunkKey(hashOf(files[n][:cut(files[n])]))
		// (The deadline only bounds a failure.)
		deadline := time.Now().Add(time.Minute)
		for !slices.Contains(w.keys(t, bucket, "ck/.chunks/"), first) {
			if err := s.up.ctx.Err(); err != nil {
				t.Fatalf("the stream stopped: %v", context.Cause(s.up.ctx))
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s was closed a minute ago, and its first chunk is not in the bucket", n)
			}
		}
	}
	// Changed after it was uploaded, and not closed (so no event says
	// so) until after the push: the push must read it again.
	f, err := os.OpenFile(filepath.Join(staged, "core-7.img"), os.O_WRONLY|os.O_APPEND, 0)
	must(t, err)
	defer f.Close()
	_, err = f.Write([]byte("more"))
	must(t, err)
	files["core-7.img"] = append(files["core-7.img"], "more"...)
	done(true)
	if keys := w.keys(t, bucket, "ck/"); slices.Contains(keys, "ck/job") {
		t.Fatalf("a manifest before the push: %v", keys)
	}
	// Published: the directory is renamed.
	img := filepath.Join(store, "1")
	must(t, os.Rename(staged, img))
	views := t.TempDir()
	meta := checkpoint.ImageMeta{Gen: 1, Branch: "job", Tier: "full", RootPID: 7}
	_, st, err := Push(ctx, b, loc, Source{Name: "job", Parent: "main", View: views, ParentView: views,
		Image: &Image{Meta: meta, Dir: img}, Stream: s}, Options{})
	must(t, err)
	if st.Stored != st.Chunks {
		t.Errorf("stored %d of %d chunks", st.Stored, st.Chunks)
	}
	m, err := Fetch(ctx, b, loc)
	must(t, err)
	out := t.TempDir()
	_, err = FetchImage(ctx, b, loc, m, out, false, Options{})
	must(t, err)
	for n, data := range files {
		got, err := os.ReadFile(filepath.Join(out, n))
		if err != nil || !bytes.Equal(got, data) {
			t.Errorf("%s fetched: %q..., %v", n, got[:min(len(got), 40)], err)
		}
	}
	if len(m.Checkpoint.Files) != len(files) {
		t.Errorf("the manifest lists %d files", len(m.Checkpoint.Files))
	}
}

// A dump that fails ends the stream's uploads and leaves no manifest.
func TestImageStreamFailedDump(t *testing.T) {
	w := sharedWeed(t)
	bucket := w.bucket(t)
	b := w.connect(t, bucket, w.Endpoint)
	ctx := context.Background()
	loc := Location{bucket, "ck/job"}
	staged := t.TempDir()
	s := NewImageStream(ctx, b, loc, Options{})
	done, err := s.Watch(staged)
	must(t, err)
	must(t, os.WriteFile(filepath.Join(staged, "core-1.img"), randomBytes(1000, 3), 0o600))
	done(false)
	s.Abort()
	for _, k := range w.keys(t, bucket, "") {
		if !strings.HasPrefix(k, "ck/.chunks/") {
			t.Errorf("a failed dump left %s", k)
		}
	}
}

// The stream reads a file as soon as it is closed, not after the file
// before it is up: here the first file's uploads are held by the proxy
// (one request in flight, so reading it stops at its second chunk), and
// a second one closed meanwhile, the child's copy of the same memory as
// a dump's second memory file mostly is, is read all the same.
func TestImageStreamReadsFilesAtOnce(t *testing.T) {
	w := sharedWeed(t)
	p := newProxy(t, strings.TrimPrefix(w.Endpoint, "http://"))
	bucket := w.bucket(t)
	b := w.connect(t, bucket, p.Endpoint())
	ctx := context.Background()
	loc := Location{bucket, "ck/job"}
	staged := t.TempDir()
	s := NewImageStream(ctx, b, loc, Options{Jobs: 1})
	defer s.Abort()
	_, err := s.Watch(staged)
	must(t, err)
	// (The deadlines only bound a failure.)
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(time.Minute); !cond(); time.Sleep(time.Millisecond) {
			if err := s.up.ctx.Err(); err != nil {
				t.Fatalf("the stream stopped: %v", context.Cause(s.up.ctx))
			}
			if time.Now().After(deadline) {
				t.Fatalf("a minute passed, and %s", what)
			}
		}
	}
	// A first small file goes up whole: the stream has read the bucket's
	// manifest, and nothing is left in flight.
	must(t, os.WriteFile(filepath.Join(staged, "inventory.img"), []byte("first"), 0o600))
	waitFor("inventory.img is not up", func() bool { return s.Streamed() == 1 })
	s.up.wg.Wait()
	p.holdAfter(0)
	// More than two chunks: the second waits for the first's request.
	pages := randomBytes(3*maxChunk, 21)
	must(t, os.WriteFile(filepath.Join(staged, "pages-1.img"), pages, 0o600))
	must(t, os.WriteFile(filepath.Join(staged, "pages-2.img"), pages[:cut(pages)], 0o600))
	has := func(name string) bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		_, ok := s.files[name]
		return ok
	}
	waitFor("pages-2.img was not read while pages-1.img's upload was held", func() bool { return has("pages-2.img") })
	if has("pages-1.img") {
		t.Fatal("pages-1.img was read whole though its upload is held")
	}
	p.drop()
}
