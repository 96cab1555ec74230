/* pl_h5.c - the process-wide HDF5 lock and the HDF5 helpers of pl_h5.h. */
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

/* ---- datasets: metadata ------------------------------------------------- */

static const char *filter_name(H5Z_filter_t id) {
    switch (id) {
    case H5Z_FILTER_DEFLATE:
        return "gzip";
    case H5Z_FILTER_SHUFFLE:
        return "shuffle";
    case H5Z_FILTER_FLETCHER32:
        return "fletcher32";
    case H5Z_FILTER_SZIP:
        return "szip";
    case H5Z_FILTER_NBIT:
        return "nbit";
    case H5Z_FILTER_SCALEOFFSET:
        return "scaleoffset";
    case 32000:
        return "lzf";
    case 32001:
        return "blosc";
    case 32004:
        return "lz4";
    case 32015:
        return "zstd";
    case 32008:
        return "bitshuffle";
    default:
        return "unknown";
    }
}

/* Every filter of a dataset must be available to this HDF5 library (lock held). */
static pl_status check_filters(const char *path, const char *name, hid_t ds) {
    hid_t dcpl = H5Dget_create_plist(ds);
    if (dcpl < 0) return PL_OK;
    int n = H5Pget_nfilters(dcpl);
    pl_status st = PL_OK;
    for (int i = 0; i < n && !st; i++) {
        unsigned flags, cd[8];
        size_t ncd = 8;
        char nm[64] = "";
        H5Z_filter_t id = H5Pget_filter2(dcpl, (unsigned)i, &flags, &ncd, cd, sizeof nm, nm, NULL);
        if (id < 0) continue;
        if (H5Zfilter_avail(id) <= 0)
            st = pl_error_set(PL_ERR_IO,
                              "%s: dataset '%s' uses HDF5 filter %d (%s) which this HDF5 library "
                              "cannot decode; rewrite the file with gzip or no compression, or put "
                              "the filter plugin in HDF5_PLUGIN_PATH",
                              path, name, (int)id, nm[0] ? nm : filter_name(id));
    }
    H5Pclose(dcpl);
    return st;
}

/* The dataset's data must be in the file itself (lock held): a virtual
 * dataset (its data in other files, by name) or external raw storage
 * (H5Pset_external: other files, by name) is refused outright. A missing or
 * short source reads as fill values without an error (issue 34: a VDS whose
 * source is gone, or external storage shorter than declared or pointing at
 * /dev/zero, trained on zeros), and the names resolve against the working
 * directory or HDF5_VDS_PREFIX / HDF5_EXTFILE_PREFIX, so a data file could
 * pull any file of the machine into training (docs/security.md). */
static pl_status check_storage(const char *path, const char *name, hid_t ds) {
    hid_t dcpl = H5Dget_create_plist(ds);
    if (dcpl < 0) return pl_error_set(PL_ERR_IO, "%s: cannot read how '%s' is stored", path, name);
    pl_status st = PL_OK;
    static const char *const fix = "copy the data into the file first, e.g. h5repack -l CONTI "
                                   "FILE NEW_FILE";
    char src[256] = "";
    H5E_BEGIN_TRY {
        int next = H5Pget_external_count(dcpl);
        if (H5Pget_layout(dcpl) == H5D_VIRTUAL) {
            size_t nv = 0;
            if (H5Pget_virtual_count(dcpl, &nv) < 0) nv = 0;
            if (nv > 0 && H5Pget_virtual_filename(dcpl, 0, src, sizeof src) < 0) src[0] = 0;
            st = pl_error_set(PL_ERR_IO,
                              "%s: dataset '%s' is a virtual dataset (its data is mapped from %zu "
                              "source%s%s%s%s); refused: a missing or short "
                              "source would read as fill values. Make it self-contained: %s",
                              path, name, nv, nv == 1 ? "" : "s", src[0] ? ", first in '" : "", src,
                              src[0] ? "'" : "", fix);
        } else if (next != 0) {
            off_t off = 0;
            hsize_t sz = 0;
            if (next < 0 || H5Pget_external(dcpl, 0, sizeof src, src, &off, &sz) < 0) src[0] = 0;
            st = pl_error_set(PL_ERR_IO,
                              "%s: dataset '%s' keeps its data in %d external file%s%s%s%s; "
                              "refused: a missing or short external file would read as fill "
                              "values. Make it self-contained: %s",
                              path, name, next, next == 1 ? "" : "s", src[0] ? ", first '" : "",
                              src, src[0] ? "'" : "", fix);
        }
    }
    H5E_END_TRY;
    H5Pclose(dcpl);
    return st;
}

pl_status pl_h5_dataset_open(const char *path, hid_t loc, const char *name, hid_t *out) {
    *out = H5I_INVALID_HID;
    if (!pl_h5_exists(loc, name))
        return pl_error_set(PL_ERR_IO, "%s: dataset '%s' not found", path, name);
    pl_h5_lock();
    hid_t ds;
    H5E_BEGIN_TRY {
        ds = H5Dopen2(loc, name, H5P_DEFAULT);
    }
    H5E_END_TRY;
    pl_status st = PL_OK;
    if (ds < 0) {
        st = pl_error_set(PL_ERR_IO, "%s: '%s' is not a dataset", path, name);
    } else if ((st = check_storage(path, name, ds)) || (st = check_filters(path, name, ds))) {
        H5Dclose(ds);
    } else {
        *out = ds;
    }
    pl_h5_unlock();
    return st;
}

