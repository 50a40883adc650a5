#!/bin/busybox sh
# Checkpoint/restore tests in the guest (qemu/init.sh runs this with the
# branchfs mount /work over /data/base, store /data/store). Each test
# prints "PASS criu_NAME[: detail]" or "FAIL criu_NAME: why" for run.sh.
# BRANCHFS_CRIU points at a wrapper of criu that makes the restore of
# the clone whose index is in /tmp/fail-index fail (a pid file it cannot
# write), for the all-or-nothing test, and hides soft-dirty bits while
# /tmp/no-soft-dirty exists.
MNT=/work
STORE=/data/store
PROG=/tests/criu-stateful
# The incremental test's 256 MiB image must fit beside the 256 MiB subject.
mount -o remount,size=80% /data
. /tests/criu-setup.sh

cat > /tmp/criu-wrap <<'W'
#!/bin/sh
# /tmp/no-soft-dirty: as on a kernel without soft-dirty bits.
if [ "$1" = check ] && [ -f /tmp/no-soft-dirty ] && echo " $* " | grep -q ' mem_dirty_track '; then
	exit 1
fi
if [ "$1" = restore ] && [ -f /tmp/fail-index ] && [ "$(cat /run/branchfs/clone/index 2>/dev/null)" = "$(cat /tmp/fail-index)" ]; then
	exec criu "$@" --pidfile /nonexistent/pid
fi
exec criu "$@"
W
chmod +x /tmp/criu-wrap
export BRANCHFS_CRIU=/tmp/criu-wrap

# A checkpoint that hangs fails its test after 5 minutes, not the whole run.
pass() { echo "PASS $*"; }
fail() { echo "FAIL $*"; }

# wait_for FILE: until it exists (the subject writes it), at most ~120 s.
wait_for() {
	i=0
	while [ ! -e "$1" ]; do
		i=$((i + 1))
		[ $i -gt 2400 ] && return 1
		sleep 0.05
	done
}

# start NAME MIB [MODE]: runs the subject in a new branch NAME; waits until ready.
start() {
	branchfs create "$1" $MNT >/dev/null || return 1
	# Its stdio is opened inside the run's mount namespace, where CRIU
	# finds the mounts of every file it has open.
	branchfs run --data-path fuse --branch "$1" $MNT -- sh -c "exec $PROG $MNT $2 $3 </dev/null >/dev/null 2>&1" </dev/null >/dev/null 2>&1 &
	RUNPID=$!
	wait_for $MNT/@"$1"/ready
}

# subject: the pid of the running subject (its child, which holds the
# secret, has the higher pid).
subject() { pidof criu-stateful | tr ' ' '\n' | sort -n | head -1; }

# bump N: counts the subject's counter up to N, one SIGUSR2 at a time,
# each acknowledged in /tmp/counter (outside the branch, which a
# checkpoint that leaves the subject running makes read-only).
bump() {
	pid=$(subject)
	c=$(cat /tmp/counter)
	while [ "$c" -lt "$1" ]; do
		kill -USR2 "$pid"
		i=0
		until [ "$(cat /tmp/counter 2>/dev/null)" = $((c + 1)) ]; do
			i=$((i + 1))
			[ $i -gt 2400 ] && return 1
			sleep 0.05
		done
		c=$((c + 1))
	done
}

if ! criu check >/tmp/criu-check 2>&1; then
	fail "criu_available: $(grep Error /tmp/criu-check | tr "\n" " ")"
	exit 0
fi
pass criu_available
# CRIU keeps what it probed of the kernel in /run for the rest of the boot.
if [ -f /run/criu.kdat ]; then pass "criu_kdat_cached: /run/criu.kdat"; else fail "criu_kdat_cached: no /run/criu.kdat"; fi

# A checkpoint of the subject's run, its files frozen with it. The
# subject writes in its branch every millisecond, and its counter is 3.
if start ck 16 write && bump 3 && out=$(timeout 300 branchfs checkpoint ck $MNT --run-id ck 2>&1) &&
	[ -f $STORE/branches/ck/images/1/image.json ]; then
	if echo x 2>/dev/null >$MNT/@ck/frozen; then
		fail "criu_checkpoint: the checkpointed branch is still writable"
	else
		pass "criu_checkpoint: $out"
	fi
else
	fail "criu_checkpoint: $out"
fi

