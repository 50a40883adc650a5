#!/bin/busybox sh
# The remote checkpoint tests in the guest, across two boots that stand
# for two hosts sharing only the S3 server on the host (qemu/s3.sh; the
# guest reaches it at 10.0.2.2) and a base made the same way on each.
#
#   criu-remote-test.sh first    (init.sh, after criu-test.sh) a subject
#                                checkpointed with --to into the bucket,
#                                its image uploaded while CRIU dumps it
#   criu-remote-test.sh second   (init.sh, on the second boot) restored
#                                from the bucket with clones, eagerly and
#                                lazily; a bad secret and a connection
#                                dropped mid-transfer fail in one line and
#                                leave the mount as it was
#
# The second host mounts its base where the first did, as restored
# processes find their files where they had them. Each test prints
# "PASS criu_remote_NAME[: detail]" or "FAIL criu_remote_NAME: why".
MNT=/work
BASE=/data/rbase
STORE=/data/rstore
PROG=/tests/criu-stateful
phase=$1
pass() { echo "PASS $*"; }
fail() { echo "FAIL $*"; }
case $phase in
first) names="criu_remote_checkpoint criu_remote_streamed" ;;
second) names="criu_remote_bad_secret criu_remote_dropped criu_remote_restore criu_remote_lazy criu_remote_lazy_prefetch" ;;
*) echo "usage: $0 first|second" >&2; exit 2 ;;
esac
fail_all() { for n in $names; do fail "$n: $1"; done; exit 0; }

set -a
. /tests/s3.env || fail_all "no /tests/s3.env"
set +a
ip link set eth0 up && ip addr add 10.0.2.15/24 dev eth0 && ip route add default via 10.0.2.2 ||
	fail_all "no network: $(ip link 2>&1 | tr '\n' ' ')"
# The first boot's criu-test.sh has set up what CRIU needs, unless only
# these tests run (BRANCHFS_QEMU_ONLY=remote); not the second's.
grep -q ' /run tmpfs ' /proc/mounts || . /tests/criu-setup.sh
criu check >/dev/null 2>&1 || fail_all "criu check fails"
url=$S3_URL/ck/rem

wait_for() {
	i=0
	while [ ! -e "$1" ]; do
		i=$((i + 1))
		[ $i -gt 2400 ] && return 1
		sleep 0.05
	done
}

# The base each host makes alike, mounted at $MNT with a store of its own.
mount_base() {
	mkdir -p $BASE/src && echo "the remote tests' base" >$BASE/README && seq 1000 >$BASE/src/numbers
	branchfs mount --base $BASE --store $STORE $MNT
}

if [ $phase = first ]; then
	# The first host: the subject in branch rem, its counter at 2 (each
	# SIGUSR2 counts one, acknowledged in /tmp/counter), checkpointed and
	# pushed. The mount of the other tests is set aside meanwhile.
	branchfs unmount $MNT || fail_all "unmounting $MNT"
	mount_base || fail_all "mounting the first host's base"
	branchfs create rem $MNT >/dev/null || fail_all "create rem"
	branchfs run --data-path fuse --branch rem $MNT -- sh -c "exec $PROG $MNT 16 </dev/null >/dev/null 2>&1" </dev/null >/dev/null 2>&1 &
	RUNPID=$!
	wait_for $MNT/@rem/ready || fail_all "the subject did not start"
	pid=$(pidof criu-stateful | tr ' ' '\n' | sort -n | head -1)
	rm -f /tmp/counter
	for c in 1 2; do
		kill -USR2 "$pid"
		i=0
		until [ "$(cat /tmp/counter 2>/dev/null)" = $c ]; do
			i=$((i + 1))
			[ $i -gt 2400 ] && fail_all "the subject did not count to $c"
			sleep 0.05
		done
	done
	# The checkpoint's requests go through s3log, which notes each one
	# the server has answered, and its CRIU, once done, does not exit
	# before a chunk of the image is in the bucket: a push that began
	# only once CRIU exited would find none (criu_remote_streamed).
	cat >/tmp/criu-held <<'W'
#!/bin/sh
criu "$@"
rc=$?
[ "$1" = dump ] || exit $rc
cut -d' ' -f1 /proc/uptime >/tmp/dumped
i=0
until chunk=$(grep -m1 '^PUT /guest/ck/\.chunks/[0-9a-f]* 200$' /tmp/s3log); do
	i=$((i + 1))
	if [ $i -gt 2400 ]; then
		echo "no chunk of the image reached the bucket in the 2 minutes after CRIU dumped it" >/tmp/held
		cut -d' ' -f1 /proc/uptime >/tmp/released
		exit $rc
	fi
	sleep 0.05
