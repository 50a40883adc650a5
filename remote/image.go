package remote

import (
	"container/list"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"sync"
)

// Checkpoint images in a bucket. A push of a checkpointed branch stores
// its latest image's files as chunks, like the branch's files, and lists
// them in the manifest (Manifest.Checkpoint). A restore on another host
// fetches them: all of them for an eager restore; for a lazy one all but
// the memory (pages-*.img), which is read in ranges as the clones fault
// it in (RangeReader). The working set a lazy restore records is kept
// beside the manifests, at DIR/.workingsets/ID, ID naming the image by
// its content, so that the next restore from any host prefetches it.

const workingSetDir = ".workingsets"

// IsPages reports the files of an image that hold its memory.
func IsPages(name string) bool {
	return strings.HasPrefix(name, "pages-") && strings.HasSuffix(name, ".img")
}

// imageID names an image by the content of its files.
func imageID(c *Checkpoint) string {
	h := sha256.New()
	files := append([]ImageFile(nil), c.Files...)
	sort.Slice(files, func(i, j int) bool { return files[i].Name < files[j].Name })
	for _, f := range files {
		fmt.Fprintf(h, "%s %s\n", f.Name, f.SHA256)
	}
	return hex.EncodeToString(h.Sum(nil))
}

func (l Location) workingSetKey(c *Checkpoint) string {
	dir := path.Dir(l.Key)
	if dir == "." {
		return workingSetDir + "/" + imageID(c)
	}
	return dir + "/" + workingSetDir + "/" + imageID(c)
}

// WorkingSet reads the working set recorded for the image of m, or
// returns nil if none is.
func WorkingSet(ctx context.Context, b *Bucket, loc Location, m *Manifest) ([]byte, error) {
	data, err := b.Get(ctx, loc.workingSetKey(m.Checkpoint))
	if IsNotFound(err) {
		return nil, nil
	}
	return data, err
}

// WorkingSetURL is where the working set of the image of m is kept.
func WorkingSetURL(loc Location, m *Manifest) string {
	return Location{loc.Bucket, loc.workingSetKey(m.Checkpoint)}.String()
}

// SaveWorkingSet stores the working set of the image of m unless one is
// there: the first restore to record one sets it.
func SaveWorkingSet(ctx context.Context, b *Bucket, loc Location, m *Manifest, data []byte) error {
	key := loc.workingSetKey(m.Checkpoint)
	if _, ok, err := b.Stat(ctx, key); err != nil || ok {
		return err
	}
	return b.Put(ctx, key, data)
}

// FetchImage writes the files of the image of m into dir: every one, or,
// with lazy, all but the pages files, which RangeReaders read.
func FetchImage(ctx context.Context, b *Bucket, loc Location, m *Manifest, dir string, lazy bool, o Options) (*Stats, error) {
	if m.Checkpoint == nil {
		return nil, fmt.Errorf("%s holds no checkpoint", loc)
	}
	recv0, req0 := b.received.Load(), b.requests.Load()
	bar := newProgress(o.Progress, "fetch checkpoint")
	defer bar.end()
	var jobs []chunkJob
	files := map[string]*os.File{}
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	st := &Stats{Paths: len(m.Checkpoint.Files)}
	for _, im := range m.Checkpoint.Files {
		st.Bytes += im.Size
		if lazy && IsPages(im.Name) {
			continue
		}
		f, err := os.OpenFile(filepath.Join(dir, im.Name), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return nil, err
		}
		files[im.Name] = f
		if err := f.Truncate(im.Size); err != nil {
			return nil, err
		}
		off := int64(0)
		for _, c := range im.Chunks {
			jobs = append(jobs, chunkJob{path: im.Name, off: off, c: c})
			off += c.Size
			bar.total.Add(c.Size)
		}
	}
	sort.SliceStable(jobs, func(i, j int) bool { return jobs[i].c.Size > jobs[j].c.Size })
	err := parallel(ctx, len(jobs), o.jobs(), func(ctx context.Context, i int) error {
		j := jobs[i]
		data, err := getChunk(ctx, b, loc, j.c)
		if err != nil {
			return err
		}
		if _, err := files[j.path].WriteAt(data, j.off); err != nil {
			return err
		}
		bar.add(j.c.Size)
		return nil
	})
	if err != nil {
		return nil, err
	}
	for _, f := range files {
		if err := f.Close(); err != nil {
			return nil, err
		}
	}
	files = nil
	st.Received, st.Requests = b.received.Load()-recv0, b.requests.Load()-req0
	return st, nil
}

