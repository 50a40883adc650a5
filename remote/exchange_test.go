package remote

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// makeBase writes a base with something for every kind of change.
func makeBase(t testing.TB, dir string) {
	t.Helper()
	w := func(rel, data string) {
		p := filepath.Join(dir, rel)
		must(t, os.MkdirAll(filepath.Dir(p), 0o755))
		must(t, os.WriteFile(p, []byte(data), 0o644))
	}
	for _, f := range []string{"keep", "mod", "del", "deldir/a", "deldir/b", "opq/x", "opq/y", "meta/f", "chm", "xr", "own", "sub/inner/file", "sub/inner/other"} {
		w(f, f+" in the base\n")
	}
	must(t, unix.Setxattr(filepath.Join(dir, "xr"), "user.old", []byte("1"), 0))
	w("big", string(randomBytes(9<<20, 1)))
}

func randomBytes(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, seed))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// changeBranch makes every kind of change in the view v.
func changeBranch(t testing.TB, v string) {
	t.Helper()
	p := func(rel string) string { return filepath.Join(v, rel) }
	must(t, os.WriteFile(p("mod"), []byte("changed in the branch\n"), 0o644))
	must(t, os.Remove(p("del")))
	must(t, os.RemoveAll(p("deldir")))
	must(t, os.RemoveAll(p("opq")))
	must(t, os.Mkdir(p("opq"), 0o711))
	must(t, os.WriteFile(p("opq/z"), []byte("made again\n"), 0o644))
	must(t, os.Chmod(p("meta"), 0o750))
	must(t, os.Chmod(p("chm"), 0o600))
	must(t, os.WriteFile(p("xa"), []byte("with an xattr\n"), 0o644))
	must(t, unix.Setxattr(p("xa"), "user.k", []byte("v"), 0))
	must(t, unix.Removexattr(p("xr"), "user.old"))
	must(t, os.Lchown(p("own"), 1234, 5678))
	big, err := os.ReadFile(p("big"))
	must(t, err)
	big = append(big[:4<<20:4<<20], append([]byte("inserted!!"), big[4<<20:]...)...)
	must(t, os.WriteFile(p("big"), big, 0o644))
	must(t, os.Symlink("keep", p("ln")))
	must(t, unix.Mkfifo(p("pipe"), 0o640))
	must(t, os.WriteFile(p("empty"), nil, 0o644))
	must(t, os.MkdirAll(p("new/deep"), 0o755))
	must(t, os.WriteFile(p("new/deep/file"), []byte("new\n"), 0o644))
	must(t, os.WriteFile(p("sub/inner/file"), []byte("changed deep down\n"), 0o644))
	must(t, os.WriteFile(p("old"), []byte("old times\n"), 0o644))
	old := time.Date(2001, 2, 3, 4, 5, 6, 7, time.UTC)
	must(t, os.Chtimes(p("old"), old, old))
	must(t, os.WriteFile(p("suid"), []byte("#!/bin/sh\n"), 0o755))
	must(t, os.Lchown(p("suid"), 1234, 1234))
	must(t, unix.Chmod(p("suid"), 0o4755))
	// Read-only files made in the branch, one of one chunk and one of
	// several, with an xattr each: a pull writes them before it may not.
	for name, size := range map[string]int{"ro": 100, "bigro": 3 << 20} {
		must(t, os.WriteFile(p(name), randomBytes(size, uint64(size)), 0o644))
		must(t, unix.Setxattr(p(name), "user.ro", []byte(name), 0))
		must(t, os.Chmod(p(name), 0o444))
	}
}

// twoHosts makes a base, a copy of it, and mounts each: two hosts that
// share a base.
func twoHosts(t testing.TB) (a, b *side) {
	t.Helper()
	needMount(t)
	dir := t.TempDir()
	baseA, baseB := filepath.Join(dir, "baseA"), filepath.Join(dir, "baseB")
	must(t, os.Mkdir(baseA, 0o755))
	makeBase(t, baseA)
	if out, err := exec.Command("cp", "-a", baseA, baseB).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v: %s", err, out)
	}
	return mountBase(t, baseA), mountBase(t, baseB)
}

type pushOut struct {
	URL   string `json:"url"`
	Stats Stats  `json:"stats"`
}

