/* test_autograd_saved.c - what the autograd tape keeps, op by op (issue 31).
 *
 * For every differentiable built-in op (LSTM aside, which keeps all its
 * inputs and states) and every way its float inputs can require a gradient,
 * the bytes the tape holds after the forward are measured with the device
 * allocator (bytes in use after the forward's frame has released every
 * activation, minus before) and compared with the op's row of
 * pipeline/ops.def, the table docs/ops.md shows: its `reads` rules ("x<-y"
 * = the gradient of input x reads input y's data, PyTorch's
 * derivatives.yaml; read here by a parser of the test's own) name the inputs
 * kept, plus the tensors it saves (its output where saves_out, n_saved extra
 * outputs: a dropout mask, statistics), whose sizes each case states
 * (`saved`; their number must be the row's). Every op of ops.def with a
 * backward has a case here (every_op_has_a_case names one that has not).
 * Inputs that require a gradient are
 * activations (non-leaf: a recorded scale of a leaf) so the tape alone can
 * keep them; index inputs are activations without grad; a frozen nf4 weight
 * lives outside the forward (a parameter), so keeping it costs nothing.
 * Backward then runs through the op: a kernel that read an input the table
 * says it does not need would read a stub's PROT_NONE page and crash.
 * Run on the CPU and on the strict device (GPU-like memory). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend_loader.h"
#include "op_table.h"
#include "pipeline/nf4.h"
#include "pl_test.h"
#include "registry.h"

#define MAXI 6
#define MAXS 3 /* tensors one op saves */

typedef enum { K_ACT, K_IDX, K_PARAM_NF4 } in_kind;

typedef struct in_spec {
    in_kind kind;
    pl_dtype dt; /* K_IDX: PL_I64 */
    int ndim;
    int64_t shape[4];
    int64_t hi; /* K_IDX: values in [0, hi) */
} in_spec;

typedef struct op_case {
    pl_op op;
    int n_in;
    in_spec in[MAXI];
    /* bytes of each tensor the op saves (its output where its row says
     * saves_out, then its saved extra outputs), before allocator rounding;
     * the list ends at the first 0 */
    int64_t saved[MAXS];
    int variant; /* lora_add: 1 = with dropout (pl_lora_add_dropout) */
    /* saved[i] has its bytes only when input saved_if[i] - 1 requires a
     * gradient (0: always), else it is empty (an op that saves a gradient
     * per input) */
    int saved_if[MAXS];
} op_case;

#define F32(...) {K_ACT, PL_F32, (int)(sizeof((int64_t[]){__VA_ARGS__}) / 8), {__VA_ARGS__}, 0}
#define IDX(hi, ...) {K_IDX, PL_I64, (int)(sizeof((int64_t[]){__VA_ARGS__}) / 8), {__VA_ARGS__}, hi}

