#!/bin/busybox sh
# The remote checkpoint tests in the guest (qemu/init.sh runs this after
# criu-test.sh, with /work mounted over /data/base, store /data/store):
# a checkpoint pushed to the S3 server on the host (qemu/s3.sh; the guest
# reaches it at 10.0.2.2) is restored on a second "host": a mount of a
# copy of the base with a store of its own, at the same mount point, as
# the restored processes find their files where they had them. Each test
# prints "PASS criu_remote_NAME[: detail]" or "FAIL criu_remote_NAME: why".
MNT=/work
PROG=/tests/criu-stateful
pass() { echo "PASS $*"; }
fail() { echo "FAIL $*"; }
names="criu_remote_checkpoint criu_remote_restore criu_remote_lazy criu_remote_lazy_prefetch"
fail_all() { for n in $names; do fail "$n: $1"; done; exit 0; }

set -a
. /tests/s3.env || fail_all "no /tests/s3.env"
set +a
ip link set eth0 up && ip addr add 10.0.2.15/24 dev eth0 && ip route add default via 10.0.2.2 ||
	fail_all "no network: $(ip link 2>&1 | tr '\n' ' ')"
criu check >/dev/null 2>&1 || fail_all "criu check fails"

wait_for() {
	i=0
	while [ ! -e "$1" ]; do
		i=$((i + 1))
		[ $i -gt 2400 ] && return 1
		sleep 0.05
	done
}

# On the first host: the subject in branch rem, its counter at 2 (each
# SIGUSR2 counts one, acknowledged in /tmp/counter), checkpointed and
# pushed.
branchfs create rem $MNT >/dev/null || fail_all "create rem"
branchfs run --data-path fuse --branch rem $MNT -- sh -c "exec $PROG $MNT 16 </dev/null >/dev/null 2>&1" </dev/null >/dev/null 2>&1 &
RUNPID=$!
wait_for $MNT/@rem/ready || fail_all "the subject did not start"
pid=$(pidof criu-stateful | tr ' ' '\n' | sort -n | head -1)
for c in 1 2; do
	kill -USR2 "$pid"
	i=0
	until [ "$(cat /tmp/counter 2>/dev/null)" = $c ]; do
		i=$((i + 1))
		[ $i -gt 2400 ] && fail_all "the subject did not count to $c"
		sleep 0.05
	done
done
url=$S3_URL/ck/rem
if out=$(branchfs checkpoint rem $MNT --run-id rem --to $S3_URL/ck/ 2>&1) && echo "$out" | grep -q "^pushed rem with checkpoint 1 to $url:"; then
	pass "criu_remote_checkpoint: $(echo "$out" | tail -1)"
else
	fail "criu_remote_checkpoint: $out"
fi
wait $RUNPID 2>/dev/null

# The second host: a copy of the base, mounted where the first was.
cp -a /data/base /data/base-second
branchfs unmount $MNT
branchfs mount --base /data/base-second --store /data/store-second $MNT || fail_all "mounting the second host"

# clones_ok OUT N: N clones restored, each continued from the subject's
# state (its counter at 2, every word of its memory, its child) in its
# own branch. Aborts them.
clones_ok() {
	bs=$(echo "$1" | sed -n 's/^restored clone [0-9]* in branch \([^ ]*\) .*/\1/p')
	ok=$(for b in $bs; do grep -l "^clone [0-9a-f]* counter=2 alloc=ok child=ok writes=ok\$" $MNT/@$b/result 2>/dev/null; done | wc -l)
	for b in $bs; do branchfs abort $MNT/@$b >/dev/null; done
	[ "$ok" = "$2" ]
}
if out=$(branchfs restore rem $MNT --from $url --clones 3 --keep 2>&1) && clones_ok "$out" 3; then
	pass "criu_remote_restore: 3 clones from $url"
else
	fail "criu_remote_restore: $out"
fi
if out=$(branchfs restore rem $MNT --from $url --clones 2 --keep --lazy 2>&1) && clones_ok "$out" 2 &&
	echo "$out" | grep -q 'recorded the working set'; then
	pass "criu_remote_lazy: 2 clones, pages faulted in from the bucket"
else
	fail "criu_remote_lazy: $out"
fi
if out=$(branchfs restore rem $MNT --from $url --clones 2 --keep --lazy 2>&1) && clones_ok "$out" 2 &&
	n=$(echo "$out" | sed -n 's/^lazy restore: prefetched \([0-9]*\) pages .*/\1/p') && [ -n "$n" ] && [ "$n" -gt 0 ]; then
	pass "criu_remote_lazy_prefetch: $n pages of the recorded working set fetched first"
else
	fail "criu_remote_lazy_prefetch: $out"
fi

# The first host again, as init.sh mounted it.
branchfs abort $MNT/@rem --recursive >/dev/null 2>&1
branchfs unmount $MNT
branchfs mount --base /data/base --store /data/store --max-branches 200 $MNT || echo "FAIL mount /work again"
branchfs abort $MNT/@rem --recursive >/dev/null 2>&1
if [ -x /tests/criu-remote-bench.sh ]; then
	/tests/criu-remote-bench.sh
fi
