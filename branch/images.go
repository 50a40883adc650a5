package branch

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// Checkpoint images: the process memory paired with a branch
// (checkpoint writes them). They live with the branch, in
// STORE/branches/NAME/images/GEN/, GEN counting up from 1, each holding
// CRIU's image files and image.json (ImageMeta). An image is staged in
// STORE/tmp and enters images/ by one rename once its files and its
// meta are on the disk: that rename is its journal record, so after a
// crash an image is there whole or not at all (a staged one is emptied
// with STORE/tmp). The branch's data directory goes to the trash with the
// branch's delta when the branch is committed or aborted.

// ImageMeta describes one checkpoint image.
type ImageMeta struct {
	Gen       int       `json:"gen"`
	Branch    string    `json:"branch"`
	Created   time.Time `json:"created"`
	Tier      string    `json:"tier"`                // "full", or the incremental tier that ran ("soft-dirty")
	Parent    int       `json:"parent,omitempty"`    // the image an incremental one holds only the changes since
	RootPID   int       `json:"root_pid"`            // the tree's root, in the PID namespace it was dumped in
	MaxPID    int       `json:"max_pid"`             // its highest PID: a restore keeps its own PIDs above
	Pages     int64     `json:"pages"`               // pages written to this image
	Bytes     int64     `json:"bytes"`               // size of the image's files
	Hold      string    `json:"hold,omitempty"`      // the child branch that keeps the branch's files frozen
	TrackMem  bool      `json:"track_mem,omitempty"` // dumped with memory tracking: an incremental may follow
	LeftAlive bool      `json:"left_running,omitempty"`
}

const imageMetaName = "image.json"

// BranchDataDir is STORE/branches/NAME.
func BranchDataDir(store, name string) string { return filepath.Join(store, "branches", name) }

// ImagesDir is where a branch's checkpoint images live.
func ImagesDir(store, name string) string { return filepath.Join(BranchDataDir(store, name), "images") }

// StageImage makes an empty directory for an image being written: in
// STORE/tmp, on the store's filesystem, so that PublishImage can rename it.
func StageImage(store, name string) (string, error) {
	tmp := filepath.Join(store, "tmp")
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		return "", err
	}
	return os.MkdirTemp(tmp, "image-"+name+"-")
}

// PublishImage moves a staged image into the branch's images as the next
// generation, after flushing its files and writing its meta; it returns
// the meta with Gen set. Preconditions: one checkpoint of the branch at a
// time (the caller holds the branch's checkpoint lock, LockImages).
func PublishImage(store string, staged string, meta ImageMeta) (ImageMeta, error) {
	dir := ImagesDir(store, meta.Branch)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return meta, err
	}
	metas, err := Images(store, meta.Branch)
	if err != nil {
		return meta, err
	}
	meta.Gen = 1
	if len(metas) > 0 {
		meta.Gen = metas[len(metas)-1].Gen + 1
	}
	meta.Created = time.Now().UTC()
	ents, err := os.ReadDir(staged)
	if err != nil {
		return meta, err
	}
	meta.Bytes = 0
	for _, e := range ents {
		if e.Type()&os.ModeSymlink != 0 {
			continue // the link to an incremental image's parent
		}
		if err := syncFile(filepath.Join(staged, e.Name())); err != nil {
			return meta, err
		}
		if fi, err := e.Info(); err == nil {
			meta.Bytes += fi.Size()
		}
	}
	data, err := json.MarshalIndent(meta, "", "  ")
	if err != nil {
		return meta, err
	}
	if err := os.WriteFile(filepath.Join(staged, imageMetaName), data, 0o600); err != nil {
		return meta, err
	}
	if err := syncFile(filepath.Join(staged, imageMetaName)); err != nil {
		return meta, err
	}
	if err := syncFile(staged); err != nil {
		return meta, err
	}
	if err := os.Rename(staged, filepath.Join(dir, strconv.Itoa(meta.Gen))); err != nil {
		return meta, err
	}
	return meta, syncFile(dir)
}

func syncFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// Images lists a branch's checkpoint images, oldest first.
func Images(store, name string) ([]ImageMeta, error) {
	ents, err := os.ReadDir(ImagesDir(store, name))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []ImageMeta
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil || !e.IsDir() {
			continue
		}
		m, err := readImageMeta(filepath.Join(ImagesDir(store, name), e.Name()))
		if err != nil {
			continue // published images always have one; not ours
		}
		out = append(out, m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Gen < out[j].Gen })
	return out, nil
}

func readImageMeta(dir string) (ImageMeta, error) {
	var m ImageMeta
	data, err := os.ReadFile(filepath.Join(dir, imageMetaName))
	if err != nil {
		return m, err
	}
	err = json.Unmarshal(data, &m)
	return m, err
}

// LatestImage is the newest image of a branch and its directory.
func LatestImage(store, name string) (ImageMeta, string, error) {
	metas, err := Images(store, name)
	if err != nil {
		return ImageMeta{}, "", err
	}
	if len(metas) == 0 {
		return ImageMeta{}, "", fmt.Errorf("branch %s has no checkpoint: %w", name, os.ErrNotExist)
	}
	m := metas[len(metas)-1]
	return m, ImageDir(store, name, m.Gen), nil
}

// ImageDir is the directory of one image.
func ImageDir(store, name string, gen int) string {
	return filepath.Join(ImagesDir(store, name), strconv.Itoa(gen))
}

// LockImages takes the branch's checkpoint lock (a flock on
// STORE/branches/NAME/lock); the returned function drops it.
func LockImages(store, name string) (func(), error) {
	dir := BranchDataDir(store, name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	return flockPath(filepath.Join(dir, "lock"))
}

// trashBranchData moves a finished branch's data directory (checkpoint
// images, clone logs) to the trash. Preconditions: s.mu held exclusively.
func (s *Store) trashBranchData(name string) {
	s.trash(BranchDataDir(s.dir, name))
}

func flockPath(path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		return nil, err
	}
	return func() { f.Close() }, nil
}

// AddImageFile adds a file to a published image once: the first caller
// writes it (to a temporary name, flushed, then linked in: whole or not
// at all after a crash) and gets true; later callers, or racing ones,
// leave the first one's and get false. A checkpoint's working set
// (checkpoint) is written this way by the first lazy restore.
func AddImageFile(imageDir, name string, data []byte) (bool, error) {
	final := filepath.Join(imageDir, name)
	if _, err := os.Lstat(final); err == nil {
		return false, nil
	}
	f, err := os.CreateTemp(imageDir, "."+name+"-")
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
	return true, syncFile(imageDir)
}
