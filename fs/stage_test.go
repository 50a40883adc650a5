package fs_test

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"unsafe"

	"github.com/branchfs/branchfs/branch"
	"golang.org/x/sys/unix"
)

// The attacks of this file come from user 65534 against root's mount of a
// base whose root others may write (a shared workspace: mode 1777, or 0777
// with no sticky bit), with the store apart from the base, where commits
// into the base stage in the base.

// sharedBase is newMountLayout with the base's root set to mode and
// reachable by other users.
func sharedBase(t *testing.T, layout string, mode uint32, env ...string) *mount {
	t.Helper()
	m := newMountLayout(t, layout, env...)
	dir := filepath.Dir(m.base)
	must(t, os.Chmod(dir, 0o755))
	must(t, os.Chmod(filepath.Dir(dir), 0o755))
	must(t, unix.Chmod(m.base, mode))
	return m
}

// eachSharedBase runs test in each layout apart from the base, with the
// base's root of each mode others may write.
func eachSharedBase(t *testing.T, test func(t *testing.T, layout string, mode uint32)) {
	for _, layout := range []string{"apart", "bind"} {
		for _, mode := range []uint32{0o1777, 0o777} {
			layout, mode := layout, mode
			t.Run(fmt.Sprintf("%s-%o", layout, mode), func(t *testing.T) {
				t.Parallel()
				test(t, layout, mode)
			})
		}
	}
}

// attack runs a shell script as user 65534.
func attack(t *testing.T, script string, args ...string) string {
	t.Helper()
	out, err := nobody(append([]string{"sh", "-c", script, "sh"}, args...)...)
	if err != nil {
		t.Fatalf("the attacker's script: %v: %s", err, out)
	}
	return out
}

// otherStages lists the names in the base's root that begin as a stage's
// do, but for those in planted.
func otherStages(t *testing.T, m *mount, planted ...string) []string {
	t.Helper()
	ents, err := os.ReadDir(m.base)
	must(t, err)
	var out []string
	for _, e := range ents {
		n := e.Name()
		if strings.HasPrefix(n, branch.StageName) && !strings.HasSuffix(n, ".stolen") && !slices.Contains(planted, n) {
			out = append(out, n)
		}
	}
	return out
}

// TestStageAttackSymlink: a symlink to the attacker's directory, planted
// where commits used to stage, must not make root's commit write there
// (copies of private and set-user-ID files included); the commit
// succeeds, and so does the next mount.
func TestStageAttackSymlink(t *testing.T) {
	eachSharedBase(t, func(t *testing.T, layout string, mode uint32) {
		m := sharedBase(t, layout, mode)
		loot := filepath.Join(filepath.Dir(m.base), "loot")
		link := filepath.Join(m.base, branch.StageName)
		// The attacker's own directory, as it would have in /tmp.
		must(t, os.Mkdir(loot, 0o777))
		must(t, os.Chown(loot, 65534, 65534))
		attack(t, `ln -s "$1" "$2"`, loot, link)
		b := commitScenario(t, m)
		writeFile(t, filepath.Join(b, "private"), "secret\n")
		must(t, os.Chmod(filepath.Join(b, "private"), 0o600))
		writeFile(t, filepath.Join(b, "suid"), "#!/bin/sh\n")
		must(t, os.Chmod(filepath.Join(b, "suid"), 0o4755))
		// Whatever root makes in the attacker's directory, even briefly.
		in, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
		must(t, err)
		defer unix.Close(in)
		_, err = unix.InotifyAddWatch(in, loot, unix.IN_CREATE|unix.IN_MOVED_TO)
		must(t, err)

		m.ok("commit", b)
		wantOutcome(t, m, true)
		wantContent(t, filepath.Join(m.base, "private"), "secret\n")
		if n, _ := unix.Read(in, make([]byte, 4096)); n > 0 {
			ents, _ := os.ReadDir(loot)
			t.Errorf("the commit wrote into the attacker's directory (%d bytes of events; it holds %v)", n, ents)
		}
		if target, err := os.Readlink(link); err != nil || target != loot {
			t.Errorf("the attacker's symlink: %q, %v", target, err)
		}
		if left := otherStages(t, m, branch.StageName); len(left) > 0 {
			t.Errorf("stages left in the base: %v", left)
		}
		m.ok("unmount", m.mnt)
		m.start()
		wantOutcome(t, m, true)
		wantStates(t, m, map[string]string{"b": "gone", "s": "stale"})
	})
}

// swapStaged is the attacker's script, run while no daemon runs: in a
// stage directory of its own, it swaps every copy a commit staged there
// for its own file; a stage directory of someone else's it moves away,
// where it may, and puts one of its own at its name, with files at the
// names the copies would have.
const swapStaged = `cd "$1" || exit 1
for d in .branchfs-commit-stage*; do
	case "$d" in *.stolen) continue;; esac
	if [ -O "$d" ]; then
		for f in "$d"/*-new-*; do
			[ -e "$f" ] || continue
			mv "$f" "$f.orig" && echo evil > "$f" && echo "swapped $f"
		done
	elif [ -d "$d" ] && mv "$d" "$d.stolen" 2>/dev/null; then
		tag=${d#.branchfs-commit-stage-}
		mkdir -m 777 "$d"
		for i in 0 1 2 3 4 5 6 7 8 9; do echo evil > "$d/$tag-new-$i"; done
		echo "replaced $d"
	fi
done`

