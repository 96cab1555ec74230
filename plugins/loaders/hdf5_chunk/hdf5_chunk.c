/* hdf5_chunk.c - mega-batch HDF5 loader.
 *
 * Two modes (README.md has the option table and the layouts):
 *
 * Rows mode: samples along axis 0 of one or more datasets. A split's rows are
 * read in chunks of `chunk_samples` rows (a multiple of batch_size) straight
 * into allocator-backed tensors on the target device; a batch is a VIEW
 * (pl_tensor_view_rows) of the current chunk, so no batch allocates. When the
 * whole data fits the budget every split stays resident (read once, reused
 * every epoch). Otherwise two chunk buffers are used: a prefetch thread reads
 * the next chunk into the second one while the first is consumed (double
 * buffering). Shuffle permutes the chunk order and the rows inside a chunk
 * (seed = ctx->seed + epoch); a shuffled batch is then gathered (memcpy per
 * row) into one batch buffer per field allocated once at create.
 *
 * Series mode (`window` > 0): one [T, F] series; inputs are overlapping
 * windows built as strided views (pl_tensor_as_strided) of one feature
 * matrix, never N copies. Splits by date (train_end / val_end) or fractions;
 * optional standardization with training-range statistics.
 *
 * Resume (plugin.h loader `state`): the train position (epoch, next batch)
 * is kept apart from the cursor val/test share; a loaded position makes the
 * next epoch_begin(train, that epoch) start at that batch of the same seeded
 * order, reading only the chunk that holds it (and prefetching the next).
 *
 * Threading: only the prefetch thread or the caller's thread touch HDF5 at
 * any time (a process-wide mutex guards every HDF5 call); tensor headers and
 * reference counts are only touched on the caller's thread.
 */
#include <cjson/cJSON.h>
#include <hdf5.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pipeline/pipeline.h"

#define MAXF PL_BATCH_MAX_FIELDS
#define NAME_LEN 256

static pthread_mutex_t g_h5_lock = PTHREAD_MUTEX_INITIALIZER;

/* A tensor owned by us even if the caller has a pl_frame open. */
static pl_tensor *own(pl_tensor *(*mk)(void *), void *arg) {
    pl_frame_begin();
    pl_tensor *t = mk(arg);
    if (t) pl_frame_keep(t);
    pl_frame_end();
    return t;
}
typedef struct { pl_dtype dt; int ndim; const int64_t *shape; pl_device dev; } empty_args;
static pl_tensor *mk_empty(void *p) {
    empty_args *a = p;
    return pl_tensor_empty(a->dt, a->ndim, a->shape, a->dev);
}
static pl_tensor *new_tensor(pl_dtype dt, int ndim, const int64_t *shape, pl_device dev) {
    empty_args a = {dt, ndim, shape, dev};
    return own(mk_empty, &a);
}
typedef struct { pl_tensor *t; int64_t start, len; } rows_args;
static pl_tensor *mk_rows(void *p) {
    rows_args *a = p;
    return pl_tensor_view_rows(a->t, a->start, a->len);
}
static pl_tensor *view_rows(pl_tensor *t, int64_t start, int64_t len) {
    rows_args a = {t, start, len};
    return own(mk_rows, &a);
}
typedef struct { pl_tensor *t; int ndim; const int64_t *shape, *stride; int64_t off; } strided_args;
static pl_tensor *mk_strided(void *p) {
    strided_args *a = p;
    return pl_tensor_as_strided(a->t, a->ndim, a->shape, a->stride, a->off);
}
static pl_tensor *as_strided(pl_tensor *t, int ndim, const int64_t *shape, const int64_t *stride,
                             int64_t off) {
    strided_args a = {t, ndim, shape, stride, off};
    return own(mk_strided, &a);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* splitmix64-seeded xorshift for permutations (reproducible per seed). */
static uint64_t rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static void shuffle_i64(int64_t *a, int64_t n, uint64_t *s) {
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)(rng_next(s) % (uint64_t)(i + 1));
        int64_t t = a[i];
        a[i] = a[j];
        a[j] = t;
    }
}

/* days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm). */
static int64_t days_from_civil(int64_t y, unsigned m, unsigned d) {
    y -= m <= 2;
    const int64_t era = (y >= 0 ? y : y - 399) / 400;
    const unsigned yoe = (unsigned)(y - era * 400);
    const unsigned doy = (153 * (m > 2 ? m - 3 : m + 9) + 2) / 5 + d - 1;
    const unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + (int64_t)doe - 719468;
}
static pl_status parse_date(const char *key, const char *s, int64_t *out) {
    int y, m, d;
    char tail;
    if (sscanf(s, "%d-%d-%d%c", &y, &m, &d, &tail) != 3 || m < 1 || m > 12 || d < 1 || d > 31)
        return pl_error_set(PL_ERR_CONFIG, "hdf5_chunk: %s = '%s': expected a date YYYY-MM-DD", key, s);
    *out = days_from_civil(y, (unsigned)m, (unsigned)d);
    return PL_OK;
}

/* ===================================================================== */

typedef struct field {
    char name[64];      /* batch field name */
    char dset[NAME_LEN];/* dataset path (relative to the split's group) */
    pl_dtype dt;        /* tensor dtype */
    hid_t memtype;      /* native HDF5 type matching dt (not to be closed) */
    int ndim;           /* rank of the dataset */
    int64_t dims[PL_MAX_DIMS];
    int64_t row_elems;  /* elements per sample */
    size_t row_bytes;
} field;

typedef struct split_data {
    bool present;
    char where[NAME_LEN];   /* "/val" or "rows 80..90 of /" for messages */
    int nf;
    field f[MAXF];
    hid_t ds[MAXF];
    int64_t row0, nrows;    /* rows of the datasets used by this split */
    int64_t batch;          /* batch size of the split */
    bool shuffle, drop_last;
    /* resident extra fields (padded CSR histories): full [nrows, H] tensors */
    int nx;
    char xname[4][64];
    pl_tensor *xt[4];
    /* series mode: windows [w0, w1) */
    int64_t w0, w1;
} split_data;

typedef struct chunk_buf {
    pl_tensor *t[MAXF];     /* [cap, ...] on the device */
    pl_tensor *stage[MAXF]; /* host staging when the device is not the CPU */
    int split;              /* what it holds: split, chunk index (-1 none) */
    int64_t chunk, rows;
} chunk_buf;

typedef struct loader {
    pl_run_context *ctx;
    pl_device dev;
    char path[1024];
    hid_t file;
    bool series_mode;
    split_data sp[PL_SPLIT_COUNT];
    int64_t cap;            /* rows per chunk */
    bool resident;          /* every split fits: one buffer per split, read once */
    int nbuf;
    chunk_buf buf[PL_SPLIT_COUNT];
    /* shuffle gather buffers ([batch, ...] per field, allocated once) */
    pl_tensor *gather[MAXF];
    pl_tensor *xgather[4];
    int64_t *perm;          /* within-chunk row order, cap entries */
    int64_t *order;         /* chunk order of the epoch */
    int64_t order_cap;
    /* epoch state */
    int cur_split;
    int64_t epoch, nchunks, chunk_pos, row_pos, batch_index;
    int cur_buf;
    bool exhausted;         /* resumed at the end of the epoch: next() returns 0 */
    /* resume protocol (train split only, README "Resume"): the train position is kept
     * apart from the cursor, which val/test batches also use; state() arms a position
     * that the next epoch_begin(train, that epoch) starts at */
    int64_t tr_epoch, tr_next;
    bool armed;
    int64_t arm_epoch, arm_next;
    pl_tensor *out_views[MAXF + 4];
    int n_out;
    /* prefetch thread */
    bool prefetch;
    pthread_t th;
    bool th_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool req_pending, busy, quit;
    int req_buf, req_split;
    int64_t req_chunk;
    pl_status req_status;
    char req_err[1024];
    /* stats */
    pl_loader_stats st;
    /* series mode */
    pl_tensor *feat, *targ, *wx_g, *wy_g; /* [T,Ff], [T,Ft], gather buffers */
    int64_t T, Ff, Ft, window, horizon;
} loader;

/* ---- HDF5 helpers ---------------------------------------------------- */

static const char *filter_name(H5Z_filter_t id) {
    switch (id) {
    case H5Z_FILTER_DEFLATE: return "gzip";
    case H5Z_FILTER_SHUFFLE: return "shuffle";
    case H5Z_FILTER_FLETCHER32: return "fletcher32";
    case H5Z_FILTER_SZIP: return "szip";
    case H5Z_FILTER_NBIT: return "nbit";
    case H5Z_FILTER_SCALEOFFSET: return "scaleoffset";
    case 32000: return "lzf";
    case 32001: return "blosc";
    case 32004: return "lz4";
    case 32015: return "zstd";
    case 32008: return "bitshuffle";
    default: return "unknown";
    }
}

/* Every filter of a dataset must be available to this HDF5 library. */
static pl_status check_filters(const char *path, const char *dname, hid_t ds) {
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
                              path, dname, (int)id, nm[0] ? nm : filter_name(id));
    }
    H5Pclose(dcpl);
    return st;
}

