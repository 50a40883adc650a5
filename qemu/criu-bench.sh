#!/bin/busybox sh
# Checkpoint/restore benchmarks in the guest, run by criu-test.sh when
# qemu/criu.sh installed them (BRANCHFS_CRIU_BENCH=1 make qemu-test).
# Under TCG only ratios mean anything. Prints "BENCH name value" lines.
MNT=/work
. /tests/criu-bench-lib.sh
json_field() { sed -n "s/.*\"$1\":\([0-9.]*\).*/\1/p" | head -1; }
# json_all FIELD: every value of FIELD in a JSON line, one a line.
json_all() { grep -o "\"$1\":[0-9.]*" | cut -d: -f2; }
drop_clones() { branchfs list $MNT | grep -o "$1-clone-[^ ]*" | while read -r b; do branchfs abort $MNT/@$b >/dev/null; done; }

# Fresh start, from `branchfs run` to the subject's ready file (it fills
# its memory, a different value in every word), against the restore of a
# checkpoint taken once it was ready; 16 MiB, 256 MiB and 1 GiB.
fresh_vs_restore() { # NAME MIB
	if ! checkpointed $1 $2; then
		echo "BENCH restore_1_vs_fresh_start_${2}MiB: does not fit in the guest"
		return 1
	fi
	fresh=$READY_MS
	one=$(branchfs restore $1 $MNT --clones 1 --keep --json | json_field restore_ms)
	echo "BENCH restore_1_vs_fresh_start_${2}MiB $(echo "$one $fresh" | awk '{ printf "%.2f", $1 / $2 }') ($one ms vs $fresh ms)"
	drop_clones $1
}
for mib in 256 1024; do
	fresh_vs_restore bfresh$mib $mib
	branchfs abort $MNT/@bfresh$mib --recursive >/dev/null 2>&1
done
fresh_vs_restore bfresh 16

# 10 clones one after another, then together; where the time goes: the
# set-up of each clone's run (branch, namespaces, cgroup: started_ms)
# and criu restore itself (criu_ms).
seq_ms=0
seq_criu=0
for i in 1 2 3 4 5 6 7 8 9 10; do
	j=$(branchfs restore bfresh $MNT --clones 1 --keep --json)
	seq_ms=$(echo "$seq_ms $(echo "$j" | json_field restore_ms)" | awk '{ print $1 + $2 }')
	seq_criu=$(echo "$seq_criu $(echo "$j" | json_field criu_ms)" | awk '{ print $1 + $2 }')
done
# What one restore spends its time on (CRIU's log, seconds since its start).
b=$(branchfs list $MNT | grep -o 'bfresh-clone-[^ ]*' | head -1)
echo "BENCH-NOTE criu restore log of $b: $(grep -E 'kdat|Forking task|Restore finished successfully' /data/store/branches/$b/restores/1/restore.log | head -5 | tr '\n' ';')"
drop_clones bfresh
j=$(branchfs restore bfresh $MNT --clones 10 --keep --json)
par=$(echo "$j" | json_field restore_ms)
setup=$(echo "$j" | json_all started_ms | sort -n | tail -1)
par_criu=$(echo "$j" | json_all criu_ms | awk '{ s += $1 } END { printf "%.0f", s / NR }')
drop_clones bfresh
branchfs abort $MNT/@bfresh --recursive >/dev/null

# What 2 vCPUs on a shared host give, right after: 10 CPU-bound jobs
# together vs one after another, the floor of the ratio of the restores
# (they overlap waiting as well as computing, so they can go below it).
cpu_job() { awk 'BEGIN { for (i = 0; i < 100000; i++) s += i * i }'; }
t0=$(now)
for i in 1 2 3 4 5 6 7 8 9 10; do cpu_job; done
t1=$(now)
for i in 1 2 3 4 5 6 7 8 9 10; do cpu_job & done
wait
t2=$(now)
floor=$(echo "$t0 $t1 $t2" | awk '{ printf "%.2f", ($3 - $2) / ($2 - $1) }')
echo "BENCH restore_10_together_vs_one_after_another $(echo "$par $seq_ms" | awk '{ printf "%.2f", $1 / $2 }') beside a CPU floor of $floor ($par ms vs $seq_ms ms; together: every run set up after $setup ms, criu restore $par_criu ms a clone on average; one after another: criu restore $(echo $seq_criu | awk '{ printf "%.0f", $1 / 10 }') ms a clone; CPU jobs $(ms_between $t1 $t2) ms vs $(ms_between $t0 $t1) ms)"

