/* test_autograd_saved.c - what the autograd tape keeps, op by op (issue 31).
 *
 * For every differentiable built-in op (LSTM aside, which keeps all its
 * inputs and states) and every way its float inputs can require a gradient,
 * the bytes the tape holds after the forward are measured with the device
 * allocator (bytes in use after the forward's frame has released every
 * activation, minus before) and compared with the table of
 * docs/autograd-memory.md, written out again here as RULES: "x<-y" = the
 * gradient of input x reads input y's data (PyTorch's derivatives.yaml),
 * plus the extra outputs the op saves (EXTRA: a dropout mask, statistics,
 * the output of relu, sigmoid, tanh, exp and the softmaxes). Inputs that require a gradient are
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
#include "pipeline/nf4.h"
#include "pl_test.h"
#include "registry.h"

#define MAXI 4

typedef enum { K_ACT, K_IDX, K_PARAM_NF4 } in_kind;

typedef struct in_spec {
    in_kind kind;
    pl_dtype dt; /* K_IDX: PL_I64 */
    int ndim;
    int64_t shape[4];
    int64_t hi; /* K_IDX: values in [0, hi) */
} in_spec;

typedef struct op_case {
    const char *name; /* also the op's name in RULES */
    pl_op op;
    int n_in;
    in_spec in[MAXI];
    const char *rules; /* "a<-b a<-a": input letters a, b, c, ... */
    int64_t extra;     /* bytes of saved extra outputs (before allocator rounding: see extra_n) */
    int extra_n;       /* how many blocks the extra bytes come in (each rounded) */
} op_case;

#define F32(...) {K_ACT, PL_F32, (int)(sizeof((int64_t[]){__VA_ARGS__}) / 8), {__VA_ARGS__}, 0}
#define IDX(hi, ...) {K_IDX, PL_I64, (int)(sizeof((int64_t[]){__VA_ARGS__}) / 8), {__VA_ARGS__}, hi}

/* sizes: [8, 32] f32 = 1024 bytes, an allocator class of its own */
static const op_case g_cases[] = {
    {"matmul", PL_OP_MATMUL, 2, {F32(8, 32), F32(32, 32)}, "a<-b b<-a", 0, 0},
    {"add", PL_OP_ADD, 2, {F32(8, 32), F32(8, 32)}, "", 0, 0},
    {"sub", PL_OP_SUB, 2, {F32(8, 32), F32(8, 32)}, "", 0, 0},
    {"mul", PL_OP_MUL, 2, {F32(8, 32), F32(8, 32)}, "a<-b b<-a", 0, 0},
    {"div", PL_OP_DIV, 2, {F32(8, 32), F32(8, 32)}, "a<-b b<-a b<-b", 0, 0},
    {"scale", PL_OP_SCALE, 1, {F32(8, 32)}, "", 0, 0},
    {"add_scalar", PL_OP_ADD_SCALAR, 1, {F32(8, 32)}, "", 0, 0},
    {"sum", PL_OP_SUM, 1, {F32(8, 32)}, "", 0, 0},
    {"mean", PL_OP_MEAN, 1, {F32(8, 32)}, "", 0, 0},
    {"relu", PL_OP_RELU, 1, {F32(8, 32)}, "", 1024, 1}, /* its output */
    {"leaky_relu", PL_OP_LEAKY_RELU, 1, {F32(8, 32)}, "a<-a", 0, 0},
    {"elu", PL_OP_ELU, 1, {F32(8, 32)}, "a<-a", 0, 0},
    {"gelu", PL_OP_GELU, 1, {F32(8, 32)}, "a<-a", 0, 0},
    {"silu", PL_OP_SILU, 1, {F32(8, 32)}, "a<-a", 0, 0},
    {"sigmoid", PL_OP_SIGMOID, 1, {F32(8, 32)}, "", 1024, 1}, /* its output */
    {"tanh", PL_OP_TANH, 1, {F32(8, 32)}, "", 1024, 1}, /* its output */
    {"exp", PL_OP_EXP, 1, {F32(8, 32)}, "", 1024, 1}, /* its output */
    {"log", PL_OP_LOG, 1, {F32(8, 32)}, "a<-a", 0, 0},
    {"square", PL_OP_SQUARE, 1, {F32(8, 32)}, "a<-a", 0, 0},
    {"sqrt", PL_OP_SQRT, 1, {F32(8, 32)}, "a<-a", 0, 0},
    {"clamp", PL_OP_CLAMP, 1, {F32(8, 32)}, "a<-a", 0, 0},
    {"swiglu", PL_OP_SWIGLU, 2, {F32(8, 32), F32(8, 32)}, "a<-a a<-b b<-a", 0, 0},
    {"softmax", PL_OP_SOFTMAX, 1, {F32(8, 32)}, "", 1024, 1}, /* its output */
    {"log_softmax", PL_OP_LOG_SOFTMAX, 1, {F32(8, 32)}, "", 1024, 1}, /* its output */
    {"causal_softmax", PL_OP_CAUSAL_SOFTMAX, 1, {F32(4, 16, 16)}, "", 4096, 1},
    {"cross_entropy", PL_OP_CROSS_ENTROPY, 2, {F32(8, 32), IDX(32, 8)}, "a<-a a<-b", 32, 1},
    {"mse", PL_OP_MSE, 2, {F32(8, 32), F32(8, 32)}, "a<-a a<-b b<-a b<-b", 0, 0},
    {"mae", PL_OP_MAE, 2, {F32(8, 32), F32(8, 32)}, "a<-a a<-b b<-a b<-b", 0, 0},
    {"huber", PL_OP_HUBER, 2, {F32(8, 32), F32(8, 32)}, "a<-a a<-b b<-a b<-b", 0, 0},
    {"embedding", PL_OP_EMBEDDING, 2, {F32(32, 32), IDX(32, 8)}, "a<-b", 0, 0},
    {"index_select", PL_OP_INDEX_SELECT, 2, {F32(8, 32), IDX(8, 4)}, "a<-b", 0, 0},
    {"gather", PL_OP_GATHER, 2, {F32(8, 32), IDX(32, 8, 4)}, "a<-b", 0, 0},
    {"scatter_add", PL_OP_SCATTER_ADD, 2, {F32(8, 32), IDX(16, 8)}, "a<-b", 0, 0},
    {"segment_softmax", PL_OP_SEGMENT_SOFTMAX, 2, {F32(8, 32), IDX(3, 8)}, "a<-b", 1024, 1},
    {"layer_norm", PL_OP_LAYER_NORM, 3, {F32(8, 32), F32(32), F32(32)},
     "a<-a a<-b a<-c b<-a b<-b b<-c c<-a c<-b c<-c", 32, 2},
    {"rms_norm", PL_OP_RMS_NORM, 2, {F32(8, 32), F32(32)}, "a<-a a<-b b<-a b<-b", 32, 1},
    {"dropout", PL_OP_DROPOUT, 1, {F32(8, 32)}, "", 256, 1},
    {"concat", PL_OP_CONCAT, 2, {F32(8, 32), F32(8, 32)}, "", 0, 0},
    {"slice", PL_OP_SLICE, 1, {F32(8, 32)}, "", 0, 0},
    {"permute", PL_OP_PERMUTE, 1, {F32(8, 32)}, "", 0, 0},
    {"reshape", PL_OP_RESHAPE, 1, {F32(8, 32)}, "", 0, 0},
    {"copy", PL_OP_COPY, 1, {F32(8, 32)}, "", 0, 0},
    {"rope", PL_OP_ROPE, 1, {F32(2, 4, 2, 16)}, "", 0, 0},
    {"cast", PL_OP_CAST, 1, {F32(8, 32)}, "", 0, 0},
    {"nf4_matmul", PL_OP_NF4_MATMUL, 2,
     {F32(8, 64), {K_PARAM_NF4, PL_NF4, 2, {32, 64}, 0}}, "a<-b", 0, 0},
};
#define N_CASES ((int)(sizeof g_cases / sizeof g_cases[0]))

