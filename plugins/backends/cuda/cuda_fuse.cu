/* cuda_fuse.cu - the CUDA backend's side of "Seeing the step" (backend.h,
 * pl_backend.capture_end_step): fusion inside a captured training step.
 *
 * One family, the first of the strict device's (plugins/backends/strict/strict_fuse.c;
 * its second, matmul + bias, is not done here: plugins/backends/cuda/README.md):
 * the gradient norm's square followed by the sum of all of its squares (one
 * pair per parameter with a gradient, every step). While a thread captures
 * (and set_option("fuse", "false") / PL_GRAPH_FUSION=0 have not turned it
 * off), a square of a contiguous f32 tensor is held back until the next
 * call of the thread; when that call is the sum of all of its squares, the
 * pair is held back in turn, and when the next call adds that sum to a
 * one-element total (the norm's running total), ONE kernel (cuda_dense.cu,
 * k_sum_squares: the three kernels' bits) is launched for the three, else
 * one for the pair; anything else issues what is held back first, in order,
 * and the fused kernel still stores the squares (and the sum). What is held
 * back is issued by the next kernel, copy, memset or the capture's end, so
 * the graph's order is the calls' order.
 *
 * When the capture ends, the core says which blocks the step released
 * (capture_end_step); the squares (and, after an add, the sum) of a fused
 * node whose bytes are dead by backend.h's liveness rule (inside a released
 * block; no later call of the step reads them before one writes all of
 * them: this file keeps each call's byte ranges while capturing) are not
 * stored: the node's T (O) argument is set to NULL before the graph is
 * instantiated. A fused launch is one node either way, so a step has one or
 * two launches less per parameter; a dropped store saves its bytes of
 * memory traffic.
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

/* A fused launch: x, its squares t, the sum o, the total u (NULL: none),
 * and the call after it. */
struct cu_fused {
    const void *x, *t, *o, *u;
    size_t bytes, next;
};

/* Held back: on 1, a square (its args, with copies of its two tensors); on
 * 2, a square and the sum of all of it (x, t, o, n). */
