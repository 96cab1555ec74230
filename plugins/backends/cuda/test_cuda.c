/* test_cuda.c - the cuda backend plugin: loads through the registry, and on
 * a machine with a GPU round-trips memory, reports mem_info, pinned memory
 * and runs a small training-style graph (matmul + cross-entropy backward),
 * nf4_matmul (f32 / bf16 x, plain / double-quantized absmax), lstm (cuDNN's
 * and the native implementation, both directions, initial states, the
 * forward / backward pairing rule, a captured native step), clamp and ten
 * AdamW / SGD steps against
 * the CPU. Without a GPU every test skips with the reason. The op-by-op
 * comparison is tests/core/test_backend_conformance.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pipeline/graph.h"
#include "pipeline/optim_math.h"
#include "pipeline/testing.h"
#include "pl_test.h"

static bool g_have_gpu;
static char g_reason[1024];

static void load_once(void) {
    static bool done;
    if (done) return;
    done = true;
    /* as `[pipeline] device = cuda` loads it (ctest puts the build's plugin
     * dir on PIPELINE_PLUGIN_PATH) */
    g_have_gpu = pl_harness_load_backend(PL_DEVICE_CUDA) == PL_OK;
    if (!g_have_gpu) snprintf(g_reason, sizeof g_reason, "%s", pl_error_message());
}

#define NEED_GPU()                                                                          \
    do {                                                                                    \
        load_once();                                                                        \
        if (!g_have_gpu) {                                                                  \
            printf("SKIP %s: no CUDA device (%s)\n", __func__, g_reason);                   \
            return;                                                                         \
        }                                                                                   \
    } while (0)

/* The plugin is found by name and kind, and its descriptor is a backend. */
START_TEST(plugin_descriptor) {
    const pl_plugin_desc *d = NULL;
    PL_CK_OK(pl_harness_find_plugin("cuda", PL_KIND_BACKEND, &d));
    ck_assert_str_eq(d->name, "cuda");
    const pl_backend *b = d->vtable;
    ck_assert_ptr_nonnull(b);
    ck_assert_int_eq(b->type, PL_DEVICE_CUDA);
    ck_assert_uint_eq(b->struct_size, PL_BACKEND_STRUCT_SIZE);
    ck_assert_ptr_nonnull(b->kernel);
    ck_assert(pl_backend_supports(b, PL_OP_MATMUL, false));
    ck_assert(pl_backend_supports(b, PL_OP_CROSS_ENTROPY, true));
    ck_assert(pl_backend_supports(b, PL_OP_NF4_MATMUL, false));
    ck_assert(pl_backend_supports(b, PL_OP_NF4_MATMUL, true));
    /* cuDNN's or, built without cuDNN, the native one (cuda_lstm_native.cu) */
    ck_assert(pl_backend_supports(b, PL_OP_LSTM, false));
    ck_assert(pl_backend_supports(b, PL_OP_LSTM, true));
    /* set_option("lstm"): the three values; anything else names itself */
    ck_assert(b->set_option);
    PL_CK_OK(b->set_option("lstm", "native"));
    PL_CK_OK(b->set_option("lstm", "auto"));
#ifdef PL_CUDA_HAVE_CUDNN
    PL_CK_OK(b->set_option("lstm", "cudnn"));
    PL_CK_OK(b->set_option("lstm", "auto"));
#else
    ck_assert_int_eq(b->set_option("lstm", "cudnn"), PL_ERR_UNSUPPORTED);
#endif
    ck_assert_int_eq(b->set_option("lstm", "fast"), PL_ERR_INVALID);
    ck_assert_msg(strstr(pl_error_message(), "'fast'"), "%s", pl_error_message());
    ck_assert(pl_backend_supports(b, PL_OP_CLAMP, false));
    ck_assert(pl_backend_supports(b, PL_OP_CLAMP, true));
    ck_assert(pl_backend_supports(b, PL_OP_ADAMW_STEP, false));
    ck_assert(pl_backend_supports(b, PL_OP_SGD_STEP, false));
    ck_assert(!pl_backend_supports(b, PL_OP_ADAMW_STEP, true)); /* in place, no autograd */
    ck_assert(!pl_backend_supports(b, PL_OP_SGD_STEP, true));
    ck_assert(pl_backend_supports(b, PL_OP_SWIGLU, false));
    ck_assert(pl_backend_supports(b, PL_OP_SWIGLU, true));
    /* ids it was not built with: NULL, no read past its table */
    ck_assert_ptr_null(b->kernel(PL_OP_COUNT, false));
    ck_assert_ptr_null(b->kernel((pl_op)(PL_OP_COUNT + 100), true));
    ck_assert_ptr_null(b->kernel((pl_op)-1, false));
    ck_assert_ptr_null(b->kernel(PL_OP_CUSTOM_BASE, false));
}
END_TEST

/* Without a device the loader refuses with PL_ERR_DEVICE and a reason. */
START_TEST(load_reports_reason) {
    load_once();
    if (g_have_gpu) return;
    ck_assert_msg(strstr(g_reason, "no cuda device is visible") != NULL, "reason: %s", g_reason);
}
END_TEST

