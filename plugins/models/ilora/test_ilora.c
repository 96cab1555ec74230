/* test_ilora.c - the ilora model plugin.
 *
 * Reference: tests/data/ilora/reference.safetensors from
 * tools/gen_ilora_reference.py (an independent PyTorch implementation of the
 * Llama backbone and of iLoRA's per-expert formula). Also: gradient check
 * of the MoE-LoRA layer, 1 expert = plain LoRA by hand, B = 0 = backbone,
 * Llama-named safetensors round trip through the plugin's vtable, ranking
 * metrics against hand-computed cases, export, dropout determinism and a
 * tiny fit on synthetic sequences.
 */
#include <dirent.h>
#include <hdf5.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ilora.h"
#include "pl_test.h"
#include "ranking.h"
#include "pipeline/testing.h"
#include "teacher_export.h"
#include "test_env.h"

const pl_plugin_desc *pl_plugin_entry(void);

/* ---- helpers ---------------------------------------------------------------------------- */

static ilora_opts small_opts(ilora_adapters ad) {
    ilora_opts o;
    ck_assert_int_eq(ilora_opts_read(NULL, &o), PL_OK);
    o.num_items = 12;
    o.dim = 8;
    o.layers = 2;
    o.heads = 2;
    o.ffn_dim = 24;
    o.max_len = 6;
    o.adapters = ad;
    o.num_experts = ad == ILORA_MOE_LORA ? 2 : 1;
    o.lora_rank = 4;
    o.lora_alpha = 8;
    o.dropout = 0;
    o.lora_dropout = 0;
    o.exclude_history = true;
    return o;
}

static pl_tensor *ids_tensor(const int32_t *v, int64_t B, int64_t L) {
    return pl_tensor_from_data(PL_I32, 2, (int64_t[]){B, L}, v, PL_CPU);
}

/* Load every parameter of `ps` from the reference file by name. */
static void load_params(pl_st_file *f, pl_params *ps) {
    for (int i = 0; i < pl_params_count(ps); i++) {
        pl_param *p = pl_params_at(ps, i);
        PL_CK_OK(pl_st_load_into(f, p->name, p->t));
    }
}

static const char *ref_path(void) {
    static char p[1024];
    snprintf(p, sizeof p, "%s/tests/data/ilora/reference.safetensors", PL_TEST_SOURCE_DIR);
    return p;
}

/* ---- ranking ------------------------------------------------------------------------------ */

START_TEST(ranking_metrics_match_hand_computed_cases) {
    /* scores: target 2 has 0.5; strictly greater: 0.9 (idx 1), 0.7 (idx 4) -> rank 2;
     * the tie at 0.5 (idx 3) does not count */
    const float s[6] = {0.1f, 0.9f, 0.5f, 0.5f, 0.7f, -1.0f};
    ck_assert_int_eq(ilora_rank_of(s, 6, 2), 2);
    ck_assert_int_eq(ilora_rank_of(s, 6, 1), 0);
    ck_assert_int_eq(ilora_rank_of(s, 6, 5), 5);
    ck_assert(ilora_hit_at(2, 3) == 1.0);
    ck_assert(ilora_hit_at(3, 3) == 0.0);
    /* NDCG: 1/log2(rank+2): rank 0 -> 1, rank 2 -> 1/2, rank 6 -> 1/3, rank >= K -> 0 */
    ck_assert_double_eq_tol(ilora_ndcg_at(0, 10), 1.0, 1e-12);
    ck_assert_double_eq_tol(ilora_ndcg_at(2, 10), 0.5, 1e-12);
    ck_assert_double_eq_tol(ilora_ndcg_at(6, 10), 1.0 / 3.0, 1e-12);
    ck_assert_double_eq_tol(ilora_ndcg_at(1, 10), 1.0 / log2(3.0), 1e-12);
    ck_assert(ilora_ndcg_at(10, 10) == 0.0);
    ck_assert_double_eq_tol(ilora_ndcg_at(9, 10), 1.0 / log2(11.0), 1e-12);
    /* excluded (-inf) items never count */
    const float x[4] = {-INFINITY, -INFINITY, 0.0f, -3.0f};
    ck_assert_int_eq(ilora_rank_of(x, 4, 3), 1);
}
END_TEST

START_TEST(topk_is_sorted_with_low_index_first_on_ties) {
    const float s[8] = {0.3f, 2.0f, -1.0f, 2.0f, 0.3f, 5.0f, -INFINITY, 0.0f};
    int32_t ids[5];
    float v[5];
    ilora_topk(s, 8, 5, ids, v);
    const int32_t want[5] = {5, 1, 3, 0, 4};
    for (int i = 0; i < 5; i++) {
        ck_assert_int_eq(ids[i], want[i]);
        ck_assert(v[i] == s[want[i]]);
    }
    int32_t all[8];
    float av[8];
    ilora_topk(s, 8, 8, all, av); /* k = n: a full sort, -inf last */
    const int32_t want_all[8] = {5, 1, 3, 0, 4, 7, 2, 6};
    for (int i = 0; i < 8; i++)
        ck_assert_int_eq(all[i], want_all[i]);
    /* NaN above every number, NaNs by lower index (pl_topk's order), wherever they stand */
    const float n[6] = {1.0f, NAN, 3.0f, 2.0f, NAN, 3.0f};
    const int32_t want_n[4] = {1, 4, 2, 5};
    ilora_topk(n, 6, 4, all, av);
    for (int i = 0; i < 4; i++)
        ck_assert_int_eq(all[i], want_n[i]);
}
END_TEST

/* ---- layer ---------------------------------------------------------------------------------- */

typedef struct layer_ctx {
    pl_tensor *w0, *gi;
    double scale;
} layer_ctx;

static pl_tensor *f_moe_lora(pl_tensor **in, int n, void *vctx) {
    layer_ctx *c = vctx;
    pl_tensor *gexp = ilora_gate_expand(pl_softmax(in[3]), c->gi);
    return ilora_moe_lora_linear(in[0], c->w0, in[1], in[2], gexp, c->scale, 0.0, 0, 0, false);
}

START_TEST(moe_lora_layer_gradients_match_central_differences) {
    pl_frame_begin();
    /* B=2, T=3, in=5, out=4, E=2, r_e=2 */
    pl_tensor *x = pl_test_randn(PL_SHAPE(2, 3, 5), 1);
    pl_tensor *a = pl_test_randn(PL_SHAPE(4, 5), 2);
    pl_tensor *b = pl_test_randn(PL_SHAPE(4, 4), 3);
    pl_tensor *g = pl_test_randn(PL_SHAPE(2, 2), 4);
    layer_ctx c = {.w0 = pl_test_randn(PL_SHAPE(4, 5), 5), .scale = 1.5};
    c.gi = pl_tensor_from_data(PL_I64, 1, (int64_t[]){4}, (int64_t[]){0, 0, 1, 1}, PL_CPU);
    pl_tensor *in[4] = {x, a, b, g};
    for (int i = 0; i < 4; i++)
        pl_tensor_set_requires_grad(in[i], true);
    char msg[512];
    ck_assert_msg(pl_gradcheck(f_moe_lora, in, 4, &c, 1e-2, 2e-3, 2e-3, msg, sizeof msg), "%s",
                  msg);
    pl_frame_end();
    pl_tape_clear();
}
END_TEST

/* One training forward + backward of the projection, with the adapter
 * branch recomputed in backward (bc) or composed; y, dx, dA, dB, dg out. */
static void branch_run(bool recompute, const float **outs, pl_tensor **keep, size_t *tape) {
    pl_frame_begin();
    pl_tensor *x = pl_test_randn(PL_SHAPE(2, 3, 5), 21);
    pl_tensor *w0 = pl_test_randn(PL_SHAPE(4, 5), 22);
    pl_tensor *a = pl_test_randn(PL_SHAPE(4, 5), 23);
    pl_tensor *b = pl_test_randn(PL_SHAPE(4, 4), 24);
    pl_tensor *g = pl_test_randn(PL_SHAPE(2, 2), 25);
    pl_tensor *gi = pl_tensor_from_data(PL_I64, 1, (int64_t[]){4}, (int64_t[]){0, 0, 1, 1}, PL_CPU);
    pl_tensor *leaf[4] = {x, a, b, g};
    for (int i = 0; i < 4; i++)
        pl_tensor_set_requires_grad(leaf[i], true);
    ilora_branch bc;
    pl_tensor *y = PL_CK_NOTNULL(ilora_moe_lora_linear_ck(
        x, w0, a, b, ilora_gate_expand(pl_softmax(g), gi), 1.5, 0.5, 7, 3, true, PL_F32,
        recompute ? &bc : NULL));
    PL_CK_OK(pl_tape_held_bytes(NULL, 0, tape));
    pl_tensor *loss = pl_sum(pl_mul(y, y), -1, false);
    loss = pl_sum(loss, -1, false);
    loss = pl_sum(loss, -1, false);
    PL_CK_OK(pl_backward(loss, 1.0));
    pl_tensor *t[5] = {y, x->grad, a->grad, b->grad, g->grad};
    for (int i = 0; i < 5; i++) {
        keep[i] = pl_frame_keep(PL_CK_NOTNULL(t[i]));
        outs[i] = pl_tensor_f32(keep[i]);
    }
    pl_frame_end();
}

START_TEST(recomputed_adapter_branch_is_bit_identical_and_keeps_less) {
    const float *o1[5], *o2[5];
    pl_tensor *k1[5], *k2[5];
    size_t tape1, tape2;
    branch_run(false, o1, k1, &tape1);
    branch_run(true, o2, k2, &tape2);
    for (int i = 0; i < 5; i++) {
        int64_t n = pl_tensor_numel(k1[i]);
        ck_assert_int_eq(n, pl_tensor_numel(k2[i]));
        ck_assert_msg(memcmp(o1[i], o2[i], (size_t)n * sizeof(float)) == 0,
                      "output %d differs between the composed and the recomputed branch", i);
    }
    /* the composed branch (pl_lora_add_dropout) keeps x (a leaf here, not
     * counted), the gates and t = drop(x) A^T [6, 4]; the recomputed one x
     * and the gates: since the dropout moved into the op, t is the whole
     * difference (before, a dropped copy of x and its mask) */
    ck_assert_msg(tape2 < tape1, "tape: recomputed %zu bytes, composed %zu", tape2, tape1);
    for (int i = 0; i < 5; i++) {
        pl_tensor_release(k1[i]);
        pl_tensor_release(k2[i]);
    }
}
END_TEST

