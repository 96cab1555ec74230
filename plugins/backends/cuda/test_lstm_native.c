/* test_lstm_native.c - the native CUDA LSTM's driver and element passes
 * (cuda_lstm_native.h), run on the HOST against the CPU backend's lstm kernel
 * (kernels_lstm.c), on any machine (no GPU, no CUDA needed).
 *
 * The driver runs as the GPU runs it, with the device replaced: `gemm` is a
 * host column-major sgemm with cublasSgemm's argument convention and its
 * argument checks (leading dimensions, CUBLAS_STATUS_INVALID_VALUE), each
 * element pass is a loop over the same PL_HD function the kernel calls (in
 * descending order, so a pass whose elements depended on each other would
 * show it), scratch is malloc'd. Checked against the CPU kernel called
 * directly (so the saved ws is compared too): y, ws (filled with NaN first:
 * every element must be written), h_n, c_n, and the backward's six
 * gradients (also NaN first: overwritten, not accumulated), forward and
 * reverse, sizes with several rows per step and odd H, In = 0, T = 1, the
 * empty cases (B, T or H = 0) and gradients left out (NULL). Under ASan
 * (CI's second pass) an index past a buffer fails here too.
 *
 * Not checked here: the launch geometry of the kernels and cuBLAS itself;
 * test_cuda.c (lstm_native_matches_cpu, lstm_native_captures) and the
 * conformance rows with PL_CUDA_LSTM=native do that on a GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_lstm_native.h"
#include "pl_test.h"

/* ---- the host stand-in for the device ---------------------------------------------- */

typedef struct host_ctx {
    float *sc[5];
    int gemms, passes;
} host_ctx;

static int imax1(int a) { return a > 1 ? a : 1; }

/* cublasSgemm's semantics and argument checks, column-major */
static pl_status h_gemm(void *ctx, bool ta, bool tb, int m, int n, int k, float alpha,
                        const float *A, int lda, const float *B, int ldb, float beta, float *C,
                        int ldc) {
    ((host_ctx *)ctx)->gemms++;
    if (m < 0 || n < 0 || k < 0 || lda < imax1(ta ? k : m) || ldb < imax1(tb ? n : k) ||
        ldc < imax1(m))
        return pl_error_set(PL_ERR_DEVICE, "host sgemm: CUBLAS_STATUS_INVALID_VALUE (%c %c m %d "
                            "n %d k %d lda %d ldb %d ldc %d)", ta ? 'T' : 'N', tb ? 'T' : 'N', m,
                            n, k, lda, ldb, ldc);
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            double acc = 0.0;
            for (int l = 0; l < k; l++) {
                double av = ta ? A[(int64_t)i * lda + l] : A[(int64_t)l * lda + i];
                double bv = tb ? B[(int64_t)l * ldb + j] : B[(int64_t)j * ldb + l];
                acc += av * bv;
            }
            float *c = &C[(int64_t)j * ldc + i];
            *c = (float)(alpha * acc + (beta == 0.0f ? 0.0 : (double)beta * *c));
        }
    return PL_OK;
}

static pl_status h_elem(void *ctx, int kind, const pl_lstm_nat *a, int64_t s, int64_t n) {
    ((host_ctx *)ctx)->passes++;
    for (int64_t e = n - 1; e >= 0; e--) pl_lstm_nat_elem(kind, a, s, e);
    return PL_OK;
}

static pl_status h_zero(void *ctx, float *p, int64_t n) {
    (void)ctx;
    memset(p, 0, (size_t)n * sizeof(float));
    return PL_OK;
}

static pl_status h_copy(void *ctx, float *dst, const float *src, int64_t n) {
    (void)ctx;
    memcpy(dst, src, (size_t)n * sizeof(float));
    return PL_OK;
}

static float *h_scratch(void *ctx, int slot, int64_t n) {
    host_ctx *c = ctx;
    ck_assert(slot >= 0 && slot < 5 && !c->sc[slot]);
    c->sc[slot] = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    for (int64_t i = 0; i < n; i++) c->sc[slot][i] = NAN; /* scratch is not zeroed on a GPU */
    return c->sc[slot];
}

static pl_lstm_nat_ops host_ops(host_ctx *c) {
    memset(c, 0, sizeof *c);
    pl_lstm_nat_ops o = {c, h_gemm, h_elem, h_zero, h_copy, h_scratch};
    return o;
}

static void host_free(host_ctx *c) {
    for (int i = 0; i < 5; i++) free(c->sc[i]);
}

/* ---- one case --------------------------------------------------------------------- */

static float *F(pl_tensor *t) { return t ? (float *)pl_tensor_data(t) : NULL; }

static pl_tensor *nan_like(pl_tensor *t) {
    pl_tensor *r = pl_tensor_empty_like(t);
    ck_assert_ptr_nonnull(r);
    PL_CK_OK(pl_tensor_fill_(r, NAN));
    return r;
}

