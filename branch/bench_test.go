package branch

import (
	"fmt"
	"os"
	"path/filepath"
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

// BenchmarkStatMergedDir measures Stat of a directory that merges the base
// and a branch's layer, holding n subdirectories: from the view's cache,
// and counting its links again (countLinks), as the first Stat after a
// mkdir, rmdir, rename or commit in the view does.
func BenchmarkStatMergedDir(b *testing.B) {
	for _, n := range []int{20, 2000} {
		for _, count := range []bool{false, true} {
			b.Run(fmt.Sprintf("subdirs=%d/count=%v", n, count), func(b *testing.B) {
				s, base := newStore(b)
				for i := 0; i < n; i++ {
					if err := os.MkdirAll(filepath.Join(base, "D", strconv.Itoa(i)), 0o755); err != nil {
						b.Fatal(err)
					}
				}
				v, err := s.Create("b", MainName)
				if err != nil {
					b.Fatal(err)
				}
				if err := v.Lock(); err != nil {
					b.Fatal(err)
				}
				defer v.Unlock()
				if _, err := v.Mkdir("D/new", 0o755, Owner{}); err != nil {
					b.Fatal(err)
				}
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					if count {
						v.invalidate()
					}
					if _, err := v.Stat("D"); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
