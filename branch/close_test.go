package branch

import (
	"errors"
	"os"
	"testing"
)

// Close tells of a failure to close the state log or the lock: here, the
// second close of a store.
func TestCloseReports(t *testing.T) {
	s, _ := newStore(t)
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := s.Close(); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("second Close: %v, want %v", err, os.ErrClosed)
	}
}
