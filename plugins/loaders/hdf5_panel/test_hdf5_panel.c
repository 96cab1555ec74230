/* test_hdf5_panel.c - the hdf5_panel loader on small synthetic panels
 * written here, and hdf5_graph's deprecated mode = panel (an alias of it).
 *
 * Everything a batch holds is recomputed independently here: the splits from
 * the target_time days, the train statistics of every feature (two passes,
 * unbiased), the cross-section target normalization, and each day's edges
 * with the textbook one-pass Pearson formula and a plain sort of the |corr|
 * (not the loader's centered two-pass one and selection). */
#include <fcntl.h>
#include <hdf5.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "loader_test_util.h"
#include "pl_test.h"

/* T rows (days 2020-01-01 + t), S stocks, F features (ret_1d first), K factors */
#define PT 40
#define PS 6
#define PF 3
#define PK 2
#define DAY0 18262LL /* 2020-01-01 */
#define PW 4
#define PL 10
#define PTOPK 3
#define PT0 9 /* max(W, L) - 1 */
/* train: target day <= 2020-01-25 (DAY0 + 24): rows 9..23; val <= 2020-02-02: rows 24..31 */
#define DATES "train_end = 2020-01-25\nval_end = 2020-02-02\n"
#define GEOM "window = 4\ngraph_lookback = 10\ngraph_top_k = 3\n"

typedef struct pfile {
    float x[PT][PS][PF], y[PT][PS], fac[PT][PS][PK];
    long long time[PT], ttime[PT];
} pfile;

/* a deterministic value in [-0.5, 0.5) */
static float noise(int a, int b, int c) {
    double v = sin(a * 12.9898 + b * 78.233 + c * 37.719 + 0.5) * 43758.5453;
    return (float)(v - floor(v) - 0.5);
}

/* Stock 4's ret_1d copies stock 3's (a tie for every other stock: the lower
 * index first); stock 5's ret_1d is constant (correlation 0 with all). */
static void pfile_init(pfile *f) {
    for (int t = 0; t < PT; t++) {
        f->time[t] = (DAY0 + t) * 86400;
        f->ttime[t] = (DAY0 + t + 1) * 86400;
        for (int s = 0; s < PS; s++) {
            for (int c = 0; c < PF; c++)
                f->x[t][s][c] = noise(t, s, c) * (float)(c + 1) + (float)c;
            f->y[t][s] = noise(t, s, 7) * 0.1f;
            for (int k = 0; k < PK; k++)
                f->fac[t][s][k] = noise(t, s, 11 + k);
        }
        f->x[t][4][0] = f->x[t][3][0];
        f->x[t][5][0] = 0.25f;
    }
}

static int write_names(const char *p, const char *ds, const char *attr, const char *names) {
    hid_t f = H5Fopen(p, H5F_ACC_RDWR, H5P_DEFAULT);
    hid_t d = f < 0 ? -1 : H5Dopen2(f, ds, H5P_DEFAULT);
    hid_t t = H5Tcopy(H5T_C_S1), sp = H5Screate(H5S_SCALAR);
    H5Tset_size(t, strlen(names) + 1);
    hid_t a = d < 0 ? -1 : H5Acreate2(d, attr, t, sp, H5P_DEFAULT, H5P_DEFAULT);
    int rc = a < 0 || H5Awrite(a, t, names) < 0 ? -1 : 0;
    if (a >= 0) H5Aclose(a);
    H5Sclose(sp);
    H5Tclose(t);
    if (d >= 0) H5Dclose(d);
    if (f >= 0) H5Fclose(f);
    return rc;
}

static const char *pfile_write(const pfile *f, const char *name, char *buf, size_t n) {
    const char *p = pl_test_tmp_path("hdf5_panel", name, buf, n);
    remove(p);
    ck_assert_int_eq(lt_write(p, "features", H5T_NATIVE_FLOAT, 3, (long long[]){PT, PS, PF}, f->x),
                     0);
    ck_assert_int_eq(lt_write(p, "target", H5T_NATIVE_FLOAT, 2, (long long[]){PT, PS}, f->y), 0);
    ck_assert_int_eq(lt_write(p, "factors", H5T_NATIVE_FLOAT, 3, (long long[]){PT, PS, PK}, f->fac),
                     0);
    ck_assert_int_eq(lt_write(p, "time", H5T_NATIVE_LLONG, 1, (long long[]){PT}, f->time), 0);
    ck_assert_int_eq(lt_write(p, "target_time", H5T_NATIVE_LLONG, 1, (long long[]){PT}, f->ttime),
                     0);
    ck_assert_int_eq(write_names(p, "features", "feature_names", "ret_1d,mom,vol"), 0);
    ck_assert_int_eq(write_names(p, "factors", "factor_names", "rev,mom_20d"), 0);
    return p;
}

static pl_status open_panel(lt_loader *L, const pfile *f, const char *name, const char *cfg) {
    char p[512], body[2048];
    snprintf(body, sizeof body, "path = %s\n%s", pfile_write(f, name, p, sizeof p),
             cfg);
    return lt_open(L, "hdf5_panel", body, NULL);
}

static int64_t meta_i(const lt_loader *L, const char *key) {
    int64_t v = -1;
    PL_CK_OK(pl_meta_get_int(L->ctx->meta, key, &v));
    return v;
}

static double meta_f(const lt_loader *L, const char *key) {
    double v = NAN;
    PL_CK_OK(pl_meta_get_float(L->ctx->meta, key, &v));
    return v;
}

/* ---- the independent reference ------------------------------------------- */

/* The rows of split s: target day in (lo, hi] (days since 1970). */
static int split_rows(const pfile *f, int s, long long test_end, int *rows) {
    const long long lo[3] = {-(1LL << 40), DAY0 + 24, DAY0 + 32},
                    hi[3] = {DAY0 + 24, DAY0 + 32, test_end};
    int n = 0;
    for (int t = PT0; t < PT; t++) {
        long long d = f->ttime[t] / 86400;
        if (d > lo[s] && d <= hi[s]) rows[n++] = t;
    }
    return n;
}

