/* test_stock_gat.c - the stock_gat model plugin: forward, loss and gradients
 * against PyTorch, numerical gradients of the composed loss, the evaluation
 * statistics against NumPy (tests/data/stock_gat/reference.safetensors from
 * tools/gen_stock_gat_reference.py), the whole-split rule, batch fields.
 *
 * Batches follow the hdf5_panel contract (docs: spec section
 * 2): x [n, W, F], edge_src / edge_dst i64 (per day k in-edges per stock
 * then one self loop per stock), batch i64 (day of every node), y, ret,
 * factors [n, K]; meta num_stocks, num_features, window, num_factors,
 * factor_name_k, num_train / num_val / num_test. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pipeline/testing.h"
#include "pl_test.h"
#include "stock_gat.h"

const pl_plugin_desc *pl_plugin_entry(void);

static const char *ref_path(void) {
    static char p[1024];
    snprintf(p, sizeof p, "%s/tests/data/stock_gat/reference.safetensors", PL_TEST_SOURCE_DIR);
    return p;
}

/* ---- loader meta and synthetic panel batches ---------------------------------- */

static const char *const FACTOR_NAMES[2] = {"reversal_1d", "momentum_20d"};

static void panel_meta(pl_meta *mt, int64_t S, int64_t W, int64_t F, int64_t K, int64_t days) {
    PL_CK_OK(pl_meta_set_int(mt, "num_stocks", S));
    PL_CK_OK(pl_meta_set_int(mt, "num_features", F));
    PL_CK_OK(pl_meta_set_int(mt, "window", W));
    PL_CK_OK(pl_meta_set_int(mt, "num_factors", K));
    for (int64_t k = 0; k < K; k++) {
        char key[32];
        snprintf(key, sizeof key, "factor_name_%lld", (long long)k);
        PL_CK_OK(pl_meta_set_str(mt, key, FACTOR_NAMES[k]));
    }
    PL_CK_OK(pl_meta_set_int(mt, "num_train", days));
    PL_CK_OK(pl_meta_set_int(mt, "num_val", days));
    PL_CK_OK(pl_meta_set_int(mt, "num_test", days));
    PL_CK_OK(pl_meta_set_str(mt, "task", "stock_ranking"));
}

typedef struct panel {
    pl_tensor *t[8];
    int n_t;
    pl_batch b;
} panel;

static void put(panel *p, const char *name, pl_tensor *t) {
    ck_assert_msg(t != NULL, "%s: %s", name, pl_error_message());
    p->t[p->n_t++] = t;
    PL_CK_OK(pl_harness_batch_add(&p->b, name, t));
}

static void panel_free(panel *p) {
    for (int i = 0; i < p->n_t; i++)
        pl_tensor_release(p->t[i]);
    memset(p, 0, sizeof *p);
}

static pl_tensor *i64(int64_t n, const int64_t *v) {
    return pl_tensor_from_data(PL_I64, 1, &n, v, PL_CPU);
}

/* D days of S stocks: stock i of a day receives edges from stocks i+1 .. i+k
 * (mod S), then every stock a self loop; x random, y the day's normalized
 * ret, K factors random. */
static void panel_synth(panel *p, int64_t D, int64_t S, int64_t W, int64_t F, int64_t K, int k,
                        bool edges, uint64_t seed) {
    memset(p, 0, sizeof *p);
    int64_t n = D * S, E = D * S * (k + 1);
    int64_t src[512], dst[512], day[128];
    ck_assert(E <= 512 && n <= 128);
    int64_t e = 0;
    for (int64_t d = 0; d < D; d++) {
        for (int64_t i = 0; i < S; i++)
            for (int j = 1; j <= k; j++) {
                src[e] = d * S + (i + j) % S;
                dst[e++] = d * S + i;
            }
        for (int64_t i = 0; i < S; i++) {
            src[e] = dst[e] = d * S + i;
            e++;
        }
        for (int64_t i = 0; i < S; i++)
            day[d * S + i] = d;
    }
    put(p, "x", pl_test_randn(PL_SHAPE(n, W, F), seed));
    if (edges) {
        put(p, "edge_src", i64(E, src));
        put(p, "edge_dst", i64(E, dst));
    }
    put(p, "batch", i64(n, day));
    pl_tensor *ret = pl_test_rand(PL_SHAPE(n), -0.03, 0.03, seed + 1);
    float y[128];
    const float *r = pl_tensor_f32(ret);
    for (int64_t d = 0; d < D; d++) { /* target_norm = cross_section */
        double mu = 0, ss = 0;
        for (int64_t i = 0; i < S; i++)
            mu += r[d * S + i] / (double)S;
        for (int64_t i = 0; i < S; i++)
            ss += (r[d * S + i] - mu) * (r[d * S + i] - mu);
        double sd = sqrt(ss / (double)(S - 1));
        for (int64_t i = 0; i < S; i++)
            y[d * S + i] = (float)((r[d * S + i] - mu) / (sd > 0 ? sd : 1));
    }
    put(p, "y", pl_tensor_from_data(PL_F32, 1, &n, y, PL_CPU));
    put(p, "ret", ret);
    if (K > 0) put(p, "factors", pl_test_randn(PL_SHAPE(n, K), seed + 2));
    p->b.size = D;
}

