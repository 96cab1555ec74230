/* pl_h5.c - the process-wide HDF5 lock and the files of pl_h5.h (open, create, close,
 * exists); reading: pl_h5_read.c; writing: pl_h5_write.c. */
#include "pl_h5.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

/* ---- the lock ----------------------------------------------------------- */

static pthread_mutex_t g_lock;
static pthread_once_t g_lock_once = PTHREAD_ONCE_INIT;

static void lock_init(void) {
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_settype(&a, PTHREAD_MUTEX_RECURSIVE);
    pthread_mutex_init(&g_lock, &a);
    pthread_mutexattr_destroy(&a);
}

void pl_h5_lock(void) {
    pthread_once(&g_lock_once, lock_init);
    pthread_mutex_lock(&g_lock);
}

void pl_h5_unlock(void) {
    pthread_mutex_unlock(&g_lock);
}

/* ---- files -------------------------------------------------------------- */

/* Little-endian unsigned of `n` bytes (n <= 8). */
static uint64_t le(const unsigned char *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

/* Why HDF5 refused `path`, from its own bytes (the library only says it
 * cannot open it): empty, no superblock signature, shorter than the end of
 * file address its superblock records (a truncated copy), or a superblock
 * this library does not know. The format: HDF5 File Format Specification
 * 3.0, section II.A (superblock versions 0 and 1: the end of file address
 * is the third address after the fixed fields; versions 2 and 3: the third
 * address after base, extension). Every read is bounds-checked. */
static void diagnose(const char *path, char *why, size_t n) {
    static const unsigned char sig[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
    FILE *fp = fopen(path, "rb");
    off_t end = fp && fseeko(fp, 0, SEEK_END) == 0 ? ftello(fp) : -1;
    if (end < 0) {
        snprintf(why, n, "HDF5 cannot open the file");
        if (fp) fclose(fp);
        return;
    }
    uint64_t size = (uint64_t)end;
    unsigned char sb[128];
    uint64_t at = 0;
    bool found = false;
    /* the superblock is at byte 0, 512, 1024, 2048, ... (after a user block) */
    for (uint64_t a = 0; a + 8 <= size && a <= UINT64_MAX / 4; a = a ? a * 2 : 512) {
        if (fseeko(fp, (off_t)a, SEEK_SET) == 0 && fread(sb, 1, 8, fp) == 8 &&
            !memcmp(sb, sig, 8)) {
            at = a;
            found = true;
            break;
        }
    }
    size_t got = 0; /* superblock bytes present (all of sb unless the file ends) */
    if (found && fseeko(fp, (off_t)at, SEEK_SET) == 0) got = fread(sb, 1, sizeof sb, fp);
    fclose(fp);
    if (size == 0) {
        snprintf(why, n, "not an HDF5 file: it is empty (0 bytes)");
        return;
    }
    if (!found) {
        snprintf(why, n,
                 "not an HDF5 file: no HDF5 superblock signature at byte 0, 512, 1024, "
                 "... (%llu bytes)",
                 (unsigned long long)size);
        return;
    }
    char inside[160];
    snprintf(inside, sizeof inside,
             "truncated: %llu bytes, ending inside the superblock at "
             "byte %llu",
             (unsigned long long)size, (unsigned long long)at);
    if (got < 9) {
        snprintf(why, n, "%s", inside);
        return;
    }
    unsigned ver = sb[8];
    if (ver > 3) {
        snprintf(why, n,
                 "HDF5 cannot open the file: its superblock (byte %llu) has version %u, "
                 "which this HDF5 library does not read (written by a newer HDF5?)",
                 (unsigned long long)at, ver);
        return;
    }
    /* versions 0 / 1: the size of addresses at byte 13, addresses from 24 / 28;
     * versions 2 / 3: the size at byte 9, addresses from 12 */
    size_t osz_at = ver <= 1 ? 13 : 9, fixed = ver == 0 ? 24 : ver == 1 ? 28 : 12;
    if (got <= osz_at) {
        snprintf(why, n, "%s", inside);
        return;
    }
    size_t o = sb[osz_at];
    if (o != 2 && o != 4 && o != 8) {
        snprintf(why, n,
                 "HDF5 cannot open the file: its superblock (byte %llu) is corrupt "
                 "(addresses of %zu bytes; 2, 4 or 8 expected)",
                 (unsigned long long)at, o);
        return;
    }
    if (got < fixed + 3 * o) { /* sb holds 128 > 28 + 24 bytes: the file ended */
        snprintf(why, n, "%s", inside);
        return;
    }
    uint64_t base = le(sb + fixed, (int)o), eof = le(sb + fixed + 2 * o, (int)o);
    uint64_t undef = o == 8 ? UINT64_MAX : ((uint64_t)1 << (8 * o)) - 1;
    if (base == undef) base = 0;
    if (eof != undef && eof <= UINT64_MAX - base && size < base + eof) {
        snprintf(why, n,
                 "truncated: %llu bytes, its superblock says %llu (an incomplete copy "
                 "or an interrupted write)",
                 (unsigned long long)size, (unsigned long long)(base + eof));
        return;
    }
    snprintf(why, n,
             "HDF5 cannot open the file, though its superblock (version %u at byte "
             "%llu) and its size (%llu bytes) look whole: its metadata is damaged, or another "
             "process holds it open for writing (HDF5 file locking)",
             ver, (unsigned long long)at, (unsigned long long)size);
}

pl_status pl_h5_open_read(const char *path, const char *hint, hid_t *out) {
    *out = H5I_INVALID_HID;
    if (pl_file_check_regular(path, NULL) && !errno) return pl_error_status(); /* a FIFO: never open */
    FILE *probe = fopen(path, "rb");
    if (!probe)
        return pl_error_set(PL_ERR_IO, "%s: cannot open (%s)%s%s", path, strerror(errno),
                            hint ? "; " : "", hint ? hint : "");
    fclose(probe);
    pl_h5_lock();
    htri_t is5;
    hid_t f = H5I_INVALID_HID;
    H5E_BEGIN_TRY {
        is5 = H5Fis_hdf5(path);
        if (is5 > 0) f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    }
    H5E_END_TRY;
    pl_h5_unlock();
    if (is5 <= 0 || f < 0) {
        char why[320];
        diagnose(path, why, sizeof why);
        return pl_error_set(PL_ERR_IO, "%s: %s", path, why);
    }
    *out = f;
    return PL_OK;
}

/* Files written by the product are built in memory (HDF5's core driver, no
 * backing store) and written out by pl_h5_close with plain write(2): a full
 * disk or a file size limit then fails in our code, naming the file, instead
 * of inside HDF5's close, where 1.10's H5F__dest frees the file but leaves its
 * id registered, so the atexit close crashed (issue 34, class 1). The name is
 * created (truncated) here, so an unwritable path fails at once. */
pl_status pl_h5_create(const char *path, hid_t *out) {
    *out = H5I_INVALID_HID;
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return pl_error_set(PL_ERR_IO, "%s: cannot create the HDF5 file (%s)", path,
                            strerror(errno));
    close(fd);
    pl_h5_lock();
    H5E_BEGIN_TRY {
        hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
        if (fapl >= 0 && H5Pset_fapl_core(fapl, (size_t)1 << 20, 0) >= 0)
            *out = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
        if (fapl >= 0) H5Pclose(fapl);
    }
    H5E_END_TRY;
    pl_h5_unlock();
    if (*out < 0) {
        unlink(path);
        return pl_error_set(PL_ERR_IO, "%s: cannot create the HDF5 file", path);
    }
    return PL_OK;
}

/* write the whole image to path (truncating); errno's text on failure */
static pl_status write_image(const char *path, const unsigned char *buf, size_t n) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return pl_error_set(PL_ERR_IO, "%s: cannot write the HDF5 file (%s)", path,
                            strerror(errno));
    size_t done = 0;
    int err = 0;
    while (done < n) {
        ssize_t w = write(fd, buf + done, n - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            err = w < 0 ? errno : ENOSPC;
            break;
        }
        done += (size_t)w;
    }
    if (!err && fsync(fd) != 0 && errno != EINVAL && errno != EROFS) err = errno;
    if (close(fd) != 0 && !err) err = errno;
    if (err) {
        /* leave no partial file: the callers write under a temporary name */
        (void)!truncate(path, 0); /* best effort; the error below names the file */
        return pl_error_set(PL_ERR_IO,
                            "%s: writing the HDF5 file failed after %zu of %zu bytes (%s)", path,
                            done, n, strerror(err));
    }
    return PL_OK;
}

pl_status pl_h5_close(const char *path, hid_t file) {
    if (file < 0) return PL_OK;
    herr_t r = 0;
    unsigned char *img = NULL;
    ssize_t n = 0;
    bool in_memory = false, nomem = false;
    pl_h5_lock();
    H5E_BEGIN_TRY {
        hid_t fapl = H5Fget_access_plist(file);
        in_memory = fapl >= 0 && H5Pget_driver(fapl) == H5FD_CORE;
        if (fapl >= 0) H5Pclose(fapl);
        if (in_memory) {
            r = H5Fflush(file, H5F_SCOPE_GLOBAL);
            n = r < 0 ? -1 : H5Fget_file_image(file, NULL, 0);
            if (n > 0 && !(img = malloc((size_t)n))) nomem = true;
            if (img && H5Fget_file_image(file, img, (size_t)n) != n) r = -1;
            if (n <= 0) r = -1;
        }
        /* in memory, the close itself cannot fail for want of disk */
        if (H5Fclose(file) < 0) r = -1;
    }
    H5E_END_TRY;
    pl_h5_unlock();
    pl_status st = PL_OK;
    if (nomem)
        st = pl_error_set(PL_ERR_NOMEM, "%s: out of memory for the file's image (%zd bytes)", path,
                          n);
    else if (r < 0)
        st = pl_error_set(PL_ERR_IO, "%s: closing the HDF5 file failed", path);
    else if (in_memory)
        st = write_image(path, img, (size_t)n);
    free(img);
    return st;
}

bool pl_h5_exists(hid_t loc, const char *name) {
    if (!strcmp(name, "/")) return true;
    char buf[1024];
    if (snprintf(buf, sizeof buf, "%s", name) >= (int)sizeof buf) return false;
    htri_t ok = 1;
    pl_h5_lock();
    H5E_BEGIN_TRY {
        /* H5Lexists needs every intermediate link to exist */
        for (char *p = buf + 1; *p && ok > 0; p++) {
            if (*p != '/') continue;
            *p = 0;
            ok = H5Lexists(loc, buf, H5P_DEFAULT);
            *p = '/';
        }
        if (ok > 0) ok = H5Lexists(loc, buf, H5P_DEFAULT);
    }
    H5E_END_TRY;
    pl_h5_unlock();
    return ok > 0;
}
