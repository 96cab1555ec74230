/* test_gat.c - the gat model plugin against PyTorch Geometric's GATConv
 * (reference data from tools/gen_gat_reference.py), numerical gradients of
 * the whole training forward (dropout on), dropout reproducibility and a
 * tiny learning run. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "../../../tests/data/gat/gat_reference.h"
#include "gat.h"
#include "pl_test.h"
#include "pipeline/testing.h"

const pl_plugin_desc *pl_plugin_entry(void);

typedef struct fixture {
    pl_run_context ctx;
    gat_model *m;
} fixture;

static void fx_init(fixture *f, const gat_opts *o) {
    memset(f, 0, sizeof *f);
    f->ctx.device = PL_CPU;
    f->ctx.seed = 7;
    f->ctx.params = pl_params_new();
    f->ctx.meta = pl_meta_new();
    PL_CK_OK(gat_model_new(o, &f->ctx, &f->m));
}

static void fx_free(fixture *f) {
    gat_model_free(f->m);
    pl_params_free(f->ctx.params);
    pl_meta_free(f->ctx.meta);
}

static pl_tensor *param(fixture *f, const char *name) {
    pl_param *p = pl_params_find(f->ctx.params, name);
    ck_assert_msg(p != NULL, "parameter %s missing", name);
    return p->t;
}

static void set_param(fixture *f, const char *name, const float *v, int64_t n) {
    pl_tensor *t = param(f, name);
    ck_assert_int_eq(pl_tensor_numel(t), n);
    memcpy(pl_tensor_f32(t), v, sizeof(float) * (size_t)n);
}

static void expect_close(const pl_tensor *t, const float *ref, int64_t n, double tol, const char *what) {
    ck_assert_msg(t != NULL, "%s: no tensor (%s)", what, pl_error_message());
    ck_assert_int_eq(pl_tensor_numel(t), n);
    for (int64_t i = 0; i < n; i++) {
        double a = pl_tensor_get(t, i);
        ck_assert_msg(fabs(a - ref[i]) <= tol, "%s[%lld]: got %.7g, PyG %.7g", what, (long long)i, a,
                      (double)ref[i]);
    }
}

static gat_opts ref_opts(bool concat, bool residual, bool loops) {
    return (gat_opts){.layers = 1, .hidden = GAT_REF_C, .heads = GAT_REF_H, .output_heads = GAT_REF_H,
                      .negative_slope = 0.2, .concat = concat, .residual = residual,
                      .add_self_loops = loops, .bias = true, .in_features = GAT_REF_F,
                      .num_classes = GAT_REF_C};
}

static pl_tensor *new_i64(const int64_t *v, int64_t n) {
    return pl_tensor_from_data(PL_I64, 1, &n, v, PL_CPU);
}

/* One GATConv case: out and every gradient vs PyG. The plugin's single
 * layer is an output layer (heads averaged); for a concat case we run the
 * layer struct with concat forced on. */
static void check_conv(bool concat, bool residual, bool loops, const float *w, const float *as,
                       const float *ad, const float *bias, const float *res, const float *r,
                       const float *out_ref, const float *gx, const float *gw, const float *gas,
                       const float *gad, const float *gb, const float *gres) {
    gat_opts o = ref_opts(concat, residual, loops);
    fixture f;
    fx_init(&f, &o);
    int64_t HC = GAT_REF_H * GAT_REF_C, total = concat ? HC : GAT_REF_C;
    gat_layer L = f.m->layer[0];
    L.concat = concat;
    if (concat) { /* the model made the bias [C] for an output layer: swap in a [H*C] one */
        pl_tensor *b = pl_tensor_from_data(PL_F32, 1, &total, bias, PL_CPU);
        pl_tensor_set_requires_grad(b, true);
        PL_CK_OK(pl_params_add(f.ctx.params, "test.bias_hc", b, 0, NULL));
        pl_tensor_release(b);
        L.bias = pl_params_count(f.ctx.params) - 1;
        ck_assert(!residual);
    } else {
        set_param(&f, "gat.layers.0.bias", bias, total);
    }
    set_param(&f, "gat.layers.0.lin.weight", w, HC * GAT_REF_F);
    set_param(&f, "gat.layers.0.att_src", as, HC);
    set_param(&f, "gat.layers.0.att_dst", ad, HC);
    if (residual) set_param(&f, "gat.layers.0.res.weight", res, total * GAT_REF_F);

    pl_tensor *x = pl_tensor_from_data(PL_F32, PL_SHAPE(GAT_REF_N, GAT_REF_F), gat_ref_x, PL_CPU);
    pl_tensor_set_requires_grad(x, true);
    pl_tensor *es = new_i64(gat_ref_src, GAT_REF_E), *ed = new_i64(gat_ref_dst, GAT_REF_E);
    pl_tensor *src, *dst;
    PL_CK_OK(gat_edges(f.m, es, ed, GAT_REF_N, &src, &dst));
    ck_assert_int_eq(pl_tensor_numel(src), loops ? GAT_REF_E - 1 + GAT_REF_N : GAT_REF_E);

    pl_frame_begin();
    pl_tensor *out = gat_conv(f.m, &L, x, src, dst, 0.0, 0, false);
    expect_close(out, out_ref, GAT_REF_N * total, 1e-4, "out");
    pl_tensor *rt = pl_tensor_from_data(PL_F32, out->ndim, out->shape, r, PL_CPU);
    pl_tensor *loss = pl_sum(pl_mul(out, rt), PL_ALL_DIMS, false);
    PL_CK_OK(pl_backward(loss, 1.0));
    pl_frame_end();

    expect_close(x->grad, gx, GAT_REF_N * GAT_REF_F, 1e-4, "dx");
    expect_close(param(&f, "gat.layers.0.lin.weight")->grad, gw, HC * GAT_REF_F, 1e-4, "dW");
    expect_close(param(&f, "gat.layers.0.att_src")->grad, gas, HC, 1e-4, "d att_src");
    expect_close(param(&f, "gat.layers.0.att_dst")->grad, gad, HC, 1e-4, "d att_dst");
    expect_close(pl_params_at(f.ctx.params, L.bias)->t->grad, gb, total, 1e-4, "d bias");
    if (residual) expect_close(param(&f, "gat.layers.0.res.weight")->grad, gres, total * GAT_REF_F, 1e-4, "d res");
    pl_tensor_release(x);
    pl_tensor_release(es);
    pl_tensor_release(ed);
    fx_free(&f);
}