START_TEST(memory_roundtrip) {
    NEED_GPU();
    const pl_backend *b = pl_backend_get(PL_DEVICE_CUDA);
    size_t fr = 0, tot = 0;
    PL_CK_OK(b->mem_info(0, &fr, &tot));
    ck_assert(tot > 0 && fr <= tot);
    float h[1000];
    for (int i = 0; i < 1000; i++) h[i] = (float)i * 0.5f - 7.0f;
    pl_tensor *c = pl_tensor_from_data(PL_F32, PL_SHAPE(10, 100), h, PL_CPU);
    pl_tensor *g = pl_tensor_to(c, PL_BF16, (pl_device){PL_DEVICE_CUDA, 0});
    ck_assert_ptr_nonnull(g);
    pl_tensor *back = pl_tensor_to(g, PL_F32, PL_CPU);
    for (int i = 0; i < 1000; i++)
        ck_assert_float_eq(pl_tensor_f32(back)[i], pl_bf16_to_f32(pl_f32_to_bf16(h[i])));
    void *p = b->host_alloc_pinned(4096);
    ck_assert_ptr_nonnull(p);
    b->host_free_pinned(p);
    pl_tensor_release(back);
    pl_tensor_release(g);
    pl_tensor_release(c);
}
END_TEST

/* loss = CE(x W^T + b, y): values and gradients match the CPU. */
START_TEST(small_graph_matches_cpu) {
    NEED_GPU();
    pl_device gd = {PL_DEVICE_CUDA, 0};
    double loss_v[2];
    pl_tensor *gw[2];
    for (int k = 0; k < 2; k++) {
        pl_device d = k ? gd : PL_CPU;
        pl_frame_begin();
        pl_tensor *x = pl_tensor_to(pl_test_randn(PL_SHAPE(16, 32), 1), PL_F32, d);
        pl_tensor *w = pl_tensor_to(pl_test_randn(PL_SHAPE(10, 32), 2), PL_F32, d);
        pl_tensor *bb = pl_tensor_to(pl_test_randn(PL_SHAPE(10), 3), PL_F32, d);
        int64_t yv[16];
        for (int i = 0; i < 16; i++) yv[i] = (i * 7) % 10;
        pl_tensor *y = pl_tensor_from_data(PL_I64, PL_SHAPE(16), yv, d);
        pl_tensor_set_requires_grad(w, true);
        pl_tensor *loss = pl_cross_entropy(pl_gelu(pl_linear(x, w, bb), false), y, -100, 0.0);
        ck_assert_ptr_nonnull(loss);
        loss_v[k] = pl_tensor_item(loss);
        PL_CK_OK(pl_backward(loss, 1.0));
        gw[k] = pl_tensor_retain(pl_tensor_to(w->grad, PL_F32, PL_CPU));
        pl_frame_end();
    }
    ck_assert_double_eq_tol(loss_v[0], loss_v[1], 1e-4);
    ck_assert_double_le(pl_test_max_abs_diff(gw[0], gw[1]), 1e-4);
    pl_tensor_release(gw[0]);
    pl_tensor_release(gw[1]);
}
END_TEST

/* A bad index or cross-entropy target does not make the op wait for the
 * device: the kernel records it and the next read of device memory (a copy
 * to the host, a synchronize) reports it, naming the op, the value and its
 * position, once; the kernels never read out of bounds meanwhile. */
START_TEST(bad_index_is_reported_at_the_next_read) {
    NEED_GPU();
    pl_device gd = {PL_DEVICE_CUDA, 0};
    const pl_backend *b = pl_backend_get(PL_DEVICE_CUDA);
    pl_frame_begin();
    pl_tensor *xc = pl_test_randn(PL_SHAPE(5, 3), 1);
    pl_tensor *x = pl_tensor_to(xc, PL_F32, gd);
    int64_t iv[4] = {0, 4, 7, 2};
    pl_tensor *ix = pl_tensor_from_data(PL_I64, PL_SHAPE(4), iv, gd);
    pl_tensor *y = pl_index_select(x, 0, ix);
    ck_assert_msg(y != NULL, "index_select waited for the device: %s", pl_error_message());
    ck_assert_ptr_null(pl_tensor_to(y, PL_F32, PL_CPU));
    ck_assert_int_eq(pl_error_status(), PL_ERR_INVALID);
    ck_assert_msg(strstr(pl_error_message(),
                         "index_select: index 7 at position 2 is out of range [0, 5)") != NULL,
                  "%s", pl_error_message());
    /* reported once; the rows of good indices are right, the bad one is 0 */
    pl_tensor *h = pl_tensor_to(y, PL_F32, PL_CPU);
    ck_assert_msg(h != NULL, "%s", pl_error_message());
    for (int j = 0; j < 3; j++) {
        ck_assert_float_eq(pl_tensor_f32(h)[0 * 3 + j], pl_tensor_f32(xc)[0 * 3 + j]);
        ck_assert_float_eq(pl_tensor_f32(h)[1 * 3 + j], pl_tensor_f32(xc)[4 * 3 + j]);
        ck_assert_float_eq(pl_tensor_f32(h)[2 * 3 + j], 0.0f);
    }
    /* a synchronize reports it too (gather, int32 indices) */
    int32_t gv[2] = {1, -1};
    pl_tensor *gi = pl_tensor_from_data(PL_I32, PL_SHAPE(2), gv, gd);
    ck_assert_ptr_nonnull(pl_index_select(x, 0, gi));
    ck_assert_int_eq(b->synchronize(0), PL_ERR_INVALID);
    ck_assert_msg(strstr(pl_error_message(), "index -1 at position 1") != NULL, "%s",
                  pl_error_message());
    PL_CK_OK(b->synchronize(0));
    /* a cross-entropy target outside [0, C) that is not ignore_index */
    pl_tensor *lg = pl_tensor_to(pl_test_randn(PL_SHAPE(3, 4), 2), PL_F32, gd);
    int64_t tv[3] = {1, 9, -100};
    pl_tensor *tg = pl_tensor_from_data(PL_I64, PL_SHAPE(3), tv, gd);
    pl_tensor *loss = pl_cross_entropy(lg, tg, -100, 0.0);
    ck_assert_msg(loss != NULL, "cross_entropy waited for the device: %s", pl_error_message());
    ck_assert(isnan(pl_tensor_item(loss)));
    ck_assert_msg(strstr(pl_error_message(), "cross_entropy: target[1] = 9 outside [0, 4) and "
                                             "!= ignore_index -100") != NULL,
                  "%s", pl_error_message());
    pl_frame_end(); /* owns every tensor above, h included */
}
END_TEST

