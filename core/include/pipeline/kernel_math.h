/* kernel_math.h - the per-element math of the op kernels, written once for
 * every backend.
 *
 * The CPU kernels (plugins/backends/cpu) and a device backend (the CUDA plugin)
 * differ in how they walk memory: OpenMP loops over rows on the CPU, grid-
 * stride loops and block reductions on a GPU. What they compute per element
 * must not differ: an activation and its derivative, a softmax or loss term,
 * a normalization step, a dropout keep decision, an NF4 decode, a bf16 / f16
 * rounding. Those formulas live here, and only here; a kernel reads its
 * operands, calls the function and stores the result.
 *
 * Every function is `static inline` and marked PL_HD: under nvcc it is
 * `__host__ __device__`, so the same text compiles as C11 (gcc) for the CPU
 * backend and as C++17 device code (nvcc) for the CUDA one. Rules that keep
 * it so:
 *   - float math through the C functions both libm and CUDA's device library
 *     have (expf, tanhf, erff, logf, sqrtf, log, sqrt, fabs, roundf,
 *     copysignf); a sum the CPU does in double is done in double here too;
 *   - no data outside the functions: a table (the 16 NF4 codes) is a
 *     function-local `static const` array, which gcc puts in .rodata and
 *     nvcc in read-only global memory (a plain local array would be rebuilt
 *     in per-thread local memory on every call on the GPU);
 *   - no allocation, no error path, no function pointers (the CPU's OpenMP
 *     loops inline and vectorize these like the expression they replace).
 * The numerics are the CPU backend's, bit for bit (its test suite is the
 * oracle); each function names the source of its formula.
 *
 * Dtypes: f32 in and out unless a function says otherwise. "g" is the
 * incoming gradient of an element; a function named *_grad returns
 * g * d(f)/dx (the product in the order written there, which fixes the
 * rounding).
 *
 * backend_util.h includes this header (PL_HD is defined here, once); it adds
 * the geometry that reads tensor headers (broadcast, batched matmul, the
 * RoPE table) and the kernel table.
 */
#ifndef PIPELINE_KERNEL_MATH_H
#define PIPELINE_KERNEL_MATH_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "pipeline/backend.h" /* pl_op: the op-indexed dispatchers at the end */

#ifdef __CUDACC__
#include <cuda_fp16.h>
#define PL_HD __host__ __device__
#else
#define PL_HD
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ==== float bits, bf16 / f16 ================================================ */

/* The bits of an f32 and back (no conversion). */
PL_HD static inline uint32_t pl_f32_bits(float f) {
#ifdef __CUDA_ARCH__
    return __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
#endif
}
PL_HD static inline float pl_f32_from_bits(uint32_t u) {
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, 4);
    return f;
#endif
}

/* f32 -> bf16 bits, round to nearest even; a NaN stays a (quiet) NaN. The
 * rounding of PyTorch's c10::BFloat16 (round_to_nearest_even) and of CUDA's
 * __float2bfloat16_rn. pl_f32_to_bf16 (tensor.h) is this function. */
PL_HD static inline uint16_t pl_bf16_round(float f) {
    uint32_t u = pl_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);                                          /* RNE */
    return (uint16_t)(u >> 16);
}
/* bf16 bits -> f32 (exact). pl_bf16_to_f32 (tensor.h) is this function. */
PL_HD static inline float pl_bf16_widen(uint16_t h) {
    return pl_f32_from_bits((uint32_t)h << 16);
}

/* f32 -> IEEE binary16 bits, round to nearest even (overflow to inf, NaN
 * stays NaN), and f16 bits -> f32 (exact): the hardware conversions, GCC's
 * _Float16 on the host (F16C's VCVTPS2PH with -march=native), cuda_fp16's
 * __float2half_rn / __half2float under nvcc (host and device). pl_f32_to_f16
 * / pl_f16_to_f32 (tensor.h) are these functions. clang before 15 has no
 * _Float16 on x86 but the same IEEE conversions through its storage type
 * __fp16 (the fuzz build, fuzz/, uses Debian's clang 14). */
#if defined(__clang__) && !defined(__CUDACC__) && __clang_major__ < 15
#define PL_HOST_F16 __fp16
#else
#define PL_HOST_F16 _Float16
#endif
PL_HD static inline uint16_t pl_f16_round(float f) {
#ifdef __CUDACC__
    return __half_as_ushort(__float2half_rn(f));
#else
    __extension__ PL_HOST_F16 h = (PL_HOST_F16)f; /* __extension__: no -pedantic warning */
    uint16_t u;
    memcpy(&u, &h, 2);
    return u;
#endif
}
PL_HD static inline float pl_f16_widen(uint16_t h) {
#ifdef __CUDACC__
    return __half2float(__ushort_as_half(h));
#else
    __extension__ PL_HOST_F16 v;
    memcpy(&v, &h, 2);
    return (float)v;
#endif
}

/* v rounded to bf16 / f16 precision and widened back: what an f32 value
 * becomes when stored in that dtype (NF4 dequantization into a half compute
 * dtype). */
PL_HD static inline float pl_bf16_rne(float v) {
    return pl_bf16_widen(pl_bf16_round(v));
}
PL_HD static inline float pl_f16_rne(float v) {
    return pl_f16_widen(pl_f16_round(v));
}

/* ==== Philox4x32-10 and the dropout stream ====================================
 * Salmon, Moraes, Dror, Shaw, "Parallel random numbers: as easy as 1, 2, 3"
 * (SC'11); constants from the paper / Random123. Counter (4 x u32) + key
 * (2 x u32) -> 4 random u32. */

#define PL_PHILOX_M0 0xD2511F53u /* round multipliers */
#define PL_PHILOX_M1 0xCD9E8D57u
#define PL_PHILOX_W0 0x9E3779B9u /* key increments (Weyl sequence) */
#define PL_PHILOX_W1 0xBB67AE85u

/* One Philox4x32 round on the counter words (a, b, c, d) with key (k0, k1).
 * Shared by pl_philox4x32_10 and the CPU's 16-lane variant (internal.h). */