pl_status pl_h5_dataset_info(const char *path, const char *name, hid_t ds, size_t elem_size,
                             pl_h5_info *out) {
    memset(out, 0, sizeof *out);
    pl_h5_lock();
    hid_t sp = H5Dget_space(ds), ft = H5Dget_type(ds);
    hsize_t d[H5S_MAX_RANK];
    int nd = sp < 0 ? -1 : H5Sget_simple_extent_dims(sp, d, NULL);
    out->cls = ft < 0 ? H5T_NO_CLASS : H5Tget_class(ft);
    out->size = ft < 0 ? 0 : H5Tget_size(ft);
    out->is_signed = out->cls == H5T_INTEGER && H5Tget_sign(ft) != H5T_SGN_NONE;
    if (ft >= 0) H5Tclose(ft);
    if (sp >= 0) H5Sclose(sp);
    pl_h5_unlock();
    if (nd < 0) return pl_error_set(PL_ERR_IO, "%s: cannot read the shape of '%s'", path, name);
    /* again here: callers that opened the dataset with H5Dopen2 */
    pl_h5_lock();
    pl_status sst = check_storage(path, name, ds);
    pl_h5_unlock();
    if (sst) return sst;
    out->rank = nd;
    size_t esz = elem_size > out->size ? elem_size : out->size;
    if (!esz) esz = 1;
    /* sizes from the file are untrusted: keep numel * esz (and int64 sums) in
     * range, and every product of dims too (a row's elements, dims[1..]): an
     * empty axis makes numel 0 but bounds no other axis, so the product of
     * the non-zero dims is what is bounded */
    uint64_t n = 1;
    bool empty = false;
    for (int i = 0; i < nd; i++) {
        if (!d[i]) {
            empty = true;
        } else if (n > ((uint64_t)1 << 62) / esz / d[i]) {
            return pl_error_set(PL_ERR_SHAPE,
                                "%s: dataset '%s' is too large (axis %d: %llu entries)", path, name,
                                i, (unsigned long long)d[i]);
        } else {
            n *= d[i];
        }
        out->dims[i] = (int64_t)d[i];
    }
    if (empty) n = 0;
    out->numel = (int64_t)n;
    /* a declared shape with no data behind it (never written, or chunks
     * missing) reads as fill values: refuse it rather than train on them or
     * allocate for it. Chunked: every chunk covering the extent must exist. */
    H5D_space_status_t ss = H5D_SPACE_STATUS_ALLOCATED;
    hsize_t have = 0, need = 0;
    pl_h5_lock();
    herr_t e = n ? H5Dget_space_status(ds, &ss) : 0;
    hid_t cp = n ? H5Dget_create_plist(ds) : H5I_INVALID_HID;
    if (cp >= 0 && H5Pget_layout(cp) == H5D_CHUNKED) {
        hsize_t ch[H5S_MAX_RANK];
        if (H5Pget_chunk(cp, H5S_MAX_RANK, ch) == nd) {
            need = 1;
            for (int i = 0; i < nd; i++) need *= (d[i] + ch[i] - 1) / ch[i];
            hid_t sp2 = H5Dget_space(ds);
            if (sp2 < 0 || H5Dget_num_chunks(ds, sp2, &have) < 0) have = need; /* unknown: trust */
            if (sp2 >= 0) H5Sclose(sp2);
        }
    }
    if (cp >= 0) H5Pclose(cp);
    pl_h5_unlock();
    bool none = e < 0 || ss == H5D_SPACE_STATUS_NOT_ALLOCATED;
    if (none || have < need) {
        char shape[160];
        size_t k = (size_t)snprintf(shape, sizeof shape, "[");
        for (int i = 0; i < nd && k < sizeof shape; i++)
            k += (size_t)snprintf(shape + k, sizeof shape - k, "%s%llu", i ? ", " : "",
                                  (unsigned long long)d[i]);
        if (k < sizeof shape) snprintf(shape + k, sizeof shape - k, "]");
        char what[96];
        if (none) snprintf(what, sizeof what, "none of its data");
        else snprintf(what, sizeof what, "only %llu of its %llu chunks",
                      (unsigned long long)have, (unsigned long long)need);
        return pl_error_set(PL_ERR_IO, "%s: dataset '%s' declares shape %s but the file stores "
                            "%s; reading it would give fill values (truncated or crafted file?)",
                            path, name, shape, what);
    }
    return PL_OK;
}

