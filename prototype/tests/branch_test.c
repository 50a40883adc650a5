// SPDX-License-Identifier: MIT
/*
 * branch_test - drives the branch() system call against a branchfs mount.
 *
 * Run inside the QEMU guest (qemu/init.sh): /work is a branchfs mount of
 * /base, /lim one of /base2 that allows at most two unfinished branches,
 * /grp one of /base3 whose control group is gid 65534.
 * Prints TAP (kselftest style) and "# BENCH" lines.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <linux/fuse.h>
#include <linux/ioprio.h>
#include <linux/magic.h>
#include <linux/perf_event.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <time.h>

#include "branch.h"

#define MNT "/work"
#define LIM "/lim"
#define GRP "/grp"

static int failures;

/* Memory the parent and the children share across fork. */
struct shared {
	volatile int step;
	volatile int done;
	volatile pid_t pids[BR_MAX_BRANCHES];
	volatile pid_t grandchild;
	volatile int err[8];
	volatile long ns[BR_MAX_BRANCHES];
	volatile char views[BR_MAX_BRANCHES][BR_NAME_MAX];
};

static struct shared *sh;

static int count_views(const char *mnt);
static int wait_views(const char *mnt, int want);

static void reset_shared(void)
{
	memset(sh, 0, sizeof(*sh));
}

/*
 * Output is TAP, as kselftest prints it: the plan, then one "ok N name" or
 * "not ok N name" per test, with "# " lines for what failed. A test calls
 * fail() for every check that fails and pass() when it got to the end;
 * it passes only when it did the second and never the first.
 */
static int test_failed, test_passed;

static int fail(const char *test, const char *fmt, ...)
{
	va_list ap;

	printf("# FAIL %s: ", test);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
	fflush(stdout);
	test_failed = 1;
	return -1;
}

static void pass(const char *test)
{
	(void)test;
	test_passed = 1;
}

static long now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

static long create(const char *mnt, unsigned int flags, unsigned int n,
		   pid_t *pids, char (*names)[BR_NAME_MAX])
{
	union branch_attr attr = { 0 };
	long r;
	int fd = open(mnt, O_RDONLY | O_DIRECTORY);

	if (fd < 0)
		return -1;
	attr.create.flags = flags;
	attr.create.mount_fd = fd;
	attr.create.n_branches = n;
	attr.create.child_pids = (uintptr_t)pids;
	attr.create.branch_names = (uintptr_t)names;
	r = branch(BR_CREATE, &attr, sizeof(attr));
	if (r != 0) {
		int e = errno;

		if (r > 0)
			return r;	/* the child keeps fd: harmless */
		close(fd);
		errno = e;
		return r;
	}
	close(fd);
	return 0;
}

static long commit(void)
{
	union branch_attr attr = { 0 };

	attr.commit.ctl_fd = -1;
	return branch(BR_COMMIT, &attr, sizeof(attr));
}

static long abort_self(void)
{
	union branch_attr attr = { 0 };

	attr.abort.ctl_fd = -1;
	return branch(BR_ABORT, &attr, sizeof(attr));
}

static int view_ioctl(const char *mnt, const char *name, unsigned long cmd, void *arg)
{
	char path[512];
	int fd, r;

	snprintf(path, sizeof(path), "%s/@%s", mnt, name);
	fd = open(path, O_RDONLY | O_DIRECTORY);
	if (fd < 0)
		return -1;
	r = ioctl(fd, cmd, arg);
	close(fd);
	return r;
}

static int abort_branch(const char *mnt, const char *name)
{
	return view_ioctl(mnt, name, FS_IOC_BRANCH_ABORT, NULL);
}

static int write_file(const char *path, const char *data)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	ssize_t n;

	if (fd < 0)
		return -1;
	n = write(fd, data, strlen(data));
	close(fd);
	return n == (ssize_t)strlen(data) ? 0 : -1;
}

static int read_file(const char *path, char *buf, size_t size)
{
	int fd = open(path, O_RDONLY);
	ssize_t n;

	if (fd < 0)
		return -1;
	n = read(fd, buf, size - 1);
	close(fd);
	if (n < 0)
		return -1;
	buf[n] = '\0';
	return 0;
}

static int exists(const char *path)
{
	struct stat st;

	return lstat(path, &st) == 0;
}

static void wait_step(int step)
{
	while (__atomic_load_n(&sh->step, __ATOMIC_ACQUIRE) < step)
		usleep(200);
}

static void set_step(int step)
{
	__atomic_store_n(&sh->step, step, __ATOMIC_RELEASE);
}

/* Kills and reaps children a failed test leaves, so that later tests start clean. */
static void reap(const pid_t *pids, int n)
{
	int i;

	for (i = 0; i < n; i++) {
		kill(pids[i], SIGKILL);
		waitpid(pids[i], NULL, __WALL);
	}
}

/* Waits, at most 20 s, until n children have counted themselves in done. */
static void wait_done(int n)
{
	long deadline = now_ns() + 20 * 1000000000L;

	while (__atomic_load_n(&sh->done, __ATOMIC_ACQUIRE) < n && now_ns() < deadline)
		usleep(200);
}

/* Waits for pid with a deadline; kills it when the deadline passes. */
static int wait_deadline(pid_t pid, int *status, int seconds)
{
	long deadline = now_ns() + seconds * 1000000000L;

	for (;;) {
		pid_t r = waitpid(pid, status, WNOHANG | __WALL);

		if (r == pid)
			return 0;
		if (r < 0)
			return -1;
		if (now_ns() > deadline) {
			kill(pid, SIGKILL);
			waitpid(pid, status, __WALL);
			errno = ETIMEDOUT;
			return -1;
		}
		usleep(1000);
	}
}

static int exited(int status, int code)
{
	return WIFEXITED(status) && WEXITSTATUS(status) == code;
}

static int killed(int status)
{
	return WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
}

/*
 * BR_CREATE with N children, each writing into its own branch via BR_FS;
 * once they are gone, without a commit, their branches are aborted.
 */
static void test_create(unsigned int n)
{
	char test[32], path[512], buf[64];
	pid_t pids[BR_MAX_BRANCHES];
	char names[BR_MAX_BRANCHES][BR_NAME_MAX];
	int before = count_views(MNT), status, left;
	long t0, r;
	unsigned int i, j;

	snprintf(test, sizeof(test), "create_n%u", n);
	reset_shared();
	t0 = now_ns();
	r = create(MNT, BR_FS, n, pids, names);
	if (r > 0) {
		snprintf(buf, sizeof(buf), "%ld", r);
		if (write_file(MNT "/child.txt", buf) < 0)
			_exit(1);
		__atomic_add_fetch(&sh->done, 1, __ATOMIC_RELEASE);
		for (;;)
			pause();
	}
	if (r < 0) {
		fail(test, "BR_CREATE: %s", strerror(errno));
		return;
	}
	printf("# BENCH create_n%u: %ld us\n", n, (now_ns() - t0) / 1000);
	wait_done(n);
	if (sh->done < (int)n) {
		fail(test, "%d of %u children wrote their file", sh->done, n);
		goto out;
	}
	for (i = 0; i < n; i++) {
		if (!names[i][0]) {
			fail(test, "no name for child %u", i + 1);
			goto out;
		}
		for (j = 0; j < i; j++)
			if (!strcmp(names[i], names[j])) {
				fail(test, "children %u and %u share branch %s", j + 1, i + 1, names[i]);
				goto out;
			}
		snprintf(path, sizeof(path), MNT "/@%s/child.txt", names[i]);
		if (read_file(path, buf, sizeof(buf)) < 0 || atoi(buf) != (int)i + 1) {
			fail(test, "%s: %s, want %u", path, strerror(errno), i + 1);
			goto out;
		}
	}
	if (exists(MNT "/child.txt")) {
		fail(test, "a child's write reached the base");
		goto out;
	}
out:
	for (i = 0; i < n; i++) {
		kill(pids[i], SIGKILL);
		if (waitpid(pids[i], &status, __WALL) != pids[i] || !killed(status))
			fail(test, "child %u (pid %d): status %#x", i + 1, pids[i], status);
	}
	left = wait_views(MNT, before);
	if (left != before)
		fail(test, "%d branches of exited children left, want %d", left, before);
	pass(test);
}

/* Three children commit at once: exactly one wins, the others lose. */
static void test_commit_race(int rounds)
{
	const char *test = "commit_race";
	pid_t pids[3];
	char names[3][BR_NAME_MAX], buf[16];
	int round, i;

	for (round = 0; round < rounds; round++) {
		int winners = 0, winner = 0, status;
		long r;

		reset_shared();
		r = create(MNT, BR_FS, 3, pids, names);
		if (r > 0) {
			snprintf(buf, sizeof(buf), "%ld", r);
			if (write_file(MNT "/winner.txt", buf) < 0)
				_exit(1);
			__atomic_add_fetch(&sh->done, 1, __ATOMIC_RELEASE);
			wait_step(1);
			if (commit() == 0)
				_exit(0);
			_exit(errno == ESTALE ? 3 : 4);
		}
		if (r < 0) {
			fail(test, "BR_CREATE: %s", strerror(errno));
			return;
		}
		/*
		 * Every child writes before any commits: a write after a
		 * sibling's commit fails with ESTALE before the kernel's kill
		 * reaches the writer.
		 */
		wait_done(3);
		set_step(1);
		for (i = 0; i < 3; i++) {
			if (wait_deadline(pids[i], &status, 20) < 0) {
				fail(test, "round %d: child %d hung", round, i + 1);
				return reap(pids + i + 1, 2 - i);
			}
			if (exited(status, 0)) {
				winners++;
				winner = i + 1;
			} else if (!exited(status, 3) && !killed(status)) {
				fail(test, "round %d: child %d ended with status %#x", round, i + 1, status);
				return reap(pids + i + 1, 2 - i);
			}
		}
		if (wait_views(MNT, 0) != 0) {
			fail(test, "round %d: %d branches left after the race", round, count_views(MNT));
			return;
		}
		if (winners != 1) {
			fail(test, "round %d: %d winners", round, winners);
			return;
		}
		if (read_file(MNT "/winner.txt", buf, sizeof(buf)) < 0 || atoi(buf) != winner) {
			fail(test, "round %d: base holds %s, winner was %d", round, buf, winner);
			return;
		}
	}
	unlink(MNT "/winner.txt");
	pass(test);
}

/*
 * BR_ABORT drops the branch at once, ends every other task of it, and
 * ends the caller as if killed by SIGABRT: not a success.
 */
static void test_abort(void)
{
	const char *test = "abort";
	char names[1][BR_NAME_MAX], path[512];
	pid_t pid;
	int status;
	long r;

	reset_shared();
	r = create(MNT, BR_FS, 1, &pid, names);
	if (r > 0) {
		pid_t g = fork();

		if (g == 0) {
			for (;;)
				pause();
		}
		sh->grandchild = g;
		if (write_file(MNT "/aborted.txt", "x") < 0)
			_exit(1);
		abort_self();
		_exit(5);	/* abort returned: it failed */
	}
	if (r < 0) {
		fail(test, "BR_CREATE: %s", strerror(errno));
		return;
	}
	if (wait_deadline(pid, &status, 20) < 0 || !WIFSIGNALED(status) || WTERMSIG(status) != SIGABRT) {
		fail(test, "child status %#x, want killed by SIGABRT from BR_ABORT", status);
		return;
	}
	snprintf(path, sizeof(path), MNT "/@%s", names[0]);
	if (exists(path))
		fail(test, "%s still exists", path);
	if (exists(MNT "/aborted.txt"))
		fail(test, "an aborted write reached the base");
	/* We are a subreaper: the orphaned grandchild is ours to reap. */
	if (!sh->grandchild || wait_deadline(sh->grandchild, &status, 10) < 0 || !killed(status))
		fail(test, "the aborted child's own child (pid %d) survived: status %#x", sh->grandchild, status);
	pass(test);
}

/* A child creates branches of its own branch; commits go one level up. */
static void test_nesting(void)
{
	const char *test = "nesting";
	char names[1][BR_NAME_MAX], buf[64];
	pid_t pid;
	int status;
	long r = create(MNT, BR_FS, 1, &pid, names);

	if (r > 0) {
		char inner[1][BR_NAME_MAX];
		pid_t gpid;
		long g = create(MNT, BR_FS, 1, &gpid, inner);

		if (g > 0) {
			if (write_file(MNT "/nested.txt", "level2") < 0)
				_exit(1);
			_exit(commit() == 0 ? 0 : 2);
		}
		if (g < 0)
			_exit(10);
		if (wait_deadline(gpid, &status, 20) < 0 || !exited(status, 0))
			_exit(11);
		/* committed into this branch, not yet into the base */
		if (read_file(MNT "/nested.txt", buf, sizeof(buf)) < 0 || strcmp(buf, "level2"))
			_exit(12);
		if (write_file(MNT "/level1.txt", "level1") < 0)
			_exit(13);
		_exit(commit() == 0 ? 0 : 14);
	}
	if (r < 0) {
		fail(test, "BR_CREATE: %s", strerror(errno));
		return;
	}
	if (wait_deadline(pid, &status, 30) < 0 || !exited(status, 0)) {
		fail(test, "level-1 child status %#x", status);
		abort_branch(MNT, names[0]);
		return;
	}
	if (read_file(MNT "/nested.txt", buf, sizeof(buf)) < 0 || strcmp(buf, "level2") ||
	    read_file(MNT "/level1.txt", buf, sizeof(buf)) < 0 || strcmp(buf, "level1")) {
		fail(test, "the base lacks the nested commit");
		return;
	}
	unlink(MNT "/nested.txt");
	unlink(MNT "/level1.txt");
	pass(test);
}

/* Siblings try to signal and trace each other. */
static void run_isolate(const char *test, unsigned int flags, int want_errno)
{
	char names[2][BR_NAME_MAX];
	pid_t pids[2];
	int status, i;
	long r;

	reset_shared();
	r = create(MNT, flags, 2, pids, names);
	if (r > 0) {
		int me = r - 1;
		pid_t sib;

		wait_step(1);
		sib = sh->pids[1 - me];
		sh->err[me * 3] = kill(sib, 0) == 0 ? 0 : errno;
		/* SEIZE does not stop the sibling, which may be tracing us;
		 * the trace ends when we exit.
		 */
		sh->err[me * 3 + 1] = ptrace(PTRACE_SEIZE, sib, 0, 0) == 0 ? 0 : errno;
		sh->err[me * 3 + 2] = kill(getppid(), 0) == 0 ? 0 : errno;
		__atomic_add_fetch(&sh->done, 1, __ATOMIC_ACQ_REL);
		while (__atomic_load_n(&sh->done, __ATOMIC_ACQUIRE) < 2)
			usleep(200);
		wait_step(2);
		_exit(0);
	}
	if (r < 0) {
		fail(test, "BR_CREATE: %s", strerror(errno));
		return;
	}
	sh->pids[0] = pids[0];
	sh->pids[1] = pids[1];
	set_step(1);
	while (__atomic_load_n(&sh->done, __ATOMIC_ACQUIRE) < 2)
		usleep(200);
	for (i = 0; i < 2; i++)
		if (kill(pids[i], 0) != 0)
			fail(test, "the parent cannot signal child %d: %s", i + 1, strerror(errno));
	set_step(2);
	for (i = 0; i < 2; i++)
		wait_deadline(pids[i], &status, 20);
	for (i = 0; i < 2; i++)
		abort_branch(MNT, names[i]);
	for (i = 0; i < 2; i++) {
		if (sh->err[i * 3] != want_errno)
			return (void)fail(test, "child %d: kill(sibling) gave %s", i + 1, strerror(sh->err[i * 3]));
		if (sh->err[i * 3 + 1] != want_errno)
			return (void)fail(test, "child %d: ptrace(sibling) gave %s", i + 1, strerror(sh->err[i * 3 + 1]));
		if (sh->err[i * 3 + 2] != 0)
			return (void)fail(test, "child %d: kill(parent) gave %s", i + 1, strerror(sh->err[i * 3 + 2]));
	}
	pass(test);
}

