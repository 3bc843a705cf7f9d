/*
 * Preloaded into gVisor sandboxes (LD_PRELOAD, set by the gvisor backend only).
 *
 * Debian's runsc (release 20221219) rejects statx() calls that carry AT_NO_AUTOMOUNT with
 * EINVAL, and coreutils passes that flag on every stat: `ls -l`, `ls DIR`, `stat` and
 * `cp -a` all fail inside the sandbox. gVisor has no automount points, so the flag means
 * nothing there; this wrapper clears it and makes the raw system call.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

int statx(int dirfd, const char *path, int flags, unsigned int mask, struct statx *buf)
{
    return (int)syscall(SYS_statx, dirfd, path, flags & ~AT_NO_AUTOMOUNT, mask, buf);
}
