/* ops_nf4.c - NF4 quantization (nf4.h) and the differentiable op
 * pl_nf4_matmul (ops.h). Kernels live in the CPU backend plugin's
 * kernels_nf4.c (plugins/backends/cpu).
 *
 * Quantization runs on the CPU (a CUDA source is staged through host
 * memory and the result copied back); it happens once per parameter at
 * precision setup, never in the training step.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "pipeline/nf4.h"

/* ---- code tables ------------------------------------------------------------ */

/* The code values and the quantizer's decision tree are kernel_math.h's
 * (pl_nf4_code, pl_nf4_encode), shared with every backend; this table is
 * the public one of pl_nf4_code_table(), expanded from the same list. */
static const float k_nf4[16] = {PL_NF4_CODE_VALUES};

const float *pl_nf4_code_table(void) { return k_nf4; }

uint8_t pl_nf4_quantize_value(float x) { return pl_nf4_encode(x); }

static float g_dyn[256];
static int g_dyn_ready;

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* bitsandbytes create_dynamic_map(signed=True, max_exponent_bits=7,
 * total_bits=8): for exponent i = 0..6, the 2^i midpoints of
 * linspace(0.1, 1, 2^i + 1) scaled by 10^(i-6), both signs; plus 0 and 1. */
static void build_dynamic_map(void) {
    float data[256];
    int n = 0;
    for (int i = 0; i < 7; i++) {
        int items = (1 << i) + 1;
        float scale = (float)pow(10.0, -6 + i);
        for (int j = 0; j + 1 < items; j++) {
            float b0 = 0.1f + (float)j * (0.9f / (float)(items - 1));
            float b1 = 0.1f + (float)(j + 1) * (0.9f / (float)(items - 1));
            float mean = (b0 + b1) / 2.0f;
            data[n++] = scale * mean;
            data[n++] = -scale * mean;
        }
    }
    data[n++] = 0.0f;
    data[n++] = 1.0f;
    qsort(data, (size_t)n, sizeof(float), cmp_float);
    memcpy(g_dyn, data, sizeof g_dyn);
}

const float *pl_nf4_dynamic_map(void) {
    if (!__atomic_load_n(&g_dyn_ready, __ATOMIC_ACQUIRE)) {
        build_dynamic_map(); /* idempotent: racing threads write the same values */
        __atomic_store_n(&g_dyn_ready, 1, __ATOMIC_RELEASE);
    }
    return g_dyn;
}

/* Index of the dynamic-map entry nearest to x (ties: lower index). */
static uint8_t dyn_nearest(const float *map, float x) {
    int lo = 0, hi = 255;
    if (!(x > map[0])) return 0;
    if (x >= map[255]) return 255;
    while (hi - lo > 1) { /* map[lo] < x <= map[hi] */
        int mid = (lo + hi) / 2;
        if (map[mid] < x)
            lo = mid;
        else
            hi = mid;
    }
    return (uint8_t)(x - map[lo] <= map[hi] - x ? lo : hi);
}

/* ---- helpers ------------------------------------------------------------------ */

/* Host f32 contiguous copy of any float tensor (owned, not in a frame). */

/* Host copy of t in dtype dt (owned, not in a frame). */
static pl_tensor *host_owned(const pl_tensor *t, pl_dtype dt) {
    pl_frame_begin();
    pl_tensor *h = pl_tensor_to(t, dt, PL_CPU);
    if (h) pl_frame_keep(h);
    pl_frame_end();
    return h;
}

static pl_tensor *host_f32(const pl_tensor *w) {
    return host_owned(w, PL_F32);
}

/* Copy of a host tensor onto `dev` (owned). */
static pl_tensor *to_device_owned(pl_tensor *h, pl_device dev) {
    if (pl_device_eq(dev, PL_CPU)) return pl_tensor_retain(h);
    pl_tensor *d = pl_tensor_new_owned(h->dtype, h->ndim, h->shape, dev);
    if (!d) return NULL;
    if (pl_tensor_copy_(d, h)) {
        pl_tensor_release(d);
        return NULL;
    }
    return d;
}

int64_t pl_nf4_num_blocks(const pl_tensor *q) {
    if (!q || q->quant.block <= 0) return 0;
    return (pl_tensor_numel(q) + q->quant.block - 1) / q->quant.block;
}

