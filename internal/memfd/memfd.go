// Package memfd hands a child process data on a descriptor: a file in
// memory (memfd_create(2)) that no one else can open by a path.
package memfd

import (
	"encoding/json"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// JSON is a file in memory holding v as JSON, at offset 0, closed on exec
// unless passed on (exec.Cmd.ExtraFiles).
func JSON(name string, v any) (*os.File, error) {
	raw, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("memfd: %w", err)
	}
	f := os.NewFile(uintptr(fd), name)
	if _, err := f.Write(raw); err != nil {
		f.Close()
		return nil, err
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}
