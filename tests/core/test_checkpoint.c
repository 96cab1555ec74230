/* test_checkpoint.c - activation checkpointing (pl_checkpoint, autograd.c):
 * a checkpointed block gives the loss and every gradient of the same block
 * run directly (parameters read through ctx, a non-leaf input, several
 * inputs, two blocks in a row, nesting, accumulation, grad_scale), keeps
 * fewer nodes and bytes alive between forward and backward, passes a
 * numerical gradient check, and frees everything on pl_tape_clear. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "pipeline/alloc.h"
#include "pl_test.h"

#define D 16 /* model width */
#define H 32 /* hidden width of the block */
#define B 8  /* rows */

/* ---- the block: x = a + u; h = dropout(silu(rms_norm(x) W1^T + b1)); x + h W2^T ---- */

typedef struct block {
    pl_tensor *w1, *b1, *w2, *g; /* [H, D], [H], [D, H], [D]: parameters */
    uint64_t counter;            /* dropout counter, fixed per block */
    bool nested;                 /* the residual branch is itself checkpointed */
} block;

static pl_tensor *branch_fn(void *ctx, pl_tensor *const *in, int n) {
    block *b = ctx;
    (void)n;
    pl_tensor *h = pl_rms_norm(in[0], b->g, 1e-6);
    h = pl_silu(pl_linear(h, b->w1, b->b1));
    h = pl_dropout(h, 0.25, 7, b->counter, true);
    return pl_linear(h, b->w2, NULL);
}

static pl_tensor *block_fn(void *ctx, pl_tensor *const *in, int n) {
    block *b = ctx;
    ck_assert_int_eq(n, 2);
    pl_tensor *x = pl_add(in[0], in[1]);
    pl_tensor *h = b->nested ? pl_checkpoint(branch_fn, b, &x, 1) : branch_fn(b, &x, 1);
    return pl_add(x, h);
}

/* Everything that gets a gradient: x0 (a leaf input), s and pu (parameters
 * producing the non-leaf inputs) and the two blocks' parameters. */
typedef struct model {
    pl_tensor *x0, *s, *pu, *target;
    block blk[2];
    bool nested; /* checkpointed blocks checkpoint their branch too */
    pl_tensor *leaf[11];
} model;

static pl_tensor *param(int nd, const int64_t *shape, uint64_t seed, double scale) {
    pl_tensor *t = pl_test_randn(nd, shape, seed);
    ck_assert_ptr_nonnull(t);
    float *d = pl_tensor_f32(t);
    for (int64_t i = 0; i < pl_tensor_numel(t); i++)
        d[i] = (float)(d[i] * scale);
    pl_tensor_set_requires_grad(t, true);
    return t;
}

/* Called outside any frame: the caller owns every tensor. */
static void model_init(model *m, bool nested) {
    memset(m, 0, sizeof *m);
    m->x0 = param(PL_SHAPE(B, D), 1, 1.0);
    m->s = param(PL_SHAPE(D), 2, 1.0);
    m->pu = param(PL_SHAPE(B, D), 3, 1.0);
    m->target = pl_test_randn(PL_SHAPE(B, D), 4);
    m->nested = nested;
    int k = 0;
    m->leaf[k++] = m->x0;
    m->leaf[k++] = m->s;
    m->leaf[k++] = m->pu;
    for (int i = 0; i < 2; i++) {
        block *b = &m->blk[i];
        b->w1 = param(PL_SHAPE(H, D), 10 + 4 * i, 0.25);
        b->b1 = param(PL_SHAPE(H), 11 + 4 * i, 0.1);
        b->w2 = param(PL_SHAPE(D, H), 12 + 4 * i, 0.2);
        b->g = param(PL_SHAPE(D), 13 + 4 * i, 1.0);
        b->counter = 100 + (uint64_t)i;
        m->leaf[k++] = b->w1;
        m->leaf[k++] = b->b1;
        m->leaf[k++] = b->w2;
        m->leaf[k++] = b->g;
    }
}

