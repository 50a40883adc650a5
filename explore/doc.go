// Package explore runs processes in branches of a branchfs mount: the Go
// face of branch(), with a user-space path beside the system call: it
// gives user space what the system call gives in the kernel (BR_FS,
// BR_ISOLATE, the sibling kill on commit), on a stock kernel. It opens a
// mount and creates, commits, aborts and lists branches through package
// ctl (the FS_IOC_BRANCH_* ioctls, and the control file where a name must
// be given); runs a command in a branch; and builds the exploration
// patterns (Speculate, BestOfN, Reflexion, Tree, Beam, Tournament,
// Cascaded) on that. `branchfs run` and the pattern subcommands are thin
// layers over it.
//
// A run holds these guarantees:
//
//   - The command runs in a private mount namespace in which the mount point
//     itself shows the branch (over MNT, over the base directory, and over
//     each Spec.Binds path), so tools that have the workspace's path baked
//     in write into the branch. A working directory inside any of them is
//     the same place in the branch. On the kernel path (DataPath) the
//     kernel's overlayfs over the branch's layers shows it, at native
//     speed, while the daemon holds the branch; on the FUSE path MNT/@NAME
//     is bound there. A sibling's commit ends a kernel-path run
//     (Result.Stale).
//   - Every process the command starts, including those that setsid(),
//     double-fork or daemonize, ends when the command ends, times out or
//     loses: the run has a cgroup v2 of its own (ended with cgroup.kill;
//     ContainCgroup), inside a PID namespace of its own whose first process
//     is a helper (ending it ends the namespace). Where no cgroup can be
//     written, the PID namespace alone does it (ContainPIDNS); Result says
//     which.
//   - Runs are in separate PID namespaces, so siblings cannot signal or
//     ptrace each other.
//   - Nothing outlives the run: not a process, cgroup, mount namespace or
//     the branch it made, even when the program running it is killed with
//     SIGKILL (see Reap).
//
// The command finds its branch's name in BRANCHFS_BRANCH, its index in
// BRANCHFS_INDEX and where it sees the branch (the mount point) in
// BRANCHFS_VIEW.
//
// The helper is this program started again: package initialization
// recognizes it and never returns to main. Starting runs needs
// CAP_SYS_ADMIN for the namespaces, or an unprivileged user namespace.
// The branch() system call forks from a single thread, which a Go program
// cannot do safely, so this package always takes the user-space path;
// kernel.BranchCreate is there for programs that can.
package explore