/* The projection as ilora computed it before pl_lora_add (ilora_layers.c
 * until 2026-11-27), from the public ops: y = x W0^T, then y + scale *
 * linear(linear(dropout(x), A) * gexp, B). */
static pl_tensor *old_chain(pl_tensor *x, pl_tensor *w0, pl_tensor *a, pl_tensor *b,
                            pl_tensor *gexp, double scale, double p, uint64_t seed,
                            uint64_t counter) {
    pl_tensor *y = pl_linear(x, w0, NULL);
    if (y && y->dtype != x->dtype) y = pl_cast(y, x->dtype);
    pl_tensor *xa = pl_linear(pl_dropout(x, p, seed, counter, true), a, NULL);
    pl_tensor *d = pl_scale(pl_linear(pl_mul(xa, gexp), b, NULL), scale);
    return pl_add(y, d);
}

/* One training forward + backward (loss sum(out * w)) of the projection:
 * fused (ilora_moe_lora_linear_ck, pl_lora_add) or the old chain, with
 * dropout 0.25, under autocast ac (PL_F32: off); out, dx, dA, dB, d logits
 * of the router into o[5][...] as doubles. */
static void proj_run(bool fused, pl_dtype ac, double o[5][64]) {
    pl_frame_begin();
    if (ac != PL_F32) PL_CK_OK(pl_autocast_begin(ac));
    pl_tensor *x = pl_test_randn(PL_SHAPE(2, 3, 5), 41);
    pl_tensor *w0 = pl_test_randn(PL_SHAPE(4, 5), 42);
    pl_tensor *a = pl_test_randn(PL_SHAPE(4, 5), 43);
    pl_tensor *b = pl_test_randn(PL_SHAPE(4, 4), 44);
    pl_tensor *g = pl_test_randn(PL_SHAPE(2, 2), 45);
    pl_tensor *w = pl_test_randn(PL_SHAPE(2, 3, 4), 46);
    pl_tensor *gi = pl_tensor_from_data(PL_I64, 1, (int64_t[]){4}, (int64_t[]){0, 0, 1, 1}, PL_CPU);
    pl_tensor *leaf[4] = {x, a, b, g};
    for (int i = 0; i < 4; i++)
        pl_tensor_set_requires_grad(leaf[i], true);
    pl_tensor *gexp = ilora_gate_expand(pl_softmax(g), gi);
    pl_tensor *y = PL_CK_NOTNULL(
        fused ? ilora_moe_lora_linear_ck(x, w0, a, b, gexp, 1.5, 0.25, 7, 3, true, PL_F32, NULL)
              : old_chain(x, w0, a, b, gexp, 1.5, 0.25, 7, 3));
    ck_assert_int_eq(y->dtype, PL_F32);
    PL_CK_OK(pl_backward(pl_sum(pl_mul(y, w), PL_ALL_DIMS, false), 1.0));
    pl_tensor *t[5] = {y, x->grad, a->grad, b->grad, g->grad};
    for (int i = 0; i < 5; i++)
        for (int64_t j = 0; j < pl_tensor_numel(PL_CK_NOTNULL(t[i])); j++)
            o[i][j] = pl_tensor_get(t[i], j);
    if (ac != PL_F32) pl_autocast_end();
    pl_frame_end();
}

/* The fused projection gives the old chain's values and gradients: in f32
 * to float reassociation; under bf16 autocast (bf16-mixed) within the two
 * bf16 roundings of the branch that the fused op skips (ops.h). */
START_TEST(fused_projection_equals_the_old_chain) {
    static const int n[5] = {24, 30, 20, 16, 4};
    static const char *what[5] = {"out", "dx", "dA", "dB", "d router logits"};
    const pl_dtype acs[2] = {PL_F32, PL_BF16};
    const double tol[2] = {2e-6, 2e-2};
    for (int k = 0; k < 2; k++) {
        double f[5][64], c[5][64];
        proj_run(true, acs[k], f);
        proj_run(false, acs[k], c);
        for (int i = 0; i < 5; i++)
            for (int j = 0; j < n[i]; j++)
                ck_assert_msg(fabs(f[i][j] - c[i][j]) <= tol[k] * (1 + fabs(c[i][j])),
                              "autocast %s: %s[%d] fused %.9g, old chain %.9g",
                              pl_dtype_name(acs[k]), what[i], j, f[i][j], c[i][j]);
    }
}
END_TEST

START_TEST(single_expert_equals_plain_lora_by_hand) {
    pl_frame_begin();
    const int64_t Bn = 2, T = 3, In = 5, Out = 4, R = 3;
    pl_tensor *x = pl_test_randn(PL_SHAPE(Bn, T, In), 11);
    pl_tensor *w0 = pl_test_randn(PL_SHAPE(Out, In), 12);
    pl_tensor *a = pl_test_randn(PL_SHAPE(R, In), 13);
    pl_tensor *b = pl_test_randn(PL_SHAPE(Out, R), 14);
    const double scale = 32.0 / 3.0;
    pl_tensor *y = PL_CK_NOTNULL(
        ilora_moe_lora_linear(x, w0, a, b, NULL, scale, 0.0, 0, 0, false));
    /* one expert through the gated path: gate 1 for every sample */
    pl_tensor *g1 = pl_tensor_full(PL_F32, 2, (int64_t[]){Bn, 1}, 1.0, PL_CPU);
    pl_tensor *gi = pl_tensor_zeros(PL_I64, 1, (int64_t[]){R}, PL_CPU);
    pl_tensor *y1 = PL_CK_NOTNULL(ilora_moe_lora_linear(x, w0, a, b, ilora_gate_expand(g1, gi),
                                                        scale, 0.0, 0, 0, false));
    const float *X = pl_tensor_f32(x), *W = pl_tensor_f32(w0), *A = pl_tensor_f32(a),
                *Bm = pl_tensor_f32(b);
    for (int64_t n = 0; n < Bn * T; n++)
        for (int64_t o = 0; o < Out; o++) {
            double base = 0, lora = 0;
            for (int64_t i = 0; i < In; i++)
                base += (double)W[o * In + i] * X[n * In + i];
            for (int64_t r = 0; r < R; r++) {
                double ax = 0;
                for (int64_t i = 0; i < In; i++)
                    ax += (double)A[r * In + i] * X[n * In + i];
                lora += (double)Bm[o * R + r] * ax;
            }
            double want = base + scale * lora;
            ck_assert_double_eq_tol(pl_tensor_get(y, n * Out + o), want, 1e-4 * (1 + fabs(want)));
            ck_assert_double_eq_tol(pl_tensor_get(y1, n * Out + o), want, 1e-4 * (1 + fabs(want)));
        }
    pl_frame_end();
}
END_TEST

/* ---- model vs PyTorch -------------------------------------------------------------------- */

static void check_logits(pl_tensor *lg, pl_st_file *f, const char *name, const int32_t *ids,
                         int64_t B, int64_t L, double tol) {
    pl_tensor *want = PL_CK_NOTNULL(pl_st_load(f, name));
    int64_t V = want->shape[2];
    ck_assert_int_eq(pl_tensor_numel(lg), B * L * V);
    double md = 0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < L; t++) {
            if (ids[b * L + t] == 0) continue; /* padding rows: undefined in both */
            for (int64_t v = 0; v < V; v++) {
                int64_t i = (b * L + t) * V + v;
                md = fmax(md, fabs(pl_tensor_get(lg, i) - pl_tensor_get(want, i)));
            }
        }
    ck_assert_msg(md < tol, "%s: max |diff| %g >= %g", name, md, tol);
    pl_tensor_release(want);
}

static void check_grads(pl_params *ps, pl_st_file *f, const char *prefix, bool adapters) {
    int checked = 0;
    for (int i = 0; i < pl_params_count(ps); i++) {
        pl_param *p = pl_params_at(ps, i);
        char key[PL_NAME_MAX + 32];
        snprintf(key, sizeof key, "%s%s", prefix, p->name);
        pl_dtype dt;
        int nd;
        int64_t sh[PL_MAX_DIMS];
        bool in_ref = pl_st_info(f, key, &dt, &nd, sh) == PL_OK;
        pl_error_clear();
        ck_assert_msg(in_ref == p->t->requires_grad, "%s: trainable %d but reference grad %d",
                      p->name, p->t->requires_grad, in_ref);
        if (!in_ref) continue;
        ck_assert_msg(p->t->grad != NULL, "%s: no gradient", p->name);
        pl_tensor *want = pl_st_load(f, key);
        double d = pl_test_max_abs_diff(p->t->grad, want);
        ck_assert_msg(d < 2e-5, "%s: gradient max |diff| %g", p->name, d);
        pl_tensor_release(want);
        checked++;
    }
    ck_assert_int_gt(checked, adapters ? 20 : 10);
}

START_TEST(model_matches_pytorch_reference) {
    pl_st_file *f = NULL;
    PL_CK_OK(pl_st_open(ref_path(), &f));
    pl_tensor *ids = PL_CK_NOTNULL(pl_st_load(f, "input_ids"));
    pl_tensor *labels = PL_CK_NOTNULL(pl_st_load(f, "labels"));
    const int64_t B = ids->shape[0], L = ids->shape[1];
    const int32_t *iv = pl_tensor_i32(ids);
    for (int mode = 0; mode < 2; mode++) {
        bool adapt = mode == 1;
        env e;
        env_init(&e, 7, 0);
        ilora_opts o = small_opts(adapt ? ILORA_MOE_LORA : ILORA_NONE);
        o.router_input = ILORA_ROUTER_MEAN_EMBEDDING; /* the reference's per-row router */
        ilora_model *m = NULL;
        PL_CK_OK(ilora_model_create(&o, &e.ctx, &m));
        load_params(f, e.ctx.params);
        /* eval logits */
        pl_frame_begin();
        pl_no_grad_begin();
        pl_tensor *lg = PL_CK_NOTNULL(ilora_logits(m, ilora_hidden(m, ids, false)));
        check_logits(lg, f, adapt ? "expected.logits" : "expected.logits_base", iv, B, L, 2e-5);
        if (adapt) {
            pl_tensor *g = PL_CK_NOTNULL(ilora_gates(m, ids));
            pl_tensor *want = pl_st_load(f, "expected.gates");
            ck_assert_double_le(pl_test_max_abs_diff(g, want), 1e-6);
            pl_tensor_release(want);
        }
        pl_no_grad_end();
        pl_frame_end();
        /* training loss and gradients (dropout 0) through the vtable's forward */
        pl_batch bt = {.n = 2, .names = {"input_ids", "labels"}, .fields = {ids, labels}, .size = B};
        pl_frame_begin();
        pl_tensor *loss = NULL;
        pl_metrics mt;
        pl_metrics_reset(&mt);
        PL_CK_OK(ilora_forward(m, &bt, PL_SPLIT_TRAIN, true, &loss, &mt));
        pl_tensor *wl = pl_st_load(f, adapt ? "expected.loss" : "expected.base_loss");
        ck_assert_double_eq_tol(pl_tensor_item(loss), pl_tensor_item(wl), 1e-5);
        pl_tensor_release(wl);
        PL_CK_OK(pl_backward(loss, 1.0));
        pl_frame_end();
        check_grads(e.ctx.params, f, adapt ? "expected.grad." : "expected.base_grad.", adapt);
        ilora_model_destroy(m);
        env_free(&e);
    }
    pl_tensor_release(ids);
    pl_tensor_release(labels);
    pl_st_close(f);
}
END_TEST

