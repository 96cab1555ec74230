/* kernels_lstm.c - fused LSTM layer on the CPU (forward + backward through time).
 *
 * Equations (PyTorch nn.LSTM, gate order i, f, g, o):
 *   a_t = x_t W_ih^T + h_{t-1} W_hh^T + b          (b = b_ih + b_hh)
 *   i = sig(a_i), f = sig(a_f), g = tanh(a_g), o = sig(a_o)
 *   c_t = f c_{t-1} + i g,   h_t = o tanh(c_t)
 *
 * Forward: one sgemm for the input projection of all B*T rows, then per step
 * one sgemm h_{t-1} @ W_hh^T accumulated into the step's gate rows and the
 * elementwise cell update. Workspace ws [B, T, 6H] keeps, per (b, t), the
 * activated gates (4H), c_t (H) and h_t (H) for backward.
 *
 * Backward through time (dh_n, dc_n are not differentiated): per step
 *   dh = dy_t + dh_next,  dc = dh o (1 - tanh^2 c_t) + dc_next
 *   da_i = dc g i(1-i), da_f = dc c_{t-1} f(1-f), da_g = dc i (1-g^2),
 *   da_o = dh tanh(c_t) o(1-o),  dc_next = dc f,  dh_next = da W_hh
 * then three sgemms over all steps: dx = dA W_ih, dW_ih = dA^T x,
 * dW_hh = dA^T H_prev, and db = column sums of dA.
 * Kernel args: in = {x [B,T,In], w_ih [4H,In], w_hh [4H,H], b [4H], h0 [B,H],
 * c0 [B,H]}; out = {y [B,T,H], ws [B,T,6H], h_n [B,H], c_n [B,H]};
 * p.flags bit0 = reverse (process t = T-1 .. 0).
 * The cell's per-element math (gates, tanh through expf, the derivatives) is
 * kernel_math.h's pl_lstm_cell / pl_lstm_cell_grad, shared with every backend.
 */
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_internal.h"

void pl_cpu_register_lstm(pl_kernel_table *b);

/* One row of a step: the gate pre-activations gi, gf, gg, go (H each) become
 * the gates in place, then c_t and h_t (also copied to y). The slices do not
 * overlap (restrict: a row is [i | f | g | o | c | h] of H each), so the loop
 * vectorizes; the cell's math is plain arithmetic (pl_sigmoid_fast,
 * pl_tanh_fast). Not inlined: GCC drops restrict when it inlines. */
__attribute__((noinline)) static void cell_row(float *restrict gi, float *restrict gf, float *restrict gg,
                     float *restrict go, float *restrict c, float *restrict h,
                     const float *restrict cprev, float *restrict y, int64_t H) {
    for (int64_t j = 0; j < H; j++) {
        pl_lstm_cell(gi[j], gf[j], gg[j], go[j], cprev[j], &gi[j], &gf[j], &gg[j], &go[j], &c[j],
                     &h[j]);
        y[j] = h[j];
    }
}

/* One row of a step backward from a forward row [i | f | g | o | c | h]:
 * dh = dy + dh_next; da = [da_i | da_f | da_g | da_o]; dc_next becomes
 * dc_prev in place. */
__attribute__((noinline)) static void cell_grad_row(const float *restrict row, const float *restrict cprev,
                          const float *restrict dy, const float *restrict dh_next,
                          float *restrict dc_next, float *restrict dai, float *restrict daf,
                          float *restrict dag, float *restrict dao, int64_t H) {
    const float *ri = row, *rf = row + H, *rg = row + 2 * H, *ro = row + 3 * H, *rc = row + 4 * H;
    for (int64_t j = 0; j < H; j++)
        pl_lstm_cell_grad(ri[j], rf[j], rg[j], ro[j], rc[j], cprev[j], dy[j] + dh_next[j],
                          dc_next[j], &dai[j], &daf[j], &dag[j], &dao[j], &dc_next[j]);
}

