package branch

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// replayEnv makes the test binary a process that commits branch b of the
// store it names and dies, as by kill -9, at a step of that commit.
const replayEnv = "BRANCHFS_TEST_COMMIT_KILLED_AT"

// TestCommitKilledHelper is that process; run alone it does nothing.
func TestCommitKilledHelper(t *testing.T) {
	spec := os.Getenv(replayEnv)
	if spec == "" {
		t.Skip("runs as a helper of TestCommitReplay")
	}
	step, dirs, _ := strings.Cut(spec, ":")
	dir, base, _ := strings.Cut(dirs, ":")
	s, err := Open(dir, base, Options{})
	if err != nil {
		t.Fatal(err)
	}
	failHook = func(s string) error {
		if s == step {
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {}
		}
		return nil
	}
	_, err = s.Commit("b")
	t.Fatalf("step %s not reached; commit: %v", step, err)
}

// killCommitAt runs a process that commits branch b of s's store (closed)
// and is killed at step.
func killCommitAt(t *testing.T, s *Store, step string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestCommitKilledHelper$", "-test.count=1")
	cmd.Env = append(os.Environ(), replayEnv+"="+step+":"+s.Dir()+":"+s.Base())
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("the helper was not killed at %s: %v\n%s", step, err, out)
	}
}

// TestCommitReplay kills a process at each step of a commit of many kinds
// of change and opens the store again, as the next mount does: the base
// then holds all of the commit, when its journal was written, or none of
// it; the branches are as the commit's outcome says.
func TestCommitReplay(t *testing.T) {
	for _, c := range []struct {
		step      string
		committed bool
	}{
		{"commit-planned", false},
		{"commit-staged", false},
		{"commit-journaled", true},
		{"commit-step-0", true},
		{"commit-step-3", true},
		{"commit-step-5", true},
		{"commit-applied", true},
		{"commit-epoch", true},
	} {
		for _, layout := range layouts {
			t.Run(c.step+"-"+layout, func(t *testing.T) {
				s, base := newBigStore(t, layout)
				b, _ := s.Create("b", MainName)
				if _, err := s.Create("s", MainName); err != nil {
					t.Fatal(err)
				}
				changeMuch(t, b)
				baseBefore := treeOf(t, base)
				branchView := viewTree(t, b, "", nil)
				s.Close()

				killCommitAt(t, s, c.step)
				s = reopen(t, s)
				states := map[string]string{}
				for _, in := range s.List(false) {
					states[in.Name] = in.State
				}
				if c.committed {
					if d := diffTrees(branchView, viewTree(t, s.Main(), "", nil)); d != "" {
						t.Errorf("main after the replay differs from the branch committed: %s", d)
					}
					if states["s"] != "stale" || states["b"] != "" {
						t.Errorf("branches after the replay: %v, want s stale and b gone", states)
					}
				} else {
					if d := diffTrees(baseBefore, treeOf(t, base)); d != "" {
						t.Errorf("base changed by a commit that did not happen: %s", d)
					}
					v, err := s.View("b")
					if err != nil {
						t.Fatal(err)
					}
					if d := diffTrees(branchView, viewTree(t, v, "", nil)); d != "" {
						t.Errorf("branch changed by a commit that did not happen: %s", d)
					}
					if states["s"] != "live" || states["b"] != "live" {
						t.Errorf("branches after the next mount: %v, want b and s live", states)
					}
				}
				if left := stagesIn(t, base); len(left) > 0 {
					t.Errorf("stages left in the base: %v", left)
				}
			})
		}
	}
}

// A commit into a base apart from the store is killed half-way, and its
// stage in the base is then missing, or another user's directory (holding
// files of the stage's names) or symlink stands at its name: the next
// mount neither takes what is missing for steps done nor uses what the
// foreign entry holds. It finishes the commit from the branch's delta,
// leaves the foreign entry alone, and loses no branch.
func TestReplayForeignStage(t *testing.T) {
	for _, kind := range []string{"missing", "directory", "symlink"} {
		t.Run(kind, func(t *testing.T) {
			s, base := newBigStore(t, "apart")
			b, _ := s.Create("b", MainName)
			if _, err := s.Create("s", MainName); err != nil {
				t.Fatal(err)
			}
			changeMuch(t, b)
			branchView := viewTree(t, b, "", nil)
			s.Close()
			killCommitAt(t, s, "commit-step-3")
			stage := foreignStage(t, base, kind)

			s = reopen(t, s)
			if d := diffTrees(branchView, viewTree(t, s.Main(), "", nil)); d != "" {
				t.Errorf("main after the replay differs from the branch committed: %s", d)
			}
			states := map[string]string{}
			for _, in := range s.List(false) {
				states[in.Name] = in.State
			}
			if states["s"] != "stale" || states["b"] != "" {
				t.Errorf("branches after the replay: %v, want s stale and b gone", states)
			}
			wantForeignKept(t, stage, kind)
		})
	}
}