/* Map a dataset's file type to a tensor dtype and native memory type. */
static pl_status map_type(const char *path, const char *dname, hid_t ds, bool to_f32,
                          pl_dtype *dt, hid_t *mem) {
    hid_t ft = H5Dget_type(ds);
    H5T_class_t cls = H5Tget_class(ft);
    size_t sz = H5Tget_size(ft);
    H5T_sign_t sign = cls == H5T_INTEGER ? H5Tget_sign(ft) : H5T_SGN_NONE;
    H5Tclose(ft);
    if (cls == H5T_FLOAT) {
        if (to_f32 || sz == 4) { *dt = PL_F32; *mem = H5T_NATIVE_FLOAT; }
        else if (sz == 8) { *dt = PL_F64; *mem = H5T_NATIVE_DOUBLE; }
        else { *dt = PL_F32; *mem = H5T_NATIVE_FLOAT; } /* f16 and others: converted by HDF5 */
        return PL_OK;
    }
    if (cls == H5T_INTEGER || cls == H5T_ENUM) {
        if (sz == 1 && sign == H5T_SGN_NONE) { *dt = PL_U8; *mem = H5T_NATIVE_UINT8; }
        else if (sz <= 4 && !(sz == 4 && sign == H5T_SGN_NONE)) { *dt = PL_I32; *mem = H5T_NATIVE_INT32; }
        else { *dt = PL_I64; *mem = H5T_NATIVE_INT64; }
        return PL_OK;
    }
    return pl_error_set(PL_ERR_DTYPE, "%s: dataset '%s' has a non-numeric HDF5 type (class %d)",
                        path, dname, (int)cls);
}

static pl_status open_dataset(const char *path, hid_t file, const char *dname, hid_t *out) {
    htri_t ok = 0;
    H5E_BEGIN_TRY { ok = H5Lexists(file, dname, H5P_DEFAULT) > 0 ? H5Oexists_by_name(file, dname, H5P_DEFAULT) : 0; }
    H5E_END_TRY;
    if (ok <= 0) return pl_error_set(PL_ERR_IO, "%s: dataset '%s' not found", path, dname);
    hid_t ds;
    H5E_BEGIN_TRY { ds = H5Dopen2(file, dname, H5P_DEFAULT); }
    H5E_END_TRY;
    if (ds < 0) return pl_error_set(PL_ERR_IO, "%s: '%s' is not a dataset", path, dname);
    *out = ds;
    return PL_OK;
}

static bool link_exists(hid_t file, const char *name) {
    htri_t ok = 0;
    if (!strcmp(name, "/")) return true;
    H5E_BEGIN_TRY {
        /* every prefix must exist for H5Lexists */
        char buf[NAME_LEN];
        snprintf(buf, sizeof buf, "%s", name);
        ok = 1;
        for (char *p = buf + 1; *p && ok > 0; p++) {
            if (*p != '/') continue;
            *p = 0;
            ok = H5Lexists(file, buf, H5P_DEFAULT);
            *p = '/';
        }
        if (ok > 0) ok = H5Lexists(file, buf, H5P_DEFAULT);
    }
    H5E_END_TRY;
    return ok > 0;
}

static int get_dims(hid_t ds, int64_t *dims) {
    hid_t sp = H5Dget_space(ds);
    hsize_t d[H5S_MAX_RANK];
    int nd = H5Sget_simple_extent_dims(sp, d, NULL);
    H5Sclose(sp);
    for (int i = 0; i < nd && i < PL_MAX_DIMS; i++) dims[i] = (int64_t)d[i];
    return nd;
}

/* Read rows [r0, r0+n) of `ds` into `dst` (host memory). */
static pl_status read_rows(const char *path, const char *dname, hid_t ds, const field *f, int64_t r0,
                           int64_t n, void *dst) {
    if (n == 0) return PL_OK;
    hsize_t start[PL_MAX_DIMS] = {0}, count[PL_MAX_DIMS];
    for (int i = 0; i < f->ndim; i++) count[i] = (hsize_t)f->dims[i];
    start[0] = (hsize_t)r0;
    count[0] = (hsize_t)n;
    hid_t fs = H5Dget_space(ds);
    hid_t ms = H5Screate_simple(f->ndim, count, NULL);
    herr_t e = H5Sselect_hyperslab(fs, H5S_SELECT_SET, start, NULL, count, NULL);
    if (e >= 0) {
        H5E_BEGIN_TRY { e = H5Dread(ds, f->memtype, ms, fs, H5P_DEFAULT, dst); }
        H5E_END_TRY;
    }
    H5Sclose(ms);
    H5Sclose(fs);
    if (e < 0)
        return pl_error_set(PL_ERR_IO, "%s: reading rows %lld..%lld of dataset '%s' failed", path,
                            (long long)r0, (long long)(r0 + n), dname);
    return PL_OK;
}

/* ---- options --------------------------------------------------------- */

static const pl_option_spec opts[] = {
    {"path", PL_OPT_STRING, NULL, PL_NO_BOUNDS, NULL, "HDF5 file"},
    {"datasets", PL_OPT_STRING, "", PL_NO_BOUNDS, NULL,
     "rows mode: 'field=dataset,...' or 'dataset,...' (field = dataset's base name)"},
    {"val_datasets", PL_OPT_STRING, "", PL_NO_BOUNDS, NULL, "datasets of the val split (default: datasets)"},
    {"test_datasets", PL_OPT_STRING, "", PL_NO_BOUNDS, NULL, "datasets of the test split (default: datasets)"},
    {"train_group", PL_OPT_STRING, "/train", PL_NO_BOUNDS, NULL, "group of the train split"},
    {"val_group", PL_OPT_STRING, "/val", PL_NO_BOUNDS, NULL, "group of the val split"},
    {"test_group", PL_OPT_STRING, "/test", PL_NO_BOUNDS, NULL, "group of the test split"},
    {"split_fractions", PL_OPT_STRING, "", PL_NO_BOUNDS, NULL,
     "'0.8,0.1,0.1': split the rows (or the series) in order instead of groups/dates"},
    {"history", PL_OPT_STRING, "", PL_NO_BOUNDS, NULL,
     "CSR group (offsets/items) under val/test groups exposed as a padded i32 [B, Hmax] field of that name"},
    {"batch_size", PL_OPT_INT, "32", 1, 1e9, NULL, "samples per batch"},
    {"eval_batch_size", PL_OPT_INT, "0", 0, 1e9, NULL, "val/test batch size (0: batch_size)"},
    {"chunk_samples", PL_OPT_INT, "0", 0, 1e12, NULL, "rows per chunk (0: from chunk_size_gb)"},
    {"chunk_size_gb", PL_OPT_FLOAT, "0", 0, 1e6, NULL,
     "chunk budget in GiB (0: 75 % of free device memory, clamped to the data size)"},
    {"shuffle", PL_OPT_BOOL, "true", PL_NO_BOUNDS, NULL, "shuffle train (chunk order and rows in a chunk)"},
    {"drop_last", PL_OPT_BOOL, "false", PL_NO_BOUNDS, NULL, "drop the last partial train batch"},
    {"prefetch", PL_OPT_BOOL, "true", PL_NO_BOUNDS, NULL, "read the next chunk in a background thread"},
    {"convert", PL_OPT_CHOICE, "none", PL_NO_BOUNDS, "none|f32", "convert floating datasets to f32"},
    {"series", PL_OPT_STRING, "series", PL_NO_BOUNDS, NULL, "series mode: the [T, F] dataset"},
    {"window", PL_OPT_INT, "0", 0, 1e9, NULL, "series mode when > 0: input window length"},
    {"horizon", PL_OPT_INT, "1", 1, 1e9, NULL, "series mode: target steps after the window"},
    {"target_columns", PL_OPT_STRING, "0", PL_NO_BOUNDS, NULL, "series: target column names or indices"},
    {"feature_columns", PL_OPT_STRING, "", PL_NO_BOUNDS, NULL, "series: input columns (default all)"},
    {"standardize", PL_OPT_BOOL, "false", PL_NO_BOUNDS, NULL,
     "series: (x - mean) / std per column, stats from the training range only"},
    {"date_dataset", PL_OPT_STRING, "date", PL_NO_BOUNDS, NULL, "series: days since 1970 per row"},
    {"train_end", PL_OPT_STRING, "", PL_NO_BOUNDS, NULL, "series: last date (YYYY-MM-DD) of train targets"},
    {"val_end", PL_OPT_STRING, "", PL_NO_BOUNDS, NULL, "series: last date of val targets (test after)"},
    PL_OPTIONS_END};

/* Parse "a=b,c" into field names / dataset names. */
static pl_status parse_fields(const char *key, const char *spec, split_data *s) {
    char buf[2048];
    snprintf(buf, sizeof buf, "%s", spec);
    s->nf = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        while (*tok == ' ') tok++;
        char *e = tok + strlen(tok);
        while (e > tok && e[-1] == ' ') *--e = 0;
        if (!*tok) continue;
        if (s->nf >= MAXF - 4)
            return pl_error_set(PL_ERR_CONFIG, "hdf5_chunk: %s: more than %d datasets", key, MAXF - 4);
        field *f = &s->f[s->nf++];
        char *eq = strchr(tok, '=');
        if (eq) {
            *eq = 0;
            snprintf(f->name, sizeof f->name, "%s", tok);
            snprintf(f->dset, sizeof f->dset, "%s", eq + 1);
        } else {
            const char *base = strrchr(tok, '/');
            snprintf(f->name, sizeof f->name, "%s", base ? base + 1 : tok);
            snprintf(f->dset, sizeof f->dset, "%s", tok);
        }
        if (!f->name[0] || !f->dset[0])
            return pl_error_set(PL_ERR_CONFIG, "hdf5_chunk: %s: empty field or dataset in '%s'", key, spec);
    }
    if (s->nf == 0)
        return pl_error_set(PL_ERR_CONFIG, "hdf5_chunk: %s is empty; list the datasets to load", key);
    return PL_OK;
}

static pl_status parse_fractions(const char *s, double fr[3]) {
    if (sscanf(s, "%lf,%lf,%lf", &fr[0], &fr[1], &fr[2]) != 3 || fr[0] <= 0 || fr[1] < 0 ||
        fr[2] < 0 || fr[0] + fr[1] + fr[2] > 1.0 + 1e-9)
        return pl_error_set(PL_ERR_CONFIG,
                            "hdf5_chunk: split_fractions = '%s': expected three fractions "
                            "'train,val,test' >= 0 summing to at most 1", s);
    return PL_OK;
}

