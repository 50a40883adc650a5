package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"

	"github.com/branchfs/branchfs/branch"
	"github.com/branchfs/branchfs/fs"
	"github.com/branchfs/branchfs/kernel"
	"github.com/branchfs/branchfs/kernel/explore"
	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"
)

const fuseSuperMagic = 0x65735546

// findView returns the root of the view that holds p (MNT or MNT/@NAME)
// and its branch name. It reads the mount table instead of looking for a
// control file on the way up: a user's own file may bear that name, and
// the directories of a stale branch answer ESTALE.
func findView(p string) (root, name string, err error) {
	abs, err := filepath.Abs(p)
	if err != nil {
		return "", "", err
	}
	// Inside a run, the main view and MNT/@NAME are under EnvRoot, which
	// the mount table does not show.
	if r, _ := runRoot(); r != "" && (abs == r || strings.HasPrefix(abs, r+"/")) {
		first, _, _ := strings.Cut(strings.TrimPrefix(strings.TrimPrefix(abs, r), "/"), "/")
		if name, ok := strings.CutPrefix(first, fs.BranchPrefix); ok {
			return filepath.Join(r, first), name, nil
		}
		return r, branch.MainName, nil
	}
	abs = resolvePrefix(abs)
	mnt, fstype, err := enclosingMount(abs)
	if err != nil {
		return "", "", err
	}
	if fstype != "fuse.branchfs" {
		return "", "", fmt.Errorf("%s is not inside a branchfs mount", p)
	}
	if err := checkStore(mnt); err != nil {
		return "", "", err
	}
	rel := strings.TrimPrefix(strings.TrimPrefix(abs, mnt), "/")
	first, _, _ := strings.Cut(rel, "/")
	if strings.HasPrefix(first, fs.BranchPrefix) {
		return filepath.Join(mnt, first), first[len(fs.BranchPrefix):], nil
	}
	return mnt, branch.MainName, nil
}

// runRoot is, inside a run, where its commands reach the main view
// (explore.EnvRoot) and the mount point, which shows the run's branch
// (explore.EnvView); "" elsewhere.
func runRoot() (root, view string) {
	root, view = os.Getenv(explore.EnvRoot), os.Getenv(explore.EnvView)
	if root == "" || view == "" {
		return "", ""
	}
	return filepath.Clean(root), filepath.Clean(view)
}

// viewPath is where branch name's view is, for the mount at mnt: MNT/@NAME,
// or inside a run whose mount point mnt is, under explore.EnvRoot.
func viewPath(mnt, name string) string {
	if r, v := runRoot(); r != "" {
		if abs, err := filepath.Abs(mnt); err == nil && resolvePrefix(abs) == resolvePrefix(v) {
			return filepath.Join(r, fs.BranchPrefix+name)
		}
	}
	return filepath.Join(mnt, fs.BranchPrefix+name)
}

// storeArg is --store (--storage) of the commands that act on a mount
// given by a path: the reference implementation's clients pass it to
// every command. Given, it must be the store of that mount.
var storeArg string

// addStoreFlag gives every command that has no --store of its own the
// shared one, storeArg.
func addStoreFlag(root *cobra.Command) {
	for _, c := range root.Commands() {
		if c.Flags().Lookup("store") != nil || c.Name() == "help" || c.Name() == "completion" {
			continue
		}
		c.Flags().StringVar(&storeArg, "store", "", "the store of the mount (--storage is another name for it): the command fails unless the mount keeps its branches there")
		aliasStorage(c)
	}
}

// checkStore checks that the mount at mnt keeps its branches in storeArg,
// when that is given.
func checkStore(mnt string) error {
	if storeArg == "" {
		return nil
	}
	st, err := readStatus(mnt, false)
	if err != nil {
		return fmt.Errorf("%s: %w", mnt, err)
	}
	if !sameDir(st.Store, storeArg) {
		return fmt.Errorf("the mount at %s keeps its branches in %s, not in --store %s", mnt, st.Store, storeArg)
	}
	return nil
}

