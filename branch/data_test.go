package branch

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// stageWith stages an entry holding one file, f, of content, and returns
// its base name.
func stageWith(t *testing.T, store, content string) string {
	t.Helper()
	dir, err := StageData(store)
	mustOK(t, err)
	mustOK(t, os.WriteFile(filepath.Join(dir, "f"), []byte(content), 0o600))
	return filepath.Base(dir)
}

// Entries enter by generation, whole, each area on its own; a staged one
// is not an entry, and what is not a published generation is not listed.
func TestDataPublishInOrder(t *testing.T) {
	s, _ := newStore(t)
	_, err := s.Create("a", MainName)
	mustOK(t, err)
	if gens, err := DataEntries(s.Dir(), "a", "images"); err != nil || len(gens) != 0 {
		t.Fatalf("no entry yet: %v %v", gens, err)
	}
	for i, content := range []string{"one", "two"} {
		gen, err := s.PublishData("a", "images", stageWith(t, s.Dir(), content))
		if err != nil || gen != i+1 {
			t.Fatalf("entry %d: gen %d, %v", i, gen, err)
		}
	}
	if gen, err := s.PublishData("a", "logs", stageWith(t, s.Dir(), "log")); err != nil || gen != 1 {
		t.Fatalf("another area: gen %d, %v", gen, err)
	}
	staged := stageWith(t, s.Dir(), "unpublished")
	area := DataAreaDir(s.Dir(), "a", "images")
	mustOK(t, os.Mkdir(filepath.Join(area, "junk"), 0o700))
	mustOK(t, os.Mkdir(filepath.Join(area, "07"), 0o700))
	mustOK(t, os.WriteFile(filepath.Join(area, "8"), nil, 0o600))
	gens, err := DataEntries(s.Dir(), "a", "images")
	if err != nil || !slices.Equal(gens, []int{1, 2}) {
		t.Fatalf("entries: %v %v", gens, err)
	}
	if data, err := os.ReadFile(filepath.Join(DataEntryDir(s.Dir(), "a", "images", 2), "f")); err != nil || string(data) != "two" {
		t.Fatalf("entry 2 holds %q, %v", data, err)
	}
	if _, err := os.Stat(filepath.Join(DataStageDir(s.Dir()), staged)); err != nil {
		t.Errorf("the unpublished entry: %v", err)
	}
}

// Publishing refuses what is not a staged entry, main, and a branch that
// is not live, and leaves nothing behind.
func TestPublishDataRefuses(t *testing.T) {
	s, _ := newStore(t)
	// b and stale are children of a: b's commit makes stale stale and
	// leaves a live.
	for _, c := range [][2]string{{"a", MainName}, {"gone", MainName}, {"b", "a"}, {"stale", "a"}} {
		_, err := s.Create(c[0], c[1])
		mustOK(t, err)
	}
	_, err := s.Abort("gone", false)
	mustOK(t, err)
	_, err = s.Commit("b")
	mustOK(t, err)
	good := stageWith(t, s.Dir(), "x")
	file := filepath.Join(DataStageDir(s.Dir()), "plain")
	mustOK(t, os.WriteFile(file, nil, 0o600))
	mustOK(t, os.Symlink(filepath.Join(DataStageDir(s.Dir()), good), filepath.Join(DataStageDir(s.Dir()), "link")))
	for _, c := range []struct {
		name, area, staged string
		errno              syscall.Errno
	}{
		{"a", "", good, syscall.EINVAL},
		{"a", "Images", good, syscall.EINVAL},
		{"a", "../x", good, syscall.EINVAL},
		{"a", "images", "", syscall.EINVAL},
		{"a", "images", "..", syscall.EINVAL},
		{"a", "images", "../" + good, syscall.EINVAL},
		{"a", "images", "nothing", syscall.EINVAL},
		{"a", "images", "plain", syscall.EINVAL},
		{"a", "images", "link", syscall.EINVAL},
		{MainName, "images", good, syscall.EINVAL},
		{"nosuch", "images", good, syscall.ENOENT},
		{"gone", "images", good, syscall.ENOENT}, // an ended branch is forgotten
		{"b", "images", good, syscall.ENOENT},
		{"stale", "images", good, syscall.ESTALE},
	} {
		_, err := s.PublishData(c.name, c.area, c.staged)
		if got, _ := Errno(err); got != c.errno {
			t.Errorf("%s %q %q: %v (%v), want %v", c.name, c.area, c.staged, err, got, c.errno)
		}
	}
	for _, n := range []string{"a", "b", "gone", "stale", MainName, "nosuch"} {
		if _, err := os.Stat(BranchDataDir(s.Dir(), n)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("a refused publish left data of %s: %v", n, err)
		}
	}
	if _, err := s.PublishData("stale", "images", good); !errors.Is(err, ErrStale) {
		t.Errorf("publish in a stale branch: %v", err)
	}
	if _, err := os.Stat(filepath.Join(DataStageDir(s.Dir()), good)); err != nil {
		t.Errorf("a refused entry is still the caller's: %v", err)
	}
}