/* sizes: [8, 32] f32 = 1024 bytes, an allocator class of its own */
#define NOTHING {0}
static const op_case g_cases[] = {
    {PL_OP_MATMUL, 2, {F32(8, 32), F32(32, 32)}, NOTHING},
    {PL_OP_ADD, 2, {F32(8, 32), F32(8, 32)}, NOTHING},
    {PL_OP_SUB, 2, {F32(8, 32), F32(8, 32)}, NOTHING},
    {PL_OP_MUL, 2, {F32(8, 32), F32(8, 32)}, NOTHING},
    {PL_OP_DIV, 2, {F32(8, 32), F32(8, 32)}, NOTHING},
    {PL_OP_SCALE, 1, {F32(8, 32)}, NOTHING},
    {PL_OP_ADD_SCALAR, 1, {F32(8, 32)}, NOTHING},
    {PL_OP_SUM, 1, {F32(8, 32)}, NOTHING},
    {PL_OP_MEAN, 1, {F32(8, 32)}, NOTHING},
    {PL_OP_RELU, 1, {F32(8, 32)}, {1024}}, /* its output */
    {PL_OP_LEAKY_RELU, 1, {F32(8, 32)}, NOTHING},
    {PL_OP_ELU, 1, {F32(8, 32)}, NOTHING},
    {PL_OP_GELU, 1, {F32(8, 32)}, NOTHING},
    {PL_OP_SILU, 1, {F32(8, 32)}, NOTHING},
    {PL_OP_SIGMOID, 1, {F32(8, 32)}, {1024}}, /* its output */
    {PL_OP_TANH, 1, {F32(8, 32)}, {1024}},    /* its output */
    {PL_OP_EXP, 1, {F32(8, 32)}, {1024}},     /* its output */
    {PL_OP_LOG, 1, {F32(8, 32)}, NOTHING},
    {PL_OP_SQUARE, 1, {F32(8, 32)}, NOTHING},
    {PL_OP_SQRT, 1, {F32(8, 32)}, NOTHING},
    {PL_OP_CLAMP, 1, {F32(8, 32)}, NOTHING},
    {PL_OP_SWIGLU, 2, {F32(8, 32), F32(8, 32)}, NOTHING},
    /* y [8, 32] + lora of x [8, 32], A [4, 32], B [32, 4], gexp [8, 4]: keeps
     * what the reads rules name of x, A, B, gexp (never y) and t = x A^T
     * [8, 4] f32 */
    {PL_OP_LORA_ADD, 5, {F32(8, 32), F32(8, 32), F32(4, 32), F32(32, 4), F32(8, 4)}, {128}},
    /* the same with dropout inside the op (p 0.25): the same bytes, no copy of
     * drop(x) and no mask (both regenerated in backward) */
    {PL_OP_LORA_ADD, 5, {F32(8, 32), F32(8, 32), F32(4, 32), F32(32, 4), F32(8, 4)}, {128}, 1},
    {PL_OP_SOFTMAX, 1, {F32(8, 32)}, {1024}},     /* its output */
    {PL_OP_LOG_SOFTMAX, 1, {F32(8, 32)}, {1024}}, /* its output */
    {PL_OP_CAUSAL_SOFTMAX, 1, {F32(4, 16, 16)}, {4096}}, /* its output, the probabilities */
    /* q [1, 2, 8, 16], k, v [1, 1, 8, 16] (GQA); saves its output [1, 2, 8, 16]
     * and the logsumexp [1, 2, 8] f32, never the 2 x 8 x 8 probabilities */
    {PL_OP_ATTENTION, 3, {F32(1, 2, 8, 16), F32(1, 1, 8, 16), F32(1, 1, 8, 16)}, {1024, 64}},
    {PL_OP_CROSS_ENTROPY, 2, {F32(8, 32), IDX(32, 8)}, {32}}, /* logsumexp per row */
    /* x [8, 32], W [16, 32]: the gradients at a unit incoming gradient, dx
     * [8, 32] when x requires one and dW [16, 32] when W does (else an
     * empty [0] tensor: the allocator's smallest block), never the [8, 16]
     * logits nor x */
    {PL_OP_LINEAR_CROSS_ENTROPY, 3, {F32(8, 32), F32(16, 32), IDX(16, 8)}, {1024, 2048}, 0, {1, 2}},
    {PL_OP_MSE, 2, {F32(8, 32), F32(8, 32)}, NOTHING},
    {PL_OP_MAE, 2, {F32(8, 32), F32(8, 32)}, NOTHING},
    {PL_OP_HUBER, 2, {F32(8, 32), F32(8, 32)}, NOTHING},
    {PL_OP_EMBEDDING, 2, {F32(32, 32), IDX(32, 8)}, NOTHING},
    {PL_OP_INDEX_SELECT, 2, {F32(8, 32), IDX(8, 4)}, NOTHING},
    {PL_OP_GATHER, 2, {F32(8, 32), IDX(32, 8, 4)}, NOTHING},
    {PL_OP_SCATTER_ADD, 2, {F32(8, 32), IDX(16, 8)}, NOTHING},
    {PL_OP_SEGMENT_SOFTMAX, 2, {F32(8, 32), IDX(3, 8)}, {1024}}, /* its output */
    {PL_OP_LAYER_NORM, 3, {F32(8, 32), F32(32), F32(32)}, {32, 32}}, /* mean, rstd */
    {PL_OP_RMS_NORM, 2, {F32(8, 32), F32(32)}, {32}},                  /* rstd */
    {PL_OP_DROPOUT, 1, {F32(8, 32)}, {256}},                           /* the u8 mask */
    {PL_OP_CONCAT, 2, {F32(8, 32), F32(8, 32)}, NOTHING},
    {PL_OP_SLICE, 1, {F32(8, 32)}, NOTHING},
    {PL_OP_PERMUTE, 1, {F32(8, 32)}, NOTHING},
    {PL_OP_RESHAPE, 1, {F32(8, 32)}, NOTHING},
    {PL_OP_COPY, 1, {F32(8, 32)}, NOTHING},
    {PL_OP_ROPE, 1, {F32(2, 4, 2, 16)}, NOTHING},
    {PL_OP_CAST, 1, {F32(8, 32)}, NOTHING},
    {PL_OP_NF4_MATMUL, 2, {F32(8, 64), {K_PARAM_NF4, PL_NF4, 2, {32, 64}, 0}}, NOTHING},
    /* x [B 2, T 4, In 32], w_ih [4H, In], w_hh [4H, H], b [4H], h0, c0 [B, H]
     * with H = 8; saves the [B, T, 6H] gates and states */
    {PL_OP_LSTM, 6, {F32(2, 4, 32), F32(32, 32), F32(32, 8), F32(32), F32(2, 8), F32(2, 8)}, {1536}},
};
#define N_CASES ((int)(sizeof g_cases / sizeof g_cases[0]))

