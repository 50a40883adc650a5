package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"

	"github.com/branchfs/branchfs/kernel/checkpoint"
	"github.com/spf13/cobra"
)

func checkpointCmd() *cobra.Command {
	var runID string
	var leaveRunning, incremental, asJSON bool
	c := &cobra.Command{
		Use:   "checkpoint NAME MNT (PID | --run-id ID)",
		Short: "Checkpoint the processes of a `branchfs run` in branch NAME, with the branch's files",
		Long: `Dump the process tree rooted at PID (a process of a ` + "`branchfs run`" + ` in branch NAME), or at the
command of the run in branch ID (--run-id; a run is named by its branch), with CRIU into the store beside
the branch. From then on the branch's files are frozen as the checkpoint's (a child branch NAME-checkpoint
holds them). The tree is killed unless --leave-running. --incremental stores only the pages changed since
the previous checkpoint (which must have left the tree running): those the kernel's soft-dirty bits mark,
or, where the kernel has none, those that differ from the previous image (the pagemap's anonymous pages,
compared); everything when there is no previous checkpoint. The output says which tier ran. Needs a CRIU that passes ` + "`criu check`" + `.`,
		Example: `  branchfs run --branch job /mnt/p -- ./long-job.sh &
  branchfs checkpoint job /mnt/p --run-id job --leave-running`,
		Args: cobra.RangeArgs(2, 3),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			o := checkpoint.DumpOptions{LeaveRunning: leaveRunning, Incremental: incremental}
			switch {
			case len(args) == 3 && runID != "":
				return errors.New("checkpoint: a PID or --run-id, not both")
			case len(args) == 3:
				pid, err := strconv.Atoi(args[2])
				if err != nil || pid <= 0 {
					return fmt.Errorf("checkpoint: %q is not a process ID", args[2])
				}
				o.PID = pid
			case runID == "":
				return errors.New("checkpoint: give a PID or --run-id ID")
			case runID != name:
				return fmt.Errorf("checkpoint: the run %s is not in branch %s", runID, name)
			}
			m, err := openMount(args[1])
			if err != nil {
				return fmt.Errorf("checkpoint: %w", err)
			}
			if _, err := checkpoint.Available(); err != nil {
				return fmt.Errorf("checkpoint: %w", err)
			}
			meta, err := checkpoint.Checkpoint(m, name, o)
			if err != nil {
				return fmt.Errorf("checkpoint %s: %w", name, err)
			}
			if asJSON {
				return json.NewEncoder(os.Stdout).Encode(meta)
			}
			fmt.Printf("checkpoint %d of %s: tier %s, %d pages, %d bytes of images\n", meta.Gen, name, meta.Tier, meta.Pages, meta.Bytes)
			return nil
		},
	}
	c.Flags().StringVar(&runID, "run-id", "", "checkpoint the command of the run in this branch")
	c.Flags().BoolVar(&leaveRunning, "leave-running", false, "leave the tree running after the dump")
	c.Flags().BoolVar(&incremental, "incremental", false, "dump only the pages written since the previous checkpoint")
	c.Flags().BoolVar(&asJSON, "json", false, "print the image's record as JSON")
	return c
}
