/* test_lstm.c - the lstm model plugin against torch.nn.LSTM + nn.Linear
 * (reference data from tools/gen_lstm_model_reference.py; with RevIN, input
 * differencing and the naive skip from gen_revin_reference.py), numerical
 * gradients of the training forward (dropout on), the stateful carry and
 * the evaluation metrics in original units. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "../../../tests/data/lstm_model/lstm_model_reference.h"
#include "lstm.h"
#include "pl_test.h"
#include "revin_reference.h"
#include "pipeline/testing.h"

const pl_plugin_desc *pl_plugin_entry(void);

typedef struct fixture {
    pl_run_context ctx;
    lstm_model *m;
} fixture;

static lstm_opts base_opts(void) {
    lstm_opts o = {.input_size = LSTM_REF_MF, .hidden_size = LSTM_REF_MH, .output_size = 1,
                   .num_layers = 2, .head = LSTM_HEAD_LAST, .loss = LSTM_LOSS_MSE, .huber_delta = 1.0,
                   .horizon = 1, .input_field = "x", .target_field = "y"};
    for (int i = 0; i < LSTM_MAX_OUT; i++) o.scale[i] = 1.0;
    return o;
}

static void fx_init(fixture *f, const lstm_opts *o) {
    memset(f, 0, sizeof *f);
    f->ctx.device = PL_CPU;
    f->ctx.seed = 11;
    f->ctx.params = pl_params_new();
    f->ctx.meta = pl_meta_new();
    PL_CK_OK(lstm_model_new(o, &f->ctx, &f->m));
}

static void fx_free(fixture *f) {
    lstm_model_free(f->m);
    pl_params_free(f->ctx.params);
    pl_meta_free(f->ctx.meta);
}

static void expect_close(const pl_tensor *t, const float *ref, int64_t n, double tol, const char *what) {
    ck_assert_msg(t != NULL, "%s: no tensor (%s)", what, pl_error_message());
    ck_assert_int_eq(pl_tensor_numel(t), n);
    for (int64_t i = 0; i < n; i++) {
        double a = pl_tensor_get(t, i);
        ck_assert_msg(fabs(a - ref[i]) <= tol, "%s[%lld]: got %.7g, torch %.7g", what, (long long)i, a,
                      (double)ref[i]);
    }
}

static void check_reference(bool bidir, lstm_head head, int64_t out_size, const lstm_ref_param *ps,
                            const float *r, const float *pred_ref, const float *dx_ref, int64_t n_pred) {
    lstm_opts o = base_opts();
    o.bidirectional = bidir;
    o.head = head;
    o.output_size = out_size;
    o.dropout = 0.5; /* eval: no effect */
    fixture f;
    fx_init(&f, &o);
    int n = 0;
    for (const lstm_ref_param *p = ps; p->name; p++, n++) {
        pl_param *q = pl_params_find(f.ctx.params, p->name);
        ck_assert_msg(q != NULL, "parameter %s missing", p->name);
        ck_assert_int_eq(pl_tensor_numel(q->t), p->n);
        memcpy(pl_tensor_f32(q->t), p->value, sizeof(float) * (size_t)p->n);
    }
    ck_assert_int_eq(n, pl_params_count(f.ctx.params));
    pl_tensor *x = pl_tensor_from_data(PL_F32, PL_SHAPE(LSTM_REF_MB, LSTM_REF_MT, LSTM_REF_MF), lstm_ref_mx,
                                       PL_CPU);
    pl_tensor_set_requires_grad(x, true);
    pl_frame_begin();
    pl_tensor *pred = lstm_predict(f.m, x, false);
    expect_close(pred, pred_ref, n_pred, 1e-5, "pred");
    pl_tensor *rt = pl_tensor_from_data(PL_F32, pred->ndim, pred->shape, r, PL_CPU);
    PL_CK_OK(pl_backward(pl_sum(pl_mul(pred, rt), PL_ALL_DIMS, false), 1.0));
    pl_frame_end();
    expect_close(x->grad, dx_ref, LSTM_REF_MB * LSTM_REF_MT * LSTM_REF_MF, 1e-4, "dx");
    for (const lstm_ref_param *p = ps; p->name; p++)
        expect_close(pl_params_find(f.ctx.params, p->name)->t->grad, p->grad, p->n, 1e-4, p->name);
    pl_tensor_release(x);
    fx_free(&f);
}

START_TEST(bidirectional_two_layers_last_step_matches_torch) {
    check_reference(true, LSTM_HEAD_LAST, 2, lstm_ref_bi_last_params, lstm_ref_bi_last_r,
                    lstm_ref_bi_last_pred, lstm_ref_bi_last_dx, LSTM_REF_MB * 2);
}
END_TEST

START_TEST(two_layers_every_step_head_matches_torch) {
    check_reference(false, LSTM_HEAD_ALL, 1, lstm_ref_uni_all_params, lstm_ref_uni_all_r,
                    lstm_ref_uni_all_pred, lstm_ref_uni_all_dx, LSTM_REF_MB * LSTM_REF_MT);
}
END_TEST

/* ---- training forward through the plugin vtable ---------------------------------- */

typedef struct series_batch {
    pl_tensor *x, *y;
    pl_batch b;
} series_batch;

static void batch_init(series_batch *s, int64_t B, int64_t T, int64_t F, int64_t ny, uint64_t seed) {
    s->x = pl_test_randn(PL_SHAPE(B, T, F), seed);
    s->y = pl_test_randn(PL_SHAPE(B, ny, 1), seed + 1);
    memset(&s->b, 0, sizeof s->b);
    s->b.n = 2;
    s->b.names[0] = "x";
    s->b.fields[0] = s->x;
    s->b.names[1] = "y";
    s->b.fields[1] = s->y;
    s->b.size = B;
}

static void batch_free(series_batch *s) {
    pl_tensor_release(s->x);
    pl_tensor_release(s->y);
}

typedef struct gc_ctx {
    fixture *f;
    series_batch *s;
} gc_ctx;

static pl_tensor *train_loss(pl_tensor **in, int n, void *p) {
    gc_ctx *c = p;
    const pl_model_vtable *vt = pl_plugin_entry()->vtable;
    pl_tensor *loss = NULL;
    if (vt->forward(c->f->m, &c->s->b, PL_SPLIT_TRAIN, true, &loss, NULL)) return NULL;
    return loss;
}

/* Finite differences of the training forward w.r.t. x (when given) and
 * every parameter of f, which must number n_params. */
