package checkpoint

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
)

// CRIU's memory images, as far as the page server and the prefetch need
// them. pagemap-PID.img lists a process's dumped memory: two magic
// numbers, then entries, each a 32-bit little-endian length and a
// protobuf message (images/pagemap.proto): first a pagemap_head naming
// the pages file (pages-ID.img), then one pagemap_entry per run of pages.
// The pages file holds the pages of the entries marked present, in the
// order of the entries; pages marked in-parent are in the parent image
// (an incremental checkpoint's "parent" link), at the same address.
const (
	imgCommonMagic = 0x54564319
	pagemapMagic   = 0x56084025
	pageSize       = 4096
)

// Flags of a pagemap entry.
const (
	peParent  = 1 << 0 // the pages are in the parent image
	peLazy    = 1 << 1 // they may be restored on demand (userfaultfd)
	pePresent = 1 << 2 // they are in this image's pages file
)

type pmEntry struct {
	vaddr uint64
	pages uint32
	flags uint32
	off   int64 // of its first page in the pages file, when present
}

// pagemap is one process's pagemap image, opened for reading pages.
type pagemap struct {
	pagesID uint32
	entries []pmEntry // ascending vaddr
	pages   PagesFile
	parent  *pagemap
}

// PagesFile reads an image's pages file (pages-ID.img): the file itself,
// or one kept elsewhere (Source.Pages).
type PagesFile interface {
	io.ReaderAt
	Close() error
}

// pagesOpener opens the pages file name of the image in dir.
type pagesOpener func(dir, name string) (PagesFile, error)

func openLocal(dir, name string) (PagesFile, error) { return os.Open(filepath.Join(dir, name)) }

func pagesName(id uint32) string { return fmt.Sprintf("pages-%d.img", id) }

func pagemapPath(dir string, pid int) string {
	return filepath.Join(dir, "pagemap-"+strconv.Itoa(pid)+".img")
}

// readPagemapFile reads the head and entries of a pagemap image.
func readPagemapFile(path string) (uint32, []pmEntry, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, nil, err
	}
	if len(data) < 8 || binary.LittleEndian.Uint32(data) != imgCommonMagic || binary.LittleEndian.Uint32(data[4:]) != pagemapMagic {
		return 0, nil, fmt.Errorf("%s: not a CRIU pagemap image", path)
	}
	data = data[8:]
	var msgs [][]byte
	for len(data) > 0 {
		if len(data) < 4 {
			return 0, nil, fmt.Errorf("%s: truncated", path)
		}
		n := int(binary.LittleEndian.Uint32(data))
		if len(data) < 4+n {
			return 0, nil, fmt.Errorf("%s: truncated", path)
		}
		msgs, data = append(msgs, data[4:4+n]), data[4+n:]
	}
	if len(msgs) == 0 {
		return 0, nil, fmt.Errorf("%s: no head", path)
	}
	head, err := protoVarints(msgs[0])
	if err != nil {
		return 0, nil, fmt.Errorf("%s: %w", path, err)
	}
	var entries []pmEntry
	var off int64
	for _, m := range msgs[1:] {
		f, err := protoVarints(m)
		if err != nil {
			return 0, nil, fmt.Errorf("%s: %w", path, err)
		}
		e := pmEntry{vaddr: f[1], pages: uint32(f[2])}
		// Older images have no flags: in_parent, or present.
		switch _, hasFlags := f[4]; {
		case f[3] != 0:
			e.flags = peParent
		case hasFlags:
			e.flags = uint32(f[4])
		default:
			e.flags = pePresent
		}
		if e.flags&pePresent != 0 {
			e.off = off
			off += int64(e.pages) * pageSize
		}
		entries = append(entries, e)
	}
	return uint32(head[1]), entries, nil
}

// openPagemap opens the pagemap of process pid in image dir, with its
// parents'.
func openPagemap(dir string, pid int) (*pagemap, error) { return openPagemapWith(dir, pid, openLocal) }

// openPagemapWith is openPagemap reading the pages through open.
func openPagemapWith(dir string, pid int, open pagesOpener) (*pagemap, error) {
	id, entries, err := readPagemapFile(pagemapPath(dir, pid))
	if err != nil {
		return nil, err
	}
	pm := &pagemap{pagesID: id, entries: entries}
	sort.Slice(pm.entries, func(i, j int) bool { return pm.entries[i].vaddr < pm.entries[j].vaddr })
	if pm.pages, err = open(dir, pagesName(id)); err != nil {
		return nil, err
	}
	if _, err := os.Stat(filepath.Join(dir, "parent")); err == nil {
		if pm.parent, err = openPagemapWith(filepath.Join(dir, "parent"), pid, open); err != nil {
			pm.close()
			return nil, fmt.Errorf("parent image: %w", err)
		}
	}
	return pm, nil
}