done
echo "seen before the dump ended: $chunk" >/tmp/held
cut -d' ' -f1 /proc/uptime >/tmp/released
exit $rc
W
	chmod +x /tmp/criu-held
	rm -f /tmp/s3log /tmp/held
	/tests/s3log 127.0.0.1:18334 "${AWS_ENDPOINT_URL#http://}" /tmp/s3log >/tmp/s3log.out 2>&1 &
	LOGPID=$!
	i=0
	until grep -q ready /tmp/s3log.out 2>/dev/null || [ $i -gt 200 ]; do i=$((i + 1)); sleep 0.05; done
	started=$(cut -d' ' -f1 /proc/uptime)
	# BRANCHFS_PHASES: where the time after the dump goes, printed below.
	if out=$(BRANCHFS_PHASES=1 AWS_ENDPOINT_URL=http://127.0.0.1:18334 BRANCHFS_CRIU=/tmp/criu-held branchfs checkpoint rem $MNT --run-id rem --to $S3_URL/ck/ 2>&1) &&
		echo "$out" | grep -q "^pushed rem with checkpoint 1 to $url:"; then
		# The times of the dump (to CRIU's exit) and of what followed the
		# hold: their sum is what checkpoint --to takes without it.
		took=$(awk -v s="$started" -v d="$(cat /tmp/dumped)" -v r="$(cat /tmp/released)" -v e="$(cut -d' ' -f1 /proc/uptime)" \
			'BEGIN { printf "dump %.2f s, held %.2f s, then %.2f s to the manifest", d - s, r - d, e - r }')
		echo "$out" | grep '^branchfs: phase' | grep -v ' phase [0-9.]* chunk ' | sed 's/^/criu_remote_checkpoint /'
		pass "criu_remote_checkpoint: $(echo "$out" | grep -v '^branchfs: phase' | tail -1) ($took)"
	else
		fail "criu_remote_checkpoint: $out"
	fi
	if grep -q '^seen ' /tmp/held 2>/dev/null; then
		pass "criu_remote_streamed: $(cat /tmp/held)"
	else
		fail "criu_remote_streamed: $(cat /tmp/held 2>/dev/null || echo "the dump did not get as far: $(cat /tmp/s3log.out)")"
	fi
	kill $LOGPID 2>/dev/null
	wait $LOGPID 2>/dev/null
	wait $RUNPID 2>/dev/null
	if [ -x /tests/criu-remote-bench.sh ]; then
		/tests/criu-remote-bench.sh
	fi
	branchfs abort $MNT/@rem --recursive >/dev/null 2>&1
	branchfs unmount $MNT
	branchfs mount --base /data/base --store /data/store --max-branches 200 $MNT || echo "FAIL mount /work again"
	exit 0
fi

# The second host: nothing of the first but the bucket.
mount_base || fail_all "mounting the second host's base"

# unchanged WHAT ERRFILE: the restore failed with one line on stderr and
# left no branch and no staged image behind; else says what is wrong.
unchanged() {
	lines=$(wc -l <"$2")
	if ! branchfs list $MNT >/tmp/list 2>&1; then
		echo "after $1, branchfs list fails: $(cat /tmp/list)"
		return
	fi
	left=$(awk 'NR > 1 && $1 != "main" { printf "%s ", $1 }' /tmp/list)
	staged=$(ls $STORE/tmp 2>/dev/null | tr '\n' ' ')
	if [ "$lines" != 1 ]; then
		echo "$1: $lines lines on stderr: $(tr '\n' '|' <"$2")"
	elif [ -n "$left" ]; then
		echo "$1 left branches: $left"
	elif [ -n "$staged" ]; then
		echo "$1 left staged files: $staged"
	fi
}

if AWS_SECRET_ACCESS_KEY=not-the-secret branchfs restore rem $MNT --from $url --clones 2 >/tmp/out 2>/tmp/err; then
	fail "criu_remote_bad_secret: a restore with a wrong secret succeeded: $(cat /tmp/out)"
elif why=$(unchanged "a restore with a wrong secret" /tmp/err) && [ -n "$why" ]; then
	fail "criu_remote_bad_secret: $why"
elif ! grep -q 'secret key' /tmp/err; then
	fail "criu_remote_bad_secret: the error does not name the secret key: $(cat /tmp/err)"
else
	pass "criu_remote_bad_secret: $(cat /tmp/err)"
fi

# The connection drops once 4 MiB of the 16 MiB subject's image came.
host=${AWS_ENDPOINT_URL#http://}
/tests/dropconn 127.0.0.1:18333 "$host" $((4 << 20)) >/tmp/dropconn &
DROPPID=$!
wait_for_line() { i=0; until grep -q ready "$1" 2>/dev/null; do i=$((i + 1)); [ $i -gt 200 ] && return 1; sleep 0.05; done; }
if ! wait_for_line /tmp/dropconn; then
	fail "criu_remote_dropped: the proxy did not start"
elif AWS_ENDPOINT_URL=http://127.0.0.1:18333 branchfs restore rem $MNT --from $url --clones 2 >/tmp/out 2>/tmp/err; then
	fail "criu_remote_dropped: a restore through a dropped connection succeeded: $(cat /tmp/out)"
elif ! grep -q dropped /tmp/dropconn; then
	fail "criu_remote_dropped: the restore failed before the connection dropped: $(cat /tmp/err)"
elif why=$(unchanged "a restore through a dropped connection" /tmp/err) && [ -n "$why" ]; then
	fail "criu_remote_dropped: $why"
else
	pass "criu_remote_dropped: $(cat /tmp/err)"
fi
kill $DROPPID 2>/dev/null
wait $DROPPID 2>/dev/null

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
branchfs abort $MNT/@rem --recursive >/dev/null 2>&1
branchfs unmount $MNT
