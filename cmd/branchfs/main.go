// Command branchfs mounts a directory with copy-on-write branches and
// creates, commits and aborts them.
package main

import (
	"errors"
	"fmt"
	"os"
	"runtime/debug"
	"syscall"

	"github.com/branchfs/branchfs/branch"
	"github.com/branchfs/branchfs/explore"
	"github.com/spf13/cobra"
)

// Exit statuses: a lost commit is told apart from other failures, so
// scripts can retry or pick another candidate.
const (
	exitError = 1
	exitStale = 3
)

func main() {
	args := joinPassthroughValue(os.Args[1:])
	root := newRootFor(args)
	// What a killed `branchfs run` left (processes, cgroups, branches) is
	// ended by the next branchfs command.
	root.PersistentPreRun = func(*cobra.Command, []string) { explore.Reap() }
	root.SetArgs(args)
	err := root.Execute()
	explore.Shutdown() // the janitor of runs, if this command started any
	if err != nil {
		var status exitStatus
		if errors.As(err, &status) {
			os.Exit(int(status))
		}
		fmt.Fprintln(os.Stderr, "branchfs:", err)
		if errors.Is(err, syscall.ESTALE) || errors.Is(err, branch.ErrStale) || errors.Is(err, branch.ErrGone) {
			os.Exit(exitStale)
		}
		os.Exit(exitError)
	}
}

// commands are branchfs's commands in the order of its help, with their
// names (TestCommandNames checks them against the commands' own).
var commands = []struct {
	name, group string
	make        func() *cobra.Command
}{
	{"mount", "branches", mountCmd}, {"unmount", "branches", unmountCmd}, {"create", "branches", createCmd},
	{"commit", "branches", commitCmd}, {"abort", "branches", abortCmd}, {"list", "branches", listCmd},
	{"diff", "branches", diffCmd}, {"push", "branches", pushCmd}, {"pull", "branches", pullCmd},
	{"run", "runs", runCmd}, {"checkpoint", "runs", checkpointCmd}, {"restore", "runs", restoreCmd},
	{"speculate", "runs", speculateCmd}, {"best-of-n", "runs", bestOfNCmd}, {"reflexion", "runs", reflexionCmd},
	{"tree", "runs", treeCmd}, {"beam", "runs", beamCmd}, {"tournament", "runs", tournamentCmd},
	{"cascaded", "runs", cascadedCmd},
}

// newRoot is the root command with every command below it.
func newRoot() *cobra.Command { return newRootFor(nil) }

// newRootFor is the root command for running args: with only the command
// args name, if they name one, since a process runs one command, and
// making all of them (their flags, defaults and help) was a twentieth of
// the time of a `branchfs create`. Anything else (help, completion, a
// mistyped name that cobra suggests a command for) gets them all.
func newRootFor(args []string) *cobra.Command {
	only := ""
	if len(args) > 0 {
		for _, c := range commands {
			if c.name == args[0] {
				only = c.name
			}
		}
	}
	root := &cobra.Command{
		Use:   "branchfs",
		Short: "Copy-on-write branches of a directory, committed atomically",
		Long: `branchfs shows a directory (the base) at a mount point, MNT, and serves branches of it at MNT/@NAME.
A branch starts as its parent shows now and keeps its own writes: they reach neither the base nor any
other branch until the branch is committed, which applies them to its parent all at once (all or
nothing, also if the daemon is killed). Of two sibling branches, the first to commit wins; the other
becomes stale. Branches are made, committed and aborted by the commands below, by the user who
mounted, root and the members of mount --control-group, or through the FS_IOC_BRANCH_* ioctls on any
file of a view, or text commands written to a view's .branchfs_ctl.
The run and pattern commands run processes in branches and commit or abort them by their outcome.

EXIT STATUS
  0    Success.
  1    An error, described on standard error.
  3    The branch is stale (a sibling committed first) or no longer exists.
  run exits with the status of its command: 124 when --timeout ended it, 128+N when signal N did.
  A pattern (speculate, best-of-n, ...) exits 0 when a candidate won and 1 when none did.
  Interrupted by signal N (SIGINT, SIGTERM, SIGHUP), run and the patterns exit 128+N.

SHELL COMPLETION
  branchfs completion SHELL prints a completion script for bash, zsh, fish or powershell; see
  branchfs completion SHELL --help for where to put it.`,
		Example: `  branchfs mount --base ~/project /mnt/p
  branchfs create try1 /mnt/p              # prints /mnt/p/@try1
  (cd /mnt/p/@try1 && make test)
  branchfs diff /mnt/p/@try1
  branchfs commit /mnt/p/@try1             # or: branchfs abort /mnt/p/@try1
  branchfs run /mnt/p -- make test         # the same in one command
  branchfs unmount /mnt/p
  source <(branchfs completion bash)`,
		Version:       buildVersion(),
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddGroup(&cobra.Group{ID: "branches", Title: "Branches:"}, &cobra.Group{ID: "runs", Title: "Processes in branches:"})
	for _, c := range commands {
		if only == "" || c.name == only {
			cmd := c.make()
			cmd.GroupID = c.group
			root.AddCommand(cmd)
		}
	}
	addStoreFlag(root)
	for _, c := range root.Commands() {
		if status, ok := exitStatusHelp[c.Name()]; ok {
			c.Long += "\n\nEXIT STATUS\n" + status
		}
	}
	return root
}

// The EXIT STATUS section of each command's help, as main exits.
const (
	exitsPlain = `  0      Success.
  1      An error, described in one line on standard error.`
	exitsBranch = exitsPlain + `
  3      The branch is stale (a sibling committed first) or no longer exists.`
	exitsPattern = `  0      A candidate won (and was committed, unless --no-commit).
  1      No candidate won, or an error, described in one line on standard error.
  128+N  Signal N (SIGINT, SIGTERM, SIGHUP) interrupted it; every candidate was ended.`
)

var exitStatusHelp = map[string]string{
	"mount": exitsPlain, "unmount": exitsPlain,
	"create": exitsBranch, "commit": exitsBranch, "abort": exitsBranch, "list": exitsBranch, "diff": exitsBranch,
	"checkpoint": exitsBranch, "push": exitsBranch, "pull": exitsPlain,
	"run": `  N      CMD's own exit status.
  124    --timeout ended CMD.
  127    CMD could not be started.
  128+N  Signal N ended CMD, or interrupted branchfs run (SIGINT, SIGTERM, SIGHUP).
  1, 3   branchfs itself failed, described in one line on standard error; 3: the branch is stale.`,
	"restore": `  0      Every clone was restored and has ended; the output says which one committed, if any.
  1      An error, described in one line on standard error; if a clone failed to restore, every clone was ended.
  128+N  Signal N (SIGINT, SIGTERM, SIGHUP) interrupted it; every clone was ended.`,
	"speculate": exitsPattern, "best-of-n": exitsPattern, "reflexion": exitsPattern, "cascaded": exitsPattern,
	"tournament": exitsPattern, "tree": exitsPattern, "beam": exitsPattern,
}

// version is the release, set when linking (-ldflags "-X main.version=v1.0.0").
var version string

// buildVersion is version, or else the module's version and the commit the
// binary was built from.
func buildVersion() string {
	if version != "" {
		return version
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	v := bi.Main.Version
	for _, s := range bi.Settings {
		switch {
		case s.Key == "vcs.revision":
			v += " " + s.Value[:min(12, len(s.Value))]
		case s.Key == "vcs.modified" && s.Value == "true":
			v += " (modified)"
		}
	}
	return v
}
