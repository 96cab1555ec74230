/* chunk_test_files.c - the synthetic files and checks the hdf5_rows,
 * hdf5_series and hdf5_chunk (alias) tests share (chunk_test_files.h). */
#include <hdf5.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "chunk_test_files.h"

const char *lf_tmp_path(const char *name, char *buf, size_t n) {
    return pl_test_tmp_path(lf_suite, name, buf, n);
}

/* /train/x f32 [100, 3] = row*10 + col, /train/y i64 [100] = row,
 * /val/x [10, 3] = 1000 + row*10 + col, /val/y = 1000 + row,
 * /val/hist CSR: row r has r % 4 items: 7, 8, 9 (first r%4 of them),
 * /test the same as val plus 2000. Root attribute num_items = 42. */
const char *lf_make_rows_file(char *buf, size_t n) {
    const char *p = lf_tmp_path("rows.h5", buf, n);
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

/* Series: T = 30 days from 1970-01-01, F = 3 columns c0 = t, c1 = t^2/10, c2 = 5 - t. */
const char *lf_make_series_file(char *buf, size_t n) {
    const char *p = lf_tmp_path("series.h5", buf, n);
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
    lf_write_series_columns(p);
    return p;
}

/* /columns = level, sq, down (variable-length strings) */
void lf_write_series_columns(const char *p) {
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

/* ---- start_batch: epoch_begin(split, epoch, k) --------------------------- */

void lf_make_body(char *body, size_t n, const char *extra, bool series) {
    char p[512];
    if (series)
        snprintf(body, n, "path = %s\nwindow = 3\nhorizon = 1\ntarget_columns = 0\n"
                 "split_fractions = 0.6,0.2,0.2\n%s", lf_make_series_file(p, sizeof p), extra);
    else
        snprintf(body, n, "path = %s\ndatasets = x,label=y\nhistory = hist\n%s",
                 lf_make_rows_file(p, sizeof p), extra);
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
void lf_check_start(const char *plugin, const char *body_extra, bool series, int chunk_rows) {
    char body[2048], msg[512];
    lf_make_body(body, sizeof body, body_extra, series);
    const int E = 1;
    lt_loader R;
    PL_CK_OK(lt_open(&R, plugin, body, NULL));
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
        PL_CK_OK(lt_open(&B, plugin, body, NULL));
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
    PL_CK_OK(lt_open(&C, plugin, body, NULL));
    char want[128];
    ck_assert_int_eq(C.vt->epoch_begin(C.self, PL_SPLIT_TRAIN, E, ref.nb + 1), PL_ERR_INVALID);
    const char *m = pl_error_message();
    snprintf(want, sizeof want, "start_batch %d", ref.nb + 1);
    ck_assert_msg(strstr(m, plugin) && strstr(m, "train") && strstr(m, want), "%s", m);
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
/* ---- batch_fields ------------------------------------------------------------ */

/* batch_fields(cfg) of the loader in L, then every batch of every split checked
 * against it; each declared field is carried by some batch. */
void lf_check_fields_against_batches(lt_loader *L, const char *what) {
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

const pl_field_spec *lf_find_field(const pl_field_list *fl, const char *name) {
    for (int i = 0; i < fl->n; i++)
        if (!strcmp(fl->f[i].name, name)) return &fl->f[i];
    ck_abort_msg("field '%s' not declared", name);
    return NULL;
}

void lf_expect_in_message(const char *m, const char *a, const char *b, const char *c) {
    ck_assert_msg(strstr(m, a) && (!b || strstr(m, b)) && (!c || strstr(m, c)),
                  "message '%s' lacks '%s' / '%s' / '%s'", m, a, b ? b : "", c ? c : "");
}

/* ---- real data (converted by tools/ when python3 + h5py are here) ----- */

bool lf_convert(const char *tool, const char *args, const char *out) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "python3 tools/%s %s %s > /dev/null 2>&1", tool, args, out);
    return system(cmd) == 0;
}