START_TEST(gatconv_concat_matches_pyg) {
    check_conv(true, false, true, gat_ref_concat_w, gat_ref_concat_att_src, gat_ref_concat_att_dst,
               gat_ref_concat_bias, NULL, gat_ref_concat_r, gat_ref_concat_out, gat_ref_concat_x_grad,
               gat_ref_concat_w_grad, gat_ref_concat_att_src_grad, gat_ref_concat_att_dst_grad,
               gat_ref_concat_bias_grad, NULL);
}
END_TEST

START_TEST(gatconv_mean_residual_matches_pyg) {
    check_conv(false, true, true, gat_ref_mean_res_w, gat_ref_mean_res_att_src, gat_ref_mean_res_att_dst,
               gat_ref_mean_res_bias, gat_ref_mean_res_res, gat_ref_mean_res_r, gat_ref_mean_res_out,
               gat_ref_mean_res_x_grad, gat_ref_mean_res_w_grad, gat_ref_mean_res_att_src_grad,
               gat_ref_mean_res_att_dst_grad, gat_ref_mean_res_bias_grad, gat_ref_mean_res_res_grad);
}
END_TEST

START_TEST(gatconv_without_self_loops_matches_pyg) {
    check_conv(true, false, false, gat_ref_noloops_w, gat_ref_noloops_att_src, gat_ref_noloops_att_dst,
               gat_ref_noloops_bias, NULL, gat_ref_noloops_r, gat_ref_noloops_out, gat_ref_noloops_x_grad,
               gat_ref_noloops_w_grad, gat_ref_noloops_att_src_grad, gat_ref_noloops_att_dst_grad,
               gat_ref_noloops_bias_grad, NULL);
}
END_TEST

/* conv1 (3 heads x 4, concat) -> ELU -> conv2 (3 classes, 2 heads averaged), eval mode. */
START_TEST(two_layer_network_matches_pyg) {
    gat_opts o = {.layers = 2, .hidden = GAT_REF_C, .heads = GAT_REF_H, .output_heads = 2,
                  .dropout = 0.6, .attn_dropout = 0.6, .negative_slope = 0.2, .concat = true,
                  .add_self_loops = true, .bias = true, .in_features = GAT_REF_F, .num_classes = GAT_REF_K};
    fixture f;
    fx_init(&f, &o);
    int64_t HC = GAT_REF_H * GAT_REF_C;
    set_param(&f, "gat.layers.0.lin.weight", gat_ref_net1_w, HC * GAT_REF_F);
    set_param(&f, "gat.layers.0.att_src", gat_ref_net1_att_src, HC);
    set_param(&f, "gat.layers.0.att_dst", gat_ref_net1_att_dst, HC);
    set_param(&f, "gat.layers.0.bias", gat_ref_net1_bias, HC);
    set_param(&f, "gat.layers.1.lin.weight", gat_ref_net2_w, 2 * GAT_REF_K * HC);
    set_param(&f, "gat.layers.1.att_src", gat_ref_net2_att_src, 2 * GAT_REF_K);
    set_param(&f, "gat.layers.1.att_dst", gat_ref_net2_att_dst, 2 * GAT_REF_K);
    set_param(&f, "gat.layers.1.bias", gat_ref_net2_bias, GAT_REF_K);
    pl_tensor *x = pl_tensor_from_data(PL_F32, PL_SHAPE(GAT_REF_N, GAT_REF_F), gat_ref_x, PL_CPU);
    pl_tensor_set_requires_grad(x, true);
    pl_tensor *es = new_i64(gat_ref_src, GAT_REF_E), *ed = new_i64(gat_ref_dst, GAT_REF_E);
    pl_tensor *src, *dst;
    PL_CK_OK(gat_edges(f.m, es, ed, GAT_REF_N, &src, &dst));
    pl_frame_begin();
    pl_tensor *out = gat_logits(f.m, x, src, dst, false); /* eval: dropout off */
    expect_close(out, gat_ref_net_out, GAT_REF_N * GAT_REF_K, 1e-4, "logits");
    pl_tensor *rt = pl_tensor_from_data(PL_F32, out->ndim, out->shape, gat_ref_net_r, PL_CPU);
    PL_CK_OK(pl_backward(pl_sum(pl_mul(out, rt), PL_ALL_DIMS, false), 1.0));
    pl_frame_end();
    expect_close(x->grad, gat_ref_net_x_grad, GAT_REF_N * GAT_REF_F, 1e-4, "dx");
    expect_close(param(&f, "gat.layers.0.lin.weight")->grad, gat_ref_net1_w_grad, HC * GAT_REF_F, 1e-4, "dW1");
    expect_close(param(&f, "gat.layers.0.att_src")->grad, gat_ref_net1_att_src_grad, HC, 1e-4, "d att_src1");
    expect_close(param(&f, "gat.layers.0.att_dst")->grad, gat_ref_net1_att_dst_grad, HC, 1e-4, "d att_dst1");
    expect_close(param(&f, "gat.layers.0.bias")->grad, gat_ref_net1_bias_grad, HC, 1e-4, "d bias1");
    expect_close(param(&f, "gat.layers.1.lin.weight")->grad, gat_ref_net2_w_grad, 2 * GAT_REF_K * HC, 1e-4, "dW2");
    expect_close(param(&f, "gat.layers.1.att_src")->grad, gat_ref_net2_att_src_grad, 2 * GAT_REF_K, 1e-4, "d att_src2");
    expect_close(param(&f, "gat.layers.1.att_dst")->grad, gat_ref_net2_att_dst_grad, 2 * GAT_REF_K, 1e-4, "d att_dst2");
    expect_close(param(&f, "gat.layers.1.bias")->grad, gat_ref_net2_bias_grad, GAT_REF_K, 1e-4, "d bias2");
    pl_tensor_release(x);
    pl_tensor_release(es);
    pl_tensor_release(ed);
    fx_free(&f);
}
END_TEST