/* ---- rows mode: open datasets of one split ---------------------------- */

static void join_path(char *out, size_t n, const char *group, const char *name) {
    if (name[0] == '/' || !group[0] || !strcmp(group, "/"))
        snprintf(out, n, "%s%s", name[0] == '/' ? "" : "/", name);
    else
        snprintf(out, n, "%s/%s", group, name);
}

static pl_status open_split(loader *L, int si, const char *group, bool to_f32) {
    split_data *s = &L->sp[si];
    int64_t n = -1;
    const char *first = NULL;
    for (int i = 0; i < s->nf; i++) {
        field *f = &s->f[i];
        char full[NAME_LEN];
        join_path(full, sizeof full, group, f->dset);
        snprintf(f->dset, sizeof f->dset, "%s", full);
        pl_status st = open_dataset(L->path, L->file, f->dset, &s->ds[i]);
        if (st) return st;
        if ((st = check_filters(L->path, f->dset, s->ds[i]))) return st;
        if ((st = map_type(L->path, f->dset, s->ds[i], to_f32, &f->dt, &f->memtype))) return st;
        f->ndim = get_dims(s->ds[i], f->dims);
        if (f->ndim < 1 || f->ndim > PL_MAX_DIMS)
            return pl_error_set(PL_ERR_SHAPE,
                                "%s: dataset '%s' has rank %d; expected 1..%d with samples on axis 0",
                                L->path, f->dset, f->ndim, PL_MAX_DIMS);
        f->row_elems = 1;
        for (int d = 1; d < f->ndim; d++) f->row_elems *= f->dims[d];
        f->row_bytes = (size_t)f->row_elems * pl_dtype_size(f->dt);
        if (n < 0) {
            n = f->dims[0];
            first = f->dset;
        } else if (f->dims[0] != n) {
            return pl_error_set(PL_ERR_SHAPE,
                                "%s: datasets '%s' (%lld rows) and '%s' (%lld rows) disagree on "
                                "axis 0",
                                L->path, first, (long long)n, f->dset, (long long)f->dims[0]);
        }
    }
    s->present = true;
    s->row0 = 0;
    s->nrows = n;
    snprintf(s->where, sizeof s->where, "group %s", group);
    return PL_OK;
}

/* Padded [nrows, Hmax] i32 from CSR offsets/items (history of seen items). */
static pl_status load_history(loader *L, int si, const char *group, const char *name) {
    split_data *s = &L->sp[si];
    char po[NAME_LEN], pi[NAME_LEN], g[NAME_LEN];
    join_path(g, sizeof g, group, name);
    snprintf(po, sizeof po, "%s/offsets", g);
    snprintf(pi, sizeof pi, "%s/items", g);
    hid_t dso, dsi;
    pl_status st = open_dataset(L->path, L->file, po, &dso);
    if (st) return st;
    if ((st = open_dataset(L->path, L->file, pi, &dsi))) {
        H5Dclose(dso);
        return st;
    }
    int64_t dims_o[PL_MAX_DIMS], dims_i[PL_MAX_DIMS];
    int ro = get_dims(dso, dims_o), ri = get_dims(dsi, dims_i);
    int64_t *off = NULL;
    int32_t *items = NULL;
    pl_tensor *pad = NULL;
    if (ro != 1 || ri != 1 || dims_o[0] != s->nrows + 1) {
        st = pl_error_set(PL_ERR_SHAPE, "%s: '%s' must be 1-D [%lld] (rows + 1) and '%s' 1-D; found rank %d [%lld] and rank %d",
                          L->path, po, (long long)(s->nrows + 1), pi, ro, (long long)dims_o[0], ri);
        goto done;
    }
    off = malloc(sizeof *off * (size_t)dims_o[0]);
    items = malloc(sizeof *items * (size_t)(dims_i[0] ? dims_i[0] : 1));
    if (!off || !items) {
        st = pl_error_set(PL_ERR_NOMEM, "%s: out of memory reading '%s'", L->path, g);
        goto done;
    }
    if (H5Dread(dso, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, off) < 0 ||
        (dims_i[0] && H5Dread(dsi, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, items) < 0)) {
        st = pl_error_set(PL_ERR_IO, "%s: reading '%s' failed", L->path, g);
        goto done;
    }
    int64_t hmax = 1;
    for (int64_t r = 0; r < s->nrows; r++) {
        if (off[r] < 0 || off[r + 1] < off[r] || off[r + 1] > dims_i[0]) {
            st = pl_error_set(PL_ERR_INVALID, "%s: '%s' is not a valid CSR offset array at row %lld",
                              L->path, po, (long long)r);
            goto done;
        }
        if (off[r + 1] - off[r] > hmax) hmax = off[r + 1] - off[r];
    }
    pl_tensor *host = new_tensor(PL_I32, 2, (int64_t[]){s->nrows, hmax}, PL_CPU);
    if (!host) {
        st = pl_error_status();
        goto done;
    }
    int32_t *h = pl_tensor_data(host);
    memset(h, 0, sizeof *h * (size_t)(s->nrows * hmax));
    for (int64_t r = 0; r < s->nrows; r++)
        memcpy(h + r * hmax, items + off[r], sizeof *h * (size_t)(off[r + 1] - off[r]));
    pad = host;
    if (!pl_device_eq(L->dev, PL_CPU)) {
        pad = new_tensor(PL_I32, 2, (int64_t[]){s->nrows, hmax}, L->dev);
        if (!pad || pl_tensor_copy_(pad, host)) {
            st = pl_error_status();
            pl_tensor_release(pad);
            pad = NULL;
        }
        pl_tensor_release(host);
        if (!pad) goto done;
    }
    snprintf(s->xname[s->nx], sizeof s->xname[0], "%s", name);
    s->xt[s->nx++] = pad;
done:
    free(off);
    free(items);
    H5Dclose(dso);
    H5Dclose(dsi);
    return st;
}

/* ---- chunk reading (any thread) --------------------------------------- */

static pl_status fill_chunk(loader *L, chunk_buf *b, int si, int64_t chunk) {
    split_data *s = &L->sp[si];
    int64_t r0 = chunk * L->cap, n = s->nrows - r0;
    if (n > L->cap) n = L->cap;
    pl_status st = PL_OK;
    pthread_mutex_lock(&g_h5_lock);
    for (int i = 0; i < s->nf && !st; i++) {
        pl_tensor *dst = b->stage[i] ? b->stage[i] : b->t[i];
        st = read_rows(L->path, s->f[i].dset, s->ds[i], &s->f[i], s->row0 + r0, n, pl_tensor_data(dst));
    }
    pthread_mutex_unlock(&g_h5_lock);
    for (int i = 0; i < s->nf && !st; i++) {
        if (!b->stage[i]) continue;
        const pl_backend *be = pl_backend_get(L->dev.type);
        st = be ? be->memcpy(pl_tensor_data(b->t[i]), L->dev, pl_tensor_data(b->stage[i]), PL_CPU,
                             (size_t)n * s->f[i].row_bytes)
                : pl_error_status();
    }
    if (!st) {
        b->split = si;
        b->chunk = chunk;
        b->rows = n;
        size_t bytes = 0;
        for (int i = 0; i < s->nf; i++) bytes += (size_t)n * s->f[i].row_bytes;
        __atomic_add_fetch(&L->st.bytes_read, bytes, __ATOMIC_RELAXED);
        __atomic_add_fetch(&L->st.chunks_loaded, 1, __ATOMIC_RELAXED);
    } else {
        b->split = -1;
    }
    return st;
}

static void *prefetch_main(void *arg) {
    loader *L = arg;
    pthread_mutex_lock(&L->mu);
    for (;;) {
        while (!L->req_pending && !L->quit) pthread_cond_wait(&L->cv, &L->mu);
        if (L->quit) break;
        int bi = L->req_buf, si = L->req_split;
        int64_t ch = L->req_chunk;
        L->req_pending = false;
        L->busy = true;
        pthread_mutex_unlock(&L->mu);
        pl_status st = fill_chunk(L, &L->buf[bi], si, ch);
        pthread_mutex_lock(&L->mu);
        L->req_status = st;
        if (st) snprintf(L->req_err, sizeof L->req_err, "%s", pl_error_message());
        L->busy = false;
        pthread_cond_broadcast(&L->cv);
    }
    pthread_mutex_unlock(&L->mu);
    return NULL;
}

/* Wait for the in-flight read (if any); returns its status. */
static pl_status prefetch_wait(loader *L) {
    if (!L->th_started) return PL_OK;
    double t0 = now_s();
    pthread_mutex_lock(&L->mu);
    while (L->req_pending || L->busy) pthread_cond_wait(&L->cv, &L->mu);
    pl_status st = L->req_status;
    L->req_status = PL_OK;
    pthread_mutex_unlock(&L->mu);
    L->st.wait_seconds += now_s() - t0;
    if (st) return pl_error_set(st, "%s", L->req_err);
    return PL_OK;
}

static void prefetch_request(loader *L, int bi, int si, int64_t chunk) {
    if (!L->th_started) return;
    pthread_mutex_lock(&L->mu);
    L->buf[bi].split = -1; /* being overwritten */
    L->req_buf = bi;
    L->req_split = si;
    L->req_chunk = chunk;
    L->req_pending = true;
    pthread_cond_broadcast(&L->cv);
    pthread_mutex_unlock(&L->mu);
}

/* ---- buffers ----------------------------------------------------------- */

