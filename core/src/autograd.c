/* autograd.c - grad mode, frames, the tape, backward, activation
 * checkpointing, custom ops, autocast, and the small checks every op uses at
 * entry (see autograd.h, internal.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "op_table.h"

#define MAX_SAVED 8

typedef struct pl_node {
    int op; /* pl_op or custom id */
    pl_op_params p;
    int n_in, n_saved;
    pl_tensor *in[PL_MAX_OP_INPUTS];
    pl_tensor *saved[MAX_SAVED];
    pl_tensor *out;      /* weak (cleared when out's header dies) unless out_strong */
    bool out_strong;     /* checkpoint nodes hold their output (recompute check) */
    pl_device dev;       /* out's device: the backend whose backward runs */
    pl_tensor *grad_out; /* accumulated d(loss)/d(out), f32 */
    const pl_custom_op *custom;
    pl_checkpoint_fn ckpt_fn; /* checkpoint node: backward recomputes fn(ckpt_ctx, in) */
    void *ckpt_ctx;           /* borrowed */
    /* in[j] is a stub of a frozen parameter's autocast copy: backward casts
     * recast[j] (retained) again instead of the tape keeping that copy */
    pl_tensor *recast[PL_MAX_OP_INPUTS];
} pl_node;

/* ---- per-thread state ------------------------------------------------------ */

typedef struct tensor_vec {
    pl_tensor **v;
    int64_t n, cap;
} tensor_vec;

static _Thread_local int tl_no_grad;
/* set when an op under no-grad had an input requiring grad: pl_checkpoint's
 * forward learns from it whether fn's result would have been recorded */
static _Thread_local bool tl_no_grad_saw_grad;
static _Thread_local pl_node **tl_tape;
static _Thread_local int64_t tl_tape_n, tl_tape_cap;
static _Thread_local pl_node *tl_node_pool[1024];
static _Thread_local int tl_node_pool_n;
#define MAX_FRAMES 32
static _Thread_local tensor_vec tl_frames[MAX_FRAMES];
static _Thread_local int tl_frame_depth;
static pl_dtype g_autocast = PL_F32;

static pl_status vec_push(tensor_vec *v, pl_tensor *t) {
    if (v->n == v->cap) {
        int64_t nc = v->cap ? v->cap * 2 : 256;
        pl_tensor **nv = realloc(v->v, (size_t)nc * sizeof *nv);
        if (!nv) return pl_error_set(PL_ERR_NOMEM, "out of memory (frame)");
        v->v = nv;
        v->cap = nc;
    }
    v->v[v->n++] = t;
    return PL_OK;
}

/* ---- grad mode / autocast ------------------------------------------------------ */

bool pl_grad_enabled(void) { return tl_no_grad == 0; }
void pl_no_grad_begin(void) { tl_no_grad++; }
void pl_no_grad_end(void) {
    if (tl_no_grad > 0) tl_no_grad--;
}
void pl_autocast_set(pl_dtype dt) { g_autocast = dt; }
pl_dtype pl_autocast_get(void) { return g_autocast; }

void pl_tensor_set_requires_grad(pl_tensor *t, bool on) {
    if (t) t->requires_grad = on;
}

void pl_tensor_zero_grad(pl_tensor *t) {
    if (t && t->grad) pl_tensor_fill_(t->grad, 0.0);
}

/* ---- frames ------------------------------------------------------------------ */

void pl_frame_begin(void) {
    if (tl_frame_depth < MAX_FRAMES) tl_frames[tl_frame_depth].n = 0;
    tl_frame_depth++;
}

void pl_frame_end(void) {
    if (tl_frame_depth == 0) return;
    tl_frame_depth--;
    if (tl_frame_depth >= MAX_FRAMES) return;
    tensor_vec *f = &tl_frames[tl_frame_depth];
    for (int64_t i = f->n - 1; i >= 0; i--) pl_tensor_release(f->v[i]);
    f->n = 0;
}

void pl_frame_adopt(pl_tensor *t) {
    if (!t || tl_frame_depth == 0 || tl_frame_depth > MAX_FRAMES) return;
    vec_push(&tl_frames[tl_frame_depth - 1], t);
}

pl_tensor *pl_frame_keep(pl_tensor *t) { return pl_tensor_retain(t); }

pl_tensor *pl_frame_end_keep(pl_tensor *t) {
    pl_tensor_retain(t);
    pl_frame_end();
    /* the enclosing frame takes our reference; with none, the caller owns it */
    if (t && tl_frame_depth > 0) pl_frame_adopt(t);
    return t;
}

/* ---- entry checks --------------------------------------------------------------- */

