package main

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/branchfs/branchfs/checkpoint"
	"github.com/branchfs/branchfs/remote"
	"github.com/spf13/cobra"
)

func restoreCmd() *cobra.Command {
	var clones, jobs int
	var from string
	var keep, lazy, asJSON bool
	c := &cobra.Command{
		Use:   "restore NAME MNT --clones N",
		Short: "Restore the latest checkpoint of branch NAME as N clones, each in a child branch",
		Long: `Make N child branches of NAME and restore the latest checkpoint of NAME into each: its own mount
namespace, in which MNT shows the clone's branch, its own PID namespace and cgroup. All or none: if one
clone fails to restore, every clone is ended and its branch aborted, and the error names it. Each clone
reads its generation id in ` + checkpoint.CloneDir + `/id. branchfs restore then waits: the first clone to exit 0
commits into NAME and the others are killed and aborted (--keep leaves every clone's branch).
--lazy restores memory on demand (CRIU's lazy pages, served by branchfs): the first lazy restore of a
checkpoint records the pages its clones fault in (the working set, kept with the checkpoint), and later
ones copy that set in before the clones run.
--from URL restores the checkpoint pushed to URL (checkpoint --to, or push of a checkpointed branch) on
this host: the branch is pulled as NAME first if the mount has none (see pull), and the image is
downloaded in parallel, or, with --lazy, all but its memory, which the clones fault in by ranged GETs
from the bucket, one fetch for all clones; the working set the first lazy restore records is kept in
the bucket, where the next one, on any host, finds it and fetches it before the clones run. A restore
--from that fails aborts the branch it pulled.` + remoteEnv,
		Example: `  branchfs restore job /mnt/p --clones 4
  branchfs restore job /mnt/p --clones 4 --lazy --from s3://bucket/jobs/job`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if clones < 1 {
				return fmt.Errorf("restore: --clones must be at least 1")
			}
			m, err := openMount(args[1])
			if err != nil {
				return fmt.Errorf("restore: %w", err)
			}
			if _, err := checkpoint.Available(); err != nil {
				return fmt.Errorf("restore: %w", err)
			}
			ctx, stop := interruptible()
			var source *checkpoint.Source
			fromDone := func(bool) {}
			if from != "" {
				var err error
				source, fromDone, err = restoreSource(ctx, m, args[0], args[1], from, lazy, jobs)
				if err != nil {
					stop()
					return fmt.Errorf("restore %s: %w", args[0], err)
				}
			}
			o := checkpoint.RestoreOptions{Clones: clones, Keep: keep, Lazy: lazy, From: source, Restored: func(cs []*checkpoint.Clone) {
				if !asJSON {
					for _, c := range cs {
						fmt.Printf("restored clone %d in branch %s (pid %d, id %s, %.1f ms)\n", c.Index, c.Branch, c.PID, c.ID, c.RestoreMS)
					}
				}
			}}
			out, err := checkpoint.Restore(ctx, m, args[0], o)
			sig := stop()
			fromDone(err == nil)
			if asJSON && out != nil {
				json.NewEncoder(os.Stdout).Encode(out)
			}
			if err != nil {
				return fmt.Errorf("restore %s: %w", args[0], err)
			}
			if !asJSON {
				switch {
				case out.WorkingSet != "":
					fmt.Printf("lazy restore: prefetched %d pages of the working set %s\n", out.Prefetched, out.WorkingSet)
				case out.Recording:
					fmt.Printf("lazy restore: recorded the working set (if the clones faulted any page in)\n")
				}
				if f := out.Fetched; f != nil {
					fmt.Printf("lazy restore: fetched the %d pages restored first in %d reads, %d requests, %d KiB, %.0f ms\n", f.Pages, f.Reads, out.Requests, f.Bytes>>10, f.MS)
				}
				for _, c := range out.Clones {
					state := "kept"
					switch {
					case c.Committed:
						state = "committed"
					case c.Aborted:
						state = "aborted"
					}
					fmt.Printf("clone %d (%s) exited %d%s: %s\n", c.Index, c.Branch, c.ExitCode, sigSuffix(c.Signal), state)
				}
			}
			if sig != 0 {
				return exitStatus(sig)
			}
			return nil
		},
	}
	c.Flags().IntVar(&clones, "clones", 1, "how many clones to restore")
	c.Flags().BoolVar(&lazy, "lazy", false, "restore memory on demand, prefetching the recorded working set")
	c.Flags().StringVar(&from, "from", "", "restore the checkpoint pushed to this s3://BUCKET/KEY")
	c.Flags().IntVarP(&jobs, "jobs", "j", remote.DefaultJobs, "with --from: requests to keep in flight")
	c.Flags().BoolVar(&keep, "keep", false, "leave every clone's branch when the clones end")
	c.Flags().BoolVar(&asJSON, "json", false, "print a JSON record of the restore")
	return c
}

func sigSuffix(s string) string {
	if s == "" {
		return ""
	}
	return " (" + s + ")"
}
