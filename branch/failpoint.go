package branch

// failHook, when set, runs at each named step of a commit and of its
// rollback (see commit.go): a test makes it return an error there, or kill
// the process as kill -9 would. Only tests set it, directly or through the
// branchfs_failpoints build tag (failpoint_env.go); the shipped binary never
// does.
var failHook func(step string) error

func failpoint(step string) error {
	if failHook == nil {
		return nil
	}
	return failHook(step)
}
