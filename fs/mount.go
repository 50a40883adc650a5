package fs

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// Mounting a FUSE file system takes CAP_SYS_ADMIN. Root mounts with
// mount(2) itself; anyone else asks fusermount3 (Debian package fuse3),
// the setuid helper, which checks that the user may mount there, mounts
// and hands the connection back over a unix socket. Unmounting goes the
// same two ways.

// Fusermount is the setuid helper that mounts and unmounts for users
// without CAP_SYS_ADMIN.
const Fusermount = "fusermount3"

// fuseConf holds the administrator's settings for fusermount3.
const fuseConf = "/etc/fuse.conf"

// allowOther says whether the mount may let other users in (allow_other):
// always for root; for anyone else only where the administrator allows it
// (user_allow_other in /etc/fuse.conf), or fusermount3 refuses to mount.
// Without it, the kernel lets only the mounting user in, not even root.
func allowOther() bool {
	if os.Geteuid() == 0 {
		return true
	}
	f, err := os.Open(fuseConf)
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if strings.TrimSpace(sc.Text()) == "user_allow_other" {
			return true
		}
	}
	return false
}

// mountDevice mounts a FUSE connection at mnt and returns its descriptor:
// with mount(2) as root, else (or when mount(2) is not permitted, as for
// root in a user namespace) through fusermount3.
func mountDevice(mnt string, mo *fuse.MountOptions) (int, error) {
	if os.Geteuid() == 0 {
		fd, err := mountDirect(mnt, mo)
		if !errors.Is(err, unix.EPERM) {
			return fd, err
		}
	}
	return mountFusermount(mnt, mo)
}

// mountDirect opens /dev/fuse and mounts it at mnt as go-fuse's direct
// mount would.
func mountDirect(mnt string, mo *fuse.MountOptions) (int, error) {
	fd, err := unix.Open("/dev/fuse", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	data := []string{
		fmt.Sprintf("fd=%d", fd),
		"rootmode=40000",
		fmt.Sprintf("user_id=%d", os.Geteuid()),
		fmt.Sprintf("group_id=%d", os.Getegid()),
		fmt.Sprintf("max_read=%d", mo.MaxWrite),
	}
	data = append(data, mo.Options...)
	if mo.AllowOther {
		data = append(data, "allow_other")
	}
	err = unix.Mount(mo.FsName, mnt, "fuse."+mo.Name, unix.MS_NOSUID|unix.MS_NODEV, strings.Join(data, ","))
	if err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// mountFusermount has fusermount3 mount at mnt and receives the
// connection's descriptor from it over a socket pair (_FUSE_COMMFD). The
// helper adds nosuid and nodev, and the user and group IDs, itself.
func mountFusermount(mnt string, mo *fuse.MountOptions) (int, error) {
	bin, err := exec.LookPath(Fusermount)
	if err != nil {
		return -1, fmt.Errorf("%w: mounting as a user without CAP_SYS_ADMIN needs %s (Debian package fuse3)", err, Fusermount)
	}
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	ours, theirs := os.NewFile(uintptr(pair[0]), "fusermount"), os.NewFile(uintptr(pair[1]), "fusermount")
	defer ours.Close()
	opts := append([]string{
		"fsname=" + escapeOption(mo.FsName),
		"subtype=" + mo.Name,
		fmt.Sprintf("max_read=%d", mo.MaxWrite),
	}, mo.Options...)
	if mo.AllowOther {
		opts = append(opts, "allow_other")
	}
	cmd := exec.Command(bin, "-o", strings.Join(opts, ","), "--", mnt)
	cmd.Env = []string{"_FUSE_COMMFD=3"}
	cmd.ExtraFiles = []*os.File{theirs} // descriptor 3
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err = cmd.Run()
	theirs.Close()
	if err != nil {
		return -1, fmt.Errorf("%s: %v: %s", Fusermount, err, strings.TrimSpace(out.String()))
	}
	fd, err := receiveFd(int(ours.Fd()))
	if err != nil {
		unmountFusermount(mnt, true)
		return -1, fmt.Errorf("%s: receiving the connection: %w", Fusermount, err)
	}
	return fd, nil
}

// escapeOption escapes the commas and backslashes that fusermount3 would
// take for separators in an option's value.
func escapeOption(v string) string {
	return strings.NewReplacer(`\`, `\\`, ",", `\,`).Replace(v)
}

// receiveFd reads the one descriptor fusermount3 sends over sock.
func receiveFd(sock int) (int, error) {
	buf := make([]byte, 8)
	oob := make([]byte, unix.CmsgSpace(4))
	_, oobn, _, _, err := unix.Recvmsg(sock, buf, oob, unix.MSG_CMSG_CLOEXEC)
	if err != nil {
		return -1, err
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil {
		return -1, err
	}
	for _, m := range msgs {
		fds, err := unix.ParseUnixRights(&m)
		if err == nil && len(fds) > 0 {
			for _, extra := range fds[1:] {
				unix.Close(extra)
			}
			return fds[0], nil
		}
	}
	return -1, errors.New("no descriptor in the message")
}

// Unmount unmounts the FUSE file system at mnt: with umount(2) where
// permitted, else through fusermount3 (the user who mounted it). Lazy
// detaches it at once even while it is busy; a dead daemon's mount needs
// nothing flushed. It retries a few times while the kernel counts the
// mount busy.
func Unmount(mnt string, lazy bool) error {
	flags := 0
	if lazy {
		flags = unix.MNT_DETACH
	}
	var err error
	for try, delay := 0, 5*time.Millisecond; try < 5; try, delay = try+1, 2*delay {
		err = unix.Unmount(mnt, flags)
		if errors.Is(err, unix.EPERM) {
			err = unmountFusermount(mnt, lazy)
		}
		if !errors.Is(err, unix.EBUSY) {
			break
		}
		time.Sleep(delay)
	}
	return err
}

// unmountFusermount runs fusermount3 -u; its exit status says nothing of
// the cause, so a busy mount is recognized by the message.
func unmountFusermount(mnt string, lazy bool) error {
	args := []string{"-u"}
	if lazy {
		args = append(args, "-z")
	}
	out, err := exec.Command(Fusermount, append(args, "--", mnt)...).CombinedOutput()
	if err == nil {
		return nil
	}
	msg := strings.TrimSpace(string(out))
	if strings.Contains(strings.ToLower(msg), syscall.EBUSY.Error()) { // strerror capitalizes it
		return fmt.Errorf("%s: %s: %w", Fusermount, msg, unix.EBUSY)
	}
	return fmt.Errorf("%s: %v: %s", Fusermount, err, msg)
}