static pl_status lstm_fwd(const pl_kernel_args *a) {
    const pl_tensor *xt = a->in[0], *wih = a->in[1], *whh = a->in[2];
    int64_t B = xt->shape[0], T = xt->shape[1], In = xt->shape[2], H = whh->shape[1];
    int64_t G = 4 * H, W = 6 * H;
    bool rev = a->p.flags & 1;
    const float *x = pl_tensor_data(xt), *bias = pl_tensor_data(a->in[3]);
    const float *h0 = pl_tensor_data(a->in[4]), *c0 = pl_tensor_data(a->in[5]);
    float *y = pl_tensor_data(a->out[0]), *ws = pl_tensor_data(a->out[1]);
    float *hn = pl_tensor_data(a->out[2]), *cn = pl_tensor_data(a->out[3]);
    if (B == 0 || H == 0) return PL_OK;
    if (T == 0) {
        memcpy(hn, h0, (size_t)(B * H) * sizeof(float));
        memcpy(cn, c0, (size_t)(B * H) * sizeof(float));
        return PL_OK;
    }
    /* input projection of every (b, t) row into the gate slots of ws */
    if (In > 0)
        pl_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)(B * T), (int)G, (int)In, 1.0f, x,
                    (int)In, pl_tensor_data(wih), (int)In, 0.0f, ws, (int)W);
    else
        for (int64_t r = 0; r < B * T; r++)
            memset(ws + r * W, 0, (size_t)G * sizeof(float));
#pragma omp parallel for if (B * T * G > 65536) schedule(static)
    for (int64_t r = 0; r < B * T; r++)
        for (int64_t k = 0; k < G; k++)
            ws[r * W + k] += bias[k];

    const float *whp = pl_tensor_data(whh);
    for (int64_t s = 0; s < T; s++) {
        int64_t t = rev ? T - 1 - s : s, tp = rev ? t + 1 : t - 1;
        const float *hprev = s == 0 ? h0 : ws + tp * W + 5 * H;
        int ldh = s == 0 ? (int)H : (int)(T * W);
        pl_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)B, (int)G, (int)H, 1.0f, hprev,
                    ldh, whp, (int)H, 1.0f, ws + t * W, (int)(T * W));
#pragma omp parallel for if (B * H > 16384) schedule(static)
        for (int64_t b = 0; b < B; b++) {
            float *row = ws + (b * T + t) * W;
            cell_row(row, row + H, row + 2 * H, row + 3 * H, row + 4 * H, row + 5 * H,
                     s == 0 ? c0 + b * H : ws + (b * T + tp) * W + 4 * H, y + (b * T + t) * H, H);
        }
    }
    int64_t tl = rev ? 0 : T - 1;
    for (int64_t b = 0; b < B; b++) {
        memcpy(cn + b * H, ws + (b * T + tl) * W + 4 * H, (size_t)H * sizeof(float));
        memcpy(hn + b * H, ws + (b * T + tl) * W + 5 * H, (size_t)H * sizeof(float));
    }
    return PL_OK;
}

