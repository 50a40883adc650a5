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
# BRANCHFS_QEMU_ONLY=remote runs the remote checkpoint tests alone (both
# boots), for work on checkpoint --to and restore --from.
only=${BRANCHFS_QEMU_ONLY:-}
case $only in
'' | remote) ;;
*) echo "qemu-test: BRANCHFS_QEMU_ONLY may be remote, or empty for every test" >&2; exit 2 ;;
esac

kernel=$("$here/build-kernel.sh")
work=$(mktemp -d)
# shellcheck source=qemu/s3.sh
. "$here/s3.sh"
trap 's3_stop; rm -rf "$work"' EXIT
root=$work/root
mkdir -p "$root"/{bin,tests,dev,proc,sys,tmp}
cp /bin/busybox "$root/bin/busybox"
(cd "$repo" && CGO_ENABLED=0 go build -o "$root/bin/branchfs" ./cmd/branchfs)
(cd "$repo" && CGO_ENABLED=0 go test -c -o "$root/tests/kernel.test" ./kernel)
(cd "$repo" && CGO_ENABLED=0 go test -c -o "$root/tests/explore.test" ./explore)
gcc -static -O2 -pthread -Wall -Wno-format-truncation -I"$repo/prototype/include" -o "$root/tests/branch_test" "$repo/prototype/tests/branch_test.c"
install -m 755 "$here/init.sh" "$root/init"
"$here/criu.sh" "$root" # checkpoint tests: criu, its libraries, a subject
s3_start "$root"         # the remote ones: an S3 server the guest reaches
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
# The checkpoint benchmark's 1 GiB process needs room for itself, its
# image (on the guest's tmpfs) and a restored copy; the remote one's lazy
# restore from the bucket also for the page server's block cache beside
# the clone and the local image (at its lowest, 2.7 GiB of 3.9 were left).
# The debug kernel's KASAN shadow and quarantine cost the checkpoint
# tests' two 256 MB subjects their room: in 1 GiB the OOM killer took them.
mem=1024
[ "${BRANCHFS_QEMU_DEBUG:-0}" = 0 ] || mem=2048
[ -z "${BRANCHFS_CRIU_BENCH:-}" ] || mem=4096
# boot LOG [ARG]: boots the guest, the kernel given ARG too, its console
# in LOG; sets qrc to QEMU's exit status (124: timed out).
# no_timer_check: on a loaded host a TCG guest's timer can miss the
# kernel's boot check, which then panics ("IO-APIC + timer doesn't work").
boot() {
	set +e
	timeout "$timeout_s" qemu-system-x86_64 -accel "$accel" -m $mem -smp 2 \
		-nographic -no-reboot -kernel "$kernel" -initrd "$work/initramfs.gz" -nic user,model=e1000 \
		-append "console=ttyS0 panic=-1 quiet no_timer_check ${2:-}" </dev/null | stdbuf -oL tr -d '\r' > "$1"
	qrc=${PIPESTATUS[0]}
	set -e
	cat "$1"
}
boot "$work/console.log" "${only:+branchfs.only=$only}"
qrc1=$qrc
# A second boot stands for a second host: it restores with clones what the
# first pushed to the S3 server, sharing nothing else with it.
echo "qemu-test: booting again as the second host" >&2
boot "$work/console2.log" branchfs.second
qrc2=$qrc
cat "$work/console.log" "$work/console2.log" > "$work/both.log"

