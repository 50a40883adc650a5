#!/bin/bash
# The daemon's own cost per request (docs/performance.md, "The daemon's own
# cost per request"): binaries of branchfs taking turns, in a shuffled order
# within each round, on the tree workload in a branch view: tar -xf of Go's
# src/, cp -a of it within the view, rm -rf of the copy, each followed by a
# syncfs, on a fresh ext4 image per binary and round. The daemon and the
# client run on one CPU (alternating between rounds), so that the figures
# do not depend on where the scheduler puts them. Needs root and perf.
#
#   bench/daemon-cost.sh ROUNDS BIN...
#
# Prints a line per binary, phase and round: seconds, the daemon's CPU time
# and its system calls per file (perf stat), and the load average; and per
# binary its peak RSS. The summary gives medians (min-max).
set -euo pipefail
rounds=${1:?usage: bench/daemon-cost.sh ROUNDS BIN...}
shift
bins=()
for b in "$@"; do bins+=("$(realpath "$b")"); done
bin=${bins[0]} # lib.sh unmounts with it; each round sets it to the binary measured
work=$(mktemp -d /var/tmp/daemon-cost.XXXXXX)
. "$(dirname "$0")/lib.sh"
cleanup() {
	unmount_all
	rm -rf "$work"
}
trap cleanup EXIT
tar -C "$(go env GOROOT 2>/dev/null || echo /usr/local/go)" -cf "$work/src.tar" src
files=$(tar -tf "$work/src.tar" | grep -vc '/$')
out=$work/out
: >"$out"
for ((r = 0; r < rounds; r++)); do
	cpu=$((r % 2))
	for i in $(seq 0 $((${#bins[@]} - 1)) | shuf); do
		bin=${bins[i]} fs=$work/fs mnt=$work/mnt
		freshfs "$fs"
		mount_branch "$fs/base" "$fs/store" "$mnt"
		taskset -a -p -c $cpu "$pid" >/dev/null
		d=$mnt/@b/x
		mkdir "$d"
		for phase in extract cp rm; do
			case $phase in
			extract) cmd=(tar -xf "$work/src.tar") ;;
			cp) cmd=(cp -a src copy) ;;
			rm) cmd=(rm -rf copy) ;;
			esac
			sync -f "$d" "$fs"
			perf stat -x, -o "$work/stat" -p "$pid" -e raw_syscalls:sys_enter,task-clock &
			st=$!
			# Wait until the counters are attached: two per thread.
			want=$(($(ls "/proc/$pid/task" | wc -l) * 2))
			until [ "$(ls -l "/proc/$st/fd" 2>/dev/null | grep -c perf_event)" -ge "$want" ]; do sleep 0.02; done
			start=$(date +%s.%N)
			(cd "$d" && taskset -c $cpu "${cmd[@]}")
			sync -f "$d" "$fs"
			end=$(date +%s.%N)
			kill -INT $st
			wait $st || true
			awk -F, -v n="$files" -v name="$i:$(basename "$bin")" -v ph=$phase -v t="$(echo "$end - $start" | bc)" -v l="$(load)" '
				$3 == "raw_syscalls:sys_enter" { sys = $1 } $3 == "task-clock" { cpu = $1 }
				END { printf "%s %s %.3f s, daemon %.0f ms CPU, %.1f syscalls/file, load %s\n", name, ph, t, cpu, sys / n, l }' \
				"$work/stat" | tee -a "$out"
		done
		echo "$i:$(basename "$bin") rss $(awk '/VmHWM/ {print $2}' "/proc/$pid/status") kB" | tee -a "$out"
		unmount_all
		rm -rf "$fs.img" "$fs"
	done
done
echo "# medians over $rounds rounds (min-max), $files files"
awk '$2 == "rss" { k = $1 " rss"; v[k] = v[k] " " $3; next }
	{ k = $1 " " $2; v[k " s"] = v[k " s"] " " $3; v[k " ms"] = v[k " ms"] " " $6; v[k " syscalls/file"] = v[k " syscalls/file"] " " $9
	  v[k " load"] = v[k " load"] " " $12 }
	END { for (k in v) print k, v[k] }' "$out" | sort | while read -r a b c rest; do
	[ "$b" = rss ] && { set -- $c $rest; label="$a rss kB"; } || { set -- $rest; label="$a $b $c"; }
	printf '%-40s %s\n' "$label" "$(printf '%s\n' "$@" | sort -g | awk '{ x[NR] = $1 } END { m = NR % 2 ? x[(NR + 1) / 2] : (x[NR / 2] + x[NR / 2 + 1]) / 2; printf "%g (%g-%g)", m, x[1], x[NR] }')"
done