/* The allocator's block size for n bytes (core/src/tensor/alloc.c's classes below 1 MiB). */
static size_t block_of(size_t n) {
    size_t p = 256;
    while (p < n) p <<= 1;
    return p;
}

static size_t spec_bytes(const in_spec *s) {
    int64_t n = 1;
    for (int i = 0; i < s->ndim; i++) n *= s->shape[i];
    return block_of(pl_dtype_nbytes(s->dt, n));
}

/* Which inputs the rules of ops.def keep for this grad mask ("x<-y", x / y
 * an input letter or '*': any / every input), parsed here independently of
 * the core's parser (op_table.c). */
static unsigned rules_keep(const char *rules, int n_in, unsigned grad_mask) {
    unsigned all = (1u << n_in) - 1u, keep = 0;
    for (const char *r = rules; *r;) {
        if (*r == ' ') {
            r++;
            continue;
        }
        ck_assert_msg(strlen(r) >= 4 && r[1] == '<' && r[2] == '-', "bad rule in '%s'", rules);
        bool applies = r[0] == '*' ? grad_mask != 0 : (grad_mask >> (r[0] - 'a') & 1u) != 0;
        if (applies) keep |= r[3] == '*' ? all : 1u << (r[3] - 'a');
        r += 4;
    }
    return keep;
}

static pl_tensor *make_input(const in_spec *s, pl_device dev, int seed) {
    pl_tensor *h;
    if (s->kind == K_IDX) {
        h = pl_tensor_empty_owned(PL_I64, s->ndim, s->shape, PL_CPU);
        int64_t *v = pl_tensor_data(h);
        for (int64_t i = 0; i < pl_tensor_numel(h); i++) v[i] = (i * 7 + seed) % s->hi;
    } else {
        h = pl_tensor_empty_owned(PL_F32, s->ndim, s->shape, PL_CPU);
        pl_tensor_uniform_(h, 0.5, 1.5, 11, (uint64_t)seed); /* > 0: log, sqrt, div */
    }
    pl_tensor *d = pl_tensor_to(h, s->dt == PL_NF4 ? PL_F32 : s->dt, dev); /* no frame: ours */
    pl_tensor_release(h);
    if (s->kind == K_PARAM_NF4) {
        pl_tensor *q = pl_nf4_quantize(d, 64, true);
        pl_tensor_release(d);
        pl_tensor_set_name(q, "frozen.weight");
        return q;
    }
    return d;
}

