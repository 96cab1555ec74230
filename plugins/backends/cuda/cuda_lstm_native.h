/* cuda_lstm_native.h - the capturable ("native") LSTM of the CUDA backend,
 * written once for the device and the host: the per-element work (PL_HD) and
 * the sequence of GEMMs and element passes, over a table of operations
 * (pl_lstm_nat_ops). cuda_lstm_native.cu gives it cuBLAS's cublasSgemm and
 * one kernel per element pass on the thread's stream; test_lstm_native.c
 * gives it a host loop and a host column-major sgemm with cuBLAS's argument
 * convention, and checks the result against the CPU backend's kernel
 * (kernels_lstm.c) on a machine without a GPU. So the index arithmetic, the
 * GEMM arguments (row-major to column-major, leading dimensions, offsets)
 * and the order of the passes are the code the GPU runs; only the launch
 * geometry and cuBLAS itself are not checked there.
 *
 * The op (ops.h pl_lstm; the kernel arguments: cuda_lstm.cu's top): x
 * [B, T, In], w_ih [4H, In], w_hh [4H, H], b [4H] (b_ih + b_hh), h0 / c0
 * [B, H]; y [B, T, H], ws [B, T, 6H], h_n / c_n [B, H]; reverse = t from
 * T-1 down to 0. The structure is PyTorch's non-cuDNN path
 * (_thnn_fused_lstm_cell forward / backward per step), the math and what is
 * written are the CPU kernel's, op for op:
 *
 * forward (B, T, H > 0):
 *   1. ws[b, t, 0:4H] = b                         (BIAS pass, B*T*4H)
 *   2. ws[b, t, 0:4H] += x[b, t] W_ih^T           (one GEMM, M = B*T; none when In = 0)
 *   3. per step s = 0 .. T-1 (t = s, or T-1-s reversed; tp the step before):
 *        ws[:, t, 0:4H] += h_{tp} W_hh^T           (one GEMM, M = B; h_{tp} is
 *                                                    ws[:, tp, 5H:6H], or h0 at s = 0)
 *        CELL pass (B*H): pl_lstm_cell turns the row's pre-activations into
 *        [i | f | g | o | c_t | h_t] in place and copies h_t to y[b, t]
 *   4. FINAL pass (B*H): h_n / c_n = the row of the last step processed.
 * The saved ws is the CPU's, element for element: [i, f, g, o (activated),
 * c_t, h_t] per (b, t), so this backward reads it and recomputes nothing.
 *
 * backward (dh_n = dc_n = 0, as on the CPU): scratch dA [B, T, 4H], dh / dc
 * [B, H] (zeroed by ZERO_STATE), per step s = T-1 .. 0:
 *   CELL_GRAD pass (B*H): pl_lstm_cell_grad with dh = dy[b, t] + dh, dc in
 *   place (becomes dc_{t-1}), the row's dA[b, t];
 *   dh = dA[:, t] W_hh                            (one GEMM, beta 0; skipped at s = 0
 *                                                    when dh0 is not wanted)
 * then STATE_OUT (dh0 / dc0), and over all B*T rows at once:
 *   dx    = dA W_ih                               (one GEMM)
 *   dW_ih = dA^T x                                (one GEMM)
 *   dW_hh = dA^T Hp, Hp[b, t] = h_{tp} (h0 at s = 0), gathered by the
 *           HPREV pass into [B, T, H] scratch   (one GEMM)
 *   db    = ones[B*T] dA                          (one GEMM, M = 1)
 * Each output may be NULL (not computed); the others are overwritten.
 * B, T or H = 0: the forward copies h0 / c0 to h_n / c_n when T = 0 and
 * does nothing else; the backward zeroes every wanted output.
 *
 * GEMMs: `gemm` has cublasSgemm's column-major convention; the row-major
 * products above go through pl_lstm_nat_rm_gemm (C^T = op(B)^T op(A)^T, as
 * cuda_matmul.cu's rm_gemm_ab). Every dimension and leading dimension is
 * checked against INT_MAX first (pl_lstm_nat_check).
 */
#ifndef PL_CUDA_LSTM_NATIVE_H
#define PL_CUDA_LSTM_NATIVE_H

#include <limits.h>
#include <stdbool.h>
#include <stdint.h>

#include "pipeline/backend_util.h" /* PL_HD, kernel_math.h's pl_lstm_cell / _grad, pl_status */

