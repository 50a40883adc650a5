package explore

import "github.com/branchfs/branchfs/ctl"

// Mount is a branchfs mount point, seen from its main view: package ctl's
// client handle (views, branches, the daemon's verbs), with runs and the
// patterns on top.
type Mount struct {
	*ctl.Mount
	// dataPath is the runs' default (SetDataPath); "": auto.
	dataPath DataPath
}

// Open checks that dir is the mount point of a branchfs mount (its main
// view) and returns it. Inside a run, the run's mount point is taken as
// the mount (ctl.Open).
func Open(dir string) (*Mount, error) {
	c, err := ctl.Open(dir)
	if err != nil {
		return nil, err
	}
	return &Mount{Mount: c}, nil
}
