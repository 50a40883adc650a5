# Sourced by the checkpoint benchmarks in the guest (criu-bench.sh,
# criu-remote-bench.sh): timing, the subject, and the time to a restored
# clone's first output. MNT is the mount they work in.
PROG=/tests/criu-stateful
now() { cut -d' ' -f1 /proc/uptime; } # seconds, 10 ms steps
ms_between() { echo "$1 $2" | awk '{ printf "%.0f", ($2 - $1) * 1000 }'; }
median3() { tr ' ' '\n' | grep . | sort -n | sed -n 2p; }
guest_mib() { free -m | awk '/Mem:/ { print $2 }'; }

# checkpointed NAME MIB [MODE [ARGS...]]: runs the subject (MIB MiB, in
# MODE) in a new branch NAME and, once it is ready, checkpoints it with
# ARGS. Sets READY_MS (from its start to ready), CK_MS (the checkpoint's
# time) and CK_OUT (its output). Fails, leaving no branch, if the subject
# or its checkpoint did not fit in the guest.
checkpointed() {
	_n=$1 _mib=$2 _mode=${3:-} CK_OUT=""
	if [ $# -ge 3 ]; then shift 3; else shift $#; fi
	branchfs create $_n $MNT >/dev/null
	_t0=$(now)
	branchfs run --data-path fuse --branch $_n $MNT -- sh -c "exec $PROG $MNT $_mib $_mode </dev/null >/dev/null 2>&1" </dev/null >/dev/null 2>&1 &
	_rp=$!
	while [ ! -e $MNT/@$_n/ready ] && kill -0 $_rp 2>/dev/null; do sleep 0.01; done
	_t1=$(now)
	READY_MS=$(ms_between $_t0 $_t1)
	if ! [ -e $MNT/@$_n/ready ] || ! CK_OUT=$(branchfs checkpoint $_n $MNT --run-id $_n "$@" 2>&1); then
		kill $_rp 2>/dev/null
		wait $_rp 2>/dev/null
		branchfs abort $MNT/@$_n --recursive >/dev/null 2>&1
		return 1
	fi
	CK_MS=$(ms_between $_t1 $(now))
	wait $_rp # the run ends with the checkpoint, by a signal
	return 0
}

# first_output NAME [ARGS...]: ms from the start of a restore of NAME (one
# clone, with ARGS) to the clone's first output (the subject's DIR/first,
# once it has read its hot pages); the restore's output stays in
# /tmp/bench-restore, with the page server's summary ("served N pages, F
# of them faulted in") when BENCH_STORE names the store. Checks the
# clone's result and aborts its branch.
first_output() {
	_n=$1
	shift
	_t0=$(now)
	branchfs restore $_n $MNT --clones 1 --keep "$@" >/tmp/bench-restore 2>&1 &
	_bp=$!
	_b=""
	while :; do
		[ -z "$_b" ] && _b=$(sed -n 's/^restored clone 0 in branch \([^ ]*\) .*/\1/p' /tmp/bench-restore)
		[ -n "$_b" ] && [ -e $MNT/@$_b/first ] && break
		if ! kill -0 $_bp 2>/dev/null; then
			_b=$(sed -n 's/^restored clone 0 in branch \([^ ]*\) .*/\1/p' /tmp/bench-restore)
			[ -n "$_b" ] && [ -e $MNT/@$_b/first ] && break
			echo "BENCH-ERROR $_n $*: $(cat /tmp/bench-restore)" >&2
			return 1
		fi
		sleep 0.01
	done
	_t1=$(now)
	wait $_bp
	grep -q 'alloc=ok child=ok' $MNT/@$_b/result || echo "BENCH-ERROR $_n $*: not restored faithfully: $(cat $MNT/@$_b/result)" >&2
	[ -z "${BENCH_STORE:-}" ] || cat $BENCH_STORE/branches/$_b/restores/1/page-server.log >>/tmp/bench-restore 2>/dev/null
	branchfs abort $MNT/@$_b >/dev/null
	ms_between $_t0 $_t1
}