/* ---- the router ---------------------------------------------------------------------------- */

static const char *router_ref_path(void) {
    static char p[1024];
    snprintf(p, sizeof p, "%s/tests/data/ilora/reference_router.safetensors", PL_TEST_SOURCE_DIR);
    return p;
}

/* Every lora_B of `ps` to U(-0.5, 0.5) (they start at zero). */
static void random_lora_b(pl_params *ps, uint64_t seed) {
    for (int i = 0; i < pl_params_count(ps); i++) {
        pl_param *p = pl_params_at(ps, i);
        if (strstr(p->name, "lora_B")) PL_CK_OK(pl_tensor_uniform_(p->t, -0.5, 0.5, seed, (uint64_t)i));
    }
}

static ilora_opts router_opts(void) {
    ilora_opts o = small_opts(ILORA_MOE_LORA); /* router_input = last_hidden: the default */
    ck_assert_int_eq(o.router_input, ILORA_ROUTER_LAST_HIDDEN);
    o.router_temperature = 0.7;
    o.router_aux_loss_coef = 0.3;
    o.router_entropy_coef = 0.2;
    return o;
}

/* tools/gen_ilora_reference.py --router: gates per position from the
 * backbone's hidden states, temperature, load-balancing and entropy terms. */
START_TEST(router_over_hidden_states_matches_pytorch_reference) {
    pl_st_file *f = NULL;
    PL_CK_OK(pl_st_open(router_ref_path(), &f));
    pl_tensor *ids = PL_CK_NOTNULL(pl_st_load(f, "input_ids"));
    pl_tensor *labels = PL_CK_NOTNULL(pl_st_load(f, "labels"));
    const int64_t B = ids->shape[0], L = ids->shape[1];
    env e;
    env_init(&e, 7, 0);
    ilora_opts o = router_opts();
    ilora_model *m = NULL;
    PL_CK_OK(ilora_model_create(&o, &e.ctx, &m));
    load_params(f, e.ctx.params);
    pl_frame_begin();
    pl_no_grad_begin();
    pl_tensor *lg = PL_CK_NOTNULL(ilora_logits(m, ilora_hidden(m, ids, false)));
    check_logits(lg, f, "expected.logits", pl_tensor_i32(ids), B, L, 2e-5);
    pl_tensor *g = PL_CK_NOTNULL(ilora_gates(m, ids));
    ck_assert_int_eq(g->ndim, 3);
    pl_tensor *want = pl_st_load(f, "expected.gates");
    ck_assert_double_le(pl_test_max_abs_diff(g, want), 1e-6);
    pl_tensor_release(want);
    pl_no_grad_end();
    pl_frame_end();
    pl_batch bt = {.n = 2, .names = {"input_ids", "labels"}, .fields = {ids, labels}, .size = B};
    pl_frame_begin();
    pl_tensor *loss = NULL;
    pl_metrics mt;
    pl_metrics_reset(&mt);
    PL_CK_OK(ilora_forward(m, &bt, PL_SPLIT_TRAIN, true, &loss, &mt));
    pl_tensor *wl = pl_st_load(f, "expected.loss");
    ck_assert_double_eq_tol(pl_tensor_item(loss), pl_tensor_item(wl), 1e-5);
    pl_tensor_release(wl);
    PL_CK_OK(pl_backward(loss, 1.0));
    pl_frame_end();
    check_grads(e.ctx.params, f, "expected.grad.", true);
    ilora_model_destroy(m);
    env_free(&e);
    pl_tensor_release(ids);
    pl_tensor_release(labels);
    pl_st_close(f);
}
END_TEST

/* Position t's gates and logits depend on items <= t only (no look-ahead in
 * training), and the gates do not depend on the adapters. */
START_TEST(router_over_hidden_states_is_causal) {
    env e;
    env_init(&e, 31, 0);
    ilora_opts o = small_opts(ILORA_MOE_LORA);
    o.num_experts = 2;
    o.init_std = 0.5;
    ilora_model *m = NULL;
    PL_CK_OK(ilora_model_create(&o, &e.ctx, &m));
    random_lora_b(e.ctx.params, 3); /* non-zero B: the adapters matter */
    const int32_t a[12] = {0, 3, 7, 1, 12, 2, 5, 2, 9, 9, 11, 4};
    int32_t b[12];
    memcpy(b, a, sizeof b);
    const int64_t t = 2; /* change every item after position t */
    for (int r = 0; r < 2; r++)
        for (int64_t j = t + 1; j < 6; j++) b[r * 6 + j] = 1 + (a[r * 6 + j] + 4) % 12;
    pl_frame_begin();
    pl_no_grad_begin();
    pl_tensor *ia = ids_tensor(a, 2, 6), *ib = ids_tensor(b, 2, 6);
    pl_tensor *ga = PL_CK_NOTNULL(ilora_gates(m, ia)), *gb = PL_CK_NOTNULL(ilora_gates(m, ib));
    pl_tensor *la = PL_CK_NOTNULL(ilora_logits(m, ilora_hidden(m, ia, false)));
    pl_tensor *lb = PL_CK_NOTNULL(ilora_logits(m, ilora_hidden(m, ib, false)));
    double dg = 0, dl = 0, later = 0;
    for (int r = 0; r < 2; r++)
        for (int64_t j = 0; j < 6; j++) {
            for (int k = 0; k < 2; k++) {
                double d = fabs(pl_tensor_get(ga, (r * 6 + j) * 2 + k) -
                                pl_tensor_get(gb, (r * 6 + j) * 2 + k));
                if (j <= t) dg = fmax(dg, d);
                else later = fmax(later, d);
            }
            for (int v = 0; j <= t && v < 13; v++)
                dl = fmax(dl, fabs(pl_tensor_get(la, (r * 6 + j) * 13 + v) -
                                   pl_tensor_get(lb, (r * 6 + j) * 13 + v)));
        }
    ck_assert_msg(dg < 1e-6 && dl < 1e-5, "positions <= t changed: gates %g logits %g", dg, dl);
    ck_assert_msg(later > 1e-3, "the later positions' gates did not change (%g)", later);
    /* the router reads the backbone alone: zero B changes the logits, not the gates */
    for (int i = 0; i < pl_params_count(e.ctx.params); i++) {
        pl_param *p = pl_params_at(e.ctx.params, i);
        if (strstr(p->name, "lora_B")) PL_CK_OK(pl_tensor_fill_(p->t, 0.0));
    }
    pl_tensor *g0 = PL_CK_NOTNULL(ilora_gates(m, ia));
    ck_assert_double_le(pl_test_max_abs_diff(g0, ga), 1e-7);
    /* and equal softmax(router(h)) of the backbone's own hidden states, by hand */
    pl_tensor *h = PL_CK_NOTNULL(ilora_hidden(m, ia, false)); /* B = 0: the backbone */
    pl_param *rw = PL_CK_NOTNULL(pl_params_find(e.ctx.params, "router.weight"));
    pl_param *rb = PL_CK_NOTNULL(pl_params_find(e.ctx.params, "router.bias"));
    double md = 0;
    for (int64_t n = 0; n < 12; n++) {
        double z[2], mx = -INFINITY, s = 0;
        for (int k = 0; k < 2; k++) {
            z[k] = pl_tensor_get(rb->t, k);
            for (int d = 0; d < 8; d++) z[k] += pl_tensor_get(rw->t, k * 8 + d) * pl_tensor_get(h, n * 8 + d);
            mx = fmax(mx, z[k]);
        }
        for (int k = 0; k < 2; k++) s += exp(z[k] - mx);
        for (int k = 0; k < 2; k++) md = fmax(md, fabs(exp(z[k] - mx) / s - pl_tensor_get(g0, n * 2 + k)));
    }
    ck_assert_double_le(md, 1e-6);
    /* the gates' forward checks the length as the model's does */
    const int32_t long_row[7] = {1, 2, 3, 4, 5, 6, 7};
    ck_assert_ptr_null(ilora_gates(m, ids_tensor(long_row, 1, 7)));
    ck_assert_int_eq(pl_error_status(), PL_ERR_SHAPE);
    ck_assert_ptr_nonnull(strstr(pl_error_message(), "max_len"));
    pl_error_clear();
    pl_no_grad_end();
    pl_frame_end();
    ilora_model_destroy(m);
    env_free(&e);
}
END_TEST

/* Two experts, both router terms on, wide init: the model the router-loss
 * tests train (seed 17). */
static ilora_model *router_loss_model(env *e) {
    env_init(e, 17, 0);
    ilora_opts o = router_opts();
    o.num_experts = 2;
    o.router_aux_loss_coef = 1.0;
    o.router_entropy_coef = 1.0;
    o.init_std = 0.5;
    ilora_model *m = NULL;
    PL_CK_OK(ilora_model_create(&o, &e->ctx, &m));
    return m;
}

/* Central differences of the training loss (CE + load balancing + entropy)
 * in the router's weight and bias against the backward pass. */
