#!/bin/busybox sh
# Time to first output of a clone restored lazily from the S3 server on the
# host (criu-remote-test.sh runs this when qemu/s3.sh installed it:
# BRANCHFS_CRIU_BENCH=1 make qemu-test, or =remote for this bench alone),
# against the same restore from the local image, for 64 MiB, 256 MiB and
# 1 GiB subjects whose working set is of one size whatever theirs: 256 hot
# pages, as far apart as they can be (criu-stateful's "fixed"), so that
# no page brings a neighbour along and every one costs a request of its
# own: the worst case for the bucket. Prints "BENCH name value" lines;
# under TCG only ratios mean anything.
MNT=/work
BENCH_STORE=/data/rstore # criu-remote-test.sh's
. /tests/criu-bench-lib.sh

# low_water_start, low_water_stop: the least MemAvailable (MiB) seen
# between the two, sampled every half second.
low_water_start() {
	(
		low=999999
		while :; do
			a=$(awk '/^MemAvailable:/ { printf "%d", $2 / 1024 }' /proc/meminfo)
			[ "$a" -lt $low ] && low=$a && echo $low >/tmp/bench-low-water
			sleep 0.5
		done
	) &
	LOW_PID=$!
}
low_water_stop() {
	kill $LOW_PID 2>/dev/null
	wait $LOW_PID 2>/dev/null
	cat /tmp/bench-low-water
	rm -f /tmp/bench-low-water
}
# fetched: what the last restore fetched before its clone ran, as it said.
prefetched() { sed -n 's/^lazy restore: prefetched \([0-9]*\) pages .*/\1/p' /tmp/bench-restore; }
requests() { sed -n 's/^lazy restore: fetched .* \([0-9]*\) requests, .*/\1/p' /tmp/bench-restore; }
fetched() { sed -n 's/^lazy restore: fetched the \(.*\)/\1/p' /tmp/bench-restore; }
# restored: ms from the start of checkpoint.Restore (after the image's
# files and the working set came) to the clone restored, as it said.
restored() { sed -n 's/^restored clone 0 in branch .*, \([0-9.]*\) ms)$/\1/p' /tmp/bench-restore; }
# faults: the one-page requests the page server answered (faults, save the
# odd remainder of a background copy).
faults() { sed -n 's/^served [0-9]* pages, \([0-9]*\) of them faulted in$/\1/p' /tmp/bench-restore; }

for mib in 64 256 1024; do
	n=rfirst$mib
	if ! checkpointed $n $mib fixed --to $S3_URL/bench/; then
		echo "BENCH first_output_remote_${mib}MiB: does not fit in the guest ($(guest_mib) MiB): $CK_OUT"
		continue
	fi
	url=$S3_URL/bench/$n
	# Local: the working set recorded by a first lazy restore, then used.
	first_output $n --lazy >/dev/null
	loc="" rem="" reqs="" lres="" rres="" lflt="" rflt=""
	for i in 1 2 3; do
		loc="$loc $(first_output $n --lazy)"
		lres="$lres $(restored)"
		lflt="$lflt $(faults)"
	done
	wsl=$(prefetched)
	# From the bucket: the first records the working set there.
	low_water_start
	first=$(first_output $n --lazy --from $url)
	recf=$(faults)
	low=$(low_water_stop)
	for i in 1 2 3; do
		rem="$rem $(first_output $n --lazy --from $url)"
		reqs="$reqs $(requests)"
		rres="$rres $(restored)"
		rflt="$rflt $(faults)"
	done
	wsr=$(prefetched) what=$(fetched)
	eager=""
	# An eager restore from the bucket stages the whole image beside the
	# local one: 1 GiB of each does not fit beside the subject.
	[ $mib -ge 1024 ] || eager=$(first_output $n --from $url)
	l=$(echo $loc | median3) r=$(echo $rem | median3)
	echo "BENCH first_output_remote_${mib}MiB lazy with prefetch from the bucket $r ms vs from the local image $l ms ($(echo "$r $l" | awk '{ printf "%.2f", $1 / $2 }')x); working set ${wsr:-none} pages from the bucket, ${wsl:-none} locally; fetched before the clone ran: ${what:-nothing} (requests:$reqs); first lazy restore from the bucket (recording) $first ms, ${recf:-?} faults, least memory available meanwhile $low MiB of $(guest_mib); eager from the bucket ${eager:-not run} ms; checkpoint and push $CK_MS ms: $(echo "$CK_OUT" | tail -1) (runs: bucket$rem, restored after$rres ms, faults$rflt; local$loc, restored after$lres ms, faults$lflt)"
	branchfs abort $MNT/@$n --recursive >/dev/null
done
