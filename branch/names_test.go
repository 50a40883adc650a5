package branch

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// logUsed is how many bytes of records the state log holds.
func logUsed(t *testing.T, s *Store) int {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(s.Dir(), "log"))
	if err != nil {
		t.Fatal(err)
	}
	return len(bytes.TrimRight(data, "\x00"))
}

func names(list []Info) string {
	var out []string
	for _, in := range list {
		out = append(out, in.Name+":"+in.State)
	}
	return strings.Join(out, " ")
}

// Finished branches leave List and the log, which is compacted as it
// grows; live branches, epochs and the name counter survive compaction
// and a remount.
func TestLogStaysBounded(t *testing.T) {
	s, base := newStore(t)
	_, err := s.Create("", MainName)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := s.Create("c", MainName)
	write(t, c, "new", "n")
	if _, err := s.Commit("c"); err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("x", 120)
	for i := 0; i < 3000; i++ {
		if _, err := s.Create(long, MainName); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Abort(long, false); err != nil {
			t.Fatal(err)
		}
	}
	if used := logUsed(t, s); used > compactMin+4096 {
		t.Errorf("log holds %d bytes after 3000 aborted branches", used)
	}
	if got := names(s.List(false)); got != "main:live branch-1:stale" {
		t.Errorf("List: %s", got)
	}
	if all := names(s.List(true)); !strings.Contains(all, long+":aborted") || len(s.List(true)) != 2+historyMax {
		t.Errorf("List(true) holds %d entries", len(s.List(true)))
	}
	s = reopen(t, s)
	if got := names(s.List(false)); got != "main:live branch-1:stale" {
		t.Errorf("List after a remount: %s", got)
	}
	if data, _ := os.ReadFile(filepath.Join(base, "new")); string(data) != "n" {
		t.Errorf("base new = %q", data)
	}
	// The stale branch-1 made main's epoch 1 its parent's; a new branch
	// must be live, and its generated name new.
	v, err := s.Create("", MainName)
	if err != nil || v.Name() != "branch-2" || v.Check() != nil {
		t.Errorf("generated %v %v, want a live branch-2", v.Name(), err)
	}
}