/* ---- the plugin's training forward: batch fields, masked loss, dropout ---- */

typedef struct graph_batch {
    pl_tensor *x, *es, *ed, *y, *mask;
    pl_batch b;
} graph_batch;

static void batch_init(graph_batch *g, const uint8_t *mask) {
    static const int64_t labels[GAT_REF_N] = {0, 1, 2, 1, 0, 2};
    g->x = pl_tensor_from_data(PL_F32, PL_SHAPE(GAT_REF_N, GAT_REF_F), gat_ref_x, PL_CPU);
    g->es = new_i64(gat_ref_src, GAT_REF_E);
    g->ed = new_i64(gat_ref_dst, GAT_REF_E);
    g->y = new_i64(labels, GAT_REF_N);
    g->mask = pl_tensor_from_data(PL_U8, PL_SHAPE(GAT_REF_N), mask, PL_CPU);
    memset(&g->b, 0, sizeof g->b);
    const char *names[5] = {"x", "edge_src", "edge_dst", "y", "mask"};
    pl_tensor *ts[5] = {g->x, g->es, g->ed, g->y, g->mask};
    for (int i = 0; i < 5; i++) {
        g->b.names[i] = names[i];
        g->b.fields[i] = ts[i];
    }
    g->b.n = 5;
    g->b.size = GAT_REF_N;
}

static void batch_free(graph_batch *g) {
    pl_tensor *ts[5] = {g->x, g->es, g->ed, g->y, g->mask};
    for (int i = 0; i < 5; i++) pl_tensor_release(ts[i]);
}

static gat_opts small_opts(void) {
    return (gat_opts){.layers = 2, .hidden = 3, .heads = 2, .output_heads = 2, .dropout = 0.5,
                      .attn_dropout = 0.5, .negative_slope = 0.2, .concat = true, .residual = true,
                      .add_self_loops = true, .bias = true, .in_features = GAT_REF_F,
                      .num_classes = GAT_REF_K};
}

/* The plugin's training loss on one batch, for pl_gradcheck (node and graph tasks). */
typedef struct gc_ctx {
    fixture *f;
    const pl_batch *b;
} gc_ctx;

static pl_tensor *train_loss(pl_tensor **in, int n, void *p) {
    (void)in;
    (void)n;
    gc_ctx *c = p;
    const pl_model_vtable *vt = pl_plugin_entry()->vtable;
    pl_tensor *loss = NULL;
    if (vt->forward(c->f->m, c->b, PL_SPLIT_TRAIN, true, &loss, NULL)) return NULL;
    return loss;
}

START_TEST(training_forward_gradients_match_finite_differences) {
    gat_opts o = small_opts();
    fixture f;
    fx_init(&f, &o);
    f.ctx.micro_step = 3; /* fixed dropout masks: the loss is a smooth function of the weights */
    static const uint8_t mask[GAT_REF_N] = {1, 1, 0, 1, 1, 1};
    graph_batch g;
    batch_init(&g, mask);
    pl_tensor *ins[16];
    int n = 0;
    for (int i = 0; i < pl_params_count(f.ctx.params); i++) ins[n++] = pl_params_at(f.ctx.params, i)->t;
    ck_assert_int_eq(n, 10); /* 2 layers x (lin, att_src, att_dst, res, bias) */
    gc_ctx c = {&f, &g.b};
    char msg[512];
    ck_assert_msg(pl_gradcheck(train_loss, ins, n, &c, 1e-3, 2e-3, 2e-2, msg, sizeof msg), "%s", msg);
    batch_free(&g);
    fx_free(&f);
}
END_TEST

START_TEST(dropout_masks_follow_the_micro_step) {
    gat_opts o = small_opts();
    fixture f;
    fx_init(&f, &o);
    static const uint8_t mask[GAT_REF_N] = {1, 1, 1, 1, 1, 1};
    graph_batch g;
    batch_init(&g, mask);
    const pl_model_vtable *vt = pl_plugin_entry()->vtable;
    double v[3];
    int64_t steps[3] = {5, 5, 6};
    pl_no_grad_begin();
    for (int i = 0; i < 3; i++) {
        f.ctx.micro_step = steps[i];
        pl_frame_begin();
        pl_tensor *loss = NULL;
        PL_CK_OK(vt->forward(f.m, &g.b, PL_SPLIT_TRAIN, true, &loss, NULL));
        v[i] = pl_tensor_item(loss);
        pl_frame_end();
    }
    pl_no_grad_end();
    ck_assert_msg(v[0] == v[1], "same step, different loss: %.9g vs %.9g", v[0], v[1]);
    ck_assert_msg(v[0] != v[2], "dropout masks did not change with the step (%.9g)", v[0]);
    batch_free(&g);
    fx_free(&f);
}
END_TEST

/* Eval metrics count only masked nodes; loss = cross entropy over them
 * (compared with log-softmax computed here from the logits). */
