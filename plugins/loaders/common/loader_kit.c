/* loader_kit.c - the loaders' shared kit (loader_kit.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "loader_kit.h"

/* ---- tensors ------------------------------------------------------------ */

/* A tensor owned by us even if the caller has a pl_frame open. */
static pl_tensor *own(pl_tensor *t) {
    if (t) pl_frame_keep(t);
    pl_frame_end();
    return t;
}

pl_tensor *lk_new_tensor(pl_dtype dt, int ndim, const int64_t *shape, pl_device dev) {
    pl_frame_begin();
    return own(pl_tensor_empty(dt, ndim, shape, dev));
}

pl_tensor *lk_view_rows(pl_tensor *t, int64_t start, int64_t len) {
    pl_frame_begin();
    return own(pl_tensor_view_rows(t, start, len));
}

pl_tensor *lk_as_strided(pl_tensor *t, int ndim, const int64_t *shape, const int64_t *stride,
                         int64_t off) {
    pl_frame_begin();
    return own(pl_tensor_as_strided(t, ndim, shape, stride, off));
}

pl_tensor *lk_to_device(pl_device dev, pl_dtype dt, int nd, const int64_t *shape,
                        const void *host) {
    pl_tensor *t = lk_new_tensor(dt, nd, shape, dev);
    if (!t) return NULL;
    int64_t n = 1;
    for (int i = 0; i < nd; i++)
        n *= shape[i];
    size_t bytes = pl_dtype_nbytes(dt, n);
    if (bytes == 0) return t;
    const pl_backend *be = pl_backend_get(t->device.type);
    if (!be || be->memcpy(pl_tensor_data(t), t->device, host, PL_CPU, bytes)) {
        pl_tensor_release(t);
        return NULL;
    }
    return t;
}

static void free_pinned(void *data, void *ctx) {
    ((const pl_backend *)ctx)->host_free_pinned(data);
}

pl_tensor *lk_stage_tensor(pl_device dev, pl_dtype dt, int ndim, const int64_t *shape) {
    const pl_backend *be = pl_backend_get(dev.type);
    if (be && be->host_alloc_pinned && be->host_free_pinned) {
        int64_t n = 1;
        for (int d = 0; d < ndim; d++)
            n *= shape[d];
        void *p = be->host_alloc_pinned(pl_dtype_nbytes(dt, n) ? pl_dtype_nbytes(dt, n) : 1);
        if (p) {
            pl_frame_begin(); /* ours, whatever frame the caller has open */
            pl_tensor *t = pl_tensor_from_external(dt, ndim, shape, p, free_pinned, (void *)be);
            if (t) pl_frame_keep(t);
            pl_frame_end();
            if (!t) be->host_free_pinned(p);
            return t;
        }
    }
    return lk_new_tensor(dt, ndim, shape, PL_CPU);
}

pl_status lk_read_ds(const char *path, hid_t f, const char *name, hid_t memtype, int min_rank,
                     int max_rank, const int64_t *want, void **out, int64_t *dims, int *rank,
                     uint64_t *bytes_read) {
    pl_h5_info in;
    pl_status st = pl_h5_read_alloc(path, f, name, memtype, min_rank, max_rank, want, out, &in);
    if (st) return st;
    for (int i = 0; i < in.rank; i++)
        dims[i] = in.dims[i];
    if (rank) *rank = in.rank;
    if (bytes_read) *bytes_read += (uint64_t)in.numel * H5Tget_size(memtype);
    return PL_OK;
}

/* ---- batches ------------------------------------------------------------ */

int lk_emit(lk_views *views, pl_batch *out, const char *name, pl_tensor *v) {
    if (!v) return -1;
    if (views->n >= LK_MAX_VIEWS || out->n >= PL_BATCH_MAX_FIELDS) {
        pl_tensor_release(v);
        pl_error_set(PL_ERR_INTERNAL, "loader: batch field '%s' is one too many (%d)", name,
                     PL_BATCH_MAX_FIELDS);
        return -1;
    }
    views->v[views->n++] = v;
    out->names[out->n] = name;
    out->fields[out->n++] = v;
    return 0;
}

void lk_views_release(lk_views *views) {
    for (int i = 0; i < views->n; i++)
        pl_tensor_release(views->v[i]);
    views->n = 0;
}

