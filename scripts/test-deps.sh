#!/bin/bash
# Installs what make test needs on a Debian machine, once, and prepares
# /dev/fuse; make test runs it first, so a fresh machine needs nothing else.
# The guest's own needs (kernel source, QEMU, criu) are qemu/deps.sh's.
set -euo pipefail
need=()
# setpriv (util-linux) runs the permission checks as another user; cc
# builds the C ioctl client; fusermount3 (fuse3) mounts for ordinary users;
# mkfs.ext4 and chattr (e2fsprogs) make the full and immutable filesystems
# of the commit fault tests.
for tool in setpriv:util-linux cc:gcc fusermount3:fuse3 mkfs.ext4:e2fsprogs chattr:e2fsprogs; do
	command -v "${tool%%:*}" >/dev/null || need+=("${tool#*:}")
done
if [ ${#need[@]} -gt 0 ]; then
	mapfile -t need < <(printf '%s\n' "${need[@]}" | sort -u)
	echo "test-deps: installing ${need[*]}" >&2
	# Other package managers may hold dpkg's lock: wait for it.
	apt-get -o DPkg::Lock::Timeout=600 update -qq
	DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq "${need[@]}" >/dev/null
fi
# fusermount3 opens /dev/fuse as the calling user: udev makes it 0666 on a
# Debian system, a container's /dev may leave it 0600.
if [ -c /dev/fuse ] && [ "$(stat -c %a /dev/fuse)" != 666 ]; then
	echo "test-deps: chmod 0666 /dev/fuse, as udev makes it, for the ordinary-user tests" >&2
	chmod 0666 /dev/fuse
fi
