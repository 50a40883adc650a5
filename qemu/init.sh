#!/bin/busybox sh
# /init of the test guest: mounts what the tests need, three branchfs mounts,
# runs the C and Go tests of branch() and powers off. The host harness
# (qemu/run.sh) reads the PASS/FAIL lines from the serial console.
/bin/busybox --install -s /bin
export PATH=/bin
mount -t devtmpfs dev /dev
mount -t proc proc /proc
mount -t sysfs sys /sys
# The second boot stands for a second host (qemu/run.sh): it restores what
# the first pushed to the S3 server, and nothing else.
if grep -qw branchfs.second /proc/cmdline; then
	mkdir -p /data /work
	mount -t tmpfs data /data
	echo "== guest $(uname -r), second boot"
	echo "== checkpoint and restore, second host"
	/tests/criu-remote-test.sh second
	echo "== kernel log"
	dmesg
	echo "== kernel log end"
	echo "== guest done"
	poweroff -f
fi
# Base and store share one filesystem with xattrs, as commits rename.
mkdir -p /data /work /lim /grp
mount -t tmpfs data /data
mkdir -p /data/base /data/base2 /data/base3
echo hello > /data/base/hello.txt
echo "== guest $(uname -r), branch() abi $(cat /sys/kernel/branch/abi_version 2>/dev/null || echo none)"
branchfs mount --base /data/base --store /data/store --max-branches 200 /work || echo "FAIL mount /work"
branchfs mount --base /data/base2 --store /data/store2 --max-branches 2 /lim || echo "FAIL mount /lim"
# Its control group, gid 65534, may make branches: for unprivileged callers.
branchfs mount --base /data/base3 --store /data/store3 --control-group 65534 /grp || echo "FAIL mount /grp"
cd /
# BRANCHFS_QEMU_ONLY=remote (qemu/run.sh): the remote checkpoint tests alone.
if grep -qw branchfs.only=remote /proc/cmdline; then
	echo "== checkpoint and restore"
	/tests/criu-remote-test.sh first
	echo "== kernel log"
	dmesg
	echo "== kernel log end"
	echo "== guest done"
	poweroff -f
fi
/tests/branch_test
echo "== go binding"
BRANCHFS_GUEST_MNT=/work /tests/kernel.test -test.v -test.count=1
# The limits of runs (memory, pids, cpu), with every controller of a
# cgroup2 mounted for them alone. The OOM killer's reports of the memory
# test (a stack dump each) are what it asks for: they leave the log.
mkdir -p /data/tmp && mount -t cgroup2 cgroup2 /sys/fs/cgroup
dmesg -c > /data/klog
TMPDIR=/data/tmp BRANCHFS_TEST_BINARY=/bin/branchfs /tests/explore.test -test.v -test.count=1 -test.run '^TestLimits$|^TestLimitsBadInput$'
dmesg -c | awk '/invoked oom-killer/ { oom = 1 } !oom { print } /Killed process/ { oom = 0 }' >> /data/klog
umount /sys/fs/cgroup
if [ -x /tests/criu-test.sh ]; then
	echo "== checkpoint and restore"
	/tests/criu-test.sh
	[ ! -x /tests/criu-remote-test.sh ] || /tests/criu-remote-test.sh first
fi
if [ -x /tests/extra ]; then
	echo "== extra program"
	/tests/extra
	echo "== extra program exited $?"
fi
# The host fails the run on any BUG, WARNING, Oops, lockdep or KASAN
# report; quiet keeps most of them off the console, so print the log.
echo "== kernel log"
cat /data/klog
dmesg
echo "== kernel log end"
echo "== guest done"
branchfs unmount /work
branchfs unmount /lim
branchfs unmount /grp
poweroff -f
