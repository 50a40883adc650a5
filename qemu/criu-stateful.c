// SPDX-License-Identifier: MIT
/*
 * A process whose state only a faithful restore keeps, for the checkpoint
 * tests of qemu/criu-test.sh: a counter and a random seed in memory, a
 * large allocation in which every 64-bit word holds a different value, a
 * workspace file held open, and a child that knows a secret. It writes
 * DIR/ready, then waits until it finds /run/branchfs/clone/id (a restored
 * clone's generation id): it then checks all of its state, writes the
 * result to DIR/result and through the open file, and exits 0 when all of
 * it held.
 *
 * The counter counts SIGUSR2 signals, each acknowledged by writing its
 * value to /tmp/counter (outside the branch, which a checkpoint that
 * leaves the process running makes read-only), so that a test knows the
 * value a checkpoint holds and a clone reports the one it was restored
 * with. SIGUSR1 gives every
 * 100th page of the allocation new contents (another generation of
 * values) and then creates /tmp/touched (for the incremental checkpoint
 * tests). With "write", it also writes DIR/heartbeat every millisecond
 * and remembers any error, which a clone reports: a checkpoint must stop
 * it before its branch turns read-only.
 * Its first output after a restore, DIR/first, comes once it has read its
 * hot pages (1% of the allocation, spread over it: every 100th page from
 * the one /tmp/hot-offset names, 0 without it, read after the restore: the
 * restored process's input); with "hot" it checks only those and not the
 * whole allocation (the lazy restore benchmark's working set). With
 * "fixed" its hot pages are HOT_PAGES whatever its size, as far apart as
 * they can be (every MIBth page): a working set of fixed size in which no
 * page is near another, the worst case for a restore that fetches them;
 * and its child is forked before the allocation, so that the tree's
 * memory is MIB, not twice that.
 *
 * Usage: criu-stateful DIR MIB [hot|fixed|write]
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t touch, bump;

static void on_usr1(int sig)
{
	(void)sig;
	touch = 1;
}

static void on_usr2(int sig)
{
	(void)sig;
	bump++;
}

/*
 * The value of word i in generation gen: i and gen, both below 2^40 and
 * 2^24, make one 64-bit number, which multiplying by an odd constant
 * maps to a different one for each pair; the seed's XOR keeps them apart.
 * A word from any other place, or of another generation, differs.
 */
static uint64_t word(size_t i, uint64_t gen, uint64_t seed)
{
	return (((uint64_t)i | gen << 40) * 0x9e3779b97f4a7c15ULL) ^ seed;
}

#define WORDS_PER_PAGE (4096 / sizeof(uint64_t))
#define TOUCH_STRIDE 100 /* pages */
#define HOT_STRIDE 100 /* pages: 1% */
#define HOT_PAGES 256 /* with "fixed": a MiB is 256 pages, so every MIBth page */

/* The generation of the words of page p after touches SIGUSR1s. */
static uint64_t gen_of(size_t p, uint64_t touches)
{
	return p % TOUCH_STRIDE == 0 ? touches : 0;
}

/* /tmp/counter holds value, whole when it appears. */
static void write_counter(long value)
{
	FILE *f = fopen("/tmp/counter.tmp", "w");

	if (!f)
		return;
	fprintf(f, "%ld\n", value);
	fclose(f);
	rename("/tmp/counter.tmp", "/tmp/counter");
}

/* The child that knows the secret: it answers each byte on in with it on out. */
static pid_t start_child(int in, int out, unsigned int secret)
{
	pid_t child = fork();
	char c;

	if (child) /* or -1: no child */
		return child;
	while (read(in, &c, 1) == 1)
		if (write(out, &secret, sizeof(secret)) != sizeof(secret))
			_exit(1);
	_exit(0);
}

