package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"

	"github.com/branchfs/branchfs/checkpoint"
	"github.com/branchfs/branchfs/internal/phase"
	"github.com/branchfs/branchfs/remote"
	"github.com/spf13/cobra"
)

func checkpointCmd() *cobra.Command {
	var runID, to string
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
compared); everything when there is no previous checkpoint. The output says which tier ran. Needs a CRIU that passes ` + "`criu check`" + `.
--to URL pushes the branch with its checkpoint to URL (as push does), for restore --from on another
host: each image file is uploaded as soon as CRIU has written it, the rest and the manifest once the
dump is done; a dump or upload that fails leaves the manifest at URL as it was. It needs a full
checkpoint (not --incremental).` + remoteEnv,
		Example: `  branchfs run --branch job /mnt/p -- ./long-job.sh &
  branchfs checkpoint job /mnt/p --run-id job --leave-running
  branchfs checkpoint job /mnt/p --run-id job --to s3://bucket/jobs/`,
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
			var dest *remoteDest
			var stream *remote.ImageStream
			if to != "" {
				if incremental {
					return errors.New("checkpoint: --to needs a full checkpoint, not --incremental")
				}
				// The bucket is checked before the dump, which may not
				// leave the tree running.
				if dest, err = openRemote(context.Background(), to, name); err != nil {
					return fmt.Errorf("checkpoint %s: %w", name, err)
				}
				phase.Mark("bucket connected")
				// The image's files go up as CRIU closes each; the push
				// after the dump sends the rest and the manifest.
				stream = remote.NewImageStream(dest.ctx, dest.b, dest.loc, remote.Options{Progress: terminal()})
				o.Watch = stream.Watch
			}
			meta, err := checkpoint.Checkpoint(m, name, o)
			if err != nil {
				if stream != nil {
					stream.Abort()
				}
				return fmt.Errorf("checkpoint %s: %w", name, err)
			}
			if !asJSON {
				fmt.Printf("checkpoint %d of %s: tier %s, %d pages, %d bytes of images\n", meta.Gen, name, meta.Tier, meta.Pages, meta.Bytes)
			}
			var pushed *remote.Stats
			if dest != nil {
				phase.Mark("push begins")
				if pushed, err = dest.push(m.View(name), name, stream, remote.Options{Progress: terminal()}); err != nil {
					return fmt.Errorf("checkpoint %s: kept here, but the push to %s failed: %w (%s is as it was)", name, dest.loc, err, dest.loc)
				}
				if !asJSON {
					fmt.Printf("pushed %s with checkpoint %d to %s: %s, sent %s\n", name, meta.Gen, dest.loc, remote.BytesOf(pushed.Bytes), remote.BytesOf(pushed.Sent))
				}
			}
			phase.Mark("done")
			if asJSON {
				return json.NewEncoder(os.Stdout).Encode(meta)
			}
			return nil
		},
	}
	c.Flags().StringVar(&runID, "run-id", "", "checkpoint the command of the run in this branch")
	c.Flags().StringVar(&to, "to", "", "push the branch and its checkpoint, as it is dumped, to this s3://BUCKET/KEY")
	c.Flags().BoolVar(&leaveRunning, "leave-running", false, "leave the tree running after the dump")
	c.Flags().BoolVar(&incremental, "incremental", false, "dump only the pages written since the previous checkpoint")
	c.Flags().BoolVar(&asJSON, "json", false, "print the image's record as JSON")
	return c
}