PL_HD static inline void pl_philox_round(uint32_t *a, uint32_t *b, uint32_t *c, uint32_t *d,
                                         uint32_t k0, uint32_t k1) {
    uint64_t p0 = (uint64_t)PL_PHILOX_M0 * *a, p1 = (uint64_t)PL_PHILOX_M1 * *c;
    uint32_t na = (uint32_t)(p1 >> 32) ^ *b ^ k0, nc = (uint32_t)(p0 >> 32) ^ *d ^ k1;
    *b = (uint32_t)p1;
    *d = (uint32_t)p0;
    *a = na;
    *c = nc;
}

/* Philox4x32-10: ten rounds, the key bumped by (W0, W1) after each. */
PL_HD static inline void pl_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2],
                                          uint32_t out[4]) {
    uint32_t a = ctr[0], b = ctr[1], c = ctr[2], d = ctr[3];
    uint32_t k0 = key[0], k1 = key[1];
    for (int r = 0; r < 10; r++) {
        pl_philox_round(&a, &b, &c, &d, k0, k1);
        k0 += PL_PHILOX_W0;
        k1 += PL_PHILOX_W1;
    }
    out[0] = a;
    out[1] = b;
    out[2] = c;
    out[3] = d;
}

/* A random u32 to [0, 1) with 24 bits (x >> 8) / 2^24, exact in f32. */
PL_HD static inline float pl_philox_u01(uint32_t x) {
    return (float)(x >> 8) * (1.0f / 16777216.0f);
}

/* Dropout (PL_OP_DROPOUT, p.alpha = drop probability p, p.seed, p.counter):
 * element i of the flattened input is kept iff
 *   pl_philox_u01(philox({g lo, g hi, counter lo, counter hi},
 *                        {seed lo, seed hi})[i % 4]) >= p,   g = i / 4,
 * and a kept element is scaled by 1 / (1 - p) (inverted dropout, as
 * torch.nn.functional.dropout). Every backend draws the same mask for the
 * same (seed, counter). */

/* The four words of group g (elements 4g .. 4g+3). */
PL_HD static inline void pl_dropout_draw(uint64_t g, uint64_t seed, uint64_t counter,
                                         uint32_t out[4]) {
    const uint32_t ctr[4] = {(uint32_t)g, (uint32_t)(g >> 32), (uint32_t)counter,
                             (uint32_t)(counter >> 32)};
    const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    pl_philox4x32_10(ctr, key, out);
}
/* Parameter initialization (pl_tensor_uniform_ / pl_tensor_normal_ in
 * tensor.c; a backend's fill_random): group g, elements 4g .. 4g+3, draws
 * the four words philox({g lo, g hi, stream lo, stream hi}, {seed lo, seed hi})
 * (pl_dropout_draw's scheme with the stream as counter). Uniform on [a, b):
 * v_k = a + (b - a) u01(r_k). Normal N(a, b^2): Box-Muller on the pairs
 * (r0, r1), (r2, r3) in double, u1 = ((r >> 8) + 1) / 16777217 (never 0),
 * u2 = (r' >> 8) / 16777216, rad = sqrt(-2 log u1), v = a + b rad cos(2 pi u2)
 * and a + b rad sin(2 pi u2). Each value is rounded to f32 once. A device
 * draws the same values up to its double log / sqrt / sin / cos (CUDA's are
 * within 2 ulp of glibc's in double, so a rare f32 value differs by 1 ulp). */
PL_HD static inline void pl_init_draw(uint64_t g, uint64_t seed, uint64_t stream, int normal,
                                      double a, double b, float v[4]) {
    uint32_t r[4];
    pl_dropout_draw(g, seed, stream, r);
    if (normal) {
        const double two_pi = 6.283185307179586476925286766559;
        for (int k = 0; k < 4; k += 2) {
            double u1 = ((r[k] >> 8) + 1.0) / 16777217.0, u2 = (r[k + 1] >> 8) / 16777216.0;
            double rad = sqrt(-2.0 * log(u1));
            v[k] = (float)(a + b * rad * cos(two_pi * u2));
            v[k + 1] = (float)(a + b * rad * sin(two_pi * u2));
        }
    } else {
        for (int k = 0; k < 4; k++) v[k] = (float)(a + (b - a) * pl_philox_u01(r[k]));
    }
}

/* Whether the element drawing word r survives drop probability p. */
PL_HD static inline bool pl_dropout_keep(uint32_t r, float p) {
    return pl_philox_u01(r) >= p;
}
/* The scale of kept elements, 1 / (1 - p) rounded once to f32; 0 for p >= 1
 * (everything dropped). */
PL_HD static inline float pl_dropout_scale(double p) {
    return p < 1.0 ? (float)(1.0 / (1.0 - p)) : 0.0f;
}
/* Forward y = keep ? x * scale : 0; backward the same on the gradient. */
PL_HD static inline float pl_dropout_apply(float x, bool keep, float scale) {
    return keep ? x * scale : 0.0f;
}

/* ==== RoPE ======================================================================
 * Rotate-half convention of Hugging Face Llama (LlamaRotaryEmbedding +
 * apply_rotary_pos_emb), with its arithmetic: x is [B, T, H, Dh], Dh even,
 * half = Dh / 2,
 *   inv_freq[i] = 1 / theta^(2i / Dh)   in f32
 *   angle       = f32(pos) * inv_freq   in f32
 *   cos, sin    of the f32 angle, computed in double, rounded to f32
 *   y[i]        = x[i] cos - x[i + half] sin      (i < half)
 *   y[i + half] = x[i + half] cos + x[i] sin
 * Backward applies the transposed rotation: the same with sin negated. The
 * cos/sin table is built on the host by pl_rope_cos_sin (backend_util.h). */

/* inv_freq of pair i of a head of 2 * half dims, theta = rope base. */
PL_HD static inline float pl_rope_inv_freq(double theta, int64_t i, int64_t half) {
    return 1.0f / powf((float)theta, (float)(2 * i) / (float)(2 * half));
}
/* The angle of position pos for a pair with inverse frequency inv. */
PL_HD static inline float pl_rope_angle(int64_t pos, float inv) {
    return (float)pos * inv;
}
/* One rotation pair (x1 = x[i], x2 = x[i + half]); s is already negated for
 * backward. */