/* ---- a model from the compiled-in sources ------------------------------------
 * The harness validates the INI snippet against the plugin's schema and
 * owns the run context; create / forward are this test's own copy of the
 * plugin code, so sg_predict can be called on the instance. */

typedef struct model {
    pl_harness *h;
    sg_model *m;
    const pl_model_vtable *vt;
} model;

static void model_open(model *t, const char *ini, int64_t S, int64_t W, int64_t F, int64_t K,
                       int64_t days) {
    t->h = pl_harness_new("model", "stock_gat", ini);
    ck_assert_msg(t->h != NULL, "%s", pl_error_message());
    panel_meta(pl_harness_ctx(t->h)->meta, S, W, F, K, days);
    t->vt = pl_plugin_entry()->vtable;
    void *self = NULL;
    PL_CK_OK(t->vt->create(pl_harness_section(t->h), pl_harness_ctx(t->h), &self));
    t->m = self;
}

static void model_close(model *t) {
    t->vt->destroy(t->m);
    pl_harness_free(t->h);
}

static pl_tensor *param(model *t, const char *name) {
    pl_param *p = pl_params_find(pl_harness_ctx(t->h)->params, name);
    ck_assert_msg(p != NULL, "parameter %s missing", name);
    return p->t;
}

static void expect_close(const pl_tensor *t, const pl_tensor *ref, double atol, double rtol,
                         const char *what) {
    ck_assert_msg(t != NULL, "%s: no tensor (%s)", what, pl_error_message());
    ck_assert_msg(ref != NULL, "%s: not in the fixture", what);
    ck_assert_int_eq(pl_tensor_numel(t), pl_tensor_numel(ref));
    for (int64_t i = 0; i < pl_tensor_numel(t); i++) {
        double a = pl_tensor_get(t, i), r = pl_tensor_get(ref, i);
        ck_assert_msg(fabs(a - r) <= atol + rtol * fabs(r), "%s[%lld]: got %.8g, PyTorch %.8g",
                      what, (long long)i, a, r);
    }
}

/* ---- forward, loss and gradients vs PyTorch ----------------------------------- */

