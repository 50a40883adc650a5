#!/bin/busybox sh
# Checkpoint/restore benchmarks in the guest, run by criu-test.sh when
# qemu/criu.sh installed them (BRANCHFS_CRIU_BENCH=1 make qemu-test).
# Under TCG only ratios mean anything. Prints "BENCH name value" lines.
MNT=/work
PROG=/tests/criu-stateful
now() { cut -d' ' -f1 /proc/uptime; } # seconds, 10 ms steps
ms_between() { echo "$1 $2" | awk '{ printf "%.0f", ($2 - $1) * 1000 }'; }
json_field() { sed -n "s/.*\"$1\":\([0-9.]*\).*/\1/p" | head -1; }

# Fresh start: from `branchfs run` to the subject's ready file.
branchfs create bfresh $MNT >/dev/null
t0=$(now)
branchfs run --branch bfresh $MNT -- sh -c "exec $PROG $MNT 16 </dev/null >/dev/null 2>&1" </dev/null >/dev/null 2>&1 &
rp=$!
while [ ! -e $MNT/@bfresh/ready ]; do sleep 0.01; done
fresh=$(ms_between $t0 $(now))
branchfs checkpoint bfresh $MNT --run-id bfresh >/dev/null
wait $rp

one=$(branchfs restore bfresh $MNT --clones 1 --keep --json | json_field restore_ms)
echo "BENCH restore_1_vs_fresh_start $(echo "$one $fresh" | awk '{ printf "%.2f", $1 / $2 }') ($one ms vs $fresh ms, 16 MiB)"
branchfs list $MNT | grep -o 'bfresh-clone-[^ ]*' | while read -r b; do branchfs abort $MNT/@$b >/dev/null; done

seq_ms=0
for i in 1 2 3 4 5 6 7 8 9 10; do
	t=$(branchfs restore bfresh $MNT --clones 1 --keep --json | json_field restore_ms)
	seq_ms=$(echo "$seq_ms $t" | awk '{ print $1 + $2 }')
done
branchfs list $MNT | grep -o 'bfresh-clone-[^ ]*' | while read -r b; do branchfs abort $MNT/@$b >/dev/null; done
par=$(branchfs restore bfresh $MNT --clones 10 --keep --json | json_field restore_ms)
echo "BENCH restore_10_together_vs_one_after_another $(echo "$par $seq_ms" | awk '{ printf "%.2f", $1 / $2 }') ($par ms vs $seq_ms ms)"
branchfs abort $MNT/@bfresh --recursive >/dev/null