func push(t testing.TB, env []string, view, url string) pushOut {
	t.Helper()
	var out pushOut
	must(t, json.Unmarshal([]byte(ok(t, env, "push", "--json", view, url)), &out))
	return out
}

// Two mounts of copies of one base exchange a branch through a bucket:
// the pulled branch shows what the pushed one does, path for path (type,
// mode, owner, content, symlink target, xattrs, times), its diff is the
// same, and its commit leaves the second base as the first branch shows.
func TestExchange(t *testing.T) {
	w := sharedWeed(t)
	a, b := twoHosts(t)
	bucket := w.bucket(t)
	env := w.env()
	ok(t, nil, "create", "work", a.mnt)
	changeBranch(t, a.view("work"))

	first := push(t, env, a.view("work"), "s3://"+bucket+"/team/")
	if first.URL != "s3://"+bucket+"/team/work" {
		t.Errorf("pushed to %s", first.URL)
	}
	if first.Stats.Stored != first.Stats.Chunks || first.Stats.Chunks == 0 {
		t.Errorf("first push stored %d of %d chunks", first.Stats.Stored, first.Stats.Chunks)
	}
	ok(t, env, "pull", first.URL, b.mnt)

	want := snapshot(t, a.view("work"), true)
	for p, has := range map[string]bool{"opq/z": true, "opq/x": false, "del": false, "deldir": false, "ln": true, "pipe": true, "new/deep/file": true} {
		if _, ok := want[p]; ok != has {
			t.Fatalf("the branch on the first mount: %s there: %v, want %v", p, ok, has)
		}
	}
	if !strings.Contains(want["xa"], "user.k=v") || !strings.Contains(want["suid"], "04755 1234:1234") {
		t.Fatalf("the branch on the first mount: xa %q, suid %q", want["xa"], want["suid"])
	}
	sameTrees(t, "pulled branch", want, snapshot(t, b.view("work"), true))
	diffA := ok(t, nil, "diff", "--json", a.view("work"))
	diffB := ok(t, nil, "diff", "--json", b.view("work"))
	if strings.ReplaceAll(diffA, a.mnt, "") != strings.ReplaceAll(diffB, b.mnt, "") {
		t.Errorf("diffs differ:\n%s\n%s", diffA, diffB)
	}

	// Pushing it again sends the manifest only; so does pushing another
	// branch holding the same files.
	again := push(t, env, a.view("work"), first.URL)
	if again.Stats.Stored != 0 {
		t.Errorf("second push of an unchanged branch stored %d chunks", again.Stats.Stored)
	}
	ok(t, nil, "create", "same", a.mnt, "-p", "work")
	other := push(t, env, a.view("same"), "s3://"+bucket+"/team/same")
	if other.Stats.Stored != 0 {
		t.Errorf("a push of an empty child stored %d chunks", other.Stats.Stored)
	}
	ok(t, nil, "abort", a.view("same"))

	ok(t, nil, "commit", b.view("work"))
	sameTrees(t, "base after the commit", snapshot(t, a.view("work"), false), snapshot(t, b.base, false))
}

// A second push of a branch in which one file of a hundred changed sends
// that file's chunk and the manifest, not the branch again.
func TestSecondPushSendsTheChange(t *testing.T) {
	w := sharedWeed(t)
	a, _ := twoHosts(t)
	bucket := w.bucket(t)
	env := w.env()
	ok(t, nil, "create", "many", a.mnt)
	v := a.view("many")
	for i := range 100 {
		must(t, os.WriteFile(filepath.Join(v, fmt.Sprintf("f%03d", i)), randomBytes(64<<10, uint64(i)), 0o644))
	}
	url := "s3://" + bucket + "/many"
	first := push(t, env, v, url)
	must(t, os.WriteFile(filepath.Join(v, "f000"), randomBytes(64<<10, 1000), 0o644))
	second := push(t, env, v, url)
	if second.Stats.Stored != 1 {
		t.Errorf("second push stored %d chunks, want 1", second.Stats.Stored)
	}
	if second.Stats.Sent >= first.Stats.Sent/10 {
		t.Errorf("second push sent %d bytes, the first %d", second.Stats.Sent, first.Stats.Sent)
	}
}
