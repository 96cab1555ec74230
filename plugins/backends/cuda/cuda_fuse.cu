/* cuda_fuse.cu - the CUDA backend's side of "Seeing the step" (backend.h,
 * pl_backend.capture_end_step): fusion inside a captured training step.
 *
 * One family, as on the strict device (plugins/backends/strict/strict_fuse.c):
 * the gradient norm's square followed by the sum of all of its squares (one
 * pair per parameter with a gradient, every step). While a thread captures
 * (and set_option("fuse", "false") / PL_GRAPH_FUSION=0 have not turned it
 * off), a square of a contiguous f32 tensor is held back until the next
 * call of the thread; when that call is the sum of all of its squares, ONE
 * kernel (cuda_dense.cu, k_sum_squares: the two kernels' bits) is launched
 * for the pair, still storing the squares; anything else issues the square
 * first, in order. A held-back square is issued by the next kernel, copy,
 * memset or the capture's end, so the graph's order is the calls' order.
 *
 * When the capture ends, the core says which blocks the step released
 * (capture_end_step); the squares of a fused node whose bytes are dead by
 * backend.h's liveness rule (inside a released block; no later call of the
 * step reads them before one writes all of them: this file keeps each
 * call's byte ranges while capturing) are not stored: the node's T argument
 * is set to NULL before the graph is instantiated. A fused launch is one
 * node either way, so a step has one launch less per parameter; the store
 * dropped saves the squares' bytes of memory traffic.
 *
 * Compiled here without a GPU; the first GPU session compares
 * PL_GRAPH_FUSION=0 with the default (plugins/backends/cuda/README.md).
 */
#include <atomic>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#include "cuda_common.cuh"
#include "pipeline/optim_math.h"

static std::atomic<bool> g_fuse{true};

pl_status pl_cu_fuse_option(const char *value) {
    if (strcmp(value, "true") && strcmp(value, "false"))
        return pl_error_set(PL_ERR_INVALID, "cuda backend: fuse = '%s' (expected true or false)", value);
    g_fuse = !strcmp(value, "true");
    return PL_OK;
}

/* One byte range a call reads, or writes whole (cover). */
struct cu_range {
    size_t call;
    uintptr_t lo, hi;
    bool cover;
};

/* A fused launch: x, its squares t, the sum o, and the call after it. */
struct cu_fused {
    const void *x, *t, *o;
    size_t bytes, next;
};

/* A square held back: its args, with copies of its two tensors. */
struct cu_pending {
    bool on;
    pl_kernel_fn f;
    pl_kernel_args a;
    pl_tensor in, out;
    pl_storage sin, sout;
};

static thread_local bool tl_on;
static thread_local size_t tl_calls;
static thread_local std::vector<cu_range> *tl_log;
static thread_local std::vector<cu_fused> *tl_fused;
static thread_local cu_pending tl_pend;

void pl_cu_fuse_begin(void) {
    const char *e = getenv("PL_GRAPH_FUSION");
    tl_on = g_fuse && !(e && !strcmp(e, "0"));
    tl_calls = 0;
    tl_pend.on = false;
    if (!tl_log) tl_log = new std::vector<cu_range>();
    if (!tl_fused) tl_fused = new std::vector<cu_fused>();
    tl_log->clear();
    tl_fused->clear();
}

static void note(uintptr_t lo, uintptr_t hi, bool cover) {
    if (lo < hi) tl_log->push_back(cu_range{tl_calls, lo, hi, cover});
}