static void model_free(model *m) {
    for (int i = 0; i < 11; i++)
        pl_tensor_release(m->leaf[i]);
    pl_tensor_release(m->target);
}

static void zero_grads(model *m) {
    for (int i = 0; i < 11; i++)
        pl_tensor_zero_grad(m->leaf[i]);
}

/* Loss of the two-block model; frame-owned. The blocks' inputs are the
 * non-leaf a = x0 * s and u = 0.5 * pu. ckpt false: no checkpoint at all. */
static pl_tensor *model_loss(model *m, bool ckpt) {
    pl_tensor *a = pl_mul(m->x0, m->s);
    pl_tensor *u = pl_scale(m->pu, 0.5);
    for (int i = 0; i < 2; i++) {
        pl_tensor *in[2] = {a, u};
        m->blk[i].nested = ckpt && m->nested;
        a = ckpt ? pl_checkpoint(block_fn, &m->blk[i], in, 2) : block_fn(&m->blk[i], in, 2);
    }
    return pl_mse_loss(a, m->target);
}

/* Gradients of every leaf after `reps` backward calls with grad_scale. */
typedef struct grads {
    double loss;
    float v[11][H * D];
} grads;

static void run(model *m, bool ckpt, int reps, double scale, grads *out) {
    zero_grads(m);
    for (int r = 0; r < reps; r++) {
        pl_frame_begin();
        pl_tensor *loss = PL_CK_NOTNULL(model_loss(m, ckpt));
        out->loss = pl_tensor_item(loss);
        PL_CK_OK(pl_backward(loss, scale));
        ck_assert_int_eq(pl_tape_size(), 0);
        pl_frame_end();
    }
    for (int i = 0; i < 11; i++) {
        pl_tensor *g = m->leaf[i]->grad;
        ck_assert_msg(g != NULL, "leaf %d got no gradient (ckpt=%d)", i, ckpt);
        memcpy(out->v[i], pl_tensor_f32(g), (size_t)pl_tensor_numel(g) * sizeof(float));
    }
}

static void check_same(const model *m, const grads *a, const grads *b, double tol,
                       const char *what) {
    ck_assert_msg(fabs(a->loss - b->loss) <= tol + tol * fabs(b->loss), "%s: loss %.9g vs %.9g",
                  what, a->loss, b->loss);
    for (int i = 0; i < 11; i++) {
        int64_t n = pl_tensor_numel(m->leaf[i]);
        double norm = 0;
        for (int64_t j = 0; j < n; j++) {
            double x = a->v[i][j], y = b->v[i][j];
            norm += fabs(y);
            ck_assert_msg(fabs(x - y) <= tol + tol * fabs(y),
                          "%s: leaf %d element %lld: %.9g vs %.9g", what, i, (long long)j, x, y);
        }
        ck_assert_msg(norm > 0, "%s: leaf %d has an all-zero gradient", what, i);
    }
}

static grads g_ref, g_ck, g_tmp;

START_TEST(checkpointed_blocks_match_direct_loss_and_every_gradient) {
    model m;
    model_init(&m, false);
    run(&m, false, 1, 1.0, &g_ref);
    run(&m, true, 1, 1.0, &g_ck);
    check_same(&m, &g_ck, &g_ref, 1e-6, "checkpoint vs direct");
    model_free(&m);
}
END_TEST

START_TEST(nested_checkpoint_matches_direct) {
    model m;
    model_init(&m, true); /* the residual branch of each block is checkpointed inside it */
    run(&m, false, 1, 1.0, &g_ref);
    run(&m, true, 1, 1.0, &g_ck);
    check_same(&m, &g_ck, &g_ref, 1e-6, "nested checkpoint vs direct");
    model_free(&m);
}
END_TEST