static void check_reference_case(const char *name) {
    pl_st_file *f;
    PL_CK_OK(pl_st_open(ref_path(), &f));
    char key[256];
    snprintf(key, sizeof key, "%s.ini", name);
    const char *ini = pl_st_meta(f, key);
    ck_assert_msg(ini != NULL, "fixture has no %s", key);
    pl_tensor *x = pl_st_load(f, "batch/x");
    model t;
    model_open(&t, ini, 4, x->shape[1], x->shape[2], 0, 2);
    /* every parameter of the model from the fixture, and no other in the fixture */
    pl_params *ps = pl_harness_ctx(t.h)->params;
    int in_fixture = 0;
    char prefix[64];
    snprintf(prefix, sizeof prefix, "%s/param/", name);
    for (int i = 0; i < pl_st_count(f); i++)
        in_fixture += !strncmp(pl_st_name_at(f, i), prefix, strlen(prefix));
    ck_assert_int_eq(pl_params_count(ps), in_fixture);
    for (int i = 0; i < pl_params_count(ps); i++) {
        snprintf(key, sizeof key, "%s%s", prefix, pl_params_at(ps, i)->name);
        PL_CK_OK(pl_st_load_into(f, key, pl_params_at(ps, i)->t));
    }
    panel p = {0};
    put(&p, "x", x);
    put(&p, "edge_src", pl_st_load(f, "batch/edge_src"));
    put(&p, "edge_dst", pl_st_load(f, "batch/edge_dst"));
    put(&p, "batch", pl_st_load(f, "batch/batch"));
    put(&p, "y", pl_st_load(f, "batch/y"));
    put(&p, "ret", pl_st_load(f, "batch/ret"));
    p.b.size = 2;
    PL_CK_OK(pl_harness_check_batch(t.h, &p.b, PL_SPLIT_TRAIN));

    /* evaluation forward: the prediction */
    pl_no_grad_begin();
    pl_frame_begin();
    snprintf(key, sizeof key, "%s/pred", name);
    pl_tensor *ref = pl_st_load(f, key);
    expect_close(sg_predict(t.m, x, p.b.fields[1], p.b.fields[2], false), ref, 2e-5, 1e-5, key);
    pl_tensor_release(ref);
    pl_frame_end();
    pl_no_grad_end();

    /* training forward (dropout 0): the composed loss and every gradient */
    pl_frame_begin();
    pl_tensor *loss = NULL;
    pl_metrics mt;
    pl_metrics_reset(&mt);
    PL_CK_OK(t.vt->forward(t.m, &p.b, PL_SPLIT_TRAIN, true, &loss, &mt));
    snprintf(key, sizeof key, "%s/loss", name);
    pl_tensor *rl = pl_st_load(f, key);
    snprintf(key, sizeof key, "%s/mse", name);
    pl_tensor *rm = pl_st_load(f, key);
    ck_assert_msg(fabs(pl_tensor_item(loss) - pl_tensor_get(rl, 0)) <=
                      1e-5 * (1 + fabs(pl_tensor_get(rl, 0))),
                  "%s: loss %.8g, PyTorch %.8g", name, pl_tensor_item(loss), pl_tensor_get(rl, 0));
    ck_assert_msg(fabs(pl_metrics_get(&mt, "mse") - pl_tensor_get(rm, 0)) <=
                      1e-5 * (1 + pl_tensor_get(rm, 0)),
                  "%s: mse %.8g, PyTorch %.8g", name, pl_metrics_get(&mt, "mse"),
                  pl_tensor_get(rm, 0));
    pl_tensor_release(rl);
    pl_tensor_release(rm);
    PL_CK_OK(pl_backward(loss, 1.0));
    pl_frame_end();
    for (int i = 0; i < pl_params_count(ps); i++) {
        pl_param *pp = pl_params_at(ps, i);
        snprintf(key, sizeof key, "%s/grad/%s", name, pp->name);
        pl_tensor *g = pl_st_load(f, key);
        expect_close(pp->t->grad, g, 1e-5, 1e-4, key);
        pl_tensor_release(g);
    }
    panel_free(&p);
    pl_st_close(f);
    model_close(&t);
}

START_TEST(full_model_matches_pytorch) {
    check_reference_case("full");
} /* revin, 2+2 layers, MLP head, rank loss */
END_TEST
START_TEST(graph_model_matches_pytorch) {
    check_reference_case("graph");
}
END_TEST
START_TEST(encoder_only_model_matches_pytorch) {
    check_reference_case("plain");
}
END_TEST

/* ---- numerical gradients of the composed loss ----------------------------------- */

/* mse + rank loss, dropout on (masks fixed by the micro step), with and
 * without the graph and RevIN: every parameter through the core's gradcheck,
 * on the built plugin (.so) as the trainer loads it. */
static void gradcheck_case(bool graph, bool revin) {
    char ini[512];
    snprintf(
        ini, sizeof ini,
        "hidden = 4\nencoder_layers = 2\ngraph = %s\ngat_layers = 2\nheads = 2\ngat_hidden = 3\n"
        "head_hidden = 3\nrevin = %s\nrevin_channel = 2\nrank_loss_weight = 0.5\n"
        "dropout = 0.2\nattn_dropout = 0.2\n",
        graph ? "true" : "false", revin ? "true" : "false");
    pl_harness *h = pl_harness_new("model", "stock_gat", ini);
    ck_assert_msg(h != NULL, "%s", pl_error_message());
    panel_meta(pl_harness_ctx(h)->meta, 5, 4, 3, 2, 3);
    pl_harness_ctx(h)->micro_step = 3;
    void *m;
    PL_CK_OK(pl_harness_create(h, &m));
    panel p;
    panel_synth(&p, 3, 5, 4, 3, 2, 2, graph, 41);
    PL_CK_OK(pl_harness_check_batch(h, &p.b, PL_SPLIT_TRAIN));
    pl_status st = pl_harness_gradcheck(h, m, &p.b, 1e-3, 1e-3, 1e-2, 0);
    ck_assert_msg(st == PL_OK, "graph %d revin %d: %s", graph, revin, pl_error_message());
    panel_free(&p);
    pl_harness_destroy(h, m);
    pl_harness_free(h);
}

START_TEST(gradients_match_finite_differences_with_graph_and_revin) {
    gradcheck_case(true, true);
}
END_TEST
START_TEST(gradients_match_finite_differences_with_graph) {
    gradcheck_case(true, false);
}
END_TEST
START_TEST(gradients_match_finite_differences_with_revin) {
    gradcheck_case(false, true);
}
END_TEST
START_TEST(gradients_match_finite_differences_encoder_only) {
    gradcheck_case(false, false);
}
END_TEST

