// Command branchfs mounts a directory with copy-on-write branches and
// creates, commits and aborts them.
package main

import (
	"errors"
	"fmt"
	"os"
	"syscall"

	"github.com/branchfs/branchfs/kernel/explore"
	"github.com/spf13/cobra"
)

// Exit statuses: a lost commit is told apart from other failures, so
// scripts can retry or pick another candidate.
const (
	exitError = 1
	exitStale = 3
)

func main() {
	root := &cobra.Command{
		Use:           "branchfs",
		Short:         "Copy-on-write branches of a directory, committed atomically",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(mountCmd(), unmountCmd(), createCmd(), commitCmd(), abortCmd(), listCmd(), diffCmd())
	root.AddCommand(checkpointCmd(), restoreCmd())
	root.AddCommand(runCmd(), speculateCmd(), bestOfNCmd(), reflexionCmd(), treeCmd(), beamCmd(), tournamentCmd(), cascadedCmd())
	// What a killed `branchfs run` left (processes, cgroups, branches) is
	// ended by the next branchfs command.
	root.PersistentPreRun = func(*cobra.Command, []string) { explore.Reap() }
	root.SetArgs(joinPassthroughValue(os.Args[1:]))
	err := root.Execute()
	explore.Shutdown() // the janitor of runs, if this command started any
	if err != nil {
		var status exitStatus
		if errors.As(err, &status) {
			os.Exit(int(status))
		}
		fmt.Fprintln(os.Stderr, "branchfs:", err)
		if errors.Is(err, syscall.ESTALE) {
			os.Exit(exitStale)
		}
		os.Exit(exitError)
	}
}
