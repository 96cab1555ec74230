/* test_hdf5_chunk.c - the mega-batch loader on synthetic files written here
 * with the HDF5 C API (values are functions of the row index, so every batch
 * is checked against hand-computed numbers), plus bad-input errors and, when
 * ../shared/data and python3+h5py are present, MovieLens and Chicago files
 * converted by tools/. */
#include <hdf5.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "loader_test_util.h"
#include "pl_test.h"

static const char *tmp_path(const char *name, char *buf, size_t n) {
    return pl_test_tmp_path("hdf5_chunk", name, buf, n);
}

#define NTR 100
#define NV 10

/* /train/x f32 [100, 3] = row*10 + col, /train/y i64 [100] = row,
 * /val/x [10, 3] = 1000 + row*10 + col, /val/y = 1000 + row,
 * /val/hist CSR: row r has r % 4 items: 7, 8, 9 (first r%4 of them),
 * /test the same as val plus 2000. Root attribute num_items = 42. */
static const char *make_rows_file(char *buf, size_t n) {
    const char *p = tmp_path("rows.h5", buf, n);
    if (access(p, F_OK) == 0) return p;
    float x[NTR * 3];
    long long y[NTR];
    for (int i = 0; i < NTR; i++) {
        y[i] = i;
        for (int j = 0; j < 3; j++) x[i * 3 + j] = (float)(i * 10 + j);
    }
    ck_assert_int_eq(lt_write(p, "/train/x", H5T_NATIVE_FLOAT, 2, (long long[]){NTR, 3}, x), 0);
    ck_assert_int_eq(lt_write(p, "/train/y", H5T_NATIVE_LLONG, 1, (long long[]){NTR}, y), 0);
    for (int s = 1; s <= 2; s++) {
        float vx[NV * 3];
        long long vy[NV], off[NV + 1];
        int items[NV * 3], k = 0;
        off[0] = 0;
        for (int i = 0; i < NV; i++) {
            vy[i] = s * 1000 + i;
            for (int j = 0; j < 3; j++) vx[i * 3 + j] = (float)(s * 1000 + i * 10 + j);
            for (int h = 0; h < i % 4; h++) items[k++] = 7 + h;
            off[i + 1] = k;
        }
        const char *g = s == 1 ? "/val" : "/test";
        char nm[64];
        snprintf(nm, sizeof nm, "%s/x", g);
        ck_assert_int_eq(lt_write(p, nm, H5T_NATIVE_FLOAT, 2, (long long[]){NV, 3}, vx), 0);
        snprintf(nm, sizeof nm, "%s/y", g);
        ck_assert_int_eq(lt_write(p, nm, H5T_NATIVE_LLONG, 1, (long long[]){NV}, vy), 0);
        snprintf(nm, sizeof nm, "%s/hist/offsets", g);
        ck_assert_int_eq(lt_write(p, nm, H5T_NATIVE_LLONG, 1, (long long[]){NV + 1}, off), 0);
        snprintf(nm, sizeof nm, "%s/hist/items", g);
        ck_assert_int_eq(lt_write(p, nm, H5T_NATIVE_INT, 1, (long long[]){k}, items), 0);
    }
    hid_t f = H5Fopen(p, H5F_ACC_RDWR, H5P_DEFAULT);
    hid_t sp = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(f, "num_items", H5T_STD_I64LE, sp, H5P_DEFAULT, H5P_DEFAULT);
    long long v = 42;
    H5Awrite(a, H5T_NATIVE_LLONG, &v);
    H5Aclose(a);
    H5Sclose(sp);
    H5Fclose(f);
    return p;
}

static pl_status open_rows(lt_loader *L, const char *extra) {
    char p[512], body[2048];
    snprintf(body, sizeof body, "path = %s\ndatasets = x,label=y\nhistory = hist\n%s", make_rows_file(p, sizeof p),
             extra);
    return lt_open(L, "hdf5_chunk", body, NULL);
}

/* Batches are views of the chunk buffer; a whole epoch allocates nothing. */
START_TEST(test_views_and_no_alloc) {
    lt_loader L;
    PL_CK_OK(open_rows(&L, "batch_size = 10\nchunk_samples = 20\nshuffle = false\nprefetch = true\n"));
    ck_assert_int_eq(L.vt->num_batches(L.self, PL_SPLIT_TRAIN), 10);
    PL_CK_OK(L.vt->epoch_begin(L.self, PL_SPLIT_TRAIN, 0, 0));
    pl_batch b;
    ck_assert_int_eq(L.vt->next(L.self, &b), 1);
    pl_alloc_stats s0 = pl_alloc_get_stats(PL_CPU);
    pl_tensor *x = pl_batch_get(&b, "x");
    ck_assert_ptr_nonnull(x);
    ck_assert_ptr_nonnull(pl_batch_get(&b, "label"));
    pl_storage *chunk0 = x->storage;
    const char *d0 = pl_tensor_data(x);
    ck_assert_int_eq(x->shape[0], 10);
    ck_assert_int_eq(x->shape[1], 3);
    ck_assert(pl_tensor_is_contiguous(x));
    int64_t rows = 10, nb = 1;
    int r;
    while ((r = L.vt->next(L.self, &b)) == 1) {
        x = pl_batch_get(&b, "x");
        pl_tensor *y = pl_batch_get(&b, "label");
        ck_assert_int_eq(y->dtype, PL_I64);
        ck_assert_int_eq(b.index, nb);
        if (nb == 1) {
            /* second batch of the same chunk: same storage, 10 rows further */
            ck_assert_ptr_eq(x->storage, chunk0);
            ck_assert_ptr_eq((const char *)pl_tensor_data(x), d0 + 10 * 3 * sizeof(float));
        }
        for (int64_t i = 0; i < b.size; i++) {
            ck_assert_int_eq(pl_tensor_i64(y)[i], rows + i);
            ck_assert_float_eq(pl_tensor_f32(x)[i * 3 + 2], (float)((rows + i) * 10 + 2));
        }
        rows += b.size;
        nb++;
    }
    ck_assert_int_eq(r, 0);
    ck_assert_int_eq(rows, NTR);
    pl_alloc_stats s1 = pl_alloc_get_stats(PL_CPU);
    ck_assert_uint_eq(s1.system_allocs, s0.system_allocs);
    ck_assert_uint_eq(s1.allocations, s0.allocations);
    pl_loader_stats ls = L.vt->stats(L.self);
    ck_assert_uint_eq(ls.chunks_loaded, 5);
    ck_assert_uint_eq(ls.bytes_read, NTR * (3 * 4 + 8));
    lt_close(&L);
}
END_TEST

/* Shuffle: every row once per epoch, different order per epoch, same order for the same seed. */
START_TEST(test_shuffle) {
    lt_loader L, L2;
    PL_CK_OK(open_rows(&L, "batch_size = 8\nchunk_samples = 32\nshuffle = true\n"));
    PL_CK_OK(open_rows(&L2, "batch_size = 8\nchunk_samples = 32\nshuffle = true\nprefetch = false\n"));
    int64_t order[2][NTR];
    for (int e = 0; e < 2; e++) {
        int seen[NTR] = {0};
        PL_CK_OK(L.vt->epoch_begin(L.self, PL_SPLIT_TRAIN, e, 0));
        PL_CK_OK(L2.vt->epoch_begin(L2.self, PL_SPLIT_TRAIN, e, 0));
        pl_batch b, b2;
        int64_t k = 0;
        pl_alloc_stats s0 = pl_alloc_get_stats(PL_CPU);
        while (L.vt->next(L.self, &b) == 1) {
            ck_assert_int_eq(L2.vt->next(L2.self, &b2), 1);
            pl_tensor *y = pl_batch_get(&b, "label"), *x = pl_batch_get(&b, "x");
            for (int64_t i = 0; i < b.size; i++) {
                int64_t v = pl_tensor_i64(y)[i];
                ck_assert(v >= 0 && v < NTR);
                ck_assert_int_eq(pl_tensor_i64(pl_batch_get(&b2, "label"))[i], v);
                ck_assert_float_eq(pl_tensor_f32(x)[i * 3 + 1], (float)(v * 10 + 1));
                seen[v]++;
                order[e][k++] = v;
            }
        }
        pl_alloc_stats s1 = pl_alloc_get_stats(PL_CPU);
        ck_assert_uint_eq(s1.allocations, s0.allocations);
        ck_assert_int_eq(k, NTR);
        for (int i = 0; i < NTR; i++) ck_assert_int_eq(seen[i], 1);
    }
    int same = 0;
    for (int i = 0; i < NTR; i++) same += order[0][i] == order[1][i];
    ck_assert_int_lt(same, NTR / 2);
    int inorder = 0;
    for (int i = 0; i < NTR; i++) inorder += order[0][i] == i;
    ck_assert_int_lt(inorder, NTR / 2);
    lt_close(&L);
    lt_close(&L2);
}
END_TEST

START_TEST(test_drop_last_and_resident) {
    lt_loader L;
    PL_CK_OK(open_rows(&L, "batch_size = 30\ndrop_last = true\nshuffle = false\n"));
    ck_assert_int_eq(L.vt->num_batches(L.self, PL_SPLIT_TRAIN), 3);
    ck_assert_int_eq(L.vt->num_batches(L.self, PL_SPLIT_VAL), 1); /* eval: never dropped */
    for (int e = 0; e < 3; e++) {
        PL_CK_OK(L.vt->epoch_begin(L.self, PL_SPLIT_TRAIN, e, 0));
        pl_batch b;
        int n = 0;
        while (L.vt->next(L.self, &b) == 1) {
            ck_assert_int_eq(b.size, 30);
            n++;
        }
        ck_assert_int_eq(n, 3);
    }
    /* resident (everything fits): the train split was read once for 3 epochs */
    ck_assert_uint_eq(L.vt->stats(L.self).chunks_loaded, 1);
    int64_t v;
    PL_CK_OK(pl_meta_get_int(L.ctx->meta, "num_items", &v));
    ck_assert_int_eq(v, 42);
    PL_CK_OK(pl_meta_get_int(L.ctx->meta, "num_train", &v));
    ck_assert_int_eq(v, NTR);
    lt_close(&L);
    PL_CK_OK(open_rows(&L, "batch_size = 30\ndrop_last = false\nshuffle = false\n"));
    ck_assert_int_eq(L.vt->num_batches(L.self, PL_SPLIT_TRAIN), 4);
    lt_close(&L);
}
END_TEST

/* val split: the CSR history becomes a padded [B, Hmax] i32 field. */
START_TEST(test_history_field) {
    lt_loader L;
    PL_CK_OK(open_rows(&L, "batch_size = 4\neval_batch_size = 4\n"));
    PL_CK_OK(L.vt->epoch_begin(L.self, PL_SPLIT_VAL, 0, 0));
    pl_batch b;
    int64_t row = 0;
    while (L.vt->next(L.self, &b) == 1) {
        pl_tensor *h = pl_batch_get(&b, "hist"), *y = pl_batch_get(&b, "label");
        ck_assert_ptr_nonnull(h);
        ck_assert_int_eq(h->dtype, PL_I32);
        ck_assert_int_eq(h->shape[1], 3);
        for (int64_t i = 0; i < b.size; i++, row++) {
            ck_assert_int_eq(pl_tensor_i64(y)[i], 1000 + row);
            for (int k = 0; k < 3; k++)
                ck_assert_int_eq(pl_tensor_i32(h)[i * 3 + k], k < row % 4 ? 7 + k : 0);
        }
    }
    ck_assert_int_eq(row, NV);
    lt_close(&L);
}
END_TEST

