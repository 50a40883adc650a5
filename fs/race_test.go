//go:build race

package fs_test

// The daemon under test is built with the race detector when the tests are.
const raceBuild = true
