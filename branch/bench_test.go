package branch

import (
	"strconv"
	"testing"

	"golang.org/x/sys/unix"
)

// BenchmarkCreate measures branch creation in the store alone, without FUSE.
func BenchmarkCreate(b *testing.B) {
	s, _ := newStore(b)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := s.Create("b"+strconv.Itoa(i), MainName); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCommit1MB measures the commit of a one-file 1 MB delta.
func BenchmarkCommit1MB(b *testing.B) {
	s, _ := newStore(b)
	data := make([]byte, 1<<20)
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		v, err := s.Create("c"+strconv.Itoa(i), MainName)
		if err != nil {
			b.Fatal(err)
		}
		f, _, err := v.Create("f", unix.O_WRONLY, 0o644, Owner{})
		if err != nil {
			b.Fatal(err)
		}
		f.WriteAt(data, 0)
		f.Close()
		b.StartTimer()
		if _, err := s.Commit(v.Name()); err != nil {
			b.Fatal(err)
		}
	}
}