/* mean and unbiased std of feature c over the train rows, all stocks */
static void feature_stats(const pfile *f, int c, double *mean, double *sd) {
    int rows[PT], n = split_rows(f, 0, 1LL << 40, rows);
    double s = 0, ss = 0;
    for (int i = 0; i < n; i++)
        for (int k = 0; k < PS; k++)
            s += f->x[rows[i]][k][c];
    *mean = s / (n * PS);
    for (int i = 0; i < n; i++)
        for (int k = 0; k < PS; k++)
            ss += (f->x[rows[i]][k][c] - *mean) * (f->x[rows[i]][k][c] - *mean);
    *sd = sqrt(ss / (n * PS - 1));
}

/* |Pearson| of ret_1d of stocks i and j over rows t-L+1..t, one-pass formula;
 * 0 when either series is constant */
static double abs_corr(const pfile *f, int t, int i, int j) {
    double sx = 0, sy = 0, sxx = 0, syy = 0, sxy = 0;
    bool ci = true, cj = true;
    for (int r = t - PL + 1; r <= t; r++) {
        double a = f->x[r][i][0], b = f->x[r][j][0];
        ci = ci && f->x[r][i][0] == f->x[t][i][0];
        cj = cj && f->x[r][j][0] == f->x[t][j][0];
        sx += a;
        sy += b;
        sxx += a * a;
        syy += b * b;
        sxy += a * b;
    }
    if (ci || cj) return 0;
    return fabs((PL * sxy - sx * sy) / sqrt((PL * sxx - sx * sx) * (PL * syy - sy * sy)));
}

/* the k sources of node i on day t: j != i by |corr| descending, ties j ascending
 * (insertion sort of all S-1 candidates) */
static void top_sources(const pfile *f, int t, int i, int *out) {
    int cand[PS], n = 0;
    double a[PS];
    for (int j = 0; j < PS; j++) {
        if (j == i) continue;
        a[j] = abs_corr(f, t, i, j);
        int p = n++;
        while (p > 0 && a[cand[p - 1]] < a[j]) {
            cand[p] = cand[p - 1];
            p--;
        }
        cand[p] = j;
    }
    memcpy(out, cand, sizeof *out * PTOPK);
}

/* Day d of batch b is row t: its x window, edges, y, ret, factors against the
 * reference. std: features standardized with the train statistics. */
static void check_day(const pfile *f, const pl_batch *b, int d, int t, bool std, bool loops) {
    const int64_t Ed = PS * (PTOPK + (loops ? 1 : 0));
    const float *x = pl_tensor_f32(pl_batch_get(b, "x"));
    const int64_t *src = pl_tensor_i64(pl_batch_get(b, "edge_src")),
                  *dst = pl_tensor_i64(pl_batch_get(b, "edge_dst")),
                  *bv = pl_tensor_i64(pl_batch_get(b, "batch"));
    const float *y = pl_tensor_f32(pl_batch_get(b, "y")),
                *ret = pl_tensor_f32(pl_batch_get(b, "ret")),
                *fac = pl_tensor_f32(pl_batch_get(b, "factors"));
    double mean[PF], sd[PF];
    for (int c = 0; c < PF; c++) {
        mean[c] = 0;
        sd[c] = 1;
        if (std) feature_stats(f, c, &mean[c], &sd[c]);
    }
    double m = 0, ss = 0;
    for (int s = 0; s < PS; s++)
        m += f->y[t][s];
    m /= PS;
    for (int s = 0; s < PS; s++)
        ss += (f->y[t][s] - m) * (f->y[t][s] - m);
    double ysd = sqrt(ss / (PS - 1));
    for (int s = 0; s < PS; s++) {
        int64_t node = (int64_t)d * PS + s;
        ck_assert_int_eq(bv[node], d);
        for (int w = 0; w < PW; w++)
            for (int c = 0; c < PF; c++)
                ck_assert_float_eq_tol(x[(node * PW + w) * PF + c],
                                       (f->x[t - PW + 1 + w][s][c] - mean[c]) / sd[c], 1e-5);
        ck_assert_float_eq_tol(y[node], (f->y[t][s] - m) / ysd, 1e-5);
        ck_assert_float_eq(ret[node], f->y[t][s]);
        for (int k = 0; k < PK; k++)
            ck_assert_float_eq(fac[node * PK + k], f->fac[t][s][k]);
        int want[PTOPK];
        top_sources(f, t, s, want);
        for (int k = 0; k < PTOPK; k++) {
            int64_t e = d * Ed + s * PTOPK + k;
            ck_assert_msg(src[e] == d * PS + want[k] && dst[e] == node,
                          "row %d, node %d, source %d: edge %lld -> %lld, expected %lld -> %lld", t,
                          s, k, (long long)src[e], (long long)dst[e], (long long)(d * PS + want[k]),
                          (long long)node);
        }
        if (loops) {
            ck_assert_int_eq(src[d * Ed + PS * PTOPK + s], node);
            ck_assert_int_eq(dst[d * Ed + PS * PTOPK + s], node);
        }
    }
}

/* ---- batches against the reference ------------------------------------------ */

