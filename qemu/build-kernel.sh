#!/bin/bash
# Builds the patched kernel for the QEMU harness and prints the path of its
# bzImage. The build is cached under $CACHE and redone only when the
# patches, the config fragment or this script change.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
CACHE=${BRANCHFS_QEMU_CACHE:-/var/cache/branchfs-qemu}
tarball=/usr/src/linux-source-6.12.tar.xz

[ -f "$tarball" ] || { echo "build-kernel: $tarball missing; apt-get install linux-source-6.12" >&2; exit 1; }

key=$(cat "$repo"/prototype/patches/*.patch "$here/kernel.config" "$0" | sha256sum | cut -c1-16)
out=$CACHE/kernel-$key
if [ -f "$out/bzImage" ]; then
	echo "$out/bzImage"
	exit 0
fi

mkdir -p "$CACHE"
src=$CACHE/src-$key
# Trees of builds that were cut off take gigabytes each.
rm -rf "$CACHE"/src-* "$CACHE/build"
mkdir -p "$src"
echo "build-kernel: extracting linux-source-6.12 and applying $(ls "$repo"/prototype/patches/*.patch | wc -l) patches" >&2
tar -xJf "$tarball" -C "$src" --strip-components=1
for p in "$repo"/prototype/patches/*.patch; do
	patch -s -p1 -d "$src" < "$p"
done

# A fixed build directory keeps ccache's hits across source versions.
build=$CACHE/build
mkdir -p "$build"
export CCACHE_DIR=$CACHE/ccache CCACHE_BASEDIR=$src CCACHE_NOHASHDIR=1
cc="gcc"
command -v ccache >/dev/null && cc="ccache gcc"
mk() { make -C "$src" O="$build" ARCH=x86_64 CC="$cc" HOSTCC=gcc "$@"; }
mk -s tinyconfig >&2
"$src/scripts/kconfig/merge_config.sh" -m -O "$build" "$build/.config" "$here/kernel.config" >&2
mk -s olddefconfig >&2
# Every wanted option must have survived; a missing dependency drops one.
missing=0
while IFS= read -r line; do
	case $line in CONFIG_*=*) grep -qx "$line" "$build/.config" || { echo "build-kernel: not set: $line" >&2; missing=1; } ;; esac
done < "$here/kernel.config"
[ $missing = 0 ] || exit 1
echo "build-kernel: building bzImage with $(nproc) jobs" >&2
mk -s -j"$(nproc)" bzImage >&2
mkdir -p "$out"
cp "$build/arch/x86/boot/bzImage" "$out/bzImage"
cp "$build/.config" "$out/config"
rm -rf "$src"
echo "$out/bzImage"
