// SPDX-License-Identifier: MIT
/*
 * fuse-floor: the cheapest FUSE daemon there can be, to measure what the
 * kernel's FUSE protocol costs by itself on this machine (see
 * bench/roundtrip.sh and docs/performance.md, "The floor"). It has a
 * directory of its own: a Go package (bench) may hold no C file without cgo.
 *
 *   fuse-floor serve MNT    mount a file system of nothing at MNT and answer
 *                           its requests until it is unmounted; then print
 *                           how many requests of each kind came
 *   fuse-floor serve-uring MNT   the same through FUSE over io_uring: a queue
 *                           per CPU, each answered by a thread pinned to it
 *                           (needs /sys/module/fuse/parameters/enable_uring)
 *   fuse-floor serve-store MNT FILE   the same, but every file created at
 *                           MNT is stored in FILE, on a real file system:
 *                           a create makes FILE anew, a WRITE is pwrite(2)
 *                           to it at the offset, FSYNC is fsync(2) of it, an
 *                           unlink removes it (one file at a time)
 *   fuse-floor serve-splice MNT FILE  serve-store reading each request with
 *                           splice(2) into a pipe and splicing a WRITE's
 *                           payload from there into FILE: the kernel moves
 *                           the written pages into the pipe, one copy less
 *   fuse-floor stat DIR N   stat(2) N distinct names that do not exist in
 *                           DIR; print the mean microseconds per call
 *   fuse-floor write FILE MIB [w]   create FILE (O_RDWR, as Go's os.Create
 *                           in the bench's write workload; with w,
 *                           O_WRONLY as a shell's >), write MIB MiB to it in
 *                           64 KiB blocks, fsync and close it; print MiB per
 *                           second, then remove it
 *
 * The server is one thread in blocking read(2) and write(2) on /dev/fuse,
 * written from <linux/fuse.h> alone (no libfuse). It stores nothing: a
 * lookup of a name fails with ENOENT and no negative entry (every lookup
 * is a round trip); a create or mkdir makes a node that remembers its
 * attributes only, and whose name the kernel keeps for an hour as it does
 * branchfs's, so that it never looks one up; writes are counted and dropped; there are no xattrs
 * (ENODATA, so the kernel keeps asking, as it must of a daemon that keeps
 * them). With FUSE_FLOOR_DIRECT_IO set, created files are opened with
 * FOPEN_DIRECT_IO: a WRITE carries the caller's own pages. It asks at INIT for what branchfs asks that changes which
 * requests the kernel sends (atomic O_TRUNC, KILLPRIV_V2, no umask,
 * default_permissions, no writeback cache), so that `tar -xf` into it
 * sends the requests an extraction sends branchfs. With FUSE_FLOOR_WRITEBACK
 * set it asks for the writeback cache as well, which passthrough excludes.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/fuse.h>
#include <linux/io_uring.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define MAX_WRITE (1 << 20)
#define SPLICE_WRITE (256 << 10)
#define TIMEOUT 3600 /* seconds of entry and attribute validity, as branchfs */

static struct fuse_attr *nodes; /* by node ID; 1 is the root */
static uint64_t nnodes, capnodes;
static uint64_t counts[64], through_uring;

static uint64_t newnode(uint32_t mode, uint32_t uid, uint32_t gid)
{
	struct timespec now;

	if (nnodes == capnodes) {
		capnodes = capnodes ? 2 * capnodes : 1024;
		nodes = realloc(nodes, capnodes * sizeof(*nodes));
		if (!nodes)
			abort();
	}
	clock_gettime(CLOCK_REALTIME, &now);
	memset(&nodes[nnodes], 0, sizeof(nodes[0]));
	nodes[nnodes] = (struct fuse_attr){
		.ino = nnodes, .mode = mode, .nlink = S_ISDIR(mode) ? 2 : 1,
		.uid = uid, .gid = gid, .blksize = 4096,
		.atime = now.tv_sec, .mtime = now.tv_sec, .ctime = now.tv_sec,
	};
	return nnodes++;
}

