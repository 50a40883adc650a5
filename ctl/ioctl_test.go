package ctl

import "testing"

// The numbers must match what C's <linux/ioctl.h> macros produce.
func TestIoctlNumbers(t *testing.T) {
	for _, c := range []struct {
		name      string
		got, want uint32
	}{
		{"CREATE", FS_IOC_BRANCH_CREATE, 0x80806200},
		{"COMMIT", FS_IOC_BRANCH_COMMIT, 0x6201},
		{"ABORT", FS_IOC_BRANCH_ABORT, 0x6202},
	} {
		if c.got != c.want {
			t.Errorf("FS_IOC_BRANCH_%s = %#x, want %#x", c.name, c.got, c.want)
		}
	}
}