/* The allocator's block size for n bytes (core/src/alloc.c's classes below 1 MiB). */
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

/* Which inputs the documented rules keep for this grad mask. */
static unsigned rules_keep(const char *rules, unsigned grad_mask) {
    unsigned keep = 0;
    for (const char *r = rules; *r;) {
        if (*r == ' ') {
            r++;
            continue;
        }
        int x = r[0] - 'a', y = r[3] - 'a';
        ck_assert_msg(r[1] == '<' && r[2] == '-', "bad rule in '%s'", rules);
        if (grad_mask >> x & 1u) keep |= 1u << y;
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
    case PL_OP_SOFTMAX: return pl_softmax(x[0]);
    case PL_OP_LOG_SOFTMAX: return pl_log_softmax(x[0]);
    case PL_OP_CAUSAL_SOFTMAX: return pl_causal_softmax(x[0], 0.5);
    case PL_OP_CROSS_ENTROPY: return pl_cross_entropy(x[0], x[1], -100, 0.0);
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
    default: return NULL;
    }
}

/* One op, one grad mask: bytes the tape holds vs the rules; then backward. */
static void check_case(const op_case *c, unsigned grad_mask, pl_device dev) {
    char what[160];
    snprintf(what, sizeof what, "%s on %s, inputs requiring grad 0x%x", c->name,
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
    unsigned keep = rules_keep(c->rules, grad_mask);
    size_t want = 0;
    for (int i = 0; i < c->n_in; i++)
        if (keep >> i & 1u && c->in[i].kind != K_PARAM_NF4) want += spec_bytes(&c->in[i]);
    for (int i = 0; i < c->extra_n; i++) want += block_of((size_t)c->extra / (size_t)c->extra_n);
    ck_assert_msg(held == want,
                  "%s: the tape holds %zu bytes, the table says %zu (rules '%s', extra %lld)",
                  what, held, want, c->rules, (long long)c->extra);
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
    tcase_add_test(tc, needed_inputs_examples);
    tcase_add_test(tc, output_shared_with_its_consumer);
    tcase_add_test(tc, every_op_keeps_what_the_table_says_on_cpu);
    tcase_add_test(tc, every_op_keeps_what_the_table_says_on_strict);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return pl_test_run(suite()); }
