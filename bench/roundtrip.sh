#!/bin/bash
# The floor of a FUSE daemon on this machine (docs/performance.md, "The
# floor"): what one request costs through the kernel's FUSE code with the
# cheapest daemon there can be (bench/floor/fuse-floor.c), against branchfs and
# fuse-overlayfs, and what an extraction costs natively and into that
# daemon. Needs root, a C compiler, fuse-overlayfs and a built binary
# (make build).
#
#   bench/roundtrip.sh stat [ROUNDS] [N]  stat(2) of N missing names, each a
#       LOOKUP: microseconds per call on native ext4, the kernel's overlayfs,
#       fuse-floor (through /dev/fuse, and through io_uring with a queue per
#       CPU), a branch view and fuse-overlayfs; client and daemon free, on
#       one CPU, on different CPUs, and the daemon on one CPU with the
#       client free
#   bench/roundtrip.sh tree [ROUNDS]      tar -xf of Go's src/, cp -a and
#       rm -rf of it (with syncfs, as the bench's tree workload), natively,
#       into fuse-floor (extraction only, as it keeps no files; /dev/fuse,
#       io_uring, and with the writeback cache) and in a branch view, each on an ext4 file system of
#       its own: free, with tar and the daemon on one CPU, and with the
#       daemon on one CPU and tar anywhere
#   bench/roundtrip.sh write [ROUNDS] [MIB]  the bench's write workload: a
#       new file of MIB MiB (512) written in 64 KiB blocks and fsynced,
#       natively, into fuse-floor storing it in a file (serve-store:
#       read(2) of each request and pwrite(2) of its payload;
#       serve-splice: splice(2) through a pipe; direct: serve-store with
#       FOPEN_DIRECT_IO, no page cache of the mount; direct+splice: both)
#       and in a branch view, each
#       on an ext4 file system of its own; free and on one CPU. With
#       OLD=path/to/branchfs, a branch view of that binary takes turns too.
#       The file is opened O_RDWR, as the bench's os.Create does; with
#       OPEN=w, O_WRONLY, as a shell's > or dd do. SYSTEMS='native ...'
#       picks systems.
#
# Systems and placements take turns in a shuffled order within each round;
# each line of output is one measurement with the load average then, and
# the summary gives medians (with min and max) per system and placement.
set -euo pipefail
mode=${1:-stat}
rounds=${2:-15}
n=${3:-5000}
repo=$(cd "$(dirname "$0")/.." && pwd)
bin=$repo/bin/branchfs
work=$(mktemp -d /var/tmp/roundtrip.XXXXXX)
. "$repo/bench/lib.sh"
uring=/sys/module/fuse/parameters/enable_uring
olduring=$(cat $uring)
cleanup() {
	echo "$olduring" >$uring
	unmount_all
	rm -rf "$work"
}
trap cleanup EXIT
cc -O2 -Wall -pthread -o "$work/fuse-floor" "$repo/bench/floor/fuse-floor.c"
# Lets daemons ask for FUSE over io_uring (fuse-floor-uring); restored at exit.
echo Y >$uring
floor=$work/fuse-floor

