# Sourced by the checkpoint tests in the guest (criu-test.sh, and
# criu-remote-test.sh on the second boot): what CRIU and runs need.
mkdir -p /run && mount -t tmpfs run /run # CRIU caches its kernel probe in /run (per boot)
# A checkpoint freezes the run's cgroup first: runs need cgroup v2.
mkdir -p /sys/fs/cgroup
grep -q ' /sys/fs/cgroup cgroup2 ' /proc/mounts || mount -t cgroup2 none /sys/fs/cgroup
ip link set lo up 2>/dev/null
mkdir -p /dev/pts && mount -t devpts -o ptmxmode=0666 devpts /dev/pts # criu check opens /dev/ptmx
[ -e /dev/ptmx ] || ln -s pts/ptmx /dev/ptmx
