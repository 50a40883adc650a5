// SPDX-License-Identifier: MIT
/*
 * fuse-floor: the cheapest FUSE daemon there can be, to measure what the
 * kernel's FUSE protocol costs by itself on this machine (see
 * bench/roundtrip.sh and docs/performance.md, "The floor").
 *
 *   fuse-floor serve MNT    mount a file system of nothing at MNT and answer
 *                           its requests until it is unmounted; then print
 *                           how many requests of each kind came
 *   fuse-floor stat DIR N   stat(2) N distinct names that do not exist in
 *                           DIR; print the mean microseconds per call
 *
 * The server is one thread in blocking read(2) and write(2) on /dev/fuse,
 * written from <linux/fuse.h> alone (no libfuse). It stores nothing: a
 * lookup of a name fails with ENOENT and no negative entry (every lookup
 * is a round trip); a create or mkdir makes a node that remembers its
 * attributes only, and whose name the kernel keeps for an hour as it does
 * branchfs's, so that it never looks one up; writes are counted and dropped; there are no xattrs
 * (ENODATA, so the kernel keeps asking, as it must of a daemon that keeps
 * them). It asks at INIT for what branchfs asks that changes which
 * requests the kernel sends (atomic O_TRUNC, KILLPRIV_V2, no umask,
 * default_permissions, no writeback cache), so that `tar -xf` into it
 * sends the requests an extraction sends branchfs.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/fuse.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define MAX_WRITE (1 << 20)
#define TIMEOUT 3600 /* seconds of entry and attribute validity, as branchfs */

static struct fuse_attr *nodes; /* by node ID; 1 is the root */
static uint64_t nnodes, capnodes;
static uint64_t counts[64];

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

static void reply(int fd, uint64_t unique, int err, const void *arg, size_t len)
{
	struct fuse_out_header h = {
		.len = sizeof(h) + (err ? 0 : len), .error = -err, .unique = unique,
	};
	struct iovec iov[2] = { { &h, sizeof(h) }, { (void *)arg, err ? 0 : len } };

	/* ENOENT: the caller was interrupted and the request is gone. */
	if (writev(fd, iov, 2) < 0 && errno != ENOENT)
		perror("fuse-floor: writev");
}

static void reply_entry(int fd, uint64_t unique, uint64_t nodeid)
{
	struct fuse_entry_out e = {
		.nodeid = nodeid, .attr = nodes[nodeid],
		.entry_valid = TIMEOUT, .attr_valid = TIMEOUT,
	};

	reply(fd, unique, 0, &e, sizeof(e));
}

static void reply_attr(int fd, uint64_t unique, uint64_t nodeid)
{
	struct fuse_attr_out a = { .attr_valid = TIMEOUT, .attr = nodes[nodeid] };

	reply(fd, unique, 0, &a, sizeof(a));
}

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