START_TEST(accumulation_and_grad_scale_match_direct) {
    model m;
    model_init(&m, false);
    /* two backward calls of 1/2 each (gradient accumulation) */
    run(&m, false, 2, 0.5, &g_ref);
    run(&m, true, 2, 0.5, &g_ck);
    check_same(&m, &g_ck, &g_ref, 1e-6, "accumulated, checkpoint vs direct");
    /* and they add up to one call with scale 1 */
    run(&m, true, 1, 1.0, &g_tmp);
    check_same(&m, &g_ck, &g_tmp, 1e-6, "two halves vs one whole");
    /* grad_scale multiplies every gradient (a power of two: exact) */
    run(&m, true, 1, 4.0, &g_ck);
    for (int i = 0; i < 11; i++)
        for (int64_t j = 0; j < pl_tensor_numel(m.leaf[i]); j++)
            g_tmp.v[i][j] *= 4.0f;
    check_same(&m, &g_ck, &g_tmp, 1e-6, "grad_scale 4");
    model_free(&m);
}
END_TEST

START_TEST(checkpoint_keeps_fewer_nodes_and_bytes_until_backward) {
    model m;
    model_init(&m, false);
    int64_t nodes[2];
    size_t bytes[2];
    for (int ck = 0; ck < 2; ck++) {
        size_t base = pl_alloc_get_stats(PL_CPU).bytes_in_use;
        pl_frame_begin();
        pl_tensor *loss = PL_CK_NOTNULL(model_loss(&m, ck));
        nodes[ck] = pl_tape_size();
        bytes[ck] = pl_alloc_get_stats(PL_CPU).bytes_in_use - base;
        PL_CK_OK(pl_backward(loss, 1.0));
        pl_frame_end();
    }
    /* direct: mul, scale, 2 x (add, rms_norm, linear, silu, dropout, linear,
     * add, ...), mse; checkpointed: mul, scale, 2 checkpoint nodes, mse */
    ck_assert_int_eq(nodes[1], 5);
    ck_assert_int_gt(nodes[0], 15);
    ck_assert_msg(bytes[1] < bytes[0] / 2, "bytes alive after forward: %zu checkpointed vs %zu",
                  bytes[1], bytes[0]);
    model_free(&m);
}
END_TEST

START_TEST(tape_clear_after_checkpointed_forward_frees_everything) {
    model m;
    model_init(&m, true);
    size_t base = pl_alloc_get_stats(PL_CPU).bytes_in_use;
    pl_frame_begin();
    PL_CK_NOTNULL(model_loss(&m, true));
    ck_assert_int_gt(pl_tape_size(), 0);
    pl_tape_clear();
    ck_assert_int_eq(pl_tape_size(), 0);
    pl_frame_end();
    ck_assert_int_eq(pl_alloc_get_stats(PL_CPU).bytes_in_use, base);
    /* and after a full backward too (recomputed activations freed) */
    pl_frame_begin();
    PL_CK_OK(pl_backward(model_loss(&m, true), 1.0));
    pl_frame_end();
    zero_grads(&m);
    size_t with_grads = pl_alloc_get_stats(PL_CPU).bytes_in_use;
    pl_frame_begin();
    PL_CK_OK(pl_backward(model_loss(&m, true), 1.0));
    pl_frame_end();
    ck_assert_int_eq(pl_alloc_get_stats(PL_CPU).bytes_in_use, with_grads);
    model_free(&m);
}
END_TEST

/* ---- numerical gradient check: every operand an input of the checkpoint ---- */

static pl_tensor *all_inputs_fn(void *ctx, pl_tensor *const *in, int n) {
    (void)ctx;
    ck_assert_int_eq(n, 4);
    pl_tensor *h = pl_rms_norm(in[0], in[3], 1e-6);
    h = pl_dropout(pl_silu(pl_linear(h, in[1], NULL)), 0.25, 3, 9, true);
    return pl_add(in[0], pl_linear(h, in[2], NULL));
}

