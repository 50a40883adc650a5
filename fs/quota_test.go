package fs_test

import (
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/branchfs/branchfs/branch"
	"golang.org/x/sys/unix"
)

// newMountWith mounts a fresh base holding the sample tree with more
// mount flags.
func newMountWith(t *testing.T, args ...string) *mount {
	t.Helper()
	dir := t.TempDir()
	must(t, os.Chmod(dir, 0o755))
	must(t, os.Chmod(filepath.Dir(dir), 0o755))
	m := &mount{t: t, base: filepath.Join(dir, "base"), store: filepath.Join(dir, "store"),
		mnt: filepath.Join(dir, "mnt"), args: args}
	must(t, os.MkdirAll(m.mnt, 0o755))
	sampleTree(t, m.base)
	m.start()
	t.Cleanup(m.cleanup)
	return m
}

// storeBlock is the block sizes round up to in store.
func storeBlock(t *testing.T, store string) int64 {
	var st unix.Statfs_t
	must(t, unix.Statfs(store, &st))
	return st.Bsize
}

// walkDelta counts what a storage limit must count in a branch's delta:
// each regular file once, its size rounded up to the block.
func walkDelta(t *testing.T, store, name string) int64 {
	blk := storeBlock(t, store)
	seen := map[uint64]bool{}
	var total int64
	filepath.WalkDir(filepath.Join(store, "deltas", name), func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return nil
		}
		var st unix.Stat_t
		if unix.Lstat(p, &st) == nil && !seen[st.Ino] && st.Nlink > 0 {
			seen[st.Ino] = true
			total += (st.Size + blk - 1) / blk * blk
		}
		return nil
	})
	return total
}

// counted is what the daemon counts for each branch, main standing for
// the mount, as list --json tells.
func (m *mount) counted() map[string]branch.Info {
	m.t.Helper()
	var infos []branch.Info
	if err := json.Unmarshal([]byte(m.ok("list", "--json", m.mnt)), &infos); err != nil {
		m.t.Fatal(err)
	}
	out := map[string]branch.Info{}
	for _, in := range infos {
		out[in.Name] = in
	}
	return out
}

// wantExact fails unless the daemon's counts of the branches named, and
// of the mount, are what walks of their deltas find.
func (m *mount) wantExact(step string, names ...string) {
	m.t.Helper()
	c := m.counted()
	var sum int64
	for _, n := range names {
		walk := walkDelta(m.t, m.store, n)
		if c[n].StorageUsed == nil || *c[n].StorageUsed != walk {
			m.t.Fatalf("%s: %s counts %v bytes, a walk of its delta finds %d", step, n, c[n].StorageUsed, walk)
		}
		sum += walk
	}
	if u := c[branch.MainName].StorageUsed; u == nil || *u != sum {
		m.t.Fatalf("%s: the mount counts %v bytes, its branches' deltas hold %d", step, u, sum)
	}
}