// getChunk downloads a chunk and checks it against its name.
func getChunk(ctx context.Context, b *Bucket, loc Location, c Chunk) ([]byte, error) {
	data, err := b.Get(ctx, loc.chunkKey(c.Hash))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) != c.Size || hashOf(data) != c.Hash {
		return nil, fmt.Errorf("chunk %s in %s is damaged: its content does not match its name", c.Hash, loc)
	}
	return data, nil
}

// blockSize is what a RangeReader keeps in its cache at a time: a fault
// asks for one page, and the pages near it are likely next. A longer read
// (CRIU's background copy asks for up to 4 MiB) fetches the blocks it
// lacks of each chunk in one request.
const blockSize = 128 << 10

// DefaultBlockCache is the size of a lazy restore's BlockCache: the
// blocks its clones, copying in the same memory at about the same pace,
// read from each other. It is held beside the restored memory, so no
// larger than that needs.
const DefaultBlockCache = 32 << 20

// BlockCache holds blocks of chunks fetched by ranged GETs, shared by the
// RangeReaders of one restore, so that N clones fetch each block once. It
// keeps the most recently used up to its size.
type BlockCache struct {
	mu     sync.Mutex
	max    int
	blocks map[blockKey]*list.Element
	lru    *list.List // of *block, most recent first
}

type blockKey struct {
	hash string
	n    int64 // block number in the chunk
}

type block struct {
	key  blockKey
	done chan struct{}
	data []byte
	err  error
}

// NewBlockCache keeps up to size bytes.
func NewBlockCache(size int64) *BlockCache {
	return &BlockCache{max: int(max(1, size/blockSize)), blocks: map[blockKey]*list.Element{}, lru: list.New()}
}

// run returns blocks first to first+n-1 of chunk c, each fetched once
// for all callers: the run of those missing between two present ones by
// one ranged GET.
func (bc *BlockCache) run(ctx context.Context, b *Bucket, loc Location, c Chunk, first, n int64) ([][]byte, error) {
	bls := make([]*block, n)
	mine := make([]bool, n) // to fetch here
	bc.mu.Lock()
	for i := range n {
		k := blockKey{c.Hash, first + i}
		if el, ok := bc.blocks[k]; ok {
			bc.lru.MoveToFront(el)
			bls[i] = el.Value.(*block)
			continue
		}
		bls[i] = &block{key: k, done: make(chan struct{})}
		bc.blocks[k] = bc.lru.PushFront(bls[i])
		mine[i] = true
	}
	for bc.lru.Len() > bc.max {
		old := bc.lru.Back()
		bc.lru.Remove(old)
		delete(bc.blocks, old.Value.(*block).key)
	}
	bc.mu.Unlock()
	var wg sync.WaitGroup
	for i := int64(0); i < n; {
		if !mine[i] {
			i++
			continue
		}
		j := i + 1
		for j < n && mine[j] {
			j++
		}
		missing := bls[i:j]
		wg.Add(1)
		go func() {
			defer wg.Done()
			bc.fetch(ctx, b, loc, c, missing)
		}()
		i = j
	}
	wg.Wait()
	out := make([][]byte, n)
	for i, bl := range bls {
		<-bl.done
		if bl.err != nil {
			return nil, bl.err
		}
		out[i] = bl.data
	}
	return out, nil
}

