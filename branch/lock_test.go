package branch

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestTrashEmptyingQueuesForNoOne: the background emptying of the trash
// after an abort does not wait for the store's lock while an operation
// holds it: waiting, it would make every operation that comes later wait
// for that one too, since Go's RWMutex lets no reader past a waiting
// writer. It empties the trash once the lock is free.
func TestTrashEmptyingQueuesForNoOne(t *testing.T) {
	s, _ := newStore(t)
	a, err := s.Create("a", MainName)
	if err != nil {
		t.Fatal(err)
	}
	write(t, a, "new", "data")
	if _, err := s.Abort("a", false); err != nil {
		t.Fatal(err)
	}
	// A long operation in flight, a copy-up of a large file, say.
	if err := s.Main().Lock(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { s.emptyTrash(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		s.Main().Unlock()
		<-done
		t.Fatal("the trash's emptying waited for an operation in flight")
	}
	s.Main().Unlock()
	delta := filepath.Join(s.Dir(), "deltas", "a")
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		trash, _ := os.ReadDir(filepath.Join(s.Dir(), "trash"))
		if _, err := os.Lstat(delta); os.IsNotExist(err) && len(trash) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the aborted branch's delta stays: %v, %d in the trash", err, len(trash))
		}
	}
}