pl_status pl_h5_dataset_dtype(const char *path, const char *name, hid_t ds, bool floats_to_f32,
                              pl_dtype *dt, hid_t *memtype) {
    pl_h5_info in;
    pl_status st = pl_h5_dataset_info(path, name, ds, 0, &in);
    if (st) return st;
    if (in.cls == H5T_FLOAT) {
        if (!floats_to_f32 && in.size == 8) {
            *dt = PL_F64;
            *memtype = H5T_NATIVE_DOUBLE;
        } else { /* f32; f16 and others converted by HDF5 */
            *dt = PL_F32;
            *memtype = H5T_NATIVE_FLOAT;
        }
        return PL_OK;
    }
    if (in.cls == H5T_INTEGER || in.cls == H5T_ENUM) {
        if (in.size == 1 && !in.is_signed) {
            *dt = PL_U8;
            *memtype = H5T_NATIVE_UINT8;
        } else if (in.size <= 4 && !(in.size == 4 && !in.is_signed)) {
            *dt = PL_I32;
            *memtype = H5T_NATIVE_INT32;
        } else {
            *dt = PL_I64;
            *memtype = H5T_NATIVE_INT64;
        }
        return PL_OK;
    }
    return pl_error_set(PL_ERR_DTYPE, "%s: dataset '%s' has a non-numeric HDF5 type (class %d)",
                        path, name, (int)in.cls);
}

hid_t pl_h5_memtype(pl_dtype dt) {
    switch (dt) {
    case PL_F32:
        return H5T_NATIVE_FLOAT;
    case PL_F64:
        return H5T_NATIVE_DOUBLE;
    case PL_I32:
        return H5T_NATIVE_INT32;
    case PL_I64:
        return H5T_NATIVE_INT64;
    case PL_U8:
        return H5T_NATIVE_UINT8;
    default:
        return H5I_INVALID_HID;
    }
}

/* ---- datasets: data ----------------------------------------------------- */

pl_status pl_h5_read_rows(const char *path, const char *name, hid_t ds, hid_t memtype, int64_t r0,
                          int64_t n, void *dst) {
    if (n == 0) return PL_OK;
    herr_t e = -1;
    pl_h5_lock();
    hid_t fs = H5Dget_space(ds);
    hsize_t start[H5S_MAX_RANK] = {0}, count[H5S_MAX_RANK];
    int nd = fs < 0 ? -1 : H5Sget_simple_extent_dims(fs, count, NULL);
    if (nd >= 1) {
        start[0] = (hsize_t)r0;
        count[0] = (hsize_t)n;
        hid_t ms = H5Screate_simple(nd, count, NULL);
        H5E_BEGIN_TRY {
            e = H5Sselect_hyperslab(fs, H5S_SELECT_SET, start, NULL, count, NULL);
            if (e >= 0) e = H5Dread(ds, memtype, ms, fs, H5P_DEFAULT, dst);
        }
        H5E_END_TRY;
        H5Sclose(ms);
    }
    if (fs >= 0) H5Sclose(fs);
    pl_h5_unlock();
    if (e < 0)
        return pl_error_set(PL_ERR_IO, "%s: reading rows %lld..%lld of dataset '%s' failed", path,
                            (long long)r0, (long long)(r0 + n), name);
    return PL_OK;
}

pl_status pl_h5_read_alloc(const char *path, hid_t loc, const char *name, hid_t memtype,
                           int min_rank, int max_rank, const int64_t *want, void **out,
                           pl_h5_info *info) {
    *out = NULL;
    pl_h5_info in;
    hid_t ds;
    pl_status st = pl_h5_dataset_open(path, loc, name, &ds);
    if (st) return st;
    pl_h5_lock();
    size_t esz = H5Tget_size(memtype);
    st = pl_h5_dataset_info(path, name, ds, esz, &in);
    if (!st && (in.rank < min_rank || in.rank > max_rank)) {
        if (min_rank == max_rank)
            st = pl_error_set(PL_ERR_SHAPE, "%s: dataset '%s' has rank %d; expected %d", path, name,
                              in.rank, min_rank);
        else
            st = pl_error_set(PL_ERR_SHAPE, "%s: dataset '%s' has rank %d; expected %d..%d", path,
                              name, in.rank, min_rank, max_rank);
    }
    for (int i = 0; i < in.rank && !st && want; i++)
        if (want[i] >= 0 && want[i] != in.dims[i])
            st = pl_error_set(PL_ERR_SHAPE,
                              "%s: dataset '%s' has %lld entries on axis %d; expected %lld", path,
                              name, (long long)in.dims[i], i, (long long)want[i]);
    if (!st) {
        *out = malloc(in.numel ? (size_t)in.numel * esz : 1);
        if (!*out) {
            st = pl_error_set(PL_ERR_NOMEM, "%s: out of memory for '%s'", path, name);
        } else if (in.numel) {
            herr_t e;
            H5E_BEGIN_TRY {
                e = H5Dread(ds, memtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, *out);
            }
            H5E_END_TRY;
            if (e < 0) st = pl_error_set(PL_ERR_IO, "%s: reading '%s' failed", path, name);
        }
    }
    H5Dclose(ds);
    pl_h5_unlock();
    if (st) {
        free(*out);
        *out = NULL;
    } else if (info) {
        *info = in;
    }
    return st;
}

