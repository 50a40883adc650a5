#!/bin/bash
# Builds SeaweedFS's weed, the S3-compatible server the remote/ tests run on
# loopback, once per version, and prints the binary's path. The build is
# cached outside the checkout (/var/cache/branchfs-seaweedfs/VERSION/weed,
# or $BRANCHFS_SEAWEEDFS_CACHE), so CI pays for it once: about 20 minutes
# cold on 2 cores. SeaweedFS's module has replace directives, so it cannot
# be go-installed; it is downloaded through the Go module proxy and built
# inside a writable copy of the module.
set -euo pipefail
version=${BRANCHFS_SEAWEEDFS_VERSION:-v0.0.0-20261109003541-7506e5f91cd6}
cache=${BRANCHFS_SEAWEEDFS_CACHE:-/var/cache/branchfs-seaweedfs}
dir=$cache/$version
bin=$dir/weed
if [ -x "$bin" ]; then
	echo "$bin"
	exit 0
fi
mkdir -p "$dir"
chmod 0755 "$cache" "$dir"
# One build at a time: test binaries of several packages may ask at once.
exec 9>"$dir/.lock"
flock 9
if [ ! -x "$bin" ]; then
	echo "seaweedfs: building weed $version into $dir (once; about 20 minutes on 2 cores)" >&2
	mod=$(go mod download -json "github.com/seaweedfs/seaweedfs@$version" |
		sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
	[ -d "$mod" ] || { echo "seaweedfs: go mod download gave no directory" >&2; exit 1; }
	src=$dir/src
	rm -rf "$src"
	cp -r "$mod" "$src"
	chmod -R u+w "$src"
	(cd "$src" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -o "$bin.tmp" ./weed)
	mv "$bin.tmp" "$bin"
	rm -rf "$src"
fi
echo "$bin"