PL_HD static inline void pl_rope_rotate(float x1, float x2, float c, float s, float *y1,
                                        float *y2) {
    *y1 = x1 * c - x2 * s;
    *y2 = x2 * c + x1 * s;
}

/* ==== exponentials =================================================================== */

/* e^x = 2^k (1 + p), p = expm1(r), x = k ln2 + r, |r| <= ln2/2, for
 * x in [-87, 0] (callers clamp): Cody-Waite reduction with ln2 split in a
 * high part exact in float and a low part, then the Taylor polynomial of
 * expm1 to degree 8 (truncation < 3e-9 relative on |r| <= 0.347). Plain
 * arithmetic and a bit cast, so CPU loops over it vectorize (glibc's expm1f
 * does not, and took a tenth of a GAT training step). Max error against
 * double expm1: see test_ops_dense elu_matches_double_expm1. */
PL_HD static inline void pl_exp_parts(float x, float *two_k, float *p) {
    const float ln2_hi = 0.693145752f, ln2_lo = 1.42860677e-6f, inv_ln2 = 1.44269504f;
    float k = rintf(x * inv_ln2); /* nearest, ties to even: one instruction (roundf is a call) */
    float r = (x - k * ln2_hi) - k * ln2_lo;
    float q = 1.0f / 40320;
    q = q * r + 1.0f / 5040;
    q = q * r + 1.0f / 720;
    q = q * r + 1.0f / 120;
    q = q * r + 1.0f / 24;
    q = q * r + 1.0f / 6;
    q = q * r + 0.5f;
    *p = r + r * r * q;
    /* NaN (a NaN loss reaching the LSTM or the cross-entropy): k is NaN, and
     * neither its cast to int nor a shift of the negative int that x86 gives
     * for it is defined; 2^0 instead, p is NaN already. The shift is on
     * unsigned (k + 127 >= 1 for the clamped domain). */
    int32_t ki = k == k ? (int32_t)k : 0;
    *two_k = pl_f32_from_bits((uint32_t)(ki + 127) << 23);
}

/* expm1(x) for x <= 0 (ELU's negative side); x below -87 gives -1, x above
 * 0 (outside the domain: +inf, or a caller's NaN-polluted max) is taken as 0,
 * NaN gives NaN. */
PL_HD static inline float pl_expm1_neg(float x) {
    x = x < -87.0f ? -87.0f : x;
    x = x > 0.0f ? 0.0f : x; /* NaN passes both */
    float t, p;
    pl_exp_parts(x, &t, &p);
    return t * p + (t - 1.0f);
}

/* exp(x) for x <= 0 (ELU's derivative); x below -87 gives e^-87, x above 0
 * is taken as 0 (gives 1), NaN gives NaN. */
PL_HD static inline float pl_exp_neg(float x) {
    x = x < -87.0f ? -87.0f : x;
    x = x > 0.0f ? 0.0f : x; /* NaN passes both */
    float t, p;
    pl_exp_parts(x, &t, &p);
    return t + t * p;
}

/* e^x in f32 within 1 ulp of the exact value over the whole float range:
 * the exp of the f32 cross-entropy (x <= 0 there), where libm's expf, a call
 * per logit, was a tenth of the iLoRA pretraining step. Measured over every
 * float in [-104.5, 88.72] against double exp: at most 0.76 ulp where the
 * result is normal, 0.78 ulp where it is subnormal (glibc's expf: 0.502);
 * it equals expf on 99.5 % of inputs and differs by one ulp elsewhere
 * (test_kernel_math checks the bound and the edges). -inf gives 0, NaN
 * NaN, x above 88.72 inf, results below 2^-126 are subnormal (0 below
 * 2^-150), as expf; with flush-to-zero / denormals-are-zero set in MXCSR
 * both give 0 there and 1 for a subnormal x (checked).
 *
 * Why it is this accurate where pl_exp_neg is not (a few ulps): the rounding
 * of 1 + expm1(r) is what limits a float exp, so that sum is taken in two
 * parts. x = k ln2 + r1 + c with r1 = x - k ln2_hi exact (ln2_hi has 15
 * significant bits, |k| <= 151 has 8) and c = -k ln2_lo; hi = 1 + r1 with
 * its rounding error err recovered exactly (Fast2Sum, 1 >= |r1|); the small
 * terms (err, c, r^2 q(r)) are summed apart and added to hi once. q is the
 * Taylor series of (e^r - 1 - r) / r^2 to r^5 (truncation below 2^-27
 * relative on |r| <= ln2/2). The scale 2^k is applied as two halves, so k
 * from -151 (subnormal results, rounded once by the last product) to 128
 * needs no exponent out of range. Plain arithmetic and bit casts, so loops
 * over it vectorize (8 lanes under AVX2); the bound holds with and without
 * FMA contraction (both measured exhaustively). */
PL_HD static inline float pl_exp_f32(float x) {
    const float ln2_hi = 0.693145752f, ln2_lo = 1.42860677e-6f, inv_ln2 = 1.44269504f;
    x = x < -104.5f ? -104.5f : x; /* e^-104.5 < 2^-150 rounds to 0; NaN passes */
    x = x > 89.0f ? 89.0f : x;     /* e^89 > FLT_MAX: inf */
    float k = rintf(x * inv_ln2);
    float r1 = x - k * ln2_hi; /* exact */
    float c = -k * ln2_lo;
    float r = r1 + c;
    float q = 1.0f / 5040;
    q = q * r + 1.0f / 720;
    q = q * r + 1.0f / 120;
    q = q * r + 1.0f / 24;
    q = q * r + 1.0f / 6;
    q = q * r + 0.5f;
    float hi = 1.0f + r1;
    float err = (1.0f - hi) + r1; /* exact */
    float lo = (r * r) * q + (err + c);
    int32_t ki = k == k ? (int32_t)k : 0; /* NaN: no undefined cast (r is NaN) */
    int32_t k1 = ki >> 1, k2 = ki - k1;
    float t1 = pl_f32_from_bits((uint32_t)(k1 + 127) << 23);
    float t2 = pl_f32_from_bits((uint32_t)(k2 + 127) << 23);
    return ((hi + lo) * t1) * t2;
}