START_TEST(eval_reports_masked_loss_and_accuracy) {
    gat_opts o = small_opts();
    fixture f;
    fx_init(&f, &o);
    static const uint8_t mask[GAT_REF_N] = {0, 1, 0, 1, 1, 0};
    static const int64_t labels[GAT_REF_N] = {0, 1, 2, 1, 0, 2};
    graph_batch g;
    batch_init(&g, mask);
    const pl_model_vtable *vt = pl_plugin_entry()->vtable;
    pl_metrics m;
    pl_metrics_reset(&m);
    pl_no_grad_begin();
    pl_frame_begin();
    pl_tensor *loss = NULL, *src, *dst;
    PL_CK_OK(vt->forward(f.m, &g.b, PL_SPLIT_VAL, false, &loss, &m));
    PL_CK_OK(gat_edges(f.m, g.es, g.ed, GAT_REF_N, &src, &dst));
    pl_tensor *logits = gat_logits(f.m, g.x, src, dst, false);
    double ce = 0;
    int correct = 0;
    for (int i = 0; i < GAT_REF_N; i++) {
        if (!mask[i]) continue;
        double mx = -INFINITY, s = 0;
        int best = 0;
        for (int k = 0; k < GAT_REF_K; k++) {
            double z = pl_tensor_get(logits, i * GAT_REF_K + k);
            if (z > mx) { mx = z; best = k; }
        }
        for (int k = 0; k < GAT_REF_K; k++) s += exp(pl_tensor_get(logits, i * GAT_REF_K + k) - mx);
        ce += -(pl_tensor_get(logits, i * GAT_REF_K + labels[i]) - mx - log(s));
        correct += best == labels[i];
    }
    pl_frame_end();
    pl_no_grad_end();
    ck_assert_double_eq_tol(pl_metrics_get(&m, "loss"), ce / 3, 1e-5);
    ck_assert_double_eq_tol(pl_metrics_get(&m, "accuracy"), correct / 3.0, 1e-12);
    batch_free(&g);
    fx_free(&f);
}
END_TEST

/* A few hundred plain gradient steps fit the 4 labelled nodes of the tiny graph. */
START_TEST(learns_the_training_labels) {
    gat_opts o = small_opts();
    o.dropout = o.attn_dropout = 0.1;
    fixture f;
    fx_init(&f, &o);
    static const uint8_t mask[GAT_REF_N] = {1, 1, 1, 0, 1, 0};
    graph_batch g;
    batch_init(&g, mask);
    const pl_model_vtable *vt = pl_plugin_entry()->vtable;
    double first = NAN;
    for (int step = 0; step < 300; step++) {
        f.ctx.micro_step = step;
        pl_frame_begin();
        pl_tensor *loss = NULL;
        PL_CK_OK(vt->forward(f.m, &g.b, PL_SPLIT_TRAIN, true, &loss, NULL));
        if (step == 0) first = pl_tensor_item(loss);
        PL_CK_OK(pl_backward(loss, 1.0));
        pl_frame_end();
        for (int i = 0; i < pl_params_count(f.ctx.params); i++) {
            pl_tensor *p = pl_params_at(f.ctx.params, i)->t;
            float *w = pl_tensor_f32(p), *gr = pl_tensor_f32(p->grad);
            for (int64_t j = 0; j < pl_tensor_numel(p); j++) w[j] -= 0.1f * gr[j];
            pl_tensor_zero_grad(p);
        }
    }
    pl_metrics m;
    pl_metrics_reset(&m);
    pl_no_grad_begin();
    pl_frame_begin();
    pl_tensor *loss = NULL;
    PL_CK_OK(vt->forward(f.m, &g.b, PL_SPLIT_TRAIN, false, &loss, &m));
    pl_frame_end();
    pl_no_grad_end();
    ck_assert_msg(pl_metrics_get(&m, "loss") < 0.2 * first, "loss %g (first %g)", pl_metrics_get(&m, "loss"),
                  first);
    ck_assert_double_eq(pl_metrics_get(&m, "accuracy"), 1.0);
    batch_free(&g);
    fx_free(&f);
}
END_TEST

START_TEST(edges_out_of_range_are_refused) {
    gat_opts o = small_opts();
    fixture f;
    fx_init(&f, &o);
    int64_t s[2] = {0, 9}, d[2] = {1, 2};
    pl_tensor *es = new_i64(s, 2), *ed = new_i64(d, 2), *a, *b;
    ck_assert_int_eq(gat_edges(f.m, es, ed, GAT_REF_N, &a, &b), PL_ERR_INVALID);
    ck_assert_msg(strstr(pl_error_message(), "9") != NULL, "%s", pl_error_message());
    pl_tensor_release(es);
    pl_tensor_release(ed);
    fx_free(&f);
}
END_TEST


/* ---- graph-level regression (task = graph_regression) ---------------------- */

/* The Cora-style reference graph (6 nodes) and a 3-node graph in one batch,
 * as hdf5_graph mode = graphs serves it: batch-local edge ids, batch vector. */
typedef struct multi_batch {
    pl_tensor *x, *es, *ed, *bv, *y;
    pl_batch b;
} multi_batch;

#define MB_N (GAT_REF_N + GAT_REF_NB)
#define MB_E (GAT_REF_E + GAT_REF_EB)

static void multi_init(multi_batch *g, const float *y) {
    float xv[MB_N * GAT_REF_F];
    memcpy(xv, gat_ref_x, sizeof gat_ref_x);
    memcpy(xv + GAT_REF_N * GAT_REF_F, gat_ref_gb_x, sizeof gat_ref_gb_x);
    int64_t s[MB_E], d[MB_E], bv[MB_N];
    for (int e = 0; e < GAT_REF_E; e++) s[e] = gat_ref_src[e], d[e] = gat_ref_dst[e];
    for (int e = 0; e < GAT_REF_EB; e++)
        s[GAT_REF_E + e] = gat_ref_gb_src[e] + GAT_REF_N, d[GAT_REF_E + e] = gat_ref_gb_dst[e] + GAT_REF_N;
    for (int i = 0; i < MB_N; i++) bv[i] = i >= GAT_REF_N;
    g->x = pl_tensor_from_data(PL_F32, PL_SHAPE(MB_N, GAT_REF_F), xv, PL_CPU);
    g->es = new_i64(s, MB_E);
    g->ed = new_i64(d, MB_E);
    g->bv = new_i64(bv, MB_N);
    g->y = pl_tensor_from_data(PL_F32, PL_SHAPE(2, GAT_REF_KT), y, PL_CPU);
    memset(&g->b, 0, sizeof g->b);
    const char *names[5] = {"x", "edge_src", "edge_dst", "batch", "y"};
    pl_tensor *ts[5] = {g->x, g->es, g->ed, g->bv, g->y};
    for (int i = 0; i < 5; i++) {
        g->b.names[i] = names[i];
        g->b.fields[i] = ts[i];
    }
    g->b.n = 5;
    g->b.size = 2;
}

