#!/bin/bash
# System calls the daemon makes per file for the small-file patterns, in a
# branch view: tar -xf of Go's src/go (about 550 files), cp -a of it within
# the view, rm -rf of the copy. Counts, unlike timings, do not depend on the
# machine's load. Needs root, strace and a built binary.
#   usage: bench/smallfiles-counts.sh [BIN] [SRC]   (default bin/branchfs, $(go env GOROOT)/src/go)
set -euo pipefail
bin=$(realpath "${1:-bin/branchfs}")
src=${2:-$(go env GOROOT)/src/go}
work=$(mktemp -d /tmp/smallfiles.XXXXXX)
mnt=$work/mnt
mkdir -p "$work/base" "$mnt"
tar -C "$(dirname "$src")" -cf "$work/src.tar" "$(basename "$src")"
files=$(tar -tf "$work/src.tar" | grep -vc '/$')
dirs=$(tar -tf "$work/src.tar" | grep -c '/$')
# REQUESTS=1: mount with --debug and count the requests of each phase too.
"$bin" mount ${REQUESTS:+--debug} --base "$work/base" --store "$work/store" "$mnt"
trap '"$bin" unmount "$mnt" || fusermount3 -u "$mnt"; rm -rf "$work"' EXIT
"$bin" create b "$mnt" >/dev/null
view=$mnt/@b
pid=$(ps -eo pid=,args= | awk -v m="$mnt" '$2 ~ /branchfs$/ && $3 == "mount" && $NF == m {print $1}')
echo "$files files, $dirs directories; daemon $pid"

# phase NAME DIR CMD...: runs CMD in DIR and counts what the daemon did:
# with perf stat (the default; cheap, so the runtime behaves as it does
# untraced) system calls, futex and nanosleep calls (the Go runtime's
# handoffs between threads), context switches and CPU time; with STRACE=1,
# under strace -c, which slows every system call, the calls by name.
phase() {
	local name=$1 dir=$2 out=$work/$1.count
	shift 2
	sync -f "$view"
	local logged=$(wc -l <"$work/store/daemon.log")
	if [ -n "${STRACE:-}" ]; then
		strace -c -f -q -o "$out" -p "$pid" &
	else
		perf stat -x, -o "$out" -p "$pid" -e raw_syscalls:sys_enter,syscalls:sys_enter_futex \
			-e syscalls:sys_enter_nanosleep,context-switches,task-clock &
	fi
	local st=$!
	# Wait until the counter is attached.
	if [ -n "${STRACE:-}" ]; then
		until grep -q '^TracerPid:[[:space:]]*[1-9]' "/proc/$pid/status"; do sleep 0.05; done
	else
		local want=$(($(ls "/proc/$pid/task" | wc -l) * 5)) # an event per thread
		until [ "$(ls -l "/proc/$st/fd" 2>/dev/null | grep -c perf_event)" -ge "$want" ]; do sleep 0.05; done
	fi
	(cd "$dir" && "$@")
	sync -f "$view"
	kill -INT $st
	wait $st || true
	[ -n "${VERBOSE:-}" ] && cat "$out"
	[ -n "${REQUESTS:-}" ] && tail -n +$((logged + 1)) "$work/store/daemon.log" |
		awk -v n="$files" '/ rx [0-9]+: / { for (i = 1; i < NF; i++) if ($i == "rx") { op[$(i+2)]++; all++ } }
			END { printf "requests %.1f/file:", all / n; for (o in op) printf " %s %d", o, op[o]; printf "\n" }'
	if [ -n "${STRACE:-}" ]; then
		awk -v n="$files" -v name="$name" '
			$NF == "total" { total = $(NF-2) }
			$NF ~ /^(futex|nanosleep|openat2|openat|newfstatat|fstat|statx|close|read|write|writev|fgetxattr|getxattr|lgetxattr)$/ {
				calls[$NF] = $4; if ($5 ~ /^[0-9]+$/) { errs[$NF] = $5 } }
			END {
				rt = calls["futex"] + calls["nanosleep"]
				printf "%-8s %6.1f syscalls/file, %.1f without futex and nanosleep (%d total):", name, total / n, (total - rt) / n, total
				for (s in calls) printf " %s %d%s", s, calls[s], (s in errs) ? "(" errs[s] " err)" : ""
				printf "\n"
			}' "$out"
	else
		awk -F, -v n="$files" -v name="$name" '
			$3 == "raw_syscalls:sys_enter" { sys = $1 } $3 == "syscalls:sys_enter_futex" { fu = $1 }
			$3 == "syscalls:sys_enter_nanosleep" { ns = $1 } $3 == "context-switches" { cs = $1 }
			$3 == "task-clock" { cpu = $1 }
			END {
				printf "%-8s %5.1f syscalls/file, %.1f without futex and nanosleep; futex %.2f, nanosleep %.2f, context switches %.2f, CPU %.0f us per file\n",
					name, sys / n, (sys - fu - ns) / n, fu / n, ns / n, cs / n, cpu * 1000 / n
			}' "$out"
	fi
}
phase extract "$view" tar -xf "$work/src.tar"
phase copy "$view" cp -a "$(basename "$src")" copy
phase remove "$view" rm -rf copy
