package branch

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

// LockImages holds the branch's checkpoint lock until its function is
// called: another holder's try meanwhile finds it taken.
func TestLockImages(t *testing.T) {
	store := t.TempDir()
	unlock, err := LockImages(store, "a")
	mustOK(t, err)
	try := func() error {
		f, err := os.Open(filepath.Join(BranchDataDir(store, "a"), "lock"))
		mustOK(t, err)
		defer f.Close()
		return unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
	}
	if err := try(); !errors.Is(err, unix.EWOULDBLOCK) {
		t.Errorf("a second lock while held: %v, want EWOULDBLOCK", err)
	}
	other, err := LockImages(store, "b") // each branch has its own
	mustOK(t, err)
	other()
	unlock()
	if err := try(); err != nil {
		t.Errorf("a second lock once released: %v", err)
	}
	store = t.TempDir()
	for _, sub := range []string{"branches", "tmp"} {
		mustOK(t, os.WriteFile(filepath.Join(store, sub), nil, 0o600))
	}
	if _, err := LockImages(store, "c"); err == nil {
		t.Error("LockImages where STORE/branches is a file succeeded")
	}
	if _, err := StageImage(store, "c"); err == nil {
		t.Error("StageImage where STORE/tmp is a file succeeded")
	}
}

// AddImageFile adds a file once: whoever comes first writes it, whole, and
// every later or racing caller leaves it as it is.
func TestAddImageFile(t *testing.T) {
	store := t.TempDir()
	m, err := PublishImage(store, stageWith(t, store, "a", "pages"), ImageMeta{Branch: "a"})
	mustOK(t, err)
	dir := ImageDir(store, "a", m.Gen)
	first, err := AddImageFile(dir, "ws.img", []byte("first"))
	if err != nil || !first {
		t.Fatalf("first add: %v, %v", first, err)
	}
	again, err := AddImageFile(dir, "ws.img", []byte("second"))
	if err != nil || again {
		t.Errorf("second add: %v, %v; want false", again, err)
	}
	const racers = 8
	var wg sync.WaitGroup
	won := make([]bool, racers)
	errs := make([]error, racers)
	for i := range racers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			won[i], errs[i] = AddImageFile(dir, "race.img", []byte(fmt.Sprint("racer ", i)))
		}()
	}
	wg.Wait()
	winner := slices.Index(won, true)
	if winner < 0 || slices.Index(won[winner+1:], true) >= 0 {
		t.Errorf("winners among the racers: %v", won)
	}
	for i, err := range errs {
		if err != nil {
			t.Errorf("racer %d: %v", i, err)
		}
	}
	for name, want := range map[string]string{"ws.img": "first", "race.img": fmt.Sprint("racer ", winner)} {
		if data, err := os.ReadFile(filepath.Join(dir, name)); err != nil || string(data) != want {
			t.Errorf("%s = %q, %v; want %q", name, data, err, want)
		}
	}
	ents, err := os.ReadDir(dir)
	mustOK(t, err)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if want := []string{imageMetaName, "pages-1.img", "race.img", "ws.img"}; !slices.Equal(names, want) {
		t.Errorf("the image holds %q, want %q: no temporary file left", names, want)
	}
	if _, err := AddImageFile(filepath.Join(store, "nothing"), "x", nil); err == nil {
		t.Error("AddImageFile into a missing image succeeded")
	}
}

// An incremental image's link to its parent is not part of its size, and
// what is not a published image in images/ is not listed.
func TestImagesListsPublishedOnly(t *testing.T) {
	store := t.TempDir()
	full, err := PublishImage(store, stageWith(t, store, "a", "full"), ImageMeta{Branch: "a", Tier: "full", TrackMem: true})
	mustOK(t, err)
	staged := stageWith(t, store, "a", "inc")
	mustOK(t, os.Symlink(ImageDir(store, "a", full.Gen), filepath.Join(staged, "parent")))
	inc, err := PublishImage(store, staged, ImageMeta{Branch: "a", Tier: "soft-dirty", Parent: full.Gen})
	mustOK(t, err)
	if inc.Gen != 2 || inc.Bytes != 3 || inc.Parent != 1 {
		t.Errorf("incremental image: %+v; want gen 2, 3 bytes, parent 1", inc)
	}
	images := ImagesDir(store, "a")
	mustOK(t, os.Mkdir(filepath.Join(images, "7"), 0o700))          // no meta
	mustOK(t, os.Mkdir(filepath.Join(images, "junk"), 0o700))       // not a generation
	mustOK(t, os.WriteFile(filepath.Join(images, "8"), nil, 0o600)) // not a directory
	mustOK(t, os.WriteFile(filepath.Join(images, "9.json"), nil, 0o600))
	all, err := Images(store, "a")
	mustOK(t, err)
	if len(all) != 2 || all[0].Gen != 1 || all[1].Gen != 2 || !all[0].TrackMem || all[1].Tier != "soft-dirty" {
		t.Errorf("images: %+v", all)
	}
	if m, _, err := LatestImage(store, "a"); err != nil || m.Gen != 2 {
		t.Errorf("latest: %+v, %v", m, err)
	}
	if _, err := PublishImage(store, filepath.Join(store, "tmp", "nothing"), ImageMeta{Branch: "a"}); err == nil {
		t.Error("publishing a missing stage succeeded")
	}
	if all, _ := Images(store, "a"); len(all) != 2 {
		t.Errorf("a failed publish left %d images", len(all))
	}
	mustOK(t, os.WriteFile(BranchDataDir(store, "f"), nil, 0o600))
	if _, err := PublishImage(store, stageWith(t, store, "f", "x"), ImageMeta{Branch: "f"}); err == nil {
		t.Error("publishing where the branch's data directory is a file succeeded")
	}
}
