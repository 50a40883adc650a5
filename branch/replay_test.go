package branch

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
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

				cmd := exec.Command(os.Args[0], "-test.run=^TestCommitKilledHelper$", "-test.count=1")
				cmd.Env = append(os.Environ(), replayEnv+"="+c.step+":"+s.Dir()+":"+base)
				out, err := cmd.CombinedOutput()
				var exit *exec.ExitError
				if !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
					t.Fatalf("the helper was not killed at %s: %v\n%s", c.step, err, out)
				}

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
				if _, err := os.Lstat(base + "/" + StageName); !os.IsNotExist(err) {
					t.Errorf("%s left in the base: %v", StageName, err)
				}
			})
		}
	}
}