START_TEST(panel_batches_match_an_independent_computation) {
    pfile f;
    pfile_init(&f);
    lt_loader L;
    PL_CK_OK(open_panel(&L, &f, "ref.h5", DATES GEOM "shuffle = false\nbatch_size = 4\n"));
    int rows[3][PT], n[3];
    for (int s = 0; s < 3; s++)
        n[s] = split_rows(&f, s, 1LL << 40, rows[s]);
    ck_assert_int_eq(n[0], 15);
    ck_assert_int_eq(n[1], 8);
    ck_assert_int_eq(n[2], 8);
    ck_assert_int_eq(meta_i(&L, "num_stocks"), PS);
    ck_assert_int_eq(meta_i(&L, "num_features"), PF);
    ck_assert_int_eq(meta_i(&L, "window"), PW);
    ck_assert_int_eq(meta_i(&L, "num_factors"), PK);
    ck_assert_str_eq(pl_meta_get_str(L.ctx->meta, "factor_name_0"), "rev");
    ck_assert_str_eq(pl_meta_get_str(L.ctx->meta, "factor_name_1"), "mom_20d");
    ck_assert_int_eq(meta_i(&L, "num_train"), n[0]);
    ck_assert_int_eq(meta_i(&L, "num_val"), n[1]);
    ck_assert_int_eq(meta_i(&L, "num_test"), n[2]);
    ck_assert_int_eq(meta_i(&L, "graphs_built"), PT - PT0);
    ck_assert(meta_f(&L, "graph_build_ms") >= 0);
    ck_assert_str_eq(pl_meta_get_str(L.ctx->meta, "task"), "stock_ranking");
    const char *sum = pl_meta_get_str(L.ctx->meta, "data_summary");
    ck_assert_msg(sum &&
                      strstr(sum, ": 6 stocks, 3 features, 40 days (9 before the first full "
                                  "window); train 15, val 8, test 8 days; 31 day-graphs built "
                                  "once in ") &&
                      strstr(sum, "(top-3 |corr| over 10 days)"),
                  "%s", sum ? sum : "(none)");
    /* standardization statistics: train rows, all stocks, unbiased std */
    for (int c = 0; c < PF; c++) {
        double mean, sd;
        char k1[32], k2[32];
        feature_stats(&f, c, &mean, &sd);
        snprintf(k1, sizeof k1, "feature_mean_%d", c);
        snprintf(k2, sizeof k2, "feature_std_%d", c);
        ck_assert_double_eq_tol(meta_f(&L, k1), mean, 1e-12);
        ck_assert_double_eq_tol(meta_f(&L, k2), sd, 1e-12);
    }
    const int64_t want_nb[3] = {4, 1, 1}; /* 15 days / 4; eval_batch_size 0: whole split */
    for (int s = 0; s < 3; s++) {
        ck_assert_int_eq(L.vt->num_batches(L.self, (pl_data_split)s), want_nb[s]);
        PL_CK_OK(L.vt->epoch_begin(L.self, (pl_data_split)s, 0, 0));
        pl_batch b;
        int day = 0, nb = 0;
        while (L.vt->next(L.self, &b) == 1) {
            ck_assert_int_eq(b.index, nb++);
            ck_assert_int_eq(pl_batch_get(&b, "x")->shape[0], b.size * PS);
            ck_assert_int_eq(pl_batch_get(&b, "x")->shape[1], PW);
            ck_assert_int_eq(pl_batch_get(&b, "x")->shape[2], PF);
            ck_assert_int_eq(pl_batch_get(&b, "edge_src")->shape[0], b.size * PS * PTOPK);
            ck_assert_int_eq(pl_batch_get(&b, "factors")->shape[1], PK);
            for (int d = 0; d < b.size; d++)
                check_day(&f, &b, d, rows[s][day++], true, false);
        }
        ck_assert_int_eq(day, n[s]);
        ck_assert_int_eq(nb, want_nb[s]);
    }
    lt_close(&L);
}
END_TEST

/* The hand-made facts the reference relies on: node 3 and 4 are copies (each
 * the other's first source), node 5 is constant (its sources: the k lowest
 * other indices, all at |corr| 0). With self loops after the day's edges. */
START_TEST(panel_ties_constant_series_and_self_loops) {
    pfile f;
    pfile_init(&f);
    lt_loader L;
    PL_CK_OK(open_panel(&L, &f, "ties.h5",
                        DATES GEOM "shuffle = false\nadd_self_loops = true\nstandardize_features "
                                   "= false\n"));
    PL_CK_OK(L.vt->epoch_begin(L.self, PL_SPLIT_VAL, 0, 0));
    pl_batch b;
    ck_assert_int_eq(L.vt->next(L.self, &b), 1);
    ck_assert_int_eq(b.size, 8);
    const int64_t Ed = PS * (PTOPK + 1);
    const int64_t *src = pl_tensor_i64(pl_batch_get(&b, "edge_src"));
    for (int d = 0; d < b.size; d++) {
        ck_assert_int_eq(src[d * Ed + 3 * PTOPK], d * PS + 4);
        ck_assert_int_eq(src[d * Ed + 4 * PTOPK], d * PS + 3);
        for (int k = 0; k < PTOPK; k++)
            ck_assert_int_eq(src[d * Ed + 5 * PTOPK + k], d * PS + k);
        check_day(&f, &b, d, 24 + d, false, true);
    }
    lt_close(&L);
}
END_TEST

/* graphs = per_batch rebuilds the edges in next(): every batch of every split,
 * shuffled train epochs included, equals graphs = once bit for bit. */
START_TEST(per_batch_edges_equal_once) {
    pfile f;
    pfile_init(&f);
    lt_loader A, B;
    PL_CK_OK(open_panel(&A, &f, "once.h5", DATES GEOM "batch_size = 4\neval_batch_size = 3\n"));
    PL_CK_OK(open_panel(&B, &f, "per_batch.h5",
                        DATES GEOM "batch_size = 4\neval_batch_size = 3\ngraphs = per_batch\n"));
    ck_assert_int_eq(meta_i(&B, "graphs_built"), 0);
    const char *sum = pl_meta_get_str(B.ctx->meta, "data_summary");
    ck_assert_msg(strstr(sum, "day-graphs rebuilt in every batch"), "%s", sum);
    char msg[512];
    int64_t served = 0;
    for (int e = 0; e < 2; e++)
        for (int s = 0; s < 3; s++) {
            lt_epoch ea, eb;
            PL_CK_OK(A.vt->epoch_begin(A.self, (pl_data_split)s, e, 0));
            PL_CK_OK(B.vt->epoch_begin(B.self, (pl_data_split)s, e, 0));
            ck_assert_int_eq(lt_read_epoch(&A, &ea), 0);
            ck_assert_int_eq(lt_read_epoch(&B, &eb), 0);
            const char *d = lt_epoch_tail_diff(&ea, 0, &eb, msg, sizeof msg);
            ck_assert_msg(d == NULL, "epoch %d split %d: %s", e, s, d);
            for (int i = 0; i < eb.nb; i++)
                served += eb.b[i].size;
            lt_epoch_free(&ea);
            lt_epoch_free(&eb);
        }
    ck_assert_int_eq(meta_i(&B, "graphs_built"), served); /* running count */
    lt_close(&A);
    lt_close(&B);
}
END_TEST