#define NOREPLY 1 /* answer's result for FORGET and INTERRUPT */

/* FUSE over io_uring (protocol 7.42; <linux/fuse.h> here may be older). */
#define INIT_EXT (1u << 30)
#define OVER_IO_URING_FLAGS2 (1u << 9) /* FUSE_OVER_IO_URING, bit 41 */
struct uring_header {
	char in_out[128]; /* fuse_in_header, then fuse_out_header */
	char op_in[128]; /* the request's first argument */
	struct {
		uint64_t flags, commit_id;
		uint32_t payload_sz, padding;
		uint64_t reserved;
	} ent;
};
struct uring_cmd {
	uint64_t flags, commit_id;
	uint16_t qid;
	uint8_t padding[6];
};
enum { URING_REGISTER = 1, URING_COMMIT_AND_FETCH = 2 };

static int uring; /* serve through io_uring queues, one thread per CPU */
/* serve-store and serve-splice: the file that holds what is written. */
static const char *backing;
static int backfd = -1;
static int splicing; /* a WRITE's payload is stored before answer */

/* store makes the backing file anew for a create (keep 0) or removes it. */
static int store(int keep)
{
	if (backfd >= 0)
		close(backfd);
	backfd = -1;
	if (unlink(backing) < 0 && errno != ENOENT)
		return -errno;
	if (keep && (backfd = open(backing, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644)) < 0)
		return -errno;
	return 0;
}
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static void setattr(struct fuse_attr *a, const struct fuse_setattr_in *in)
{
	if (in->valid & FATTR_MODE)
		a->mode = (a->mode & S_IFMT) | (in->mode & 07777);
	if (in->valid & FATTR_UID)
		a->uid = in->uid;
	if (in->valid & FATTR_GID)
		a->gid = in->gid;
	if (in->valid & FATTR_SIZE)
		a->size = in->size;
	if (in->valid & FATTR_ATIME)
		a->atime = in->atime, a->atimensec = in->atimensec;
	if (in->valid & FATTR_MTIME)
		a->mtime = in->mtime, a->mtimensec = in->mtimensec;
}

/*
 * answer puts the reply to the request in, whose first argument (the
 * only one read) is at arg, at out; it returns the reply's length, a
 * negative errno, or NOREPLY.
 */
