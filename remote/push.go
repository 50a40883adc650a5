package remote

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/branchfs/branchfs/branch"
	"github.com/branchfs/branchfs/checkpoint"
	"github.com/branchfs/branchfs/internal/phase"
	"golang.org/x/sys/unix"
)

// Source is a branch to push, as its mount shows it.
type Source struct {
	Name, Parent string
	View         string             // the branch's view, MNT/@NAME
	ParentView   string             // its parent's view
	Items        []branch.DeltaItem // its delta (branch.Store.Delta)
	// Image is the branch's checkpoint image to push with it, if any.
	Image *Image
	// Stream, if not nil, uploaded the image's files as they were
	// dumped: Push takes those unchanged since, and the stream's
	// uploads, and closes it.
	Stream *ImageStream
}

// Image is a checkpoint image on this host: its record and directory.
type Image struct {
	Meta checkpoint.ImageMeta
	Dir  string
}

// Options tune a push or a pull.
type Options struct {
	Jobs     int       // requests in flight; 0: DefaultJobs
	Progress io.Writer // where to draw a progress bar (a terminal), or nil
	Force    bool      // pull: make the branch even on a base that differs
}

// DefaultJobs is how many requests a push or pull keeps in flight.
const DefaultJobs = 8

func (o *Options) jobs() int {
	if o.Jobs > 0 {
		return o.Jobs
	}
	return DefaultJobs
}

// Stats tell what a push or pull did.
type Stats struct {
	Paths    int   `json:"paths"`    // entries in the manifest
	Bytes    int64 `json:"bytes"`    // content of its files (and checkpoint image)
	Chunks   int   `json:"chunks"`   // distinct chunks it names
	Stored   int   `json:"stored"`   // chunks a push sent (the others were in the bucket)
	Sent     int64 `json:"sent"`     // bytes sent, manifest included
	Received int64 `json:"received"` // bytes received
	Requests int64 `json:"requests"`
}

// maxRetries is how often a push reads a file again that changed while it
// read it.
const maxRetries = 3