/* max |got - want| <= tol (1 + max |want|), NaN fails */
static void near(const char *what, const char *cs, pl_tensor *got, pl_tensor *want, double tol) {
    int64_t n = pl_tensor_numel(want);
    ck_assert_int_eq(pl_tensor_numel(got), n);
    const float *g = F(got), *w = F(want);
    double mx = 0.0;
    for (int64_t i = 0; i < n; i++) mx = fmax(mx, fabs(w[i]));
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)g[i] - w[i]);
        ck_assert_msg(d <= tol * (1.0 + mx), "%s: %s[%lld] = %.9g, CPU %.9g (|diff| %g, bound %g)",
                      cs, what, (long long)i, g[i], w[i], d, tol * (1.0 + mx));
    }
}

enum { WANT_ALL = 63 }; /* bit i: backward output i wanted */

/* Forward and backward of (B, T, In, H, rev) by the CPU kernel and the
 * native driver on the host; `want` selects the gradients. */
static void run_case(int64_t B, int64_t T, int64_t In, int64_t H, int rev, int want) {
    char cs[96];
    snprintf(cs, sizeof cs, "B%lld T%lld In%lld H%lld%s want %d", (long long)B, (long long)T,
             (long long)In, (long long)H, rev ? " reverse" : "", want);
    const pl_backend *cpu = pl_backend_get(PL_DEVICE_CPU);
    ck_assert_ptr_nonnull(cpu);
    pl_kernel_fn cfwd = cpu->kernel(PL_OP_LSTM, false), cbwd = cpu->kernel(PL_OP_LSTM, true);
    ck_assert(cfwd && cbwd);
    pl_frame_begin();
    int64_t G = 4 * H;
    uint64_t sd = (uint64_t)(B * 1000 + T * 100 + In * 10 + H + rev);
    pl_tensor *x = pl_test_randn(PL_SHAPE(B, T, In), sd + 1);
    pl_tensor *wih = pl_test_rand(PL_SHAPE(G, In), -0.6, 0.6, sd + 2);
    pl_tensor *whh = pl_test_rand(PL_SHAPE(G, H), -0.6, 0.6, sd + 3);
    pl_tensor *bias = pl_test_rand(PL_SHAPE(G), -0.5, 0.5, sd + 4);
    pl_tensor *h0 = pl_test_rand(PL_SHAPE(B, H), -1, 1, sd + 5);
    pl_tensor *c0 = pl_test_rand(PL_SHAPE(B, H), -1, 1, sd + 6);
    pl_tensor *dy = pl_test_rand(PL_SHAPE(B, T, H), -1, 1, sd + 7);
    ck_assert(x && wih && whh && bias && h0 && c0 && dy);

    /* the CPU kernel: forward, then backward with every gradient */
    pl_tensor *fo[2][4], *go[2][6];
    int64_t osh[4][3] = {{B, T, H}, {B, T, 6 * H}, {B, H, 0}, {B, H, 0}};
    int ond[4] = {3, 3, 2, 2};
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < 4; i++)
            fo[k][i] = nan_like(pl_tensor_zeros(PL_F32, ond[i], osh[i], PL_CPU));
    pl_kernel_args fa = {0};
    fa.op = PL_OP_LSTM, fa.n_in = 6, fa.n_out = 4, fa.p.flags = rev;
    pl_tensor *fin[6] = {x, wih, whh, bias, h0, c0};
    for (int i = 0; i < 6; i++) fa.in[i] = fin[i];
    for (int i = 0; i < 4; i++) fa.out[i] = fo[0][i];
    if (B * H > 0) /* what the CPU writes when nothing is computed is the NaN fill */
        PL_CK_OK(cfwd(&fa));
    pl_tensor *gin[6] = {x, wih, whh, bias, h0, c0};
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < 6; i++) go[k][i] = nan_like(pl_tensor_zeros_like(gin[i]));
    pl_kernel_args ba = {0};
    ba.op = PL_OP_LSTM, ba.n_in = 8, ba.n_out = 6, ba.p.flags = rev;
    pl_tensor *bin[8] = {dy, x, wih, whh, bias, h0, c0, fo[0][1]};
    for (int i = 0; i < 8; i++) ba.in[i] = bin[i];
    for (int i = 0; i < 6; i++) ba.out[i] = go[0][i];
    if (B * T * H > 0) PL_CK_OK(cbwd(&ba));

    /* the native driver */
    host_ctx hc;
    pl_lstm_nat_ops o = host_ops(&hc);
    pl_lstm_nat n;
    memset(&n, 0, sizeof n);
    n.B = B, n.T = T, n.In = In, n.H = H, n.rev = rev;
    n.x = F(x), n.wih = F(wih), n.whh = F(whh), n.bias = F(bias), n.h0 = F(h0), n.c0 = F(c0);
    n.y = F(fo[1][0]), n.ws = F(fo[1][1]), n.hn = F(fo[1][2]), n.cn = F(fo[1][3]);
    PL_CK_OK(pl_lstm_nat_forward(&o, &n));
    if (B * T * H > 0) /* one GEMM per step and the input projection's when In > 0 */
        ck_assert_int_eq(hc.gemms, (int)T + (In > 0));
    host_free(&hc);
    static const char *fname[4] = {"y", "ws", "h_n", "c_n"};
    if (B * H > 0) {
        for (int i = 0; i < 4; i++)
            if (T > 0 || i >= 2) near(fname[i], cs, fo[1][i], fo[0][i], 2e-5);
    }

    o = host_ops(&hc);
    n.dy = F(dy);
    float **outs[6] = {&n.dx, &n.dwih, &n.dwhh, &n.db, &n.dh0, &n.dc0};
    for (int i = 0; i < 6; i++) *outs[i] = want >> i & 1 ? F(go[1][i]) : NULL;
    PL_CK_OK(pl_lstm_nat_backward(&o, &n));
    host_free(&hc);
    static const char *gname[6] = {"dx", "dw_ih", "dw_hh", "db", "dh0", "dc0"};
    for (int i = 0; i < 6; i++) {
        if (!(want >> i & 1)) { /* not wanted: not written */
            const float *g = F(go[1][i]);
            for (int64_t e = 0; e < pl_tensor_numel(go[1][i]); e++)
                ck_assert_msg(isnan(g[e]), "%s: %s written though not wanted", cs, gname[i]);
            continue;
        }
        if (B * T * H == 0) { /* empty sums: zero */
            const float *g = F(go[1][i]);
            for (int64_t e = 0; e < pl_tensor_numel(go[1][i]); e++)
                ck_assert_msg(g[e] == 0.0f, "%s: %s[%lld] = %g, expected 0", cs, gname[i],
                              (long long)e, g[e]);
            continue;
        }
        near(gname[i], cs, go[1][i], go[0][i], 5e-5);
    }
    pl_frame_end();
}

