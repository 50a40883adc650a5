# Shell functions the measurement scripts beside it share (sourced, not
# run): the mounts they make, unmounted in reverse order, the fresh ext4
# file systems the tree workload needs, and a branch view to measure in.
# $bin is the branchfs binary, for unmount and mount_branch's default.

mounts=() # unmounted in reverse order by unmount_all

load() { cut -d' ' -f1 /proc/loadavg; }

unmount() { # MNT; branchfs's unmount waits for its daemon to end
	if grep -q " $1 fuse.branchfs " /proc/mounts; then "$bin" unmount "$1"; else umount "$1"; fi
}
unmount_last() {
	local m=${mounts[-1]}
	unset 'mounts[-1]'
	unmount "$m"
}
unmount_all() {
	local m
	while [ ${#mounts[@]} -gt 0 ]; do
		m=${mounts[-1]}
		unset 'mounts[-1]'
		unmount "$m" || umount -l "$m" || true
	done
}

# freshfs DIR: an ext4 file system of its own at DIR (a sparse image,
# loop-mounted and detached at unmount), so that no inode it allocates was
# freed recently (docs/performance.md, "How the bench measures").
freshfs() {
	mkdir -p "$1"
	truncate -s 8G "$1.img"
	mkfs.ext4 -q -F "$1.img"
	mount -o loop "$1.img" "$1"
	mounts+=("$1")
}

# mount_branch BASE STORE MNT [BINARY]: a branchfs mount with a branch b,
# whose view is MNT/@b; sets pid to the daemon's process ID.
mount_branch() {
	local b=${4:-$bin}
	mkdir -p "$1" "$3"
	"$b" mount --base "$1" --store "$2" "$3"
	mounts+=("$3")
	"$b" create b "$3" >/dev/null
	pid=$(ps -eo pid=,args= | awk -v m="$3" '$3 == "mount" && $NF == m {print $1}')
}