pl_status pl_h5_read_tensor(const char *path, hid_t loc, const char *name, pl_dtype dt,
                            pl_tensor **out) {
    *out = NULL;
    hid_t mt = pl_h5_memtype(dt);
    if (mt < 0)
        return pl_error_set(PL_ERR_DTYPE, "%s: reading '%s' as %s: not a dtype HDF5 converts to",
                            path, name, pl_dtype_name(dt));
    hid_t ds;
    pl_status st = pl_h5_dataset_open(path, loc, name, &ds);
    if (st) return st;
    pl_h5_info in;
    pl_h5_lock();
    st = pl_h5_dataset_info(path, name, ds, pl_dtype_size(dt), &in);
    if (!st && (in.rank < 1 || in.rank > PL_MAX_DIMS))
        st = pl_error_set(PL_ERR_SHAPE, "%s: dataset '%s' has rank %d; expected 1..%d", path, name,
                          in.rank, PL_MAX_DIMS);
    pl_tensor *t = NULL;
    if (!st) {
        pl_frame_begin(); /* owned by the caller whatever frame is open */
        t = pl_tensor_empty(dt, in.rank, in.dims, PL_CPU);
        if (t) pl_frame_keep(t);
        pl_frame_end();
        if (!t) st = pl_error_prefix(pl_error_status(), "%s: '%s'", path, name);
    }
    if (!st && in.numel) {
        herr_t e;
        H5E_BEGIN_TRY {
            e = H5Dread(ds, mt, H5S_ALL, H5S_ALL, H5P_DEFAULT, pl_tensor_data(t));
        }
        H5E_END_TRY;
        if (e < 0) st = pl_error_set(PL_ERR_IO, "%s: reading '%s' failed", path, name);
    }
    H5Dclose(ds);
    pl_h5_unlock();
    if (st) {
        pl_tensor_release(t);
        return st;
    }
    *out = t;
    return PL_OK;
}

/* ---- attributes ---------------------------------------------------------- */

static pl_status attr_read(const char *path, hid_t obj, const char *name, hid_t memtype, void *v,
                           bool *found) {
    *found = false;
    pl_status st = PL_OK;
    pl_h5_lock();
    H5E_BEGIN_TRY {
        if (H5Aexists(obj, name) > 0) {
            *found = true;
            hid_t a = H5Aopen(obj, name, H5P_DEFAULT);
            hid_t sp = a < 0 ? -1 : H5Aget_space(a), t = a < 0 ? -1 : H5Aget_type(a);
            H5T_class_t c = t < 0 ? H5T_NO_CLASS : H5Tget_class(t);
            bool ok = sp >= 0 && H5Sget_simple_extent_npoints(sp) == 1 &&
                      (c == H5T_INTEGER || c == H5T_FLOAT) && H5Aread(a, memtype, v) >= 0;
            if (t >= 0) H5Tclose(t);
            if (sp >= 0) H5Sclose(sp);
            if (a >= 0) H5Aclose(a);
            if (!ok)
                st = pl_error_set(PL_ERR_IO, "%s: attribute '%s' is not one readable number", path,
                                  name);
        }
    }
    H5E_END_TRY;
    pl_h5_unlock();
    return st;
}

pl_status pl_h5_attr_read_int(const char *path, hid_t obj, const char *name, int64_t *v,
                              bool *found) {
    return attr_read(path, obj, name, H5T_NATIVE_INT64, v, found);
}

pl_status pl_h5_attr_read_double(const char *path, hid_t obj, const char *name, double *v,
                                 bool *found) {
    return attr_read(path, obj, name, H5T_NATIVE_DOUBLE, v, found);
}

/* Append the names of `s[0..len)` to names[*n..]: the whole text (split =
 * false) or each comma-separated part, spaces around it dropped. */
static pl_status add_names(const char *path, const char *obj, const char *attr, const char *s,
                           size_t len, bool split, char (*names)[64], int maxn, int *n) {
    size_t i = 0;
    do {
        size_t j = i;
        while (j < len && s[j] && !(split && s[j] == ','))
            j++;
        size_t a = i, b = j;
        while (a < b && s[a] == ' ')
            a++;
        while (b > a && s[b - 1] == ' ')
            b--;
        if (*n >= maxn)
            return pl_error_set(PL_ERR_IO, "%s: attribute '%s' of '%s' holds more than %d names",
                                path, attr, obj, maxn);
        if (b == a || b - a > 63)
            return pl_error_set(PL_ERR_IO,
                                "%s: attribute '%s' of '%s': name %d is %s; expected 1..63 bytes",
                                path, attr, obj, *n, b == a ? "empty" : "longer than 63 bytes");
        memcpy(names[*n], s + a, b - a);
        names[(*n)++][b - a] = 0;
        i = j + 1;
    } while (split && i <= len && s[i - 1] == ',');
    return PL_OK;
}

