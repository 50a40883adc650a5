package kernel

import (
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"syscall"
	"testing"
	"unsafe"

	"github.com/branchfs/branchfs/ctl"
	"golang.org/x/sys/unix"
)

// Without the marker the binding must refuse, calling nothing; with it
// (in the QEMU guest) it must accept.
func TestAvailable(t *testing.T) {
	err := Available()
	if _, statErr := os.Stat(SysfsDir); statErr != nil {
		if !errors.Is(err, syscall.ENOSYS) {
			t.Fatalf("no %s, Available() = %v, want ENOSYS", SysfsDir, err)
		}
		if _, err := Branch(BR_COMMIT, nil, 0); !errors.Is(err, syscall.ENOSYS) {
			t.Fatalf("Branch without the syscall = %v, want ENOSYS", err)
		}
		return
	}
	if err != nil {
		t.Fatalf("%s exists but Available() = %v", SysfsDir, err)
	}
}

// TestBranchFromGo drives branch() through the Go binding: three children
// race to commit, one wins and its file alone reaches the base. It needs
// the patched kernel and a branchfs mount named by BRANCHFS_GUEST_MNT, as
// in the QEMU guest.
func TestBranchFromGo(t *testing.T) {
	mnt := os.Getenv("BRANCHFS_GUEST_MNT")
	if mnt == "" || Available() != nil {
		t.Skip("needs the patched kernel and BRANCHFS_GUEST_MNT (make qemu-test)")
	}
	const n = 3
	// The children run no Go runtime code: everything they touch is ready.
	var paths [n][]byte
	for i := range paths {
		paths[i] = []byte(filepath.Join(mnt, "go-"+strconv.Itoa(i+1)+".txt") + "\x00")
	}
	data := []byte("from go\n")

	dir, err := os.Open(mnt)
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	idx, children, err := BranchCreate(dir, n, BR_FS)
	if idx > 0 {
		p := &paths[idx-1][0]
		fd, _, e := unix.RawSyscall(unix.SYS_OPEN, uintptr(unsafe.Pointer(p)),
			unix.O_WRONLY|unix.O_CREAT|unix.O_TRUNC, 0o644)
		// A sibling that commits first makes this branch stale: the
		// open can then fail with ESTALE before its SIGKILL lands, which
		// is losing, as a commit's ESTALE is (3). Other errors exit
		// 16+errno, for the report below.
		code := 16 + uintptr(e)
		if e == unix.ESTALE {
			code = 3
		}
		if e == 0 {
			unix.RawSyscall(unix.SYS_WRITE, fd, uintptr(unsafe.Pointer(&data[0])), uintptr(len(data)))
			unix.RawSyscall(unix.SYS_CLOSE, fd, 0, 0)
			switch BranchCommit() {
			case 0:
				code = 0
			case unix.ESTALE:
				code = 3
			default:
				code = 4
			}
		}
		unix.RawSyscall(unix.SYS_EXIT_GROUP, code, 0, 0)
	}
	if err != nil {
		t.Fatalf("BranchCreate: %v", err)
	}
	for _, c := range children {
		unix.Close(c.Pidfd)
	}
	winner := 0
	for i, c := range children {
		var ws unix.WaitStatus
		if _, err := unix.Wait4(c.Pid, &ws, unix.WALL, nil); err != nil {
			t.Fatalf("wait for child %d: %v", i+1, err)
		}
		switch {
		case ws.Exited() && ws.ExitStatus() == 0:
			if winner != 0 {
				t.Fatalf("children %d and %d both won", winner, i+1)
			}
			winner = i + 1
		case ws.Exited() && ws.ExitStatus() == 3, ws.Signaled() && ws.Signal() == unix.SIGKILL:
		default:
			t.Fatalf("child %d (branch %s) ended with %#x (exit 16+N: its open failed with errno N)", i+1, c.Name, ws)
		}
	}
	for i, c := range children {
		if i+1 != winner {
			if v, err := os.Open(filepath.Join(mnt, "@"+c.Name)); err == nil {
				ctl.IoctlAbort(v)
				v.Close()
			}
		}
	}
	if winner == 0 {
		t.Fatal("no child won")
	}
	for i := 1; i <= n; i++ {
		_, err := os.Stat(filepath.Join(mnt, "go-"+strconv.Itoa(i)+".txt"))
		if (err == nil) != (i == winner) {
			t.Errorf("go-%d.txt in the base: %v (winner %d)", i, err, winner)
		}
	}
	os.Remove(filepath.Join(mnt, "go-"+strconv.Itoa(winner)+".txt"))
}

// TestBranchAbortFromGo: a child of branch() that calls BranchAbort ends
// as if killed by SIGABRT, and what it wrote goes with its branch.
func TestBranchAbortFromGo(t *testing.T) {
	mnt := os.Getenv("BRANCHFS_GUEST_MNT")
	if mnt == "" || Available() != nil {
		t.Skip("needs the patched kernel and BRANCHFS_GUEST_MNT (make qemu-test)")
	}
	path := []byte(filepath.Join(mnt, "go-aborted.txt") + "\x00")
	dir, err := os.Open(mnt)
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	idx, children, err := BranchCreate(dir, 1, BR_FS)
	if idx > 0 {
		// As in TestBranchFromGo, the child makes system calls only.
		fd, _, e := unix.RawSyscall(unix.SYS_OPEN, uintptr(unsafe.Pointer(&path[0])),
			unix.O_WRONLY|unix.O_CREAT|unix.O_TRUNC, 0o644)
		code := 16 + uintptr(e)
		if e == 0 {
			unix.RawSyscall(unix.SYS_CLOSE, fd, 0, 0)
			code = 16 + uintptr(BranchAbort()) // returns only with an errno
		}
		unix.RawSyscall(unix.SYS_EXIT_GROUP, code, 0, 0)
	}
	if err != nil {
		t.Fatalf("BranchCreate: %v", err)
	}
	c := children[0]
	unix.Close(c.Pidfd)
	var ws unix.WaitStatus
	if _, err := unix.Wait4(c.Pid, &ws, unix.WALL, nil); err != nil {
		t.Fatal(err)
	}
	if !ws.Signaled() || ws.Signal() != unix.SIGABRT {
		t.Fatalf("the child (branch %s) ended with %#x, want SIGABRT (exit 16+N: errno N)", c.Name, ws)
	}
	if _, err := os.Stat(filepath.Join(mnt, "go-aborted.txt")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the aborted branch's file in the base: %v", err)
	}
	if _, err := os.Stat(filepath.Join(mnt, "@"+c.Name)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the aborted branch's view: %v", err)
	}
}