static void gradcheck_training_forward(fixture *f, series_batch *s, pl_tensor *x, int n_params) {
    pl_tensor *ins[40];
    int n = 0;
    if (x) ins[n++] = x;
    for (int i = 0; i < pl_params_count(f->ctx.params); i++)
        ins[n++] = pl_params_at(f->ctx.params, i)->t;
    ck_assert_int_eq(n, (x ? 1 : 0) + n_params);
    gc_ctx c = {f, s};
    char msg[512];
    ck_assert_msg(pl_gradcheck(train_loss, ins, n, &c, 1e-3, 1e-3, 1e-2, msg, sizeof msg), "%s",
                  msg);
}

/* head.weight = 0, head.bias = bias: the network outputs bias everywhere. */
static void set_constant_head(fixture *f, double bias) {
    PL_CK_OK(pl_tensor_fill_(pl_params_find(f->ctx.params, "head.weight")->t, 0.0));
    PL_CK_OK(pl_tensor_fill_(pl_params_find(f->ctx.params, "head.bias")->t, bias));
}

START_TEST(training_forward_gradients_match_finite_differences) {
    lstm_opts o = base_opts();
    o.hidden_size = 3;
    o.bidirectional = true;
    o.dropout = 0.3;
    o.loss = LSTM_LOSS_HUBER;
    o.huber_delta = 0.5;
    o.output_size = 2;
    o.horizon = 2;
    fixture f;
    fx_init(&f, &o);
    f.ctx.micro_step = 4; /* fixed dropout masks */
    series_batch s;
    batch_init(&s, 3, 4, LSTM_REF_MF, 2, 99);
    pl_tensor_set_requires_grad(s.x, true);
    gradcheck_training_forward(&f, &s, s.x, 2 * 2 * 4 + 2);
    batch_free(&s);
    fx_free(&f);
}
END_TEST

START_TEST(dropout_masks_follow_the_micro_step) {
    lstm_opts o = base_opts();
    o.dropout = 0.5;
    fixture f;
    fx_init(&f, &o);
    series_batch s;
    batch_init(&s, 4, 6, LSTM_REF_MF, 1, 5);
    const pl_model_vtable *vt = pl_plugin_entry()->vtable;
    int64_t steps[3] = {9, 9, 10};
    double v[3];
    pl_no_grad_begin();
    for (int i = 0; i < 3; i++) {
        f.ctx.micro_step = steps[i];
        pl_frame_begin();
        pl_tensor *loss = NULL;
        PL_CK_OK(vt->forward(f.m, &s.b, PL_SPLIT_TRAIN, true, &loss, NULL));
        v[i] = pl_tensor_item(loss);
        pl_frame_end();
    }
    pl_no_grad_end();
    ck_assert_msg(v[0] == v[1], "same step, different loss: %.9g vs %.9g", v[0], v[1]);
    ck_assert_msg(v[0] != v[2], "dropout masks did not change with the step (%.9g)", v[0]);
    batch_free(&s);
    fx_free(&f);
}
END_TEST

/* A 2T-step sequence in one batch equals two T-step batches with the
 * state carried (forward direction, every-step head). */
START_TEST(stateful_carry_continues_the_sequence) {
    lstm_opts o = base_opts();
    o.head = LSTM_HEAD_ALL;
    o.stateful = true;
    fixture f;
    fx_init(&f, &o);
    int64_t B = 2, T = 4;
    pl_tensor *full = pl_test_randn(PL_SHAPE(B, 2 * T, LSTM_REF_MF), 3);
    pl_frame_begin();
    lstm_reset_state(f.m);
    pl_tensor *ref = lstm_predict(f.m, full, false); /* [B, 2T, 1] */
    lstm_reset_state(f.m);
    pl_tensor *p1 = lstm_predict(f.m, pl_contiguous(pl_tensor_narrow(full, 1, 0, T)), false);
    pl_tensor *p2 = lstm_predict(f.m, pl_contiguous(pl_tensor_narrow(full, 1, T, T)), false);
    ck_assert_ptr_nonnull(p1);
    ck_assert_ptr_nonnull(p2);
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++) {
            ck_assert_double_eq_tol(pl_tensor_get(p1, b * T + t), pl_tensor_get(ref, b * 2 * T + t), 1e-6);
            ck_assert_double_eq_tol(pl_tensor_get(p2, b * T + t), pl_tensor_get(ref, b * 2 * T + T + t), 1e-6);
        }
    /* without the carry the second half differs */
    lstm_reset_state(f.m);
    pl_tensor *p2z = lstm_predict(f.m, pl_contiguous(pl_tensor_narrow(full, 1, T, T)), false);
    ck_assert(fabs(pl_tensor_get(p2z, 0) - pl_tensor_get(p2, 0)) > 1e-6);
    pl_frame_end();
    pl_tensor_release(full);
    fx_free(&f);
}
END_TEST

/* With a zero head weight the prediction is the head bias c everywhere, so
 * every metric is known in closed form. Targets are de-standardized with
 * y = 10 * y_std + 100; the naive forecast reads input column 1 at
 * T - period (horizon 1). Two batches check that rmse is sqrt(total sse / n). */
START_TEST(eval_metrics_in_original_units) {
    lstm_opts o = base_opts();
    o.num_layers = 1;
    o.shift[0] = 100;
    o.scale[0] = 10;
    o.seasonal_period = 3;
    o.naive_column = 1;
    fixture f;
    fx_init(&f, &o);
    set_constant_head(&f, 0.5);
    const pl_model_vtable *vt = pl_plugin_entry()->vtable;
    int64_t B = 3, T = 5;
    pl_metrics m;
    pl_metrics_reset(&m);
    double ae = 0, se = 0, ape = 0, nae = 0, l2 = 0;
    int n = 0;
    for (int k = 0; k < 2; k++) {
        series_batch s;
        batch_init(&s, B, T, LSTM_REF_MF, 1, 40 + (uint64_t)k);
        s.b.index = k;
        float *y = pl_tensor_f32(s.y);
        const float *x = pl_tensor_f32(s.x);
        for (int64_t b = 0; b < B; b++) {
            y[b] *= (float)(k + 1); /* second batch: larger errors */
            double e = (0.5 - y[b]) * 10, yv = y[b] * 10 + 100;
            ae += fabs(e);
            se += e * e;
            ape += fabs(e) / fabs(yv);
            l2 += (0.5 - y[b]) * (0.5 - y[b]);
            nae += fabs((x[(b * T + T - 3) * LSTM_REF_MF + 1] * 10 + 100) - yv);
            n++;
        }
        pl_no_grad_begin();
        pl_frame_begin();
        pl_tensor *loss = NULL;
        PL_CK_OK(vt->forward(f.m, &s.b, PL_SPLIT_VAL, false, &loss, &m));
        pl_frame_end();
        pl_no_grad_end();
        batch_free(&s);
    }
    ck_assert_double_eq_tol(pl_metrics_get(&m, "loss"), l2 / n, 1e-5);
    ck_assert_double_eq_tol(pl_metrics_get(&m, "mae"), ae / n, 1e-4);
    ck_assert_double_eq_tol(pl_metrics_get(&m, "rmse"), sqrt(se / n), 1e-4);
    ck_assert_double_eq_tol(pl_metrics_get(&m, "mape"), 100 * ape / n, 1e-4);
    ck_assert_double_eq_tol(pl_metrics_get(&m, "seasonal_naive_mae"), nae / n, 1e-4);
    fx_free(&f);
}
END_TEST