pl_status pl_h5_attr_read_names(const char *path, hid_t loc, const char *obj, const char *attr,
                                char (*names)[64], int maxn, int *n) {
    *n = 0;
    pl_status st = PL_OK;
    pl_h5_lock();
    H5E_BEGIN_TRY {
        hid_t a = H5I_INVALID_HID;
        if (H5Aexists_by_name(loc, obj, attr, H5P_DEFAULT) > 0)
            a = H5Aopen_by_name(loc, obj, attr, H5P_DEFAULT, H5P_DEFAULT);
        hid_t t = a < 0 ? -1 : H5Aget_type(a), sp = a < 0 ? -1 : H5Aget_space(a);
        int nd = sp < 0 ? -1 : H5Sget_simple_extent_ndims(sp);
        hssize_t cnt = sp < 0 ? -1 : H5Sget_simple_extent_npoints(sp);
        bool vlen = t >= 0 && H5Tis_variable_str(t) > 0;
        size_t sz = t >= 0 ? H5Tget_size(t) : 0;
        if (a < 0) {
            /* absent: *n = 0 */
        } else if (t < 0 || H5Tget_class(t) != H5T_STRING || nd < 0 || nd > 1 || cnt < 1 ||
                   cnt > (hssize_t)maxn || (!vlen && (sz < 1 || sz > 65536))) {
            st = pl_error_set(PL_ERR_IO,
                              "%s: attribute '%s' of '%s' is not a string or a 1-D array of at "
                              "most %d strings",
                              path, attr, obj, maxn);
        } else {
            hid_t mt = H5Tcopy(H5T_C_S1);
            H5Tset_cset(mt, H5Tget_cset(t));
            H5Tset_size(mt, vlen ? H5T_VARIABLE : sz + 1);
            char **v = vlen ? calloc((size_t)cnt, sizeof *v) : NULL;
            char *f = vlen ? NULL : calloc((size_t)cnt, sz + 1);
            if ((vlen && !v) || (!vlen && !f))
                st = pl_error_set(PL_ERR_NOMEM, "%s: attribute '%s' of '%s'", path, attr, obj);
            else if (H5Aread(a, mt, vlen ? (void *)v : (void *)f) < 0)
                st = pl_error_set(PL_ERR_IO, "%s: cannot read attribute '%s' of '%s'", path, attr,
                                  obj);
            else {
                /* a scalar is one comma-separated list; an array one name per entry */
                for (hssize_t i = 0; i < cnt && !st; i++) {
                    const char *e = vlen ? (v[i] ? v[i] : "") : f + (size_t)i * (sz + 1);
                    st = add_names(path, obj, attr, e, strlen(e), nd == 0, names, maxn, n);
                }
                if (vlen) H5Dvlen_reclaim(mt, sp, H5P_DEFAULT, v);
            }
            free(v);
            free(f);
            H5Tclose(mt);
        }
        if (sp >= 0) H5Sclose(sp);
        if (t >= 0) H5Tclose(t);
        if (a >= 0) H5Aclose(a);
    }
    H5E_END_TRY;
    pl_h5_unlock();
    if (st) *n = 0;
    return st;
}

static pl_status attr_write(const char *path, hid_t obj, const char *name, hid_t type,
                            const void *v) {
    herr_t r = -1;
    pl_h5_lock();
    H5E_BEGIN_TRY {
        hid_t sp = H5Screate(H5S_SCALAR);
        hid_t a = H5Acreate2(obj, name, type, sp, H5P_DEFAULT, H5P_DEFAULT);
        if (a >= 0) {
            r = H5Awrite(a, type, v);
            H5Aclose(a);
        }
        H5Sclose(sp);
    }
    H5E_END_TRY;
    pl_h5_unlock();
    return r < 0 ? pl_error_set(PL_ERR_IO, "%s: cannot write attribute '%s'", path, name) : PL_OK;
}

pl_status pl_h5_attr_write_int(const char *path, hid_t obj, const char *name, int64_t v) {
    return attr_write(path, obj, name, H5T_NATIVE_INT64, &v);
}

pl_status pl_h5_attr_write_double(const char *path, hid_t obj, const char *name, double v) {
    return attr_write(path, obj, name, H5T_NATIVE_DOUBLE, &v);
}

pl_status pl_h5_attr_write_str(const char *path, hid_t obj, const char *name, const char *v) {
    pl_h5_lock();
    hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, strlen(v) + 1);
    pl_status st = attr_write(path, obj, name, t, v);
    H5Tclose(t);
    pl_h5_unlock();
    return st;
}

/* ---- writing row-extendible datasets ------------------------------------ */

pl_status pl_h5_create_rows(const char *path, hid_t loc, const char *name, hid_t type,
                            int64_t width, hid_t *out) {
    int nd = width > 0 ? 2 : 1;
    hsize_t dims[2] = {0, (hsize_t)width}, maxd[2] = {H5S_UNLIMITED, (hsize_t)width};
    hsize_t chunk[2] = {width > 0 ? (hsize_t)(width > 256 ? 64 : 1024) : 8192, (hsize_t)width};
    pl_h5_lock();
    H5E_BEGIN_TRY {
        hid_t sp = H5Screate_simple(nd, dims, maxd);
        hid_t pl = H5Pcreate(H5P_DATASET_CREATE);
        H5Pset_chunk(pl, nd, chunk);
        *out = H5Dcreate2(loc, name, type, sp, H5P_DEFAULT, pl, H5P_DEFAULT);
        H5Pclose(pl);
        H5Sclose(sp);
    }
    H5E_END_TRY;
    pl_h5_unlock();
    if (*out < 0) return pl_error_set(PL_ERR_IO, "%s: cannot create dataset '%s'", path, name);
    return PL_OK;
}