# Mount helpers beside lib.sh's mount_branch; each sets pid to the daemon's
# process ID.
mount_floor() { # MNT [serve-uring]
	mkdir -p "$1"
	"$floor" "${2:-serve}" "$1" 2>"$1.counts" &
	pid=$!
	until grep -q " $1 fuse.fuse-floor " /proc/mounts; do sleep 0.01; done
	mounts+=("$1")
}
mount_fovl() { # LOWER UPPER WORK MNT
	mkdir -p "$1" "$2" "$3" "$4"
	fuse-overlayfs -f -o "lowerdir=$1,upperdir=$2,workdir=$3" "$4" &
	pid=$!
	until grep -q " $4 fuse" /proc/mounts; do sleep 0.01; done
	mounts+=("$4")
}
# place PLACEMENT CPU PID: the client and the daemon's threads on CPU
# (one), the client on CPU and the daemon on the other (cross), the daemon
# on CPU and the client anywhere (dpin), or both anywhere (free); prints
# the client's taskset CPU list.
place() {
	local other=$((1 - $2)) cpus=0-$(($(nproc) - 1))
	case $1 in
	one) [ -n "$3" ] && taskset -a -p -c "$2" "$3" >/dev/null; echo "$2" ;;
	cross) [ -n "$3" ] && taskset -a -p -c "$other" "$3" >/dev/null; echo "$2" ;;
	dpin) [ -n "$3" ] && taskset -a -p -c "$2" "$3" >/dev/null; echo "$cpus" ;;
	free) [ -n "$3" ] && taskset -a -p -c "$cpus" "$3" >/dev/null; echo "$cpus" ;;
	esac
}
summary() {
	echo "# medians over rounds (min-max); load average median (min-max)"
	sort -k1,1 -k2,2 -k3,3g "$1" | awk '
		function flush() { if (k != "") printf "%-22s %8.2f (%.2f-%.2f)  load %.2f (%.2f-%.2f)  n=%d\n", k, med(v, c), v[1], v[c], med(l, c), lmin, lmax, c }
		function med(a, c) { return c % 2 ? a[(c + 1) / 2] : (a[c / 2] + a[c / 2 + 1]) / 2 }
		{ key = $1 " " $2; if (key != k) { flush(); k = key; c = 0; lmin = 1e9; lmax = 0 } v[++c] = $3; ls[c] = $4
		  if ($4 < lmin) lmin = $4; if ($4 > lmax) lmax = $4
		  # the load median, from a sorted copy
		  for (i = 1; i <= c; i++) l[i] = ls[i]; for (i = 2; i <= c; i++) for (j = i; j > 1 && l[j-1] > l[j]; j--) { t = l[j]; l[j] = l[j-1]; l[j-1] = t } }
		END { flush() }'
}

out=$work/out
: >"$out"
if [ "$mode" = stat ]; then
	freshfs "$work/fs"
	mkdir -p "$work/fs/native" "$work/fs/lower"
	mkdir -p "$work/fs/ku" "$work/fs/kw" "$work/kovl"
	mount -t overlay overlay -o "lowerdir=$work/fs/lower,upperdir=$work/fs/ku,workdir=$work/fs/kw" "$work/kovl"
	mounts+=("$work/kovl")
	mount_floor "$work/floor"
	floorpid=$pid
	mount_floor "$work/uring" serve-uring
	mount_branch "$work/fs/base" "$work/fs/store" "$work/bmnt"
	branchpid=$pid
	mount_fovl "$work/fs/lower" "$work/fs/fu" "$work/fs/fw" "$work/fovl"
	fovlpid=$pid
	declare -A dir=([native]=$work/fs/native [overlayfs]=$work/kovl [fuse-floor]=$work/floor
		[fuse-floor-uring]=$work/uring [branch]=$work/bmnt/@b [fuse-overlayfs]=$work/fovl)
	declare -A daemon=([native]= [overlayfs]= [fuse-floor]=$floorpid
		[fuse-floor-uring]= [branch]=$branchpid [fuse-overlayfs]=$fovlpid)
	for ((r = 0; r < rounds; r++)); do
		cpu=$((r % 2))
		for t in $(for s in "${!dir[@]}"; do for p in free one cross dpin; do
			[ -z "${daemon[$s]}" ] && [ $p = cross -o $p = dpin ] && continue
			echo "$s/$p"
		done; done | shuf); do
			s=${t%/*} p=${t#*/}
			client=$(place "$p" $cpu "${daemon[$s]}")
			echo "$s $p $(taskset -c "$client" "$floor" stat "${dir[$s]}" "$n") $(load)" | tee -a "$out"
		done
	done
	summary "$out"
	exit
fi

