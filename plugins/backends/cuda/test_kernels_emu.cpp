/* test_kernels_emu.cpp - CUDA kernels that have not run on a GPU, run on the host
 * without one: the fused attention's (cuda_attention.cu: k_att_fwd, k_att_bwd_dq,
 * k_att_bwd_dkv) against a naive double-precision attention; topk's (cuda_index.cu:
 * k_topk_rows) against a full sort in pl_topk_before's order; the multi-tensor optimizer,
 * GradScaler and foreach-norm ones (cuda_optim.cu: k_count, k_adamw_step_multi,
 * k_sgd_step_multi, k_sum_squares_multi, k_mul_multi, k_amp_unscale_multi, with
 * cuda_common.cuh's block reductions) against optim_math.h's element functions in a loop.
 * The kernels' text (CMake copies it out of the .cu files, between their section's first
 * line and what follows it, into *.inc) is compiled as C++ with the CUDA keywords as shims:
 * a grid's blocks one after another, a block's threads as threads of their own, __shared__
 * arrays as statics (one block at a time), __syncthreads a barrier, a warp shuffle a
 * block-wide exchange. So the tiling, causal offsets, online softmax, grouped-query heads
 * and bias of attention, topk's rounds and tree reduction, the optimizers' tensor per
 * blockIdx.y, counts, coefficient records and skip, and every index are the code a GPU
 * runs; launch limits, registers and the device's own float rounding (nvcc contracts
 * a * b + c into fmas; this target does not: -ffp-contract=off) are not checked here.
 * Attention: tiles crossed on both sides (T, L > 64 rows, > 32 keys), L - T > 0, a
 * per-batch and a shared bias with masked (-30) keys, GQA / MQA, D = 128 (the kernels'
 * limit) and D = 33; wrong beyond 2e-5 relative to 1 + |reference|. topk: V below and
 * above the block's 256 threads, ties, -inf and NaN, k = 1 .. V; exact. Optimizers,
 * mul_multi, amp_unscale_multi: bit for bit; sum_squares_multi within 1e-6 (its order is
 * the block's). Errors: a printed line per check, exit status 1 when any fails. */
#include <pthread.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "pipeline/backend_util.h"
#include "pipeline/optim_math.h"

struct u3 {
    unsigned x, y, z;
};
static thread_local u3 threadIdx;
static u3 blockIdx, blockDim, gridDim;
static pthread_barrier_t g_bar;
#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
#define __syncthreads() pthread_barrier_wait(&g_bar)
/* cuda_common.cuh's loads and stores for the dtypes the cases use (f32, bf16); f16 is left
 * out: its conversion needs libgcc's helpers where the host has no F16C */
static inline float pl_d_ldf(const void *p, int dt, int64_t i) {
    if (dt == PL_BF16) return pl_bf16_widen(((const uint16_t *)p)[i]);
    if (dt != PL_F32) abort();
    return ((const float *)p)[i];
}
static inline void pl_d_stf(void *p, int dt, int64_t i, float v) {
    if (dt == PL_BF16)
        ((uint16_t *)p)[i] = pl_bf16_round(v);
    else if (dt == PL_F32)
        ((float *)p)[i] = v;
    else
        abort();
}
/* a warp shuffle: every thread of the block calls it (as pl_d_block_sum's callers do), so
 * a block-wide exchange through a static buffer stands in for the warp's */
template <typename T> static T __shfl_xor_sync(unsigned mask, T v, int o) {
    static T buf[1024];
    (void)mask;
    buf[threadIdx.x] = v;
    __syncthreads();
    T r = buf[threadIdx.x ^ (unsigned)o];
    __syncthreads();
    return r;
}
#define GRID_LOOP(i, n)                                                                            \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                      \
         i += (int64_t)blockDim.x * gridDim.x)
#include "att_kernels.inc"
#include "common_reduce.inc"
#include "optim_kernels.inc"
#include "topk_kernels.inc"

template <class F> static void launch(u3 grid, unsigned threads, F body) {
    gridDim = grid;
    blockDim = {threads, 1, 1};
    for (unsigned by = 0; by < grid.y; by++)
        for (unsigned bx = 0; bx < grid.x; bx++) {
            blockIdx = {bx, by, 0};
            pthread_barrier_init(&g_bar, NULL, threads);
            std::vector<std::thread> ts;
            for (unsigned t = 0; t < threads; t++)
                ts.emplace_back([=] {
                    threadIdx = {t, 0, 0};
                    body();
                });
            for (auto &t : ts)
                t.join();
            pthread_barrier_destroy(&g_bar);
        }
}