/* ---- no lookahead ----------------------------------------------------------- */

/* Day t's x and edges (day-local ids) from a loader serving split s in file order */
static void day_of_split(lt_loader *L, pl_data_split s, int first_row, int t, float *x,
                         int64_t *edges) {
    PL_CK_OK(L->vt->epoch_begin(L->self, s, 0, 0));
    pl_batch b;
    ck_assert_int_eq(L->vt->next(L->self, &b), 1);
    int d = t - first_row;
    ck_assert(d >= 0 && d < b.size);
    memcpy(x, pl_tensor_f32(pl_batch_get(&b, "x")) + (int64_t)d * PS * PW * PF,
           sizeof *x * PS * PW * PF);
    const int64_t Ed = PS * PTOPK;
    for (int64_t e = 0; e < Ed; e++) {
        edges[e] = pl_tensor_i64(pl_batch_get(&b, "edge_src"))[d * Ed + e] - d * PS;
        edges[Ed + e] = pl_tensor_i64(pl_batch_get(&b, "edge_dst"))[d * Ed + e] - d * PS;
    }
}

/* Every value of rows > t changed (features, targets, factors): day t's x and
 * edges are unchanged. A test day with train statistics (rows < t), and a
 * train day without standardization (the train statistics see later train
 * rows by design). */
START_TEST(no_lookahead_rows_after_t_change_nothing_of_day_t) {
    const struct {
        pl_data_split split;
        int first, t;
        const char *cfg;
    } cases[] = {{PL_SPLIT_TEST, 32, 34, DATES GEOM "shuffle = false\n"},
                 {PL_SPLIT_TRAIN, 9, 15,
                  DATES GEOM "shuffle = false\nbatch_size = 64\nstandardize_features = false\n"}};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        pfile a, b;
        pfile_init(&a);
        pfile_init(&b);
        const int t = cases[c].t;
        for (int r = t + 1; r < PT; r++)
            for (int s = 0; s < PS; s++) {
                for (int k = 0; k < PF; k++)
                    b.x[r][s][k] = a.x[r][s][k] * -3.0f + 1.0f + (float)s;
                b.y[r][s] = -a.y[r][s] + 0.5f;
                for (int k = 0; k < PK; k++)
                    b.fac[r][s][k] = 2.0f;
            }
        lt_loader LA, LB;
        PL_CK_OK(open_panel(&LA, &a, "look_a.h5", cases[c].cfg));
        PL_CK_OK(open_panel(&LB, &b, "look_b.h5", cases[c].cfg));
        static float xa[PS * PW * PF], xb[PS * PW * PF];
        int64_t ea[2 * PS * PTOPK], eb[2 * PS * PTOPK];
        day_of_split(&LA, cases[c].split, cases[c].first, t, xa, ea);
        day_of_split(&LB, cases[c].split, cases[c].first, t, xb, eb);
        ck_assert_msg(!memcmp(xa, xb, sizeof xa), "case %zu: day %d's x changed", c, t);
        ck_assert_msg(!memcmp(ea, eb, sizeof ea), "case %zu: day %d's edges changed", c, t);
        /* and the change is visible one day later (the test sees something) */
        day_of_split(&LA, cases[c].split, cases[c].first, t + 1, xa, ea);
        day_of_split(&LB, cases[c].split, cases[c].first, t + 1, xb, eb);
        ck_assert(memcmp(xa, xb, sizeof xa) != 0);
        lt_close(&LA);
        lt_close(&LB);
    }
}
END_TEST

/* ---- splits, normalization, order ---------------------------------------- */

/* Splits follow target_time, not time: with targets 3 days ahead, train ends
 * 3 rows earlier; test_end drops the rows after it (counted in the summary). */
START_TEST(splits_follow_target_time) {
    pfile f;
    pfile_init(&f);
    for (int t = 0; t < PT; t++)
        f.ttime[t] = f.time[t] + 3 * 86400;
    lt_loader L;
    PL_CK_OK(open_panel(&L, &f, "split3.h5",
                        DATES GEOM "shuffle = false\ntest_end = 2020-02-06\nbatch_size = 64\n"));
    int rows[3][PT], n[3];
    for (int s = 0; s < 3; s++)
        n[s] = split_rows(&f, s, DAY0 + 36, rows[s]);
    /* target day t+3: train t <= 21, val 22..29, test 30..33 (34.. after test_end) */
    ck_assert_int_eq(n[0], 13);
    ck_assert_int_eq(rows[1][0], 22);
    ck_assert_int_eq(n[2], 4);
    ck_assert_int_eq(meta_i(&L, "num_train"), n[0]);
    ck_assert_int_eq(meta_i(&L, "num_val"), n[1]);
    ck_assert_int_eq(meta_i(&L, "num_test"), n[2]);
    const char *sum = pl_meta_get_str(L.ctx->meta, "data_summary");
    ck_assert_msg(strstr(sum, "(9 before the first full window, 6 after test_end); train 13, val "
                              "8, test 4 days"),
                  "%s", sum);
    for (int s = 0; s < 3; s++) {
        PL_CK_OK(L.vt->epoch_begin(L.self, (pl_data_split)s, 0, 0));
        pl_batch b;
        ck_assert_int_eq(L.vt->next(L.self, &b), 1);
        ck_assert_int_eq(b.size, n[s]);
        for (int d = 0; d < b.size; d++)
            check_day(&f, &b, d, rows[s][d], true, false);
    }
    lt_close(&L);
}
END_TEST

/* target_norm: cross_section (checked by check_day), global (train mean and
 * unbiased std over every train stock-day), none (raw); a day whose targets
 * are all equal has std 0 -> 1 (centered only). */