START_TEST(test_fractions) {
    char p[512], body[1024];
    snprintf(body, sizeof body, "path = %s\ndatasets = x=/train/x,y=/train/y\nsplit_fractions = 0.8,0.1,0.1\n"
             "batch_size = 16\nshuffle = false\n", make_rows_file(p, sizeof p));
    lt_loader L;
    PL_CK_OK(lt_open(&L, "hdf5_chunk", body, NULL));
    int64_t first[3] = {0, 80, 90}, count[3] = {80, 10, 10};
    for (int s = 0; s < 3; s++) {
        PL_CK_OK(L.vt->epoch_begin(L.self, (pl_data_split)s, 0, 0));
        pl_batch b;
        int64_t n = 0;
        while (L.vt->next(L.self, &b) == 1) {
            for (int64_t i = 0; i < b.size; i++) ck_assert_int_eq(pl_tensor_i64(pl_batch_get(&b, "y"))[i], first[s] + n + i);
            n += b.size;
        }
        ck_assert_int_eq(n, count[s]);
    }
    lt_close(&L);
}
END_TEST

/* Series: T = 30 days from 1970-01-01, F = 3 columns c0 = t, c1 = t^2/10, c2 = 5 - t. */
static void write_series_columns(const char *p);
static const char *make_series_file(char *buf, size_t n) {
    const char *p = tmp_path("series.h5", buf, n);
    if (access(p, F_OK) == 0) return p;
    float s[30 * 3];
    long long d[30];
    for (int t = 0; t < 30; t++) {
        s[t * 3] = (float)t;
        s[t * 3 + 1] = (float)(t * t) / 10.0f;
        s[t * 3 + 2] = 5.0f - (float)t;
        d[t] = t;
    }
    ck_assert_int_eq(lt_write(p, "/series", H5T_NATIVE_FLOAT, 2, (long long[]){30, 3}, s), 0);
    ck_assert_int_eq(lt_write(p, "/date", H5T_NATIVE_LLONG, 1, (long long[]){30}, d), 0);
    write_series_columns(p);
    return p;
}