pl_status pl_check_float(const char *op, const pl_tensor *t, bool allow_half) {
    char buf[256];
    if (t->dtype == PL_F32 || (allow_half && (t->dtype == PL_BF16 || t->dtype == PL_F16)))
        return PL_OK;
    return pl_error_set(PL_ERR_DTYPE, "%s: tensor %s has dtype %s; expected f32%s", op,
                        pl_tensor_describe(t, buf, sizeof buf), pl_dtype_name(t->dtype),
                        allow_half ? ", bf16 or f16" : "");
}

pl_status pl_check_index(const char *op, const pl_tensor *t) {
    char buf[256];
    if (t->dtype == PL_I64 || t->dtype == PL_I32) return PL_OK;
    return pl_error_set(PL_ERR_DTYPE, "%s: index tensor %s must be i32 or i64", op,
                        pl_tensor_describe(t, buf, sizeof buf));
}

pl_status pl_check_same_device(const char *op, pl_tensor *const *ts, int n) {
    char b1[256], b2[256];
    const pl_tensor *first = NULL;
    for (int i = 0; i < n; i++) {
        if (!ts[i]) continue;
        if (!first) {
            first = ts[i];
            continue;
        }
        if (!pl_device_eq(first->device, ts[i]->device))
            return pl_error_set(PL_ERR_DEVICE, "%s: inputs on different devices: %s and %s", op,
                                pl_tensor_describe(first, b1, sizeof b1),
                                pl_tensor_describe(ts[i], b2, sizeof b2));
    }
    return PL_OK;
}

pl_status pl_check_ndim(const char *op, const pl_tensor *t, int lo, int hi) {
    char buf[256];
    if (t->ndim >= lo && t->ndim <= hi) return PL_OK;
    return pl_error_set(PL_ERR_SHAPE, "%s: tensor %s has rank %d, expected %d..%d", op,
                        pl_tensor_describe(t, buf, sizeof buf), t->ndim, lo, hi);
}

bool pl_any_requires_grad(pl_tensor *const *ts, int n) {
    for (int i = 0; i < n; i++)
        if (ts[i] && ts[i]->requires_grad) return true;
    return false;
}

pl_status pl_broadcast_shapes(const char *op, const pl_tensor *a, const pl_tensor *b, int *ndim,
                              int64_t *shape) {
    int nd = a->ndim > b->ndim ? a->ndim : b->ndim;
    for (int i = 0; i < nd; i++) {
        int ia = a->ndim - nd + i, ib = b->ndim - nd + i;
        int64_t sa = ia >= 0 ? a->shape[ia] : 1, sb = ib >= 0 ? b->shape[ib] : 1;
        if (sa != sb && sa != 1 && sb != 1) {
            char b1[256], b2[256];
            return pl_error_set(PL_ERR_SHAPE, "%s: shapes %s and %s do not broadcast (dim %d: %lld vs %lld)",
                                op, pl_tensor_describe(a, b1, sizeof b1),
                                pl_tensor_describe(b, b2, sizeof b2), i, (long long)sa,
                                (long long)sb);
        }
        shape[i] = sa == 1 ? sb : sa;
    }
    *ndim = nd;
    return PL_OK;
}

pl_tensor *pl_contiguous_owned(pl_tensor *t) {
    if (!t) return NULL;
    if (pl_tensor_is_contiguous(t)) return pl_tensor_retain(t);
    if (t->requires_grad) {
        /* differentiable copy (ops_index.c); adopted by the frame, so retain */
        pl_tensor *c = pl_contiguous(t);
        return pl_tensor_retain(c);
    }
    pl_tensor *c = pl_tensor_new_owned(t->dtype, t->ndim, t->shape, t->device);
    if (!c) return NULL;
    pl_kernel_args k = {.op = PL_OP_COPY, .n_in = 1, .in = {t}, .n_out = 1, .out = {c}};
    if (pl_kernel_forward(&k)) {
        pl_tensor_release(c);
        return NULL;
    }
    return c;
}

/* ---- kernels --------------------------------------------------------------------- */

static const pl_custom_op *g_custom[256];
static int g_n_custom;

pl_status pl_kernel_forward(pl_kernel_args *a) {
    pl_status ac = pl_op_check_call(a->op, a->n_in, a->n_out); /* its ops.def row */
    if (ac) return ac;
    const pl_tensor *ref = a->n_in > 0 && a->in[0] ? a->in[0] : a->out[0];
    const pl_backend *b = pl_backend_get(ref->device.type);
    if (!b) return pl_error_status();
    pl_kernel_fn fn = pl_backend_kernel(b, a->op, false);
    if (!fn)
        return pl_error_set(PL_ERR_UNSUPPORTED, "op '%s' has no forward kernel on backend '%s'",
                            pl_op_name(a->op), b->name);
    bool half = pl_half_io_needed(b, a, false); /* half_io.c */
    if (!pl_op_profile_on()) return half ? pl_half_io_call(b, fn, a) : fn(a);
    double t0 = pl_op_profile_begin(ref->device);
    pl_status st = half ? pl_half_io_call(b, fn, a) : fn(a);
    pl_op_profile_end(a->op, false, ref, ref->device, t0);
    return st;
}