/* Allocate buffer b with `rows` rows of split si's fields. */
static pl_status alloc_buf(loader *L, chunk_buf *b, const split_data *s, int64_t rows) {
    b->split = -1;
    for (int i = 0; i < s->nf; i++) {
        int64_t shape[PL_MAX_DIMS];
        memcpy(shape, s->f[i].dims, sizeof shape);
        shape[0] = rows;
        b->t[i] = new_tensor(s->f[i].dt, s->f[i].ndim, shape, L->dev);
        if (!b->t[i]) return pl_error_prefix(pl_error_status(), "%s: chunk buffer for '%s'", L->path, s->f[i].dset);
        pl_tensor_set_name(b->t[i], "%s", s->f[i].dset);
        if (!pl_device_eq(L->dev, PL_CPU)) {
            b->stage[i] = new_tensor(s->f[i].dt, s->f[i].ndim, shape, PL_CPU);
            if (!b->stage[i]) return pl_error_status();
        }
    }
    return PL_OK;
}

static void free_buf(chunk_buf *b) {
    for (int i = 0; i < MAXF; i++) {
        pl_tensor_release(b->t[i]);
        pl_tensor_release(b->stage[i]);
        b->t[i] = b->stage[i] = NULL;
    }
}

static void release_views(loader *L) {
    for (int i = 0; i < L->n_out; i++) pl_tensor_release(L->out_views[i]);
    L->n_out = 0;
}

/* ---- destroy ----------------------------------------------------------- */

static void h5c_destroy(void *self) {
    loader *L = self;
    if (!L) return;
    if (L->th_started) {
        pthread_mutex_lock(&L->mu);
        L->quit = true;
        pthread_cond_broadcast(&L->cv);
        pthread_mutex_unlock(&L->mu);
        pthread_join(L->th, NULL);
    }
    pthread_mutex_destroy(&L->mu);
    pthread_cond_destroy(&L->cv);
    release_views(L);
    for (int i = 0; i < PL_SPLIT_COUNT; i++) free_buf(&L->buf[i]);
    for (int i = 0; i < MAXF; i++) pl_tensor_release(L->gather[i]);
    for (int i = 0; i < 4; i++) pl_tensor_release(L->xgather[i]);
    pthread_mutex_lock(&g_h5_lock);
    for (int si = 0; si < PL_SPLIT_COUNT; si++) {
        split_data *s = &L->sp[si];
        for (int i = 0; i < s->nf; i++)
            if (s->ds[i] > 0) H5Dclose(s->ds[i]);
        for (int i = 0; i < s->nx; i++) pl_tensor_release(s->xt[i]);
    }
    if (L->file > 0) H5Fclose(L->file);
    pthread_mutex_unlock(&g_h5_lock);
    pl_tensor_release(L->feat);
    pl_tensor_release(L->targ);
    pl_tensor_release(L->wx_g);
    pl_tensor_release(L->wy_g);
    free(L->perm);
    free(L->order);
    free(L);
}

/* ---- meta -------------------------------------------------------------- */

static herr_t attr_cb(hid_t loc, const char *name, const H5A_info_t *info, void *data) {
    (void)info;
    loader *L = data;
    hid_t a = H5Aopen(loc, name, H5P_DEFAULT);
    if (a < 0) return 0;
    hid_t sp = H5Aget_space(a), t = H5Aget_type(a);
    if (H5Sget_simple_extent_npoints(sp) == 1) {
        H5T_class_t c = H5Tget_class(t);
        if (c == H5T_INTEGER) {
            int64_t v;
            if (H5Aread(a, H5T_NATIVE_INT64, &v) >= 0) pl_meta_set_int(L->ctx->meta, name, v);
        } else if (c == H5T_FLOAT) {
            double v;
            if (H5Aread(a, H5T_NATIVE_DOUBLE, &v) >= 0) pl_meta_set_float(L->ctx->meta, name, v);
        }
    }
    H5Tclose(t);
    H5Sclose(sp);
    H5Aclose(a);
    return 0;
}

static void publish_file_attrs(loader *L) {
    if (!L->ctx || !L->ctx->meta) return;
    H5E_BEGIN_TRY { H5Aiterate2(L->file, H5_INDEX_NAME, H5_ITER_INC, NULL, attr_cb, L); }
    H5E_END_TRY;
}

static void meta_int(loader *L, const char *k, int64_t v) {
    if (L->ctx && L->ctx->meta) pl_meta_set_int(L->ctx->meta, k, v);
}
static void meta_float(loader *L, const char *k, double v) {
    if (L->ctx && L->ctx->meta) pl_meta_set_float(L->ctx->meta, k, v);
}

/* ---- series mode ------------------------------------------------------- */

/* Column names of the series: dataset "columns" or attribute "columns". */
static int read_column_names(loader *L, const char *series, char names[][64], int maxn) {
    int n = 0;
    hid_t obj = -1, sp = -1, t = -1;
    bool is_attr = false;
    H5E_BEGIN_TRY {
        if (link_exists(L->file, "/columns")) obj = H5Dopen2(L->file, "/columns", H5P_DEFAULT);
        if (obj < 0) {
            hid_t ds = H5Dopen2(L->file, series, H5P_DEFAULT);
            if (ds >= 0) {
                if (H5Aexists(ds, "columns") > 0) {
                    obj = H5Aopen(ds, "columns", H5P_DEFAULT);
                    is_attr = true;
                }
                H5Dclose(ds);
            }
        }
    }
    H5E_END_TRY;
    if (obj < 0) return 0;
    sp = is_attr ? H5Aget_space(obj) : H5Dget_space(obj);
    t = is_attr ? H5Aget_type(obj) : H5Dget_type(obj);
    hssize_t cnt = H5Sget_simple_extent_npoints(sp);
    if (H5Tget_class(t) == H5T_STRING && H5Tis_variable_str(t) > 0 && cnt > 0 && cnt <= maxn) {
        char **s = calloc((size_t)cnt, sizeof *s);
        hid_t mt = H5Tcopy(H5T_C_S1);
        H5Tset_size(mt, H5T_VARIABLE);
        H5Tset_cset(mt, H5Tget_cset(t));
        herr_t e = is_attr ? H5Aread(obj, mt, s) : H5Dread(obj, mt, H5S_ALL, H5S_ALL, H5P_DEFAULT, s);
        if (e >= 0) {
            for (hssize_t i = 0; i < cnt; i++) snprintf(names[i], 64, "%s", s[i] ? s[i] : "");
            n = (int)cnt;
            H5Dvlen_reclaim(mt, sp, H5P_DEFAULT, s);
        }
        H5Tclose(mt);
        free(s);
    }
    H5Tclose(t);
    H5Sclose(sp);
    if (is_attr) H5Aclose(obj); else H5Dclose(obj);
    return n;
}

/* "ridership,3" -> column indices. */
static pl_status parse_columns(loader *L, const char *key, const char *spec, char names[][64], int nnames,
                               int64_t F, int *idx, int *n) {
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", spec);
    *n = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        while (*tok == ' ') tok++;
        if (!*tok) continue;
        int c = -1;
        for (int i = 0; i < nnames; i++)
            if (!strcmp(names[i], tok)) c = i;
        if (c < 0) {
            char *end;
            long v = strtol(tok, &end, 10);
            if (*end == 0 && v >= 0 && v < F) c = (int)v;
        }
        if (c < 0)
            return pl_error_set(PL_ERR_CONFIG, "hdf5_chunk: %s: column '%s' is neither a name in %s "
                                "nor an index 0..%lld", key, tok, L->path, (long long)F - 1);
        if (*n >= 1024) return pl_error_set(PL_ERR_CONFIG, "hdf5_chunk: %s: too many columns", key);
        idx[(*n)++] = c;
    }
    if (*n == 0) return pl_error_set(PL_ERR_CONFIG, "hdf5_chunk: %s is empty", key);
    return PL_OK;
}

static pl_status write_standardization(loader *L, char names[][64], int nnames, const int *cols, int nc,
                                       const double *mean, const double *sd, int64_t train_rows) {
    if (!L->ctx || !L->ctx->run_dir) return PL_OK;
    cJSON *root = cJSON_CreateObject();
    cJSON *c = cJSON_AddArrayToObject(root, "columns");
    cJSON *m = cJSON_AddArrayToObject(root, "mean");
    cJSON *s = cJSON_AddArrayToObject(root, "std");
    for (int i = 0; i < nc; i++) {
        char nb[64];
        if (cols[i] < nnames) snprintf(nb, sizeof nb, "%s", names[cols[i]]);
        else snprintf(nb, sizeof nb, "%d", cols[i]);
        cJSON_AddItemToArray(c, cJSON_CreateString(nb));
        cJSON_AddItemToArray(m, cJSON_CreateNumber(mean[i]));
        cJSON_AddItemToArray(s, cJSON_CreateNumber(sd[i]));
    }
    cJSON_AddNumberToObject(root, "train_rows", (double)train_rows);
    cJSON_AddStringToObject(root, "source", L->path);
    cJSON_AddStringToObject(root, "formula", "x_std = (x - mean) / std, population std of the training rows");
    char *txt = cJSON_Print(root);
    cJSON_Delete(root);
    char p[2048];
    snprintf(p, sizeof p, "%s/standardization.json", L->ctx->run_dir);
    FILE *f = fopen(p, "w");
    pl_status st = PL_OK;
    if (!f || fputs(txt, f) < 0) st = pl_error_set(PL_ERR_IO, "%s: cannot write", p);
    if (f) fclose(f);
    free(txt);
    return st;
}

