package fs_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/branchfs/branchfs/branch"
	"golang.org/x/sys/unix"
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

// storeLayouts are where the crash and fault tests put base and store:
// both on one mount; the store on a tmpfs apart from the base; the base a
// bind mount (a mount root, as Docker's are) with the default store.
var storeLayouts = []string{"same", "apart", "bind"}

// newMountLayout is newMount with the base and store placed as layout says.
func newMountLayout(t *testing.T, layout string, env ...string) *mount {
	t.Helper()
	if layout == "same" {
		return newMount(t, "", env...)
	}
	dir := t.TempDir()
	m := &mount{t: t, base: filepath.Join(dir, "base"), mnt: filepath.Join(dir, "mnt"), env: env}
	must(t, os.MkdirAll(m.mnt, 0o755))
	switch layout {
	case "apart":
		store, err := os.MkdirTemp("/dev/shm", "branchfs-store")
		if err != nil {
			t.Skipf("no /dev/shm: %v", err)
		}
		t.Cleanup(func() { os.RemoveAll(store) })
		m.store = store
		sampleTree(t, m.base)
	case "bind":
		src := filepath.Join(dir, "src")
		sampleTree(t, src)
		must(t, os.MkdirAll(m.base, 0o755))
		if out, err := exec.Command("mount", "--bind", src, m.base).CombinedOutput(); err != nil {
			t.Skipf("mount --bind: %v: %s", err, out)
		}
		t.Cleanup(func() { unix.Unmount(m.base, unix.MNT_DETACH) })
	}
	before, _ := filepath.Glob("/var/lib/branchfs/*")
	m.start()
	if m.store == "" {
		// The default store: the directory the mount made, named after
		// the mount point.
		name := strings.Trim(strings.ReplaceAll(m.mnt, "/", "-"), "-")
		name = name[max(0, len(name)-60):]
		after, _ := filepath.Glob("/var/lib/branchfs/*")
		for _, p := range after {
			if !slices.Contains(before, p) && strings.HasPrefix(filepath.Base(p), name) {
				m.store = p
			}
		}
		if m.store == "" {
			t.Fatalf("no default store made under /var/lib/branchfs")
		}
		store := m.store
		t.Cleanup(func() { os.RemoveAll(store) })
	}
	t.Cleanup(m.cleanup)
	return m
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
	for _, layout := range storeLayouts {
		t.Run(layout, func(t *testing.T) {
			t.Parallel()
			testCrashDuringCommit(t, layout)
		})
	}
}

func testCrashDuringCommit(t *testing.T, layout string) {
	for _, point := range append(commitPoints(), "commit-undo", "commit-rolled-back", "commit-epoch") {
		t.Run(point, func(t *testing.T) {
			env := "BRANCHFS_FAILPOINT=" + point
			if strings.HasPrefix(point, "commit-undo") || point == "commit-rolled-back" {
				// Kill it while it rolls back a step that failed.
				env = "BRANCHFS_FAILPOINT=commit-step-3=enospc," + point
			}
			m := newMountLayout(t, layout, env)
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
				wantNoStage(t, m)
				return
			}
			// Nothing happened: both branches are live and whole.
			wantStates(t, m, map[string]string{"b": "live", "s": "live"})
			wantContent(t, filepath.Join(m.view("s"), "sibling"), "s\n")
			m.ok("commit", m.view("b"))
			wantContent(t, filepath.Join(m.base, "newdir", "deep", "x"), "x\n")
			wantNoStage(t, m)
		})
	}
}

// wantNoStage checks that no commit's stage is left in the base, and that
// no view shows one.
func wantNoStage(t *testing.T, m *mount) {
	t.Helper()
	for _, dir := range []string{m.base, m.mnt} {
		names, err := os.ReadDir(dir)
		must(t, err)
		for _, e := range names {
			if e.Name() == branch.StageName {
				t.Errorf("%s in %s", branch.StageName, dir)
			}
		}
	}
}
