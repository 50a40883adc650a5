package transport

import (
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// Loop (loop.go) rests on go-fuse's ProtocolServer, which is marked
// EXPERIMENTAL, and on facts go-fuse does not export: it replays INIT
// through unsafe, reads request headers and open flags in place, and
// copies the opcodes. The tests here fail when a go-fuse upgrade changes
// any of that; check loop.go against the new version, then move the pin.

// goFuseVersion is the go-fuse that loop.go was last checked against.
const goFuseVersion = "v2.12.1"

func TestLoopGoFuseVersion(t *testing.T) {
	// Test binaries carry no module versions (debug.ReadBuildInfo): read
	// the requirement where it is written.
	mod, err := os.ReadFile("../../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	var version string
	for _, line := range strings.Split(string(mod), "\n") {
		f := strings.Fields(line)
		if i := slices.Index(f, "github.com/hanwen/go-fuse/v2"); i >= 0 && i+1 < len(f) {
			if slices.Contains(f, "=>") {
				t.Fatalf("go.mod replaces go-fuse (%s): check fs/transport/loop.go against it", strings.TrimSpace(line))
			}
			version = f[i+1]
		}
	}
	if version != goFuseVersion {
		t.Fatalf("go.mod requires go-fuse %q, fs/transport/loop.go was checked against %s: check its use of "+
			"ProtocolServer, the replayed INIT and the opcodes, then update goFuseVersion", version, goFuseVersion)
	}
}

// TestLoopGoFuseLayout pins the struct layouts loop.go reads and writes
// through unsafe: they are the kernel's ABI, which go-fuse mirrors.
func TestLoopGoFuseLayout(t *testing.T) {
	var (
		in   fuse.InHeader
		out  fuse.OutHeader
		init fuse.InitIn
		open fuse.OpenIn
		crt  fuse.CreateIn
	)
	for _, c := range []struct {
		what      string
		got, want uintptr
	}{
		{"sizeof InHeader", unsafe.Sizeof(in), 40},
		{"InHeader.Opcode", unsafe.Offsetof(in.Opcode), 4},
		{"InHeader.Unique", unsafe.Offsetof(in.Unique), 8},
		{"sizeof OutHeader", unsafe.Sizeof(out), 16},
		{"OutHeader.Status", unsafe.Offsetof(out.Status), 4},
		{"OutHeader.Unique", unsafe.Offsetof(out.Unique), 8},
		{"InitIn.InHeader", unsafe.Offsetof(init.InHeader), 0}, // replayed as a request
		{"InitIn.Major", unsafe.Offsetof(init.Major), 40},
		{"OpenIn.Flags", unsafe.Offsetof(open.Flags), 40},
		{"CreateIn.Flags", unsafe.Offsetof(crt.Flags), 40},
	} {
		if c.got != c.want {
			t.Errorf("%s = %d, want %d", c.what, c.got, c.want)
		}
	}
}

// opRecorder records which RawFileSystem method a request reached.
type opRecorder struct {
	fuse.RawFileSystem
	got string
}

func (r *opRecorder) SetAttr(<-chan struct{}, *fuse.SetAttrIn, *fuse.AttrOut) fuse.Status {
	r.got = "SetAttr"
	return fuse.OK
}

func (r *opRecorder) Rename(_ <-chan struct{}, in *fuse.RenameIn, _, _ string) fuse.Status {
	r.got = "Rename"
	if in.Flags != 0 {
		r.got = "Rename2"
	}
	return fuse.OK
}

func (r *opRecorder) Link(<-chan struct{}, *fuse.LinkIn, string, *fuse.EntryOut) fuse.Status {
	r.got = "Link"
	return fuse.OK
}

func (r *opRecorder) Open(<-chan struct{}, *fuse.OpenIn, *fuse.OpenOut) fuse.Status {
	r.got = "Open"
	return fuse.OK
}

func (r *opRecorder) Fsync(<-chan struct{}, *fuse.FsyncIn) fuse.Status {
	r.got = "Fsync"
	return fuse.OK
}

func (r *opRecorder) SetXAttr(<-chan struct{}, *fuse.SetXAttrIn, string, []byte) fuse.Status {
	r.got = "SetXAttr"
	return fuse.OK
}

func (r *opRecorder) RemoveXAttr(<-chan struct{}, *fuse.InHeader, string) fuse.Status {
	r.got = "RemoveXAttr"
	return fuse.OK
}

func (r *opRecorder) FsyncDir(<-chan struct{}, *fuse.FsyncIn) fuse.Status {
	r.got = "FsyncDir"
	return fuse.OK
}

func (r *opRecorder) Create(<-chan struct{}, *fuse.CreateIn, string, *fuse.CreateOut) fuse.Status {
	r.got = "Create"
	return fuse.OK
}

func (r *opRecorder) Fallocate(<-chan struct{}, *fuse.FallocateIn) fuse.Status {
	r.got = "Fallocate"
	return fuse.OK
}

func (r *opRecorder) CopyFileRange(<-chan struct{}, *fuse.CopyFileRangeIn) (uint32, fuse.Status) {
	r.got = "CopyFileRange"
	return 0, fuse.OK
}

// request builds a request of opcode op: its argument structure of size
// argSize (the header included), whose first word after the header is arg,
// then payload.
func request(op uint32, argSize int, arg uint32, payload string) []byte {
	b := make([]byte, argSize+len(payload))
	copy(b[argSize:], payload)
	h := (*fuse.InHeader)(unsafe.Pointer(&b[0]))
	*h = fuse.InHeader{Length: uint32(len(b)), Opcode: op, Unique: 2, NodeId: 1}
	if argSize > int(unsafe.Sizeof(*h)) {
		*(*uint32)(unsafe.Pointer(&b[unsafe.Sizeof(*h)])) = arg
	}
	return b
}

// TestLoopGoFuseOpcodes replays an INIT as NewLoop does, then sends
// each opcode loop.go names through the ProtocolServer and checks that it
// reaches the method of that name, and that the opcode table sends it to a worker as before.
func TestLoopGoFuseOpcodes(t *testing.T) {
	rec := &opRecorder{RawFileSystem: fuse.NewDefaultRawFileSystem()}
	ps := initedServer(t, rec)
	out := make([]byte, 1<<18)
	hdr := int(unsafe.Sizeof(fuse.InHeader{}))
	for _, c := range []struct {
		op      uint32
		method  string
		argSize int
		arg     uint32
		payload string
		blocks  bool
	}{
		{opSetattr, "SetAttr", int(unsafe.Sizeof(fuse.SetAttrIn{})), 0, "", false}, // OnWorker when it copies up
		{opRename, "Rename", hdr + 8, 0, "a\x00b\x00", true},
		{opLink, "Link", int(unsafe.Sizeof(fuse.LinkIn{})), 0, "a\x00", true},
		{opOpen, "Open", int(unsafe.Sizeof(fuse.OpenIn{})), syscall.O_RDONLY, "", false},
		{opOpen, "Open", int(unsafe.Sizeof(fuse.OpenIn{})), syscall.O_WRONLY, "", true},
		{opOpen, "Open", int(unsafe.Sizeof(fuse.OpenIn{})), syscall.O_RDONLY | syscall.O_TRUNC, "", true},
		{opFsync, "Fsync", int(unsafe.Sizeof(fuse.FsyncIn{})), 0, "", true},
		{opSetxattr, "SetXAttr", hdr + 8, 1, "user.a\x00v", false},
		{opRemovexattr, "RemoveXAttr", hdr, 0, "user.a\x00", false},
		{opFsyncdir, "FsyncDir", int(unsafe.Sizeof(fuse.FsyncIn{})), 0, "", true},
		{opCreate, "Create", int(unsafe.Sizeof(fuse.CreateIn{})), syscall.O_WRONLY, "a\x00", true},
		{opCreate, "Create", int(unsafe.Sizeof(fuse.CreateIn{})), syscall.O_WRONLY | syscall.O_EXCL, "a\x00", false},
		{opFallocate, "Fallocate", int(unsafe.Sizeof(fuse.FallocateIn{})), 0, "", true},
		{opRename2, "Rename2", int(unsafe.Sizeof(fuse.RenameIn{})), 0, "a\x00b\x00", true},
		{opCopyFileRange, "CopyFileRange", int(unsafe.Sizeof(fuse.CopyFileRangeIn{})), 0, "", false}, // of 0 bytes: see TestSmallCopyOnReader
	} {
		req := request(c.op, c.argSize, c.arg, c.payload)
		if c.op == opRename2 {
			(*fuse.RenameIn)(unsafe.Pointer(&req[0])).Flags = 1 // RENAME_NOREPLACE
		}
		rec.got = ""
		if _, st := ps.HandleRequest([][]byte{req}, [][]byte{out}); !st.Ok() {
			t.Errorf("opcode %d: %v", c.op, st)
		}
		if rec.got != c.method {
			t.Errorf("opcode %d reached %q, loop.go takes it for %s", c.op, rec.got, c.method)
		}
		if got := (&Loop{}).toWorker(req); got != c.blocks {
			t.Errorf("toWorker(opcode %d, arg %#x) = %v, want %v", c.op, c.arg, got, c.blocks)
		}
	}
}

// initedServer is a ProtocolServer for raw that has answered an INIT, as
// NewLoop replays it: go-fuse parses requests by the version and flags
// negotiated there.
func initedServer(t *testing.T, raw fuse.RawFileSystem) *fuse.ProtocolServer {
	t.Helper()
	mo := fuse.MountOptions{MaxWrite: 1 << 17}
	ps := fuse.NewProtocolServer(raw, &mo)
	init := fuse.InitIn{InHeader: fuse.InHeader{Opcode: 26, Unique: 1}, Major: 7, Minor: 31}
	init.Length = uint32(unsafe.Sizeof(init))
	out := make([]byte, 1<<18)
	if _, st := ps.HandleRequest([][]byte{bytesOf(&init)}, [][]byte{out}); !st.Ok() {
		t.Fatalf("replayed INIT: %v", st)
	}
	if h := (*fuse.OutHeader)(unsafe.Pointer(&out[0])); h.Status != 0 || h.Unique != 1 {
		t.Fatalf("replayed INIT answered %+v", *h)
	}
	return ps
}