static double rnd(unsigned *s) {
    *s = *s * 1103515245u + 12345u;
    return ((*s >> 8) & 0xffff) / 32768.0 - 1.0;
}

static int run(int64_t B, int64_t H, int64_t KV, int64_t T, int64_t L, int64_t D, int causal,
               int bias_b) {
    unsigned seed = 7;
    std::vector<float> q(B * H * T * D), k(B * KV * L * D), v(B * KV * L * D), bias(bias_b * L),
        dO(B * H * T * D);
    for (auto *x : {&q, &k, &v, &dO})
        for (auto &e : *x)
            e = (float)rnd(&seed);
    for (auto &e : bias)
        e = (float)(2 * rnd(&seed)) - (rnd(&seed) > 0.6 ? 30.0f : 0.0f);
    float scale = 0.35f;
    att_args a;
    memset(&a, 0, sizeof a);
    a.q = q.data();
    a.k = k.data();
    a.v = v.data();
    a.bias = bias_b ? bias.data() : NULL;
    a.qdt = PL_F32;
    a.bdt = PL_F32;
    a.B = B;
    a.H = H;
    a.KV = KV;
    a.T = T;
    a.L = L;
    a.D = D;
    a.rep = H / KV;
    a.bias_bstride = bias_b == 1 ? 0 : L;
    a.scale = scale;
    a.causal = causal;
    std::vector<float> out(B * H * T * D), lse(B * H * T), dq(B * H * T * D, NAN),
        dk(B * KV * L * D, NAN), dv(B * KV * L * D, NAN);
    launch({(unsigned)(B * H), (unsigned)((T + ATT_ROWS - 1) / ATT_ROWS), 1}, ATT_ROWS,
           [&] { k_att_fwd(a, out.data(), lse.data()); });
    a.o = out.data();
    launch({(unsigned)(B * H), (unsigned)((T + ATT_ROWS - 1) / ATT_ROWS), 1}, ATT_ROWS,
           [&] { k_att_bwd_dq(a, dO.data(), lse.data(), dq.data()); });
    launch({(unsigned)(B * KV), (unsigned)((L + ATT_ROWS - 1) / ATT_ROWS), 1}, ATT_ROWS,
           [&] { k_att_bwd_dkv(a, dO.data(), lse.data(), dk.data(), dv.data()); });
    /* naive reference in double */
    std::vector<double> rout(out.size()), rlse(lse.size()), rdq(dq.size(), 0), rdk(dk.size(), 0),
        rdv(dv.size(), 0);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < T; i++) {
                int64_t row = (b * H + h) * T + i, kvb = (b * KV + h / (H / KV)) * L,
                        n = causal ? L - T + i + 1 : L;
                const float *bb = bias_b ? bias.data() + (bias_b == 1 ? 0 : b * L) : NULL;
                std::vector<double> s(n), p(n);
                double m = -INFINITY, c = bb ? -INFINITY : 0, sum = 0;
                for (int64_t j = 0; j < n; j++) {
                    double d = 0;
                    for (int64_t e = 0; e < D; e++)
                        d += (double)q[row * D + e] * k[(kvb + j) * D + e];
                    s[j] = scale * d + (bb ? bb[j] : 0);
                    m = std::max(m, s[j]);
                    if (bb) c = std::max(c, (double)bb[j]);
                }
                for (int64_t j = 0; j < n; j++)
                    sum += p[j] = exp(s[j] - m);
                for (int64_t j = 0; j < n; j++)
                    p[j] /= sum;
                rlse[row] = m + log(sum) - c;
                for (int64_t e = 0; e < D; e++) {
                    double o = 0;
                    for (int64_t j = 0; j < n; j++)
                        o += p[j] * v[(kvb + j) * D + e];
                    rout[row * D + e] = o;
                }
                double Di = 0;
                for (int64_t e = 0; e < D; e++)
                    Di += (double)dO[row * D + e] * rout[row * D + e];
                for (int64_t j = 0; j < n; j++) {
                    double dp = 0;
                    for (int64_t e = 0; e < D; e++)
                        dp += (double)dO[row * D + e] * v[(kvb + j) * D + e];
                    double ds = p[j] * (dp - Di);
                    for (int64_t e = 0; e < D; e++) {
                        rdq[row * D + e] += scale * ds * k[(kvb + j) * D + e];
                        rdk[(kvb + j) * D + e] += scale * ds * q[row * D + e];
                        rdv[(kvb + j) * D + e] += p[j] * dO[row * D + e];
                    }
                }
            }
    struct {
        const char *n;
        const float *g;
        const double *w;
        size_t c;
    } cmp[] = {{"out", out.data(), rout.data(), out.size()},
               {"lse", lse.data(), rlse.data(), lse.size()},
               {"dq", dq.data(), rdq.data(), dq.size()},
               {"dk", dk.data(), rdk.data(), dk.size()},
               {"dv", dv.data(), rdv.data(), dv.size()}};
    int bad = 0;
    for (auto &x : cmp) {
        double worst = 0;
        for (size_t i = 0; i < x.c; i++) {
            double d = fabs(x.g[i] - x.w[i]) / (1 + fabs(x.w[i]));
            if (!(d <= worst)) worst = d;
        }
        if (!(worst <= 2e-5)) bad++;
        printf("B%lld H%lld KV%lld T%lld L%lld D%lld causal %d bias %d: %s max rel err %.3g%s\n",
               (long long)B, (long long)H, (long long)KV, (long long)T, (long long)L, (long long)D,
               causal, bias_b, x.n, worst, worst <= 2e-5 ? "" : "  <-- FAIL");
    }
    return bad;
}