START_TEST(target_normalization) {
    pfile f;
    pfile_init(&f);
    for (int s = 0; s < PS; s++)
        f.y[26][s] = 0.01f; /* val day 26: constant across stocks */
    int rows[PT], n = split_rows(&f, 0, 1LL << 40, rows);
    double m = 0, ss = 0;
    for (int i = 0; i < n; i++)
        for (int s = 0; s < PS; s++)
            m += f.y[rows[i]][s];
    m /= n * PS;
    for (int i = 0; i < n; i++)
        for (int s = 0; s < PS; s++)
            ss += (f.y[rows[i]][s] - m) * (f.y[rows[i]][s] - m);
    double sd = sqrt(ss / (n * PS - 1));
    const char *norms[3] = {"cross_section", "global", "none"};
    for (int c = 0; c < 3; c++) {
        char cfg[512];
        snprintf(cfg, sizeof cfg, DATES GEOM "shuffle = false\ntarget_norm = %s\n", norms[c]);
        lt_loader L;
        PL_CK_OK(open_panel(&L, &f, "norm.h5", cfg));
        if (c == 1) {
            ck_assert_double_eq_tol(meta_f(&L, "target_mean"), m, 1e-12);
            ck_assert_double_eq_tol(meta_f(&L, "target_std"), sd, 1e-12);
        }
        PL_CK_OK(L.vt->epoch_begin(L.self, PL_SPLIT_VAL, 0, 0));
        pl_batch b;
        ck_assert_int_eq(L.vt->next(L.self, &b), 1);
        const float *y = pl_tensor_f32(pl_batch_get(&b, "y"));
        for (int d = 0; d < b.size; d++)
            for (int s = 0; s < PS; s++) {
                float r = f.y[24 + d][s];
                float want = c == 1 ? (float)((r - m) / sd) : c == 2 ? r : y[d * PS + s];
                if (c == 0 && 24 + d == 26) want = 0.0f; /* (r - mean) / 1 */
                ck_assert_float_eq_tol(y[d * PS + s], want, 1e-6);
            }
        if (c == 0) check_day(&f, &b, 0, 24, true, false);
        lt_close(&L);
    }
}
END_TEST

/* standardize_features = false serves the file's values (check_day with no
 * statistics); the graph is the same either way */
START_TEST(unstandardized_features_are_the_files) {
    pfile f;
    pfile_init(&f);
    lt_loader L;
    PL_CK_OK(
        open_panel(&L, &f, "raw.h5", DATES GEOM "shuffle = false\nstandardize_features = false\n"));
    ck_assert_double_eq(meta_f(&L, "feature_mean_1"), 0.0);
    ck_assert_double_eq(meta_f(&L, "feature_std_1"), 1.0);
    PL_CK_OK(L.vt->epoch_begin(L.self, PL_SPLIT_TEST, 0, 0));
    pl_batch b;
    ck_assert_int_eq(L.vt->next(L.self, &b), 1);
    for (int d = 0; d < b.size; d++)
        check_day(&f, &b, d, 32 + d, false, false);
    lt_close(&L);
}
END_TEST

/* Shuffle: each train day once per epoch, the order a function of (seed,
 * epoch) only (a second loader visiting epochs backwards with val between
 * agrees), not the same every epoch; val / test in file order. */
static int day_row(const pfile *f, float ret0) {
    for (int t = 0; t < PT; t++)
        if (f->y[t][0] == ret0) return t;
    return -1;
}

START_TEST(shuffle_is_a_function_of_seed_and_epoch) {
    pfile f;
    pfile_init(&f);
    lt_loader L, L2;
    PL_CK_OK(open_panel(&L, &f, "shuf.h5", DATES GEOM "batch_size = 4\n"));
    PL_CK_OK(open_panel(&L2, &f, "shuf2.h5", DATES GEOM "batch_size = 4\n"));
    int order[5][15], distinct = 0;
    for (int e = 0; e < 5; e++) {
        PL_CK_OK(L.vt->epoch_begin(L.self, PL_SPLIT_TRAIN, e, 0));
        pl_batch b;
        int k = 0, seen[PT] = {0};
        while (L.vt->next(L.self, &b) == 1)
            for (int d = 0; d < b.size; d++) {
                int t = day_row(&f, pl_tensor_f32(pl_batch_get(&b, "ret"))[d * PS]);
                ck_assert(t >= PT0 && t <= 23);
                check_day(&f, &b, d, t, true, false);
                seen[t]++;
                order[e][k++] = t;
            }
        ck_assert_int_eq(k, 15);
        for (int t = PT0; t <= 23; t++)
            ck_assert_int_eq(seen[t], 1);
        if (e > 0 && memcmp(order[e], order[0], sizeof order[0])) distinct++;
    }
    ck_assert_int_gt(distinct, 0);
    for (int e = 4; e >= 0; e--) {
        PL_CK_OK(L2.vt->epoch_begin(L2.self, PL_SPLIT_VAL, 0, 0));
        pl_batch b;
        ck_assert_int_eq(L2.vt->next(L2.self, &b), 1);
        ck_assert_int_eq(day_row(&f, pl_tensor_f32(pl_batch_get(&b, "ret"))[0]), 24);
        PL_CK_OK(L2.vt->epoch_begin(L2.self, PL_SPLIT_TRAIN, e, 0));
        int k = 0;
        while (L2.vt->next(L2.self, &b) == 1)
            for (int d = 0; d < b.size; d++)
                ck_assert_int_eq(day_row(&f, pl_tensor_f32(pl_batch_get(&b, "ret"))[d * PS]),
                                 order[e][k++]);
    }
    lt_close(&L);
    lt_close(&L2);
}
END_TEST

/* Batch counts: eval_batch_size 0 = the whole split in one batch, else
 * ceil(days / eval_batch_size); train ceil, or floor with drop_last. */