static pl_tensor *run_op(const op_case *c, pl_tensor **x) {
    switch (c->op) {
    case PL_OP_MATMUL: return pl_matmul(x[0], x[1], false, false);
    case PL_OP_ADD: return pl_add(x[0], x[1]);
    case PL_OP_SUB: return pl_sub(x[0], x[1]);
    case PL_OP_MUL: return pl_mul(x[0], x[1]);
    case PL_OP_DIV: return pl_div(x[0], x[1]);
    case PL_OP_SCALE: return pl_scale(x[0], 2.0);
    case PL_OP_ADD_SCALAR: return pl_add_scalar(x[0], 2.0);
    case PL_OP_SUM: return pl_sum(x[0], 1, false);
    case PL_OP_MEAN: return pl_mean(x[0], 0, false);
    case PL_OP_RELU: return pl_relu(x[0]);
    case PL_OP_LEAKY_RELU: return pl_leaky_relu(x[0], 0.01);
    case PL_OP_ELU: return pl_elu(x[0], 1.0);
    case PL_OP_GELU: return pl_gelu(x[0], false);
    case PL_OP_SILU: return pl_silu(x[0]);
    case PL_OP_SIGMOID: return pl_sigmoid(x[0]);
    case PL_OP_TANH: return pl_tanh(x[0]);
    case PL_OP_EXP: return pl_exp(x[0]);
    case PL_OP_LOG: return pl_log(x[0]);
    case PL_OP_SQUARE: return pl_square(x[0]);
    case PL_OP_SQRT: return pl_sqrt(x[0]);
    case PL_OP_CLAMP: return pl_clamp(x[0], 0.7, 1.2);
    case PL_OP_SWIGLU: return pl_swiglu(x[0], x[1]);
    case PL_OP_LORA_ADD:
        return c->variant ? pl_lora_add_dropout(x[0], x[1], x[2], x[3], x[4], 0.5, 0.25, 11, 3, true)
                          : pl_lora_add(x[0], x[1], x[2], x[3], x[4], 0.5);
    case PL_OP_SOFTMAX: return pl_softmax(x[0]);
    case PL_OP_LOG_SOFTMAX: return pl_log_softmax(x[0]);
    case PL_OP_CAUSAL_SOFTMAX: return pl_causal_softmax(x[0], 0.5);
    case PL_OP_ATTENTION: return pl_attention(x[0], x[1], x[2], NULL, 0.25, true);
    case PL_OP_CROSS_ENTROPY: return pl_cross_entropy(x[0], x[1], -100, 0.0);
    case PL_OP_LINEAR_CROSS_ENTROPY: return pl_linear_cross_entropy(x[0], x[1], x[2], -100, 0.0);
    case PL_OP_MSE: return pl_mse_loss(x[0], x[1]);
    case PL_OP_MAE: return pl_mae_loss(x[0], x[1]);
    case PL_OP_HUBER: return pl_huber_loss(x[0], x[1], 0.2);
    case PL_OP_EMBEDDING: return pl_embedding(x[0], x[1]);
    case PL_OP_INDEX_SELECT: return pl_index_select(x[0], 0, x[1]);
    case PL_OP_GATHER: return pl_gather(x[0], 1, x[1]);
    case PL_OP_SCATTER_ADD: return pl_scatter_add(x[0], 0, x[1], 16);
    case PL_OP_SEGMENT_SOFTMAX: return pl_segment_softmax(x[0], x[1], 3);
    case PL_OP_LAYER_NORM: return pl_layer_norm(x[0], x[1], x[2], 1e-5);
    case PL_OP_RMS_NORM: return pl_rms_norm(x[0], x[1], 1e-5);
    case PL_OP_DROPOUT: return pl_dropout(x[0], 0.5, 3, 0, true);
    case PL_OP_CONCAT: return pl_concat(x, 2, 0);
    case PL_OP_SLICE: return pl_slice(x[0], 1, 4, 20);
    case PL_OP_PERMUTE: return pl_permute(x[0], (const int[]){1, 0});
    case PL_OP_RESHAPE: return pl_reshape(x[0], 2, (int64_t[]){32, 8});
    case PL_OP_COPY: return pl_contiguous(pl_transpose(pl_reshape(x[0], 2, (int64_t[]){32, 8}), 0, 1));
    case PL_OP_ROPE: return pl_rope(x[0], 0, 10000.0);
    case PL_OP_CAST: return pl_cast(x[0], PL_BF16);
    case PL_OP_NF4_MATMUL: return pl_nf4_matmul(x[0], x[1]);
    case PL_OP_LSTM: return pl_lstm(x[0], x[1], x[2], x[3], NULL, x[4], x[5], false, NULL, NULL);
    default: return NULL;
    }
}