static void run_close_fds(const char *test, unsigned int flags, int want_open)
{
	char names[1][BR_NAME_MAX];
	pid_t pid;
	int status;
	long r;
	int fd = open("/dev/null", O_RDONLY);

	if (fd < 0 || dup2(fd, 9) < 0) {
		fail(test, "setup: %s", strerror(errno));
		return;
	}
	close(fd);
	r = create(MNT, flags, 1, &pid, names);
	if (r > 0) {
		int open9 = fcntl(9, F_GETFD) >= 0;
		int std = fcntl(0, F_GETFD) >= 0 && fcntl(1, F_GETFD) >= 0 && fcntl(2, F_GETFD) >= 0;

		_exit(!std ? 2 : open9 == want_open ? 0 : 1);
	}
	close(9);
	if (r < 0) {
		fail(test, "BR_CREATE: %s", strerror(errno));
		return;
	}
	wait_deadline(pid, &status, 20);
	abort_branch(MNT, names[0]);
	if (!exited(status, 0)) {
		fail(test, "child status %#x (1: fd 9 %s, 2: stdio closed)", status,
		     want_open ? "closed" : "still open");
		return;
	}
	pass(test);
}

/* A grandchild forked before the winning commit dies with its parent. */
static void test_grandchild_killed(void)
{
	const char *test = "grandchild_killed";
	char names[2][BR_NAME_MAX];
	pid_t pids[2];
	int status, i;
	long r;

	reset_shared();
	r = create(MNT, BR_FS, 2, pids, names);
	if (r == 1) {
		pid_t g = fork();

		if (g == 0) {
			for (;;)
				pause();
		}
		sh->grandchild = g;
		for (;;)
			pause();
	}
	if (r == 2) {
		while (!sh->grandchild)
			usleep(200);
		_exit(commit() == 0 ? 0 : 1);
	}
	if (r < 0) {
		fail(test, "BR_CREATE: %s", strerror(errno));
		return;
	}
	if (wait_deadline(pids[1], &status, 20) < 0 || !exited(status, 0)) {
		fail(test, "the committing child ended with %#x", status);
		kill(pids[0], SIGKILL);
		goto out;
	}
	if (wait_deadline(pids[0], &status, 10) < 0 || !killed(status)) {
		fail(test, "the losing child ended with %#x, want SIGKILL", status);
		goto out;
	}
	/* We are a subreaper: the orphaned grandchild is ours to reap. */
	if (wait_deadline(sh->grandchild, &status, 10) < 0 || !killed(status)) {
		fail(test, "the grandchild (pid %d) survived: status %#x", sh->grandchild, status);
		goto out;
	}
	pass(test);
out:
	for (i = 0; i < 2; i++)
		abort_branch(MNT, names[i]);
}

/* A commit the filesystem refuses declares no winner and kills nobody. */
static void test_failed_commit(void)
{
	const char *test = "failed_fs_commit";
	char names[2][BR_NAME_MAX], nested[BR_NAME_MAX] = "";
	pid_t pids[2];
	int status, alive;
	long r;

	reset_shared();
	r = create(MNT, BR_FS, 2, pids, names);
	if (r == 1) {
		wait_step(1);
		sh->err[0] = commit() == 0 ? 0 : errno;
		set_step(2);
		for (;;)
			pause();
	}
	if (r == 2) {
		wait_step(3);
		_exit(commit() == 0 ? 0 : 1);
	}
	if (r < 0) {
		fail(test, "BR_CREATE: %s", strerror(errno));
		return;
	}
	/* A live child branch makes the filesystem refuse child 1's commit. */
	if (view_ioctl(MNT, names[0], FS_IOC_BRANCH_CREATE, nested) < 0) {
		fail(test, "nested create: %s", strerror(errno));
		set_step(3);
		goto out;
	}
	set_step(1);
	wait_step(2);
	alive = kill(pids[0], 0) == 0 && kill(pids[1], 0) == 0;
	set_step(3);
	if (wait_deadline(pids[1], &status, 20) < 0 || !exited(status, 0)) {
		fail(test, "child 2 could not commit after child 1 failed: %#x", status);
		goto out;
	}
	wait_deadline(pids[0], &status, 10);
	if (sh->err[0] != EBUSY) {
		fail(test, "child 1's commit gave %s, want EBUSY", strerror(sh->err[0]));
		goto out;
	}
	if (!alive) {
		fail(test, "a sibling died after a failed commit");
		goto out;
	}
	if (!killed(status)) {
		fail(test, "child 1 survived child 2's commit: %#x", status);
		goto out;
	}
	pass(test);
out:
	kill(pids[0], SIGKILL);
	waitpid(pids[0], NULL, WNOHANG);
	if (nested[0])
		abort_branch(MNT, nested);
	abort_branch(MNT, names[0]);
	abort_branch(MNT, names[1]);
}

/*
 * Branches of the mount that are neither main nor committed, from the
 * control file's list: readdir does not show them.
 */
static int count_views(const char *mnt)
{
	static char buf[1 << 20];
	char path[512];
	const char *p;
	int n = 0;

	snprintf(path, sizeof(path), "%s/.branchfs_ctl", mnt);
	if (read_file(path, buf, sizeof(buf)) < 0)
		return -1;
	for (p = buf; (p = strstr(p, "\"state\": \"")); p++)
		if (strncmp(p + 10, "committed", 9))
			n++;
	return n - 1;	/* main */
}

/* Waits, at most 20 s, until mnt has want unfinished branches. */
static int wait_views(const char *mnt, int want)
{
	long deadline = now_ns() + 20 * 1000000000L;
	int n;

	while ((n = count_views(mnt)) != want && now_ns() < deadline)
		usleep(1000);
	return n;
}

/* The filesystem refuses the third of four branches: nothing stays. */
static void test_partial_failure(void)
{
	const char *test = "partial_failure";
	char names[4][BR_NAME_MAX], path[512];
	pid_t pids[4];
	int before = count_views(LIM), i, status;
	long r;

	memset(names, 0, sizeof(names));
	r = create(LIM, BR_FS | BR_CLOSE_FDS, 4, pids, names);
	if (r > 0)
		_exit(0);
	if (r == 0) {
		fail(test, "BR_CREATE of 4 under a limit of 2 succeeded");
		return;
	}
	if (errno != ENOSPC) {
		fail(test, "BR_CREATE gave %s, want ENOSPC", strerror(errno));
		return;
	}
	if (waitpid(-1, &status, WNOHANG | __WALL) != -1 || errno != ECHILD) {
		fail(test, "a child was left behind");
		return;
	}
	for (i = 0; i < 4; i++) {
		if (pids[i] != 0)
			return (void)fail(test, "pid %d reported for a child that does not exist", pids[i]);
		snprintf(path, sizeof(path), LIM "/@%s", names[i]);
		if (names[i][0] && exists(path))
			return (void)fail(test, "branch %s was left behind", names[i]);
	}
	if (count_views(LIM) != before)
		return (void)fail(test, "branches left behind: %d before, %d after", before, count_views(LIM));
	/* Nothing holds the limit: two branches still fit. */
	r = create(LIM, BR_FS, 2, pids, names);
	if (r > 0)
		_exit(0);
	if (r < 0)
		return (void)fail(test, "BR_CREATE of 2 after the failure: %s", strerror(errno));
	for (i = 0; i < 2; i++)
		wait_deadline(pids[i], &status, 20);
	if (wait_views(LIM, before) != before)
		return (void)fail(test, "the exited children's branches stay");
	pass(test);
}

static void expect_errno(const char *test, long r, int want, const char *what)
{
	if (r > 0)
		_exit(0);	/* a child of a call that should have failed */
	if (r == 0 || errno != want)
		fail(test, "%s: got %ld (%s), want %s", what, r, r ? strerror(errno) : "success", strerror(want));
}

static void test_bad_input(void)
{
	const char *test = "bad_input";
	int fd = open(MNT, O_RDONLY | O_DIRECTORY), sub;
	char names[2][BR_NAME_MAX];
	pid_t pids[2];
	union branch_attr attr;
	unsigned char big[sizeof(attr) + 16];

	mkdir(MNT "/subdir", 0755);
	sub = open(MNT "/subdir", O_RDONLY | O_DIRECTORY);

	expect_errno(test, branch(99, &attr, sizeof(attr)), EINVAL, "bad op");
	expect_errno(test, syscall(__NR_branch, BR_CREATE, (void *)8, sizeof(attr)), EFAULT, "bad attr pointer");

	memset(&attr, 0, sizeof(attr));
	attr.create.mount_fd = fd;
	attr.create.n_branches = 1;
	attr.create.branch_names = (uintptr_t)names;
	attr.create.child_pids = (uintptr_t)pids;
	attr.create.flags = 1U << 9;
	expect_errno(test, branch(BR_CREATE, &attr, sizeof(attr)), EINVAL, "bad flags");
	attr.create.flags = BR_MEMORY;
	expect_errno(test, branch(BR_CREATE, &attr, sizeof(attr)), EOPNOTSUPP, "BR_MEMORY");
	attr.create.flags = 0;
	attr.create.n_branches = 0;
	expect_errno(test, branch(BR_CREATE, &attr, sizeof(attr)), EINVAL, "n_branches 0");
	attr.create.n_branches = BR_MAX_BRANCHES + 1;
	expect_errno(test, branch(BR_CREATE, &attr, sizeof(attr)), EINVAL, "n_branches 65");
	attr.create.n_branches = 1;
	attr.create.branch_names = 0;
	expect_errno(test, branch(BR_CREATE, &attr, sizeof(attr)), EINVAL, "no names buffer");
	attr.create.branch_names = 16;
	expect_errno(test, branch(BR_CREATE, &attr, sizeof(attr)), EFAULT, "bad names pointer");
	attr.create.branch_names = (uintptr_t)names;
	attr.create.child_pids = 16;
	expect_errno(test, branch(BR_CREATE, &attr, sizeof(attr)), EFAULT, "bad pids pointer");
	attr.create.child_pids = (uintptr_t)pids;
	attr.create.mount_fd = -1;
	expect_errno(test, branch(BR_CREATE, &attr, sizeof(attr)), EBADF, "bad mount fd");
	attr.create.mount_fd = sub;
	expect_errno(test, branch(BR_CREATE, &attr, sizeof(attr)), EINVAL, "fd not a mount root");
	attr.create.mount_fd = fd;

	/* Bigger than the kernel knows: a zero tail is fine, any other E2BIG. */
	memset(big, 0, sizeof(big));
	attr.create.n_branches = 0;	/* so that a passing size check stops at EINVAL */
	memcpy(big, &attr, sizeof(attr));
	expect_errno(test, branch(BR_CREATE, (void *)big, sizeof(big)), EINVAL, "bigger attr, zero tail");
	big[sizeof(attr) + 3] = 1;
	expect_errno(test, branch(BR_CREATE, (void *)big, sizeof(big)), E2BIG, "bigger attr, non-zero tail");

	memset(&attr, 0, sizeof(attr));
	expect_errno(test, branch(BR_COMMIT, &attr, sizeof(attr)), EINVAL, "commit outside a branch");
	expect_errno(test, branch(BR_ABORT, &attr, sizeof(attr)), EINVAL, "abort outside a branch");
	attr.commit.flags = 1;
	expect_errno(test, branch(BR_COMMIT, &attr, sizeof(attr)), EINVAL, "commit flags");

	if (count_views(MNT) != 0)
		fail(test, "failed calls left %d branches", count_views(MNT));
	/* The op first: a bad op with a bad pointer is EINVAL. */
	expect_errno(test, syscall(__NR_branch, 99, (void *)8, sizeof(attr)), EINVAL, "bad op, bad pointer");

	close(sub);
	close(fd);
	rmdir(MNT "/subdir");
	pass(test);
}

/* ---- the fixes of issue 30; each of these failed on the first series ---- */

static long create_attr(union branch_attr *attr)
{
	return branch(BR_CREATE, attr, sizeof(*attr));
}

static volatile int reaper_stop;
static volatile int reaped_n;
static pid_t reaped[4096];

/* Another thread of the caller, reaping whatever child it sees. */
static void *reaper(void *arg)
{
	(void)arg;
	while (!reaper_stop) {
		int st;
		pid_t p = waitpid(-1, &st, __WALL | WNOHANG);

		if (p > 0 && reaped_n < 4096)
			reaped[reaped_n++] = p;
	}
	return NULL;
}

static void on_alarm(int sig)
{
	(void)sig;
}

/*
 * BR_CREATE under a 300 us timer, with another thread reaping any child:
 * every child the kernel made is one whose pid was returned, and no
 * branch stays once they exited.
 */
static void test_signals_create(void)
{
	const char *test = "signals_during_create";
	static pid_t returned[4096];
	struct itimerval it = { { 0, 300 }, { 0, 300 } };
	struct sigaction sa = { 0 };
	int nret = 0, i, j, fails = 0, st;
	pthread_t th;
	pid_t p;

	sa.sa_handler = on_alarm;
	sa.sa_flags = SA_RESTART;
	sigaction(SIGALRM, &sa, NULL);
	reaper_stop = 0;
	reaped_n = 0;
	pthread_create(&th, NULL, reaper, NULL);
	setitimer(ITIMER_REAL, &it, NULL);
	for (i = 0; i < 10; i++) {
		pid_t pids[8];
		char names[8][BR_NAME_MAX];
		long r = create(MNT, BR_FS, 8, pids, names);

		if (r > 0)
			_exit(0);
		if (r < 0) {
			fails++;
			continue;
		}
		for (j = 0; j < 8; j++)
			returned[nret++] = pids[j];
	}
	for (i = 0; i < 10; i++) {
		pid_t pids[4];
		char names[4][BR_NAME_MAX];
		long r = create(LIM, BR_FS, 4, pids, names);

		if (r > 0)
			_exit(0);
		if (r == 0)
			fail(test, "4 branches under a limit of 2");
	}
	memset(&it, 0, sizeof(it));
	setitimer(ITIMER_REAL, &it, NULL);
	/* Everything returned exits at once: reap until nothing is left. */
	for (long deadline = now_ns() + 20 * 1000000000L; now_ns() < deadline;) {
		int got = 0;

		for (i = 0; i < reaped_n; i++)
			for (j = 0; j < nret; j++)
				if (reaped[i] == returned[j])
					got++;
		if (got == nret || reaped_n >= nret + 64)
			break;
		usleep(1000);
	}
	reaper_stop = 1;
	pthread_join(th, NULL);
	while ((p = waitpid(-1, &st, __WALL | WNOHANG)) > 0)
		reaped[reaped_n++] = p;
	for (i = 0; i < reaped_n; i++) {
		for (j = 0; j < nret && reaped[i] != returned[j]; j++)
			;
		if (j == nret) {
			fail(test, "pid %d was reaped but never returned by BR_CREATE", reaped[i]);
			break;
		}
	}
	if (reaped_n != nret)
		fail(test, "%d children reaped, %d returned (%d calls failed)", reaped_n, nret, fails);
	if (fails)
		fail(test, "%d of 10 creates failed under the timer", fails);
	if (wait_views(MNT, 0) || wait_views(LIM, 0))
		fail(test, "branches left: %d in %s, %d in %s", count_views(MNT), MNT, count_views(LIM), LIM);
	signal(SIGALRM, SIG_DFL);
	pass(test);
}