if [ "$mode" = write ]; then
	mib=${3:-512}
	for ((r = 0; r < rounds; r++)); do
		cpu=$((r % 2))
		for t in $(for s in ${SYSTEMS:-native fuse-floor-store fuse-floor-splice fuse-floor-direct fuse-floor-direct+splice branch} ${OLD:+branch-old}; do
			echo $s/free $s/one; done | tr ' ' '\n' | shuf); do
			s=${t%/*} p=${t#*/}
			fs=$work/fs-$r-$s-$p
			freshfs "$fs"
			pid=
			case $s in
			native) d=$fs ;;
			fuse-floor-*) mkdir -p "$work/floor"
				kind=${s#fuse-floor-}
				case $kind in direct*) export FUSE_FLOOR_DIRECT_IO=1 ;; esac
				case $kind in direct) kind=store ;; direct+splice) kind=splice ;; esac
				"$floor" "serve-$kind" "$work/floor" "$fs/backing" 2>"$work/floor.counts" &
				unset FUSE_FLOOR_DIRECT_IO
				pid=$! ;;
			branch) mount_branch "$fs/base" "$fs/store" "$work/bmnt" && d=$work/bmnt/@b ;;
			branch-old) mount_branch "$fs/base" "$fs/store" "$work/bmnt" "$OLD" && d=$work/bmnt/@b ;;
			esac
			if [ "${s#fuse-floor}" != "$s" ]; then
				until grep -q " $work/floor fuse.fuse-floor " /proc/mounts; do sleep 0.01; done
				mounts+=("$work/floor")
				d=$work/floor
			fi
			cpus=$(place "$p" $cpu "$pid")
			sync -f "$fs"
			echo "$s $p $(taskset -c "$cpus" "$floor" write "$d/out" "$mib" ${OPEN:-}) $(load)" | tee -a "$out"
			[ "$d" = "$fs" ] || unmount_last
			[ "${s#fuse-floor}" = "$s" ] || wait "$pid"
			unmount_last
			rm -f "$fs.img"
		done
	done
	summary "$out"
	exit
fi

# tree
tar -C "$(go env GOROOT 2>/dev/null || echo /usr/local/go)" -cf "$work/src.tar" src
files=$(tar -tf "$work/src.tar" | grep -vc '/$')
echo "$files files"
# timed DIR PREFIX CPUS CMD...: runs CMD in DIR on CPUS between two syncfs of
# DIR and the file system under it, and prints seconds.
timed() {
	local d=$1 fs=$2 cpus=$3 start
	shift 3
	sync -f "$d" "$fs"
	start=$(date +%s.%N)
	(cd "$d" && taskset -c "$cpus" "$@") || { echo "failed: $*" >&2 && exit 1; }
	sync -f "$d" "$fs"
	echo "$(date +%s.%N) - $start" | bc
}
for ((r = 0; r < rounds; r++)); do
	cpu=$((r % 2))
	for t in $(printf '%s\n' tar-only/free native/free fuse-floor/free fuse-floor/one fuse-floor/dpin fuse-floor-uring/free fuse-floor-wb/free fuse-floor-wb/one branch/free branch/one ${DPIN:+branch/dpin} | shuf); do
		s=${t%/*} p=${t#*/}
		fs=$work/fs-$r-$s-$p
		freshfs "$fs"
		pid=
		case $s in
		tar-only) # reading and parsing the archive alone, the part of tar's time no file system takes
			x=$( { /usr/bin/time -f %e tar -xOf "$work/src.tar" >/dev/null; } 2>&1)
			echo "$s-extract $p $x $(load)" | tee -a "$out"
			unmount_last && rm -f "$fs.img" && continue ;;
		native) d=$fs/native && mkdir "$d" ;;
		fuse-floor) mount_floor "$work/floor" && d=$work/floor/x && mkdir "$d" ;;
		fuse-floor-uring) mount_floor "$work/floor" serve-uring && d=$work/floor/x && mkdir "$d" && pid= ;;
		fuse-floor-wb) FUSE_FLOOR_WRITEBACK=1 mount_floor "$work/floor" && d=$work/floor/x && mkdir "$d" ;;
		branch) mount_branch "$fs/base" "$fs/store" "$work/bmnt" && d=$work/bmnt/@b/x && mkdir "$d" ;;
		esac
		cpus=$(place "$p" $cpu "$pid")
		x=$(timed "$d" "$fs" "$cpus" tar -xf "$work/src.tar")
		echo "$s-extract $p $x $(load)" | tee -a "$out"
		if [ "${s#fuse-floor}" = "$s" ]; then
			x=$(timed "$d" "$fs" "$cpus" cp -a src copy)
			echo "$s-cp $p $x $(load)" | tee -a "$out"
			x=$(timed "$d" "$fs" "$cpus" rm -rf copy)
			echo "$s-rm $p $x $(load)" | tee -a "$out"
		fi
		if [ "${s#fuse-floor}" != "$s" ]; then
			unmount_last && wait
			awk -v n="$files" '$1 == "opcode" { r += $3 } END { printf "fuse-floor: %.1f requests per file\n", r / n }' "$work/floor.counts"
		elif [ $s = branch ]; then
			unmount_last
		fi
		unmount_last
		rm -f "$fs.img"
	done
done
summary "$out"