static void multi_free(multi_batch *g) {
    pl_tensor *ts[5] = {g->x, g->es, g->ed, g->bv, g->y};
    for (int i = 0; i < 5; i++) pl_tensor_release(ts[i]);
}

static gat_opts graph_opts(gat_readout r, int64_t head_hidden) {
    return (gat_opts){.layers = 2, .hidden = GAT_REF_C, .heads = GAT_REF_H, .output_heads = 1,
                      .negative_slope = 0.2, .concat = true, .add_self_loops = true, .bias = true,
                      .in_features = GAT_REF_F, .num_classes = 1, .task = GAT_GRAPH_REGRESSION,
                      .readout = r, .head_hidden = head_hidden, .num_targets = GAT_REF_KT,
                      .scale = {1, 1}, .shift = {0, 0}};
}


/* Both readouts and the MLP head against PyG (GATConv x2 + global_mean_pool /
 * global_add_pool + Linear), outputs and every gradient. */
static void check_graph_case(gat_readout r, int64_t hh, const float *out_ref, const float *rr,
                             const float *gx, const float *gw1, const float *gw2,
                             const float *hw0, const float *hb0, const float *hw1, const float *hb1,
                             const float *ghw0, const float *ghb0, const float *ghw1, const float *ghb1,
                             const float *w1, const float *as1, const float *ad1, const float *b1,
                             const float *w2, const float *as2, const float *ad2, const float *b2) {
    gat_opts o = graph_opts(r, hh);
    fixture f;
    fx_init(&f, &o);
    int64_t HC = GAT_REF_H * GAT_REF_C, D0 = hh ? hh : GAT_REF_KT;
    set_param(&f, "gat.layers.0.lin.weight", w1, HC * GAT_REF_F);
    set_param(&f, "gat.layers.0.att_src", as1, HC);
    set_param(&f, "gat.layers.0.att_dst", ad1, HC);
    set_param(&f, "gat.layers.0.bias", b1, HC);
    set_param(&f, "gat.layers.1.lin.weight", w2, HC * HC);
    set_param(&f, "gat.layers.1.att_src", as2, HC);
    set_param(&f, "gat.layers.1.att_dst", ad2, HC);
    set_param(&f, "gat.layers.1.bias", b2, HC);
    set_param(&f, "gat.head.0.weight", hw0, D0 * HC);
    set_param(&f, "gat.head.0.bias", hb0, D0);
    if (hh) {
        set_param(&f, "gat.head.1.weight", hw1, GAT_REF_KT * hh);
        set_param(&f, "gat.head.1.bias", hb1, GAT_REF_KT);
    }
    static const float y[2 * GAT_REF_KT] = {0};
    multi_batch g;
    multi_init(&g, y);
    pl_tensor_set_requires_grad(g.x, true);
    pl_frame_begin();
    pl_tensor *src, *dst;
    PL_CK_OK(gat_edges_batch(f.m, g.es, g.ed, MB_N, &src, &dst));
    pl_tensor *out = gat_graph_predict(f.m, g.x, src, dst, g.bv, 2, false);
    expect_close(out, out_ref, 2 * GAT_REF_KT, 1e-4, "graph predictions");
    pl_tensor *rt = pl_tensor_from_data(PL_F32, out->ndim, out->shape, rr, PL_CPU);
    PL_CK_OK(pl_backward(pl_sum(pl_mul(out, rt), PL_ALL_DIMS, false), 1.0));
    pl_frame_end();
    expect_close(g.x->grad, gx, MB_N * GAT_REF_F, 1e-4, "dx");
    expect_close(param(&f, "gat.layers.0.lin.weight")->grad, gw1, HC * GAT_REF_F, 1e-4, "dW1");
    expect_close(param(&f, "gat.layers.1.lin.weight")->grad, gw2, HC * HC, 1e-4, "dW2");
    expect_close(param(&f, "gat.head.0.weight")->grad, ghw0, D0 * HC, 1e-4, "d head0 W");
    expect_close(param(&f, "gat.head.0.bias")->grad, ghb0, D0, 1e-4, "d head0 b");
    if (hh) {
        expect_close(param(&f, "gat.head.1.weight")->grad, ghw1, GAT_REF_KT * hh, 1e-4, "d head1 W");
        expect_close(param(&f, "gat.head.1.bias")->grad, ghb1, GAT_REF_KT, 1e-4, "d head1 b");
    }
    multi_free(&g);
    fx_free(&f);
}

START_TEST(graph_regression_mean_readout_matches_pyg) {
    check_graph_case(GAT_READOUT_MEAN, 5, gat_ref_graph_mean_out, gat_ref_graph_mean_r, gat_ref_graph_mean_x_grad,
                     gat_ref_graph_mean1_w_grad, gat_ref_graph_mean2_w_grad, gat_ref_graph_mean_head0_w,
                     gat_ref_graph_mean_head0_b, gat_ref_graph_mean_head1_w, gat_ref_graph_mean_head1_b,
                     gat_ref_graph_mean_head0_w_grad, gat_ref_graph_mean_head0_b_grad,
                     gat_ref_graph_mean_head1_w_grad, gat_ref_graph_mean_head1_b_grad, gat_ref_graph_mean1_w,
                     gat_ref_graph_mean1_att_src, gat_ref_graph_mean1_att_dst, gat_ref_graph_mean1_bias,
                     gat_ref_graph_mean2_w, gat_ref_graph_mean2_att_src, gat_ref_graph_mean2_att_dst,
                     gat_ref_graph_mean2_bias);
}
END_TEST