static pl_status check_nf4(const char *what, const pl_tensor *q) {
    char buf[256];
    if (!q) return pl_error_set(PL_ERR_INVALID, "%s: NULL tensor", what);
    if (q->dtype != PL_NF4)
        return pl_error_set(PL_ERR_DTYPE, "%s: tensor %s is not nf4", what,
                            pl_tensor_describe(q, buf, sizeof buf));
    int64_t nb = pl_nf4_num_blocks(q);
    const pl_tensor *a = q->quant.absmax;
    if (q->quant.block <= 0 || !a || pl_tensor_numel(a) != nb ||
        !(a->dtype == PL_F32 || (a->dtype == PL_U8 && q->quant.absmax_scale)))
        return pl_error_set(PL_ERR_INVALID, "%s: nf4 tensor %s has no valid quantization state "
                            "(block %lld, absmax %s for %lld blocks)", what,
                            pl_tensor_describe(q, buf, sizeof buf), (long long)q->quant.block,
                            a ? pl_dtype_name(a->dtype) : "missing", (long long)nb);
    if (a->dtype == PL_U8 &&
        pl_tensor_numel(q->quant.absmax_scale) != (nb + PL_NF4_DQ_BLOCK - 1) / PL_NF4_DQ_BLOCK)
        return pl_error_set(PL_ERR_INVALID, "%s: nf4 tensor %s: absmax_scale has %lld entries, "
                            "expected %lld", what, pl_tensor_describe(q, buf, sizeof buf),
                            (long long)pl_tensor_numel(q->quant.absmax_scale),
                            (long long)((nb + PL_NF4_DQ_BLOCK - 1) / PL_NF4_DQ_BLOCK));
    if (!pl_tensor_is_contiguous(q) || q->offset != 0)
        return pl_error_set(PL_ERR_INVALID, "%s: nf4 tensor %s must be contiguous", what,
                            pl_tensor_describe(q, buf, sizeof buf));
    return PL_OK;
}

/* Double quantization of nb absmax constants: q8[nb], scale[ceil(nb/256)],
 * returns the mean. */
static float double_quantize(const float *absmax, int64_t nb, uint8_t *q8, float *scale) {
    const float *map = pl_nf4_dynamic_map();
    double s = 0;
    for (int64_t b = 0; b < nb; b++) s += absmax[b];
    float mean = nb ? (float)(s / (double)nb) : 0.0f;
    int64_t ng = (nb + PL_NF4_DQ_BLOCK - 1) / PL_NF4_DQ_BLOCK;
    for (int64_t g = 0; g < ng; g++) {
        int64_t b0 = g * PL_NF4_DQ_BLOCK, b1 = b0 + PL_NF4_DQ_BLOCK < nb ? b0 + PL_NF4_DQ_BLOCK : nb;
        float m = 0.0f;
        for (int64_t b = b0; b < b1; b++) {
            float a = fabsf(absmax[b] - mean);
            if (a > m) m = a;
        }
        scale[g] = m;
        float inv = m > 0.0f ? 1.0f / m : 0.0f;
        for (int64_t b = b0; b < b1; b++) q8[b] = dyn_nearest(map, (absmax[b] - mean) * inv);
    }
    return mean;
}

/* Fill q (nf4, on w's device) from w (f32/bf16/f16, contiguous, w's
 * numel); q->quant.* already sized. The block absmax and the codes come
 * from the NF4_QUANTIZE kernel of w's device (a GPU quantizes on the GPU);
 * the double quantization of the absmax (QLoRA section 3) runs on the host:
 * one f32 per block of 64 values crosses, not the weight.
 * Non-finite values are refused (PL_ERR_NUMERIC naming `name`): the block
 * absmax (fabsf(x) > m) skips a NaN, so the NaN would become an ordinary
 * code of its block and vanish; an Inf would make its whole block NaN. */