/* ---- evaluation metrics vs NumPy ---------------------------------------------------- */

typedef struct metric_fixture {
    pl_st_file *f;
    pl_tensor *pred, *ret, *fac, *day, *expected, *daily_ic, *daily_ls;
    int64_t n, days, long_short;
} metric_fixture;

static void mf_open(metric_fixture *mf) {
    PL_CK_OK(pl_st_open(ref_path(), &mf->f));
    mf->pred = pl_st_load(mf->f, "metrics/pred");
    mf->ret = pl_st_load(mf->f, "metrics/ret");
    mf->fac = pl_st_load(mf->f, "metrics/factors");
    mf->day = pl_st_load(mf->f, "metrics/batch");
    mf->expected = pl_st_load(mf->f, "metrics/expected");
    mf->daily_ic = pl_st_load(mf->f, "metrics/daily_ic");
    mf->daily_ls = pl_st_load(mf->f, "metrics/daily_ls");
    ck_assert(mf->pred && mf->ret && mf->fac && mf->day && mf->expected && mf->daily_ic &&
              mf->daily_ls);
    mf->n = pl_tensor_numel(mf->pred);
    mf->days = atoll(pl_st_meta(mf->f, "metrics.days"));
    mf->long_short = atoll(pl_st_meta(mf->f, "metrics.long_short"));
}

static void mf_close(metric_fixture *mf) {
    pl_tensor *ts[7] = {mf->pred,     mf->ret,      mf->fac,     mf->day,
                        mf->expected, mf->daily_ic, mf->daily_ls};
    for (int i = 0; i < 7; i++)
        pl_tensor_release(ts[i]);
    pl_st_close(mf->f);
}

/* expected[row] = ic, ic_std, ic_t, sharpe, days (NumPy) */
static double expected(const metric_fixture *mf, int row, int col) {
    return pl_tensor_get(mf->expected, row * 5 + col);
}

/* Ties (average ranks), a constant-prediction day (IC 0, return 0), a
 * constant-return day, ties across the long/short cut and a 4-stock day
 * (L = 2), for the prediction and for two factors. */
START_TEST(metrics_match_numpy_with_ties_and_constant_days) {
    metric_fixture mf;
    mf_open(&mf);
    const float *ret = pl_tensor_f32(mf.ret), *fac = pl_tensor_f32(mf.fac);
    const int64_t *day = pl_tensor_i64(mf.day);
    const float *scores[3] = {pl_tensor_f32(mf.pred), fac, fac + 1};
    const int64_t strides[3] = {1, 2, 2};
    for (int row = 0; row < 3; row++) {
        sg_stats s;
        PL_CK_OK(
            sg_daily_stats(scores[row], strides[row], ret, day, mf.n, mf.days, mf.long_short, &s));
        const double got[5] = {s.ic, s.ic_std, s.ic_t, s.sharpe, (double)s.days};
        const char *what[5] = {"ic", "ic_std", "ic_t", "sharpe", "days"};
        for (int c = 0; c < 5; c++)
            ck_assert_msg(
                fabs(got[c] - expected(&mf, row, c)) <= 1e-9 * (1 + fabs(expected(&mf, row, c))),
                "score %d %s: %.12g, NumPy %.12g", row, what[c], got[c], expected(&mf, row, c));
        /* and day by day */
        for (int64_t d = 0, i0 = 0; d < mf.days; d++) {
            int64_t m = 0;
            float sc[16], rt[16];
            while (i0 + m < mf.n && day[i0 + m] == d) {
                sc[m] = scores[row][(i0 + m) * strides[row]];
                rt[m] = ret[i0 + m];
                m++;
            }
            double ic = sg_spearman(sc, rt, m), ls = sg_long_short(sc, rt, m, mf.long_short);
            double want_ic = pl_tensor_get(mf.daily_ic, row * mf.days + d);
            double want_ls = pl_tensor_get(mf.daily_ls, row * mf.days + d);
            ck_assert_msg(fabs(ic - want_ic) < 1e-12, "score %d day %lld: IC %.12g, NumPy %.12g",
                          row, (long long)d, ic, want_ic);
            ck_assert_msg(fabs(ls - want_ls) < 1e-12,
                          "score %d day %lld: long/short %.12g, NumPy %.12g", row, (long long)d, ls,
                          want_ls);
            i0 += m;
        }
    }
    /* the constant-prediction day (3) and the constant-return day (5) count as IC 0 */
    ck_assert(pl_tensor_get(mf.daily_ic, 3) == 0.0 && pl_tensor_get(mf.daily_ls, 3) == 0.0);
    ck_assert(pl_tensor_get(mf.daily_ic, 5) == 0.0);
    mf_close(&mf);
}
END_TEST