# Time to first output of a restored clone (the subject's DIR/first, once
# it has read its hot pages: 1% of its allocation): eager restore, lazy
# without a working set, lazy with the working set the lazy restores
# recorded. Median of 3 each.
for mib in 64 256 1024; do
	n=bfirst$mib
	if ! checkpointed $n $mib hot; then
		echo "BENCH first_output_${mib}MiB: does not fit in the guest ($(guest_mib) MiB)"
		continue
	fi
	ws=/data/store/branches/$n/images/1/workingset
	eager="" lazy="" pre=""
	for i in 1 2 3; do eager="$eager $(first_output $n)"; done
	for i in 1 2 3; do
		rm -f $ws
		lazy="$lazy $(first_output $n --lazy)"
	done
	wsn=$(wc -l <$ws 2>/dev/null)
	for i in 1 2 3; do pre="$pre $(first_output $n --lazy)"; done
	# The working set of another input: recorded by a lazy restore whose
	# process read other pages (offset 50), then used for input 0.
	rm -f $ws
	echo 50 >/tmp/hot-offset
	first_output $n --lazy >/dev/null
	rm -f /tmp/hot-offset
	other=""
	for i in 1 2 3; do other="$other $(first_output $n --lazy)"; done
	e=$(echo $eager | median3) l=$(echo $lazy | median3) p=$(echo $pre | median3) o=$(echo $other | median3)
	echo "BENCH first_output_${mib}MiB eager $e ms, lazy $l ms ($(echo "$l $e" | awk '{ printf "%.2f", $1 / $2 }')x), lazy with prefetch $p ms ($(echo "$p $e" | awk '{ printf "%.2f", $1 / $2 }')x), with the working set of another input $o ms ($(echo "$o $e" | awk '{ printf "%.2f", $1 / $2 }')x); working set ${wsn:-0} pages (runs: eager$eager; lazy$lazy; prefetch$pre; other input$other)"
	branchfs abort $MNT/@$n --recursive >/dev/null
done

# Incremental vs full dump, size and time, 256 MiB, after the subject
# rewrote 1% of its allocation: with soft-dirty bits, then without them
# (the criu wrapper of criu-test.sh hides them: the anon-pagemap tier).
dump_tiers() { # NAME: prints "TIER: full P pages T ms, incremental P pages T ms"
	branchfs create $1 $MNT >/dev/null
	branchfs run --data-path fuse --branch $1 $MNT -- sh -c "exec $PROG $MNT 256 </dev/null >/dev/null 2>&1" </dev/null >/dev/null 2>&1 &
	rp=$!
	while [ ! -e $MNT/@$1/ready ]; do sleep 0.05; done
	t0=$(now)
	full=$(branchfs checkpoint $1 $MNT --run-id $1 --leave-running --json)
	t1=$(now)
	pid=$(pidof criu-stateful | tr ' ' '\n' | sort -n | head -1)
	rm -f /tmp/touched
	kill -USR1 $pid
	while [ ! -e /tmp/touched ]; do sleep 0.05; done
	t2=$(now)
	inc=$(branchfs checkpoint $1 $MNT --run-id $1 --leave-running --incremental --json)
	t3=$(now)
	tier=$(echo "$inc" | sed -n 's/.*"tier":"\([^"]*\)".*/\1/p')
	fp=$(echo "$full" | json_field pages) ip=$(echo "$inc" | json_field pages)
	fms=$(ms_between $t0 $t1) ims=$(ms_between $t2 $t3)
	echo "BENCH dump_incremental_vs_full_$tier pages $(echo "$ip $fp" | awk '{ printf "%.3f", $1 / $2 }'), time $(echo "$ims $fms" | awk '{ printf "%.2f", $1 / $2 }') ($ip vs $fp pages, $ims vs $fms ms, 256 MiB)"
	kill $rp 2>/dev/null
	wait $rp 2>/dev/null
	branchfs abort $MNT/@$1 --recursive >/dev/null 2>&1
}
dump_tiers bdump
touch /tmp/no-soft-dirty
dump_tiers bdumpanon
rm -f /tmp/no-soft-dirty