START_TEST(graph_regression_sum_readout_matches_pyg) {
    check_graph_case(GAT_READOUT_SUM, 0, gat_ref_graph_sum_out, gat_ref_graph_sum_r, gat_ref_graph_sum_x_grad,
                     gat_ref_graph_sum1_w_grad, gat_ref_graph_sum2_w_grad, gat_ref_graph_sum_head0_w,
                     gat_ref_graph_sum_head0_b, NULL, NULL, gat_ref_graph_sum_head0_w_grad,
                     gat_ref_graph_sum_head0_b_grad, NULL, NULL, gat_ref_graph_sum1_w,
                     gat_ref_graph_sum1_att_src, gat_ref_graph_sum1_att_dst, gat_ref_graph_sum1_bias,
                     gat_ref_graph_sum2_w, gat_ref_graph_sum2_att_src, gat_ref_graph_sum2_att_dst,
                     gat_ref_graph_sum2_bias);
}
END_TEST

/* Graphs in a batch do not see each other: each graph's prediction equals
 * the one it gets alone (catches wrong edge offsets or batch ids). */
START_TEST(graph_predictions_do_not_depend_on_batch_mates) {
    gat_opts o = graph_opts(GAT_READOUT_MEAN, 4);
    o.residual = true;
    fixture f;
    fx_init(&f, &o);
    static const float y[2 * GAT_REF_KT] = {0};
    multi_batch g;
    multi_init(&g, y);
    pl_no_grad_begin();
    pl_frame_begin();
    pl_tensor *src, *dst;
    PL_CK_OK(gat_edges_batch(f.m, g.es, g.ed, MB_N, &src, &dst));
    pl_tensor *both = gat_graph_predict(f.m, g.x, src, dst, g.bv, 2, false);
    /* graph 1 alone: its 3 nodes, local edge ids, batch vector of zeros */
    pl_tensor *x1 = pl_tensor_from_data(PL_F32, PL_SHAPE(GAT_REF_NB, GAT_REF_F), gat_ref_gb_x, PL_CPU);
    pl_tensor *s1 = new_i64(gat_ref_gb_src, GAT_REF_EB), *d1 = new_i64(gat_ref_gb_dst, GAT_REF_EB);
    int64_t z[GAT_REF_NB] = {0};
    pl_tensor *b1 = new_i64(z, GAT_REF_NB);
    PL_CK_OK(gat_edges_batch(f.m, s1, d1, GAT_REF_NB, &src, &dst));
    pl_tensor *alone = gat_graph_predict(f.m, x1, src, dst, b1, 1, false);
    ck_assert_msg(both && alone, "%s", pl_error_message());
    for (int k = 0; k < GAT_REF_KT; k++)
        ck_assert_msg(fabs(pl_tensor_get(both, GAT_REF_KT + k) - pl_tensor_get(alone, k)) < 1e-6,
                      "target %d: %g in the batch, %g alone", k, pl_tensor_get(both, GAT_REF_KT + k),
                      pl_tensor_get(alone, k));
    pl_frame_end(); /* owns x1, s1, d1, b1 too */
    pl_no_grad_end();
    multi_free(&g);
    fx_free(&f);
}
END_TEST

/* Numerical gradients of the plugin's whole training forward (dropout on
 * with fixed masks, huber loss, mean readout, MLP head). */
START_TEST(graph_regression_gradients_match_finite_differences) {
    gat_opts o = graph_opts(GAT_READOUT_MEAN, 3);
    o.hidden = 2;
    o.heads = 2;
    o.dropout = o.attn_dropout = 0.3;
    o.residual = true;
    o.loss = GAT_LOSS_HUBER;
    o.huber_delta = 0.5;
    fixture f;
    fx_init(&f, &o);
    f.ctx.micro_step = 2;
    static const float y[2 * GAT_REF_KT] = {0.3f, -1.2f, 1.5f, 0.1f};
    multi_batch g;
    multi_init(&g, y);
    pl_tensor *ins[32];
    int n = 0;
    for (int i = 0; i < pl_params_count(f.ctx.params); i++) ins[n++] = pl_params_at(f.ctx.params, i)->t;
    ck_assert_int_eq(n, 14); /* 2 layers x 5 + head 2 x (weight, bias) */
    gc_ctx c = {&f, &g.b};
    char msg[512];
    ck_assert_msg(pl_gradcheck(train_loss, ins, n, &c, 1e-3, 2e-3, 2e-2, msg, sizeof msg), "%s", msg);
    multi_free(&g);
    fx_free(&f);
}
END_TEST

/* Evaluation metrics are in the target's original units: mae / mse of
 * pred * scale + shift against y * scale + shift (hand-computed here). */
START_TEST(graph_regression_metrics_undo_standardization) {
    gat_opts o = graph_opts(GAT_READOUT_SUM, 0);
    o.scale[0] = 10.0;
    o.shift[0] = 50.0;
    o.scale[1] = 0.5;
    o.shift[1] = -2.0;
    fixture f;
    fx_init(&f, &o);
    static const float y[2 * GAT_REF_KT] = {0.3f, -1.2f, 1.5f, 0.1f};
    multi_batch g;
    multi_init(&g, y);
    const pl_model_vtable *vt = pl_plugin_entry()->vtable;
    pl_metrics m;
    pl_metrics_reset(&m);
    pl_no_grad_begin();
    pl_frame_begin();
    pl_tensor *loss = NULL, *src, *dst;
    PL_CK_OK(vt->forward(f.m, &g.b, PL_SPLIT_VAL, false, &loss, &m));
    PL_CK_OK(gat_edges_batch(f.m, g.es, g.ed, MB_N, &src, &dst));
    pl_tensor *pred = gat_graph_predict(f.m, g.x, src, dst, g.bv, 2, false);
    double ae = 0, se = 0, sq = 0, base = 0;
    for (int i = 0; i < 2 * GAT_REF_KT; i++) {
        int k = i % GAT_REF_KT;
        double d = pl_tensor_get(pred, i) - y[i];
        sq += d * d;
        ae += fabs(d) * o.scale[k];
        se += d * d * o.scale[k] * o.scale[k];
        base += fabs(y[i]) * o.scale[k];
    }
    pl_frame_end();
    pl_no_grad_end();
    ck_assert_double_eq_tol(pl_metrics_get(&m, "loss"), sq / 4, 1e-5);
    ck_assert_double_eq_tol(pl_metrics_get(&m, "mae"), ae / 4, 1e-4);
    ck_assert_double_eq_tol(pl_metrics_get(&m, "mse"), se / 4, 1e-3);
    ck_assert_double_eq_tol(pl_metrics_get(&m, "train_mean_mae"), base / 4, 1e-4);
    multi_free(&g);
    fx_free(&f);
}
END_TEST