static pl_status fill_q(pl_tensor *q, const pl_tensor *w, const char *name) {
    int64_t n = pl_tensor_numel(q), nb = pl_nf4_num_blocks(q);
    bool dq = q->quant.absmax_scale != NULL;
    int64_t ng = (nb + PL_NF4_DQ_BLOCK - 1) / PL_NF4_DQ_BLOCK;
    pl_device dev = q->device;
    pl_tensor *wc = pl_tensor_is_contiguous(w) ? pl_tensor_retain((pl_tensor *)w)
                                               : pl_contiguous_owned((pl_tensor *)w);
    /* q is left unchanged on error: the absmax goes to a temporary first */
    pl_tensor *am = pl_tensor_new_owned(PL_F32, 1, &nb, dev);
    pl_tensor *bad = pl_tensor_new_owned(PL_I64, 1, (int64_t[]){2}, dev);
    pl_tensor *hb = NULL, *ha = NULL, *h8 = NULL, *hs = NULL;
    pl_status st = !wc || !am || !bad ? (pl_error_status() ? pl_error_status() : PL_ERR_NOMEM)
                                      : PL_OK;
    if (!st) {
        pl_kernel_args k = {.op = PL_OP_NF4_QUANTIZE, .n_in = 1, .n_out = 3};
        k.p.start = q->quant.block;
        k.in[0] = wc;
        k.out[0] = q;
        k.out[1] = am;
        k.out[2] = bad;
        st = pl_kernel_forward(&k);
    }
    if (!st && !(hb = host_owned(bad, PL_I64))) st = pl_error_status();
    if (!st) {
        const int64_t *b = pl_tensor_data(hb);
        if (b[0]) {
            pl_tensor *h = host_f32(wc); /* the error path only: the value named */
            double v = h && b[1] >= 0 && b[1] < n ? ((const float *)pl_tensor_data(h))[b[1]] : NAN;
            pl_tensor_release(h);
            st = pl_error_set(PL_ERR_NUMERIC, "nf4 quantization of '%s': %lld non-finite values "
                              "of %lld (first at flat index %lld: %g); NF4 codes hold finite "
                              "weights only", name && *name ? name : "(unnamed tensor)",
                              (long long)b[0], (long long)n, (long long)b[1], v);
        }
    }
    if (!st && dq) {
        ha = host_owned(am, PL_F32);
        h8 = pl_tensor_new_owned(PL_U8, 1, &nb, PL_CPU);
        hs = pl_tensor_new_owned(PL_F32, 1, &ng, PL_CPU);
        if (!ha || !h8 || !hs) st = pl_error_status() ? pl_error_status() : PL_ERR_NOMEM;
        if (!st) {
            q->quant.absmax_mean =
                double_quantize(pl_tensor_data(ha), nb, pl_tensor_data(h8), pl_tensor_data(hs));
            st = pl_tensor_copy_(q->quant.absmax, h8);
            if (!st) st = pl_tensor_copy_(q->quant.absmax_scale, hs);
        }
    } else if (!st) {
        q->quant.absmax_mean = 0.0f;
        st = pl_tensor_copy_(q->quant.absmax, am);
    }
    pl_tensor_release(wc);
    pl_tensor_release(am);
    pl_tensor_release(bad);
    pl_tensor_release(hb);
    pl_tensor_release(ha);
    pl_tensor_release(h8);
    pl_tensor_release(hs);
    return st;
}

/* ---- public quantize / dequantize ------------------------------------------------- */

pl_tensor *pl_nf4_quantize(const pl_tensor *w, int64_t block, bool double_quant) {
    char buf[256];
    if (!w) return NULL;
    if (!(w->dtype == PL_F32 || w->dtype == PL_BF16 || w->dtype == PL_F16)) {
        pl_error_set(PL_ERR_DTYPE, "nf4_quantize: tensor %s has dtype %s; expected f32, bf16 or f16",
                     pl_tensor_describe(w, buf, sizeof buf), pl_dtype_name(w->dtype));
        return NULL;
    }
    if (block <= 0) {
        pl_error_set(PL_ERR_INVALID, "nf4_quantize: block size %lld for %s must be > 0",
                     (long long)block, pl_tensor_describe(w, buf, sizeof buf));
        return NULL;
    }
    int64_t n = pl_tensor_numel(w), nb = (n + block - 1) / block;
    int64_t ng = (nb + PL_NF4_DQ_BLOCK - 1) / PL_NF4_DQ_BLOCK;
    pl_tensor *q = pl_tensor_new_owned(PL_NF4, w->ndim, w->shape, w->device);
    if (!q) return NULL;
    q->quant.block = block;
    q->quant.orig_dtype = w->dtype;
    q->quant.absmax = pl_tensor_new_owned(double_quant ? PL_U8 : PL_F32, 1, &nb, w->device);
    if (double_quant) q->quant.absmax_scale = pl_tensor_new_owned(PL_F32, 1, &ng, w->device);
    if (!q->quant.absmax || (double_quant && !q->quant.absmax_scale) || fill_q(q, w, w->name)) {
        pl_tensor_release(q);
        return NULL;
    }
    pl_tensor_set_name(q, "%s", w->name);
    pl_tensor_set_name(q->quant.absmax, "%s.absmax", w->name);
    if (q->quant.absmax_scale) pl_tensor_set_name(q->quant.absmax_scale, "%s.absmax_scale", w->name);
    return q;
}

