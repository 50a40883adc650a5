package checkpoint

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/branchfs/branchfs/branch"
	"github.com/branchfs/branchfs/explore"
	"github.com/branchfs/branchfs/internal/phase"
	"golang.org/x/sys/unix"
)

// Checkpoint images are entries of the branch's data area ImagesArea
// (branch's per-branch data: STORE/branches/NAME/images/GEN), each
// holding CRIU's image files and image.json (ImageMeta). A checkpoint
// stages its image in the store, flushes it and asks the daemon to
// publish it (publishImage); the daemon names its generation. The layout
// and image.json are what they were when the core wrote images itself, so
// images made before stay readable as they are.
const ImagesArea = "images"

// FailedDumpsArea keeps the log of each failed dump (dump.log), beside
// the branch's images.
const FailedDumpsArea = "failed-dumps"

// RestoresArea keeps each clone's CRIU restore log and pid file, in the
// clone's branch.
const RestoresArea = "restores"

// ImageMeta describes one checkpoint image.
type ImageMeta struct {
	// Gen is the image's generation, its directory's name: the daemon
	// picks it when it publishes (older images also record it here).
	Gen       int       `json:"gen,omitempty"`
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

// ImageDir is the directory of one image.
func ImageDir(store, name string, gen int) string {
	return branch.DataEntryDir(store, name, ImagesArea, gen)
}

// Images lists a branch's checkpoint images, oldest first.
func Images(store, name string) ([]ImageMeta, error) {
	gens, err := branch.DataEntries(store, name, ImagesArea)
	if err != nil {
		return nil, err
	}
	var out []ImageMeta
	for _, gen := range gens {
		m, err := readImageMeta(ImageDir(store, name, gen))
		if err != nil {
			continue // published images always have one; not ours
		}
		m.Gen = gen
		out = append(out, m)
	}
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

// publishImage writes meta into the staged image (its size counted,
// Created set), flushes its files and has the daemon publish it as the
// branch's next image; it returns the meta with Gen set.
func publishImage(m *explore.Mount, staged string, meta ImageMeta) (ImageMeta, error) {
	ents, err := os.ReadDir(staged)
	if err != nil {
		return meta, err
	}
	meta.Gen, meta.Bytes, meta.Created = 0, 0, time.Now().UTC()
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
	phase.Mark("image files synced")
	meta.Gen, err = m.Publish(meta.Branch, ImagesArea, staged)
	return meta, err
}

// publishFiles moves the files at paths into a new entry of area of
// branch name, flushed; the paths are in the store's stage. It returns
// where they went, by base name. The entry goes with the branch.
func publishFiles(m *explore.Mount, store, name, area string, paths ...string) (map[string]string, error) {
	staged, err := branch.StageData(store)
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(staged) // gone once published
	for _, p := range paths {
		to := filepath.Join(staged, filepath.Base(p))
		if err := os.Rename(p, to); err != nil {
			return nil, err
		}
		if err := syncFile(to); err != nil {
			return nil, err
		}
	}
	gen, err := m.Publish(name, area, staged)
	if err != nil {
		return nil, err
	}
	at := map[string]string{}
	for _, p := range paths {
		at[filepath.Base(p)] = filepath.Join(branch.DataEntryDir(store, name, area, gen), filepath.Base(p))
	}
	return at, nil
}

func syncFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// lockImages takes the lock that lets one checkpoint of branch name run
// at a time (two would seize one tree and pick one parent); the returned
// function drops it. It is a flock on a file in the store's stage, which
// the next mount empties: a lock, not data of the branch.
func lockImages(store, name string) (func(), error) {
	sum := sha256.Sum256([]byte(name))
	f, err := os.OpenFile(filepath.Join(branch.DataStageDir(store), "checkpoint-"+hex.EncodeToString(sum[:12])+".lock"),
		os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		return nil, err
	}
	return func() { f.Close() }, nil
}