# The summary counts every result line: TAP lines of the C tests
# ("ok N name", "not ok N name"), Go's "--- PASS: name (" lines, and the
# extra program's PASS/FAIL or TAP lines. Every test the harness promises
# must have reported under its exact name.
want="available bad_input create_n1 create_n3 create_n8 create_n64 commit_race abort nesting
isolate no_isolate_control close_fds no_close_fds_control grandchild_killed failed_fs_commit
partial_failure signals_during_create names_copied_once confined_view caller_killed fence_more
no_fence_more_control fs_rebase traced_fork_events pidfds_and_attr limits view_locked winner_after_commit nproc_unprivileged perf_fork_records unstarted_child gate_cgroup_kill trace_fork_event nproc_fs_unprivileged
control_file_identified name_limits commit_threads_fds daemon_stopped gate_freeze gate_session_pinned gate_oom TestAvailable TestBranchFromGo TestBranchAbortFromGo TestLimits TestLimitsBadInput
criu_available criu_kdat_cached criu_checkpoint criu_clones_1 criu_clones_3 criu_clones_8 criu_unnoticed criu_generation_ids
criu_fail_all criu_commit_race criu_incremental criu_incremental_anon criu_lazy_restore criu_lazy_prefetch"
want_remote="criu_remote_checkpoint criu_remote_streamed criu_remote_bad_secret criu_remote_dropped criu_remote_restore criu_remote_lazy criu_remote_lazy_prefetch"
if [ "$only" = remote ]; then want=$want_remote; else want="$want $want_remote"; fi
results=$work/results
awk '
/^== go binding/ { sec = "go"; next }
/^== extra program exited/ { sec = "done"; next }
/^== extra program/ { sec = "extra"; next }
/^== checkpoint and restore/ { sec = "criu"; next }
/^== / { next }
sec == "" && match($0, /^(not )?ok [0-9]+ [^ #]+/) {
	split($0, f, " ")
	if (f[1] == "ok") print "pass", f[3]; else print "fail", f[4]
}
sec == "go" && /^ *--- (PASS|FAIL|SKIP): / {
	name = $3
	print ($2 == "PASS:" ? "pass" : $2 == "SKIP:" ? "skip" : "fail"), "go/" name
}
sec == "criu" && /^(PASS|FAIL) criu_/ {
	name = $2
	sub(/:$/, "", name)
	print ($1 == "PASS" ? "pass" : "fail"), "criu/" name
}
sec == "extra" && /^(PASS|FAIL)[ :]/ { n++; print ($1 ~ /^PASS/ ? "pass" : "fail"), "extra/" n }
sec == "extra" && /^(not )?ok [0-9]+/ { n++; print ($1 == "ok" ? "pass" : "fail"), "extra/" n }
' "$work/both.log" > "$results"
passed=$(grep -c '^pass ' "$results" || true)
failed=$(grep -c '^fail ' "$results" || true)
for t in $want; do
	case $t in Test*) name=go/$t ;; criu_*) name=criu/$t ;; *) name=$t ;; esac
	if ! grep -qxE "(pass|fail|skip) $name" "$results"; then
		echo "MISSING $t"
		failed=$((failed + 1))
	elif grep -qx "skip $name" "$results"; then
		echo "SKIPPED $t"
		failed=$((failed + 1))
	fi
done
# The C tests announce their count first (TAP plan).
plan=$(sed -n 's/^1\.\.\([0-9]*\)$/\1/p' "$work/console.log" | head -1)
ran=$(awk '$2 !~ /^(go|extra|criu)\// { n++ } END { print n + 0 }' "$results")
if [ -z "$only" ] && { [ -z "$plan" ] || [ "$plan" != "$ran" ]; }; then
	echo "qemu-test: the C tests planned ${plan:-no} tests and reported $ran"
	failed=$((failed + 1))
fi
# The extra program's exit status counts when it printed no failure.
erc=$(sed -n 's/^== extra program exited \([0-9]*\)$/\1/p' "$work/console.log")
if [ -n "$erc" ] && [ "$erc" != 0 ] && ! grep -q '^fail extra/' "$results"; then
	echo "qemu-test: the extra program exited $erc"
	failed=$((failed + 1))
fi
# Any report of the kernel's own checks fails the run, whatever the tests
# said: the guest prints its kernel log before it powers off.
# Lockdep's reports start with "WARNING:" or name the problem; its boot
# banner ("RCU lockdep checking is enabled") is no report.
bad='BUG:|WARNING:|Oops|general protection fault|Kernel panic|kernel BUG|KASAN|UBSAN|possible recursive locking|possible circular locking|possible irq lock inversion|inconsistent lock state|suspicious RCU usage|bad unlock balance|DEBUG_LOCKS_WARN_ON|held lock freed|INFO: task .* blocked|list_(add|del) corruption|Call Trace:'
# gate_oom exhausts the memory on purpose: the call traces of the OOM
# killer's report and of allocations that failed meanwhile, between the
# marks it writes to the kernel log, are expected; nothing else is.
awk '/branch_test: gate_oom begins/ { oom = 1 } /branch_test: gate_oom ends/ { oom = 0 }
	!(oom && /Call Trace:/)' "$work/both.log" > "$work/scanned.log"
if grep -qE "$bad" "$work/scanned.log"; then
	echo "qemu-test: the kernel reported a problem:"
	grep -nE "$bad" "$work/scanned.log" | head -20
	failed=$((failed + 1))
fi
logs=("$work/console.log" "$work/console2.log")
rcs=("$qrc1" "$qrc2")
for i in 0 1; do
	log=${logs[$i]} rc=${rcs[$i]} boot=$((i + 1))
	if ! grep -q '^== kernel log end' "$log"; then
		echo "qemu-test: the guest printed no kernel log (boot $boot)"
		failed=$((failed + 1))
	fi
	if [ "$rc" = 124 ]; then
		echo "qemu-test: boot $boot timed out after ${timeout_s}s"
		failed=$((failed + 1))
	elif ! grep -q '^== guest done' "$log"; then
		echo "qemu-test: the guest did not finish (boot $boot, qemu exit $rc)"
		failed=$((failed + 1))
	fi
done
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