pl_status pl_h5_append_rows(const char *path, hid_t ds, hid_t memtype, int64_t start, int64_t n,
                            int64_t width, const void *data) {
    if (n == 0) return PL_OK;
    int nd = width > 0 ? 2 : 1;
    hsize_t size[2] = {(hsize_t)(start + n), (hsize_t)width};
    hsize_t off[2] = {(hsize_t)start, 0}, cnt[2] = {(hsize_t)n, (hsize_t)width};
    herr_t r;
    pl_h5_lock();
    H5E_BEGIN_TRY {
        r = H5Dset_extent(ds, size);
        if (r >= 0) {
            hid_t fs = H5Dget_space(ds);
            hid_t ms = H5Screate_simple(nd, cnt, NULL);
            r = H5Sselect_hyperslab(fs, H5S_SELECT_SET, off, NULL, cnt, NULL);
            if (r >= 0) r = H5Dwrite(ds, memtype, ms, fs, H5P_DEFAULT, data);
            H5Sclose(ms);
            H5Sclose(fs);
        }
    }
    H5E_END_TRY;
    pl_h5_unlock();
    if (r < 0) {
        char nm[256] = "?";
        pl_h5_lock();
        H5E_BEGIN_TRY {
            H5Iget_name(ds, nm, sizeof nm);
        }
        H5E_END_TRY;
        pl_h5_unlock();
        return pl_error_set(PL_ERR_IO, "%s: writing rows %lld..%lld of '%s' failed", path,
                            (long long)start, (long long)(start + n), nm);
    }
    return PL_OK;
}

/* ---- prediction files ----------------------------------------------------- */

pl_status pl_h5_out_open(pl_h5_out *o, const char *path, const pl_meta *attrs) {
    memset(o, 0, sizeof *o);
    o->file = H5I_INVALID_HID;
    if (snprintf(o->path, sizeof o->path, "%s", path) >= (int)sizeof o->path)
        return pl_error_set(PL_ERR_INVALID, "%s: path too long", path);
    pl_status st = pl_h5_create(path, &o->file);
    for (int i = 0; !st && attrs && i < pl_meta_count(attrs); i++) {
        const char *k = pl_meta_key_at(attrs, i), *sv = pl_meta_get_str(attrs, k);
        int64_t iv;
        double dv = 0;
        if (sv) st = pl_h5_attr_write_str(path, o->file, k, sv);
        else if (pl_meta_get_int(attrs, k, &iv) == PL_OK)
            st = pl_h5_attr_write_int(path, o->file, k, iv);
        else {
            pl_error_clear();
            pl_meta_get_float(attrs, k, &dv);
            st = pl_h5_attr_write_double(path, o->file, k, dv);
        }
    }
    if (st) pl_h5_out_abort(o);
    return st;
}

static pl_h5_out_dataset *out_find(const pl_h5_out *o, const char *name) {
    for (int i = 0; i < o->n; i++)
        if (!strcmp(o->d[i].name, name)) return (pl_h5_out_dataset *)&o->d[i];
    return NULL;
}

int64_t pl_h5_out_rows(const pl_h5_out *o, const char *name) {
    const pl_h5_out_dataset *d = out_find(o, name);
    return d ? d->dims[0] : -1;
}

static pl_status out_create(pl_h5_out *o, const char *name, const pl_tensor *t,
                            pl_h5_out_dataset **out) {
    if (o->n == PL_H5_OUT_MAX)
        return pl_error_set(PL_ERR_INVALID, "%s: more than %d datasets", o->path, PL_H5_OUT_MAX);
    hid_t mt = pl_h5_memtype(t->dtype);
    if (mt == H5I_INVALID_HID)
        return pl_error_set(PL_ERR_DTYPE, "%s: dataset '%s': dtype %s cannot be written", o->path,
                            name, pl_dtype_name(t->dtype));
    pl_h5_out_dataset *d = &o->d[o->n];
    memset(d, 0, sizeof *d);
    snprintf(d->name, sizeof d->name, "%s", name);
    d->dt = t->dtype;
    d->rank = t->ndim;
    hsize_t dims[PL_MAX_DIMS], maxd[PL_MAX_DIMS], chunk[PL_MAX_DIMS];
    hsize_t row = 1;
    for (int i = 1; i < t->ndim; i++) {
        d->dims[i] = t->shape[i];
        dims[i] = maxd[i] = chunk[i] = (hsize_t)(t->shape[i] > 0 ? t->shape[i] : 1);
        row *= chunk[i];
    }
    dims[0] = 0;
    maxd[0] = H5S_UNLIMITED;
    chunk[0] = row >= 4096 ? 1 : 4096 / row; /* about 4096 elements per chunk */
    pl_h5_lock();
    H5E_BEGIN_TRY {
        hid_t sp = H5Screate_simple(t->ndim, dims, maxd);
        hid_t pl = H5Pcreate(H5P_DATASET_CREATE);
        H5Pset_chunk(pl, t->ndim, chunk);
        d->ds = H5Dcreate2(o->file, name, mt, sp, H5P_DEFAULT, pl, H5P_DEFAULT);
        H5Pclose(pl);
        H5Sclose(sp);
    }
    H5E_END_TRY;
    pl_h5_unlock();
    if (d->ds < 0) return pl_error_set(PL_ERR_IO, "%s: cannot create dataset '%s'", o->path, name);
    o->n++;
    *out = d;
    return PL_OK;
}