/* ---- recording --------------------------------------------------------------------- */

static pl_node *node_new(void) {
    pl_node *n = tl_node_pool_n ? tl_node_pool[--tl_node_pool_n] : malloc(sizeof *n);
    if (n) memset(n, 0, sizeof *n);
    return n;
}

static void node_free(pl_node *n) {
    for (int i = 0; i < n->n_in; i++) pl_tensor_release(n->in[i]);
    for (int i = 0; i < n->n_in; i++) pl_tensor_release(n->recast[i]);
    for (int i = 0; i < n->n_saved; i++) pl_tensor_release(n->saved[i]);
    if (n->out && n->out->grad_fn == n) n->out->grad_fn = NULL;
    if (n->out_strong) pl_tensor_release(n->out);
    n->out = NULL;
    pl_tensor_release(n->grad_out);
    if (tl_node_pool_n < 1024)
        tl_node_pool[tl_node_pool_n++] = n;
    else
        free(n);
}

static const char *backend_name(pl_device_type dev) {
    const pl_backend *b = pl_backend_get(dev);
    return b && b->name ? b->name : dev == PL_DEVICE_CUDA ? "cuda" : "cpu";
}

static pl_kernel_fn backward_fn(int op, const pl_custom_op *custom, pl_device_type dev) {
    if (custom) return custom->backward[dev];
    return pl_backend_kernel(pl_backend_get(dev), (pl_op)op, true);
}

/* ---- what the tape keeps (issue 31; docs/autograd-memory.md) ---------------------------
 * A node keeps an input's data only when its op's backward reads it for an
 * input that requires a gradient (PyTorch's derivatives.yaml; the `reads`
 * column of pipeline/ops.def, per op);
 * every other input is kept as a stub (pl_tensor_stub_owned: shape, dtype,
 * grad_fn, no data), so an activation whose only reader needs nothing of it
 * is freed as soon as the forward lets go of it. A leaf that requires grad
 * (a parameter) is always kept whole: its .grad accumulates on that header.
 * Extra outputs an op saves (softmax statistics, a dropout mask, the causal
 * softmax's probabilities) are kept whole, and a node does not hold its own
 * output (a weak pointer; a later op that needs it keeps it).
 *
 * pl_autograd_needed_inputs: bit j set = backward reads input j's data, for
 * `grad_mask` (bit j = input j requires grad), from ops.def's `reads`; what
 * docs/ops.md states (generated from ops.def) and test_autograd_saved checks,
 * op by op, on the CPU and the strict device. */
unsigned pl_autograd_needed_inputs(int op, int n_in, unsigned grad_mask) {
    const pl_op_row *r = pl_op_row_of(op);
    return pl_op_reads_mask(r ? r->reads : "-", n_in, grad_mask);
}

bool pl_autograd_saves_output(int op) {
    const pl_op_row *r = pl_op_row_of(op);
    return r && r->saves_out;
}

/* pl_autocast_recast_hint: while an autocast matmul records its node, its
 * operand copies of frozen parameters (dst = cast(src)) */
static _Thread_local struct {
    const pl_tensor *dst;
    pl_tensor *src;
} tl_recast[2];

void pl_autocast_recast_hint(int slot, const pl_tensor *dst, pl_tensor *src) {
    if (slot < 0 || slot > 1) return;
    bool ok = dst && src && dst != src && !src->requires_grad && !src->grad_fn &&
              !dst->requires_grad && pl_tensor_is_contiguous(src) && pl_tensor_is_param(src);
    tl_recast[slot].dst = ok ? dst : NULL;
    tl_recast[slot].src = ok ? src : NULL;
}

static pl_tensor *recast_source(const pl_tensor *x) {
    for (int i = 0; i < 2; i++)
        if (tl_recast[i].dst == x && tl_recast[i].src) return tl_recast[i].src;
    return NULL;
}