/* One op, one grad mask: bytes the tape holds vs the rules; then backward. */
static void check_case(const op_case *c, unsigned grad_mask, pl_device dev) {
    char what[160];
    const pl_op_row *row = pl_op_row_of(c->op);
    ck_assert_ptr_nonnull(row);
    snprintf(what, sizeof what, "%s on %s, inputs requiring grad 0x%x", row->name,
             dev.type == PL_DEVICE_CPU ? "cpu" : "strict", grad_mask);
    pl_tensor *leaf[MAXI] = {0};
    for (int i = 0; i < c->n_in; i++) {
        leaf[i] = make_input(&c->in[i], dev, i + 1);
        ck_assert_msg(leaf[i] != NULL, "%s: input %d: %s", what, i, pl_error_message());
        if (grad_mask >> i & 1u) pl_tensor_set_requires_grad(leaf[i], true);
    }
    pl_alloc_stats s0 = pl_alloc_get_stats(dev);
    pl_frame_begin();
    pl_tensor *x[MAXI] = {0};
    for (int i = 0; i < c->n_in; i++) {
        if (c->in[i].kind == K_PARAM_NF4)
            x[i] = leaf[i]; /* a parameter: alive without the tape */
        else if (grad_mask >> i & 1u)
            x[i] = pl_scale(leaf[i], 1.0); /* an activation the tape alone may keep */
        else
            x[i] = pl_tensor_to(leaf[i], leaf[i]->dtype, dev); /* an activation, no grad */
        ck_assert_msg(x[i] != NULL, "%s: %s", what, pl_error_message());
    }
    pl_tensor *y = run_op(c, x);
    ck_assert_msg(y != NULL, "%s: %s", what, pl_error_message());
    ck_assert_msg(y->grad_fn != NULL, "%s: not recorded", what);
    /* the loss for the backward below (a sum keeps nothing of y); y itself
     * dies with the frame unless the tape keeps it */
    pl_tensor *l = pl_sum(y->dtype == PL_F32 ? y : pl_cast(y, PL_F32), PL_ALL_DIMS, false);
    ck_assert_msg(l != NULL, "%s: %s", what, pl_error_message());
    pl_tensor_retain(l);
    pl_frame_end();
    pl_alloc_stats s1 = pl_alloc_get_stats(dev);
    size_t held = s1.bytes_in_use - s0.bytes_in_use - l->storage->capacity;
    unsigned keep = rules_keep(row->reads, c->n_in, grad_mask);
    size_t want = 0;
    for (int i = 0; i < c->n_in; i++)
        if (keep >> i & 1u && c->in[i].kind != K_PARAM_NF4) want += spec_bytes(&c->in[i]);
    for (int i = 0; i < MAXS && c->saved[i]; i++) /* an empty one: the smallest block */
        want += block_of(!c->saved_if[i] || grad_mask >> (c->saved_if[i] - 1) & 1u
                             ? (size_t)c->saved[i] : 0);
    ck_assert_msg(held == want,
                  "%s: the tape holds %zu bytes, ops.def says %zu (reads '%s', saves %s%d more)",
                  what, held, want, row->reads, row->saves_out ? "its output and " : "",
                  row->n_saved);
    size_t held_api = 0;
    PL_CK_OK(pl_tape_held_bytes(NULL, 0, &held_api));
    ck_assert_msg(held_api == want, "%s: pl_tape_held_bytes says %zu, the allocator %zu", what,
                  held_api, want);
    /* backward: every kernel reads only what was kept (a stub's page is PROT_NONE) */
    pl_status st = pl_backward(l, 1.0);
    ck_assert_msg(st == PL_OK, "%s: backward: %s", what, pl_error_message());
    pl_tensor_release(l);
    for (int i = 0; i < c->n_in; i++)
        if (grad_mask >> i & 1u)
            ck_assert_msg(leaf[i]->grad != NULL, "%s: input %d got no gradient", what, i);
    pl_alloc_stats s2 = pl_alloc_get_stats(dev);
    size_t grads = 0;
    for (int i = 0; i < c->n_in; i++)
        if (leaf[i] && leaf[i]->grad) grads += leaf[i]->grad->storage->capacity;
    ck_assert_msg(s2.bytes_in_use == s0.bytes_in_use + grads,
                  "%s: after backward %zu bytes in use, expected %zu (the tape freed all)", what,
                  s2.bytes_in_use, s0.bytes_in_use + grads);
    for (int i = 0; i < c->n_in; i++) pl_tensor_release(leaf[i]);
}

