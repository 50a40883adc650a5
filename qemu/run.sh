#!/bin/bash
# make qemu-test: builds the patched kernel (cached), an initramfs with
# busybox, a static branchfs and the tests, boots it under QEMU (KVM when
# /dev/kvm is usable, TCG otherwise), prints every result and then
# "N passed, N failed". Exits non-zero on a failure, a missing test or a
# timeout.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
timeout_s=${BRANCHFS_QEMU_TIMEOUT:-900}

kernel=$("$here/build-kernel.sh")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
root=$work/root
mkdir -p "$root"/{bin,tests,dev,proc,sys,tmp}
cp /bin/busybox "$root/bin/busybox"
(cd "$repo" && CGO_ENABLED=0 go build -o "$root/bin/branchfs" ./cmd/branchfs)
(cd "$repo" && CGO_ENABLED=0 go test -c -o "$root/tests/kernel.test" ./kernel)
gcc -static -O2 -Wall -Wno-format-truncation -I"$repo/prototype/include" -o "$root/tests/branch_test" "$repo/prototype/tests/branch_test.c"
install -m 755 "$here/init.sh" "$root/init"
# Another static program to run in the guest after ours, with /work and
# /lim mounted as for our tests: BRANCHFS_QEMU_EXTRA=/path/to/program.
if [ -n "${BRANCHFS_QEMU_EXTRA:-}" ]; then
	install -m 755 "$BRANCHFS_QEMU_EXTRA" "$root/tests/extra"
fi
(cd "$root" && find . | cpio -o -H newc --quiet | gzip -1) > "$work/initramfs.gz"

# /dev/kvm can be there and still not run a guest: under a nested
# hypervisor that lacks CPU features QEMU's default model asks for, the
# guest spins without a word until the timeout. So KVM is used only when a
# bare boot of the kernel (it panics for want of a root, and QEMU exits)
# prints the kernel's banner; BRANCHFS_QEMU_ACCEL=tcg|kvm overrides.
kvm_boots() {
	[ -r /dev/kvm ] && [ -w /dev/kvm ] || return 1
	local out
	out=$(timeout 20 qemu-system-x86_64 -accel kvm -m 256 -nographic -no-reboot \
		-kernel "$kernel" -append "console=ttyS0 panic=-1" </dev/null 2>/dev/null || true)
	[[ $out == *"Linux version"* ]]
}
accel=${BRANCHFS_QEMU_ACCEL:-}
if [ -z "$accel" ]; then
	accel=tcg
	if kvm_boots; then accel=kvm; fi
fi
echo "qemu-test: booting $kernel under $accel" >&2
set +e
timeout "$timeout_s" qemu-system-x86_64 -accel "$accel" -m 1024 -smp 2 \
	-nographic -no-reboot -kernel "$kernel" -initrd "$work/initramfs.gz" \
	-append "console=ttyS0 panic=-1 quiet" </dev/null | tr -d '\r' > "$work/console.log"
qrc=${PIPESTATUS[0]}
set -e
cat "$work/console.log"

# Every test the harness promises must have reported.
want="available bad_input create_n1 create_n3 create_n8 create_n64 commit_race abort nesting
isolate no_isolate_control close_fds no_close_fds_control grandchild_killed failed_fs_commit
partial_failure TestAvailable TestBranchFromGo"
passed=0 failed=0
for t in $want; do
	if grep -qE "^(PASS $t|--- PASS: $t \()" "$work/console.log"; then
		passed=$((passed + 1))
	else
		failed=$((failed + 1))
		grep -qE "^(FAIL $t:|--- FAIL: $t )" "$work/console.log" || echo "MISSING $t"
	fi
done
extra=$(grep -cE '^(FAIL |--- FAIL: )' "$work/console.log" || true)
if [ "$qrc" = 124 ]; then
	echo "qemu-test: timed out after ${timeout_s}s"
	failed=$((failed + 1))
elif ! grep -q '^== guest done' "$work/console.log"; then
	echo "qemu-test: the guest did not finish (qemu exit $qrc)"
	failed=$((failed + 1))
fi
echo "$passed passed, $failed failed"
[ "$failed" = 0 ] && [ "$extra" = 0 ]