pl_status pl_nf4_quantize_into(pl_tensor *q, const pl_tensor *w) {
    char b1[256], b2[256];
    pl_status st = check_nf4("nf4_quantize_into", q);
    if (st) return st;
    if (!w || !(w->dtype == PL_F32 || w->dtype == PL_BF16 || w->dtype == PL_F16) ||
        pl_tensor_numel(w) != pl_tensor_numel(q))
        return pl_error_set(PL_ERR_SHAPE, "nf4_quantize_into: source %s must be a float tensor with "
                            "the %lld elements of %s", w ? pl_tensor_describe(w, b1, sizeof b1) : "NULL",
                            (long long)pl_tensor_numel(q), pl_tensor_describe(q, b2, sizeof b2));
    if (pl_device_eq(w->device, q->device)) return fill_q(q, w, w->name[0] ? w->name : q->name);
    /* e.g. a file's host tensor into a parameter on the GPU: quantized there */
    pl_frame_begin();
    pl_tensor *wd = pl_tensor_to(w, w->dtype, q->device);
    if (wd) pl_frame_keep(wd);
    pl_frame_end();
    if (!wd) return pl_error_status();
    pl_tensor_set_name(wd, "%s", w->name);
    st = fill_q(q, wd, w->name[0] ? w->name : q->name);
    pl_tensor_release(wd);
    return st;
}

pl_status pl_nf4_block_absmax(const pl_tensor *q, float *out) {
    pl_status st = check_nf4("nf4_block_absmax", q);
    if (st) return st;
    int64_t nb = pl_nf4_num_blocks(q);
    pl_tensor *a = q->quant.absmax;
    if (a->dtype == PL_F32) {
        if (a->device.type == PL_DEVICE_CPU) {
            memcpy(out, pl_tensor_data(a), (size_t)nb * sizeof(float));
            return PL_OK;
        }
        pl_tensor *h = host_f32(a);
        if (!h) return pl_error_status();
        memcpy(out, pl_tensor_data(h), (size_t)nb * sizeof(float));
        pl_tensor_release(h);
        return PL_OK;
    }
    /* double quantized: u8 codes into the dynamic map, f32 group scale */
    pl_tensor *c8 = a->device.type == PL_DEVICE_CPU ? pl_tensor_retain(a) : NULL;
    if (!c8) {
        c8 = pl_tensor_new_owned(PL_U8, 1, &nb, PL_CPU);
        if (!c8 || pl_tensor_copy_(c8, a)) {
            pl_tensor_release(c8);
            return pl_error_status();
        }
    }
    pl_tensor *sc = host_f32(q->quant.absmax_scale);
    if (!sc) {
        pl_tensor_release(c8);
        return pl_error_status();
    }
    const float *map = pl_nf4_dynamic_map();
    const uint8_t *c = pl_tensor_data(c8);
    const float *s = pl_tensor_data(sc);
    float mean = q->quant.absmax_mean;
    for (int64_t b = 0; b < nb; b++)
        out[b] = pl_nf4_dq_absmax(map[c[b]], s[b / PL_NF4_DQ_BLOCK], mean);
    pl_tensor_release(c8);
    pl_tensor_release(sc);
    return PL_OK;
}

/* Dequantize elements [e0, e1) of a CPU nf4 code buffer into dst[0..e1-e0)
 * as f32 (rounded to `round_to` precision when bf16/f16). The CPU backend's
 * kernels_nf4.c has its twin (a plugin: it calls no core internals). */
static void pl_nf4_dequant_range_cpu(
    const uint8_t *codes, const float *absmax, int64_t block, int64_t e0, int64_t e1, float *dst,
    pl_dtype round_to) {
    for (int64_t i = e0; i < e1; i++) {
        float v = pl_nf4_decode(codes, i, absmax[i / block]);
        if (round_to == PL_BF16)
            v = pl_bf16_rne(v);
        else if (round_to == PL_F16)
            v = pl_f16_rne(v);
        dst[i - e0] = v;
    }
}