# restore_keep N: N clones; each must have continued from the subject's
# state (its counter 3, every word of its memory, its child, no write
# error ever) and written only into its own branch. Collects the clones'
# ids and results.
ids=""
results=""
restore_keep() {
	n=$1
	if ! out=$(branchfs restore ck $MNT --clones $n --keep 2>&1); then
		fail "criu_clones_$n: $out"
		return
	fi
	branches=$(echo "$out" | sed -n 's/^restored clone [0-9]* in branch \([^ ]*\) .*/\1/p')
	got=$(echo "$branches" | grep -c .)
	bad=""
	for b in $branches; do
		r=$(cat $MNT/@$b/result 2>/dev/null)
		results="$results$r
"
		case $r in
		"clone "*" counter=3 alloc=ok child=ok writes=ok") ;;
		*) bad="$bad $b:[$r]" ;;
		esac
		grep -q "^$r\$" $MNT/@$b/state.log || bad="$bad $b:state.log"
		ids="$ids $(echo "$r" | cut -d' ' -f2)"
	done
	[ -e $MNT/@ck/result ] && bad="$bad ck-has-a-result"
	grep -q '^clone' $MNT/@ck/state.log && bad="$bad ck-state.log-written"
	if [ "$got" = "$n" ] && [ -z "$bad" ]; then
		pass "criu_clones_$n"
	else
		fail "criu_clones_$n: $got restored;$bad; $out"
	fi
	for b in $branches; do branchfs abort $MNT/@$b >/dev/null; done
}
restore_keep 1
restore_keep 3
restore_keep 8

# The subject, which wrote in its branch every millisecond, saw no error:
# it was stopped before its branch turned read-only (its memory, which
# every clone restored, says so).
n=$(echo "$results" | grep -c 'writes=ok$')
if [ "$n" = 12 ]; then
	pass "criu_unnoticed: 12 clones, no write error before the checkpoint"
else
	fail "criu_unnoticed: $n of 12 clones without a write error: $(echo "$results" | grep -v 'writes=ok$' | head -2)"
fi

# Every clone saw its own id.
total=$(echo $ids | wc -w)
uniq=$(echo $ids | tr ' ' '\n' | grep -E '^[0-9a-f]{32}$' | sort -u | wc -l)
if [ "$total" = 12 ] && [ "$uniq" = 12 ]; then
	pass "criu_generation_ids: 12 clones, 12 distinct ids"
else
	fail "criu_generation_ids: $total ids, $uniq distinct and well formed: $ids"
fi

# A clone that fails to restore takes every other one down.
echo 1 > /tmp/fail-index
out=$(branchfs restore ck $MNT --clones 3 2>&1)
rc=$?
rm -f /tmp/fail-index
left=$(branchfs list $MNT | grep -c 'ck-clone-')
procs=$(ps | grep -c '[c]riu-stateful')
if [ $rc != 0 ] && echo "$out" | grep -q 'clone 1 (ck-clone-' && [ "$left" = 0 ] && [ "$procs" = 0 ]; then
	pass "criu_fail_all"
else
	fail "criu_fail_all: exit $rc, $left clone branches and $procs processes left: $out"
fi

# Clones race: the first to exit 0 commits into ck, the others abort.
out=$(branchfs restore ck $MNT --clones 3 --json 2>&1)
winner=$(echo "$out" | sed -n 's/.*"winner":"\([^"]*\)".*/\1/p')
commits=$(echo "$out" | grep -o '"committed":true' | wc -l)
if [ -n "$winner" ] && [ "$commits" = 1 ] && grep -q 'counter=3 alloc=ok child=ok writes=ok' $MNT/@ck/result 2>/dev/null &&
	[ "$(branchfs list $MNT | grep -c 'ck-clone-')" = 0 ]; then
	pass "criu_commit_race: $winner won"
else
	fail "criu_commit_race: $out"
fi
branchfs abort $MNT/@ck --recursive >/dev/null 2>&1

# Incremental: after 1% of 256 MiB is given new contents, only about that
# is dumped, and a clone restored from the increment (over its parent)
# has the new contents and the counter of the second checkpoint.
if start inc 256 && bump 1 && full=$(timeout 300 branchfs checkpoint inc $MNT --run-id inc --leave-running --json 2>&1); then
	rm -f /tmp/touched
	bump 2
	kill -USR1 $(subject)
	if wait_for /tmp/touched && inc=$(timeout 300 branchfs checkpoint inc $MNT --run-id inc --leave-running --incremental --json 2>&1); then
		fp=$(echo "$full" | sed -n 's/.*"pages":\([0-9]*\).*/\1/p')
		ip=$(echo "$inc" | sed -n 's/.*"pages":\([0-9]*\).*/\1/p')
		tier=$(echo "$inc" | sed -n 's/.*"tier":"\([^"]*\)".*/\1/p')
		# The restore needs the room the subject holds.
		kill $RUNPID 2>/dev/null; wait $RUNPID 2>/dev/null
		out=$(branchfs restore inc $MNT --clones 1 --keep 2>&1)
		b=$(echo "$out" | sed -n 's/^restored clone 0 in branch \([^ ]*\) .*/\1/p')
		r=$(cat $MNT/@$b/result 2>/dev/null)
		# 1% of 65536 pages is 656; allow the stack, libc and the like.
		if [ "$tier" = soft-dirty ] && [ "$ip" -ge 600 ] && [ "$ip" -le 1600 ] && [ "$fp" -ge 65536 ] &&
			echo "$r" | grep -q "^clone [0-9a-f]* counter=2 alloc=ok child=ok writes=ok\$"; then
			pass "criu_incremental: tier $tier, $ip of $fp pages; restored: $r"
		else
			fail "criu_incremental: tier $tier, $ip of $fp pages: $inc; restored: [$r] $out"
		fi
		[ -n "$b" ] && branchfs abort $MNT/@$b >/dev/null
	else
		fail "criu_incremental: $inc"
	fi
