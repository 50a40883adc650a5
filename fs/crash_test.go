package fs_test

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestCrashDuringCommit kills the daemon (SIGKILL, from inside, at a named
// step) during a commit, mounts again and checks that the base holds all
// of the commit or none of it, and that no branch was lost.
func TestCrashDuringCommit(t *testing.T) {
	points := []string{"commit-planned", "commit-journaled"}
	for i := 0; i < 6; i++ {
		points = append(points, "commit-step-"+strconv.Itoa(i))
	}
	points = append(points, "commit-applied", "commit-epoch")
	for _, point := range points {
		t.Run(point, func(t *testing.T) {
			m := newMount(t, "", "BRANCHFS_FAILPOINT="+point)
			b := m.create("b")
			sibling := m.create("s")
			writeFile(t, filepath.Join(sibling, "sibling"), "s\n")
			writeFile(t, filepath.Join(b, "file"), "committed\n")
			must(t, os.Remove(filepath.Join(b, "dir", "a")))
			must(t, os.Rename(filepath.Join(b, "dir", "sub"), filepath.Join(b, "moved")))
			must(t, os.MkdirAll(filepath.Join(b, "newdir", "deep"), 0o755))
			writeFile(t, filepath.Join(b, "newdir", "deep", "x"), "x\n")
			if _, _, code := m.cli("commit", b); code == 0 {
				t.Fatalf("commit succeeded; the failpoint did not fire")
			}
			m.waitDead()
			m.env = nil
			m.start() // over the dead mount, as a user restarting would

			committed := point != "commit-planned"
			type state struct {
				path string
				new  string // content after the commit; "" means missing
				old  string // content before it
			}
			for _, s := range []state{
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
			// Recovery rewrote the log as a snapshot: no commit is pending.
			if log := readFile(t, filepath.Join(m.store, "log")); strings.Contains(log, `"op":"commit"`) {
				t.Errorf("unfinished commit left in the log after recovery:\n%s", log)
			}
			list := m.ok("list", m.mnt)
			wantState := func(name, state string) {
				t.Helper()
				for _, line := range strings.Split(list, "\n") {
					f := strings.Fields(line)
					if len(f) > 2 && f[0] == name {
						if f[2] != state {
							t.Errorf("branch %s is %s, want %s", name, f[2], state)
						}
						return
					}
				}
				t.Errorf("branch %s lost:\n%s", name, list)
			}
			if committed {
				wantState("b", "committed")
				wantState("s", "stale")
				return
			}
			// Nothing happened: both branches are live and whole.
			wantState("b", "live")
			wantState("s", "live")
			wantContent(t, filepath.Join(m.view("s"), "sibling"), "s\n")
			m.ok("commit", m.view("b"))
			wantContent(t, filepath.Join(m.base, "newdir", "deep", "x"), "x\n")
		})
	}
}
