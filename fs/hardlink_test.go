package fs_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"
)

// TestHardlinkedBaseFiles: two names of one base file are two files in a
// branch (its copy-up parts them, as overlayfs without an index does), so
// a write through one name lands in that name only, each shows one link,
// and unlinking one leaves the other, open or not, with its link.
func TestHardlinkedBaseFiles(t *testing.T) {
	m := newMount(t, "")
	must(t, os.Link(filepath.Join(m.base, "file"), filepath.Join(m.base, "same")))
	b := m.create("b")
	// The kernel knows both names before the write, as after an ls -l.
	for _, n := range []string{"same", "file"} {
		_, err := os.Lstat(filepath.Join(b, n))
		must(t, err)
	}
	writeFile(t, filepath.Join(b, "file"), "changed\n")
	wantContent(t, filepath.Join(b, "file"), "changed\n")
	wantContent(t, filepath.Join(b, "same"), "base file\n")
	for _, n := range []string{"file", "same"} {
		var st unix.Stat_t
		must(t, unix.Lstat(filepath.Join(b, n), &st))
		if st.Nlink != 1 {
			t.Errorf("%s in the branch: nlink %d, want 1", n, st.Nlink)
		}
	}
	if out := m.ok("diff", b); out != "M file\n" {
		t.Errorf("diff = %q, want %q", out, "M file\n")
	}

	// Open one name for writing, unlink the other: the open one keeps
	// its name and its link.
	f, err := os.OpenFile(filepath.Join(b, "same"), os.O_WRONLY|os.O_APPEND, 0)
	must(t, err)
	must(t, os.Remove(filepath.Join(b, "file")))
	var st unix.Stat_t
	must(t, unix.Fstat(int(f.Fd()), &st))
	if st.Nlink != 1 {
		t.Errorf("open same after unlinking file: nlink %d, want 1", st.Nlink)
	}
	_, err = f.WriteString("more\n")
	must(t, err)
	must(t, f.Close())
	wantContent(t, filepath.Join(b, "same"), "base file\nmore\n")
	wantMissing(t, filepath.Join(b, "file"))
	// The base is untouched until the commit.
	wantContent(t, filepath.Join(m.base, "file"), "base file\n")
	m.ok("commit", b)
	wantContent(t, filepath.Join(m.base, "same"), "base file\nmore\n")
	wantMissing(t, filepath.Join(m.base, "file"))
}