// foreignStage does to the one stage in base what kind says: removes it,
// or moves it away and puts a directory or symlink of user 65534 at its
// name, the directory holding a file "evil" for each name the stage held.
// It returns the stage's path.
func foreignStage(t *testing.T, base, kind string) string {
	t.Helper()
	stages := stagesIn(t, base)
	if len(stages) != 1 {
		t.Fatalf("stages in the base of a commit killed half-way: %v", stages)
	}
	p := filepath.Join(base, stages[0])
	if kind == "missing" {
		if err := os.RemoveAll(p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	ents, err := os.ReadDir(p)
	if err != nil || len(ents) == 0 {
		t.Fatalf("stage %s: %v %v", p, ents, err)
	}
	if err := os.Rename(p, p+".moved"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(p + ".moved") })
	if kind == "symlink" {
		if err := os.Symlink(t.TempDir(), p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	if err := os.Mkdir(p, 0o777); err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if err := os.WriteFile(filepath.Join(p, e.Name()), []byte("evil"), 0o666); err != nil {
			t.Fatal(err)
		}
		os.Lchown(filepath.Join(p, e.Name()), 65534, 65534)
	}
	if err := os.Lchown(p, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	return p
}

// wantForeignKept checks that what foreignStage put at stage is as it was.
func wantForeignKept(t *testing.T, stage, kind string) {
	t.Helper()
	switch kind {
	case "directory":
		ents, err := os.ReadDir(stage)
		if err != nil || len(ents) == 0 {
			t.Errorf("the foreign directory at %s: %v, %v", stage, ents, err)
		}
		for _, e := range ents {
			if data, err := os.ReadFile(filepath.Join(stage, e.Name())); string(data) != "evil" {
				t.Errorf("%s in the foreign directory: %q, %v", e.Name(), data, err)
			}
		}
	case "symlink":
		target, err := os.Readlink(stage)
		if err != nil {
			t.Fatalf("the foreign symlink: %v", err)
		}
		if ents, _ := os.ReadDir(target); len(ents) > 0 {
			t.Errorf("the mount wrote into the directory a foreign symlink names: %v", ents)
		}
	}
}

// A mount that must finish a commit whose stage is missing, and cannot
// (a step fails), fails and names the stage; the next one finishes it.
func TestReplayForeignStageFails(t *testing.T) {
	s, base := newBigStore(t, "apart")
	b, _ := s.Create("b", MainName)
	changeMuch(t, b)
	branchView := viewTree(t, b, "", nil)
	s.Close()
	killCommitAt(t, s, "commit-step-3")
	stage := foreignStage(t, base, "missing")
	setFailHook(t, failAt("commit-step-4", unix.EIO))
	if s2, err := Open(s.Dir(), base, Options{}); err == nil {
		s2.Close()
		t.Fatalf("a mount that could not finish the commit succeeded")
	} else if !strings.Contains(err.Error(), stage) || !errors.Is(err, unix.EIO) {
		t.Errorf("the mount says: %v; want the stage %s named, and EIO", err, stage)
	}
	failHook = nil
	s = reopen(t, s)
	if d := diffTrees(branchView, viewTree(t, s.Main(), "", nil)); d != "" {
		t.Errorf("main after the replay differs from the branch committed: %s", d)
	}
	if left := stagesIn(t, base); len(left) > 0 {
		t.Errorf("stages left in the base: %v", left)
	}
}

// A second store of the same base (another mount) leaves the stage of a
// commit the first one has not finished alone; the first then finishes it.
func TestStageOfAnotherStore(t *testing.T) {
	s, base := newBigStore(t, "apart")
	b, _ := s.Create("b", MainName)
	changeMuch(t, b)
	branchView := viewTree(t, b, "", nil)
	setFailHook(t, func(step string) error {
		if step == "commit-step-3" || step == "commit-undo" {
			return unix.EIO
		}
		return nil
	})
	if _, err := s.Commit("b"); !errors.Is(err, ErrUnfinished) {
		t.Fatalf("commit: %v, want ErrUnfinished", err)
	}
	stages := stagesIn(t, base)
	other, err := os.MkdirTemp("/dev/shm", "branchfs-store")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(other) })
	s2, err := Open(other, base, Options{})
	if err != nil {
		t.Fatal(err)
	}
	s2.Close()
	if got := stagesIn(t, base); !slices.Equal(got, stages) {
		t.Errorf("stages in the base after another store's mount: %v, want %v", got, stages)
	}
	failHook = nil
	if _, err := s.Commit("b"); err != nil {
		t.Fatalf("commit retried: %v", err)
	}
	if d := diffTrees(branchView, viewTree(t, s.Main(), "", nil)); d != "" {
		t.Errorf("main after the retried commit differs from the branch: %s", d)
	}
	if left := stagesIn(t, base); len(left) > 0 {
		t.Errorf("stages left in the base: %v", left)
	}
}

// A stage in the base whose removal fails (EIO) after the commit is
// removed later: after the next commit or abort, or at the next mount.
func TestStageRemoveFails(t *testing.T) {
	for _, remount := range []bool{false, true} {
		t.Run(fmt.Sprint("remount=", remount), func(t *testing.T) {
			s, base := newBigStore(t, "apart")
			b, _ := s.Create("b", MainName)
			changeMuch(t, b)
			var fired atomic.Int32
			setFailHook(t, func(step string) error {
				if step == "stage-remove" && fired.Add(1) == 1 {
					return unix.EIO
				}
				return nil
			})
			if _, err := s.Commit("b"); err != nil {
				t.Fatalf("commit: %v", err)
			}
			if fired.Load() == 0 {
				t.Fatal("the stage's removal was not reached")
			}
			if left := stagesIn(t, base); len(left) != 1 {
				t.Fatalf("stages in the base after a failed removal: %v", left)
			}
			if remount {
				s = reopen(t, s)
			} else {
				// Sooner or later after the commit, with the trash.
				for deadline := time.Now().Add(10 * time.Second); len(stagesIn(t, base)) > 0; {
					if time.Now().After(deadline) {
						t.Fatalf("the stage is still in the base: %v", stagesIn(t, base))
					}
					time.Sleep(5 * time.Millisecond)
				}
			}
			if left := stagesIn(t, base); len(left) > 0 {
				t.Errorf("stages left in the base: %v", left)
			}
			s.List(false) // after the removal, under the store's lock
			if ents, _ := os.ReadDir(filepath.Join(s.Dir(), "base-stages")); len(ents) > 0 {
				t.Errorf("records of stages removed: %v", ents)
			}
		})
	}
}

// A stage made in a base root that is set-group-ID and world-writable
// with a default ACL granting another user everything is still its
// commit's alone: mode 0700, no ACL.
func TestStageInSharedRoot(t *testing.T) {
	s, base := newBigStore(t, "apart")
	if err := unix.Chmod(base, 0o2777); err != nil {
		t.Fatal(err)
	}
	// The default ACL u::rwx,u:65534:rwx,g::rwx,m::rwx,o::rwx.
	acl := binary.LittleEndian.AppendUint32(nil, 2)
	for _, e := range []struct {
		tag uint16
		id  uint32
	}{{0x01, ^uint32(0)}, {0x02, 65534}, {0x04, ^uint32(0)}, {0x10, ^uint32(0)}, {0x20, ^uint32(0)}} {
		acl = binary.LittleEndian.AppendUint16(acl, e.tag)
		acl = binary.LittleEndian.AppendUint16(acl, 7)
		acl = binary.LittleEndian.AppendUint32(acl, e.id)
	}
	if err := unix.Setxattr(base, "system.posix_acl_default", acl, 0); err != nil {
		t.Skipf("no ACLs on the base: %v", err)
	}
	b, _ := s.Create("b", MainName)
	changeMuch(t, b)
	setFailHook(t, func(step string) error {
		if step == "commit-step-3" || step == "commit-undo" {
			return unix.EIO
		}
		return nil
	})
	if _, err := s.Commit("b"); !errors.Is(err, ErrUnfinished) {
		t.Fatalf("commit: %v, want ErrUnfinished", err)
	}
	stages := stagesIn(t, base)
	if len(stages) != 1 {
		t.Fatalf("stages of an unfinished commit: %v", stages)
	}
	p := filepath.Join(base, stages[0])
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	if st.Mode&07777 != 0o700 || st.Uid != uint32(os.Geteuid()) {
		t.Errorf("stage %s: mode %o, uid %d", p, st.Mode&07777, st.Uid)
	}
	for _, acl := range []string{"system.posix_acl_access", "system.posix_acl_default"} {
		if _, err := unix.Lgetxattr(p, acl, nil); !errors.Is(err, unix.ENODATA) {
			t.Errorf("stage %s has %s: %v", p, acl, err)
		}
	}
	failHook = nil
	if _, err := s.Commit("b"); err != nil {
		t.Fatalf("commit retried: %v", err)
	}
	if left := stagesIn(t, base); len(left) > 0 {
		t.Errorf("stages left in the base: %v", left)
	}
}