/* naive_skip with a zero head: the forecast is the seasonal-naive one, so
 * the model's mae equals seasonal_naive_mae and pred = x[:, T - period, col]. */
START_TEST(naive_skip_adds_the_seasonal_naive_forecast) {
    lstm_opts o = base_opts();
    o.num_layers = 1;
    o.shift[0] = 3;
    o.scale[0] = 2;
    o.seasonal_period = 2;
    o.naive_column = 2;
    o.naive_skip = true;
    fixture f;
    fx_init(&f, &o);
    set_constant_head(&f, 0.0);
    int64_t B = 4, T = 6;
    series_batch s;
    batch_init(&s, B, T, LSTM_REF_MF, 1, 77);
    const pl_model_vtable *vt = pl_plugin_entry()->vtable;
    pl_metrics m;
    pl_metrics_reset(&m);
    pl_no_grad_begin();
    pl_frame_begin();
    pl_tensor *pred = lstm_predict(f.m, s.x, false);
    for (int64_t b = 0; b < B; b++)
        ck_assert_double_eq_tol(pl_tensor_get(pred, b), pl_tensor_get(s.x, (b * T + T - 2) * LSTM_REF_MF + 2), 1e-7);
    pl_tensor *loss = NULL;
    PL_CK_OK(vt->forward(f.m, &s.b, PL_SPLIT_TEST, false, &loss, &m));
    pl_frame_end();
    pl_no_grad_end();
    ck_assert_double_eq_tol(pl_metrics_get(&m, "mae"), pl_metrics_get(&m, "seasonal_naive_mae"), 1e-6);
    batch_free(&s);
    fx_free(&f);
}
END_TEST

/* The corrected seasonal naive forecast y[t-s] + (y[t-1] - y[t-1-s]) on one
 * window written by hand: period 2, target in input column 1 holding
 * 1, 4, 2, 7, 3 (standardized; original = 10 v + 100) and the next value 8.5.
 * Seasonal naive: y[t-2] = 7 -> 170 vs 185: |15|. Corrected: 7 + (3 - 2) = 8
 * -> 180: |5|. naive_skip = corrected with a zero head forecasts 180 (mae 5),
 * naive_skip = true forecasts 170 (mae 15). */
START_TEST(corrected_seasonal_naive_matches_a_hand_computed_window) {
    const float col[5] = {1, 4, 2, 7, 3};
    for (int mode = 0; mode < 3; mode++) { /* naive_skip false, true, corrected */
        lstm_opts o = base_opts();
        o.num_layers = 1;
        o.shift[0] = 100;
        o.scale[0] = 10;
        o.seasonal_period = 2;
        o.naive_column = 1;
        o.naive_skip = mode > 0;
        o.skip_corrected = mode == 2;
        fixture f;
        fx_init(&f, &o);
        set_constant_head(&f, 0.0);
        series_batch s;
        batch_init(&s, 1, 5, LSTM_REF_MF, 1, 5);
        float *x = pl_tensor_f32(s.x);
        for (int t = 0; t < 5; t++)
            x[t * LSTM_REF_MF + 1] = col[t];
        pl_tensor_f32(s.y)[0] = 8.5f;
        const pl_model_vtable *vt = pl_plugin_entry()->vtable;
        pl_metrics m;
        pl_metrics_reset(&m);
        pl_no_grad_begin();
        pl_frame_begin();
        pl_tensor *loss = NULL;
        PL_CK_OK(vt->forward(f.m, &s.b, PL_SPLIT_TEST, false, &loss, &m));
        if (mode > 0)
            ck_assert_double_eq_tol(pl_tensor_get(lstm_predict(f.m, s.x, false), 0),
                                    mode == 2 ? 8.0 : 7.0, 1e-6);
        pl_frame_end();
        pl_no_grad_end();
        ck_assert_double_eq_tol(pl_metrics_get(&m, "seasonal_naive_mae"), 15.0, 1e-4);
        ck_assert_double_eq_tol(pl_metrics_get(&m, "seasonal_naive_corrected_mae"), 5.0, 1e-4);
        if (mode > 0)
            ck_assert_double_eq_tol(pl_metrics_get(&m, "mae"), mode == 2 ? 5.0 : 15.0, 1e-4);
        batch_free(&s);
        fx_free(&f);
    }
}
END_TEST

/* naive_skip = auto starts from the baseline with the lower training-window
 * MAE the loader published (hdf5_series naive_period; its test computes the
 * two figures by hand): corrected when it is lower, the seasonal naive when
 * it is lower or tied; the choice lands in the run's meta. Without the
 * figures, or measured with another period, the model is refused. */
START_TEST(naive_skip_auto_takes_the_baseline_with_the_lower_training_mae) {
    const struct {
        double nae, cae;
        bool corrected;
    } cases[] = {{2.0, 0.0, true}, {1.0 / 3.0, 1.0, false}, {0.5, 0.5, false}};
    const pl_model_vtable *vt = pl_plugin_entry()->vtable;
    for (int i = 0; i < 3; i++) {
        pl_harness *h =
            PL_CK_NOTNULL(pl_harness_new("model", "lstm",
                                         "input_size = 3\nhidden_size = 4\nseasonal_period = 2\n"
                                         "naive_skip = auto\n"));
        pl_run_context *ctx = pl_harness_ctx(h);
        PL_CK_OK(pl_meta_set_int(ctx->meta, "naive_period", 2));
        PL_CK_OK(pl_meta_set_float(ctx->meta, "train_seasonal_naive_mae", cases[i].nae));
        PL_CK_OK(pl_meta_set_float(ctx->meta, "train_seasonal_naive_corrected_mae", cases[i].cae));
        void *self = NULL;
        PL_CK_OK(vt->create(pl_harness_section(h), ctx, &self));
        const lstm_model *m = self;
        ck_assert(m->o.naive_skip);
        ck_assert_int_eq(m->o.skip_corrected, cases[i].corrected);
        const char *chosen = pl_meta_get_str(ctx->meta, "naive_skip_auto");
        ck_assert_str_eq(chosen ? chosen : "(none)", cases[i].corrected ? "corrected" : "true");
        vt->destroy(self);
        pl_harness_free(h);
    }
    for (int i = 0; i < 2; i++) { /* no figures; figures for period 3 */
        pl_harness *h =
            PL_CK_NOTNULL(pl_harness_new("model", "lstm",
                                         "input_size = 3\nhidden_size = 4\nseasonal_period = 2\n"
                                         "naive_skip = auto\n"));
        pl_run_context *ctx = pl_harness_ctx(h);
        if (i == 1) {
            PL_CK_OK(pl_meta_set_int(ctx->meta, "naive_period", 3));
            PL_CK_OK(pl_meta_set_float(ctx->meta, "train_seasonal_naive_mae", 1));
            PL_CK_OK(pl_meta_set_float(ctx->meta, "train_seasonal_naive_corrected_mae", 2));
        }
        void *self = NULL;
        ck_assert_int_ne(vt->create(pl_harness_section(h), ctx, &self), PL_OK);
        const char *msg = pl_error_message();
        ck_assert_msg(strstr(msg, "naive_skip = auto") &&
                          strstr(msg, i == 0 ? "train_seasonal_naive_mae" : "naive_period = 3"),
                      "%s", msg);
        pl_harness_free(h);
    }
}
END_TEST

