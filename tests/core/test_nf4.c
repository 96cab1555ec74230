/* test_nf4.c - NF4 quantization (pipeline/nf4.h) and pl_nf4_matmul.
 *
 * References used (independent of the code under test):
 *   - the NF4 code values are recomputed from their definition, bitsandbytes
 *     create_normal_map(offset=0.9677083): quantiles of N(0,1) at
 *     linspace(offset, 0.5, 9)[:-1] and linspace(offset, 0.5, 8)[:-1]
 *     (negated), plus 0, normalized by the max (QLoRA eq. 4); the quantile
 *     function is inverted here by bisection on 0.5 * erfc(-x / sqrt 2);
 *   - quantization is checked against a brute-force nearest-code search;
 *   - the round-trip error bound is bitsandbytes' own test
 *     (tests/test_functional.py test_4bit_quant, blocksize 64: mean |err|
 *     < 0.1 and mean relative error < 0.28 on randn(1024, 1024));
 *   - matmul results are compared with dequantize + pl_matmul, gradients
 *     with central differences (pl_gradcheck).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pipeline/kernel_math.h"
#include "pipeline/nf4.h"
#include "pl_test.h"

static double norm_cdf(double x) { return 0.5 * erfc(-x / sqrt(2.0)); }

static double norm_ppf(double p) {
    double lo = -10, hi = 10;
    for (int i = 0; i < 200; i++) {
        double mid = 0.5 * (lo + hi);
        if (norm_cdf(mid) < p)
            lo = mid;
        else
            hi = mid;
    }
    return 0.5 * (lo + hi);
}

/* float32 torch.linspace(a, b, n)[i] (close enough: values feed a ppf). */
static float linspace_f(float a, float b, int n, int i) {
    return (float)(a + (double)(b - a) * i / (n - 1));
}

