// Package checkpoint pairs branches with process memory: it checkpoints
// the process tree of a `branchfs run` into its branch's store directory
// and restores it as N clones, each in a child branch of its own. It is
// named for its job (checkpoint and restore), not for the tool under it.
// It stands beside package explore, whose runs it checkpoints and restores
// into: both give user space what branch() gives in the kernel, here for
// memory as well as files.
//
// CRIU does the work, driven through its command line (criu dump, criu
// restore), not its RPC service (go-criu over `criu swrk`). The CLI needs
// no protobuf code in a static binary, leaves a log file per action beside
// the images that a failing clone's error quotes, and can run inside the
// namespaces of a run (nsenter for a dump; a restore runs as the command of
// a run). go-criu adds nothing the CLI lacks here and, in v8.3.0, its
// FeatureCheck only echoes the features asked for.
//
// A checkpoint (Checkpoint) dumps the tree rooted at the run's command,
// from inside the run's mount and PID namespaces, into
// STORE/branches/NAME/images/GEN, the branch's data (images.go; see
// package branch for how an entry is published). First it freezes the run's cgroup, then it makes
// a child branch, NAME-checkpoint (the hold), so that NAME, which has a
// live child, is read-only from then on: the checkpoint's files stay as
// its memory expects them (the frozen-origin rule). The tree is frozen
// before its branch turns read-only, so it never sees that happen; only a
// tree left running after the dump (LeaveRunning) writes into a read-only
// branch, and gets EROFS. An incremental checkpoint stores only
// what changed since the previous one, by the best tier that works: the
// kernel's soft-dirty bits (CRIU's --track-mem, tier "soft-dirty"); where
// the kernel lacks them, or the previous dump did not track memory, the
// pages the pagemap shows present and anonymous (those CRIU dumps)
// compared with the previous image, equal ones left to it (tier
// "anon-pagemap", incremental.go); with no previous image, everything
// (tier "full"). The output says which tier ran.
//
// A restore (Restore) makes N child branches of NAME and starts, in each,
// a run (package explore: its own mount namespace with the clone's view
// bound over the mount point and the base directory, its own PID
// namespace and cgroup) whose command is this program again: it shows the
// clone its generation id and runs `criu restore`, whose tree keeps the
// PIDs it had, free in the new PID namespace. Every clone must be restored
// or none is: on a failure every clone is killed, every clone branch
// aborted, and the error names the failing clone and quotes CRIU's log.
// The clones then race as speculate's candidates do: the first to exit 0
// commits into NAME, the others are killed and aborted (Keep leaves every
// branch).
//
// A lazy restore (RestoreOptions.Lazy) runs `criu restore --lazy-pages`
// with CRIU's lazy-pages daemon beside it, fed by our page server
// (pageserver.go: CRIU's page-server protocol over a socket pair, pages
// read from the image files, pagemap.go). The page server records the
// pages the clone faults in; the first lazy restore of an image saves
// them in it (WorkingSetName, through branch.AddDataFile), and later
// ones restore from a view of the image in which those pages are not
// lazy, so that CRIU copies them in before the tree runs (σCRIU's
// working-set prefetch).
//
// A clone learns that it is one from the files in /run/branchfs/clone
// (CloneDir), a read-only tmpfs mounted in its mount namespace alone and
// readable by anyone: id (32 hex digits, random, different in every
// clone of every restore; the checkpointed original has no such
// directory), index (0..N-1) and branch. A program reseeds its random
// numbers and renews its identifiers when id changes.
//
// CRIU must pass `criu check` on the running kernel: Debian's 3.17 fails
// on kernels from 6.13 on (their vDSO layout arrived in CRIU 4.1). Where
// it is missing or fails, every call here fails at once with one line
// saying so (Available); the filesystem is not affected.
package checkpoint
