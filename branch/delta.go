package branch

import (
	"sort"

	"golang.org/x/sys/unix"
)

// DeltaKind says what one entry of a branch's delta does to its parent.
type DeltaKind string

const (
	// DeltaDeleted: the path is gone in the branch (a tombstone).
	DeltaDeleted DeltaKind = "deleted"
	// DeltaOpaque: a directory deleted and made again in the branch;
	// nothing the parent has below it shows.
	DeltaOpaque DeltaKind = "opaque"
	// DeltaDirChanged: a directory the branch made, or whose mode, owner
	// or xattrs it changed; the parent's entries below it still show.
	DeltaDirChanged DeltaKind = "dir-changed"
	// DeltaDir: a directory that only holds changes; the parent shows it
	// with the same mode, owner and xattrs.
	DeltaDir DeltaKind = "dir"
	// DeltaEntry: a file, symlink or special file the branch made or
	// changed; the branch's view shows what it is now.
	DeltaEntry DeltaKind = "entry"
)

// DeltaItem is one path of a branch's delta.
type DeltaItem struct {
	Path string    `json:"path"`
	Kind DeltaKind `json:"kind"`
}

// Delta lists what a live or stale branch holds over its parent, one item
// a path, each directory before what it holds and names in byte order:
// the tombstones and opaque directories the view hides, which Diff folds
// into deletions, as they are. It describes the delta's layout in the
// format's own terms, so that a copy of the branch (package remote) can be
// made again through a view, without reading the store.
func (s *Store) Delta(name string) ([]DeltaItem, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	b, err := s.lookupBranch(name)
	if err != nil {
		return nil, err
	}
	if b.isMain() {
		return nil, &BranchError{"delta", name, ErrMainView}
	}
	if b.view == nil {
		return nil, &BranchError{"delta", name, ErrGone}
	}
	items := []DeltaItem{}
	if !b.view.layers[0].present() {
		return items, nil
	}
	return deltaDir(b.view.layers[0], b.parent.view, "", items)
}

func deltaDir(src *layer, parent *View, rel string, items []DeltaItem) ([]DeltaItem, error) {
	names, err := src.names(rel)
	if err != nil {
		return nil, err
	}
	sort.Strings(names)
	for _, n := range names {
		if rel == "" && isStageName(n) {
			continue
		}
		p := JoinRel(rel, n)
		st, err := src.lstat(p)
		if err != nil {
			return nil, err
		}
		switch {
		case src.isWhiteoutRel(&st):
			items = append(items, DeltaItem{p, DeltaDeleted})
			continue
		case st.Mode&unix.S_IFMT != unix.S_IFDIR:
			items = append(items, DeltaItem{p, DeltaEntry})
			continue
		}
		kind := DeltaDir
		if pe, perr := parent.Lookup(p); src.isOpaque(p) {
			kind = DeltaOpaque
		} else if perr != nil || !pe.IsDir() || dirMetaChanged(src, parent, p, &st, pe) {
			kind = DeltaDirChanged
		}
		items = append(items, DeltaItem{p, kind})
		if items, err = deltaDir(src, parent, p, items); err != nil {
			return nil, err
		}
	}
	return items, nil
}
