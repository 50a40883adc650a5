package ctl

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/branchfs/branchfs/branch"
)

// FindView returns the root of the view that holds path p (MNT or
// MNT/@NAME), its branch name, and the mount point mnt ("" inside a run,
// where the views are under EnvRoot, which the mount table does not
// show). It reads the mount table instead of looking for a control file
// on the way up: a user's own file may bear that name, and the
// directories of a stale branch answer ESTALE.
func FindView(p string) (root, name, mnt string, err error) {
	abs, err := filepath.Abs(p)
	if err != nil {
		return "", "", "", err
	}
	if r, _ := RunRoot(); r != "" && (abs == r || strings.HasPrefix(abs, r+"/")) {
		first, _, _ := strings.Cut(strings.TrimPrefix(strings.TrimPrefix(abs, r), "/"), "/")
		if name, ok := strings.CutPrefix(first, BranchPrefix); ok {
			return filepath.Join(r, first), name, "", nil
		}
		return r, branch.MainName, "", nil
	}
	abs = ResolvePrefix(abs)
	me, err := EnclosingMount(abs)
	if err != nil {
		return "", "", "", err
	}
	if me.FSType != FSType {
		return "", "", "", fmt.Errorf("%s is not inside a branchfs mount", p)
	}
	mnt = me.Point
	rel := strings.TrimPrefix(strings.TrimPrefix(abs, mnt), "/")
	first, _, _ := strings.Cut(rel, "/")
	if name, ok := strings.CutPrefix(first, BranchPrefix); ok {
		return filepath.Join(mnt, first), name, mnt, nil
	}
	return mnt, branch.MainName, mnt, nil
}

// RunRoot is, inside a run, where its commands reach the main view
// (EnvRoot) and the mount point, which shows the run's branch (EnvView);
// "" elsewhere.
func RunRoot() (root, view string) {
	root, view = os.Getenv(EnvRoot), os.Getenv(EnvView)
	if root == "" || view == "" {
		return "", ""
	}
	return filepath.Clean(root), filepath.Clean(view)
}

// ViewPath is where branch name's view is, for the mount at mnt:
// MNT/@NAME, or inside a run whose mount point mnt is, under EnvRoot.
func ViewPath(mnt, name string) string {
	if r, v := RunRoot(); r != "" {
		if abs, err := filepath.Abs(mnt); err == nil && ResolvePrefix(abs) == ResolvePrefix(v) {
			return filepath.Join(r, BranchPrefix+name)
		}
	}
	return filepath.Join(mnt, BranchPrefix+name)
}