// Push stores the branch src at loc: every chunk it needs and is not in
// the bucket yet, then its manifest, last. A push that fails leaves the
// manifest that was at loc as it was; its chunks stay for the next push.
// Files are read through the branch's view; one written to while it is
// read is read again. (The branch is not frozen: a push of a branch that
// is being changed holds some state of each file, not one state of all.)
func Push(ctx context.Context, b *Bucket, loc Location, src Source, o Options) (*Manifest, *Stats, error) {
	bv, err := openView(src.View)
	if err != nil {
		return nil, nil, err
	}
	defer bv.close()
	pv, err := openView(src.ParentView)
	if err != nil {
		return nil, nil, err
	}
	defer pv.close()
	sent0, recv0, req0 := b.Moved()
	if src.Stream != nil {
		sent0, recv0, req0 = src.Stream.sent0, src.Stream.recv0, src.Stream.req0
	}
	m := &Manifest{Format: manifestFormat, Branch: src.Name, Parent: src.Parent, Created: time.Now().UTC(),
		Entries: make([]Entry, len(src.Items))}
	// The metadata and the base versions first, which gives the bar its
	// total.
	err = parallel(ctx, len(src.Items), o.jobs(), func(ctx context.Context, i int) error {
		it := src.Items[i]
		e := &m.Entries[i]
		e.Path, e.Kind = it.Path, it.Kind
		var err error
		if e.Base, err = pv.version(it.Path); err != nil {
			return fmt.Errorf("reading %s in %s: %w", it.Path, src.Parent, err)
		}
		if it.Kind != branch.DeltaDeleted {
			if e.Meta, err = bv.meta(it.Path); err != nil {
				return fmt.Errorf("reading %s: %w", it.Path, err)
			}
		}
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	phase.Mark("push: views opened, metadata read")
	var images []os.DirEntry
	if src.Image != nil {
		if src.Image.Meta.Parent != 0 {
			return nil, nil, fmt.Errorf("checkpoint %d of %s holds only the changes since checkpoint %d: push a full checkpoint", src.Image.Meta.Gen, src.Name, src.Image.Meta.Parent)
		}
		ents, err := os.ReadDir(src.Image.Dir)
		if err != nil {
			return nil, nil, err
		}
		for _, e := range ents {
			if e.Type().IsRegular() {
				images = append(images, e)
			}
		}
		m.Checkpoint = &Checkpoint{Image: src.Image.Meta, Files: make([]ImageFile, len(images))}
	}
	bar := newProgress(o.Progress, "push "+src.Name)
	defer bar.end()
	st := &Stats{Paths: len(m.Entries)}
	for _, e := range m.Entries {
		bar.total.Add(e.Size)
	}
	for _, e := range images {
		if fi, err := e.Info(); err == nil {
			bar.total.Add(fi.Size())
		}
	}
	var up *uploader
	if src.Stream != nil {
		src.Stream.stop()
		phase.Mark("push: the stream's watch ended")
		up = src.Stream.up
	} else {
		up = newUploader(ctx, b, loc, o.jobs())
	}
	// The chunks the manifest at loc names are there: it was written
	// after them. A second push of a branch asks only about the others.
	if err := up.knowManifest(ctx); err != nil {
		return nil, nil, err
	}
	phase.Mark("push: manifest known")
	err = parallel(up.ctx, len(m.Entries), o.jobs(), func(ctx context.Context, i int) error {
		e := &m.Entries[i]
		if e.Type != "file" {
			return nil
		}
		for try := 1; ; try++ {
			err := pushFile(ctx, bv, e, up, bar)
			if !errors.Is(err, errChanged) || try == maxRetries {
				return err
			}
			if e.Meta, err = bv.meta(e.Path); err != nil {
				return fmt.Errorf("reading %s: %w", e.Path, err)
			}
		}
	})
	phase.Mark("push: %d entries read", len(m.Entries))
	if err == nil && len(images) > 0 {
		err = parallel(up.ctx, len(images), o.jobs(), func(ctx context.Context, i int) error {
			f, err := os.Open(filepath.Join(src.Image.Dir, images[i].Name()))
			if err != nil {
				return err
			}
			defer f.Close()
			im := &m.Checkpoint.Files[i]
			if src.Stream != nil {
				var st unix.Stat_t
				if err := unix.Fstat(int(f.Fd()), &st); err != nil {
					return err
				}
				if sf, ok := src.Stream.file(images[i].Name(), &st); ok {
					*im = sf
					bar.add(sf.Size)
					phase.Mark("push: %s taken from the stream", sf.Name)
					return nil
				}
			}
			im.Name = images[i].Name()
			im.Chunks, im.SHA256, im.Size, err = pushStream(ctx, f, up, bar)
			if err != nil {
				return fmt.Errorf("reading %s: %w", f.Name(), err)
			}
			phase.Mark("push: %s read (%d bytes)", im.Name, im.Size)
			return nil
		})
	}
	if src.Stream != nil {
		src.Stream.close()
	}
	phase.Mark("push: image files read")
	if werr := up.wait(); err == nil {
		err = werr
	}
	phase.Mark("push: uploads done (%d stored)", up.stored.Load())
	if err != nil {
		return nil, nil, err
	}
	for _, e := range m.Entries {
		st.Bytes += e.Size
	}
	if m.Checkpoint != nil {
		for _, f := range m.Checkpoint.Files {
			st.Bytes += f.Size
		}
	}
	st.Chunks, st.Stored = len(up.seen), int(up.stored.Load())
	data, err := encodeManifest(m)
	if err != nil {
		return nil, nil, err
	}
	if err := b.Put(ctx, loc.Key, data); err != nil {
		return nil, nil, err
	}
	phase.Mark("push: manifest stored")
	sent, recv, req := b.Moved()
	st.Sent, st.Received, st.Requests = sent-sent0, recv-recv0, req-req0
	return m, st, nil
}

// errChanged: a file changed while a push read it.
var errChanged = errors.New("changed while it was read")

// pushFile reads e's file through the view, cuts it into chunks, hands
// each to the uploader and records them in e, with its size and SHA-256.
func pushFile(ctx context.Context, v *view, e *Entry, up *uploader, bar *progress) error {
	f, err := v.openFile(e.Path, unix.O_RDONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	var before, after unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &before); err != nil {
		return err
	}
	if before.Size != e.Size || before.Mtim != unix.NsecToTimespec(e.Mtime) {
		return errChanged
	}
	chunks, sum, size, err := pushStream(ctx, f, up, bar)
	if err != nil {
		return fmt.Errorf("reading %s: %w", e.Path, err)
	}
	if err := unix.Fstat(int(f.Fd()), &after); err != nil {
		return err
	}
	if after.Size != size || after.Mtim != before.Mtim || after.Ctim != before.Ctim {
		bar.add(-size)
		return errChanged
	}
	e.Chunks, e.SHA256 = chunks, sum
	return nil
}

// pushStream cuts r into chunks, hands each to the uploader and returns
// them with the SHA-256 and size of the whole.
func pushStream(ctx context.Context, r io.Reader, up *uploader, bar *progress) ([]Chunk, string, int64, error) {
	c := newChunker(r)
	defer c.close()
	whole := sha256.New()
	var chunks []Chunk
	var size int64
	for {
		data, err := c.next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, "", 0, err
		}
		if ctx.Err() != nil {
			return nil, "", 0, context.Cause(ctx)
		}
		whole.Write(data)
		h := hashOf(data)
		chunks = append(chunks, Chunk{h, int64(len(data))})
		size += int64(len(data))
		up.add(h, data)
		bar.add(int64(len(data)))
	}
	return chunks, hex.EncodeToString(whole.Sum(nil)), size, nil
}

// uploader sends each chunk it is given once, unless the bucket has it,
// with at most jobs requests in flight; add blocks while they are.
type uploader struct {
	ctx    context.Context
	cancel context.CancelCauseFunc
	b      *Bucket
	loc    Location
	sem    chan struct{}
	wg     sync.WaitGroup
	mu     sync.Mutex
	seen   map[string]bool
	known  map[string]bool // in the bucket: named by the manifest there
	knew   bool            // known was read (it is not written after)
	stored atomic.Int64
}

// knowManifest notes the chunks of the manifest at the uploader's place,
// if one is there.
func (u *uploader) knowManifest(ctx context.Context) error {
	if u.knew {
		return nil
	}
	u.knew = true
	data, err := u.b.Get(ctx, u.loc.Key)
	if IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	m, err := decodeManifest(data)
	if err != nil {
		return nil // not ours, or damaged: it names nothing to trust
	}
	u.known = map[string]bool{}
	for _, e := range m.Entries {
		for _, c := range e.Chunks {
			u.known[c.Hash] = true
		}
	}
	if m.Checkpoint != nil {
		for _, f := range m.Checkpoint.Files {
			for _, c := range f.Chunks {
				u.known[c.Hash] = true
			}
		}
	}
	return nil
}

func newUploader(ctx context.Context, b *Bucket, loc Location, jobs int) *uploader {
	u := &uploader{b: b, loc: loc, sem: make(chan struct{}, jobs), seen: map[string]bool{}}
	u.ctx, u.cancel = context.WithCancelCause(ctx)
	return u
}

func (u *uploader) add(hash string, data []byte) {
	u.mu.Lock()
	if u.seen[hash] {
		u.mu.Unlock()
		return
	}
	u.seen[hash] = true
	u.mu.Unlock()
	select {
	case u.sem <- struct{}{}:
	case <-u.ctx.Done():
		return
	}
	u.wg.Add(1)
	go func() {
		defer func() { <-u.sem; u.wg.Done() }()
		if err := u.put(hash, data); err != nil {
			u.cancel(err)
		}
	}()
}

// put stores a chunk unless the bucket holds it whole: a chunk's name is
// its content, so one of the right size is the right one (a pull checks).
func (u *uploader) put(hash string, data []byte) error {
	if u.known[hash] {
		return nil
	}
	key := u.loc.chunkKey(hash)
	size, ok, err := u.b.Stat(u.ctx, key)
	if err != nil {
		return err
	}
	if ok && size == int64(len(data)) {
		return nil
	}
	phase.Mark("chunk %.12s (%d bytes): absent", hash, len(data))
	if err := u.b.Put(u.ctx, key, data); err != nil {
		return err
	}
	phase.Mark("chunk %.12s stored", hash)
	u.stored.Add(1)
	return nil
}

// wait waits for the chunks in flight and returns the first error.
func (u *uploader) wait() error {
	u.wg.Wait()
	err := context.Cause(u.ctx)
	u.cancel(nil)
	return err
}

// pathError names a path of the branch in an error.
func pathError(op, p string, err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return err
	}
	return fmt.Errorf("%s %s: %w", op, p, err)
}