/* x's value again: src cast to x's dtype on x's device (owned) */
static pl_tensor *recast_now(pl_tensor *src, const pl_tensor *x) {
    pl_kernel_args k = {.op = PL_OP_CAST, .n_in = 1, .n_out = 1};
    k.p.dtype = x->dtype;
    k.in[0] = src;
    k.out[0] = pl_tensor_new_owned(x->dtype, x->ndim, x->shape, x->device);
    if (!k.out[0]) return NULL;
    if (pl_kernel_forward(&k)) {
        pl_tensor_release(k.out[0]);
        return NULL;
    }
    return k.out[0];
}

/* Append a node out = op(inputs) to the tape; retains what backward reads of
 * the inputs (the rest as stubs) and saved; out only for a checkpoint node. */
static pl_node *tape_push(int op, const pl_custom_op *custom, const pl_op_params *p,
                          pl_tensor *const *inputs, int n_in, pl_tensor *const *saved, int n_saved,
                          pl_tensor *out) {
    if (tl_tape_n == tl_tape_cap) {
        int64_t nc = tl_tape_cap ? tl_tape_cap * 2 : 1024;
        pl_node **nt = realloc(tl_tape, (size_t)nc * sizeof *nt);
        if (!nt) {
            pl_error_set(PL_ERR_NOMEM, "out of memory (tape)");
            return NULL;
        }
        tl_tape = nt;
        tl_tape_cap = nc;
    }
    pl_node *n = node_new();
    if (!n) {
        pl_error_set(PL_ERR_NOMEM, "out of memory (autograd node)");
        return NULL;
    }
    n->op = op;
    n->custom = custom;
    if (p) n->p = *p;
    n->n_in = n_in;
    /* a built-in op: only what its backward reads (custom ops and checkpoint
     * nodes, whose backward may read anything, keep every input) */
    unsigned grad_mask = 0;
    for (int i = 0; i < n_in; i++)
        if (inputs[i] && inputs[i]->requires_grad) grad_mask |= 1u << i;
    bool builtin = !custom && op > PL_OP_NONE && op < PL_OP_COUNT;
    unsigned need = builtin ? pl_autograd_needed_inputs(op, n_in, grad_mask) : ~0u;
    for (int i = 0; i < n_in; i++) {
        pl_tensor *x = inputs[i];
        bool keep = !x || (need >> i & 1u) || (x->requires_grad && !x->grad_fn) ||
                    pl_tensor_is_stub(x);
        pl_tensor *src = keep && x && builtin ? recast_source(x) : NULL;
        if (src) { /* backward casts the frozen parameter again (pl_autocast_recast_hint) */
            n->recast[i] = pl_tensor_retain(src);
            keep = false;
        }
        n->in[i] = keep ? pl_tensor_retain(x) : pl_tensor_stub_owned(x);
        if (!n->in[i]) {
            n->n_in = i;
            node_free(n);
            return NULL;
        }
    }
    n->n_saved = n_saved;
    for (int i = 0; i < n_saved; i++) n->saved[i] = pl_tensor_retain(saved[i]);
    n->out_strong = op == PL_OP_NONE && !custom; /* a checkpoint node */
    n->out = n->out_strong ? pl_tensor_retain(out) : out;
    n->dev = out->device;
    out->grad_fn = n;
    out->requires_grad = true;
    tl_tape[tl_tape_n++] = n;
    return n;
}

static pl_status record(int op, const pl_custom_op *custom, const pl_op_params *p,
                        pl_tensor *const *inputs, int n_in, pl_tensor *const *saved, int n_saved,
                        pl_tensor *out) {
    if (!custom) {
        pl_status ac = pl_op_check_node(op, n_in, n_saved); /* its ops.def row */
        if (ac) return ac;
    }
    if (!pl_any_requires_grad(inputs, n_in)) return PL_OK;
    if (!pl_grad_enabled()) {
        tl_no_grad_saw_grad = true;
        return PL_OK;
    }
    const char *name = custom ? custom->name : pl_op_name(op);
    if (n_in > PL_MAX_OP_INPUTS || n_saved > MAX_SAVED)
        return pl_error_set(PL_ERR_INTERNAL, "%s: too many inputs/saved tensors to record", name);
    if (!backward_fn(op, custom, out->device.type))
        return pl_error_set(PL_ERR_UNSUPPORTED,
                            "op '%s' has no backward kernel on backend '%s', but an input "
                            "requires grad; wrap the call in pl_no_grad_begin/end or detach the "
                            "input",
                            name, backend_name(out->device.type));
    return tape_push(op, custom, p, inputs, n_in, saved, n_saved, out) ? PL_OK : pl_error_status();
}

pl_status pl_autograd_record(pl_op op, const pl_op_params *p, pl_tensor *const *inputs, int n_in,
                             pl_tensor *const *saved, int n_saved, pl_tensor *out) {
    return record(op, NULL, p, inputs, n_in, saved, n_saved, out);
}