pl_tensor *pl_nf4_dequantize(const pl_tensor *q, pl_dtype dt) {
    if (!q) return NULL;
    if (check_nf4("nf4_dequantize", q)) return NULL;
    if (!(dt == PL_F32 || dt == PL_BF16 || dt == PL_F16)) {
        pl_error_set(PL_ERR_DTYPE, "nf4_dequantize: target dtype %s is not f32, bf16 or f16",
                     pl_dtype_name(dt));
        return NULL;
    }
    int64_t n = pl_tensor_numel(q), nb = pl_nf4_num_blocks(q);
    float *am = malloc((size_t)(nb ? nb : 1) * sizeof(float));
    pl_tensor *hc = NULL, *hf = NULL, *ho = NULL, *out = NULL;
    if (!am) {
        pl_error_set(PL_ERR_NOMEM, "nf4_dequantize: out of memory");
        return NULL;
    }
    if (pl_nf4_block_absmax(q, am)) goto done;
    hc = q->device.type == PL_DEVICE_CPU ? pl_tensor_retain((pl_tensor *)q)
                                         : pl_tensor_new_owned(PL_NF4, q->ndim, q->shape, PL_CPU);
    if (!hc || (hc != q && pl_tensor_copy_(hc, q))) goto done;
    hf = pl_tensor_new_owned(PL_F32, q->ndim, q->shape, PL_CPU);
    if (!hf) goto done;
    {
        const uint8_t *codes = pl_tensor_data(hc);
        float *d = pl_tensor_data(hf);
        int64_t block = q->quant.block, chunk = 1 << 16;
#pragma omp parallel for if (n > 65536) schedule(static)
        for (int64_t e0 = 0; e0 < n; e0 += chunk) {
            int64_t e1 = e0 + chunk < n ? e0 + chunk : n;
            pl_nf4_dequant_range_cpu(codes, am, block, e0, e1, d + e0, PL_F32);
        }
    }
    ho = dt == PL_F32 ? pl_tensor_retain(hf) : pl_tensor_new_owned(dt, q->ndim, q->shape, PL_CPU);
    if (!ho || (ho != hf && pl_tensor_copy_(ho, hf))) goto done;
    out = to_device_owned(ho, q->device);
    if (out) pl_tensor_set_name(out, "%s.dequant", q->name);
done:
    free(am);
    pl_tensor_release(hc);
    pl_tensor_release(hf);
    pl_tensor_release(ho);
    return out;
}

/* ---- the op ---------------------------------------------------------------------------- */

pl_tensor *pl_nf4_matmul(pl_tensor *x, pl_tensor *w) {
    char bx[256], bw[256];
    if (!x || !w) return NULL;
    if (w->dtype != PL_NF4) {
        pl_error_set(PL_ERR_DTYPE, "nf4_matmul: weight %s must be nf4 (quantize it with "
                     "pl_nf4_quantize or a quantizing precision stage)", pl_tensor_describe(w, bw, sizeof bw));
        return NULL;
    }
    if (check_nf4("nf4_matmul", w) || pl_check_ndim("nf4_matmul", w, 2, 2) ||
        pl_check_float("nf4_matmul", x, true) || pl_check_ndim("nf4_matmul", x, 1, PL_MAX_DIMS))
        return NULL;
    pl_tensor *ts[2] = {x, w};
    if (pl_check_same_device("nf4_matmul", ts, 2)) return NULL;
    int64_t N = w->shape[0], K = w->shape[1];
    if (x->shape[x->ndim - 1] != K) {
        pl_error_set(PL_ERR_SHAPE, "nf4_matmul: x %s has %lld input features, weight %s expects %lld",
                     pl_tensor_describe(x, bx, sizeof bx), (long long)x->shape[x->ndim - 1],
                     pl_tensor_describe(w, bw, sizeof bw), (long long)K);
        return NULL;
    }
    if (w->requires_grad) {
        pl_error_set(PL_ERR_INVALID, "nf4_matmul: weight %s requires grad; nf4 weights are frozen",
                     pl_tensor_describe(w, bw, sizeof bw));
        return NULL;
    }
    pl_dtype ac = pl_autocast_get();
    if ((ac == PL_BF16 || ac == PL_F16) && x->dtype != ac) {
        pl_frame_begin();
        pl_tensor *r = pl_nf4_matmul(pl_cast(x, ac), w);
        if (r) pl_frame_keep(r);
        pl_frame_end();
        return r ? pl_op_result(r) : NULL;
    }
    int64_t shape[PL_MAX_DIMS];
    memcpy(shape, x->shape, sizeof(int64_t) * (size_t)x->ndim);
    shape[x->ndim - 1] = N;
    pl_kernel_args k = {.op = PL_OP_NF4_MATMUL, .n_in = 2, .n_out = 1};
    k.p.dtype = x->dtype;
    k.in[0] = pl_contiguous_owned(x);
    k.in[1] = pl_tensor_retain(w);
    k.out[0] = pl_tensor_new_owned(x->dtype, x->ndim, shape, x->device);
    pl_status s = !k.in[0] || !k.out[0] ? pl_error_status() : PL_OK;
    if (!s) s = pl_kernel_forward(&k);
    if (!s) s = pl_autograd_record(PL_OP_NF4_MATMUL, &k.p, k.in, 2, NULL, 0, k.out[0]);
    pl_tensor_release(k.in[0]);
    pl_tensor_release(k.in[1]);
    if (s) {
        pl_tensor_release(k.out[0]);
        return NULL;
    }
    return pl_op_result(k.out[0]);
}
