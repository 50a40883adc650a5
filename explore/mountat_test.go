package explore

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	fsdaemon "github.com/branchfs/branchfs/daemon"
)

// daemon.MountAt mounts from Go with a daemon of its own (this test
// binary, started again), which Unmount ends; bad options are refused and
// mount nothing. explore runs in it as in any mount.
func TestMountAt(t *testing.T) {
	dir := t.TempDir()
	base, mnt, store := filepath.Join(dir, "base"), filepath.Join(dir, "mnt"), filepath.Join(dir, "store")
	must(t, os.Mkdir(base, 0o755))
	must(t, os.Mkdir(mnt, 0o755))
	for _, bad := range []struct {
		base, mnt string
		o         fsdaemon.MountOptions
	}{
		{base, mnt, fsdaemon.MountOptions{}},
		{base, mnt, fsdaemon.MountOptions{Store: store, MaxBranches: -1}},
		{filepath.Join(dir, "nosuch"), mnt, fsdaemon.MountOptions{Store: store}},
		{base, mnt, fsdaemon.MountOptions{Store: filepath.Join(base, "store")}},
		{"", mnt, fsdaemon.MountOptions{Store: store}},
	} {
		if mt, err := fsdaemon.MountAt(bad.base, bad.mnt, bad.o); err == nil {
			mt.Unmount()
			t.Errorf("%+v: mounted", bad)
		}
	}
	if _, err := os.Stat(store); !os.IsNotExist(err) {
		t.Errorf("a refused mount made its store: %v", err)
	}
	mt, err := fsdaemon.MountAt(base, mnt, fsdaemon.MountOptions{Store: store, MaxBranches: 1})
	must(t, err)
	m, err := Open(mnt)
	must(t, err)
	data, err := os.ReadFile(filepath.Join(store, "daemon.pid"))
	must(t, err)
	pid, _ := strconv.Atoi(strings.TrimSpace(string(data)))
	if pid <= 0 || pid == os.Getpid() {
		t.Fatalf("daemon pid %d (this process %d)", pid, os.Getpid())
	}
	res, err := m.Run(context.Background(), Spec{Args: sh("echo x > f")})
	must(t, err)
	if !res.Committed || readFile(t, filepath.Join(base, "f")) != "x\n" {
		t.Errorf("run: %+v", res)
	}
	// MaxBranches reached the daemon.
	_, err = m.Create("", "a")
	must(t, err)
	if _, err := m.Create("", "b"); err == nil {
		t.Error("MaxBranches 1: a second branch")
	}
	must(t, m.Abort("a", false))
	must(t, mt.Unmount())
	if procStart(pid) != 0 {
		t.Errorf("daemon %d still there", pid)
	}
	if _, err := Open(mnt); err == nil {
		t.Error("still mounted")
	}
	// The store brings the mount back, as branchfs mount's does.
	mt, err = fsdaemon.MountAt(base, mnt, fsdaemon.MountOptions{Store: store})
	must(t, err)
	must(t, mt.Unmount())
}

// A run's branch may bear any name a file may: its cgroup and record
// work all the same, and it can be run in again by name.
func TestRunFreeName(t *testing.T) {
	tm := mountT(t)
	name := "my run\n+1 \"é\""
	res, err := tm.Run(context.Background(), Spec{Args: sh("echo x > f"), Name: name, OnSuccess: Keep})
	must(t, err)
	if res.Branch != name || res.Containment != ContainCgroup || res.Outcome != Keep {
		t.Fatalf("result %+v", res)
	}
	res, err = tm.Run(context.Background(), Spec{Args: sh("cat f"), Branch: name})
	must(t, err)
	if !res.Committed || readFile(t, filepath.Join(tm.base, "f")) != "x\n" {
		t.Errorf("run in it again: %+v", res)
	}
	tm.noneLeft(t, token(t))
}
