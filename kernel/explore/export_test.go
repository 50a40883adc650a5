package explore

// BuiltBinary is the branchfs binary TestMain built, for the examples.
func BuiltBinary() string { return binary }