START_TEST(target_shape_mismatch_is_refused) {
    lstm_opts o = base_opts();
    o.output_size = 2;
    fixture f;
    fx_init(&f, &o);
    series_batch s;
    batch_init(&s, 2, 3, LSTM_REF_MF, 1, 1); /* y has 1 value per row, the head makes 2 */
    const pl_model_vtable *vt = pl_plugin_entry()->vtable;
    pl_frame_begin();
    pl_tensor *loss = NULL;
    ck_assert_int_eq(vt->forward(f.m, &s.b, PL_SPLIT_TRAIN, true, &loss, NULL), PL_ERR_SHAPE);
    ck_assert_msg(strstr(pl_error_message(), "needs 4") != NULL, "%s", pl_error_message());
    pl_frame_end();
    batch_free(&s);
    fx_free(&f);
}
END_TEST

/* ---- RevIN, input differencing ---------------------------------------------------- */

static lstm_opts revin_opts(lstm_revin mode, bool affine, int layers, bool bidir, int64_t diff,
                            int64_t horizon, int64_t col) {
    lstm_opts o = base_opts();
    o.input_size = REVIN_REF_F;
    o.hidden_size = REVIN_REF_H;
    o.num_layers = layers;
    o.bidirectional = bidir;
    o.output_size = o.horizon = horizon;
    o.revin = mode;
    o.revin_affine = affine;
    o.revin_eps = REVIN_REF_EPS;
    o.input_diff = diff;
    o.seasonal_period = REVIN_REF_PERIOD;
    o.naive_column = col;
    o.naive_skip = true;
    return o;
}

static void check_revin_reference(const lstm_opts *o, const revin_ref_param *ps, const float *r,
                                  const float *pred_ref, const float *dx_ref) {
    fixture f;
    fx_init(&f, o);
    int n = 0;
    for (const revin_ref_param *p = ps; p->name; p++, n++) {
        pl_param *q = pl_params_find(f.ctx.params, p->name);
        ck_assert_msg(q != NULL, "parameter %s missing", p->name);
        ck_assert_int_eq(pl_tensor_numel(q->t), p->n);
        memcpy(pl_tensor_f32(q->t), p->value, sizeof(float) * (size_t)p->n);
    }
    ck_assert_int_eq(n, pl_params_count(f.ctx.params));
    pl_tensor *x = pl_tensor_from_data(PL_F32, PL_SHAPE(REVIN_REF_B, REVIN_REF_T, REVIN_REF_F),
                                       revin_ref_x, PL_CPU);
    pl_tensor_set_requires_grad(x, true);
    pl_frame_begin();
    pl_tensor *pred = lstm_predict(f.m, x, false);
    expect_close(pred, pred_ref, REVIN_REF_B * o->horizon, 1e-4, "pred");
    pl_tensor *rt = pl_tensor_from_data(PL_F32, pred->ndim, pred->shape, r, PL_CPU);
    PL_CK_OK(pl_backward(pl_sum(pl_mul(pred, rt), PL_ALL_DIMS, false), 1.0));
    pl_frame_end();
    /* dx with the statistics detached (RevIN) */
    expect_close(x->grad, dx_ref, REVIN_REF_B * REVIN_REF_T * REVIN_REF_F, 1e-4, "dx");
    for (const revin_ref_param *p = ps; p->name; p++)
        expect_close(pl_params_find(f.ctx.params, p->name)->t->grad, p->grad, p->n, 1e-4, p->name);
    pl_tensor_release(x);
    fx_free(&f);
}

START_TEST(revin_std_affine_naive_skip_matches_torch) {
    lstm_opts o = revin_opts(LSTM_REVIN_STD, true, REVIN_REF_STD_AFFINE_LAYERS,
                             REVIN_REF_STD_AFFINE_BIDIR, REVIN_REF_STD_AFFINE_DIFF,
                             REVIN_REF_STD_AFFINE_HORIZON, REVIN_REF_STD_AFFINE_COL);
    check_revin_reference(&o, revin_ref_std_affine_params, revin_ref_std_affine_r,
                          revin_ref_std_affine_pred, revin_ref_std_affine_dx);
}
END_TEST

START_TEST(revin_mean_input_diff_bidirectional_matches_torch) {
    lstm_opts o =
        revin_opts(LSTM_REVIN_MEAN, false, REVIN_REF_MEAN_DIFF_LAYERS, REVIN_REF_MEAN_DIFF_BIDIR,
                   REVIN_REF_MEAN_DIFF_DIFF, REVIN_REF_MEAN_DIFF_HORIZON, REVIN_REF_MEAN_DIFF_COL);
    check_revin_reference(&o, revin_ref_mean_diff_params, revin_ref_mean_diff_r,
                          revin_ref_mean_diff_pred, revin_ref_mean_diff_dx);
}
END_TEST

/* With a zero head weight and head bias beta the network outputs beta, so
 * the forecast is known by hand from the window statistics (computed here
 * in double): revin std without naive skip: mean_c + beta * sqrt(var_c + eps);
 * revin mean with naive skip: x[T - period, c] + beta. */
