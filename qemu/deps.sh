#!/bin/bash
# Installs what make qemu-test needs, from Debian's packages, if missing.
set -euo pipefail
need=()
[ -f /usr/src/linux-source-6.12.tar.xz ] || need+=(linux-source-6.12)
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
[ -x /bin/busybox ] && /bin/busybox --list 2>/dev/null | grep -qx cpio || need+=(busybox-static)
for tool in ccache flex bison bc cpio gcc make perl xz patch; do
	command -v "$tool" >/dev/null || need+=("$tool")
done
[ -f /usr/include/libelf.h ] || need+=(libelf-dev)
[ -f /usr/include/openssl/ssl.h ] || need+=(libssl-dev)
if [ ${#need[@]} -gt 0 ]; then
	echo "qemu-test: installing ${need[*]}" >&2
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]/xz/xz-utils}" >/dev/null
fi
