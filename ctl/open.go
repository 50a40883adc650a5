package ctl

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"

	"github.com/branchfs/branchfs/branch"
	"golang.org/x/sys/unix"
)

// OpenControl opens the control file of the view whose root is view,
// making sure it is the daemon's: a regular file at ControlIno, an inode
// number no file of a view has, on a FUSE filesystem. A user's own file
// of that name (in the base, or outside any mount) is refused, and so is
// a link or a FIFO planted there (opened without following links and
// without blocking).
func OpenControl(view string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(view, ControlName), os.O_RDWR|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	var st unix.Stat_t
	var sfs unix.Statfs_t
	if unix.Fstat(int(f.Fd()), &st) != nil || st.Ino != ControlIno || st.Mode&unix.S_IFMT != unix.S_IFREG ||
		unix.Fstatfs(int(f.Fd()), &sfs) != nil || sfs.Type != FuseSuperMagic {
		f.Close()
		return nil, fmt.Errorf("%s is not a branchfs view", view)
	}
	return f, nil
}

// Command writes one command (a verb, or VERB:ARG) to the control file
// of view and returns the daemon's answer. A refusal is the bare errno
// the daemon answered (Explain tells it in words).
func Command(view, cmd string) ([]byte, error) {
	f, err := OpenControl(view)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if _, err := f.Write([]byte(cmd)); err != nil {
		return nil, unwrapErrno(err)
	}
	return io.ReadAll(io.NewSectionReader(f, 0, 1<<30))
}

// unwrapErrno is the errno inside err (an *os.PathError of a write), or
// err.
func unwrapErrno(err error) error {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return errno
	}
	return err
}

// ReadStatus is the answer to CmdList from view: the view's branch, the
// mount's base and store, and its branches (all: with the latest
// finished ones).
func ReadStatus(view string, all bool) (*Status, error) {
	cmd := CmdList
	if all {
		cmd += ":" + ArgAll
	}
	data, err := Command(view, cmd)
	if err != nil {
		return nil, err
	}
	var st Status
	if err := json.Unmarshal(data, &st); err != nil {
		return nil, fmt.Errorf("%s: the daemon's list: %w", view, err)
	}
	return &st, nil
}

// Hold asks the daemon to hold the branch whose view is view for this
// process's kernel-path run, and returns its layers (CmdHold).
func Hold(view string) (*branch.Layers, error) {
	data, err := Command(view, CmdHold)
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return nil, &Error{"holding the branch: " + message(CmdHold, errno), errno, errorOf(CmdHold, errno)}
	}
	if err != nil {
		return nil, err
	}
	var ls branch.Layers
	if err := json.Unmarshal(data, &ls); err != nil || ls.Upper.Path == "" || len(ls.Lower) == 0 {
		return nil, fmt.Errorf("the daemon's layers %q: %v", data, err)
	}
	return &ls, nil
}

// Release ends this process's hold of the branch whose view is view
// (CmdRelease). A daemon gone holds nothing.
func Release(view string) error {
	_, err := Command(view, CmdRelease)
	return err
}