void pl_autograd_forget_out(pl_tensor *t) {
    pl_node *n = t->grad_fn;
    if (n && n->out == t) n->out = NULL;
    t->grad_fn = NULL;
}

/* Free the nodes tape[mark..] (newest first) and what they hold. */
static void tape_truncate(int64_t mark) {
    for (int64_t i = tl_tape_n - 1; i >= mark; i--)
        node_free(tl_tape[i]);
    tl_tape_n = mark;
}

void pl_tape_clear(void) { tape_truncate(0); }

int64_t pl_tape_size(void) { return tl_tape_n; }

/* ---- backward ------------------------------------------------------------------------ */

/* dst += src (both f32, same numel, contiguous). */
static pl_status accumulate(pl_tensor *dst, pl_tensor *src) {
    if (dst->device.type == PL_DEVICE_CPU) {
        float *d = pl_tensor_data(dst);
        const float *s = pl_tensor_data(src);
        int64_t n = pl_tensor_numel(dst);
#pragma omp parallel for if (n > 65536) schedule(static)
        for (int64_t i = 0; i < n; i++) d[i] += s[i];
        return PL_OK;
    }
    pl_kernel_args k = {.op = PL_OP_ADD, .n_in = 2, .in = {dst, src}, .n_out = 1, .out = {dst}};
    return pl_kernel_forward(&k);
}

static pl_status give_grad(pl_tensor *x, pl_tensor *g) {
    /* g: owned f32 gradient with x's shape; consumed */
    pl_node *n = x->grad_fn;
    pl_status s = PL_OK;
    if (n) {
        if (!n->grad_out)
            n->grad_out = g;
        else {
            s = accumulate(n->grad_out, g);
            pl_tensor_release(g);
        }
        return s;
    }
    if (!x->requires_grad) {
        pl_tensor_release(g);
        return PL_OK;
    }
    if (!x->grad) {
        x->grad = pl_tensor_new_owned_zeros(PL_F32, x->ndim, x->shape, x->device);
        if (!x->grad) {
            pl_tensor_release(g);
            return pl_error_status();
        }
        pl_tensor_set_name(x->grad, "%s.grad", x->name);
    }
    s = accumulate(x->grad, g);
    pl_tensor_release(g);
    return s;
}

/* Gradients g[j] (owned, f32, input j's shape; NULL where input j needs
 * none) of a recorded op's inputs from its accumulated grad_out. */
static pl_status node_backward(pl_node *n, pl_tensor **g) {
    const char *name = n->custom ? n->custom->name : pl_op_name(n->op);
    pl_kernel_args k = {.op = n->op < PL_OP_COUNT ? (pl_op)n->op : PL_OP_NONE, .p = n->p};
    k.n_in = 1 + n->n_in + n->n_saved;
    k.in[0] = n->grad_out;
    pl_tensor *tmp[PL_MAX_OP_INPUTS] = {0};
    for (int j = 0; j < n->n_in; j++) {
        k.in[1 + j] = n->in[j];
        if (n->recast[j]) { /* a frozen parameter's half copy, cast again for this kernel */
            tmp[j] = recast_now(n->recast[j], n->in[j]);
            if (!tmp[j]) {
                for (int i = 0; i < j; i++) pl_tensor_release(tmp[i]);
                return pl_error_prefix(pl_error_status() ? pl_error_status() : PL_ERR_NOMEM,
                                       "backward of '%s': casting %s again", name,
                                       n->recast[j]->name);
            }
            k.in[1 + j] = tmp[j];
        }
    }
    for (int j = 0; j < n->n_saved; j++)
        k.in[1 + n->n_in + j] = n->saved[j];
    k.n_out = n->n_in;
    for (int j = 0; j < n->n_in; j++) {
        pl_tensor *x = n->in[j];
        /* same tensor passed twice: each slot gets its own buffer */
        if (x && x->requires_grad) {
            g[j] = k.out[j] = pl_tensor_new_owned(PL_F32, x->ndim, x->shape, x->device);
            if (!g[j]) return pl_error_status();
        }
    }
    pl_kernel_fn fn = backward_fn(n->op, n->custom, n->dev.type);
    if (!fn)
        return pl_error_set(PL_ERR_UNSUPPORTED, "op '%s' has no backward kernel on backend '%s'",
                            name, backend_name(n->dev.type));
    bool prof = pl_op_profile_on();
    double t0 = prof ? pl_op_profile_begin(n->dev) : 0;
    const pl_backend *be = n->custom ? NULL : pl_backend_get(n->dev.type);
    pl_status st = be && pl_half_io_needed(be, &k, true) ? pl_half_io_call(be, fn, &k) : fn(&k);
    if (prof) pl_op_profile_end(n->custom ? PL_OP_COUNT : n->op, true, n->in[0], n->dev, t0);
    for (int j = 0; j < n->n_in; j++) pl_tensor_release(tmp[j]);
    if (st) pl_error_prefix(st, "backward of '%s'", name);
    return st;
}