static pl_status open_series(loader *L, const pl_config_section *cfg) {
    const char *series = pl_cfg_str(cfg, "series", "series");
    char sname[NAME_LEN];
    join_path(sname, sizeof sname, "/", series);
    hid_t ds;
    pl_status st = open_dataset(L->path, L->file, sname, &ds);
    if (st) return st;
    if ((st = check_filters(L->path, sname, ds))) { H5Dclose(ds); return st; }
    int64_t dims[PL_MAX_DIMS];
    int nd = get_dims(ds, dims);
    if (nd != 2) {
        H5Dclose(ds);
        return pl_error_set(PL_ERR_SHAPE, "%s: series dataset '%s' has rank %d; expected [T, F]",
                            L->path, sname, nd);
    }
    int64_t T = dims[0], F = dims[1];
    float *raw = malloc(sizeof *raw * (size_t)(T * F > 0 ? T * F : 1));
    int64_t *date = NULL;
    double *mean = NULL, *sd = NULL;
    int *fcols = NULL, *tcols = NULL;
    char (*names)[64] = calloc((size_t)(F > 0 ? F : 1), 64);
    if (!raw || !names) { st = pl_error_set(PL_ERR_NOMEM, "%s: out of memory", L->path); goto out; }
    if (H5Dread(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, raw) < 0) {
        st = pl_error_set(PL_ERR_IO, "%s: reading '%s' failed", L->path, sname);
        goto out;
    }
    L->st.bytes_read += (uint64_t)(T * F) * 4;
    int nnames = read_column_names(L, sname, names, (int)F);
    fcols = malloc(sizeof *fcols * 1024);
    tcols = malloc(sizeof *tcols * 1024);
    int nfc = 0, ntc = 0;
    const char *fspec = pl_cfg_str(cfg, "feature_columns", "");
    if (!fspec[0]) {
        nfc = (int)(F < 1024 ? F : 1024);
        for (int i = 0; i < nfc; i++) fcols[i] = i;
    } else if ((st = parse_columns(L, "feature_columns", fspec, names, nnames, F, fcols, &nfc))) {
        goto out;
    }
    if ((st = parse_columns(L, "target_columns", pl_cfg_str(cfg, "target_columns", "0"), names, nnames, F,
                            tcols, &ntc)))
        goto out;

    int64_t W = pl_cfg_int(cfg, "window", 0), H = pl_cfg_int(cfg, "horizon", 1);
    int64_t nwin = T - W - H + 1;
    if (nwin <= 0) {
        st = pl_error_set(PL_ERR_CONFIG, "%s: series '%s' has %lld rows; window %lld + horizon %lld needs more",
                          L->path, sname, (long long)T, (long long)W, (long long)H);
        goto out;
    }
    /* split points as row indices: train rows [0, a), val [a, b), test [b, T) */
    int64_t a, b;
    const char *fr = pl_cfg_str(cfg, "split_fractions", "");
    const char *te = pl_cfg_str(cfg, "train_end", ""), *ve = pl_cfg_str(cfg, "val_end", "");
    if (te[0]) {
        int64_t d_te, d_ve = INT64_MAX;
        if ((st = parse_date("train_end", te, &d_te))) goto out;
        if (ve[0] && (st = parse_date("val_end", ve, &d_ve))) goto out;
        if (d_ve < d_te) {
            st = pl_error_set(PL_ERR_CONFIG, "hdf5_chunk: val_end %s is before train_end %s", ve, te);
            goto out;
        }
        char dname[NAME_LEN];
        join_path(dname, sizeof dname, "/", pl_cfg_str(cfg, "date_dataset", "date"));
        hid_t dd;
        if ((st = open_dataset(L->path, L->file, dname, &dd))) goto out;
        int64_t ddims[PL_MAX_DIMS];
        int dnd = get_dims(dd, ddims);
        date = malloc(sizeof *date * (size_t)(T ? T : 1));
        if (dnd != 1 || ddims[0] != T) {
            H5Dclose(dd);
            st = pl_error_set(PL_ERR_SHAPE, "%s: date dataset '%s' must be [%lld] like '%s'; found rank %d [%lld]",
                              L->path, dname, (long long)T, sname, dnd, (long long)ddims[0]);
            goto out;
        }
        herr_t e = H5Dread(dd, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, date);
        H5Dclose(dd);
        if (e < 0) { st = pl_error_set(PL_ERR_IO, "%s: reading '%s' failed", L->path, dname); goto out; }
        for (int64_t i = 1; i < T; i++)
            if (date[i] < date[i - 1]) {
                st = pl_error_set(PL_ERR_INVALID, "%s: '%s' is not sorted (row %lld)", L->path, dname, (long long)i);
                goto out;
            }
        a = 0;
        while (a < T && date[a] <= d_te) a++;
        b = a;
        while (b < T && date[b] <= d_ve) b++;
    } else if (fr[0]) {
        double f3[3];
        if ((st = parse_fractions(fr, f3))) goto out;
        a = (int64_t)floor(f3[0] * (double)T + 0.5);
        b = a + (int64_t)floor(f3[1] * (double)T + 0.5);
        if (b > T) b = T;
    } else {
        st = pl_error_set(PL_ERR_CONFIG, "hdf5_chunk: series mode (window = %lld) needs train_end "
                          "(and val_end) or split_fractions", (long long)W);
        goto out;
    }
    /* a window w belongs to the split of its last target row w + W + H - 1 */
    int64_t cut[4] = {0, a - W - H + 1, b - W - H + 1, nwin};
    for (int k = 1; k < 3; k++) {
        if (cut[k] < 0) cut[k] = 0;
        if (cut[k] > nwin) cut[k] = nwin;
    }
    if (cut[2] < cut[1]) cut[2] = cut[1];
    for (int si = 0; si < PL_SPLIT_COUNT; si++) {
        split_data *s = &L->sp[si];
        s->w0 = cut[si];
        s->w1 = cut[si + 1];
        s->nrows = s->w1 - s->w0;
        s->present = s->nrows > 0;
        snprintf(s->where, sizeof s->where, "windows %lld..%lld of %s", (long long)s->w0,
                 (long long)s->w1, sname);
    }
    if (L->sp[PL_SPLIT_TRAIN].nrows <= 0) {
        st = pl_error_set(PL_ERR_CONFIG, "%s: the train split of '%s' has no window (train rows: %lld, "
                          "window %lld + horizon %lld)", L->path, sname, (long long)a, (long long)W, (long long)H);
        goto out;
    }
    /* standardization over the training rows [0, a) */
    int nall = nfc + ntc;
    mean = calloc((size_t)nall, sizeof *mean);
    sd = calloc((size_t)nall, sizeof *sd);
    bool stdz = pl_cfg_bool(cfg, "standardize", false);
    int *allc = malloc(sizeof *allc * (size_t)nall);
    for (int i = 0; i < nfc; i++) allc[i] = fcols[i];
    for (int i = 0; i < ntc; i++) allc[nfc + i] = tcols[i];
    for (int i = 0; i < nall; i++) {
        mean[i] = 0;
        sd[i] = 1;
        if (!stdz) continue;
        double s1 = 0, s2 = 0;
        for (int64_t r = 0; r < a; r++) s1 += raw[r * F + allc[i]];
        double m = s1 / (double)a;
        for (int64_t r = 0; r < a; r++) {
            double d = raw[r * F + allc[i]] - m;
            s2 += d * d;
        }
        double v = sqrt(s2 / (double)a);
        mean[i] = m;
        sd[i] = v > 0 ? v : 1.0; /* constant column: leave scale alone */
    }
    L->feat = new_tensor(PL_F32, 2, (int64_t[]){T, nfc}, PL_CPU);
    L->targ = new_tensor(PL_F32, 2, (int64_t[]){T, ntc}, PL_CPU);
    if (!L->feat || !L->targ) { st = pl_error_status(); free(allc); goto out; }
    float *fx = pl_tensor_data(L->feat), *ty = pl_tensor_data(L->targ);
    for (int64_t r = 0; r < T; r++) {
        for (int i = 0; i < nfc; i++) fx[r * nfc + i] = (float)((raw[r * F + fcols[i]] - mean[i]) / sd[i]);
        for (int i = 0; i < ntc; i++)
            ty[r * ntc + i] = (float)((raw[r * F + tcols[i]] - mean[nfc + i]) / sd[nfc + i]);
    }
    if (!pl_device_eq(L->dev, PL_CPU)) {
        pl_tensor *df = new_tensor(PL_F32, 2, (int64_t[]){T, nfc}, L->dev);
        pl_tensor *dt = new_tensor(PL_F32, 2, (int64_t[]){T, ntc}, L->dev);
        if (!df || !dt || pl_tensor_copy_(df, L->feat) || pl_tensor_copy_(dt, L->targ)) {
            st = pl_error_status();
            pl_tensor_release(df);
            pl_tensor_release(dt);
            free(allc);
            goto out;
        }
        pl_tensor_release(L->feat);
        pl_tensor_release(L->targ);
        L->feat = df;
        L->targ = dt;
    }
    L->T = T;
    L->Ff = nfc;
    L->Ft = ntc;
    L->window = W;
    L->horizon = H;
    meta_int(L, "num_features", nfc);
    meta_int(L, "num_targets", ntc);
    meta_int(L, "window", W);
    meta_int(L, "horizon", H);
    meta_int(L, "num_rows", T);
    meta_int(L, "train_rows", a);
    for (int i = 0; i < ntc; i++) {
        char k[64];
        snprintf(k, sizeof k, "target_mean_%d", i);
        meta_float(L, k, mean[nfc + i]);
        snprintf(k, sizeof k, "target_std_%d", i);
        meta_float(L, k, sd[nfc + i]);
    }
    meta_float(L, "target_mean", mean[nfc]);
    meta_float(L, "target_std", sd[nfc]);
    meta_int(L, "standardized", stdz ? 1 : 0);
    if (stdz) st = write_standardization(L, names, nnames, allc, nall, mean, sd, a);
    free(allc);
out:
    H5Dclose(ds);
    free(raw);
    free(date);
    free(mean);
    free(sd);
    free(fcols);
    free(tcols);
    free(names);
    return st;
}