/* fill_random: parameter init drawn on the GPU equals the host's draw up to
 * the device's double log / sin / cos: f32 values within 1 ulp, and such
 * values rare (kernel_math.h pl_init_draw). */
START_TEST(fill_random_matches_the_host_draw) {
    NEED_GPU();
    pl_device gd = {PL_DEVICE_CUDA, 0};
    pl_frame_begin();
    int64_t n = 1000003;
    pl_tensor *h = PL_CK_NOTNULL(pl_tensor_empty(PL_F32, 1, &n, PL_CPU));
    pl_tensor *d = PL_CK_NOTNULL(pl_tensor_empty(PL_F32, 1, &n, gd));
    for (int normal = 0; normal < 2; normal++) {
        PL_CK_OK(normal ? pl_tensor_normal_(d, 0.0, 0.02, 42, 99) : pl_tensor_uniform_(d, -0.1, 0.1, 42, 99));
        PL_CK_OK(normal ? pl_tensor_normal_(h, 0.0, 0.02, 42, 99) : pl_tensor_uniform_(h, -0.1, 0.1, 42, 99));
        pl_tensor *g = PL_CK_NOTNULL(pl_tensor_to(d, PL_F32, PL_CPU));
        const float *a = pl_tensor_f32(h), *b = pl_tensor_f32(g);
        int64_t differ = 0;
        for (int64_t i = 0; i < n; i++) {
            if (a[i] == b[i]) continue;
            differ++;
            ck_assert_msg(fabsf(a[i] - b[i]) <= 1.5f * fabsf(nextafterf(a[i], INFINITY) - a[i]),
                          "element %lld: host %a, device %a", (long long)i, a[i], b[i]);
        }
        ck_assert_msg(differ <= n / 10000, "%lld of %lld values differ", (long long)differ, (long long)n);
        printf("fill_random (%s): %lld of %lld values differ from the host's by 1 ulp\n",
               normal ? "normal" : "uniform", (long long)differ, (long long)n);
    }
    pl_frame_end();
}
END_TEST

/* NVML through the backend: utilization in [0, 1] and the device's memory,
 * or PL_ERR_UNSUPPORTED saying why (no libnvidia-ml.so.1); a second call
 * with the cursor averages the samples taken in between. */
START_TEST(device_stats_through_nvml) {
    NEED_GPU();
    pl_device gd = {PL_DEVICE_CUDA, 0};
    pl_device_stats ds;
    uint64_t cur = 0;
    pl_status st = pl_backend_device_stats(gd, &cur, &ds);
    if (st == PL_ERR_UNSUPPORTED) {
        printf("SKIP %s: %s\n", __func__, pl_error_message());
        return;
    }
    PL_CK_OK(st);
    ck_assert(ds.memory_total_bytes > 0 && ds.memory_used_bytes > 0);
    ck_assert(ds.memory_used_bytes <= ds.memory_total_bytes);
    ck_assert(ds.utilization >= 0 && ds.utilization <= 1);
    /* about a second of work, then the samples of that second */
    pl_frame_begin();
    pl_tensor *a = pl_tensor_to(pl_test_randn(PL_SHAPE(2048, 2048), 1), PL_F32, gd);
    for (int i = 0; i < 200; i++) {
        pl_frame_begin(); /* nested: each product is released at once */
        ck_assert_ptr_nonnull(pl_matmul(a, a, false, false));
        pl_frame_end();
    }
    pl_frame_end();
    PL_CK_OK(pl_backend_get(PL_DEVICE_CUDA)->synchronize(0));
    PL_CK_OK(pl_backend_device_stats(gd, &cur, &ds));
    printf("device stats: utilization %.2f over %d samples, %.0f of %.0f MiB in use\n",
           ds.utilization, ds.n_samples, ds.memory_used_bytes / 1048576.0,
           ds.memory_total_bytes / 1048576.0);
    ck_assert(ds.utilization >= 0 && ds.utilization <= 1);
}
END_TEST

/* Largest |v| of a CPU float tensor (the scale for relative tolerances). */
static double max_abs(const pl_tensor *t) {
    double m = 0;
    for (int64_t i = 0; i < pl_tensor_numel(t); i++) m = fmax(m, fabs(pl_tensor_get(t, i)));
    return m;
}

/* y = x @ dequant(W)^T and dx on the GPU match the CPU for f32 and bf16 x,
 * with plain and double-quantized absmax. W [300, 128] has 600 blocks of
 * 64, so the double quantization spans three groups of 256 (the last short). */
