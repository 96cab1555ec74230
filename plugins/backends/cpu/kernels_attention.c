/* kernels_attention.c - CPU kernels of the fused attention op (pl_attention,
 * ops.h; FlashAttention-2, Dao 2023, arXiv 2307.08691). Conventions:
 * backend.h.
 *
 * Forward, one (batch, head) per task (OpenMP): each query row's scores
 * s_j = scale q . k_j + bias_j over the keys it sees go to a scratch row of L
 * floats (never a T x L matrix), then the row's max m, p_j = e^(s_j - m),
 * l = sum p_j, out = (sum p_j v_j) / l and lse = m + log l, saved less the
 * row's largest visible bias c (exact: a fully masked row keeps log l,
 * which -1e9 + log l in f32 would lose). On the CPU the
 * row of L floats is free, so the softmax is the exact two-pass one of
 * pl_causal_softmax (same rounding as the unfused chain, up to the order
 * of the sums) rather than the online rescaling the CUDA kernel needs for
 * its tiles (cuda_attention.cu); both give the same lse and output.
 *
 * Backward, one (batch, kv head) per task, so the rep = H / KV query heads
 * that share a kv head add into its dK, dV without a race: for each of
 * their query rows, P_ij = e^((s_ij - c_i) - (lse_i - c_i)) recomputed from
 * the saved logsumexp, D_i = dO_i . O_i, and
 *   dV_j += P_ij dO_i, dP_ij = dO_i . V_j, dS_ij = P_ij (dP_ij - D_i),
 *   dQ_i += scale dS_ij K_j, dK_j += scale dS_ij Q_i.
 * bf16 / f16 tensors are read in place and widened row by row (k, v of the
 * task's kv head into scratch), gradients are f32 (the tape's).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_internal.h" /* backend_util.h, kernel_math.h */

/* n elements of a float tensor's data from element off, as f32 (f32 data is
 * returned in place, other dtypes are widened into buf). */
static const float *row_f32(const pl_tensor *t, int64_t off, int64_t n, float *buf) {
    const void *p = pl_tensor_data(t);
    if (t->dtype == PL_F32) return (const float *)p + off;
    for (int64_t i = 0; i < n; i++)
        buf[i] = (float)pl_elem_load(p, t->dtype, off + i);
    return buf;
}

static inline float dotf(const float *a, const float *b, int64_t n) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < n; i++)
        s += a[i] * b[i];
    return s;
}

/* The geometry of one call: q [B, H, T, D], k / v [B, KV, L, D], bias [1 or B, 1, 1, L]. */
typedef struct att_geo {
    int64_t B, H, KV, T, L, D, rep;
    float scale;
    bool causal;
    const pl_tensor *bias; /* or NULL */
} att_geo;

static att_geo geo_of(const pl_tensor *q, const pl_tensor *k, const pl_tensor *bias,
                      const pl_op_params *p) {
    att_geo g = {.B = q->shape[0],
                 .H = q->shape[1],
                 .T = q->shape[2],
                 .D = q->shape[3],
                 .KV = k->shape[1],
                 .L = k->shape[2],
                 .scale = (float)p->alpha,
                 .causal = (p->flags & 1) != 0,
                 .bias = bias};
    g.rep = g.KV > 0 ? g.H / g.KV : 1;
    return g;
}

/* keys query i sees */
static inline int64_t visible(const att_geo *g, int64_t i) {
    return g->causal ? g->L - g->T + i + 1 : g->L;
}

/* the bias row of batch b widened into buf (L floats), or NULL without one */
static const float *bias_row(const att_geo *g, int64_t b, float *buf) {
    if (!g->bias) return NULL;
    int64_t bb = g->bias->shape[0] == 1 ? 0 : b;
    return row_f32(g->bias, bb * g->L, g->L, buf);
}

/* c: the largest bias among the n keys a row sees (0 without a bias); the
 * saved statistic is lse - c (the top of this file). */
