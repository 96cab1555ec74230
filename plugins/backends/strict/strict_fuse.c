/* strict_fuse.c - the strict device's fusion pass over a captured step
 * (pl_backend.capture_end_step; backend.h, "Seeing the step").
 *
 * First family, the one every shipped config's step has: the gradient norm's
 * sum of squares, pl_sum(pl_square(grad)) per parameter with a gradient
 * (core/run/step_values.c): square writes an intermediate as large as the
 * gradient that only the sum reads. Fused, one kernel reads the gradient
 * once and writes the sum, the intermediate is never written (it is dead:
 * its block is released by the end of the step and nothing after the sum
 * reads it before writing it), and the step has one kernel call less per
 * parameter. When the sum is added to the norm's running total right after
 * (total = total + ssq, every parameter but the first) and is dead after
 * that add, the add joins too: one call instead of three. The fused kernel computes the same bits
 * as the CPU's two: each square rounded to f32 (pl_math_square), then summed in double in the same
 * OpenMP loop as the CPU's full sum (kernels_dense.c, k_sum_fwd: same
 * threshold, same split), then rounded to f32 once.
 *
 * Second family, in the models' forward: pl_linear with a bias
 * (ops_dense.c), a matmul into y [.., N] then the add of a bias row b [N]
 * broadcast over y's rows. When y is dead after the add (only the add reads
 * it; its block released by the step's end), one kernel runs the CPU's
 * matmul kernel with the add's output as its output and adds b to it in
 * place, a GEMM with a bias epilogue: y is never written. Same bits: the
 * same GEMM (same kernel, same operands, same shapes) writes the same f32
 * values, and the add kernel's f32 broadcast case is one f32 addition per
 * element (kernels_dense.c, k_binary_fwd), done here in the add's operand
 * order. f32 only (operands, bias, both outputs): a half matmul or bias
 * takes the widened paths (strict.c, run_widened; autocast's casts), left
 * unfused.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "pipeline/backend_util.h"
#include "pipeline/kernel_math.h"
#include "pipeline/optim_math.h"
#include "strict_internal.h"

#define CPU_PAR_MIN 32768 /* the CPU kernels' PAR_MIN (kernels_dense_common.h) */

/* The sum of the squares of x (f32, contiguous), as square then sum give it. */
static float sum_squares(const pl_tensor *x) {
    const float *X = pl_tensor_data(x);
    int64_t n = pl_tensor_numel(x);
    double s = 0;
#pragma omp parallel for reduction(+ : s) if (n > CPU_PAR_MIN)
    for (int64_t i = 0; i < n; i++) {
        float q = pl_math_square(X[i]); /* the square kernel's f32 value */
        s += q;
    }
    return (float)(s * 1.0);
}

/* in[0]: x; out[0]: the sum of x's squares (f32, 1 element). */
static pl_status k_sum_squares(const pl_kernel_args *a) {
    ((float *)pl_tensor_data(a->out[0]))[0] = sum_squares(a->in[0]);
    return PL_OK;
}

/* in[0]: x; in[1]: a running total t (f32, 1 element); out[0] = t + the sum
 * of x's squares, the add's operands in the add's order (p.flags bit0: the
 * sum was the add's first operand), as the add kernel rounds it. */
static pl_status k_sum_squares_add(const pl_kernel_args *a) {
    float s = sum_squares(a->in[0]), t = ((const float *)pl_tensor_data(a->in[1]))[0];
    ((float *)pl_tensor_data(a->out[0]))[0] = (a->p.flags & 1) ? s + t : t + s;
    return PL_OK;
}

/* in[0], in[1]: the matmul's operands (p.flags: its transposes, as
 * PL_OP_MATMUL's); in[2]: the bias b (f32 [N]); out[0]: the add's output
 * (f32 [.., N], contiguous) = A @ B + b, as the matmul then the add give it
 * (p.start: y was the add's first operand). */