static int answer(const struct fuse_in_header *in, const void *arg, void *out)
{
	struct fuse_entry_out *e = out;
	struct fuse_attr_out *a = out;

	__atomic_fetch_add(&counts[in->opcode & 63], 1, __ATOMIC_RELAXED);
	switch (in->opcode) {
	case FUSE_INIT: {
		const struct fuse_init_in *ii = arg;
		struct fuse_init_out *o = out;

		memset(o, 0, sizeof(*o));
		o->major = FUSE_KERNEL_VERSION;
		o->minor = ii->minor < FUSE_KERNEL_MINOR_VERSION ? ii->minor : FUSE_KERNEL_MINOR_VERSION;
		o->max_readahead = ii->max_readahead;
		o->flags = ii->flags & (FUSE_ASYNC_READ | FUSE_BIG_WRITES | FUSE_ATOMIC_O_TRUNC |
					FUSE_HANDLE_KILLPRIV_V2 | FUSE_DONT_MASK | FUSE_MAX_PAGES |
					FUSE_PARALLEL_DIROPS);
		/* What a daemon without passthrough may ask for instead. */
		if (getenv("FUSE_FLOOR_WRITEBACK"))
			o->flags |= ii->flags & FUSE_WRITEBACK_CACHE;
		if (uring) {
			if (!(ii->flags & INIT_EXT) || !(ii->flags2 & OVER_IO_URING_FLAGS2)) {
				fprintf(stderr, "fuse-floor: no FUSE over io_uring (enable_uring?)\n");
				exit(1);
			}
			o->flags |= INIT_EXT;
			o->flags2 = OVER_IO_URING_FLAGS2;
		}
		/* A spliced request must fit the pipe (pipe-max-size, 1 MiB). */
		o->max_write = splicing ? SPLICE_WRITE : MAX_WRITE;
		o->max_pages = o->max_write / 4096;
		o->time_gran = 1;
		return sizeof(*o);
	}
	case FUSE_LOOKUP:
		return -ENOENT;
	case FUSE_FORGET:
	case FUSE_BATCH_FORGET:
	case FUSE_INTERRUPT:
		return NOREPLY;
	case FUSE_GETXATTR:
	case FUSE_LISTXATTR:
		return -ENODATA;
	case FUSE_UNLINK:
		return backing ? store(0) : 0;
	case FUSE_FSYNC:
		return backing && backfd >= 0 && fsync(backfd) < 0 ? -errno : 0;
	case FUSE_READDIR:
	case FUSE_READ:
	case FUSE_RELEASE:
	case FUSE_RELEASEDIR:
	case FUSE_RMDIR:
	case FUSE_FSYNCDIR:
		return 0; /* nothing to read or to keep */
	case FUSE_STATFS: {
		struct fuse_statfs_out *o = out;

		memset(o, 0, sizeof(*o));
		o->st.bsize = o->st.frsize = 4096;
		o->st.namelen = 255;
		return sizeof(*o);
	}
	case FUSE_OPEN:
	case FUSE_OPENDIR: {
		struct fuse_open_out *o = out;

		memset(o, 0, sizeof(*o));
		o->fh = in->nodeid;
		return sizeof(*o);
	}
	case FUSE_CREATE:
		if (backing) {
			int err = store(1);

			if (err)
				return err;
		}
		break;
	case FUSE_GETATTR:
	case FUSE_SETATTR:
	case FUSE_WRITE:
	case FUSE_MKDIR:
		break;
	default:
		/* FLUSH, ACCESS and the rest: ENOSYS, which the kernel
		 * remembers for FLUSH and ACCESS, as it does for branchfs. */
		return -ENOSYS;
	}
	/* The requests that read or make nodes. */
	pthread_mutex_lock(&mu);
	switch (in->opcode) {
	case FUSE_GETATTR:
	case FUSE_SETATTR:
		if (in->opcode == FUSE_SETATTR)
			setattr(&nodes[in->nodeid], arg);
		memset(a, 0, sizeof(*a));
		a->attr_valid = TIMEOUT;
		a->attr = nodes[in->nodeid];
		pthread_mutex_unlock(&mu);
		return sizeof(*a);
	case FUSE_WRITE: {
		const struct fuse_write_in *wi = arg;
		struct fuse_write_out *o = out;

		/* The payload follows the argument (spliced already if splicing). */
		if (backing && !splicing &&
		    pwrite(backfd, (const char *)(wi + 1), wi->size, wi->offset) != (ssize_t)wi->size) {
			pthread_mutex_unlock(&mu);
			return -EIO;
		}
		if (wi->offset + wi->size > nodes[in->nodeid].size)
			nodes[in->nodeid].size = wi->offset + wi->size;
		pthread_mutex_unlock(&mu);
		memset(o, 0, sizeof(*o));
		o->size = wi->size;
		return sizeof(*o);
	}
	}
	/* CREATE and MKDIR: a new node. */
	memset(e, 0, sizeof(*e));
	if (in->opcode == FUSE_CREATE) {
		const struct fuse_create_in *ci = arg;
		struct fuse_open_out *o = (void *)(e + 1);

		e->nodeid = newnode(S_IFREG | (ci->mode & 07777), in->uid, in->gid);
		memset(o, 0, sizeof(*o));
		o->fh = e->nodeid;
		/* Writes from the caller's pages, no page cache of the mount. */
		if (getenv("FUSE_FLOOR_DIRECT_IO"))
			o->open_flags = FOPEN_DIRECT_IO;
	} else {
		const struct fuse_mkdir_in *mi = arg;

		e->nodeid = newnode(S_IFDIR | (mi->mode & 07777), in->uid, in->gid);
	}
	e->attr = nodes[e->nodeid];
	pthread_mutex_unlock(&mu);
	e->entry_valid = e->attr_valid = TIMEOUT;
	return in->opcode == FUSE_CREATE ? sizeof(*e) + sizeof(struct fuse_open_out) : sizeof(*e);
}