/* topk of R rows of V values (ties, -inf and NaN among them) for k, against a full sort */
static int run_topk(int64_t R, int64_t V, int64_t k) {
    unsigned seed = 11;
    std::vector<float> x(R * V), ov(R * k, -7.0f);
    std::vector<int64_t> oi(R * k, -7);
    for (auto &e : x) {
        double u = rnd(&seed);
        e = (float)(std::floor(u * 20) / 4); /* many ties */
        if (u > 0.97) e = -INFINITY;
        if (u < -0.98) e = NAN;
    }
    launch({(unsigned)R, 1, 1}, TOPK_THREADS,
           [&] { k_topk_rows(x.data(), ov.data(), oi.data(), R, V, k); });
    int bad = 0;
    for (int64_t r = 0; r < R; r++) {
        std::vector<int64_t> id(V);
        for (int64_t j = 0; j < V; j++)
            id[j] = j;
        const float *s = x.data() + r * V;
        std::sort(id.begin(), id.end(),
                  [&](int64_t a, int64_t b) { return pl_topk_before(s[a], a, s[b], b); });
        for (int64_t j = 0; j < k; j++) {
            float w = s[id[j]], g = ov[r * k + j];
            bool same = oi[r * k + j] == id[j] && (w == g || (w != w && g != g));
            if (!same && bad++ < 3)
                printf("topk R%lld V%lld k%lld: row %lld rank %lld: %g at %lld, want %g at %lld  "
                       "<-- FAIL\n",
                       (long long)R, (long long)V, (long long)k, (long long)r, (long long)j, g,
                       (long long)oi[r * k + j], w, (long long)id[j]);
        }
    }
    printf("topk R%lld V%lld k%lld: %s\n", (long long)R, (long long)V, (long long)k,
           bad ? "FAIL" : "exact");
    return bad != 0;
}

/* ---- the optimizer / GradScaler / foreach-norm kernels (cuda_optim.cu) ---- */

static int g_optim_bad;
static void expect(bool ok, const char *what) {
    if (!ok) g_optim_bad++;
    printf("optim: %s%s\n", what, ok ? "" : "  <-- FAIL");
}

/* adamw_step_multi, counted (counts 0, 2, 4 before), over tensors of 7, 1300 and 0 elements
 * with 2 x-blocks (so the grid-stride loop strides), the coefficients in the arguments or in a
 * device-style table (dc), then found_inf 1 (nothing changes); sgd_step_multi counted (the
 * first step's buffer), and the k_count launch before each. Against the element functions
 * called in a plain loop: bit for bit. */
