package explore

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A command in a run makes a child branch of its run's branch, whose
// printed path exists there, and runs in one: the inner run commits into
// the outer branch, and the outer one into main. An inner run still
// running when the outer one ends is ended with it, and its branch
// aborted, so that the outer branch commits.
func TestRunsInsideRuns(t *testing.T) {
	tm := mountT(t)
	b := binary
	dir := t.TempDir()
	script := `set -e
echo outer > f1
p=$(` + b + ` create child .)
[ -d "$p" ] && [ "$(cat "$p/f1")" = outer ] && echo "$p" > ` + tm.mnt + `/../seen
echo child > "$p/c"
` + b + ` abort "$p"
` + b + ` run --data-path fuse . -- sh -c 'echo "inner $BRANCHFS_BRANCH" > f2; [ "$(cat f1)" = outer ]'
echo after > f3
` + b + ` run --data-path fuse . -- sh -c 'touch ` + dir + `/started; exec sleep 1000' &
until [ -e ` + dir + `/started ]; do sleep 0.05; done
`
	_, stderr, code := runCLI(t, tm.mnt, "run", "--data-path", "fuse", "--timeout", "60s", tm.mnt, "--", "sh", "-c", script)
	if code != 0 {
		t.Fatalf("outer run: exit %d: %s", code, stderr)
	}
	seen := strings.TrimSpace(readFile(t, filepath.Join(filepath.Dir(tm.mnt), "seen")))
	if seen != rootMountpoint()+"/@child" {
		t.Errorf("create printed %q", seen)
	}
	for f, want := range map[string]string{"f1": "outer\n", "f3": "after\n"} {
		if got := readFile(t, filepath.Join(tm.base, f)); got != want {
			t.Errorf("base %s = %q", f, got)
		}
	}
	if got := readFile(t, filepath.Join(tm.base, "f2")); !strings.HasPrefix(got, "inner run-") {
		t.Errorf("base f2 = %q", got)
	}
	for _, f := range []string{"c"} {
		if _, err := os.Stat(filepath.Join(tm.base, f)); err == nil {
			t.Errorf("%s reached the base", f)
		}
	}
	tm.noneLeft(t, token(t))
}