START_TEST(eval_batch_size_zero_is_the_whole_split) {
    const struct {
        const char *cfg;
        int64_t nb[3], last_size[3];
    } cases[] = {{"batch_size = 4\n", {4, 1, 1}, {3, 8, 8}},
                 {"batch_size = 4\ndrop_last = true\neval_batch_size = 3\n", {3, 3, 3}, {4, 2, 2}},
                 {"batch_size = 100\neval_batch_size = 8\n", {1, 1, 1}, {15, 8, 8}}};
    pfile f;
    pfile_init(&f);
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        char cfg[512];
        snprintf(cfg, sizeof cfg, DATES GEOM "%s", cases[c].cfg);
        lt_loader L;
        PL_CK_OK(open_panel(&L, &f, "nb.h5", cfg));
        for (int s = 0; s < 3; s++) {
            ck_assert_int_eq(L.vt->num_batches(L.self, (pl_data_split)s), cases[c].nb[s]);
            PL_CK_OK(L.vt->epoch_begin(L.self, (pl_data_split)s, 1, 0));
            pl_batch b;
            int64_t nb = 0, size = 0;
            while (L.vt->next(L.self, &b) == 1) {
                nb++;
                size = b.size;
                ck_assert_int_eq(pl_batch_get(&b, "y")->shape[0], b.size * PS);
            }
            ck_assert_int_eq(nb, cases[c].nb[s]);
            ck_assert_int_eq(size, cases[c].last_size[s]);
        }
        lt_close(&L);
    }
}
END_TEST

/* epoch_begin(train, e, k) serves batches k.. of the whole epoch bit for bit */
START_TEST(start_batch_serves_the_tail_of_the_epoch) {
    pfile f;
    pfile_init(&f);
    const char *cfg = DATES GEOM "batch_size = 4\ngraphs = per_batch\n";
    lt_loader A;
    PL_CK_OK(open_panel(&A, &f, "start.h5", cfg));
    lt_epoch ref, rest;
    PL_CK_OK(A.vt->epoch_begin(A.self, PL_SPLIT_TRAIN, 3, 0));
    ck_assert_int_eq(lt_read_epoch(&A, &ref), 0);
    ck_assert_int_eq(ref.nb, 4);
    char msg[512];
    for (int k = 0; k <= ref.nb; k++) {
        PL_CK_OK(A.vt->epoch_begin(A.self, PL_SPLIT_TRAIN, 4, 0));
        PL_CK_OK(A.vt->epoch_begin(A.self, PL_SPLIT_VAL, 0, 0));
        pl_batch b;
        ck_assert_int_eq(A.vt->next(A.self, &b), 1);
        PL_CK_OK(A.vt->epoch_begin(A.self, PL_SPLIT_TRAIN, 3, k));
        ck_assert_int_eq(lt_read_epoch(&A, &rest), 0);
        const char *d = lt_epoch_tail_diff(&ref, k, &rest, msg, sizeof msg);
        ck_assert_msg(d == NULL, "k = %d: %s", k, d);
        lt_epoch_free(&rest);
    }
    ck_assert_int_eq(A.vt->epoch_begin(A.self, PL_SPLIT_TRAIN, 3, 5), PL_ERR_INVALID);
    ck_assert_msg(strstr(pl_error_message(), "start_batch 5") &&
                      strstr(pl_error_message(), "has 4 batches"),
                  "%s", pl_error_message());
    lt_epoch_free(&ref);
    lt_close(&A);
}
END_TEST

/* Declared fields against every batch of every split; `factors =` serves none */
START_TEST(batch_fields_match_every_batch) {
    pfile f;
    pfile_init(&f);
    const char *cfgs[2] = {DATES GEOM "batch_size = 4\n", DATES GEOM "factors =\n"};
    const int want[2] = {7, 6};
    for (int c = 0; c < 2; c++) {
        lt_loader L;
        PL_CK_OK(open_panel(&L, &f, "fields.h5", cfgs[c]));
        pl_field_list fl;
        PL_CK_OK(L.vt->batch_fields(L.sec, &fl));
        ck_assert_int_eq(fl.n, want[c]);
        unsigned used = 0;
        char msg[512];
        for (int s = 0; s < 3; s++) {
            PL_CK_OK(L.vt->epoch_begin(L.self, (pl_data_split)s, 0, 0));
            pl_batch b;
            while (L.vt->next(L.self, &b) == 1) {
                const char *d =
                    lt_fields_diff(&L, &fl, (pl_data_split)s, &b, &used, msg, sizeof msg);
                ck_assert_msg(d == NULL, "%s", d);
            }
        }
        ck_assert_int_eq(used, (1u << fl.n) - 1);
        if (c == 1) ck_assert_int_eq(meta_i(&L, "num_factors"), 0);
        lt_close(&L);
    }
}
END_TEST

/* Batches are views of the staging; an epoch (train reshuffled) allocates nothing */
START_TEST(epochs_allocate_nothing) {
    pfile f;
    pfile_init(&f);
    lt_loader L;
    PL_CK_OK(open_panel(&L, &f, "alloc.h5", DATES GEOM "batch_size = 4\n"));
    for (int e = 0; e < 3; e++) {
        pl_alloc_stats s0 = pl_alloc_get_stats(PL_CPU);
        for (int s = 0; s < 3; s++) {
            PL_CK_OK(L.vt->epoch_begin(L.self, (pl_data_split)s, e, 0));
            pl_batch b;
            while (L.vt->next(L.self, &b) == 1)
                ;
        }
        pl_alloc_stats s1 = pl_alloc_get_stats(PL_CPU);
        if (e > 0) {
            ck_assert_uint_eq(s1.system_allocs, s0.system_allocs);
            ck_assert_uint_eq(s1.bytes_in_use, s0.bytes_in_use);
        }
    }
    lt_close(&L);
}
END_TEST

/* ---- bad files and options ---------------------------------------------------- */

/* The file written from f, plus dataset `extra` (name, [d0, d1, d2] of f32
 * zeros or i64 `iv`) when given; loading with cfg fails with both strings and
 * the file's name in the message (options-only errors: without the file). */