/*
 * A thread pinned to one CPU answers the requests that callers on that CPU
 * make (the kernel queues each request on the queue of the caller's CPU),
 * through an io_uring of its own: one io_uring_enter(2) commits a reply and
 * waits for the next request.
 */
static int devfd;

static void *uring_queue(void *cpu)
{
	int q = (int)(long)cpu, rfd;
	struct io_uring_params p;
	cpu_set_t set;
	struct uring_header *h = calloc(1, sizeof(*h));
	char *payload = malloc(MAX_WRITE + 4096);
	struct iovec iov[2] = { { h, sizeof(*h) }, { payload, MAX_WRITE + 4096 } };
	unsigned char *sq, *cq, *sqes;
	unsigned *sqtail, *sqmask, *sqarray, *cqhead, *cqtail, *cqmask;
	struct io_uring_cqe *cqes;
	unsigned op = URING_REGISTER;
	uint64_t commit = 0;

	CPU_ZERO(&set);
	CPU_SET(q, &set);
	if (sched_setaffinity(0, sizeof(set), &set) < 0 || !h || !payload)
		goto fail;
	memset(&p, 0, sizeof(p));
	p.flags = IORING_SETUP_SQE128 | IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN;
	rfd = syscall(__NR_io_uring_setup, 4, &p);
	if (rfd < 0)
		goto fail;
	sq = mmap(NULL, p.sq_off.array + p.sq_entries * sizeof(unsigned), PROT_READ | PROT_WRITE,
		  MAP_SHARED | MAP_POPULATE, rfd, IORING_OFF_SQ_RING);
	cq = mmap(NULL, p.cq_off.cqes + p.cq_entries * sizeof(struct io_uring_cqe), PROT_READ | PROT_WRITE,
		  MAP_SHARED | MAP_POPULATE, rfd, IORING_OFF_CQ_RING);
	sqes = mmap(NULL, p.sq_entries * 128, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, rfd,
		    IORING_OFF_SQES);
	if (sq == MAP_FAILED || cq == MAP_FAILED || sqes == MAP_FAILED)
		goto fail;
	sqtail = (void *)(sq + p.sq_off.tail), sqmask = (void *)(sq + p.sq_off.ring_mask);
	sqarray = (void *)(sq + p.sq_off.array);
	cqhead = (void *)(cq + p.cq_off.head), cqtail = (void *)(cq + p.cq_off.tail);
	cqmask = (void *)(cq + p.cq_off.ring_mask), cqes = (void *)(cq + p.cq_off.cqes);
	for (;;) {
		unsigned tail = *sqtail, i = tail & *sqmask, head;
		struct io_uring_sqe *sqe = (void *)(sqes + i * 128);
		struct uring_cmd *cmd = (void *)sqe->cmd;
		struct io_uring_cqe *cqe;
		struct fuse_in_header in;
		struct fuse_out_header *oh = (void *)h->in_out;
		int n;

		memset(sqe, 0, 128);
		sqe->opcode = IORING_OP_URING_CMD;
		sqe->fd = devfd;
		sqe->cmd_op = op;
		sqe->addr = (uint64_t)(uintptr_t)iov;
		sqe->len = 2;
		cmd->commit_id = commit;
		cmd->qid = q;
		sqarray[i] = i;
		__atomic_store_n(sqtail, tail + 1, __ATOMIC_RELEASE);
		while (syscall(__NR_io_uring_enter, rfd, 1, 1, IORING_ENTER_GETEVENTS, NULL, 0) < 0)
			if (errno != EINTR)
				goto fail;
		head = *cqhead;
		if (head == __atomic_load_n(cqtail, __ATOMIC_ACQUIRE))
			continue; /* not possible with min_complete 1, but harmless */
		cqe = &cqes[head & *cqmask];
		n = cqe->res;
		__atomic_store_n(cqhead, head + 1, __ATOMIC_RELEASE);
		if (n < 0) {
			if (n != -ENOTCONN && n != -ECANCELED)
				fprintf(stderr, "fuse-floor: queue %d: %s\n", q, strerror(-n));
			return NULL; /* unmounted */
		}
		memcpy(&in, h->in_out, sizeof(in));
		__atomic_fetch_add(&through_uring, 1, __ATOMIC_RELAXED);
		n = answer(&in, h->op_in, payload);
		/* Nothing is sent through io_uring that wants no reply. */
		memset(oh, 0, sizeof(*oh));
		oh->unique = in.unique;
		oh->error = n < 0 ? n : 0;
		oh->len = sizeof(*oh) + (n > 0 ? n : 0);
		h->ent.payload_sz = n > 0 ? n : 0;
		commit = in.unique;
		op = URING_COMMIT_AND_FETCH;
	}
fail:
	perror("fuse-floor: io_uring queue");
	exit(1);
}