static pl_tensor *checkpointed(pl_tensor **in, int n, void *ctx) {
    return pl_checkpoint(all_inputs_fn, ctx, in, n);
}

START_TEST(checkpoint_gradients_match_finite_differences) {
    pl_frame_begin();
    pl_tensor *in[4] = {param(PL_SHAPE(3, 6), 21, 1.0), param(PL_SHAPE(5, 6), 22, 0.4),
                        param(PL_SHAPE(6, 5), 23, 0.4), param(PL_SHAPE(6), 24, 1.0)};
    char msg[512];
    ck_assert_msg(pl_gradcheck(checkpointed, in, 4, NULL, 1e-3, 3e-3, 3e-2, msg, sizeof msg),
                  "gradcheck: %s", msg);
    pl_frame_end();
}
END_TEST

/* ---- edges ---- */

typedef struct captured {
    pl_tensor *c; /* a non-leaf requiring grad, read through ctx */
    pl_tensor *w;
} captured;

static pl_tensor *captured_fn(void *ctx, pl_tensor *const *in, int n) {
    captured *k = ctx;
    (void)n;
    return pl_mul(pl_silu(pl_linear(in[0], k->w, NULL)), k->c);
}

START_TEST(non_leaf_read_through_ctx_gets_its_gradient) {
    pl_tensor *x = param(PL_SHAPE(4, 5), 31, 1.0), *w = param(PL_SHAPE(5, 5), 32, 0.5),
              *p = param(PL_SHAPE(5), 33, 1.0);
    float ref[3][25];
    for (int ck = 0; ck < 2; ck++) {
        pl_tensor_zero_grad(x);
        pl_tensor_zero_grad(w);
        pl_tensor_zero_grad(p);
        pl_frame_begin();
        captured k = {.c = pl_tanh(p), .w = w};
        pl_tensor *y = ck ? pl_checkpoint(captured_fn, &k, &x, 1) : captured_fn(&k, &x, 1);
        PL_CK_OK(pl_backward(pl_sum(y, PL_ALL_DIMS, false), 1.0));
        pl_frame_end();
        pl_tensor *g[3] = {x->grad, w->grad, p->grad};
        for (int i = 0; i < 3; i++) {
            ck_assert_ptr_nonnull(g[i]);
            for (int64_t j = 0; j < pl_tensor_numel(g[i]); j++) {
                float v = pl_tensor_f32(g[i])[j];
                if (!ck)
                    ref[i][j] = v;
                else
                    ck_assert_msg(fabsf(v - ref[i][j]) <= 1e-6f + 1e-6f * fabsf(ref[i][j]),
                                  "grad %d[%lld]: %.9g vs %.9g", i, (long long)j, v, ref[i][j]);
            }
        }
    }
    pl_tensor_release(x);
    pl_tensor_release(w);
    pl_tensor_release(p);
}
END_TEST

static pl_tensor *identity_fn(void *ctx, pl_tensor *const *in, int n) {
    (void)ctx;
    (void)n;
    return pl_dropout(in[0], 0.5, 1, 1, false); /* returns in[0] itself */
}