// sameDir reports whether a and b are one directory.
func sameDir(a, b string) bool {
	var sa, sb unix.Stat_t
	return unix.Stat(a, &sa) == nil && unix.Stat(b, &sb) == nil && sa.Dev == sb.Dev && sa.Ino == sb.Ino
}

// mountOfStore finds the mount point of the branchfs mount that keeps its
// branches in store: for list --store without MNT, as the reference's
// list takes it.
func mountOfStore(store string) (string, error) {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(data), "\n") {
		fields := strings.Fields(line)
		sep := slices.Index(fields, "-")
		if len(fields) < 5 || sep < 0 || sep+1 >= len(fields) || fields[sep+1] != "fuse.branchfs" {
			continue
		}
		mnt := unescapeMountinfo(fields[4])
		if st, err := readStatus(mnt, false); err == nil && sameDir(st.Store, store) {
			return mnt, nil
		}
	}
	return "", fmt.Errorf("no branchfs mount keeps its branches in %s", store)
}

// mountRoot returns the root of the branchfs mount that holds p, and the
// branch whose view holds p.
func mountRoot(p string) (root, name string, err error) {
	root, name, err = findView(p)
	if err == nil && name != branch.MainName {
		root = filepath.Dir(root)
	}
	return root, name, err
}

// mountPoint returns the mount point of the branchfs mount that holds p,
// with the errors of the branch commands when p is outside any, and when
// p is inside one but is not its mount point.
func mountPoint(p string) (string, error) {
	mnt, _, err := mountRoot(p)
	if err != nil {
		return "", err
	}
	abs, err := filepath.Abs(p)
	if err != nil {
		return "", err
	}
	if resolvePrefix(abs) != mnt {
		return "", fmt.Errorf("%s is inside the branchfs mount at %s; give the mount point", p, mnt)
	}
	return mnt, nil
}

// openMount opens the mount whose mount point is dir, for run, the
// patterns and checkpoints.
func openMount(dir string) (*explore.Mount, error) {
	if _, err := mountPoint(dir); err != nil {
		return nil, err
	}
	return explore.Open(dir)
}

// resolvePrefix resolves the symbolic links of the longest prefix of abs
// that resolves: further down, a stale branch answers ESTALE.
func resolvePrefix(abs string) string {
	rest := ""
	for d := abs; ; d = filepath.Dir(d) {
		if r, err := filepath.EvalSymlinks(d); err == nil {
			return filepath.Join(r, rest)
		}
		if d == "/" {
			return abs
		}
		rest = filepath.Join(filepath.Base(d), rest)
	}
}

// enclosingMount finds the mount point in /proc/self/mountinfo that holds
// abs, and its filesystem type.
func enclosingMount(abs string) (mnt, fstype string, err error) {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return "", "", err
	}
	for _, line := range strings.Split(string(data), "\n") {
		// ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER
		fields := strings.Fields(line)
		sep := slices.Index(fields, "-")
		if len(fields) < 5 || sep < 0 || sep+1 >= len(fields) {
			continue
		}
		mp := unescapeMountinfo(fields[4])
		if (abs == mp || strings.HasPrefix(abs, strings.TrimSuffix(mp, "/")+"/")) && len(mp) >= len(mnt) {
			// Later lines are mounts made later, over earlier ones.
			mnt, fstype = mp, fields[sep+1]
		}
	}
	return mnt, fstype, nil
}