START_TEST(revin_denormalizes_with_the_target_window_statistics) {
    const int64_t B = 3, T = 8, F = LSTM_REF_MF, c = 2, period = 7;
    const double beta = 0.7, eps = 1e-3;
    pl_tensor *x = pl_test_randn(PL_SHAPE(B, T, F), 123);
    float *xv = pl_tensor_f32(x);
    for (int64_t i = 0; i < B * T; i++)
        xv[i * F + c] = 4.0f + 2.5f * xv[i * F + c]; /* level 4, scale 2.5 */
    for (int mode = 0; mode < 2; mode++) {
        lstm_opts o = base_opts();
        o.num_layers = 1;
        o.revin = mode == 0 ? LSTM_REVIN_STD : LSTM_REVIN_MEAN;
        o.revin_eps = eps;
        o.naive_column = c;
        o.seasonal_period = period;
        o.naive_skip = mode == 1;
        fixture f;
        fx_init(&f, &o);
        set_constant_head(&f, beta);
        pl_frame_begin();
        pl_tensor *pred = lstm_predict(f.m, x, false);
        ck_assert_ptr_nonnull(pred);
        for (int64_t b = 0; b < B; b++) {
            double mu = 0, var = 0;
            for (int64_t t = 0; t < T; t++)
                mu += xv[(b * T + t) * F + c] / (double)T;
            for (int64_t t = 0; t < T; t++) {
                double d = xv[(b * T + t) * F + c] - mu;
                var += d * d / (double)T;
            }
            double want =
                mode == 0 ? mu + beta * sqrt(var + eps) : xv[(b * T + T - period) * F + c] + beta;
            ck_assert_msg(fabs(pl_tensor_get(pred, b) - want) < 1e-5,
                          "mode %d row %lld: %.7g, want %.7g", mode, (long long)b,
                          pl_tensor_get(pred, b), want);
        }
        pl_frame_end();
        fx_free(&f);
    }
    pl_tensor_release(x);
}
END_TEST

/* What RevIN is for: a shift of every input feature's level (and, with std,
 * a common scale a > 0) moves the forecast by the target column's shift (and
 * scales it), whatever the weights. Seasonal differencing with the naive
 * skip follows a level shift too; the plain model does not. Modes:
 * 0 revin mean, 1 revin std (a = 2), 2 input_diff 2 only, 3 none. */
START_TEST(revin_forecast_follows_level_and_scale_shifts) {
    const int64_t B = 2, T = 9, F = LSTM_REF_MF, c = 1;
    const float shift[LSTM_REF_MF] = {3.0f, -2.0f, 0.5f};
    for (int mode = 0; mode < 4; mode++) {
        lstm_opts o = base_opts();
        o.revin = mode == 0 ? LSTM_REVIN_MEAN : mode == 1 ? LSTM_REVIN_STD : LSTM_REVIN_OFF;
        o.revin_eps = 1e-9;
        o.input_diff = mode == 2 ? 2 : 0;
        o.naive_column = c;
        o.seasonal_period = 7;
        o.naive_skip = true;
        fixture f;
        fx_init(&f, &o);
        pl_tensor_fill_(pl_params_find(f.ctx.params, "head.bias")->t,
                        0.4); /* a non-zero correction */
        double a = mode == 1 ? 2.0 : 1.0;
        pl_tensor *x = pl_test_randn(PL_SHAPE(B, T, F), 7),
                  *xs = pl_test_randn(PL_SHAPE(B, T, F), 7);
        float *v = pl_tensor_f32(xs);
        for (int64_t i = 0; i < B * T * F; i++)
            v[i] = (float)(a * v[i] + shift[i % F]);
        pl_frame_begin();
        pl_tensor *p0 = lstm_predict(f.m, x, false), *p1 = lstm_predict(f.m, xs, false);
        ck_assert_ptr_nonnull(p0);
        ck_assert_ptr_nonnull(p1);
        for (int64_t b = 0; b < B; b++) {
            double want = a * pl_tensor_get(p0, b) + shift[c], got = pl_tensor_get(p1, b);
            if (mode < 3)
                ck_assert_msg(fabs(got - want) < 1e-5, "mode %d row %lld: %.7g, want %.7g", mode,
                              (long long)b, got, want);
            else
                ck_assert_msg(fabs(got - want) > 1e-3,
                              "without revin the forecast should not follow the shift");
        }
        pl_frame_end();
        pl_tensor_release(x);
        pl_tensor_release(xs);
        fx_free(&f);
    }
}
END_TEST

/* Full training forward (revin std + affine, input_diff, input and
 * feature dropout, naive skip, 2 layers with dropout) vs finite differences w.r.t. every
 * parameter. The input is left out: RevIN detaches its statistics, so the
 * analytic dx omits their dependence on x by design (checked against torch
 * above) while finite differences include it. */
START_TEST(revin_training_forward_gradients_match_finite_differences) {
    lstm_opts o = base_opts();
    o.hidden_size = 3;
    o.dropout = 0.3;
    o.loss = LSTM_LOSS_HUBER; /* smooth: finite differences of L1 are poor near 0 */
    o.revin = LSTM_REVIN_STD;
    o.revin_affine = true;
    o.revin_eps = 1e-5;
    o.input_diff = 2;
    o.seasonal_period = 4;
    o.naive_column = 1;
    o.naive_skip = true;
    o.input_dropout = 0.2;
    o.feature_dropout = 0.3;
    fixture f;
    fx_init(&f, &o);
    f.ctx.micro_step = 6; /* fixed dropout masks */
    /* non-trivial affine so that its gradients are generic */
    float *w = pl_tensor_f32(pl_params_find(f.ctx.params, "revin.affine_weight")->t);
    float *bb = pl_tensor_f32(pl_params_find(f.ctx.params, "revin.affine_bias")->t);
    for (int i = 0; i < LSTM_REF_MF; i++) {
        w[i] = 0.8f + 0.2f * (float)i;
        bb[i] = 0.1f * (float)(i - 1);
    }
    series_batch s;
    batch_init(&s, 3, 6, LSTM_REF_MF, 1, 31);
    gradcheck_training_forward(&f, &s, NULL, 2 * 4 + 2 + 2);
    batch_free(&s);
    fx_free(&f);
}
END_TEST


/* exogenous_gate: at init (gates 0) the forecast does not depend on the
 * other columns at all; the gates get gradients (finite differences of the
 * training loss w.r.t. every parameter incl. input_gate, set non-zero). */
START_TEST(exogenous_gate_starts_from_the_target_history) {
    lstm_opts o = base_opts();
    o.hidden_size = 3;
    o.loss = LSTM_LOSS_HUBER;
    o.seasonal_period = 4;
    o.naive_column = 1;
    o.naive_skip = true;
    o.exogenous_gate = true;
    fixture f;
    fx_init(&f, &o);
    series_batch s;
    batch_init(&s, 3, 6, LSTM_REF_MF, 1, 31);
    pl_no_grad_begin();
    pl_frame_begin();
    pl_tensor *p0 = lstm_predict(f.m, s.x, false);
    /* change every column except the target's: the forecast must not move */
    float *xv = pl_tensor_f32(s.x);
    for (int64_t i = 0; i < pl_tensor_numel(s.x); i++)
        if (i % LSTM_REF_MF != 1) xv[i] += 1.5f;
    pl_tensor *p1 = lstm_predict(f.m, s.x, false);
    ck_assert_msg(p0 && p1, "%s", pl_error_message());
    ck_assert_double_eq(pl_test_max_abs_diff(p0, p1), 0.0);
    pl_frame_end();
    pl_no_grad_end();
    float *g = pl_tensor_f32(pl_params_find(f.ctx.params, "input_gate")->t);
    for (int i = 0; i < LSTM_REF_MF; i++) g[i] = 0.3f - 0.2f * (float)i;
    gradcheck_training_forward(&f, &s, NULL, 2 * 4 + 2 + 1);
    batch_free(&s);
    fx_free(&f);
}
END_TEST