// linkScripts run, as the conformance scripts do, in a native directory and
// in a branch's directory, on files that start in the base: "f" (10
// bytes), "o" and, owned by uid 65534, "mine" beside root's 0600 "secret"
// in a directory anyone may write. Every file is read first, so that its
// inode used passthrough (newMount passes every file through) before the
// link copies it up. An exclusive create of an existing name fails, and
// makes the kernel look that name up again, as a rename's target does.
var linkScripts = map[string][]step{
	// A name that stood for the linked file is given to another: the
	// file keeps its other name, and one link.
	"replaced": {
		root("read", "f"), root("link", "f", "l"), root("stat", "f", "nlink"), root("sameino", "f", "l"),
		root("rename", "o", "l"), root("stat", "f", "nlink"), root("stat", "l", "nlink,size"), root("cat", "f"),
		root("copyrange", "f", "l", "0", "1", "4"), root("cat", "l"),
		root("link", "f", "m"), root("unlink", "f"), root("stat", "m", "nlink"), root("cat", "m"),
	},
	// Attributes changed through one name are the file's, seen through
	// every name.
	"attrs": {
		root("read", "f"), root("link", "f", "l"), root("stat", "f", "mtime,mode"), root("create", "l", "0644"),
		root("stat", "l", "mtime"),
		root("utimens", "l", "1000", "2000"), root("stat", "f", "atime,mtime"),
		root("utimens", "f", "3000", "4000"), root("stat", "l", "atime,mtime"),
		root("chmod", "l", "0600"), root("stat", "f", "mode"), root("setxattr", "f", "user.x", "1"),
		root("getxattr", "l", "user.x"),
	},
	// Data changed through one name is the file's.
	"data": {
		root("read", "f"), root("link", "f", "l"), root("read", "l"), root("create", "l", "0644"), root("read", "f"),
		root("read", "l"), root("zero", "l", "2", "4"), root("cat", "f"), root("cat", "l"),
		root("truncate", "f", "3"), root("cat", "l"), root("stat", "l", "size"),
	},
	// Two names of one file are one file to copy_file_range(2) too: the
	// kernel refuses overlapping ranges within one file.
	"copyrange": {
		root("read", "f"), root("link", "f", "l"), root("create", "l", "0644"), root("copyrange", "f", "l", "0", "2", "4"),
		root("copyrange", "l", "f", "0", "6", "4"), root("cat", "f"),
	},
	// The attack: an ordinary user links its own file, moves root's
	// private file over the link's name, and changes its own file's mode,
	// xattrs and ACL. All of it must stay on the user's file.
	"attack": {
		as(65534, 65534, "read", "mine"), as(65534, 65534, "link", "mine", "l"),
		as(65534, 65534, "rename", "secret", "l"),
		as(65534, 65534, "chmod", "mine", "0666"), as(65534, 65534, "setxattr", "mine", "user.x", "1"),
		as(65534, 65534, "setacl", "mine", "u::6,u:65534:6,g::4,m::6,o::4"),
		root("stat", "l", "mode,uid,nlink"), root("getxattr", "l", "user.x"), root("getacl", "l"),
		root("stat", "mine", "mode,uid,nlink"), root("getxattr", "mine", "user.x"), root("getacl", "mine"),
		as(65534, 65534, "cat", "l"), as(65534, 65534, "open", "l", "w"), as(65534, 65534, "cat", "mine"),
	},
}

// linkBase makes the files linkScripts start with in dir.
func linkBase(t *testing.T, dir string) {
	must(t, os.Mkdir(dir, 0o777))
	must(t, os.Chmod(dir, 0o777))
	writeFile(t, filepath.Join(dir, "f"), "0123456789")
	writeFile(t, filepath.Join(dir, "o"), "other")
	writeFile(t, filepath.Join(dir, "mine"), "the user's")
	must(t, os.Chown(filepath.Join(dir, "mine"), userUID, userUID))
	writeFile(t, filepath.Join(dir, "secret"), "root's secret")
	must(t, os.Chmod(filepath.Join(dir, "secret"), 0o600))
}

// TestHardlinksOfBaseFiles runs linkScripts in a branch, whose links copy
// base files up, and natively, and requires the same transcript; then it
// commits and requires the base to hold what the native directory does.
func TestHardlinksOfBaseFiles(t *testing.T) {
	m := newMount(t, "")
	native := t.TempDir()
	must(t, os.Chmod(native, 0o755))
	for name := range linkScripts {
		linkBase(t, filepath.Join(native, name))
		linkBase(t, filepath.Join(m.base, name))
	}
	b := m.create("b")
	for name, script := range linkScripts {
		t.Run(name, func(t *testing.T) {
			want, got := runScript(t, filepath.Join(native, name), script), runScript(t, filepath.Join(b, name), script)
			t.Logf("native transcript: %q", want)
			for i := range script {
				if want[i] != got[i] {
					t.Errorf("step %d %v %v: native %q, branch %q", i, script[i].op, script[i].args, want[i], got[i])
				}
			}
		})
	}
	m.ok("commit", b)
	for name := range linkScripts {
		if diff := compareTrees(filepath.Join(native, name), filepath.Join(m.base, name)); diff != "" {
			t.Errorf("%s after the commit: %s", name, diff)
		}
	}
	if _, err := unix.Getxattr(filepath.Join(m.base, "attack", "l"), "system.posix_acl_access", nil); err != unix.ENODATA {
		t.Errorf("root's file after the commit: ACL %v, want none", err)
	}
}