START_TEST(router_loss_gradients_match_central_differences) {
    env e;
    ilora_model *m = router_loss_model(&e);
    random_lora_b(e.ctx.params, 5);
    const int32_t idv[12] = {0, 3, 7, 1, 12, 2, 5, 2, 9, 9, 11, 4};
    const int32_t lab[12] = {0, 7, 1, 12, 2, 0, 2, 9, 9, 11, 4, 10};
    pl_tensor *ids = ids_tensor(idv, 2, 6), *labels = ids_tensor(lab, 2, 6);
    pl_batch bt = {.n = 2, .names = {"input_ids", "labels"}, .fields = {ids, labels}, .size = 2};
    pl_param *ps[2] = {PL_CK_NOTNULL(pl_params_find(e.ctx.params, "router.weight")),
                       PL_CK_NOTNULL(pl_params_find(e.ctx.params, "router.bias"))};
    pl_frame_begin();
    pl_tensor *loss = NULL;
    PL_CK_OK(ilora_forward(m, &bt, PL_SPLIT_TRAIN, true, &loss, NULL));
    PL_CK_OK(pl_backward(loss, 1.0));
    pl_frame_end();
    int checked = 0;
    for (int q = 0; q < 2; q++) {
        pl_tensor *w = ps[q]->t;
        float *wv = pl_tensor_f32(w);
        for (int64_t i = 0; i < pl_tensor_numel(w); i += (q ? 1 : 3)) {
            const double eps = 1e-2;
            double fx[2];
            float keep = wv[i];
            for (int s = 0; s < 2; s++) {
                wv[i] = keep + (float)(s ? -eps : eps);
                pl_frame_begin();
                pl_no_grad_begin();
                pl_tensor *l = NULL;
                PL_CK_OK(ilora_forward(m, &bt, PL_SPLIT_TRAIN, true, &l, NULL));
                fx[s] = pl_tensor_item(l);
                pl_no_grad_end();
                pl_frame_end();
            }
            wv[i] = keep;
            double num = (fx[0] - fx[1]) / (2 * eps), an = pl_tensor_get(w->grad, i);
            ck_assert_msg(fabs(num - an) <= 2e-3 + 0.02 * fabs(num), "%s[%lld]: numerical %g, "
                          "backward %g", ps[q]->name, (long long)i, num, an);
            checked++;
        }
    }
    ck_assert_int_ge(checked, 8);
    pl_tensor_release(ids);
    pl_tensor_release(labels);
    ilora_model_destroy(m);
    env_free(&e);
}
END_TEST

/* On a device the training loss is built without reading the labels back
 * (every position scored, the sums masked; ilora_forward.c train_forward_device):
 * the same loss, count of labelled positions and gradients as the host
 * path's selection of the labelled positions, router terms over the
 * per-position gates included. A batch without a label: NaN there
 * (PyTorch's cross-entropy over nothing), 0 on the host path. */
START_TEST(device_loss_equals_the_host_selection) {
    env e;
    ilora_model *m = router_loss_model(&e);
    ck_assert(!m->device_loss); /* a CPU run selects on the host */
    random_lora_b(e.ctx.params, 5);
    const int32_t idv[12] = {0, 3, 7, 1, 12, 2, 5, 2, 9, 9, 11, 4};
    const int32_t lab[12] = {0, 7, 1, 12, 2, 0, 2, 9, 9, 11, 4, 10};
    pl_tensor *ids = ids_tensor(idv, 2, 6), *labels = ids_tensor(lab, 2, 6);
    pl_batch bt = {.n = 2, .names = {"input_ids", "labels"}, .fields = {ids, labels}, .size = 2};
    pl_param *rw = PL_CK_NOTNULL(pl_params_find(e.ctx.params, "router.weight"));
    double lv[2], cnt[2];
    pl_tensor *g[2];
    for (int k = 0; k < 2; k++) {
        m->device_loss = k == 1;
        pl_frame_begin();
        pl_metrics mt;
        pl_metrics_reset(&mt);
        pl_tensor *loss = NULL;
        PL_CK_OK(ilora_forward(m, &bt, PL_SPLIT_TRAIN, true, &loss, &mt));
        lv[k] = pl_tensor_item(loss);
        cnt[k] = mt.count[0];
        PL_CK_OK(pl_backward(loss, 1.0));
        pl_frame_end();
        g[k] = PL_CK_NOTNULL(pl_tensor_to(rw->t->grad, PL_F32, PL_CPU));
        pl_tensor_release(rw->t->grad);
        rw->t->grad = NULL;
    }
    ck_assert_double_eq(cnt[0], 10);
    ck_assert_double_eq(cnt[1], 10);
    ck_assert_double_eq_tol(lv[1], lv[0], 1e-6 * fabs(lv[0]));
    ck_assert_double_le(pl_test_max_abs_diff(g[0], g[1]), 1e-6);
    pl_tensor *z = pl_tensor_zeros_like(g[0]);
    ck_assert_double_gt(pl_test_max_abs_diff(g[0], z), 1e-4);
    pl_tensor_release(z);
    pl_tensor_release(g[0]);
    pl_tensor_release(g[1]);
    /* no labelled position */
    const int32_t none[12] = {0};
    pl_tensor *nl = ids_tensor(none, 2, 6);
    bt.fields[1] = nl;
    for (int k = 0; k < 2; k++) {
        m->device_loss = k == 1;
        pl_frame_begin();
        pl_tensor *loss = NULL;
        PL_CK_OK(ilora_forward(m, &bt, PL_SPLIT_TRAIN, true, &loss, NULL));
        double v = pl_tensor_item(loss);
        if (k) ck_assert(isnan(v));
        else ck_assert_double_eq(v, 0.0);
        pl_frame_end();
    }
    pl_tensor_release(nl);
    pl_tensor_release(ids);
    pl_tensor_release(labels);
    ilora_model_destroy(m);
    env_free(&e);
}
END_TEST

/* ilora_head_loss: the tied f32 head without distillation is one
 * pl_linear_cross_entropy (no logits handed back) with the loss and the
 * gradients of h and of the tied embedding of the chain ilora_logits +
 * pl_cross_entropy (loss within 2e-6 relative, gradients within 1e-6 of
 * their largest magnitude); with a distillation weight the logits are
 * needed and the chain runs (its logits handed back, the same loss). */
START_TEST(head_loss_is_fused_for_the_tied_head) {
    env e;
    env_init(&e, 31, 0);
    ilora_opts o = small_opts(ILORA_NONE);
    ilora_model *m = NULL;
    PL_CK_OK(ilora_model_create(&o, &e.ctx, &m));
    pl_tensor *h = PL_CK_NOTNULL(pl_test_randn(2, (int64_t[]){10, 8}, 77));
    pl_tensor_set_requires_grad(h, true);
    const int64_t tv[10] = {3, 0, 12, 1, 7, 7, 0, 9, 2, 11};
    pl_tensor *tg = PL_CK_NOTNULL(pl_tensor_from_data(PL_I64, 1, (int64_t[]){10}, tv, PL_CPU));
    double lv[3];
    pl_tensor *gh[2], *ge[2];
    for (int k = 0; k < 3; k++) { /* 0: fused, 1: the chain by hand, 2: kd_weight > 0 */
        m->o.kd_weight = k == 2 ? 0.5 : 0.0;
        pl_frame_begin();
        pl_tensor *lg = NULL, *loss;
        if (k == 1) {
            loss = pl_cross_entropy(ilora_logits(m, h), tg, 0, 0.0);
        } else {
            loss = ilora_head_loss(m, h, tg, 0, &lg);
            if (k == 0) ck_assert_ptr_null(lg);
            else ck_assert_ptr_nonnull(lg);
        }
        PL_CK_NOTNULL(loss);
        lv[k] = pl_tensor_item(loss);
        if (k < 2) {
            PL_CK_OK(pl_backward(loss, 1.0));
            gh[k] = h->grad;
            ge[k] = m->embed->grad;
            h->grad = m->embed->grad = NULL;
        }
        pl_frame_end();
    }
    m->o.kd_weight = 0;
    ck_assert_double_eq_tol(lv[0], lv[1], 2e-6 * fabs(lv[1]));
    ck_assert(lv[2] == lv[1]);
    for (int w = 0; w < 2; w++) {
        pl_tensor *a = w ? ge[0] : gh[0], *b = w ? ge[1] : gh[1];
        pl_tensor *z = pl_tensor_zeros_like(b);
        double mx = pl_test_max_abs_diff(b, z);
        ck_assert_double_gt(mx, 0);
        ck_assert_double_le(pl_test_max_abs_diff(a, b), 1e-6 * mx);
        pl_tensor_release(z);
        pl_tensor_release(a);
        pl_tensor_release(b);
    }
    pl_tensor_release(tg);
    pl_tensor_release(h);
    ilora_model_destroy(m);
    env_free(&e);
}
END_TEST

/* gate_entropy, gate_usage_k and gate_user_tv over an evaluation pass of two
 * batches equal the same statistics of the users' last-position gates
 * computed at once; a new pass (batch index 0) starts over. */
START_TEST(gate_statistics_cover_the_whole_split) {
    env e;
    env_init(&e, 23, 0);
    ilora_opts o = small_opts(ILORA_MOE_LORA);
    o.num_experts = 2;
    o.init_std = 0.5;
    ilora_model *m = NULL;
    PL_CK_OK(ilora_model_create(&o, &e.ctx, &m));
    PL_CK_OK(pl_tensor_uniform_(PL_CK_NOTNULL(pl_params_find(e.ctx.params, "router.weight"))->t,
                                -2, 2, 9, 1));
    const int32_t idv[24] = {0, 0, 4, 9, 2, 11, 3, 3, 8, 1, 12, 5,
                             0, 0, 0, 0, 0, 7, 6, 2, 10, 4, 4, 1};
    const int32_t tgt[4] = {6, 10, 2, 3};
    pl_frame_begin();
    pl_no_grad_begin();
    pl_tensor *all = ids_tensor(idv, 4, 6);
    pl_tensor *g = PL_CK_NOTNULL(ilora_gates(m, all)); /* [4, 6, 2] */
    double ent = 0, use[2] = {0}, tv = 0;
    for (int b = 0; b < 4; b++)
        for (int k = 0; k < 2; k++) {
            double p = pl_tensor_get(g, (b * 6 + 5) * 2 + k);
            ent -= p * log(p) / log(2.0) / 4;
            use[k] += p / 4;
        }
    for (int b = 0; b < 4; b++)
        for (int k = 0; k < 2; k++) tv += 0.5 * fabs(pl_tensor_get(g, (b * 6 + 5) * 2 + k) - use[k]) / 4;
    ck_assert_double_gt(tv, 1e-3); /* the users differ */
    for (int pass = 0; pass < 2; pass++) {
        pl_metrics mt;
        pl_metrics_reset(&mt);
        for (int half = 0; half < 2; half++) {
            pl_tensor *ids = ids_tensor(idv + half * 12, 2, 6);
            pl_tensor *tg = pl_tensor_from_data(PL_I32, 1, (int64_t[]){2}, tgt + half * 2, PL_CPU);
            pl_batch bt = {.n = 2, .names = {"input_ids", "target"}, .fields = {ids, tg},
                           .size = 2, .index = half};
            PL_CK_OK(ilora_forward(m, &bt, PL_SPLIT_VAL, false, NULL, &mt));
        }
        ck_assert_double_eq_tol(pl_metrics_get(&mt, "gate_entropy"), ent, 1e-6);
        ck_assert_double_eq_tol(pl_metrics_get(&mt, "gate_usage_0"), use[0], 1e-6);
        ck_assert_double_eq_tol(pl_metrics_get(&mt, "gate_usage_1"), use[1], 1e-6);
        ck_assert_double_eq_tol(pl_metrics_get(&mt, "gate_user_tv"), tv, 1e-6);
    }
    pl_no_grad_end();
    pl_frame_end();
    ilora_model_destroy(m);
    env_free(&e);
}
END_TEST