START_TEST(nf4_matmul_matches_cpu) {
    NEED_GPU();
    pl_device gd = {PL_DEVICE_CUDA, 0};
    for (int variant = 0; variant < 4; variant++) {
        pl_dtype xdt = variant & 1 ? PL_BF16 : PL_F32;
        bool dq = variant & 2;
        pl_tensor *y[2], *gx[2];
        for (int k = 0; k < 2; k++) {
            pl_device d = k ? gd : PL_CPU;
            pl_frame_begin();
            pl_tensor *x = pl_tensor_to(pl_test_randn(PL_SHAPE(2, 5, 128), 11), PL_F32, d);
            pl_tensor *wf = pl_tensor_to(pl_test_randn(PL_SHAPE(300, 128), 12), PL_F32, d);
            pl_tensor *r = pl_tensor_to(pl_test_rand(PL_SHAPE(2, 5, 300), -1, 1, 13), PL_F32, d);
            pl_tensor *q = PL_CK_NOTNULL(pl_nf4_quantize(wf, 64, dq));
            pl_tensor_set_requires_grad(x, true);
            pl_tensor *out = PL_CK_NOTNULL(pl_nf4_matmul(pl_cast(x, xdt), q));
            ck_assert_int_eq(out->dtype, xdt);
            pl_tensor *loss = pl_sum(pl_mul(pl_cast(out, PL_F32), r), PL_ALL_DIMS, false);
            PL_CK_OK(pl_backward(loss, 1.0));
            y[k] = pl_tensor_retain(pl_tensor_to(out, PL_F32, PL_CPU));
            gx[k] = pl_tensor_retain(pl_tensor_to(x->grad, PL_F32, PL_CPU));
            pl_tensor_release(q);
            pl_frame_end();
        }
        /* same dequantized weights; only the GEMMs' summation order differs
         * (and, for bf16, the final rounding of y to bf16) */
        double ty = (xdt == PL_BF16 ? 1e-2 : 1e-5) * max_abs(y[0]);
        ck_assert_msg(pl_test_max_abs_diff(y[0], y[1]) <= ty, "%s%s: y differs by %g",
                      pl_dtype_name(xdt), dq ? " double-quant" : "",
                      pl_test_max_abs_diff(y[0], y[1]));
        /* dx: for bf16 x the GPU rounds dy to bf16 and runs a bf16 GEMM (tensor
         * cores, as PyTorch's bf16 backward); the CPU keeps dy f32: bf16's
         * relative precision (2^-8) bounds it (the H200 showed a max difference
         * of 0.057 on 2026-11-27, over the f32 bound of 1e-5 max|dx|) */
        double tg = (xdt == PL_BF16 ? 1e-2 : 1e-5) * max_abs(gx[0]);
        ck_assert_msg(pl_test_max_abs_diff(gx[0], gx[1]) <= tg,
                      "%s%s: dx differs by %g", pl_dtype_name(xdt), dq ? " double-quant" : "",
                      pl_test_max_abs_diff(gx[0], gx[1]));
        for (int k = 0; k < 2; k++) {
            pl_tensor_release(y[k]);
            pl_tensor_release(gx[k]);
        }
    }
}
END_TEST

/* ---- lstm: cuDNN's and the native implementation (cuda_lstm_native.cu) ---- */

/* set_option("lstm", mode) with PL_CUDA_LSTM unset (it would win); NULL:
 * leave the option. */
static void lstm_mode(const char *mode) {
    unsetenv("PL_CUDA_LSTM");
    if (mode) PL_CK_OK(pl_backend_get(PL_DEVICE_CUDA)->set_option("lstm", mode));
}

enum { LSTM_NI = 7, LSTM_NR = 3 + LSTM_NI };
static const char *const g_lstm_names[LSTM_NR] = {"y",     "h_n",   "c_n",   "dx",  "dw_ih",
                                                   "dw_hh", "db_ih", "db_hh", "dh0", "dc0"};

/* The lstm op's inputs x [B, T, In], W_ih [4H, In], W_hh [4H, H], b_ih, b_hh
 * [4H], h0, c0 [B, H]: fixed random draws on the host (tensors of the frame) */
static void lstm_inputs(int64_t B, int64_t T, int64_t In, int64_t H, pl_tensor *in[LSTM_NI]) {
    in[0] = pl_test_randn(PL_SHAPE(B, T, In), 21);
    in[1] = pl_test_randn(PL_SHAPE(4 * H, In), 22);
    in[2] = pl_test_randn(PL_SHAPE(4 * H, H), 23);
    in[3] = pl_test_randn(PL_SHAPE(4 * H), 24);
    in[4] = pl_test_randn(PL_SHAPE(4 * H), 25);
    in[5] = pl_test_randn(PL_SHAPE(B, H), 26);
    in[6] = pl_test_randn(PL_SHAPE(B, H), 27);
}

/* pl_lstm with both biases and initial states on device d, then the
 * backward of sum(y * r): res = {y, h_n, c_n, every input gradient} on the
 * CPU (dx NULL when !xgrad: x is then not a leaf with a gradient). The
 * forward runs under lstm mode fwd_mode, the backward under bwd_mode (NULL:
 * unchanged). */
static void lstm_run(pl_device d, int64_t B, int64_t T, int64_t In, int64_t H, int rev,
                     bool xgrad, const char *fwd_mode, const char *bwd_mode,
                     pl_tensor *res[LSTM_NR]) {
    pl_frame_begin();
    pl_tensor *in[LSTM_NI];
    lstm_inputs(B, T, In, H, in);
    for (int i = 0; i < LSTM_NI; i++) {
        in[i] = pl_tensor_to(in[i], PL_F32, d);
        if (i > 0 || xgrad) pl_tensor_set_requires_grad(in[i], true);
    }
    if (d.type == PL_DEVICE_CUDA) lstm_mode(fwd_mode);
    pl_tensor *hn = NULL, *cn = NULL;
    pl_tensor *y = PL_CK_NOTNULL(pl_lstm(in[0], in[1], in[2], in[3], in[4], in[5], in[6], rev,
                                         &hn, &cn));
    pl_tensor *r = pl_tensor_to(pl_test_rand(PL_SHAPE(B, T, H), -1, 1, 28), PL_F32, d);
    if (d.type == PL_DEVICE_CUDA && bwd_mode) lstm_mode(bwd_mode);
    PL_CK_OK(pl_backward(pl_sum(pl_mul(y, r), PL_ALL_DIMS, false), 1.0));
    res[0] = pl_tensor_retain(pl_tensor_to(y, PL_F32, PL_CPU));
    res[1] = pl_tensor_retain(pl_tensor_to(hn, PL_F32, PL_CPU));
    res[2] = pl_tensor_retain(pl_tensor_to(cn, PL_F32, PL_CPU));
    for (int i = 0; i < LSTM_NI; i++) {
        ck_assert_msg((in[i]->grad != NULL) == (i > 0 || xgrad), "input %d: gradient %s", i,
                      in[i]->grad ? "unexpected" : "missing");
        res[3 + i] = in[i]->grad ? pl_tensor_retain(pl_tensor_to(in[i]->grad, PL_F32, PL_CPU)) : NULL;
    }
    pl_frame_end();
}

