/* SPDX-License-Identifier: MIT */
/*
 * branch.h - the branch() system call of prototype/patches, for C programs.
 *
 * long branch(int op, union branch_attr *attr, size_t size);
 *
 * The call is out of tree, so its number may mean something else on another
 * kernel. branch() below reads /sys/kernel/branch/ first and fails with
 * ENOSYS, calling nothing, when the kernel does not announce it under the
 * number and ABI this header speaks.
 */
#ifndef BRANCH_H
#define BRANCH_H

#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "branchfs.h"

#define __NR_branch		500	/* x86_64 */
#define BRANCH_ABI_VERSION	3
#define BRANCH_SYSFS		"/sys/kernel/branch"

#define BR_CREATE	1
#define BR_COMMIT	2
#define BR_ABORT	3

#define BR_FS		(1U << 0)	/* each child sees its branch at the mount point */
#define BR_MEMORY	(1U << 1)	/* reserved: EOPNOTSUPP */
#define BR_ISOLATE	(1U << 2)	/* siblings cannot signal, trace or renice each other */
#define BR_CLOSE_FDS	(1U << 3)	/* children start with fds 0, 1 and 2 only */

#define BR_NAME_MAX	256	/* a name of 1 to 254 bytes and its NUL */
#define BR_MAX_BRANCHES	64

/* Unused bytes must be zero. */
union branch_attr {
	struct {
		uint32_t flags;
		int32_t mount_fd;	/* root of a branchfs mount */
		uint32_t n_branches;	/* 1..BR_MAX_BRANCHES */
		uint32_t __pad;		/* 0 */
		uint64_t child_pids;	/* pid_t[n_branches] or 0 */
		uint64_t branch_names;	/* char[n_branches][BR_NAME_MAX] */
		uint64_t pidfds;	/* int[n_branches] or 0: O_CLOEXEC pidfds */
	} create;
	struct {
		uint32_t flags;		/* 0 */
		int32_t ctl_fd;		/* -1 */
	} commit;
	struct {
		uint32_t flags;		/* 0 */
		int32_t ctl_fd;		/* -1; the caller ends as if killed by SIGABRT */
	} abort;
};

static inline long branch_sysfs_int(const char *file)
{
	char buf[32];
	ssize_t n;
	int fd = open(file, O_RDONLY | O_CLOEXEC);

	if (fd < 0)
		return -1;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return -1;
	buf[n] = '\0';
	return strtol(buf, NULL, 10);
}

/* 0 when the running kernel has branch() as this header knows it. */
static inline int branch_available(void)
{
#if defined(__x86_64__)
	if (branch_sysfs_int(BRANCH_SYSFS "/abi_version") == BRANCH_ABI_VERSION &&
	    branch_sysfs_int(BRANCH_SYSFS "/syscall_nr") == __NR_branch)
		return 0;
#endif
	errno = ENOSYS;
	return -1;
}

static inline long branch(int op, union branch_attr *attr, size_t size)
{
	static int checked;	/* 1: available, -1: not */

	if (!checked)
		checked = branch_available() == 0 ? 1 : -1;
	if (checked < 0) {
		errno = ENOSYS;
		return -1;
	}
	return syscall(__NR_branch, op, attr, size);
}

#endif /* BRANCH_H */
