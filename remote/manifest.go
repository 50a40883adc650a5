package remote

import (
	"bytes"
	"compress/gzip"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/branchfs/branchfs/branch"
	"github.com/branchfs/branchfs/checkpoint"
	"github.com/branchfs/branchfs/ctl"
	"golang.org/x/sys/unix"
)

// manifestFormat is the version of Manifest this code writes and reads.
const manifestFormat = 1

// maxManifest bounds what a pull reads and unpacks from a bucket.
const maxManifest = 1 << 30

// Manifest describes one pushed branch: every entry of its delta with the
// metadata and chunks that make it again, and what the branch's parent
// showed at each of those paths.
type Manifest struct {
	Format  int       `json:"format"`
	Branch  string    `json:"branch"` // its name where it was pushed from
	Parent  string    `json:"parent"` // its parent's name there
	Created time.Time `json:"created"`
	// Entries in the order of branch.Delta: a directory before what it
	// holds.
	Entries []Entry `json:"entries"`
	// Checkpoint is the branch's latest checkpoint image, when it has one.
	Checkpoint *Checkpoint `json:"checkpoint,omitempty"`
}

// Checkpoint is a checkpoint image: its record and its files (CRIU's
// images; pages-*.img hold the memory).
type Checkpoint struct {
	Image checkpoint.ImageMeta `json:"image"`
	Files []ImageFile          `json:"files"`
}

// ImageFile is one file of a checkpoint image.
type ImageFile struct {
	Name   string  `json:"name"`
	Size   int64   `json:"size"`
	SHA256 string  `json:"sha256"`
	Chunks []Chunk `json:"chunks,omitempty"`
}

// Entry is one path of the delta.
type Entry struct {
	Path string           `json:"path"`
	Kind branch.DeltaKind `json:"kind"`
	// What the branch shows at Path; empty for DeltaDeleted.
	Meta
	// Base is what the parent showed at Path when the branch was pushed.
	Base Version `json:"base"`
}

// Meta is a file's type, metadata and content as the branch shows it.
type Meta struct {
	Type   string            `json:"type,omitempty"` // fileTypes: "file", "dir", "symlink", ...
	Mode   uint32            `json:"mode,omitempty"` // permission bits, 07777
	UID    uint32            `json:"uid,omitempty"`
	GID    uint32            `json:"gid,omitempty"`
	Atime  int64             `json:"atime,omitempty"` // nanoseconds since the epoch
	Mtime  int64             `json:"mtime,omitempty"`
	Xattrs map[string][]byte `json:"xattrs,omitempty"`
	Size   int64             `json:"size,omitempty"`   // files
	SHA256 string            `json:"sha256,omitempty"` // files: of the whole content
	Chunks []Chunk           `json:"chunks,omitempty"` // files: the content, in order
	Target string            `json:"target,omitempty"` // symlinks
	Rdev   uint64            `json:"rdev,omitempty"`   // devices
}

// Chunk is a piece of a file's content, stored at Location.chunkKey(Hash).
type Chunk struct {
	Hash string `json:"h"`
	Size int64  `json:"n"`
}

// Version is what a view showed at a path: Type "absent", or a file type
// with, for a file, its size and SHA-256, and for a symlink its target.
type Version struct {
	Type   string `json:"type"`
	Size   int64  `json:"size,omitempty"`
	SHA256 string `json:"sha256,omitempty"`
	Target string `json:"target,omitempty"`
}

const absent = "absent"

// differs describes how v (here) differs from w (there), or is "".
func (v Version) differs(w Version) string {
	switch {
	case v.Type != w.Type:
		return fmt.Sprintf("%s here, %s there", article(v.Type), article(w.Type))
	case v.Size != w.Size || v.SHA256 != w.SHA256:
		return fmt.Sprintf("its content differs (%d bytes here, %d there)", v.Size, w.Size)
	case v.Target != w.Target:
		return fmt.Sprintf("the symlink points to %q here, %q there", v.Target, w.Target)
	}
	return ""
}

func article(t string) string {
	switch t {
	case absent:
		return "absent"
	case "file", "dir", "symlink", "fifo", "socket":
		return "a " + t
	}
	return "a " + t + " device"
}

// fileTypes names the types of files by their S_IFMT bits.
var fileTypes = map[uint32]string{
	unix.S_IFREG: "file", unix.S_IFDIR: "dir", unix.S_IFLNK: "symlink",
	unix.S_IFIFO: "fifo", unix.S_IFSOCK: "socket", unix.S_IFCHR: "char", unix.S_IFBLK: "block",
}

func typeOf(mode uint32) string { return fileTypes[mode&unix.S_IFMT] }

func modeOf(t string) uint32 {
	for m, n := range fileTypes {
		if n == t {
			return m
		}
	}
	return 0
}