// fetch fills run, consecutive blocks of chunk c, by one ranged GET; on
// an error it drops them from the cache, so that a later read tries
// again.
func (bc *BlockCache) fetch(ctx context.Context, b *Bucket, loc Location, c Chunk, run []*block) {
	off := run[0].key.n * blockSize
	end := min(c.Size, (run[len(run)-1].key.n+1)*blockSize)
	data, err := b.GetRange(ctx, loc.chunkKey(c.Hash), off, end-off)
	for i, bl := range run {
		if err != nil {
			bl.err = err
			bc.mu.Lock()
			if el, ok := bc.blocks[bl.key]; ok && el.Value == bl {
				bc.lru.Remove(el)
				delete(bc.blocks, bl.key)
			}
			bc.mu.Unlock()
		} else {
			at := int64(i) * blockSize
			bl.data = data[at:min(at+blockSize, int64(len(data))):min(at+blockSize, int64(len(data)))]
		}
		close(bl.done)
	}
}

// RangeReader reads a file of an image in the bucket by ranged GETs, as
// a page server reads a pages file. (A range cannot be checked against
// its chunk's name, which covers the whole chunk; TLS or the store's own
// checks stand for it.)
type RangeReader struct {
	ctx    context.Context
	b      *Bucket
	loc    Location
	chunks []Chunk
	starts []int64 // of each chunk in the file
	size   int64
	cache  *BlockCache
}

// OpenImageFile returns a RangeReader of the image file name of m: one
// that reads through cache, or, with cache nil, exactly what it is asked.
func OpenImageFile(ctx context.Context, b *Bucket, loc Location, m *Manifest, name string, cache *BlockCache) (*RangeReader, error) {
	if m.Checkpoint == nil {
		return nil, fmt.Errorf("%s holds no checkpoint", loc)
	}
	for _, f := range m.Checkpoint.Files {
		if f.Name != name {
			continue
		}
		r := &RangeReader{ctx: ctx, b: b, loc: loc, chunks: f.Chunks, size: f.Size, cache: cache}
		var off int64
		for _, c := range f.Chunks {
			r.starts = append(r.starts, off)
			off += c.Size
		}
		return r, nil
	}
	return nil, fmt.Errorf("the checkpoint at %s has no file %s", loc, name)
}

// ReadAt reads len(p) bytes at off: the blocks it spans, through the
// cache, those it lacks of each chunk by one request; or, without a
// cache, the bytes themselves, one request for each chunk they span.
func (r *RangeReader) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 || off+int64(len(p)) > r.size {
		return 0, fmt.Errorf("read of %d bytes at %d past the end (%d): %w", len(p), off, r.size, io.ErrUnexpectedEOF)
	}
	// One span for each chunk the read covers, read at once: by one
	// request, or through the cache.
	type span struct {
		c   Chunk
		in  int64 // where dst starts in the chunk
		dst []byte
	}
	var spans []*span
	for at, rest := off, p; len(rest) > 0; {
		i := sort.Search(len(r.starts), func(i int) bool { return r.starts[i] > at }) - 1
		c := r.chunks[i]
		in := at - r.starts[i]
		s := &span{c: c, in: in, dst: rest[:min(int64(len(rest)), c.Size-in)]}
		spans = append(spans, s)
		at, rest = at+int64(len(s.dst)), rest[len(s.dst):]
	}
	errs := make([]error, len(spans))
	var wg sync.WaitGroup
	for i, s := range spans {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if r.cache == nil {
				data, err := r.b.GetRange(r.ctx, r.loc.chunkKey(s.c.Hash), s.in, int64(len(s.dst)))
				copy(s.dst, data)
				errs[i] = err
				return
			}
			first, last := s.in/blockSize, (s.in+int64(len(s.dst))-1)/blockSize
			bls, err := r.cache.run(r.ctx, r.b, r.loc, s.c, first, last-first+1)
			if err != nil {
				errs[i] = err
				return
			}
			dst, from := s.dst, s.in-first*blockSize
			for _, bl := range bls {
				n := copy(dst, bl[from:])
				dst, from = dst[n:], 0
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

// Close releases nothing: the cache is the restore's.
func (r *RangeReader) Close() error { return nil }
