/* kernels_nf4.c - CPU kernels of PL_OP_NF4_MATMUL (ops.h pl_nf4_matmul) and
 * PL_OP_NF4_QUANTIZE (pl_nf4_quantize's block absmax and codes).
 *
 * forward : x [M, K] (f32/bf16/f16, contiguous; leading dims flattened),
 *           W nf4 [N, K] -> y [M, N] in x's dtype.
 *           y = x @ dequant(W)^T. W is dequantized on the fly, a panel of
 *           rows at a time (about 1 MiB of f32), never as a whole; each
 *           dequantized value is code * absmax rounded to x's dtype (so a
 *           bf16 compute dtype sees bf16 weights, as bitsandbytes'
 *           dequantize into the compute dtype), then OpenBLAS sgemm
 *           accumulates in f32 and the result is rounded to x's dtype.
 * backward: dy [M, N] f32 -> dx [M, K] f32 = dy @ dequant(W) (same panels).
 *           W is frozen: no gradient for it.
 * The decode (code table, nibble order, absmax scale) and the rounding are
 * kernel_math.h's pl_nf4_decode / pl_bf16_rne / pl_f16_rne, through
 * pl_nf4_dequant_range_cpu below.
 */
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_internal.h"
#include "pipeline/nf4.h"

/* Dequantize elements [e0, e1) of a CPU nf4 code buffer into dst[0..e1-e0)
 * as f32, rounded to `round_to` precision when bf16/f16 (the twin of
 * ops_nf4.c's, which the core's host pl_nf4_dequantize uses). */
static void pl_nf4_dequant_range_cpu(const uint8_t *codes, const float *absmax, int64_t block,
                                     int64_t e0, int64_t e1, float *dst, pl_dtype round_to) {
    for (int64_t i = e0; i < e1; i++) {
        float v = pl_nf4_decode(codes, i, absmax[i / block]);
        if (round_to == PL_BF16)
            v = pl_bf16_rne(v);
        else if (round_to == PL_F16)
            v = pl_f16_rne(v);
        dst[i - e0] = v;
    }
}

/* pl_nf4_block_absmax for a kernel: every tensor a kernel is handed is
 * addressable (the CPU's, or a device backend running these kernels on
 * memory it opened for the call, as the strict device does), so the
 * quantization state is read straight from memory, no copy (a copy there
 * would be a device-to-host read per matmul on such a device). The op
 * (ops_nf4.c) checked the state before the call; this checks it again, as
 * a kernel reached another way would need. */
static pl_status nf4_block_absmax_direct(const pl_tensor *q, float *out) {
    int64_t nb = pl_nf4_num_blocks(q);
    const pl_tensor *a = q->quant.absmax;
    if (q->quant.block <= 0 || !a || pl_tensor_numel(a) != nb ||
        !(a->dtype == PL_F32 || (a->dtype == PL_U8 && q->quant.absmax_scale &&
                                 pl_tensor_numel(q->quant.absmax_scale) ==
                                     (nb + PL_NF4_DQ_BLOCK - 1) / PL_NF4_DQ_BLOCK))) {
        char buf[256];
        return pl_error_set(PL_ERR_INVALID,
                            "nf4 kernel: tensor %s has no valid quantization state (block %lld, "
                            "absmax %s for %lld blocks)",
                            pl_tensor_describe(q, buf, sizeof buf), (long long)q->quant.block,
                            a ? pl_dtype_name(a->dtype) : "missing", (long long)nb);
    }
    if (a->dtype == PL_F32) {
        memcpy(out, pl_tensor_data(a), (size_t)nb * sizeof(float));
        return PL_OK;
    }
    const float *map = pl_nf4_dynamic_map();
    const uint8_t *c = pl_tensor_data(a);
    const float *sc = pl_tensor_data(q->quant.absmax_scale);
    float mean = q->quant.absmax_mean;
    for (int64_t b = 0; b < nb; b++)
        out[b] = pl_nf4_dq_absmax(map[c[b]], sc[b / PL_NF4_DQ_BLOCK], mean);
    return PL_OK;
}

#define PANEL_FLOATS (1 << 18) /* 1 MiB of dequantized weights per panel */

typedef struct scratch {
    void *p;
    size_t cap;
} scratch;

static float *scratch_get(scratch *s, size_t nbytes) {
    s->p = pl_alloc(PL_CPU, nbytes ? nbytes : 4, &s->cap);
    return s->p;
}
static void scratch_put(scratch *s) {
    if (s->p) pl_free(PL_CPU, s->p, s->cap);
    s->p = NULL;
}