START_TEST(average_ranks_share_tied_positions) {
    const float v[6] = {0.5f, -1.0f, 0.5f, 2.0f, 0.5f, -1.0f};
    double r[6];
    PL_CK_OK(sg_rank_average(v, 6, r));
    const double want[6] = {4, 1.5, 4, 6, 4, 1.5};
    for (int i = 0; i < 6; i++)
        ck_assert_double_eq_tol(r[i], want[i], 1e-15);
    const float c[3] = {1, 1, 1}, d[3] = {0.1f, 0.3f, 0.2f};
    ck_assert(sg_spearman(c, d, 3) == 0.0);      /* constant side: 0 */
    ck_assert(sg_spearman(d, d, 1) == 0.0);      /* one stock: 0 */
    ck_assert(sg_long_short(c, d, 3, 5) == 0.0); /* constant score: no position */
    const float nan_v[3] = {1, NAN, 2};
    ck_assert(isnan(sg_spearman(nan_v, d, 3))); /* a diverged model shows as NaN */
}
END_TEST

/* The metric fixture as an evaluation batch (7 days, one of 4 stocks): the
 * forward reports, in order, loss, ic, ic_std, ic_t, sharpe, mse and per
 * factor ic_<name>, ic_t_<name>, sharpe_<name>; with the head's weight
 * zeroed every prediction is the head bias (constant each day), so every
 * model statistic is 0 while the factors' match NumPy. */
START_TEST(evaluation_reports_the_split_statistics_in_order) {
    metric_fixture mf;
    mf_open(&mf);
    model t;
    model_open(&t, "hidden = 4\nheads = 2\ngat_hidden = 2\nlong_short = 3\n", 10, 3, 2, 2, mf.days);
    panel p = {0};
    int64_t n = mf.n;
    put(&p, "x", pl_test_randn(PL_SHAPE(n, 3, 2), 5));
    int64_t self_loops[64];
    for (int64_t i = 0; i < n; i++)
        self_loops[i] = i; /* a graph of self loops is enough here */
    put(&p, "edge_src", i64(n, self_loops));
    put(&p, "edge_dst", i64(n, self_loops));
    put(&p, "batch", pl_tensor_retain(mf.day));
    put(&p, "y", pl_test_randn(PL_SHAPE(n), 6));
    put(&p, "ret", pl_tensor_retain(mf.ret));
    put(&p, "factors", pl_tensor_retain(mf.fac));
    p.b.size = mf.days;
    PL_CK_OK(pl_harness_check_batch(t.h, &p.b, PL_SPLIT_VAL));

    /* the trained head: metrics = sg_daily_stats of sg_predict */
    pl_metrics mt;
    pl_metrics_reset(&mt);
    pl_no_grad_begin();
    pl_frame_begin();
    pl_tensor *loss = NULL;
    PL_CK_OK(t.vt->forward(t.m, &p.b, PL_SPLIT_VAL, false, &loss, &mt));
    pl_tensor *pred = pl_tensor_to(
        sg_predict(t.m, p.b.fields[0], p.b.fields[1], p.b.fields[2], false), PL_F32, PL_CPU);
    sg_stats s;
    PL_CK_OK(sg_daily_stats(pl_tensor_f32(pred), 1, pl_tensor_f32(mf.ret), pl_tensor_i64(mf.day), n,
                            mf.days, 3, &s));
    ck_assert_double_eq_tol(pl_metrics_get(&mt, "ic"), s.ic, 1e-12);
    ck_assert_double_eq_tol(pl_metrics_get(&mt, "sharpe"), s.sharpe, 1e-12);
    ck_assert_msg(s.ic != 0.0, "a random model has IC exactly 0: the check above is vacuous");
    pl_frame_end();
    pl_no_grad_end();

    /* constant predictions */
    pl_tensor *w = param(&t, "head.0.weight");
    PL_CK_OK(pl_tensor_fill_(w, 0.0));
    double bias = pl_tensor_get(param(&t, "head.0.bias"), 0);
    pl_metrics_reset(&mt);
    pl_no_grad_begin();
    pl_frame_begin();
    PL_CK_OK(t.vt->forward(t.m, &p.b, PL_SPLIT_VAL, false, &loss, &mt));
    pl_frame_end();
    pl_no_grad_end();
    const char *names[] = {"loss",
                           "ic",
                           "ic_std",
                           "ic_t",
                           "sharpe",
                           "mse",
                           "ic_reversal_1d",
                           "ic_t_reversal_1d",
                           "sharpe_reversal_1d",
                           "ic_momentum_20d",
                           "ic_t_momentum_20d",
                           "sharpe_momentum_20d"};
    ck_assert_int_eq(mt.n, 12);
    for (int i = 0; i < 12; i++)
        ck_assert_str_eq(mt.name[i], names[i]);
    double mse = 0;
    const float *yv = pl_tensor_f32(p.b.fields[4]);
    for (int64_t i = 0; i < n; i++)
        mse += (bias - yv[i]) * (bias - yv[i]) / (double)n;
    ck_assert_double_eq_tol(pl_metrics_get(&mt, "mse"), mse, 1e-5);
    ck_assert_double_eq_tol(pl_metrics_get(&mt, "loss"), mse, 1e-5); /* rank_loss_weight 0 */
    ck_assert_double_eq(mt.count[0], (double)n);
    for (int i = 1; i <= 4; i++)
        ck_assert_msg(pl_metrics_value_at(&mt, i) == 0.0, "%s = %g", names[i],
                      pl_metrics_value_at(&mt, i));
    for (int k = 0; k < 2; k++) {
        ck_assert_double_eq_tol(pl_metrics_value_at(&mt, 6 + 3 * k), expected(&mf, 1 + k, 0), 1e-9);
        ck_assert_double_eq_tol(pl_metrics_value_at(&mt, 7 + 3 * k), expected(&mf, 1 + k, 2), 1e-9);
        ck_assert_double_eq_tol(pl_metrics_value_at(&mt, 8 + 3 * k), expected(&mf, 1 + k, 3), 1e-9);
    }
    panel_free(&p);
    model_close(&t);
    mf_close(&mf);
}
END_TEST