func (pm *pagemap) close() {
	for ; pm != nil; pm = pm.parent {
		if pm.pages != nil {
			pm.pages.Close()
		}
	}
}

var errNoPage = errors.New("no such page in the image")

// readPages copies len(buf)/pageSize pages from vaddr on into buf, a
// run of an entry with one read.
func (pm *pagemap) readPages(vaddr uint64, buf []byte) error {
	for len(buf) > 0 {
		i := sort.Search(len(pm.entries), func(i int) bool {
			e := pm.entries[i]
			return e.vaddr+uint64(e.pages)*pageSize > vaddr
		})
		if i == len(pm.entries) || pm.entries[i].vaddr > vaddr {
			return fmt.Errorf("%w: %#x", errNoPage, vaddr)
		}
		e := pm.entries[i]
		n := min(uint64(len(buf)), e.vaddr+uint64(e.pages)*pageSize-vaddr)
		switch {
		case e.flags&pePresent != 0:
			_, err := pm.pages.ReadAt(buf[:n], e.off+int64(vaddr-e.vaddr))
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			if err != nil {
				return err
			}
		case e.flags&peParent != 0 && pm.parent != nil:
			if err := pm.parent.readPages(vaddr, buf[:n]); err != nil {
				return err
			}
		default:
			return fmt.Errorf("%w: %#x (flags %#x)", errNoPage, vaddr, e.flags)
		}
		vaddr, buf = vaddr+n, buf[n:]
	}
	return nil
}

// protoVarints decodes a protobuf message whose fields of interest are
// varints, by field number; fields of other wire types are skipped.
func protoVarints(m []byte) (map[int]uint64, error) {
	out := map[int]uint64{}
	for len(m) > 0 {
		key, n := binary.Uvarint(m)
		if n <= 0 {
			return nil, errors.New("bad protobuf key")
		}
		m = m[n:]
		field, wire := int(key>>3), key&7
		switch wire {
		case 0:
			v, n := binary.Uvarint(m)
			if n <= 0 {
				return nil, errors.New("bad protobuf varint")
			}
			out[field], m = v, m[n:]
		case 1, 5:
			size := 8
			if wire == 5 {
				size = 4
			}
			if len(m) < size {
				return nil, errors.New("truncated protobuf")
			}
			m = m[size:]
		case 2:
			l, n := binary.Uvarint(m)
			if n <= 0 || uint64(len(m)-n) < l {
				return nil, errors.New("bad protobuf bytes")
			}
			m = m[n+int(l):]
		default:
			return nil, fmt.Errorf("protobuf wire type %d", wire)
		}
	}
	return out, nil
}

// appendEntry appends one pagemap_entry record (length and message).
func appendEntry(b []byte, e pmEntry) []byte {
	var msg []byte
	msg = binary.AppendUvarint(msg, 1<<3)
	msg = binary.AppendUvarint(msg, e.vaddr)
	msg = binary.AppendUvarint(msg, 2<<3)
	msg = binary.AppendUvarint(msg, uint64(e.pages))
	msg = binary.AppendUvarint(msg, 4<<3)
	msg = binary.AppendUvarint(msg, uint64(e.flags))
	b = binary.LittleEndian.AppendUint32(b, uint32(len(msg)))
	return append(b, msg...)
}

// writePagemapFile writes a pagemap image: the entries must be in the
// order of the pages file.
func writePagemapFile(path string, pagesID uint32, entries []pmEntry) error {
	b := binary.LittleEndian.AppendUint32(nil, imgCommonMagic)
	b = binary.LittleEndian.AppendUint32(b, pagemapMagic)
	var head []byte
	head = binary.AppendUvarint(head, 1<<3)
	head = binary.AppendUvarint(head, uint64(pagesID))
	b = binary.LittleEndian.AppendUint32(b, uint32(len(head)))
	b = append(b, head...)
	for _, e := range entries {
		b = appendEntry(b, e)
	}
	return os.WriteFile(path, b, 0o600)
}