pl_status lk_gather_rows(const char *plugin, pl_device dev, pl_tensor *dst, pl_tensor *src,
                         const int64_t *idx, pl_tensor *idx_dev, int64_t off, int64_t n,
                         size_t row_bytes) {
    if (pl_device_eq(dev, PL_CPU)) {
        char *d = pl_tensor_data(dst);
        const char *s = pl_tensor_data(src);
#pragma omp parallel for if (n * (int64_t)row_bytes > (1 << 20)) schedule(static)
        for (int64_t i = 0; i < n; i++)
            memcpy(d + (size_t)i * row_bytes, s + (size_t)idx[i] * row_bytes, row_bytes);
        return PL_OK;
    }
    const pl_backend *be = pl_backend_get(dev.type);
    if (!be) return pl_error_status();
    pl_kernel_fn k = pl_backend_kernel(be, PL_OP_INDEX_SELECT, false);
    if (!k)
        return pl_error_set(PL_ERR_UNSUPPORTED,
                            "%s: backend %s has no index_select kernel to "
                            "gather a shuffled batch",
                            plugin, be->name);
    pl_tensor *iv = lk_view_rows(idx_dev, off, n), *ov = lk_view_rows(dst, 0, n);
    pl_status st = !iv || !ov ? pl_error_status() : PL_OK;
    if (!st) {
        pl_kernel_args a = {.op = PL_OP_INDEX_SELECT, .n_in = 2, .n_out = 1};
        a.in[0] = src;
        a.in[1] = iv;
        a.out[0] = ov;
        a.p.dim = 0;
        st = k(&a);
    }
    pl_tensor_release(iv);
    pl_tensor_release(ov);
    return st;
}

/* ---- order -------------------------------------------------------------- */

uint64_t lk_rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void lk_shuffle(int64_t *a, int64_t n, uint64_t *s) {
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)(lk_rng_next(s) % (uint64_t)(i + 1));
        int64_t t = a[i];
        a[i] = a[j];
        a[j] = t;
    }
}

void lk_shuffle_order(int64_t *order, const int64_t *ids, int64_t n, uint64_t seed) {
    if (n > 0) memcpy(order, ids, sizeof *order * (size_t)n);
    lk_shuffle(order, n, &seed);
}

/* ---- splits ------------------------------------------------------------- */

pl_status lk_parse_fractions(const char *plugin, const char *s, double fr[3]) {
    if (sscanf(s, "%lf,%lf,%lf", &fr[0], &fr[1], &fr[2]) != 3 || fr[0] <= 0 || fr[1] < 0 ||
        fr[2] < 0 || fr[0] + fr[1] + fr[2] > 1.0 + 1e-9)
        return pl_error_set(PL_ERR_CONFIG,
                            "%s: split_fractions = '%s': expected three fractions "
                            "'train,val,test' >= 0 summing to at most 1",
                            plugin, s);
    return PL_OK;
}

int64_t lk_batches(int64_t n, int64_t batch, bool drop_last) {
    if (n <= 0 || batch <= 0) return 0;
    return drop_last ? n / batch : (n + batch - 1) / batch;
}

pl_status lk_check_start(const char *plugin, pl_data_split split, int64_t epoch, int64_t start,
                         int64_t nb, const char *where) {
    if (start >= 0 && start <= nb) return PL_OK;
    return pl_error_set(PL_ERR_INVALID,
                        "%s: epoch_begin(%s, epoch %lld, start_batch %lld): start_batch must lie "
                        "in 0..%lld, split '%s' has %lld batches (%s)",
                        plugin, pl_split_name(split), (long long)epoch, (long long)start,
                        (long long)nb, pl_split_name(split), (long long)nb, where);
}

int lk_predict_split(const pl_run_context *ctx) {
    const char *s = ctx && ctx->meta ? pl_meta_get_str(ctx->meta, "predict_split") : NULL;
    for (int i = 0; s && i < PL_SPLIT_COUNT; i++)
        if (!strcmp(s, pl_split_name((pl_data_split)i))) return i;
    return -1;
}

/* ---- deprecated aliases ------------------------------------------------ */