static volatile int scribble_stop;
static char (*scribble_names)[BR_NAME_MAX];
static char scribble_with[BR_NAME_MAX];

static void *scribbler(void *arg)
{
	(void)arg;
	while (!scribble_stop) {
		int i;

		for (i = 0; i < 8; i++)
			memcpy(scribble_names[i], scribble_with, BR_NAME_MAX);
	}
	return NULL;
}

/* Which view the calling child sees at MNT, from the control file. */
static void my_view(char *out)
{
	static char buf[1 << 20];
	char *p, *e;

	out[0] = '\0';
	if (read_file(MNT "/.branchfs_ctl", buf, sizeof(buf)) < 0)
		return;
	p = strstr(buf, "\"view\": \"");
	if (!p)
		return;
	p += 9;
	e = strchr(p, '"');
	if (!e || e - p >= BR_NAME_MAX)
		return;
	memcpy(out, p, e - p);
	out[e - p] = '\0';
}

/*
 * Another thread writes the name of a decoy branch over the names buffer
 * while BR_CREATE runs: every child still comes up in its own branch.
 */
static void test_names_copied(void)
{
	const char *test = "names_copied_once";
	static char names[8][BR_NAME_MAX];
	int fd = open(MNT, O_RDONLY | O_DIRECTORY), round, i, j, st;
	pthread_t th;
	pid_t pids[8];

	memset(scribble_with, 0, sizeof(scribble_with));
	if (fd < 0 || ioctl(fd, FS_IOC_BRANCH_CREATE, scribble_with) < 0) {
		fail(test, "decoy: %s", strerror(errno));
		return;
	}
	close(fd);
	scribble_names = names;
	scribble_stop = 0;
	pthread_create(&th, NULL, scribbler, NULL);
	for (round = 0; round < 4; round++) {
		long r;

		reset_shared();
		r = create(MNT, BR_FS, 8, pids, names);
		if (r > 0) {
			char v[BR_NAME_MAX];

			my_view(v);
			memcpy((char *)sh->views[r - 1], v, BR_NAME_MAX);
			_exit(0);
		}
		if (r < 0) {
			fail(test, "round %d: BR_CREATE: %s", round, strerror(errno));
			continue;
		}
		for (i = 0; i < 8; i++)
			waitpid(pids[i], &st, __WALL);
		for (i = 0; i < 8; i++) {
			const char *v = (const char *)sh->views[i];

			if (!v[0] || !strcmp(v, "main") || !strcmp(v, scribble_with))
				fail(test, "round %d: child %d came up in view \"%s\"", round, i + 1, v);
			for (j = 0; j < i; j++)
				if (!strcmp(v, (const char *)sh->views[j]))
					fail(test, "round %d: children %d and %d share view %s", round, j + 1, i + 1, v);
		}
	}
	scribble_stop = 1;
	pthread_join(th, NULL);
	abort_branch(MNT, scribble_with);
	if (wait_views(MNT, 0))
		fail(test, "%d branches left", count_views(MNT));
	pass(test);
}

/* A mount of one view reaches no other branch through branch(). */
static void test_confined_view(void)
{
	const char *test = "confined_view";
	char name[BR_NAME_MAX] = "", src[512], names[1][BR_NAME_MAX];
	int fd = open(MNT, O_RDONLY | O_DIRECTORY);
	pid_t pid;
	long r;

	if (fd < 0 || ioctl(fd, FS_IOC_BRANCH_CREATE, name) < 0) {
		fail(test, "create: %s", strerror(errno));
		return;
	}
	close(fd);
	snprintf(src, sizeof(src), MNT "/@%s", name);
	mkdir("/tmp/confined", 0755);
	if (mount(src, "/tmp/confined", NULL, MS_BIND, NULL) < 0) {
		fail(test, "bind: %s", strerror(errno));
		goto out;
	}
	r = create("/tmp/confined", 0, 1, &pid, names);
	if (r > 0)
		_exit(0);
	if (r == 0) {
		waitpid(pid, NULL, 0);
		fail(test, "BR_CREATE on a bind mount of one view succeeded");
	} else if (errno != EXDEV) {
		fail(test, "BR_CREATE on a bind mount of one view: %s, want EXDEV", strerror(errno));
	}
	umount("/tmp/confined");
out:
	abort_branch(MNT, name);
	if (wait_views(MNT, 0))
		fail(test, "%d branches left", count_views(MNT));
	pass(test);
}

/* Callers SIGKILLed in the middle of BR_CREATE leave no branch. */
static void test_caller_killed(void)
{
	const char *test = "caller_killed";
	int k, st;
	pid_t p;

	for (k = 0; k < 8; k++) {
		pid_t helper;

		reset_shared();
		helper = fork();
		if (helper == 0) {
			for (;;) {
				pid_t pids[8];
				char names[8][BR_NAME_MAX];
				long r;

				__atomic_add_fetch(&sh->done, 1, __ATOMIC_RELEASE);
				r = create(MNT, BR_FS, 8, pids, names);
				if (r > 0)
					_exit(0);
			}
		}
		while (__atomic_load_n(&sh->done, __ATOMIC_ACQUIRE) < 1 + k % 3)
			usleep(100);
		/* A varying point of the call, not a wait for anything. */
		usleep(700 * k);
		kill(helper, SIGKILL);
		waitpid(helper, &st, 0);
	}
	/* Orphans come to us, the subreaper; they exit at once. */
	for (long deadline = now_ns() + 20 * 1000000000L; now_ns() < deadline;) {
		p = waitpid(-1, &st, __WALL | WNOHANG);
		if (p < 0)
			break;
		if (p == 0)
			usleep(1000);
	}
	if (waitpid(-1, &st, __WALL | WNOHANG) >= 0)
		fail(test, "children of the killed callers still run");
	if (wait_views(MNT, 0))
		fail(test, "%d branches left after 8 killed callers", count_views(MNT));
	pass(test);
}

/*
 * A sibling tries SIGIO with F_SETSIG SIGKILL, prlimit, setpriority,
 * sched_setscheduler, oom_score_adj, sched_setaffinity, timerslack_ns and
 * ioprio_set on the other: all refused under BR_ISOLATE, all allowed
 * without.
 */
static void run_fence(const char *test, unsigned int flags, int want)
{
	char names[2][BR_NAME_MAX];
	pid_t pids[2];
	int status[2], i;
	long r;

	reset_shared();
	r = create(MNT, flags, 2, pids, names);
	if (r == 1) {
		pid_t sib;
		int pfd[2], n = 0;
		struct rlimit rl = { 1 << 20, 1 << 20 };
		struct sched_param sp = { 0 };
		cpu_set_t cpus;
		char path[64];

		wait_step(1);
		sib = sh->pids[1];
		sh->err[n++] = prlimit(sib, RLIMIT_FSIZE, &rl, NULL) ? errno : 0;
		sh->err[n++] = setpriority(PRIO_PROCESS, sib, 5) ? errno : 0;
		sh->err[n++] = sched_setscheduler(sib, SCHED_BATCH, &sp) ? errno : 0;
		snprintf(path, sizeof(path), "/proc/%d/oom_score_adj", sib);
		sh->err[n++] = write_file(path, "500") ? errno : 0;
		CPU_ZERO(&cpus);
		CPU_SET(0, &cpus);
		sh->err[n++] = sched_setaffinity(sib, sizeof(cpus), &cpus) ? errno : 0;
		snprintf(path, sizeof(path), "/proc/%d/timerslack_ns", sib);
		sh->err[n++] = write_file(path, "1000") ? errno : 0;
		sh->err[n++] = syscall(SYS_ioprio_set, IOPRIO_WHO_PROCESS, sib,
				       IOPRIO_PRIO_VALUE(IOPRIO_CLASS_BE, 4)) ? errno : 0;
		/* Last: it kills the sibling when allowed. */
		if (pipe(pfd) || fcntl(pfd[0], F_SETOWN, sib) || fcntl(pfd[0], F_SETSIG, SIGKILL) ||
		    fcntl(pfd[0], F_SETFL, O_ASYNC) || write(pfd[1], "x", 1) != 1)
			_exit(9);
		set_step(2);
		_exit(0);
	}
	if (r == 2) {
		struct rlimit rl;

		wait_step(2);
		getrlimit(RLIMIT_FSIZE, &rl);
		_exit(rl.rlim_cur == RLIM_INFINITY ? 0 : 1);
	}
	if (r < 0) {
		fail(test, "BR_CREATE: %s", strerror(errno));
		return;
	}
	sh->pids[0] = pids[0];
	sh->pids[1] = pids[1];
	set_step(1);
	for (i = 0; i < 2; i++)
		if (wait_deadline(pids[i], &status[i], 20) < 0)
			fail(test, "child %d hung", i + 1);
	if (!exited(status[0], 0))
		fail(test, "the acting child ended with %#x", status[0]);
	for (i = 0; i < 7; i++) {
		static const char *what[] = { "prlimit", "setpriority", "sched_setscheduler", "oom_score_adj",
					      "sched_setaffinity", "timerslack_ns", "ioprio_set" };

		if (sh->err[i] != want)
			fail(test, "%s(sibling) gave %s, want %s", what[i], strerror(sh->err[i]), strerror(want));
	}
	if (want && !exited(status[1], 0))
		fail(test, "the fenced sibling ended with %#x (SIGIO got through?)", status[1]);
	if (!want && !killed(status[1]))
		fail(test, "without BR_ISOLATE, F_SETSIG SIGKILL did not reach the sibling: %#x", status[1]);
	pass(test);
}

/* BR_FS moves a working directory, root and descriptors inside the mount. */
static void test_fs_rebase(void)
{
	const char *test = "fs_rebase";
	int status;
	pid_t helper;

	/* The base takes writes once the branches of earlier tests are gone. */
	wait_views(MNT, 0);
	if ((mkdir(MNT "/sub", 0755) && errno != EEXIST) || write_file(MNT "/sub/f.txt", "")) {
		fail(test, "setup: %s", strerror(errno));
		return;
	}
	helper = fork();
	if (helper == 0) {
		char names[2][BR_NAME_MAX];
		pid_t pids[2];
		int fd = open(MNT "/sub/f.txt", O_WRONLY), dfd = open(MNT "/sub", O_RDONLY | O_DIRECTORY);
		int mfd = open(MNT, O_RDONLY | O_DIRECTORY), i, st[2];
		union branch_attr attr = { 0 };
		char buf[16];
		long r;

		if (fd < 0 || dfd < 0 || mfd < 0 || chdir(MNT "/sub")) {
			printf("# fs_rebase: setup: fd %d dfd %d mfd %d: %s\n", fd, dfd, mfd, strerror(errno));
			_exit(20);
		}
		/* child 1: cwd and descriptors; child 2 of a second call: a root inside */
		r = create(MNT, BR_FS, 1, pids, names);
		if (r > 0) {
			int afd;

			if (write_file("rel.txt", "rel") < 0)
				_exit(1);
			if (write(fd, "fd", 2) != 2)
				_exit(2);
			afd = openat(dfd, "at.txt", O_WRONLY | O_CREAT, 0644);
			if (afd < 0)
				_exit(3);
			close(afd);
			if (read_file(MNT "/sub/f.txt", buf, sizeof(buf)) || strcmp(buf, "fd"))
				_exit(4);
			if (!exists(MNT "/sub/rel.txt") || !exists(MNT "/sub/at.txt"))
				_exit(5);
			_exit(0);
		}
		if (r < 0)
			_exit(21);
		waitpid(pids[0], &st[0], 0);
		if (chroot(MNT "/sub"))
			_exit(22);
		attr.create.flags = BR_FS;
		attr.create.mount_fd = mfd;
		attr.create.n_branches = 1;
		attr.create.child_pids = (uintptr_t)&pids[1];
		attr.create.branch_names = (uintptr_t)&names[1];
		r = create_attr(&attr);
		if (r > 0)
			_exit(write_file("/root.txt", "root") ? 6 : 0);
		if (r < 0)
			_exit(23);
		waitpid(pids[1], &st[1], 0);
		for (i = 0; i < 2; i++)
			if (!exited(st[i], 0))
				_exit(30 + WEXITSTATUS(st[i]) + 10 * i);
		_exit(0);
	}
	if (wait_deadline(helper, &status, 30) < 0 || !exited(status, 0))
		fail(test, "helper status %#x (exit 31..: cwd/fd child failed at step N-30; 4x: root child)", status);
	if (exists(MNT "/sub/rel.txt") || exists(MNT "/sub/at.txt") || exists(MNT "/sub/root.txt"))
		fail(test, "a child's write reached the base");
	{
		char buf[16];

		if (read_file(MNT "/sub/f.txt", buf, sizeof(buf)) || buf[0])
			fail(test, "a write through an inherited descriptor reached the base");
	}
	unlink(MNT "/sub/f.txt");
	rmdir(MNT "/sub");
	if (wait_views(MNT, 0))
		fail(test, "%d branches left", count_views(MNT));
	pass(test);
}

/*
 * Waits for the tracee pid, stopped by its raise(SIGSTOP) after
 * PTRACE_TRACEME, and lets it go on with its forks traced (children are
 * attached and stop with SIGSTOP first).
 */
static int trace_forks(const char *test, pid_t pid)
{
	int st;

	if (waitpid(pid, &st, 0) != pid || !WIFSTOPPED(st)) {
		fail(test, "tracee did not stop: %#x", st);
		return -1;
	}
	ptrace(PTRACE_SETOPTIONS, pid, 0, PTRACE_O_TRACEFORK);
	ptrace(PTRACE_CONT, pid, 0, 0);
	return 0;
}

/* A stop at a PTRACE_EVENT_FORK. */
static int fork_event(int st)
{
	return st >> 8 == (SIGTRAP | (PTRACE_EVENT_FORK << 8));
}

/*
 * The signal a tracee stopped with, to deliver as it goes on, as it would
 * be untraced: none for a child's attach stop and for event stops.
 */
static int signal_to_pass(int st)
{
	return WSTOPSIG(st) == SIGSTOP || WSTOPSIG(st) == SIGTRAP ? 0 : WSTOPSIG(st);
}

/*
 * The tracer of a caller of branch() that trace_forks() let go, and of the
 * children it forks: what a test does besides letting every stop go on.
 */
struct tracer {
	const char *test;
	pid_t caller;
	long deadline;		/* now_ns() by which the caller must have ended */
	/*
	 * Optional: at the caller's first fork event, while the caller is
	 * held there, so that the call's verdict cannot come meanwhile.
	 */
	void (*first_fork)(struct tracer *t);
	/*
	 * Optional: at the end of any other child of the tracer; with it,
	 * trace_caller() waits for all of them, so that none ends unjudged.
	 */
	void (*other_ended)(struct tracer *t, int st);
	void *ctx;		/* for the callbacks */
	int forks;		/* the caller's fork events */
	int attached;		/* children's attach stops */
};

/*
 * Lets the caller and its traced children go on from every stop, each with
 * the signal it stopped with (signal_to_pass()), until the caller ends. Returns the caller's
 * wait status, or -1 (a failure) if it had not ended by the deadline: it
 * is killed then, to meet no later test. It polls so that the deadline
 * holds even when nothing stops or ends.
 */
