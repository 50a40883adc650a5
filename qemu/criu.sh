#!/bin/bash
# Adds the checkpoint tests to the guest's root (qemu/run.sh calls this
# with the root directory): Debian's criu and the shared libraries it
# needs (found with ldd), the test subject and the test script. criu is
# installed by qemu/deps.sh, which make qemu-test runs first; without it
# the run stops here rather than report every checkpoint test missing.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$1
criu=$(command -v criu || true)
[ -n "$criu" ] || { echo "criu.sh: no criu on the host: run qemu/deps.sh (make qemu-test does)" >&2; exit 1; }
mkdir -p "$root/bin" "$root/tests"
cp "$criu" "$root/bin/criu"
ldd "$criu" | awk '/=>/ { print $3 } /^\t\/lib/ { print $1 }' | while read -r lib; do
	[ -f "$lib" ] || continue
	mkdir -p "$root$(dirname "$lib")"
	cp -L "$lib" "$root$lib"
done
gcc -static -O2 -Wall -Wextra -o "$root/tests/criu-stateful" "$here/criu-stateful.c"
install -m 755 "$here/criu-test.sh" "$root/tests/criu-test.sh"
install -m 644 "$here/criu-setup.sh" "$root/tests/criu-setup.sh"
# BRANCHFS_CRIU_BENCH=remote runs only the remote one (qemu/s3.sh).
if [ -n "${BRANCHFS_CRIU_BENCH:-}" ]; then
	install -m 644 "$here/criu-bench-lib.sh" "$root/tests/criu-bench-lib.sh"
fi
if [ -n "${BRANCHFS_CRIU_BENCH:-}" ] && [ "$BRANCHFS_CRIU_BENCH" != remote ]; then
	install -m 755 "$here/criu-bench.sh" "$root/tests/criu-bench.sh"
fi