/* tanh through exp (the LSTM's cell): glibc's tanhf goes through expm1f,
 * which took a third of an LSTM step. Odd Taylor series below 0.1 (error
 * term 62x^9/2835 < 3e-11 relative), (1 - e)/(1 + e) with e = exp(-2|x|)
 * above (< 4e-7 relative). Both branches are plain arithmetic (pl_exp_neg,
 * not libm's expf), so a loop over it vectorizes: the branch becomes a
 * select. */
PL_HD static inline float pl_tanh_fast(float x) {
    float ax = fabsf(x), x2 = x * x;
    float small = x * (1.0f + x2 * (-1.0f / 3.0f + x2 * (2.0f / 15.0f + x2 * (-17.0f / 315.0f))));
    float e = pl_exp_neg(-2.0f * ax);
    float big = copysignf((1.0f - e) / (1.0f + e), x);
    return ax < 0.1f ? small : big;
}

/* sigmoid through exp(-|x|) <= 1 (no overflow on either side):
 * 1 / (1 + e) for x >= 0, e / (1 + e) below; pl_exp_neg is plain arithmetic,
 * so a loop over it vectorizes (the LSTM's gates; expf was a sixth of its
 * step). Within a few float ulps of 1 / (1 + expf(-x)). */
PL_HD static inline float pl_sigmoid_fast(float x) {
    float e = pl_exp_neg(-fabsf(x));
    float r = 1.0f / (1.0f + e);
    return x >= 0.0f ? r : e * r;
}

/* ==== activations ==================================================================
 * PyTorch semantics; derivatives as tools/autograd/derivatives.yaml and the
 * aten kernels (aten/src/ATen/native/Activation.cpp, cpu/Activation.cpp)
 * define them. Named pl_math_*: pl_relu and friends are the ops (ops.h). */

#define PL_SQRT_2_OVER_PI 0.7978845608028654f /* sqrt(2 / pi) */
#define PL_INV_SQRT_2 0.7071067811865476f     /* 1 / sqrt(2) */
#define PL_INV_SQRT_2PI 0.3989422804014327f   /* 1 / sqrt(2 pi) */
#define PL_GELU_C 0.044715f                   /* the tanh approximation's cubic term */

/* relu: max(x, 0) (NaN -> 0); derivative threshold_backward(g, result, 0):
 * g where the output y > 0 (the same elements as x > 0; NaN gives 0 both ways). */
PL_HD static inline float pl_math_relu(float x) {
    return x > 0 ? x : 0.0f;
}
PL_HD static inline float pl_math_relu_grad(float g, float y) {
    return y > 0 ? g : 0.0f;
}

/* leaky_relu(x, a) = x > 0 ? x : a x; leaky_relu_backward: g or g a. */
PL_HD static inline float pl_math_leaky_relu(float x, float a) {
    return x > 0 ? x : x * a;
}
PL_HD static inline float pl_math_leaky_relu_grad(float g, float x, float a) {
    return x > 0 ? g : g * a;
}

/* elu(x, a) = x > 0 ? x : a (e^x - 1); elu_backward: g or g a e^x (from x,
 * not from the output). NaN passes through (it fails both comparisons). */
PL_HD static inline float pl_math_elu(float x, float a) {
    float e = a * pl_expm1_neg(x <= 0 ? x : 0.0f);
    return x > 0 ? x : x <= 0 ? e : x;
}
PL_HD static inline float pl_math_elu_grad(float g, float x, float a) {
    float e = g * a * pl_exp_neg(x <= 0 ? x : 0.0f);
    return x > 0 ? g : x <= 0 ? e : x;
}

/* gelu, approximate='none': x Phi(x) = x/2 (1 + erf(x / sqrt 2));
 * gelu_backward: g (Phi(x) + x phi(x)), phi the normal density. */
PL_HD static inline float pl_math_gelu_erf(float x) {
    return 0.5f * x * (1.0f + erff(x * PL_INV_SQRT_2));
}
PL_HD static inline float pl_math_gelu_erf_grad(float g, float x) {
    float cdf = 0.5f * (1.0f + erff(x * PL_INV_SQRT_2));
    float pdf = PL_INV_SQRT_2PI * expf(-0.5f * x * x);
    return g * (cdf + x * pdf);
}

/* gelu, approximate='tanh': x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)));
 * gelu_backward (aten GeluKernel, tanh branch): with t the tanh and u its
 * argument, g (1/2 (1 + t) + x/2 (1 - t^2) du/dx). */
PL_HD static inline float pl_math_gelu_tanh(float x) {
    return 0.5f * x * (1.0f + tanhf(PL_SQRT_2_OVER_PI * (x + PL_GELU_C * x * x * x)));
}
PL_HD static inline float pl_math_gelu_tanh_grad(float g, float x) {
    float x2 = x * x;
    float t = tanhf(PL_SQRT_2_OVER_PI * (x + PL_GELU_C * x2 * x));
    float du = PL_SQRT_2_OVER_PI * (1.0f + 3.0f * PL_GELU_C * x2);
    return g * (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du);
}

/* sigmoid = 1 / (1 + e^-x); sigmoid_backward(g, result): g s (1 - s), s the
 * output. */
PL_HD static inline float pl_math_sigmoid(float x) {
    return 1.0f / (1.0f + expf(-x));
}
PL_HD static inline float pl_math_sigmoid_grad(float g, float s) {
    return g * s * (1.0f - s);
}

/* silu = x sigmoid(x); silu_backward: g s (1 + x (1 - s)). */
PL_HD static inline float pl_math_silu(float x) {
    return x * pl_math_sigmoid(x);
}
PL_HD static inline float pl_math_silu_grad(float g, float x) {
    float s = pl_math_sigmoid(x);
    return g * s * (1.0f + x * (1.0f - s));
}

