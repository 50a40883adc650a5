package transport

// SlowFiles sends to workers the reads and writes of the files whose inode
// number is ino, and every IOCTL: the file system answers commands there
// that may wait long for a lock (fs's control files, whose commands take
// the store's lock exclusively and so wait for every operation in flight),
// and the reader would read no other request meanwhile. Call it before
// Serve.
func (l *Loop) SlowFiles(ino uint64) {
	l.nodes.slowIno, l.nodes.slowNodes = ino, map[uint64]uint64{}
}