/* Evaluation refuses a batch that is not the whole split (the statistics
 * are over days) naming data.eval_batch_size, and a loader without the
 * split's day count; training batches are any size. */
START_TEST(evaluation_needs_the_whole_split_in_one_batch) {
    pl_harness *h = pl_harness_new("model", "stock_gat", "hidden = 4\nheads = 2\ngat_hidden = 2\n");
    ck_assert_msg(h != NULL, "%s", pl_error_message());
    pl_meta *mt = pl_harness_ctx(h)->meta;
    panel_meta(mt, 5, 4, 3, 0, 16);
    PL_CK_OK(pl_meta_set_int(mt, "num_val", 3));
    void *m;
    PL_CK_OK(pl_harness_create(h, &m));
    panel p;
    panel_synth(&p, 3, 5, 4, 3, 0, 2, true, 9);
    pl_metrics met;
    pl_metrics_reset(&met);
    double loss;
    PL_CK_OK(pl_harness_forward(h, m, &p.b, PL_SPLIT_VAL, false, &loss, &met)); /* 3 of 3 days */
    ck_assert_int_eq(pl_harness_forward(h, m, &p.b, PL_SPLIT_TEST, false, &loss, &met),
                     PL_ERR_CONFIG);
    ck_assert_msg(strstr(pl_error_message(), "data.eval_batch_size") != NULL &&
                      strstr(pl_error_message(), "num_test") != NULL &&
                      strstr(pl_error_message(), "16") != NULL,
                  "%s", pl_error_message());
    PL_CK_OK(pl_harness_forward(h, m, &p.b, PL_SPLIT_TRAIN, true, &loss, NULL)); /* 3 of 16: fine */
    pl_harness_destroy(h, m);
    pl_harness_free(h);

    /* a loader that does not say how many days the split has */
    h = pl_harness_new("model", "stock_gat", "hidden = 4\nheads = 2\ngat_hidden = 2\n");
    PL_CK_OK(pl_meta_set_int(pl_harness_ctx(h)->meta, "num_features", 3));
    PL_CK_OK(pl_harness_create(h, &m));
    ck_assert_int_eq(pl_harness_forward(h, m, &p.b, PL_SPLIT_VAL, false, &loss, NULL),
                     PL_ERR_CONFIG);
    ck_assert_msg(strstr(pl_error_message(), "num_val") != NULL, "%s", pl_error_message());
    pl_harness_destroy(h, m);
    pl_harness_free(h);
    panel_free(&p);
}
END_TEST

