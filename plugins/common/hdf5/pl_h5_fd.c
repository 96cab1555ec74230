/* pl_h5_fd.c - the POSIX file driver pl_h5 writes through (pl_h5_fd.h):
 * sec2's behaviour, except that a failed write is recorded, not returned. */
#define _GNU_SOURCE /* pread / pwrite / ftruncate with off_t */
#include "pl_h5_fd.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#if H5_VERSION_GE(1, 13, 2)
#include <H5FDdevelop.h> /* H5FD_class_t moved there */
#endif

typedef struct fd_file {
    H5FD_t pub; /* first: HDF5 casts between the two */
    int fd;
    haddr_t eoa, eof;
    dev_t dev;
    ino_t ino;
    int err;                 /* errno of the first failed write / truncate / close; 0 */
    pl_h5_fd_report *report; /* filled by fd_close (pl_h5_fd_watch) */
} fd_file;

/* the largest address an off_t reaches (as sec2) */
#define FD_MAXADDR (((haddr_t)1 << (8 * sizeof(off_t) - 1)) - 1)

static void fail(fd_file *f, int e) {
    if (!f->err) f->err = e ? e : EIO;
}

static H5FD_t *fd_open(const char *name, unsigned flags, hid_t fapl, haddr_t maxaddr) {
    (void)fapl;
    if (!name || !*name || maxaddr == 0 || maxaddr == HADDR_UNDEF) return NULL;
    int of = (flags & H5F_ACC_RDWR) ? O_RDWR : O_RDONLY;
    if (flags & H5F_ACC_TRUNC) of |= O_TRUNC;
    if (flags & H5F_ACC_CREAT) of |= O_CREAT;
    if (flags & H5F_ACC_EXCL) of |= O_EXCL;
    int fd = open(name, of | O_CLOEXEC, 0666);
    if (fd < 0) return NULL;
    struct stat sb;
    fd_file *f = fstat(fd, &sb) == 0 ? calloc(1, sizeof *f) : NULL;
    if (!f) {
        close(fd);
        return NULL;
    }
    f->fd = fd;
    f->eof = (haddr_t)sb.st_size;
    f->dev = sb.st_dev;
    f->ino = sb.st_ino;
    return &f->pub;
}

static herr_t fd_close(H5FD_t *file) {
    fd_file *f = (fd_file *)file;
    if (close(f->fd) != 0) fail(f, errno);
    if (f->report) {
        f->report->closed = true;
        f->report->err = f->err;
    }
    free(f);
    return 0;
}

static int fd_cmp(const H5FD_t *a, const H5FD_t *b) {
    const fd_file *x = (const fd_file *)a, *y = (const fd_file *)b;
    if (x->dev != y->dev) return x->dev < y->dev ? -1 : 1;
    if (x->ino != y->ino) return x->ino < y->ino ? -1 : 1;
    return 0;
}

static herr_t fd_query(const H5FD_t *file, unsigned long *flags) {
    (void)file;
    if (flags) {
        *flags = H5FD_FEAT_AGGREGATE_METADATA | H5FD_FEAT_ACCUMULATE_METADATA |
                 H5FD_FEAT_DATA_SIEVE | H5FD_FEAT_AGGREGATE_SMALLDATA;
#ifdef H5FD_FEAT_DEFAULT_VFD_COMPATIBLE
        *flags |= H5FD_FEAT_DEFAULT_VFD_COMPATIBLE;
#endif
    }
    return 0;
}

static haddr_t fd_get_eoa(const H5FD_t *file, H5FD_mem_t type) {
    (void)type;
    return ((const fd_file *)file)->eoa;
}

static herr_t fd_set_eoa(H5FD_t *file, H5FD_mem_t type, haddr_t addr) {
    (void)type;
    ((fd_file *)file)->eoa = addr;
    return 0;
}

static haddr_t fd_get_eof(const H5FD_t *file, H5FD_mem_t type) {
    (void)type;
    return ((const fd_file *)file)->eof;
}

static herr_t fd_get_handle(H5FD_t *file, hid_t fapl, void **handle) {
    (void)fapl;
    if (!handle) return -1;
    *handle = file; /* pl_h5_fd_error reads the struct, not a POSIX fd */
    return 0;
}

