/* test_half_io.c - bf16 tensors through the f32-only kernels (half_io.c,
 * issue 31 item 2), on the CPU and on the strict device.
 *
 * An op on bf16 activations is recorded once, with its bf16 tensors, and the
 * dispatch widens them around the kernel. Checked here against the way it
 * was done before, spelled out: cast to f32, the f32 op, cast back, every
 * cast recorded. Forward results and gradients must be the same bits
 * (widening is exact, the f32 kernel the same, one rounding), except the
 * gradient of an op whose backward reads its own output, which now reads
 * the bf16-rounded output (PyTorch's bf16 semantics): equal within bf16's
 * relative precision there. And the tape must hold the bf16 inputs, not f32
 * copies: the bytes are measured with the device allocator. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "backend_loader.h"
#include "pl_test.h"
#include "registry.h"

enum { C_RMS_NORM, C_MUL, C_SWIGLU, C_SUM, C_SIGMOID, C_SOFTMAX, C_ADD_BCAST, C_LAYER_NORM, C_N };
static const char *const g_names[C_N] = {"rms_norm", "mul", "swiglu", "sum", "sigmoid",
                                         "softmax", "add (broadcast)", "layer_norm"};
/* does the op's backward read its output (rounded to bf16 now)? */
static const bool g_reads_output[C_N] = {false, false, false, false, true, true, false, false};

static pl_tensor *g_w; /* an f32 parameter [32] of the norms */

static pl_tensor *op(int c, pl_tensor *a, pl_tensor *b) {
    switch (c) {
    case C_RMS_NORM: return pl_rms_norm(a, g_w, 1e-5);
    case C_MUL: return pl_mul(a, b);
    case C_SWIGLU: return pl_swiglu(a, b);
    case C_SUM: return pl_sum(a, 1, false);
    case C_SIGMOID: return pl_sigmoid(a);
    case C_SOFTMAX: return pl_softmax(a);
    case C_ADD_BCAST: return pl_add(a, pl_reshape(b, 1, (int64_t[]){256})); /* [8,256] + [256] */
    default: return pl_layer_norm(a, g_w, NULL, 1e-5);
    }
}

/* The old way: both operands cast to f32 (recorded), the op, the result cast
 * back; swiglu as the chain it fuses, silu(gate) rounded to bf16 times up. */
static pl_tensor *op_via_casts(int c, pl_tensor *a, pl_tensor *b) {
    if (c == C_SWIGLU) {
        pl_tensor *s = pl_cast(pl_silu(pl_cast(a, PL_F32)), a->dtype);
        return pl_cast(pl_mul(pl_cast(s, PL_F32), pl_cast(b, PL_F32)), a->dtype);
    }
    pl_tensor *r = op(c, pl_cast(a, PL_F32), b ? pl_cast(b, PL_F32) : NULL);
    return r ? pl_cast(r, a->dtype) : NULL;
}

static pl_tensor *leaf(pl_device dev, int64_t rows, int64_t cols, uint64_t seed) {
    pl_tensor *h = pl_tensor_empty_owned(PL_F32, 2, (int64_t[]){rows, cols}, PL_CPU);
    pl_tensor_uniform_(h, -2.0, 2.0, 5, seed);
    pl_tensor *d = pl_tensor_to(h, PL_BF16, dev);
    pl_tensor_release(h);
    pl_tensor_set_requires_grad(d, true);
    return d;
}

static pl_tensor *host(const pl_tensor *t) {
    return pl_tensor_to(t, t->dtype, PL_CPU);
}

/* Forward value (host, owned) and input grads of op c on bf16 leaves. */
static pl_tensor *run(int c, pl_device dev, bool via_casts, pl_tensor **ga, pl_tensor **gb) {
    bool two = c == C_MUL || c == C_SWIGLU || c == C_ADD_BCAST;
    pl_tensor *a = leaf(dev, 8, c == C_ADD_BCAST ? 256 : 32, 1);
    pl_tensor *b = two ? leaf(dev, c == C_ADD_BCAST ? 1 : 8, c == C_ADD_BCAST ? 256 : 32, 2) : NULL;
    ck_assert_ptr_nonnull(a);
    pl_frame_begin();
    pl_tensor *y = via_casts ? op_via_casts(c, a, b) : op(c, a, b);
    ck_assert_msg(y != NULL, "%s: %s", g_names[c], pl_error_message());
    ck_assert_int_eq(y->dtype, PL_BF16);
    /* a loss that weighs every element differently: sum(y * y) in f32 */
    pl_tensor *y32 = pl_cast(y, PL_F32);
    pl_tensor *l = pl_sum(pl_mul(y32, y32), PL_ALL_DIMS, false);
    ck_assert_msg(l != NULL, "%s: %s", g_names[c], pl_error_message());
    pl_tensor_retain(y);
    pl_tensor_retain(l);
    pl_frame_end();
    pl_tensor *out = host(y); /* outside the frame: ours */
    pl_tensor_release(y);
    PL_CK_OK(pl_backward(l, 1.0));
    pl_tensor_release(l);
    *ga = host(a->grad);
    *gb = b ? host(b->grad) : NULL;
    pl_tensor_release(a);
    pl_tensor_release(b);
    return out;
}