/* Training reports loss and mse weighted by the node count. */
START_TEST(training_reports_loss_and_mse_per_node) {
    pl_harness *h = pl_harness_new("model", "stock_gat",
                                   "hidden = 4\nheads = 2\ngat_hidden = 2\nrank_loss_weight = 2\n");
    ck_assert_msg(h != NULL, "%s", pl_error_message());
    panel_meta(pl_harness_ctx(h)->meta, 5, 4, 3, 2, 100);
    void *m;
    PL_CK_OK(pl_harness_create(h, &m));
    panel p;
    panel_synth(&p, 3, 5, 4, 3, 2, 2, true, 12);
    pl_metrics met;
    pl_metrics_reset(&met);
    double loss;
    PL_CK_OK(pl_harness_forward(h, m, &p.b, PL_SPLIT_TRAIN, true, &loss, &met));
    ck_assert_int_eq(met.n, 2);
    ck_assert_str_eq(met.name[0], "loss");
    ck_assert_str_eq(met.name[1], "mse");
    ck_assert_double_eq(met.count[0], 15);
    ck_assert_double_eq(met.count[1], 15);
    ck_assert_double_eq_tol(pl_metrics_get(&met, "loss"), loss, 1e-6);
    /* the rank term is in [0, 2] per day, weighted 2 */
    double rank_part = loss - pl_metrics_get(&met, "mse");
    ck_assert_msg(rank_part >= 0 && rank_part <= 4, "rank term %g", rank_part);
    panel_free(&p);
    pl_harness_destroy(h, m);
    pl_harness_free(h);
}
END_TEST

/* graph = false needs no edges; graph = true refuses a batch without them. */
START_TEST(batch_needs_follow_the_graph_option) {
    pl_harness *h = pl_harness_new("model", "stock_gat", "graph = false\nhidden = 4\n");
    ck_assert_msg(h != NULL, "%s", pl_error_message());
    panel_meta(pl_harness_ctx(h)->meta, 5, 4, 3, 0, 3);
    void *m;
    PL_CK_OK(pl_harness_create(h, &m));
    panel p;
    panel_synth(&p, 3, 5, 4, 3, 0, 2, false, 3);
    PL_CK_OK(pl_harness_check_batch(h, &p.b, PL_SPLIT_VAL));
    double loss;
    PL_CK_OK(pl_harness_forward(h, m, &p.b, PL_SPLIT_VAL, false, &loss, NULL));
    pl_harness_destroy(h, m);
    pl_harness_free(h);
    h = pl_harness_new("model", "stock_gat", "graph = true\nhidden = 4\n");
    ck_assert_msg(h != NULL, "%s", pl_error_message());
    ck_assert_int_eq(pl_harness_check_batch(h, &p.b, PL_SPLIT_TRAIN), PL_ERR_INVALID);
    ck_assert_msg(strstr(pl_error_message(), "edge_src") != NULL, "%s", pl_error_message());
    pl_harness_free(h);
    panel_free(&p);
}
END_TEST

/* A few hundred adamw steps on one batch whose next-day return is the last
 * day's feature 0: the model's daily IC on it goes from chance to near 1
 * (the whole path learns: encoder, GAT, head, rank loss). */
START_TEST(learns_a_cross_sectional_signal) {
    pl_harness *h = pl_harness_new("model", "stock_gat",
                                   "hidden = 8\nheads = 2\ngat_hidden = 4\ndropout = 0\n"
                                   "rank_loss_weight = 1\n");
    ck_assert_msg(h != NULL, "%s", pl_error_message());
    const int64_t D = 8, S = 6, W = 4, F = 3;
    panel_meta(pl_harness_ctx(h)->meta, S, W, F, 0, D);
    void *m, *opt;
    PL_CK_OK(pl_harness_create(h, &m));
    pl_harness *oh =
        pl_harness_new_shared(h, "optimizer", "adamw", "lr = 0.01\nweight_decay = 0\n");
    ck_assert_msg(oh != NULL, "%s", pl_error_message());
    PL_CK_OK(pl_harness_create(oh, &opt));
    panel p;
    panel_synth(&p, D, S, W, F, 0, 2, true, 77);
    const float *x = pl_tensor_f32(pl_batch_get(&p.b, "x"));
    float *y = pl_tensor_f32(pl_batch_get(&p.b, "y")),
          *ret = pl_tensor_f32(pl_batch_get(&p.b, "ret"));
    for (int64_t d = 0; d < D; d++) {
        double mu = 0, ss = 0;
        for (int64_t s = 0; s < S; s++) {
            int64_t i = d * S + s;
            ret[i] = 0.01f * x[(i * W + W - 1) * F];
            mu += ret[i] / (double)S;
        }
        for (int64_t s = 0; s < S; s++)
            ss += (ret[d * S + s] - mu) * (ret[d * S + s] - mu);
        for (int64_t s = 0; s < S; s++)
            y[d * S + s] = (float)((ret[d * S + s] - mu) / sqrt(ss / (double)(S - 1)));
    }
    pl_metrics before, after;
    pl_metrics_reset(&before);
    pl_metrics_reset(&after);
    double l0, l1;
    PL_CK_OK(pl_harness_forward(h, m, &p.b, PL_SPLIT_TRAIN, false, &l0, &before));
    for (int step = 0; step < 300; step++)
        PL_CK_OK(pl_harness_train_step(h, m, oh, opt, &p.b, &l1));
    PL_CK_OK(pl_harness_forward(h, m, &p.b, PL_SPLIT_TRAIN, false, &l1, &after));
    double ic0 = pl_metrics_get(&before, "ic"), ic1 = pl_metrics_get(&after, "ic");
    ck_assert_msg(ic1 > 0.9 && l1 < 0.2 * l0, "ic %.3f -> %.3f, loss %.4g -> %.4g", ic0, ic1, l0,
                  l1);
    ck_assert_msg(pl_metrics_get(&after, "sharpe") > 0, "sharpe %g",
                  pl_metrics_get(&after, "sharpe"));
    panel_free(&p);
    pl_harness_destroy(oh, opt);
    pl_harness_free(oh);
    pl_harness_destroy(h, m);
    pl_harness_free(h);
}
END_TEST