void lk_merge_options(pl_option_spec *out, int cap, const pl_option_spec *const *lists,
                      int nlists) {
    int n = 0;
    for (int l = 0; l < nlists; l++)
        for (const pl_option_spec *o = lists[l]; o->name && n < cap - 1; o++) {
            bool seen = false;
            for (int i = 0; i < n && !seen; i++)
                seen = !strcmp(out[i].name, o->name);
            if (!seen) out[n++] = *o;
        }
    out[n] = (pl_option_spec)PL_OPTIONS_END;
}

void lk_deprecated(const char *old, const char *what, const char *new_name) {
    static char said[4][96];
    static int nsaid;
    char key[96];
    snprintf(key, sizeof key, "%s/%s", old, new_name);
    for (int i = 0; i < nsaid; i++)
        if (!strcmp(said[i], key)) return;
    if (nsaid < 4) snprintf(said[nsaid++], sizeof said[0], "%s", key);
    pl_message("%s%s is deprecated: use plugin = %s (same options; plugins/loaders/README.md)", old,
               what, new_name);
}

/* ---- metadata ----------------------------------------------------------- */

void lk_join_path(char *out, size_t n, const char *group, const char *name) {
    if (name[0] == '/' || !group[0] || !strcmp(group, "/"))
        snprintf(out, n, "%s%s", name[0] == '/' ? "" : "/", name);
    else
        snprintf(out, n, "%s/%s", group, name);
}

void lk_meta_int(pl_run_context *ctx, const char *k, int64_t v) {
    if (ctx && ctx->meta) pl_meta_set_int(ctx->meta, k, v);
}

void lk_meta_float(pl_run_context *ctx, const char *k, double v) {
    if (ctx && ctx->meta) pl_meta_set_float(ctx->meta, k, v);
}

typedef struct attr_walk {
    pl_run_context *ctx;
    const char *path;
} attr_walk;

static herr_t attr_cb(hid_t loc, const char *name, const H5A_info_t *info, void *data) {
    (void)info;
    const attr_walk *w = data;
    int64_t iv;
    double dv;
    bool found;
    hid_t a = H5Aopen(loc, name, H5P_DEFAULT);
    if (a < 0) return 0;
    hid_t t = H5Aget_type(a);
    H5T_class_t c = H5Tget_class(t);
    H5Tclose(t);
    H5Aclose(a);
    if (c == H5T_INTEGER && !pl_h5_attr_read_int(w->path, loc, name, &iv, &found))
        pl_meta_set_int(w->ctx->meta, name, iv);
    else if (c == H5T_FLOAT && !pl_h5_attr_read_double(w->path, loc, name, &dv, &found))
        pl_meta_set_float(w->ctx->meta, name, dv);
    pl_error_clear(); /* non-scalar attributes are not meta */
    return 0;
}

void lk_publish_file_attrs(pl_run_context *ctx, const char *path, hid_t file) {
    if (!ctx || !ctx->meta) return;
    attr_walk w = {ctx, path};
    pl_h5_lock();
    H5E_BEGIN_TRY {
        H5Aiterate2(file, H5_INDEX_NAME, H5_ITER_INC, NULL, attr_cb, &w);
    }
    H5E_END_TRY;
    pl_h5_unlock();
}

int64_t lk_days_from_civil(int64_t y, int m, int d) {
    y -= m <= 2;
    const int64_t era = (y >= 0 ? y : y - 399) / 400;
    const int64_t yoe = y - era * 400;
    const int64_t doy = (153 * (m > 2 ? m - 3 : m + 9) + 2) / 5 + d - 1;
    const int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

void lk_format_day(int64_t z, char *out, size_t n) {
    if (z <= -100000000 || z >= 100000000) {
        snprintf(out, n, "day %lld", (long long)z);
        return;
    }
    z += 719468;
    const int64_t era = (z >= 0 ? z : z - 146096) / 146097;
    const int64_t doe = z - era * 146097;
    const int64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    const int64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    const int64_t mp = (5 * doy + 2) / 153;
    const int d = (int)(doy - (153 * mp + 2) / 5 + 1), m = (int)(mp < 10 ? mp + 3 : mp - 9);
    snprintf(out, n, "%04lld-%02d-%02d", (long long)(yoe + era * 400 + (m <= 2)), m, d);
}

double lk_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
