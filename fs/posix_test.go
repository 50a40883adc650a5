package fs_test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// posixChecks run in an empty directory of a view and compare what the view
// does with what any POSIX filesystem does.
var posixChecks = map[string]func(t *testing.T, d string){
	"CreateReadWrite": func(t *testing.T, d string) {
		p := filepath.Join(d, "f")
		writeFile(t, p, "hello")
		f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
		must(t, err)
		f.WriteString(" world")
		f.Close()
		wantContent(t, p, "hello world")
	},
	"OTrunc": func(t *testing.T, d string) {
		p := filepath.Join(d, "f")
		writeFile(t, p, "long content")
		f, err := os.OpenFile(p, os.O_WRONLY|os.O_TRUNC, 0)
		must(t, err)
		f.WriteString("x")
		f.Close()
		wantContent(t, p, "x")
	},
	"Truncate": func(t *testing.T, d string) {
		p := filepath.Join(d, "f")
		writeFile(t, p, "0123456789")
		must(t, os.Truncate(p, 4))
		wantContent(t, p, "0123")
		must(t, os.Truncate(p, 6))
		wantContent(t, p, "0123\x00\x00")
	},
	"ExclusiveCreate": func(t *testing.T, d string) {
		p := filepath.Join(d, "f")
		writeFile(t, p, "x")
		_, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
		wantErrno(t, err, syscall.EEXIST)
	},
	"MkdirRmdir": func(t *testing.T, d string) {
		p := filepath.Join(d, "sub")
		must(t, os.Mkdir(p, 0o750))
		writeFile(t, filepath.Join(p, "f"), "x")
		wantErrno(t, syscall.Rmdir(p), syscall.ENOTEMPTY)
		must(t, os.Remove(filepath.Join(p, "f")))
		must(t, syscall.Rmdir(p))
		wantMissing(t, p)
	},
	"Readdir": func(t *testing.T, d string) {
		for _, n := range []string{"a", "b", "c"} {
			writeFile(t, filepath.Join(d, n), n)
		}
		must(t, os.Remove(filepath.Join(d, "b")))
		ents, err := os.ReadDir(d)
		must(t, err)
		if len(ents) != 2 || ents[0].Name() != "a" || ents[1].Name() != "c" {
			t.Errorf("readdir = %v, want [a c]", ents)
		}
	},
	"ReaddirAgain": func(t *testing.T, d string) {
		// The kernel lists a directory again once its copy of the
		// listing is gone, as after memory pressure; the daemon then
		// leaves out the attributes of the names whose inodes the kernel
		// holds.
		writeFile(t, filepath.Join(d, "a"), "a")
		writeFile(t, filepath.Join(d, "b"), "b")
		must(t, os.Chmod(filepath.Join(d, "b"), 0o600))
		must(t, os.Mkdir(filepath.Join(d, "c"), 0o700))
		if _, err := os.ReadDir(d); err != nil {
			t.Fatal(err)
		}
		writeFile(t, filepath.Join(d, "e"), "e") // made after the first listing
		must(t, os.WriteFile("/proc/sys/vm/drop_caches", []byte("1"), 0o200))
		ents, err := os.ReadDir(d)
		must(t, err)
		want := map[string]os.FileMode{"a": 0o644, "b": 0o600, "c": os.ModeDir | 0o700, "e": 0o644}
		if len(ents) != len(want) {
			t.Errorf("readdir = %v, want %d names", ents, len(want))
		}
		for _, e := range ents {
			fi, err := e.Info()
			if err != nil {
				t.Errorf("%s listed again: %v", e.Name(), err)
			} else if fi.Mode() != want[e.Name()] {
				t.Errorf("%s listed again: mode %v, want %v", e.Name(), fi.Mode(), want[e.Name()])
			}
		}
	},
	"Rename": func(t *testing.T, d string) {
		a, b := filepath.Join(d, "a"), filepath.Join(d, "b")
		writeFile(t, a, "A")
		writeFile(t, b, "B")
		var before syscall.Stat_t
		must(t, syscall.Stat(a, &before))
		must(t, os.Rename(a, b))
		wantMissing(t, a)
		wantContent(t, b, "A")
		var after syscall.Stat_t
		must(t, syscall.Stat(b, &after))
		if after.Ino != before.Ino {
			t.Errorf("rename changed the inode: %d -> %d", before.Ino, after.Ino)
		}
		must(t, os.Mkdir(filepath.Join(d, "dir"), 0o755))
		must(t, os.Rename(filepath.Join(d, "dir"), filepath.Join(d, "dir2")))
		wantMissing(t, filepath.Join(d, "dir"))
	},
	"RenameFlags": func(t *testing.T, d string) {
		a, b := filepath.Join(d, "a"), filepath.Join(d, "b")
		writeFile(t, a, "A")
		writeFile(t, b, "B")
		wantErrno(t, unix.Renameat2(unix.AT_FDCWD, a, unix.AT_FDCWD, b, unix.RENAME_NOREPLACE), syscall.EEXIST)
		must(t, unix.Renameat2(unix.AT_FDCWD, a, unix.AT_FDCWD, b, unix.RENAME_EXCHANGE))
		wantContent(t, a, "B")
		wantContent(t, b, "A")
	},
	"RenameDirOverNonEmpty": func(t *testing.T, d string) {
		a, b := filepath.Join(d, "a"), filepath.Join(d, "b")
		must(t, os.Mkdir(a, 0o755))
		must(t, os.Mkdir(b, 0o755))
		writeFile(t, filepath.Join(b, "f"), "x")
		wantErrno(t, syscall.Rename(a, b), syscall.ENOTEMPTY)
	},
	"ChmodChownUtimes": func(t *testing.T, d string) {
		p := filepath.Join(d, "f")
		writeFile(t, p, "x")
		must(t, os.Chmod(p, 0o4751))
		must(t, os.Lchown(p, 1234, 5678))
		mt := time.Date(2001, 2, 3, 4, 5, 6, 789, time.UTC)
		must(t, os.Chtimes(p, mt, mt))
		var st syscall.Stat_t
		must(t, syscall.Lstat(p, &st))
		if st.Mode&07777 != 0o751 && st.Mode&07777 != 0o4751 {
			t.Errorf("mode = %o", st.Mode&07777)
		}
		if st.Uid != 1234 || st.Gid != 5678 {
			t.Errorf("owner = %d:%d, want 1234:5678", st.Uid, st.Gid)
		}
		if st.Mtim.Sec != mt.Unix() || st.Mtim.Nsec != 789 {
			t.Errorf("mtime = %v, want %v", st.Mtim, mt)
		}
	},
	"Symlink": func(t *testing.T, d string) {
		p := filepath.Join(d, "l")
		must(t, os.Symlink("target/../x", p))
		got, err := os.Readlink(p)
		must(t, err)
		if got != "target/../x" {
			t.Errorf("readlink = %q", got)
		}
		fi, err := os.Lstat(p)
		must(t, err)
		if fi.Mode()&os.ModeSymlink == 0 {
			t.Errorf("lstat mode = %v, want a symlink", fi.Mode())
		}
	},
	"Hardlink": func(t *testing.T, d string) {
		a, b := filepath.Join(d, "a"), filepath.Join(d, "b")
		writeFile(t, a, "one")
		must(t, os.Link(a, b))
		var sa, sb syscall.Stat_t
		must(t, syscall.Stat(a, &sa))
		must(t, syscall.Stat(b, &sb))
		if sa.Ino != sb.Ino || sb.Nlink != 2 {
			t.Errorf("links: ino %d/%d nlink %d, want one inode with 2 links", sa.Ino, sb.Ino, sb.Nlink)
		}
		f, err := os.OpenFile(b, os.O_WRONLY|os.O_APPEND, 0)
		must(t, err)
		f.WriteString("two")
		f.Close()
		wantContent(t, a, "onetwo")
		must(t, os.Remove(a))
		must(t, syscall.Stat(b, &sb))
		if sb.Nlink != 1 {
			t.Errorf("nlink after unlink = %d, want 1", sb.Nlink)
		}
	},
	"Xattr": func(t *testing.T, d string) {
		p := filepath.Join(d, "f")
		writeFile(t, p, "x")
		must(t, unix.Setxattr(p, "user.test", []byte("value"), 0))
		buf := make([]byte, 64)
		n, err := unix.Getxattr(p, "user.test", buf)
		must(t, err)
		if string(buf[:n]) != "value" {
			t.Errorf("getxattr = %q", buf[:n])
		}
		n, err = unix.Listxattr(p, buf)
		must(t, err)
		if !bytes.Contains(buf[:n], []byte("user.test\x00")) {
			t.Errorf("listxattr = %q", buf[:n])
		}
		if bytes.Contains(buf[:n], []byte("branchfs")) {
			t.Errorf("listxattr shows internal names: %q", buf[:n])
		}
		must(t, unix.Removexattr(p, "user.test"))
		_, err = unix.Getxattr(p, "user.test", buf)
		wantErrno(t, err, syscall.ENODATA)
	},
	"FifoAndDevice": func(t *testing.T, d string) {
		fifo := filepath.Join(d, "fifo")
		must(t, syscall.Mkfifo(fifo, 0o600))
		go func() {
			f, err := os.OpenFile(fifo, os.O_WRONLY, 0)
			if err == nil {
				f.WriteString("through the pipe")
				f.Close()
			}
		}()
		wantContent(t, fifo, "through the pipe")
		dev := filepath.Join(d, "null")
		must(t, syscall.Mknod(dev, syscall.S_IFCHR|0o666, int(unix.Mkdev(1, 3))))
		var st syscall.Stat_t
		must(t, syscall.Stat(dev, &st))
		if st.Rdev != unix.Mkdev(1, 3) {
			t.Errorf("rdev = %#x", st.Rdev)
		}
	},
	"SparseFile": func(t *testing.T, d string) {
		p := filepath.Join(d, "sparse")
		f, err := os.Create(p)
		must(t, err)
		f.WriteAt([]byte("end"), 64<<20)
		f.Close()
		var st syscall.Stat_t
		must(t, syscall.Stat(p, &st))
		if st.Size != 64<<20+3 || st.Blocks*512 > 1<<20 {
			t.Errorf("sparse file: size %d, %d bytes allocated", st.Size, st.Blocks*512)
		}
		fd, err := unix.Open(p, unix.O_RDONLY, 0)
		must(t, err)
		defer unix.Close(fd)
		off, err := unix.Seek(fd, 0, unix.SEEK_DATA)
		must(t, err)
		if off < 1<<20 {
			t.Errorf("SEEK_DATA = %d, want past the hole", off)
		}
	},
	"Mmap": func(t *testing.T, d string) {
		p := filepath.Join(d, "m")
		writeFile(t, p, string(make([]byte, 8192)))
		fd, err := unix.Open(p, unix.O_RDWR, 0)
		must(t, err)
		mem, err := unix.Mmap(fd, 0, 8192, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		must(t, err)
		copy(mem[4096:], "mapped")
		must(t, unix.Msync(mem, unix.MS_SYNC))
		must(t, unix.Munmap(mem))
		unix.Close(fd)
		if got := readFile(t, p)[4096:4102]; got != "mapped" {
			t.Errorf("after mmap write read %q", got)
		}
	},
	"Exec": func(t *testing.T, d string) {
		p := filepath.Join(d, "script.sh")
		must(t, os.WriteFile(p, []byte("#!/bin/sh\necho ran \"$1\"\n"), 0o755))
		out, err := exec.Command(p, "here").CombinedOutput()
		if err != nil || string(out) != "ran here\n" {
			t.Errorf("exec: %v %q", err, out)
		}
	},
	"UnlinkOpenFile": func(t *testing.T, d string) {
		p := filepath.Join(d, "f")
		writeFile(t, p, "still here")
		f, err := os.Open(p)
		must(t, err)
		defer f.Close()
		must(t, os.Remove(p))
		buf := make([]byte, 32)
		n, _ := f.Read(buf)
		if string(buf[:n]) != "still here" {
			t.Errorf("read of unlinked file = %q", buf[:n])
		}
	},
	// tar sets a directory's times after filling it; du and find (fts)
	// then compare each directory's inode number with what ".." gives.
	"InodeNumberKeptBySetattr": func(t *testing.T, d string) {
		sub, f := filepath.Join(d, "sub"), filepath.Join(d, "f")
		must(t, os.Mkdir(sub, 0o755))
		writeFile(t, f, "x")
		dir := inodeNumber(t, d)
		want := map[string]uint64{sub: inodeNumber(t, sub), f: inodeNumber(t, f)}
		must(t, os.Chmod(sub, 0o700))
		must(t, os.Chtimes(sub, time.Unix(1e9, 0), time.Unix(1e9, 0)))
		must(t, os.Chown(f, 1000, 1000))
		must(t, os.Truncate(f, 0))
		w, err := os.OpenFile(f, os.O_WRONLY, 0)
		must(t, err)
		must(t, w.Chmod(0o600))
		var st unix.Stat_t
		must(t, unix.Fstat(int(w.Fd()), &st))
		w.Close()
		if st.Ino != want[f] {
			t.Errorf("fstat after fchmod: inode %d, want %d", st.Ino, want[f])
		}
		for p, ino := range want {
			if got := inodeNumber(t, p); got != ino || got == 0 {
				t.Errorf("%s: inode %d after setattr, %d before", filepath.Base(p), got, ino)
			}
		}
		must(t, os.Chmod(d, 0o755))
		dotdot, err := os.Open(filepath.Join(sub, ".."))
		must(t, err)
		defer dotdot.Close()
		must(t, unix.Fstat(int(dotdot.Fd()), &st))
		if st.Ino != dir || inodeNumber(t, d) != dir {
			t.Errorf("after chmod: sub/.. has inode %d, the directory %d; before, %d", st.Ino, inodeNumber(t, d), dir)
		}
	},
	"DeepTree":                deepTree,
	"AttrsOfOpenFile":         attrsOfOpenFile(os.O_WRONLY),
	"AttrsOfReadOnlyOpenFile": attrsOfOpenFile(os.O_RDONLY),
	"Permissions": func(t *testing.T, d string) {
		must(t, os.Chmod(d, 0o755))
		p := filepath.Join(d, "secret")
		writeFile(t, p, "x")
		must(t, os.Chmod(p, 0o600))
		out, err := exec.Command("setpriv", "--reuid", "1000", "--regid", "1000", "--clear-groups", "cat", p).CombinedOutput()
		if err == nil || !bytes.Contains(out, []byte("Permission denied")) {
			t.Errorf("uid 1000 read a 0600 root file: %v %s", err, out)
		}
		must(t, os.Chmod(d, 0o777))
		out, err = exec.Command("setpriv", "--reuid", "1000", "--regid", "1000", "--clear-groups", "touch", filepath.Join(d, "mine")).CombinedOutput()
		if err != nil {
			t.Fatalf("uid 1000 could not create: %v %s", err, out)
		}
		var st syscall.Stat_t
		must(t, syscall.Stat(filepath.Join(d, "mine"), &st))
		if st.Uid != 1000 || st.Gid != 1000 {
			t.Errorf("new file owned by %d:%d, want 1000:1000", st.Uid, st.Gid)
		}
	},
}

// TestPOSIX runs the table on the main view, a branch and a nested branch.
func TestPOSIX(t *testing.T) {
	m := newMount(t, "")
	views := []struct{ name, dir string }{{"main", m.mnt}}
	run := func(view string) {
		for name, check := range posixChecks {
			t.Run(view+"/"+name, func(t *testing.T) {
				d := filepath.Join(views[len(views)-1].dir, "t-"+view+"-"+name)
				must(t, os.Mkdir(d, 0o755))
				check(t, d)
			})
		}
	}
	run("main")
	views = append(views, struct{ name, dir string }{"branch", m.create("b1")})
	run("branch")
	views = append(views, struct{ name, dir string }{"nested", m.create("b2", "b1")})
	run("nested")
	// Whatever the branches did, the base saw none of it.
	for name := range posixChecks {
		for _, view := range []string{"branch", "nested"} {
			wantMissing(t, filepath.Join(m.base, "t-"+view+"-"+name))
		}
	}
}

// attrsOfOpenFile: fchmod, fchown, futimes, fgetxattr and flistxattr act on
// the open file, also once its name has been given to another file.
func attrsOfOpenFile(flag int) func(t *testing.T, d string) {
	return func(t *testing.T, d string) {
		p, q := filepath.Join(d, "f"), filepath.Join(d, "g")
		writeFile(t, p, "old")
		must(t, unix.Setxattr(p, "user.k", []byte("v"), 0))
		f, err := os.OpenFile(p, flag, 0)
		must(t, err)
		defer f.Close()
		writeFile(t, q, "new")
		must(t, os.Rename(q, p))
		fd := int(f.Fd())
		must(t, unix.Fchmod(fd, 0o600))
		must(t, unix.Fchown(fd, 1000, 1000))
		must(t, unix.Futimes(fd, []unix.Timeval{{Sec: 1e9}, {Sec: 1e9}}))
		buf := make([]byte, 64)
		n, err := unix.Fgetxattr(fd, "user.k", buf)
		if err != nil || string(buf[:n]) != "v" {
			t.Errorf("fgetxattr = %q, %v; want \"v\"", buf[:max(n, 0)], err)
		}
		n, err = unix.Flistxattr(fd, buf)
		if err != nil || !bytes.Contains(buf[:max(n, 0)], []byte("user.k\x00")) {
			t.Errorf("flistxattr = %q, %v; want user.k", buf[:max(n, 0)], err)
		}
		must(t, unix.Fsetxattr(fd, "user.k2", []byte("w"), 0))
		must(t, unix.Fremovexattr(fd, "user.k"))
		n, err = unix.Flistxattr(fd, buf)
		if err != nil || string(buf[:max(n, 0)]) != "user.k2\x00" {
			t.Errorf("flistxattr after fsetxattr and fremovexattr = %q, %v; want user.k2", buf[:max(n, 0)], err)
		}
		var st unix.Stat_t
		must(t, unix.Fstat(fd, &st))
		if st.Mode&0o7777 != 0o600 || st.Uid != 1000 || st.Gid != 1000 || st.Mtim.Sec != 1e9 {
			t.Errorf("open file: mode %o, owner %d:%d, mtime %d", st.Mode&0o7777, st.Uid, st.Gid, st.Mtim.Sec)
		}
		must(t, unix.Stat(p, &st))
		if st.Mode&0o7777 == 0o600 || st.Uid != 0 || st.Mtim.Sec == 1e9 {
			t.Errorf("the file now named f changed: mode %o, owner %d, mtime %d", st.Mode&0o7777, st.Uid, st.Mtim.Sec)
		}
		if _, err := unix.Getxattr(p, "user.k", buf); err != unix.ENODATA {
			t.Errorf("getxattr of the file now named f: %v, want ENODATA", err)
		}
		if _, err := unix.Getxattr(p, "user.k2", buf); err != unix.ENODATA {
			t.Errorf("getxattr of the file now named f: %v, want ENODATA", err)
		}
		// An unlinked open file keeps its attributes too.
		g, err := os.OpenFile(p, flag, 0)
		must(t, err)
		defer g.Close()
		must(t, os.Remove(p))
		must(t, unix.Fsetxattr(int(g.Fd()), "user.gone", []byte("x"), 0))
		if n, err := unix.Fgetxattr(int(g.Fd()), "user.gone", buf); err != nil || string(buf[:n]) != "x" {
			t.Errorf("fgetxattr of an unlinked file: %q, %v", buf[:max(n, 0)], err)
		}
		must(t, unix.Fremovexattr(int(g.Fd()), "user.gone"))
	}
}

// deepTree: a tree deeper than PATH_MAX, reached as processes reach it,
// relative to a directory deep in it, works as on the filesystem below:
// the view's own paths from its root are no limit.
func deepTree(t *testing.T, d string) {
	name := strings.Repeat("d", 250)
	fd, err := unix.Open(d, unix.O_PATH|unix.O_DIRECTORY, 0)
	must(t, err)
	defer func() { unix.Close(fd) }()
	for range 20 { // 5 KB below d
		must(t, unix.Mkdirat(fd, name, 0o755))
		next, err := unix.Openat(fd, name, unix.O_PATH|unix.O_DIRECTORY, 0)
		must(t, err)
		unix.Close(fd)
		fd = next
	}
	f, err := unix.Openat(fd, "f", unix.O_CREAT|unix.O_WRONLY|unix.O_EXCL, 0o640)
	must(t, err)
	_, err = unix.Write(f, []byte("deep"))
	unix.Close(f)
	must(t, err)
	var st unix.Stat_t
	must(t, unix.Fstatat(fd, "f", &st, unix.AT_SYMLINK_NOFOLLOW))
	if st.Mode&0o7777 != 0o640 || st.Size != 4 {
		t.Errorf("deep file: mode %o, size %d; want 640, 4", st.Mode&0o7777, st.Size)
	}
	must(t, unix.Renameat(fd, "f", fd, "g"))
	must(t, unix.Symlinkat("g", fd, "l"))
	must(t, unix.Linkat(fd, "g", fd, "h", 0))
	must(t, unix.Mkdirat(fd, "sub", 0o700))
	must(t, unix.Fchmodat(fd, "g", 0o600, 0))
	must(t, unix.Setxattr(procFd(fd)+"/g", "user.k", []byte("v"), 0))
	buf := make([]byte, 8)
	if n, err := unix.Readlinkat(fd, "l", buf); err != nil || string(buf[:n]) != "g" {
		t.Errorf("readlink of the deep symlink: %q, %v", buf[:max(n, 0)], err)
	}
	must(t, unix.Unlinkat(fd, "h", 0))
	must(t, unix.Unlinkat(fd, "sub", unix.AT_REMOVEDIR))
	if n, err := unix.Getxattr(procFd(fd), "user.none", buf); err != unix.ENODATA {
		t.Errorf("getxattr of the deep directory: %d, %v; want ENODATA", n, err)
	}
}

func procFd(fd int) string { return "/proc/self/fd/" + strconv.Itoa(fd) }

// TestAttrsOfOrphanedLowerFile: a base file opened read-only in a branch,
// whose name the branch then removes or gives to another file, takes
// fchmod, fchown, futimens, fsetxattr and fremovexattr as on ext4, and
// reads on; the change goes to a copy of the branch's own, never to the
// base, also after the branch is committed.
func TestAttrsOfOrphanedLowerFile(t *testing.T) {
	for _, pass := range []string{"auto", "off"} {
		t.Run(pass, func(t *testing.T) { attrsOfOrphanedLowerFile(t, pass) })
	}
}

func attrsOfOrphanedLowerFile(t *testing.T, passthrough string) {
	m := newMount(t, passthrough)
	for _, name := range []string{"unlinked", "renamed-over"} {
		p := filepath.Join(m.base, name)
		writeFile(t, p, "base data")
		must(t, unix.Setxattr(p, "user.k", []byte("v"), 0))
		must(t, os.Chmod(p, 0o644))
		must(t, os.Chtimes(p, time.Unix(5e8, 0), time.Unix(5e8, 0)))
	}
	// The base's inodes, held open: the commit removes their names.
	var before [2]unix.Stat_t
	var baseFds [2]int
	for i, name := range []string{"unlinked", "renamed-over"} {
		f, err := os.Open(filepath.Join(m.base, name))
		must(t, err)
		defer f.Close()
		baseFds[i] = int(f.Fd())
		must(t, unix.Fstat(baseFds[i], &before[i]))
	}
	b := m.create("orphan")
	var files []*os.File
	for _, name := range []string{"unlinked", "renamed-over"} {
		f, err := os.Open(filepath.Join(b, name))
		must(t, err)
		defer f.Close()
		files = append(files, f)
	}
	must(t, os.Remove(filepath.Join(b, "unlinked")))
	writeFile(t, filepath.Join(b, "new"), "new")
	must(t, os.Rename(filepath.Join(b, "new"), filepath.Join(b, "renamed-over")))
	buf := make([]byte, 64)
	for _, f := range files {
		fd := int(f.Fd())
		// Before any change, the attributes are read from the base's file.
		if n, err := unix.Fgetxattr(fd, "user.k", buf); err != nil || string(buf[:n]) != "v" {
			t.Errorf("%s: fgetxattr before a change = %q, %v; want v", f.Name(), buf[:max(n, 0)], err)
		}
		if n, err := unix.Flistxattr(fd, buf); err != nil || string(buf[:max(n, 0)]) != "user.k\x00" {
			t.Errorf("%s: flistxattr before a change = %q, %v; want user.k", f.Name(), buf[:max(n, 0)], err)
		}
		must(t, unix.Fchmod(fd, 0o600))
		must(t, unix.Fchown(fd, 1000, 1000))
		must(t, unix.UtimesNanoAt(fd, "", []unix.Timespec{{Sec: 1e9}, {Sec: 1e9}}, unix.AT_EMPTY_PATH))
		must(t, unix.Fsetxattr(fd, "user.k2", []byte("w"), 0))
		must(t, unix.Fremovexattr(fd, "user.k"))
		n, err := unix.Flistxattr(fd, buf)
		if err != nil || string(buf[:max(n, 0)]) != "user.k2\x00" {
			t.Errorf("%s: flistxattr = %q, %v; want user.k2", f.Name(), buf[:max(n, 0)], err)
		}
		var st unix.Stat_t
		must(t, unix.Fstat(fd, &st))
		if st.Mode&0o7777 != 0o600 || st.Uid != 1000 || st.Gid != 1000 || st.Mtim.Sec != 1e9 || st.Size != 9 {
			t.Errorf("%s: fstat: mode %o, owner %d:%d, mtime %d, size %d", f.Name(), st.Mode&0o7777, st.Uid, st.Gid, st.Mtim.Sec, st.Size)
		}
		n, err = unix.Pread(fd, buf, 0)
		if err != nil || string(buf[:max(n, 0)]) != "base data" {
			t.Errorf("%s: read after the change = %q, %v", f.Name(), buf[:max(n, 0)], err)
		}
	}
	// The commit unlinks the base's names, which changes their ctime.
	baseUnchanged := func(when string, ctime bool) {
		t.Helper()
		for i, name := range []string{"unlinked", "renamed-over"} {
			var st unix.Stat_t
			must(t, unix.Fstat(baseFds[i], &st))
			if st.Mode != before[i].Mode || st.Uid != before[i].Uid || st.Gid != before[i].Gid ||
				st.Mtim != before[i].Mtim || ctime && st.Ctim != before[i].Ctim {
				t.Errorf("%s: base %s changed: mode %o owner %d:%d mtime %v", when, name, st.Mode, st.Uid, st.Gid, st.Mtim)
			}
			n, err := unix.Fgetxattr(baseFds[i], "user.k", buf)
			if err != nil || string(buf[:n]) != "v" {
				t.Errorf("%s: base %s user.k = %q, %v", when, name, buf[:max(n, 0)], err)
			}
			if _, err := unix.Fgetxattr(baseFds[i], "user.k2", buf); err != unix.ENODATA {
				t.Errorf("%s: base %s has user.k2: %v", when, name, err)
			}
		}
	}
	baseUnchanged("before commit", true)
	m.ok("commit", b)
	baseUnchanged("after commit", false)
	if got := readFile(t, filepath.Join(m.base, "renamed-over")); got != "new" {
		t.Errorf("after commit, renamed-over = %q, want the branch's file", got)
	}
	wantMissing(t, filepath.Join(m.base, "unlinked"))
}

// TestOrphanCopyHoldsUpNoOtherRequest: the first change of attributes
// through a descriptor of a large base file whose name the branch removed
// copies the file for the descriptor (withOrphan), which takes a while. A
// request on the same file meanwhile, which the request loop's reader
// answers (fgetxattr), must not wait for the copy there: every other
// request of the mount would wait with it.
func TestOrphanCopyHoldsUpNoOtherRequest(t *testing.T) {
	m := newMount(t, "")
	bigFile(t, filepath.Join(m.base, "big"), 256)
	notHeldUp(t, "lookups waited for the copy of an orphaned file", func(try int) bool {
		x := m.create(fmt.Sprintf("x%d", try))
		f, err := os.Open(filepath.Join(x, "big"))
		must(t, err)
		must(t, os.Remove(filepath.Join(x, "big")))
		fd := int(f.Fd())
		copying, changed := copyUpInFlight(t, m, "", func(string) error { return unix.Fchmod(fd, 0o600) })
		asked := make(chan error, 1)
		tid := make(chan int)
		go func() {
			runtime.LockOSThread() // the thread ends with the goroutine
			tid <- unix.Gettid()
			_, err := unix.Fgetxattr(fd, "user.k", make([]byte, 16))
			asked <- err
		}()
		// The lookups go after the fgetxattr: its request is queued
		// once its thread waits in the system call.
		waitInSyscall(t, <-tid, unix.SYS_FGETXATTR, asked)
		lookUpMissing(t, x)
		var first bool
		select {
		case err := <-changed:
			must(t, err)
			first = true
		default:
			must(t, <-changed)
		}
		// Before the copy the base's file answers for the file's
		// xattrs, after it the copy does; neither has user.k.
		err = <-asked
		if err != unix.ENODATA {
			t.Errorf("fgetxattr during the copy: %v, want ENODATA", err)
		}
		t.Logf("try %d: the copy ended before the lookups: %v", try, first)
		f.Close()
		for deadline := time.Now().Add(10 * time.Second); copying(); {
			if time.Now().After(deadline) {
				t.Fatal("the copy is still open after its file's release")
			}
			time.Sleep(time.Millisecond)
		}
		return first
	})
}

// waitInSyscall waits until thread tid of this process sleeps in system
// call nr, or done has a value, which it leaves there.
func waitInSyscall(t *testing.T, tid, nr int, done chan error) {
	t.Helper()
	p := fmt.Sprintf("/proc/self/task/%d/syscall", tid)
	for deadline := time.Now().Add(10 * time.Second); ; {
		if len(done) > 0 {
			return
		}
		data, err := os.ReadFile(p)
		must(t, err)
		if strings.HasPrefix(string(data), strconv.Itoa(nr)+" ") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("thread %d not in system call %d: %s", tid, nr, data)
		}
	}
}