static int trace_caller(struct tracer *t)
{
	int st, caller_st = -1;
	pid_t w;

	while ((w = waitpid(-1, &st, __WALL | WNOHANG)) >= 0) {
		if (w == 0) {
			if (now_ns() >= t->deadline)
				break;
			usleep(1000);
		} else if (WIFEXITED(st) || WIFSIGNALED(st)) {
			if (w != t->caller) {
				if (t->other_ended)
					t->other_ended(t, st);
			} else {
				caller_st = st;
				if (!t->other_ended)
					break;
			}
		} else if (WIFSTOPPED(st)) {
			if (w == t->caller && fork_event(st)) {
				if (!t->forks++ && t->first_fork)
					t->first_fork(t);
			} else if (w != t->caller && WSTOPSIG(st) == SIGSTOP) {
				t->attached++;
			}
			ptrace(PTRACE_CONT, w, 0, signal_to_pass(st));
		}
	}
	if (caller_st == -1) {
		if (w)
			fail(t->test, "waitpid: %s", strerror(errno));
		else
			fail(t->test, "the caller had not ended by the deadline");
		kill(t->caller, SIGKILL);
		waitpid(t->caller, NULL, __WALL);
	}
	return caller_st;
}

/* strace -f sees the children: PTRACE_EVENT_FORK and auto-attach. */
static void test_traced(void)
{
	const char *test = "traced_fork_events";
	struct tracer t = { .test = test, .deadline = now_ns() + 20 * 1000000000L };
	int st;
	pid_t pid = fork();

	if (pid == 0) {
		pid_t pids[2];
		char names[2][BR_NAME_MAX];
		long r;

		ptrace(PTRACE_TRACEME, 0, 0, 0);
		raise(SIGSTOP);
		r = create(MNT, BR_FS, 2, pids, names);
		if (r > 0)
			_exit(0);
		if (r < 0)
			_exit(1);
		waitpid(pids[0], NULL, 0);
		waitpid(pids[1], NULL, 0);
		_exit(0);
	}
	if (trace_forks(test, pid))
		return;
	t.caller = pid;
	st = trace_caller(&t);
	if (st != -1 && !exited(st, 0))
		fail(test, "tracee ended with %#x", st);
	if (t.forks != 2 || t.attached != 2)
		fail(test, "%d PTRACE_EVENT_FORK stops and %d auto-attached children, want 2 and 2",
		     t.forks, t.attached);
	while (waitpid(-1, &st, __WALL | WNOHANG) > 0)
		;
	if (wait_views(MNT, 0))
		fail(test, "%d branches left", count_views(MNT));
	pass(test);
}

/* pidfds come back; ctl_fd must be -1 and unused bytes zero, in a branch too. */
static void test_pidfds_and_attr(void)
{
	const char *test = "pidfds_and_attr";
	union branch_attr attr = { 0 };
	char names[2][BR_NAME_MAX];
	pid_t pids[2];
	int pidfds[2] = { -1, -1 }, i;
	int fd = open(MNT, O_RDONLY | O_DIRECTORY);
	long r;

	attr.create.flags = BR_FS;
	attr.create.mount_fd = fd;
	attr.create.n_branches = 2;
	attr.create.child_pids = (uintptr_t)pids;
	attr.create.branch_names = (uintptr_t)names;
	attr.create.pidfds = (uintptr_t)pidfds;
	r = create_attr(&attr);
	if (r > 0) {
		union branch_attr c = { 0 };
		int code = 0;

		c.commit.ctl_fd = 5;
		if (branch(BR_COMMIT, &c, sizeof(c)) == 0 || errno != EINVAL)
			code |= 1;
		c.commit.ctl_fd = -1;
		((unsigned char *)&c)[20] = 1;
		if (branch(BR_COMMIT, &c, sizeof(c)) == 0 || errno != EINVAL)
			code |= 2;
		if (branch(BR_ABORT, &c, sizeof(c)) == 0 || errno != EINVAL)
			code |= 4;
		_exit(code ? code : 40 + r);
	}
	close(fd);
	if (r < 0) {
		fail(test, "BR_CREATE: %s", strerror(errno));
		return;
	}
	for (i = 0; i < 2; i++) {
		siginfo_t si = { 0 };

		if (pidfds[i] < 0 || (fcntl(pidfds[i], F_GETFD) & FD_CLOEXEC) == 0) {
			fail(test, "pidfd %d: %d, not an O_CLOEXEC descriptor", i + 1, pidfds[i]);
			reap(pids + i, 1);
			continue;
		}
		if (syscall(SYS_waitid, P_PIDFD, pidfds[i], &si, WEXITED, NULL) < 0)
			fail(test, "waitid(P_PIDFD) %d: %s", i + 1, strerror(errno));
		else if (si.si_pid != pids[i] || si.si_status != 41 + i)
			fail(test, "child %d: pid %d status %d (1: ctl_fd 5, 2/4: unused bytes accepted)",
			     i + 1, si.si_pid, si.si_status);
		close(pidfds[i]);
	}
	if (wait_views(MNT, 0))
		fail(test, "%d branches left", count_views(MNT));
	pass(test);
}

/* /proc/sys/user/max_branches caps the branches of a user. */
static void test_limits(void)
{
	const char *test = "limits";
	char old[32], names[3][BR_NAME_MAX];
	pid_t pids[3];
	long r;

	if (read_file("/proc/sys/user/max_branches", old, sizeof(old)) < 0) {
		fail(test, "/proc/sys/user/max_branches: %s", strerror(errno));
		return;
	}
	write_file("/proc/sys/user/max_branches", "2");
	r = create(MNT, 0, 3, pids, names);
	if (r > 0)
		_exit(0);
	if (r == 0)
		fail(test, "3 branches under max_branches 2");
	else if (errno != EAGAIN)
		fail(test, "got %s, want EAGAIN", strerror(errno));
	r = create(MNT, 0, 2, pids, names);
	if (r > 0)
		_exit(0);
	if (r < 0)
		fail(test, "2 branches under max_branches 2: %s", strerror(errno));
	else
		reap(pids, 2);
	write_file("/proc/sys/user/max_branches", old);
	if (wait_views(MNT, 0))
		fail(test, "%d branches left", count_views(MNT));
	pass(test);
}

/*
 * RLIMIT_NPROC counts all N children before any branch is made, for a
 * user it applies to (root is exempt): with one process and a limit of
 * two, two children are refused with EAGAIN, one is not (the call then
 * fails on the control file, which only the daemon's user may open).
 */
static void test_nproc_unprivileged(void)
{
	const char *test = "nproc_unprivileged";
	int status;
	pid_t helper = fork();

	if (helper == 0) {
		struct rlimit rl = { 2, 2 };
		union branch_attr attr = { 0 };
		char names[2][BR_NAME_MAX];
		int mfd = open(MNT, O_RDONLY | O_DIRECTORY);
		long r;

		if (mfd < 0 || setrlimit(RLIMIT_NPROC, &rl) || setgroups(0, NULL) ||
		    setresgid(65534, 65534, 65534) || setresuid(65534, 65534, 65534))
			_exit(20);
		attr.create.mount_fd = mfd;
		attr.create.n_branches = 2;
		attr.create.branch_names = (uintptr_t)names;
		r = create_attr(&attr);
		if (r > 0)
			_exit(0);
		if (r == 0 || errno != EAGAIN) {
			printf("# %s: 2 children over RLIMIT_NPROC 2 as uid 65534: %ld %s\n", test, r, strerror(errno));
			_exit(1);
		}
		attr.create.n_branches = 1;
		r = create_attr(&attr);
		if (r > 0)
			_exit(0);
		if (r == 0 || errno == EAGAIN) {
			printf("# %s: 1 child under RLIMIT_NPROC 2 as uid 65534: %ld %s\n", test, r, strerror(errno));
			_exit(2);
		}
		_exit(0);
	}
	if (wait_deadline(helper, &status, 20) < 0 || !exited(status, 0))
		fail(test, "helper status %#x (1: not refused, 2: refused under the limit, 20: setup)", status);
	if (wait_views(MNT, 0))
		fail(test, "%d branches left", count_views(MNT));
	pass(test);
}