static int pfd[2]; /* serve-splice's pipe */

/* readall reads n bytes from fd into p. */
static int readall(int fd, char *p, size_t n)
{
	while (n > 0) {
		ssize_t r = read(fd, p, n);

		if (r <= 0)
			return -1;
		p += r, n -= r;
	}
	return 0;
}

/*
 * splice_request moves the next request into the pipe and reads it into
 * buf, but for a WRITE's payload, which it splices into the backing file.
 * It returns the request's length, or -1 with errno set.
 */
static ssize_t splice_request(char *buf)
{
	ssize_t n = splice(devfd, NULL, pfd[1], NULL, MAX_WRITE + 4096, 0);
	struct fuse_in_header *in = (void *)buf;
	const size_t wlen = sizeof(*in) + sizeof(struct fuse_write_in);

	if (n < 0)
		return -1;
	if (readall(pfd[0], buf, sizeof(*in)) < 0)
		goto broken;
	if (in->opcode != FUSE_WRITE || in->len < wlen)
		return readall(pfd[0], buf + sizeof(*in), n - sizeof(*in)) < 0 ? -1 : n;
	if (readall(pfd[0], buf + sizeof(*in), wlen - sizeof(*in)) < 0)
		goto broken;
	{
		struct fuse_write_in *wi = (void *)(in + 1);
		loff_t off = wi->offset;
		size_t left = n - wlen;

		while (left > 0) {
			ssize_t s = splice(pfd[0], NULL, backfd, &off, left, SPLICE_F_MOVE);

			if (s <= 0)
				goto broken;
			left -= s;
		}
	}
	return n;
broken:
	perror("fuse-floor: splice");
	exit(1);
}

