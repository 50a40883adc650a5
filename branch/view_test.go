package branch

import (
	"os"
	"testing"
)

// CheckWritable is a check: it makes no delta directory; the first write
// does.
func TestCheckWritableChangesNothing(t *testing.T) {
	s, _ := newStore(t)
	v, err := s.Create("b", MainName)
	if err != nil {
		t.Fatal(err)
	}
	if err := v.CheckWritable(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(s.deltaDir("b")); !os.IsNotExist(err) {
		t.Fatalf("delta directory after CheckWritable: %v", err)
	}
	write(t, v, "g", "g")
	if _, err := os.Lstat(s.deltaDir("b")); err != nil {
		t.Fatalf("delta directory after a write: %v", err)
	}
}