static void panel_error(const pfile *f, const char *extra, int nd, const long long *dims,
                        const void *data, bool i64, const char *cfg, const char *want1,
                        const char *want2) {
    static int n;
    char name[32], p[512], body[2048];
    snprintf(name, sizeof name, "pbad%d.h5", n++);
    pfile_write(f, name, p, sizeof p);
    if (extra)
        ck_assert_int_eq(
            lt_write(p, extra, i64 ? H5T_NATIVE_LLONG : H5T_NATIVE_FLOAT, nd, dims, data), 0);
    snprintf(body, sizeof body, "path = %s\n%s", p, cfg);
    lt_loader L;
    ck_assert_int_ne(lt_open(&L, "hdf5_panel", body, NULL), PL_OK);
    const char *m = pl_error_message();
    ck_assert_msg(strstr(m, want1) && (!want2 || strstr(m, want2)), "expected '%s' / '%s' in: %s",
                  want1, want2 ? want2 : "", m);
    if (!strstr(want1, "hdf5_panel:")) ck_assert_msg(strstr(m, p), "file name missing in: %s", m);
}

START_TEST(bad_files_are_refused_naming_dataset_expected_and_found) {
    pfile f;
    pfile_init(&f);
    static float zeros[PT * (PS + 1) * PF];
    const char *ok = DATES GEOM;
    char cfg[512];
    /* shapes */
    snprintf(cfg, sizeof cfg, "%starget = y_short\n", ok);
    panel_error(&f, "y_short", 2, (long long[]){PT - 1, PS}, zeros, false, cfg,
                "dataset 'y_short' has 39 entries on axis 0; expected 40", "panel target: [T, S]");
    snprintf(cfg, sizeof cfg, "%sfeatures = flat\n", ok);
    panel_error(&f, "flat", 2, (long long[]){PT, PS}, zeros, false, cfg,
                "dataset 'flat' has rank 2; expected 3", "[T days, S stocks, F features]");
    snprintf(cfg, sizeof cfg, "%sfactors = fac_wide\n", ok);
    panel_error(&f, "fac_wide", 3, (long long[]){PT, PS + 1, PK}, zeros, false, cfg,
                "dataset 'fac_wide' has 7 entries on axis 1; expected 6", "factors");
    snprintf(cfg, sizeof cfg, "%stime = t_short\n", ok);
    panel_error(&f, "t_short", 1, (long long[]){PT - 2}, f.time, true, cfg,
                "dataset 't_short' has 38 entries on axis 0; expected 40", NULL);
    /* times */
    pfile g = f;
    g.time[12] = g.time[11];
    panel_error(&g, NULL, 0, NULL, NULL, false, ok, "dataset 'time' must strictly increase",
                "time[12] = 1578787200 (2020-01-12) <= time[11] = 1578787200 (2020-01-12)");
    g = f;
    g.ttime[20] = g.time[20];
    panel_error(&g, NULL, 0, NULL, NULL, false, ok,
                "target_time[20] = 1579564800 (2020-01-21) is not after time[20]", NULL);
    /* non-finite */
    g = f;
    g.x[30][2][1] = NAN;
    panel_error(&g, NULL, 0, NULL, NULL, false, ok, "dataset 'features' row 30, column 7",
                "is nan");
    g = f;
    g.y[5][1] = INFINITY;
    panel_error(&g, NULL, 0, NULL, NULL, false, ok, "dataset 'target' row 5, column 1 is inf",
                NULL);
    g = f;
    g.fac[0][0][1] = -INFINITY;
    panel_error(&g, NULL, 0, NULL, NULL, false, ok, "dataset 'factors' row 0, column 1", "-inf");
    /* splits */
    panel_error(&f, NULL, 0, NULL, NULL, false,
                "train_end = 2020-01-25\nval_end = 2020-01-26\ntest_end = 2020-01-26\n" GEOM,
                "hdf5_panel: test_end = 2020-01-26 must be after val_end = 2020-01-26", NULL);
    panel_error(&f, NULL, 0, NULL, NULL, false,
                "train_end = 2019-01-25\nval_end = 2020-02-02\n" GEOM,
                "split 'train' is empty: no usable row has a target_time day on or before "
                "train_end 2019-01-25",
                "the usable rows 9..39 (full window and lookback) have target_time 2020-01-11 .. "
                "2020-02-10");
    panel_error(&f, NULL, 0, NULL, NULL, false,
                "train_end = 2020-01-25\nval_end = 2020-03-02\n" GEOM,
                "split 'test' is empty: no usable row has a target_time day after val_end "
                "2020-03-02",
                NULL);
    panel_error(&f, NULL, 0, NULL, NULL, false, "train_end = 2020-02-30\nval_end = 2020-03-02\n",
                "hdf5_panel: train_end = '2020-02-30': expected a date YYYY-MM-DD", NULL);
    panel_error(&f, NULL, 0, NULL, NULL, false, "val_end = 2020-03-02\n",
                "hdf5_panel: needs train_end = YYYY-MM-DD", NULL);
    /* options against the file */
    snprintf(cfg, sizeof cfg, "%sgraph_feature = ret_5d\n", ok);
    panel_error(&f, NULL, 0, NULL, NULL, false, cfg,
                "graph_feature 'ret_5d' is not one of the 3 names of attribute 'feature_names' "
                "of dataset 'features' (ret_1d, mom, vol)",
                NULL);
    panel_error(&f, NULL, 0, NULL, NULL, false, DATES "graph_top_k = 6\n",
                "graph_top_k = 6 must lie in 1..S-1 = 5 (dataset 'features' has S = 6 stocks)",
                NULL);
    panel_error(&f, NULL, 0, NULL, NULL, false, DATES "window = 41\ngraph_lookback = 10\n",
                "window = 41 and graph_lookback = 10 need at least 41 rows", "has T = 40");
    panel_error(&f, NULL, 0, NULL, NULL, false, DATES,
                "graph_lookback = 60 need at least 60 rows; dataset 'features' has T = 40", NULL);
    snprintf(cfg, sizeof cfg, "%sfeatures = unnamed\n", ok);
    panel_error(&f, "unnamed", 3, (long long[]){PT, PS, PF}, zeros, false, cfg,
                "dataset 'unnamed' needs attribute 'feature_names' with its 3 feature names",
                "found 0 names");
    panel_error(&f, NULL, 0, NULL, NULL, false, DATES GEOM "factors = \"\"\n",
                "hdf5_panel: factors = \"\" names a dataset called \"\"", "write `factors =`");
    /* a key of hdf5_graph's node / graphs modes is no option of hdf5_panel */
    char p[512], body[1024];
    pfile_write(&f, "other_opt.h5", p, sizeof p);
    snprintf(body, sizeof body, "path = %s\n%srow_normalize = true\n", p, ok);
    lt_loader L;
    ck_assert_int_eq(lt_open(&L, "hdf5_panel", body, NULL), PL_ERR_CONFIG);
    ck_assert_msg(strstr(pl_error_message(), "unknown key 'row_normalize'"), "%s",
                  pl_error_message());
}
END_TEST

