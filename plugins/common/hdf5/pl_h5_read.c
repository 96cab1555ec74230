/* pl_h5_read.c - reading HDF5 with pl_h5.h: dataset metadata and checks, rows, whole
 * datasets and tensors, attributes, finite-value and column-name checks. */
#include "pl_h5.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