static pl_status k_matmul_bias(const pl_kernel_args *a) {
    pl_kernel_fn mm = pl_backend_kernel(pl_backend_cpu(), PL_OP_MATMUL, false);
    if (!mm)
        return pl_error_set(PL_ERR_UNSUPPORTED,
                            "strict device: no CPU matmul kernel for matmul+bias");
    pl_kernel_args m = *a;
    m.op = PL_OP_MATMUL;
    m.n_in = 2;
    m.in[2] = NULL;
    m.p.start = 0;
    pl_status s = mm(&m);
    if (s) return s;
    float *O = pl_tensor_data(a->out[0]);
    const float *B = pl_tensor_data(a->in[2]);
    int64_t N = pl_tensor_numel(a->in[2]), R = N ? pl_tensor_numel(a->out[0]) / N : 0;
    bool first = a->p.start != 0;
#pragma omp parallel for if (R * N > CPU_PAR_MIN)
    for (int64_t r = 0; r < R; r++) {
        float *o = O + r * N;
        if (first)
            for (int64_t j = 0; j < N; j++)
                o[j] = o[j] + B[j];
        else
            for (int64_t j = 0; j < N; j++)
                o[j] = B[j] + o[j];
    }
    return PL_OK;
}

static bool f32_contig(const pl_tensor *t) {
    return t && !pl_tensor_is_stub(t) && t->dtype == PL_F32 && pl_tensor_is_contiguous(t);
}

/* The bytes a tensor's elements span (over-estimated for a strided view:
 * used for reads only, where more is safe). 0 for a stub or NULL. */
static void span(const pl_tensor *t, uintptr_t *lo, uintptr_t *hi) {
    *lo = *hi = 0;
    if (!t || pl_tensor_is_stub(t) || !t->storage || pl_tensor_numel(t) == 0) return;
    *lo = (uintptr_t)pl_tensor_data(t);
    if (pl_tensor_is_contiguous(t)) {
        *hi = *lo + pl_tensor_nbytes(t);
        return;
    }
    int64_t e = 1;
    for (int d = 0; d < t->ndim; d++)
        e += (t->shape[d] - 1) * (t->stride[d] < 0 ? -t->stride[d] : t->stride[d]);
    size_t el = pl_dtype_size(t->dtype);
    *hi = *lo + (uintptr_t)e * (el ? el : 1); /* nf4: 1 byte per element, more than enough */
}

static bool overlaps(const pl_tensor *t, uintptr_t lo, uintptr_t hi) {
    uintptr_t a, b;
    span(t, &a, &b);
    bool o = a < b && a < hi && lo < b;
    if (!o && t && t->dtype == PL_NF4)
        o = overlaps(t->quant.absmax, lo, hi) || overlaps(t->quant.absmax_scale, lo, hi);
    return o;
}

/* 1: call r reads a byte of [lo, hi); 0: it does not (what it writes is
 * its outputs, a copy's destination, a memset). */
static bool reads(const rec *r, uintptr_t lo, uintptr_t hi) {
    if (r->kind == REC_COPY) return (uintptr_t)r->src < hi && lo < (uintptr_t)r->src + r->n;
    if (r->kind != REC_KERNEL && r->kind != REC_FUSED) return false;
    const pl_kernel_args *a = &r->a;
    for (int i = 0; i < a->n_in; i++)
        if (overlaps(a->in[i], lo, hi)) return true;
    if (a->p.extra && pl_op_has_multi_list(a->op)) {
        const pl_optim_multi *m = a->p.extra; /* updated in place: read */
        for (int i = 0; i < m->n; i++) {
            if (overlaps(m->param[i], lo, hi) || overlaps(m->grad[i], lo, hi)) return true;
            for (int k = 0; k < 3; k++)
                if (overlaps(m->state[k][i], lo, hi)) return true;
            if (pl_optim_multi_counted(a->op) && overlaps(m->count[i], lo, hi)) return true;
        }
    } else if (a->p.extra && overlaps(a->p.extra, lo, hi)) { /* dropout's offset tensor */
        return true;
    }
    return false;
}

/* Whether call r writes every byte of [lo, hi) (a contiguous output, a
 * copy's destination or a memset that covers it). */