/* /columns = level, sq, down (variable-length strings) */
static void write_series_columns(const char *p) {
    hid_t f = H5Fopen(p, H5F_ACC_RDWR, H5P_DEFAULT);
    hid_t st = H5Tcopy(H5T_C_S1);
    H5Tset_size(st, H5T_VARIABLE);
    const char *names[3] = {"level", "sq", "down"};
    hid_t sp = H5Screate_simple(1, (hsize_t[]){3}, NULL);
    hid_t ds = H5Dcreate2(f, "/columns", st, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    H5Dwrite(ds, st, H5S_ALL, H5S_ALL, H5P_DEFAULT, names);
    H5Dclose(ds);
    H5Sclose(sp);
    H5Tclose(st);
    H5Fclose(f);
}

START_TEST(test_series_windows) {
    char p[512], body[1024], rd[512];
    /* train targets end 1970-01-20 (day 19), val 1970-01-25 (day 24) */
    snprintf(body, sizeof body, "path = %s\nwindow = 4\nhorizon = 2\ntarget_columns = level\n"
             "feature_columns = level,down\nstandardize = true\ntrain_end = 1970-01-20\n"
             "val_end = 1970-01-25\nbatch_size = 4\nshuffle = false\n", make_series_file(p, sizeof p));
    tmp_path("run", rd, sizeof rd);
    mkdir(rd, 0755);
    lt_loader L;
    PL_CK_OK(lt_open(&L, "hdf5_chunk", body, rd));
    /* windows: 30 - 4 - 2 + 1 = 25; train: last target row w+5 <= 19 -> w 0..14 */
    ck_assert_int_eq(L.vt->num_batches(L.self, PL_SPLIT_TRAIN), 4); /* 15 windows */
    ck_assert_int_eq(L.vt->num_batches(L.self, PL_SPLIT_VAL), 2);   /* w 15..19 */
    ck_assert_int_eq(L.vt->num_batches(L.self, PL_SPLIT_TEST), 2);  /* w 20..24 */
    /* training stats of 'level' over rows 0..19: mean 9.5, population std sqrt(33.25) */
    double m, s, sd_level = sqrt(33.25);
    PL_CK_OK(pl_meta_get_float(L.ctx->meta, "target_mean", &m));
    PL_CK_OK(pl_meta_get_float(L.ctx->meta, "target_std", &s));
    ck_assert_double_eq_tol(m, 9.5, 1e-9);
    ck_assert_double_eq_tol(s, sd_level, 1e-9);
    int64_t nf;
    PL_CK_OK(pl_meta_get_int(L.ctx->meta, "num_features", &nf));
    ck_assert_int_eq(nf, 2);
    /* the data line: windows per split and the dates of their last targets (row r is day r) */
    const char *sum = pl_meta_get_str(L.ctx->meta, "data_summary");
    ck_assert_ptr_nonnull(sum);
    ck_assert_msg(strstr(sum, "train 15 windows (windows 0..15 of /series, last targets "
                              "1970-01-06..1970-01-20), val 5 windows (windows 15..20 of /series, "
                              "last targets 1970-01-21..1970-01-25), test 5 windows (windows "
                              "20..25 of /series, last targets 1970-01-26..1970-01-30)"),
                  "%s", sum);
    const int64_t w0[3] = {0, 15, 20};
    for (int sp = 0; sp < 3; sp++) {
        PL_CK_OK(L.vt->epoch_begin(L.self, (pl_data_split)sp, 0, 0));
        pl_batch b;
        int64_t w = w0[sp];
        pl_storage *st0 = NULL;
        while (L.vt->next(L.self, &b) == 1) {
            pl_tensor *x = pl_batch_get(&b, "x"), *y = pl_batch_get(&b, "y");
            ck_assert_int_eq(x->ndim, 3);
            ck_assert_int_eq(x->shape[1], 4);
            ck_assert_int_eq(x->shape[2], 2);
            ck_assert_int_eq(y->shape[1], 2);
            ck_assert_int_eq(y->shape[2], 1);
            /* overlapping windows: a strided view, window stride = one row */
            ck_assert_int_eq(x->stride[0], 2);
            ck_assert_int_eq(x->stride[1], 2);
            if (!st0) st0 = x->storage;
            ck_assert_ptr_eq(x->storage, st0);
            for (int64_t i = 0; i < b.size; i++, w++) {
                for (int k = 0; k < 4; k++) {
                    int64_t t = w + k;
                    double lv = (t - 9.5) / sd_level, dn = ((5.0 - t) - (5.0 - 9.5)) / sd_level;
                    ck_assert_double_eq_tol(pl_tensor_get(x, (i * 4 + k) * 2), lv, 1e-5);
                    ck_assert_double_eq_tol(pl_tensor_get(x, (i * 4 + k) * 2 + 1), dn, 1e-5);
                }
                for (int k = 0; k < 2; k++)
                    ck_assert_double_eq_tol(pl_tensor_get(y, i * 2 + k), (w + 4 + k - 9.5) / sd_level, 1e-5);
            }
        }
        ck_assert_int_eq(w, w0[sp] + (sp == 0 ? 15 : 5));
    }
    lt_close(&L);
    char js[600];
    snprintf(js, sizeof js, "%s/standardization.json", rd);
    FILE *f = fopen(js, "r");
    ck_assert_msg(f != NULL, "standardization.json not written");
    char txt[4096];
    size_t n = fread(txt, 1, sizeof txt - 1, f);
    txt[n] = 0;
    fclose(f);
    ck_assert_ptr_nonnull(strstr(txt, "\"level\""));
    ck_assert_ptr_nonnull(strstr(txt, "9.5"));
}
END_TEST

START_TEST(test_series_shuffle) {
    char p[512], body[1024];
    snprintf(body, sizeof body, "path = %s\nwindow = 3\nhorizon = 1\ntarget_columns = 0\n"
             "split_fractions = 0.6,0.2,0.2\nbatch_size = 5\nshuffle = true\n", make_series_file(p, sizeof p));
    lt_loader L;
    PL_CK_OK(lt_open(&L, "hdf5_chunk", body, NULL));
    /* train rows [0, 18): windows whose target row w+3 < 18 -> w 0..14 */
    PL_CK_OK(L.vt->epoch_begin(L.self, PL_SPLIT_TRAIN, 1, 0));
    pl_batch b;
    int seen[15] = {0}, total = 0;
    while (L.vt->next(L.self, &b) == 1) {
        pl_tensor *x = pl_batch_get(&b, "x"), *y = pl_batch_get(&b, "y");
        for (int64_t i = 0; i < b.size; i++) {
            int w = (int)pl_tensor_get(x, i * 3 * 3); /* level of the first row = w */
            ck_assert(w >= 0 && w < 15);
            seen[w]++;
            total++;
            ck_assert_double_eq_tol(pl_tensor_get(y, i), w + 3, 1e-6);
            ck_assert_double_eq_tol(pl_tensor_get(x, i * 9 + 3 * 2 + 2), 5.0 - (w + 2), 1e-6);
        }
    }
    ck_assert_int_eq(total, 15);
    for (int i = 0; i < 15; i++) ck_assert_int_eq(seen[i], 1);
    lt_close(&L);
}
END_TEST

/* ---- start_batch: epoch_begin(split, epoch, k) --------------------------- */

static void make_body(char *body, size_t n, const char *extra, bool series) {
    char p[512];
    if (series)
        snprintf(body, n, "path = %s\nwindow = 3\nhorizon = 1\ntarget_columns = 0\n"
                 "split_fractions = 0.6,0.2,0.2\n%s", make_series_file(p, sizeof p), extra);
    else
        snprintf(body, n, "path = %s\ndatasets = x,label=y\nhistory = hist\n%s",
                 make_rows_file(p, sizeof p), extra);
}

/* Value identifying row 0 of batch j (rows: the label = the row number; series:
 * the first window's first level = w), to find the chunk of each batch. */
static int64_t first_row(const lt_epoch *e, int j, bool series) {
    const lt_batch_copy *c = &e->b[j];
    for (int i = 0; i < c->n; i++) {
        if (!series && !strcmp(c->name[i], "label")) return ((const int64_t *)c->data[i])[0];
        if (series && !strcmp(c->name[i], "x")) return (int64_t)((const float *)c->data[i])[0];
    }
    ck_abort_msg("batch %d has no identifying field", j);
    return -1;
}

/* For every k, a fresh loader's epoch_begin(train, E, k) serves exactly batches
 * k.. of the whole epoch E (bit-identical fields, indices from k), reading only the
 * chunk holding batch k and those after it; so does a loader that served val in
 * between (the trainer's mid-epoch validation), and the next epoch is whole. The
 * same for val (fixed order). Out of range: PL_ERR_INVALID with the numbers. */
static void check_start(const char *body_extra, bool series, int chunk_rows) {
    char body[2048], msg[512];
    make_body(body, sizeof body, body_extra, series);
    const int E = 1;
    lt_loader R;
    PL_CK_OK(lt_open(&R, "hdf5_chunk", body, NULL));
    lt_epoch ref, ref2, refv;
    PL_CK_OK(R.vt->epoch_begin(R.self, PL_SPLIT_TRAIN, E, 0));
    ck_assert_int_eq(lt_read_epoch(&R, &ref), 0);
    PL_CK_OK(R.vt->epoch_begin(R.self, PL_SPLIT_TRAIN, E + 1, 0));
    ck_assert_int_eq(lt_read_epoch(&R, &ref2), 0);
    PL_CK_OK(R.vt->epoch_begin(R.self, PL_SPLIT_VAL, 0, 0));
    ck_assert_int_eq(lt_read_epoch(&R, &refv), 0);
    ck_assert_int_eq(ref.nb, R.vt->num_batches(R.self, PL_SPLIT_TRAIN));
    ck_assert_int_eq(refv.nb, R.vt->num_batches(R.self, PL_SPLIT_VAL));
    lt_close(&R);
    /* the position in the epoch's chunk order of the chunk holding each batch */
    int chunk_pos[64], nchunks = 0;
    ck_assert_int_le(ref.nb, 64);
    for (int j = 0; j < ref.nb; j++) {
        if (chunk_rows <= 0) {
            chunk_pos[j] = 0;
            nchunks = 1;
            continue;
        }
        int64_t ch = first_row(&ref, j, series) / chunk_rows;
        bool same = j > 0 && first_row(&ref, j - 1, series) / chunk_rows == ch;
        chunk_pos[j] = same ? chunk_pos[j - 1] : nchunks++;
    }
    for (int k = 0; k <= ref.nb; k++) {
        lt_loader B;
        lt_epoch rest;
        PL_CK_OK(lt_open(&B, "hdf5_chunk", body, NULL));
        uint64_t c0 = B.vt->stats(B.self).chunks_loaded;
        PL_CK_OK(B.vt->epoch_begin(B.self, PL_SPLIT_TRAIN, E, k));
        ck_assert_int_eq(lt_read_epoch(&B, &rest), 0);
        const char *d = lt_epoch_tail_diff(&ref, k, &rest, msg, sizeof msg);
        ck_assert_msg(d == NULL, "%s: %s", body_extra, d);
        lt_epoch_free(&rest);
        if (chunk_rows > 0) {
            /* chunks read: the one holding batch k and those after it */
            uint64_t read = B.vt->stats(B.self).chunks_loaded - c0;
            int total_chunks = (NTR + chunk_rows - 1) / chunk_rows; /* incl. one serving no batch */
            uint64_t want = k < ref.nb ? (uint64_t)(total_chunks - chunk_pos[k]) : 0;
            ck_assert_msg(read == want, "%s: start %d: %llu chunks read, expected %llu", body_extra, k,
                          (unsigned long long)read, (unsigned long long)want);
        }
        /* train batches, then val batches, then the rest of the train epoch from k */
        pl_batch b;
        PL_CK_OK(B.vt->epoch_begin(B.self, PL_SPLIT_TRAIN, E, 0));
        for (int j = 0; j < k; j++) ck_assert_int_eq(B.vt->next(B.self, &b), 1);
        PL_CK_OK(B.vt->epoch_begin(B.self, PL_SPLIT_VAL, 0, 0));
        ck_assert_int_eq(B.vt->next(B.self, &b), 1);
        PL_CK_OK(B.vt->epoch_begin(B.self, PL_SPLIT_TRAIN, E, k));
        ck_assert_int_eq(lt_read_epoch(&B, &rest), 0);
        d = lt_epoch_tail_diff(&ref, k, &rest, msg, sizeof msg);
        ck_assert_msg(d == NULL, "%s, after val: %s", body_extra, d);
        lt_epoch_free(&rest);
        PL_CK_OK(B.vt->epoch_begin(B.self, PL_SPLIT_TRAIN, E + 1, 0));
        ck_assert_int_eq(lt_read_epoch(&B, &rest), 0);
        d = lt_epoch_tail_diff(&ref2, 0, &rest, msg, sizeof msg);
        ck_assert_msg(d == NULL, "%s, next epoch: %s", body_extra, d);
        lt_epoch_free(&rest);
        if (k <= refv.nb) {
            PL_CK_OK(B.vt->epoch_begin(B.self, PL_SPLIT_VAL, 7, k));
            ck_assert_int_eq(lt_read_epoch(&B, &rest), 0);
            d = lt_epoch_tail_diff(&refv, k, &rest, msg, sizeof msg);
            ck_assert_msg(d == NULL, "%s, val: %s", body_extra, d);
            lt_epoch_free(&rest);
        }
        lt_close(&B);
    }
    /* out of range: refused naming the plugin, split, value and the batch count */
    lt_loader C;
    PL_CK_OK(lt_open(&C, "hdf5_chunk", body, NULL));
    char want[128];
    ck_assert_int_eq(C.vt->epoch_begin(C.self, PL_SPLIT_TRAIN, E, ref.nb + 1), PL_ERR_INVALID);
    const char *m = pl_error_message();
    snprintf(want, sizeof want, "start_batch %d", ref.nb + 1);
    ck_assert_msg(strstr(m, "hdf5_chunk") && strstr(m, "train") && strstr(m, want), "%s", m);
    snprintf(want, sizeof want, "has %d batches", ref.nb);
    ck_assert_msg(strstr(m, want), "%s", m);
    ck_assert_int_eq(C.vt->epoch_begin(C.self, PL_SPLIT_VAL, 0, -1), PL_ERR_INVALID);
    ck_assert_msg(strstr(pl_error_message(), "start_batch -1") && strstr(pl_error_message(), "val"),
                  "%s", pl_error_message());
    /* a refused start leaves the loader usable */
    PL_CK_OK(C.vt->epoch_begin(C.self, PL_SPLIT_TRAIN, E, 0));
    lt_epoch rest;
    ck_assert_int_eq(lt_read_epoch(&C, &rest), 0);
    ck_assert_ptr_null(lt_epoch_tail_diff(&ref, 0, &rest, msg, sizeof msg));
    lt_epoch_free(&rest);
    lt_close(&C);
    lt_epoch_free(&ref);
    lt_epoch_free(&ref2);
    lt_epoch_free(&refv);
}

START_TEST(start_batch_streaming_shuffled_across_chunks) {
    /* 100 rows in chunks of 16 (2 batches each; the 4-row chunk 6 is one short batch
     * somewhere in the shuffled order), with and without the prefetch thread */
    check_start("batch_size = 8\nchunk_samples = 16\nshuffle = true\nprefetch = true\n", false, 16);
    check_start("batch_size = 8\nchunk_samples = 16\nshuffle = true\nprefetch = false\n", false, 16);
    /* in order, drop_last: 12 batches, chunk 6 (4 rows) serves none */
    check_start("batch_size = 8\nchunk_samples = 24\nshuffle = false\ndrop_last = true\n", false, 24);
}
END_TEST

START_TEST(start_batch_resident_and_series) {
    check_start("batch_size = 16\nshuffle = true\n", false, 0);
    check_start("batch_size = 4\nshuffle = true\n", true, 0);
    check_start("batch_size = 4\nshuffle = false\ndrop_last = true\n", true, 0);
}
END_TEST

/* ---- batch_fields ------------------------------------------------------------ */

/* batch_fields(cfg) of the loader in L, then every batch of every split checked
 * against it; each declared field is carried by some batch. */
static void check_fields_against_batches(lt_loader *L, const char *what) {
    pl_field_list fl;
    char msg[512];
    PL_CK_OK(L->vt->batch_fields(L->sec, &fl));
    unsigned used = 0;
    for (int s = 0; s < PL_SPLIT_COUNT; s++) {
        if (L->vt->num_batches(L->self, (pl_data_split)s) == 0) continue;
        PL_CK_OK(L->vt->epoch_begin(L->self, (pl_data_split)s, 0, 0));
        pl_batch b;
        while (L->vt->next(L->self, &b) == 1) {
            const char *d = lt_fields_diff(L, &fl, (pl_data_split)s, &b, &used, msg, sizeof msg);
            ck_assert_msg(d == NULL, "%s, split %s: %s", what, pl_split_name((pl_data_split)s), d);
        }
    }
    ck_assert_msg(used == (1u << fl.n) - 1, "%s: a declared field is in no batch (used %x)", what, used);
}

static const pl_field_spec *find_field(const pl_field_list *fl, const char *name) {
    for (int i = 0; i < fl->n; i++)
        if (!strcmp(fl->f[i].name, name)) return &fl->f[i];
    ck_abort_msg("field '%s' not declared", name);
    return NULL;
}

/* Contradicting split options are refused, by batch_fields (what `pipeline
 * check` calls, before any data is read) and by create, naming both keys. */
START_TEST(contradicting_split_options_are_refused) {
    char p[512], body[1024];
    const char *series_file = make_series_file(p, sizeof p);
    const struct {
        const char *extra, *want;
    } cases[] = {
        {"window = 3\nsplit_fractions = 0.6,0.2,0.2\ntrain_end = 1970-01-20\n",
         "split_fractions = 0.6,0.2,0.2 and train_end = 1970-01-20 are both set"},
        {"window = 3\ntrain_end = \nval_end = 1970-01-20\nsplit_fractions = 0.6,0.2,0.2\n",
         "split_fractions = 0.6,0.2,0.2 and val_end = 1970-01-20 are both set"},
        {"window = 3\nval_end = 1970-01-20\n", "val_end = 1970-01-20 without train_end"},
        {"train_end = 1970-01-20\n", "train_end = 1970-01-20 applies to series mode"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(body, sizeof body, "path = %s\nhorizon = 1\ntarget_columns = 0\n%s", series_file,
                 cases[i].extra);
        pl_harness *h = pl_harness_new("data", "hdf5_chunk", body);
        ck_assert_msg(h != NULL, "%s", pl_error_message());
        const pl_loader_vtable *vt = pl_harness_vtable(h);
        pl_field_list fl;
        ck_assert_int_eq(vt->batch_fields(pl_harness_section(h), &fl), PL_ERR_CONFIG);
        ck_assert_msg(strstr(pl_error_message(), cases[i].want), "case %zu: %s", i, pl_error_message());
        pl_harness_free(h);
        lt_loader L;
        ck_assert_int_eq(lt_open(&L, "hdf5_chunk", body, NULL), PL_ERR_CONFIG);
        ck_assert_msg(strstr(pl_error_message(), cases[i].want), "case %zu: %s", i, pl_error_message());
    }
}
END_TEST

/* Dates are untrusted: a day count far outside any calendar (found by fuzz_hdf5:
 * INT64_MAX days overflowed the seconds of the data line's date) is printed as
 * a day number. */
START_TEST(data_line_with_dates_outside_the_calendar) {
    char p[512], body[1024];
    tmp_path("series_far.h5", p, sizeof p);
    float s[30];
    long long d[30];
    for (int t = 0; t < 30; t++) {
        s[t] = (float)t;
        d[t] = t < 29 ? t : 9223372036854775807LL;
    }
    ck_assert_int_eq(lt_write(p, "/series", H5T_NATIVE_FLOAT, 2, (long long[]){30, 1}, s), 0);
    ck_assert_int_eq(lt_write(p, "/date", H5T_NATIVE_LLONG, 1, (long long[]){30}, d), 0);
    snprintf(body, sizeof body, "path = %s\nwindow = 4\nhorizon = 1\ntarget_columns = 0\n"
             "train_end = 1970-01-20\nval_end = 1970-01-25\n", p);
    lt_loader L;
    PL_CK_OK(lt_open(&L, "hdf5_chunk", body, NULL));
    const char *sum = pl_meta_get_str(L.ctx->meta, "data_summary");
    ck_assert_msg(sum && strstr(sum, "..day 9223372036854775807)"), "%s", sum ? sum : "(none)");
    lt_close(&L);
}
END_TEST

/* ---- times of day and multi-timeframe windows ----------------------------- */

/* 1997-06-20T00:00:00Z: day 10032 (1997-06-01 is day 10013: 27 years with 7
 * leap days = 9862, plus January .. May = 151) */
#define T0_1997_06_20 (10032LL * 86400)

/* String dataset `name` (variable-length) or, with attr, string attribute
 * `attr` of dataset `name`. */
static void write_strings(const char *p, const char *name, const char *attr, const char **v, int n) {
    hid_t f = H5Fopen(p, H5F_ACC_RDWR, H5P_DEFAULT);
    hid_t st = H5Tcopy(H5T_C_S1);
    H5Tset_size(st, H5T_VARIABLE);
    hid_t sp = attr ? H5Screate(H5S_SCALAR) : H5Screate_simple(1, (hsize_t[]){(hsize_t)n}, NULL);
    if (attr) {
        hid_t ds = H5Dopen2(f, name, H5P_DEFAULT);
        hid_t a = H5Acreate2(ds, attr, st, sp, H5P_DEFAULT, H5P_DEFAULT);
        H5Awrite(a, st, v);
        H5Aclose(a);
        H5Dclose(ds);
    } else {
        hid_t ds = H5Dcreate2(f, name, st, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        H5Dwrite(ds, st, H5S_ALL, H5S_ALL, H5P_DEFAULT, v);
        H5Dclose(ds);
    }
    H5Sclose(sp);
    H5Tclose(st);
    H5Fclose(f);
}

/* Hourly bars as tools/csv_to_h5.py --resample 1h writes them: /time =
 * 1997-06-20T00:00Z + t hours (unit attribute `unit`, NULL: none; row
 * `gap_row` > 0 one hour late), /series columns level = t, open = t,
 * high = t, ticks = 1. */
static const char *make_hourly_file(const char *name, int T, const char *unit, int gap_row,
                                    char *buf, size_t n) {
    const char *p = tmp_path(name, buf, n);
    unlink(p);
    float *s = malloc(sizeof(float) * 4 * (size_t)T);
    long long *tm = malloc(sizeof(long long) * (size_t)T);
    for (int t = 0; t < T; t++) {
        s[t * 4] = s[t * 4 + 1] = s[t * 4 + 2] = (float)t;
        s[t * 4 + 3] = 1;
        tm[t] = T0_1997_06_20 + 3600LL * t + (gap_row > 0 && t >= gap_row ? 3600 : 0);
    }
    ck_assert_int_eq(lt_write(p, "/series", H5T_NATIVE_FLOAT, 2, (long long[]){T, 4}, s), 0);
    ck_assert_int_eq(lt_write(p, "/time", H5T_NATIVE_LLONG, 1, (long long[]){T}, tm), 0);
    free(s);
    free(tm);
    write_strings(p, "/columns", NULL, (const char *[]){"level", "open", "high", "ticks"}, 4);
    if (unit) write_strings(p, "/time", "unit", &unit, 1);
    return p;
}

static void expect_open_error(const char *body, const char *want) {
    lt_loader L;
    pl_status st = lt_open(&L, "hdf5_chunk", body, NULL);
    ck_assert_msg(st != PL_OK, "accepted: %s", body);
    ck_assert_msg(strstr(pl_error_message(), want), "want '%s', got: %s", want, pl_error_message());
}

/* train_end / val_end with a time of day split a file whose rows have times
 * (/time, seconds) at that instant (any zone); a date alone takes the whole
 * day; the data line prints the times. */
START_TEST(split_by_time_of_day_on_a_seconds_file) {
    char p[512], body[1024];
    const char *f = make_hourly_file("hourly.h5", 30, "seconds since 1970-01-01T00:00:00Z", 0, p,
                                     sizeof p);
    const char *ends[] = {"train_end = 1997-06-20T09:00Z\nval_end = 1997-06-20T14:30:00Z\n",
                          "train_end = 1997-06-20T16:00+07:00\nval_end = 1997-06-20T13:30-0100\n"};
    for (int c = 0; c < 2; c++) {
        /* train rows: time <= 09:00 -> rows 0..9 (a = 10); val: <= 14:30 -> b = 15.
         * window 4 + horizon 1: window w's last target is row w + 4 -> train w 0..5,
         * val w 6..10, test w 11..25 */
        snprintf(body, sizeof body, "path = %s\nwindow = 4\nhorizon = 1\ntarget_columns = level\n%s"
                 "batch_size = 4\nshuffle = false\n", f, ends[c]);
        lt_loader L;
        PL_CK_OK(lt_open(&L, "hdf5_chunk", body, NULL));
        const char *sum = pl_meta_get_str(L.ctx->meta, "data_summary");
        ck_assert_msg(sum && strstr(sum, "train 6 windows (windows 0..6 of /series, last targets "
                                         "1997-06-20T04:00Z..1997-06-20T09:00Z), val 5 windows "
                                         "(windows 6..11 of /series, last targets "
                                         "1997-06-20T10:00Z..1997-06-20T14:00Z), test 15 windows "
                                         "(windows 11..26 of /series, last targets "
                                         "1997-06-20T15:00Z..1997-06-21T05:00Z)"),
                      "case %d: %s", c, sum ? sum : "(none)");
        lt_close(&L);
    }
    /* a date alone: the whole day 1997-06-20 (rows 0..23) */
    snprintf(body, sizeof body, "path = %s\nwindow = 4\nhorizon = 1\ntarget_columns = level\n"
             "train_end = 1997-06-20\nbatch_size = 4\n", f);
    lt_loader L;
    PL_CK_OK(lt_open(&L, "hdf5_chunk", body, NULL));
    int64_t ntr;
    PL_CK_OK(pl_meta_get_int(L.ctx->meta, "num_train", &ntr));
    ck_assert_int_eq(ntr, 20); /* last targets rows 4..23 */
    lt_close(&L);
    /* a time of day without its zone, and a time on a file of calendar days */
    snprintf(body, sizeof body, "path = %s\nwindow = 4\ntarget_columns = level\n"
             "train_end = 1997-06-20T09:00\n", f);
    expect_open_error(body, "needs its zone");
    char q[512];
    snprintf(body, sizeof body, "path = %s\nwindow = 4\ntarget_columns = level\n"
             "train_end = 1970-01-20T09:00Z\n", make_series_file(q, sizeof q));
    expect_open_error(body, "holds calendar days");
    /* the file's time unit is checked (untrusted) */
    f = make_hourly_file("hourly_ms.h5", 30, "milliseconds since 1970-01-01T00:00:00Z", 0, p, sizeof p);
    snprintf(body, sizeof body, "path = %s\nwindow = 4\ntarget_columns = level\n"
             "train_end = 1997-06-20T09:00Z\n", f);
    expect_open_error(body, "has unit 'milliseconds since 1970-01-01T00:00:00Z'");
}
END_TEST

/* Multi-timeframe windows: timeframes 1, 4, 12 bars with windows 3, 4, 2
 * (lookback max(3, 16, 24) = 24 rows). Window w's last input row is
 * e = w + 23 in every timeframe; its targets are rows e+1, e+2. Timeframe k
 * reads rows e - (W-1)k, ..., e of trailing k-bar aggregates: level (last)
 * = the row, open (first) = row - k + 1, high (max) = the row, ticks (sum) = k.
 * Every value is checked by hand, and none is later than e (no window sees a
 * target bar), shuffled or not. */
static void check_timeframe_batch(const pl_batch *b, int64_t *seen, int nwin) {
    pl_tensor *x = pl_batch_get(b, "x"), *y = pl_batch_get(b, "y"),
              *x4 = pl_batch_get(b, "x_tf4"), *x12 = pl_batch_get(b, "x_tf12");
    ck_assert(x && y && x4 && x12);
    ck_assert_int_eq(x->shape[1], 3);
    ck_assert_int_eq(x4->shape[1], 4);
    ck_assert_int_eq(x12->shape[1], 2);
    ck_assert_int_eq(x4->shape[2], 4);
    const struct {
        pl_tensor *t;
        int k, W;
    } tfs[3] = {{x, 1, 3}, {x4, 4, 4}, {x12, 12, 2}};
    for (int64_t i = 0; i < b->size; i++) {
        int64_t e = (int64_t)pl_tensor_get(y, i * 2) - 1; /* first target = level of row e + 1 */
        ck_assert_double_eq(pl_tensor_get(y, i * 2 + 1), (double)(e + 2));
        int64_t w = e - 23;
        ck_assert_msg(w >= 0 && w < nwin, "window %lld", (long long)w);
        seen[w]++;
        for (int f = 0; f < 3; f++) {
            int k = tfs[f].k, W = tfs[f].W;
            for (int j = 0; j < W; j++) {
                int64_t r = e - (int64_t)(W - 1 - j) * k;
                double lv = pl_tensor_get(tfs[f].t, (i * W + j) * 4 + 0),
                       op = pl_tensor_get(tfs[f].t, (i * W + j) * 4 + 1),
                       hi = pl_tensor_get(tfs[f].t, (i * W + j) * 4 + 2),
                       tk = pl_tensor_get(tfs[f].t, (i * W + j) * 4 + 3);
                ck_assert_msg(lv == (double)r && hi == (double)r && op == (double)(r - k + 1) &&
                                  tk == (double)k,
                              "timeframe %d, window %lld, step %d: level %g open %g high %g ticks "
                              "%g; want %lld %lld %lld %d", k, (long long)w, j, lv, op, hi, tk,
                              (long long)r, (long long)(r - k + 1), (long long)r, k);
                ck_assert_msg(lv <= (double)e && hi <= (double)e && op >= 0,
                              "timeframe %d sees row %g past the input time (row %lld)", k, hi,
                              (long long)e);
            }
        }
    }
}

START_TEST(timeframe_windows_end_at_the_input_time_and_never_see_the_future) {
    char p[512], body[1024];
    const char *f = make_hourly_file("hourly_tf.h5", 60, "seconds since 1970-01-01T00:00:00Z", 0, p,
                                     sizeof p);
    for (int shuffle = 0; shuffle < 2; shuffle++) {
        snprintf(body, sizeof body, "path = %s\ntimeframes = 1,4,12\nwindows = 3,4,2\nhorizon = 2\n"
                 "target_columns = level\nsplit_fractions = 0.5,0.25,0.25\nbatch_size = 8\n"
                 "shuffle = %s\n", f, shuffle ? "true" : "false");
        lt_loader L;
        PL_CK_OK(lt_open(&L, "hdf5_chunk", body, NULL));
        /* 60 - 24 - 2 + 1 = 35 windows; train rows [0, 30): last target w + 25 < 30 -> w 0..4 */
        int64_t seen[35] = {0}, total = 0;
        for (int sp = 0; sp < 3; sp++) {
            if (L.vt->num_batches(L.self, (pl_data_split)sp) == 0) continue;
            PL_CK_OK(L.vt->epoch_begin(L.self, (pl_data_split)sp, 3, 0));
            pl_batch b;
            while (L.vt->next(L.self, &b) == 1) {
                if (!shuffle) { /* views of the timeframe matrices: rows k apart */
                    ck_assert_int_eq(pl_batch_get(&b, "x_tf4")->stride[1], 16);
                    ck_assert_int_eq(pl_batch_get(&b, "x_tf12")->stride[1], 48);
                }
                check_timeframe_batch(&b, seen, 35);
                total += b.size;
            }
        }
        ck_assert_int_eq(total, 35);
        for (int w = 0; w < 35; w++)
            ck_assert_int_eq(seen[w], 1);
        int64_t ntr, lb;
        PL_CK_OK(pl_meta_get_int(L.ctx->meta, "num_train", &ntr));
        PL_CK_OK(pl_meta_get_int(L.ctx->meta, "lookback", &lb));
        ck_assert_int_eq(ntr, 5);
        ck_assert_int_eq(lb, 24);
        check_fields_against_batches(&L, "timeframes");
        lt_close(&L);
    }
    /* standardized: each timeframe with its own training-row statistics; for
     * k = 4 the aggregates of rows 3 .. 29 (levels 3..29: mean 16, population
     * variance (27^2 - 1) / 12) */
    snprintf(body, sizeof body, "path = %s\ntimeframes = 1,4,12\nwindows = 3,4,2\nhorizon = 2\n"
             "target_columns = level\nsplit_fractions = 0.5,0.25,0.25\nbatch_size = 8\n"
             "shuffle = false\nstandardize = true\n", f);
    lt_loader L;
    PL_CK_OK(lt_open(&L, "hdf5_chunk", body, NULL));
    PL_CK_OK(L.vt->epoch_begin(L.self, PL_SPLIT_TEST, 0, 0));
    pl_batch b;
    ck_assert_int_eq(L.vt->next(L.self, &b), 1);
    pl_tensor *x4 = pl_batch_get(&b, "x_tf4");
    /* first test window: last target w + 25 >= 45 -> w = 20, e = 43 */
    ck_assert_double_eq_tol(pl_tensor_get(x4, 3 * 4), (43 - 16) / sqrt(728.0 / 12), 1e-5);
    ck_assert_double_eq_tol(pl_tensor_get(x4, 3 * 4 + 3), 0, 1e-12); /* ticks: constant 4 */
    lt_close(&L);
}
END_TEST

START_TEST(timeframes_need_regular_bars_and_consistent_options) {
    char p[512], body[1024];
    const char *f = make_hourly_file("hourly_gap.h5", 60, NULL, 37, p, sizeof p);
    snprintf(body, sizeof body, "path = %s\ntimeframes = 1,4\nwindows = 3,4\ntarget_columns = level\n"
             "split_fractions = 0.5,0.25,0.25\n", f);
    expect_open_error(body, "from row 36 (1997-06-21T12:00Z) to 37 (1997-06-21T14:00Z) by 7200");
    f = make_hourly_file("hourly_ok.h5", 60, NULL, 0, p, sizeof p);
    const struct {
        const char *extra, *want;
    } cases[] = {
        {"timeframes = 1,4\nwindows = 3\n", "one window length per timeframe"},
        {"timeframes = 4,1\nwindows = 3,3\n", "bar counts must increase"},
        {"timeframes = 1,4\nwindows = 3,0\n", "expected integers >= 1"},
        {"window = 5\ntimeframes = 1,4\nwindows = 3,3\n", "leave window out"},
        {"window = 5\nwindows = 3,3\n", "windows = 3,3 without timeframes"},
        {"timeframes = 1,4\nwindows = 3,3\ntimeframe_agg = open=median\n", "is not COLUMN="},
        {"timeframes = 1,40\nwindows = 3,3\n", "reach back 120 rows"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(body, sizeof body, "path = %s\ntarget_columns = level\nsplit_fractions = "
                 "0.5,0.25,0.25\n%s", f, cases[i].extra);
        expect_open_error(body, cases[i].want);
    }
    /* untrusted times whose steps overflow int64 (found by fuzz_hdf5: UBSan, signed
     * overflow in the step) are irregular bars, named, not undefined behaviour */
    const char *q = tmp_path("hourly_overflow.h5", p, sizeof p);
    unlink(q);
    float sv[4 * 8] = {0};
    long long tv[8];
    for (int t = 0; t < 8; t++)
        tv[t] = T0_1997_06_20 + 3600LL * t;
    tv[0] = INT64_MIN;
    ck_assert_int_eq(lt_write(q, "/series", H5T_NATIVE_FLOAT, 2, (long long[]){8, 4}, sv), 0);
    ck_assert_int_eq(lt_write(q, "/time", H5T_NATIVE_LLONG, 1, (long long[]){8}, tv), 0);
    write_strings(q, "/columns", NULL, (const char *[]){"level", "open", "high", "ticks"}, 4);
    snprintf(body, sizeof body, "path = %s\ntimeframes = 1,2\nwindows = 2,2\ntarget_columns = "
             "level\nsplit_fractions = 0.5,0.25,0.25\n", q);
    expect_open_error(body, "steps by more than 2^63 from row 0 to 1");
}
END_TEST

START_TEST(batch_fields_rows_mode) {
    lt_loader L;
    PL_CK_OK(open_rows(&L, "batch_size = 8\nchunk_samples = 16\nshuffle = true\n"));
    pl_field_list fl;
    PL_CK_OK(L.vt->batch_fields(L.sec, &fl));
    ck_assert_int_eq(fl.n, 3);
    const pl_field_spec *x = find_field(&fl, "x"), *y = find_field(&fl, "label"), *h = find_field(&fl, "hist");
    ck_assert(x->dtype == PL_F32 && x->rank == 2 && !x->optional);
    ck_assert(y->dtype == PL_I64 && y->rank == 1 && !y->optional);
    ck_assert(h->dtype == PL_I32 && h->rank == 2 && !h->optional);
    /* val/test batches only */
    ck_assert_uint_eq(h->splits, PL_SPLIT_BIT(PL_SPLIT_VAL) | PL_SPLIT_BIT(PL_SPLIT_TEST));
    ck_assert_uint_eq(x->splits, 0);
    check_fields_against_batches(&L, "rows");
    lt_close(&L);
    /* convert = f32 and split_fractions */
    char p[512], body[1024];
    snprintf(body, sizeof body, "path = %s\ndatasets = x=/train/x,y=/train/y\nsplit_fractions = 0.8,0.1,0.1\n"
             "batch_size = 16\nconvert = f32\n", make_rows_file(p, sizeof p));
    PL_CK_OK(lt_open(&L, "hdf5_chunk", body, NULL));
    check_fields_against_batches(&L, "rows, fractions");
    lt_close(&L);
}
END_TEST

/* One field name with a dtype that depends on the split cannot be declared. */
START_TEST(batch_fields_refuses_split_dependent_dtype) {
    char q[512], body[1024];
    tmp_path("dtypes.h5", q, sizeof q);
    float xf[8] = {0};
    double xd[8] = {0};
    ck_assert_int_eq(lt_write(q, "/train/x", H5T_NATIVE_FLOAT, 2, (long long[]){4, 2}, xf), 0);
    ck_assert_int_eq(lt_write(q, "/val/x", H5T_NATIVE_DOUBLE, 2, (long long[]){4, 2}, xd), 0);
    snprintf(body, sizeof body, "path = %s\ndatasets = x\nbatch_size = 2\n", q);
    lt_loader L;
    PL_CK_OK(lt_open(&L, "hdf5_chunk", body, NULL));
    pl_field_list fl;
    ck_assert_int_eq(L.vt->batch_fields(L.sec, &fl), PL_ERR_CONFIG);
    ck_assert_msg(strstr(pl_error_message(), "'x'") && strstr(pl_error_message(), "val") &&
                  strstr(pl_error_message(), q), "%s", pl_error_message());
    lt_close(&L);
    snprintf(body, sizeof body, "path = %s\ndatasets = x\nbatch_size = 2\nconvert = f32\n", q);
    PL_CK_OK(lt_open(&L, "hdf5_chunk", body, NULL));
    check_fields_against_batches(&L, "convert = f32");
    lt_close(&L);
}
END_TEST

START_TEST(batch_fields_series_mode) {
    char body[2048];
    make_body(body, sizeof body, "batch_size = 4\nshuffle = true\n", true);
    lt_loader L;
    PL_CK_OK(lt_open(&L, "hdf5_chunk", body, NULL));
    pl_field_list fl;
    PL_CK_OK(L.vt->batch_fields(L.sec, &fl));
    ck_assert_int_eq(fl.n, 2);
    ck_assert(find_field(&fl, "x")->dtype == PL_F32 && find_field(&fl, "x")->rank == 3);
    ck_assert(find_field(&fl, "y")->dtype == PL_F32 && find_field(&fl, "y")->rank == 3);
    check_fields_against_batches(&L, "series");
    lt_close(&L);
}
END_TEST

/* ---- teacher outputs joined to the train rows (teacher_join.c) ---------- */

#define JN 20 /* train rows */
#define JL 4  /* positions */
#define JK 3  /* teacher items per position in the file */

static int32_t j_input(int r, int p) { return p == 0 && r % 2 == 0 ? 0 : (r * 4 + p) % 9 + 1; }
static int32_t j_label(int r, int p) { return p == 0 && r % 2 == 0 ? 0 : (r + p) % 9 + 1; }
static int32_t j_item(int src, int p, int k) { return 1 + (src * 7 + p * 3 + k) % 9; }
static float j_logit(int p, int k) { return -(float)k - 0.1f * (float)p; }
static float j_lognorm(int src, int p) { return (float)src + 0.01f * (float)p; }

static void write_attr_double(const char *path, const char *name, double v) {
    hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
    hid_t sp = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(f, name, H5T_IEEE_F64LE, sp, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(a, H5T_NATIVE_DOUBLE, &v);
    H5Aclose(a);
    H5Sclose(sp);
    H5Fclose(f);
}

/* data: /train/input_ids, /train/labels i32 [JN, JL] (+ val/test copies);
 * teacher (ilora export layout): the rows in reverse order (source_row
 * JN-1-t), one entry per labelled position. `bad_row` >= 0: that teacher
 * row's input_ids copy differs at position 2; `no_lognorm`: no
 * /train/lognorm. */
static void make_join_files(const char *dp, const char *tp, int bad_row, bool no_lognorm) {
    unlink(dp);
    unlink(tp);
    int32_t in[JN * JL], lab[JN * JL], tin[JN * JL], tlab[JN * JL], src[JN];
    int32_t row[JN * JL], pos[JN * JL], lbl[JN * JL], ids[JN * JL * JK];
    float lg[JN * JL * JK], ln[JN * JL];
    long long n = 0;
    for (int r = 0; r < JN; r++)
        for (int p = 0; p < JL; p++) {
            in[r * JL + p] = j_input(r, p);
            lab[r * JL + p] = j_label(r, p);
        }
    for (int t = 0; t < JN; t++) {
        int s = JN - 1 - t;
        src[t] = s;
        for (int p = 0; p < JL; p++) {
            tin[t * JL + p] = j_input(s, p) + (t == bad_row && p == 2 ? 1 : 0);
            tlab[t * JL + p] = j_label(s, p);
            if (!j_label(s, p)) continue;
            row[n] = t;
            pos[n] = p;
            lbl[n] = j_label(s, p);
            for (int k = 0; k < JK; k++) {
                ids[n * JK + k] = j_item(s, p, k);
                lg[n * JK + k] = j_logit(p, k);
            }
            ln[n++] = j_lognorm(s, p);
        }
    }
    long long d2[2] = {JN, JL}, d1[1] = {JN};
    ck_assert_int_eq(lt_write(dp, "/train/input_ids", H5T_NATIVE_INT, 2, d2, in), 0);
    ck_assert_int_eq(lt_write(dp, "/train/labels", H5T_NATIVE_INT, 2, d2, lab), 0);
    ck_assert_int_eq(lt_write(dp, "/val/input_ids", H5T_NATIVE_INT, 2, d2, in), 0);
    ck_assert_int_eq(lt_write(dp, "/val/labels", H5T_NATIVE_INT, 2, d2, lab), 0);
    ck_assert_int_eq(lt_write(tp, "/train/input_ids", H5T_NATIVE_INT, 2, d2, tin), 0);
    ck_assert_int_eq(lt_write(tp, "/train/labels", H5T_NATIVE_INT, 2, d2, tlab), 0);
    ck_assert_int_eq(lt_write(tp, "/train/source_row", H5T_NATIVE_INT, 1, d1, src), 0);
    long long pk[2] = {n, JK}, p1[1] = {n};
    ck_assert_int_eq(lt_write(tp, "/train/row", H5T_NATIVE_INT, 1, p1, row), 0);
    ck_assert_int_eq(lt_write(tp, "/train/pos", H5T_NATIVE_INT, 1, p1, pos), 0);
    ck_assert_int_eq(lt_write(tp, "/train/label", H5T_NATIVE_INT, 1, p1, lbl), 0);
    ck_assert_int_eq(lt_write(tp, "/train/topk_ids", H5T_NATIVE_INT, 2, pk, ids), 0);
    ck_assert_int_eq(lt_write(tp, "/train/topk_logits", H5T_NATIVE_FLOAT, 2, pk, lg), 0);
    if (!no_lognorm)
        ck_assert_int_eq(lt_write(tp, "/train/lognorm", H5T_NATIVE_FLOAT, 1, p1, ln), 0);
    write_attr_double(tp, "temperature", 2.0);
}

static pl_status open_join(lt_loader *L, const char *dp, const char *tp, const char *extra) {
    char body[2048];
    snprintf(body, sizeof body,
             "path = %s\ndatasets = input_ids,labels\nrow_field = row\nteacher_outputs = %s\n%s",
             dp, tp, extra);
    return lt_open(L, "hdf5_chunk", body, NULL);
}

/* Every train row of a shuffled epoch carries the teacher's targets of ITS
 * row (found through source_row, whatever the teacher file's row order),
 * the first teacher_top_k items of each labelled position, 0 elsewhere. */
START_TEST(teacher_outputs_join_follows_the_shuffled_rows) {
    char dp[512], tp[512];
    tmp_path("join_data.h5", dp, sizeof dp);
    tmp_path("join_teacher.h5", tp, sizeof tp);
    make_join_files(dp, tp, -1, false);
    for (int streaming = 0; streaming < 2; streaming++) {
        lt_loader L;
        PL_CK_OK(open_join(&L, dp, tp, streaming ? "batch_size = 3\nteacher_top_k = 2\n"
                                                   "chunk_samples = 6\n"
                                                 : "batch_size = 3\nteacher_top_k = 2\n"));
        double T;
        PL_CK_OK(pl_meta_get_float(L.ctx->meta, "teacher_temperature", &T));
        ck_assert_double_eq(T, 2.0);
        PL_CK_OK(L.vt->epoch_begin(L.self, PL_SPLIT_TRAIN, 1, 0));
        pl_batch b;
        int seen[JN] = {0}, n = 0, inorder = 0;
        while (L.vt->next(L.self, &b) == 1) {
            pl_tensor *rw = pl_batch_get(&b, "row"), *in = pl_batch_get(&b, "input_ids");
            pl_tensor *ki = pl_batch_get(&b, "kd_ids"), *kl = pl_batch_get(&b, "kd_logits");
            pl_tensor *kn = pl_batch_get(&b, "kd_lognorm");
            ck_assert_ptr_nonnull(rw);
            ck_assert_ptr_nonnull(ki);
            ck_assert_int_eq(ki->ndim, 3);
            ck_assert_int_eq(ki->shape[2], 2);
            ck_assert_int_eq(kn->ndim, 2);
            for (int64_t i = 0; i < b.size; i++) {
                int r = (int)pl_tensor_i64(rw)[i];
                ck_assert(r >= 0 && r < JN);
                seen[r]++;
                inorder += r == n;
                n++;
                for (int p = 0; p < JL; p++) {
                    ck_assert_int_eq(((int32_t *)pl_tensor_data(in))[i * JL + p], j_input(r, p));
                    const int32_t *id = (int32_t *)pl_tensor_data(ki) + (i * JL + p) * 2;
                    const float *lv = pl_tensor_f32(kl) + (i * JL + p) * 2;
                    float nv = pl_tensor_f32(kn)[i * JL + p];
                    for (int k = 0; k < 2; k++) {
                        ck_assert_int_eq(id[k], j_label(r, p) ? j_item(r, p, k) : 0);
                        ck_assert_float_eq(lv[k], j_label(r, p) ? j_logit(p, k) : 0.0f);
                    }
                    ck_assert_float_eq(nv, j_label(r, p) ? j_lognorm(r, p) : 0.0f);
                }
            }
        }
        ck_assert_int_eq(n, JN);
        ck_assert_int_lt(inorder, JN / 2);
        for (int r = 0; r < JN; r++) ck_assert_int_eq(seen[r], 1);
        /* val batches: the row field, no teacher fields */
        PL_CK_OK(L.vt->epoch_begin(L.self, PL_SPLIT_VAL, 0, 0));
        ck_assert_int_eq(L.vt->next(L.self, &b), 1);
        ck_assert_ptr_nonnull(pl_batch_get(&b, "row"));
        ck_assert_ptr_null(pl_batch_get(&b, "kd_ids"));
        lt_close(&L);
    }
    /* declared: row everywhere, the teacher fields for train only */
    char body[2048];
    snprintf(body, sizeof body, "path = %s\ndatasets = input_ids,labels\nrow_field = row\n"
             "teacher_outputs = %s\n", dp, tp);
    lt_loader L;
    PL_CK_OK(lt_open(&L, "hdf5_chunk", body, NULL));
    check_fields_against_batches(&L, "teacher join");
    pl_field_list fl;
    PL_CK_OK(L.vt->batch_fields(L.sec, &fl));
    ck_assert_uint_eq(find_field(&fl, "kd_ids")->splits, PL_SPLIT_BIT(PL_SPLIT_TRAIN));
    ck_assert_uint_eq(find_field(&fl, "row")->splits, 0u);
    lt_close(&L);
}
END_TEST

/* On a device (the strict one: GPU-like memory the host cannot touch) a
 * shuffled batch is gathered by one index_select per field from the chunk's
 * row order, copied to the device once per chunk: every batch of an epoch
 * equals the CPU loader's, byte for byte, resident and streaming, with the
 * teacher join's extra fields and row_field. */
START_TEST(shuffled_batches_on_a_device_equal_the_cpu_ones) {
    PL_CK_OK(pl_harness_load_backend_named(PL_DEVICE_CUDA, "strict"));
    pl_device dev = {PL_DEVICE_CUDA, 0};
    char p[512], dp[512], tp[512], body[2048];
    make_rows_file(p, sizeof p);
    tmp_path("join_data.h5", dp, sizeof dp);
    tmp_path("join_teacher.h5", tp, sizeof tp);
    make_join_files(dp, tp, -1, false);
    const char *cases[] = {
        "batch_size = 8\nshuffle = true\n",                           /* resident */
        "batch_size = 8\nchunk_samples = 32\nshuffle = true\n",      /* streaming, prefetch */
        "batch_size = 7\nchunk_samples = 21\nshuffle = true\nprefetch = false\n",
        "JOIN batch_size = 3\nteacher_top_k = 2\n",                   /* extra fields, resident */
        "JOIN batch_size = 3\nteacher_top_k = 2\nchunk_samples = 6\n", /* streaming */
    };
    for (int c = 0; c < 5; c++) {
        bool join = !strncmp(cases[c], "JOIN ", 5);
        if (join)
            snprintf(body, sizeof body, "path = %s\ndatasets = input_ids,labels\nrow_field = row\n"
                     "teacher_outputs = %s\n%s", dp, tp, cases[c] + 5);
        else
            snprintf(body, sizeof body, "path = %s\ndatasets = x,label=y\nrow_field = row\n%s", p,
                     cases[c]);
        lt_loader Lc, Ld;
        PL_CK_OK(lt_open(&Lc, "hdf5_chunk", body, NULL));
        PL_CK_OK(lt_open_on(&Ld, "hdf5_chunk", body, NULL, dev));
        for (int e = 0; e < 2; e++) {
            lt_epoch ec, ed;
            PL_CK_OK(Lc.vt->epoch_begin(Lc.self, PL_SPLIT_TRAIN, e, 0));
            PL_CK_OK(Ld.vt->epoch_begin(Ld.self, PL_SPLIT_TRAIN, e, 0));
            ck_assert_int_eq(lt_read_epoch(&Lc, &ec), 0);
            ck_assert_msg(lt_read_epoch(&Ld, &ed) == 0, "case %d: %s", c, pl_error_message());
            ck_assert_int_gt(ed.nb, 1);
            ck_assert_int_eq(ed.b[0].n, ec.b[0].n);
            ck_assert_int_ge(ed.b[0].n, join ? 6 : 3);
            char why[512];
            const char *d = lt_epoch_tail_diff(&ec, 0, &ed, why, sizeof why);
            ck_assert_msg(d == NULL, "case %d epoch %d: %s", c, e, d);
            lt_epoch_free(&ec);
            lt_epoch_free(&ed);
        }
        lt_close(&Lc);
        lt_close(&Ld);
    }
}
END_TEST

/* Rows that do not match are refused naming both files and the first
 * mismatching row; so are a missing log-normalizer and a K too large. */
START_TEST(teacher_outputs_mismatch_is_refused_naming_both_files_and_the_row) {
    char dp[512], tp[512];
    tmp_path("join_data_bad.h5", dp, sizeof dp);
    tmp_path("join_teacher_bad.h5", tp, sizeof tp);
    lt_loader L;
    make_join_files(dp, tp, 7, false);
    ck_assert_int_ne(open_join(&L, dp, tp, ""), PL_OK);
    const char *m = pl_error_message();
    ck_assert_msg(strstr(m, dp) && strstr(m, tp), "message '%s' lacks a file name", m);
    ck_assert_msg(strstr(m, "row 7 (source_row 12)") && strstr(m, "input_ids position 2"),
                  "message '%s' lacks the row", m);
    make_join_files(dp, tp, -1, true);
    ck_assert_int_ne(open_join(&L, dp, tp, ""), PL_OK);
    ck_assert_ptr_nonnull(strstr(pl_error_message(), "/train/lognorm"));
    make_join_files(dp, tp, -1, false);
    ck_assert_int_ne(open_join(&L, dp, tp, "teacher_top_k = 4\n"), PL_OK);
    ck_assert_ptr_nonnull(strstr(pl_error_message(), "teacher_top_k = 4"));
    /* a teacher "item" that is no item (0, the padding id) is refused at the join, naming
     * the file, the dataset and its place: the model reads them on the device unchecked */
    {
        hid_t f = H5Fopen(tp, H5F_ACC_RDWR, H5P_DEFAULT);
        hid_t d = H5Dopen2(f, "/train/topk_ids", H5P_DEFAULT);
        int32_t v[4096];
        hid_t sp = H5Dget_space(d);
        ck_assert_int_le(H5Sget_simple_extent_npoints(sp), 4096);
        H5Sclose(sp);
        ck_assert_int_ge(H5Dread(d, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, v), 0);
        v[1 * JK + 2] = 0;
        ck_assert_int_ge(H5Dwrite(d, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, v), 0);
        H5Dclose(d);
        H5Fclose(f);
    }
    ck_assert_int_ne(open_join(&L, dp, tp, ""), PL_OK);
    m = pl_error_message();
    ck_assert_msg(strstr(m, tp) && strstr(m, "/train/topk_ids[1][2] = 0 is not an item"), "%s", m);
    make_join_files(dp, tp, -1, false);
    /* a data file with another row count: the first data row without a teacher row */
    char dp2[512];
    tmp_path("join_data_more.h5", dp2, sizeof dp2);
    unlink(dp2);
    int32_t in[(JN + 1) * JL], lab[(JN + 1) * JL];
    for (int r = 0; r <= JN; r++)
        for (int p = 0; p < JL; p++) {
            in[r * JL + p] = j_input(r, p);
            lab[r * JL + p] = j_label(r, p);
        }
    long long d2[2] = {JN + 1, JL};
    ck_assert_int_eq(lt_write(dp2, "/train/input_ids", H5T_NATIVE_INT, 2, d2, in), 0);
    ck_assert_int_eq(lt_write(dp2, "/train/labels", H5T_NATIVE_INT, 2, d2, lab), 0);
    ck_assert_int_ne(open_join(&L, dp2, tp, ""), PL_OK);
    m = pl_error_message();
    ck_assert_msg(strstr(m, "no row for train row 20") && strstr(m, dp2) && strstr(m, tp),
                  "message '%s'", m);
    pl_error_clear();
}
END_TEST

/* ---- bad inputs ------------------------------------------------------- */

static void expect_error(const char *body, const char *needle1, const char *needle2) {
    lt_loader L;
    pl_status st = lt_open(&L, "hdf5_chunk", body, NULL);
    ck_assert_msg(st != PL_OK, "expected an error for:\n%s", body);
    const char *m = pl_error_message();
    ck_assert_msg(strstr(m, needle1) != NULL, "message '%s' lacks '%s'", m, needle1);
    if (needle2) ck_assert_msg(strstr(m, needle2) != NULL, "message '%s' lacks '%s'", m, needle2);
}

START_TEST(test_errors) {
    char p[512], body[2048], q[512];
    expect_error("path = /nonexistent/x.h5\ndatasets = x\n", "/nonexistent/x.h5", "cannot open");
    tmp_path("not.h5", q, sizeof q);
    FILE *f = fopen(q, "w");
    fputs("hello, I am text\n", f);
    fclose(f);
    snprintf(body, sizeof body, "path = %s\ndatasets = x\n", q);
    expect_error(body, q, "not an HDF5 file");
    make_rows_file(p, sizeof p);
    snprintf(body, sizeof body, "path = %s\ndatasets = x,nope\n", p);
    expect_error(body, p, "'/train/nope' not found");
    /* first dims disagree */
    tmp_path("bad.h5", q, sizeof q);
    float z[12] = {0};
    lt_write(q, "/train/a", H5T_NATIVE_FLOAT, 2, (long long[]){4, 3}, z);
    lt_write(q, "/train/b", H5T_NATIVE_FLOAT, 1, (long long[]){5}, z);
    lt_write(q, "/train/s", H5T_NATIVE_FLOAT, 0, NULL, z);
    lt_write(q, "/empty/a", H5T_NATIVE_FLOAT, 2, (long long[]){0, 3}, z);
    snprintf(body, sizeof body, "path = %s\ndatasets = a,b\n", q);
    expect_error(body, "'/train/a' (4 rows) and '/train/b' (5 rows)", "disagree");
    snprintf(body, sizeof body, "path = %s\ndatasets = s\n", q);
    expect_error(body, "'/train/s' has rank 0", q);
    snprintf(body, sizeof body, "path = %s\ndatasets = a\ntrain_group = /empty\n", q);
    expect_error(body, "split 'train'", "0 rows");
    snprintf(body, sizeof body, "path = %s\ndatasets = a\nbatch_size = 8\ndrop_last = true\n", q);
    expect_error(body, "4 rows < batch_size 8", "drop_last");
    /* a filter the C library cannot decode (h5py's LZF) */
    snprintf(body, sizeof body, "path = tests/data/loaders/lzf.h5\ndatasets = x,y\n");
    expect_error(body, "dataset '/train/x' uses HDF5 filter 32000 (lzf)", "tests/data/loaders/lzf.h5");
    /* an empty val split is refused at epoch_begin, naming it */
    lt_loader L;
    snprintf(body, sizeof body, "path = %s\ndatasets = a\n", q);
    PL_CK_OK(lt_open(&L, "hdf5_chunk", body, NULL));
    ck_assert_int_eq(L.vt->num_batches(L.self, PL_SPLIT_VAL), 0);
    ck_assert_int_ne(L.vt->epoch_begin(L.self, PL_SPLIT_VAL, 0, 0), PL_OK);
    ck_assert_ptr_nonnull(strstr(pl_error_message(), "split 'val' is empty"));
    lt_close(&L);
}
END_TEST

/* ---- NaN / Inf in the data ------------------------------------------- */

/* /train/x f32 [40, 3] = row, with NaN at row 25 column 2 and Inf at row 28
 * column 0; /train/z f64 [40] = row with NaN at row 3; /train/ok f32 [40, 3]. */
static const char *make_nan_file(char *buf, size_t n) {
    const char *p = tmp_path("nan.h5", buf, n);
    remove(p);
    float x[40 * 3], ok[40 * 3];
    double z[40];
    for (int i = 0; i < 40; i++) {
        z[i] = i;
        for (int j = 0; j < 3; j++) x[i * 3 + j] = ok[i * 3 + j] = (float)i;
    }
    x[25 * 3 + 2] = NAN;
    x[28 * 3 + 0] = INFINITY;
    z[3] = NAN;
    ck_assert_int_eq(lt_write(p, "/train/x", H5T_NATIVE_FLOAT, 2, (long long[]){40, 3}, x), 0);
    ck_assert_int_eq(lt_write(p, "/train/z", H5T_NATIVE_DOUBLE, 1, (long long[]){40}, z), 0);
    ck_assert_int_eq(lt_write(p, "/train/ok", H5T_NATIVE_FLOAT, 2, (long long[]){40, 3}, ok), 0);
    return p;
}

static void expect_in_message(const char *m, const char *a, const char *b, const char *c) {
    ck_assert_msg(strstr(m, a) && (!b || strstr(m, b)) && (!c || strstr(m, c)),
                  "message '%s' lacks '%s' / '%s' / '%s'", m, a, b ? b : "", c ? c : "");
}

/* Rows mode: a chunk holding NaN / Inf is refused when it is read, naming
 * the file, the dataset, the row and column of the first one and the count in
 * that chunk (streaming: the read of a later chunk; resident: the first epoch). */
START_TEST(nonfinite_rows_are_refused_naming_dataset_row_and_column) {
    char p[512], body[1024];
    make_nan_file(p, sizeof p);
    for (int prefetch = 0; prefetch < 2; prefetch++) {
        /* streaming, chunks of 10 rows in file order: chunk 2 (rows 20..29) fails */
        snprintf(body, sizeof body,
                 "path = %s\ndatasets = x\nbatch_size = 10\nchunk_samples = 10\nshuffle = "
                 "false\nprefetch = %s\n",
                 p, prefetch ? "true" : "false");
        lt_loader L;
        PL_CK_OK(lt_open(&L, "hdf5_chunk", body, NULL));
        pl_status st = L.vt->epoch_begin(L.self, PL_SPLIT_TRAIN, 0, 0);
        pl_batch b;
        int r = 0, nb = 0;
        while (!st && (r = L.vt->next(L.self, &b)) == 1)
            nb++;
        ck_assert_msg(st || r < 0, "an epoch over NaN data ended without an error");
        ck_assert_int_le(nb, 2); /* batches of chunks 0 and 1 are clean */
        expect_in_message(pl_error_message(), p, "dataset '/train/x' row 25, column 2 is nan",
                          "2 non-finite values in rows 20..29");
        /* the chunks before it are served */
        PL_CK_OK(L.vt->epoch_begin(L.self, PL_SPLIT_TRAIN, 0, 0));
        ck_assert_int_eq(L.vt->next(L.self, &b), 1);
        lt_close(&L);
    }
    /* resident (everything fits): refused at the first epoch_begin */
    snprintf(body, sizeof body, "path = %s\ndatasets = ok,x\nbatch_size = 8\nshuffle = false\n",
             p);
    lt_loader L;
    PL_CK_OK(lt_open(&L, "hdf5_chunk", body, NULL));
    ck_assert_int_ne(L.vt->epoch_begin(L.self, PL_SPLIT_TRAIN, 0, 0), PL_OK);
    expect_in_message(pl_error_message(), "dataset '/train/x' row 25, column 2 is nan",
                      "2 non-finite values in rows 0..39", "fillna()");
    lt_close(&L);
    /* f64 kept as f64, rank 1: no column; split_fractions rows are dataset rows */
    snprintf(body, sizeof body,
             "path = %s\ndatasets = /train/z\nbatch_size = 2\nshuffle = false\n"
             "split_fractions = 0.05,0.95,0\n",
             p);
    PL_CK_OK(lt_open(&L, "hdf5_chunk", body, NULL));
    PL_CK_OK(L.vt->epoch_begin(L.self, PL_SPLIT_TRAIN, 0, 0)); /* rows 0..1 are clean */
    ck_assert_int_ne(L.vt->epoch_begin(L.self, PL_SPLIT_VAL, 0, 0), PL_OK);
    expect_in_message(pl_error_message(), "dataset '/train/z' row 3 is nan",
                      "1 non-finite value in rows 2..39", NULL);
    lt_close(&L);
}
END_TEST

/* Series mode: the used columns of the series are checked once at create;
 * the message names the column; an unused column may hold NaN. */
START_TEST(nonfinite_series_is_refused_naming_row_and_column) {
    char q[512], body[1024];
    tmp_path("series_nan.h5", q, sizeof q);
    remove(q);
    /* copy the series with NaN at row 12 column 1 ('sq') */
    float s[30 * 3];
    long long d[30];
    for (int t = 0; t < 30; t++) {
        s[t * 3] = (float)t;
        s[t * 3 + 1] = t == 12 ? NAN : (float)(t * t) / 10.0f;
        s[t * 3 + 2] = t == 20 ? -INFINITY : 5.0f - (float)t;
        d[t] = t;
    }
    ck_assert_int_eq(lt_write(q, "/series", H5T_NATIVE_FLOAT, 2, (long long[]){30, 3}, s), 0);
    ck_assert_int_eq(lt_write(q, "/date", H5T_NATIVE_LLONG, 1, (long long[]){30}, d), 0);
    write_series_columns(q);
    const char *common = "window = 4\nhorizon = 2\ntarget_columns = level\n"
                         "train_end = 1970-01-20\nval_end = 1970-01-25\nbatch_size = 4\n";
    snprintf(body, sizeof body, "path = %s\n%s", q, common);
    lt_loader L;
    ck_assert_int_ne(lt_open(&L, "hdf5_chunk", body, NULL), PL_OK);
    expect_in_message(pl_error_message(), q, "dataset '/series' row 12, column 1 ('sq') is nan",
                      "2 non-finite values in rows 0..29");
    /* only 'level' and 'down' used: the first is -inf at row 20 column 2 */
    snprintf(body, sizeof body, "path = %s\n%sfeature_columns = 0,2\n", q, common);
    ck_assert_int_ne(lt_open(&L, "hdf5_chunk", body, NULL), PL_OK);
    expect_in_message(pl_error_message(), "dataset '/series' row 20, column 2 ('down') is -inf",
                      "1 non-finite value in rows 0..29", NULL);
    /* 'sq' and 'down' unused: loads */
    snprintf(body, sizeof body, "path = %s\n%sfeature_columns = 0\n", q, common);
    PL_CK_OK(lt_open(&L, "hdf5_chunk", body, NULL));
    lt_close(&L);
}
END_TEST

/* naive_period: the training windows' MAE of the seasonal naive forecast
 * y[r-s] and the corrected y[r-s] + y[e] - y[e-s], by hand. 8 daily rows,
 * train_end = day 5 (rows 0..5), window 3, horizon 1, s = 2: training
 * windows w = 0, 1, 2 (last input e = w+2, target r = w+3).
 *   trend  = 0 1 2 3 4 5 | 1000 -1000: naive y[w+1] misses by 2 each (MAE 2),
 *            corrected (w+1) + (w+2) - w = w+3 is exact (MAE 0): corrected wins;
 *   season = 0 10 1 10 0 10 | 1000 -1000: naive errors 0, 1, 0 (MAE 1/3),
 *            corrected 11, 1, 9 vs 10, 0, 10: errors 1, 1, 1 (MAE 1): naive wins.
 * The val/test rows (1000, -1000) would change both if they were read. */
START_TEST(naive_period_publishes_both_baselines_training_mae) {
    char p[512], body[1024], rd[512];
    tmp_path("naive.h5", p, sizeof p);
    remove(p);
    float s[8 * 2];
    long long d[8];
    const float trend[8] = {0, 1, 2, 3, 4, 5, 1000, -1000},
                season[8] = {0, 10, 1, 10, 0, 10, 1000, -1000};
    for (int t = 0; t < 8; t++) {
        s[t * 2] = trend[t];
        s[t * 2 + 1] = season[t];
        d[t] = t;
    }
    ck_assert_int_eq(lt_write(p, "/series", H5T_NATIVE_FLOAT, 2, (long long[]){8, 2}, s), 0);
    ck_assert_int_eq(lt_write(p, "/date", H5T_NATIVE_LLONG, 1, (long long[]){8}, d), 0);
    tmp_path("naive_run", rd, sizeof rd);
    mkdir(rd, 0755);
    const double want[2][2] = {{2.0, 0.0}, {1.0 / 3.0, 1.0}}; /* [column][naive, corrected] */
    for (int c = 0; c < 2; c++) {
        snprintf(body, sizeof body,
                 "path = %s\nwindow = 3\nhorizon = 1\ntarget_columns = %d\nstandardize = true\n"
                 "train_end = 1970-01-06\nval_end = 1970-01-07\nbatch_size = 2\nnaive_period = 2\n",
                 p, c);
        lt_loader L;
        PL_CK_OK(lt_open(&L, "hdf5_chunk", body, rd));
        double nae = -1, cae = -1;
        int64_t np = 0;
        PL_CK_OK(pl_meta_get_int(L.ctx->meta, "naive_period", &np));
        PL_CK_OK(pl_meta_get_float(L.ctx->meta, "train_seasonal_naive_mae", &nae));
        PL_CK_OK(pl_meta_get_float(L.ctx->meta, "train_seasonal_naive_corrected_mae", &cae));
        ck_assert_int_eq(np, 2);
        ck_assert_double_eq_tol(nae, want[c][0], 1e-9);
        ck_assert_double_eq_tol(cae, want[c][1], 1e-9);
        lt_close(&L);
        /* the figures the run keeps for `pipeline predict` */
        char jp[600], txt[1024] = {0};
        snprintf(jp, sizeof jp, "%s/naive_baselines.json", rd);
        FILE *f = fopen(jp, "rb");
        ck_assert_msg(f != NULL, "%s not written", jp);
        ck_assert_int_gt(fread(txt, 1, sizeof txt - 1, f), 0);
        fclose(f);
        ck_assert_msg(strstr(txt, "\"train_windows\":\t3"), "%s", txt);
    }
    /* without naive_period nothing is published */
    snprintf(body, sizeof body,
             "path = %s\nwindow = 3\nhorizon = 1\ntrain_end = 1970-01-06\nbatch_size = 2\n", p);
    lt_loader L;
    PL_CK_OK(lt_open(&L, "hdf5_chunk", body, NULL));
    double v;
    ck_assert_int_ne(pl_meta_get_float(L.ctx->meta, "train_seasonal_naive_mae", &v), PL_OK);
    pl_error_clear();
    lt_close(&L);
    /* a period the window cannot hold, or shorter than the horizon, is refused naming both */
    snprintf(body, sizeof body,
             "path = %s\nwindow = 3\nhorizon = 1\ntrain_end = 1970-01-06\nnaive_period = 3\n", p);
    ck_assert_int_ne(lt_open(&L, "hdf5_chunk", body, NULL), PL_OK);
    expect_in_message(pl_error_message(), "naive_period = 3", "< window (3", NULL);
    snprintf(body, sizeof body,
             "path = %s\nwindow = 3\nhorizon = 2\ntrain_end = 1970-01-06\nnaive_period = 1\n", p);
    ck_assert_int_ne(lt_open(&L, "hdf5_chunk", body, NULL), PL_OK);
    expect_in_message(pl_error_message(), "naive_period = 1", ">= horizon (2", NULL);
}
END_TEST

/* ---- real data (converted by tools/ when python3 + h5py are here) ----- */

static bool convert(const char *tool, const char *args, const char *out) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "python3 tools/%s %s %s > /dev/null 2>&1", tool, args, out);
    return system(cmd) == 0;
}

START_TEST(test_movielens_real) {
    char csv[512], out[512];
    if (!pl_test_shared("movielens/ratings.csv", csv, sizeof csv)) {
        printf("test_movielens_real: ../shared/data absent, skipped\n");
        return;
    }
    tmp_path("ml.h5", out, sizeof out);
    if (!convert("movielens_to_h5.py", csv, out)) {
        printf("test_movielens_real: python3 + h5py unavailable, skipped\n");
        return;
    }
    char body[1024];
    snprintf(body, sizeof body, "path = %s\ndatasets = input_ids,labels\n"
             "val_datasets = input_ids,target,user_index\ntest_datasets = input_ids,target,user_index\n"
             "history = history\nbatch_size = 128\neval_batch_size = 256\n", out);
    lt_loader L;
    PL_CK_OK(lt_open(&L, "hdf5_chunk", body, NULL));
    int64_t v;
    PL_CK_OK(pl_meta_get_int(L.ctx->meta, "num_items", &v));
    ck_assert_int_eq(v, 9066);
    PL_CK_OK(pl_meta_get_int(L.ctx->meta, "num_users", &v));
    ck_assert_int_eq(v, 671);
    PL_CK_OK(pl_meta_get_int(L.ctx->meta, "num_ratings", &v));
    ck_assert_int_eq(v, 100004);
    PL_CK_OK(pl_meta_get_int(L.ctx->meta, "seq_len", &v));
    ck_assert_int_eq(v, 50);
    /* test split: the target never appears in the padded history; histories of
     * all users hold 100004 - 671 items in total */
    PL_CK_OK(L.vt->epoch_begin(L.self, PL_SPLIT_TEST, 0, 0));
    pl_batch b;
    int64_t users = 0, hist_items = 0;
    while (L.vt->next(L.self, &b) == 1) {
        pl_tensor *h = pl_batch_get(&b, "history"), *t = pl_batch_get(&b, "target");
        pl_tensor *in = pl_batch_get(&b, "input_ids");
        int64_t H = h->shape[1];
        for (int64_t i = 0; i < b.size; i++, users++) {
            int32_t tg = pl_tensor_i32(t)[i];
            ck_assert(tg >= 1 && tg <= 9066);
            for (int64_t k = 0; k < H; k++) {
                int32_t it = pl_tensor_i32(h)[i * H + k];
                hist_items += it != 0;
                ck_assert_int_ne(it, tg);
            }
            /* the last input is the validation target: nonzero */
            ck_assert_int_ne(pl_tensor_i32(in)[i * 50 + 49], 0);
        }
    }
    ck_assert_int_eq(users, 671);
    ck_assert_int_eq(hist_items, 100004 - 671);
    lt_close(&L);
}
END_TEST

START_TEST(test_chicago_real) {
    char csv[512], out[512];
    if (!pl_test_shared("timeseries/chicago_ridership.csv", csv, sizeof csv)) {
        printf("test_chicago_real: ../shared/data absent, skipped\n");
        return;
    }
    tmp_path("chicago.h5", out, sizeof out);
    if (!convert("csv_to_h5.py", csv, out)) {
        printf("test_chicago_real: python3 + h5py unavailable, skipped\n");
        return;
    }
    char body[1024];
    snprintf(body, sizeof body, "path = %s\nwindow = 14\nhorizon = 1\ntarget_columns = ridership\n"
             "standardize = true\ntrain_end = 2013-12-31\nval_end = 2014-12-31\nbatch_size = 64\n", out);
    lt_loader L;
    PL_CK_OK(lt_open(&L, "hdf5_chunk", body, NULL));
    int64_t rows, ntr, nv, nt, nf;
    PL_CK_OK(pl_meta_get_int(L.ctx->meta, "num_rows", &rows));
    ck_assert_int_eq(rows, 5698);
    PL_CK_OK(pl_meta_get_int(L.ctx->meta, "num_features", &nf));
    ck_assert_int_eq(nf, 49);
    /* 2001-01-22 .. 2013-12-31 is 4727 days; windows whose target is in 2014: 365 */
    PL_CK_OK(pl_meta_get_int(L.ctx->meta, "train_rows", &rows));
    ck_assert_int_eq(rows, 4727);
    PL_CK_OK(pl_meta_get_int(L.ctx->meta, "num_train", &ntr));
    PL_CK_OK(pl_meta_get_int(L.ctx->meta, "num_val", &nv));
    PL_CK_OK(pl_meta_get_int(L.ctx->meta, "num_test", &nt));
    ck_assert_int_eq(ntr, 4727 - 14);
    ck_assert_int_eq(nv, 365);
    ck_assert_int_eq(nt, 5698 - 4727 - 365);
    double m;
    PL_CK_OK(pl_meta_get_float(L.ctx->meta, "target_mean", &m));
    ck_assert(m > 5 && m < 25); /* thousands of rides at Clark/Lake */
    lt_close(&L);
}
END_TEST

int main(void) {
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    Suite *s = suite_create("hdf5_chunk");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_views_and_no_alloc);
    tcase_add_test(tc, test_shuffle);
    tcase_add_test(tc, test_drop_last_and_resident);
    tcase_add_test(tc, test_history_field);
    tcase_add_test(tc, test_fractions);
    tcase_add_test(tc, test_series_windows);
    tcase_add_test(tc, test_series_shuffle);
    tcase_add_test(tc, start_batch_streaming_shuffled_across_chunks);
    tcase_add_test(tc, start_batch_resident_and_series);
    tcase_add_test(tc, batch_fields_rows_mode);
    tcase_add_test(tc, batch_fields_refuses_split_dependent_dtype);
    tcase_add_test(tc, batch_fields_series_mode);
    tcase_add_test(tc, teacher_outputs_join_follows_the_shuffled_rows);
    tcase_add_test(tc, teacher_outputs_mismatch_is_refused_naming_both_files_and_the_row);
    tcase_add_test(tc, shuffled_batches_on_a_device_equal_the_cpu_ones);
    tcase_add_test(tc, test_errors);
    tcase_add_test(tc, nonfinite_rows_are_refused_naming_dataset_row_and_column);
    tcase_add_test(tc, nonfinite_series_is_refused_naming_row_and_column);
    tcase_add_test(tc, contradicting_split_options_are_refused);
    tcase_add_test(tc, data_line_with_dates_outside_the_calendar);
    tcase_add_test(tc, split_by_time_of_day_on_a_seconds_file);
    tcase_add_test(tc, timeframe_windows_end_at_the_input_time_and_never_see_the_future);
    tcase_add_test(tc, timeframes_need_regular_bars_and_consistent_options);
    tcase_add_test(tc, naive_period_publishes_both_baselines_training_mae);
    tcase_add_test(tc, test_movielens_real);
    tcase_add_test(tc, test_chicago_real);
    suite_add_tcase(s, tc);
    return pl_test_run(s);
}