static void run_adamw_multi(bool table) {
    const int64_t n[3] = {7, 1300, 0};
    unsigned seed = 5;
    pl_adamw_hyper h;
    memset(&h, 0, sizeof h);
    h.lr = 1e-2, h.beta1 = 0.9, h.beta2 = 0.999, h.eps = 1e-8, h.weight_decay = 0.1;
    pl_adamw_ccoef k = pl_adamw_ccoef_of(&h);
    std::vector<float> p[3], g[3], m[3], v[3], rp[3], rm[3], rv[3];
    float cnt[3] = {0, 2, 4}, rcnt[3] = {0, 2, 4};
    adamw_multi_args a;
    memset(&a, 0, sizeof a);
    std::vector<float> dc(PL_OPTIM_COEF_FLOATS * 3, 0.0f);
    count_args ca;
    memset(&ca, 0, sizeof ca);
    for (int t = 0; t < 3; t++) {
        for (auto *x : {&p[t], &g[t], &m[t], &v[t]}) {
            x->resize(n[t]);
            for (auto &e : *x)
                e = (float)rnd(&seed);
        }
        for (auto &e : v[t])
            e = e * e;
        rp[t] = p[t], rm[t] = m[t], rv[t] = v[t];
        a.p[t] = p[t].data(), a.g[t] = g[t].data(), a.m[t] = m[t].data(), a.v[t] = v[t].data();
        a.count[t] = &cnt[t];
        a.n[t] = n[t];
        a.c[t].k = k;
        memcpy(dc.data() + PL_OPTIM_COEF_FLOATS * t, &k, sizeof k);
        ca.c[t] = &cnt[t];
    }
    for (int step = 0; step < 2; step++) {
        float skip = step == 1 ? 1.0f : 0.0f;
        launch({1, 1, 1}, PL_OPTIM_MULTI_MAX, [&] { k_count(ca, 3, &skip); });
        launch({2, 3, 1}, 256, [&] { k_adamw_step_multi(a, table ? dc.data() : NULL, &skip); });
        if (skip != 0.0f) continue;
        for (int t = 0; t < 3; t++) {
            rcnt[t] += 1.0f;
            pl_adamw_coef c = pl_adamw_coef_at(&k, (double)rcnt[t]);
            for (int64_t i = 0; i < n[t]; i++)
                pl_adamw_elem(&c, &rp[t][i], g[t][i], &rm[t][i], &rv[t][i], NULL);
        }
    }
    bool same = true;
    for (int t = 0; t < 3; t++) {
        same = same && cnt[t] == rcnt[t];
        for (int64_t i = 0; i < n[t]; i++)
            same = same && !memcmp(&p[t][i], &rp[t][i], 4) && !memcmp(&m[t][i], &rm[t][i], 4) &&
                   !memcmp(&v[t][i], &rv[t][i], 4);
    }
    expect(same,
           table ? "adamw_step_multi counted, table coefficients, then skipped: bit for bit"
                 : "adamw_step_multi counted, coefficients by value, then skipped: bit for bit");
}

static void run_sgd_multi(void) {
    const int64_t n[2] = {300, 5};
    unsigned seed = 9;
    pl_sgd_hyper h;
    memset(&h, 0, sizeof h);
    h.lr = 0.1, h.momentum = 0.9, h.dampening = 0.1, h.weight_decay = 0.01;
    pl_sgd_coef c = pl_sgd_coef_of(&h, true);
    std::vector<float> p[2], g[2], b[2], rp[2], rb[2];
    float cnt[2] = {0, 6}, rcnt[2] = {0, 6};
    sgd_multi_args a;
    memset(&a, 0, sizeof a);
    count_args ca;
    memset(&ca, 0, sizeof ca);
    for (int t = 0; t < 2; t++) {
        for (auto *x : {&p[t], &g[t], &b[t]}) {
            x->resize(n[t]);
            for (auto &e : *x)
                e = (float)rnd(&seed);
        }
        rp[t] = p[t], rb[t] = b[t];
        a.p[t] = p[t].data(), a.g[t] = g[t].data(), a.buf[t] = b[t].data(), a.count[t] = &cnt[t];
        a.n[t] = n[t];
        a.c[t] = c;
        ca.c[t] = &cnt[t];
    }
    launch({1, 1, 1}, PL_OPTIM_MULTI_MAX, [&] { k_count(ca, 2, NULL); });
    launch({1, 2, 1}, 256, [&] { k_sgd_step_multi(a, NULL, NULL); });
    bool same = true;
    for (int t = 0; t < 2; t++) {
        rcnt[t] += 1.0f;
        pl_sgd_coef ct = c;
        ct.first = rcnt[t] == 1.0f;
        for (int64_t i = 0; i < n[t]; i++)
            pl_sgd_elem(&ct, &rp[t][i], g[t][i], &rb[t][i]);
        same = same && cnt[t] == rcnt[t];
        for (int64_t i = 0; i < n[t]; i++)
            same = same && !memcmp(&p[t][i], &rp[t][i], 4) && !memcmp(&b[t][i], &rb[t][i], 4);
    }
    expect(same, "sgd_step_multi counted (a first step and a seventh): bit for bit");
}

