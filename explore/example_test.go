package explore_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/branchfs/branchfs/daemon"
	"github.com/branchfs/branchfs/explore"
)

// Mount a directory from Go, run a command in a new branch of it, and
// unmount. The command writes at the mount point's own path and exits 0,
// so its branch is committed: the base holds its write.
func Example() {
	dir, _ := os.MkdirTemp("", "example")
	defer os.RemoveAll(dir)
	base, mnt := filepath.Join(dir, "base"), filepath.Join(dir, "mnt")
	os.Mkdir(base, 0o755)
	os.Mkdir(mnt, 0o755)
	os.WriteFile(filepath.Join(base, "file"), []byte("base\n"), 0o644)

	mt, err := daemon.MountAt(base, mnt, daemon.MountOptions{Store: filepath.Join(dir, "store")})
	if err != nil {
		panic(err)
	}
	defer mt.Unmount()
	m, err := explore.Open(mnt)
	if err != nil {
		panic(err)
	}

	res, err := m.Run(context.Background(), explore.Spec{Args: []string{"sh", "-c", "echo changed > file"}})
	if err != nil {
		panic(err)
	}
	data, _ := os.ReadFile(filepath.Join(base, "file"))
	fmt.Printf("exit %d, committed %v; base file: %s", res.ExitCode, res.Committed, data)
	// Output: exit 0, committed true; base file: changed
}

// Create, list and abort branches by name.
func ExampleMount_Create() {
	dir, _ := os.MkdirTemp("", "example")
	defer os.RemoveAll(dir)
	base, mnt := filepath.Join(dir, "base"), filepath.Join(dir, "mnt")
	os.Mkdir(base, 0o755)
	os.Mkdir(mnt, 0o755)
	os.WriteFile(filepath.Join(base, "file"), []byte("base\n"), 0o644)
	mt, err := daemon.MountAt(base, mnt, daemon.MountOptions{Store: filepath.Join(dir, "store")})
	if err != nil {
		panic(err)
	}
	defer mt.Unmount()
	m, err := explore.Open(mnt)
	if err != nil {
		panic(err)
	}

	name, err := m.Create("main", "try 1")
	if err != nil {
		panic(err)
	}
	os.WriteFile(filepath.Join(m.View(name), "file"), []byte("try 1\n"), 0o644)
	list, _ := m.List()
	for _, b := range list {
		fmt.Printf("%q %s %d\n", b.Name, b.State, b.DeltaFiles)
	}
	m.Abort(name, false)
	data, _ := os.ReadFile(filepath.Join(mnt, "file"))
	fmt.Print(string(data))
	// Output:
	// "main" live 0
	// "try 1" live 1
	// base
}

// Race three candidates, each with its output in a buffer of its own: the
// first to succeed commits, the others are killed and their branches
// aborted.
func ExampleMount_Speculate() {
	dir, _ := os.MkdirTemp("", "example")
	defer os.RemoveAll(dir)
	base, mnt := filepath.Join(dir, "base"), filepath.Join(dir, "mnt")
	os.Mkdir(base, 0o755)
	os.Mkdir(mnt, 0o755)
	mt, err := daemon.MountAt(base, mnt, daemon.MountOptions{Store: filepath.Join(dir, "store")})
	if err != nil {
		panic(err)
	}
	defer mt.Unmount()
	m, err := explore.Open(mnt)
	if err != nil {
		panic(err)
	}

	outs := make([]bytes.Buffer, 3)
	out, err := m.Speculate(context.Background(), [][]string{
		explore.Shell("echo slow; sleep 10; echo slow > answer"),
		explore.Shell("echo fast; echo fast > answer"),
		explore.Shell("echo broken; exit 1"),
	}, explore.Options{
		Output: func(i int) (io.Writer, io.Writer) { return &outs[i], &outs[i] },
	})
	if err != nil {
		panic(err)
	}
	data, _ := os.ReadFile(filepath.Join(mnt, "answer"))
	fmt.Printf("winner %d; answer: %s", *out.Winner, data)
	for i, r := range out.Results {
		fmt.Printf("%d: %s, committed %v, aborted %v\n", i, strings.TrimSpace(outs[i].String()), r.Committed, r.Aborted)
	}
	// Output:
	// winner 1; answer: fast
	// 0: slow, committed false, aborted true
	// 1: fast, committed true, aborted false
	// 2: broken, committed false, aborted true
}

// Score candidates on fd 3, two at a time, each within a time limit, and
// commit the best.
func ExampleMount_BestOfN() {
	dir, _ := os.MkdirTemp("", "example")
	defer os.RemoveAll(dir)
	base, mnt := filepath.Join(dir, "base"), filepath.Join(dir, "mnt")
	os.Mkdir(base, 0o755)
	os.Mkdir(mnt, 0o755)
	mt, err := daemon.MountAt(base, mnt, daemon.MountOptions{Store: filepath.Join(dir, "store")})
	if err != nil {
		panic(err)
	}
	defer mt.Unmount()
	m, err := explore.Open(mnt)
	if err != nil {
		panic(err)
	}

	cmd := explore.Shell("echo $BRANCHFS_INDEX > best; echo $(( BRANCHFS_INDEX * 7 % 5 )) >&3")
	out, err := m.BestOfN(context.Background(), [][]string{cmd, cmd, cmd, cmd, cmd}, true,
		explore.Options{MaxParallel: 2, CandidateTimeout: time.Minute})
	if err != nil {
		panic(err)
	}
	data, _ := os.ReadFile(filepath.Join(mnt, "best"))
	fmt.Printf("winner %d with score %v; best: %s", *out.Winner, *out.WinnerResult().Score, data)
	// Output: winner 2 with score 4; best: 2
}