static pl_status checkpoint_backward(pl_node *n, pl_tensor **g);

/* Reverse walk over tape[lo..]: every node holding a grad_out passes
 * gradients to its inputs (nodes further back, or leaves' .grad). */
static pl_status backward_from(int64_t lo) {
    pl_status st = PL_OK;
    for (int64_t i = tl_tape_n - 1; i >= lo && !st; i--) {
        pl_node *n = tl_tape[i];
        if (!n->grad_out) continue;
        pl_tensor *g[PL_MAX_OP_INPUTS] = {0};
        st = n->ckpt_fn ? checkpoint_backward(n, g) : node_backward(n, g);
        for (int j = 0; j < n->n_in; j++) {
            if (!g[j]) continue;
            if (!st)
                st = give_grad(n->in[j], g[j]);
            else
                pl_tensor_release(g[j]);
        }
        /* free this node's gradient early: nothing downstream needs it */
        pl_tensor_release(n->grad_out);
        n->grad_out = NULL;
    }
    return st;
}

/* ---- what the tape holds, by op (PL_TAPE_REPORT=1: printed at each backward) ----
 * Bytes of the distinct storages the tape keeps (inputs kept whole, saved
 * tensors, a checkpoint node's output), each counted once, under the op of
 * the oldest node keeping it. Leaves that require grad or have a name
 * (parameters, frozen weights: alive without the tape) are left out. */
pl_status pl_tape_held_bytes(size_t *per_op, int n_ops, size_t *total) {
    int64_t cap = 64;
    while (cap < 4 * (tl_tape_n * (PL_MAX_OP_INPUTS + MAX_SAVED + 1) + 1)) cap *= 2;
    const pl_storage **seen = calloc((size_t)cap, sizeof *seen);
    if (!seen) return pl_error_set(PL_ERR_NOMEM, "pl_tape_held_bytes: out of memory");
    if (per_op)
        for (int i = 0; i < n_ops; i++) per_op[i] = 0;
    size_t sum = 0;
    for (int64_t i = 0; i < tl_tape_n; i++) {
        pl_node *n = tl_tape[i];
        pl_tensor *held[PL_MAX_OP_INPUTS + MAX_SAVED + 1];
        int nh = 0;
        for (int j = 0; j < n->n_in; j++) held[nh++] = n->in[j];
        for (int j = 0; j < n->n_saved; j++) held[nh++] = n->saved[j];
        if (n->out_strong) held[nh++] = n->out;
        for (int j = 0; j < nh; j++) {
            pl_tensor *t = held[j];
            if (!t || pl_tensor_is_stub(t) || (!t->grad_fn && (t->requires_grad || t->name[0])))
                continue;
            const pl_storage *st = t->storage;
            uint64_t h = ((uintptr_t)st >> 4) * 0x9E3779B97F4A7C15ull;
            int64_t k = (int64_t)(h & (uint64_t)(cap - 1));
            while (seen[k] && seen[k] != st) k = (k + 1) & (cap - 1);
            if (seen[k]) continue;
            seen[k] = st;
            sum += st->capacity;
            int op = n->ckpt_fn ? PL_OP_NONE : n->op;
            if (per_op && op >= 0 && op < n_ops) per_op[op] += st->capacity;
        }
    }
    free(seen);
    if (total) *total = sum;
    return PL_OK;
}

static void tape_report(void) {
    static int on = -1;
    if (on < 0) on = getenv("PL_TAPE_REPORT") && atoi(getenv("PL_TAPE_REPORT")) > 0;
    if (!on) return;
    size_t per[PL_OP_COUNT], total;
    if (pl_tape_held_bytes(per, PL_OP_COUNT, &total)) return;
    fprintf(stderr, "tape: %lld nodes hold %.1f MiB:", (long long)tl_tape_n, total / 1048576.0);
    for (int i = 0; i < PL_OP_COUNT; i++)
        if (per[i] >= 1024 * 1024)
            fprintf(stderr, " %s %.1f", i == PL_OP_NONE ? "checkpoint" : pl_op_name((pl_op)i),
                    per[i] / 1048576.0);
    fprintf(stderr, "\n");
}