pl_status pl_h5_out_append(pl_h5_out *o, const char *name, const pl_tensor *t) {
    char b[256];
    if (!t || t->ndim < 1)
        return pl_error_set(PL_ERR_INVALID, "%s: dataset '%s': need a tensor of rank >= 1",
                            o->path, name);
    pl_h5_out_dataset *d = out_find(o, name);
    pl_status st = PL_OK;
    if (!d && (st = out_create(o, name, t, &d))) return st;
    bool same = d->dt == t->dtype && d->rank == t->ndim;
    for (int i = 1; same && i < t->ndim; i++)
        same = d->dims[i] == t->shape[i];
    if (!same)
        return pl_error_set(PL_ERR_SHAPE, "%s: dataset '%s' has rows of %s; cannot append %s",
                            o->path, name, pl_dtype_name(d->dt), pl_tensor_describe(t, b, sizeof b));
    int64_t n = t->shape[0];
    if (n == 0) return PL_OK;
    const pl_tensor *h = t;
    pl_frame_begin();
    if (t->device.type != PL_DEVICE_CPU || !pl_tensor_is_contiguous(t))
        h = pl_tensor_to(t, t->dtype, PL_CPU);
    if (!h) st = pl_error_status();
    hsize_t size[PL_MAX_DIMS], off[PL_MAX_DIMS] = {0}, cnt[PL_MAX_DIMS];
    for (int i = 0; i < t->ndim; i++)
        size[i] = cnt[i] = (hsize_t)t->shape[i];
    size[0] = (hsize_t)(d->dims[0] + n);
    off[0] = (hsize_t)d->dims[0];
    herr_t r = 0;
    if (!st) {
        pl_h5_lock();
        H5E_BEGIN_TRY {
            r = H5Dset_extent(d->ds, size);
            if (r >= 0) {
                hid_t fs = H5Dget_space(d->ds);
                hid_t ms = H5Screate_simple(t->ndim, cnt, NULL);
                r = H5Sselect_hyperslab(fs, H5S_SELECT_SET, off, NULL, cnt, NULL);
                if (r >= 0)
                    r = H5Dwrite(d->ds, pl_h5_memtype(t->dtype), ms, fs, H5P_DEFAULT,
                                 pl_tensor_data((pl_tensor *)h));
                H5Sclose(ms);
                H5Sclose(fs);
            }
        }
        H5E_END_TRY;
        pl_h5_unlock();
        if (r < 0)
            st = pl_error_set(PL_ERR_IO, "%s: writing rows %lld..%lld of '%s' failed", o->path,
                              (long long)d->dims[0], (long long)(d->dims[0] + n), name);
    }
    pl_frame_end();
    if (!st) d->dims[0] += n;
    return st;
}

pl_status pl_h5_out_close(pl_h5_out *o) {
    herr_t r = 0;
    pl_h5_lock();
    H5E_BEGIN_TRY {
        for (int i = 0; i < o->n; i++)
            if (o->d[i].ds >= 0 && H5Dclose(o->d[i].ds) < 0) r = -1;
    }
    H5E_END_TRY;
    pl_h5_unlock();
    o->n = 0;
    pl_status st = pl_h5_close(o->path, o->file);
    o->file = H5I_INVALID_HID;
    if (!st && r < 0) st = pl_error_set(PL_ERR_IO, "%s: closing a dataset failed", o->path);
    return st;
}

void pl_h5_out_abort(pl_h5_out *o) {
    if (o->file < 0 && o->n == 0) return;
    pl_h5_out_close(o);
    pl_error_clear();
}

pl_status pl_h5_out_new(const char *path, const pl_meta *attrs, pl_h5_out **out) {
    *out = calloc(1, sizeof **out);
    if (!*out) return pl_error_set(PL_ERR_NOMEM, "%s: out of memory", path);
    pl_status st = pl_h5_out_open(*out, path, attrs);
    if (st) {
        free(*out);
        *out = NULL;
    }
    return st;
}

pl_status pl_h5_out_finish(pl_h5_out **o, const char *who) {
    if (!*o) return pl_error_set(PL_ERR_INVALID, "%s: predict_end before predict_begin", who);
    pl_status st = pl_h5_out_close(*o);
    free(*o);
    *o = NULL;
    return st;
}

void pl_h5_out_free(pl_h5_out **o) {
    if (!*o) return;
    pl_h5_out_abort(*o);
    free(*o);
    *o = NULL;
}

