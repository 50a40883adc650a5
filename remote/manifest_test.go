package remote

import (
	"strings"
	"testing"

	"github.com/branchfs/branchfs/branch"
)

// A pull trusts no manifest: one that would write outside the view, through
// a symlink, to the control file or an internal xattr, or whose chunks do
// not add up, is refused before anything is made.
func TestManifestRefusesUnsafe(t *testing.T) {
	dir := func(p string) Entry {
		return Entry{Path: p, Kind: branch.DeltaDir, Meta: Meta{Type: "dir", Mode: 0o755}, Base: Version{Type: "dir"}}
	}
	file := func(p string) Entry {
		return Entry{Path: p, Kind: branch.DeltaEntry, Meta: Meta{Type: "file", Mode: 0o644, Size: 3,
			Chunks: []Chunk{{strings.Repeat("ab", 32), 3}}}, Base: Version{Type: absent}}
	}
	link := Entry{Path: "a", Kind: branch.DeltaEntry, Meta: Meta{Type: "symlink", Target: "/etc"}, Base: Version{Type: absent}}
	good := []Entry{dir("a"), file("a/b"), {Path: "c", Kind: branch.DeltaDeleted, Base: Version{Type: "file"}}}
	check := func(entries []Entry) error {
		m := &Manifest{Format: manifestFormat, Branch: "b", Entries: entries}
		data, err := encodeManifest(m)
		if err != nil {
			t.Fatal(err)
		}
		_, err = decodeManifest(data)
		return err
	}
	if err := check(good); err != nil {
		t.Fatalf("a sound manifest: %v", err)
	}
	withXattr := file("x")
	withXattr.Xattrs = map[string][]byte{"user.overlay.opaque": []byte("y")}
	badSum := file("x")
	badSum.Size = 4
	badHash := file("x")
	badHash.Chunks = []Chunk{{"../../etc/passwd", 3}}
	dirAsEntry := file("x")
	dirAsEntry.Type = "dir"
	for name, entries := range map[string][]Entry{
		"dot-dot":            {file("../x")},
		"absolute":           {file("/x")},
		"empty component":    {dir("a"), file("a//b")},
		"dot":                {file("./x")},
		"control file":       {file(".branchfs_ctl")},
		"no directory entry": {file("a/b")},
		"through a symlink":  {link, file("a/b")},
		"twice":              {file("x"), file("x")},
		"internal xattr":     {withXattr},
		"chunks short":       {badSum},
		"chunk name":         {badHash},
		"kind and type":      {dirAsEntry},
	} {
		if err := check(entries); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := decodeManifest([]byte("not gzip")); err == nil {
		t.Error("garbage accepted")
	}
}