static void check_all(pl_device dev) {
    int n = 0;
    for (int ci = 0; ci < N_CASES; ci++) {
        const op_case *c = &g_cases[ci];
        const pl_op_row *row = pl_op_row_of(c->op);
        int ns = 0;
        while (ns < MAXS && c->saved[ns]) ns++;
        ck_assert_msg(ns == (row->saves_out ? 1 : 0) + row->n_saved,
                      "%s: the case lists %d saved tensors, ops.def's row %d (saves_out %d + "
                      "n_saved %d)",
                      row->name, ns, (row->saves_out ? 1 : 0) + row->n_saved, row->saves_out,
                      row->n_saved);
        unsigned floats = 0;
        for (int i = 0; i < c->n_in; i++)
            if (c->in[i].kind == K_ACT && c->in[i].dt == PL_F32) floats |= 1u << i;
        /* every non-empty subset of the float inputs */
        for (unsigned m = 1; m <= floats; m++) {
            if ((m & ~floats) != 0) continue;
            check_case(c, m, dev);
            n++;
        }
    }
    printf("%d op x grad-mask cases hold what the table says on %s\n", n,
           dev.type == PL_DEVICE_CPU ? "cpu" : "strict");
}

START_TEST(every_op_keeps_what_the_table_says_on_cpu) { check_all(PL_CPU); }
END_TEST

START_TEST(every_op_keeps_what_the_table_says_on_strict) {
    pl_registry *reg = pl_registry_new();
    ck_assert_ptr_nonnull(reg);
    PL_CK_OK(pl_registry_add_dir(reg, PL_TEST_PLUGIN_DIR));
    PL_CK_OK(pl_backend_load_named(reg, PL_DEVICE_CUDA, "strict"));
    pl_registry_free(reg);
    check_all((pl_device){PL_DEVICE_CUDA, 0});
}
END_TEST