else
	fail "criu_incremental: $full"
fi
kill $RUNPID 2>/dev/null; wait $RUNPID 2>/dev/null
branchfs abort $MNT/@inc --recursive >/dev/null 2>&1

# Incremental where the kernel has no soft-dirty bits: the dump keeps the
# pages that differ from the previous image (the counter's, the stack's;
# SIGUSR1 gives 1% of the allocation new contents), and the image
# restores whole through its parent, with those contents and the counter.
touch /tmp/no-soft-dirty
if start inca 64 && bump 1 && full=$(timeout 300 branchfs checkpoint inca $MNT --run-id inca --leave-running --json 2>&1); then
	rm -f /tmp/touched
	bump 2
	kill -USR1 $(subject)
	if wait_for /tmp/touched && inc=$(timeout 300 branchfs checkpoint inca $MNT --run-id inca --leave-running --incremental 2>&1); then
		fp=$(echo "$full" | sed -n 's/.*"pages":\([0-9]*\).*/\1/p')
		ip=$(echo "$inc" | sed -n 's/.*tier anon-pagemap, \([0-9]*\) pages.*/\1/p')
		out=$(branchfs restore inca $MNT --clones 1 --keep 2>&1)
		b=$(echo "$out" | sed -n 's/^restored clone 0 in branch \([^ ]*\) .*/\1/p')
		if [ -n "$ip" ] && [ "$ip" -ge 1 ] && [ "$ip" -le $((fp / 20)) ] && [ -L $STORE/branches/inca/images/2/parent ] &&
			grep -q 'counter=2 alloc=ok child=ok writes=ok$' $MNT/@$b/result 2>/dev/null; then
			pass "criu_incremental_anon: $inc; restored whole"
		else
			fail "criu_incremental_anon: $ip of $fp pages: $inc; $out"
		fi
		[ -n "$b" ] && branchfs abort $MNT/@$b >/dev/null
	else
		fail "criu_incremental_anon: $inc"
	fi
else
	fail "criu_incremental_anon: $full"
fi
rm -f /tmp/no-soft-dirty
kill $RUNPID 2>/dev/null; wait $RUNPID 2>/dev/null
branchfs abort $MNT/@inca --recursive >/dev/null 2>&1

# Lazy restore: the clone runs before its memory is in, our page server
# sends the pages it faults in and records them (the working set) with
# the image; a second lazy restore copies that set in first.
lazy_ok() { # OUT: one clone restored, continued from its state
	b=$(echo "$1" | sed -n 's/^restored clone 0 in branch \([^ ]*\) .*/\1/p')
	[ -n "$b" ] && grep -q "^clone [0-9a-f]* counter=1 alloc=ok child=ok writes=ok\$" $MNT/@$b/result 2>/dev/null
}
ws=$STORE/branches/lz/images/1/workingset
if start lz 32 && bump 1 && timeout 300 branchfs checkpoint lz $MNT --run-id lz >/dev/null 2>&1 &&
	out=$(branchfs restore lz $MNT --clones 1 --keep --lazy 2>&1) && lazy_ok "$out"; then
	if [ -s $ws ] && echo "$out" | grep -q 'recorded the working set'; then
		pass "criu_lazy_restore: $(wc -l <$ws) pages in the working set"
	else
		fail "criu_lazy_restore: no working set recorded: $out"
	fi
	before=$(cat $ws)
	if out=$(branchfs restore lz $MNT --clones 2 --keep --lazy 2>&1) && lazy_ok "$out" &&
		n=$(echo "$out" | sed -n "s|^lazy restore: prefetched \([0-9]*\) pages of the working set $ws\$|\1|p") &&
		[ -n "$n" ] && [ "$n" -gt 0 ] && [ "$(cat $ws)" = "$before" ]; then
		pass "criu_lazy_prefetch: $n pages prefetched"
	else
		fail "criu_lazy_prefetch: $out"
	fi
else
	fail "criu_lazy_restore: $out"
	fail "criu_lazy_prefetch: no first lazy restore"
fi
kill $RUNPID 2>/dev/null; wait $RUNPID 2>/dev/null
branchfs list $MNT | grep -o 'lz-clone-[^ ]*' | while read -r b; do branchfs abort $MNT/@$b >/dev/null; done
branchfs abort $MNT/@lz --recursive >/dev/null 2>&1
if [ -x /tests/criu-bench.sh ]; then
	/tests/criu-bench.sh
fi
echo "== criu tests done"