/* Sum readout + linear head learns a per-graph count: y = number of nodes
 * (6 and 3, standardized by hand), to a small fraction of the first loss. */
START_TEST(graph_regression_learns_node_counts) {
    gat_opts o = graph_opts(GAT_READOUT_SUM, 0);
    o.num_targets = 1;
    fixture f;
    fx_init(&f, &o);
    /* two targets in the batch layout; fit y[:, 0] = (n - 4.5) / 1.5 only */
    static const float y[2 * GAT_REF_KT] = {1.0f, 0.0f, -1.0f, 0.0f};
    multi_batch g;
    multi_init(&g, y);
    pl_tensor_release(g.y);
    static const float y1[2] = {1.0f, -1.0f};
    g.y = g.b.fields[4] = pl_tensor_from_data(PL_F32, PL_SHAPE(2, 1), y1, PL_CPU);
    const pl_model_vtable *vt = pl_plugin_entry()->vtable;
    double first = NAN, last = NAN;
    for (int step = 0; step < 200; step++) {
        pl_frame_begin();
        pl_tensor *loss = NULL;
        PL_CK_OK(vt->forward(f.m, &g.b, PL_SPLIT_TRAIN, true, &loss, NULL));
        if (step == 0) first = pl_tensor_item(loss);
        last = pl_tensor_item(loss);
        PL_CK_OK(pl_backward(loss, 1.0));
        pl_frame_end();
        for (int i = 0; i < pl_params_count(f.ctx.params); i++) {
            pl_tensor *p = pl_params_at(f.ctx.params, i)->t;
            float *w = pl_tensor_f32(p), *gr = pl_tensor_f32(p->grad);
            for (int64_t j = 0; j < pl_tensor_numel(p); j++) w[j] -= 0.02f * gr[j];
            pl_tensor_zero_grad(p);
        }
    }
    ck_assert_msg(last < 0.05 * first, "loss %g after 200 steps (first %g)", last, first);
    multi_free(&g);
    fx_free(&f);
}
END_TEST

/* hdf5_graph pad (jraph pad_with_graphs): the multi batch padded to 12 nodes,
 * 13 edges and 4 graphs (3 padding nodes of zero features in padding graph
 * 2, its 4 padding edges loops on its first node, graph 3 empty, junk
 * targets on the padding rows, graph_mask 1 1 0 0). For every loss and both
 * readouts, dropout on: the training loss, every parameter's gradient and
 * the eval metrics equal the unpadded batch's (to f32 rounding: the mean's
 * scale is G / sum(mask) times the mean over G rows, and the weight
 * gradients sum zero rows of the padding nodes in). */