// TestLinkedCopyKeepsNoBacking: a name linked to a base file that a reader
// holds open with passthrough is the branch's copy; a write through it
// reaches the copy, never the base file the reader's inode passes reads to.
func TestLinkedCopyKeepsNoBacking(t *testing.T) {
	m := newMount(t, "")
	b := m.create("b")
	r, err := os.Open(filepath.Join(b, "file"))
	must(t, err)
	defer r.Close()
	_, err = r.Read(make([]byte, 4)) // passthrough, to the base file
	must(t, err)
	must(t, os.Link(filepath.Join(b, "file"), filepath.Join(b, "l")))
	w, err := os.OpenFile(filepath.Join(b, "l"), os.O_RDWR, 0)
	must(t, err)
	_, err = w.WriteAt([]byte("BRANCH"), 0)
	must(t, err)
	must(t, w.Close())
	wantContent(t, filepath.Join(m.base, "file"), "base file\n")
	wantContent(t, filepath.Join(b, "l"), "BRANCHile\n")
	wantContent(t, filepath.Join(b, "file"), "BRANCHile\n")
	must(t, r.Close())
	m.ok("commit", b)
	wantContent(t, filepath.Join(m.base, "file"), "BRANCHile\n")
	wantContent(t, filepath.Join(m.base, "l"), "BRANCHile\n")
}

// TestLinkOverRootsFile replays the attack with the mount's default options
// (passthrough for files of 1 MiB and more) as an ordinary user, with the
// shell's tools: root's private file, moved over the name of a link to the
// user's own file, keeps its mode and stays unreadable to the user, before
// and after the commit.
func TestLinkOverRootsFile(t *testing.T) {
	dir := t.TempDir()
	must(t, os.Chmod(dir, 0o755))
	must(t, os.Chmod(filepath.Dir(dir), 0o755))
	m := &mount{t: t, base: filepath.Join(dir, "base"), store: filepath.Join(dir, "store"), mnt: filepath.Join(dir, "mnt"),
		args: []string{"--passthrough-min-size", strconv.Itoa(1 << 20)}}
	must(t, os.MkdirAll(m.mnt, 0o755))
	sampleTree(t, m.base)
	shared := filepath.Join(m.base, "shared")
	must(t, os.Mkdir(shared, 0o777))
	must(t, os.Chmod(shared, 0o777))
	writeFile(t, filepath.Join(shared, "secret"), "root's secret\n")
	must(t, os.Chmod(filepath.Join(shared, "secret"), 0o600))
	big := filepath.Join(shared, "big")
	must(t, os.WriteFile(big, bytes.Repeat([]byte("u"), 2<<20), 0o644))
	must(t, os.Chown(big, userUID, userUID))
	m.start()
	t.Cleanup(m.cleanup)
	b := m.create("b")
	out, err := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--", "sh", "-c",
		`cd "$0" && cat big >/dev/null && ln big L && mv secret L && chmod 666 big && ! cat L 2>/dev/null`,
		filepath.Join(b, "shared")).CombinedOutput()
	if err != nil {
		t.Errorf("attack as uid %d: %v: %s", userUID, err, out)
	}
	check := func(where string) {
		t.Helper()
		for name, want := range map[string]uint32{"L": 0o600, "big": 0o666} {
			var st unix.Stat_t
			must(t, unix.Stat(filepath.Join(where, name), &st))
			if st.Mode&0o7777 != want {
				t.Errorf("%s/%s: mode %o, want %o", where, name, st.Mode&0o7777, want)
			}
		}
		wantContent(t, filepath.Join(where, "L"), "root's secret\n")
	}
	check(filepath.Join(b, "shared"))
	m.ok("commit", b)
	check(shared)
}

