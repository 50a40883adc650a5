package explore

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// FreezeRun stops every process of a run until it is thawed, and refuses
// a process that is in no run's cgroup.
func TestFreezeRun(t *testing.T) {
	tm := mountT(t)
	tok := token(t)
	count := filepath.Join(t.TempDir(), "count")
	p, err := tm.Start(context.Background(), Spec{Args: sh(
		"i=0; while :; do i=$((i+1)); echo $i >" + count + ".t; mv " + count + ".t " + count + "; sleep 0.01; done; : " + tok)})
	must(t, err)
	defer func() {
		p.Kill()
		p.Abort()
		tm.noneLeft(t, tok)
	}()
	if p.noCgroup != "" {
		t.Skipf("runs have no cgroup here: %s", p.noCgroup)
	}
	read := func() int {
		data, _ := os.ReadFile(count)
		n, _ := strconv.Atoi(strings.TrimSpace(string(data)))
		return n
	}
	eventually(t, "the run to count", func() bool { return read() > 0 })
	pid, err := strconv.Atoi(strings.SplitN(withToken(tok)[0], ":", 2)[0])
	must(t, err)
	_, thaw, err := FreezeRun(pid, 10*time.Second)
	must(t, err)
	frozen := read()
	// Nothing to wait for: a frozen run does nothing. A tenth of a
	// second is ten rounds of its loop.
	time.Sleep(100 * time.Millisecond)
	if n := read(); n != frozen {
		t.Errorf("the frozen run counted from %d to %d", frozen, n)
	}
	must(t, thaw())
	eventually(t, "the thawed run to count on", func() bool { return read() > frozen })
	if _, _, err := FreezeRun(os.Getpid(), time.Second); err == nil {
		t.Error("FreezeRun froze the cgroup of a process in no run")
	}
}
