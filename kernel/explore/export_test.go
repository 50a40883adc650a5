package explore

// BuiltBinary is the branchfs binary TestMain built, for the examples.
func BuiltBinary() string { return binary }

// UnmountLater unmounts mnt and removes dir once the tests are done with
// it, for the examples.
func UnmountLater(mnt, dir string) { unmountLater(mnt, dir) }