/* Widen n elements of a float buffer to f32. */
static void widen(const void *src, pl_dtype dt, float *dst, int64_t n) {
    if (dt == PL_BF16) {
        const uint16_t *s = src;
#pragma omp parallel for if (n > 65536) schedule(static)
        for (int64_t i = 0; i < n; i++) dst[i] = pl_bf16_widen(s[i]);
    } else if (dt == PL_F16) {
        const uint16_t *s = src;
#pragma omp parallel for if (n > 65536) schedule(static)
        for (int64_t i = 0; i < n; i++) dst[i] = pl_f16_widen(s[i]);
    } else {
        memcpy(dst, src, (size_t)n * sizeof(float));
    }
}

static void narrow(const float *src, pl_dtype dt, void *dst, int64_t n) {
    uint16_t *d = dst;
    if (dt == PL_BF16) {
#pragma omp parallel for if (n > 65536) schedule(static)
        for (int64_t i = 0; i < n; i++) d[i] = pl_bf16_round(src[i]);
    } else {
#pragma omp parallel for if (n > 65536) schedule(static)
        for (int64_t i = 0; i < n; i++) d[i] = pl_f16_round(src[i]);
    }
}

/* Rows [r0, r1) of W dequantized into panel [r1-r0, K]. */
static void dequant_rows(const pl_tensor *w, const float *absmax, int64_t r0, int64_t r1,
                         float *panel, pl_dtype round_to) {
    int64_t K = w->shape[1];
    const uint8_t *codes = pl_tensor_data(w);
#pragma omp parallel for if ((r1 - r0) * K > 65536) schedule(static)
    for (int64_t r = r0; r < r1; r++)
        pl_nf4_dequant_range_cpu(codes, absmax, w->quant.block, r * K, (r + 1) * K,
                                 panel + (r - r0) * K, round_to);
}

static int64_t panel_rows(int64_t N, int64_t K) {
    int64_t r = PANEL_FLOATS / (K > 0 ? K : 1);
    if (r < 1) r = 1;
    return r < N ? r : N;
}

static pl_status nf4_matmul_fwd(const pl_kernel_args *a) {
    const pl_tensor *x = a->in[0], *w = a->in[1];
    pl_tensor *y = a->out[0];
    int64_t N = w->shape[0], K = w->shape[1];
    int64_t M = K ? pl_tensor_numel(x) / K : 0;
    pl_dtype xd = x->dtype;
    int64_t nb = pl_nf4_num_blocks(w), pr = panel_rows(N, K);
    scratch s_am = {0}, s_x = {0}, s_y = {0}, s_p = {0};
    pl_status st = PL_OK;
    float *am = scratch_get(&s_am, (size_t)nb * sizeof(float));
    float *panel = scratch_get(&s_p, (size_t)(pr * K) * sizeof(float));
    const float *X = xd == PL_F32 ? pl_tensor_data(x) : scratch_get(&s_x, (size_t)(M * K) * 4);
    float *Y = xd == PL_F32 ? pl_tensor_data(y) : scratch_get(&s_y, (size_t)(M * N) * 4);
    if (!am || !panel || !X || !Y) {
        st = pl_error_status();
        goto done;
    }
    if ((st = nf4_block_absmax_direct(w, am))) goto done;
    if (xd != PL_F32) widen(pl_tensor_data(x), xd, (float *)X, M * K);
    if (M == 0 || N == 0) goto out;
    if (K == 0) {
        memset(Y, 0, (size_t)(M * N) * sizeof(float));
        goto out;
    }
    for (int64_t r0 = 0; r0 < N; r0 += pr) {
        int64_t r1 = r0 + pr < N ? r0 + pr : N;
        dequant_rows(w, am, r0, r1, panel, xd);
        pl_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)M, (int)(r1 - r0), (int)K, 1.0f,
                    X, (int)K, panel, (int)K, 0.0f, Y + r0, (int)N);
    }
out:
    if (xd != PL_F32) narrow(Y, xd, pl_tensor_data(y), M * N);
done:
    scratch_put(&s_am);
    scratch_put(&s_p);
    scratch_put(&s_x);
    scratch_put(&s_y);
    return st;
}