START_TEST(zero_lora_b_gives_the_backbone_outputs) {
    const int32_t idv[12] = {0, 0, 4, 9, 2, 11, 3, 3, 8, 1, 12, 5};
    pl_tensor *lg[2] = {0};
    for (int mode = 0; mode < 2; mode++) {
        env e;
        env_init(&e, 99, 0);
        ilora_opts o = small_opts(mode ? ILORA_MOE_LORA : ILORA_NONE);
        o.init_std = 0.5; /* visible logits */
        ilora_model *m = NULL;
        PL_CK_OK(ilora_model_create(&o, &e.ctx, &m));
        if (mode) { /* adapters are there, B is zero, A and the router are not */
            pl_param *pa = PL_CK_NOTNULL(pl_params_find(e.ctx.params,
                                                        "model.layers.1.mlp.up_proj.lora_A.weight"));
            ck_assert_double_gt(fabs(pl_tensor_get(pa->t, 0)), 0.0);
            ck_assert_ptr_nonnull(pl_params_find(e.ctx.params, "router.weight"));
        }
        pl_frame_begin();
        pl_tensor *ids = ids_tensor(idv, 2, 6);
        lg[mode] = pl_frame_keep(ilora_logits(m, ilora_hidden(m, ids, false)));
        pl_frame_end();
        ck_assert_ptr_nonnull(lg[mode]);
        ilora_model_destroy(m);
        env_free(&e);
    }
    ck_assert_double_le(pl_test_max_abs_diff(lg[0], lg[1]), 1e-6);
    ck_assert_double_gt(fabs(pl_tensor_get(lg[0], 5 * 13 + 3)), 1e-3); /* a real position */
    pl_tensor_release(lg[0]);
    pl_tensor_release(lg[1]);
}
END_TEST

START_TEST(llama_named_safetensors_loads_through_the_vtable) {
    /* a Llama-named file written with pl_st_writer from random tensors */
    const pl_plugin_desc *d = pl_plugin_entry();
    const pl_model_vtable *vt = d->vtable;
    ck_assert_int_eq(d->kind, PL_KIND_MODEL);
    char path[256];
    snprintf(path, sizeof path, "/tmp/test_ilora_llama_%d.safetensors", (int)getpid());
    const int64_t V = 21, D = 64, F = 176, NL = 2; /* defaults: dim 64, ffn 8/3*64 -> 176 */
    pl_st_writer *w = PL_CK_NOTNULL(pl_st_writer_new(path));
    uint64_t s = 1;
    char name[128];
    pl_tensor *emb = pl_test_randn(PL_SHAPE(V, D), s++);
    PL_CK_OK(pl_st_writer_add(w, "model.embed_tokens.weight", emb));
    for (int l = 0; l < NL; l++) {
        const char *pn[7] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                             "self_attn.o_proj", "mlp.gate_proj",    "mlp.up_proj",
                             "mlp.down_proj"};
        const int64_t od[7] = {D, D, D, D, F, F, D}, id[7] = {D, D, D, D, D, D, F};
        for (int i = 0; i < 7; i++) {
            snprintf(name, sizeof name, "model.layers.%d.%s.weight", l, pn[i]);
            pl_tensor *t = pl_test_randn(PL_SHAPE(od[i], id[i]), s++);
            PL_CK_OK(pl_st_writer_add(w, name, t));
            pl_tensor_release(t);
        }
        snprintf(name, sizeof name, "model.layers.%d.input_layernorm.weight", l);
        pl_tensor *t = pl_test_randn(PL_SHAPE(D), s++);
        PL_CK_OK(pl_st_writer_add(w, name, t));
        pl_tensor_release(t);
        snprintf(name, sizeof name, "model.layers.%d.post_attention_layernorm.weight", l);
        t = pl_test_randn(PL_SHAPE(D), s++);
        PL_CK_OK(pl_st_writer_add(w, name, t));
        pl_tensor_release(t);
    }
    pl_tensor *nrm = pl_test_randn(PL_SHAPE(D), s++);
    PL_CK_OK(pl_st_writer_add(w, "model.norm.weight", nrm));
    PL_CK_OK(pl_st_writer_meta(w, "format", "pt"));
    PL_CK_OK(pl_st_writer_commit(w));
    pl_st_writer_free(w);

    env e;
    env_init(&e, 3, V - 1); /* num_items from the loader's meta */
    void *self = NULL;
    PL_CK_OK(vt->create(NULL, &e.ctx, &self)); /* every option at its default */
    pl_st_file *f = NULL;
    PL_CK_OK(pl_st_open(path, &f));
    ck_assert_int_eq(pl_st_count(f), pl_params_count(e.ctx.params));
    for (int i = 0; i < pl_st_count(f); i++) {
        pl_param *p = pl_params_find(e.ctx.params, pl_st_name_at(f, i));
        ck_assert_msg(p != NULL, "file tensor %s is no model parameter", pl_st_name_at(f, i));
        PL_CK_OK(pl_st_load_into(f, p->name, p->t));
        pl_tensor *want = pl_st_load(f, p->name);
        ck_assert_double_eq(pl_test_max_abs_diff(p->t, want), 0.0);
        pl_tensor_release(want);
    }
    pl_param *pe = pl_params_find(e.ctx.params, "model.embed_tokens.weight");
    ck_assert_double_eq(pl_test_max_abs_diff(pe->t, emb), 0.0);
    /* a wrong shape is refused with the tensor's name */
    pl_param *pq = pl_params_find(e.ctx.params, "model.layers.0.mlp.down_proj.weight");
    ck_assert_int_ne(pl_st_load_into(f, "model.layers.0.mlp.up_proj.weight", pq->t), PL_OK);
    ck_assert_ptr_nonnull(strstr(pl_error_message(), "up_proj"));
    pl_st_close(f);
    vt->destroy(self);
    env_free(&e);
    pl_tensor_release(emb);
    pl_tensor_release(nrm);
    unlink(path);
}
END_TEST

/* ---- metrics through forward --------------------------------------------------------------- */

START_TEST(eval_metrics_exclude_history_and_padding) {
    env e;
    env_init(&e, 5, 0);
    ilora_opts o = small_opts(ILORA_NONE);
    o.init_std = 0.7;
    ilora_model *m = NULL;
    PL_CK_OK(ilora_model_create(&o, &e.ctx, &m));
    const int32_t idv[18] = {0, 0, 4, 9, 2, 11, 3, 3, 8, 1, 12, 5, 0, 0, 0, 0, 0, 7};
    const int32_t tgt[3] = {6, 10, 2};
    /* history: row 0 excludes 5 extra items beyond its window, row 2 nothing */
    const int32_t hist[3 * 4] = {4, 9, 1, 3, 8, 1, 12, 0, 0, 0, 0, 0};
    pl_frame_begin();
    pl_no_grad_begin();
    pl_tensor *ids = ids_tensor(idv, 3, 6);
    pl_tensor *tg = pl_tensor_from_data(PL_I32, 1, (int64_t[]){3}, tgt, PL_CPU);
    pl_tensor *hs = pl_tensor_from_data(PL_I32, 2, (int64_t[]){3, 4}, hist, PL_CPU);
    pl_batch bt = {.n = 3, .names = {"input_ids", "target", "history"}, .fields = {ids, tg, hs},
                   .size = 3};
    pl_metrics mt;
    pl_metrics_reset(&mt);
    pl_tensor *loss = NULL;
    PL_CK_OK(ilora_forward(m, &bt, PL_SPLIT_VAL, false, &loss, &mt));
    /* expected, independently: logits of the last position, exclusions by hand */
    pl_tensor *lg = ilora_logits(m, ilora_hidden(m, ids, false)); /* [3, 6, 13] */
    double hit = 0, ndcg = 0, ce = 0;
    int64_t ranks[3];
    for (int b = 0; b < 3; b++) {
        float row[13];
        for (int v = 0; v < 13; v++)
            row[v] = (float)pl_tensor_get(lg, (b * 6 + 5) * 13 + v);
        double mx = -INFINITY, z = 0;
        for (int v = 0; v < 13; v++)
            mx = fmax(mx, row[v]);
        for (int v = 0; v < 13; v++)
            z += exp(row[v] - mx);
        ce += -(row[tgt[b]] - mx - log(z));
        int64_t r = 0;
        for (int v = 1; v < 13; v++) {
            bool seen = false;
            for (int j = 0; j < 4; j++)
                seen |= hist[b * 4 + j] == v;
            if (!seen && v != tgt[b] && row[v] > row[tgt[b]]) r++;
        }
        ranks[b] = r;
        hit += r < 3;
        ndcg += r < 3 ? 1.0 / log2(r + 2.0) : 0.0;
    }
    /* metric_k 3 makes hits informative on 12 items */
    (void)ranks;
    pl_no_grad_end();
    pl_frame_end();
    ck_assert_double_eq_tol(pl_metrics_get(&mt, "loss"), ce / 3, 1e-5);
    ilora_model_destroy(m);
    env_free(&e);

    env_init(&e, 5, 0);
    o.metric_k = 3;
    PL_CK_OK(ilora_model_create(&o, &e.ctx, &m));
    pl_frame_begin();
    pl_no_grad_begin();
    ids = ids_tensor(idv, 3, 6);
    tg = pl_tensor_from_data(PL_I32, 1, (int64_t[]){3}, tgt, PL_CPU);
    hs = pl_tensor_from_data(PL_I32, 2, (int64_t[]){3, 4}, hist, PL_CPU);
    pl_batch b2 = {.n = 3, .names = {"input_ids", "target", "history"}, .fields = {ids, tg, hs},
                   .size = 3};
    pl_metrics_reset(&mt);
    PL_CK_OK(ilora_forward(m, &b2, PL_SPLIT_VAL, false, &loss, &mt));
    pl_no_grad_end();
    pl_frame_end();
    ck_assert_double_eq_tol(pl_metrics_get(&mt, "hit_ratio@3"), hit / 3, 1e-12);
    ck_assert_double_eq_tol(pl_metrics_get(&mt, "recall@3"), hit / 3, 1e-12);
    ck_assert_double_eq_tol(pl_metrics_get(&mt, "ndcg@3"), ndcg / 3, 1e-9);
    ilora_model_destroy(m);
    env_free(&e);
}
END_TEST