// TestStageAttackSwap: in a directory the attacker made where commits used
// to stage, or in any stage it can reach or replace, the attacker swaps
// what a commit staged while the daemon is dead (killed once the commit
// is journaled); the next mount must finish the commit with the branch's
// files, not the attacker's, and leave the attacker's directory alone.
func TestStageAttackSwap(t *testing.T) {
	eachSharedBase(t, func(t *testing.T, layout string, mode uint32) {
		m := sharedBase(t, layout, mode, "BRANCHFS_FAILPOINT=commit-journaled")
		planted := filepath.Join(m.base, branch.StageName)
		attack(t, `mkdir -m 777 "$1"`, planted)
		b := commitScenario(t, m)
		if _, _, code := m.cli("commit", b); code == 0 {
			t.Fatalf("commit succeeded; the failpoint did not fire")
		}
		m.waitDead()
		t.Logf("the attacker: %s", attack(t, swapStaged, m.base))
		m.env = nil
		m.start()
		wantOutcome(t, m, true)
		wantStates(t, m, map[string]string{"b": "gone", "s": "stale"})
		var st unix.Stat_t
		if err := unix.Lstat(planted, &st); err != nil || st.Uid != 65534 {
			t.Errorf("the attacker's directory: uid %d, %v", st.Uid, err)
		}
		if left := otherStages(t, m, branch.StageName); len(left) > 0 && mode&unix.S_ISVTX != 0 {
			t.Errorf("stages left in the base: %v", left)
		}
		// Later commits work beside the planted directory.
		c := m.create("c")
		writeFile(t, filepath.Join(c, "later"), "later\n")
		m.ok("commit", c)
		wantContent(t, filepath.Join(m.base, "later"), "later\n")
	})
}

// TestStageAttackMissing: with the daemon dead half-way through a commit
// (three steps done), the attacker moves the commit's stage away from its
// name, as the base's root lets it (mode 0777); the next mount must not
// take the missing stage for steps done: it finishes the commit whole, and
// no branch is lost.
func TestStageAttackMissing(t *testing.T) {
	for _, layout := range []string{"apart", "bind"} {
		t.Run(layout, func(t *testing.T) {
			t.Parallel()
			m := sharedBase(t, layout, 0o777, "BRANCHFS_FAILPOINT=commit-step-2")
			b := commitScenario(t, m)
			if _, _, code := m.cli("commit", b); code == 0 {
				t.Fatalf("commit succeeded; the failpoint did not fire")
			}
			m.waitDead()
			out := attack(t, `cd "$1" && for d in .branchfs-commit-stage*; do mv "$d" "$d.stolen" && echo "moved $d"; done`, m.base)
			if !strings.Contains(out, "moved") {
				t.Fatalf("no stage to move: %s", out)
			}
			m.env = nil
			m.start()
			wantOutcome(t, m, true)
			wantStates(t, m, map[string]string{"b": "gone", "s": "stale"})
			if left := otherStages(t, m); len(left) > 0 {
				t.Errorf("stages left in the base: %v", left)
			}
		})
	}
}