static bool covers(const rec *r, uintptr_t lo, uintptr_t hi) {
    if (r->kind == REC_COPY || r->kind == REC_MEMSET)
        return (uintptr_t)r->dst <= lo && hi <= (uintptr_t)r->dst + r->n;
    if (r->kind != REC_KERNEL && r->kind != REC_FUSED) return false;
    for (int i = 0; i < r->a.n_out; i++) {
        const pl_tensor *t = r->a.out[i];
        if (!t || pl_tensor_is_stub(t) || !pl_tensor_is_contiguous(t) || t->dtype == PL_NF4) continue;
        uintptr_t a = (uintptr_t)pl_tensor_data(t), b = a + pl_tensor_nbytes(t);
        if (a <= lo && hi <= b) return true;
    }
    return false;
}

/* backend.h's liveness rule: [lo, hi), written before call `from`, is dead
 * from there on. */
static bool dead(const rec *r, size_t from, size_t n, const pl_step_facts *f, uintptr_t lo,
                 uintptr_t hi) {
    if (!pl_step_released(f, (const void *)lo, hi - lo)) return false;
    for (size_t j = from; j < n; j++) {
        if (reads(&r[j], lo, hi)) return false;
        if (covers(&r[j], lo, hi)) return true;
    }
    return true; /* released: nothing reads it after the step */
}

/* r[i], r[i + 1]: square of a contiguous f32 x, then the sum of all of its
 * squares into one f32. */
static bool square_sum(const rec *r, const rec *q) {
    if (r->kind != REC_KERNEL || q->kind != REC_KERNEL || r->backward || q->backward ||
        r->a.op != PL_OP_SQUARE || q->a.op != PL_OP_SUM || r->a.n_in != 1 || q->a.n_in != 1)
        return false;
    const pl_tensor *x = r->a.in[0], *t = r->a.out[0], *u = q->a.in[0], *o = q->a.out[0];
    if (!f32_contig(x) || !f32_contig(t) || !f32_contig(u) || !f32_contig(o) ||
        pl_tensor_numel(o) != 1 || pl_tensor_numel(x) != pl_tensor_numel(t) ||
        pl_tensor_data(u) != pl_tensor_data(t) || pl_tensor_numel(u) != pl_tensor_numel(t))
        return false;
    int64_t outer, m, inner;
    pl_reduce_split(u, q->a.p.dim, &outer, &m, &inner);
    return outer == 1 && inner == 1;
}

/* r: an add of two one-element f32 tensors into a third, one operand (only
 * one) o's data; *first: whether o is the first. */
static bool add_of(const rec *r, const pl_tensor *o, bool *first) {
    if (r->kind != REC_KERNEL || r->backward || r->a.op != PL_OP_ADD || r->a.n_in != 2) return false;
    const pl_tensor *t[3] = {r->a.in[0], r->a.in[1], r->a.out[0]};
    for (int k = 0; k < 3; k++)
        if (!f32_contig(t[k]) || pl_tensor_numel(t[k]) != 1) return false;
    *first = pl_tensor_data(t[0]) == pl_tensor_data(o);
    return *first != (pl_tensor_data(t[1]) == pl_tensor_data(o));
}

static bool dead_t(const rec *r, size_t from, size_t n, const pl_step_facts *f, const pl_tensor *t) {
    uintptr_t lo = (uintptr_t)pl_tensor_data(t);
    return dead(r, from, n, f, lo, lo + pl_tensor_nbytes(t));
}

static bool same_shape(const pl_tensor *a, const pl_tensor *b) {
    if (a->ndim != b->ndim) return false;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d]) return false;
    return true;
}

/* r, q: a forward matmul of f32 operands into a contiguous f32 y [.., N],
 * then an add of y and a bias row (f32, contiguous, [N]) into a contiguous
 * f32 tensor of y's shape that overlaps none of the matmul's operands, the
 * bias or y (the GEMM writes it directly); *first: y is the add's first
 * operand. */