/* feature_dropout drops a feature for all time steps of a window:
 * changing feature 2 at every step leaves exactly the rows where it was
 * dropped unchanged (about half at p = 0.5). Elementwise input_dropout
 * drops single values, so (almost) every row changes. */
START_TEST(feature_dropout_drops_whole_features) {
    const int64_t B = 64, T = 5, F = LSTM_REF_MF;
    for (int kind = 0; kind < 2; kind++) {
        lstm_opts o = base_opts();
        o.num_layers = 1;
        o.feature_dropout = kind == 0 ? 0.5 : 0;
        o.input_dropout = kind == 1 ? 0.5 : 0;
        fixture f;
        fx_init(&f, &o);
        f.ctx.micro_step = 3;
        pl_tensor *x = pl_test_randn(PL_SHAPE(B, T, F), 17),
                  *x2 = pl_test_randn(PL_SHAPE(B, T, F), 17);
        float *v = pl_tensor_f32(x2);
        for (int64_t i = 0; i < B * T; i++)
            v[i * F + 2] += 1.0f;
        pl_no_grad_begin();
        pl_frame_begin();
        pl_tensor *p1 = lstm_predict(f.m, x, true), *p2 = lstm_predict(f.m, x2, true);
        ck_assert_ptr_nonnull(p1);
        ck_assert_ptr_nonnull(p2);
        int same = 0;
        for (int64_t b = 0; b < B; b++)
            same += pl_tensor_get(p1, b) == pl_tensor_get(p2, b);
        if (kind == 0)
            ck_assert_msg(same >= 16 && same <= 48,
                          "feature dropout 0.5: %d of %lld rows unchanged", same, (long long)B);
        else
            ck_assert_msg(same <= 8, "input dropout 0.5: %d of %lld rows unchanged", same,
                          (long long)B);
        /* evaluation: no dropout, every row changes */
        pl_tensor *e1 = lstm_predict(f.m, x, false), *e2 = lstm_predict(f.m, x2, false);
        for (int64_t b = 0; b < B; b++)
            ck_assert(pl_tensor_get(e1, b) != pl_tensor_get(e2, b));
        pl_frame_end();
        pl_no_grad_end();
        pl_tensor_release(x);
        pl_tensor_release(x2);
        fx_free(&f);
    }
}
END_TEST

/* ---- ensemble ------------------------------------------------------------------- */

/* Two members = two single models with the members' weights: the evaluation
 * forecast is their mean and the training loss the mean of their losses.
 * Member 0 starts from the single model's init (same seed); member 1 not. */
START_TEST(ensemble_forecast_is_the_members_mean) {
    lstm_opts o = base_opts();
    o.num_layers = 1;
    o.revin = LSTM_REVIN_MEAN;
    o.revin_eps = 1e-5;
    o.seasonal_period = 3;
    o.naive_column = 0;
    o.naive_skip = true;
    o.loss = LSTM_LOSS_MAE;
    fixture single[2], ens;
    fx_init(&single[0], &o);
    fx_init(&single[1], &o);
    o.ensemble = 2;
    fx_init(&ens, &o);
    ck_assert_int_eq(pl_params_count(ens.ctx.params), 2 * pl_params_count(single[0].ctx.params));
    for (int i = 0; i < pl_params_count(single[0].ctx.params); i++) {
        const pl_param *q = pl_params_at(single[0].ctx.params, i);
        char name[PL_NAME_MAX + 16];
        snprintf(name, sizeof name, "members.0.%s", q->name);
        pl_param *m0 = pl_params_find(ens.ctx.params, name);
        snprintf(name, sizeof name, "members.1.%s", q->name);
        pl_param *m1 = pl_params_find(ens.ctx.params, name);
        ck_assert_msg(m0 && m1, "member parameters of %s missing", q->name);
        ck_assert_msg(pl_test_max_abs_diff(m0->t, q->t) == 0, "%s: member 0 init differs", q->name);
        ck_assert_msg(pl_test_max_abs_diff(m1->t, q->t) > 0, "%s: member 1 init = member 0",
                      q->name);
        /* the second single model gets member 1's weights */
        PL_CK_OK(pl_tensor_copy_(pl_params_at(single[1].ctx.params, i)->t, m1->t));
    }
    series_batch s;
    batch_init(&s, 4, 6, LSTM_REF_MF, 1, 8);
    const pl_model_vtable *vt = pl_plugin_entry()->vtable;
    pl_no_grad_begin();
    pl_frame_begin();
    pl_tensor *pe = lstm_predict(ens.m, s.x, false), *p0 = lstm_predict(single[0].m, s.x, false),
              *p1 = lstm_predict(single[1].m, s.x, false);
    for (int64_t b = 0; b < 4; b++)
        ck_assert_double_eq_tol(pl_tensor_get(pe, b),
                                0.5 * (pl_tensor_get(p0, b) + pl_tensor_get(p1, b)), 1e-6);
    double l[3];
    fixture *fs[3] = {&ens, &single[0], &single[1]};
    for (int i = 0; i < 3; i++) {
        pl_tensor *loss = NULL;
        PL_CK_OK(vt->forward(fs[i]->m, &s.b, PL_SPLIT_TRAIN, true, &loss, NULL));
        l[i] = pl_tensor_item(loss);
    }
    ck_assert_double_eq_tol(l[0], 0.5 * (l[1] + l[2]), 1e-6);
    pl_frame_end();
    pl_no_grad_end();
    batch_free(&s);
    for (int i = 0; i < 3; i++)
        fx_free(fs[i]);
}
END_TEST

START_TEST(ensemble_training_forward_gradients_match_finite_differences) {
    lstm_opts o = base_opts();
    o.hidden_size = 3;
    o.dropout = 0.3;
    o.loss = LSTM_LOSS_HUBER;
    o.revin = LSTM_REVIN_STD;
    o.revin_affine = true;
    o.revin_eps = 1e-5;
    o.seasonal_period = 2;
    o.naive_column = 2;
    o.naive_skip = true;
    o.ensemble = 2;
    fixture f;
    fx_init(&f, &o);
    f.ctx.micro_step = 2;
    series_batch s;
    batch_init(&s, 3, 5, LSTM_REF_MF, 1, 55);
    gradcheck_training_forward(&f, &s, NULL, 2 * (2 * 4 + 2 + 2));
    batch_free(&s);
    fx_free(&f);
}
END_TEST