pl_status pl_backward(pl_tensor *loss, double grad_scale) {
    tape_report();
    char buf[256];
    if (!loss) return pl_error_status() ? pl_error_status() : pl_error_set(PL_ERR_INVALID, "backward: NULL loss");
    if (!loss->grad_fn) {
        pl_tape_clear();
        return pl_error_set(PL_ERR_INVALID,
                            "backward: %s was not produced by a recorded op (no parameter requires "
                            "grad, or grad mode was off)",
                            pl_tensor_describe(loss, buf, sizeof buf));
    }
    if (pl_tensor_numel(loss) != 1) {
        pl_tape_clear();
        return pl_error_set(PL_ERR_SHAPE, "backward: loss %s must have one element",
                            pl_tensor_describe(loss, buf, sizeof buf));
    }
    pl_node *root = loss->grad_fn;
    root->grad_out = pl_tensor_new_owned(PL_F32, loss->ndim, loss->shape, loss->device);
    if (!root->grad_out || pl_tensor_fill_(root->grad_out, grad_scale)) {
        pl_tape_clear();
        return pl_error_status();
    }
    pl_status st = backward_from(0);
    pl_tape_clear();
    return st;
}

/* ---- activation checkpointing ------------------------------------------------------ */

pl_tensor *pl_checkpoint(pl_checkpoint_fn fn, void *ctx, pl_tensor *const *inputs, int n_in) {
    if (!fn || n_in < 0 || n_in > PL_MAX_OP_INPUTS || (n_in > 0 && !inputs)) {
        pl_error_set(PL_ERR_INVALID, "checkpoint: fn is NULL or n_in = %d is outside 0..%d", n_in,
                     PL_MAX_OP_INPUTS);
        return NULL;
    }
    for (int i = 0; i < n_in; i++)
        if (!inputs[i]) return NULL; /* NULL-propagation, as every op */
    if (!pl_grad_enabled()) return fn(ctx, inputs, n_in);
    /* forward without a tape: fn's temporaries die with the frame */
    bool outer_saw = tl_no_grad_saw_grad;
    tl_no_grad_saw_grad = false;
    pl_no_grad_begin();
    pl_frame_begin();
    pl_tensor *y = fn(ctx, inputs, n_in);
    /* a new header, so that the node never claims a tensor fn passed through */
    pl_tensor *out = y ? pl_tensor_view_owned(y) : NULL;
    /* or fn handed back a tensor requiring grad without an op */
    bool saw = tl_no_grad_saw_grad || (y && y->requires_grad);
    pl_frame_end();
    pl_no_grad_end();
    tl_no_grad_saw_grad = outer_saw || saw;
    if (!out) {
        if (!y && !pl_error_status())
            pl_error_set(PL_ERR_INVALID, "checkpoint: fn returned NULL without setting an error");
        return NULL;
    }
    /* saw: some op in fn read a tensor requiring grad (an input or a parameter) */
    pl_node *n = saw ? tape_push(PL_OP_NONE, NULL, NULL, inputs, n_in, NULL, 0, out) : NULL;
    if (saw && !n) {
        pl_tensor_release(out);
        return NULL;
    }
    if (n) {
        n->ckpt_fn = fn;
        n->ckpt_ctx = ctx;
    }
    return pl_op_result(out);
}

/* Backward of a checkpoint node: recompute fn with grad on over detached
 * aliases of the inputs, onto the tape after the current end, back-propagate
 * grad_out through that segment (parameters' .grad accumulate as usual), hand
 * the aliases' gradients out as g[j], then free the segment. */
static pl_status checkpoint_backward(pl_node *n, pl_tensor **g) {
    char b1[256], b2[256];
    pl_tensor *x[PL_MAX_OP_INPUTS] = {0};
    int64_t mark = tl_tape_n;
    int no_grad = tl_no_grad;
    pl_status st = PL_OK;
    for (int j = 0; j < n->n_in && !st; j++) {
        pl_tensor *in = n->in[j];
        x[j] = in->requires_grad ? pl_tensor_view_owned(in) : pl_tensor_retain(in);
        if (!x[j])
            st = pl_error_status();
        else
            x[j]->requires_grad = in->requires_grad; /* a leaf: grad_fn NULL */
    }
    tl_no_grad = 0;
    pl_frame_begin();
    pl_tensor *y = st ? NULL : n->ckpt_fn(n->ckpt_ctx, x, n->n_in);
    if (!st && !y)
        st = pl_error_status() ? pl_error_status()
                               : pl_error_set(PL_ERR_INVALID, "fn returned NULL without setting "
                                                              "an error");
    if (!st && (y->dtype != n->out->dtype || !pl_tensor_same_shape(y, n->out)))
        st = pl_error_set(PL_ERR_INVALID,
                          "recomputed output %s differs from the forward's %s; fn must be "
                          "deterministic given ctx",
                          pl_tensor_describe(y, b1, sizeof b1),
                          pl_tensor_describe(n->out, b2, sizeof b2));
    if (!st) st = give_grad(y, pl_tensor_retain(n->grad_out));
    if (!st) st = backward_from(mark);
    if (st) pl_error_prefix(st, "backward of checkpoint");
    tape_truncate(mark);
    pl_frame_end();
    tl_no_grad = no_grad;
    for (int j = 0; j < n->n_in; j++) {
        if (!st && x[j]->requires_grad) {
            g[j] = x[j]->grad
                       ? pl_tensor_retain(x[j]->grad)
                       : pl_tensor_new_owned_zeros(PL_F32, x[j]->ndim, x[j]->shape, x[j]->device);
            if (!g[j]) st = pl_error_status();
        }
        pl_tensor_release(x[j]);
    }
    return st;
}