static void lstm_release(pl_tensor *res[LSTM_NR]) {
    for (int j = 0; j < LSTM_NR; j++) pl_tensor_release(res[j]);
}

/* every result within 1e-4 (1 + max |want|) */
static void lstm_compare(pl_tensor *got[LSTM_NR], pl_tensor *want[LSTM_NR], double tol,
                         const char *what) {
    for (int j = 0; j < LSTM_NR; j++) {
        ck_assert_msg((got[j] == NULL) == (want[j] == NULL), "%s: %s present on one side only",
                      what, g_lstm_names[j]);
        if (!got[j]) continue;
        double diff = pl_test_max_abs_diff(got[j], want[j]);
        ck_assert_msg(diff <= tol * (1.0 + max_abs(want[j])), "%s: %s differs by %g", what,
                      g_lstm_names[j], diff);
    }
}

/* Both implementations (cuDNN's when built, and the native one) against the
 * CPU: y, h_n, c_n and every gradient (x, w_ih, w_hh, b_ih, b_hh, h0, c0),
 * forward and reverse, a small case and one with several blocks per pass
 * (B*H = 320, B*T*4H = 15360), x with and without a gradient (dx NULL). */
START_TEST(lstm_matches_cpu) {
    NEED_GPU();
    pl_device gd = {PL_DEVICE_CUDA, 0};
    static const int64_t sz[2][4] = {{3, 5, 7, 6}, {8, 12, 10, 40}};
#ifdef PL_CUDA_HAVE_CUDNN
    static const char *const modes[2] = {"cudnn", "native"};
#else
    static const char *const modes[1] = {"native"};
#endif
    for (int k = 0; k < 2; k++)
        for (int rev = 0; rev < 2; rev++)
            for (int xg = 1; xg >= 0; xg--) {
                const int64_t *z = sz[k];
                pl_tensor *want[LSTM_NR], *got[LSTM_NR];
                lstm_run(PL_CPU, z[0], z[1], z[2], z[3], rev, xg, NULL, NULL, want);
                for (size_t m = 0; m < sizeof modes / sizeof *modes; m++) {
                    char what[128];
                    snprintf(what, sizeof what, "%s B%lld T%lld In%lld H%lld%s%s", modes[m],
                             (long long)z[0], (long long)z[1], (long long)z[2], (long long)z[3],
                             rev ? " reverse" : "", xg ? "" : " (no dx)");
                    lstm_run(gd, z[0], z[1], z[2], z[3], rev, xg, modes[m], NULL, got);
                    lstm_compare(got, want, 1e-4, what);
                    lstm_release(got);
                }
                lstm_release(want);
            }
    lstm_mode("auto");
}
END_TEST

/* The rule that pairs a backward with its forward (cuda_lstm_native.cu):
 * under auto the backward is native only for a ws a native forward wrote.
 * A cuDNN forward (ws not written) followed by an auto backward must run
 * cuDNN's backward (a native one would read an unwritten ws); a native
 * forward followed by an auto backward the native one. Both match the CPU.
 * PL_CUDA_LSTM wins over the option; a bad value names itself. */
START_TEST(lstm_backward_follows_its_forward) {
    NEED_GPU();
    pl_device gd = {PL_DEVICE_CUDA, 0};
    pl_tensor *want[LSTM_NR], *got[LSTM_NR];
    lstm_run(PL_CPU, 4, 6, 5, 9, 0, true, NULL, NULL, want);
#ifdef PL_CUDA_HAVE_CUDNN
    lstm_run(gd, 4, 6, 5, 9, 0, true, "cudnn", "auto", got);
    lstm_compare(got, want, 1e-4, "cudnn forward, auto backward");
    lstm_release(got);
#endif
    lstm_run(gd, 4, 6, 5, 9, 0, true, "native", "auto", got);
    lstm_compare(got, want, 1e-4, "native forward, auto backward");
    lstm_release(got);
    lstm_release(want);
    /* the environment wins; a value it does not know fails the op naming it */
    lstm_mode("auto");
    setenv("PL_CUDA_LSTM", "fastest", 1);
    pl_frame_begin();
    pl_tensor *x = pl_tensor_to(pl_test_randn(PL_SHAPE(2, 3, 4), 1), PL_F32, gd);
    pl_tensor *wih = pl_tensor_to(pl_test_randn(PL_SHAPE(8, 4), 2), PL_F32, gd);
    pl_tensor *whh = pl_tensor_to(pl_test_randn(PL_SHAPE(8, 2), 3), PL_F32, gd);
    ck_assert_ptr_null(pl_lstm(x, wih, whh, NULL, NULL, NULL, NULL, false, NULL, NULL));
    ck_assert_msg(strstr(pl_error_message(), "PL_CUDA_LSTM") &&
                      strstr(pl_error_message(), "'fastest'"),
                  "%s", pl_error_message());
    pl_error_clear();
    pl_frame_end();
    unsetenv("PL_CUDA_LSTM");
}
END_TEST

