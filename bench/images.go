package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// images is a set of disk images of one size, each written in full once
// and attached to a loop device with direct I/O, on which fresh ext4 file
// systems are made for the systems to work on. Written in full, an image
// has neither holes nor unwritten extents, so the host's file system
// allocates and converts nothing while a system writes into it (into a
// sparse image, as freshFS makes, or into the work directory, where the
// host's file system, mounted with discard here, gives back the blocks of
// each removed file, a system's writeback also pays for the host's
// allocation); with direct I/O the image's blocks go to the disk as a
// partition's would, without a second copy in the host's page cache that
// a later system's writeback would meet.
type images struct {
	files, loops []string
}

// newImages makes n images of size bytes in the work directory.
func (b *bench) newImages(n int, size int64) *images {
	im := &images{}
	zeros := make([]byte, 1<<20)
	for i := range n {
		p := filepath.Join(b.work, fmt.Sprintf("image-%d.img", i))
		f, err := os.Create(p)
		must(err)
		for off := int64(0); off < size; off += int64(len(zeros)) {
			_, err := f.Write(zeros)
			must(err)
		}
		must(f.Sync())
		must(f.Close())
		out, err := exec.Command("losetup", "--direct-io=on", "--find", "--show", p).Output()
		if err != nil {
			fail("losetup %s: %v", p, err)
		}
		im.files = append(im.files, p)
		im.loops = append(im.loops, strings.TrimSpace(string(out)))
	}
	return im
}

// fresh makes a new ext4 file system on image i, mounts it at the work
// directory's name, and returns its root and what unmounts it. mkfs
// discards nothing (a discard punches holes in the image) and initializes
// the inode tables and the journal itself: left lazy, they would be
// zeroed by the kernel's ext4lazyinit thread in the background, under the
// measurement.
func (im *images) fresh(b *bench, i int, name string) (string, func()) {
	dev, root := im.loops[i], b.dir(name)
	must(run(b.work, nil, "mkfs.ext4", "-q", "-F", "-E", "nodiscard,lazy_itable_init=0,lazy_journal_init=0", dev))
	must(run(b.work, nil, "mount", dev, root))
	return root, func() { unmountFS(root); os.Remove(root) }
}

// remove detaches and deletes the images.
func (im *images) remove() {
	for i, dev := range im.loops {
		exec.Command("losetup", "-d", dev).Run()
		os.Remove(im.files[i])
	}
}

// unmountFS unmounts the file system at root, waiting for a FUSE daemon
// that may still be closing its files after its own unmount returned.
func unmountFS(root string) {
	for i := 0; unix.Unmount(root, 0) == unix.EBUSY; i++ {
		if i == 200 {
			must(unix.Unmount(root, unix.MNT_DETACH))
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}