/* perf sees the children as it sees fork()'s: a fork record each. */
static void test_perf_fork(void)
{
	const char *test = "perf_fork_records";
	struct perf_event_attr pa = { 0 };
	long page = sysconf(_SC_PAGESIZE), r;
	struct perf_event_mmap_page *meta;
	char names[3][BR_NAME_MAX];
	int fd, i, seen = 0;
	unsigned long long head, off;
	pid_t pids[3];
	char *ring;

	pa.size = sizeof(pa);
	pa.type = PERF_TYPE_SOFTWARE;
	pa.config = PERF_COUNT_SW_DUMMY;
	pa.task = 1;
	fd = syscall(SYS_perf_event_open, &pa, 0, -1, -1, PERF_FLAG_FD_CLOEXEC);
	if (fd < 0) {
		fail(test, "perf_event_open: %s", strerror(errno));
		return;
	}
	meta = mmap(NULL, page * 9, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (meta == MAP_FAILED) {
		fail(test, "mmap: %s", strerror(errno));
		close(fd);
		return;
	}
	ring = (char *)meta + page;
	r = create(MNT, 0, 3, pids, names);
	if (r > 0)
		_exit(0);
	if (r < 0) {
		fail(test, "BR_CREATE: %s", strerror(errno));
	} else {
		for (i = 0; i < 3; i++)
			waitpid(pids[i], NULL, 0);
		head = __atomic_load_n(&meta->data_head, __ATOMIC_ACQUIRE);
		for (off = 0; off + sizeof(struct perf_event_header) <= head && off < (unsigned long long)page * 8;) {
			struct perf_event_header *h = (void *)(ring + off);
			struct { struct perf_event_header h; __u32 pid, ppid, tid, ptid; } *f = (void *)h;

			if (!h->size)
				break;
			if (h->type == PERF_RECORD_FORK)
				for (i = 0; i < 3; i++)
					if ((pid_t)f->pid == pids[i] && (pid_t)f->ppid == getpid())
						seen++;
			off += h->size;
		}
		if (seen != 3)
			fail(test, "%d fork records of the 3 children", seen);
	}
	munmap(meta, page * 9);
	close(fd);
	if (wait_views(MNT, 0))
		fail(test, "%d branches left", count_views(MNT));
	pass(test);
}

/* Mounts a filesystem of type at dir unless one of magic is there. */
static int mount_once(const char *type, const char *dir, long magic, const char *data)
{
	struct statfs sf;

	if (statfs(dir, &sf) == 0 && sf.f_type == magic)
		return 0;
	return mount(type, dir, type, 0, data);
}

#define CGROUP2 "/sys/fs/cgroup"
#define CGROUP1 "/tmp/cgroup1"

/* Mounts cgroup2 at CGROUP2 unless it is there; fails test if it cannot. */
static int mount_cgroup2(const char *test)
{
	if (mount_once("cgroup2", CGROUP2, 0x63677270 /* CGROUP2_SUPER_MAGIC */, NULL)) {
		fail(test, "mount cgroup2: %s", strerror(errno));
		return -1;
	}
	return 0;
}

/* The directory of pid's cgroup under CGROUP2. */
static int cgroup2_dir(pid_t pid, char *out, size_t size)
{
	char path[64], buf[4096], *p;

	snprintf(path, sizeof(path), "/proc/%d/cgroup", pid);
	if (read_file(path, buf, sizeof(buf)) < 0)
		return -1;
	for (p = buf; p && strncmp(p, "0::", 3);)
		if ((p = strchr(p, '\n')))
			p++;
	if (!p)
		return -1;
	p[strcspn(p, "\n")] = '\0';
	snprintf(out, size, "%s%s", CGROUP2, strcmp(p + 3, "/") ? p + 3 : "");
	return 0;
}

/* Whether a line of file (a cgroup's cgroup.procs, say) is pid; -1 when unreadable. */
static int pid_listed(const char *file, pid_t pid)
{
	static char buf[1 << 16];
	char *line, *save;

	if (read_file(file, buf, sizeof(buf)) < 0)
		return -1;
	for (line = strtok_r(buf, "\n", &save); line; line = strtok_r(NULL, "\n", &save))
		if (atoi(line) == pid)
			return 1;
	return 0;
}

/*
 * After the verdict, in the caller: both children are in its cgroup's
 * cgroup.procs and in the v1 hierarchy's tasks.  0, or what is wrong.
 */
static int children_listed(const pid_t *pids)
{
	char dir[256], file[320];
	int i;

	if (cgroup2_dir(getpid(), dir, sizeof(dir)))
		return 3;
	snprintf(file, sizeof(file), "%s/cgroup.procs", dir);
	for (i = 0; i < 2; i++) {
		if (pid_listed(file, pids[i]) != 1)
			return 4;
		if (pid_listed(CGROUP1 "/tasks", pids[i]) != 1)
			return 5;
	}
	return 0;
}

/*
 * The sched_process_fork trace event reports the children as fork()'s:
 * one event from the caller for each child, with the pid the call gave.
 */
static void test_trace_fork(void)
{
	const char *test = "trace_fork_event";
	const char *enable = "/sys/kernel/tracing/events/sched/sched_process_fork/enable";
	static char buf[1 << 20];
	char names[3][BR_NAME_MAX], *line, *save, *p;
	int seen[3] = { 0 }, others = 0, i, fd;
	size_t len = 0;
	ssize_t got;
	pid_t pids[3];
	long r;

	if (mount_once("tracefs", "/sys/kernel/tracing", 0x74726163 /* TRACEFS_MAGIC */, NULL)) {
		fail(test, "mount tracefs: %s", strerror(errno));
		return;
	}
	if (write_file("/sys/kernel/tracing/trace", "") || write_file(enable, "1")) {
		fail(test, "enabling sched_process_fork: %s", strerror(errno));
		return;
	}
	r = create(MNT, 0, 3, pids, names);
	if (r > 0)
		_exit(0);
	write_file(enable, "0");
	if (r < 0) {
		fail(test, "BR_CREATE: %s", strerror(errno));
		return;
	}
	for (i = 0; i < 3; i++)
		waitpid(pids[i], NULL, 0);
	fd = open("/sys/kernel/tracing/trace", O_RDONLY);
	while (fd >= 0 && len < sizeof(buf) - 1 && (got = read(fd, buf + len, sizeof(buf) - 1 - len)) > 0)
		len += got;
	if (fd >= 0)
		close(fd);
	buf[len] = '\0';
	for (line = strtok_r(buf, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		if (!strstr(line, "sched_process_fork:") || !(p = strstr(line, " pid=")) || atoi(p + 5) != getpid())
			continue;
		p = strstr(line, "child_pid=");
		for (i = 0; p && i < 3 && atoi(p + 10) != pids[i]; i++)
			;
		if (p && i < 3)
			seen[i]++;
		else
			others++;
	}
	for (i = 0; i < 3; i++)
		if (seen[i] != 1)
			fail(test, "%d events for child %d (pid %d), want 1", seen[i], i + 1, pids[i]);
	if (others)
		fail(test, "%d events for other children of the caller", others);
	if (wait_views(MNT, 0))
		fail(test, "%d branches left", count_views(MNT));
	pass(test);
}

/* Branches mnt ever had, finished ones too (list:all), or -1. */
static int count_all_branches(const char *mnt)
{
	static char buf[1 << 16];
	char path[512];
	const char *p;
	ssize_t got = -1;
	int fd, n = 0;

	snprintf(path, sizeof(path), "%s/.branchfs_ctl", mnt);
	fd = open(path, O_RDWR);
	if (fd < 0)
		return -1;
	if (write(fd, "list:all", 8) == 8)
		got = pread(fd, buf, sizeof(buf) - 1, 0);
	close(fd);
	if (got < 0)
		return -1;
	buf[got] = '\0';
	for (p = buf; (p = strstr(p, "\"state\": \"")); p++)
		n++;
	return n - 1;	/* main */
}

/*
 * RLIMIT_NPROC for a caller that is not root and uses BR_FS: uid and gid
 * 65534, in GRP's control group, with CAP_SYS_ADMIN (which BR_FS needs)
 * in a user namespace of its own.  Two children over a limit of two
 * (with the caller) give EAGAIN before any branch is made (GRP's list
 * of all branches, finished ones too, stays empty) and leave no child;
 * one child is made, so the refusal is the limit's.
 */
static void test_nproc_fs(void)
{
	const char *test = "nproc_fs_unprivileged";
	int status;
	pid_t helper = fork();

	if (helper == 0) {
		struct rlimit rl = { 2, 2 };
		char names[2][BR_NAME_MAX];
		pid_t pids[2];
		int st;
		long r;

		if (setrlimit(RLIMIT_NPROC, &rl) || setgroups(0, NULL) || setresgid(65534, 65534, 65534) ||
		    setresuid(65534, 65534, 65534) || unshare(CLONE_NEWUSER))
			_exit(20);
		r = create(GRP, BR_FS, 2, pids, names);
		if (r > 0)
			_exit(0);
		if (r == 0 || errno != EAGAIN) {
			printf("# %s: 2 children over RLIMIT_NPROC 2: %ld %s\n", test, r, strerror(errno));
			_exit(1);
		}
		if (waitpid(-1, NULL, WNOHANG | __WALL) != -1 || errno != ECHILD)
			_exit(2);
		if (count_all_branches(GRP) != 0)
			_exit(3);
		r = create(GRP, BR_FS, 1, pids, names);
		if (r > 0)
			_exit(7);
		if (r < 0) {
			printf("# %s: 1 child under RLIMIT_NPROC 2: %s\n", test, strerror(errno));
			_exit(4);
		}
		_exit(waitpid(pids[0], &st, 0) == pids[0] && exited(st, 7) ? 0 : 5);
	}
	if (wait_deadline(helper, &status, 20) < 0 || !exited(status, 0))
		fail(test, "helper status %#x (1: not refused, 2: a child left, 3: a branch was made, "
		     "4: refused under the limit, 5: the child's end, 20: setup)", status);
	if (wait_views(GRP, 0))
		fail(test, "%d branches left", count_views(GRP));
	pass(test);
}

/*
 * unstarted_child's checks at the caller's first fork event, before the
 * verdict: nothing finds the child yet.
 */
static void unstarted_at_fork(struct tracer *t)
{
	char path[64], dir[256], files[4][320];
	unsigned long msg = 0;
	int st, pfd, i;
	pid_t first;

	ptrace(PTRACE_GETEVENTMSG, t->caller, 0, &msg);
	first = msg;
	snprintf(path, sizeof(path), "/proc/%d", first);
	if (exists(path))
		fail(t->test, "/proc/%d exists before the verdict", first);
	if (kill(first, 0) == 0 || errno != ESRCH)
		fail(t->test, "kill(child, 0) before the verdict: %s, want ESRCH",
		     kill(first, 0) ? strerror(errno) : "found");
	pfd = syscall(SYS_pidfd_open, first, 0);
	if (pfd >= 0) {
		fail(t->test, "pidfd_open(child) before the verdict found it");
		close(pfd);
	}
	if (waitpid(first, &st, WNOHANG | __WALL) > 0)
		fail(t->test, "the tracer's wait() reported the child before the verdict: %#x", st);
	if (cgroup2_dir(t->caller, dir, sizeof(dir)))
		fail(t->test, "no cgroup2 line in /proc/%d/cgroup", t->caller);
	snprintf(files[0], sizeof(files[0]), "%s/cgroup.procs", dir);
	snprintf(files[1], sizeof(files[1]), "%s/cgroup.threads", dir);
	snprintf(files[2], sizeof(files[2]), "%s/tasks", CGROUP1);
	snprintf(files[3], sizeof(files[3]), "%s/cgroup.procs", CGROUP1);
	for (i = 0; i < 4; i++) {
		if (pid_listed(files[i], t->caller) != 1)
			fail(t->test, "%s does not list the caller", files[i]);
		if (pid_listed(files[i], first) != 0)
			fail(t->test, "%s lists the child before the verdict", files[i]);
	}
}

/*
 * A child between its fork and the call's verdict is not published: no
 * pid lookup finds it (/proc, kill(), pidfd_open()), no wait() reports
 * it, not even its tracer's, though a tracer is told its pid at
 * PTRACE_EVENT_FORK, and its cgroup's cgroup.procs and cgroup.threads
 * and the tasks and cgroup.procs of a cgroup v1 hierarchy leave it out.
 * Once the verdict is given it is listed and runs as usual.  The tracer
 * holds the caller at the fork event of its first child, so that the
 * verdict cannot come meanwhile.
 */
static void test_unstarted(void)
{
	const char *test = "unstarted_child";
	struct tracer t = {
		.test = test,
		.deadline = now_ns() + 20 * 1000000000L,
		.first_fork = unstarted_at_fork,
	};
	int st;
	pid_t pid;

	if (mount_cgroup2(test))
		return;
	if ((mkdir(CGROUP1, 0755) && errno != EEXIST) ||
	    mount("cgroup", CGROUP1, "cgroup", 0, "none,name=branch_test")) {
		fail(test, "mount a cgroup v1 hierarchy: %s", strerror(errno));
		return;
	}
	reset_shared();
	pid = fork();
	if (pid == 0) {
		char names[2][BR_NAME_MAX];
		int s0 = 0, s1 = 0, listed;
		pid_t pids[2];
		long r;

		ptrace(PTRACE_TRACEME, 0, 0, 0);
		raise(SIGSTOP);
		r = create(MNT, BR_FS, 2, pids, names);
		if (r > 0) {
			__atomic_add_fetch(&sh->done, 1, __ATOMIC_ACQ_REL);
			wait_step(1);
			_exit(0);
		}
		if (r < 0)
			_exit(1);
		listed = children_listed(pids);
		set_step(1);
		waitpid(pids[0], &s0, __WALL);
		waitpid(pids[1], &s1, __WALL);
		_exit(!exited(s0, 0) || !exited(s1, 0) ? 2 : listed);
	}
	if (trace_forks(test, pid))
		return;
	t.caller = pid;
	st = trace_caller(&t);
	if (st != -1 && !exited(st, 0))
		fail(test, "caller ended with %#x (1: BR_CREATE failed, 2: a child's end, "
		     "3-5: children not listed after the verdict)", st);
	if (t.forks != 2)
		fail(test, "%d fork events, want 2", t.forks);
	if (sh->done != 2)
		fail(test, "%d children ran, want 2", sh->done);
	while (waitpid(-1, &st, __WALL | WNOHANG) > 0)
		;
	if (umount2(CGROUP1, 0))
		fail(test, "umount %s: %s", CGROUP1, strerror(errno));
	if (wait_views(MNT, 0))
		fail(test, "%d branches left", count_views(MNT));
	pass(test);
}

/* gate_cgroup_kill: the kill, while the caller's first child waits at the gate. */
static void cgroup_kill_at_fork(struct tracer *t)
{
	if (write_file(t->ctx, "1"))
		fail(t->test, "cgroup.kill: %s", strerror(errno));
}

static void cgroup_kill_ended(struct tracer *t, int st)
{
	if (!killed(st))
		fail(t->test, "a child ended with %#x, not by SIGKILL", st);
}

/*
 * A child killed before the verdict, by cgroup.kill (no pid lookup finds
 * it then), with the caller: it waits for the verdict, which the dying
 * caller still gives, and dies; nothing is left, neither a task in the
 * cgroup nor a branch.  The tracer holds the caller at its first fork
 * event, so the kill comes while the child waits at the gate.
 */
static void test_gate_cgroup_kill(void)
{
	const char *test = "gate_cgroup_kill";
	const char *cg = CGROUP2 "/branch_test";
	char path[128], buf[256], kill_path[128];
	struct tracer t = {
		.test = test,
		.deadline = now_ns() + 20 * 1000000000L,
		.first_fork = cgroup_kill_at_fork,
		.other_ended = cgroup_kill_ended,
		.ctx = kill_path,
	};
	int st;
	pid_t pid;

	if (mount_cgroup2(test))
		return;
	if (mkdir(cg, 0755) && errno != EEXIST) {
		fail(test, "mkdir %s: %s", cg, strerror(errno));
		return;
	}
	snprintf(path, sizeof(path), "%s/cgroup.procs", cg);
	snprintf(kill_path, sizeof(kill_path), "%s/cgroup.kill", cg);
	pid = fork();
	if (pid == 0) {
		char names[4][BR_NAME_MAX];
		pid_t pids[4];

		if (write_file(path, "0"))
			_exit(20);
		ptrace(PTRACE_TRACEME, 0, 0, 0);
		raise(SIGSTOP);
		create(MNT, BR_FS, 4, pids, names);
		_exit(1);	/* the caller, or a child that started */
	}
	if (trace_forks(test, pid))
		return;
	t.caller = pid;
	st = trace_caller(&t);
	if (st != -1 && !killed(st))
		fail(test, "the caller was not killed: %#x", st);
	/* Every task of the cgroup is gone, the child too. */
	snprintf(path, sizeof(path), "%s/cgroup.events", cg);
	while ((read_file(path, buf, sizeof(buf)) || !strstr(buf, "populated 0")) &&
	       now_ns() < t.deadline)
		usleep(1000);
	if (!strstr(buf, "populated 0"))
		fail(test, "tasks left in the cgroup: %s", buf);
	if (rmdir(cg))
		fail(test, "rmdir %s: %s", cg, strerror(errno));
	if (wait_views(MNT, 0))
		fail(test, "%d branches left", count_views(MNT));
	pass(test);
}

/* The view a BR_FS child gets is locked: no unmount reveals the parent's. */
static void test_view_locked(void)
{
	const char *test = "view_locked";
	char names[1][BR_NAME_MAX];
	int status;
	pid_t pid;
	long r = create(MNT, BR_FS, 1, &pid, names);

	if (r > 0) {
		if (umount2(MNT, MNT_DETACH) == 0)
			_exit(1);
		if (errno != EINVAL)
			_exit(2);
		_exit(write_file(MNT "/locked.txt", "x") ? 3 : 0);
	}
	if (r < 0) {
		fail(test, "BR_CREATE: %s", strerror(errno));
		return;
	}
	if (wait_deadline(pid, &status, 20) < 0 || !exited(status, 0))
		fail(test, "child status %#x (1: the view came off, 2: another error, 3: no write)", status);
	if (exists(MNT "/locked.txt"))
		fail(test, "a child's write reached the base");
	if (wait_views(MNT, 0))
		fail(test, "%d branches left", count_views(MNT));
	pass(test);
}

static int cmp_long(const void *a, const void *b)
{
	long x = *(const long *)a, y = *(const long *)b;

	return x < y ? -1 : x > y;
}

static long median(long *v, int n)
{
	qsort(v, n, sizeof(*v), cmp_long);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/*
 * Mean cost of one branch with a child that exits at once, three ways;
 * the median cost of a commit, two ways, each sample timed in the child.
 */
static void bench(void)
{
	enum { iters = 30 };
	char names[1][BR_NAME_MAX];
	long t0, t_fork, t_sys, t_user, c_sys[iters], c_user[iters];
	pid_t pid;
	int i, status;

	t0 = now_ns();
	for (i = 0; i < iters; i++) {
		pid = fork();
		if (pid == 0)
			_exit(0);
		waitpid(pid, &status, 0);
	}
	t_fork = (now_ns() - t0) / iters;

	t0 = now_ns();
	for (i = 0; i < iters; i++) {
		long r = create(MNT, BR_FS, 1, &pid, names);

		if (r > 0)
			_exit(0);
		waitpid(pid, &status, 0);
		abort_branch(MNT, names[0]);
	}
	t_sys = (now_ns() - t0) / iters;

	t0 = now_ns();
	for (i = 0; i < iters; i++) {
		char name[BR_NAME_MAX] = "", src[512];
		int fd = open(MNT, O_RDONLY | O_DIRECTORY);

		ioctl(fd, FS_IOC_BRANCH_CREATE, name);
		close(fd);
		pid = fork();
		if (pid == 0) {
			snprintf(src, sizeof(src), MNT "/@%s", name);
			if (unshare(CLONE_NEWNS) || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) ||
			    mount(src, MNT, NULL, MS_BIND, NULL))
				_exit(1);
			_exit(0);
		}
		waitpid(pid, &status, 0);
		abort_branch(MNT, name);
	}
	t_user = (now_ns() - t0) / iters;

	/* Commit: branch() against FS_IOC_BRANCH_COMMIT, timed in the child. */
	for (i = 0; i < iters; i++) {
		long r;

		reset_shared();
		r = create(MNT, BR_FS, 1, &pid, names);
		if (r > 0) {
			long s = now_ns();

			commit();
			sh->ns[0] = now_ns() - s;
			_exit(0);
		}
		waitpid(pid, &status, 0);
		c_sys[i] = sh->ns[0];

		r = create(MNT, BR_FS, 1, &pid, names);
		if (r > 0) {
			long s = now_ns();
			int fd = open(MNT "/.branchfs_ctl", O_RDONLY);

			ioctl(fd, FS_IOC_BRANCH_COMMIT);
			sh->ns[0] = now_ns() - s;
			_exit(0);
		}
		waitpid(pid, &status, 0);
		c_user[i] = sh->ns[0];
	}
	printf("# BENCH create+child+exit: fork() %ld us, branch(BR_CREATE) %ld us, ioctl+fork+unshare+bind %ld us; "
	       "branch/fork %.2fx, branch/userspace %.2fx\n",
	       t_fork / 1000, t_sys / 1000, t_user / 1000,
	       (double)t_sys / t_fork, (double)t_sys / t_user);
	t_sys = median(c_sys, iters);
	t_user = median(c_user, iters);
	printf("# BENCH commit (median of %d): branch(BR_COMMIT) %ld us, open+ioctl(FS_IOC_BRANCH_COMMIT) %ld us; "
	       "ratio %.2fx (fastest %ld and %ld us)\n", iters, t_sys / 1000, t_user / 1000,
	       (double)t_sys / t_user, c_sys[0] / 1000, c_user[0] / 1000);
}

static void run_create(const char *arg) { test_create(atoi(arg)); }
static void run_commit_race(const char *arg) { (void)arg; test_commit_race(10); }
static void run_abort(const char *arg) { (void)arg; test_abort(); }
static void run_nesting(const char *arg) { (void)arg; test_nesting(); }
static void run_isolate_on(const char *arg) { run_isolate(arg, BR_FS | BR_ISOLATE, EPERM); }
static void run_isolate_off(const char *arg) { run_isolate(arg, BR_FS, 0); }
static void run_close_on(const char *arg) { run_close_fds(arg, BR_FS | BR_CLOSE_FDS, 0); }
static void run_close_off(const char *arg) { run_close_fds(arg, BR_FS, 1); }
static void run_grandchild(const char *arg) { (void)arg; test_grandchild_killed(); }
static void run_failed_commit(const char *arg) { (void)arg; test_failed_commit(); }
static void run_partial(const char *arg) { (void)arg; test_partial_failure(); }
static void run_bad_input(const char *arg) { (void)arg; test_bad_input(); }
static void run_signals(const char *arg) { (void)arg; test_signals_create(); }
static void run_names(const char *arg) { (void)arg; test_names_copied(); }
static void run_confined(const char *arg) { (void)arg; test_confined_view(); }
static void run_killed(const char *arg) { (void)arg; test_caller_killed(); }
/*
 * The winner's work after BR_COMMIT: in the child of a BR_FS call, its
 * working directory, descriptors and mount point; in a child without
 * BR_FS, a working directory in its "@NAME" view.  All of them show the
 * parent's view, which holds the commit, and writes go there.  Exit
 * codes: 1 commit, 2 relative read, 3 relative write, 4 read descriptor,
 * 5 write descriptor, 6 absolute read, 7 cwd, 8 setup, 9 the winner's
 * child.
 */
static int winner_steps(const char *cwd_after, int rfd, int wfd)
{
	char buf[64];

	if (commit())
		return 1;
	if (read_file("f.txt", buf, sizeof(buf)) || strcmp(buf, "branch"))
		return 2;
	if (write_file("after.txt", "after"))
		return 3;
	if (rfd >= 0 && (pread(rfd, buf, 6, 0) != 6 || memcmp(buf, "branch", 6))) {
		printf("# winner_after_commit: read fd: %s\n", strerror(errno));
		return 4;
	}
	if (wfd >= 0 && write(wfd, "cd", 2) != 2)
		return 5;
	if (read_file(MNT "/win/f.txt", buf, sizeof(buf)) || strcmp(buf, "branch"))
		return 6;
	if (!getcwd(buf, sizeof(buf)) || strcmp(buf, cwd_after))
		return 7;
	return 0;
}

static void test_winner_after_commit(void)
{
	const char *test = "winner_after_commit";
	char names[1][BR_NAME_MAX], path[512], buf[64];
	int status, fs;
	pid_t pids[1];
	long r;

	wait_views(MNT, 0);
	if (mkdir(MNT "/win", 0755) && errno != EEXIST) {
		fail(test, "setup: %s", strerror(errno));
		return;
	}
	for (fs = 1; fs >= 0; fs--) {
		reset_shared();
		r = create(MNT, fs ? BR_FS : 0, 1, pids, names);
		if (r > 0) {
			int rfd, wfd, pfd[2], code;
			pid_t gc;

			if (!fs) {
				wait_step(1);
				snprintf(path, sizeof(path), MNT "/@%s/win", (const char *)sh->views[0]);
			}
			if (chdir(fs ? MNT "/win" : path) || write_file("f.txt", "branch"))
				_exit(8);
			rfd = open("f.txt", O_RDONLY);
			wfd = open("g.txt", O_WRONLY | O_CREAT | O_TRUNC, 0644);
			if (rfd < 0 || wfd < 0 || write(wfd, "ab", 2) != 2 || pipe(pfd))
				_exit(8);
			/* A task the winner forked moves too: it reads once the commit is done. */
			gc = fork();
			if (gc == 0) {
				close(pfd[1]);
				if (read(pfd[0], buf, 1) != 1)
					_exit(1);
				_exit(read_file("f.txt", buf, sizeof(buf)) || strcmp(buf, "branch"));
			}
			code = winner_steps(MNT "/win", rfd, wfd);
			if (write(pfd[1], "x", 1) != 1 || waitpid(gc, &status, 0) != gc)
				_exit(8);
			_exit(code ? code : exited(status, 0) ? 0 : 9);
		}
		if (r < 0) {
			fail(test, "create (BR_FS %d): %s", fs, strerror(errno));
			break;
		}
		memcpy((char *)sh->views[0], names[0], BR_NAME_MAX);
		set_step(1);
		if (wait_deadline(pids[0], &status, 30) < 0 || !exited(status, 0))
			fail(test, "BR_FS %d: winner status %#x (exit 1 commit, 2 relative read, 3 relative write, "
			     "4 read fd, 5 write fd, 6 absolute read, 7 cwd, 8 setup, 9 its child)", fs, status);
		if (read_file(MNT "/win/after.txt", buf, sizeof(buf)) || strcmp(buf, "after"))
			fail(test, "BR_FS %d: the winner's write after its commit is not in the parent", fs);
		if (read_file(MNT "/win/g.txt", buf, sizeof(buf)) || strcmp(buf, "abcd"))
			fail(test, "BR_FS %d: g.txt holds \"%s\", want \"abcd\"", fs, buf);
		unlink(MNT "/win/f.txt");
		unlink(MNT "/win/g.txt");
		unlink(MNT "/win/after.txt");
	}
	rmdir(MNT "/win");
	if (wait_views(MNT, 0))
		fail(test, "%d branches left", count_views(MNT));
	pass(test);
}

/* ---- issue 44: what only branchfs answers, names, descriptors, stalls, walks ---- */

/*
 * A FUSE filesystem served by a thread of this program over /dev/fuse:
 * a control file at its root whose inode number is ctl_ino, which answers
 * "create" with name, and "@NAME" in its root as the view.  It gives what
 * branchfs would not (another inode number, names of any length), to see
 * what the kernel takes.
 */
struct fake_fs {
	int fd;
	const char *dir;
	unsigned long long ctl_ino;
	char name[512];		/* the created branch's name */
	volatile int writes;	/* to the control file */
	volatile int aborts;	/* FS_IOC_BRANCH_ABORT on the view */
	pthread_t thread;
};

enum { FAKE_CTL = 2, FAKE_VIEW = 3 };

static void fake_attr(struct fuse_attr *a, unsigned long long ino, unsigned int mode)
{
	memset(a, 0, sizeof(*a));
	a->ino = ino;
	a->mode = mode;
	a->nlink = S_ISDIR(mode) ? 2 : 1;
	a->blksize = 4096;
}

/* err is 0 or -errno. */
static void fake_reply(struct fake_fs *f, uint64_t unique, int err, const void *data, size_t size)
{
	char buf[sizeof(struct fuse_out_header) + 1024];
	struct fuse_out_header *h = (void *)buf;

	if (err || !data)
		size = 0;
	h->len = sizeof(*h) + size;
	h->error = err;
	h->unique = unique;
	if (size)
		memcpy(h + 1, data, size);
	if (write(f->fd, buf, h->len) < 0)
		return;	/* an interrupted request: the kernel dropped it */
}

static void fake_entry(struct fake_fs *f, uint64_t unique, uint64_t node,
		       unsigned long long ino, unsigned int mode)
{
	struct fuse_entry_out e = { .nodeid = node, .generation = 1 };

	fake_attr(&e.attr, ino, mode);
	fake_reply(f, unique, 0, &e, sizeof(e));
}

static void *fake_serve(void *arg)
{
	struct fake_fs *f = arg;
	size_t size = FUSE_MIN_READ_BUFFER + (1 << 17);
	char *buf = malloc(size);

	while (buf) {
		ssize_t n = read(f->fd, buf, size);
		struct fuse_in_header *in = (void *)buf;
		void *a = in + 1;

		if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == ENOENT))
			continue;
		if (n < (ssize_t)sizeof(*in))
			break;	/* ENODEV: unmounted */
		switch (in->opcode) {
		case FUSE_INIT: {
			struct fuse_init_in *ii = a;
			struct fuse_init_out o = {
				.major = FUSE_KERNEL_VERSION,
				.minor = ii->minor < FUSE_KERNEL_MINOR_VERSION ? ii->minor : FUSE_KERNEL_MINOR_VERSION,
				.max_readahead = ii->max_readahead,
				.max_background = 16,
				.congestion_threshold = 12,
				.max_write = 65536,
				.time_gran = 1,
			};

			fake_reply(f, in->unique, 0, &o, sizeof(o));
			break;
		}
		case FUSE_LOOKUP: {
			const char *name = a;

			if (in->nodeid == FUSE_ROOT_ID && !strcmp(name, ".branchfs_ctl"))
				fake_entry(f, in->unique, FAKE_CTL, f->ctl_ino, S_IFREG | 0600);
			else if (in->nodeid == FUSE_ROOT_ID && name[0] == '@' && !strcmp(name + 1, f->name))
				fake_entry(f, in->unique, FAKE_VIEW, 3, S_IFDIR | 0755);
			else
				fake_reply(f, in->unique, -ENOENT, NULL, 0);
			break;
		}
		case FUSE_GETATTR: {
			struct fuse_attr_out o = { 0 };

			if (in->nodeid == FAKE_CTL)
				fake_attr(&o.attr, f->ctl_ino, S_IFREG | 0600);
			else
				fake_attr(&o.attr, in->nodeid == FAKE_VIEW ? 3 : 1, S_IFDIR | 0755);
			fake_reply(f, in->unique, 0, &o, sizeof(o));
			break;
		}
		case FUSE_OPEN:
		case FUSE_OPENDIR: {
			struct fuse_open_out o = { .fh = in->nodeid, .open_flags = FOPEN_DIRECT_IO };

			fake_reply(f, in->unique, 0, &o, sizeof(o));
			break;
		}
		case FUSE_WRITE: {
			struct fuse_write_in *w = a;
			struct fuse_write_out o = { .size = w->size };

			f->writes++;
			fake_reply(f, in->unique, 0, &o, sizeof(o));
			break;
		}
		case FUSE_READ: {
			struct fuse_read_in *r = a;
			char answer[600];
			size_t len;

			snprintf(answer, sizeof(answer), "%s\n", f->name);
			len = strlen(answer);
			if (r->offset >= len)
				len = 0;
			else
				len -= r->offset;
			if (len > r->size)
				len = r->size;
			fake_reply(f, in->unique, 0, len ? answer + r->offset : "", len);
			break;
		}
		case FUSE_IOCTL: {
			struct fuse_ioctl_in *io = a;
			struct fuse_ioctl_out o = { 0 };

			if (io->cmd == FS_IOC_BRANCH_ABORT && in->nodeid == FAKE_VIEW)
				f->aborts++;
			fake_reply(f, in->unique, 0, &o, sizeof(o));
			break;
		}
		case FUSE_FORGET:
		case FUSE_BATCH_FORGET:
		case FUSE_INTERRUPT:
			break;
		case FUSE_FLUSH:
		case FUSE_RELEASE:
		case FUSE_RELEASEDIR:
		case FUSE_FSYNC:
		case FUSE_FSYNCDIR:
			fake_reply(f, in->unique, 0, NULL, 0);
			break;
		default:
			fake_reply(f, in->unique, -ENOSYS, NULL, 0);
		}
	}
	free(buf);
	return NULL;
}

