// Package ctl is branchfs's control protocol and its client: what a
// program that talks to a running daemon needs, and no FUSE.
//
// A daemon answers, at the root of every view (the mount point for main,
// MNT/@NAME for a branch), a control file, ControlName: a command written
// to it (VERB or VERB:ARG, one of the Cmd constants) runs, and reading it
// returns the answer (a new name, a Status, a diff as JSON). Any file of a
// view also answers the FS_IOC_BRANCH_* ioctls, which C programs and the
// kernel's branch() use. Package fs serves what this package defines.
//
// Here too: finding a mount in the mount table (Mounts, EnclosingMount,
// MountOfStore), opening a control file safely (OpenControl: a user's
// file of that name is refused), errno to message (Explain, from the
// error table of package branch), and the client handle Mount (Open,
// Create, Commit, Abort, List, Info, View, and the verbs of runs: Hold,
// Release, Watch, SetLimit, and Publish of a branch's data).
package ctl