static int cmpf(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* pl_tensor_storage_nbytes: an NF4 tensor costs its codes and its
 * quantization state; any other tensor its elements. */
START_TEST(storage_nbytes_counts_the_quantization_state) {
    pl_tensor *w = pl_test_randn(PL_SHAPE(8, 64), 3);
    ck_assert_uint_eq(pl_tensor_storage_nbytes(w), 8 * 64 * 4);
    pl_tensor *q = PL_CK_NOTNULL(pl_nf4_quantize(w, 64, true));
    ck_assert_uint_eq(pl_tensor_storage_nbytes(q), pl_nf4_code_nbytes(q) + pl_nf4_state_nbytes(q));
    ck_assert_uint_eq(pl_nf4_code_nbytes(q), 8 * 64 / 2);
    ck_assert_uint_gt(pl_nf4_state_nbytes(q), 0);
    pl_tensor_release(q);
    pl_tensor_release(w);
}
END_TEST

START_TEST(code_table_is_the_qlora_normal_map) {
    const float offset = 0.9677083f;
    float v[16];
    int n = 0;
    for (int i = 0; i < 8; i++) v[n++] = (float)norm_ppf(linspace_f(offset, 0.5f, 9, i));
    v[n++] = 0.0f;
    for (int i = 0; i < 7; i++) v[n++] = (float)-norm_ppf(linspace_f(offset, 0.5f, 8, i));
    qsort(v, 16, sizeof(float), cmpf);
    float mx = v[15];
    const float *t = pl_nf4_code_table();
    for (int i = 0; i < 16; i++)
        ck_assert_msg(fabsf(v[i] / mx - t[i]) < 2e-6f, "code %d: table %.9g, recomputed %.9g", i,
                      t[i], v[i] / mx);
    /* the exact constants of bitsandbytes csrc/kernels.cu */
    ck_assert_float_eq(t[0], -1.0f);
    ck_assert_float_eq(t[7], 0.0f);
    ck_assert_float_eq(t[15], 1.0f);
    ck_assert_float_eq(t[1], -0.6961928009986877f);
    ck_assert_float_eq(t[8], 0.07958029955625534f);
    ck_assert_float_eq(t[14], 0.7229568362236023f);
}
END_TEST

START_TEST(each_code_value_maps_to_itself) {
    const float *t = pl_nf4_code_table();
    for (int i = 0; i < 16; i++) ck_assert_int_eq(pl_nf4_quantize_value(t[i]), i);
    float vals[64];
    for (int i = 0; i < 64; i++) vals[i] = t[(i * 7) % 16]; /* contains -1 and 1: absmax 1 */
    pl_tensor *w = PL_CK_NOTNULL(pl_tensor_from_data(PL_F32, PL_SHAPE(2, 32), vals, PL_CPU));
    pl_tensor *q = PL_CK_NOTNULL(pl_nf4_quantize(w, 64, false));
    ck_assert_int_eq(q->dtype, PL_NF4);
    ck_assert_int_eq(q->ndim, 2);
    ck_assert_float_eq(pl_tensor_f32(q->quant.absmax)[0], 1.0f);
    /* packing: element 0 in the low nibble, element 1 in the high nibble */
    const uint8_t *codes = pl_tensor_data(q);
    ck_assert_int_eq(codes[0], (uint8_t)(((7 % 16) << 4) | 0));
    pl_tensor *d = PL_CK_NOTNULL(pl_nf4_dequantize(q, PL_F32));
    const float *dd = pl_tensor_f32(d);
    for (int i = 0; i < 64; i++) ck_assert_float_eq(dd[i], vals[i]);
    pl_tensor_release(d);
    pl_tensor_release(q);
    pl_tensor_release(w);
}
END_TEST

/* The decode every backend compiles (kernel_math.h, PL_HD) is the public
 * table and the public quantizer, value for value. */
START_TEST(shared_decode_is_the_public_table) {
    const float *t = pl_nf4_code_table();
    for (unsigned c = 0; c < 16; c++) ck_assert(pl_nf4_code(c) == t[c]);
    uint8_t codes[8];
    for (int b = 0; b < 8; b++) codes[b] = (uint8_t)((2 * b) | ((15 - 2 * b) << 4));
    for (int i = 0; i < 16; i++) {
        unsigned c = (i & 1) ? 15u - (unsigned)(i - 1) : (unsigned)i; /* low nibble first */
        ck_assert_uint_eq(pl_nf4_nibble(codes, i), c);
        ck_assert(pl_nf4_decode(codes, i, 0.5f) == t[c] * 0.5f);
    }
    for (int k = -1100; k <= 1100; k++) {
        float x = (float)k / 1000.0f;
        ck_assert_int_eq(pl_nf4_encode(x), pl_nf4_quantize_value(x));
    }
    ck_assert_int_eq(pl_nf4_encode(NAN), 0);
}
END_TEST

/* nearest code by brute force (ties -> lower index, like the tree) */
static int nearest_code(float x) {
    const float *t = pl_nf4_code_table();
    int best = 0;
    for (int i = 1; i < 16; i++)
        if (fabsf(x - t[i]) < fabsf(x - t[best])) best = i;
    return best;
}

START_TEST(round_trip_of_normal_matrix_within_bitsandbytes_bound) {
    const int64_t R = 256, C = 1024, B = 64;
    pl_tensor *w = PL_CK_NOTNULL(pl_test_randn(PL_SHAPE(R, C), 7));
    const float *x = pl_tensor_f32(w);
    for (int dq = 0; dq < 2; dq++) {
        pl_tensor *q = PL_CK_NOTNULL(pl_nf4_quantize(w, B, dq));
        pl_tensor *d = PL_CK_NOTNULL(pl_nf4_dequantize(q, PL_F32));
        const float *y = pl_tensor_f32(d);
        float *am = malloc(sizeof(float) * (size_t)pl_nf4_num_blocks(q));
        PL_CK_OK(pl_nf4_block_absmax(q, am));
        double err = 0, rel = 0;
        int64_t n = R * C, mismatched = 0;
        for (int64_t i = 0; i < n; i++) {
            double e = fabs((double)x[i] - y[i]);
            err += e;
            rel += e / (fabs(x[i]) + 1e-8);
            if (!dq) {
                /* exact: y = code[nearest(x / absmax)] * absmax */
                float m = 0;
                for (int64_t j = (i / B) * B; j < (i / B + 1) * B; j++)
                    if (fabsf(x[j]) > m) m = fabsf(x[j]);
                ck_assert_float_eq(am[i / B], m);
                int c = nearest_code(x[i] * (1.0f / m));
                if (y[i] != pl_nf4_code_table()[c] * m) mismatched++;
            }
        }
        err /= (double)n;
        rel /= (double)n;
        ck_assert_int_eq(mismatched, 0);
        ck_assert_msg(err < 0.1 && rel < 0.28, "dq=%d: mean abs err %.5f (< 0.1), rel %.5f (< 0.28)",
                      dq, err, rel);
        ck_assert_msg(err > 0.03, "dq=%d: error %.5f suspiciously small for 4 bits", dq, err);
        if (dq) {
            /* recovered constants close to the exact absmax of each block */
            for (int64_t b = 0; b < pl_nf4_num_blocks(q); b++) {
                float m = 0;
                for (int64_t j = b * B; j < (b + 1) * B; j++)
                    if (fabsf(x[j]) > m) m = fabsf(x[j]);
                ck_assert_msg(fabsf(am[b] - m) < 0.02f * m, "block %lld absmax %g vs %g",
                              (long long)b, am[b], m);
            }
        }
        free(am);
        pl_tensor_release(d);
        pl_tensor_release(q);
    }
    pl_tensor_release(w);
}
END_TEST

START_TEST(double_quantization_stores_0_127_bits_per_param) {
    const int64_t n = 64 * 256 * 4; /* 1024 blocks, 4 groups */
    pl_tensor *w = PL_CK_NOTNULL(pl_test_randn(PL_SHAPE(256, n / 256), 3));
    pl_tensor *q0 = PL_CK_NOTNULL(pl_nf4_quantize(w, 64, false));
    pl_tensor *q1 = PL_CK_NOTNULL(pl_nf4_quantize(w, 64, true));
    ck_assert_int_eq(pl_nf4_code_nbytes(q0), (size_t)n / 2);
    /* plain: one f32 per 64 params = 0.5 bit / param */
    ck_assert_int_eq(pl_nf4_state_nbytes(q0), 1024 * 4);
    ck_assert_double_eq_tol(pl_nf4_state_nbytes(q0) * 8.0 / (double)n, 0.5, 1e-12);
    /* double: u8 per block + f32 per 256 blocks (+ one f32 mean per tensor) */
    ck_assert_int_eq(q1->quant.absmax->dtype, PL_U8);
    ck_assert_int_eq(pl_tensor_numel(q1->quant.absmax_scale), 4);
    ck_assert_int_eq(pl_nf4_state_nbytes(q1), 1024 + 4 * 4 + 4);
    double bits = (pl_nf4_state_nbytes(q1) - 4) * 8.0 / (double)n;
    ck_assert_double_eq_tol(bits, 8.0 / 64 + 32.0 / (64 * 256), 1e-12);
    ck_assert_double_eq_tol(bits, 0.127, 0.0005);
    pl_tensor_release(q0);
    pl_tensor_release(q1);
    pl_tensor_release(w);
}
END_TEST

START_TEST(zero_block_and_short_last_block) {
    float v[70] = {0};
    for (int i = 64; i < 70; i++) v[i] = (float)(i - 66);
    pl_tensor *w = PL_CK_NOTNULL(pl_tensor_from_data(PL_F32, PL_SHAPE(70), v, PL_CPU));
    pl_tensor *q = PL_CK_NOTNULL(pl_nf4_quantize(w, 64, false));
    ck_assert_int_eq(pl_nf4_num_blocks(q), 2);
    ck_assert_float_eq(pl_tensor_f32(q->quant.absmax)[1], 3.0f);
    pl_tensor *d = PL_CK_NOTNULL(pl_nf4_dequantize(q, PL_F32));
    for (int i = 0; i < 64; i++) ck_assert_float_eq(pl_tensor_f32(d)[i], 0.0f);
    ck_assert_float_eq(pl_tensor_f32(d)[69], 3.0f);
    ck_assert_float_eq(pl_tensor_f32(d)[64], 3.0f * pl_nf4_code_table()[nearest_code(-2.0f / 3)]);
    pl_tensor_release(d);
    pl_tensor_release(q);
    pl_tensor_release(w);
}
END_TEST

/* ---- pl_nf4_matmul ---------------------------------------------------------------- */

static void check_matmul(int64_t N, int64_t K, pl_dtype xdt, bool dq, double tol) {
    pl_tensor *w = PL_CK_NOTNULL(pl_test_randn(PL_SHAPE(N, K), 11));
    pl_tensor *q = PL_CK_NOTNULL(pl_nf4_quantize(w, 64, dq));
    pl_tensor *x32 = PL_CK_NOTNULL(pl_test_randn(PL_SHAPE(3, 5, K), 12));
    pl_frame_begin();
    pl_tensor *x = xdt == PL_F32 ? x32 : pl_cast(x32, xdt);
    pl_tensor *y = PL_CK_NOTNULL(pl_nf4_matmul(x, q));
    ck_assert_int_eq(y->dtype, xdt);
    ck_assert_int_eq(y->ndim, 3);
    ck_assert_int_eq(y->shape[2], N);
    /* reference: weights dequantized to x's dtype, f32 matmul of the same values */
    pl_tensor *deq = pl_nf4_dequantize(q, xdt);
    pl_tensor *ref = pl_matmul(pl_cast(x, PL_F32), pl_cast(deq, PL_F32), false, true);
    ck_assert_ptr_nonnull(ref);
    double md = pl_test_max_abs_diff(y, ref);
    ck_assert_msg(md <= tol, "N=%lld K=%lld %s: max diff %g > %g", (long long)N, (long long)K,
                  pl_dtype_name(xdt), md, tol);
    pl_tensor_release(deq);
    pl_frame_end();
    pl_tensor_release(x32);
    pl_tensor_release(q);
    pl_tensor_release(w);
}

START_TEST(nf4_matmul_matches_dequantize_then_matmul) {
    check_matmul(48, 128, PL_F32, false, 1e-4);
    check_matmul(600, 512, PL_F32, true, 2e-4); /* two weight panels */
    /* bf16: output rounded to bf16 (|y| ~ 20: 1 ulp = 0.125) */
    check_matmul(40, 256, PL_BF16, false, 0.13);
}
END_TEST

static pl_tensor *f_nf4(pl_tensor **in, int n, void *ctx) {
    (void)n;
    return pl_nf4_matmul(in[0], ctx);
}

START_TEST(nf4_matmul_gradient_flows_to_x_only) {
    pl_tensor *w = PL_CK_NOTNULL(pl_test_randn(PL_SHAPE(7, 64), 21));
    pl_tensor *q = PL_CK_NOTNULL(pl_nf4_quantize(w, 64, true));
    pl_tensor *x = PL_CK_NOTNULL(pl_test_randn(PL_SHAPE(2, 3, 64), 22));
    pl_tensor_set_requires_grad(x, true);
    char msg[256];
    ck_assert_msg(pl_gradcheck(f_nf4, &x, 1, q, 1e-2, 1e-3, 1e-3, msg, sizeof msg), "%s", msg);
    ck_assert_ptr_null(q->grad);
    /* dx = dy @ dequant(W) with dy = ones */
    pl_tensor_zero_grad(x);
    pl_frame_begin();
    pl_tensor *loss = pl_sum(pl_nf4_matmul(x, q), PL_ALL_DIMS, false);
    PL_CK_OK(pl_backward(loss, 1.0));
    pl_frame_end();
    pl_tensor *d = PL_CK_NOTNULL(pl_nf4_dequantize(q, PL_F32));
    for (int64_t k = 0; k < 64; k++) {
        double s = 0;
        for (int64_t r = 0; r < 7; r++) s += pl_tensor_f32(d)[r * 64 + k];
        for (int64_t m = 0; m < 6; m++)
            ck_assert_double_eq_tol(pl_tensor_f32(x->grad)[m * 64 + k], s, 1e-5);
    }
    pl_tensor_release(d);
    pl_tensor_release(x);
    pl_tensor_release(q);
    pl_tensor_release(w);
}
END_TEST

START_TEST(other_ops_refuse_nf4_with_op_and_tensor_names) {
    pl_tensor *w = PL_CK_NOTNULL(pl_test_randn(PL_SHAPE(8, 64), 31));
    pl_tensor_set_name(w, "model.layer.q_proj.weight");
    pl_tensor *q = PL_CK_NOTNULL(pl_nf4_quantize(w, 64, false));
    pl_tensor *x = PL_CK_NOTNULL(pl_test_randn(PL_SHAPE(4, 64), 32));
    pl_frame_begin();
    pl_error_clear();
    ck_assert_ptr_null(pl_matmul(x, q, false, true));
    ck_assert_int_eq(pl_error_status(), PL_ERR_DTYPE);
    ck_assert_msg(strstr(pl_error_message(), "matmul") &&
                      strstr(pl_error_message(), "model.layer.q_proj.weight"),
                  "message: %s", pl_error_message());
    pl_error_clear();
    ck_assert_ptr_null(pl_linear(x, q, NULL));
    ck_assert_int_eq(pl_error_status(), PL_ERR_DTYPE);
    pl_error_clear();
    ck_assert_ptr_null(pl_add(q, q));
    ck_assert_int_eq(pl_error_status(), PL_ERR_DTYPE);
    ck_assert_msg(strstr(pl_error_message(), "add"), "message: %s", pl_error_message());
    /* nf4_matmul refuses a float weight and a wrong K */
    pl_error_clear();
    ck_assert_ptr_null(pl_nf4_matmul(x, w));
    ck_assert_int_eq(pl_error_status(), PL_ERR_DTYPE);
    pl_tensor *x2 = pl_test_randn(PL_SHAPE(4, 32), 33);
    ck_assert_ptr_null(pl_nf4_matmul(x2, q));
    ck_assert_int_eq(pl_error_status(), PL_ERR_SHAPE);
    pl_frame_end();
    pl_tensor_release(x);
    pl_tensor_release(q);
    pl_tensor_release(w);
}
END_TEST

START_TEST(checkpoint_interop_quantize_and_dequantize_on_load) {
    char path[] = "/tmp/pl_test_nf4_XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    close(fd);
    pl_tensor *w = PL_CK_NOTNULL(pl_test_randn(PL_SHAPE(16, 80), 41));
    pl_tensor *q = PL_CK_NOTNULL(pl_nf4_quantize(w, 64, true));
    /* a qlora4-style checkpoint: codes under the name, state under the prefix */
    pl_st_writer *wr = PL_CK_NOTNULL(pl_st_writer_new(path));
    PL_CK_OK(pl_st_writer_add(wr, "base.weight", q));
    PL_CK_OK(pl_st_writer_add(wr, "plain.weight", w));
    PL_CK_OK(pl_st_writer_add(wr, "precision.qlora4.v1.base.weight.absmax", q->quant.absmax));
    PL_CK_OK(pl_st_writer_add(wr, "precision.qlora4.v1.base.weight.absmax_scale",
                              q->quant.absmax_scale));
    char buf[64];
    snprintf(buf, sizeof buf, "%.9g", (double)q->quant.absmax_mean);
    PL_CK_OK(pl_st_writer_meta(wr, "precision.qlora4.v1.base.weight.absmax_mean", buf));
    PL_CK_OK(pl_st_writer_meta(wr, "precision.qlora4.v1.base.weight.block", "64"));
    PL_CK_OK(pl_st_writer_commit(wr));
    pl_st_writer_free(wr);

    pl_st_file *f = NULL;
    PL_CK_OK(pl_st_open(path, &f));
    /* nf4 codes onto an f32 base: dequantized */
    pl_tensor *dst = PL_CK_NOTNULL(pl_tensor_zeros(PL_F32, PL_SHAPE(16, 80), PL_CPU));
    PL_CK_OK(pl_nf4_load_into(f, "base.weight", "precision.qlora4.v1.", dst));
    pl_tensor *ref = PL_CK_NOTNULL(pl_nf4_dequantize(q, PL_F32));
    ck_assert_double_eq_tol(pl_test_max_abs_diff(dst, ref), 0.0, 1e-6);
    /* f32 weights onto an nf4 parameter: quantized in place */
    pl_tensor *q2 = PL_CK_NOTNULL(pl_nf4_quantize(dst, 64, true)); /* other values */
    PL_CK_OK(pl_nf4_load_into(f, "plain.weight", "precision.qlora4.v1.", q2));
    ck_assert_int_eq(memcmp(pl_tensor_data(q2), pl_tensor_data(q), pl_nf4_code_nbytes(q)), 0);
    ck_assert_int_eq(memcmp(pl_tensor_data(q2->quant.absmax), pl_tensor_data(q->quant.absmax),
                            pl_tensor_nbytes(q->quant.absmax)),
                     0);
    /* codes without their state: a clear error */
    pl_tensor *dst2 = PL_CK_NOTNULL(pl_tensor_zeros(PL_F32, PL_SHAPE(16, 80), PL_CPU));
    ck_assert_int_ne(pl_nf4_load_into(f, "base.weight", "other.", dst2), PL_OK);
    ck_assert_msg(strstr(pl_error_message(), "other.base.weight.absmax"), "%s", pl_error_message());
    pl_st_close(f);
    unlink(path);
    pl_tensor_release(dst2);
    pl_tensor_release(q2);
    pl_tensor_release(ref);
    pl_tensor_release(dst);
    pl_tensor_release(q);
    pl_tensor_release(w);
}
END_TEST

/* A NaN used to vanish: the block absmax skips it (fabsf(NaN) > m is false)
 * and it became an ordinary code. NaN and Inf are refused, naming the
 * tensor, the count and the first index, in quantize and quantize_into,
 * from f32, bf16 and f16 sources (issue 34). */
START_TEST(quantize_refuses_non_finite_weights) {
    const pl_dtype dts[] = {PL_F32, PL_BF16, PL_F16};
    for (int k = 0; k < 3; k++)
        for (int inf = 0; inf < 2; inf++) {
            int64_t shape[2] = {4, 32};
            pl_tensor *w32 = PL_CK_NOTNULL(pl_test_randn(2, shape, 11));
            ((float *)pl_tensor_data(w32))[70] = inf ? -INFINITY : NAN;
            pl_tensor *w = PL_CK_NOTNULL(pl_tensor_to(w32, dts[k], PL_CPU));
            pl_tensor_set_name(w, "layer.q_proj.weight");
            ck_assert_ptr_null(pl_nf4_quantize(w, 64, k == 1));
            const char *m = pl_error_message();
            ck_assert_int_eq(pl_error_status(), PL_ERR_NUMERIC);
            ck_assert_msg(strstr(m, "'layer.q_proj.weight'") && strstr(m, "1 non-finite values of 128") &&
                              strstr(m, "first at flat index 70"),
                          "%s: %s", pl_dtype_name(dts[k]), m);
            /* quantize_into an existing nf4 tensor: refused, q keeps its values */
            pl_tensor *ok = PL_CK_NOTNULL(pl_test_randn(2, shape, 12));
            pl_tensor *q = PL_CK_NOTNULL(pl_nf4_quantize(ok, 64, false));
            pl_tensor *before = PL_CK_NOTNULL(pl_nf4_dequantize(q, PL_F32));
            ck_assert_int_eq(pl_nf4_quantize_into(q, w), PL_ERR_NUMERIC);
            pl_tensor *after = PL_CK_NOTNULL(pl_nf4_dequantize(q, PL_F32));
            ck_assert(pl_test_max_abs_diff(before, after) == 0.0);
            pl_tensor_release(before);
            pl_tensor_release(after);
            pl_tensor_release(q);
            pl_tensor_release(ok);
            pl_tensor_release(w);
            pl_tensor_release(w32);
        }
}
END_TEST

int main(void) {
    Suite *s = suite_create("nf4");
    TCase *tc = tcase_create("nf4");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, code_table_is_the_qlora_normal_map);
    tcase_add_test(tc, storage_nbytes_counts_the_quantization_state);
    tcase_add_test(tc, each_code_value_maps_to_itself);
    tcase_add_test(tc, shared_decode_is_the_public_table);
    tcase_add_test(tc, round_trip_of_normal_matrix_within_bitsandbytes_bound);
    tcase_add_test(tc, double_quantization_stores_0_127_bits_per_param);
    tcase_add_test(tc, zero_block_and_short_last_block);
    tcase_add_test(tc, nf4_matmul_matches_dequantize_then_matmul);
    tcase_add_test(tc, nf4_matmul_gradient_flows_to_x_only);
    tcase_add_test(tc, other_ops_refuse_nf4_with_op_and_tensor_names);
    tcase_add_test(tc, checkpoint_interop_quantize_and_dequantize_on_load);
    tcase_add_test(tc, quantize_refuses_non_finite_weights);
    suite_add_tcase(s, tc);
    return pl_test_run(s);
}
