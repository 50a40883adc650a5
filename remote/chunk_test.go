package remote

import (
	"bytes"
	"io"
	"testing"
	"testing/iotest"
)

func chunksOf(t *testing.T, r io.Reader) [][]byte {
	t.Helper()
	c := newChunker(r)
	defer c.close()
	var out [][]byte
	for {
		b, err := c.next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, b)
	}
}

// Chunks put back together are the stream, whatever its size and however
// the reader splits it, and each but the last is between the bounds.
func TestChunksMakeTheStream(t *testing.T) {
	for _, n := range []int{0, 1, minChunk, minChunk + 1, maxChunk, 3*maxChunk + 5, 10 << 20} {
		data := randomBytes(n, uint64(n))
		for _, r := range []io.Reader{bytes.NewReader(data), iotest.HalfReader(bytes.NewReader(data))} {
			chunks := chunksOf(t, r)
			if got := bytes.Join(chunks, nil); !bytes.Equal(got, data) {
				t.Fatalf("%d bytes: the chunks make %d other bytes", n, len(got))
			}
			for i, c := range chunks {
				if len(c) > maxChunk || i < len(chunks)-1 && len(c) < minChunk {
					t.Errorf("%d bytes: chunk %d of %d has %d bytes", n, i, len(chunks), len(c))
				}
			}
		}
	}
}

// An insertion changes the chunk it falls in, and the cuts after it come
// back to the same places in the content: the other chunks are the same.
func TestChunksFollowTheContent(t *testing.T) {
	data := randomBytes(24<<20, 7)
	changed := append(append(bytes.Clone(data[:9<<20]), "an insertion"...), data[9<<20:]...)
	old := map[string]bool{}
	for _, c := range chunksOf(t, bytes.NewReader(data)) {
		old[hashOf(c)] = true
	}
	chunks := chunksOf(t, bytes.NewReader(changed))
	fresh := 0
	for _, c := range chunks {
		if !old[hashOf(c)] {
			fresh++
		}
	}
	if fresh == 0 || fresh > 2 {
		t.Errorf("%d of %d chunks are new after one insertion, want 1 or 2", fresh, len(chunks))
	}
	if len(chunks) < 10 {
		t.Errorf("24 MiB make %d chunks", len(chunks))
	}
}
