package branch

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestLongPathsStayBeneath: paths longer than one openat2 takes resolve
// in chunks, and a symlink or ".." anywhere along them still cannot lead
// out of the layer, also where what lies outside would resolve.
func TestLongPathsStayBeneath(t *testing.T) {
	dir := t.TempDir()
	name := strings.Repeat("d", 250)
	parts := make([]string, 20)
	for i := range parts {
		parts[i] = name
	}
	deep := strings.Join(parts, "/")
	levels := mkdirDeep(t, filepath.Join(dir, "layer"), len(parts))
	// The same tree outside the layer, with a file at its bottom.
	outside := mkdirDeep(t, filepath.Join(dir, "out"), len(parts))
	fd, err := unix.Openat(outside[len(parts)], "secret", unix.O_CREAT|unix.O_WRONLY, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	unix.Close(fd)

	l, err := openLayer(filepath.Join(dir, "layer"), false)
	if err != nil {
		t.Fatal(err)
	}
	defer l.close()
	fd, err = l.open(deep+"/f", unix.O_CREAT|unix.O_WRONLY|unix.O_EXCL, 0o600)
	if err != nil {
		t.Fatalf("create %d bytes deep: %v", len(deep), err)
	}
	unix.Close(fd)
	if st, err := l.lstat(deep + "/f"); err != nil || st.Mode&0o777 != 0o600 {
		t.Fatalf("lstat deep file: mode %o, %v", st.Mode&0o777, err)
	}
	// From each depth i, a symlink to dir and ".." up to dir, followed by
	// the way down to the secret: every walk must fail.
	down := "out/" + deep + "/secret"
	for i := range parts {
		if err := unix.Symlinkat(dir, levels[i], "l"); err != nil {
			t.Fatal(err)
		}
		at := strings.Join(parts[:i], "/")
		if at != "" {
			at += "/"
		}
		for _, p := range []string{at + "l/" + down, at + strings.Repeat("../", i+1) + down} {
			if fd, err := l.open(p, unix.O_RDONLY, 0); err == nil {
				unix.Close(fd)
				t.Errorf("opened a file outside the layer through a %d-byte path (symlink or .. %d deep)", len(p), i)
			}
		}
		unix.Unlinkat(levels[i], "l", 0)
	}
}

// mkdirDeep makes directory root and n levels of 250-byte names below it,
// with *at calls (the whole path is too long for mkdir(2)), and returns a
// descriptor for each level, root first.
func mkdirDeep(t *testing.T, root string, n int) []int {
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	levels := []int{fd}
	t.Cleanup(func() {
		for _, fd := range levels {
			unix.Close(fd)
		}
	})
	for range n {
		name := strings.Repeat("d", 250)
		if err := unix.Mkdirat(fd, name, 0o755); err != nil {
			t.Fatal(err)
		}
		if fd, err = unix.Openat(fd, name, unix.O_PATH|unix.O_DIRECTORY, 0); err != nil {
			t.Fatal(err)
		}
		levels = append(levels, fd)
	}
	return levels
}
