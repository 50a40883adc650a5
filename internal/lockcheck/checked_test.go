//go:build race

package lockcheck

import (
	"strings"
	"testing"
)

// panics runs fn and returns its panic's message, "" without one.
func panics(fn func()) (msg string) {
	defer func() {
		if r := recover(); r != nil {
			msg = r.(string)
		}
	}()
	fn()
	return ""
}

func TestOrderKept(t *testing.T) {
	var s RWMutex[Store]
	var open Mutex[NodeOpen]
	var pass Mutex[PassWriters]
	if msg := panics(func() {
		s.RLock()
		open.Lock()
		pass.Lock()
		s.AssertHeld()
		pass.Unlock()
		open.Unlock()
		s.RUnlock()
		s.Lock()
		s.AssertHeld()
		s.Unlock()
	}); msg != "" {
		t.Fatal(msg)
	}
}

func TestReadLockTwice(t *testing.T) {
	var s RWMutex[Store]
	s.RLock()
	defer s.RUnlock()
	msg := panics(s.RLock)
	if !strings.Contains(msg, "branch Store.mu (shared) again: a second read lock") || !strings.Contains(msg, "TestReadLockTwice") {
		t.Errorf("got %q", msg)
	}
}

func TestUpgrade(t *testing.T) {
	var s RWMutex[Store]
	s.RLock()
	defer s.RUnlock()
	if msg := panics(s.Lock); !strings.Contains(msg, "branch Store.mu again") {
		t.Errorf("got %q", msg)
	}
}

func TestInversion(t *testing.T) {
	var s RWMutex[Store]
	var open Mutex[NodeOpen]
	open.Lock()
	defer open.Unlock()
	if msg := panics(s.RLock); !strings.Contains(msg, "out of order") || !strings.Contains(msg, "It holds fs Node.openMu") {
		t.Errorf("got %q", msg)
	}
}

func TestLeavesDoNotNest(t *testing.T) {
	var a Mutex[ViewCache]
	var b Mutex[LayerDirs]
	a.Lock()
	defer a.Unlock()
	if msg := panics(b.Lock); !strings.Contains(msg, "beside another lock of its rank") {
		t.Errorf("got %q", msg)
	}
}

func TestUnlockedElsewhere(t *testing.T) {
	var s RWMutex[Store]
	s.Lock()
	done := make(chan struct{})
	go func() { s.Unlock(); close(done) }()
	<-done
	if msg := panics(func() { s.RLock(); s.AssertHeld(); s.RUnlock() }); msg != "" {
		t.Fatal(msg)
	}
}

func TestAssertHeld(t *testing.T) {
	var s RWMutex[Store]
	if msg := panics(s.AssertHeld); !strings.Contains(msg, "does not hold branch Store.mu") {
		t.Errorf("got %q", msg)
	}
	s.RLock()
	done := make(chan string)
	go func() { done <- panics(s.AssertHeld) }()
	if msg := <-done; msg == "" {
		t.Error("another goroutine's hold counted")
	}
	s.RUnlock()
}