// unescapeMountinfo undoes the octal escapes (\040 for a space) of
// /proc/self/mountinfo.
func unescapeMountinfo(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// openControl opens a view's control file, making sure it is the daemon's:
// its inode number is one no file of a view has.
func openControl(viewRoot string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(viewRoot, fs.ControlName), os.O_RDWR|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	var st unix.Stat_t
	var sfs unix.Statfs_t
	if unix.Fstat(int(f.Fd()), &st) != nil || st.Ino != fs.ControlIno || st.Mode&unix.S_IFMT != unix.S_IFREG ||
		unix.Fstatfs(int(f.Fd()), &sfs) != nil || sfs.Type != fuseSuperMagic {
		f.Close()
		return nil, fmt.Errorf("%s is not a branchfs view", viewRoot)
	}
	return f, nil
}

// control writes one command to a view's control file and returns the answer.
func control(viewRoot, cmd string) ([]byte, error) {
	f, err := openControl(viewRoot)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if _, err := f.Write([]byte(cmd)); err != nil {
		return nil, unwrapErrno(err)
	}
	return io.ReadAll(io.NewSectionReader(f, 0, 1<<30))
}

// setLimit gives the branch whose view is view, just created, a storage
// limit of max bytes, or else aborts it: a branch without the limit asked
// for is not what was asked.
func setLimit(view string, max int64) error {
	_, err := control(view, fs.CmdLimit+":"+strconv.FormatInt(max, 10))
	if err != nil {
		control(view, fs.CmdAbort)
	}
	return err
}

func unwrapErrno(err error) error {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return errno
	}
	return err
}

func readStatus(viewRoot string, all bool) (*fs.Status, error) {
	cmd := fs.CmdList
	if all {
		cmd += ":" + fs.ArgAll
	}
	data, err := control(viewRoot, cmd)
	if err != nil {
		return nil, err
	}
	var st fs.Status
	return &st, json.Unmarshal(data, &st)
}

// branchAt finds the view root and branch name for a path inside MNT/@NAME.
func branchAt(p, op string) (string, string, error) {
	root, name, err := findView(p)
	if err != nil {
		return "", "", fmt.Errorf("%s: %w", op, err)
	}
	if name == branch.MainName {
		return "", "", fmt.Errorf("%s: %s is in the main view; give MNT/@NAME or a path inside it", op, p)
	}
	return root, name, nil
}

// explain turns the errno the daemon answered into one line naming the
// branch and the cause; the errno stays reachable for the exit status.
func explain(op, name string, err error) error {
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		return fmt.Errorf("%s %s: %w", op, branch.Quote(name), err)
	}
	msg := errno.Error()
	// A commit's ENOSPC, EROFS, EEXIST or EPERM is its filesystem's (a
	// full disk, an immutable file), not a branch error of that errno.
	commitErr := errno == syscall.ESTALE || errno == syscall.EBUSY || errno == syscall.EINVAL ||
		errno == syscall.EUCLEAN || errno == syscall.ENOENT || errno == syscall.EIDRM
	if e := branch.ErrorOf(errno); e != nil && (op != "commit" || commitErr) {
		msg = e.Error()
	}
	if op == "create" && errno == syscall.EBUSY {
		// The new branch would see writes that still reach its parent,
		// through passthrough or a kernel-path run's overlayfs.
		msg = "the parent is busy: files are open for writing with passthrough in it, or a kernel-path run holds it (a run inside a run needs the outer one on --data-path fuse)"
	}
	switch {
	case op == "commit" && (errno == syscall.ENOTCONN || errno == syscall.ECONNABORTED):
		msg += " (the daemon stopped during the commit; the next mount finishes it or rolls it back)"
	case op == "commit" && errno != syscall.EUCLEAN:
		msg += " (nothing was committed)"
	}
	return &daemonError{fmt.Sprintf("%s %s: %s", op, branch.Quote(name), msg), errno}
}

// daemonError is an errno the daemon answered, told as its message; the
// errno stays reachable for the exit status.
type daemonError struct {
	msg   string
	errno syscall.Errno
}

func (e *daemonError) Error() string { return e.msg }
func (e *daemonError) Unwrap() error { return e.errno }