/* ---- create ------------------------------------------------------------ */

static pl_status h5c_create(const pl_config_section *cfg, pl_run_context *ctx, void **self) {
    loader *L = calloc(1, sizeof *L);
    if (!L) return pl_error_set(PL_ERR_NOMEM, "hdf5_chunk: out of memory");
    L->ctx = ctx;
    L->dev = ctx ? ctx->device : PL_CPU;
    pthread_mutex_init(&L->mu, NULL);
    pthread_cond_init(&L->cv, NULL);
    L->cur_split = -1;
    for (int i = 0; i < PL_SPLIT_COUNT; i++) L->buf[i].split = -1;
    pl_status st = PL_OK;
    snprintf(L->path, sizeof L->path, "%s", pl_cfg_str(cfg, "path", ""));
    if (!L->path[0]) {
        st = pl_error_set(PL_ERR_CONFIG, "hdf5_chunk: 'path' is empty");
        goto fail;
    }
    FILE *probe = fopen(L->path, "rb");
    if (!probe) {
        st = pl_error_set(PL_ERR_IO, "%s: cannot open (missing file?); run tools/prepare_data.sh", L->path);
        goto fail;
    }
    fclose(probe);
    pthread_mutex_lock(&g_h5_lock);
    htri_t is5;
    H5E_BEGIN_TRY { is5 = H5Fis_hdf5(L->path); }
    H5E_END_TRY;
    if (is5 <= 0) {
        pthread_mutex_unlock(&g_h5_lock);
        st = pl_error_set(PL_ERR_IO, "%s: not an HDF5 file", L->path);
        goto fail;
    }
    H5E_BEGIN_TRY { L->file = H5Fopen(L->path, H5F_ACC_RDONLY, H5P_DEFAULT); }
    H5E_END_TRY;
    if (L->file < 0) {
        pthread_mutex_unlock(&g_h5_lock);
        st = pl_error_set(PL_ERR_IO, "%s: HDF5 cannot open the file", L->path);
        goto fail;
    }
    publish_file_attrs(L);
    int64_t bs = pl_cfg_int(cfg, "batch_size", 32), ebs = pl_cfg_int(cfg, "eval_batch_size", 0);
    if (ebs <= 0) ebs = bs;
    bool shuffle = pl_cfg_bool(cfg, "shuffle", true), drop_last = pl_cfg_bool(cfg, "drop_last", false);
    for (int si = 0; si < PL_SPLIT_COUNT; si++) {
        L->sp[si].batch = si == PL_SPLIT_TRAIN ? bs : ebs;
        L->sp[si].shuffle = si == PL_SPLIT_TRAIN && shuffle;
        L->sp[si].drop_last = si == PL_SPLIT_TRAIN && drop_last;
    }

    if (pl_cfg_int(cfg, "window", 0) > 0) {
        L->series_mode = true;
        st = open_series(L, cfg);
        pthread_mutex_unlock(&g_h5_lock);
        if (st) goto fail;
        split_data *tr = &L->sp[PL_SPLIT_TRAIN];
        if (tr->drop_last && tr->nrows < tr->batch) {
            st = pl_error_set(PL_ERR_CONFIG, "%s: train split has %lld windows < batch_size %lld with drop_last: no batch",
                              L->path, (long long)tr->nrows, (long long)tr->batch);
            goto fail;
        }
        if (tr->shuffle) {
            L->wx_g = new_tensor(PL_F32, 3, (int64_t[]){tr->batch, L->window, L->Ff}, L->dev);
            L->wy_g = new_tensor(PL_F32, 3, (int64_t[]){tr->batch, L->horizon, L->Ft}, L->dev);
            L->perm = malloc(sizeof *L->perm * (size_t)tr->nrows);
            if (!L->wx_g || !L->wy_g || !L->perm) { st = pl_error_status(); goto fail; }
        }
        for (int si = 0; si < PL_SPLIT_COUNT; si++) {
            char k[64];
            snprintf(k, sizeof k, "num_%s", pl_split_name((pl_data_split)si));
            meta_int(L, k, L->sp[si].nrows);
        }
        *self = L;
        return PL_OK;
    }

    /* rows mode */
    const char *dspec = pl_cfg_str(cfg, "datasets", "");
    const char *fr = pl_cfg_str(cfg, "split_fractions", "");
    bool to_f32 = !strcmp(pl_cfg_str(cfg, "convert", "none"), "f32");
    const char *keys[3] = {"datasets", "val_datasets", "test_datasets"};
    if (fr[0]) {
        double f3[3];
        if ((st = parse_fractions(fr, f3)) || (st = parse_fields("datasets", dspec, &L->sp[0])) ||
            (st = open_split(L, 0, "/", to_f32))) {
            pthread_mutex_unlock(&g_h5_lock);
            goto fail;
        }
        int64_t N = L->sp[0].nrows;
        int64_t a = (int64_t)floor(f3[0] * (double)N + 0.5);
        int64_t b = a + (int64_t)floor(f3[1] * (double)N + 0.5);
        if (b > N) b = N;
        int64_t r0[3] = {0, a, b}, r1[3] = {a, b, f3[0] + f3[1] + f3[2] >= 1.0 - 1e-9 ? N : b + (int64_t)floor(f3[2] * (double)N + 0.5)};
        if (r1[2] > N) r1[2] = N;
        for (int si = 1; si < 3; si++) {
            L->sp[si].nf = L->sp[0].nf;
            memcpy(L->sp[si].f, L->sp[0].f, sizeof L->sp[0].f);
            for (int i = 0; i < L->sp[0].nf; i++) L->sp[si].ds[i] = H5Dopen2(L->file, L->sp[0].f[i].dset, H5P_DEFAULT);
        }
        for (int si = 0; si < 3; si++) {
            split_data *s = &L->sp[si];
            s->row0 = r0[si];
            s->nrows = r1[si] - r0[si];
            s->present = s->nrows > 0;
            snprintf(s->where, sizeof s->where, "rows %lld..%lld of /", (long long)r0[si], (long long)r1[si]);
            if (f3[si] > 0 && s->nrows == 0) {
                pthread_mutex_unlock(&g_h5_lock);
                st = pl_error_set(PL_ERR_CONFIG, "%s: split '%s' is empty (%lld rows x fraction %g)", L->path,
                                  pl_split_name((pl_data_split)si), (long long)N, f3[si]);
                goto fail;
            }
        }
    } else {
        const char *groups[3] = {pl_cfg_str(cfg, "train_group", "/train"), pl_cfg_str(cfg, "val_group", "/val"),
                                 pl_cfg_str(cfg, "test_group", "/test")};
        const char *hist = pl_cfg_str(cfg, "history", "");
        for (int si = 0; si < 3; si++) {
            const char *spec = pl_cfg_str(cfg, keys[si], "");
            if (!spec[0]) spec = dspec;
            if (!link_exists(L->file, groups[si])) {
                if (si == PL_SPLIT_TRAIN) {
                    st = pl_error_set(PL_ERR_IO, "%s: train group '%s' not found (set train_group, or "
                                      "split_fractions to split one set of datasets)", L->path, groups[si]);
                    break;
                }
                snprintf(L->sp[si].where, sizeof L->sp[si].where, "group %s (not in the file)", groups[si]);
                continue;
            }
            if ((st = parse_fields(keys[si], spec, &L->sp[si])) || (st = open_split(L, si, groups[si], to_f32)))
                break;
            if (L->sp[si].nrows == 0) {
                st = pl_error_set(PL_ERR_CONFIG, "%s: split '%s' (group %s) has 0 rows", L->path,
                                  pl_split_name((pl_data_split)si), groups[si]);
                break;
            }
            if (hist[0] && si != PL_SPLIT_TRAIN) {
                char g[NAME_LEN];
                join_path(g, sizeof g, groups[si], hist);
                if (link_exists(L->file, g) && (st = load_history(L, si, groups[si], hist))) break;
            }
        }
        if (st) {
            pthread_mutex_unlock(&g_h5_lock);
            goto fail;
        }
    }
    pthread_mutex_unlock(&g_h5_lock);

    /* per-sample bytes and the chunk budget */
    size_t total = 0, max_row = 0;
    int64_t max_rows = 0;
    for (int si = 0; si < 3; si++) {
        split_data *s = &L->sp[si];
        if (!s->present) continue;
        size_t rb = 0;
        for (int i = 0; i < s->nf; i++) rb += s->f[i].row_bytes;
        if (rb > max_row) max_row = rb;
        if (s->nrows > max_rows) max_rows = s->nrows;
        total += rb * (size_t)s->nrows;
    }
    split_data *tr = &L->sp[PL_SPLIT_TRAIN];
    if (tr->drop_last && tr->nrows < tr->batch) {
        st = pl_error_set(PL_ERR_CONFIG, "%s: train split (%s) has %lld rows < batch_size %lld with drop_last: no batch",
                          L->path, tr->where, (long long)tr->nrows, (long long)tr->batch);
        goto fail;
    }
    int64_t cs = pl_cfg_int(cfg, "chunk_samples", 0);
    double gb = pl_cfg_float(cfg, "chunk_size_gb", 0);
    size_t budget;
    if (gb > 0) {
        budget = (size_t)(gb * 1073741824.0);
    } else {
        size_t fb = 0, tb = 0;
        const pl_backend *be = pl_backend_get(L->dev.type);
        if (be && be->mem_info && be->mem_info(L->dev.index, &fb, &tb) == PL_OK && fb > 0)
            budget = (size_t)(0.75 * (double)fb);
        else
            budget = (size_t)1 << 30;
    }
    int64_t bmax = 0;
    for (int si = 0; si < 3; si++) if (L->sp[si].batch > bmax) bmax = L->sp[si].batch;
    if (cs <= 0 && total <= budget) {
        L->resident = true;
    } else {
        if (cs <= 0) cs = (int64_t)(budget / 2 / (max_row ? max_row : 1)); /* two buffers share it */
        if (cs > max_rows) cs = max_rows;
        if (cs >= max_rows) L->resident = true;
    }
    if (L->resident) {
        L->nbuf = 3;
        for (int si = 0; si < 3; si++) {
            if (!L->sp[si].present) continue;
            if ((st = alloc_buf(L, &L->buf[si], &L->sp[si], L->sp[si].nrows))) goto fail;
        }
        L->cap = max_rows;
    } else {
        /* chunk = multiple of every split's batch (the train batch drives it) */
        int64_t b = tr->batch;
        if (cs < b) cs = b;
        cs -= cs % b;
        L->cap = cs;
        L->nbuf = 2;
        /* one set of buffers shaped for the largest row layout: fields differ per split, so
         * allocate per split lazily? Keep it simple: buffers are per field of the train split;
         * val/test use their own pair if their fields differ. */
        for (int k = 0; k < 2; k++)
            if ((st = alloc_buf(L, &L->buf[k], tr, L->cap))) goto fail;
        L->prefetch = pl_cfg_bool(cfg, "prefetch", true);
    }
    /* gather buffers for the shuffled split (train) */
    if (tr->shuffle) {
        for (int i = 0; i < tr->nf; i++) {
            int64_t shape[PL_MAX_DIMS];
            memcpy(shape, tr->f[i].dims, sizeof shape);
            shape[0] = tr->batch;
            L->gather[i] = new_tensor(tr->f[i].dt, tr->f[i].ndim, shape, L->dev);
            if (!L->gather[i]) { st = pl_error_status(); goto fail; }
        }
        L->perm = malloc(sizeof *L->perm * (size_t)(L->resident ? tr->nrows : L->cap));
        if (!L->perm) { st = pl_error_set(PL_ERR_NOMEM, "hdf5_chunk: out of memory"); goto fail; }
    }
    L->order_cap = 1;
    for (int si = 0; si < 3; si++) {
        int64_t nc = L->resident ? 1 : (L->sp[si].nrows + L->cap - 1) / L->cap;
        if (nc > L->order_cap) L->order_cap = nc;
    }
    L->order = malloc(sizeof *L->order * (size_t)L->order_cap);
    if (!L->order) { st = pl_error_set(PL_ERR_NOMEM, "hdf5_chunk: out of memory"); goto fail; }
    if (L->prefetch) {
        if (pthread_create(&L->th, NULL, prefetch_main, L) != 0) {
            st = pl_error_set(PL_ERR_INTERNAL, "hdf5_chunk: cannot start the prefetch thread");
            goto fail;
        }
        L->th_started = true;
    }
    for (int si = 0; si < 3; si++) {
        char k[64];
        snprintf(k, sizeof k, "num_%s", pl_split_name((pl_data_split)si));
        meta_int(L, k, L->sp[si].nrows);
    }
    /* dims of the first field of the train split: seq_len for [N, L] inputs */
    if (tr->nf > 0 && tr->f[0].ndim >= 2) meta_int(L, "seq_len", tr->f[0].dims[1]);
    if (ctx && ctx->verbose)
        fprintf(stderr, "hdf5_chunk: %s: train %lld / val %lld / test %lld rows, %s, chunk %lld rows\n", L->path,
                (long long)tr->nrows, (long long)L->sp[1].nrows, (long long)L->sp[2].nrows,
                L->resident ? "resident" : "streaming", (long long)L->cap);
    *self = L;
    return PL_OK;
fail:
    h5c_destroy(L);
    return st;
}