/* n scores of few distinct values (many ties): levels steps of `step` from
 * `base`, drawn by an LCG from seed */
static void tied_scores(float *sc, int n, uint32_t seed, uint32_t levels, float step, float base) {
    for (int i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        sc[i] = (float)((seed >> 16) % levels) * step + base;
    }
}

/* The host ranking's exclusions of one row (ilora_seen_mask's): item 0 and
 * the seen ids in [1, V) but `keep` to -inf; hist NULL: item 0 only. */
static void mask_seen(float *row, int64_t V, const int64_t *hist, int H, int64_t keep) {
    row[0] = -INFINITY;
    for (int j = 0; hist && j < H; j++)
        if (hist[j] > 0 && hist[j] < V && hist[j] != keep) row[hist[j]] = -INFINITY;
}

/* The device ranking (ranking.h) against the host's: scores with ties (the
 * target's score repeated), seen lists with duplicates, padding, ids outside
 * [1, V) and the target itself; one chunk, then chunks of 2 rows. */
START_TEST(device_ranking_equals_host_ranking) {
    env e;
    env_init(&e, 5, 0);
    enum { B = 5, V = 11, H = 6 };
    float sc[B * V];
    tied_scores(sc, B * V, 12345, 7, 0.25f, -0.5f);
    const int64_t tgt[B] = {3, 1, 10, 5, 7};
    const int64_t hist[B * H] = {3,  4,  4, 0, 9, 2, /* the target, a duplicate, padding */
                                 11, -1, 2, 2, 5, 6, /* ids outside [1, V) */
                                 0,  0,  0, 0, 0, 0, /* nothing */
                                 1,  2,  3, 4, 6, 7, 7, 7, 7, 8, 8, 10};
    int64_t want[B];
    for (int b = 0; b < B; b++) {
        float row[V];
        memcpy(row, sc + b * V, sizeof row);
        mask_seen(row, V, hist + b * H, H, tgt[b]);
        want[b] = ilora_rank_of(row, V, tgt[b]);
    }
    for (int pass = 0; pass < 3; pass++) {
        ilora_rank_chunk_elems = pass == 0 ? 1 << 20 : 2 * V; /* chunks of 2 rows */
        pl_frame_begin();
        pl_tensor *s = pl_tensor_from_data(PL_F32, 2, (int64_t[]){B, V}, sc, PL_CPU);
        pl_tensor *t = pl_tensor_from_data(PL_I64, 2, (int64_t[]){B, 1}, tgt, PL_CPU);
        pl_tensor *h = pl_tensor_from_data(PL_I64, 2, (int64_t[]){B, H}, hist, PL_CPU);
        pl_tensor *off = NULL;
        pl_tensor *r = ilora_rank_device(s, t, pass < 2 ? h : NULL, &off);
        ck_assert_msg(r != NULL, "%s", pl_error_message());
        ck_assert_int_eq(r->shape[0], B);
        for (int b = 0; b < B; b++) {
            int64_t w = want[b];
            if (pass == 2) { /* nothing seen: only item 0 is left out */
                w = 0;
                for (int v = 1; v < V; v++)
                    w += sc[b * V + v] > sc[b * V + tgt[b]];
            }
            ck_assert_msg(pl_tensor_get(r, b) == (double)w, "pass %d row %d: rank %g, want %lld",
                          pass, b, pl_tensor_get(r, b), (long long)w);
        }
        pl_frame_end();
        pl_tensor_release(off);
    }
    ilora_rank_chunk_elems = 1 << 20;
    env_free(&e);
}
END_TEST

/* The device top-k of `pipeline predict` (ranking.h, ilora_topk_device)
 * against the host's (item 0 and the seen items to -inf, then ilora_topk):
 * ties, a NaN and a +inf score in a row without seen items, seen lists with
 * duplicates, padding and ids outside [1, V); k from 1 to V, so -inf items
 * are picked too (lower id first); one chunk, chunks of 2 rows, no seen
 * list. Ids and values bit for bit. */
START_TEST(device_topk_equals_host_topk) {
    env e;
    env_init(&e, 5, 0);
    enum { B = 5, V = 11, H = 6 };
    float sc[B * V];
    tied_scores(sc, B * V, 777, 5, 0.5f, -1.0f);
    sc[2 * V + 4] = NAN;
    sc[2 * V + 6] = INFINITY;
    const int64_t hist[B * H] = {3,  4,  4, 0, 9, 2, 11, -1, 2, 2, 5, 6, 0, 0, 0,
                                 0,  0,  0, 1, 2, 3, 4,  6,  7, 7, 7, 7, 8, 8, 10};
    for (int pass = 0; pass < 3; pass++) {
        ilora_rank_chunk_elems = pass == 1 ? 2 * V : 1 << 20; /* pass 1: chunks of 2 rows */
        for (int64_t k = 1; k <= V; k += k < 4 ? 3 : V - 4) {
            pl_frame_begin();
            pl_tensor *s = pl_tensor_from_data(PL_F32, 2, (int64_t[]){B, V}, sc, PL_CPU);
            pl_tensor *h = pl_tensor_from_data(PL_I64, 2, (int64_t[]){B, H}, hist, PL_CPU);
            pl_tensor *off = NULL, *v = NULL, *ix = NULL;
            PL_CK_OK(ilora_topk_device(s, pass < 2 ? h : NULL, k, &off, &v, &ix));
            ck_assert_int_eq(v->shape[0], B);
            ck_assert_int_eq(v->shape[1], k);
            for (int b = 0; b < B; b++) {
                float row[V], wv[V];
                int32_t wi[V];
                memcpy(row, sc + b * V, sizeof row);
                mask_seen(row, V, pass < 2 ? hist + b * H : NULL, H, 0);
                ilora_topk(row, V, k, wi, wv);
                for (int64_t j = 0; j < k; j++) {
                    float gv = (float)pl_tensor_get(v, b * k + j);
                    int64_t gi = (int64_t)pl_tensor_get(ix, b * k + j);
                    ck_assert_msg(gi == wi[j] && memcmp(&gv, &wv[j], sizeof gv) == 0,
                                  "pass %d k %lld row %d pick %lld: item %lld (%g), host %d (%g)",
                                  pass, (long long)k, b, (long long)j, (long long)gi, gv, wi[j],
                                  wv[j]);
                }
            }
            pl_frame_end();
            pl_tensor_release(off);
        }
    }
    ilora_rank_chunk_elems = 1 << 20;
    env_free(&e);
}
END_TEST

/* ---- export ---------------------------------------------------------------------------------- */

/* A model destroyed in the middle of an export (a failed run) leaves no
 * teacher_outputs.h5 and no temporary file behind. */
START_TEST(aborted_export_leaves_no_file) {
    env e;
    env_init(&e, 5, 0);
    ilora_opts o = small_opts(ILORA_MOE_LORA);
    ilora_model *m = NULL;
    PL_CK_OK(ilora_model_create(&o, &e.ctx, &m));
    char dir[256];
    snprintf(dir, sizeof dir, "/tmp/test_ilora_abort_%d", (int)getpid());
    ck_assert_int_eq(mkdir(dir, 0700), 0);
    PL_CK_OK(ilora_export_begin(m, dir));
    ilora_model_destroy(m);
    DIR *d = opendir(dir);
    ck_assert_ptr_nonnull(d);
    int files = 0;
    for (struct dirent *de; (de = readdir(d));)
        files += de->d_name[0] != '.';
    closedir(d);
    ck_assert_int_eq(files, 0);
    rmdir(dir);
    env_free(&e);
}
END_TEST