static herr_t fd_read(H5FD_t *file, H5FD_mem_t type, hid_t dxpl, haddr_t addr, size_t size,
                      void *buf) {
    (void)type;
    (void)dxpl;
    fd_file *f = (fd_file *)file;
    if (addr == HADDR_UNDEF || addr > FD_MAXADDR || size > FD_MAXADDR - addr) return -1;
    char *p = buf;
    while (size > 0) {
        ssize_t n = pread(f->fd, p, size, (off_t)addr);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return -1;
        if (n == 0) { /* past the end of the file (or of what was written): zeros */
            memset(p, 0, size);
            break;
        }
        size -= (size_t)n;
        addr += (haddr_t)n;
        p += n;
    }
    return 0;
}

static herr_t fd_write(H5FD_t *file, H5FD_mem_t type, hid_t dxpl, haddr_t addr, size_t size,
                       const void *buf) {
    (void)type;
    (void)dxpl;
    fd_file *f = (fd_file *)file;
    if (addr == HADDR_UNDEF || addr > FD_MAXADDR || size > FD_MAXADDR - addr) return -1;
    const char *p = buf;
    haddr_t end = addr + size;
    while (size > 0 && !f->err) { /* after a failure: discarded (the file is abandoned) */
        ssize_t n = pwrite(f->fd, p, size, (off_t)addr);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            fail(f, n < 0 ? errno : ENOSPC);
            break;
        }
        size -= (size_t)n;
        addr += (haddr_t)n;
        p += n;
    }
    if (end > f->eof) f->eof = end;
    return 0;
}

static herr_t fd_truncate(H5FD_t *file, hid_t dxpl, hbool_t closing) {
    (void)dxpl;
    (void)closing;
    fd_file *f = (fd_file *)file;
    if (f->eoa != f->eof) {
        if (!f->err && ftruncate(f->fd, (off_t)f->eoa) != 0) fail(f, errno);
        f->eof = f->eoa;
    }
    return 0;
}

static const H5FD_class_t fd_class = {
#if H5_VERSION_GE(1, 13, 2)
    .version = H5FD_CLASS_VERSION,
    .value = (H5FD_class_value_t)411, /* 256..511: for local drivers */
#endif
    .name = "pipeline_recorded_errors",
    .maxaddr = FD_MAXADDR,
    .fc_degree = H5F_CLOSE_STRONG,
    .open = fd_open,
    .close = fd_close,
    .cmp = fd_cmp,
    .query = fd_query,
    .get_eoa = fd_get_eoa,
    .set_eoa = fd_set_eoa,
    .get_eof = fd_get_eof,
    .get_handle = fd_get_handle,
    .read = fd_read,
    .write = fd_write,
    .truncate = fd_truncate,
    .fl_map = H5FD_FLMAP_DICHOTOMY,
};

static hid_t g_driver = H5I_INVALID_HID;

/* the driver's id (registered once; again if HDF5 was closed and reopened) */
static hid_t driver(void) {
    if (g_driver < 0 || H5Iis_valid(g_driver) <= 0) g_driver = H5FDregister(&fd_class);
    return g_driver;
}

hid_t pl_h5_fd_fapl(void) {
    hid_t drv = driver();
    if (drv < 0) return H5I_INVALID_HID;
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    if (fapl < 0) return H5I_INVALID_HID;
    if (H5Pset_driver(fapl, drv, NULL) < 0 || H5Pset_fclose_degree(fapl, H5F_CLOSE_STRONG) < 0) {
        H5Pclose(fapl);
        return H5I_INVALID_HID;
    }
    return fapl;
}

/* The driver's struct of the file `obj` belongs to; NULL if another driver's. */
static fd_file *of(hid_t obj) {
    fd_file *f = NULL;
    H5E_BEGIN_TRY {
        hid_t fid = H5Iget_file_id(obj);
        hid_t fapl = fid >= 0 ? H5Fget_access_plist(fid) : H5I_INVALID_HID;
        void *h = NULL;
        if (fapl >= 0 && g_driver >= 0 && H5Pget_driver(fapl) == g_driver &&
            H5Fget_vfd_handle(fid, fapl, &h) >= 0)
            f = h;
        if (fapl >= 0) H5Pclose(fapl);
        if (fid >= 0) H5Idec_ref(fid);
    }
    H5E_END_TRY;
    return f;
}

int pl_h5_fd_error(hid_t obj) {
    fd_file *f = of(obj);
    return f ? f->err : 0;
}

void *pl_h5_fd_watch(hid_t file, pl_h5_fd_report *rep) {
    fd_file *f = of(file);
    if (f) f->report = rep;
    return f;
}

void pl_h5_fd_unwatch(void *token, pl_h5_fd_report *rep) {
    fd_file *f = token;
    if (!f || rep->closed) return; /* closed: freed, *rep filled */
    f->report = NULL;
    rep->err = f->err;
}