START_TEST(padded_batch_gives_the_unpadded_loss_gradients_and_metrics) {
    enum { PADN = 3, PADE = 4, PN = MB_N + PADN, PE = MB_E + PADE, PG = 4 };
    static const float y[2 * GAT_REF_KT] = {0.3f, -1.2f, 1.5f, 0.1f};
    const gat_loss losses[3] = {GAT_LOSS_MSE, GAT_LOSS_MAE, GAT_LOSS_HUBER};
    const pl_model_vtable *vt = pl_plugin_entry()->vtable;
    for (int c = 0; c < 6; c++) {
        gat_opts o = graph_opts(c % 2 ? GAT_READOUT_SUM : GAT_READOUT_MEAN, 3);
        o.add_self_loops = false; /* the loader adds them: the model's would read the edges */
        o.dropout = o.attn_dropout = 0.3;
        o.residual = true;
        o.loss = losses[c / 2];
        o.huber_delta = 0.5;
        o.scale[0] = 10.0;
        o.shift[0] = 50.0;
        multi_batch g;
        multi_init(&g, y);
        /* the padded batch: the real rows first, as the loader lays them out */
        float xv[PN * GAT_REF_F] = {0}, yv[PG * GAT_REF_KT], mv[PG] = {1, 1, 0, 0};
        int64_t sv[PE], dv[PE], bv[PN];
        memcpy(xv, pl_tensor_f32(g.x), sizeof(float) * MB_N * GAT_REF_F);
        memcpy(sv, pl_tensor_i64(g.es), sizeof(int64_t) * MB_E);
        memcpy(dv, pl_tensor_i64(g.ed), sizeof(int64_t) * MB_E);
        memcpy(bv, pl_tensor_i64(g.bv), sizeof(int64_t) * MB_N);
        for (int e = MB_E; e < PE; e++)
            sv[e] = dv[e] = MB_N;
        for (int i = MB_N; i < PN; i++)
            bv[i] = 2;
        for (int i = 0; i < PG * GAT_REF_KT; i++)
            yv[i] = i < 2 * GAT_REF_KT ? y[i] : 7.0f;
        pl_tensor *ts[6] = {pl_tensor_from_data(PL_F32, PL_SHAPE(PN, GAT_REF_F), xv, PL_CPU),
                            new_i64(sv, PE),
                            new_i64(dv, PE),
                            new_i64(bv, PN),
                            pl_tensor_from_data(PL_F32, PL_SHAPE(PG, GAT_REF_KT), yv, PL_CPU),
                            pl_tensor_from_data(PL_F32, PL_SHAPE(PG), mv, PL_CPU)};
        const char *names[6] = {"x", "edge_src", "edge_dst", "batch", "y", "graph_mask"};
        pl_batch pb = {.n = 6, .size = 2};
        for (int i = 0; i < 6; i++) {
            pb.names[i] = names[i];
            pb.fields[i] = ts[i];
        }
        /* the two runs from the same weights, gradients kept apart */
        fixture f;
        fx_init(&f, &o);
        f.ctx.micro_step = 5;
        int np = pl_params_count(f.ctx.params);
        double lv[2], met[2][4];
        static double grad[2][4096];
        int ng = 0;
        for (int run = 0; run < 2; run++) {
            const pl_batch *b = run ? &pb : &g.b;
            pl_frame_begin();
            pl_tensor *loss = NULL;
            PL_CK_OK(vt->forward(f.m, b, PL_SPLIT_TRAIN, true, &loss, NULL));
            lv[run] = pl_tensor_item(loss);
            PL_CK_OK(pl_backward(loss, 1.0));
            pl_frame_end();
            ng = 0;
            for (int i = 0; i < np; i++) {
                pl_tensor *p = pl_params_at(f.ctx.params, i)->t;
                ck_assert_ptr_nonnull(p->grad);
                for (int64_t j = 0; j < pl_tensor_numel(p); j++) {
                    ck_assert_int_lt(ng, 4096);
                    grad[run][ng++] = pl_tensor_get(p->grad, j);
                }
                pl_tensor_zero_grad(p);
            }
            pl_metrics m;
            pl_metrics_reset(&m);
            pl_no_grad_begin();
            pl_frame_begin();
            PL_CK_OK(vt->forward(f.m, b, PL_SPLIT_VAL, false, &loss, &m));
            pl_frame_end();
            pl_no_grad_end();
            const char *keys[4] = {"loss", "mae", "mse", "train_mean_mae"};
            for (int k = 0; k < 4; k++)
                met[run][k] = pl_metrics_get(&m, keys[k]);
        }
        ck_assert_msg(isfinite(lv[0]) && fabs(lv[1] - lv[0]) <= 1e-6 * fabs(lv[0]),
                      "case %d: loss %.9g unpadded, %.9g padded", c, lv[0], lv[1]);
        /* per entry, against the largest entry of the gradient vector: an entry
         * that is a sum of terms of both signs keeps their rounding, not its own */
        int nz = 0;
        double gmax = 0;
        for (int j = 0; j < ng; j++)
            gmax = fmax(gmax, fabs(grad[0][j]));
        for (int j = 0; j < ng; j++) {
            nz += grad[0][j] != 0;
            ck_assert_msg(fabs(grad[1][j] - grad[0][j]) <= 1e-6 * gmax,
                          "case %d: gradient %d: %.9g unpadded, %.9g padded (largest %.3g)", c, j,
                          grad[0][j], grad[1][j], gmax);
        }
        ck_assert_int_gt(nz, ng / 2);
        for (int k = 0; k < 4; k++)
            ck_assert_msg(fabs(met[1][k] - met[0][k]) <= 1e-6 * fabs(met[0][k]),
                          "case %d: metric %d: %.9g unpadded, %.9g padded", c, k, met[0][k],
                          met[1][k]);
        for (int i = 0; i < 6; i++)
            pl_tensor_release(ts[i]);
        multi_free(&g);
        fx_free(&f);
    }
}
END_TEST

START_TEST(graph_regression_refuses_a_node_batch) {
    gat_opts o = graph_opts(GAT_READOUT_MEAN, 0);
    fixture f;
    fx_init(&f, &o);
    static const uint8_t mask[GAT_REF_N] = {1, 1, 1, 1, 1, 1};
    graph_batch g;
    batch_init(&g, mask);
    pl_tensor *loss = NULL;
    const pl_model_vtable *vt = pl_plugin_entry()->vtable;
    ck_assert_int_ne(vt->forward(f.m, &g.b, PL_SPLIT_TRAIN, true, &loss, NULL), PL_OK);
    ck_assert_msg(strstr(pl_error_message(), "batch") != NULL, "%s", pl_error_message());
    batch_free(&g);
    fx_free(&f);
}
END_TEST

START_TEST(schema_and_descriptor) {
    const pl_plugin_desc *d = pl_plugin_entry();
    ck_assert_str_eq(d->name, "gat");
    ck_assert_int_eq(d->kind, PL_KIND_MODEL);
    const char *want[] = {"layers", "hidden", "heads", "output_heads", "dropout", "attn_dropout",
                          "negative_slope", "concat", "residual", "add_self_loops"};
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        bool found = false;
        for (const pl_option_spec *o = d->options; o->name; o++) found |= !strcmp(o->name, want[i]);
        ck_assert_msg(found, "option %s missing", want[i]);
    }
}
END_TEST

int main(void) {
    Suite *s = suite_create("gat");
    TCase *tc = tcase_create("gat");
    tcase_add_test(tc, gatconv_concat_matches_pyg);
    tcase_add_test(tc, gatconv_mean_residual_matches_pyg);
    tcase_add_test(tc, gatconv_without_self_loops_matches_pyg);
    tcase_add_test(tc, two_layer_network_matches_pyg);
    tcase_add_test(tc, training_forward_gradients_match_finite_differences);
    tcase_add_test(tc, dropout_masks_follow_the_micro_step);
    tcase_add_test(tc, eval_reports_masked_loss_and_accuracy);
    tcase_add_test(tc, learns_the_training_labels);
    tcase_add_test(tc, edges_out_of_range_are_refused);
    tcase_add_test(tc, graph_regression_mean_readout_matches_pyg);
    tcase_add_test(tc, graph_regression_sum_readout_matches_pyg);
    tcase_add_test(tc, graph_predictions_do_not_depend_on_batch_mates);
    tcase_add_test(tc, graph_regression_gradients_match_finite_differences);
    tcase_add_test(tc, graph_regression_metrics_undo_standardization);
    tcase_add_test(tc, graph_regression_learns_node_counts);
    tcase_add_test(tc, padded_batch_gives_the_unpadded_loss_gradients_and_metrics);
    tcase_add_test(tc, graph_regression_refuses_a_node_batch);
    tcase_add_test(tc, schema_and_descriptor);
    suite_add_tcase(s, tc);
    return pl_test_run(s);
}