/* in = {dy, x, w_ih, w_hh, b, h0, c0, ws}; out = {dx, dw_ih, dw_hh, db, dh0, dc0} */
static pl_status lstm_bwd(const pl_kernel_args *a) {
    const pl_tensor *xt = a->in[1], *whh_t = a->in[3];
    int64_t B = xt->shape[0], T = xt->shape[1], In = xt->shape[2], H = whh_t->shape[1];
    int64_t G = 4 * H, W = 6 * H;
    bool rev = a->p.flags & 1;
    const float *dy = pl_tensor_data(a->in[0]), *x = pl_tensor_data(xt);
    const float *wih = pl_tensor_data(a->in[2]), *whh = pl_tensor_data(whh_t);
    const float *h0 = pl_tensor_data(a->in[5]), *c0 = pl_tensor_data(a->in[6]);
    const float *ws = pl_tensor_data(a->in[7]);
    float *dx = a->out[0] ? pl_tensor_data(a->out[0]) : NULL;
    float *dwih = a->out[1] ? pl_tensor_data(a->out[1]) : NULL;
    float *dwhh = a->out[2] ? pl_tensor_data(a->out[2]) : NULL;
    float *db = a->out[3] ? pl_tensor_data(a->out[3]) : NULL;
    float *dh0 = a->out[4] ? pl_tensor_data(a->out[4]) : NULL;
    float *dc0 = a->out[5] ? pl_tensor_data(a->out[5]) : NULL;

    size_t nA = (size_t)(B * T * G), nBH = (size_t)(B * H);
    float *dA = malloc((nA ? nA : 1) * sizeof(float));
    float *dh_next = calloc(nBH ? nBH : 1, sizeof(float));
    float *dc_next = calloc(nBH ? nBH : 1, sizeof(float));
    float *hp = dwhh ? malloc((size_t)(B * T * H + 1) * sizeof(float)) : NULL;
    if (!dA || !dh_next || !dc_next || (dwhh && !hp)) {
        free(dA);
        free(dh_next);
        free(dc_next);
        free(hp);
        return pl_error_set(PL_ERR_NOMEM,
                            "lstm backward: out of host memory (B=%lld T=%lld H=%lld)",
                            (long long)B, (long long)T, (long long)H);
    }
    for (int64_t s = T - 1; s >= 0; s--) {
        int64_t t = rev ? T - 1 - s : s, tp = rev ? t + 1 : t - 1;
#pragma omp parallel for if (B * H > 16384) schedule(static)
        for (int64_t b = 0; b < B; b++) {
            float *da = dA + (b * T + t) * G;
            cell_grad_row(ws + (b * T + t) * W,
                          s == 0 ? c0 + b * H : ws + (b * T + tp) * W + 4 * H,
                          dy + (b * T + t) * H, dh_next + b * H, dc_next + b * H, da, da + H,
                          da + 2 * H, da + 3 * H, H);
        }
        if (s > 0 || dh0)
            pl_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)B, (int)H, (int)G, 1.0f,
                        dA + t * G, (int)(T * G), whh, (int)H, 0.0f, dh_next, (int)H);
        if (hp) {
            for (int64_t b = 0; b < B; b++) {
                const float *src = s == 0 ? h0 + b * H : ws + (b * T + tp) * W + 5 * H;
                memcpy(hp + (b * T + t) * H, src, (size_t)H * sizeof(float));
            }
        }
    }
    if (dh0) memcpy(dh0, dh_next, nBH * sizeof(float));
    if (dc0) memcpy(dc0, dc_next, nBH * sizeof(float));
    int BT = (int)(B * T);
    if (dx && In > 0)
        pl_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, BT, (int)In, (int)G, 1.0f, dA,
                    (int)G, wih, (int)In, 0.0f, dx, (int)In);
    if (dwih && In > 0)
        pl_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)G, (int)In, BT, 1.0f, dA, (int)G,
                    x, (int)In, 0.0f, dwih, (int)In);
    if (dwhh)
        pl_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)G, (int)H, BT, 1.0f, dA, (int)G,
                    hp, (int)H, 0.0f, dwhh, (int)H);
    if (db) {
        for (int64_t k = 0; k < G; k++)
            db[k] = 0.0f;
        for (int64_t r = 0; r < B * T; r++)
            for (int64_t k = 0; k < G; k++)
                db[k] += dA[r * G + k];
    }
    free(dA);
    free(dh_next);
    free(dc_next);
    free(hp);
    return PL_OK;
}

void pl_cpu_register_lstm(pl_kernel_table *b) {
    b->forward[PL_OP_LSTM] = lstm_fwd;
    b->backward[PL_OP_LSTM] = lstm_bwd;
}