/* sum_squares_multi (from 0 and onto 0.3), mul_multi and amp_unscale_multi over 7, 3000, 0
 * and 1500 elements; an inf in the last tensor for the unscale */
static void run_foreach(void) {
    const int64_t n[4] = {7, 3000, 0, 1500};
    unsigned seed = 13;
    std::vector<float> x[4];
    amp_unscale_args a;
    memset(&a, 0, sizeof a);
    for (int t = 0; t < 4; t++) {
        x[t].resize(n[t]);
        for (auto &e : x[t])
            e = (float)rnd(&seed);
        a.g[t] = x[t].data();
        a.n[t] = n[t];
    }
    for (int start = 1; start >= 0; start--) {
        float acc = 0.3f, want = start ? 0.0f : 0.3f;
        for (int t = 0; t < 4; t++) {
            double s = 0;
            for (int64_t i = 0; i < n[t]; i++)
                s += (double)pl_math_square(x[t][i]);
            want = want + (float)s;
        }
        launch({1, 1, 1}, 1024, [&] { k_sum_squares_multi(a, 4, &acc, start); });
        char what[96];
        snprintf(what, sizeof what, "sum_squares_multi (start %d): %.9g, want %.9g", start, acc,
                 want);
        expect(fabs(acc - want) <= 1e-6 * want, what);
    }
    std::vector<float> w[4];
    for (int t = 0; t < 4; t++)
        w[t] = x[t];
    float s = -0.37f;
    launch({2, 4, 1}, 256, [&] { k_mul_multi(a, &s); });
    bool same = true;
    for (int t = 0; t < 4; t++)
        for (int64_t i = 0; i < n[t]; i++)
            same = same && x[t][i] == w[t][i] * s;
    expect(same, "mul_multi: bit for bit");
    x[3][1499] = INFINITY;
    for (int t = 0; t < 4; t++)
        w[t] = x[t];
    float inv = 0.5f, found = 0.0f;
    launch({2, 4, 1}, 256, [&] { k_amp_unscale_multi(a, &inv, &found); });
    same = found == 1.0f;
    for (int t = 0; t < 4; t++)
        for (int64_t i = 0; i < n[t]; i++) {
            float e = w[t][i];
            pl_amp_unscale_elem(&e, inv);
            same = same && !memcmp(&e, &x[t][i], 4);
        }
    expect(same, "amp_unscale_multi: the elements and found_inf (an inf in the last tensor)");
}

int main() {
    int bad = 0;
    run_adamw_multi(false);
    run_adamw_multi(true);
    run_sgd_multi();
    run_foreach();
    bad += g_optim_bad;
    bad += run_topk(3, 37, 5);
    bad += run_topk(2, 23, 23);
    bad += run_topk(4, 700, 20);
    bad += run_topk(2, 1000, 1);
    bad += run_topk(1, 300, 40);
    bad += run(2, 4, 2, 66, 100, 8, 1, 2);
    bad += run(1, 2, 2, 70, 70, 16, 1, 0);
    bad += run(1, 2, 1, 5, 7, 8, 0, 1);
    bad += run(2, 2, 2, 130, 130, 128, 1, 2);
    bad += run(1, 4, 1, 3, 40, 33, 0, 0);
    printf(bad ? "FAIL\n" : "all OK\n");
    return bad != 0;
}