/* The table in code: a frozen weight keeps nothing of the activation. */
START_TEST(needed_inputs_examples) {
    ck_assert_uint_eq(pl_autograd_needed_inputs(PL_OP_MATMUL, 2, 1u), 2u); /* W frozen */
    ck_assert_uint_eq(pl_autograd_needed_inputs(PL_OP_MATMUL, 2, 2u), 1u); /* x frozen */
    ck_assert_uint_eq(pl_autograd_needed_inputs(PL_OP_MATMUL, 2, 3u), 3u);
    ck_assert_uint_eq(pl_autograd_needed_inputs(PL_OP_ADD, 2, 3u), 0u);
    ck_assert_uint_eq(pl_autograd_needed_inputs(PL_OP_SILU, 1, 1u), 1u);
    ck_assert_uint_eq(pl_autograd_needed_inputs(PL_OP_RELU, 1, 1u), 0u); /* saves y */
    ck_assert(pl_autograd_saves_output(PL_OP_RELU) && pl_autograd_saves_output(PL_OP_SOFTMAX));
    ck_assert(!pl_autograd_saves_output(PL_OP_SILU) && !pl_autograd_saves_output(PL_OP_ELU));
    ck_assert_uint_eq(pl_autograd_needed_inputs(PL_OP_NF4_MATMUL, 2, 1u), 2u);
    ck_assert_uint_eq(pl_autograd_needed_inputs(PL_OP_LSTM, 6, 1u), 63u); /* everything */
    ck_assert_uint_eq(pl_autograd_needed_inputs(PL_OP_DIV, 2, 1u), 2u);  /* da = g / b */
    ck_assert_uint_eq(pl_autograd_needed_inputs(PL_OP_DIV, 2, 2u), 3u);  /* db = -g a / b^2 */
    ck_assert_uint_eq(pl_autograd_needed_inputs(PL_OP_SWIGLU, 2, 1u), 3u);
    ck_assert_uint_eq(pl_autograd_needed_inputs(PL_OP_SWIGLU, 2, 2u), 1u); /* d up: gate */
    /* lora_add (y, x, A, B, gexp): only dB (B trains): gexp; only dA: x, B,
     * gexp; only dy: nothing; never y */
    ck_assert_uint_eq(pl_autograd_needed_inputs(PL_OP_LORA_ADD, 5, 8u), 16u);
    ck_assert_uint_eq(pl_autograd_needed_inputs(PL_OP_LORA_ADD, 5, 4u), 2u | 8u | 16u);
    ck_assert_uint_eq(pl_autograd_needed_inputs(PL_OP_LORA_ADD, 5, 1u), 0u);
    ck_assert_uint_eq(pl_autograd_needed_inputs(PL_OP_LORA_ADD, 5, 31u), 30u);
    ck_assert_uint_eq(pl_autograd_needed_inputs(PL_OP_EMBEDDING, 2, 1u), 2u); /* the index */
    ck_assert_uint_eq(pl_autograd_needed_inputs(PL_OP_LAYER_NORM, 1, 1u), 1u);
    ck_assert_uint_eq(pl_autograd_needed_inputs(PL_OP_LAYER_NORM, 3, 4u), 7u);
    ck_assert_uint_eq(pl_autograd_needed_inputs(PL_OP_ADAMW_STEP, 2, 1u), 3u); /* no backward */
    ck_assert_uint_eq(pl_autograd_needed_inputs(PL_OP_COUNT + 5, 2, 1u), 3u);  /* unknown op */
    ck_assert_uint_eq(pl_autograd_needed_inputs(PL_OP_MATMUL, 2, 0u), 0u);
    ck_assert(pl_autograd_saves_output(PL_OP_SEGMENT_SOFTMAX));
    /* a malformed rule keeps everything (nothing freed that might be read) */
    ck_assert_uint_eq(pl_op_reads_mask("a<", 2, 1u), 3u);
    ck_assert_uint_eq(pl_op_reads_mask("a<-b b<-", 2, 1u), 3u);
    ck_assert_uint_eq(pl_op_reads_mask("z<-a", 2, 1u), 3u);
    ck_assert_uint_eq(pl_op_reads_mask("", 2, 3u), 0u);
}
END_TEST

/* The core's reading of every op's rule (op_table.c) is this test's (the
 * one the bytes are checked against), for every arity ops.def allows and
 * every grad mask. */
