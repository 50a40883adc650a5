/* SPDX-License-Identifier: MIT */
/*
 * branchfs.h - the ioctls a branchfs daemon answers on any file or
 * directory of a view, and on the .branchfs_ctl file at each view's root.
 */
#ifndef BRANCHFS_H
#define BRANCHFS_H

#include <linux/ioctl.h>

#define BRANCHFS_NAME_MAX 128

/*
 * The inode number of every .branchfs_ctl, one no other file has: with
 * the filesystem's type (FUSE), it tells the control file from a file of
 * the same name on another filesystem.
 */
#define BRANCH_CTL_INO 0xffff000000000000ULL

/* Create a child of the view; its name is returned NUL-padded. */
#define FS_IOC_BRANCH_CREATE _IOR('b', 0, char[BRANCHFS_NAME_MAX])
/* Commit the view into its parent; ESTALE if a sibling committed first. */
#define FS_IOC_BRANCH_COMMIT _IO('b', 1)
/* Drop the view's branch and its changes. */
#define FS_IOC_BRANCH_ABORT _IO('b', 2)

#endif /* BRANCHFS_H */
