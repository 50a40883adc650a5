package fs_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

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
			_, errOut, code := m.cli("commit", b)
			if code == 0 {
				t.Fatalf("commit succeeded; the failpoint did not fire")
			}
			if strings.Contains(errOut, "nothing was committed") {
				t.Errorf("a commit the daemon died in says: %s", errOut)
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
			if strings.HasPrefix(e.Name(), branch.StageName) {
				t.Errorf("%s in %s", e.Name(), dir)
			}
		}
	}
}

// TestCrashDuringOperation kills the daemon at each step of the operations
// that replace an entry of a branch (tombstones, opaque directories,
// copy-up, a new file over a deleted one) and checks after a restart that
// the operation that was cut short happened whole or not at all, and that
// nothing done before it was undone.
func TestCrashDuringOperation(t *testing.T) {
	type crashCase struct {
		point string
		// before runs operations that complete; op is cut short.
		before, op func(t *testing.T, b string)
		// check looks at the branch after the restart.
		check func(t *testing.T, b string)
	}
	rmBase := func(t *testing.T, b string) { must(t, os.Remove(filepath.Join(b, "dir", "sub", "b"))) }
	emptySubOrGone := func(t *testing.T, b string) {
		wantMissing(t, filepath.Join(b, "dir", "sub", "b"))
		if ents, err := os.ReadDir(filepath.Join(b, "dir", "sub")); err == nil && len(ents) > 0 {
			t.Errorf("dir/sub after the crash holds %v", ents)
		}
	}
	rmDir := func(t *testing.T, b string) { must(t, os.RemoveAll(filepath.Join(b, "dir"))) }
	mkDir := func(t *testing.T, b string) { os.Mkdir(filepath.Join(b, "dir"), 0o755) }
	newDirEmptyOrGone := func(t *testing.T, b string) {
		if ents, err := os.ReadDir(filepath.Join(b, "dir")); err == nil && len(ents) > 0 {
			t.Errorf("dir deleted and made again holds %v after the crash", ents)
		}
	}
	rmFile := func(t *testing.T, b string) { must(t, os.Remove(filepath.Join(b, "file"))) }
	cutRm := func(t *testing.T, b string) { os.Remove(filepath.Join(b, "file")) }
	newOrGone := func(p, want string) func(t *testing.T, b string) {
		return func(t *testing.T, b string) {
			if data, err := os.ReadFile(filepath.Join(b, p)); err == nil && string(data) != want {
				t.Errorf("%s after the crash = %q; want %q or missing", p, data, want)
			}
		}
	}
	cases := []crashCase{
		// unlink of a copied-up file that the base has too
		{"unlink-staged", func(t *testing.T, b string) { writeFile(t, filepath.Join(b, "file"), "branch\n") },
			cutRm, newOrGone("file", "branch\n")},
		{"unlink-placed", func(t *testing.T, b string) { writeFile(t, filepath.Join(b, "file"), "branch\n") },
			cutRm, func(t *testing.T, b string) { wantMissing(t, filepath.Join(b, "file")) }},
		// rmdir of a base directory emptied in the branch
		{"rmdir-staged", rmBase, func(t *testing.T, b string) { os.Remove(filepath.Join(b, "dir", "sub")) }, emptySubOrGone},
		{"rmdir-placed", rmBase, func(t *testing.T, b string) { os.Remove(filepath.Join(b, "dir", "sub")) },
			func(t *testing.T, b string) { wantMissing(t, filepath.Join(b, "dir", "sub")) }},
		// rm -rf dir; mkdir dir
		{"mkdir-staged", rmDir, mkDir, newDirEmptyOrGone},
		{"mkdir-placed", rmDir, mkDir, func(t *testing.T, b string) {
			newDirEmptyOrGone(t, b)
			if _, err := os.Stat(filepath.Join(b, "dir")); err != nil {
				t.Errorf("dir made again: %v", err)
			}
		}},
		// a new file where a base file was deleted
		{"create-staged", rmFile, func(t *testing.T, b string) { os.WriteFile(filepath.Join(b, "file"), []byte("new\n"), 0o644) },
			newOrGone("file", "")},
		{"create-placed", rmFile, func(t *testing.T, b string) { os.WriteFile(filepath.Join(b, "file"), []byte("new\n"), 0o644) },
			newOrGone("file", "")},
		// rename of a changed base file: both names may show it, the old
		// name never shows the base's version
		{"rename-linked", func(t *testing.T, b string) { writeFile(t, filepath.Join(b, "file"), "branch\n") },
			func(t *testing.T, b string) { os.Rename(filepath.Join(b, "file"), filepath.Join(b, "renamed")) },
			func(t *testing.T, b string) {
				wantContent(t, filepath.Join(b, "renamed"), "branch\n")
				newOrGone("file", "branch\n")(t, b)
			}},
		// rename of a base directory with a deleted entry
		{"rename-staged", func(t *testing.T, b string) { must(t, os.Remove(filepath.Join(b, "dir", "a"))) },
			func(t *testing.T, b string) { os.Rename(filepath.Join(b, "dir"), filepath.Join(b, "moved")) },
			func(t *testing.T, b string) {
				wantMissing(t, filepath.Join(b, "dir", "a"))
				wantMissing(t, filepath.Join(b, "moved", "a"))
				wantContent(t, filepath.Join(b, "dir", "sub", "b"), "b\n")
			}},
		// a new file renamed over a deleted base file
		{"rename-exchanged", func(t *testing.T, b string) {
			writeFile(t, filepath.Join(b, "new"), "new\n")
			rmFile(t, b)
		}, func(t *testing.T, b string) { os.Rename(filepath.Join(b, "new"), filepath.Join(b, "file")) },
			func(t *testing.T, b string) {
				wantContent(t, filepath.Join(b, "file"), "new\n")
				wantMissing(t, filepath.Join(b, "new"))
			}},
		// copy-up of a directory for a chmod: never half made
		{"copyup-staged", func(t *testing.T, b string) { must(t, os.Remove(filepath.Join(b, "file"))) },
			func(t *testing.T, b string) { os.Chmod(filepath.Join(b, "dir", "sub"), 0o700) },
			func(t *testing.T, b string) {
				wantMissing(t, filepath.Join(b, "file"))
				for _, p := range []string{"dir", "dir/sub"} {
					if fi, err := os.Stat(filepath.Join(b, p)); err != nil || fi.Mode().Perm() != 0o755 {
						t.Errorf("%s after the crash: %v %v", p, fi.Mode(), err)
					}
				}
				wantContent(t, filepath.Join(b, "dir", "sub", "b"), "b\n")
			}},
		// copy-up of a file for a write: the name shows the base's file
		// or the whole copy
		{"copyup-staged", func(t *testing.T, b string) { writeFile(t, filepath.Join(b, "new"), "new\n") },
			func(t *testing.T, b string) { os.WriteFile(filepath.Join(b, "file"), []byte("written\n"), 0o644) },
			func(t *testing.T, b string) {
				wantContent(t, filepath.Join(b, "new"), "new\n")
				wantContent(t, filepath.Join(b, "file"), "base file\n")
			}},
	}
	for _, c := range cases {
		t.Run(c.point, func(t *testing.T) {
			t.Parallel() // each waits mostly for its daemons to start and stop
			m := newMount(t, "", "BRANCHFS_FAILPOINT="+c.point)
			b := m.create("b")
			c.before(t, b)
			c.op(t, b)
			m.waitDead()
			m.env = nil
			m.start()
			c.check(t, m.view("b"))
			wantContent(t, filepath.Join(m.base, "file"), "base file\n")
			wantContent(t, filepath.Join(m.base, "dir", "sub", "b"), "b\n")
		})
	}
}