START_TEST(needed_inputs_follow_the_rules) {
    for (int op = PL_OP_NONE + 1; op < PL_OP_COUNT; op++) {
        const pl_op_row *row = pl_op_row_of(op);
        if (!row->bwd) continue;
        for (int n = row->in_min; n <= row->in_max; n++)
            for (unsigned m = 0; m < (1u << n); m++)
                ck_assert_msg(pl_autograd_needed_inputs(op, n, m) == rules_keep(row->reads, n, m),
                              "%s with %d inputs, grad mask 0x%x: the core keeps 0x%x, the rule "
                              "'%s' says 0x%x",
                              row->name, n, m, pl_autograd_needed_inputs(op, n, m), row->reads,
                              rules_keep(row->reads, n, m));
    }
}
END_TEST

/* Coverage from the table: every op of ops.def with a backward has a case
 * above (the bytes of what it keeps are measured), named when missing. */
START_TEST(every_op_has_a_case) {
    char missing[512] = "";
    for (int op = PL_OP_NONE + 1; op < PL_OP_COUNT; op++) {
        const pl_op_row *row = pl_op_row_of(op);
        bool has = false;
        for (int i = 0; i < N_CASES; i++) has = has || (int)g_cases[i].op == op;
        if (!row->bwd) {
            ck_assert_msg(!has, "op %s has a saved-bytes case but no backward in ops.def",
                          row->name);
            continue;
        }
        if (!has) {
            size_t l = strlen(missing);
            snprintf(missing + l, sizeof missing - l, " %s", row->name);
        }
    }
    ck_assert_msg(!missing[0],
                  "ops of ops.def with a backward and no case in test_autograd_saved.c:%s",
                  missing);
}
END_TEST

/* The point of saving the output: relu(x) feeding a matmul by a trainable
 * weight (dW reads relu's output) keeps that one tensor, not x beside it
 * (measured with the allocator, on the CPU). Backward's dx then equals the
 * closed form d/dx sum(relu(x) @ W) = [x > 0] * rowsum(W). */
START_TEST(output_shared_with_its_consumer) {
    pl_tensor *leaf = make_input(&(in_spec)F32(8, 32), PL_CPU, 1);
    pl_tensor *w = make_input(&(in_spec)F32(32, 32), PL_CPU, 2);
    PL_CK_OK(pl_tensor_uniform_(leaf, -1.0, 1.0, 5, 0));
    pl_tensor_set_requires_grad(leaf, true);
    pl_tensor_set_requires_grad(w, true);
    pl_alloc_stats s0 = pl_alloc_get_stats(PL_CPU);
    pl_frame_begin();
    pl_tensor *x = pl_scale(leaf, 1.0); /* an activation */
    pl_tensor *y = pl_matmul(pl_relu(x), w, false, false);
    pl_tensor *l = pl_tensor_retain(pl_sum(y, PL_ALL_DIMS, false));
    ck_assert_msg(l != NULL, "%s", pl_error_message());
    pl_frame_end();
    pl_alloc_stats s1 = pl_alloc_get_stats(PL_CPU);
    size_t held = s1.bytes_in_use - s0.bytes_in_use - l->storage->capacity;
    ck_assert_uint_eq(held, 1024); /* relu's output, once: not x too */
    PL_CK_OK(pl_backward(l, 1.0));
    pl_tensor_release(l);
    const float *X = pl_tensor_data(leaf), *G = pl_tensor_data(leaf->grad), *W = pl_tensor_data(w);
    for (int i = 0; i < 8; i++)
        for (int k = 0; k < 32; k++) {
            float rs = 0;
            for (int j = 0; j < 32; j++) rs += W[k * 32 + j];
            ck_assert_float_eq_tol(G[i * 32 + k], X[i * 32 + k] > 0 ? rs : 0.0f, 1e-5f);
        }
    pl_tensor_release(leaf);
    pl_tensor_release(w);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("autograd_saved");
    TCase *tc = tcase_create("saved");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, every_op_has_a_case);
    tcase_add_test(tc, needed_inputs_examples);
    tcase_add_test(tc, needed_inputs_follow_the_rules);
    tcase_add_test(tc, output_shared_with_its_consumer);
    tcase_add_test(tc, every_op_keeps_what_the_table_says_on_cpu);
    tcase_add_test(tc, every_op_keeps_what_the_table_says_on_strict);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return pl_test_run(suite()); }
