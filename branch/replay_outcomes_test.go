package branch

import (
	"errors"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// A commit that could neither finish nor roll back is settled by the next
// mount, into main or into a parent branch, with the store on the base's
// mount or apart: the replay finishes it (the parent shows what the branch
// showed), or, where a step fails again, rolls it back (both show what they
// showed before, and the commit can be made again), or, where the rollback
// fails too, the mount fails saying so and the one after settles it. Before
// any mount, a branch made below the parent settles it too.
func TestReplayOutcomes(t *testing.T) {
	for _, into := range []string{MainName, "p"} {
		for _, layout := range layouts {
			for _, outcome := range []string{"finishes", "rolls back", "fails again", "settled by a create"} {
				t.Run(into+"/"+layout+"/"+outcome, func(t *testing.T) {
					testReplayOutcome(t, into, layout, outcome)
				})
			}
		}
	}
}

func testReplayOutcome(t *testing.T, into, layout, outcome string) {
	s, _ := newBigStore(t, layout)
	parent := s.Main()
	if into == "p" {
		parent = mustCreate(t, s, "p", MainName)
		write(t, parent, "f", "from p")
		mustOK(t, parent.Unlink("g1"))
	}
	b := mustCreate(t, s, "b", into)
	changeMuch(t, b)
	parentBefore, bBefore := viewTree(t, parent, "", nil), viewTree(t, b, "", nil)
	stepAndUndo := func(step string) error {
		if step == "commit-step-1" || step == "commit-undo" {
			return unix.EIO
		}
		return nil
	}
	setFailHook(t, stepAndUndo)
	if _, err := s.Commit("b"); !errors.Is(err, ErrUnfinished) {
		t.Fatalf("commit: %v, want ErrUnfinished", err)
	}
	if outcome == "settled by a create" {
		// No new mount: a branch made below the parent settles the
		// commit first.
		if _, err := s.Create("x", into); !errors.Is(err, ErrUnfinished) {
			t.Fatalf("create while the rollback still fails: %v, want ErrUnfinished", err)
		}
		if _, err := s.Commit("b"); !errors.Is(err, ErrUnfinished) {
			t.Fatalf("commit retried while the rollback still fails: %v, want ErrUnfinished", err)
		}
		failHook = nil
		mustCreate(t, s, "x", into)
		if _, err := s.View("b"); !errors.Is(err, ErrNotFound) {
			t.Errorf("b after its commit was settled: %v", err)
		}
		if d := diffTrees(bBefore, viewTree(t, parent, "", nil)); d != "" {
			t.Errorf("%s shows other than b did: %s", into, d)
		}
		return
	}
	s.Close()
	switch outcome {
	case "rolls back":
		failHook = failAt("commit-step-1", unix.EIO)
	case "fails again":
		if s2, err := Open(s.Dir(), s.Base(), Options{}); err == nil || !strings.Contains(err.Error(), "can neither finish nor roll back") {
			if s2 != nil {
				s2.Close()
			}
			t.Fatalf("mount with the rollback failing again: %v", err)
		}
		failHook = nil
	default:
		failHook = nil
	}
	s = reopen(t, s)
	failHook = nil
	parent, b = s.Main(), nil
	if into == "p" {
		parent = viewOf(s, "p")
	}
	if outcome == "rolls back" {
		if d := diffTrees(parentBefore, viewTree(t, parent, "", nil)); d != "" {
			t.Errorf("%s after the rollback: %s", into, d)
		}
		b = viewOf(s, "b")
		if d := diffTrees(bBefore, viewTree(t, b, "", nil)); d != "" {
			t.Errorf("b after the rollback: %s", d)
		}
		mustCommit(t, s, "b")
	} else if _, err := s.View("b"); !errors.Is(err, ErrNotFound) {
		t.Errorf("b after its commit finished: %v", err)
	}
	if d := diffTrees(bBefore, viewTree(t, parent, "", nil)); d != "" {
		t.Errorf("%s shows other than b did: %s", into, d)
	}
}