/* LoRA / MoE-LoRA (ops.h pl_lora_add): v rounded to the compute dtype rt
 * (PL_F32: as it is), and the gated rank slot u = t g rounded to rt, as
 * the unfused pl_mul(t, gexp) -> pl_linear's cast stores it. */
PL_HD static inline float pl_math_rne_to(float v, pl_dtype rt) {
    return rt == PL_BF16 ? pl_bf16_rne(v) : rt == PL_F16 ? pl_f16_rne(v) : v;
}
PL_HD static inline float pl_math_lora_gate(float t, float g, pl_dtype rt) {
    return pl_math_rne_to(t * g, rt);
}

/* SwiGLU: silu(x) u (x the gate, u the up projection), with silu(x)
 * rounded to dtype rt (PL_BF16 / PL_F16; PL_F32: not rounded) as the
 * unfused mul(silu(x), u) stores it for a gate of that dtype. Values and
 * gradients are the unfused chain's, bit for bit: d x = silu_backward(g u, x),
 * d u = g silu(x) (rounded to rt). */
PL_HD static inline float pl_math_swiglu_act(float x, pl_dtype rt) {
    float s = pl_math_silu(x);
    return rt == PL_BF16 ? pl_bf16_rne(s) : rt == PL_F16 ? pl_f16_rne(s) : s;
}
PL_HD static inline float pl_math_swiglu(float x, float u, pl_dtype rt) {
    return pl_math_swiglu_act(x, rt) * u;
}
PL_HD static inline float pl_math_swiglu_grad_gate(float g, float x, float u) {
    return pl_math_silu_grad(g * u, x);
}
PL_HD static inline float pl_math_swiglu_grad_up(float g, float x, pl_dtype rt) {
    return g * pl_math_swiglu_act(x, rt);
}

/* tanh (tanhf); tanh_backward(g, result): g (1 - t^2), t the output. */
PL_HD static inline float pl_math_tanh_grad(float g, float t) {
    return g * (1.0f - t * t);
}

/* exp, log, square, sqrt and their derivatives: g e^x (= g y, y the output:
 * derivatives.yaml's grad * result), g / x, 2 g x, g / (2 sqrt x). */
PL_HD static inline float pl_math_exp_grad(float g, float y) {
    return g * y;
}
PL_HD static inline float pl_math_log_grad(float g, float x) {
    return g / x;
}
PL_HD static inline float pl_math_square(float x) {
    return x * x;
}
PL_HD static inline float pl_math_square_grad(float g, float x) {
    return 2.0f * g * x;
}
PL_HD static inline float pl_math_sqrt_grad(float g, float x) {
    return g / (2.0f * sqrtf(x));
}

/* The unary op `op` (relu .. sqrt of pl_op) at x; alpha = p.alpha (leaky
 * slope, elu alpha), flags = p.flags (gelu: bit0 = tanh approximation). A
 * switch on a constant op folds away after inlining (the CUDA kernels are
 * templated on op); an op that is not unary gives NaN. */
PL_HD static inline float pl_unary_forward(pl_op op, float x, float alpha, int flags) {
    switch (op) {
    case PL_OP_RELU:
        return pl_math_relu(x);
    case PL_OP_LEAKY_RELU:
        return pl_math_leaky_relu(x, alpha);
    case PL_OP_ELU:
        return pl_math_elu(x, alpha);
    case PL_OP_GELU:
        return (flags & 1) ? pl_math_gelu_tanh(x) : pl_math_gelu_erf(x);
    case PL_OP_SILU:
        return pl_math_silu(x);
    case PL_OP_SIGMOID:
        return pl_math_sigmoid(x);
    case PL_OP_TANH:
        return tanhf(x);
    case PL_OP_EXP:
        return expf(x);
    case PL_OP_LOG:
        return logf(x);
    case PL_OP_SQUARE:
        return pl_math_square(x);
    case PL_OP_SQRT:
        return sqrtf(x);
    default:
        return NAN;
    }
}
/* Whether the derivative of unary op `op` is read from its output y rather
 * than its input x (derivatives.yaml's `result`): relu, sigmoid, tanh, exp.
 * The tape keeps y for these (the op saves its output; the input is a stub),
 * and a backward kernel passes y as pl_unary_backward's `v`. elu is not here:
 * elu_backward from the result (a e^x = y + a) is not bit-identical to
 * a e^x from x. */
PL_HD static inline bool pl_unary_grad_reads_output(pl_op op) {
    return op == PL_OP_RELU || op == PL_OP_SIGMOID || op == PL_OP_TANH || op == PL_OP_EXP;
}
/* g * d(op)/dx, from v = the output y where pl_unary_grad_reads_output(op),
 * the input x otherwise, as above. */
PL_HD static inline float pl_unary_backward(pl_op op, float g, float v, float alpha, int flags) {
    switch (op) {
    case PL_OP_RELU:
        return pl_math_relu_grad(g, v);
    case PL_OP_LEAKY_RELU:
        return pl_math_leaky_relu_grad(g, v, alpha);
    case PL_OP_ELU:
        return pl_math_elu_grad(g, v, alpha);
    case PL_OP_GELU:
        return (flags & 1) ? pl_math_gelu_tanh_grad(g, v) : pl_math_gelu_erf_grad(g, v);
    case PL_OP_SILU:
        return pl_math_silu_grad(g, v);
    case PL_OP_SIGMOID:
        return pl_math_sigmoid_grad(g, v);
    case PL_OP_TANH:
        return pl_math_tanh_grad(g, v);
    case PL_OP_EXP:
        return pl_math_exp_grad(g, v);
    case PL_OP_LOG:
        return pl_math_log_grad(g, v);
    case PL_OP_SQUARE:
        return pl_math_square_grad(g, v);
    case PL_OP_SQRT:
        return pl_math_sqrt_grad(g, v);
    default:
        return NAN;
    }
}