/* One lstm forward + backward on the persistent inputs in[] (their
 * gradients zeroed first), y and the gradients copied into dst[]. */
static pl_status lstm_graph_step(pl_tensor **in, pl_tensor *r, pl_tensor **dst) {
    for (int i = 0; i < LSTM_NI; i++) pl_tensor_zero_grad(in[i]);
    pl_frame_begin();
    pl_status st = PL_OK;
    pl_tensor *y = pl_lstm(in[0], in[1], in[2], in[3], in[4], in[5], in[6], true, NULL, NULL);
    if (!y) st = pl_error_status();
    if (!st) st = pl_backward(pl_sum(pl_mul(y, r), PL_ALL_DIMS, false), 1.0);
    if (!st) st = pl_tensor_copy_(dst[0], y);
    for (int i = 0; i < LSTM_NI && !st; i++) st = pl_tensor_copy_(dst[1 + i], in[i]->grad);
    pl_frame_end();
    return st;
}

/* Capture of an lstm forward + backward (reverse, B*H = 320): under auto
 * (native inside the capture) and under PL_CUDA_LSTM=native the capture
 * succeeds and the replay gives the eager native results (1e-6) and the
 * CPU's (1e-4); under cudnn the capture is refused with lstm's reason. */
START_TEST(lstm_native_captures) {
    NEED_GPU();
    pl_device gd = {PL_DEVICE_CUDA, 0};
    int64_t B = 8, T = 7, In = 5, H = 40;
    pl_tensor *want[LSTM_NR];
    lstm_run(PL_CPU, B, T, In, H, 1, true, NULL, NULL, want);
    pl_frame_begin();
    pl_tensor *in[LSTM_NI];
    lstm_inputs(B, T, In, H, in);
    pl_tensor *dst[1 + LSTM_NI];
    for (int i = 0; i < LSTM_NI; i++) {
        in[i] = PL_CK_NOTNULL(pl_tensor_to(in[i], PL_F32, gd));
        pl_tensor_set_requires_grad(in[i], true);
        dst[1 + i] = PL_CK_NOTNULL(pl_tensor_zeros_like(in[i]));
    }
    dst[0] = PL_CK_NOTNULL(pl_tensor_zeros(PL_F32, PL_SHAPE(B, T, H), gd));
    pl_tensor *r = pl_tensor_to(pl_test_rand(PL_SHAPE(B, T, H), -1, 1, 28), PL_F32, gd);
    /* eager, native (also creates the gradients outside the capture) */
    lstm_mode("native");
    PL_CK_OK(lstm_graph_step(in, r, dst));
    pl_tensor *eager[1 + LSTM_NI];
    for (int i = 0; i < 1 + LSTM_NI; i++) eager[i] = PL_CK_NOTNULL(pl_tensor_to(dst[i], PL_F32, PL_CPU));
    for (int v = 0; v < 3; v++) {
        /* 0: option auto; 1: option cudnn (built without cuDNN: auto) and
         * PL_CUDA_LSTM=native; 2: option cudnn */
#ifdef PL_CUDA_HAVE_CUDNN
        lstm_mode(v == 0 ? "auto" : "cudnn");
#else
        if (v == 2) break;
        lstm_mode("auto");
#endif
        if (v == 1) setenv("PL_CUDA_LSTM", "native", 1);
        pl_graph *g = NULL;
        PL_CK_OK(pl_graph_capture_begin(gd));
        pl_status st = lstm_graph_step(in, r, dst);
        pl_status e = pl_graph_capture_end(&g);
        unsetenv("PL_CUDA_LSTM");
        if (v == 2) {
            ck_assert_int_ne(st ? st : e, PL_OK);
            ck_assert_msg(strstr(pl_error_message(), "lstm") &&
                              strstr(pl_error_message(), "cannot be captured"),
                          "cudnn under capture: %s", pl_error_message());
            ck_assert_ptr_null(g);
            pl_error_clear();
            break;
        }
        ck_assert_msg(!st && !e, "variant %d: capture failed: %s", v, pl_error_message());
        for (int i = 0; i < 1 + LSTM_NI; i++) PL_CK_OK(pl_tensor_fill_(dst[i], NAN));
        PL_CK_OK(pl_graph_replay(g));
        for (int i = 0; i < 1 + LSTM_NI; i++) {
            const char *name = g_lstm_names[i == 0 ? 0 : 2 + i];
            pl_tensor *got = PL_CK_NOTNULL(pl_tensor_to(dst[i], PL_F32, PL_CPU));
            pl_tensor *cpu = want[i == 0 ? 0 : 2 + i];
            double de = pl_test_max_abs_diff(got, eager[i]), dc = pl_test_max_abs_diff(got, cpu);
            ck_assert_msg(de <= 1e-6 * (1.0 + max_abs(eager[i])),
                          "variant %d: replayed %s differs from the eager native one by %g", v,
                          name, de);
            ck_assert_msg(dc <= 1e-4 * (1.0 + max_abs(cpu)),
                          "variant %d: replayed %s differs from the CPU by %g", v, name, dc);
        }
        pl_graph_release(g);
    }
    lstm_mode("auto");
    pl_frame_end();
    lstm_release(want);
}
END_TEST

/* clamp to [-1, 1] forward and backward are bit-identical to the CPU,
 * including the bounds themselves, +-inf and NaN (stays NaN; gradient 0). */
