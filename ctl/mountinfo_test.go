package ctl

import (
	"os"
	"testing"
)

func TestParseMountinfo(t *testing.T) {
	const data = `22 1 0:21 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
35 22 0:30 / /sys/fs/cgroup rw,nosuid master:2 - cgroup2 cgroup2 rw,nsdelegate
61 22 0:45 / /mnt/a\040b\134c rw,nosuid,nodev - fuse.branchfs branchfs rw,user_id=1000,group_id=1000
62 22 0:46 /sub /mnt/x\04 rw - fuse.branchfs branchfs rw,user_id=0
bad line
63 22 0:47 / /mnt/- rw - tmpfs none
`
	ms := parseMountinfo(data)
	if len(ms) != 5 {
		t.Fatalf("%d entries, want 5: %+v", len(ms), ms)
	}
	want := []struct{ point, fstype, root string }{
		{"/", "ext4", "/"}, {"/sys/fs/cgroup", "cgroup2", "/"}, {`/mnt/a b\c`, "fuse.branchfs", "/"},
		{`/mnt/x\04`, "fuse.branchfs", "/sub"}, {"/mnt/-", "tmpfs", "/"},
	}
	for i, w := range want {
		if ms[i].Point != w.point || ms[i].FSType != w.fstype || ms[i].Root != w.root {
			t.Errorf("entry %d: %+v, want %+v", i, ms[i], w)
		}
	}
	if ms[2].ID != 61 || ms[2].Parent != 22 {
		t.Errorf("IDs %d %d", ms[2].ID, ms[2].Parent)
	}
	if v, ok := ms[2].SuperOption("user_id"); !ok || v != "1000" {
		t.Errorf("user_id %q %v", v, ok)
	}
	if _, ok := ms[4].SuperOption("user_id"); ok {
		t.Error("tmpfs has a user_id")
	}
}

// This process's own table holds "/", and the enclosing mount of a path
// is the longest mount point above it.
func TestEnclosingMount(t *testing.T) {
	m, err := EnclosingMount("/")
	if err != nil || m.Point != "/" {
		t.Fatalf("/: %+v %v", m, err)
	}
	wd, _ := os.Getwd()
	m, err = EnclosingMount(ResolvePrefix(wd))
	if err != nil || m.Point == "" {
		t.Fatalf("%s: %+v %v", wd, m, err)
	}
}

// readProc reads a file whole however its size compares with its first
// buffer, and says which file it could not open.
func TestReadProcWhole(t *testing.T) {
	for _, size := range []int{0, 100, 16 << 10, 40<<10 + 7} {
		want := make([]byte, size)
		for i := range want {
			want[i] = byte('a' + i%26)
		}
		path := t.TempDir() + "/f"
		if err := os.WriteFile(path, want, 0o600); err != nil {
			t.Fatal(err)
		}
		if got, err := readProc(path); err != nil || string(got) != string(want) {
			t.Errorf("%d bytes: read %d, %v", size, len(got), err)
		}
	}
	if _, err := readProc("/proc/self/no-such-file"); !os.IsNotExist(err) {
		t.Errorf("a missing file: %v", err)
	}
}
