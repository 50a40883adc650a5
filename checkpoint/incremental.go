package checkpoint

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// dedupe turns the full dump in dir into an incremental one against the
// image in prev (the anon-pagemap tier): CRIU dumped every page the
// pagemap shows present and anonymous; each page equal to the one at the
// same address of the same process in prev (or its parents) is dropped
// from the pages file and marked in-parent, as a soft-dirty dump marks a
// page not written since. Without soft-dirty bits nothing tells which
// pages were written, so the content decides: a page is kept unless it is
// the same. The caller links dir/parent to prev.
func dedupe(dir, prev string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		num, ok := strings.CutPrefix(e.Name(), "pagemap-")
		num, ok2 := strings.CutSuffix(num, ".img")
		pid, err := strconv.Atoi(num)
		if !ok || !ok2 || err != nil {
			continue // not a process's pagemap (pagemap-shmem-N.img, ...)
		}
		if err := dedupeProcess(dir, prev, pid); err != nil {
			return fmt.Errorf("process %d: %w", pid, err)
		}
	}
	return nil
}

func dedupeProcess(dir, prev string, pid int) error {
	id, entries, err := readPagemapFile(pagemapPath(dir, pid))
	if err != nil {
		return err
	}
	old, err := openPagemap(prev, pid)
	if errors.Is(err, os.ErrNotExist) {
		return nil // a process the previous image lacks: all of it is new
	}
	if err != nil {
		return err
	}
	defer old.close()
	pagesPath := filepath.Join(dir, pagesName(id))
	in, err := os.Open(pagesPath)
	if err != nil {
		return err
	}
	defer in.Close()
	tmp := pagesPath + ".new"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	defer os.Remove(tmp)
	defer f.Close()
	out := bufio.NewWriterSize(f, 1<<20)
	// Pages are compared a chunk at a time: one read of each image per
	// chunk, not per page (the pages are mostly where they were).
	const chunk = 256
	cur, was := make([]byte, chunk*pageSize), make([]byte, chunk*pageSize)
	var kept []pmEntry
	for _, e := range entries {
		if e.flags&pePresent == 0 {
			kept = append(kept, e)
			continue
		}
		// Runs of pages that stay and of pages the parent has.
		var run *pmEntry
		for i := uint32(0); i < e.pages; i += chunk {
			n := min(chunk, e.pages-i)
			base := e.vaddr + uint64(i)*pageSize
			if _, err := io.ReadFull(in, cur[:n*pageSize]); err != nil {
				return err
			}
			whole := old.readPages(base, was[:n*pageSize]) == nil
			for j := uint32(0); j < n; j++ {
				vaddr := base + uint64(j)*pageSize
				page, prev := cur[j*pageSize:(j+1)*pageSize], was[j*pageSize:(j+1)*pageSize]
				same := (whole || old.readPages(vaddr, prev) == nil) && bytes.Equal(page, prev)
				flags := e.flags
				if same {
					flags = flags&^pePresent | peParent
				} else if _, err := out.Write(page); err != nil {
					return err
				}
				if run == nil || run.flags != flags {
					kept = append(kept, pmEntry{vaddr: vaddr, flags: flags})
					run = &kept[len(kept)-1]
				}
				run.pages++
			}
		}
	}
	if err := out.Flush(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, pagesPath); err != nil {
		return err
	}
	return writePagemapFile(pagemapPath(dir, pid), id, kept)
}
