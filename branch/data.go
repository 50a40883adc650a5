package branch

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Per-branch data: directories that programs beside the daemon keep with
// a branch (checkpoint's images), in STORE/branches/NAME/AREA/GEN,
// GEN counting up from 1 in each area. The core knows nothing of what an
// entry holds; it owns where entries live, when they enter and when they
// go:
//
//   - A program stages an entry in a directory of its own in STORE/tmp
//     (StageData), on the store's filesystem, and writes and flushes its
//     files there. What is staged is nobody's until published, and goes
//     with STORE/tmp at the next mount.
//   - The daemon publishes it on the program's request (Store.PublishData,
//     the control file's publish verb): under the store's lock, while the
//     branch is live, by one rename to the next generation. That rename is
//     its journal record: after a crash an entry is there whole or not at
//     all.
//   - A commit or abort moves the branch's data to the trash under the same
//     lock, so no entry lands in a branch that has ended.
//
// Published entries are read in place (DataEntries, DataEntryDir), and a
// file may be added to one once (AddDataFile).

// BranchDataDir is STORE/branches/NAME.
func BranchDataDir(store, name string) string { return filepath.Join(store, "branches", name) }

// DataAreaDir is STORE/branches/NAME/AREA, where area's entries live.
func DataAreaDir(store, name, area string) string {
	return filepath.Join(BranchDataDir(store, name), area)
}

// DataEntryDir is the directory of entry gen of a branch's area.
func DataEntryDir(store, name, area string, gen int) string {
	return filepath.Join(DataAreaDir(store, name, area), strconv.Itoa(gen))
}

// DataStageDir is where entries are staged: STORE/tmp.
func DataStageDir(store string) string { return filepath.Join(store, "tmp") }

// StageData makes an empty directory, in DataStageDir, for an entry being
// written; its base name is what PublishData takes.
func StageData(store string) (string, error) {
	return os.MkdirTemp(DataStageDir(store), "data-")
}

// validArea says whether area is what an area may be called: a short
// plain name, a lowercase letter then up to 63 lowercase letters, digits
// and dashes. (Not a regexp: compiled when the package starts, it cost
// every CLI command 0.2 ms.)
func validArea(area string) bool {
	if len(area) == 0 || len(area) > 64 || area[0] < 'a' || area[0] > 'z' {
		return false
	}
	for _, c := range []byte(area[1:]) {
		if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

// PublishData moves the staged entry staged (a base name in DataStageDir)
// into area of branch name as its next generation, and returns that
// generation. The branch must be live and not main; the entry a directory,
// not a link. Its files must be flushed by whoever wrote them; the renames
// are flushed here.
func (s *Store) PublishData(name, area, staged string) (int, error) {
	if !validArea(area) {
		return 0, &BranchError{"publish in", name, fmt.Errorf("%w: area %q", ErrInvalidData, area)}
	}
	if staged == "" || staged == "." || staged == ".." || strings.Contains(staged, "/") {
		return 0, &BranchError{"publish in", name, fmt.Errorf("%w: staged entry %q", ErrInvalidData, staged)}
	}
	from := filepath.Join(DataStageDir(s.dir), staged)
	s.mu.Lock()
	defer s.mu.Unlock()
	b, err := s.lookupBranch(name)
	if err != nil {
		return 0, err
	}
	if b.isMain() {
		return 0, &BranchError{"publish in", name, ErrMainView}
	}
	if err := b.State().err(); err != nil {
		return 0, &BranchError{"publish in", name, err}
	}
	if fi, err := os.Lstat(from); err != nil || !fi.IsDir() {
		return 0, &BranchError{"publish in", name, fmt.Errorf("%w: staged entry %q is no directory in %s", ErrInvalidData, staged, DataStageDir(s.dir))}
	}
	gens, err := DataEntries(s.dir, name, area)
	if err != nil {
		return 0, err
	}
	gen := 1
	if len(gens) > 0 {
		gen = gens[len(gens)-1] + 1
	}
	dir := DataAreaDir(s.dir, name, area)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return 0, err
	}
	if err := syncDir(from); err != nil {
		return 0, err
	}
	if err := unix.Renameat2(unix.AT_FDCWD, from, unix.AT_FDCWD, filepath.Join(dir, strconv.Itoa(gen)), unix.RENAME_NOREPLACE); err != nil {
		return 0, &os.LinkError{Op: "rename", Old: from, New: filepath.Join(dir, strconv.Itoa(gen)), Err: err}
	}
	if err := syncDir(dir); err != nil {
		return 0, err
	}
	return gen, syncDir(DataStageDir(s.dir))
}

// DataEntries lists the generations of a branch's area, oldest first.
func DataEntries(store, name, area string) ([]int, error) {
	ents, err := os.ReadDir(DataAreaDir(store, name, area))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var gens []int
	for _, e := range ents {
		if n, err := strconv.Atoi(e.Name()); err == nil && n > 0 && e.IsDir() && strconv.Itoa(n) == e.Name() {
			gens = append(gens, n)
		}
	}
	sort.Ints(gens)
	return gens, nil
}

// trashBranchData moves a finished branch's data directory to the trash.
// Preconditions: s.mu held exclusively.
func (s *Store) trashBranchData(name string) {
	s.trash(BranchDataDir(s.dir, name))
}

func syncFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// AddDataFile adds a file to a published entry once: the first caller
// writes it (to a temporary name, flushed, then linked in: whole or not
// at all after a crash) and gets true; later callers, or racing ones,
// leave the first one's and get false. A checkpoint's working set
// (checkpoint) is written this way by the first lazy restore.
func AddDataFile(entryDir, name string, data []byte) (bool, error) {
	final := filepath.Join(entryDir, name)
	if _, err := os.Lstat(final); err == nil {
		return false, nil
	}
	f, err := os.CreateTemp(entryDir, "."+name+"-")
	if err != nil {
		return false, err
	}
	defer os.Remove(f.Name())
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return false, err
	}
	if err := os.Link(f.Name(), final); err != nil {
		if errors.Is(err, os.ErrExist) {
			return false, nil
		}
		return false, err
	}
	return true, syncFile(entryDir)
}
