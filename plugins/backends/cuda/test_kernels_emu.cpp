/* test_kernels_emu.cpp - CUDA kernels that have not run on a GPU, run on the host
 * without one: the fused attention's (cuda_attention.cu: k_att_fwd, k_att_bwd_dq,
 * k_att_bwd_dkv) against a naive double-precision attention, and topk's (cuda_index.cu:
 * k_topk_rows) against a full sort in pl_topk_before's order. The kernels' text (CMake
 * copies it out of the .cu files, between their section's first line and the host
 * function after it, into att_kernels.inc / topk_kernels.inc) is compiled as C++ with the
 * CUDA keywords as shims: a grid's blocks one after another, a block's threads as threads
 * of their own, __shared__ arrays as statics (one block at a time), __syncthreads a
 * barrier. So the tiling, the causal offsets, the online softmax, grouped-query heads, the
 * bias, topk's rounds and tree reduction and every index are the code a GPU runs; launch
 * limits, registers and the device's own float rounding are not checked here.
 * Attention cases: tiles crossed on both sides (T, L > 64 rows, > 32 keys), L - T > 0, a
 * per-batch and a shared bias with masked (-30) keys, GQA / MQA, D = 128 (the kernels'
 * limit) and D = 33; an output is wrong beyond 2e-5 relative to 1 + |reference|. topk:
 * V below and above the block's 256 threads, ties, -inf and NaN, k = 1 .. V; values
 * and indices exact. Errors: a printed line per check, exit status 1 when any fails. */
#include <pthread.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "pipeline/backend_util.h"

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
#include "att_kernels.inc"
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

int main() {
    int bad = 0;
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