START_TEST(clamp_matches_cpu) {
    NEED_GPU();
    pl_device gd = {PL_DEVICE_CUDA, 0};
    enum { N = 1000 };
    float xv[N];
    for (int i = 0; i < N; i++) xv[i] = (float)(i - N / 2) * 0.005f;
    xv[0] = -1.0f, xv[1] = 1.0f, xv[2] = INFINITY, xv[3] = -INFINITY, xv[4] = NAN;
    pl_tensor *y[2], *gx[2];
    for (int k = 0; k < 2; k++) {
        pl_device d = k ? gd : PL_CPU;
        pl_frame_begin();
        pl_tensor *x = pl_tensor_from_data(PL_F32, PL_SHAPE(N), xv, d);
        pl_tensor *r = pl_tensor_to(pl_test_rand(PL_SHAPE(N), -1, 1, 41), PL_F32, d);
        pl_tensor_set_requires_grad(x, true);
        pl_tensor *out = PL_CK_NOTNULL(pl_clamp(x, -1.0, 1.0));
        PL_CK_OK(pl_backward(pl_sum(pl_mul(out, r), PL_ALL_DIMS, false), 1.0));
        y[k] = pl_tensor_retain(pl_tensor_to(out, PL_F32, PL_CPU));
        gx[k] = pl_tensor_retain(pl_tensor_to(x->grad, PL_F32, PL_CPU));
        pl_frame_end();
    }
    ck_assert(memcmp(pl_tensor_f32(y[0]), pl_tensor_f32(y[1]), N * sizeof(float)) == 0);
    ck_assert(memcmp(pl_tensor_f32(gx[0]), pl_tensor_f32(gx[1]), N * sizeof(float)) == 0);
    for (int k = 0; k < 2; k++) {
        pl_tensor_release(y[k]);
        pl_tensor_release(gx[k]);
    }
}
END_TEST

/* Ten in-place updates of a 70001-element parameter (many blocks, a partial
 * last one): AdamW, Adam (l2), each with and without amsgrad, and SGD with
 * dampened momentum, plain and nesterov. The parameter and every state tensor
 * match the CPU. Both run optim_math.h's element functions; only the two
 * compilers' FMA contractions may differ, hence a tolerance of a few ulps. */
START_TEST(optimizer_steps_match_cpu) {
    NEED_GPU();
    pl_device gd = {PL_DEVICE_CUDA, 0};
    const int64_t n = 70001;
    static const char *names[6] = {"adamw", "adam l2", "adamw amsgrad", "adam l2 amsgrad",
                                   "sgd momentum", "sgd nesterov"};
    static const char *states[4] = {"param", "exp_avg / momentum", "exp_avg_sq",
                                    "max_exp_avg_sq"};
    for (int variant = 0; variant < 6; variant++) {
        bool sgd = variant >= 4;
        int nst = sgd ? 2 : 4;
        pl_tensor *res[2][4];
        for (int k = 0; k < 2; k++) {
            pl_device d = k ? gd : PL_CPU;
            pl_frame_begin();
            pl_tensor *st[4]; /* param, exp_avg (sgd: momentum buffer), exp_avg_sq, max */
            st[0] = pl_tensor_to(pl_test_randn(PL_SHAPE(n), 31), PL_F32, d);
            for (int j = 1; j < 4; j++) st[j] = PL_CK_NOTNULL(pl_tensor_zeros(PL_F32, 1, &n, d));
            for (int step = 1; step <= 10; step++) {
                pl_tensor *g = pl_tensor_to(pl_test_randn(PL_SHAPE(n), 100 + step), PL_F32, d);
                if (sgd) {
                    pl_sgd_hyper h = {.lr = 0.05, .momentum = 0.9, .dampening = 0.1,
                                      .weight_decay = 0.01, .nesterov = variant & 1,
                                      .first = step == 1};
                    PL_CK_OK(pl_sgd_step_(st[0], g, st[1], &h));
                } else {
                    pl_adamw_hyper h = {.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8,
                                        .weight_decay = 0.1, .l2 = variant & 1,
                                        .amsgrad = variant & 2, .step = step};
                    PL_CK_OK(pl_adamw_step_(st[0], g, st[1], st[2], h.amsgrad ? st[3] : NULL, &h));
                }
            }
            for (int j = 0; j < nst; j++)
                res[k][j] = pl_tensor_retain(pl_tensor_to(st[j], PL_F32, PL_CPU));
            pl_frame_end();
        }
        for (int j = 0; j < nst; j++) {
            double diff = pl_test_max_abs_diff(res[0][j], res[1][j]);
            ck_assert_msg(diff <= 1e-6 * (1.0 + max_abs(res[0][j])), "%s: %s differs by %g",
                          names[variant], states[j], diff);
            pl_tensor_release(res[0][j]);
            pl_tensor_release(res[1][j]);
        }
    }
}
END_TEST

/* Whole-step graphs (graph.h, [trainer] cuda_graphs): a small training step
 * (linear, gelu, dropout, cross-entropy, backward, AdamW with a changing lr
 * and bias correction) captured with cudaStreamBeginCapture on the plugin's
 * per-thread stream and replayed with cudaGraphLaunch gives the eager run's
 * losses and weights (the same kernels: 1e-6); a host read while capturing
 * fails naming it and poisons the capture. */
START_TEST(graph_capture_replays_a_step) {
    NEED_GPU();
    pl_device gd = {PL_DEVICE_CUDA, 0};
    pl_test_graph_step(gd, 7, 1e-6);
    pl_test_graph_violation(gd);
}
END_TEST

