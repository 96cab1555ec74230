/* test_hdf5_series.c - the hdf5_series loader on synthetic series written
 * here with the HDF5 C API (values are functions of the row, so every window
 * is checked against hand-computed numbers): windows, shuffle, start_batch,
 * split options, dates and times of day, timeframes, batch_fields, NaN / Inf,
 * the naive baselines, a device's shuffled batches equal to the CPU's, and
 * Chicago converted by tools/ when ../shared/data and python3 + h5py are
 * present. */
#include <hdf5.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "chunk_test_files.h"

#define PLUGIN "hdf5_series"
const char *const lf_suite = "hdf5_series";

START_TEST(test_series_windows) {
    char p[512], body[1024], rd[512];
    /* train targets end 1970-01-20 (day 19), val 1970-01-25 (day 24) */
    snprintf(body, sizeof body,
             "path = %s\nwindow = 4\nhorizon = 2\ntarget_columns = level\n"
             "feature_columns = level,down\nstandardize = true\ntrain_end = 1970-01-20\n"
             "val_end = 1970-01-25\nbatch_size = 4\nshuffle = false\n",
             lf_make_series_file(p, sizeof p));
    lf_tmp_path("run", rd, sizeof rd);
    mkdir(rd, 0755);
    lt_loader L;
    PL_CK_OK(lt_open(&L, PLUGIN, body, rd));
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
                    ck_assert_double_eq_tol(pl_tensor_get(y, i * 2 + k),
                                            (w + 4 + k - 9.5) / sd_level, 1e-5);
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
    snprintf(body, sizeof body,
             "path = %s\nwindow = 3\nhorizon = 1\ntarget_columns = 0\n"
             "split_fractions = 0.6,0.2,0.2\nbatch_size = 5\nshuffle = true\n",
             lf_make_series_file(p, sizeof p));
    lt_loader L;
    PL_CK_OK(lt_open(&L, PLUGIN, body, NULL));
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
    for (int i = 0; i < 15; i++)
        ck_assert_int_eq(seen[i], 1);
    lt_close(&L);
}
END_TEST

START_TEST(start_batch_series) {
    lf_check_start(PLUGIN, "batch_size = 4\nshuffle = true\n", true, 0);
    lf_check_start(PLUGIN, "batch_size = 4\nshuffle = false\ndrop_last = true\n", true, 0);
}
END_TEST

/* Contradicting split options are refused, by batch_fields (what `pipeline
 * check` calls, before any data is read) and by create, naming both keys. */