/* ==== softmax family ==============================================================
 * softmax(x)_j = e^(x_j - m) / s, m = max_j x_j, s = sum_j e^(x_j - m);
 * log_softmax(x)_j = x_j - (m + log s). The row max and sums are the
 * backend's reduction (s in double on every backend); the pieces per element
 * are these. Backward (aten _softmax_backward_data / _log_softmax_backward_data):
 *   softmax:     gx = y (g - sum(g y))
 *   log_softmax: gx = g - e^y sum(g)            (y the log-softmax) */

/* Running max: NaN entries are skipped (m stays), as fmaxf. */
PL_HD static inline float pl_max_step(float m, float x) {
    return x > m ? x : m;
}
/* e^(x - m): a softmax numerator (and the summand of s). */
PL_HD static inline float pl_softmax_exp(float x, float m) {
    return expf(x - m);
}
/* The same numerator for bf16 logits (cross-entropy under autocast):
 * pl_exp_neg instead of libm's expf (x <= m), within a few f32 ulps of it
 * (< 1e-6 relative) and vectorizable, where expf is a call per element.
 * The inputs carry 8 significant bits, so the difference is 2^15 times
 * below their own rounding. f32 logits take pl_ce_exp (within 1 ulp). */
PL_HD static inline float pl_softmax_exp_bf16(float x, float m) {
    return pl_exp_neg(x - m);
}
/* log-sum-exp of a row for log_softmax, m + log s rounded to f32. */
PL_HD static inline float pl_log_softmax_lse(float m, double s) {
    return m + (float)log(s);
}
/* 1 / s rounded once to f32: softmax multiplies every numerator by it. */
PL_HD static inline float pl_softmax_inv(double s) {
    return (float)(1.0 / s);
}
/* softmax backward at one element: y (g - dot), dot = sum(g y) of the row
 * (causal_softmax passes y scaled by its score scale). */
PL_HD static inline float pl_softmax_grad(float y, float g, float dot) {
    return y * (g - dot);
}
/* log_softmax backward at one element: g - e^logy sum_g. Both read the
 * saved output y (derivatives.yaml's `result`), never x. */
PL_HD static inline float pl_log_softmax_grad(float g, float logy, float sum_g) {
    return g - expf(logy) * sum_g;
}

/* ==== cross entropy with label smoothing ============================================
 * PyTorch F.cross_entropy(logits [N, C], target [N], ignore_index,
 * label_smoothing eps, reduction='mean') (aten cross_entropy_loss_label_smoothing):
 *   loss = ((1 - eps) sum_valid(l_i - x[i, t_i]) + eps/C sum_valid(C l_i - sum_c x[i, c]))
 *          / n_valid,     l_i = m_i + log sum_c e^(x[i, c] - m_i)  (in double)
 *   gx[i, c] = g / n_valid (softmax[i, c] - (1 - eps) [c == t_i] - eps / C)
 * for rows whose target is not ignore_index, 0 for the others. */

/* e^(x - m) of an f32 logit: the summand of the row's s (in double) and,
 * with m = lse, the softmax of backward. pl_exp_f32, within 1 ulp of the
 * exact value (libm's expf: 0.5), and 8 lanes at a time where expf is a call
 * per logit; the loss and the gradient move at the level of f32 rounding
 * (the f32 sum of 9,067 of them already rounds more). */
PL_HD static inline float pl_ce_exp(float x, float m) {
    return pl_exp_f32(x - m);
}
/* l_i in double (the row's lse, saved as f32 for backward). */
PL_HD static inline double pl_ce_lse(float m, double s) {
    return m + log(s);
}
/* Row i's terms: nll = l - x[t]; smoothing = C l - sum_c x[i, c]. */
PL_HD static inline double pl_ce_row_nll(double lse, float x_target) {
    return lse - x_target;
}
PL_HD static inline double pl_ce_row_smooth(double lse, int64_t C, double sum_x) {
    return (double)C * lse - sum_x;
}
/* The mean loss from the sums over valid rows. */
PL_HD static inline double pl_ce_loss(double nll, double smooth, double eps, int64_t C,
                                      double n_valid) {
    /* without smoothing the term is absent, not 0 * smooth: a -inf logit
     * (a masked class) makes smooth infinite, and 0 * inf would be NaN */
    double sm = eps > 0 ? eps / (double)C * smooth : 0.0;
    return ((1.0 - eps) * nll + sm) / n_valid;
}
/* The smoothing share eps / C subtracted from every class. */
PL_HD static inline float pl_ce_smooth_off(float eps, int64_t C) {
    return eps / (float)C;
}
/* gx[i, c] before the target correction: scale (e^(x - lse) - off),
 * scale = g / n_valid. */
PL_HD static inline float pl_ce_grad(float x, float lse, float scale, float off) {
    return scale * (pl_ce_exp(x, lse) - off);
}
/* pl_ce_grad for bf16 logits: pl_exp_neg (x <= lse), as pl_softmax_exp_bf16. */
PL_HD static inline float pl_ce_grad_bf16(float x, float lse, float scale, float off) {
    return scale * (pl_exp_neg(x - lse) - off);
}
/* What gx[i, t_i] further loses: scale (1 - eps). */
PL_HD static inline float pl_ce_target_grad(float scale, float eps) {
    return scale * (1.0f - eps);
}

/* ==== mse / mae / huber (reduction='mean') ============================================
 * Per element d = pred - target (in double for the loss, f32 for the
 * gradient); the loss is the mean of the terms, the gradient of pred is
 * g / n times the derivative (target gets its negation). Huber as
 * F.huber_loss: |d| < delta ? d^2 / 2 : delta (|d| - delta / 2); derivative
 * d clamped to [-delta, delta] (aten huber_backward). mae's derivative is
 * sign(d) (0 at 0). */
PL_HD static inline double pl_loss_term(pl_op op, double d, double delta) {
    if (op == PL_OP_MSE) return d * d;
    if (op == PL_OP_MAE) return fabs(d);
    return fabs(d) < delta ? 0.5 * d * d : delta * (fabs(d) - 0.5 * delta); /* PL_OP_HUBER */
}
PL_HD static inline float pl_loss_grad(pl_op op, float d, float delta) {
    if (op == PL_OP_MSE) return 2.0f * d;
    if (op == PL_OP_MAE) return (float)((d > 0) - (d < 0));
    return d < -delta ? -delta : (d > delta ? delta : d); /* PL_OP_HUBER */
}