static int fake_mount(struct fake_fs *f, const char *dir, unsigned long long ctl_ino, const char *name)
{
	char opts[128];

	memset(f, 0, sizeof(*f));
	f->dir = dir;
	f->ctl_ino = ctl_ino;
	snprintf(f->name, sizeof(f->name), "%s", name);
	mkdir(dir, 0755);
	f->fd = open("/dev/fuse", O_RDWR | O_CLOEXEC);
	if (f->fd < 0)
		return -1;
	snprintf(opts, sizeof(opts), "fd=%d,rootmode=40000,user_id=0,group_id=0", f->fd);
	if (mount("fakebr", dir, "fuse.fakebr", MS_NOSUID | MS_NODEV, opts)) {
		close(f->fd);
		return -1;
	}
	if (pthread_create(&f->thread, NULL, fake_serve, f)) {
		umount2(dir, MNT_DETACH);
		close(f->fd);
		return -1;
	}
	return 0;
}

static void fake_unmount(struct fake_fs *f)
{
	umount2(f->dir, MNT_DETACH);
	pthread_join(f->thread, NULL);
	close(f->fd);
}

/* Waits, at most 20 s, until *counter reaches want. */
static int wait_count(volatile int *counter, int want)
{
	long deadline = now_ns() + 20 * 1000000000L;

	while (*counter < want && now_ns() < deadline)
		usleep(1000);
	return *counter >= want ? 0 : -1;
}

/*
 * A filesystem is taken for a branching one by what only one answers, not
 * by a file's name: a tmpfs with a .branchfs_ctl at its root, and a FUSE
 * filesystem whose control file has another inode number, are refused
 * with EOPNOTSUPP before anything is written to them.
 */
static void test_control_file_identified(void)
{
	const char *test = "control_file_identified";
	const char *tdir = "/tmp/notbr", *fdir = "/tmp/fakebr";
	char names[1][BR_NAME_MAX], buf[64];
	struct fake_fs f;
	pid_t pids[1];
	int status;
	long r;

	mkdir(tdir, 0755);
	if (mount("tmpfs", tdir, "tmpfs", 0, NULL) || write_file("/tmp/notbr/.branchfs_ctl", "keep")) {
		fail(test, "tmpfs: %s", strerror(errno));
		return;
	}
	r = create(tdir, 0, 1, pids, names);
	if (r > 0)
		_exit(0);
	if (r == 0 || errno != EOPNOTSUPP)
		fail(test, "tmpfs with a .branchfs_ctl: %s, want EOPNOTSUPP", r ? strerror(errno) : "created");
	if (read_file("/tmp/notbr/.branchfs_ctl", buf, sizeof(buf)) || strcmp(buf, "keep"))
		fail(test, "the tmpfs's .branchfs_ctl now holds \"%s\"", buf);
	umount2(tdir, MNT_DETACH);

	if (fake_mount(&f, fdir, 5, "x1")) {
		fail(test, "mount a FUSE filesystem: %s", strerror(errno));
		return;
	}
	r = create(fdir, 0, 1, pids, names);
	if (r > 0)
		_exit(0);
	if (r == 0 || errno != EOPNOTSUPP)
		fail(test, "FUSE, control file of inode 5: %s, want EOPNOTSUPP", r ? strerror(errno) : "created");
	if (f.writes)
		fail(test, "%d writes to a control file of inode 5", f.writes);
	fake_unmount(&f);

	/* The control: the same filesystem, with the inode number branchfs gives. */
	if (fake_mount(&f, fdir, BRANCH_CTL_INO, "x1")) {
		fail(test, "mount a FUSE filesystem: %s", strerror(errno));
		return;
	}
	r = create(fdir, 0, 1, pids, names);
	if (r > 0)
		_exit(0);
	if (r < 0) {
		fail(test, "FUSE with the control file's inode number: %s", strerror(errno));
	} else {
		waitpid(pids[0], &status, 0);
		if (strcmp(names[0], "x1"))
			fail(test, "name \"%s\", want x1", names[0]);
		if (wait_count(&f.aborts, 1))
			fail(test, "the exited child's branch was not aborted");
	}
	fake_unmount(&f);
	pass(test);
}

/*
 * Names are as long as a view's name allows: "@NAME" is one file name, so
 * 254 bytes are taken (and 127, which the first series refused), 255 are
 * not; nor '/' or a newline inside.
 */
static void test_name_limits(void)
{
	const char *test = "name_limits";
	static const struct {
		int len;
		const char *inside;	/* put in the middle, or NULL */
		int want;		/* 0 or an errno */
	} cases[] = {
		{ 127, NULL, 0 }, { 254, NULL, 0 }, { 255, NULL, EIO }, { 8, "/", EIO }, { 8, "\n", EIO },
	};
	char names[1][BR_NAME_MAX], name[300];
	struct fake_fs f;
	pid_t pids[1];
	unsigned int i;
	int status;
	long r;

	for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		memset(name, 'n', cases[i].len);
		name[cases[i].len] = '\0';
		if (cases[i].inside)
			name[cases[i].len / 2] = cases[i].inside[0];
		if (fake_mount(&f, "/tmp/fakebr", BRANCH_CTL_INO, name)) {
			fail(test, "mount a FUSE filesystem: %s", strerror(errno));
			return;
		}
		r = create("/tmp/fakebr", 0, 1, pids, names);
		if (r > 0)
			_exit(0);
		if (cases[i].want) {
			if (r == 0 || errno != cases[i].want)
				fail(test, "a name of %d bytes%s: %s, want %s", cases[i].len,
				     cases[i].inside ? " with a / or newline" : "",
				     r ? strerror(errno) : "created", strerror(cases[i].want));
		} else if (r < 0) {
			fail(test, "a name of %d bytes: %s", cases[i].len, strerror(errno));
		} else {
			waitpid(pids[0], &status, 0);
			if (strcmp(names[0], name))
				fail(test, "a name of %d bytes came back as %zu bytes", cases[i].len, strlen(names[0]));
			if (wait_count(&f.aborts, 1))
				fail(test, "a name of %d bytes: the branch was not aborted", cases[i].len);
		}
		fake_unmount(&f);
	}
	pass(test);
}

