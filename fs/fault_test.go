package fs_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestCommitFaults makes each step of a commit fail (ENOSPC or EPERM, in
// turn, and each store layout in turn) in the daemon: the commit reports failure, the base and the
// branches are as before, the next mount finds nothing to finish, and the
// commit succeeds once the fault is gone. (branch/commit_test.go fails
// every step with each.)
func TestCommitFaults(t *testing.T) {
	for i, point := range commitPoints() {
		errno := []string{"enospc", "eperm"}[i%2]
		layout := storeLayouts[i%len(storeLayouts)]
		t.Run(point+"="+errno+"-"+layout, func(t *testing.T) {
			t.Parallel()
			m := newMountLayout(t, layout, "BRANCHFS_FAILPOINT="+point+"="+errno)
			b := commitScenario(t, m)
			_, errOut, code := m.cli("commit", b)
			if code == 0 {
				t.Fatalf("commit succeeded; the failpoint did not fire")
			}
			if !strings.Contains(errOut, "nothing was committed") {
				t.Errorf("commit says: %s", errOut)
			}
			wantOutcome(t, m, false)
			wantStates(t, m, map[string]string{"b": "live", "s": "live"})
			wantContent(t, filepath.Join(b, "file"), "committed\n")
			m.ok("unmount", m.mnt)
			m.env = nil
			m.start()
			wantOutcome(t, m, false)
			m.ok("commit", m.view("b"))
			wantOutcome(t, m, true)
			wantNoStage(t, m)
		})
	}
}

// TestCommitDoneRecordFails: a commit whose "done" record cannot be
// written has happened and says so, and the next mount does not apply it
// again over what was written since.
func TestCommitDoneRecordFails(t *testing.T) {
	m := newMount(t, "", "BRANCHFS_FAILPOINT=commit-epoch=eio")
	b := commitScenario(t, m)
	m.ok("commit", b)
	m.ok("abort", m.view("s"))
	writeFile(t, filepath.Join(m.mnt, "file"), "after\n")
	m.ok("unmount", m.mnt)
	m.env = nil
	m.start()
	wantContent(t, filepath.Join(m.base, "file"), "after\n")
	wantStates(t, m, map[string]string{"b": "gone"})
}

// TestCommitDiskFull commits a branch that rewrites 300 files into a base
// on a small ext4 that is full: the commit fails and changes nothing, and
// succeeds once there is space.
func TestCommitDiskFull(t *testing.T) {
	dir := t.TempDir()
	img := filepath.Join(dir, "img")
	fsDir := filepath.Join(dir, "fs")
	must(t, os.MkdirAll(fsDir, 0o755))
	// .ci/run installs mkfs.ext4 (e2fsprogs).
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", img, "24M").CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v: %s", err, out)
	}
	if out, err := exec.Command("mount", "-o", "loop", img, fsDir).CombinedOutput(); err != nil {
		t.Skipf("no loop devices here: mount -o loop: %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", "-l", fsDir).Run() })
	m := &mount{t: t, base: filepath.Join(fsDir, "base"), store: filepath.Join(fsDir, "store"), mnt: filepath.Join(dir, "mnt")}
	must(t, os.MkdirAll(m.mnt, 0o755))
	const n = 300
	must(t, os.MkdirAll(filepath.Join(m.base, "src"), 0o755))
	for i := 0; i < n; i++ {
		writeFile(t, filepath.Join(m.base, "src", strconv.Itoa(i)), "old\n")
	}
	m.start()
	t.Cleanup(m.cleanup)
	b := m.create("b")
	for i := 0; i < n; i++ {
		writeFile(t, filepath.Join(b, "src", strconv.Itoa(i)), "new\n")
	}
	// Fill the disk: what is left goes to a file of the base's.
	fill, err := os.Create(filepath.Join(fsDir, "fill"))
	must(t, err)
	chunk := make([]byte, 64<<10)
	for {
		if _, err := fill.Write(chunk); err != nil {
			break
		}
	}
	for {
		if _, err := fill.Write(chunk[:1024]); err != nil {
			break
		}
	}
	fill.Close()
	// And the inodes: the commit's directories cannot grow either.
	for i := 0; ; i++ {
		if err := os.WriteFile(filepath.Join(fsDir, "i"+strconv.Itoa(i)), nil, 0o644); err != nil {
			break
		}
	}
	_, errOut, code := m.cli("commit", b)
	count := func() (old, new int) {
		for i := 0; i < n; i++ {
			switch readFile(t, filepath.Join(m.base, "src", strconv.Itoa(i))) {
			case "old\n":
				old++
			case "new\n":
				new++
			}
		}
		return
	}
	old, nw := count()
	if code == 0 {
		if nw != n {
			t.Fatalf("commit succeeded with %d new and %d old files", nw, old)
		}
		t.Skip("the commit found the space it needed")
	}
	t.Logf("commit on a full disk: %s", errOut)
	if !strings.Contains(errOut, "no space left on device") {
		t.Errorf("commit on a full disk says: %s", errOut)
	}
	if old != n {
		t.Fatalf("a failed commit left %d new and %d old files in the base", nw, old)
	}
	wantStates(t, m, map[string]string{"b": "live"})
	must(t, os.Remove(filepath.Join(fsDir, "fill")))
	m.ok("commit", b)
	if _, nw := count(); nw != n {
		t.Errorf("retried commit left %d of %d files new", nw, n)
	}
}

// TestCommitImmutableBase: an immutable file in the base (chattr +i), the
// third of five that a branch rewrites, stops the commit before anything
// moves; the commit says so and succeeds once the flag is gone.
func TestCommitImmutableBase(t *testing.T) {
	m := newMount(t, "")
	for i := 1; i <= 5; i++ {
		writeFile(t, filepath.Join(m.base, "f"+strconv.Itoa(i)), "old\n")
	}
	b := m.create("b")
	for i := 1; i <= 5; i++ {
		writeFile(t, filepath.Join(b, "f"+strconv.Itoa(i)), "new\n")
	}
	locked := filepath.Join(m.base, "f3")
	if out, err := exec.Command("chattr", "+i", locked).CombinedOutput(); err != nil {
		t.Fatalf("chattr +i (e2fsprogs, which .ci/run installs): %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("chattr", "-i", locked).Run() })
	_, errOut, code := m.cli("commit", b)
	if code == 0 || !strings.Contains(errOut, "operation not permitted") || !strings.Contains(errOut, "nothing was committed") {
		t.Errorf("commit with an immutable base file: exit %d: %s", code, errOut)
	}
	for i := 1; i <= 5; i++ {
		wantContent(t, filepath.Join(m.base, "f"+strconv.Itoa(i)), "old\n")
	}
	wantStates(t, m, map[string]string{"b": "live"})
	must(t, exec.Command("chattr", "-i", locked).Run())
	m.ok("commit", b)
	for i := 1; i <= 5; i++ {
		wantContent(t, filepath.Join(m.base, "f"+strconv.Itoa(i)), "new\n")
	}
}
