// Command branchfs mounts a directory with copy-on-write branches and
// creates, commits and aborts them.
package main

import (
	"errors"
	"fmt"
	"os"
	"syscall"

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
	if err := root.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "branchfs:", err)
		if errors.Is(err, syscall.ESTALE) {
			os.Exit(exitStale)
		}
		os.Exit(exitError)
	}
}