/* ---- checking data ------------------------------------------------------ */

pl_status pl_h5_check_finite(const char *path, const char *name, pl_dtype dt, const void *data,
                             int64_t first_row, int64_t rows, int ndim, const int64_t *dims,
                             const bool *use_col, const char (*col_names)[64], int n_names) {
    if ((dt != PL_F32 && dt != PL_F64) || rows <= 0) return PL_OK;
    int64_t w = 1;
    for (int d = 1; d < ndim; d++)
        w *= dims[d];
    int64_t n = rows * w, count = 0, first = -1;
    if (dt == PL_F32) {
        const float *x = data;
        for (int64_t i = 0; i < n; i++)
            if (!isfinite(x[i]) && (!use_col || use_col[i % w]) && count++ == 0) first = i;
    } else {
        const double *x = data;
        for (int64_t i = 0; i < n; i++)
            if (!isfinite(x[i]) && (!use_col || use_col[i % w]) && count++ == 0) first = i;
    }
    if (!count) return PL_OK;
    double v = dt == PL_F32 ? (double)((const float *)data)[first] : ((const double *)data)[first];
    int64_t row = first_row + first / w, col = first % w;
    /* where in the row: "column 3 ('down')", or "element 7 = [2][1]" beyond rank 2 */
    char where[256] = "";
    if (ndim == 2) {
        int k = snprintf(where, sizeof where, ", column %lld", (long long)col);
        if (col_names && col < n_names && col_names[col][0])
            snprintf(where + k, sizeof where - (size_t)k, " ('%s')", col_names[col]);
    } else if (ndim > 2) {
        int k = snprintf(where, sizeof where, ", column %lld (index [%lld]", (long long)col,
                         (long long)row);
        int64_t rest = col, stride = w;
        for (int d = 1; d < ndim && k > 0 && (size_t)k < sizeof where; d++) {
            stride /= dims[d];
            k += snprintf(where + k, sizeof where - (size_t)k, "[%lld]",
                          (long long)(rest / stride));
            rest %= stride;
        }
        if (k > 0 && (size_t)k < sizeof where) snprintf(where + k, sizeof where - (size_t)k, ")");
    }
    return pl_error_set(PL_ERR_INVALID,
                        "%s: dataset '%s' row %lld%s is %g: not a finite number (%lld non-finite "
                        "value%s in rows %lld..%lld). Missing values are refused: drop those rows "
                        "or fill them (e.g. pandas dropna() / fillna()) when writing the file",
                        path, name, (long long)row, where, v, (long long)count,
                        count == 1 ? "" : "s", (long long)first_row,
                        (long long)(first_row + rows - 1));
}

/* ---- column names of a series ------------------------------------------ */

int pl_h5_column_names(hid_t file, const char *series, char (*names)[64], int maxn) {
    int n = 0;
    hid_t obj = -1;
    bool is_attr = false;
    pl_h5_lock();
    H5E_BEGIN_TRY {
        if (H5Lexists(file, "/columns", H5P_DEFAULT) > 0) obj = H5Dopen2(file, "/columns", H5P_DEFAULT);
        if (obj < 0) {
            hid_t ds = H5Dopen2(file, series, H5P_DEFAULT);
            if (ds >= 0) {
                if (H5Aexists(ds, "columns") > 0) {
                    obj = H5Aopen(ds, "columns", H5P_DEFAULT);
                    is_attr = obj >= 0;
                }
                H5Dclose(ds);
            }
        }
        hid_t sp = obj < 0 ? -1 : is_attr ? H5Aget_space(obj) : H5Dget_space(obj);
        hid_t t = obj < 0 ? -1 : is_attr ? H5Aget_type(obj) : H5Dget_type(obj);
        hssize_t cnt = sp >= 0 ? H5Sget_simple_extent_npoints(sp) : 0;
        if (t >= 0 && H5Tget_class(t) == H5T_STRING && H5Tis_variable_str(t) > 0 && cnt > 0 &&
            cnt <= maxn) {
            char **s = calloc((size_t)cnt, sizeof *s);
            hid_t mt = H5Tcopy(H5T_C_S1);
            H5Tset_size(mt, H5T_VARIABLE);
            H5Tset_cset(mt, H5Tget_cset(t)); /* csv_to_h5 writes UTF-8 */
            herr_t e = !s        ? -1
                       : is_attr ? H5Aread(obj, mt, s)
                                 : H5Dread(obj, mt, H5S_ALL, H5S_ALL, H5P_DEFAULT, s);
            if (e >= 0) {
                for (hssize_t i = 0; i < cnt; i++)
                    snprintf(names[i], 64, "%s", s[i] ? s[i] : "");
                n = (int)cnt;
                H5Dvlen_reclaim(mt, sp, H5P_DEFAULT, s);
            }
            H5Tclose(mt);
            free(s);
        }
        if (t >= 0) H5Tclose(t);
        if (sp >= 0) H5Sclose(sp);
        if (obj >= 0) is_attr ? H5Aclose(obj) : H5Dclose(obj);
    }
    H5E_END_TRY;
    pl_h5_unlock();
    return n;
}