START_TEST(export_writes_sorted_topk_per_position_and_user) {
    env e;
    env_init(&e, 5, 0);
    ilora_opts o = small_opts(ILORA_MOE_LORA);
    o.init_std = 0.7;
    o.export_top_k = 4;
    o.export_temperature = 2.0;
    ilora_model *m = NULL;
    PL_CK_OK(ilora_model_create(&o, &e.ctx, &m));
    char dir[256];
    snprintf(dir, sizeof dir, "/tmp/test_ilora_export_%d", (int)getpid());
    ck_assert_int_eq(mkdir(dir, 0700), 0);
    PL_CK_OK(ilora_export_begin(m, dir));
    const int32_t idv[12] = {0, 0, 4, 9, 2, 11, 3, 3, 8, 1, 12, 5};
    const int32_t lab[12] = {0, 0, 9, 2, 11, 7, 3, 8, 1, 12, 5, 6};
    const int32_t rows[2] = {17, 4};
    pl_frame_begin();
    pl_no_grad_begin();
    pl_tensor *ids = ids_tensor(idv, 2, 6);
    pl_tensor *lb = ids_tensor(lab, 2, 6);
    pl_tensor *rw = pl_tensor_from_data(PL_I32, 1, (int64_t[]){2}, rows, PL_CPU);
    pl_batch bt = {.n = 3, .names = {"input_ids", "labels", "row"}, .fields = {ids, lb, rw},
                   .size = 2};
    PL_CK_OK(ilora_export_batch(m, &bt, PL_SPLIT_TRAIN));
    PL_CK_OK(ilora_export_batch(m, &bt, PL_SPLIT_TRAIN)); /* appends */
    pl_tensor *tg = pl_tensor_from_data(PL_I32, 1, (int64_t[]){2}, (int32_t[]){6, 2}, PL_CPU);
    pl_tensor *us = pl_tensor_from_data(PL_I32, 1, (int64_t[]){2}, (int32_t[]){0, 1}, PL_CPU);
    pl_batch bv = {.n = 3, .names = {"input_ids", "target", "user_index"},
                   .fields = {ids, tg, us}, .size = 2};
    PL_CK_OK(ilora_export_batch(m, &bv, PL_SPLIT_TEST));
    { /* until export_end the file exists only under its temporary name */
        char fin[300];
        snprintf(fin, sizeof fin, "%s/teacher_outputs.h5", dir);
        ck_assert_int_ne(access(fin, F_OK), 0);
    }
    pl_tensor *lg = ilora_logits(m, ilora_hidden(m, ids, false)); /* [2, 6, 13] */
    pl_no_grad_end();
    PL_CK_OK(ilora_export_end(m));

    char path[300];
    snprintf(path, sizeof path, "%s/teacher_outputs.h5", dir);
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    ck_assert_int_ge(f, 0);
    int32_t tid[20][4], trow[20], tpos[20], tlab[20];
    float tv[20][4];
    hid_t d = H5Dopen2(f, "/train/topk_ids", H5P_DEFAULT);
    hid_t sp = H5Dget_space(d);
    hsize_t dims[2];
    H5Sget_simple_extent_dims(sp, dims, NULL);
    ck_assert_int_eq((int)dims[0], 20); /* 10 labelled positions per batch, twice */
    ck_assert_int_eq((int)dims[1], 4);
    H5Dread(d, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, tid);
    H5Sclose(sp);
    H5Dclose(d);
    d = H5Dopen2(f, "/train/topk_logits", H5P_DEFAULT);
    H5Dread(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, tv);
    H5Dclose(d);
    d = H5Dopen2(f, "/train/row", H5P_DEFAULT);
    H5Dread(d, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, trow);
    H5Dclose(d);
    d = H5Dopen2(f, "/train/pos", H5P_DEFAULT);
    H5Dread(d, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, tpos);
    H5Dclose(d);
    d = H5Dopen2(f, "/train/label", H5P_DEFAULT);
    H5Dread(d, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, tlab);
    H5Dclose(d);
    int32_t src[4], cin[4][6];
    d = H5Dopen2(f, "/train/source_row", H5P_DEFAULT);
    H5Dread(d, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, src);
    H5Dclose(d);
    d = H5Dopen2(f, "/train/input_ids", H5P_DEFAULT);
    H5Dread(d, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, cin);
    H5Dclose(d);
    for (int r = 0; r < 4; r++) { /* row copies in loader order, with the source rows */
        ck_assert_int_eq(src[r], rows[r % 2]);
        for (int t = 0; t < 6; t++)
            ck_assert_int_eq(cin[r][t], idv[(r % 2) * 6 + t]);
    }
    for (int i = 0; i < 20; i++) {
        ck_assert(trow[i] >= 0 && trow[i] < 4);
        ck_assert_int_eq(trow[i], (i % 10 < 4 ? 0 : 1) + (i >= 10 ? 2 : 0)); /* 4 + 6 labels */
        int r = trow[i] % 2;
        ck_assert_int_eq(tlab[i], lab[r * 6 + tpos[i]]);
        ck_assert_int_ne(lab[r * 6 + tpos[i]], 0);
        /* the best exported item is the argmax over items 1..12 of the logits / T */
        int best = 1;
        for (int v = 2; v < 13; v++)
            if (pl_tensor_get(lg, (r * 6 + tpos[i]) * 13 + v) >
                pl_tensor_get(lg, (r * 6 + tpos[i]) * 13 + best))
                best = v;
        ck_assert_int_eq(tid[i][0], best);
        ck_assert_double_eq_tol(tv[i][0], pl_tensor_get(lg, (r * 6 + tpos[i]) * 13 + best) / 2.0,
                                1e-5);
        for (int k = 0; k < 4; k++) {
            ck_assert_int_ne(tid[i][k], 0);
            if (k) ck_assert(tv[i][k] <= tv[i][k - 1]);
        }
    }
    d = H5Dopen2(f, "/test/topk_ids", H5P_DEFAULT);
    sp = H5Dget_space(d);
    H5Sget_simple_extent_dims(sp, dims, NULL);
    ck_assert_int_eq((int)dims[0], 2);
    H5Sclose(sp);
    H5Dclose(d);
    d = H5Dopen2(f, "/val/topk_ids", H5P_DEFAULT);
    sp = H5Dget_space(d);
    H5Sget_simple_extent_dims(sp, dims, NULL);
    ck_assert_int_eq((int)dims[0], 0);
    H5Sclose(sp);
    H5Dclose(d);
    double temp = 0;
    hid_t a = H5Aopen(f, "temperature", H5P_DEFAULT);
    H5Aread(a, H5T_NATIVE_DOUBLE, &temp);
    H5Aclose(a);
    ck_assert_double_eq(temp, 2.0);
    H5Fclose(f);
    pl_frame_end();
    unlink(path);
    rmdir(dir);
    ilora_model_destroy(m);
    env_free(&e);
}
END_TEST

/* ---- training behaviour --------------------------------------------------------------------- */

static double train_loss(ilora_model *m, pl_tensor *ids, pl_tensor *lab, bool backward) {
    pl_batch bt = {.n = 2, .names = {"input_ids", "labels"}, .fields = {ids, lab}, .size = 1};
    pl_frame_begin();
    pl_tensor *loss = NULL;
    pl_metrics mt;
    pl_metrics_reset(&mt);
    pl_status st = ilora_forward(m, &bt, PL_SPLIT_TRAIN, true, &loss, &mt);
    ck_assert_msg(st == PL_OK, "%s", pl_error_message());
    double v = pl_tensor_item(loss);
    if (backward) PL_CK_OK(pl_backward(loss, 1.0));
    else pl_tape_clear();
    pl_frame_end();
    return v;
}

START_TEST(dropout_masks_follow_the_micro_step) {
    env e;
    env_init(&e, 5, 0);
    ilora_opts o = small_opts(ILORA_MOE_LORA);
    o.dropout = 0.3;
    o.lora_dropout = 0.3;
    o.init_std = 0.5;
    ilora_model *m = NULL;
    PL_CK_OK(ilora_model_create(&o, &e.ctx, &m));
    /* non-zero B so the adapter dropout matters */
    for (int i = 0; i < pl_params_count(e.ctx.params); i++) {
        pl_param *p = pl_params_at(e.ctx.params, i);
        if (strstr(p->name, "lora_B")) PL_CK_OK(pl_tensor_normal_(p->t, 0, 0.3, 1, (uint64_t)i));
    }
    const int32_t idv[6] = {0, 4, 9, 2, 11, 3}, lab[6] = {0, 9, 2, 11, 3, 5};
    pl_tensor *ids = ids_tensor(idv, 1, 6), *lb = ids_tensor(lab, 1, 6);
    e.ctx.micro_step = 3;
    double a = train_loss(m, ids, lb, false);
    e.ctx.micro_step = 4;
    double b = train_loss(m, ids, lb, false);
    e.ctx.micro_step = 3;
    double c = train_loss(m, ids, lb, false);
    ck_assert(a == c);
    ck_assert(a != b);
    pl_tensor_release(ids);
    pl_tensor_release(lb);
    ilora_model_destroy(m);
    env_free(&e);
}
END_TEST

/* Synthetic sequences: each user walks the cycle 1..N with a personal stride
 * s in {1, 2}: next = (cur - 1 + s) % N + 1. Learnable only from context. */
START_TEST(tiny_fit_on_synthetic_sequences_lowers_the_loss) {
    env e;
    env_init(&e, 11, 0);
    ilora_opts o = small_opts(ILORA_NONE);
    o.dim = 16;
    o.ffn_dim = 0;
    o.max_len = 8;
    ilora_model *m = NULL;
    PL_CK_OK(ilora_model_create(&o, &e.ctx, &m));
    const int64_t B = 8, L = 8, N = 12;
    int32_t idv[64], lab[64];
    for (int b = 0; b < B; b++) {
        int s = 1 + (b % 2), cur = 1 + (b * 5) % (int)N;
        for (int t = 0; t < L; t++) {
            idv[b * L + t] = cur;
            cur = (cur - 1 + s) % (int)N + 1;
            lab[b * L + t] = cur;
        }
    }
    pl_tensor *ids = ids_tensor(idv, B, L), *lb = ids_tensor(lab, B, L);
    /* plain Adam (torch.optim.Adam formula), lr 0.02, 60 steps */
    int np = pl_params_count(e.ctx.params);
    float **mm = calloc((size_t)np, sizeof *mm), **vv = calloc((size_t)np, sizeof *vv);
    double first = 0, last = 0;
    for (int step = 1; step <= 60; step++) {
        for (int i = 0; i < np; i++)
            pl_tensor_zero_grad(pl_params_at(e.ctx.params, i)->t);
        e.ctx.micro_step = step;
        double l = train_loss(m, ids, lb, true);
        if (step == 1) first = l;
        last = l;
        for (int i = 0; i < np; i++) {
            pl_tensor *p = pl_params_at(e.ctx.params, i)->t;
            if (!p->grad) continue;
            int64_t n = pl_tensor_numel(p);
            if (!mm[i]) {
                mm[i] = calloc((size_t)n, sizeof(float));
                vv[i] = calloc((size_t)n, sizeof(float));
            }
            float *w = pl_tensor_f32(p), *g = pl_tensor_f32(p->grad);
            double b1 = 0.9, b2 = 0.999, lr = 0.02;
            for (int64_t j = 0; j < n; j++) {
                mm[i][j] = (float)(b1 * mm[i][j] + (1 - b1) * g[j]);
                vv[i][j] = (float)(b2 * vv[i][j] + (1 - b2) * g[j] * g[j]);
                double mh = mm[i][j] / (1 - pow(b1, step)), vh = vv[i][j] / (1 - pow(b2, step));
                w[j] -= (float)(lr * mh / (sqrt(vh) + 1e-8));
            }
        }
    }
    /* ln(13) = 2.56 at the start; the rule is deterministic given the context */
    ck_assert_msg(first > 2.3 && last < 0.5 * first, "loss %g -> %g", first, last);
    for (int i = 0; i < np; i++) {
        free(mm[i]);
        free(vv[i]);
    }
    free(mm);
    free(vv);
    pl_tensor_release(ids);
    pl_tensor_release(lb);
    ilora_model_destroy(m);
    env_free(&e);
}
END_TEST