/* The element passes (template argument of the device kernel). */
enum {
    PL_LSTM_NAT_BIAS = 0,   /* n = B*T*4H: ws gates <- b */
    PL_LSTM_NAT_CELL,       /* n = B*H, step s: the cell forward */
    PL_LSTM_NAT_FINAL,      /* n = B*H: h_n, c_n */
    PL_LSTM_NAT_ZERO_STATE, /* n = B*H: dh = dc = 0 */
    PL_LSTM_NAT_CELL_GRAD,  /* n = B*H, step s: the cell backward */
    PL_LSTM_NAT_STATE_OUT,  /* n = B*H: dh0 = dh, dc0 = dc (each when wanted) */
    PL_LSTM_NAT_HPREV,      /* n = B*T*H: hp[b, t] = h_{tp} (h0 at s = 0) */
    PL_LSTM_NAT_ONES,       /* n = B*T: ones = 1 */
    PL_LSTM_NAT_KINDS
};

/* One call's sizes and buffers (device pointers on the GPU), f32, contiguous.
 * Passed by value to the kernels. */
typedef struct pl_lstm_nat {
    int64_t B, T, In, H;
    int rev; /* p.flags bit0 */
    /* forward inputs (the backward reads them too) */
    const float *x, *wih, *whh, *bias, *h0, *c0;
    /* forward outputs; ws is read by the backward */
    float *y, *ws, *hn, *cn;
    /* backward: dy in; the wanted gradients out (NULL: not wanted) */
    const float *dy;
    float *dx, *dwih, *dwhh, *db, *dh0, *dc0;
    /* backward scratch (filled by the driver through ops->scratch) */
    float *dA, *dh, *dc, *hp, *ones;
} pl_lstm_nat;

/* The time index of step s (0 = first processed) and of the step before it
 * (only meaningful for s > 0). */
PL_HD static inline int64_t pl_lstm_nat_t(const pl_lstm_nat *a, int64_t s) {
    return a->rev ? a->T - 1 - s : s;
}
PL_HD static inline int64_t pl_lstm_nat_tp(const pl_lstm_nat *a, int64_t t) {
    return a->rev ? t + 1 : t - 1;
}

/* Element e of pass `kind` at step s (ignored by the passes that are not per
 * step). Each element is independent of the others of the same pass. */
PL_HD static inline void pl_lstm_nat_elem(int kind, const pl_lstm_nat *a, int64_t s, int64_t e) {
    const int64_t H = a->H, T = a->T, W = 6 * H, G = 4 * H;
    switch (kind) {
    case PL_LSTM_NAT_BIAS: { /* row r = b*T + t of ws, gate column k */
        int64_t r = e / G, k = e % G;
        a->ws[r * W + k] = a->bias[k];
        break;
    }
    case PL_LSTM_NAT_CELL: {
        int64_t b = e / H, j = e % H, t = pl_lstm_nat_t(a, s), tp = pl_lstm_nat_tp(a, t);
        float *row = a->ws + (b * T + t) * W;
        float cprev = s == 0 ? a->c0[b * H + j] : a->ws[(b * T + tp) * W + 4 * H + j];
        pl_lstm_cell(row[j], row[H + j], row[2 * H + j], row[3 * H + j], cprev, &row[j],
                     &row[H + j], &row[2 * H + j], &row[3 * H + j], &row[4 * H + j],
                     &row[5 * H + j]);
        a->y[(b * T + t) * H + j] = row[5 * H + j];
        break;
    }
    case PL_LSTM_NAT_FINAL: {
        int64_t b = e / H, j = e % H, tl = a->rev ? 0 : T - 1;
        const float *row = a->ws + (b * T + tl) * W;
        if (a->cn) a->cn[e] = row[4 * H + j];
        if (a->hn) a->hn[e] = row[5 * H + j];
        break;
    }
    case PL_LSTM_NAT_ZERO_STATE:
        a->dh[e] = 0.0f;
        a->dc[e] = 0.0f;
        break;
    case PL_LSTM_NAT_CELL_GRAD: {
        int64_t b = e / H, j = e % H, t = pl_lstm_nat_t(a, s), tp = pl_lstm_nat_tp(a, t);
        const float *row = a->ws + (b * T + t) * W;
        float cprev = s == 0 ? a->c0[b * H + j] : a->ws[(b * T + tp) * W + 4 * H + j];
        float *da = a->dA + (b * T + t) * G;
        pl_lstm_cell_grad(row[j], row[H + j], row[2 * H + j], row[3 * H + j], row[4 * H + j],
                          cprev, a->dy[(b * T + t) * H + j] + a->dh[e], a->dc[e], &da[j],
                          &da[H + j], &da[2 * H + j], &da[3 * H + j], &a->dc[e]);
        break;
    }
    case PL_LSTM_NAT_STATE_OUT:
        if (a->dh0) a->dh0[e] = a->dh[e];
        if (a->dc0) a->dc0[e] = a->dc[e];
        break;
    case PL_LSTM_NAT_HPREV: { /* e = (b*T + t)*H + j */
        int64_t j = e % H, r = e / H, t = r % T, b = r / T;
        int64_t s2 = a->rev ? T - 1 - t : t, tp = pl_lstm_nat_tp(a, t);
        a->hp[e] = s2 == 0 ? a->h0[b * H + j] : a->ws[(b * T + tp) * W + 5 * H + j];
        break;
    }
    case PL_LSTM_NAT_ONES:
        a->ones[e] = 1.0f;
        break;
    default:
        break;
    }
}