func appendTo(p string, n int) error {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	_, err = f.Write(make([]byte, n))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// TestStorageLimitMounted: a write past a branch's own limit, or past the
// mount's, fails with EDQUOT through the mount, passthrough or not, and
// nothing else breaks: reads, directories, removals, and writes once
// space is freed; main writes the base unbounded.
func TestStorageLimitMounted(t *testing.T) {
	m := newMountWith(t, "--max-storage", "256K")
	blk := storeBlock(t, m.store)
	m.ok("create", "--max-storage", "64K", "b", m.mnt)
	b := m.view("b")
	must(t, os.WriteFile(filepath.Join(b, "f1"), make([]byte, 64<<10), 0o644))
	err := appendTo(filepath.Join(b, "f1"), 1)
	if !errors.Is(err, syscall.EDQUOT) {
		t.Fatalf("a write past the branch's limit: %v; want EDQUOT", err)
	}
	if fi, err := os.Stat(filepath.Join(b, "f1")); err != nil || fi.Size() != 64<<10 {
		t.Fatalf("f1 after the refused write: %v %v", fi.Size(), err)
	}
	// A copy-up that does not fit fails, and the base file stays.
	if err := appendTo(filepath.Join(b, "file"), 1); !errors.Is(err, syscall.EDQUOT) {
		t.Fatalf("a copy-up past the limit: %v", err)
	}
	wantContent(t, filepath.Join(b, "file"), "base file\n")
	must(t, os.Mkdir(filepath.Join(b, "newdir"), 0o755))
	must(t, os.Symlink("f1", filepath.Join(b, "sl")))
	must(t, os.RemoveAll(filepath.Join(b, "dir")))
	if ents, err := os.ReadDir(b); err != nil || len(ents) != 5 {
		t.Fatalf("listing: %v %v", ents, err)
	}
	m.wantExact("full", "b")
	// A reader open on the file: the writer must not pass through it.
	r, err := os.Open(filepath.Join(b, "f1"))
	must(t, err)
	must(t, os.Truncate(filepath.Join(b, "f1"), 60<<10))
	if err := appendTo(filepath.Join(b, "f1"), 8<<10); !errors.Is(err, syscall.EDQUOT) {
		t.Fatalf("a write past the limit with a reader open: %v", err)
	}
	r.Close()
	must(t, os.Remove(filepath.Join(b, "f1")))
	must(t, appendTo(filepath.Join(b, "file"), 10<<10))
	m.wantExact("freed", "b")
	var sfs unix.Statfs_t
	must(t, unix.Statfs(b, &sfs))
	if used := *m.counted()["b"].StorageUsed; int64(sfs.Blocks)*sfs.Frsize != 64<<10 || int64(sfs.Bavail)*sfs.Frsize != 64<<10-used {
		t.Errorf("df in b: %d of %d bytes free; want %d of %d", int64(sfs.Bavail)*sfs.Frsize, int64(sfs.Blocks)*sfs.Frsize, 64<<10-used, 64<<10)
	}

	// The mount's limit counts every branch.
	c := m.create("c")
	used := *m.counted()["b"].StorageUsed
	room := 256<<10 - used
	must(t, os.WriteFile(filepath.Join(c, "big"), make([]byte, room), 0o644))
	if err := appendTo(filepath.Join(c, "big"), int(blk)); !errors.Is(err, syscall.EDQUOT) {
		t.Fatalf("a write past the mount's limit: %v", err)
	}
	if err := appendTo(filepath.Join(b, "more"), 1); !errors.Is(err, syscall.EDQUOT) {
		t.Fatalf("a write in another branch past the mount's limit: %v", err)
	}
	m.wantExact("mount full", "b", "c")
	m.ok("abort", c)
	must(t, appendTo(filepath.Join(b, "more"), 1))
	m.wantExact("after the abort", "b")
	if _, errOut, code := m.cli("create", "--max-storage", "lots", "d", m.mnt); code == 0 || !strings.Contains(errOut, "not a size") {
		t.Fatalf("create with a bad size: exit %d: %s", code, errOut)
	}
	wantMissing(t, m.view("d"))
	// Main writes the base, which no limit counts.
	m.ok("abort", b)
	must(t, os.WriteFile(filepath.Join(m.mnt, "bigmain"), make([]byte, 1<<20), 0o644))
}

// TestStorageCountExact: what the limits count equals a walk of the
// deltas after copy-ups, truncates, hard links, a commit into a branch,
// an abort, kill -9 of the daemon and a mount again.
func TestStorageCountExact(t *testing.T) {
	m := newMountWith(t, "--max-storage", "1G")
	b := m.create("b")
	bp := func(p string) string { return filepath.Join(b, p) }
	step := func(name string, do func() error, names ...string) {
		t.Helper()
		if err := do(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		m.wantExact(name, append([]string{"b"}, names...)...)
	}
	step("copy-up", func() error { return appendTo(bp("file"), 5000) })
	step("copy-up by chmod", func() error { return os.Chmod(bp("dir/a"), 0o600) })
	step("truncate up", func() error { return os.Truncate(bp("dir/a"), 100000) })
	step("truncate down", func() error { return os.Truncate(bp("dir/a"), 10) })
	step("new file", func() error { return os.WriteFile(bp("new"), make([]byte, 20000), 0o644) })
	step("hard link", func() error { return os.Link(bp("new"), bp("new2")) })
	step("write through a link", func() error { return appendTo(bp("new2"), 9000) })
	step("unlink a name", func() error { return os.Remove(bp("new")) })
	step("rename over", func() error {
		if err := os.WriteFile(bp("r"), make([]byte, 7000), 0o644); err != nil {
			return err
		}
		return os.Rename(bp("r"), bp("new2"))
	})
	step("O_TRUNC", func() error { return os.WriteFile(bp("file"), []byte("x"), 0o644) })
	step("rm -r", func() error { return os.RemoveAll(bp("dir")) })
	c := m.create("c", "b")
	step("child writes", func() error {
		if err := os.WriteFile(filepath.Join(c, "file"), make([]byte, 30000), 0o644); err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(c, "cnew"), make([]byte, 3000), 0o644)
	}, "c")
	step("commit into b", func() error { _, _, code := m.cli("commit", c); return exitErr(code) })
	d := m.create("d", "b")
	step("another child writes", func() error { return appendTo(filepath.Join(d, "new2"), 50000) }, "d")
	step("abort", func() error { _, _, code := m.cli("abort", d); return exitErr(code) })
	e := m.create("e", "b")
	step("a third child writes", func() error { return appendTo(filepath.Join(e, "e"), 12345) }, "e")
	before := m.counted()

	data, err := os.ReadFile(filepath.Join(m.store, "daemon.pid"))
	must(t, err)
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	must(t, err)
	must(t, unix.Kill(pid, unix.SIGKILL))
	m.waitDead()
	m.start()
	m.wantExact("kill -9 and mount again", "b", "e")
	after := m.counted()
	for _, n := range []string{"main", "b", "e"} {
		if *before[n].StorageUsed != *after[n].StorageUsed {
			t.Errorf("%s counts %d after the remount, %d before", n, *after[n].StorageUsed, *before[n].StorageUsed)
		}
	}
}

func exitErr(code int) error {
	if code != 0 {
		return errors.New("exit " + strconv.Itoa(code))
	}
	return nil
}

// TestUnprivilegedStorageLimit: an ordinary user's mount and branches
// keep their limits, and a kernel-path run is not taken under one.
func TestUnprivilegedStorageLimit(t *testing.T) {
	dir := t.TempDir()
	must(t, os.Chmod(dir, 0o755))
	must(t, os.Chmod(filepath.Dir(dir), 0o755))
	home := filepath.Join(dir, "home")
	base, mnt := filepath.Join(home, "base"), filepath.Join(home, "mnt")
	must(t, os.MkdirAll(mnt, 0o755))
	sampleTree(t, base)
	giveHome(t, home, mnt)
	inHome(t, home, binary, "mount", "--base", base, "--max-storage", "1M", mnt)
	inHome(t, home, binary, "create", "--max-storage", "16K", "b", mnt)
	b := filepath.Join(mnt, "@b")
	inHome(t, home, "sh", "-c", `head -c 16384 /dev/zero > "$0"/f`, b)
	out, err := tryInHome(home, "sh", "-c", `head -c 1 /dev/zero >> "$0"/f`, b)
	if err == nil || !strings.Contains(out, "quota") {
		t.Fatalf("a write past the limit as an ordinary user: %v: %s", err, out)
	}
	inHome(t, home, "sh", "-c", `rm "$0"/f && head -c 8192 /dev/zero > "$0"/g && cat "$0"/file`, b)
	out, err = tryInHome(home, binary, "run", "--data-path", "kernel", "--branch", "b", mnt, "--", "true")
	if err == nil || !strings.Contains(out, "storage limit") {
		t.Fatalf("a kernel-path run under a limit: %v: %s", err, out)
	}
	out, err = tryInHome(home, binary, "run", "--max-storage", "8K", mnt, "--", "sh", "-c", `head -c 12288 /dev/zero > "$BRANCHFS_VIEW"/h`)
	if err == nil || !strings.Contains(out, "quota") || !strings.Contains(out, "the storage limit refused 1 writes") {
		t.Fatalf("a run past its limit: %v: %s", err, out)
	}
	inHome(t, home, binary, "unmount", mnt)
}