/* ---- custom ops ------------------------------------------------------------------------ */

int pl_custom_op_register(const pl_custom_op *op) {
    if (!op || !op->name || !op->infer || g_n_custom >= 256) {
        pl_error_set(PL_ERR_INVALID, "pl_custom_op_register: invalid descriptor or table full");
        return -1;
    }
    for (int i = 0; i < g_n_custom; i++)
        if (g_custom[i] == op || !strcmp(g_custom[i]->name, op->name)) return PL_OP_CUSTOM_BASE + i;
    g_custom[g_n_custom] = op;
    return PL_OP_CUSTOM_BASE + g_n_custom++;
}

pl_tensor *pl_custom_op_apply(int id, pl_tensor *const *inputs, int n_in, const pl_op_params *p,
                              pl_tensor **extra_outputs) {
    for (int i = 0; i < n_in; i++)
        if (!inputs[i]) return NULL;
    int idx = id - PL_OP_CUSTOM_BASE;
    if (idx < 0 || idx >= g_n_custom) {
        pl_error_set(PL_ERR_INVALID, "custom op id %d is not registered", id);
        return NULL;
    }
    const pl_custom_op *op = g_custom[idx];
    if (n_in < 1 || n_in > PL_MAX_OP_INPUTS) {
        pl_error_set(PL_ERR_INVALID, "custom op '%s': %d inputs (1..%d allowed)", op->name, n_in,
                     PL_MAX_OP_INPUTS);
        return NULL;
    }
    if (pl_check_same_device(op->name, inputs, n_in)) return NULL;
    pl_kernel_args k = {.op = PL_OP_NONE, .n_in = n_in};
    if (p) k.p = *p;
    for (int i = 0; i < n_in; i++) k.in[i] = pl_contiguous_owned(inputs[i]);
    int n_out = 0;
    pl_dtype dts[PL_MAX_OP_OUTPUTS];
    int nds[PL_MAX_OP_OUTPUTS];
    int64_t shapes[PL_MAX_OP_OUTPUTS][PL_MAX_DIMS];
    pl_tensor *result = NULL;
    pl_device dev = inputs[0]->device;
    pl_kernel_fn fwd = op->forward[dev.type];
    if (!fwd) {
        pl_error_set(PL_ERR_UNSUPPORTED, "custom op '%s' has no kernel for this device", op->name);
        goto done;
    }
    if (op->infer(&k, &n_out, dts, nds, shapes)) goto done;
    if (n_out < 1 || n_out > PL_MAX_OP_OUTPUTS) {
        pl_error_set(PL_ERR_INVALID, "custom op '%s': infer gave %d outputs", op->name, n_out);
        goto done;
    }
    k.n_out = n_out;
    for (int i = 0; i < n_out; i++)
        if (!(k.out[i] = pl_tensor_new_owned(dts[i], nds[i], shapes[i], dev))) goto done;
    if (fwd(&k)) {
        pl_error_prefix(pl_error_status(), "custom op '%s'", op->name);
        goto done;
    }
    int ns = op->n_saved_outputs < n_out - 1 ? op->n_saved_outputs : n_out - 1;
    if (record(id, op, p, k.in, n_in, k.out + 1, ns, k.out[0])) goto done;
    result = k.out[0];
    k.out[0] = NULL;
    if (extra_outputs)
        for (int i = 1; i < n_out; i++) {
            extra_outputs[i - 1] = pl_op_result(k.out[i]);
            k.out[i] = NULL;
        }
done:
    for (int i = 0; i < n_in; i++) pl_tensor_release(k.in[i]);
    for (int i = 0; i < k.n_out; i++) pl_tensor_release(k.out[i]);
    return pl_op_result(result);
}