/* What the driver runs on: the device (cuda_lstm_native.cu) or the host
 * (test_lstm_native.c). Each returns PL_OK or an error it has set. */
typedef struct pl_lstm_nat_ops {
    void *ctx;
    /* cublasSgemm's convention (column-major): C[m, n] = alpha op(A) op(B) +
     * beta C, op(A) m x k, op(B) k x n; ta / tb: transpose */
    pl_status (*gemm)(void *ctx, bool ta, bool tb, int m, int n, int k, float alpha,
                      const float *A, int lda, const float *B, int ldb, float beta, float *C,
                      int ldc);
    /* every element e in [0, n) of pass `kind` at step s (n > 0) */
    pl_status (*elem)(void *ctx, int kind, const pl_lstm_nat *a, int64_t s, int64_t n);
    /* n floats at p <- 0; dst <- src (n floats) */
    pl_status (*zero)(void *ctx, float *p, int64_t n);
    pl_status (*copy)(void *ctx, float *dst, const float *src, int64_t n);
    /* n floats of scratch in slot 0 .. 4, or NULL with the error set; the
     * caller of the driver frees the slots afterwards */
    float *(*scratch)(void *ctx, int slot, int64_t n);
} pl_lstm_nat_ops;

/* PL_ERR_UNSUPPORTED when a GEMM dimension or leading dimension would pass
 * INT_MAX (cuBLAS's int). */
static inline pl_status pl_lstm_nat_check(const pl_lstm_nat *a) {
    int64_t B = a->B, T = a->T, In = a->In, H = a->H;
    if (B > INT_MAX || T > INT_MAX || In > INT_MAX || H > INT_MAX / 6 ||
        (T > 0 && B > INT_MAX / T) || (T > 0 && 6 * H > INT_MAX / T))
        return pl_error_set(PL_ERR_UNSUPPORTED, "cuda lstm (native): B=%lld T=%lld In=%lld "
                            "H=%lld exceed cuBLAS's int range (B*T and T*6H must fit)",
                            (long long)B, (long long)T, (long long)In, (long long)H);
    return PL_OK;
}

/* Row-major C[M, N] = op(A) op(B) + beta C (alpha 1), A stored [M, K] (ta:
 * [K, M]) with row stride lda, B stored [K, N] (tb: [N, K]) with row stride
 * ldb, C with row stride ldc. cuBLAS is column-major: a row-major X is X^T
 * to it, so this asks for C^T[N, M] = op(B)^T op(A)^T. */
static inline pl_status pl_lstm_nat_rm_gemm(const pl_lstm_nat_ops *o, bool ta, bool tb,
                                            int64_t M, int64_t N, int64_t K, const float *A,
                                            int64_t lda, const float *B, int64_t ldb,
                                            float beta, float *C, int64_t ldc) {
    return o->gemm(o->ctx, tb, ta, (int)N, (int)M, (int)K, 1.0f, B, (int)ldb, A, (int)lda, beta,
                   C, (int)ldc);
}