// exchangeHelper is the attacker of TestStageAttackExchange, when this
// binary was started as it: on each stage made in the base's root it
// exchanges the stage with the directory victim, there too, before the
// daemon can open it, and says so on standard output.
func exchangeHelper() {
	spec := os.Getenv("BRANCHFS_EXCHANGE")
	if spec == "" {
		return
	}
	base, victim, _ := strings.Cut(spec, "\x1f")
	in, err := unix.InotifyInit1(unix.IN_CLOEXEC)
	if err == nil {
		_, err = unix.InotifyAddWatch(in, base, unix.IN_CREATE)
	}
	dir, err2 := unix.Open(base, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil || err2 != nil {
		fmt.Println("inotify:", err, err2)
		os.Exit(1)
	}
	fmt.Println("ready")
	buf := make([]byte, 64<<10)
	for {
		n, err := unix.Read(in, buf)
		if err != nil {
			os.Exit(1)
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			e := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			name := strings.TrimRight(string(buf[off+unix.SizeofInotifyEvent:off+unix.SizeofInotifyEvent+int(e.Len)]), "\x00")
			off += unix.SizeofInotifyEvent + int(e.Len)
			if strings.HasPrefix(name, branch.StageName) {
				if unix.Renameat2(dir, name, dir, victim, unix.RENAME_EXCHANGE) == nil {
					fmt.Println("exchanged", name)
				}
			}
		}
	}
}

// TestStageAttackExchange: where the base's root has no sticky bit, the
// attacker exchanges each stage the daemon makes there, before the daemon
// opens it, with a private directory of root's in the base's root, which
// the attacker may rename but not empty; the commit must not take root's
// directory for its stage, and so empty it.
func TestStageAttackExchange(t *testing.T) {
	for _, layout := range []string{"apart", "bind"} {
		t.Run(layout, func(t *testing.T) {
			t.Parallel()
			m := sharedBase(t, layout, 0o777)
			private := filepath.Join(m.base, "private")
			must(t, os.Mkdir(private, 0o700))
			writeFile(t, filepath.Join(private, "keep"), "root's\n")
			cmd := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--", helper)
			cmd.Env = append(os.Environ(), "BRANCHFS_EXCHANGE="+m.base+"\x1fprivate")
			out, err := cmd.StdoutPipe()
			must(t, err)
			must(t, cmd.Start())
			defer func() {
				cmd.Process.Kill()
				cmd.Wait()
			}()
			lines := bufio.NewScanner(out)
			if !lines.Scan() || lines.Text() != "ready" {
				t.Fatalf("the attacker: %q", lines.Text())
			}
			exchanged := make(chan string, 100)
			go func() {
				for lines.Scan() {
					exchanged <- lines.Text()
				}
				close(exchanged)
			}()
			won := 0
			for i := 0; i < 20 && won == 0; i++ {
				b := m.create(fmt.Sprint("b", i))
				writeFile(t, filepath.Join(b, "new"), "new\n")
				if _, errOut, code := m.cli("commit", b); code != 0 {
					t.Logf("commit %d: %s", i, errOut)
				}
				for len(exchanged) > 0 {
					t.Log(<-exchanged)
					won++
				}
			}
			if won == 0 {
				t.Skip("the attacker never exchanged a stage in time")
			}
			// Wherever the attacker put root's directory, it holds root's file.
			found, err := filepath.Glob(filepath.Join(m.base, "*", "keep"))
			must(t, err)
			if len(found) != 1 {
				t.Fatalf("root's private directory lost its file: found %v", found)
			}
			wantContent(t, found[0], "root's\n")
		})
	}
}

// TestCommitAttackReplacedDir: where others may rename in the base (its
// root has no sticky bit), the attacker puts a private directory of
// root's at the name of its own directory, in which root's branch wrote;
// the commit must not give root's directory the owner and mode the
// branch's copy of the attacker's directory has.
func TestCommitAttackReplacedDir(t *testing.T) {
	for _, layout := range []string{"same", "apart"} {
		t.Run(layout, func(t *testing.T) {
			t.Parallel()
			m := sharedBase(t, layout, 0o777)
			private := filepath.Join(m.base, "private")
			must(t, os.Mkdir(private, 0o700))
			writeFile(t, filepath.Join(private, "keep"), "root's\n")
			theirs := filepath.Join(m.base, "theirs")
			attack(t, `mkdir -m 777 "$1"`, theirs)
			b := m.create("b")
			writeFile(t, filepath.Join(b, "theirs", "new"), "root's too\n")
			attack(t, `mv "$1" "$1.old" && mv "$2" "$1"`, theirs, private)
			if _, errOut, code := m.cli("commit", b); code == 0 || !strings.Contains(errOut, "replaced") {
				t.Errorf("the commit: exit %d, %q; want it refused as replaced", code, errOut)
			}
			var st unix.Stat_t
			must(t, unix.Lstat(theirs, &st))
			if st.Uid != 0 || st.Mode&0o777 != 0o700 {
				t.Errorf("root's directory, moved to %s: uid %d, mode %04o", theirs, st.Uid, st.Mode&0o7777)
			}
			wantContent(t, filepath.Join(theirs, "keep"), "root's\n")
		})
	}
}

// TestCommitAttackRemovedDir: as TestCommitAttackReplacedDir, with the
// attacker's directory removed in root's branch (and then a file made at
// its name, or renamed instead): the commit must not remove the private
// directory of root's that the attacker put at that name meanwhile.
func TestCommitAttackRemovedDir(t *testing.T) {
	for _, layout := range []string{"same", "apart"} {
		for _, then := range []string{"removed", "file", "renamed"} {
			t.Run(layout+"-"+then, func(t *testing.T) {
				t.Parallel()
				m := sharedBase(t, layout, 0o777)
				private := filepath.Join(m.base, "private")
				must(t, os.Mkdir(private, 0o700))
				writeFile(t, filepath.Join(private, "keep"), "root's\n")
				theirs := filepath.Join(m.base, "theirs")
				attack(t, `mkdir -m 777 "$1" && echo junk > "$1/junk"`, theirs)
				b := m.create("b")
				if then == "renamed" {
					must(t, os.Rename(filepath.Join(b, "theirs"), filepath.Join(b, "moved")))
				} else {
					must(t, os.RemoveAll(filepath.Join(b, "theirs")))
				}
				if then == "file" {
					writeFile(t, filepath.Join(b, "theirs"), "a file now\n")
				}
				attack(t, `mv "$1" "$1.old" && mv "$2" "$1"`, theirs, private)
				if _, errOut, code := m.cli("commit", b); code == 0 || !strings.Contains(errOut, "replaced") {
					t.Errorf("the commit: exit %d, %q; want it refused as replaced", code, errOut)
				}
				wantContent(t, filepath.Join(theirs, "keep"), "root's\n")
			})
		}
	}
}