START_TEST(contradicting_split_options_are_refused) {
    char p[512], body[1024];
    const char *series_file = lf_make_series_file(p, sizeof p);
    const struct {
        const char *extra, *want;
    } cases[] = {
        {"window = 3\nsplit_fractions = 0.6,0.2,0.2\ntrain_end = 1970-01-20\n",
         "split_fractions = 0.6,0.2,0.2 and train_end = 1970-01-20 are both set"},
        {"window = 3\ntrain_end = \nval_end = 1970-01-20\nsplit_fractions = 0.6,0.2,0.2\n",
         "split_fractions = 0.6,0.2,0.2 and val_end = 1970-01-20 are both set"},
        {"window = 3\nval_end = 1970-01-20\n", "val_end = 1970-01-20 without train_end"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(body, sizeof body, "path = %s\nhorizon = 1\ntarget_columns = 0\n%s", series_file,
                 cases[i].extra);
        pl_harness *h = pl_harness_new("data", PLUGIN, body);
        ck_assert_msg(h != NULL, "%s", pl_error_message());
        const pl_loader_vtable *vt = pl_harness_vtable(h);
        pl_field_list fl;
        ck_assert_int_eq(vt->batch_fields(pl_harness_section(h), &fl), PL_ERR_CONFIG);
        ck_assert_msg(strstr(pl_error_message(), cases[i].want), "case %zu: %s", i,
                      pl_error_message());
        pl_harness_free(h);
        lt_loader L;
        ck_assert_int_eq(lt_open(&L, PLUGIN, body, NULL), PL_ERR_CONFIG);
        ck_assert_msg(strstr(pl_error_message(), cases[i].want), "case %zu: %s", i,
                      pl_error_message());
    }
}
END_TEST

/* Dates are untrusted: a day count far outside any calendar (found by fuzz_hdf5:
 * INT64_MAX days overflowed the seconds of the data line's date) is printed as
 * a day number. */
START_TEST(data_line_with_dates_outside_the_calendar) {
    char p[512], body[1024];
    lf_tmp_path("series_far.h5", p, sizeof p);
    float s[30];
    long long d[30];
    for (int t = 0; t < 30; t++) {
        s[t] = (float)t;
        d[t] = t < 29 ? t : 9223372036854775807LL;
    }
    ck_assert_int_eq(lt_write(p, "/series", H5T_NATIVE_FLOAT, 2, (long long[]){30, 1}, s), 0);
    ck_assert_int_eq(lt_write(p, "/date", H5T_NATIVE_LLONG, 1, (long long[]){30}, d), 0);
    snprintf(body, sizeof body,
             "path = %s\nwindow = 4\nhorizon = 1\ntarget_columns = 0\n"
             "train_end = 1970-01-20\nval_end = 1970-01-25\n",
             p);
    lt_loader L;
    PL_CK_OK(lt_open(&L, PLUGIN, body, NULL));
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
static void write_strings(const char *p, const char *name, const char *attr, const char **v,
                          int n) {
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
    const char *p = lf_tmp_path(name, buf, n);
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
    pl_status st = lt_open(&L, PLUGIN, body, NULL);
    ck_assert_msg(st != PL_OK, "accepted: %s", body);
    ck_assert_msg(strstr(pl_error_message(), want), "want '%s', got: %s", want, pl_error_message());
}

/* train_end / val_end with a time of day split a file whose rows have times
 * (/time, seconds) at that instant (any zone); a date alone takes the whole
 * day; the data line prints the times. */
START_TEST(split_by_time_of_day_on_a_seconds_file) {
    char p[512], body[1024];
    const char *f =
        make_hourly_file("hourly.h5", 30, "seconds since 1970-01-01T00:00:00Z", 0, p, sizeof p);
    const char *ends[] = {"train_end = 1997-06-20T09:00Z\nval_end = 1997-06-20T14:30:00Z\n",
                          "train_end = 1997-06-20T16:00+07:00\nval_end = 1997-06-20T13:30-0100\n"};
    for (int c = 0; c < 2; c++) {
        /* train rows: time <= 09:00 -> rows 0..9 (a = 10); val: <= 14:30 -> b = 15.
         * window 4 + horizon 1: window w's last target is row w + 4 -> train w 0..5,
         * val w 6..10, test w 11..25 */
        snprintf(body, sizeof body,
                 "path = %s\nwindow = 4\nhorizon = 1\ntarget_columns = level\n%s"
                 "batch_size = 4\nshuffle = false\n",
                 f, ends[c]);
        lt_loader L;
        PL_CK_OK(lt_open(&L, PLUGIN, body, NULL));
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
    snprintf(body, sizeof body,
             "path = %s\nwindow = 4\nhorizon = 1\ntarget_columns = level\n"
             "train_end = 1997-06-20\nbatch_size = 4\n",
             f);
    lt_loader L;
    PL_CK_OK(lt_open(&L, PLUGIN, body, NULL));
    int64_t ntr;
    PL_CK_OK(pl_meta_get_int(L.ctx->meta, "num_train", &ntr));
    ck_assert_int_eq(ntr, 20); /* last targets rows 4..23 */
    lt_close(&L);
    /* a time of day without its zone, and a time on a file of calendar days */
    snprintf(body, sizeof body,
             "path = %s\nwindow = 4\ntarget_columns = level\n"
             "train_end = 1997-06-20T09:00\n",
             f);
    expect_open_error(body, "needs its zone");
    char q[512];
    snprintf(body, sizeof body,
             "path = %s\nwindow = 4\ntarget_columns = level\n"
             "train_end = 1970-01-20T09:00Z\n",
             lf_make_series_file(q, sizeof q));
    expect_open_error(body, "holds calendar days");
    /* the file's time unit is checked (untrusted) */
    f = make_hourly_file("hourly_ms.h5", 30, "milliseconds since 1970-01-01T00:00:00Z", 0, p,
                         sizeof p);
    snprintf(body, sizeof body,
             "path = %s\nwindow = 4\ntarget_columns = level\n"
             "train_end = 1997-06-20T09:00Z\n",
             f);
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
    pl_tensor *x = pl_batch_get(b, "x"), *y = pl_batch_get(b, "y"), *x4 = pl_batch_get(b, "x_tf4"),
              *x12 = pl_batch_get(b, "x_tf12");
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
                              "%g; want %lld %lld %lld %d",
                              k, (long long)w, j, lv, op, hi, tk, (long long)r,
                              (long long)(r - k + 1), (long long)r, k);
                ck_assert_msg(lv <= (double)e && hi <= (double)e && op >= 0,
                              "timeframe %d sees row %g past the input time (row %lld)", k, hi,
                              (long long)e);
            }
        }
    }
}