/* Seeing the step (backend.h, capture_end_step; cuda_fuse.cu): in a captured
 * step a square followed by the sum of all of its squares is one launch
 * (k_sum_squares) whatever the liveness, its bits the two kernels'; the
 * squares' store is dropped only when they are dead (mode 0), kept when a
 * later call reads them (1) or they are still held when the capture ends
 * (2); with the add of a running total after it (3), one launch for the
 * three, the squares' and the sum's stores dropped; fuse = false launches
 * the kernels one by one. 100003 and 777 elements. */
static int cu_fuse_case(int mode, pl_tensor *x, pl_tensor *o, pl_tensor *acc, const char **pat) {
    pl_graph *g = NULL;
    pl_tensor *kept = NULL;
    PL_CK_OK(pl_graph_capture_begin(x->device));
    pl_frame_begin();
    pl_tensor *sq = PL_CK_NOTNULL(pl_square(x));
    pl_tensor *ssq = PL_CK_NOTNULL(pl_sum(sq, PL_ALL_DIMS, false));
    if (mode == 1) ssq = PL_CK_NOTNULL(pl_add(ssq, pl_sum(pl_scale(sq, 0.0), PL_ALL_DIMS, false)));
    if (mode == 2) kept = pl_tensor_retain(sq);
    if (mode == 3) ssq = PL_CK_NOTNULL(pl_add(acc, ssq)); /* the norm's running total */
    PL_CK_OK(pl_tensor_copy_(o, ssq));
    pl_frame_end();
    PL_CK_OK(pl_graph_capture_end(&g));
    static char buf[256];
    const char *p = "";
    int nf = pl_graph_fused(g, &p);
    snprintf(buf, sizeof buf, "%s", p);
    *pat = buf;
    PL_CK_OK(pl_tensor_fill_(o, -1.0));
    PL_CK_OK(pl_graph_replay(g));
    pl_graph_release(g);
    pl_tensor_release(kept);
    return nf;
}

START_TEST(step_fusion_square_sum) {
    NEED_GPU();
    pl_device gd = {PL_DEVICE_CUDA, 0};
    const pl_backend *b = pl_backend_get(PL_DEVICE_CUDA);
    ck_assert(PL_BACKEND_HAS(b, capture_end_step) && b->capture_end_step);
    int64_t sizes[2] = {100003, 777};
    for (int k = 0; k < 2; k++) {
        pl_frame_begin();
        pl_tensor *x = PL_CK_NOTNULL(pl_tensor_to(pl_test_randn(PL_SHAPE(sizes[k]), 21 + k), PL_F32, gd));
        pl_tensor *o = PL_CK_NOTNULL(pl_tensor_zeros(PL_F32, 0, NULL, gd));
        pl_tensor *acc = PL_CK_NOTNULL(pl_tensor_zeros(PL_F32, 0, NULL, gd));
        PL_CK_OK(pl_tensor_fill_(acc, 0.3));
        pl_tensor *ssq = PL_CK_NOTNULL(pl_sum(pl_square(x), PL_ALL_DIMS, false));
        pl_tensor *w1 = PL_CK_NOTNULL(pl_tensor_to(ssq, PL_F32, PL_CPU));
        pl_tensor *w3 = PL_CK_NOTNULL(pl_tensor_to(pl_add(acc, ssq), PL_F32, PL_CPU));
        const char *drop[4] = {"square+sum x1; dead stores dropped: 1", "square+sum x1; dead stores dropped: 0",
                               "square+sum x1; dead stores dropped: 0",
                               "square+sum+add x1; dead stores dropped: 2"};
        for (int mode = 0; mode < 4; mode++)
            for (int fuse = 1; fuse >= 0; fuse--) {
                pl_tensor *want = mode == 3 ? w3 : w1;
                PL_CK_OK(b->set_option("fuse", fuse ? "true" : "false"));
                const char *pat = NULL;
                int nf = cu_fuse_case(mode, x, o, acc, &pat);
                ck_assert_msg(nf == fuse, "mode %d fuse %d: %d fused (%s)", mode, fuse, nf, pat);
                if (fuse) ck_assert_msg(!strcmp(pat, drop[mode]), "mode %d: %s", mode, pat);
                pl_tensor *got = PL_CK_NOTNULL(pl_tensor_to(o, PL_F32, PL_CPU));
                ck_assert_msg(memcmp(pl_tensor_data(got), pl_tensor_data(want), 4) == 0,
                              "n %lld mode %d fuse %d: %.9g, eager %.9g", (long long)sizes[k], mode,
                              fuse, pl_tensor_item(got), pl_tensor_item(want));
            }
        pl_frame_end();
    }
    PL_CK_OK(b->set_option("fuse", "true"));
}
END_TEST

int main(void) {
    Suite *s = suite_create("cuda_backend");
    TCase *tc = tcase_create("cuda");
    tcase_add_test(tc, plugin_descriptor);
    tcase_add_test(tc, load_reports_reason);
    tcase_add_test(tc, memory_roundtrip);
    tcase_add_test(tc, small_graph_matches_cpu);
    tcase_add_test(tc, bad_index_is_reported_at_the_next_read);
    tcase_add_test(tc, device_stats_through_nvml);
    tcase_add_test(tc, fill_random_matches_the_host_draw);
    tcase_add_test(tc, nf4_matmul_matches_cpu);
    tcase_add_test(tc, lstm_matches_cpu);
    tcase_add_test(tc, lstm_backward_follows_its_forward);
    tcase_add_test(tc, lstm_native_captures);
    tcase_add_test(tc, clamp_matches_cpu);
    tcase_add_test(tc, optimizer_steps_match_cpu);
    tcase_add_test(tc, graph_capture_replays_a_step);
    tcase_add_test(tc, step_fusion_square_sum);
    suite_add_tcase(s, tc);
    return pl_test_run(s);
}