static inline pl_status pl_lstm_nat_forward(const pl_lstm_nat_ops *o, const pl_lstm_nat *a) {
    const int64_t B = a->B, T = a->T, In = a->In, H = a->H, G = 4 * H, W = 6 * H;
    if (B == 0 || H == 0) return PL_OK;
    if (T == 0) { /* no step: the final states are the initial ones */
        if (a->hn && o->copy(o->ctx, a->hn, a->h0, B * H)) return pl_error_status();
        if (a->cn && o->copy(o->ctx, a->cn, a->c0, B * H)) return pl_error_status();
        return PL_OK;
    }
    if (pl_lstm_nat_check(a)) return pl_error_status();
    if (o->elem(o->ctx, PL_LSTM_NAT_BIAS, a, 0, B * T * G)) return pl_error_status();
    /* ws[r, 0:G] += x[r] W_ih^T over all r = b*T + t */
    if (In > 0 && pl_lstm_nat_rm_gemm(o, false, true, B * T, G, In, a->x, In, a->wih, In, 1.0f,
                                      a->ws, W))
        return pl_error_status();
    for (int64_t s = 0; s < T; s++) {
        int64_t t = pl_lstm_nat_t(a, s), tp = pl_lstm_nat_tp(a, t);
        /* rows b of step t: ws + (b*T + t)*W, row stride T*W; h_{tp} likewise at 5H */
        const float *hprev = s == 0 ? a->h0 : a->ws + tp * W + 5 * H;
        int64_t ldh = s == 0 ? H : T * W;
        if (pl_lstm_nat_rm_gemm(o, false, true, B, G, H, hprev, ldh, a->whh, H, 1.0f,
                                a->ws + t * W, T * W))
            return pl_error_status();
        if (o->elem(o->ctx, PL_LSTM_NAT_CELL, a, s, B * H)) return pl_error_status();
    }
    if ((a->hn || a->cn) && o->elem(o->ctx, PL_LSTM_NAT_FINAL, a, 0, B * H))
        return pl_error_status();
    return PL_OK;
}

static inline pl_status pl_lstm_nat_backward(const pl_lstm_nat_ops *o, const pl_lstm_nat *in) {
    pl_lstm_nat a = *in;
    const int64_t B = a.B, T = a.T, In = a.In, H = a.H, G = 4 * H;
    if (!a.dx && !a.dwih && !a.dwhh && !a.db && !a.dh0 && !a.dc0) return PL_OK;
    if (B == 0 || T == 0 || H == 0) { /* every gradient is an empty sum */
        float *outs[6] = {a.dx, a.dwih, a.dwhh, a.db, a.dh0, a.dc0};
        int64_t ns[6] = {B * T * In, G * In, G * H, G, B * H, B * H};
        for (int i = 0; i < 6; i++)
            if (outs[i] && ns[i] > 0 && o->zero(o->ctx, outs[i], ns[i])) return pl_error_status();
        return PL_OK;
    }
    if (pl_lstm_nat_check(&a)) return pl_error_status();
    const int64_t BT = B * T;
    if (!(a.dA = o->scratch(o->ctx, 0, BT * G)) || !(a.dh = o->scratch(o->ctx, 1, B * H)) ||
        !(a.dc = o->scratch(o->ctx, 2, B * H)))
        return pl_error_status();
    if (o->elem(o->ctx, PL_LSTM_NAT_ZERO_STATE, &a, 0, B * H)) return pl_error_status();
    for (int64_t s = T - 1; s >= 0; s--) {
        int64_t t = pl_lstm_nat_t(&a, s);
        if (o->elem(o->ctx, PL_LSTM_NAT_CELL_GRAD, &a, s, B * H)) return pl_error_status();
        /* dh[b] = dA[b, t] W_hh: rows of dA at (b*T + t)*G, row stride T*G */
        if ((s > 0 || a.dh0) && pl_lstm_nat_rm_gemm(o, false, false, B, H, G, a.dA + t * G,
                                                    T * G, a.whh, H, 0.0f, a.dh, H))
            return pl_error_status();
    }
    if ((a.dh0 || a.dc0) && o->elem(o->ctx, PL_LSTM_NAT_STATE_OUT, &a, 0, B * H))
        return pl_error_status();
    if (a.dx && In > 0 &&
        pl_lstm_nat_rm_gemm(o, false, false, BT, In, G, a.dA, G, a.wih, In, 0.0f, a.dx, In))
        return pl_error_status();
    if (a.dwih && In > 0 &&
        pl_lstm_nat_rm_gemm(o, true, false, G, In, BT, a.dA, G, a.x, In, 0.0f, a.dwih, In))
        return pl_error_status();
    if (a.dwhh) {
        if (!(a.hp = o->scratch(o->ctx, 3, BT * H)) ||
            o->elem(o->ctx, PL_LSTM_NAT_HPREV, &a, 0, BT * H) ||
            pl_lstm_nat_rm_gemm(o, true, false, G, H, BT, a.dA, G, a.hp, H, 0.0f, a.dwhh, H))
            return pl_error_status();
    }
    if (a.db) {
        if (!(a.ones = o->scratch(o->ctx, 4, BT)) ||
            o->elem(o->ctx, PL_LSTM_NAT_ONES, &a, 0, BT) ||
            pl_lstm_nat_rm_gemm(o, false, false, 1, G, BT, a.ones, BT, a.dA, G, 0.0f, a.db, G))
            return pl_error_status();
    }
    return PL_OK;
}

#endif