/* ==== layer_norm / rms_norm (last dim, D elements a row) =================================
 * layer_norm (aten native_layer_norm): mu = mean x (double), var = mean
 * (x - mu)^2 (double, biased), rstd = 1 / sqrt(var + eps) rounded to f32;
 * y = (x - mu) rstd [* w] [+ b]. rms_norm (torch.nn.RMSNorm): rstd =
 * 1 / sqrt(mean x^2 + eps); y = x rstd [* w].
 * Backward (native_layer_norm_backward), with gy = g w and xhat = (x - mu) rstd:
 *   layer: gx = rstd (gy - mean(gy) - xhat mean(gy xhat))
 *   rms:   gx = rstd (gy - x rstd mean(gy x rstd))
 *   gw = sum over rows of g xhat, gb = sum over rows of g.
 * The row sums (double) are the backend's reduction. w and b are optional
 * (NULL), indexed by the column j. */

/* rstd from a row's sum of squares ss (of x - mu, or of x for rms). */
PL_HD static inline float pl_norm_rstd(double ss, int64_t D, double eps) {
    return (float)(1.0 / sqrt(ss / (double)D + eps));
}
/* (x - mu)^2 in double: layer_norm's variance summand. */
PL_HD static inline double pl_layer_norm_sqdev(float x, double mu) {
    return (x - mu) * (x - mu);
}
/* xhat = (x - mu) rstd in f32. */
PL_HD static inline float pl_norm_xhat(float x, float mu, float rstd) {
    return (x - mu) * rstd;
}
/* layer_norm output at column j. */
PL_HD static inline float pl_layer_norm_y(float x, float mu, float rstd, const float *w,
                                          const float *b, int64_t j) {
    float v = pl_norm_xhat(x, mu, rstd);
    if (w) v *= w[j];
    if (b) v += b[j];
    return v;
}
/* rms_norm output at column j. */
PL_HD static inline float pl_rms_norm_y(float x, float rstd, const float *w, int64_t j) {
    return w ? x * rstd * w[j] : x * rstd;
}
/* gy = g w[j] (g without a weight). */
PL_HD static inline float pl_norm_gy(float g, const float *w, int64_t j) {
    return w ? g * w[j] : g;
}
/* layer_norm: the gx of one element from the row means m1 = mean(gy),
 * m2 = mean(gy xhat). */
PL_HD static inline float pl_layer_norm_gx(float gy, float xhat, float rstd, float m1, float m2) {
    return rstd * (gy - m1 - xhat * m2);
}
/* rms_norm: the summand of sum(gy x rstd) (in double, also gw's summand with
 * gy = g), and the gx of one element from m2 = that sum / D. */
PL_HD static inline double pl_rms_norm_dot(float gy, float x, float rstd) {
    return (double)gy * x * rstd;
}
PL_HD static inline float pl_rms_norm_gx(float gy, float x, float rstd, float m2) {
    return rstd * (gy - x * rstd * m2);
}

/* ==== NF4 (QLoRA; bitsandbytes csrc/kernels.cu) =========================================
 * Dettmers et al. 2023 (arXiv:2305.14314); nf4.h has the storage layout.
 * Packing: element 2j in the low nibble of byte j, 2j+1 in the high one. */

/* The 16 NF4 code values, ascending: bitsandbytes' nf4_data / dDequantizeNF4
 * constants, exactly. The one copy: pl_nf4_code and pl_nf4_code_table()
 * (nf4.h) both expand it. */
#define PL_NF4_CODE_VALUES                                                                         \
    -1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f,                      \
        -0.28444138169288635f, -0.18477343022823334f, -0.09105003625154495f, 0.0f,                 \
        0.07958029955625534f, 0.16093020141124725f, 0.24611230194568634f, 0.33791524171829224f,    \
        0.44070982933044434f, 0.5626170039176941f, 0.7229568362236023f, 1.0f

/* The code value of 4-bit index c (0..15; higher bits ignored). */
PL_HD static inline float pl_nf4_code(unsigned c) {
    static const float codes[16] = {PL_NF4_CODE_VALUES};
    return codes[c & 15u];
}

/* The 4-bit index of element i of a packed code buffer. */
PL_HD static inline unsigned pl_nf4_nibble(const uint8_t *codes, int64_t i) {
    uint8_t byte = codes[i >> 1];
    return (i & 1) ? (unsigned)(byte >> 4) : (unsigned)(byte & 0x0f);
}

/* Dequantized element i: code * absmax of its block. */
PL_HD static inline float pl_nf4_decode(const uint8_t *codes, int64_t i, float absmax) {
    return pl_nf4_code(pl_nf4_nibble(codes, i)) * absmax;
}

/* The index of the NF4 code nearest to a normalized x in [-1, 1]:
 * bitsandbytes dQuantizeNF4's decision tree over the midpoints of
 * consecutive codes (ties to the lower code; NaN -> 0).
 * pl_nf4_quantize_value (nf4.h) is this function. */
PL_HD static inline uint8_t pl_nf4_encode(float x) {
    if (x > 0.03979014977812767f) {
        if (x > 0.3893125355243683f) {
            if (x > 0.6427869200706482f) return x > 0.8614784181118011f ? 15 : 14;
            return x > 0.5016634166240692f ? 13 : 12;
        }
        if (x > 0.2035212516784668f) return x > 0.2920137718319893f ? 11 : 10;
        return x > 0.1202552504837513f ? 9 : 8;
    }
    if (x > -0.33967943489551544f) {
        if (x > -0.13791173323988914f) return x > -0.045525018125772476f ? 7 : 6;
        return x > -0.23460740596055984f ? 5 : 4;
    }
    if (x > -0.6106329262256622f) return x > -0.4599952697753906f ? 3 : 2;
    return x > -0.8480964004993439f ? 1 : 0;
}

