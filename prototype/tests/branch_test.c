// SPDX-License-Identifier: MIT
/*
 * branch_test - drives the branch() system call against a branchfs mount.
 *
 * Run inside the QEMU guest (qemu/init.sh): /work is a branchfs mount of
 * /base, /lim one of /base2 that allows at most two unfinished branches.
 * Prints "PASS name" or "FAIL name: why" per test and "BENCH" lines.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>

#include "branch.h"

#define MNT "/work"
#define LIM "/lim"

static int failures;

/* Memory the parent and the children share across fork. */
struct shared {
	volatile int step;
	volatile int done;
	volatile pid_t pids[BR_MAX_BRANCHES];
	volatile pid_t grandchild;
	volatile int err[8];
	volatile long ns[BR_MAX_BRANCHES];
};

static struct shared *sh;

static void reset_shared(void)
{
	memset(sh, 0, sizeof(*sh));
}

static int fail(const char *test, const char *fmt, ...)
{
	va_list ap;

	printf("FAIL %s: ", test);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
	fflush(stdout);
	failures++;
	return -1;
}

static void pass(const char *test)
{
	printf("PASS %s\n", test);
	fflush(stdout);
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

/* BR_CREATE with N children, each writing into its own branch via BR_FS. */
static void test_create(unsigned int n)
{
	char test[32], path[512], buf[64];
	pid_t pids[BR_MAX_BRANCHES];
	char names[BR_MAX_BRANCHES][BR_NAME_MAX];
	long t0, r;
	unsigned int i, j;
	int status;

	snprintf(test, sizeof(test), "create_n%u", n);
	t0 = now_ns();
	r = create(MNT, BR_FS, n, pids, names);
	if (r > 0) {
		snprintf(buf, sizeof(buf), "%ld", r);
		_exit(write_file(MNT "/child.txt", buf) == 0 ? 0 : 1);
	}
	if (r < 0) {
		fail(test, "BR_CREATE: %s", strerror(errno));
		return;
	}
	printf("BENCH create_n%u: %ld us\n", n, (now_ns() - t0) / 1000);
	for (i = 0; i < n; i++) {
		if (wait_deadline(pids[i], &status, 20) < 0 || !exited(status, 0)) {
			fail(test, "child %u (pid %d) did not write its file (status %#x)", i + 1, pids[i], status);
			goto out;
		}
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
	pass(test);
out:
	for (i = 0; i < n; i++)
		abort_branch(MNT, names[i]);
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
		for (i = 0; i < 3; i++)
			if (i + 1 != winner)
				abort_branch(MNT, names[i]);
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

/* BR_ABORT drops the branch and ends the caller. */
static void test_abort(void)
{
	const char *test = "abort";
	char names[1][BR_NAME_MAX], path[512];
	pid_t pid;
	int status;
	long r = create(MNT, BR_FS, 1, &pid, names);

	if (r > 0) {
		if (write_file(MNT "/aborted.txt", "x") < 0)
			_exit(1);
		abort_self();
		_exit(5);	/* abort returned: it failed */
	}
	if (r < 0) {
		fail(test, "BR_CREATE: %s", strerror(errno));
		return;
	}
	if (wait_deadline(pid, &status, 20) < 0 || !exited(status, 0)) {
		fail(test, "child status %#x, want exit 0 from BR_ABORT", status);
		return;
	}
	snprintf(path, sizeof(path), MNT "/@%s", names[0]);
	if (exists(path)) {
		fail(test, "%s still exists", path);
		return;
	}
	if (exists(MNT "/aborted.txt")) {
		fail(test, "an aborted write reached the base");
		return;
	}
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

static int count_views(const char *mnt)
{
	DIR *d = opendir(mnt);
	struct dirent *e;
	int n = 0;

	if (!d)
		return -1;
	while ((e = readdir(d)))
		if (e->d_name[0] == '@')
			n++;
	closedir(d);
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
	for (i = 0; i < 2; i++) {
		wait_deadline(pids[i], &status, 20);
		abort_branch(LIM, names[i]);
	}
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
	int before = failures, fd = open(MNT, O_RDONLY | O_DIRECTORY), sub;
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
	close(sub);
	close(fd);
	rmdir(MNT "/subdir");
	if (failures == before)
		pass(test);
}

/* Mean cost of one branch with a child that exits at once, three ways. */
static void bench(void)
{
	const int iters = 30;
	char names[1][BR_NAME_MAX];
	long t0, t_fork, t_sys, t_user, c_sys = 0, c_user = 0;
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
		c_sys += sh->ns[0];

		r = create(MNT, BR_FS, 1, &pid, names);
		if (r > 0) {
			long s = now_ns();
			int fd = open(MNT "/.branchfs_ctl", O_RDONLY);

			ioctl(fd, FS_IOC_BRANCH_COMMIT);
			sh->ns[0] = now_ns() - s;
			_exit(0);
		}
		waitpid(pid, &status, 0);
		c_user += sh->ns[0];
	}
	c_sys /= iters;
	c_user /= iters;
	printf("BENCH create+child+exit: fork() %ld us, branch(BR_CREATE) %ld us, ioctl+fork+unshare+bind %ld us; "
	       "branch/fork %.2fx, branch/userspace %.2fx\n",
	       t_fork / 1000, t_sys / 1000, t_user / 1000,
	       (double)t_sys / t_fork, (double)t_sys / t_user);
	printf("BENCH commit: branch(BR_COMMIT) %ld us, open+ioctl(FS_IOC_BRANCH_COMMIT) %ld us; ratio %.2fx\n",
	       c_sys / 1000, c_user / 1000, (double)c_sys / c_user);
}

int main(int argc, char **argv)
{
	sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (sh == MAP_FAILED)
		return 2;
	setvbuf(stdout, NULL, _IOLBF, 0);
	prctl(PR_SET_CHILD_SUBREAPER, 1);
	if (branch_available() != 0) {
		fail("available", "%s has no branch(): %s", BRANCH_SYSFS, strerror(errno));
		return 1;
	}
	pass("available");

	test_bad_input();
	test_create(1);
	test_create(3);
	test_create(8);
	test_create(64);
	test_commit_race(10);
	test_abort();
	test_nesting();
	run_isolate("isolate", BR_FS | BR_ISOLATE, EPERM);
	run_isolate("no_isolate_control", BR_FS, 0);
	run_close_fds("close_fds", BR_FS | BR_CLOSE_FDS, 0);
	run_close_fds("no_close_fds_control", BR_FS, 1);
	test_grandchild_killed();
	test_failed_commit();
	test_partial_failure();
	if (argc < 2 || strcmp(argv[1], "--no-bench"))
		bench();
	return failures ? 1 : 0;
}