// A branch's data goes with it when it is aborted or committed.
func TestDataGoesWithTheBranch(t *testing.T) {
	for _, end := range []string{"abort", "commit"} {
		t.Run(end, func(t *testing.T) {
			s, _ := newStore(t)
			_, err := s.Create("a", MainName)
			mustOK(t, err)
			_, err = s.PublishData("a", "images", stageWith(t, s.Dir(), "x"))
			mustOK(t, err)
			if end == "abort" {
				_, err = s.Abort("a", false)
			} else {
				_, err = s.Commit("a")
			}
			mustOK(t, err)
			s.Close() // empties what waits for the trash
			if _, err := os.Stat(BranchDataDir(s.Dir(), "a")); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("after %s, the branch's data is still there: %v", end, err)
			}
		})
	}
}

// AddDataFile adds a file once: whoever comes first writes it, whole, and
// every later or racing caller leaves it as it is.
func TestAddDataFile(t *testing.T) {
	s, _ := newStore(t)
	_, err := s.Create("a", MainName)
	mustOK(t, err)
	gen, err := s.PublishData("a", "images", stageWith(t, s.Dir(), "pages"))
	mustOK(t, err)
	dir := DataEntryDir(s.Dir(), "a", "images", gen)
	first, err := AddDataFile(dir, "ws.img", []byte("first"))
	if err != nil || !first {
		t.Fatalf("first add: %v, %v", first, err)
	}
	again, err := AddDataFile(dir, "ws.img", []byte("second"))
	if err != nil || again {
		t.Errorf("second add: %v, %v; want false", again, err)
	}
	const racers = 8
	var wg sync.WaitGroup
	won := make([]bool, racers)
	errs := make([]error, racers)
	for i := range racers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			won[i], errs[i] = AddDataFile(dir, "race.img", []byte(fmt.Sprint("racer ", i)))
		}()
	}
	wg.Wait()
	winner := slices.Index(won, true)
	if winner < 0 || slices.Index(won[winner+1:], true) >= 0 {
		t.Errorf("winners among the racers: %v", won)
	}
	for i, err := range errs {
		if err != nil {
			t.Errorf("racer %d: %v", i, err)
		}
	}
	for name, want := range map[string]string{"ws.img": "first", "race.img": fmt.Sprint("racer ", winner)} {
		if data, err := os.ReadFile(filepath.Join(dir, name)); err != nil || string(data) != want {
			t.Errorf("%s = %q, %v; want %q", name, data, err, want)
		}
	}
	ents, err := os.ReadDir(dir)
	mustOK(t, err)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if want := []string{"f", "race.img", "ws.img"}; !slices.Equal(names, want) {
		t.Errorf("the entry holds %q, want %q: no temporary file left", names, want)
	}
	if _, err := AddDataFile(filepath.Join(s.Dir(), "nothing"), "x", nil); err == nil {
		t.Error("AddDataFile into a missing entry succeeded")
	}
}

// An area's name is a lowercase letter, then up to 63 lowercase letters,
// digits and dashes.
func TestAreaNames(t *testing.T) {
	for area, ok := range map[string]bool{
		"images": true, "a": true, "a-1": true, "z" + strings.Repeat("9", 63): true,
		"": false, "1a": false, "-a": false, "Images": false, "a_b": false, "a.b": false, "a/b": false,
		"z" + strings.Repeat("9", 64): false, "é": false, "a\x00": false,
	} {
		if got := validArea(area); got != ok {
			t.Errorf("validArea(%q) = %v, want %v", area, got, ok)
		}
	}
}