START_TEST(records_nothing_without_grad_and_passes_inputs_through) {
    pl_frame_begin();
    pl_tensor *x = pl_test_randn(PL_SHAPE(3, 4), 41);
    block b = {.w1 = pl_test_randn(PL_SHAPE(H, 4), 42),
               .b1 = NULL,
               .w2 = pl_test_randn(PL_SHAPE(4, H), 43),
               .g = pl_test_randn(PL_SHAPE(4), 44)};
    pl_tensor *y = PL_CK_NOTNULL(pl_checkpoint(branch_fn, &b, &x, 1));
    ck_assert_int_eq(pl_tape_size(), 0); /* nothing requires grad */
    ck_assert_ptr_null(y->grad_fn);
    pl_tensor_set_requires_grad(b.w1, true);
    pl_no_grad_begin();
    PL_CK_NOTNULL(pl_checkpoint(branch_fn, &b, &x, 1));
    pl_no_grad_end();
    ck_assert_int_eq(pl_tape_size(), 0); /* grad mode off */
    y = PL_CK_NOTNULL(pl_checkpoint(branch_fn, &b, &x, 1));
    ck_assert_int_eq(pl_tape_size(), 1); /* a parameter read through ctx suffices */
    ck_assert_ptr_nonnull(y->grad_fn);
    pl_tape_clear();
    /* fn handing its input back: the input keeps no grad_fn, grad flows through */
    pl_tensor *p = param(PL_SHAPE(3, 4), 45, 1.0);
    y = PL_CK_NOTNULL(pl_checkpoint(identity_fn, NULL, &p, 1));
    ck_assert_ptr_ne(y, p);
    ck_assert_ptr_null(p->grad_fn);
    PL_CK_OK(pl_backward(pl_sum(pl_scale(y, 3.0), PL_ALL_DIMS, false), 1.0));
    for (int64_t j = 0; j < 12; j++)
        ck_assert_float_eq(pl_tensor_f32(p->grad)[j], 3.0f);
    pl_frame_end();
}
END_TEST

static pl_tensor *null_fn(void *ctx, pl_tensor *const *in, int n) {
    (void)ctx, (void)in, (void)n;
    return NULL;
}

/* Returns a shape that changes between calls: not deterministic. */
static pl_tensor *changing_fn(void *ctx, pl_tensor *const *in, int n) {
    int *calls = ctx;
    (void)n;
    return (*calls)++ == 0 ? pl_scale(in[0], 2.0) : pl_sum(in[0], 0, false);
}

START_TEST(bad_fn_is_refused_with_a_clear_error) {
    pl_frame_begin();
    pl_tensor *p = param(PL_SHAPE(3, 4), 51, 1.0);
    pl_error_clear();
    ck_assert_ptr_null(pl_checkpoint(null_fn, NULL, &p, 1));
    ck_assert_int_eq(pl_error_status(), PL_ERR_INVALID);
    ck_assert_ptr_null(pl_checkpoint(NULL, NULL, &p, 1));
    ck_assert_int_eq(pl_error_status(), PL_ERR_INVALID);
    ck_assert_ptr_null(pl_checkpoint(identity_fn, NULL, &p, PL_MAX_OP_INPUTS + 1));
    ck_assert_int_eq(pl_error_status(), PL_ERR_INVALID);
    ck_assert_int_eq(pl_tape_size(), 0);
    int calls = 0;
    pl_tensor *y = PL_CK_NOTNULL(pl_checkpoint(changing_fn, &calls, &p, 1));
    ck_assert_int_eq(pl_backward(pl_sum(y, PL_ALL_DIMS, false), 1.0), PL_ERR_INVALID);
    ck_assert_msg(strstr(pl_error_message(), "deterministic") != NULL, "message: %s",
                  pl_error_message());
    ck_assert_int_eq(pl_tape_size(), 0);
    pl_frame_end();
}
END_TEST

int main(void) {
    Suite *s = suite_create("checkpoint");
    TCase *tc = tcase_create("checkpoint");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, checkpointed_blocks_match_direct_loss_and_every_gradient);
    tcase_add_test(tc, nested_checkpoint_matches_direct);
    tcase_add_test(tc, accumulation_and_grad_scale_match_direct);
    tcase_add_test(tc, checkpoint_keeps_fewer_nodes_and_bytes_until_backward);
    tcase_add_test(tc, tape_clear_after_checkpointed_forward_frees_everything);
    tcase_add_test(tc, checkpoint_gradients_match_finite_differences);
    tcase_add_test(tc, non_leaf_read_through_ctx_gets_its_gradient);
    tcase_add_test(tc, records_nothing_without_grad_and_passes_inputs_through);
    tcase_add_test(tc, bad_fn_is_refused_with_a_clear_error);
    suite_add_tcase(s, tc);
    return pl_test_run(s);
}
