package explore_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/branchfs/branchfs/kernel/explore"
)

// exampleMount mounts a base holding "file" with the branchfs binary the
// tests built (as `branchfs mount` would) and returns the mount point.
func exampleMount() (mnt string, unmount func()) {
	dir, _ := os.MkdirTemp("", "explore-example")
	base, mnt := filepath.Join(dir, "base"), filepath.Join(dir, "mnt")
	os.MkdirAll(base, 0o755)
	os.MkdirAll(mnt, 0o755)
	os.WriteFile(filepath.Join(base, "file"), []byte("base\n"), 0o644)
	if out, err := exec.Command(explore.BuiltBinary(), "mount", "--base", base, "--store", filepath.Join(dir, "store"), mnt).CombinedOutput(); err != nil {
		panic(fmt.Sprint(err, string(out)))
	}
	return mnt, func() { explore.UnmountLater(mnt, dir) }
}

// Run a command in a new branch: it writes at the mount point's own path,
// and its branch is committed because it exits 0.
func ExampleMount_Run() {
	mnt, unmount := exampleMount()
	defer unmount()

	m, err := explore.Open(mnt)
	if err != nil {
		panic(err)
	}
	res, err := m.Run(context.Background(), explore.Spec{
		Args:   []string{"sh", "-c", "echo changed > " + mnt + "/file"},
		Stdout: os.Stdout,
	})
	if err != nil {
		panic(err)
	}
	data, _ := os.ReadFile(filepath.Join(mnt, "file"))
	fmt.Printf("exit %d, committed %v, %d file in the delta; file: %s", res.ExitCode, res.Committed, res.DeltaFiles, data)
	// Output: exit 0, committed true, 1 file in the delta; file: changed
}

// Create, list and abort branches through the ioctls.
func ExampleMount_Create() {
	mnt, unmount := exampleMount()
	defer unmount()

	m, _ := explore.Open(mnt)
	name, _ := m.Create("main", "try1")
	os.WriteFile(filepath.Join(m.View(name), "file"), []byte("try1\n"), 0o644)
	list, _ := m.List()
	for _, b := range list {
		fmt.Println(b.Name, b.State, b.DeltaFiles)
	}
	m.Abort(name, false)
	data, _ := os.ReadFile(filepath.Join(mnt, "file"))
	fmt.Print(string(data))
	// Output:
	// main live 0
	// try1 live 1
	// base
}

// Race three candidates: the first to succeed commits, and the others are
// killed and their branches aborted.
func ExampleMount_Speculate() {
	mnt, unmount := exampleMount()
	defer unmount()

	m, _ := explore.Open(mnt)
	out, err := m.Speculate(context.Background(), [][]string{
		explore.Shell("sleep 10; echo slow > " + mnt + "/file"),
		explore.Shell("echo fast > " + mnt + "/file"),
		explore.Shell("exit 1"),
	}, explore.Options{})
	if err != nil {
		panic(err)
	}
	data, _ := os.ReadFile(filepath.Join(mnt, "file"))
	fmt.Printf("winner %d; file: %s", *out.Winner, data)
	for _, r := range out.Results {
		fmt.Println(r.Committed, r.Aborted)
	}
	// Output:
	// winner 1; file: fast
	// false true
	// true false
	// false true
}

// Score candidates on fd 3 and commit the best.
func ExampleMount_BestOfN() {
	mnt, unmount := exampleMount()
	defer unmount()

	m, _ := explore.Open(mnt)
	cmd := []string{"sh", "-c", "echo $BRANCHFS_INDEX > " + mnt + "/file; echo $(( BRANCHFS_INDEX * 7 % 5 )) >&3"}
	out, _ := m.BestOfN(context.Background(), [][]string{cmd, cmd, cmd, cmd, cmd}, true, explore.Options{})
	data, _ := os.ReadFile(filepath.Join(mnt, "file"))
	fmt.Printf("winner %d with score %v; file: %s", *out.Winner, *out.WinnerResult().Score, data)
	// Output: winner 2 with score 4; file: 2
}
