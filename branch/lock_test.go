package branch

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
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

// TestTryCommandsWaitForNoOne: TryCreate, TryCommit and TryAbort fail
// with ErrWouldWait and change nothing while an operation holds the
// store's lock, and do what Create, Commit and Abort do once it is free.
func TestTryCommandsWaitForNoOne(t *testing.T) {
	s, base := newStore(t)
	a, err := s.Create("a", MainName)
	if err != nil {
		t.Fatal(err)
	}
	write(t, a, "new", "data")
	if _, err := s.Create("b", MainName); err != nil {
		t.Fatal(err)
	}
	tries := []struct {
		what string
		do   func() error
	}{
		{"create", func() error { _, err := s.TryCreate("c", MainName); return err }},
		{"commit", func() error { _, err := s.TryCommit("a"); return err }},
		{"abort", func() error { _, err := s.TryAbort("b", false); return err }},
	}
	before := s.List(true)
	// A long operation in flight, a copy-up of a large file, say.
	if err := s.Main().Lock(); err != nil {
		t.Fatal(err)
	}
	for _, try := range tries {
		if err := try.do(); !errors.Is(err, ErrWouldWait) {
			t.Errorf("%s while the lock is held: %v, want ErrWouldWait", try.what, err)
		}
	}
	s.Main().Unlock()
	if after := s.List(true); !reflect.DeepEqual(after, before) {
		t.Errorf("refused tries changed the branches from %+v to %+v", before, after)
	}
	if _, err := os.Lstat(filepath.Join(base, "new")); !os.IsNotExist(err) {
		t.Errorf("a refused commit reached the base: %v", err)
	}
	for _, try := range tries {
		if err := try.do(); err != nil {
			t.Errorf("%s with the lock free: %v", try.what, err)
		}
	}
	if data, err := os.ReadFile(filepath.Join(base, "new")); err != nil || string(data) != "data" {
		t.Errorf("the commit's file in the base: %q, %v", data, err)
	}
	var states []string
	for _, info := range s.List(true) {
		states = append(states, info.Name+":"+info.State)
	}
	// c, a sibling of a made before a's commit, is stale now.
	if got := strings.Join(states, " "); got != "main:live c:stale a:committed b:aborted" {
		t.Errorf("branches after the tries: %s; want c stale, a committed, b aborted", got)
	}
}
