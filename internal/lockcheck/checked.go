//go:build race

package lockcheck

import (
	"bytes"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"unsafe"
)

// Mutex is sync.Mutex, of rank R, checked.
type Mutex[R Rank] struct{ mu sync.Mutex }

func (m *Mutex[R]) Lock() {
	g := before(unsafe.Pointer(m), rankOf[R](), false)
	m.mu.Lock()
	taken(g, unsafe.Pointer(m), rankOf[R](), false)
}

func (m *Mutex[R]) TryLock() bool {
	if !m.mu.TryLock() {
		return false
	}
	taken(goid(), unsafe.Pointer(m), rankOf[R](), false)
	return true
}

func (m *Mutex[R]) Unlock() {
	released(unsafe.Pointer(m))
	m.mu.Unlock()
}

// RWMutex is sync.RWMutex, of rank R, checked.
type RWMutex[R Rank] struct{ mu sync.RWMutex }

func (m *RWMutex[R]) Lock() {
	g := before(unsafe.Pointer(m), rankOf[R](), false)
	m.mu.Lock()
	taken(g, unsafe.Pointer(m), rankOf[R](), false)
}

func (m *RWMutex[R]) TryLock() bool {
	if !m.mu.TryLock() {
		return false
	}
	taken(goid(), unsafe.Pointer(m), rankOf[R](), false)
	return true
}

func (m *RWMutex[R]) Unlock() {
	released(unsafe.Pointer(m))
	m.mu.Unlock()
}

func (m *RWMutex[R]) RLock() {
	g := before(unsafe.Pointer(m), rankOf[R](), true)
	m.mu.RLock()
	taken(g, unsafe.Pointer(m), rankOf[R](), true)
}

func (m *RWMutex[R]) RUnlock() {
	released(unsafe.Pointer(m))
	m.mu.RUnlock()
}

// AssertHeld panics unless the calling goroutine holds m, shared or
// exclusively.
func (m *RWMutex[R]) AssertHeld() {
	g := goid()
	mu.Lock()
	defer mu.Unlock()
	for _, h := range held[g] {
		if h.lock == unsafe.Pointer(m) {
			return
		}
	}
	_, name := rankOf[R]().rank()
	panic(fmt.Sprintf("lockcheck: goroutine %d does not hold %s, which it must here:\n%s", g, name, stack(callers(3))))
}

func rankOf[R Rank]() Rank {
	var r R
	return r
}

// A holding is a lock a goroutine holds.
type holding struct {
	lock   unsafe.Pointer
	rank   Rank
	shared bool
	at     []uintptr // where it was taken
}

var (
	mu   sync.Mutex
	held = map[int64][]holding{} // by goroutine
)

// before checks that goroutine may take lock, of rank r, and returns the
// goroutine's ID.
func before(lock unsafe.Pointer, r Rank, shared bool) int64 {
	g := goid()
	order, name := r.rank()
	mu.Lock()
	defer mu.Unlock()
	for _, h := range held[g] {
		hOrder, hName := h.rank.rank()
		if hOrder < order {
			continue
		}
		why := " out of order"
		switch {
		case h.lock == lock && shared && h.shared:
			why = " again: a second read lock waits for a writer that waits for the first"
		case h.lock == lock:
			why = " again"
		case hOrder == order:
			why = " beside another lock of its rank"
		}
		panic(fmt.Sprintf("lockcheck: goroutine %d takes %s%s%s, at\n%sIt holds %s%s, taken at\n%s",
			g, name, mode(shared), why, stack(callers(4)), hName, mode(h.shared), stack(h.at)))
	}
	return g
}

// taken records that goroutine g holds lock.
func taken(g int64, lock unsafe.Pointer, r Rank, shared bool) {
	h := holding{lock: lock, rank: r, shared: shared, at: callers(4)}
	mu.Lock()
	held[g] = append(held[g], h)
	mu.Unlock()
}

// released forgets the latest holding of lock: the calling goroutine's, or
// another's, since a lock may be released by another goroutine than the
// one that took it.
func released(lock unsafe.Pointer) {
	g := goid()
	mu.Lock()
	defer mu.Unlock()
	if drop(g, lock) {
		return
	}
	for other := range held {
		if drop(other, lock) {
			return
		}
	}
}

// drop forgets goroutine g's latest holding of lock. Preconditions: mu
// held.
func drop(g int64, lock unsafe.Pointer) bool {
	hs := held[g]
	for i := len(hs) - 1; i >= 0; i-- {
		if hs[i].lock == lock {
			hs = append(hs[:i], hs[i+1:]...)
			if len(hs) == 0 {
				delete(held, g)
			} else {
				held[g] = hs
			}
			return true
		}
	}
	return false
}

func mode(shared bool) string {
	if shared {
		return " (shared)"
	}
	return ""
}

// goid is the calling goroutine's ID, from the first line of its stack:
// "goroutine 12 [running]:".
func goid() int64 {
	var buf [64]byte
	b := buf[:runtime.Stack(buf[:], false)]
	b = bytes.TrimPrefix(b, []byte("goroutine "))
	if i := bytes.IndexByte(b, ' '); i >= 0 {
		b = b[:i]
	}
	id, err := strconv.ParseInt(string(b), 10, 64)
	if err != nil {
		panic("lockcheck: no goroutine ID in " + string(buf[:]))
	}
	return id
}

// callers is the stack from skip frames above it: the lock's caller at 4
// (runtime.Callers, callers, before or taken, the lock method).
func callers(skip int) []uintptr {
	pcs := make([]uintptr, 16)
	return pcs[:runtime.Callers(skip, pcs)]
}

func stack(pcs []uintptr) string {
	var b strings.Builder
	frames := runtime.CallersFrames(pcs)
	for {
		f, more := frames.Next()
		fmt.Fprintf(&b, "\t%s\n\t\t%s:%d\n", f.Function, f.File, f.Line)
		if !more {
			break
		}
	}
	return b.String()
}
