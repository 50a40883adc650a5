#!/bin/busybox sh
# Time to first output of a clone restored from the S3 server on the host
# (criu-remote-test.sh runs this when qemu/s3.sh installed it:
# BRANCHFS_CRIU_BENCH=1 make qemu-test, or =remote for this bench alone),
# against the same restore from the local image, for 64 MiB, 256 MiB and
# 1 GiB subjects that read 1% of their memory (their hot pages) before
# their first output. Prints "BENCH name value" lines; under TCG only
# ratios mean anything.
MNT=/work
PROG=/tests/criu-stateful
now() { cut -d' ' -f1 /proc/uptime; }
ms_between() { echo "$1 $2" | awk '{ printf "%.0f", ($2 - $1) * 1000 }'; }
median3() { tr ' ' '\n' | grep . | sort -n | sed -n 2p; }

first_output() { # NAME ARGS...: ms from the restore's start to the clone's first output
	n=$1
	shift
	t0=$(now)
	branchfs restore $n $MNT --clones 1 --keep "$@" >/tmp/bench-restore 2>&1 &
	bp=$!
	b=""
	while :; do
		[ -z "$b" ] && b=$(sed -n 's/^restored clone 0 in branch \([^ ]*\) .*/\1/p' /tmp/bench-restore)
		[ -n "$b" ] && [ -e $MNT/@$b/first ] && break
		if ! kill -0 $bp 2>/dev/null; then
			b=$(sed -n 's/^restored clone 0 in branch \([^ ]*\) .*/\1/p' /tmp/bench-restore)
			[ -n "$b" ] && [ -e $MNT/@$b/first ] && break
			echo "BENCH-ERROR $n $*: $(cat /tmp/bench-restore)" >&2
			return 1
		fi
		sleep 0.01
	done
	t1=$(now)
	wait $bp
	grep -q 'alloc=ok child=ok' $MNT/@$b/result || echo "BENCH-ERROR $n $*: not restored faithfully: $(cat $MNT/@$b/result)" >&2
	branchfs abort $MNT/@$b >/dev/null
	ms_between $t0 $t1
}

for mib in 64 256 1024; do
	n=rfirst$mib
	branchfs create $n $MNT >/dev/null
	branchfs run --data-path fuse --branch $n $MNT -- sh -c "exec $PROG $MNT $mib hot </dev/null >/dev/null 2>&1" </dev/null >/dev/null 2>&1 &
	rp=$!
	while [ ! -e $MNT/@$n/ready ] && kill -0 $rp 2>/dev/null; do sleep 0.05; done
	t0=$(now)
	if ! [ -e $MNT/@$n/ready ] || ! pushed=$(branchfs checkpoint $n $MNT --run-id $n --to $S3_URL/bench/ 2>&1); then
		echo "BENCH first_output_remote_${mib}MiB: does not fit in the guest ($(free -m | awk '/Mem:/ { print $2 }') MiB): $pushed"
		kill $rp 2>/dev/null
		wait $rp 2>/dev/null
		branchfs abort $MNT/@$n --recursive >/dev/null 2>&1
		continue
	fi
	ck=$(ms_between $t0 $(now))
	wait $rp
	url=$S3_URL/bench/$n
	# Local: the working set recorded by a first lazy restore, then used.
	first_output $n --lazy >/dev/null
	loc="" rem=""
	for i in 1 2 3; do loc="$loc $(first_output $n --lazy)"; done
	# From the bucket: the first records the working set there.
	first=$(first_output $n --lazy --from $url)
	for i in 1 2 3; do rem="$rem $(first_output $n --lazy --from $url)"; done
	eager=""
	# An eager restore from the bucket stages the whole image beside the
	# local one: 1 GiB of each does not fit beside the subject.
	[ $mib -ge 1024 ] || eager=$(first_output $n --from $url)
	l=$(echo $loc | median3) r=$(echo $rem | median3)
	echo "BENCH first_output_remote_${mib}MiB lazy with prefetch from the bucket $r ms vs from the local image $l ms ($(echo "$r $l" | awk '{ printf "%.2f", $1 / $2 }')x); first lazy restore from the bucket (recording) $first ms; eager from the bucket ${eager:-not run} ms; checkpoint and push $ck ms: $(echo "$pushed" | tail -1) (runs: bucket$rem; local$loc)"
	branchfs abort $MNT/@$n --recursive >/dev/null
done