static float bias_max(const float *bias, int64_t n) {
    if (!bias) return 0.0f;
    float c = -INFINITY;
    for (int64_t j = 0; j < n; j++)
        c = pl_max_step(c, bias[j]);
    return c;
}

/* scale q . k_j + bias_j for the n visible keys of one row */
static void row_scores(const att_geo *g, const float *q, const float *K, const float *bias,
                       int64_t n, float *s) {
    for (int64_t j = 0; j < n; j++)
        s[j] = g->scale * dotf(q, K + j * g->D, g->D) + (bias ? bias[j] : 0.0f);
}

/* Scratch of one task: s [L], bias [L], q, acc [D], K, V [L, D] when widened. */
static float *task_scratch(const att_geo *g) {
    return malloc((size_t)(2 * g->L + 4 * g->D + 2 * g->L * g->D + 1) * sizeof(float));
}

/* in = {q, k, v, [bias]}; out = {out [B, H, T, D], lse f32 [B, H, T]} */
static pl_status attention_fwd(const pl_kernel_args *a) {
    const pl_tensor *q = a->in[0], *k = a->in[1], *v = a->in[2];
    att_geo g = geo_of(q, k, a->n_in > 3 ? a->in[3] : NULL, &a->p);
    pl_tensor *o = a->out[0];
    float *lse = pl_tensor_data(a->out[1]);
    void *op = pl_tensor_data(o);
    int64_t tasks = g.B * g.H, D = g.D, L = g.L;
    int fail = 0;
#pragma omp parallel for schedule(dynamic) if (tasks > 1 && g.T * L * D > 4096)
    for (int64_t bh = 0; bh < tasks; bh++) {
        float *sc = task_scratch(&g);
        if (!sc) {
#pragma omp atomic write
            fail = 1;
            continue;
        }
        float *s = sc, *bbuf = s + L, *qb = bbuf + L, *acc = qb + D, *kb = acc + 2 * D,
              *vb = kb + L * D;
        int64_t b = bh / g.H, h = bh % g.H, kvh = (b * g.KV + h / g.rep) * L * D;
        const float *K = row_f32(k, kvh, L * D, kb), *V = row_f32(v, kvh, L * D, vb);
        const float *bias = bias_row(&g, b, bbuf);
        for (int64_t i = 0; i < g.T; i++) {
            int64_t row = bh * g.T + i, n = visible(&g, i);
            const float *qr = row_f32(q, row * D, D, qb);
            row_scores(&g, qr, K, bias, n, s);
            float m = -INFINITY, l = 0.0f;
            for (int64_t j = 0; j < n; j++)
                m = pl_max_step(m, s[j]);
            for (int64_t j = 0; j < n; j++)
                l += s[j] = pl_softmax_exp(s[j], m);
            memset(acc, 0, (size_t)D * sizeof(float));
            for (int64_t j = 0; j < n; j++) {
                const float *vr = V + j * D;
                float p = s[j];
#pragma omp simd
                for (int64_t d = 0; d < D; d++)
                    acc[d] += p * vr[d];
            }
            float inv = 1.0f / l;
            for (int64_t d = 0; d < D; d++)
                pl_elem_store(op, o->dtype, row * D + d, acc[d] * inv);
            lse[row] = (m - bias_max(bias, n)) + logf(l);
        }
        free(sc);
    }
    if (fail) return pl_error_set(PL_ERR_NOMEM, "attention: out of host memory for scratch");
    return PL_OK;
}

/* The rep query heads of one (batch, kv head): adds into dK, dV (f32 [L, D],
 * zeroed by the caller) and writes dQ rows where dq is not NULL. */
