#!/bin/bash
# Installs what make qemu-test needs, from Debian's packages, if missing.
# The kernel source is pinned to the version in qemu/kernel-version.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=qemu/kernel-version
. "$here/kernel-version"
need=()
have=$(dpkg-query -W -f='${Version}' "$KERNEL_PACKAGE" 2>/dev/null || true)
[ "$have" = "$KERNEL_PACKAGE_VERSION" ] && [ -f "$KERNEL_TARBALL" ] || need+=("$KERNEL_PACKAGE=$KERNEL_PACKAGE_VERSION")
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
[ -x /bin/busybox ] && /bin/busybox --list 2>/dev/null | grep -qx cpio || need+=(busybox-static)
for tool in ccache flex bison bc cpio gcc make perl xz patch flock curl; do
	command -v "$tool" >/dev/null || need+=("$tool")
done
# criu (Debian's 3.17) goes into the guest for the checkpoint tests
# (qemu/criu.sh); it fails on hosts from 6.13 on, not in the 6.12 guest.
command -v criu >/dev/null || need+=(criu)
[ -f /usr/include/libelf.h ] || need+=(libelf-dev)
[ -f /usr/include/openssl/ssl.h ] || need+=(libssl-dev)
if [ ${#need[@]} -gt 0 ]; then
	need=("${need[@]/#xz/xz-utils}")
	need=("${need[@]/#flock/util-linux}")
	echo "qemu-test: installing ${need[*]}" >&2
	# Other package managers may hold dpkg's lock: wait for it.
	apt-get -o DPkg::Lock::Timeout=600 update -qq
	DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq --allow-downgrades "${need[@]}" >/dev/null
fi