/* The bytes a tensor spans (over-estimated for a strided view: reads only). */
static void note_read(const pl_tensor *t) {
    if (!t || pl_tensor_is_stub(t) || !t->storage || pl_tensor_numel(t) == 0) return;
    uintptr_t lo = (uintptr_t)pl_tensor_data(t);
    if (pl_tensor_is_contiguous(t)) {
        note(lo, lo + pl_tensor_nbytes(t), false);
    } else {
        int64_t e = 1;
        for (int d = 0; d < t->ndim; d++)
            e += (t->shape[d] - 1) * (t->stride[d] < 0 ? -t->stride[d] : t->stride[d]);
        size_t el = pl_dtype_size(t->dtype);
        note(lo, lo + (uintptr_t)e * (el ? el : 1), false);
    }
    if (t->dtype == PL_NF4) {
        note_read(t->quant.absmax);
        note_read(t->quant.absmax_scale);
    }
}

static void note_call(const pl_kernel_args *a) {
    for (int i = 0; i < a->n_in; i++) note_read(a->in[i]);
    if (a->p.extra && (a->op == PL_OP_ADAMW_STEP_MULTI || a->op == PL_OP_SGD_STEP_MULTI)) {
        const pl_optim_multi *m = (const pl_optim_multi *)a->p.extra;
        for (int i = 0; i < m->n; i++) {
            note_read(m->param[i]);
            note_read(m->grad[i]);
            for (int k = 0; k < 3; k++) note_read(m->state[k][i]);
        }
    } else if (a->p.extra && a->op == PL_OP_DROPOUT) {
        note_read((const pl_tensor *)a->p.extra);
    }
    for (int i = 0; i < a->n_out; i++) {
        const pl_tensor *t = a->out[i];
        if (!t || pl_tensor_is_stub(t) || !pl_tensor_is_contiguous(t) || t->dtype == PL_NF4) continue;
        uintptr_t lo = (uintptr_t)pl_tensor_data(t);
        note(lo, lo + pl_tensor_nbytes(t), true);
    }
    tl_calls++;
}

static bool f32_contig(const pl_tensor *t) {
    return t && !pl_tensor_is_stub(t) && t->dtype == PL_F32 && pl_tensor_is_contiguous(t);
}

pl_status pl_cu_fuse_flush(void) {
    if (!tl_pend.on) return PL_OK;
    tl_pend.on = false;
    note_call(&tl_pend.a);
    return tl_pend.f(&tl_pend.a);
}

pl_status pl_cu_fuse_write(void *dst, const void *src, size_t n) {
    pl_status s = pl_cu_fuse_flush();
    if (s || !tl_log) return s;
    if (src) note((uintptr_t)src, (uintptr_t)src + n, false);
    note((uintptr_t)dst, (uintptr_t)dst + n, true);
    tl_calls++;
    return PL_OK;
}

pl_status pl_cu_fuse_call(pl_kernel_fn f, const pl_kernel_args *a, bool backward) {
    if (!tl_on || !tl_log) return f(a);
    const cu_pending *p = &tl_pend;
    if (p->on && !backward && a->op == PL_OP_SUM && a->n_in == 1 && f32_contig(a->in[0]) &&
        f32_contig(a->out[0]) && pl_tensor_numel(a->out[0]) == 1 &&
        pl_tensor_data(a->in[0]) == pl_tensor_data(p->a.out[0]) &&
        pl_tensor_numel(a->in[0]) == pl_tensor_numel(p->a.out[0])) {
        int64_t outer, n, inner;
        pl_reduce_split(a->in[0], a->p.dim, &outer, &n, &inner);
        if (outer == 1 && inner == 1) { /* the pair: one launch */
            tl_pend.on = false;
            const float *x = (const float *)pl_tensor_data(p->a.in[0]);
            float *t = (float *)pl_tensor_data(p->a.out[0]), *o = (float *)pl_tensor_data(a->out[0]);
            note_read(p->a.in[0]);
            note((uintptr_t)t, (uintptr_t)t + pl_tensor_nbytes(p->a.out[0]), true);
            note((uintptr_t)o, (uintptr_t)o + sizeof(float), true);
            tl_calls++;
            tl_fused->push_back(cu_fused{x, t, o, pl_tensor_nbytes(p->a.out[0]), tl_calls});
            if (pl_cu_set_device(a->in[0])) return pl_error_status();
            return pl_cu_sum_squares(x, t, o, n);
        }
    }
    pl_status s = pl_cu_fuse_flush();
    if (s) return s;
    if (!backward && a->op == PL_OP_SQUARE && a->n_in == 1 && f32_contig(a->in[0]) &&
        f32_contig(a->out[0]) && pl_tensor_numel(a->in[0]) == pl_tensor_numel(a->out[0])) {
        cu_pending *q = &tl_pend; /* held back: the tensors by value (the caller frees its own) */
        q->f = f;
        q->a = *a;
        q->in = *a->in[0];
        q->out = *a->out[0];
        q->sin = *a->in[0]->storage;
        q->sout = *a->out[0]->storage;
        q->in.storage = &q->sin;
        q->out.storage = &q->sout;
        q->a.in[0] = &q->in;
        q->a.out[0] = &q->out;
        q->on = true;
        return PL_OK;
    }
    note_call(a);
    return f(a);
}

