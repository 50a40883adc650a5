package remote

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

// The tests that mount (every test of push and pull) do so for real
// through the branchfs binary; they need root and /dev/fuse, and skip
// without them.

var binary string // branchfs, built for the tests

var (
	shared     *weed
	sharedOnce sync.Once
	sharedErr  error
)

func TestMain(m *testing.M) {
	var dir string
	if canMount() {
		var err error
		if dir, err = os.MkdirTemp("", "branchfs-bin"); err != nil {
			panic(err)
		}
		// The unprivileged tests run it as another user.
		os.Chmod(dir, 0o755)
		binary = filepath.Join(dir, "branchfs")
		cmd := exec.Command("go", "build", "-o", binary, "../cmd/branchfs")
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
		if err := cmd.Run(); err != nil {
			fmt.Println("building branchfs:", err)
			os.Exit(1)
		}
	}
	code := m.Run()
	if shared != nil {
		shared.stop()
	}
	if dir != "" {
		os.RemoveAll(dir)
	}
	os.Exit(code)
}

func canMount() bool {
	_, err := os.Stat("/dev/fuse")
	return os.Geteuid() == 0 && err == nil
}

func needMount(t testing.TB) {
	t.Helper()
	if !canMount() {
		t.Skip("mounts branchfs: needs root and /dev/fuse")
	}
}

// sharedWeed is one server for the tests that do not stop theirs; each
// test has a bucket of its own.
func sharedWeed(t testing.TB) *weed {
	t.Helper()
	weedBinary(t)
	sharedOnce.Do(func() {
		w := &weed{}
		func() {
			defer func() {
				if r := recover(); r != nil {
					sharedErr = fmt.Errorf("%v", r)
				}
			}()
			w = newWeed(&onceT{t})
		}()
		shared = w
	})
	if sharedErr != nil {
		t.Fatal(sharedErr)
	}
	return shared
}

// onceT turns the fatal errors of a setup shared by tests into a panic
// that sharedWeed reports to every test.
type onceT struct{ testing.TB }

func (o *onceT) Fatal(args ...any)                 { panic(fmt.Sprint(args...)) }
func (o *onceT) Fatalf(format string, args ...any) { panic(fmt.Sprintf(format, args...)) }

// side is one host of an exchange: a base and its mount.
type side struct {
	base, mnt, store string
}

// mountBase mounts base on a fresh mount point with a store of its own.
func mountBase(t testing.TB, base string) *side {
	t.Helper()
	dir := t.TempDir()
	s := &side{base: base, mnt: filepath.Join(dir, "mnt"), store: filepath.Join(dir, "store")}
	must(t, os.Mkdir(s.mnt, 0o755))
	if out, err := exec.Command(binary, "mount", "--base", base, "--store", s.store, s.mnt).CombinedOutput(); err != nil {
		t.Fatalf("mount: %v: %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command(binary, "unmount", s.mnt).CombinedOutput(); err != nil {
			t.Errorf("unmount %s: %v: %s", s.mnt, err, out)
			unix.Unmount(s.mnt, unix.MNT_DETACH)
		}
	})
	return s
}

func (s *side) view(name string) string { return filepath.Join(s.mnt, "@"+name) }

// result is what a command printed and how it exited.
type result struct {
	stdout, stderr string
	code           int
}

// cli runs branchfs with env (nil: this process's) and returns its result.
func cli(t testing.TB, env []string, args ...string) result {
	t.Helper()
	cmd := exec.Command(binary, args...)
	cmd.Env = env
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	r := result{out.String(), errb.String(), 0}
	if err != nil {
		ee, ok := err.(*exec.ExitError)
		if !ok {
			t.Fatalf("branchfs %s: %v", strings.Join(args, " "), err)
		}
		r.code = ee.ExitCode()
	}
	return r
}

// ok runs branchfs and fails the test unless it exits 0.
func ok(t testing.TB, env []string, args ...string) string {
	t.Helper()
	r := cli(t, env, args...)
	if r.code != 0 {
		t.Fatalf("branchfs %s: exit %d: %s%s", strings.Join(args, " "), r.code, r.stdout, r.stderr)
	}
	return r.stdout
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// snapshot describes every entry under root (root itself not), one line
// a path: type, mode, owner, size, content hash, symlink target, xattrs
// and, with times, the mtime.
func snapshot(t testing.TB, root string, times bool) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == root {
			return nil
		}
		rel, _ := filepath.Rel(root, p)
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		desc := fmt.Sprintf("%s %#o %d:%d", typeOf(st.Mode), st.Mode&07777, st.Uid, st.Gid)
		switch typeOf(st.Mode) {
		case "file":
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			sum := sha256.Sum256(data)
			desc += fmt.Sprintf(" %d %s", len(data), hex.EncodeToString(sum[:8]))
		case "symlink":
			target, _ := os.Readlink(p)
			desc += " -> " + target
		}
		if times && (typeOf(st.Mode) != "dir") {
			desc += fmt.Sprintf(" mtime %d", st.Mtim.Nano())
		}
		desc += " " + xattrList(t, p)
		out[rel] = desc
		return nil
	})
	must(t, err)
	return out
}

func xattrList(t testing.TB, p string) string {
	buf := make([]byte, 64<<10)
	n, err := unix.Llistxattr(p, buf)
	if err != nil {
		return "xattrs: " + err.Error()
	}
	var parts []string
	for _, name := range strings.Split(string(buf[:n]), "\x00") {
		if name == "" || strings.HasPrefix(name, "security.") {
			continue
		}
		val := make([]byte, 64<<10)
		m, err := unix.Lgetxattr(p, name, val)
		if err != nil {
			parts = append(parts, name+"=?"+err.Error())
			continue
		}
		parts = append(parts, name+"="+string(val[:m]))
	}
	sort.Strings(parts)
	return "[" + strings.Join(parts, " ") + "]"
}

// sameTrees fails t where two snapshots differ.
func sameTrees(t testing.TB, what string, want, got map[string]string) {
	t.Helper()
	var paths []string
	for p := range want {
		paths = append(paths, p)
	}
	for p := range got {
		if _, ok := want[p]; !ok {
			paths = append(paths, p)
		}
	}
	sort.Strings(paths)
	bad := 0
	for _, p := range paths {
		if want[p] != got[p] {
			bad++
			if bad <= 20 {
				t.Errorf("%s: %s: want %q, got %q", what, p, want[p], got[p])
			}
		}
	}
}
