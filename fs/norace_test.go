//go:build !race

package fs_test

const raceBuild = false
