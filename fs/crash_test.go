package fs_test

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// commitScenario gives branch b changes of every kind and a live sibling s
// with a file of its own, for a commit that goes wrong.
func commitScenario(t *testing.T, m *mount) string {
	t.Helper()
	b := m.create("b")
	sibling := m.create("s")
	writeFile(t, filepath.Join(sibling, "sibling"), "s\n")
	writeFile(t, filepath.Join(b, "file"), "committed\n")
	must(t, os.Remove(filepath.Join(b, "dir", "a")))
	must(t, os.Rename(filepath.Join(b, "dir", "sub"), filepath.Join(b, "moved")))
	must(t, os.MkdirAll(filepath.Join(b, "newdir", "deep"), 0o755))
	writeFile(t, filepath.Join(b, "newdir", "deep", "x"), "x\n")
	return b
}

// wantOutcome checks that the base and the main view hold all of
// commitScenario's commit, or none of it.
func wantOutcome(t *testing.T, m *mount, committed bool) {
	t.Helper()
	for _, s := range []struct {
		path string
		new  string // content after the commit; "" means missing
		old  string // content before it
	}{
		{"file", "committed\n", "base file\n"},
		{"dir/a", "", "a\n"},
		{"dir/sub/b", "", "b\n"},
		{"moved/b", "b\n", ""},
		{"newdir/deep/x", "x\n", ""},
	} {
		want := s.old
		if committed {
			want = s.new
		}
		for _, root := range []string{m.base, m.mnt} {
			p := filepath.Join(root, s.path)
			if want == "" {
				wantMissing(t, p)
			} else {
				wantContent(t, p, want)
			}
		}
	}
}

// wantStates checks the state list reports for each branch named.
// wantStates checks the states list shows; "gone" says that a branch
// (a committed one) is not listed.
func wantStates(t *testing.T, m *mount, states map[string]string) {
	t.Helper()
	list := m.ok("list", m.mnt)
	for name, state := range states {
		found := state == "gone"
		for _, line := range strings.Split(list, "\n") {
			f := strings.Fields(line)
			if len(f) > 2 && f[0] == name {
				found = true
				if f[2] != state {
					t.Errorf("branch %s is %s, want %s", name, f[2], state)
				}
			}
		}
		if !found {
			t.Errorf("branch %s lost:\n%s", name, list)
		}
	}
}

// commitPoints are the failpoints of commitScenario's commit, in order.
func commitPoints() []string {
	points := []string{"commit-planned", "commit-journaled"}
	for i := 0; i < 6; i++ {
		points = append(points, "commit-step-"+strconv.Itoa(i))
	}
	return append(points, "commit-applied")
}

// TestCrashDuringCommit kills the daemon (SIGKILL, from inside, at a named
// step) during a commit, mounts again and checks that the base holds all
// of the commit or none of it, and that no branch was lost.
func TestCrashDuringCommit(t *testing.T) {
	for _, point := range append(commitPoints(), "commit-undo", "commit-rolled-back", "commit-epoch") {
		t.Run(point, func(t *testing.T) {
			env := "BRANCHFS_FAILPOINT=" + point
			if strings.HasPrefix(point, "commit-undo") || point == "commit-rolled-back" {
				// Kill it while it rolls back a step that failed.
				env = "BRANCHFS_FAILPOINT=commit-step-3=enospc," + point
			}
			m := newMount(t, "", env)
			b := commitScenario(t, m)
			if _, _, code := m.cli("commit", b); code == 0 {
				t.Fatalf("commit succeeded; the failpoint did not fire")
			}
			m.waitDead()
			m.env = nil
			m.start() // over the dead mount, as a user restarting would

			// Once journaled, a commit a crash interrupts is finished by
			// the next mount, also one that was rolling back.
			committed := point != "commit-planned"
			wantOutcome(t, m, committed)
			// Recovery rewrote the log as a snapshot: no commit is pending.
			if log := readFile(t, filepath.Join(m.store, "log")); strings.Contains(log, `"op":"commit"`) {
				t.Errorf("unfinished commit left in the log after recovery:\n%s", log)
			}
			if committed {
				wantStates(t, m, map[string]string{"b": "gone", "s": "stale"})
				return
			}
			// Nothing happened: both branches are live and whole.
			wantStates(t, m, map[string]string{"b": "live", "s": "live"})
			wantContent(t, filepath.Join(m.view("s"), "sibling"), "s\n")
			m.ok("commit", m.view("b"))
			wantContent(t, filepath.Join(m.base, "newdir", "deep", "x"), "x\n")
		})
	}
}