// TestUnprivilegedCrashApart: an ordinary user whose base is a mount root
// (a bind mount) and whose $XDG_STATE_HOME is a tmpfs gets a default store
// there, apart from the base; a commit the daemon dies in is finished by
// the next mount, with nothing of the stage left in the base.
func TestUnprivilegedCrashApart(t *testing.T) {
	if _, err := exec.LookPath("fusermount3"); err != nil {
		t.Fatal("fusermount3 (Debian package fuse3) is needed: .ci/run installs it")
	}
	dir := t.TempDir()
	must(t, os.Chmod(dir, 0o755))
	must(t, os.Chmod(filepath.Dir(dir), 0o755))
	home := filepath.Join(dir, "home")
	src, base, mnt := filepath.Join(home, "src"), filepath.Join(home, "base"), filepath.Join(home, "mnt")
	must(t, os.MkdirAll(mnt, 0o755))
	must(t, os.MkdirAll(base, 0o755))
	sampleTree(t, src)
	state, err := os.MkdirTemp("/dev/shm", "branchfs-state")
	must(t, err)
	t.Cleanup(func() { os.RemoveAll(state) })
	for _, root := range []string{home, state} {
		must(t, filepath.Walk(root, func(p string, _ os.FileInfo, err error) error {
			if err != nil {
				return err
			}
			return os.Lchown(p, userUID, userUID)
		}))
	}
	if out, err := exec.Command("mount", "--bind", src, base).CombinedOutput(); err != nil {
		t.Skipf("mount --bind: %v: %s", err, out)
	}
	t.Cleanup(func() { unix.Unmount(base, unix.MNT_DETACH) })
	as := func(env []string, name string, args ...string) (string, error) {
		cmd := exec.Command("setpriv", append([]string{"--reuid=65534", "--regid=65534", "--clear-groups", "--", name}, args...)...)
		cmd.Env = append([]string{"HOME=" + home, "PATH=" + os.Getenv("PATH"), "XDG_STATE_HOME=" + state, "GORACE=" + os.Getenv("GORACE")}, env...)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	ok := func(name string, args ...string) {
		t.Helper()
		if out, err := as(nil, name, args...); err != nil {
			t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
		}
	}
	t.Cleanup(func() {
		if mountEntry(t, mnt) != "" {
			as(nil, binary, "unmount", mnt)
			unix.Unmount(mnt, unix.MNT_DETACH)
		}
	})
	if out, err := as([]string{"BRANCHFS_FAILPOINT=commit-step-2"}, binary, "mount", "--base", base, mnt); err != nil {
		t.Fatalf("mount: %v: %s", err, out)
	}
	pidFile, _ := filepath.Glob(filepath.Join(state, "branchfs", "*", "daemon.pid"))
	if len(pidFile) != 1 {
		t.Fatalf("default store under $XDG_STATE_HOME/branchfs: %v", pidFile)
	}
	data, err := os.ReadFile(pidFile[0])
	must(t, err)
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	must(t, err)
	ok(binary, "create", "b", mnt)
	b := filepath.Join(mnt, "@b")
	ok("sh", "-c", `echo committed > "$0"/file && rm "$0"/dir/a && mv "$0"/dir/sub "$0"/moved &&
		mkdir -p "$0"/newdir/deep && echo x > "$0"/newdir/deep/x`, b)
	if out, err := as(nil, binary, "commit", b); err == nil {
		t.Fatalf("commit succeeded; the failpoint did not fire: %s", out)
	}
	for deadline := time.Now().Add(10 * time.Second); ; {
		stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil || strings.Contains(string(stat), ") Z ") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the daemon did not die at the failpoint")
		}
		time.Sleep(5 * time.Millisecond)
	}
	ok(binary, "mount", "--base", base, mnt)
	// The mount is the user's alone: root checks the base, the user the
	// main view.
	m := &mount{t: t, base: base, mnt: base}
	wantOutcome(t, m, true)
	wantNoStage(t, m)
	if out, err := as(nil, "sh", "-c", `cat "$0"/file "$0"/newdir/deep/x; ls -A "$0"`, mnt); err != nil ||
		out != "committed\nx\ndir\nfile\nlink\nmoved\nnewdir\n" {
		t.Errorf("main view after the remount: %v: %q", err, out)
	}
	ok(binary, "unmount", mnt)
}