/* ---- epochs ------------------------------------------------------------ */

static int64_t split_batches(const loader *L, int si) {
    const split_data *s = &L->sp[si];
    if (!s->present) return 0;
    return s->drop_last ? s->nrows / s->batch : (s->nrows + s->batch - 1) / s->batch;
}

static int64_t h5c_num_batches(void *self, pl_data_split split) {
    loader *L = self;
    if ((int)split < 0 || split >= PL_SPLIT_COUNT) return 0;
    return split_batches(L, split);
}

static int64_t chunk_count(const loader *L, int si) {
    if (L->resident || L->series_mode) return 1;
    return (L->sp[si].nrows + L->cap - 1) / L->cap;
}

/* Streaming: buffers whose fields belong to another split's layout must be re-shaped. */
static pl_status ensure_layout(loader *L, int si) {
    if (L->resident) return PL_OK;
    split_data *s = &L->sp[si];
    for (int k = 0; k < 2; k++) {
        chunk_buf *b = &L->buf[k];
        bool ok = true;
        for (int i = 0; i < s->nf && ok; i++)
            ok = b->t[i] && b->t[i]->dtype == s->f[i].dt && b->t[i]->ndim == s->f[i].ndim &&
                 !memcmp(b->t[i]->shape + 1, s->f[i].dims + 1, sizeof(int64_t) * (size_t)(s->f[i].ndim - 1));
        for (int i = s->nf; i < MAXF && ok; i++) ok = !b->t[i];
        if (ok) continue;
        free_buf(b);
        pl_status st = alloc_buf(L, b, s, L->cap);
        if (st) return st;
    }
    return PL_OK;
}

/* Make chunk order[pos] current (waiting on the prefetch if needed), then prefetch the next. */
static pl_status activate_chunk(loader *L, int64_t pos) {
    int si = L->cur_split;
    int64_t ch = L->order[pos];
    pl_status st;
    if (L->resident) {
        chunk_buf *b = &L->buf[si];
        if (b->split != si) {
            double t0 = now_s();
            if ((st = fill_chunk(L, b, si, 0))) return st;
            L->st.wait_seconds += now_s() - t0;
        }
        L->cur_buf = si;
    } else {
        if ((st = prefetch_wait(L))) return st;
        int hit = -1;
        for (int k = 0; k < 2; k++)
            if (L->buf[k].split == si && L->buf[k].chunk == ch) hit = k;
        if (hit < 0) {
            hit = L->cur_split == si && pos > 0 ? 1 - L->cur_buf : 0;
            double t0 = now_s();
            if ((st = fill_chunk(L, &L->buf[hit], si, ch))) return st;
            L->st.wait_seconds += now_s() - t0;
        }
        L->cur_buf = hit;
        if (pos + 1 < L->nchunks) {
            int other = 1 - hit;
            int64_t nx = L->order[pos + 1];
            if (!(L->buf[other].split == si && L->buf[other].chunk == nx)) {
                if (L->th_started) prefetch_request(L, other, si, nx);
            }
        }
    }
    L->chunk_pos = pos;
    L->row_pos = 0;
    split_data *s = &L->sp[si];
    int64_t rows = L->buf[L->cur_buf].rows;
    if (s->shuffle) {
        for (int64_t i = 0; i < rows; i++) L->perm[i] = i;
        uint64_t seed = (L->ctx ? L->ctx->seed : 0) + (uint64_t)L->epoch;
        uint64_t rs = seed * 0x100000001B3ull ^ (uint64_t)(pos + 1) * 0x9E3779B97F4A7C15ull;
        shuffle_i64(L->perm, rows, &rs);
    }
    return PL_OK;
}

/* Batches next() serves from the chunk at position `pos` of the epoch's order. */
static int64_t chunk_batches(const loader *L, int si, int64_t pos) {
    const split_data *s = &L->sp[si];
    int64_t rows = s->nrows;
    if (!L->resident) {
        rows = s->nrows - L->order[pos] * L->cap;
        if (rows > L->cap) rows = L->cap;
    }
    return s->drop_last ? rows / s->batch : (rows + s->batch - 1) / s->batch;
}

static pl_status h5c_epoch_begin(void *self, pl_data_split split, int64_t epoch) {
    loader *L = self;
    if ((int)split < 0 || split >= PL_SPLIT_COUNT)
        return pl_error_set(PL_ERR_INVALID, "hdf5_chunk: bad split %d", (int)split);
    split_data *s = &L->sp[split];
    release_views(L);
    if (!s->present || s->nrows == 0)
        return pl_error_set(PL_ERR_CONFIG, "%s: split '%s' is empty (%s)", L->path, pl_split_name(split), s->where);
    /* resume protocol: an armed position of this train epoch is where it starts */
    int64_t start = 0;
    if (split == PL_SPLIT_TRAIN) {
        if (L->armed && L->arm_epoch == epoch) start = L->arm_next;
        L->armed = false;
        int64_t total = split_batches(L, split);
        if (start > total)
            return pl_error_set(PL_ERR_INVALID, "%s: resume position batch %lld of epoch %lld is past the %lld "
                                "batches of the train split (%s); was the checkpoint written with another "
                                "batch_size, drop_last or file?", L->path, (long long)start, (long long)epoch,
                                (long long)total, s->where);
        L->tr_epoch = epoch;
        L->tr_next = start;
    }
    L->cur_split = split;
    L->epoch = epoch;
    L->batch_index = start;
    L->exhausted = false;
    if (L->series_mode) {
        L->row_pos = start * s->batch;
        if (s->shuffle) {
            for (int64_t i = 0; i < s->nrows; i++) L->perm[i] = i;
            uint64_t rs = (L->ctx ? L->ctx->seed : 0) + (uint64_t)epoch;
            shuffle_i64(L->perm, s->nrows, &rs);
        }
        return PL_OK;
    }
    pl_status st = prefetch_wait(L);
    if (st) return st;
    if ((st = ensure_layout(L, split))) return st;
    L->nchunks = chunk_count(L, split);
    for (int64_t i = 0; i < L->nchunks; i++) L->order[i] = i;
    if (s->shuffle) {
        uint64_t rs = ((L->ctx ? L->ctx->seed : 0) + (uint64_t)epoch) ^ 0xC0FFEEull;
        shuffle_i64(L->order, L->nchunks, &rs);
    }
    if (start == 0) return activate_chunk(L, 0);
    /* resume at batch `start`: read the chunk that holds it (and prefetch the one after);
     * the chunks before it in the epoch's order are not read. The within-chunk row order
     * depends on (seed, epoch, position) only, so it is the uninterrupted epoch's. */
    int64_t k = start;
    for (int64_t pos = 0; pos < L->nchunks; pos++) {
        int64_t nb = chunk_batches(L, split, pos);
        if (k < nb) {
            if ((st = activate_chunk(L, pos))) return st;
            L->row_pos = k * s->batch;
            return PL_OK;
        }
        k -= nb;
    }
    L->exhausted = true; /* every batch of the epoch was served before the checkpoint */
    L->chunk_pos = L->nchunks - 1;
    return PL_OK;
}