func createCmd() *cobra.Command {
	var parent string
	var maxStorage sizeValue
	c := &cobra.Command{
		Use:   "create NAME MNT",
		Short: "Create branch NAME, a child of P (default main), at MNT/@NAME",
		Long: `Create branch NAME of the mount at MNT and print its path, MNT/@NAME. The branch starts as its parent
shows now (main, the base, unless --parent names a branch) and keeps its own writes: they reach neither
the parent nor any other branch until the branch is committed. Creating a branch costs the same whatever
the size of the base. A parent with live children is read-only until they are committed or aborted.
NAME is what a file name may be: 1 to 254 bytes of UTF-8 (spaces, "+", any letter), not "." or "..",
without "/" or NUL.`,
		Example: `  branchfs create try1 /mnt/p
  branchfs create try1-fix /mnt/p --parent try1`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			name, mnt := args[0], args[1]
			if err := branch.ValidateName(name); err != nil {
				return fmt.Errorf("create: %w", err)
			}
			root, _, err := mountRoot(mnt)
			if err != nil {
				return fmt.Errorf("create %s: %w", branch.Quote(name), err)
			}
			view := viewPath(root, name)
			// Inside a run, the mount point shows the run's branch: the
			// new branch is its child unless --parent says otherwise.
			if r, v := runRoot(); r != "" && root == resolvePrefix(v) && parent == branch.MainName && cmd.Flags().Changed("parent") {
				root = r
			}
			if parent != branch.MainName {
				if err := branch.ValidateName(parent); err != nil {
					return fmt.Errorf("create %s: parent: %w", branch.Quote(name), err)
				}
				root = viewPath(root, parent)
			}
			if _, err := control(root, fs.CmdCreate+":"+fs.QuoteArg(name)); err != nil {
				if errors.Is(err, os.ErrNotExist) {
					return fmt.Errorf("create %s: no branch %s under %s", branch.Quote(name), branch.Quote(parent), mnt)
				}
				return explain("create", name, err)
			}
			if maxStorage > 0 {
				if err := setLimit(view, int64(maxStorage)); err != nil {
					return explain("create", name, err)
				}
			}
			fmt.Println(viewPath(mnt, name))
			return nil
		},
	}
	c.Flags().StringVarP(&parent, "parent", "p", branch.MainName, "parent branch")
	c.Flags().Var(&maxStorage, "max-storage", "limit what the branch's own changes hold to SIZE bytes (512K, 10G: powers of 1024): file sizes rounded up to blocks, each file once; writes beyond it fail with EDQUOT")
	return c
}

func commitCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "commit PATH",
		Short: "Commit the branch that holds PATH into its parent",
		Long: `Apply what the branch holding PATH (MNT/@NAME or any path below it) changed to its parent, then end the
branch. A commit is atomic: the parent shows all of it or none of it, also if the daemon is killed on the
way (the next mount finishes or undoes it). The first of two sibling branches to commit wins; the other,
and its children, become stale: every operation in them fails, and committing one exits with status 3.
A branch with live children cannot be committed.`,
		Example: `  branchfs commit /mnt/p/@try1
  branchfs commit . || branchfs abort .`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			root, name, err := branchAt(args[0], "commit")
			if err != nil {
				return err
			}
			f, err := openControl(root)
			if err != nil {
				return explain("commit", name, err)
			}
			defer f.Close()
			if err := kernel.Commit(f); err != nil {
				return explain("commit", name, err)
			}
			return nil
		},
	}
}

func abortCmd() *cobra.Command {
	var recursive bool
	c := &cobra.Command{
		Use:   "abort PATH",
		Short: "Drop the branch that holds PATH and its changes",
		Long: `End the branch holding PATH (MNT/@NAME or any path below it) and drop its changes; its parent is
unchanged. A branch with live children is refused unless --recursive, which drops them too. Stale branches
are aborted the same way.`,
		Example: `  branchfs abort /mnt/p/@try1
  branchfs abort --recursive /mnt/p/@try1`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			root, name, err := branchAt(args[0], "abort")
			if err != nil {
				return err
			}
			c := fs.CmdAbort
			if recursive {
				c += ":" + fs.ArgRecursive
			}
			if _, err := control(root, c); err != nil {
				err = explain("abort", name, err)
				if errors.Is(err, syscall.EBUSY) {
					err = fmt.Errorf("%w (use --recursive to drop them too)", err)
				}
				return err
			}
			return nil
		},
	}
	c.Flags().BoolVar(&recursive, "recursive", false, "also drop live child branches")
	return c
}

