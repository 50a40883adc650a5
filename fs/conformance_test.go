package fs_test

import (
	endian "encoding/binary"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The conformance test runs each script twice, in a directory on the
// native filesystem and in a directory of a branch view, and requires the
// same transcript: every step's errno and every stat answer. A step runs
// as root, or as another user in a helper process, so permission checks
// are exercised as a test suite run by root with -u/-g would.

type step struct {
	uid, gid int // -1: root in this process
	op       string
	args     []string
}

func as(uid, gid int, op string, args ...string) step { return step{uid, gid, op, args} }
func root(op string, args ...string) step             { return step{-1, -1, op, args} }

var conformanceScripts = map[string][]step{
	"chmod": {
		root("create", "f", "0644"), root("mkdir", "d", "0755"), root("mkfifo", "p", "0644"),
		root("mknod", "c", "0644"), root("socket", "s"),
		root("chmod", "f", "0111"), root("stat", "f", "mode"),
		root("chmod", "d", "0111"), root("stat", "d", "mode"),
		root("chmod", "p", "0111"), root("stat", "p", "mode"),
		root("chmod", "c", "0111"), root("stat", "c", "mode"),
		root("chmod", "s", "0111"), root("stat", "s", "mode"),
		root("mark", "f"), root("chmod", "f", "0644"), root("changed", "f"),
		root("mark", "f"), as(65534, 65534, "chmod", "f", "0777"), root("changed", "f"), root("stat", "f", "mode"),
		root("create", "g", "0755"), root("chown", "g", "65534", "65534"),
		as(65534, 65534, "chmod", "g", "02755"), root("stat", "g", "mode"),
		as(65534, 65533, "chmod", "g", "02755"), root("stat", "g", "mode"),
		root("symlink", "f", "l"), root("chmod", "l", "0600"), root("stat", "f", "mode"), root("lstat", "l", "type"),
	},
	"chown": {
		root("create", "f", "0644"), root("chmod", "f", "06555"),
		root("mark", "f"), root("chown", "f", "65534", "65533"), root("stat", "f", "mode,uid,gid"), root("changed", "f"),
		as(65534, 65533, "chown", "f", "65533", "65533"), root("stat", "f", "uid,gid"),
		as(65534, 65533, "chown", "f", "-1", "65534"), root("stat", "f", "uid,gid"),
		root("chmod", "f", "06755"), as(65534, 65533, "chown", "f", "-1", "65533"), root("stat", "f", "mode"),
		root("mkdir", "d", "0755"), root("chown", "d", "65534", "65534"), root("stat", "d", "uid,gid"),
		root("symlink", "f", "l"), root("lchown", "l", "65532", "65532"), root("lstat", "l", "uid,gid"), root("stat", "f", "uid,gid"),
		// chown(-1, -1) changes nothing but the ctime.
		root("mark", "f"), root("chown", "f", "-1", "-1"), root("changed", "f"),
		root("mark", "d"), root("chown", "d", "-1", "-1"), root("changed", "d"),
		root("mark", "l"), root("lchown", "l", "-1", "-1"), root("changed", "l"),
	},
	"link": {
		root("create", "f", "0644"), root("mark", "f"), root("link", "f", "g"), root("stat", "f", "nlink"),
		root("changed", "f"), root("link", "f", "g"), root("link", "missing", "h"),
		root("mkdir", "d", "0755"), root("link", "d", "e"), root("unlink", "g"), root("stat", "f", "nlink"),
		root("chmod", ".", "0755"), as(65534, 65534, "link", "f", "x"),
		root("mkdir", "w", "0777"), as(65534, 65534, "link", "f", "w/x"), root("stat", "w/x", "nlink,uid"),
	},
	"rename": {
		root("create", "a", "0644"), root("mkdir", "d", "0755"), root("mkdir", "e", "0755"),
		root("create", "e/x", "0644"), root("mark", "a"), root("rename", "a", "b"), root("changed", "b"),
		root("rename", "d", "b"), root("rename", "b", "d"), root("rename", "d", "e"), root("rename", "d", "d/sub"),
		root("mark", "."), root("rename", "b", "d/b"), root("changed", "."), root("changed", "d"),
		root("mkdir", "sticky", "01777"), root("create", "sticky/mine", "0644"), root("chown", "sticky/mine", "65534", "65534"),
		root("create", "sticky/theirs", "0644"), root("chown", "sticky/theirs", "65533", "65533"),
		as(65534, 65534, "rename", "sticky/theirs", "sticky/x"), as(65534, 65534, "rename", "sticky/mine", "sticky/y"),
		root("stat", "sticky/y", "uid"),
	},
	"unlink": {
		root("mkdir", "d", "0755"), root("create", "d/f", "0644"), root("mark", "d"),
		root("unlink", "d/f"), root("changed", "d"), root("unlink", "d"), root("rmdir", "d"), root("rmdir", "d"),
		root("mkdir", "s", "01777"), root("create", "s/f", "0644"), as(65534, 65534, "unlink", "s/f"),
		root("chown", "s/f", "65534", "65534"), as(65534, 65534, "unlink", "s/f"), root("lstat", "s/f", "type"),
		root("mkdir", "r", "0755"), root("create", "r/f", "0644"), as(65534, 65534, "unlink", "r/f"),
	},
	"open": {
		root("chmod", ".", "0777"), as(65534, 65534, "create", "f", "0640"), root("stat", "f", "mode,uid,gid"),
		as(65533, 65533, "open", "f", "r"), as(65533, 65534, "open", "f", "r"), as(65533, 65534, "open", "f", "w"),
		root("mark", "f"), root("open", "f", "wt"), root("changed", "f"),
		root("mkdir", "d", "0755"), root("open", "d", "w"), root("open", "f/x", "r"),
		root("symlink", "f", "l"), root("open", "l", "rn"), root("create", "f", "0644"),
		root("mkdir", "g", "02775"), root("chown", "g", "0", "65530"), root("create", "g/x", "0644"), root("stat", "g/x", "gid"),
		root("mkdir", "g/sub", "0755"), root("stat", "g/sub", "gid,mode"),
	},
	// An unprivileged write, truncate or O_TRUNC open drops setuid, and
	// setgid when group execute is set; any write drops file capabilities.
	"killpriv": {
		root("create", "f", "0666"), root("chmod", "f", "06777"), as(65534, 65534, "write", "f"), root("stat", "f", "mode"),
		root("write", "f"), root("chmod", "f", "06777"), root("write", "f"), root("stat", "f", "mode"),
		as(65534, 65534, "truncate", "f", "0"), root("stat", "f", "mode"),
		root("chmod", "f", "06777"), as(65534, 65534, "open", "f", "wt"), root("stat", "f", "mode"),
		root("chmod", "f", "06767"), as(65534, 65534, "write", "f"), root("stat", "f", "mode"),
		root("chmod", "f", "06777"), as(65534, 65534, "write", "f"), as(65534, 65534, "write", "f"), root("stat", "f", "mode"),
		root("setcap", "f"), root("hascap", "f"), as(65534, 65534, "write", "f"), root("hascap", "f"),
		root("setcap", "f"), root("write", "f"), root("hascap", "f"),
		root("setcap", "f"), as(65534, 65534, "truncate", "f", "1"), root("hascap", "f"),
		root("setcap", "f"), root("chmod", "f", "06777"), root("chown", "f", "65534", "65534"), root("hascap", "f"), root("stat", "f", "mode"),
		// A file an O_TRUNC open creates keeps the mode it was made with.
		root("chmod", ".", "0777"), as(65534, 65534, "createtrunc", "n", "04755"), root("stat", "n", "mode"),
		as(65534, 65534, "createtrunc", "n", "04755"), root("stat", "n", "mode"),
	},
	"truncate": {
		root("create", "f", "0644"), root("truncate", "f", "12345"), root("stat", "f", "size"),
		root("mark", "f"), root("truncate", "f", "10"), root("changed", "f"),
		as(65534, 65534, "truncate", "f", "0"), root("chmod", "f", "0666"), as(65534, 65534, "truncate", "f", "0"),
		root("stat", "f", "size"), root("mkdir", "d", "0755"), root("truncate", "d", "0"), root("truncate", "f", "-1"),
	},
	"utimens": {
		root("create", "f", "0644"), root("utimens", "f", "1000", "2000"), root("stat", "f", "atime,mtime"),
		as(65534, 65534, "utimens", "f", "now", "now"), as(65534, 65534, "utimens", "f", "1", "1"),
		root("chmod", "f", "0666"), as(65534, 65534, "utimens", "f", "now", "now"), as(65534, 65534, "utimens", "f", "1", "1"),
		root("chown", "f", "65534", "65534"), as(65534, 65534, "utimens", "f", "3000", "4000"), root("stat", "f", "atime,mtime"),
	},
	"mkdir": {
		root("mkdir", "d", "0700"), root("stat", "d", "mode,nlink"), root("mkdir", "d", "0755"),
		root("mark", "."), root("mkdir", "e", "0755"), root("changed", "."), root("stat", ".", "nlink"),
		root("chmod", ".", "0755"), as(65534, 65534, "mkdir", "x", "0755"),
		root("mkdir", strings.Repeat("n", 255), "0755"), root("mkdir", strings.Repeat("n", 256), "0755"),
	},
	// POSIX ACLs grant and deny as on the filesystem below: named users
	// and groups, the mask, chmod of an ACL'd file, default ACLs that new
	// files and directories inherit, and the setgid bit an ACL change by
	// an owner outside the file's group drops.
	"acl": {
		root("create", "f", "0600"), root("setacl", "f", "u::6,u:65534:6,g::0,m::6,o::0"), root("stat", "f", "mode"),
		root("getacl", "f"), as(65534, 65534, "open", "f", "r"), as(65534, 65534, "write", "f"),
		as(65533, 65533, "open", "f", "r"), root("chmod", "f", "0600"), root("getacl", "f"),
		as(65534, 65534, "open", "f", "r"), root("chmod", "f", "0660"), as(65534, 65534, "open", "f", "r"),
		root("rmacl", "f"), root("getacl", "f"), root("stat", "f", "mode"), as(65534, 65534, "open", "f", "r"),
		root("create", "g", "0640"), root("setacl", "g", "u::6,g::4,g:65533:6,m::6,o::0"),
		as(65533, 65533, "write", "g"), as(65532, 65532, "open", "g", "r"),
		root("mkdir", "d", "0755"), root("setdefacl", "d", "u::7,u:65534:7,g::5,m::7,o::5"),
		root("getdefacl", "d"), root("create", "d/x", "0666"), root("stat", "d/x", "mode"), root("getacl", "d/x"),
		as(65534, 65534, "write", "d/x"), root("mkdir", "d/sub", "0777"), root("stat", "d/sub", "mode"),
		root("getacl", "d/sub"), root("getdefacl", "d/sub"), as(65534, 65534, "create", "d/sub/y", "0644"),
		root("umask", "022", "create", "d/u", "0666"), root("stat", "d/u", "mode"),
		root("umask", "022", "mkdir", "d/v", "0777"), root("stat", "d/v", "mode"),
		root("umask", "027", "mkfifo", "d/w", "0666"), root("stat", "d/w", "mode"),
		root("umask", "022", "create", "u", "0666"), root("stat", "u", "mode"),
		root("umask", "077", "mkdir", "v", "0777"), root("stat", "v", "mode"),
		root("create", "s", "0644"), root("chown", "s", "65534", "0"), root("chmod", "s", "02775"),
		as(65534, 65534, "setacl", "s", "u::7,u:65533:7,g::7,m::7,o::5"), root("stat", "s", "mode"),
		as(65533, 65533, "setacl", "s", "u::7,g::7,o::5"), root("getacl", "s"),
	},
	"symlink": {
		root("symlink", "target", "l"), root("readlink", "l"), root("lstat", "l", "type,size"), root("symlink", "x", "l"),
		root("symlink", strings.Repeat("t", 1023), "long"), root("readlink", "long"), root("stat", "l", "type"),
	},
}

func TestConformance(t *testing.T) {
	m := newMount(t, "")
	b := m.create("conformance")
	native := t.TempDir()
	must(t, os.Chmod(native, 0o755))
	for name, script := range conformanceScripts {
		t.Run(name, func(t *testing.T) {
			nd, bd := filepath.Join(native, "c-"+name), filepath.Join(b, "c-"+name)
			must(t, os.Mkdir(nd, 0o755))
			must(t, os.Mkdir(bd, 0o755))
			want, got := runScript(t, nd, script), runScript(t, bd, script)
			t.Logf("native transcript: %q", want)
			for i := range script {
				if want[i] != got[i] {
					t.Errorf("step %d %v %v: native %q, branch %q", i, script[i].op, script[i].args, want[i], got[i])
				}
			}
		})
	}
}

// runScript runs script in dir and returns one answer per step.
func runScript(t *testing.T, dir string, script []step) []string {
	marks := map[string]unix.Stat_t{}
	out := make([]string, len(script))
	for i, s := range script {
		if s.op == "mark" || s.op == "changed" {
			// Far enough apart for second and nanosecond clocks alike.
			time.Sleep(10 * time.Millisecond)
			var st unix.Stat_t
			if err := unix.Lstat(filepath.Join(dir, s.args[0]), &st); err != nil {
				out[i] = err.Error()
				continue
			}
			if s.op == "mark" {
				marks[s.args[0]] = st
				continue
			}
			old := marks[s.args[0]]
			out[i] = fmt.Sprintf("ctime changed %v, mtime changed %v", st.Ctim != old.Ctim, st.Mtim != old.Mtim)
			continue
		}
		if s.uid < 0 {
			out[i] = fsop(dir, s.op, s.args)
			continue
		}
		cmd := exec.Command(helper)
		cmd.Env = append(os.Environ(), "BRANCHFS_FSOP="+strings.Join(append([]string{dir, s.op}, s.args...), "\x1f"))
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(s.uid), Gid: uint32(s.gid)}}
		res, err := cmd.Output()
		if err != nil {
			t.Fatalf("helper: %v", err)
		}
		out[i] = strings.TrimSpace(string(res))
	}
	return out
}