START_TEST(timeframe_windows_end_at_the_input_time_and_never_see_the_future) {
    char p[512], body[1024];
    const char *f =
        make_hourly_file("hourly_tf.h5", 60, "seconds since 1970-01-01T00:00:00Z", 0, p, sizeof p);
    for (int shuffle = 0; shuffle < 2; shuffle++) {
        snprintf(body, sizeof body,
                 "path = %s\ntimeframes = 1,4,12\nwindows = 3,4,2\nhorizon = 2\n"
                 "target_columns = level\nsplit_fractions = 0.5,0.25,0.25\nbatch_size = 8\n"
                 "shuffle = %s\n",
                 f, shuffle ? "true" : "false");
        lt_loader L;
        PL_CK_OK(lt_open(&L, PLUGIN, body, NULL));
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
        lf_check_fields_against_batches(&L, "timeframes");
        lt_close(&L);
    }
    /* standardized: each timeframe with its own training-row statistics; for
     * k = 4 the aggregates of rows 3 .. 29 (levels 3..29: mean 16, population
     * variance (27^2 - 1) / 12) */
    snprintf(body, sizeof body,
             "path = %s\ntimeframes = 1,4,12\nwindows = 3,4,2\nhorizon = 2\n"
             "target_columns = level\nsplit_fractions = 0.5,0.25,0.25\nbatch_size = 8\n"
             "shuffle = false\nstandardize = true\n",
             f);
    lt_loader L;
    PL_CK_OK(lt_open(&L, PLUGIN, body, NULL));
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
    snprintf(body, sizeof body,
             "path = %s\ntimeframes = 1,4\nwindows = 3,4\ntarget_columns = level\n"
             "split_fractions = 0.5,0.25,0.25\n",
             f);
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
        snprintf(body, sizeof body,
                 "path = %s\ntarget_columns = level\nsplit_fractions = "
                 "0.5,0.25,0.25\n%s",
                 f, cases[i].extra);
        expect_open_error(body, cases[i].want);
    }
    /* untrusted times whose steps overflow int64 (found by fuzz_hdf5: UBSan, signed
     * overflow in the step) are irregular bars, named, not undefined behaviour */
    const char *q = lf_tmp_path("hourly_overflow.h5", p, sizeof p);
    unlink(q);
    float sv[4 * 8] = {0};
    long long tv[8];
    for (int t = 0; t < 8; t++)
        tv[t] = T0_1997_06_20 + 3600LL * t;
    tv[0] = INT64_MIN;
    ck_assert_int_eq(lt_write(q, "/series", H5T_NATIVE_FLOAT, 2, (long long[]){8, 4}, sv), 0);
    ck_assert_int_eq(lt_write(q, "/time", H5T_NATIVE_LLONG, 1, (long long[]){8}, tv), 0);
    write_strings(q, "/columns", NULL, (const char *[]){"level", "open", "high", "ticks"}, 4);
    snprintf(body, sizeof body,
             "path = %s\ntimeframes = 1,2\nwindows = 2,2\ntarget_columns = "
             "level\nsplit_fractions = 0.5,0.25,0.25\n",
             q);
    expect_open_error(body, "steps by more than 2^63 from row 0 to 1");
}
END_TEST