START_TEST(native_driver_matches_cpu_kernel) {
    for (int rev = 0; rev < 2; rev++) {
        run_case(3, 5, 7, 6, rev, WANT_ALL);
        run_case(4, 9, 5, 33, rev, WANT_ALL); /* several rows per step, H not a power of 2 */
        run_case(2, 1, 3, 4, rev, WANT_ALL);  /* one step: h0 / c0 feed every pass */
        run_case(2, 3, 0, 4, rev, WANT_ALL);  /* In = 0: gates = b + h W_hh^T */
        run_case(1, 4, 2, 1, rev, WANT_ALL);  /* H = 1 */
    }
}
END_TEST

START_TEST(native_driver_leaves_unwanted_gradients) {
    run_case(3, 4, 5, 6, 0, 1 << 2 | 1 << 3);  /* dw_hh, db only */
    run_case(3, 4, 5, 6, 1, 1 << 4);           /* dh0 only: the last recurrent GEMM runs */
    run_case(3, 4, 5, 6, 1, 1 << 5);           /* dc0 only */
    run_case(3, 4, 5, 6, 0, WANT_ALL & ~1);    /* dx not wanted (the first layer) */
    run_case(3, 4, 5, 6, 0, 1);                /* dx only */
}
END_TEST

START_TEST(native_driver_empty_sizes) {
    run_case(2, 0, 3, 4, 0, WANT_ALL); /* T = 0: h_n = h0, c_n = c0, gradients zero */
    run_case(2, 0, 3, 4, 1, WANT_ALL);
    run_case(0, 3, 3, 4, 0, WANT_ALL); /* B = 0 */
    run_case(2, 3, 3, 0, 0, WANT_ALL); /* H = 0 */
}
END_TEST

/* The driver refuses what cuBLAS's int cannot address, before any call. */
START_TEST(native_driver_int_range) {
    pl_lstm_nat n;
    memset(&n, 0, sizeof n);
    n.B = 1 << 20, n.T = 1 << 12, n.In = 3, n.H = 4;
    ck_assert_int_eq(pl_lstm_nat_check(&n), PL_ERR_UNSUPPORTED);
    n.B = 2, n.T = 1 << 20, n.H = 1000;
    ck_assert_int_eq(pl_lstm_nat_check(&n), PL_ERR_UNSUPPORTED);
    n.T = 1000;
    PL_CK_OK(pl_lstm_nat_check(&n));
}
END_TEST

int main(void) {
    Suite *s = suite_create("lstm_native");
    TCase *tc = tcase_create("host");
    tcase_add_test(tc, native_driver_matches_cpu_kernel);
    tcase_add_test(tc, native_driver_leaves_unwanted_gradients);
    tcase_add_test(tc, native_driver_empty_sizes);
    tcase_add_test(tc, native_driver_int_range);
    suite_add_tcase(s, tc);
    return pl_test_run(s);
}
