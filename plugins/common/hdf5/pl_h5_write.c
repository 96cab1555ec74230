/* pl_h5_write.c - writing HDF5 with pl_h5.h: attributes, row-extendible datasets and
 * the prediction files (pl_h5_out). */
#include "pl_h5.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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
        else if (!pl_meta_is_float(attrs, k) && pl_meta_get_int(attrs, k, &iv) == PL_OK)
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
        hid_t lc = H5Pcreate(H5P_LINK_CREATE); /* "train/topk_ids": the group /train too */
        H5Pset_create_intermediate_group(lc, 1);
        H5Pset_chunk(pl, t->ndim, chunk);
        d->ds = H5Dcreate2(o->file, name, mt, sp, lc, pl, H5P_DEFAULT);
        H5Pclose(lc);
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

/* ---- a model's outputs (plugin.h pl_outputs) ------------------------------- */

pl_status pl_h5_outputs_write(pl_h5_out *o, const pl_outputs *out) {
    pl_status st = PL_OK;
    for (int i = 0; !st && out && i < out->n; i++)
        st = pl_h5_out_append(o, out->name[i], out->t[i]);
    return st;
}

void pl_h5_outputs_abandon(pl_h5_out **o) {
    if (!*o) return;
    /* the error that stopped the write is the one to report: closing's is dropped */
    char msg[4096];
    pl_status es = pl_error_status();
    snprintf(msg, sizeof msg, "%s", pl_error_message());
    pl_h5_out_abort(*o);
    if (es) pl_error_set(es, "%s", msg);
    unlink((*o)->path);
    free(*o);
    *o = NULL;
}

pl_status pl_h5_outputs_open(const char *final_path, const pl_outputs *decl, pl_h5_out **out) {
    char tmp[1024];
    *out = NULL;
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%ld", final_path, (long)getpid()) >= (int)sizeof tmp)
        return pl_error_set(PL_ERR_INVALID, "%s: path too long", final_path);
    pl_status st = pl_h5_out_new(tmp, decl ? decl->attrs : NULL, out);
    if (st) return st;
    snprintf((*out)->final, sizeof (*out)->final, "%s", final_path);
    st = pl_h5_outputs_write(*out, decl);
    if (st) pl_h5_outputs_abandon(out);
    return st;
}

pl_status pl_h5_outputs_commit(pl_h5_out **o) {
    if (!*o) return pl_error_set(PL_ERR_INVALID, "pl_h5_outputs_commit: no file open");
    pl_status st = pl_h5_out_close(*o);
    if (!st && rename((*o)->path, (*o)->final) != 0)
        st = pl_error_set(PL_ERR_IO, "%s: renaming to %s failed: %s", (*o)->path, (*o)->final,
                          strerror(errno));
    if (st) unlink((*o)->path);
    free(*o);
    *o = NULL;
    return st;
}