static pl_status nf4_matmul_bwd(const pl_kernel_args *a) {
    const pl_tensor *dy = a->in[0], *x = a->in[1], *w = a->in[2];
    pl_tensor *dx = a->out[0];
    if (a->out[1])
        return pl_error_set(PL_ERR_INVALID, "nf4_matmul: weight '%s' is frozen and gets no gradient",
                            w->name);
    if (!dx) return PL_OK;
    int64_t N = w->shape[0], K = w->shape[1];
    int64_t M = K ? pl_tensor_numel(x) / K : 0;
    int64_t nb = pl_nf4_num_blocks(w), pr = panel_rows(N, K);
    float *DX = pl_tensor_data(dx);
    const float *DY = pl_tensor_data(dy);
    if (M == 0 || K == 0) return PL_OK;
    if (N == 0) {
        memset(DX, 0, (size_t)(M * K) * sizeof(float));
        return PL_OK;
    }
    scratch s_am = {0}, s_p = {0};
    float *am = scratch_get(&s_am, (size_t)nb * sizeof(float));
    float *panel = scratch_get(&s_p, (size_t)(pr * K) * sizeof(float));
    pl_status st = !am || !panel ? pl_error_status() : nf4_block_absmax_direct(w, am);
    for (int64_t r0 = 0; !st && r0 < N; r0 += pr) {
        int64_t r1 = r0 + pr < N ? r0 + pr : N;
        dequant_rows(w, am, r0, r1, panel, x->dtype);
        pl_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)M, (int)K, (int)(r1 - r0),
                    1.0f, DY + r0, (int)N, panel, (int)K, r0 == 0 ? 0.0f : 1.0f, DX, (int)K);
    }
    scratch_put(&s_am);
    scratch_put(&s_p);
    return st;
}

/* ---- nf4_quantize ------------------------------------------------------------------ */

static float load_f32(const void *p, pl_dtype dt, int64_t i) {
    switch (dt) {
    case PL_BF16: return pl_bf16_widen(((const uint16_t *)p)[i]);
    case PL_F16: return pl_f16_widen(((const uint16_t *)p)[i]);
    default: return ((const float *)p)[i];
    }
}

/* in[0] w (f32/bf16/f16, contiguous); out[0] the codes (nf4 tensor of w's
 * shape, its bytes written whole), out[1] absmax f32 [blocks], out[2] i64
 * {non-finite values, the first one's flat index}; p.start = block. Nothing
 * is encoded when a value is not finite (the caller refuses the tensor). */
static pl_status nf4_quantize_fwd(const pl_kernel_args *a) {
    const pl_tensor *w = a->in[0];
    int64_t n = pl_tensor_numel(w), block = a->p.start;
    if (block <= 0)
        return pl_error_set(PL_ERR_INVALID, "nf4_quantize: block size %lld of '%s' must be > 0",
                            (long long)block, w->name);
    int64_t nb = (n + block - 1) / block;
    const void *x = pl_tensor_data(w);
    uint8_t *codes = pl_tensor_data(a->out[0]);
    float *absmax = pl_tensor_data(a->out[1]);
    int64_t *bad = pl_tensor_data(a->out[2]);
    bad[0] = 0;
    bad[1] = -1;
    for (int64_t i = 0; i < n; i++) {
        float v = load_f32(x, w->dtype, i);
        if (!isfinite(v) && bad[0]++ == 0) bad[1] = i;
    }
    if (bad[0]) return PL_OK;
    memset(codes, 0, (size_t)((n + 1) / 2));
    /* blocks of even size never share a byte; odd sizes do, so those run
     * serially to keep the nibble writes race-free */
    int par = (block % 2 == 0) && n > 65536;
#pragma omp parallel for if (par) schedule(static)
    for (int64_t b = 0; b < nb; b++) {
        int64_t i0 = b * block, i1 = i0 + block < n ? i0 + block : n;
        float m = 0.0f;
        for (int64_t i = i0; i < i1; i++) m = pl_nf4_absmax_step(m, load_f32(x, w->dtype, i));
        absmax[b] = m;
        float inv = pl_nf4_inv_absmax(m);
        for (int64_t i = i0; i < i1; i++) {
            uint8_t c = pl_nf4_encode(load_f32(x, w->dtype, i) * inv);
            if (i & 1)
                codes[i >> 1] = (uint8_t)((codes[i >> 1] & 0x0f) | (c << 4));
            else
                codes[i >> 1] = (uint8_t)((codes[i >> 1] & 0xf0) | c);
        }
    }
    return PL_OK;
}

void pl_cpu_register_nf4(pl_kernel_table *b) {
    b->forward[PL_OP_NF4_MATMUL] = nf4_matmul_fwd;
    b->backward[PL_OP_NF4_MATMUL] = nf4_matmul_bwd;
    b->forward[PL_OP_NF4_QUANTIZE] = nf4_quantize_fwd;
}