static void attention_bwd_task(const att_geo *g, const pl_kernel_args *a, int64_t b, int64_t kvh,
                               float *sc, float *dK, float *dV) {
    const pl_tensor *gr = a->in[0], *q = a->in[1], *k = a->in[2], *v = a->in[3];
    int ns = a->n_in - 3; /* q, k, v [, bias] */
    const pl_tensor *o = a->in[1 + ns];
    const float *lse = pl_tensor_data(a->in[2 + ns]), *dO = pl_tensor_data(gr);
    float *dq = a->out[0] ? pl_tensor_data(a->out[0]) : NULL;
    int64_t D = g->D, L = g->L, base = (b * g->KV + kvh) * L * D;
    float *s = sc, *bbuf = s + L, *qb = bbuf + L, *ob = qb + D, *dqr = ob + D, *kb = dqr + D,
          *vb = kb + L * D;
    const float *K = row_f32(k, base, L * D, kb), *V = row_f32(v, base, L * D, vb);
    const float *bias = bias_row(g, b, bbuf);
    for (int64_t h = kvh * g->rep; h < (kvh + 1) * g->rep; h++) {
        for (int64_t i = 0; i < g->T; i++) {
            int64_t row = (b * g->H + h) * g->T + i, n = visible(g, i);
            const float *qr = row_f32(q, row * D, D, qb), *orow = row_f32(o, row * D, D, ob);
            const float *go = dO + row * D;
            float Di = dotf(go, orow, D), li = lse[row], c = bias_max(bias, n);
            row_scores(g, qr, K, bias, n, s);
            memset(dqr, 0, (size_t)D * sizeof(float));
            for (int64_t j = 0; j < n; j++) {
                float p = expf((s[j] - c) - li);
                float ds = p * (dotf(go, V + j * D, D) - Di), sds = g->scale * ds;
                float *dvj = dV + j * D, *dkj = dK + j * D;
                const float *kj = K + j * D;
#pragma omp simd
                for (int64_t d = 0; d < D; d++) {
                    dvj[d] += p * go[d];
                    dkj[d] += sds * qr[d];
                    dqr[d] += sds * kj[d];
                }
            }
            if (dq) memcpy(dq + row * D, dqr, (size_t)D * sizeof(float));
        }
    }
}

/* in = {g, q, k, v, [bias], out, lse}; out = {dq, dk, dv, [dbias: none]} */
static pl_status attention_bwd(const pl_kernel_args *a) {
    const pl_tensor *q = a->in[1], *k = a->in[2];
    att_geo g = geo_of(q, k, a->n_in > 6 ? a->in[4] : NULL, &a->p);
    if (a->n_out > 3 && a->out[3])
        return pl_error_set(PL_ERR_INVALID, "attention backward: the bias has no gradient");
    float *dk = a->out[1] ? pl_tensor_data(a->out[1]) : NULL;
    float *dv = a->out[2] ? pl_tensor_data(a->out[2]) : NULL;
    int64_t tasks = g.B * g.KV, LD = g.L * g.D;
    int fail = 0;
#pragma omp parallel for schedule(dynamic) if (tasks > 1 && g.T * LD > 4096)
    for (int64_t t = 0; t < tasks; t++) {
        /* scratch as the forward's, plus dK and dV of the task when not wanted */
        float *sc = task_scratch(&g);
        float *own = (!dk || !dv) ? calloc((size_t)(2 * LD), sizeof(float)) : NULL;
        if (!sc || ((!dk || !dv) && !own)) {
#pragma omp atomic write
            fail = 1;
            free(sc);
            free(own);
            continue;
        }
        float *dK = dk ? dk + t * LD : own, *dV = dv ? dv + t * LD : own + LD;
        memset(dK, 0, (size_t)LD * sizeof(float));
        memset(dV, 0, (size_t)LD * sizeof(float));
        attention_bwd_task(&g, a, t / g.KV, t % g.KV, sc, dK, dV);
        free(sc);
        free(own);
    }
    if (fail)
        return pl_error_set(PL_ERR_NOMEM, "attention backward: out of host memory for scratch");
    return PL_OK;
}

void pl_cpu_register_attention(pl_kernel_table *b) {
    b->forward[PL_OP_ATTENTION] = attention_fwd;
    b->backward[PL_OP_ATTENTION] = attention_bwd;
}
