#!/bin/bash
# SeaweedFS's weed, the S3-compatible server that the tests of push, pull
# and remote restores run on loopback (remote/, qemu/, bench/remote).
#
#   seaweedfs.sh                          builds weed if needed, prints its path
#   seaweedfs.sh serve DIR PORT KEY SECRET
#                                         runs a server: data in DIR, S3 on
#                                         127.0.0.1:PORT, its other services on
#                                         PORT+1..PORT+7, one identity KEY/SECRET
#
# weed is built once per version into a cache outside the checkout
# (/var/cache/branchfs-seaweedfs/VERSION/weed, or under
# $BRANCHFS_SEAWEEDFS_CACHE), so CI pays for it once: about 20 minutes cold
# on 2 cores. SeaweedFS's module has replace directives, so it cannot be
# go-installed; it is downloaded through the Go module proxy and built
# inside a writable copy of the module. BRANCHFS_WEED names a weed to use
# instead.
set -euo pipefail
version=${BRANCHFS_SEAWEEDFS_VERSION:-v0.0.0-20261109003541-7506e5f91cd6}
cache=${BRANCHFS_SEAWEEDFS_CACHE:-/var/cache/branchfs-seaweedfs}

build() {
	local dir=$cache/$version bin=$cache/$version/weed
	if [ -x "$bin" ]; then
		echo "$bin"
		return
	fi
	mkdir -p "$dir"
	chmod 0755 "$cache" "$dir"
	# One build at a time: test binaries of several packages may ask at once.
	exec 9>"$dir/.lock"
	flock 9
	if [ ! -x "$bin" ]; then
		echo "seaweedfs: building weed $version into $dir (once; about 20 minutes on 2 cores)" >&2
		local mod src=$dir/src
		mod=$(go mod download -json "github.com/seaweedfs/seaweedfs@$version" |
			sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
		[ -d "$mod" ] || { echo "seaweedfs: go mod download gave no directory" >&2; exit 1; }
		rm -rf "$src"
		cp -r "$mod" "$src"
		chmod -R u+w "$src"
		(cd "$src" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -o "$bin.tmp" ./weed)
		mv "$bin.tmp" "$bin"
		rm -rf "$src"
	fi
	exec 9>&-
	echo "$bin"
}

# serve runs weed server in the foreground (exec: a signal to this script
# reaches weed). SeaweedFS puts its gRPC sockets at fixed names in /tmp,
# where any user could make them first: it runs with a /tmp of its own (a
# mount namespace with a tmpfs there; as root), so DIR must not be in /tmp.
serve() {
	local dir=$1 port=$2 key=$3 secret=$4 bin
	case $dir in /tmp/*) echo "seaweedfs: serve: $dir is in /tmp, which the server does not see" >&2; exit 1 ;; esac
	bin=${BRANCHFS_WEED:-$(build)}
	mkdir -p "$dir/data" "$dir/log"
	chmod 0700 "$dir"
	printf '{"identities":[{"name":"branchfs","credentials":[{"accessKey":"%s","secretKey":"%s"}],"actions":["Admin","Read","Write","List","Tagging"]}]}\n' \
		"$key" "$secret" >"$dir/s3.json"
	exec unshare --mount --propagation private -- /bin/sh -c 'mount -t tmpfs -o mode=0700,size=16m weed-tmp /tmp && exec "$0" "$@"' \
		"$bin" -logdir="$dir/log" server -dir="$dir/data" -ip=127.0.0.1 -ip.bind=127.0.0.1 \
		-master.port=$((port + 1)) -master.port.grpc=$((port + 2)) -master.telemetry=false -master.volumeSizeLimitMB=128 \
		-volume.port=$((port + 3)) -volume.port.grpc=$((port + 4)) -volume.max=256 \
		-filer.port=$((port + 5)) -filer.port.grpc=$((port + 6)) -filer.localSocket=/tmp/filer.sock \
		-s3 -s3.port="$port" -s3.port.grpc=$((port + 7)) -s3.port.iceberg=0 -s3.port.lance=0 \
		-s3.localSocket=/tmp/s3.sock -s3.config="$dir/s3.json"
}

case ${1:-} in
"") build ;;
serve)
	[ $# = 5 ] || { echo "usage: $0 serve DIR PORT KEY SECRET" >&2; exit 2; }
	serve "$2" "$3" "$4" "$5"
	;;
*) echo "usage: $0 [serve DIR PORT KEY SECRET]" >&2; exit 2 ;;
esac
