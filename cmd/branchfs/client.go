package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"

	"github.com/branchfs/branchfs/branch"
	"github.com/branchfs/branchfs/ctl"
	"github.com/branchfs/branchfs/explore"
	"github.com/spf13/cobra"
)

// findView returns the root of the view that holds p (MNT or MNT/@NAME)
// and its branch name (ctl.FindView), checking --store.
func findView(p string) (root, name string, err error) {
	root, name, mnt, err := ctl.FindView(p)
	if err == nil && mnt != "" {
		err = checkStore(mnt)
	}
	if err != nil {
		return "", "", err
	}
	return root, name, nil
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
	st, err := ctl.ReadStatus(mnt, false)
	if err != nil {
		return fmt.Errorf("%s: %w", mnt, err)
	}
	if !ctl.SameDir(st.Store, storeArg) {
		return fmt.Errorf("the mount at %s keeps its branches in %s, not in --store %s", mnt, st.Store, storeArg)
	}
	return nil
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
	if ctl.ResolvePrefix(abs) != mnt {
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

// setLimit gives the branch whose view is view, just created, a storage
// limit of max bytes, or else aborts it: a branch without the limit asked
// for is not what was asked.
func setLimit(view string, max int64) error {
	_, err := ctl.Command(view, ctl.CmdLimit+":"+strconv.FormatInt(max, 10))
	if err != nil {
		ctl.Command(view, ctl.CmdAbort)
	}
	return err
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
			view := ctl.ViewPath(root, name)
			// Inside a run, the mount point shows the run's branch: the
			// new branch is its child unless --parent says otherwise.
			if r, v := ctl.RunRoot(); r != "" && root == ctl.ResolvePrefix(v) && parent == branch.MainName && cmd.Flags().Changed("parent") {
				root = r
			}
			if parent != branch.MainName {
				if err := branch.ValidateName(parent); err != nil {
					return fmt.Errorf("create %s: parent: %w", branch.Quote(name), err)
				}
				root = ctl.ViewPath(root, parent)
			}
			if _, err := ctl.Command(root, ctl.CmdCreate+":"+ctl.QuoteArg(name)); err != nil {
				if errors.Is(err, os.ErrNotExist) {
					return fmt.Errorf("create %s: no branch %s under %s", branch.Quote(name), branch.Quote(parent), mnt)
				}
				return ctl.Explain("create", name, err)
			}
			if maxStorage > 0 {
				if err := setLimit(view, int64(maxStorage)); err != nil {
					return ctl.Explain("create", name, err)
				}
			}
			fmt.Println(ctl.ViewPath(mnt, name))
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
			f, err := ctl.OpenControl(root)
			if err != nil {
				return ctl.Explain("commit", name, err)
			}
			defer f.Close()
			if err := ctl.IoctlCommit(f); err != nil {
				return ctl.Explain("commit", name, err)
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
			c := ctl.CmdAbort
			if recursive {
				c += ":" + ctl.ArgRecursive
			}
			if _, err := ctl.Command(root, c); err != nil {
				err = ctl.Explain("abort", name, err)
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
				mnt, err := ctl.MountOfStore(storeArg)
				if err != nil {
					return fmt.Errorf("list: %w", err)
				}
				args = []string{mnt}
			}
			root, _, err := mountRoot(args[0])
			if err != nil {
				return fmt.Errorf("list: %w", err)
			}
			st, err := ctl.ReadStatus(root, all)
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
			data, err := ctl.Command(root, ctl.CmdDiff)
			if err != nil {
				return ctl.Explain("diff", name, err)
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