START_TEST(last_position_forward_equals_the_full_forward) {
    /* evaluation and predict rank from ilora_last_hidden, which computes the
     * last layer for position L-1 only: the same logits as the full forward's
     * last position, with adapters and router, grouped-query attention, one
     * layer, and a row with left padding */
    const int32_t idv[18] = {0, 0, 4, 9, 2, 11, 3, 3, 8, 1, 12, 5, 0, 0, 0, 0, 0, 7};
    for (int mode = 0; mode < 3; mode++) {
        env e;
        env_init(&e, 5, 0);
        ilora_opts o = small_opts(mode == 1 ? ILORA_MOE_LORA : ILORA_NONE);
        o.init_std = 0.5; /* visible logits */
        if (mode == 2) {
            o.layers = 1;
            o.kv_heads = 1;
        }
        ilora_model *m = NULL;
        PL_CK_OK(ilora_model_create(&o, &e.ctx, &m));
        for (int i = 0; i < pl_params_count(e.ctx.params); i++) { /* adapters that do something */
            pl_param *p = pl_params_at(e.ctx.params, i);
            if (strstr(p->name, "lora_B"))
                PL_CK_OK(pl_tensor_normal_(p->t, 0, 0.2, 3, (uint64_t)i));
        }
        pl_frame_begin();
        pl_no_grad_begin();
        pl_tensor *ids = ids_tensor(idv, 3, 6);
        pl_tensor *full =
            PL_CK_NOTNULL(ilora_logits(m, ilora_hidden(m, ids, false)));             /* [3, 6, V] */
        pl_tensor *last = PL_CK_NOTNULL(ilora_logits(m, ilora_last_hidden(m, ids))); /* [3, V] */
        int64_t V = m->vocab;
        ck_assert_int_eq(last->ndim, 2);
        ck_assert_int_eq(last->shape[0], 3);
        ck_assert_int_eq(last->shape[1], V);
        double worst = 0, big = 0;
        for (int64_t b = 0; b < 3; b++)
            for (int64_t v = 0; v < V; v++) {
                double f = pl_tensor_get(full, (b * 6 + 5) * V + v);
                worst = fmax(worst, fabs(f - pl_tensor_get(last, b * V + v)));
                big = fmax(big, fabs(f));
            }
        ck_assert_double_le(worst, 1e-5);
        ck_assert_double_gt(big, 1e-2);
        pl_no_grad_end();
        pl_frame_end();
        ilora_model_destroy(m);
        env_free(&e);
    }
}
END_TEST

START_TEST(nf4_base_weights_give_the_dequantized_model) {
    /* qlora4 replaces frozen base projections by nf4 tensors; base_linear must
     * then compute x @ dequant(W)^T, and the adapters still get gradients */
    const int32_t idv[12] = {0, 0, 4, 9, 2, 11, 3, 3, 8, 1, 12, 5};
    const int32_t lab[12] = {0, 0, 9, 2, 11, 7, 3, 8, 1, 12, 5, 6};
    pl_tensor *lg[2] = {0};
    double loss[2];
    for (int mode = 0; mode < 2; mode++) {
        env e;
        env_init(&e, 21, 0);
        ilora_opts o = small_opts(ILORA_MOE_LORA);
        o.init_std = 0.5;
        ilora_model *m = NULL;
        PL_CK_OK(ilora_model_create(&o, &e.ctx, &m));
        for (int i = 0; i < pl_params_count(e.ctx.params); i++) {
            pl_param *p = pl_params_at(e.ctx.params, i);
            if (strstr(p->name, "lora_B")) PL_CK_OK(pl_tensor_normal_(p->t, 0, 0.2, 3, (uint64_t)i));
            if (!(p->tags & PL_TAG_BASE)) continue;
            pl_tensor *q = PL_CK_NOTNULL(pl_nf4_quantize(p->t, 64, false));
            if (mode == 1) {
                PL_CK_OK(pl_params_replace(e.ctx.params, i, q));
            } else { /* the f32 model holds the dequantized values */
                pl_tensor *dq = PL_CK_NOTNULL(pl_nf4_dequantize(q, PL_F32));
                PL_CK_OK(pl_tensor_copy_(p->t, dq));
                pl_tensor_release(dq);
            }
            pl_tensor_release(q);
        }
        pl_frame_begin();
        pl_no_grad_begin();
        pl_tensor *ids = ids_tensor(idv, 2, 6);
        lg[mode] = pl_frame_keep(ilora_logits(m, ilora_hidden(m, ids, false)));
        pl_no_grad_end();
        pl_frame_end();
        ck_assert_ptr_nonnull(lg[mode]);
        /* the model picked up the replaced tensors from the params list */
        ck_assert_int_eq(m->layer[1].proj[6].w->dtype, mode ? PL_NF4 : PL_F32);
        pl_tensor *it = ids_tensor(idv, 2, 6), *lt = ids_tensor(lab, 2, 6);
        loss[mode] = train_loss(m, it, lt, true);
        pl_param *pa = pl_params_find(e.ctx.params, "model.layers.0.self_attn.q_proj.lora_A.weight");
        ck_assert_ptr_nonnull(pa->t->grad);
        pl_tensor_release(it);
        pl_tensor_release(lt);
        ilora_model_destroy(m);
        env_free(&e);
    }
    ck_assert_double_le(pl_test_max_abs_diff(lg[0], lg[1]), 1e-4);
    ck_assert_double_eq_tol(loss[0], loss[1], 1e-4);
    pl_tensor_release(lg[0]);
    pl_tensor_release(lg[1]);
}
END_TEST

START_TEST(bad_options_are_refused_with_the_key) {
    env e;
    env_init(&e, 1, 0);
    ilora_opts o = small_opts(ILORA_MOE_LORA);
    o.num_experts = 3; /* 4 % 3 != 0 */
    ilora_model *m = NULL;
    ck_assert_int_eq(ilora_model_create(&o, &e.ctx, &m), PL_ERR_CONFIG);
    ck_assert_ptr_nonnull(strstr(pl_error_message(), "lora_rank"));
    o = small_opts(ILORA_NONE);
    o.heads = 3;
    ck_assert_int_eq(ilora_model_create(&o, &e.ctx, &m), PL_ERR_CONFIG);
    o = small_opts(ILORA_NONE);
    o.num_items = 0; /* and no meta */
    ck_assert_int_eq(ilora_model_create(&o, &e.ctx, &m), PL_ERR_CONFIG);
    ck_assert_ptr_nonnull(strstr(pl_error_message(), "num_items"));
    /* bounds an INI gets from the option table, refused for C callers too */
    o = small_opts(ILORA_MOE_LORA);
    o.num_experts = ILORA_MAX_EXPERTS + 1;
    ck_assert_int_eq(ilora_model_create(&o, &e.ctx, &m), PL_ERR_CONFIG);
    ck_assert_ptr_nonnull(strstr(pl_error_message(), "num_experts"));
    o = small_opts(ILORA_MOE_LORA);
    o.num_experts = 0;
    ck_assert_int_eq(ilora_model_create(&o, &e.ctx, &m), PL_ERR_CONFIG);
    o = small_opts(ILORA_MOE_LORA);
    o.router_temperature = 0;
    ck_assert_int_eq(ilora_model_create(&o, &e.ctx, &m), PL_ERR_CONFIG);
    ck_assert_ptr_nonnull(strstr(pl_error_message(), "router_temperature"));
    env_free(&e);
}
END_TEST

/* modules_to_save = embed_tokens (PEFT's modules_to_save): with frozen
 * base weights the item table trains beside the adapters and nothing else
 * of the backbone does. */
START_TEST(modules_to_save_trains_the_item_table_only) {
    env e;
    env_init(&e, 3, 0);
    ilora_opts o = small_opts(ILORA_LORA);
    o.save_embed = true;
    ilora_model *m = NULL;
    PL_CK_OK(ilora_model_create(&o, &e.ctx, &m));
    const int32_t idv[12] = {0, 3, 7, 1, 12, 2, 5, 2, 9, 9, 11, 4};
    const int32_t lab[12] = {0, 7, 1, 12, 2, 6, 2, 9, 9, 11, 4, 10};
    pl_tensor *ids = ids_tensor(idv, 2, 6), *labels = ids_tensor(lab, 2, 6);
    pl_batch bt = {.n = 2, .names = {"input_ids", "labels"}, .fields = {ids, labels}, .size = 2};
    pl_frame_begin();
    pl_tensor *loss = NULL;
    PL_CK_OK(ilora_forward(m, &bt, PL_SPLIT_TRAIN, true, &loss, NULL));
    PL_CK_OK(pl_backward(loss, 1.0));
    pl_frame_end();
    int trained = 0;
    for (int i = 0; i < pl_params_count(e.ctx.params); i++) {
        pl_param *p = pl_params_at(e.ctx.params, i);
        bool want = strstr(p->name, "lora_") || !strcmp(p->name, "model.embed_tokens.weight");
        ck_assert_msg(p->t->requires_grad == want, "%s: requires_grad %d", p->name,
                      p->t->requires_grad);
        if (!strcmp(p->name, "model.embed_tokens.weight")) {
            ck_assert_ptr_nonnull(p->t->grad);
            /* item 8 is only a label: the tied head gives it a gradient */
            double g8 = 0;
            for (int d = 0; d < 8; d++) g8 += fabs(pl_tensor_get(p->t->grad, 8 * 8 + d));
            ck_assert_double_gt(g8, 0);
            trained++;
        }
    }
    ck_assert_int_eq(trained, 1);
    pl_tensor_release(ids);
    pl_tensor_release(labels);
    ilora_model_destroy(m);
    env_free(&e);
}
END_TEST

int main(void) {
    Suite *s = suite_create("ilora");
    TCase *t = tcase_create("ilora");
    tcase_set_timeout(t, 120);
    tcase_add_test(t, ranking_metrics_match_hand_computed_cases);
    tcase_add_test(t, head_loss_is_fused_for_the_tied_head);
    tcase_add_test(t, topk_is_sorted_with_low_index_first_on_ties);
    tcase_add_test(t, moe_lora_layer_gradients_match_central_differences);
    tcase_add_test(t, single_expert_equals_plain_lora_by_hand);
    tcase_add_test(t, recomputed_adapter_branch_is_bit_identical_and_keeps_less);
    tcase_add_test(t, fused_projection_equals_the_old_chain);
    tcase_add_test(t, model_matches_pytorch_reference);
    tcase_add_test(t, router_over_hidden_states_matches_pytorch_reference);
    tcase_add_test(t, router_over_hidden_states_is_causal);
    tcase_add_test(t, router_loss_gradients_match_central_differences);
    tcase_add_test(t, device_loss_equals_the_host_selection);
    tcase_add_test(t, gate_statistics_cover_the_whole_split);
    tcase_add_test(t, zero_lora_b_gives_the_backbone_outputs);
    tcase_add_test(t, last_position_forward_equals_the_full_forward);
    tcase_add_test(t, llama_named_safetensors_loads_through_the_vtable);
    tcase_add_test(t, eval_metrics_exclude_history_and_padding);
    tcase_add_test(t, device_ranking_equals_host_ranking);
    tcase_add_test(t, device_topk_equals_host_topk);
    tcase_add_test(t, export_writes_sorted_topk_per_position_and_user);
    tcase_add_test(t, aborted_export_leaves_no_file);
    tcase_add_test(t, dropout_masks_follow_the_micro_step);
    tcase_add_test(t, tiny_fit_on_synthetic_sequences_lowers_the_loss);
    tcase_add_test(t, nf4_base_weights_give_the_dequantized_model);
    tcase_add_test(t, bad_options_are_refused_with_the_key);
    tcase_add_test(t, modules_to_save_trains_the_item_table_only);
    suite_add_tcase(s, t);
    return pl_test_run(s);
}