// TestDirectoryLinkCounts: a directory of a branch counts the
// subdirectories it shows, wherever they are kept (st_nlink is 2 and one for
// each), after its copy-up, mkdir, rmdir and renames, in a nested branch too,
// by stat and in a listing's attributes.
func TestDirectoryLinkCounts(t *testing.T) {
	m := newMount(t, "")
	native := t.TempDir()
	tree := func(dir string) {
		for _, d := range []string{"d/s1/x", "d/s2", "d/s3", "e"} {
			must(t, os.MkdirAll(filepath.Join(dir, "n", d), 0o755))
		}
		writeFile(t, filepath.Join(dir, "n", "d", "f"), "f\\n")
	}
	tree(native)
	tree(m.base)
	script := []step{
		root("stat", "d", "nlink"), root("create", "d/new", "0644"), root("stat", "d", "nlink"), root("nlinks", "."),
		root("mkdir", "d/s4", "0755"), root("stat", "d", "nlink"), root("rmdir", "d/s2"), root("stat", "d", "nlink"),
		root("rename", "d/s1", "e/s1"), root("stat", "d", "nlink"), root("stat", "e", "nlink"), root("nlinks", "."),
		root("rename", "e", "d/e"), root("stat", "d", "nlink"), root("nlinks", "d"), root("stat", ".", "nlink"),
		root("mkdir", "d/s2", "0755"), root("stat", "d", "nlink"), root("rmdir", "d/s3"), root("nlinks", "."),
	}
	// The inner branch starts from what the outer one shows, and does it
	// all again: its directories merge three layers.
	var prev []string
	for _, view := range []string{"outer", "inner"} {
		b := m.create(view, prev...)
		nd := filepath.Join(native, view)
		if prev == nil {
			must(t, os.Rename(filepath.Join(native, "n"), nd))
		} else if out, err := exec.Command("cp", "-a", filepath.Join(native, "outer"), nd).CombinedOutput(); err != nil {
			t.Fatalf("cp: %v: %s", err, out)
		}
		want, got := runScript(t, nd, script), runScript(t, filepath.Join(b, "n"), script)
		for i := range script {
			if want[i] != got[i] {
				t.Errorf("%s: step %d %v %v: native %q, branch %q", view, i, script[i].op, script[i].args, want[i], got[i])
			}
		}
		prev = []string{view}
	}
	// The view's root counts what it shows too.
	b := m.view("inner")
	ents, err := os.ReadDir(b)
	must(t, err)
	dirs := 0
	for _, d := range ents {
		if d.IsDir() {
			dirs++
		}
	}
	var st unix.Stat_t
	must(t, unix.Stat(b, &st))
	if int(st.Nlink) != 2+dirs {
		t.Errorf("root of the inner branch: nlink %d, want %d", st.Nlink, 2+dirs)
	}
}

// TestLinkRightAfterPassthroughRead links base files the moment a
// passthrough read of each has closed, and requires the source's name to
// show the link at once, as natively: two links, the link's inode. The
// copy-up gives the name another inode (Node.bound), which the kernel must
// find at the next walk, not once a drop sent after the reply comes in.
func TestLinkRightAfterPassthroughRead(t *testing.T) {
	m := newMount(t, "")
	const files = 50
	for i := 0; i < files; i++ {
		writeFile(t, filepath.Join(m.base, "f"+strconv.Itoa(i)), "0123456789")
	}
	b := m.create("b")
	for i := 0; i < files; i++ {
		f, l := filepath.Join(b, "f"+strconv.Itoa(i)), filepath.Join(b, "l"+strconv.Itoa(i))
		wantContent(t, f, "0123456789")
		must(t, os.Link(f, l))
		var sf, sl unix.Stat_t
		must(t, unix.Stat(f, &sf))
		must(t, unix.Stat(l, &sl))
		if sf.Nlink != 2 || sf.Ino != sl.Ino {
			t.Errorf("%s after the link: nlink %d, inode %d; the link's inode %d", f, sf.Nlink, sf.Ino, sl.Ino)
		}
	}
}