func encodeManifest(m *Manifest) ([]byte, error) {
	var buf bytes.Buffer
	z := gzip.NewWriter(&buf)
	if err := json.NewEncoder(z).Encode(m); err != nil {
		return nil, err
	}
	if err := z.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// decodeManifest reads a manifest and checks everything a pull relies on:
// a bucket is not trusted to hand over a sound one.
func decodeManifest(data []byte) (*Manifest, error) {
	z, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		return nil, fmt.Errorf("not a branchfs manifest: %w", err)
	}
	raw, err := io.ReadAll(io.LimitReader(z, maxManifest+1))
	if err != nil {
		return nil, fmt.Errorf("not a branchfs manifest: %w", err)
	}
	if len(raw) > maxManifest {
		return nil, fmt.Errorf("manifest larger than %d bytes", maxManifest)
	}
	var m Manifest
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, fmt.Errorf("not a branchfs manifest: %w", err)
	}
	if m.Format != manifestFormat {
		return nil, fmt.Errorf("manifest format %d; this branchfs reads format %d", m.Format, manifestFormat)
	}
	if err := m.check(); err != nil {
		return nil, fmt.Errorf("bad manifest: %w", err)
	}
	return &m, nil
}

// check makes sure every path is a clean relative one whose parent is
// the root or a directory entry before it, that no path comes twice, and
// that each entry's fields fit its kind and type.
func (m *Manifest) check() error {
	if err := branch.ValidateName(m.Branch); err != nil {
		return err
	}
	dirs := map[string]bool{"": true}
	seen := map[string]bool{}
	for i := range m.Entries {
		e := &m.Entries[i]
		if err := checkPath(e.Path); err != nil {
			return err
		}
		if seen[e.Path] {
			return fmt.Errorf("%s: listed twice", e.Path)
		}
		seen[e.Path] = true
		parent := ""
		if j := strings.LastIndexByte(e.Path, '/'); j >= 0 {
			parent = e.Path[:j]
		}
		if !dirs[parent] {
			return fmt.Errorf("%s: its directory is not an earlier directory entry", e.Path)
		}
		if err := e.check(); err != nil {
			return fmt.Errorf("%s: %w", e.Path, err)
		}
		if e.Type == "dir" {
			dirs[e.Path] = true
		}
	}
	if c := m.Checkpoint; c != nil {
		names := map[string]bool{}
		for _, f := range c.Files {
			if f.Name == "" || f.Name == "." || f.Name == ".." || strings.ContainsAny(f.Name, "/\x00") || names[f.Name] {
				return fmt.Errorf("checkpoint file %q", f.Name)
			}
			names[f.Name] = true
			if err := checkChunks(f.Chunks, f.Size); err != nil {
				return fmt.Errorf("checkpoint file %s: %w", f.Name, err)
			}
		}
	}
	return nil
}

func checkPath(p string) error {
	if p == "" || len(p) > 1<<16 || strings.ContainsRune(p, 0) {
		return fmt.Errorf("bad path %q", p)
	}
	for _, c := range strings.Split(p, "/") {
		if c == "" || c == "." || c == ".." || len(c) > 255 {
			return fmt.Errorf("bad path %q", p)
		}
	}
	// The control file answers at the root of every view.
	if p == ctl.ControlName {
		return fmt.Errorf("%s is the control file's name", p)
	}
	return nil
}

func (e *Entry) check() error {
	if e.Base.Type != absent && modeOf(e.Base.Type) == 0 {
		return fmt.Errorf("base of unknown type %q", e.Base.Type)
	}
	switch e.Kind {
	case branch.DeltaDeleted:
		if e.Type != "" {
			return fmt.Errorf("a deletion with a type")
		}
		return nil
	case branch.DeltaOpaque, branch.DeltaDir, branch.DeltaDirChanged:
		if e.Type != "dir" {
			return fmt.Errorf("kind %s but type %q", e.Kind, e.Type)
		}
	case branch.DeltaEntry:
		if e.Type == "dir" || modeOf(e.Type) == 0 {
			return fmt.Errorf("kind %s but type %q", e.Kind, e.Type)
		}
	default:
		return fmt.Errorf("unknown kind %q", e.Kind)
	}
	if e.Mode&^07777 != 0 {
		return fmt.Errorf("mode %#o", e.Mode)
	}
	for n := range e.Xattrs {
		if n == "" || branch.IsInternalXattr(n) {
			return fmt.Errorf("xattr %q", n)
		}
	}
	if e.Type != "file" {
		return checkChunks(e.Chunks, 0)
	}
	return checkChunks(e.Chunks, e.Size)
}

// checkChunks makes sure chunks are well named and make size bytes.
func checkChunks(chunks []Chunk, size int64) error {
	var sum int64
	for _, c := range chunks {
		if b, err := hex.DecodeString(c.Hash); err != nil || len(b) != 32 {
			return fmt.Errorf("bad chunk name %q", c.Hash)
		}
		if c.Size <= 0 || c.Size > maxChunk {
			return fmt.Errorf("chunk of %d bytes", c.Size)
		}
		sum += c.Size
	}
	if sum != size {
		return fmt.Errorf("chunks of %d bytes for %d", sum, size)
	}
	return nil
}
