package explore

import (
	"bytes"
	"context"
	"strconv"
	"strings"
	"testing"
)

// With LastPID, the command's PID in the run's namespace comes after it:
// a restored tree's own PIDs stay free.
func TestLastPID(t *testing.T) {
	tm := mountT(t)
	var out bytes.Buffer
	res, err := tm.Run(context.Background(), Spec{Args: sh(`echo $$`), Stdout: &out, LastPID: 5000, OnSuccess: Keep, OnFailure: Abort})
	must(t, err)
	// The helper's threads may take the first few.
	pid, _ := strconv.Atoi(strings.TrimSpace(out.String()))
	if !res.Success() || pid <= 5000 || pid > 5100 {
		t.Fatalf("result %+v, the command's PID %q, want just above 5000", res, out.String())
	}
	tm.Abort(res.Branch, true)
}