struct cu_pending {
    int on;
    pl_kernel_fn f;
    pl_kernel_args a;
    pl_tensor in, out;
    pl_storage sin, sout;
    const float *x;
    float *t, *o;
    int64_t n;
    size_t tbytes;
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
    tl_pend.on = 0;
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
    if (a->p.extra && pl_op_has_multi_list(a->op)) {
        const pl_optim_multi *m = (const pl_optim_multi *)a->p.extra;
        for (int i = 0; i < m->n; i++) {
            note_read(m->param[i]);
            note_read(m->grad[i]);
            for (int k = 0; k < 3; k++) note_read(m->state[k][i]);
            if (pl_optim_multi_counted(a->op)) note_read(m->count[i]);
        }
    } else if (a->p.extra && (a->op == PL_OP_DROPOUT || a->op == PL_OP_LORA_ADD)) {
        /* the captured counter offset of dropout and of lora_add's dropout */
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

/* One fused launch: the held-back square + sum, and the add into u (u NULL: none). */
static pl_status launch(const float *a, float *u, int first) {
    cu_pending *p = &tl_pend;
    p->on = 0;
    note((uintptr_t)p->x, (uintptr_t)p->x + (size_t)p->n * sizeof(float), false);
    if (a) note((uintptr_t)a, (uintptr_t)a + sizeof(float), false);
    note((uintptr_t)p->t, (uintptr_t)p->t + p->tbytes, true);
    note((uintptr_t)p->o, (uintptr_t)p->o + sizeof(float), true);
    if (u) note((uintptr_t)u, (uintptr_t)u + sizeof(float), true);
    tl_calls++;
    tl_fused->push_back(cu_fused{p->x, p->t, p->o, u, p->tbytes, tl_calls});
    return pl_cu_sum_squares(p->x, p->t, p->o, a, u, first, p->n);
}

pl_status pl_cu_fuse_flush(void) {
    if (tl_pend.on == 2) return launch(NULL, NULL, 0);
    if (tl_pend.on != 1) return PL_OK;
    tl_pend.on = 0;
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

/* a: an add of two one-element f32 tensors into a third, one operand (only
 * one) at o; *first: whether o is the first. */
static bool add_of(const pl_kernel_args *a, const void *o, int *first) {
    if (a->op != PL_OP_ADD || a->n_in != 2 || a->n_out < 1) return false;
    const pl_tensor *t[3] = {a->in[0], a->in[1], a->out[0]};
    for (int k = 0; k < 3; k++)
        if (!f32_contig(t[k]) || pl_tensor_numel(t[k]) != 1) return false;
    *first = pl_tensor_data(t[0]) == o;
    return *first != (pl_tensor_data(t[1]) == o);
}

pl_status pl_cu_fuse_call(pl_kernel_fn f, const pl_kernel_args *a, bool backward) {
    if (!tl_on || !tl_log) return f(a);
    cu_pending *p = &tl_pend;
    int first = 0;
    if (p->on == 2 && !backward && add_of(a, p->o, &first)) { /* square + sum + add */
        if (pl_cu_set_device(a->out[0])) return pl_error_status();
        return launch((const float *)pl_tensor_data(a->in[first ? 1 : 0]),
                      (float *)pl_tensor_data(a->out[0]), first);
    }
    if (p->on == 1 && !backward && a->op == PL_OP_SUM && a->n_in == 1 && f32_contig(a->in[0]) &&
        f32_contig(a->out[0]) && pl_tensor_numel(a->out[0]) == 1 &&
        pl_tensor_data(a->in[0]) == pl_tensor_data(p->a.out[0]) &&
        pl_tensor_numel(a->in[0]) == pl_tensor_numel(p->a.out[0])) {
        int64_t outer, n, inner;
        pl_reduce_split(a->in[0], a->p.dim, &outer, &n, &inner);
        if (outer == 1 && inner == 1) { /* square + sum: held back for an add */
            if (pl_cu_set_device(a->in[0])) return pl_error_status();
            p->x = (const float *)pl_tensor_data(p->a.in[0]);
            p->t = (float *)pl_tensor_data(p->a.out[0]);
            p->o = (float *)pl_tensor_data(a->out[0]);
            p->n = n;
            p->tbytes = pl_tensor_nbytes(p->a.out[0]);
            p->on = 2;
            return PL_OK;
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
        q->on = 1;
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
    size_t k2 = 0, k3 = 0, dropped = 0;
    for (const cu_fused &fu : *tl_fused) (fu.u ? k3 : k2)++;
    if (facts) { /* drop the stores of dead squares (and sums) from the fused nodes */
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
            const float *a = *(const float **)kp.kernelParams[3];
            float *u = *(float **)kp.kernelParams[4];
            int first = *(int *)kp.kernelParams[5];
            int64_t n = *(int64_t *)kp.kernelParams[6];
            /* a store is dropped when every fused launch with the node's
             * (x, t, o, u) finds its bytes dead (a node is matched by its
             * arguments); the sum's only after an add (u) */
            bool any = false, t_dead = t != NULL, o_dead = o != NULL && u != NULL;
            for (const cu_fused &fu : *tl_fused)
                if (fu.x == x && fu.t == t && fu.o == o && fu.u == u) {
                    any = true;
                    t_dead = t_dead && dead(facts, (uintptr_t)t, (uintptr_t)t + fu.bytes, fu.next);
                    o_dead = o_dead && dead(facts, (uintptr_t)o, (uintptr_t)o + sizeof(float), fu.next);
                }
            if (!any || (!t_dead && !o_dead)) continue;
            if (t_dead) t = NULL;
            if (o_dead) o = NULL;
            dropped += (size_t)t_dead + (size_t)o_dead;
            void *args[7] = {(void *)&x, (void *)&t, (void *)&o, (void *)&a, (void *)&u, (void *)&first,
                             (void *)&n};
            kp.kernelParams = args;
            kp.extra = NULL;
            CUDA_TRY(cudaGraphKernelNodeSetParams(nodes[i], &kp));
        }
        facts->n_fused = (int)(k2 + k3);
        char a2[48] = "", a3[48] = "";
        if (k2) snprintf(a2, sizeof a2, "square+sum x%zu", k2);
        if (k3) snprintf(a3, sizeof a3, "square+sum+add x%zu", k3);
        snprintf(facts->fused, sizeof facts->fused, "%s%s%s; dead stores dropped: %zu", a2,
                 k2 && k3 ? ", " : "", a3, dropped);
    }
    tl_fused->clear();
    tl_log->clear();
    return PL_OK;
}