/* The number of descriptors open in the caller's table. */
static int count_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	int n = 0;

	while (d && (e = readdir(d)))
		n += e->d_name[0] != '.';
	if (d)
		closedir(d);
	return n;
}

/* Another thread of a winner: opens and closes descriptors while it commits. */
struct churn {
	volatile int stop;
	volatile int bad;	/* a descriptor that held another file than opened */
	volatile long rounds;
};

static void *churner(void *arg)
{
	struct churn *c = arg;
	struct stat st;
	int fd, k;

	while (!c->stop) {
		/* A file in the view, held a moment, which the move reopens... */
		fd = open(MNT "/churn.txt", O_RDONLY);
		if (fd >= 0) {
			usleep(300);
			close(fd);
		}
		/* ...and then another file, likely under the same number. */
		fd = open("/dev/null", O_RDONLY);
		if (fd < 0)
			continue;
		for (k = 0; k < 4; k++) {
			if (fstat(fd, &st) || !S_ISCHR(st.st_mode))
				c->bad++;
			sched_yield();
		}
		close(fd);
		c->rounds++;
	}
	return NULL;
}

/*
 * The winner's move into the parent's view replaces a descriptor only
 * while it still holds the file it reopened: other threads of the winner
 * that close and reuse descriptors meanwhile keep what they opened.
 */
static void test_commit_threads_fds(void)
{
	const char *test = "commit_threads_fds";
	enum { HELD = 48, THREADS = 3, ROUNDS = 6 };
	char names[1][BR_NAME_MAX], path[64];
	int round, status, i;
	pid_t pids[1];
	long r;

	for (round = 0; round < ROUNDS; round++) {
		r = create(MNT, BR_FS, 1, pids, names);
		if (r > 0) {
			pthread_t th[THREADS];
			struct churn c = { 0 };
			int held[HELD], code = 0, open_fds;
			char buf[16];

			/* Many descriptors in the view make the move's walk long. */
			for (i = 0; i < HELD; i++) {
				snprintf(path, sizeof(path), MNT "/held%d", i);
				snprintf(buf, sizeof(buf), "%d", i);
				if (write_file(path, buf))
					_exit(8);
				held[i] = open(path, O_RDONLY);
			}
			if (write_file(MNT "/churn.txt", "churn"))
				_exit(8);
			open_fds = count_fds();
			for (i = 0; i < THREADS; i++)
				pthread_create(&th[i], NULL, churner, &c);
			while (c.rounds < 20)
				usleep(1000);
			if (commit())
				code = 1;
			r = c.rounds;
			while (c.rounds < r + 20)
				usleep(1000);
			c.stop = 1;
			for (i = 0; i < THREADS; i++)
				pthread_join(th[i], NULL);
			if (c.bad && !code)
				code = 2;
			/* Every thread closed what it opened: a file left is one put back. */
			if (count_fds() != open_fds && !code)
				code = 4;
			for (i = 0; i < HELD && !code; i++) {
				ssize_t n = pread(held[i], buf, sizeof(buf) - 1, 0);

				buf[n > 0 ? n : 0] = '\0';
				if (n <= 0 || atoi(buf) != i)
					code = 3;
			}
			_exit(code);
		}
		if (r < 0) {
			fail(test, "BR_CREATE: %s", strerror(errno));
			return;
		}
		if (wait_deadline(pids[0], &status, 60) < 0 || !exited(status, 0))
			fail(test, "round %d: winner status %#x (exit 1: commit failed, 2: a thread's descriptor "
			     "held another file, 3: a held file not readable after the commit, 4: a descriptor "
			     "no thread opened was left open, 8: setup)", round, status);
		for (i = 0; i < HELD; i++) {
			snprintf(path, sizeof(path), MNT "/held%d", i);
			unlink(path);
		}
		unlink(MNT "/churn.txt");
		if (test_failed)
			break;
	}
	if (wait_views(MNT, 0))
		fail(test, "%d branches left", count_views(MNT));
	pass(test);
}

/* The daemon serving the store dir: "branchfs mount --foreground ... --store DIR". */
static pid_t daemon_of(const char *store)
{
	DIR *d = opendir("/proc");
	struct dirent *e;
	pid_t found = 0;

	while (d && !found && (e = readdir(d))) {
		char path[64], buf[4096], *a, *prev = "";
		int fd, fg = 0, st = 0;
		ssize_t n;

		if (atoi(e->d_name) <= 0)
			continue;
		snprintf(path, sizeof(path), "/proc/%s/cmdline", e->d_name);
		fd = open(path, O_RDONLY);
		if (fd < 0)
			continue;
		n = read(fd, buf, sizeof(buf) - 1);
		close(fd);
		if (n <= 0)
			continue;
		buf[n] = '\0';
		for (a = buf; a < buf + n; prev = a, a += strlen(a) + 1) {
			fg |= !strcmp(a, "--foreground");
			st |= !strcmp(prev, "--store") && !strcmp(a, store);
		}
		if (fg && st)
			found = atoi(e->d_name);
	}
	if (d)
		closedir(d);
	return found;
}

/* The state letter of /proc/PID/stat, or 0. */
static char proc_state(pid_t pid)
{
	char path[64], buf[512], *p;

	snprintf(path, sizeof(path), "/proc/%d/stat", pid);
	if (read_file(path, buf, sizeof(buf)) || !(p = strrchr(buf, ')')))
		return 0;
	return p[2];
}

/* The file that counts the requests waiting on the FUSE connection of mnt. */
static int fuse_waiting_file(const char *mnt, char *path, size_t size)
{
	struct stat st;

	mkdir("/sys/fs/fuse/connections", 0755);
	if (mount_once("fusectl", "/sys/fs/fuse/connections", 0x65735543 /* FUSE_CTL_SUPER_MAGIC */, NULL) ||
	    stat(mnt, &st))
		return -1;
	snprintf(path, size, "/sys/fs/fuse/connections/%u/waiting", minor(st.st_dev));
	return access(path, R_OK);
}

/* Requests waiting on a FUSE connection (see fuse_waiting_file), or -1. */
static int fuse_waiting(const char *file)
{
	char buf[32];

	return read_file(file, buf, sizeof(buf)) ? -1 : atoi(buf);
}

/* Waits, at most 20 s, until pid's state is c. */
static int wait_state(pid_t pid, char c)
{
	long deadline = now_ns() + 20 * 1000000000L;

	while (proc_state(pid) != c && now_ns() < deadline)
		usleep(1000);
	return proc_state(pid) == c ? 0 : -1;
}

/* Reaps pid if it ends within seconds; -1 if it does not. */
static int reaped_within(pid_t pid, int *status, int seconds)
{
	long deadline = now_ns() + seconds * 1000000000L;

	while (now_ns() < deadline) {
		if (waitpid(pid, status, WNOHANG | __WALL) == pid)
			return 0;
		usleep(1000);
	}
	return -1;
}

/*
 * A daemon stopped (SIGSTOP) during a commit holds the request, and with
 * it the group's lock: a sibling that calls BR_CREATE meanwhile, and the
 * committer, are still killed at once; a group on another mount commits
 * as usual; once the daemon goes on, everything settles.
 */
static void test_daemon_stopped(void)
{
	const char *test = "daemon_stopped";
	char names[2][BR_NAME_MAX], lnames[1][BR_NAME_MAX], waiting[128] = "";
	pid_t pids[2], lpids[1], daemon = daemon_of("/data/store");
	int status, stopped = 0, before = 0, i;
	long r;

	if (!daemon) {
		fail(test, "no daemon of /data/store");
		return;
	}
	reset_shared();
	r = create(MNT, BR_FS, 2, pids, names);
	if (r == 1) {
		__atomic_add_fetch(&sh->done, 1, __ATOMIC_ACQ_REL);
		wait_step(1);
		_exit(commit() == 0 ? 0 : 1);
	}
	if (r == 2) {
		/* Opened now: with the daemon stopped, an open would wait for it. */
		int fd = open(MNT, O_RDONLY | O_DIRECTORY);
		union branch_attr attr = { 0 };
		char nested[1][BR_NAME_MAX];

		__atomic_add_fetch(&sh->done, 1, __ATOMIC_ACQ_REL);
		wait_step(2);
		attr.create.mount_fd = fd;
		attr.create.n_branches = 1;
		attr.create.branch_names = (uintptr_t)nested;
		r = create_attr(&attr);
		_exit(r == 0 ? 0 : 2);
	}
	if (r < 0) {
		fail(test, "BR_CREATE: %s", strerror(errno));
		return;
	}
	wait_done(2);
	/*
	 * Found now: a stat of the mount point would wait for the stopped
	 * daemon.  The daemon may keep requests of its own waiting (a
	 * notification it polls for, say): the commit's comes on top.
	 */
	if (fuse_waiting_file(MNT, waiting, sizeof(waiting)) || (before = fuse_waiting(waiting)) < 0) {
		fail(test, "no %s", waiting);
		goto out;
	}
	kill(daemon, SIGSTOP);
	stopped = 1;
	set_step(1);
	/* The commit's request is with the stopped daemon, the lock held. */
	for (i = 0; i < 20000 && fuse_waiting(waiting) <= before; i++)
		usleep(1000);
	if (fuse_waiting(waiting) <= before || wait_state(pids[0], 'D')) {
		fail(test, "the commit did not reach the daemon");
		goto out;
	}
	set_step(2);
	if (wait_state(pids[1], 'D')) {
		fail(test, "the sibling's BR_CREATE did not wait for the group");
		goto out;
	}
	/* Another mount, another group: not held up. */
	r = create(LIM, BR_FS, 1, lpids, lnames);
	if (r > 0)
		_exit(commit() == 0 ? 0 : 1);
	if (r < 0)
		fail(test, "BR_CREATE on %s with %s's daemon stopped: %s", LIM, MNT, strerror(errno));
	else if (wait_deadline(lpids[0], &status, 20) < 0 || !exited(status, 0))
		fail(test, "a commit on %s with %s's daemon stopped: %#x", LIM, MNT, status);
	kill(pids[1], SIGKILL);
	if (reaped_within(pids[1], &status, 5))
		fail(test, "the sibling waiting for the group was not killed within 5 s");
	else if (!killed(status))
		fail(test, "the sibling ended with %#x", status);
	kill(pids[0], SIGKILL);
	if (reaped_within(pids[0], &status, 5))
		fail(test, "the committer waiting for the daemon was not killed within 5 s");
	else if (!killed(status))
		fail(test, "the committer ended with %#x", status);
out:
	if (stopped)
		kill(daemon, SIGCONT);
	set_step(3);
	for (i = 0; i < 2; i++) {
		kill(pids[i], SIGKILL);
		waitpid(pids[i], NULL, __WALL);
	}
	if (wait_views(MNT, 0))
		fail(test, "%d branches left", count_views(MNT));
	pass(test);
}

static long mem_available_kib(void)
{
	static char buf[8192];
	char *p;

	if (read_file("/proc/meminfo", buf, sizeof(buf)) || !(p = strstr(buf, "MemAvailable:")))
		return -1;
	return atol(p + strlen("MemAvailable:"));
}

static int set_oom_score_adj(pid_t pid, int adj)
{
	char path[64], val[16];

	snprintf(path, sizeof(path), "/proc/%d/oom_score_adj", pid);
	snprintf(val, sizeof(val), "%d", adj);
	return write_file(path, val);
}

struct oom_caller {
	char *mem;
	size_t size;
};

/* The caller's other thread: once its child waits, it holds the memory alone. */
static void *oom_unmapper(void *arg)
{
	struct oom_caller *c = arg;

	wait_step(1);
	munmap(c->mem, c->size);
	sh->err[1] = set_oom_score_adj(getpid(), -1000) ? 2 : 1;
	return NULL;
}

/*
 * gate_oom, with the caller held at its fork event: once the caller has
 * given up its copy, a hog of *ctx bytes needs the memory the child holds.
 */
