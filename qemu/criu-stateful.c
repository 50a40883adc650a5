// SPDX-License-Identifier: MIT
/*
 * A process whose state only a faithful restore keeps, for the checkpoint
 * tests of qemu/criu-test.sh: a counter and a random seed in memory, a
 * large allocation filled from that seed, a workspace file held open, and
 * a child that knows a secret. It writes DIR/ready, then counts until it
 * finds /run/branchfs/clone/id (a restored clone's generation id): it then
 * checks all of its state, writes the result to DIR/result and through
 * the open file, and exits 0 when all of it held.
 * SIGUSR1 writes to 1% of the allocation's pages and then creates
 * /tmp/touched (for the incremental checkpoint test).
 * Its first output after a restore, DIR/first, comes once it has read its
 * hot pages (1% of the allocation, spread over it); with "hot" it checks
 * only those and not the whole allocation (the lazy restore benchmark's
 * working set).
 *
 * Usage: criu-stateful DIR MIB [hot]
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t touch;

static void on_usr1(int sig)
{
	(void)sig;
	touch = 1;
}

static unsigned char fill(size_t i, unsigned int seed)
{
	return (unsigned char)((i * 2654435761u) ^ seed);
}

int main(int argc, char **argv)
{
	char path[4096], id[128] = "", line[512];
	unsigned int seed, secret;
	size_t size, pages, i;
	unsigned char *mem;
	int req[2], rep[2], fd, ok, alloc_ok, child_ok;
	long counter = 0, at_ready;
	pid_t child;
	FILE *f;

	if (argc != 3 && !(argc == 4 && !strcmp(argv[3], "hot")))
		return 2;
	/* A session of its own: its session leader must be in the tree. */
	setsid();
	size = (size_t)atol(argv[2]) << 20;
	pages = size / 4096;
	if (getrandom(&seed, sizeof(seed), 0) != sizeof(seed) ||
	    getrandom(&secret, sizeof(secret), 0) != sizeof(secret))
		return 2;
	mem = malloc(size);
	if (!mem)
		return 2;
	for (i = 0; i < size; i++)
		mem[i] = fill(i, seed);
	snprintf(path, sizeof(path), "%s/state.log", argv[1]);
	fd = open(path, O_WRONLY | O_APPEND | O_CREAT, 0644);
	if (fd < 0 || pipe(req) || pipe(rep))
		return 2;
	dprintf(fd, "started\n");
	child = fork();
	if (child == 0) {
		char c;

		while (read(req[0], &c, 1) == 1)
			if (write(rep[1], &secret, sizeof(secret)) != sizeof(secret))
				_exit(1);
		_exit(0);
	}
	signal(SIGUSR1, on_usr1);
	snprintf(path, sizeof(path), "%s/ready", argv[1]);
	f = fopen(path, "w");
	if (!f)
		return 2;
	fprintf(f, "ready\n");
	fclose(f);
	at_ready = counter;
	for (;;) {
		struct timespec ts = { 0, 2000000 };

		counter++;
		if (touch) {
			touch = 0;
			/* Every 100th page, rewritten with what it holds. */
			for (i = 0; i < pages; i += 100)
				mem[i * 4096] = fill(i * 4096, seed);
			close(open("/tmp/touched", O_WRONLY | O_CREAT, 0644));
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
	for (i = 0; i < pages && mem[i * 4096] == fill(i * 4096, seed); i += 100)
		;
	alloc_ok = i >= pages;
	snprintf(path, sizeof(path), "%s/first", argv[1]);
	close(open(path, O_WRONLY | O_CREAT, 0644));
	if (argc == 3) {
		for (i = 0; i < size && mem[i] == fill(i, seed); i++)
			;
		alloc_ok = i == size;
	}
	{
		unsigned int got = 0;
		char c = 'x';

		child_ok = write(req[1], &c, 1) == 1 &&
			   read(rep[0], &got, sizeof(got)) == sizeof(got) && got == secret;
	}
	ok = alloc_ok && child_ok && counter > at_ready;
	snprintf(line, sizeof(line), "clone %s counter=%s alloc=%s child=%s\n", id,
		 counter > at_ready ? "kept" : "lost", alloc_ok ? "ok" : "bad", child_ok ? "ok" : "bad");
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