func listCmd() *cobra.Command {
	var asJSON, all bool
	c := &cobra.Command{
		Use:   "list (MNT | --store DIR)",
		Short: "List live and stale branches with parent, state, epoch and delta size",
		Long: `List main and every live or stale branch of the mount at MNT: its parent, state (live or stale), epoch
(the commits it has received from its children) and what its delta holds (changed files and their bytes).
--all adds the latest committed and aborted branches. --json prints the same as a JSON array. Without
MNT, --store (--storage) DIR finds the mount whose store DIR is.`,
		Example: `  branchfs list /mnt/p
  branchfs list --json /mnt/p | jq -r '.[] | select(.state == "stale") | .name'`,
		Args: cobra.RangeArgs(0, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				if storeArg == "" {
					return errors.New("list: give MNT, or --store DIR")
				}
				mnt, err := mountOfStore(storeArg)
				if err != nil {
					return fmt.Errorf("list: %w", err)
				}
				args = []string{mnt}
			}
			root, _, err := mountRoot(args[0])
			if err != nil {
				return fmt.Errorf("list: %w", err)
			}
			st, err := readStatus(root, all)
			if err != nil {
				return fmt.Errorf("list %s: %w", args[0], err)
			}
			if asJSON {
				return json.NewEncoder(os.Stdout).Encode(st.Branches)
			}
			w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "NAME\tPARENT\tSTATE\tEPOCH\tDELTA")
			for _, b := range st.Branches {
				parent := b.Parent
				if parent == "" {
					parent = "-"
				}
				delta := count(b.DeltaFiles, "file") + ", " + count(b.DeltaBytes, "byte")
				if b.StorageUsed != nil {
					delta += "; " + limitText(b)
				}
				fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%s\n", branch.Quote(b.Name), branch.Quote(parent), b.State, b.Epoch, delta)
			}
			return w.Flush()
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	c.Flags().BoolVar(&all, "all", false, "also list the latest committed and aborted branches (up to 32)")
	return c
}

// limitText is what a storage limit counts for a branch of list, main
// standing for the mount.
func limitText(b branch.Info) string {
	switch {
	case b.Name == branch.MainName:
		return fmt.Sprintf("all: %d of %d bytes counted", *b.StorageUsed, b.MaxStorage)
	case b.MaxStorage == 0:
		return fmt.Sprintf("%d bytes counted (the mount's limit)", *b.StorageUsed)
	}
	return fmt.Sprintf("%d of %d bytes counted", *b.StorageUsed, b.MaxStorage)
}

// count is "1 file", "2 files": n and the noun, plural unless n is 1.
func count[N int | int64](n N, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

func diffCmd() *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:   "diff PATH",
		Short: "Show what the branch holding PATH added, changed and deleted",
		Long: `Print what committing the branch holding PATH would change in its parent, one path a line, relative to
the view's root: "A" added, "M" modified (a directory, ending in "/", when its mode, owner or xattrs
change or it was deleted and made again), "D" deleted. --json prints {"branch", "parent", "added",
"modified", "deleted"}.`,
		Example: `  branchfs diff /mnt/p/@try1
  branchfs diff --json /mnt/p/@try1`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			root, name, err := branchAt(args[0], "diff")
			if err != nil {
				return err
			}
			data, err := control(root, fs.CmdDiff)
			if err != nil {
				return explain("diff", name, err)
			}
			if asJSON {
				_, err := os.Stdout.Write(append(data, '\n'))
				return err
			}
			var d branch.Diff
			if err := json.Unmarshal(data, &d); err != nil {
				return err
			}
			var b strings.Builder
			for _, p := range d.Added {
				fmt.Fprintf(&b, "A %s\n", p)
			}
			for _, p := range d.Modified {
				fmt.Fprintf(&b, "M %s\n", p)
			}
			for _, p := range d.Deleted {
				fmt.Fprintf(&b, "D %s\n", p)
			}
			_, err = os.Stdout.WriteString(b.String())
			return err
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
}