START_TEST(revin_and_input_diff_misuse_is_refused) {
    pl_run_context ctx = {.device = PL_CPU, .seed = 1};
    ctx.params = pl_params_new();
    lstm_model *m = NULL;
    lstm_opts o = base_opts();
    o.revin = LSTM_REVIN_MEAN;
    o.revin_eps = 1e-5;
    o.head = LSTM_HEAD_ALL; /* per-step head */
    ck_assert_int_eq(lstm_model_new(&o, &ctx, &m), PL_ERR_CONFIG);
    o = base_opts();
    o.revin = LSTM_REVIN_STD;
    o.revin_eps = 1e-5;
    o.output_size = 2; /* two outputs, horizon 1: two targets */
    ck_assert_int_eq(lstm_model_new(&o, &ctx, &m), PL_ERR_CONFIG);
    o = base_opts();
    o.revin = LSTM_REVIN_MEAN;
    o.revin_eps = 1e-5;
    o.stateful = true;
    ck_assert_int_eq(lstm_model_new(&o, &ctx, &m), PL_ERR_CONFIG);
    o = base_opts();
    o.ensemble = 2;
    o.stateful = true;
    ck_assert_int_eq(lstm_model_new(&o, &ctx, &m), PL_ERR_CONFIG);
    o = base_opts();
    o.input_diff = 3;
    o.head = LSTM_HEAD_ALL;
    ck_assert_int_eq(lstm_model_new(&o, &ctx, &m), PL_ERR_CONFIG);
    /* exogenous_gate with only the target column: nothing to gate */
    o = base_opts();
    o.input_size = 1;
    o.exogenous_gate = true;
    ck_assert_int_eq(lstm_model_new(&o, &ctx, &m), PL_ERR_CONFIG);
    ck_assert_msg(strstr(pl_error_message(), "exogenous_gate") != NULL, "%s", pl_error_message());
    /* the gate's target column outside the inputs */
    o = base_opts();
    o.exogenous_gate = true;
    o.naive_column = LSTM_REF_MF;
    ck_assert_int_eq(lstm_model_new(&o, &ctx, &m), PL_ERR_CONFIG);
    ck_assert_msg(strstr(pl_error_message(), "naive_column") != NULL, "%s", pl_error_message());
    /* naive_skip horizon longer than the period */
    o = base_opts();
    o.seasonal_period = 2;
    o.naive_skip = true;
    o.output_size = o.horizon = 3;
    ck_assert_int_eq(lstm_model_new(&o, &ctx, &m), PL_ERR_CONFIG);
    ck_assert_msg(strstr(pl_error_message(), "naive_skip") != NULL, "%s", pl_error_message());
    ck_assert_int_eq(pl_params_count(ctx.params), 0); /* refused before any parameter */
    /* a window not longer than input_diff */
    o = base_opts();
    o.input_diff = 4;
    PL_CK_OK(lstm_model_new(&o, &ctx, &m));
    pl_tensor *x = pl_test_randn(PL_SHAPE(2, 4, LSTM_REF_MF), 1);
    pl_frame_begin();
    ck_assert_ptr_null(lstm_predict(m, x, false));
    ck_assert_msg(strstr(pl_error_message(), "input_diff 4") != NULL, "%s", pl_error_message());
    pl_frame_end();
    pl_tensor_release(x);
    lstm_model_free(m);
    pl_params_free(ctx.params);
}
END_TEST

/* ---- multi-timeframe (multiframe.c) ------------------------------------------------ */

static void copy_param(fixture *dst, const char *dname, fixture *src, const char *sname) {
    pl_param *d = pl_params_find(dst->ctx.params, dname), *s = pl_params_find(src->ctx.params, sname);
    ck_assert_msg(d && s, "%s / %s missing", dname, sname);
    ck_assert_int_eq(pl_tensor_numel(d->t), pl_tensor_numel(s->t));
    memcpy(pl_tensor_f32(d->t), pl_tensor_f32(s->t), sizeof(float) * (size_t)pl_tensor_numel(s->t));
}

/* The head reads [h_x, h_tf4]: with the x_tf4 half of the head zero the
 * forecast is the plain model's (checked against torch above) with the same
 * weights, whatever x_tf4 holds; with the x half zero and x_tf4's encoder a
 * copy of x's, feeding x as x_tf4 gives the plain model's forecast with the
 * second half as its head. */
START_TEST(multi_timeframe_head_joins_the_encoders_last_states) {
    lstm_opts o = base_opts(), om = base_opts();
    ck_assert_int_eq(lstm_mf_parse_fields("x_tf4", &om), PL_OK);
    ck_assert_int_eq(om.n_tf, 1);
    fixture plain, mf;
    fx_init(&plain, &o);
    fx_init(&mf, &om);
    int64_t B = 3, T = 6, Hd = LSTM_REF_MH, F = LSTM_REF_MF;
    pl_param *hw = pl_params_find(mf.ctx.params, "head.weight");
    ck_assert_int_eq(hw->t->shape[1], 2 * Hd);
    const char *names[] = {"weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0",
                           "weight_ih_l1", "weight_hh_l1", "bias_ih_l1", "bias_hh_l1"};
    char a[96], b[96];
    for (int i = 0; i < 8; i++) {
        snprintf(a, sizeof a, "lstm.%s", names[i]);
        copy_param(&mf, a, &plain, a);
        snprintf(b, sizeof b, "x_tf4.lstm.%s", names[i]);
        copy_param(&mf, b, &plain, a);
    }
    copy_param(&mf, "head.bias", &plain, "head.bias");
    const float *pw = pl_tensor_f32(pl_params_find(plain.ctx.params, "head.weight")->t);
    float *mw = pl_tensor_f32(hw->t);
    series_batch s;
    batch_init(&s, B, T, F, 1, 77);
    pl_tensor *x4 = pl_test_randn(PL_SHAPE(B, 4, F), 78);
    s.b.names[2] = "x_tf4";
    s.b.fields[2] = x4;
    s.b.n = 3;
    pl_no_grad_begin();
    for (int half = 0; half < 2; half++) {
        for (int64_t j = 0; j < 2 * Hd; j++)
            mw[j] = (j >= Hd) == half ? pw[j % Hd] : 0.0f;
        if (half) s.b.fields[2] = s.x; /* x as the second timeframe */
        pl_frame_begin();
        pl_tensor *ref = lstm_predict(plain.m, s.x, false);
        pl_tensor *got = lstm_mf_predict(mf.m, &s.b, false);
        ck_assert_msg(got != NULL, "%s", pl_error_message());
        ck_assert_int_eq(pl_tensor_numel(got), B);
        for (int64_t i = 0; i < B; i++)
            ck_assert_double_eq_tol(pl_tensor_get(got, i), pl_tensor_get(ref, i), 1e-6);
        pl_frame_end();
    }
    /* both halves on: x_tf4 matters */
    for (int64_t j = 0; j < 2 * Hd; j++)
        mw[j] = pw[j % Hd];
    pl_frame_begin();
    s.b.fields[2] = x4;
    double p1 = pl_tensor_get(lstm_mf_predict(mf.m, &s.b, false), 0);
    s.b.fields[2] = s.x;
    pl_tensor *xx = pl_slice(s.x, 1, 0, 4);
    s.b.fields[2] = xx;
    double p2 = pl_tensor_get(lstm_mf_predict(mf.m, &s.b, false), 0);
    ck_assert_msg(fabs(p1 - p2) > 1e-6, "x_tf4 ignored (%g, %g)", p1, p2);
    /* a missing timeframe field is named */
    s.b.n = 2;
    ck_assert_ptr_null(lstm_mf_predict(mf.m, &s.b, false));
    ck_assert_msg(strstr(pl_error_message(), "x_tf4"), "%s", pl_error_message());
    pl_frame_end();
    pl_no_grad_end();
    pl_tensor_release(x4);
    batch_free(&s);
    fx_free(&plain);
    fx_free(&mf);
    /* what the path cannot honour is refused */
    om.bidirectional = true;
    lstm_model *m = NULL;
    pl_run_context ctx = {.device = PL_CPU, .params = pl_params_new()};
    ck_assert_int_eq(lstm_model_new(&om, &ctx, &m), PL_ERR_CONFIG);
    ck_assert_msg(strstr(pl_error_message(), "timeframe_fields"), "%s", pl_error_message());
    pl_params_free(ctx.params);
}
END_TEST