int main(int argc, char **argv)
{
	char path[4096], id[128] = "", line[512], writes[64] = "ok";
	int req[2], rep[2], fd, hb = -1, ok, alloc_ok, child_ok, hot, fixed, writer;
	long counter = 0, beats = 0, write_errors = 0, first_errno = 0;
	unsigned int secret;
	uint64_t seed, touches = 0, *mem;
	size_t size, pages, words, i, p, stride;
	pid_t child = -1;
	FILE *f;

	fixed = argc == 4 && !strcmp(argv[3], "fixed");
	hot = fixed || (argc == 4 && !strcmp(argv[3], "hot"));
	writer = argc == 4 && !strcmp(argv[3], "write");
	if (argc != 3 && !hot && !writer)
		return 2;
	/* A session of its own: its session leader must be in the tree. */
	setsid();
	size = (size_t)atol(argv[2]) << 20;
	pages = size / 4096;
	words = size / sizeof(uint64_t);
	stride = fixed ? pages / HOT_PAGES : HOT_STRIDE;
	if (!size || !stride)
		return 2;
	if (getrandom(&seed, sizeof(seed), 0) != sizeof(seed) ||
	    getrandom(&secret, sizeof(secret), 0) != sizeof(secret))
		return 2;
	snprintf(path, sizeof(path), "%s/state.log", argv[1]);
	fd = open(path, O_WRONLY | O_APPEND | O_CREAT, 0644);
	if (fd < 0 || pipe(req) || pipe(rep))
		return 2;
	/*
	 * With "fixed", the child comes before the allocation, so that the
	 * tree's memory is MIB and not twice that (a child forked after it
	 * has a copy of its own in the checkpoint).
	 */
	if (fixed)
		child = start_child(req[0], rep[1], secret);
	mem = malloc(size);
	if (!mem)
		return 2;
	for (i = 0; i < words; i++)
		mem[i] = word(i, 0, seed);
	if (writer) {
		snprintf(path, sizeof(path), "%s/heartbeat", argv[1]);
		hb = open(path, O_WRONLY | O_CREAT, 0644);
		if (hb < 0)
			return 2;
	}
	dprintf(fd, "started\n");
	if (!fixed)
		child = start_child(req[0], rep[1], secret);
	if (child < 0)
		return 2;
	signal(SIGUSR1, on_usr1);
	signal(SIGUSR2, on_usr2);
	write_counter(counter);
	snprintf(path, sizeof(path), "%s/ready", argv[1]);
	f = fopen(path, "w");
	if (!f)
		return 2;
	fprintf(f, "ready\n");
	fclose(f);
	for (;;) {
		struct timespec ts = { 0, writer ? 1000000 : 2000000 };

		if (bump) {
			counter += bump;
			bump = 0;
			write_counter(counter);
		}
		if (touch) {
			touch = 0;
			touches++;
			for (p = 0; p < pages; p += TOUCH_STRIDE)
				for (i = p * WORDS_PER_PAGE; i < (p + 1) * WORDS_PER_PAGE; i++)
					mem[i] = word(i, touches, seed);
			close(open("/tmp/touched", O_WRONLY | O_CREAT, 0644));
		}
		if (writer) {
			beats++;
			if (pwrite(hb, &beats, sizeof(beats), 0) != sizeof(beats)) {
				if (!write_errors++)
					first_errno = errno;
			}
		}
		f = fopen("/run/branchfs/clone/id", "r");
		if (f) {
			if (!fgets(id, sizeof(id), f))
				id[0] = 0;
			fclose(f);
			id[strcspn(id, "\n")] = 0;
			break;
		}
		nanosleep(&ts, NULL);
	}
	/* The hot pages first: one word of every stride-th page from the offset. */
	f = fopen("/tmp/hot-offset", "r");
	p = 0;
	if (f) {
		if (fscanf(f, "%zu", &p) != 1)
			p = 0;
		fclose(f);
	}
	for (p %= stride; p < pages; p += stride)
		if (mem[p * WORDS_PER_PAGE] != word(p * WORDS_PER_PAGE, gen_of(p, touches), seed))
			break;
	alloc_ok = p >= pages;
	snprintf(path, sizeof(path), "%s/first", argv[1]);
	close(open(path, O_WRONLY | O_CREAT, 0644));
	if (!hot) {
		for (i = 0; i < words; i++)
			if (mem[i] != word(i, gen_of(i / WORDS_PER_PAGE, touches), seed))
				break;
		alloc_ok = i == words;
	}
	{
		unsigned int got = 0;
		char c = 'x';

		child_ok = write(req[1], &c, 1) == 1 &&
			   read(rep[0], &got, sizeof(got)) == sizeof(got) && got == secret;
	}
	if (write_errors)
		snprintf(writes, sizeof(writes), "%ld-errors-first-%s", write_errors, strerror((int)first_errno));
	ok = alloc_ok && child_ok && !write_errors;
	snprintf(line, sizeof(line), "clone %s counter=%ld alloc=%s child=%s writes=%s\n", id, counter,
		 alloc_ok ? "ok" : "bad", child_ok ? "ok" : "bad", writes);
	if (write(fd, line, strlen(line)) != (ssize_t)strlen(line))
		ok = 0;
	snprintf(path, sizeof(path), "%s/result", argv[1]);
	f = fopen(path, "w");
	if (!f)
		return 3;
	fputs(line, f);
	fclose(f);
	kill(child, SIGKILL);
	waitpid(child, NULL, 0);
	return ok ? 0 : 1;
}