static int serve(const char *mnt)
{
	static char buf[MAX_WRITE + 4096], out[4096];
	char opts[256];
	int started = 0;

	devfd = open("/dev/fuse", O_RDWR | O_CLOEXEC);
	if (devfd < 0) {
		perror("fuse-floor: /dev/fuse");
		return 1;
	}
	snprintf(opts, sizeof(opts),
		 "fd=%d,rootmode=40000,user_id=0,group_id=0,max_read=%d,default_permissions,allow_other",
		 devfd, MAX_WRITE);
	if (mount("fuse-floor", mnt, "fuse.fuse-floor", MS_NOSUID | MS_NODEV, opts) < 0) {
		perror("fuse-floor: mount");
		return 1;
	}
	newnode(0, 0, 0); /* node ID 0 is none */
	newnode(S_IFDIR | 0755, 0, 0);
	/* With io_uring, /dev/fuse still carries INIT and FORGETs. */
	if (splicing && (pipe2(pfd, O_CLOEXEC) < 0 || fcntl(pfd[0], F_SETPIPE_SZ, 2 * SPLICE_WRITE) < 0)) {
		perror("fuse-floor: pipe");
		return 1;
	}
	for (;;) {
		ssize_t n = splicing ? splice_request(buf) : read(devfd, buf, sizeof(buf));
		struct fuse_in_header *in = (void *)buf;
		struct fuse_out_header h = { .unique = in->unique };
		struct iovec iov[2] = { { &h, sizeof(h) }, { out, 0 } };
		int len;

		if (n < 0) {
			if (errno == ENOENT || errno == EINTR)
				continue;
			if (errno != ENODEV)
				perror("fuse-floor: read");
			break;
		}
		len = answer(in, buf + sizeof(*in), out);
		if (len == NOREPLY)
			continue;
		if (len < 0)
			h.error = len;
		else
			iov[1].iov_len = len;
		h.len = sizeof(h) + iov[1].iov_len;
		/* ENOENT: the caller was interrupted and the request is gone. */
		if (writev(devfd, iov, 2) < 0 && errno != ENOENT)
			perror("fuse-floor: writev");
		for (; uring && !started; started = 1) {
			pthread_t t;
			long cpus = sysconf(_SC_NPROCESSORS_CONF);

			for (long cpu = 0; cpu < cpus; cpu++)
				if (pthread_create(&t, NULL, uring_queue, (void *)cpu))
					return 1;
		}
	}
	for (int op = 0; op < 64; op++)
		if (counts[op])
			fprintf(stderr, "opcode %d: %llu\n", op, (unsigned long long)counts[op]);
	if (uring)
		fprintf(stderr, "through io_uring: %llu\n", (unsigned long long)through_uring);
	return 0;
}

static int stats(const char *dir, long n)
{
	char path[4096];
	struct stat st;
	struct timespec t0, t1;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (long i = 0; i < n; i++) {
		/* Distinct names: no negative entry in the dcache answers. */
		snprintf(path, sizeof(path), "%s/m%ld.%ld.%ld", dir, (long)getpid(), (long)t0.tv_nsec, i);
		if (stat(path, &st) == 0 || errno != ENOENT) {
			perror(path);
			return 1;
		}
	}
	clock_gettime(CLOCK_MONOTONIC, &t1);
	printf("%.2f\n", ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / 1e3 / n);
	return 0;
}

static int writes(const char *path, long mib, int acc)
{
	static char block[64 << 10];
	struct timespec t0, t1;
	int fd = open(path, acc | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);

	if (fd < 0) {
		perror(path);
		return 1;
	}
	for (size_t i = 0; i < sizeof(block); i++)
		block[i] = i * 7; /* as the bench's writeFile */
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (long i = 0; i < mib * 16; i++)
		if (write(fd, block, sizeof(block)) != sizeof(block)) {
			perror(path);
			return 1;
		}
	if (fsync(fd) < 0 || close(fd) < 0) {
		perror(path);
		return 1;
	}
	clock_gettime(CLOCK_MONOTONIC, &t1);
	printf("%.0f\n", mib / ((t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9));
	return unlink(path) < 0;
}

int main(int argc, char **argv)
{
	if (argc == 3 && !strcmp(argv[1], "serve"))
		return serve(argv[2]);
	if (argc == 3 && !strcmp(argv[1], "serve-uring")) {
		uring = 1;
		return serve(argv[2]);
	}
	if (argc == 4 && (!strcmp(argv[1], "serve-store") || !strcmp(argv[1], "serve-splice"))) {
		backing = argv[3];
		splicing = !strcmp(argv[1], "serve-splice");
		return serve(argv[2]);
	}
	if ((argc == 4 || (argc == 5 && !strcmp(argv[4], "w"))) && !strcmp(argv[1], "write"))
		return writes(argv[2], atol(argv[3]), argc == 5 ? O_WRONLY : O_RDWR);
	if (argc == 4 && !strcmp(argv[1], "stat"))
		return stats(argv[2], atol(argv[3]));
	fprintf(stderr, "usage: fuse-floor serve|serve-uring MNT | fuse-floor serve-store|serve-splice MNT FILE |\n"
			"       fuse-floor stat DIR N | fuse-floor write FILE MIB [w]\n");
	return 2;
}