/* return_metrics by hand: a zero head forecasts 0.5 (scale 1, shift 0);
 * targets 1, -2, 0, 3; last input value of naive_column 2, 1, -1, 0.
 * persistence_mae = (1 + 2 + 0 + 3) / 4 = 1.5; last_return_mae = (1 + 3 + 1 +
 * 3) / 4 = 2; dir_acc over the 3 non-zero targets: + on 1 and 3 = 2/3;
 * last return: 2 vs 1 right, 1 vs -2 wrong, 0 vs 3 (no direction) wrong = 1/3. */
START_TEST(return_metrics_by_hand) {
    lstm_opts o = base_opts();
    o.num_layers = 1;
    o.naive_column = 1;
    o.return_metrics = true;
    fixture f;
    fx_init(&f, &o);
    set_constant_head(&f, 0.5);
    int64_t B = 4, T = 3, F = LSTM_REF_MF;
    series_batch s;
    batch_init(&s, B, T, F, 1, 5);
    float *y = pl_tensor_f32(s.y), *x = pl_tensor_f32(s.x);
    const float yv[4] = {1, -2, 0, 3}, lv[4] = {2, 1, -1, 0};
    for (int64_t b = 0; b < B; b++) {
        y[b] = yv[b];
        x[(b * T + T - 1) * F + 1] = lv[b];
    }
    pl_metrics m;
    pl_metrics_reset(&m);
    pl_no_grad_begin();
    pl_frame_begin();
    pl_tensor *loss = NULL;
    const pl_model_vtable *vt = pl_plugin_entry()->vtable;
    PL_CK_OK(vt->forward(f.m, &s.b, PL_SPLIT_TEST, false, &loss, &m));
    pl_frame_end();
    pl_no_grad_end();
    ck_assert_double_eq_tol(pl_metrics_get(&m, "persistence_mae"), 1.5, 1e-6);
    ck_assert_double_eq_tol(pl_metrics_get(&m, "last_return_mae"), 2.0, 1e-6);
    ck_assert_double_eq_tol(pl_metrics_get(&m, "dir_acc"), 2.0 / 3, 1e-6);
    ck_assert_double_eq_tol(pl_metrics_get(&m, "last_return_dir_acc"), 1.0 / 3, 1e-6);
    batch_free(&s);
    fx_free(&f);
}
END_TEST

START_TEST(schema_and_descriptor) {
    const pl_plugin_desc *d = pl_plugin_entry();
    ck_assert_str_eq(d->name, "lstm");
    ck_assert_int_eq(d->kind, PL_KIND_MODEL);
    const char *want[] = {
        "hidden_size", "num_layers",    "dropout",         "bidirectional", "head",
        "stateful",    "loss",          "revin",           "revin_affine",  "revin_eps",
        "input_diff",  "input_dropout", "feature_dropout", "ensemble"};
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        bool found = false;
        for (const pl_option_spec *o = d->options; o->name; o++) found |= !strcmp(o->name, want[i]);
        ck_assert_msg(found, "option %s missing", want[i]);
    }
}
END_TEST

int main(void) {
    Suite *s = suite_create("lstm");
    TCase *tc = tcase_create("lstm");
    tcase_add_test(tc, bidirectional_two_layers_last_step_matches_torch);
    tcase_add_test(tc, two_layers_every_step_head_matches_torch);
    tcase_add_test(tc, training_forward_gradients_match_finite_differences);
    tcase_add_test(tc, dropout_masks_follow_the_micro_step);
    tcase_add_test(tc, stateful_carry_continues_the_sequence);
    tcase_add_test(tc, eval_metrics_in_original_units);
    tcase_add_test(tc, naive_skip_adds_the_seasonal_naive_forecast);
    tcase_add_test(tc, corrected_seasonal_naive_matches_a_hand_computed_window);
    tcase_add_test(tc, naive_skip_auto_takes_the_baseline_with_the_lower_training_mae);
    tcase_add_test(tc, target_shape_mismatch_is_refused);
    tcase_add_test(tc, revin_std_affine_naive_skip_matches_torch);
    tcase_add_test(tc, revin_mean_input_diff_bidirectional_matches_torch);
    tcase_add_test(tc, revin_denormalizes_with_the_target_window_statistics);
    tcase_add_test(tc, revin_forecast_follows_level_and_scale_shifts);
    tcase_add_test(tc, revin_training_forward_gradients_match_finite_differences);
    tcase_add_test(tc, exogenous_gate_starts_from_the_target_history);
    tcase_add_test(tc, feature_dropout_drops_whole_features);
    tcase_add_test(tc, ensemble_forecast_is_the_members_mean);
    tcase_add_test(tc, ensemble_training_forward_gradients_match_finite_differences);
    tcase_add_test(tc, revin_and_input_diff_misuse_is_refused);
    tcase_add_test(tc, multi_timeframe_head_joins_the_encoders_last_states);
    tcase_add_test(tc, return_metrics_by_hand);
    tcase_add_test(tc, schema_and_descriptor);
    suite_add_tcase(s, tc);
    return pl_test_run(s);
}
