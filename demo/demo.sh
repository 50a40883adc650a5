#!/usr/bin/env bash
# The branchfs demo: three candidate fixes tried side by side in three
# branches of one workspace; the one whose test passes is committed.
set -euo pipefail
bin=$(realpath "${1:-bin/branchfs}")
work=$(mktemp -d /tmp/branchfs-demo.XXXXXX)
base=$work/workspace mnt=$work/mnt
say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
cleanup() { "$bin" unmount "$mnt" 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

say "A sample workspace with a bug: add() subtracts"
mkdir -p "$base/lib" "$mnt"
cat > "$base/lib/math.sh" <<'SRC'
add() { echo $(( $1 - $2 )); }
SRC
cat > "$base/test.sh" <<'SRC'
#!/bin/sh
. ./lib/math.sh
[ "$(add 2 3)" = 5 ] && [ "$(add 10 -4)" = 6 ] && echo PASS && exit 0
echo "FAIL: add 2 3 = $(add 2 3)"; exit 1
SRC
chmod +x "$base/test.sh"
for i in $(seq 1 200); do echo "data $i" > "$base/lib/data$i.txt"; done
(cd "$base" && ./test.sh) || true

say "Mount it: $mnt shows the workspace, branches appear at $mnt/@NAME"
"$bin" mount --base "$base" --store "$work/store" "$mnt"

say "Three branches, three candidate fixes"
declare -A fix=([fix-mul]='$1 * $2' [fix-add]='$1 + $2' [fix-swap]='$2 - $1')
for b in fix-mul fix-add fix-swap; do
	"$bin" create "$b" "$mnt" >/dev/null
	printf 'add() { echo $(( %s )); }\n' "${fix[$b]}" > "$mnt/@$b/lib/math.sh"
	printf '  %-9s lib/math.sh: %s\n' "$b" "$(cat "$mnt/@$b/lib/math.sh")"
done
"$bin" list "$mnt"

say "Run the test in every branch, in parallel"
winner=
for b in fix-mul fix-add fix-swap; do
	(cd "$mnt/@$b" && if ./test.sh > "$work/$b.out" 2>&1; then echo 0; else echo 1; fi > "$work/$b.rc") &
done
wait
for b in fix-mul fix-add fix-swap; do
	printf '  %-9s %s\n' "$b" "$(cat "$work/$b.out")"
	[ "$(cat "$work/$b.rc")" = 0 ] && winner=$b
done
[ -n "$winner" ] || { echo "no candidate passed"; exit 1; }

say "What $winner changed"
"$bin" diff "$mnt/@$winner"

say "Commit $winner; its siblings become stale and are aborted"
"$bin" commit "$mnt/@$winner"
for b in fix-mul fix-add fix-swap; do
	[ "$b" = "$winner" ] && continue
	"$bin" commit "$mnt/@$b" 2>&1 | sed 's/^/  (expected) /' || true
	"$bin" abort "$mnt/@$b"
done
"$bin" list "$mnt"

say "The workspace now holds the fix, and its test passes"
echo "  $(cat "$base/lib/math.sh")"
(cd "$base" && ./test.sh)

say "Unmount"
"$bin" unmount "$mnt"
echo "demo finished"