static void oom_at_fork(struct tracer *t)
{
	size_t hog = *(size_t *)t->ctx;
	int st;
	pid_t h;

	set_step(1);
	while (!sh->err[1])
		usleep(1000);
	if (sh->err[1] != 1)
		fail(t->test, "the caller could not make itself unkillable");
	h = fork();
	if (h == 0) {
		char *m = mmap(NULL, hog, PROT_READ | PROT_WRITE,
			       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		size_t off;

		if (m == MAP_FAILED)
			_exit(1);
		for (off = 0; off < hog; off += 4096)
			m[off] = 1;
		_exit(0);
	}
	if (waitpid(h, &st, 0) != h || !exited(st, 0))
		fail(t->test, "the hog ended with %#x", st);
}

/*
 * The OOM killer sees a child that waits at the gate: the caller held at
 * its fork event unmaps its copy of a large region and makes itself
 * unkillable, so the child, which holds the only copy, is the one task
 * the OOM killer may take when a hog (unkillable too) needs the memory.
 * The child dies at the gate and the call fails with EINTR; the guest
 * does not panic for want of a victim.
 */
static void test_gate_oom(void)
{
	const char *test = "gate_oom";
	const char *stores[] = { "/data/store", "/data/store2", "/data/store3" };
	long avail = mem_available_kib();
	size_t big = (size_t)avail * 1024 / 2, hog = (size_t)avail * 1024 * 3 / 4;
	struct tracer t = {
		.test = test,
		.deadline = now_ns() + 120 * 1000000000L,
		.first_fork = oom_at_fork,
		.ctx = &hog,
	};
	int st, i;
	pid_t pid;

	if (avail <= 0) {
		fail(test, "no MemAvailable in /proc/meminfo");
		return;
	}
	/* qemu/run.sh takes the OOM reports between the two marks as expected. */
	write_file("/dev/kmsg", "branch_test: gate_oom begins\n");
	reset_shared();
	/* Only the child may be chosen: this program, the hog and the daemons not. */
	set_oom_score_adj(getpid(), -1000);
	for (i = 0; i < 3; i++)
		if (daemon_of(stores[i]))
			set_oom_score_adj(daemon_of(stores[i]), -1000);
	pid = fork();
	if (pid == 0) {
		struct oom_caller c = { .size = big };
		char names[1][BR_NAME_MAX];
		pthread_t th;
		pid_t pids[1];
		size_t off;
		long r;

		set_oom_score_adj(getpid(), 0);
		c.mem = mmap(NULL, big, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (c.mem == MAP_FAILED)
			_exit(10);
		for (off = 0; off < big; off += 4096)
			c.mem[off] = (char)(off >> 12) | 1;
		pthread_create(&th, NULL, oom_unmapper, &c);
		ptrace(PTRACE_TRACEME, 0, 0, 0);
		raise(SIGSTOP);
		r = create(MNT, 0, 1, pids, names);
		if (r > 0)
			_exit(0);	/* started: the OOM killer took something else */
		_exit(r == 0 ? 4 : errno == EINTR ? 3 : 5);
	}
	if (trace_forks(test, pid))
		goto out;
	t.caller = pid;
	st = trace_caller(&t);
	if (st != -1 && !exited(st, 3))
		fail(test, "caller ended with %#x, want exit 3 (BR_CREATE failed with EINTR: "
		     "its child was killed at the gate); 4: created, 5: another error", st);
	while (waitpid(-1, &st, __WALL | WNOHANG) > 0)
		;
out:
	write_file("/dev/kmsg", "branch_test: gate_oom ends\n");
	set_oom_score_adj(getpid(), 0);
	if (wait_views(MNT, 0))
		fail(test, "%d branches left", count_views(MNT));
	pass(test);
}

#define FREEZER1 "/tmp/freezer1"

/* gate_freeze, with the caller held at its fork event: both freezers. */
static void freeze_at_fork(struct tracer *t)
{
	char buf[64] = "";
	int i;

	/*
	 * A task that was running when FROZEN was written is frozen only
	 * by the next write, as for any cgroup v1 freezer user: write it
	 * until the state is FROZEN.
	 */
	for (i = 0; i < 5000; i++) {
		if (write_file(FREEZER1 "/branch_test/freezer.state", "FROZEN")) {
			fail(t->test, "freezer.state FROZEN: %s", strerror(errno));
			break;
		}
		if (!read_file(FREEZER1 "/branch_test/freezer.state", buf, sizeof(buf)) &&
		    !strncmp(buf, "FROZEN", 6))
			break;
		usleep(1000);
	}
	if (strncmp(buf, "FROZEN", 6))
		fail(t->test, "the cgroup freezer stays %.8s with a child at the gate", buf);
	write_file(FREEZER1 "/branch_test/freezer.state", "THAWED");
	write_file("/sys/module/suspend/parameters/pm_test_delay", "1");
	if (!write_file("/sys/power/pm_test", "freezer") &&
	    write_file("/sys/power/state", "freeze"))
		fail(t->test, "suspend's freezer, with a child at the gate: %s", strerror(errno));
	write_file("/sys/power/pm_test", "none");
}

/*
 * The freezers freeze a child waiting at the gate, and the caller held at
 * its fork event; both go on once thawed: cgroup v1's freezer (it reaches
 * the child through the cgroup, and stays FREEZING while a task is not
 * frozen), and suspend's, which walks every process (/sys/power/pm_test
 * "freezer": freeze every task, then thaw).
 */
static void test_gate_freeze(void)
{
	const char *test = "gate_freeze";
	const char *cg = FREEZER1 "/branch_test";
	struct tracer t = {
		.test = test,
		.deadline = now_ns() + 60 * 1000000000L,
		.first_fork = freeze_at_fork,
	};
	int st;
	pid_t pid;

	if ((mkdir(FREEZER1, 0755) && errno != EEXIST) || mount("cgroup", FREEZER1, "cgroup", 0, "freezer")) {
		fail(test, "mount a cgroup v1 freezer hierarchy: %s", strerror(errno));
		return;
	}
	if (mkdir(cg, 0755) && errno != EEXIST) {
		fail(test, "mkdir %s: %s", cg, strerror(errno));
		goto out;
	}
	if (access("/sys/power/pm_test", W_OK))
		fail(test, "no /sys/power/pm_test: %s", strerror(errno));
	reset_shared();
	pid = fork();
	if (pid == 0) {
		char names[2][BR_NAME_MAX];
		pid_t pids[2];
		int s0 = 0, s1 = 0;
		long r;

		if (write_file(FREEZER1 "/branch_test/cgroup.procs", "0"))
			_exit(3);
		ptrace(PTRACE_TRACEME, 0, 0, 0);
		raise(SIGSTOP);
		r = create(MNT, BR_FS, 2, pids, names);
		if (r > 0) {
			__atomic_add_fetch(&sh->done, 1, __ATOMIC_ACQ_REL);
			_exit(0);
		}
		if (r < 0)
			_exit(1);
		waitpid(pids[0], &s0, __WALL);
		waitpid(pids[1], &s1, __WALL);
		_exit(exited(s0, 0) && exited(s1, 0) ? 0 : 2);
	}
	if (trace_forks(test, pid))
		goto out;
	t.caller = pid;
	st = trace_caller(&t);
	if (st != -1 && !exited(st, 0))
		fail(test, "caller ended with %#x (1: BR_CREATE failed, 2: a child's end, "
		     "3: setup)", st);
	if (t.forks != 2)
		fail(test, "%d fork events, want 2", t.forks);
	if (sh->done != 2)
		fail(test, "%d children ran, want 2", sh->done);
	while (waitpid(-1, &st, __WALL | WNOHANG) > 0)
		;
	if (wait_views(MNT, 0))
		fail(test, "%d branches left", count_views(MNT));
out:
	rmdir(cg);
	if (umount2(FREEZER1, 0))
		fail(test, "umount %s: %s", FREEZER1, strerror(errno));
	pass(test);
}

/* The uid (plus one) of the sender of a SIGCONT the child of branch() got. */
static void note_sigcont(int sig, siginfo_t *si, void *uc)
{
	(void)sig;
	(void)uc;
	sh->err[3] = si->si_uid + 1;
}

static void *session_mover(void *arg)
{
	(void)arg;
	wait_step(1);
	sh->err[1] = setsid() < 0 ? -errno : 1;
	return NULL;
}

#define SENDERS 600

/* gate_session_pinned's senders of SIGCONT, which live until the test ends. */
struct senders {
	pid_t pid[SENDERS];
	int n;			/* how many started */
};

/*
 * gate_session_pinned, with the caller held at its fork event: once it is
 * in a session of its own, start the senders, each in a new session.
 */
static void session_at_fork(struct tracer *t)
{
	struct senders *s = t->ctx;
	pid_t p;

	set_step(1);
	while (!sh->err[1])
		usleep(1000);
	if (sh->err[1] != 1)
		fail(t->test, "setsid: %s", strerror(-sh->err[1]));
	for (s->n = 0; s->n < SENDERS; s->n++) {
		p = fork();
		if (p == 0) {
			if (setsid() < 0 || setuid(65534))
				_exit(1);
			kill(-1, SIGCONT);
			__atomic_add_fetch(&sh->err[2], 1, __ATOMIC_ACQ_REL);
			pause();
			_exit(0);
		}
		if (p < 0)
			break;
		s->pid[s->n] = p;
	}
	while (sh->err[2] < s->n && now_ns() < t->deadline)
		usleep(1000);
}

/*
 * A child waiting at the gate keeps its process group and session alive.
 * The caller is the last member of a session whose leader is gone; held
 * at its fork event, it moves to a session of its own (another thread
 * calls setsid()), so only the waiting child still points at the old one.
 * Were that not pinned, it would be freed and its memory reused for a new
 * session: processes of another user, each in a session of its own made
 * meanwhile, send SIGCONT to every process they may signal (kill(-1)),
 * and the kernel lets a SIGCONT through to any process of the sender's
 * session. The child must get none of them.
 */
static void test_gate_session_pinned(void)
{
	const char *test = "gate_session_pinned";
	struct senders senders = { .n = 0 };
	struct tracer t = {
		.test = test,
		.deadline = now_ns() + 120 * 1000000000L,
		.first_fork = session_at_fork,
		.ctx = &senders,
	};
	cpu_set_t all, one;
	int st, i;
	pid_t leader, pid = 0;

	reset_shared();
	/*
	 * On one CPU a freed struct pid is the next one a fork takes, as
	 * the allocator reuses the last freed object first.
	 */
	sched_getaffinity(0, sizeof(all), &all);
	CPU_ZERO(&one);
	CPU_SET(0, &one);
	sched_setaffinity(0, sizeof(one), &one);
	leader = fork();
	if (leader == 0) {
		pid_t parent = getppid();

		pid_t caller;

		if (setsid() < 0)
			_exit(1);
		caller = fork();
		if (caller == 0) {
			struct sigaction sa = { .sa_sigaction = note_sigcont, .sa_flags = SA_SIGINFO };
			char names[1][BR_NAME_MAX];
			pthread_t th;
			pid_t pids[1];
			long r;

			/* The session's leader ends; this test reaps it and adopts us. */
			while (getppid() != parent)
				usleep(1000);
			sigaction(SIGCONT, &sa, NULL);
			pthread_create(&th, NULL, session_mover, NULL);
			ptrace(PTRACE_TRACEME, 0, 0, 0);
			raise(SIGSTOP);
			r = create(MNT, 0, 1, pids, names);
			if (r > 0)
				_exit(sh->err[3] ? 1 : 0);
			if (r < 0)
				_exit(3);
			if (waitpid(pids[0], &st, __WALL) != pids[0])
				_exit(4);
			_exit(exited(st, 0) ? 0 : 2);
		}
		sh->pids[0] = caller;
		_exit(caller > 0 ? 0 : 1);
	}
	if (waitpid(leader, &st, 0) != leader || !exited(st, 0) || sh->pids[0] <= 0) {
		fail(test, "session leader ended with %#x", st);
		goto out;
	}
	pid = sh->pids[0];
	if (trace_forks(test, pid))
		goto out;
	t.caller = pid;
	st = trace_caller(&t);
	if (st != -1 && !exited(st, 0))
		fail(test, "caller ended with %#x (exit 2: the child got a SIGCONT from uid %d, "
		     "3: BR_CREATE failed, 4: no child)", st, sh->err[3] - 1);
	if (t.forks != 1)
		fail(test, "%d fork events, want 1", t.forks);
	if (senders.n < SENDERS / 2)
		fail(test, "only %d senders started", senders.n);
out:
	for (i = 0; i < senders.n; i++)
		kill(senders.pid[i], SIGKILL);
	for (i = 0; i < senders.n; i++)
		waitpid(senders.pid[i], &st, 0);
	while (waitpid(-1, &st, __WALL | WNOHANG) > 0)
		;
	sched_setaffinity(0, sizeof(all), &all);
	if (wait_views(MNT, 0))
		fail(test, "%d branches left", count_views(MNT));
	pass(test);
}

static void run_ctl(const char *arg) { (void)arg; test_control_file_identified(); }
static void run_name_limits(const char *arg) { (void)arg; test_name_limits(); }
static void run_threads_fds(const char *arg) { (void)arg; test_commit_threads_fds(); }
static void run_daemon_stopped(const char *arg) { (void)arg; test_daemon_stopped(); }
static void run_gate_freeze(const char *arg) { (void)arg; test_gate_freeze(); }
static void run_gate_oom(const char *arg) { (void)arg; test_gate_oom(); }
static void run_gate_session(const char *arg) { (void)arg; test_gate_session_pinned(); }

static void run_fence_on(const char *arg) { run_fence(arg, BR_FS | BR_ISOLATE, EPERM); }
static void run_fence_off(const char *arg) { run_fence(arg, BR_FS, 0); }
static void run_rebase(const char *arg) { (void)arg; test_fs_rebase(); }
static void run_traced(const char *arg) { (void)arg; test_traced(); }
static void run_pidfds(const char *arg) { (void)arg; test_pidfds_and_attr(); }
static void run_limits(const char *arg) { (void)arg; test_limits(); }
static void run_locked(const char *arg) { (void)arg; test_view_locked(); }
static void run_winner(const char *arg) { (void)arg; test_winner_after_commit(); }
static void run_nproc(const char *arg) { (void)arg; test_nproc_unprivileged(); }
static void run_perf(const char *arg) { (void)arg; test_perf_fork(); }
static void run_unstarted(const char *arg) { (void)arg; test_unstarted(); }
static void run_cgkill(const char *arg) { (void)arg; test_gate_cgroup_kill(); }
static void run_trace(const char *arg) { (void)arg; test_trace_fork(); }
static void run_nproc_fs(const char *arg) { (void)arg; test_nproc_fs(); }

static const struct test {
	const char *name;
	void (*fn)(const char *arg);
	const char *arg;
} tests[] = {
	{ "bad_input", run_bad_input, NULL },
	{ "create_n1", run_create, "1" },
	{ "create_n3", run_create, "3" },
	{ "create_n8", run_create, "8" },
	{ "create_n64", run_create, "64" },
	{ "commit_race", run_commit_race, NULL },
	{ "abort", run_abort, NULL },
	{ "nesting", run_nesting, NULL },
	{ "isolate", run_isolate_on, "isolate" },
	{ "no_isolate_control", run_isolate_off, "no_isolate_control" },
	{ "close_fds", run_close_on, "close_fds" },
	{ "no_close_fds_control", run_close_off, "no_close_fds_control" },
	{ "grandchild_killed", run_grandchild, NULL },
	{ "failed_fs_commit", run_failed_commit, NULL },
	{ "partial_failure", run_partial, NULL },
	{ "signals_during_create", run_signals, NULL },
	{ "names_copied_once", run_names, NULL },
	{ "confined_view", run_confined, NULL },
	{ "caller_killed", run_killed, NULL },
	{ "fence_more", run_fence_on, "fence_more" },
	{ "no_fence_more_control", run_fence_off, "no_fence_more_control" },
	{ "fs_rebase", run_rebase, NULL },
	{ "traced_fork_events", run_traced, NULL },
	{ "pidfds_and_attr", run_pidfds, NULL },
	{ "limits", run_limits, NULL },
	{ "view_locked", run_locked, NULL },
	{ "winner_after_commit", run_winner, NULL },
	{ "nproc_unprivileged", run_nproc, NULL },
	{ "perf_fork_records", run_perf, NULL },
	{ "unstarted_child", run_unstarted, NULL },
	{ "gate_cgroup_kill", run_cgkill, NULL },
	{ "trace_fork_event", run_trace, NULL },
	{ "nproc_fs_unprivileged", run_nproc_fs, NULL },
	{ "control_file_identified", run_ctl, NULL },
	{ "name_limits", run_name_limits, NULL },
	{ "commit_threads_fds", run_threads_fds, NULL },
	{ "daemon_stopped", run_daemon_stopped, NULL },
	{ "gate_freeze", run_gate_freeze, NULL },
	{ "gate_session_pinned", run_gate_session, NULL },
	/* Last: on a kernel whose OOM killer cannot see the child, the guest panics. */
	{ "gate_oom", run_gate_oom, NULL },
};

#define N_TESTS (sizeof(tests) / sizeof(tests[0]))

/* Runs one test and prints its TAP line; n counts from 1. */
static void run_test(unsigned int n, const char *name, void (*fn)(const char *), const char *arg)
{
	if (fn) {
		test_failed = test_passed = 0;
		fn(arg);
	}
	if (test_passed && !test_failed) {
		printf("ok %u %s\n", n, name);
	} else {
		if (!test_failed)
			printf("# %s returned without a verdict\n", name);
		printf("not ok %u %s\n", n, name);
		failures++;
	}
	fflush(stdout);
}

int main(int argc, char **argv)
{
	unsigned int i;

	sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (sh == MAP_FAILED)
		return 2;
	setvbuf(stdout, NULL, _IOLBF, 0);
	prctl(PR_SET_CHILD_SUBREAPER, 1);
	printf("TAP version 13\n1..%zu\n", N_TESTS + 1);
	test_failed = test_passed = 0;
	if (branch_available() != 0) {
		fail("available", "%s has no branch(): %s", BRANCH_SYSFS, strerror(errno));
		run_test(1, "available", NULL, NULL);
		return 1;
	}
	pass("available");
	run_test(1, "available", NULL, NULL);
	for (i = 0; i < N_TESTS; i++)
		run_test(i + 2, tests[i].name, tests[i].fn, tests[i].arg ? tests[i].arg : tests[i].name);
	if (argc < 2 || strcmp(argv[1], "--no-bench"))
		bench();
	return failures ? 1 : 0;
}
