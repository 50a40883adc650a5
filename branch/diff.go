package branch

import (
	"golang.org/x/sys/unix"
)

// Diff describes what a branch changed relative to its parent.
type Diff struct {
	Branch   string   `json:"branch"`
	Parent   string   `json:"parent"`
	Added    []string `json:"added"`
	Modified []string `json:"modified"`
	Deleted  []string `json:"deleted"`
}

// Diff lists the paths a live or stale branch added, changed and deleted.
func (s *Store) Diff(name string) (*Diff, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	b, err := s.lookupBranch(name)
	if err != nil {
		return nil, err
	}
	if b.isMain() {
		return nil, &BranchError{"diff", name, ErrMainView}
	}
	if b.view == nil {
		return nil, &BranchError{"diff", name, ErrGone}
	}
	d := &Diff{Branch: name, Parent: b.parent.meta.Name, Added: []string{}, Modified: []string{}, Deleted: []string{}}
	if !b.view.layers[0].present() {
		return d, nil
	}
	err = diffDir(b.view.layers[0], b.parent.view, "", d)
	return d, err
}

func diffDir(src *layer, parent *View, rel string, d *Diff) error {
	names, err := src.names(rel)
	if err != nil {
		return err
	}
	for _, n := range names {
		p := JoinRel(rel, n)
		st, err := src.lstat(p)
		if err != nil {
			return err
		}
		pe, perr := parent.Lookup(p)
		switch {
		case src.isWhiteoutRel(&st):
			if perr == nil {
				d.Deleted = append(d.Deleted, p)
			}
		case perr != nil:
			d.Added = append(d.Added, p+suffix(&st))
			if st.Mode&unix.S_IFMT == unix.S_IFDIR {
				if err := diffDir(src, parent, p, d); err != nil {
					return err
				}
			}
		case st.Mode&unix.S_IFMT == unix.S_IFDIR:
			if !pe.IsDir() || src.isOpaque(p) || dirMetaChanged(src, parent, p, &st, pe) {
				d.Modified = append(d.Modified, p+"/")
			}
			if err := diffDir(src, parent, p, d); err != nil {
				return err
			}
		default:
			d.Modified = append(d.Modified, p)
		}
	}
	return nil
}

// dirMetaChanged reports whether the commit's meta step for directory p
// changes what the parent shows: its mode, owner or xattrs. (Its times
// change with every entry added or removed, and say nothing more.)
func dirMetaChanged(src *layer, parent *View, p string, st *unix.Stat_t, pe *Entry) bool {
	if st.Mode&07777 != pe.Stat.Mode&07777 || st.Uid != pe.Stat.Uid || st.Gid != pe.Stat.Gid {
		return true
	}
	m, err := readDirMeta(src, p, st)
	if err != nil {
		return false
	}
	names, err := parent.ListXattr(p)
	if err != nil || len(names) != len(m.Xattrs) {
		return err == nil
	}
	for _, n := range names {
		v, ok := m.Xattrs[n]
		if !ok {
			return true
		}
		sz, err := parent.GetXattr(p, n, nil)
		if err != nil {
			return true
		}
		buf := make([]byte, sz)
		if sz, err = parent.GetXattr(p, n, buf); err != nil || string(buf[:sz]) != string(v) {
			return true
		}
	}
	return false
}

func suffix(st *unix.Stat_t) string {
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return "/"
	}
	return ""
}