static int serve(const char *mnt)
{
	static char buf[MAX_WRITE + 4096];
	char opts[256];
	int fd = open("/dev/fuse", O_RDWR | O_CLOEXEC);

	if (fd < 0) {
		perror("fuse-floor: /dev/fuse");
		return 1;
	}
	snprintf(opts, sizeof(opts),
		 "fd=%d,rootmode=40000,user_id=0,group_id=0,max_read=%d,default_permissions,allow_other",
		 fd, MAX_WRITE);
	if (mount("fuse-floor", mnt, "fuse.fuse-floor", MS_NOSUID | MS_NODEV, opts) < 0) {
		perror("fuse-floor: mount");
		return 1;
	}
	newnode(0, 0, 0); /* node ID 0 is none */
	newnode(S_IFDIR | 0755, 0, 0);
	for (;;) {
		ssize_t n = read(fd, buf, sizeof(buf));
		struct fuse_in_header *in = (void *)buf;
		void *arg = buf + sizeof(*in);

		if (n < 0) {
			if (errno == ENOENT || errno == EINTR)
				continue;
			if (errno != ENODEV)
				perror("fuse-floor: read");
			break;
		}
		counts[in->opcode & 63]++;
		switch (in->opcode) {
		case FUSE_INIT: {
			const struct fuse_init_in *ii = arg;
			struct fuse_init_out o = {
				.major = FUSE_KERNEL_VERSION,
				.minor = ii->minor < FUSE_KERNEL_MINOR_VERSION ? ii->minor :
									 FUSE_KERNEL_MINOR_VERSION,
				.max_readahead = ii->max_readahead,
				.flags = ii->flags & (FUSE_ASYNC_READ | FUSE_BIG_WRITES | FUSE_ATOMIC_O_TRUNC |
						      FUSE_HANDLE_KILLPRIV_V2 | FUSE_DONT_MASK | FUSE_MAX_PAGES |
						      FUSE_PARALLEL_DIROPS),
				.max_write = MAX_WRITE, .max_pages = MAX_WRITE / 4096, .time_gran = 1,
			};

			reply(fd, in->unique, 0, &o, sizeof(o));
			break;
		}
		case FUSE_LOOKUP:
			reply(fd, in->unique, ENOENT, NULL, 0);
			break;
		case FUSE_GETATTR:
			reply_attr(fd, in->unique, in->nodeid);
			break;
		case FUSE_SETATTR:
			setattr(&nodes[in->nodeid], arg);
			reply_attr(fd, in->unique, in->nodeid);
			break;
		case FUSE_CREATE: {
			const struct fuse_create_in *ci = arg;
			struct {
				struct fuse_entry_out e;
				struct fuse_open_out o;
			} r;

			memset(&r, 0, sizeof(r));
			r.e.entry_valid = r.e.attr_valid = TIMEOUT;
			r.e.nodeid = newnode(S_IFREG | (ci->mode & 07777), in->uid, in->gid);
			r.e.attr = nodes[r.e.nodeid];
			r.o.fh = r.e.nodeid;
			reply(fd, in->unique, 0, &r, sizeof(r));
			break;
		}
		case FUSE_MKDIR: {
			const struct fuse_mkdir_in *mi = arg;

			reply_entry(fd, in->unique, newnode(S_IFDIR | (mi->mode & 07777), in->uid, in->gid));
			break;
		}
		case FUSE_WRITE: {
			const struct fuse_write_in *wi = arg;
			struct fuse_write_out o = { .size = wi->size };

			if (wi->offset + wi->size > nodes[in->nodeid].size)
				nodes[in->nodeid].size = wi->offset + wi->size;
			reply(fd, in->unique, 0, &o, sizeof(o));
			break;
		}
		case FUSE_OPEN:
		case FUSE_OPENDIR: {
			struct fuse_open_out o = { .fh = in->nodeid };

			reply(fd, in->unique, 0, &o, sizeof(o));
			break;
		}
		case FUSE_READDIR:
		case FUSE_READ:
		case FUSE_RELEASE:
		case FUSE_RELEASEDIR:
		case FUSE_UNLINK:
		case FUSE_RMDIR:
		case FUSE_FSYNC:
		case FUSE_FSYNCDIR:
			reply(fd, in->unique, 0, NULL, 0); /* nothing to read or to keep */
			break;
		case FUSE_GETXATTR:
		case FUSE_LISTXATTR:
			reply(fd, in->unique, ENODATA, NULL, 0);
			break;
		case FUSE_STATFS: {
			struct fuse_statfs_out o = { .st = { .bsize = 4096, .frsize = 4096, .namelen = 255 } };

			reply(fd, in->unique, 0, &o, sizeof(o));
			break;
		}
		case FUSE_FORGET:
		case FUSE_BATCH_FORGET:
		case FUSE_INTERRUPT:
			break; /* no reply */
		default:
			/* FLUSH, ACCESS and the rest: ENOSYS, which the kernel
			 * remembers for FLUSH and ACCESS, as it does for branchfs. */
			reply(fd, in->unique, ENOSYS, NULL, 0);
		}
	}
	for (int op = 0; op < 64; op++)
		if (counts[op])
			fprintf(stderr, "opcode %d: %llu\n", op, (unsigned long long)counts[op]);
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

int main(int argc, char **argv)
{
	if (argc == 3 && !strcmp(argv[1], "serve"))
		return serve(argv[2]);
	if (argc == 4 && !strcmp(argv[1], "stat"))
		return stats(argv[2], atol(argv[3]));
	fprintf(stderr, "usage: fuse-floor serve MNT | fuse-floor stat DIR N\n");
	return 2;
}