static void same(const char *what, const pl_tensor *x, const pl_tensor *y, double rel) {
    ck_assert_int_eq(pl_tensor_numel(x), pl_tensor_numel(y));
    ck_assert_int_eq(x->dtype, y->dtype);
    int64_t n = pl_tensor_numel(x);
    if (rel == 0) {
        ck_assert_msg(!memcmp(pl_tensor_data(x), pl_tensor_data(y), pl_tensor_nbytes(x)),
                      "%s: not the same bits", what);
        return;
    }
    const float *p = pl_tensor_data(x), *q = pl_tensor_data(y);
    for (int64_t i = 0; i < n; i++)
        ck_assert_msg(fabs(p[i] - q[i]) <= rel * (fabs(q[i]) + 1.0), "%s [%lld]: %g vs %g",
                      what, (long long)i, p[i], q[i]);
}

static void check_same_as_casts(pl_device dev) {
    for (int c = 0; c < C_N; c++) {
        pl_tensor *ga, *gb, *ha, *hb;
        pl_tensor *y = run(c, dev, false, &ga, &gb);
        pl_tensor *r = run(c, dev, true, &ha, &hb);
        char what[96];
        snprintf(what, sizeof what, "%s forward", g_names[c]);
        same(what, y, r, 0);
        /* the saved output y in (0, 1) rounded to bf16 moves it by <= 2^-9;
         * y (1 - y) and softmax's y (g - sum) move by about as much, times a
         * loss gradient 2y <= 2: 2^-7 of (|grad| + 1) bounds it */
        double rel = g_reads_output[c] ? 1.0 / 128 : 0;
        snprintf(what, sizeof what, "%s grad of input 0", g_names[c]);
        same(what, ga, ha, rel);
        if (gb) {
            snprintf(what, sizeof what, "%s grad of input 1", g_names[c]);
            same(what, gb, hb, rel);
        }
        pl_tensor_release(y), pl_tensor_release(r);
        pl_tensor_release(ga), pl_tensor_release(gb);
        pl_tensor_release(ha), pl_tensor_release(hb);
    }
}

static pl_device strict_device(void) {
    pl_registry *reg = pl_registry_new();
    ck_assert_ptr_nonnull(reg);
    PL_CK_OK(pl_registry_add_dir(reg, PL_TEST_PLUGIN_DIR));
    PL_CK_OK(pl_backend_load_named(reg, PL_DEVICE_CUDA, "strict"));
    pl_registry_free(reg);
    return (pl_device){PL_DEVICE_CUDA, 0};
}

static void with_weight(pl_device dev) {
    pl_tensor *h = pl_tensor_empty_owned(PL_F32, 1, (int64_t[]){32}, PL_CPU);
    pl_tensor_uniform_(h, 0.5, 1.5, 7, 3);
    g_w = pl_tensor_to(h, PL_F32, dev);
    pl_tensor_release(h);
    pl_tensor_set_requires_grad(g_w, true);
}

START_TEST(same_bits_as_the_recorded_casts_on_cpu) {
    with_weight(PL_CPU);
    check_same_as_casts(PL_CPU);
    pl_tensor_release(g_w);
}
END_TEST

START_TEST(same_bits_as_the_recorded_casts_on_strict) {
    pl_device dev = strict_device();
    with_weight(dev);
    check_same_as_casts(dev);
    pl_tensor_release(g_w);
}
END_TEST

/* Bytes the tape holds after the forward of op c on bf16 activations [8, 32]
 * (each an activation: a recorded scale of a leaf, as test_autograd_saved). */
static size_t held_by_tape(int c, pl_device dev) {
    pl_tensor *a = leaf(dev, 8, 32, 1), *b = leaf(dev, 8, 32, 2);
    pl_alloc_stats s0 = pl_alloc_get_stats(dev);
    pl_frame_begin();
    pl_tensor *y = op(c, pl_scale(a, 1.0), pl_scale(b, 1.0));
    ck_assert_msg(y != NULL, "%s: %s", g_names[c], pl_error_message());
    pl_tensor *l = pl_sum(pl_cast(y, PL_F32), PL_ALL_DIMS, false);
    pl_tensor_retain(l);
    pl_frame_end();
    pl_alloc_stats s1 = pl_alloc_get_stats(dev);
    size_t held = s1.bytes_in_use - s0.bytes_in_use - l->storage->capacity;
    PL_CK_OK(pl_backward(l, 1.0));
    pl_tensor_release(l);
    pl_tensor_release(a);
    pl_tensor_release(b);
    return held;
}

static void check_held(pl_device dev) {
    with_weight(dev);
    /* [8, 32] bf16 = 512 bytes, one 512-byte allocator block (256-byte classes
     * doubling); the f32 copies the recorded casts kept were 1024 each */
    ck_assert_uint_eq(held_by_tape(C_MUL, dev), 2 * 512);          /* a and b, bf16 */
    ck_assert_uint_eq(held_by_tape(C_SWIGLU, dev), 2 * 512);       /* gate and up, bf16 */
    ck_assert_uint_eq(held_by_tape(C_RMS_NORM, dev), 512 + 256);   /* x bf16 + rstd [8] f32 */
    ck_assert_uint_eq(held_by_tape(C_SIGMOID, dev), 512);          /* its bf16 output */
    pl_tensor_release(g_w);
}

START_TEST(the_tape_keeps_bf16_not_f32_copies) {
    check_held(PL_CPU);
    check_held(strict_device());
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("half_io");
    TCase *tc = tcase_create("half_io");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, same_bits_as_the_recorded_casts_on_cpu);
    tcase_add_test(tc, same_bits_as_the_recorded_casts_on_strict);
    tcase_add_test(tc, the_tape_keeps_bf16_not_f32_copies);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return pl_test_run(suite()); }