/* backend.h's liveness rule for [lo, hi), written by the calls before `from`. */
static bool dead(const pl_step_facts *f, uintptr_t lo, uintptr_t hi, size_t from) {
    if (!pl_step_released(f, (const void *)lo, hi - lo)) return false;
    for (const cu_range &r : *tl_log) { /* in call order; a call's reads before its writes */
        if (r.call < from) continue;
        if (!r.cover && r.lo < hi && lo < r.hi) return false;
        if (r.cover && r.lo <= lo && hi <= r.hi) return true; /* written whole */
    }
    return true;
}

pl_status pl_cu_fuse_end(cudaGraph_t g, pl_step_facts *facts) {
    if (!tl_fused || tl_fused->empty()) return PL_OK;
    size_t nf = tl_fused->size(), dropped = 0;
    if (facts) { /* drop the stores of dead squares from the fused nodes */
        size_t nn = 0;
        CUDA_TRY(cudaGraphGetNodes(g, NULL, &nn));
        std::vector<cudaGraphNode_t> nodes(nn);
        if (nn) CUDA_TRY(cudaGraphGetNodes(g, nodes.data(), &nn));
        for (size_t i = 0; i < nn; i++) {
            cudaGraphNodeType ty;
            cudaKernelNodeParams kp;
            if (cudaGraphNodeGetType(nodes[i], &ty) != cudaSuccess || ty != cudaGraphNodeTypeKernel ||
                cudaGraphKernelNodeGetParams(nodes[i], &kp) != cudaSuccess) {
                cudaGetLastError(); /* a library's kernel (cuBLAS) may not answer: not ours */
                continue;
            }
            if (kp.func != pl_cu_sum_squares_kernel() || !kp.kernelParams) continue;
            const float *x = *(const float **)kp.kernelParams[0];
            float *t = *(float **)kp.kernelParams[1];
            float *o = *(float **)kp.kernelParams[2];
            int64_t n = *(int64_t *)kp.kernelParams[3];
            /* the node's squares are dead when every fused launch with its
             * (x, t, o) finds them dead (a node is matched by its arguments) */
            bool all = t != NULL, any = false;
            for (const cu_fused &fu : *tl_fused)
                if (fu.x == x && fu.t == t && fu.o == o) {
                    any = true;
                    all = all && dead(facts, (uintptr_t)t, (uintptr_t)t + fu.bytes, fu.next);
                }
            if (!any || !all) continue;
            float *none = NULL;
            void *args[4] = {(void *)&x, (void *)&none, (void *)&o, (void *)&n};
            kp.kernelParams = args;
            kp.extra = NULL;
            CUDA_TRY(cudaGraphKernelNodeSetParams(nodes[i], &kp));
            dropped++;
        }
        facts->n_fused = (int)nf;
        snprintf(facts->fused, sizeof facts->fused, "square+sum x%zu, the squares' store dropped in %zu",
                 nf, dropped);
    }
    tl_fused->clear();
    tl_log->clear();
    return PL_OK;
}