static bool matmul_bias(const rec *r, const rec *q, bool *first) {
    if (r->kind != REC_KERNEL || q->kind != REC_KERNEL || r->backward || q->backward ||
        r->a.op != PL_OP_MATMUL || q->a.op != PL_OP_ADD || r->a.n_in != 2 || q->a.n_in != 2 ||
        r->a.n_out != 1 || q->a.n_out != 1)
        return false;
    const pl_tensor *x = r->a.in[0], *w = r->a.in[1], *y = r->a.out[0], *o = q->a.out[0];
    if (!f32_contig(x) || !f32_contig(w) || !f32_contig(y) || !f32_contig(o) || y->ndim < 2 ||
        !same_shape(o, y) || pl_tensor_numel(y) == 0)
        return false;
    const pl_tensor *u = q->a.in[0], *v = q->a.in[1];
    *first = f32_contig(u) && pl_tensor_data(u) == pl_tensor_data(y) && same_shape(u, y);
    bool second = f32_contig(v) && pl_tensor_data(v) == pl_tensor_data(y) && same_shape(v, y);
    if (*first == second) return false;
    const pl_tensor *b = *first ? v : u;
    if (!f32_contig(b) || b->ndim != 1 || b->shape[0] != y->shape[y->ndim - 1]) return false;
    uintptr_t lo, hi, ylo, yhi;
    span(o, &lo, &hi);
    span(y, &ylo, &yhi);
    return !overlaps(x, lo, hi) && !overlaps(w, lo, hi) && !overlaps(b, lo, hi) &&
           !overlaps(y, lo, hi) && !overlaps(b, ylo, yhi);
}

int st_fuse_step(rec *r, size_t n, pl_step_facts *facts) {
    int k2 = 0, k3 = 0, kb = 0;
    for (size_t i = 0; i + 1 < n; i++) {
        bool yfirst = false;
        if (matmul_bias(&r[i], &r[i + 1], &yfirst) && dead_t(r, i + 2, n, facts, r[i].a.out[0])) {
            r[i].kind = REC_FUSED;
            r[i].fused = k_matmul_bias;
            r[i].a.n_in = 3;
            r[i].a.in[2] = r[i + 1].a.in[yfirst ? 1 : 0];
            r[i].a.out[0] = r[i + 1].a.out[0];
            r[i].a.p.start = yfirst;
            r[i + 1].kind = REC_NONE;
            kb++;
            i++;
            continue;
        }
        if (!square_sum(&r[i], &r[i + 1]) || !dead_t(r, i + 2, n, facts, r[i].a.out[0])) continue;
        /* the running total of the norm after it: square + sum + add, when
         * the sum is dead after the add */
        bool first = false;
        if (i + 2 < n && add_of(&r[i + 2], r[i + 1].a.out[0], &first) &&
            dead_t(r, i + 3, n, facts, r[i + 1].a.out[0])) {
            r[i].kind = REC_FUSED;
            r[i].fused = k_sum_squares_add;
            r[i].a.op = PL_OP_ADD; /* for messages: the call it ends as */
            r[i].a.n_in = 2;
            r[i].a.in[1] = r[i + 2].a.in[first ? 1 : 0];
            r[i].a.out[0] = r[i + 2].a.out[0];
            r[i].a.p = r[i + 2].a.p;
            r[i].a.p.flags = first;
            r[i + 1].kind = r[i + 2].kind = REC_NONE;
            k3++;
            i += 2;
            continue;
        }
        r[i].kind = REC_FUSED;
        r[i].fused = k_sum_squares;
        r[i].a.op = PL_OP_SUM;
        r[i].a.out[0] = r[i + 1].a.out[0];
        r[i].a.p = r[i + 1].a.p;
        r[i + 1].kind = REC_NONE;
        k2++;
        i++;
    }
    if (facts) {
        facts->n_fused = k2 + k3 + kb;
        char part[3][48] = {"", "", ""};
        if (k2) snprintf(part[0], sizeof part[0], "square+sum x%d", k2);
        if (k3) snprintf(part[1], sizeof part[1], "square+sum+add x%d", k3);
        if (kb) snprintf(part[2], sizeof part[2], "matmul+bias x%d", kb);
        facts->fused[0] = 0;
        size_t len = 0;
        for (int k = 0; k < 3; k++) {
            if (!part[k][0]) continue;
            int w = snprintf(facts->fused + len, sizeof facts->fused - len, "%s%s", len ? ", " : "",
                             part[k]);
            if (w < 0 || (size_t)w >= sizeof facts->fused - len) break;
            len += (size_t)w;
        }
    }
    return k2 + k3 + kb;
}
