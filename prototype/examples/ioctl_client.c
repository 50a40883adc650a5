/*
 * ioctl_client: create a branch of MNT, write a file in it and commit it,
 * using only the ioctls, as existing clients of the interface do.
 *
 * usage: ioctl_client MNT FILE CONTENT
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "branchfs.h"

int main(int argc, char **argv)
{
	char name[BRANCHFS_NAME_MAX], path[4096];
	int ctl, fd;

	if (argc != 4) {
		fprintf(stderr, "usage: %s MNT FILE CONTENT\n", argv[0]);
		return 2;
	}
	snprintf(path, sizeof(path), "%s/.branchfs_ctl", argv[1]);
	ctl = open(path, O_RDONLY);
	if (ctl < 0 || ioctl(ctl, FS_IOC_BRANCH_CREATE, name) < 0) {
		perror("create");
		return 1;
	}
	close(ctl);
	snprintf(path, sizeof(path), "%s/@%s/%s", argv[1], name, argv[2]);
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	if (fd < 0 || write(fd, argv[3], strlen(argv[3])) < 0) {
		perror(path);
		return 1;
	}
	if (ioctl(fd, FS_IOC_BRANCH_COMMIT) < 0) {
		fprintf(stderr, "commit %s: %s\n", name, strerror(errno));
		return errno == ESTALE ? 3 : 1;
	}
	close(fd);
	printf("%s\n", name);
	return 0;
}