/* The factor a block's values are scaled by before pl_nf4_encode: 1 / absmax
 * (0 for an all-zero block, whose codes are then all the code of 0). */
PL_HD static inline float pl_nf4_inv_absmax(float absmax) {
    return absmax > 0.0f ? 1.0f / absmax : 0.0f;
}
/* One step of a block's absmax: max(m, |x|) skipping NaN, as fabsf(x) > m. */
PL_HD static inline float pl_nf4_absmax_step(float m, float x) {
    float a = fabsf(x);
    return a > m ? a : m;
}

/* Double quantization decode (QLoRA section 3; bitsandbytes
 * dequantize_blockwise of the absmax): absmax[b] = dyn[q8[b]] * scale[b / 256]
 * + mean, with map_value = dyn[q8[b]] (pl_nf4_dynamic_map, nf4.h). */
PL_HD static inline float pl_nf4_dq_absmax(float map_value, float scale, float mean) {
    return map_value * scale + mean;
}

/* ==== LSTM cell (PyTorch nn.LSTM, gate order i, f, g, o) ===================================
 * Forward from the pre-activations a = x W_ih^T + h W_hh^T + b:
 *   i = sig(a_i), f = sig(a_f), g = tanh(a_g), o = sig(a_o)
 *   c = f c_prev + i g,   h = o tanh(c)
 * Backward from dh (dy + dh of the next step) and dc_next:
 *   dc = dh o (1 - tanh^2 c) + dc_next
 *   da_i = dc g i (1 - i), da_f = dc c_prev f (1 - f), da_g = dc i (1 - g^2),
 *   da_o = dh tanh(c) o (1 - o),   dc_prev = dc f.
 * tanh is pl_tanh_fast on every backend. */
PL_HD static inline void pl_lstm_cell(float ai, float af, float ag, float ao, float c_prev,
                                      float *i, float *f, float *g, float *o, float *c, float *h) {
    float ig = pl_sigmoid_fast(ai), fg = pl_sigmoid_fast(af);
    float gg = pl_tanh_fast(ag), og = pl_sigmoid_fast(ao);
    float cc = fg * c_prev + ig * gg;
    *i = ig;
    *f = fg;
    *g = gg;
    *o = og;
    *c = cc;
    *h = og * pl_tanh_fast(cc);
}
PL_HD static inline void pl_lstm_cell_grad(float i, float f, float g, float o, float c,
                                           float c_prev, float dh, float dc_next, float *dai,
                                           float *daf, float *dag, float *dao, float *dc_prev) {
    float tc = pl_tanh_fast(c);
    float dc = dh * o * (1.0f - tc * tc) + dc_next;
    *dai = dc * g * i * (1.0f - i);
    *daf = dc * c_prev * f * (1.0f - f);
    *dag = dc * i * (1.0f - g * g);
    *dao = dh * tc * o * (1.0f - o);
    *dc_prev = dc * f;
}

/* ==== topk order (ops.h pl_topk; torch.topk's) ============================ */

/* Does element (va, ia) rank before (vb, ib) in pl_topk's total order:
 * larger first, equal values (-0 == +0) by lower index, NaN above every
 * number and NaNs among themselves by lower index. Strict: never both ways. */
PL_HD static inline bool pl_topk_before(float va, int64_t ia, float vb, int64_t ib) {
    bool na = va != va, nb = vb != vb;
    if (na || nb) return na && (!nb || ia < ib);
    return va > vb || (va == vb && ia < ib);
}

/* PL_TOPK_SELECT_DEFINE(NAME, IDX) defines
 *   static void NAME(const float *s, int64_t n, int64_t k, float *v, IDX *id)
 * the k (1 <= k <= n) entries of s [n] that rank first in pl_topk_before's
 * order, written to v / id best first: a min-heap of the first k on that
 * order, each later entry that ranks before its root replaces the root, then
 * a heap sort. The order is total, so the result does not depend on the scan;
 * O(n log k). One definition for every index type a caller stores (the CPU's
 * topk kernel: int64_t; ilora's host ranking: int32_t). Host code only. */
#define PL_TOPK_SELECT_DEFINE(NAME, IDX)                                                          \
    static void NAME##_sift(float *v, IDX *id, int64_t k, int64_t i) {                          \
        for (;;) {                                                                             \
            int64_t l = 2 * i + 1, r = l + 1, w = i;                                           \
            if (l < k && pl_topk_before(v[w], id[w], v[l], id[l])) w = l;                      \
            if (r < k && pl_topk_before(v[w], id[w], v[r], id[r])) w = r;                      \
            if (w == i) return;                                                                \
            float tv = v[i];                                                                   \
            v[i] = v[w];                                                                       \
            v[w] = tv;                                                                         \
            IDX ti = id[i];                                                                    \
            id[i] = id[w];                                                                     \
            id[w] = ti;                                                                        \
            i = w;                                                                             \
        }                                                                                      \
    }                                                                                          \
    static void NAME(const float *s, int64_t n, int64_t k, float *v, IDX *id) {                \
        for (int64_t j = 0; j < k; j++) {                                                      \
            v[j] = s[j];                                                                       \
            id[j] = (IDX)j;                                                                    \
        }                                                                                      \
        for (int64_t i = k / 2 - 1; i >= 0; i--) NAME##_sift(v, id, k, i);                     \
        for (int64_t j = k; j < n; j++)                                                        \
            if (pl_topk_before(s[j], j, v[0], id[0])) {                                        \
                v[0] = s[j];                                                                   \
                id[0] = (IDX)j;                                                                \
                NAME##_sift(v, id, k, 0);                                                      \
            }                                                                                  \
        for (int64_t m = k - 1; m > 0; m--) { /* the last-ranked to the end */                 \
            float tv = v[0];                                                                   \
            v[0] = v[m];                                                                       \
            v[m] = tv;                                                                         \
            IDX ti = id[0];                                                                    \
            id[0] = id[m];                                                                     \
            id[m] = ti;                                                                        \
            NAME##_sift(v, id, m, 0);                                                          \
        }                                                                                      \
    }

#ifdef __cplusplus
}
#endif
#endif
