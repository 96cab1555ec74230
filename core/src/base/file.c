/* file.c - type checks before reading a user's file (see pipeline/file.h). */
#include "pipeline/file.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

const char *pl_file_type_name(unsigned mode) {
    switch (mode & S_IFMT) {
    case S_IFREG: return "a regular file";
    case S_IFDIR: return "a directory";
    case S_IFIFO: return "a FIFO";
    case S_IFSOCK: return "a socket";
    case S_IFCHR: return "a character device";
    case S_IFBLK: return "a block device";
    case S_IFLNK: return "a symbolic link";
    default: return "of unknown type";
    }
}

/* "<what> " or "" */
static const char *sep(const char *what) { return what && *what ? " " : ""; }
static const char *nz(const char *what) { return what ? what : ""; }

static pl_status refuse_type(const char *path, const char *what, unsigned mode) {
    pl_status s = pl_error_set(PL_ERR_IO, "%s%s%s: is %s, expected a regular file", nz(what),
                               sep(what), path, pl_file_type_name(mode));
    pl_hint_set("name a regular file: FIFOs, devices, sockets and directories are never read "
                "(they could block or never end)");
    errno = 0;
    return s;
}

pl_status pl_file_check_regular(const char *path, const char *what) {
    if (!path) return pl_error_set(PL_ERR_INVALID, "%s%sNULL path", nz(what), what && *what ? ": " : "");
    struct stat sb;
    if (stat(path, &sb) != 0) {
        int e = errno;
        pl_status s = pl_error_set(PL_ERR_IO, "%s%s%s: cannot stat: %s", nz(what), sep(what), path,
                                   strerror(e));
        errno = e;
        return s;
    }
    if (!S_ISREG(sb.st_mode)) return refuse_type(path, what, (unsigned)sb.st_mode);
    return PL_OK;
}

int pl_file_open_read(const char *path, const char *what) {
    if (!path) {
        pl_error_set(PL_ERR_INVALID, "%s%sNULL path", nz(what), what && *what ? ": " : "");
        return -1;
    }
    /* O_NONBLOCK: open() of a FIFO without a writer returns at once instead
     * of waiting for one; the type is checked on what was opened */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) {
        int e = errno;
        pl_error_set(PL_ERR_IO, "%s%s%s: cannot open: %s", nz(what), sep(what), path, strerror(e));
        errno = e;
        return -1;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        pl_error_set(PL_ERR_IO, "%s%s%s: cannot stat: %s", nz(what), sep(what), path, strerror(e));
        errno = e;
        return -1;
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        refuse_type(path, what, (unsigned)sb.st_mode);
        return -1;
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
        int e = errno;
        close(fd);
        pl_error_set(PL_ERR_IO, "%s%s%s: cannot set blocking mode: %s", nz(what), sep(what), path,
                     strerror(e));
        errno = e;
        return -1;
    }
    return fd;
}

FILE *pl_file_fopen_read(const char *path, const char *what) {
    int fd = pl_file_open_read(path, what);
    if (fd < 0) return NULL;
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        int e = errno;
        close(fd);
        pl_error_set(PL_ERR_IO, "%s%s%s: cannot open: %s", nz(what), sep(what), path, strerror(e));
        errno = e;
    }
    return f;
}
