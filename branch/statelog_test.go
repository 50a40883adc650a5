package branch

import (
	"bytes"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The state log reads up to its first torn or corrupt line: what follows
// it was never written, as far as a mount is concerned.
func TestLogReadsUpToDamage(t *testing.T) {
	record := func(name string) string {
		line, err := encodeRecord(&logRecord{Op: logCreate, Name: name, Parent: MainName})
		mustOK(t, err)
		return string(line)
	}
	checksummed := func(data string) string { return fmt.Sprintf("%08x %s\n", crc32.ChecksumIEEE([]byte(data)), data) }
	for _, c := range []struct {
		name   string
		damage string // written after the good records, then a good one
	}{
		{"no damage", ""},
		{"torn line", record("torn")[:20]},
		{"wrong checksum", "00000000" + record("bad")[8:]},
		{"no checksum", "branch-x " + record("bad")[9:]},
		{"short line", "1234\n"},
		{"checksummed, not JSON", checksummed("{not json")},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, _ := newStore(t)
			mustCreate(t, s, "a", MainName)
			mustCreate(t, s, "b", MainName)
			s.Close()
			log := s.logPath()
			data, err := os.ReadFile(log)
			mustOK(t, err)
			end := bytes.IndexByte(data, 0)
			if end < 0 {
				t.Fatal("no zero-filled tail in the log")
			}
			tail := c.damage + record("after")
			copy(data[end:], tail)
			mustOK(t, os.WriteFile(log, data, 0o600))
			s2, err := Open(s.Dir(), s.Base(), Options{})
			mustOK(t, err)
			defer s2.Close()
			want := "main:live a:live b:live"
			if c.damage == "" {
				want = "main:live a:live after:live b:live"
			}
			if got := names(s2.List(false)); got != want {
				t.Errorf("branches: %s, want %s", got, want)
			}
		})
	}
}

// A durable store flushes its records and its stages; what it does is the
// same.
func TestDurableStore(t *testing.T) {
	for _, layout := range layouts {
		t.Run(layout, func(t *testing.T) {
			s, base := newBigStore(t, layout)
			s.Close()
			s, err := Open(s.Dir(), s.Base(), Options{Durable: true})
			mustOK(t, err)
			defer s.Close()
			b := mustCreate(t, s, "b", MainName)
			changeMuch(t, b)
			want := viewTree(t, b, "", nil)
			mustCreate(t, s, "gone", MainName)
			mustAbort(t, s, "gone")
			mustCommit(t, s, "b")
			if d := diffTrees(want, viewTree(t, s.Main(), "", nil)); d != "" {
				t.Errorf("main shows other than b did: %s", d)
			}
			if left := stagesIn(t, base); len(left) > 0 {
				t.Errorf("stages left: %v", left)
			}
		})
	}
}

// What a crash can leave half done at the next mount: a branch whose
// parent's abort was recorded (aborts drop children first, but a crash may
// stop one anywhere) goes with it, a delta that no branch owns (its create
// was never recorded) goes to the trash, and so do what a commit's stage
// held and a record of a stage in the base that is no stage's. A stage in
// the base that the store did not record stays: it is not the store's.
func TestLoadDropsOrphans(t *testing.T) {
	s, _ := newStore(t)
	p := mustCreate(t, s, "p", MainName)
	write(t, p, "pf", "p")
	c := mustCreate(t, s, "c", "p")
	write(t, c, "cf", "c")
	mustCreate(t, s, "keep", MainName)
	mustOK(t, os.MkdirAll(s.deltaDir("ghost")+"/sub", 0o700))
	leftovers := []string{
		filepath.Join(s.Dir(), "stage", "1-x", "moved-aside"),
		filepath.Join(s.Dir(), "base-stages", "not-a-stage"),
	}
	mustOK(t, os.MkdirAll(leftovers[0], 0o700))
	mustOK(t, os.WriteFile(leftovers[1], []byte("42\n"), 0o600))
	foreign := filepath.Join(s.Base(), StageName+"-foreign")
	mustOK(t, os.Mkdir(foreign, 0o700))
	// The record of p's abort, and the crash before c's.
	if _, err := s.log.append(&logRecord{Op: logAbort, Name: "p"}, false); err != nil {
		t.Fatal(err)
	}
	s = reopen(t, s)
	if got := names(s.List(false)); got != "main:live keep:live" {
		t.Errorf("branches: %s", got)
	}
	for _, name := range []string{"p", "c", "ghost"} {
		if _, err := os.Lstat(s.deltaDir(name)); !os.IsNotExist(err) {
			t.Errorf("delta of %s: %v", name, err)
		}
	}
	for _, p := range append(leftovers, filepath.Dir(leftovers[0])) {
		if _, err := os.Lstat(p); !os.IsNotExist(err) {
			t.Errorf("%s after the mount: %v", p, err)
		}
	}
	if _, err := os.Lstat(foreign); err != nil {
		t.Errorf("a stage directory the store did not make: %v", err)
	}
}

// A log that cannot be read stops the mount, saying so, and changes
// nothing.
func TestLogUnreadable(t *testing.T) {
	s, base := newStore(t)
	mustCreate(t, s, "a", MainName)
	s.Close()
	log := s.logPath()
	mustOK(t, os.Rename(log, log+".saved"))
	mustOK(t, os.Mkdir(log, 0o700))
	before := diskTree(t, base)
	if s2, err := Open(s.Dir(), base, Options{}); err == nil || !strings.Contains(err.Error(), "directory") {
		if s2 != nil {
			s2.Close()
		}
		t.Fatalf("a store whose log is a directory: %v", err)
	}
	if d := diffTrees(before, diskTree(t, base)); d != "" {
		t.Errorf("the base changed: %s", d)
	}
	mustOK(t, os.Remove(log))
	mustOK(t, os.Rename(log+".saved", log))
	s = reopen(t, s)
	if got := names(s.List(false)); got != "main:live a:live" {
		t.Errorf("branches once the log is back: %s", got)
	}
}

// A commit whose journal is longer than the log's allocated tail grows the
// log first, and is all there at the next mount.
func TestCommitJournalOutgrowsTheLog(t *testing.T) {
	s, base := newStore(t)
	b := mustCreate(t, s, "b", MainName)
	// Each file in a base directory is a step of its own, named twice in
	// the journal: over a MiB (logChunk) of steps.
	n := logChunk/(2*240) + 200
	name := func(i int) string { return fmt.Sprintf("d/%s%05d", strings.Repeat("n", 235), i) }
	for i := range n {
		write(t, b, name(i), "b")
	}
	size := func() int64 {
		fi, err := os.Stat(s.logPath())
		mustOK(t, err)
		return fi.Size()
	}
	before := size()
	mustCommit(t, s, "b")
	if after := size(); after <= before {
		t.Errorf("the log stayed %d bytes long", after)
	}
	s = reopen(t, s)
	for _, i := range []int{0, n / 2, n - 1} {
		if data, err := os.ReadFile(filepath.Join(base, name(i))); err != nil || string(data) != "b" {
			t.Errorf("%s after the commit and a new mount: %q, %v", name(i), data, err)
		}
	}
	if got := names(s.List(false)); got != "main:live" {
		t.Errorf("branches: %s", got)
	}
}
