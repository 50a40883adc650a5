//go:build !race

package lockcheck

import "sync"

// Mutex is sync.Mutex, of rank R.
type Mutex[R Rank] struct{ sync.Mutex }

// RWMutex is sync.RWMutex, of rank R.
type RWMutex[R Rank] struct{ sync.RWMutex }

// AssertHeld checks, in race-enabled builds, that the calling goroutine
// holds m, shared or exclusively.
func (m *RWMutex[R]) AssertHeld() {}