// fsopHelper runs one step and exits, when this binary was started as the
// helper process of runScript.
func fsopHelper() {
	if spec := os.Getenv("BRANCHFS_FSOP"); spec != "" {
		f := strings.Split(spec, "\x1f")
		fmt.Println(fsop(f[0], f[1], f[2:]))
		os.Exit(0)
	}
}

func fsop(dir, op string, a []string) string {
	mask := 0
	if op == "umask" { // umask MASK OP ARGS...: OP under that umask
		m, _ := strconv.ParseUint(a[0], 8, 32)
		mask, op, a = int(m), a[1], a[2:]
	}
	// Put back afterwards: a step run in the test process would leave
	// its umask to the directories later tests make (t.TempDir).
	defer syscall.Umask(syscall.Umask(mask))
	p := func(i int) string { return filepath.Join(dir, a[i]) }
	num := func(i int) int {
		n, _ := strconv.ParseInt(a[i], 0, 64)
		return int(n)
	}
	var err error
	switch op {
	case "create":
		var fd int
		if fd, err = unix.Open(p(0), unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY, uint32(num(1))); err == nil {
			unix.Close(fd)
		}
	case "createtrunc":
		var fd int
		if fd, err = unix.Open(p(0), unix.O_CREAT|unix.O_TRUNC|unix.O_WRONLY, uint32(num(1))); err == nil {
			unix.Close(fd)
		}
	case "open":
		flags := map[string]int{"r": unix.O_RDONLY, "w": unix.O_WRONLY, "wt": unix.O_WRONLY | unix.O_TRUNC, "rn": unix.O_RDONLY | unix.O_NOFOLLOW}[a[1]]
		var fd int
		if fd, err = unix.Open(p(0), flags, 0); err == nil {
			unix.Close(fd)
		}
	case "write":
		var fd int
		if fd, err = unix.Open(p(0), unix.O_WRONLY|unix.O_APPEND, 0); err == nil {
			_, err = unix.Write(fd, []byte("x"))
			unix.Close(fd)
		}
	case "ioctl", "ctl": // control_test.go
		err = controlOp(op, p(0), a[1])
	case "setcap":
		// A version 2 capability set: CAP_NET_BIND_SERVICE permitted.
		capSet := []byte{0, 0, 0, 2, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
		err = unix.Setxattr(p(0), "security.capability", capSet, 0)
	case "hascap":
		_, err = unix.Getxattr(p(0), "security.capability", make([]byte, 64))
	case "setacl", "setdefacl":
		err = unix.Setxattr(p(0), aclXattr[op], encodeACL(a[1]), 0)
	case "getacl", "getdefacl":
		buf := make([]byte, 1024)
		n, err := unix.Getxattr(p(0), aclXattr[op], buf)
		if err != nil {
			return err.Error()
		}
		return decodeACL(buf[:n])
	case "rmacl":
		err = unix.Removexattr(p(0), aclXattr["getacl"])
	case "mkdir":
		err = unix.Mkdir(p(0), uint32(num(1)))
	case "mkfifo":
		err = unix.Mkfifo(p(0), uint32(num(1)))
	case "mknod":
		err = unix.Mknod(p(0), unix.S_IFCHR|uint32(num(1)), int(unix.Mkdev(1, 3)))
	case "socket":
		var l net.Listener
		if l, err = net.Listen("unix", p(0)); err == nil {
			l.(*net.UnixListener).SetUnlinkOnClose(false)
			l.Close()
		}
	case "symlink":
		err = unix.Symlink(a[0], p(1))
	case "readlink":
		buf := make([]byte, 4096)
		n, err := unix.Readlink(p(0), buf)
		if err != nil {
			return err.Error()
		}
		return string(buf[:n])
	case "link":
		err = unix.Link(p(0), p(1))
	case "unlink":
		err = unix.Unlink(p(0))
	case "rmdir":
		err = unix.Rmdir(p(0))
	case "rename":
		err = unix.Rename(p(0), p(1))
	case "chmod":
		err = unix.Chmod(p(0), uint32(num(1)))
	case "chown":
		err = unix.Chown(p(0), num(1), num(2))
	case "lchown":
		err = unix.Lchown(p(0), num(1), num(2))
	case "truncate":
		err = unix.Truncate(p(0), int64(num(1)))
	case "utimens":
		ts := make([]unix.Timespec, 2)
		for i := range ts {
			if a[1+i] == "now" {
				ts[i] = unix.Timespec{Nsec: unix.UTIME_NOW}
			} else {
				ts[i] = unix.Timespec{Sec: int64(num(1 + i))}
			}
		}
		err = unix.UtimesNano(p(0), ts)
	case "read": // an open for reading that reads: passthrough, where the view passes the file
		var data []byte
		if data, err = os.ReadFile(p(0)); err == nil {
			return fmt.Sprintf("read %d", len(data))
		}
	case "cat":
		var data []byte
		if data, err = os.ReadFile(p(0)); err == nil {
			return fmt.Sprintf("%q", data)
		}
	case "setxattr":
		err = unix.Setxattr(p(0), a[1], []byte(a[2]), 0)
	case "getxattr":
		buf := make([]byte, 256)
		n, err := unix.Getxattr(p(0), a[1], buf)
		if err != nil {
			return err.Error()
		}
		return string(buf[:n])
	case "zero": // zero FILE OFF LEN: fallocate(FALLOC_FL_ZERO_RANGE) through an open for writing
		var fd int
		if fd, err = unix.Open(p(0), unix.O_RDWR, 0); err == nil {
			err = unix.Fallocate(fd, unix.FALLOC_FL_ZERO_RANGE|unix.FALLOC_FL_KEEP_SIZE, int64(num(1)), int64(num(2)))
			unix.Close(fd)
		}
	case "copyrange": // copyrange FROM TO OFFIN OFFOUT LEN
		var in, out int
		if in, err = unix.Open(p(0), unix.O_RDONLY, 0); err != nil {
			break
		}
		defer unix.Close(in)
		if out, err = unix.Open(p(1), unix.O_WRONLY, 0); err != nil {
			break
		}
		defer unix.Close(out)
		offIn, offOut := int64(num(2)), int64(num(3))
		var n int
		if n, err = unix.CopyFileRange(in, &offIn, out, &offOut, num(4), 0); err == nil {
			return fmt.Sprintf("copied %d", n)
		}
	case "nlinks": // nlinks DIR: the link count of every directory listed in DIR
		var ents []os.DirEntry
		if ents, err = os.ReadDir(p(0)); err != nil {
			break
		}
		var out []string
		for _, d := range ents {
			var st unix.Stat_t
			if err = unix.Lstat(filepath.Join(p(0), d.Name()), &st); err != nil {
				break
			}
			if d.IsDir() {
				out = append(out, fmt.Sprintf("%s:%d", d.Name(), st.Nlink))
			}
		}
		if err == nil {
			return strings.Join(out, " ")
		}
	case "sameino": // sameino A B: whether two names show one inode number
		var sa, sb unix.Stat_t
		if err = unix.Lstat(p(0), &sa); err == nil {
			if err = unix.Lstat(p(1), &sb); err == nil {
				return fmt.Sprintf("same inode %v", sa.Ino == sb.Ino)
			}
		}
	case "stat", "lstat":
		var st unix.Stat_t
		if op == "stat" {
			err = unix.Stat(p(0), &st)
		} else {
			err = unix.Lstat(p(0), &st)
		}
		if err != nil {
			return err.Error()
		}
		var fields []string
		for _, f := range strings.Split(a[1], ",") {
			fields = append(fields, f+"="+statField(&st, f))
		}
		return strings.Join(fields, " ")
	default:
		return "unknown op " + op
	}
	if pe, ok := err.(*os.PathError); ok {
		err = pe.Err // the same on both sides
	}
	if err != nil {
		return err.Error()
	}
	return "ok"
}

func statField(st *unix.Stat_t, f string) string {
	switch f {
	case "mode":
		return fmt.Sprintf("%o", st.Mode&07777)
	case "type":
		return fmt.Sprintf("%o", st.Mode&unix.S_IFMT)
	case "uid":
		return strconv.Itoa(int(st.Uid))
	case "gid":
		return strconv.Itoa(int(st.Gid))
	case "nlink":
		return strconv.Itoa(int(st.Nlink))
	case "size":
		return strconv.FormatInt(st.Size, 10)
	case "atime":
		return strconv.FormatInt(st.Atim.Sec, 10)
	case "mtime":
		return strconv.FormatInt(st.Mtim.Sec, 10)
	}
	return "?" + f
}

var aclXattr = map[string]string{
	"setacl": "system.posix_acl_access", "getacl": "system.posix_acl_access",
	"setdefacl": "system.posix_acl_default", "getdefacl": "system.posix_acl_default",
}

// aclTags are the tags of the ACL xattr format (acl(5) entries), in the
// order the kernel requires them.
var aclTags = []struct {
	short string
	tag   uint16
}{{"u", 0x01}, {"g", 0x04}, {"m", 0x10}, {"o", 0x20}}

// encodeACL turns "u::6,u:65534:6,g::4,m::6,o::0" into the xattr form:
// version 2, then tag, permissions and id for each entry, little endian.
func encodeACL(spec string) []byte {
	out := endian.LittleEndian.AppendUint32(nil, 2)
	for _, e := range strings.Split(spec, ",") {
		f := strings.Split(e, ":")
		perm, _ := strconv.Atoi(f[2])
		id := uint32(0xffffffff)
		var tag uint16
		for _, t := range aclTags {
			if t.short == f[0] {
				tag = t.tag
			}
		}
		if f[1] != "" {
			n, _ := strconv.Atoi(f[1])
			id = uint32(n)
			tag <<= 1 // ACL_USER and ACL_GROUP follow their _OBJ tags
		}
		out = endian.LittleEndian.AppendUint16(out, tag)
		out = endian.LittleEndian.AppendUint16(out, uint16(perm))
		out = endian.LittleEndian.AppendUint32(out, id)
	}
	return out
}

// decodeACL is the inverse of encodeACL.
func decodeACL(b []byte) string {
	var entries []string
	for b = b[4:]; len(b) >= 8; b = b[8:] {
		tag, perm, id := endian.LittleEndian.Uint16(b), endian.LittleEndian.Uint16(b[2:]), endian.LittleEndian.Uint32(b[4:])
		e := fmt.Sprintf("?%x::%d", tag, perm)
		for _, t := range aclTags {
			switch tag {
			case t.tag:
				e = fmt.Sprintf("%s::%d", t.short, perm)
			case t.tag << 1:
				e = fmt.Sprintf("%s:%d:%d", t.short, id, perm)
			}
		}
		entries = append(entries, e)
	}
	return strings.Join(entries, ",")
}
