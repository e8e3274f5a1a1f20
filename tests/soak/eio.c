/* tests/soak/eio.c: a disk that returns errors, for the soak's agents (LD_PRELOAD).
 *
 * While the file named by SOAK_EIO_FLAG exists, every write, sync, truncation and
 * allocation on a file of the filesystem that holds SOAK_EIO_DIR fails with EIO; reads,
 * opens and everything on other filesystems (sockets, the log on stderr) work as ever.
 * Nothing is half-written: a call that fails does nothing. The nemesis creates the flag
 * file, then removes it. Built by tests/soak/run into the work directory:
 *
 *     cc -shared -fPIC -O2 -o eio.so eio.c -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

static int ready;     /* 0: not looked up yet; 1: on; -1: off (no variables) */
static dev_t disk;    /* st_dev of SOAK_EIO_DIR */
static const char *flag;

static int failing(int fd)
{
    struct stat st;
    if (ready == 0) {
        const char *dir = getenv("SOAK_EIO_DIR");
        flag = getenv("SOAK_EIO_FLAG");
        ready = (dir && flag && stat(dir, &st) == 0) ? 1 : -1;
        if (ready == 1)
            disk = st.st_dev;
    }
    if (ready != 1 || access(flag, F_OK) != 0)
        return 0;
    if (fstat(fd, &st) != 0 || st.st_dev != disk)
        return 0;
    errno = EIO;
    return 1;
}

#define NEXT(name) \
    static __typeof__(name) *next; \
    if (!next) \
        next = (__typeof__(name) *)dlsym(RTLD_NEXT, #name)

ssize_t write(int fd, const void *buf, size_t n)
{
    NEXT(write);
    return failing(fd) ? -1 : next(fd, buf, n);
}

ssize_t pwrite(int fd, const void *buf, size_t n, off_t off)
{
    NEXT(pwrite);
    return failing(fd) ? -1 : next(fd, buf, n, off);
}

ssize_t pwrite64(int fd, const void *buf, size_t n, off64_t off)
{
    NEXT(pwrite64);
    return failing(fd) ? -1 : next(fd, buf, n, off);
}

ssize_t writev(int fd, const struct iovec *iov, int cnt)
{
    NEXT(writev);
    return failing(fd) ? -1 : next(fd, iov, cnt);
}

ssize_t pwritev(int fd, const struct iovec *iov, int cnt, off_t off)
{
    NEXT(pwritev);
    return failing(fd) ? -1 : next(fd, iov, cnt, off);
}

ssize_t pwritev64(int fd, const struct iovec *iov, int cnt, off64_t off)
{
    NEXT(pwritev64);
    return failing(fd) ? -1 : next(fd, iov, cnt, off);
}

int fsync(int fd)
{
    NEXT(fsync);
    return failing(fd) ? -1 : next(fd);
}

int fdatasync(int fd)
{
    NEXT(fdatasync);
    return failing(fd) ? -1 : next(fd);
}

int ftruncate(int fd, off_t len)
{
    NEXT(ftruncate);
    return failing(fd) ? -1 : next(fd, len);
}

int ftruncate64(int fd, off64_t len)
{
    NEXT(ftruncate64);
    return failing(fd) ? -1 : next(fd, len);
}

int fallocate(int fd, int mode, off_t off, off_t len)
{
    NEXT(fallocate);
    return failing(fd) ? -1 : next(fd, mode, off, len);
}

int fallocate64(int fd, int mode, off64_t off, off64_t len)
{
    NEXT(fallocate64);
    return failing(fd) ? -1 : next(fd, mode, off, len);
}