START_TEST(options_and_defaults_are_the_specs) {
    const pl_plugin_desc *d = pl_plugin_entry();
    ck_assert_str_eq(d->name, "stock_gat");
    ck_assert_int_eq(d->kind, PL_KIND_MODEL);
    const char *want[][2] = {{"hidden", "32"},
                             {"encoder_layers", "1"},
                             {"graph", "true"},
                             {"gat_layers", "1"},
                             {"heads", "4"},
                             {"gat_hidden", "8"},
                             {"dropout", "0.1"},
                             {"attn_dropout", "0"},
                             {"head_hidden", "0"},
                             {"revin", "false"},
                             {"rank_loss_weight", "0"},
                             {"long_short", "5"}};
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        const pl_option_spec *o = d->options;
        while (o->name && strcmp(o->name, want[i][0]))
            o++;
        ck_assert_msg(o->name != NULL, "option %s missing", want[i][0]);
        ck_assert_str_eq(o->default_value, want[i][1]);
    }
}
END_TEST

/* A loader that serves another task, or a revin_channel past the features, is refused at create. */
START_TEST(create_refuses_what_it_cannot_honour) {
    pl_harness *h = pl_harness_new("model", "stock_gat", "revin = true\nrevin_channel = 3\n");
    ck_assert_msg(h != NULL, "%s", pl_error_message());
    panel_meta(pl_harness_ctx(h)->meta, 5, 4, 3, 0, 3);
    void *m = NULL;
    ck_assert_int_eq(pl_harness_create(h, &m), PL_ERR_CONFIG);
    ck_assert_msg(strstr(pl_error_message(), "revin_channel") != NULL, "%s", pl_error_message());
    pl_harness_free(h);
    h = pl_harness_new("model", "stock_gat", NULL);
    panel_meta(pl_harness_ctx(h)->meta, 5, 4, 3, 0, 3);
    PL_CK_OK(pl_meta_set_str(pl_harness_ctx(h)->meta, "task", "graph_regression"));
    ck_assert_int_eq(pl_harness_create(h, &m), PL_ERR_CONFIG);
    ck_assert_msg(strstr(pl_error_message(), "stock_ranking") != NULL, "%s", pl_error_message());
    pl_harness_free(h);
}
END_TEST

int main(void) {
    Suite *s = suite_create("stock_gat");
    TCase *tc = tcase_create("stock_gat");
    tcase_add_test(tc, full_model_matches_pytorch);
    tcase_add_test(tc, graph_model_matches_pytorch);
    tcase_add_test(tc, encoder_only_model_matches_pytorch);
    tcase_add_test(tc, gradients_match_finite_differences_with_graph_and_revin);
    tcase_add_test(tc, gradients_match_finite_differences_with_graph);
    tcase_add_test(tc, gradients_match_finite_differences_with_revin);
    tcase_add_test(tc, gradients_match_finite_differences_encoder_only);
    tcase_add_test(tc, metrics_match_numpy_with_ties_and_constant_days);
    tcase_add_test(tc, average_ranks_share_tied_positions);
    tcase_add_test(tc, evaluation_reports_the_split_statistics_in_order);
    tcase_add_test(tc, evaluation_needs_the_whole_split_in_one_batch);
    tcase_add_test(tc, training_reports_loss_and_mse_per_node);
    tcase_add_test(tc, batch_needs_follow_the_graph_option);
    tcase_add_test(tc, learns_a_cross_sectional_signal);
    tcase_add_test(tc, options_and_defaults_are_the_specs);
    tcase_add_test(tc, create_refuses_what_it_cannot_honour);
    suite_add_tcase(s, tc);
    return pl_test_run(s);
}
