package branch

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func stageWith(t *testing.T, store, name, content string) string {
	t.Helper()
	dir, err := StageImage(store, name)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "pages-1.img"), []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}

// Images enter by generation, whole; a staged one is not an image.
func TestImagesPublishInOrder(t *testing.T) {
	store := t.TempDir()
	if _, _, err := LatestImage(store, "a"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("no image yet: %v", err)
	}
	for i, content := range []string{"one", "two"} {
		m, err := PublishImage(store, stageWith(t, store, "a", content), ImageMeta{Branch: "a", Tier: "full"})
		if err != nil {
			t.Fatal(err)
		}
		if m.Gen != i+1 || m.Bytes != int64(len(content)) {
			t.Fatalf("image %d: gen %d, %d bytes", i, m.Gen, m.Bytes)
		}
	}
	stageWith(t, store, "a", "unpublished")
	m, dir, err := LatestImage(store, "a")
	if err != nil || m.Gen != 2 || dir != ImageDir(store, "a", 2) {
		t.Fatalf("latest: %+v %s %v", m, dir, err)
	}
	if data, err := os.ReadFile(filepath.Join(dir, "pages-1.img")); err != nil || string(data) != "two" {
		t.Fatalf("image 2 holds %q, %v", data, err)
	}
	all, err := Images(store, "a")
	if err != nil || len(all) != 2 {
		t.Fatalf("images: %+v %v", all, err)
	}
}

// A branch's images go with it when it is aborted or committed.
func TestImagesGoWithTheirBranch(t *testing.T) {
	for _, end := range []string{"abort", "commit"} {
		t.Run(end, func(t *testing.T) {
			s, _ := newStore(t)
			if _, err := s.Create("a", MainName); err != nil {
				t.Fatal(err)
			}
			if _, err := PublishImage(s.Dir(), stageWith(t, s.Dir(), "a", "x"), ImageMeta{Branch: "a"}); err != nil {
				t.Fatal(err)
			}
			var err error
			if end == "abort" {
				_, err = s.Abort("a", false)
			} else {
				_, err = s.Commit("a")
			}
			if err != nil {
				t.Fatal(err)
			}
			s.Close() // empties what waits for the trash
			if _, err := os.Stat(BranchDataDir(s.Dir(), "a")); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("after %s, the branch's data is still there: %v", end, err)
			}
		})
	}
}
