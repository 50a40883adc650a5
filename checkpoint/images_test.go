package checkpoint

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/branchfs/branchfs/branch"
	"github.com/branchfs/branchfs/daemon"
	"github.com/branchfs/branchfs/explore"
)

// mountT mounts a fresh base through a daemon of this test binary's own,
// or skips where that cannot be.
func mountT(t *testing.T) (*explore.Mount, string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting needs root")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skip("no /dev/fuse")
	}
	dir := t.TempDir()
	base, mnt, store := filepath.Join(dir, "base"), filepath.Join(dir, "mnt"), filepath.Join(dir, "store")
	for _, d := range []string{base, mnt} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	mt, err := daemon.MountAt(base, mnt, daemon.MountOptions{Store: store})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mt.Unmount() })
	m, err := explore.Open(mnt)
	if err != nil {
		t.Fatal(err)
	}
	return m, mt.Store
}

func stageImage(t *testing.T, store string, files map[string]string) string {
	t.Helper()
	dir, err := branch.StageData(store)
	if err != nil {
		t.Fatal(err)
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// Images enter through the daemon, by generation, whole; their meta says
// what they hold; they go with their branch; images written before the
// daemon published them read as they did.
func TestImagesThroughTheDaemon(t *testing.T) {
	m, store := mountT(t)
	if _, err := m.Create("", "a"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := LatestImage(store, "a"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("no image yet: %v", err)
	}
	full, err := publishImage(m, stageImage(t, store, map[string]string{"pages-1.img": "full"}), ImageMeta{Branch: "a", Tier: TierFull, TrackMem: true})
	if err != nil || full.Gen != 1 || full.Bytes != 4 {
		t.Fatalf("first image: %+v, %v", full, err)
	}
	staged := stageImage(t, store, map[string]string{"pages-1.img": "inc"})
	if err := os.Symlink(filepath.Join("..", "1"), filepath.Join(staged, "parent")); err != nil {
		t.Fatal(err)
	}
	inc, err := publishImage(m, staged, ImageMeta{Branch: "a", Tier: TierSoftDirty, Parent: full.Gen})
	if err != nil || inc.Gen != 2 || inc.Bytes != 3 || inc.Parent != 1 {
		t.Fatalf("incremental image: %+v, %v; want gen 2, 3 bytes, parent 1", inc, err)
	}
	if data, err := os.ReadFile(filepath.Join(ImageDir(store, "a", 2), "parent", "pages-1.img")); err != nil || string(data) != "full" {
		t.Errorf("the incremental image's parent: %q, %v", data, err)
	}
	// An image of before, whose meta records its generation.
	old := ImageDir(store, "a", 3)
	if err := os.Mkdir(old, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(old, imageMetaName), []byte(`{"gen": 3, "branch": "a", "tier": "full", "root_pid": 1, "max_pid": 9}`), 0o600); err != nil {
		t.Fatal(err)
	}
	all, err := Images(store, "a")
	if err != nil || len(all) != 3 || all[0].Gen != 1 || !all[0].TrackMem || all[1].Tier != TierSoftDirty || all[2].Gen != 3 || all[2].MaxPID != 9 {
		t.Fatalf("images: %+v, %v", all, err)
	}
	if latest, dir, err := LatestImage(store, "a"); err != nil || latest.Gen != 3 || dir != old {
		t.Errorf("latest: %+v %s %v", latest, dir, err)
	}
	// A failed dump's log is kept beside the images.
	log := filepath.Join(stageImage(t, store, map[string]string{"dump.log": "Error (criu): x"}), "dump.log")
	at, err := publishFiles(m, store, "a", FailedDumpsArea, log)
	if err != nil {
		t.Fatal(err)
	}
	if data, err := os.ReadFile(at["dump.log"]); err != nil || string(data) != "Error (criu): x" {
		t.Errorf("the kept log %s: %q, %v", at["dump.log"], data, err)
	}
	// No image enters a branch that has ended, and the branch's go with it.
	if err := m.Abort("a", false); err != nil {
		t.Fatal(err)
	}
	staged = stageImage(t, store, map[string]string{"pages-1.img": "late"})
	if _, err := publishImage(m, staged, ImageMeta{Branch: "a", Tier: TierFull}); !errors.Is(err, syscall.ENOENT) && !errors.Is(err, syscall.ESTALE) {
		t.Errorf("publish in an aborted branch: %v", err)
	}
	if _, err := os.Stat(staged); err != nil {
		t.Errorf("a refused image is still the caller's: %v", err)
	}
	if _, err := m.Create("", "a"); err != nil {
		t.Fatal(err)
	}
	if all, err := Images(store, "a"); err != nil || len(all) != 0 {
		t.Errorf("a new branch of the same name has images: %+v, %v", all, err)
	}
}