START_TEST(batch_fields_series_mode) {
    char body[2048];
    lf_make_body(body, sizeof body, "batch_size = 4\nshuffle = true\n", true);
    lt_loader L;
    PL_CK_OK(lt_open(&L, PLUGIN, body, NULL));
    pl_field_list fl;
    PL_CK_OK(L.vt->batch_fields(L.sec, &fl));
    ck_assert_int_eq(fl.n, 2);
    ck_assert(lf_find_field(&fl, "x")->dtype == PL_F32 && lf_find_field(&fl, "x")->rank == 3);
    ck_assert(lf_find_field(&fl, "y")->dtype == PL_F32 && lf_find_field(&fl, "y")->rank == 3);
    lf_check_fields_against_batches(&L, "series");
    lt_close(&L);
}
END_TEST

/* Series mode: the used columns of the series are checked once at create;
 * the message names the column; an unused column may hold NaN. */
START_TEST(nonfinite_series_is_refused_naming_row_and_column) {
    char q[512], body[1024];
    lf_tmp_path("series_nan.h5", q, sizeof q);
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
    lf_write_series_columns(q);
    const char *common = "window = 4\nhorizon = 2\ntarget_columns = level\n"
                         "train_end = 1970-01-20\nval_end = 1970-01-25\nbatch_size = 4\n";
    snprintf(body, sizeof body, "path = %s\n%s", q, common);
    lt_loader L;
    ck_assert_int_ne(lt_open(&L, PLUGIN, body, NULL), PL_OK);
    lf_expect_in_message(pl_error_message(), q, "dataset '/series' row 12, column 1 ('sq') is nan",
                         "2 non-finite values in rows 0..29");
    /* only 'level' and 'down' used: the first is -inf at row 20 column 2 */
    snprintf(body, sizeof body, "path = %s\n%sfeature_columns = 0,2\n", q, common);
    ck_assert_int_ne(lt_open(&L, PLUGIN, body, NULL), PL_OK);
    lf_expect_in_message(pl_error_message(), "dataset '/series' row 20, column 2 ('down') is -inf",
                         "1 non-finite value in rows 0..29", NULL);
    /* 'sq' and 'down' unused: loads */
    snprintf(body, sizeof body, "path = %s\n%sfeature_columns = 0\n", q, common);
    PL_CK_OK(lt_open(&L, PLUGIN, body, NULL));
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
    lf_tmp_path("naive.h5", p, sizeof p);
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
    lf_tmp_path("naive_run", rd, sizeof rd);
    mkdir(rd, 0755);
    const double want[2][2] = {{2.0, 0.0}, {1.0 / 3.0, 1.0}}; /* [column][naive, corrected] */
    for (int c = 0; c < 2; c++) {
        snprintf(body, sizeof body,
                 "path = %s\nwindow = 3\nhorizon = 1\ntarget_columns = %d\nstandardize = true\n"
                 "train_end = 1970-01-06\nval_end = 1970-01-07\nbatch_size = 2\nnaive_period = 2\n",
                 p, c);
        lt_loader L;
        PL_CK_OK(lt_open(&L, PLUGIN, body, rd));
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
    PL_CK_OK(lt_open(&L, PLUGIN, body, NULL));
    double v;
    ck_assert_int_ne(pl_meta_get_float(L.ctx->meta, "train_seasonal_naive_mae", &v), PL_OK);
    pl_error_clear();
    lt_close(&L);
    /* a period the window cannot hold, or shorter than the horizon, is refused naming both */
    snprintf(body, sizeof body,
             "path = %s\nwindow = 3\nhorizon = 1\ntrain_end = 1970-01-06\nnaive_period = 3\n", p);
    ck_assert_int_ne(lt_open(&L, PLUGIN, body, NULL), PL_OK);
    lf_expect_in_message(pl_error_message(), "naive_period = 3", "< window (3", NULL);
    snprintf(body, sizeof body,
             "path = %s\nwindow = 3\nhorizon = 2\ntrain_end = 1970-01-06\nnaive_period = 1\n", p);
    ck_assert_int_ne(lt_open(&L, PLUGIN, body, NULL), PL_OK);
    lf_expect_in_message(pl_error_message(), "naive_period = 1", ">= horizon (2", NULL);
}
END_TEST

START_TEST(test_chicago_real) {
    char csv[512], out[512];
    if (!pl_test_shared("timeseries/chicago_ridership.csv", csv, sizeof csv)) {
        printf("test_chicago_real: ../shared/data absent, skipped\n");
        return;
    }
    lf_tmp_path("chicago.h5", out, sizeof out);
    if (!lf_convert("csv_to_h5.py", csv, out)) {
        printf("test_chicago_real: python3 + h5py unavailable, skipped\n");
        return;
    }
    char body[1024];
    snprintf(body, sizeof body,
             "path = %s\nwindow = 14\nhorizon = 1\ntarget_columns = ridership\n"
             "standardize = true\ntrain_end = 2013-12-31\nval_end = 2014-12-31\nbatch_size = 64\n",
             out);
    lt_loader L;
    PL_CK_OK(lt_open(&L, PLUGIN, body, NULL));
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

/* On a device (the strict backend) a shuffled batch is gathered by one
 * index_select per field; it equals the CPU loader's byte for byte: one
 * timeframe (several targets, horizon 2) and three timeframes. */
START_TEST(shuffled_batches_on_a_device_equal_the_cpu_ones) {
    pl_device dev;
    PL_CK_OK(lt_test_device(&dev)); /* strict, or PL_TEST_DEVICE_BACKEND=cuda */
    char p[512], q[512], body[2048], why[512];
    lf_make_series_file(p, sizeof p);
    make_hourly_file("hourly_dev.h5", 80, NULL, 0, q, sizeof q);
    for (int c = 0; c < 2; c++) {
        if (c == 0)
            snprintf(body, sizeof body,
                     "path = %s\nwindow = 4\nhorizon = 2\ntarget_columns = "
                     "0,sq\nsplit_fractions = 0.6,0.2,0.2\nbatch_size = 3\nstandardize = true\n",
                     p);
        else
            snprintf(body, sizeof body,
                     "path = %s\ntimeframes = 1,2,4\nwindows = 3,3,2\n"
                     "target_columns = level\nsplit_fractions = 0.6,0.2,0.2\nbatch_size = 5\n",
                     q);
        int nb = 0, nf = 0;
        const char *d = lt_device_equals_cpu(PLUGIN, body, dev, 2, &nb, &nf, why, sizeof why);
        ck_assert_msg(d == NULL, "case %d: %s", c, d);
        ck_assert_int_gt(nb, 1);
        ck_assert_int_eq(nf, c == 0 ? 2 : 4);
    }
}
END_TEST

int main(void) {
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    Suite *s = suite_create("hdf5_series");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_series_windows);
    tcase_add_test(tc, test_series_shuffle);
    tcase_add_test(tc, start_batch_series);
    tcase_add_test(tc, batch_fields_series_mode);
    tcase_add_test(tc, nonfinite_series_is_refused_naming_row_and_column);
    tcase_add_test(tc, contradicting_split_options_are_refused);
    tcase_add_test(tc, data_line_with_dates_outside_the_calendar);
    tcase_add_test(tc, split_by_time_of_day_on_a_seconds_file);
    tcase_add_test(tc, timeframe_windows_end_at_the_input_time_and_never_see_the_future);
    tcase_add_test(tc, timeframes_need_regular_bars_and_consistent_options);
    tcase_add_test(tc, naive_period_publishes_both_baselines_training_mae);
    tcase_add_test(tc, shuffled_batches_on_a_device_equal_the_cpu_ones);
    tcase_add_test(tc, test_chicago_real);
    suite_add_tcase(s, tc);
    return pl_test_run(s);
}
