package remote

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"sync"
)

// Chunk sizes. A cut falls where the rolling hash of the last 64 bytes has
// its top chunkBits bits clear, so it moves with the content: a change in a
// large file changes the chunks it falls in, not every chunk after it. The
// minimum keeps the requests per byte few; the maximum bounds the memory a
// chunk in flight takes (jobs × maxChunk).
const (
	minChunk  = 256 << 10
	chunkBits = 20 // about 1 MiB past minChunk on average
	maxChunk  = 4 << 20
)

// gear maps each byte to a fixed random word for the rolling hash. It is
// part of the format: another table cuts other chunks, which would
// deduplicate nothing against chunks already pushed.
var gear = func() (g [256]uint64) {
	x := uint64(0x6272616e63686673) // "branchfs"
	for i := range g {
		// splitmix64
		x += 0x9e3779b97f4a7c15
		z := x
		z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
		z = (z ^ z>>27) * 0x94d049bb133111eb
		g[i] = z ^ z>>31
	}
	return g
}()

// cut returns the length of the chunk that starts data: all of data when
// it is minChunk or shorter, else at most maxChunk. Only the hash of the
// last 64 bytes decides, so skipping the first minChunk costs nothing.
func cut(data []byte) int {
	n := min(len(data), maxChunk)
	if n <= minChunk {
		return n
	}
	var h uint64
	for i := minChunk - 64; i < n; i++ {
		h = h<<1 + gear[data[i]]
		if i >= minChunk && h>>(64-chunkBits) == 0 {
			return i + 1
		}
	}
	return n
}

// chunker reads a stream and returns its chunks, each a slice of its own.
type chunker struct {
	r   io.Reader
	buf []byte // read, not yet returned; from bufs
	eof bool
}

// bufs holds the chunkers' read buffers: a file of a few bytes needs one
// of maxChunk as much as a large one does.
var bufs = sync.Pool{New: func() any { b := make([]byte, maxChunk); return &b }}

func newChunker(r io.Reader) *chunker {
	return &chunker{r: r, buf: (*bufs.Get().(*[]byte))[:0]}
}

// close gives the buffer back; the chunks returned stay valid.
func (c *chunker) close() {
	if c.buf != nil {
		b := c.buf[:0]
		bufs.Put(&b)
		c.buf = nil
	}
}

// next returns the next chunk, or io.EOF after the last.
func (c *chunker) next() ([]byte, error) {
	for !c.eof && len(c.buf) < maxChunk {
		n, err := c.r.Read(c.buf[len(c.buf):maxChunk])
		c.buf = c.buf[:len(c.buf)+n]
		if err == io.EOF {
			c.eof = true
		} else if err != nil {
			return nil, err
		}
	}
	if len(c.buf) == 0 {
		return nil, io.EOF
	}
	n := cut(c.buf)
	out := bytes.Clone(c.buf[:n])
	c.buf = c.buf[:copy(c.buf, c.buf[n:])]
	return out, nil
}

// hashOf names a chunk: the SHA-256 of its bytes, in hex.
func hashOf(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}
