#!/bin/bash
# Builds the patched kernel for the QEMU harness and prints the path of its
# bzImage. The build is cached under $CACHE, keyed by everything that goes
# into it: the kernel tarball's checksum, the compiler's version, the
# patches, the config fragments and this script.
#
# BRANCHFS_QEMU_DEBUG=1 builds the debug variant: kernel-debug.config on
# top (KASAN, lockdep, atomic-sleep and list checks), in a build directory
# of its own so that switching variants rebuilds neither.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
CACHE=${BRANCHFS_QEMU_CACHE:-/var/cache/branchfs-qemu}
# shellcheck source=qemu/kernel-version
. "$here/kernel-version"

[ -f "$KERNEL_TARBALL" ] || { echo "build-kernel: $KERNEL_TARBALL missing; run qemu/deps.sh" >&2; exit 1; }

variant=plain
fragments=("$here/kernel.config")
if [ "${BRANCHFS_QEMU_DEBUG:-0}" = 1 ]; then
	variant=debug
	fragments+=("$here/kernel-debug.config")
fi

mkdir -p "$CACHE"
# One build at a time: several checkouts share the cache and its build
# directories.
exec 9>"$CACHE/lock"
flock 9

# The tarball's checksum is cached by size and time: hashing 140 MB on
# every run costs a second.
stamp=$(stat -c '%s %Y' "$KERNEL_TARBALL")
sumfile=$CACHE/tarball.sha256
if [ ! -f "$sumfile" ] || [ "$(head -1 "$sumfile")" != "$stamp" ]; then
	printf '%s\n%s\n' "$stamp" "$(sha256sum "$KERNEL_TARBALL" | cut -d' ' -f1)" > "$sumfile.tmp"
	mv "$sumfile.tmp" "$sumfile"
fi
tarsum=$(sed -n 2p "$sumfile")
if [ -n "${KERNEL_TARBALL_SHA256:-}" ] && [ "$tarsum" != "$KERNEL_TARBALL_SHA256" ]; then
	echo "build-kernel: $KERNEL_TARBALL has sha256 $tarsum, want $KERNEL_TARBALL_SHA256 ($KERNEL_PACKAGE=$KERNEL_PACKAGE_VERSION)" >&2
	exit 1
fi

key=$({
	echo "$variant $tarsum"
	gcc --version | head -1
	ld --version | head -1
	cat "$repo"/prototype/patches/*.patch "${fragments[@]}" "$0"
} | sha256sum | cut -c1-16)
out=$CACHE/kernel-$variant-$key
# $out appears only by the rename below, once complete.
if [ -f "$out/bzImage" ]; then
	echo "$out/bzImage"
	exit 0
fi

src=$CACHE/src-$variant
rm -rf "$src" "$out.tmp"
mkdir -p "$src"
echo "build-kernel: extracting $(basename "$KERNEL_TARBALL") and applying $(ls "$repo"/prototype/patches/*.patch | wc -l) patches ($variant)" >&2
tar -xJf "$KERNEL_TARBALL" -C "$src" --strip-components=1
for p in "$repo"/prototype/patches/*.patch; do
	patch -s -p1 -d "$src" < "$p"
done

# A fixed build directory per variant keeps make's and ccache's hits
# across source versions.
build=$CACHE/build
[ $variant = plain ] || build=$CACHE/build-$variant
mkdir -p "$build"
# The fresh tree has the tarball's old times, so make keeps an object built
# from a patched file that no patch touches now (a patch dropped or changed
# since): touch every file the last build's patches or these touch.
touched=$build/.branchfs-patched-files
sed -n 's#^+++ b/\([^\t]*\).*#\1#p' "$repo"/prototype/patches/*.patch | sort -u > "$touched.new"
{ cat "$touched.new"; cat "$touched" 2>/dev/null || true; } | sort -u | while IFS= read -r f; do
	if [ -e "$src/$f" ]; then touch "$src/$f"; fi
done
mv "$touched.new" "$touched"
export CCACHE_DIR=$CACHE/ccache CCACHE_BASEDIR=$src CCACHE_NOHASHDIR=1
cc="gcc"
command -v ccache >/dev/null && cc="ccache gcc"
mk() { make -C "$src" O="$build" ARCH=x86_64 CC="$cc" HOSTCC=gcc "$@"; }
mk -s tinyconfig >&2
"$src/scripts/kconfig/merge_config.sh" -m -O "$build" "$build/.config" "${fragments[@]}" >&2
mk -s olddefconfig >&2
# Every wanted option must have survived; a missing dependency drops one.
missing=0
for f in "${fragments[@]}"; do
	while IFS= read -r line; do
		case $line in
		CONFIG_*=*) grep -qx "$line" "$build/.config" || { echo "build-kernel: not set: $line" >&2; missing=1; } ;;
		esac
	done < "$f"
done
[ $missing = 0 ] || exit 1
echo "build-kernel: building bzImage with $(nproc) jobs" >&2
mk -s -j"$(nproc)" bzImage >&2
mkdir -p "$out.tmp"
cp "$build/arch/x86/boot/bzImage" "$out.tmp/bzImage"
cp "$build/.config" "$out.tmp/config"
sync "$out.tmp/bzImage"
mv "$out.tmp" "$out"
rm -rf "$src"
echo "$out/bzImage"
