package explore

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A run's storage limit: its writes past it fail with EDQUOT (the command
// sees "Disk quota exceeded"), the rest of the command goes on, and the
// run takes the FUSE path, where the daemon counts every write. Each
// candidate of a pattern has its own.
func TestRunStorageLimit(t *testing.T) {
	tm := mountT(t)
	ctx := context.Background()
	var errOut strings.Builder
	res, err := tm.Run(ctx, Spec{
		Args: sh(`head -c 16384 /dev/zero > f || exit 10
			head -c 4096 /dev/zero >> f && exit 11
			mkdir d && ln -s f l && cat f >/dev/null && : > empty || exit 12
			rm f && head -c 4096 /dev/zero > g && echo still >> g`),
		MaxStorage: 16 << 10, OnSuccess: Keep, Stderr: &errOut,
	})
	must(t, err)
	if !res.Success() || res.DataPath != DataPathFUSE || res.StorageRefused != 1 {
		t.Fatalf("result %+v: %s", res, errOut.String())
	}
	if !strings.Contains(errOut.String(), "quota") {
		t.Errorf("the refused write said %q", errOut.String())
	}
	fi, err := os.Stat(filepath.Join(tm.View(res.Branch), "g"))
	if err != nil || fi.Size() != 4096+6 {
		t.Errorf("g, written once f was removed: %v %v", fi, err)
	}
	must(t, tm.Abort(res.Branch, false))
	for _, spec := range []Spec{
		{Args: []string{"true"}, MaxStorage: -1},
		{Args: []string{"true"}, MaxStorage: 1 << 20, DataPath: DataPathKernel},
	} {
		if res, err := tm.Run(ctx, spec); err == nil && res.Success() {
			t.Errorf("%+v: ran, result %+v", spec, res)
		}
	}
	// Two candidates, each under its own limit: the one that stays
	// within it wins.
	out, err := tm.BestOfN(ctx, [][]string{
		sh(`head -c 65536 /dev/zero > big`),
		sh(`head -c 4096 /dev/zero > small`),
	}, true, Options{MaxStorage: 32 << 10})
	must(t, err)
	if out.Winner == nil || *out.Winner != 1 || out.Results[0].Success() || out.Results[0].StorageRefused == 0 {
		t.Fatalf("outcome %+v", out)
	}
	if _, err := tm.BestOfN(ctx, [][]string{{"true"}}, true, Options{MaxStorage: -1}); err == nil {
		t.Error("a negative MaxStorage was taken")
	}
	tm.noneLeft(t, token(t))
}