/* Copy rows perm[r0..r0+n) of `src` ([rows, ...]) into `dst` ([>=n, ...]). */
static pl_status gather_rows(loader *L, pl_tensor *dst, const pl_tensor *src, const int64_t *idx, int64_t n,
                             size_t row_bytes) {
    char *d = pl_tensor_data(dst);
    const char *s = pl_tensor_data(src);
    if (pl_device_eq(L->dev, PL_CPU)) {
#pragma omp parallel for if (n * (int64_t)row_bytes > (1 << 20)) schedule(static)
        for (int64_t i = 0; i < n; i++) memcpy(d + (size_t)i * row_bytes, s + (size_t)idx[i] * row_bytes, row_bytes);
        return PL_OK;
    }
    const pl_backend *be = pl_backend_get(L->dev.type);
    if (!be) return pl_error_status();
    for (int64_t i = 0; i < n; i++) {
        pl_status st = be->memcpy(d + (size_t)i * row_bytes, L->dev, s + (size_t)idx[i] * row_bytes, L->dev, row_bytes);
        if (st) return st;
    }
    return PL_OK;
}

static int emit(loader *L, pl_batch *out, const char *name, pl_tensor *v) {
    if (!v) return -1;
    L->out_views[L->n_out++] = v;
    out->names[out->n] = name;
    out->fields[out->n++] = v;
    return 0;
}

static int next_series(loader *L, pl_batch *out) {
    split_data *s = &L->sp[L->cur_split];
    int64_t left = s->nrows - L->row_pos;
    if (left <= 0 || (s->drop_last && left < s->batch)) return 0;
    int64_t n = left < s->batch ? left : s->batch;
    int64_t W = L->window, H = L->horizon, Ff = L->Ff, Ft = L->Ft;
    pl_tensor *x, *y;
    if (s->shuffle) {
        /* gather the windows: x[b] = feat[w : w+W], y[b] = targ[w+W : w+W+H] */
        size_t xb = (size_t)(W * Ff) * 4, yb = (size_t)(H * Ft) * 4;
        char *gx = pl_tensor_data(L->wx_g), *gy = pl_tensor_data(L->wy_g);
        const char *fx = pl_tensor_data(L->feat), *ty = pl_tensor_data(L->targ);
        const pl_backend *be = pl_device_eq(L->dev, PL_CPU) ? NULL : pl_backend_get(L->dev.type);
        for (int64_t i = 0; i < n; i++) {
            int64_t w = s->w0 + L->perm[L->row_pos + i];
            const char *sx = fx + (size_t)(w * Ff) * 4, *sy = ty + (size_t)((w + W) * Ft) * 4;
            if (!be) {
                memcpy(gx + i * (int64_t)xb, sx, xb);
                memcpy(gy + i * (int64_t)yb, sy, yb);
            } else if (be->memcpy(gx + i * (int64_t)xb, L->dev, sx, L->dev, xb) ||
                       be->memcpy(gy + i * (int64_t)yb, L->dev, sy, L->dev, yb)) {
                return -1;
            }
        }
        x = view_rows(L->wx_g, 0, n);
        y = view_rows(L->wy_g, 0, n);
    } else {
        int64_t w = s->w0 + L->row_pos;
        x = as_strided(L->feat, 3, (int64_t[]){n, W, Ff}, (int64_t[]){Ff, Ff, 1}, L->feat->offset + w * Ff);
        y = as_strided(L->targ, 3, (int64_t[]){n, H, Ft}, (int64_t[]){Ft, Ft, 1}, L->targ->offset + (w + W) * Ft);
    }
    if (emit(L, out, "x", x) || emit(L, out, "y", y)) return -1;
    out->size = n;
    out->index = L->batch_index++;
    L->row_pos += n;
    return 1;
}

static int next_rows(loader *L, pl_batch *out) {
    split_data *s = &L->sp[L->cur_split];
    for (;;) {
        chunk_buf *b = &L->buf[L->cur_buf];
        int64_t left = b->rows - L->row_pos;
        /* drop_last: only the globally last partial batch is dropped; every chunk but the
         * last in row order is a multiple of the batch size */
        if (left > 0 && !(s->drop_last && left < s->batch)) break;
        if (L->chunk_pos + 1 >= L->nchunks) return 0;
        if (activate_chunk(L, L->chunk_pos + 1)) return -1;
    }
    chunk_buf *b = &L->buf[L->cur_buf];
    int64_t left = b->rows - L->row_pos;
    int64_t n = left < s->batch ? left : s->batch;
    /* global row index of the batch's first row (for resident extra fields) */
    int64_t g0 = L->order[L->chunk_pos] * L->cap + L->row_pos;
    for (int i = 0; i < s->nf; i++) {
        pl_tensor *v;
        if (s->shuffle) {
            if (gather_rows(L, L->gather[i], b->t[i], L->perm + L->row_pos, n, s->f[i].row_bytes)) return -1;
            v = view_rows(L->gather[i], 0, n);
        } else {
            v = view_rows(b->t[i], L->row_pos, n);
        }
        if (emit(L, out, s->f[i].name, v)) return -1;
    }
    for (int i = 0; i < s->nx; i++) {
        /* extra fields exist for val/test only, which are never shuffled */
        if (emit(L, out, s->xname[i], view_rows(s->xt[i], g0, n))) return -1;
    }
    out->size = n;
    out->index = L->batch_index++;
    L->row_pos += n;
    return 1;
}

static int h5c_next(void *self, pl_batch *out) {
    loader *L = self;
    release_views(L);
    memset(out, 0, sizeof *out);
    if (L->cur_split < 0) {
        pl_error_set(PL_ERR_INVALID, "hdf5_chunk: next() before epoch_begin()");
        return -1;
    }
    int r = L->exhausted ? 0 : L->series_mode ? next_series(L, out) : next_rows(L, out);
    if (L->cur_split == PL_SPLIT_TRAIN && r >= 0) {
        L->armed = false; /* the cursor moved on: an armed position no longer applies */
        if (r == 1) {
            L->tr_next = L->batch_index;
        } else { /* epoch done: the next train batch is the first of the next epoch */
            L->tr_epoch = L->epoch + 1;
            L->tr_next = 0;
        }
    }
    return r;
}

/* Resume protocol (plugin.h): scalars hdf5_chunk.epoch / hdf5_chunk.next_batch are the
 * TRAIN position (an armed one if any), whatever split is being served. Loading
 * (v->loading) checks the values and arms them for the next epoch_begin(train, epoch);
 * saving only reports. */
static pl_status h5c_state(void *self, const pl_state_visitor *v) {
    loader *L = self;
    double e = (double)(L->armed ? L->arm_epoch : L->tr_epoch);
    double n = (double)(L->armed ? L->arm_next : L->tr_next);
    pl_status st = v->scalar(v->ctx, "hdf5_chunk.epoch", &e);
    if (!st) st = v->scalar(v->ctx, "hdf5_chunk.next_batch", &n);
    if (st || !v->loading) return st;
    if (!(e >= 0 && n >= 0 && e < 9e15 && n < 9e15 && e == floor(e) && n == floor(n)))
        return pl_error_set(PL_ERR_INVALID, "hdf5_chunk: state epoch = %g, next_batch = %g: expected "
                            "non-negative integers", e, n);
    int64_t total = split_batches(L, PL_SPLIT_TRAIN);
    if ((int64_t)n > total)
        return pl_error_set(PL_ERR_INVALID, "%s: state next_batch = %lld is past the %lld batches of the train "
                            "split (%s, batch_size %lld); was it saved with another batch_size, drop_last or "
                            "file?", L->path, (long long)n, (long long)total, L->sp[PL_SPLIT_TRAIN].where,
                            (long long)L->sp[PL_SPLIT_TRAIN].batch);
    L->armed = true;
    L->arm_epoch = (int64_t)e;
    L->arm_next = (int64_t)n;
    return PL_OK;
}

static pl_loader_stats h5c_stats(void *self) {
    loader *L = self;
    return L->st;
}

static const pl_loader_vtable vt = {
    .create = h5c_create,
    .destroy = h5c_destroy,
    .epoch_begin = h5c_epoch_begin,
    .next = h5c_next,
    .num_batches = h5c_num_batches,
    .stats = h5c_stats,
    .state = h5c_state,
};

PL_PLUGIN_DEFINE(hdf5_chunk, PL_KIND_LOADER, "0.1.0",
                 "HDF5 rows/series loader: mega-batch chunks on the device, batches are views, prefetch",
                 opts, &vt)