/* hdf5_graph with mode = panel (deprecated) serves hdf5_panel's batches,
 * says once to use hdf5_panel, and still refuses the keys of the other
 * modes (and a panel key in graphs mode). */
static void open_alias_twice(void) {
    pfile f;
    pfile_init(&f);
    char p[512], body[1024];
    snprintf(body, sizeof body, "path = %s\nmode = panel\n" DATES GEOM,
             pfile_write(&f, "alias.h5", p, sizeof p));
    for (int i = 0; i < 2; i++) {
        lt_loader L;
        PL_CK_OK(lt_open(&L, "hdf5_graph", body, NULL));
        lt_close(&L);
    }
}

START_TEST(hdf5_graph_mode_panel_is_an_alias) {
    pfile f;
    pfile_init(&f);
    char p[512], body[1024], why[512];
    pfile_write(&f, "alias.h5", p, sizeof p);
    /* one deprecation line for two loaders (the first in this process) */
    char errp[512];
    pl_test_tmp_path("hdf5_panel", "alias_stderr.txt", errp, sizeof errp);
    fflush(stderr);
    int keep = dup(2), fd = open(errp, O_CREAT | O_TRUNC | O_WRONLY, 0600);
    ck_assert(keep >= 0 && fd >= 0);
    dup2(fd, 2);
    close(fd);
    open_alias_twice();
    fflush(stderr);
    dup2(keep, 2);
    close(keep);
    FILE *ef = fopen(errp, "r");
    char err[8192] = "";
    size_t n = ef ? fread(err, 1, sizeof err - 1, ef) : 0;
    if (ef) fclose(ef);
    err[n] = 0;
    const char *line = "hdf5_graph (mode = panel) is deprecated: use plugin = hdf5_panel";
    const char *at = strstr(err, line);
    ck_assert_msg(at && !strstr(at + 1, line), "stderr: %s", err);
    lt_epoch e[2][2];
    for (int a = 0; a < 2; a++) {
        snprintf(body, sizeof body, "path = %s\n%s" DATES GEOM "batch_size = 4\n", p,
                 a ? "mode = panel\n" : "");
        lt_loader L;
        PL_CK_OK(lt_open(&L, a ? "hdf5_graph" : "hdf5_panel", body, NULL));
        PL_CK_OK(L.vt->epoch_begin(L.self, PL_SPLIT_TRAIN, 3, 0));
        ck_assert_int_eq(lt_read_epoch(&L, &e[a][0]), 0);
        PL_CK_OK(L.vt->epoch_begin(L.self, PL_SPLIT_VAL, 0, 0));
        ck_assert_int_eq(lt_read_epoch(&L, &e[a][1]), 0);
        lt_close(&L);
    }
    ck_assert_int_gt(e[0][0].nb, 1);
    for (int s = 0; s < 2; s++) {
        const char *d = lt_epoch_tail_diff(&e[0][s], 0, &e[1][s], why, sizeof why);
        ck_assert_msg(d == NULL, "split %d: %s", s, d);
        lt_epoch_free(&e[0][s]);
        lt_epoch_free(&e[1][s]);
    }
    /* the keys of the other modes stay refused */
    snprintf(body, sizeof body, "path = %s\nmode = panel\n" DATES GEOM "row_normalize = true\n", p);
    lt_loader L;
    ck_assert_int_ne(lt_open(&L, "hdf5_graph", body, NULL), PL_OK);
    ck_assert_msg(strstr(pl_error_message(), "hdf5_graph: option 'row_normalize' applies to mode "
                                             "= node or graphs only (this section has mode = "
                                             "panel)"),
                  "%s", pl_error_message());
    snprintf(body, sizeof body, "path = %s\nmode = graphs\nwindow = 5\n", p);
    ck_assert_int_ne(lt_open(&L, "hdf5_graph", body, NULL), PL_OK);
    ck_assert_msg(strstr(pl_error_message(), "option 'window' applies to mode = panel only"), "%s",
                  pl_error_message());
}
END_TEST

int main(void) {
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    Suite *s = suite_create("hdf5_panel");
    TCase *tc = tcase_create("panel");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, panel_batches_match_an_independent_computation);
    tcase_add_test(tc, panel_ties_constant_series_and_self_loops);
    tcase_add_test(tc, per_batch_edges_equal_once);
    tcase_add_test(tc, no_lookahead_rows_after_t_change_nothing_of_day_t);
    tcase_add_test(tc, splits_follow_target_time);
    tcase_add_test(tc, target_normalization);
    tcase_add_test(tc, unstandardized_features_are_the_files);
    tcase_add_test(tc, shuffle_is_a_function_of_seed_and_epoch);
    tcase_add_test(tc, eval_batch_size_zero_is_the_whole_split);
    tcase_add_test(tc, start_batch_serves_the_tail_of_the_epoch);
    tcase_add_test(tc, batch_fields_match_every_batch);
    tcase_add_test(tc, epochs_allocate_nothing);
    tcase_add_test(tc, bad_files_are_refused_naming_dataset_expected_and_found);
    tcase_add_test(tc, hdf5_graph_mode_panel_is_an_alias);
    suite_add_tcase(s, tc);
    return pl_test_run(s);
}
