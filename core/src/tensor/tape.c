/* tape.c - the recording side of autograd: grad mode, the thread's tape of
 * nodes that ops append as they run (pl_autograd_record), what a node keeps
 * of its inputs, and freeing it. Part of the tensor + ops layer: an op
 * records its node here, and nothing here calls backward; backward,
 * activation checkpointing and custom ops (autograd.c, the layer above) walk
 * the nodes through tape_internal.h. */
#include <stdlib.h>
#include <string.h>

#include "op_table.h"
#include "tape_internal.h"

/* ---- per-thread state ------------------------------------------------------ */

static _Thread_local int tl_no_grad;
/* set when an op under no-grad had an input requiring grad: pl_checkpoint's
 * forward learns from it whether fn's result would have been recorded */
static _Thread_local bool tl_no_grad_saw_grad;
static _Thread_local pl_node **tl_tape;
static _Thread_local int64_t tl_tape_n, tl_tape_cap;
static _Thread_local pl_node *tl_node_pool[1024];
static _Thread_local int tl_node_pool_n;

/* ---- grad mode ----------------------------------------------------------------- */

bool pl_grad_enabled(void) { return tl_no_grad == 0; }
void pl_no_grad_begin(void) { tl_no_grad++; }
void pl_no_grad_end(void) {
    if (tl_no_grad > 0) tl_no_grad--;
}
int pl_no_grad_depth(void) { return tl_no_grad; }
void pl_no_grad_set_depth(int depth) { tl_no_grad = depth > 0 ? depth : 0; }
bool pl_no_grad_saw_grad_swap(bool v) {
    bool was = tl_no_grad_saw_grad;
    tl_no_grad_saw_grad = v;
    return was;
}

void pl_tensor_set_requires_grad(pl_tensor *t, bool on) {
    if (t) t->requires_grad = on;
}

void pl_tensor_zero_grad(pl_tensor *t) {
    if (t && t->grad) pl_tensor_fill_(t->grad, 0.0);
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
    pl_tensor_release(n->out_meta);
    n->out_meta = NULL;
    n->out = NULL;
    pl_tensor_release(n->grad_out);
    if (tl_node_pool_n < 1024)
        tl_node_pool[tl_node_pool_n++] = n;
    else
        free(n);
}

void pl_tape_node_drop_saved(pl_node *n) {
    for (int i = 0; i < n->n_in; i++) {
        pl_tensor *x = n->in[i];
        /* parameters (leaves requiring grad) hold no activation memory */
        if (!x || pl_tensor_is_stub(x) || (x->requires_grad && !x->grad_fn)) continue;
        pl_tensor *s = pl_tensor_stub_owned(x);
        if (!s) { /* out of memory for a header: keep the tensor until the tape ends */
            pl_error_clear();
            continue;
        }
        n->in[i] = s;
        pl_tensor_release(x);
    }
    for (int i = 0; i < n->n_saved; i++) {
        pl_tensor_release(n->saved[i]);
        n->saved[i] = NULL;
    }
}

const char *pl_tape_backend_name(pl_device_type dev) {
    const pl_backend *b = pl_backend_get(dev);
    return b && b->name ? b->name : dev == PL_DEVICE_CUDA ? "cuda" : "cpu";
}

pl_kernel_fn pl_tape_backward_fn(int op, const pl_custom_op *custom, pl_device_type dev) {
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

/* Append a node out = op(inputs) to the tape; retains what backward reads of
 * the inputs (the rest as stubs) and saved; out only for a checkpoint node. */
pl_node *pl_tape_push(int op, const pl_custom_op *custom, const pl_op_params *p,
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
    if (op == PL_OP_NONE && !custom && !(n->out_meta = pl_tensor_stub_owned(out))) { /* a checkpoint node */
        node_free(n);
        return NULL;
    }
    n->out = out;
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
    if (n_in > PL_MAX_OP_INPUTS || n_saved > PL_TAPE_MAX_SAVED)
        return pl_error_set(PL_ERR_INTERNAL, "%s: too many inputs/saved tensors to record", name);
    if (!pl_tape_backward_fn(op, custom, out->device.type))
        return pl_error_set(PL_ERR_UNSUPPORTED,
                            "op '%s' has no backward kernel on backend '%s', but an input "
                            "requires grad; wrap the call in pl_no_grad_begin/end or detach the "
                            "input",
                            name, pl_tape_backend_name(out->device.type));
    return pl_tape_push(op, custom, p, inputs, n_in, saved, n_saved, out) ? PL_OK : pl_error_status();
}

pl_status pl_tape_record_custom(int id, const pl_custom_op *custom, const pl_op_params *p,
                                pl_tensor *const *inputs, int n_in, pl_tensor *const *saved,
                                int n_saved, pl_tensor *out) {
    return record(id, custom, p, inputs, n_in, saved, n_saved, out);
}

pl_status pl_autograd_record(pl_op op, const pl_op_params *p, pl_tensor *const *inputs, int n_in,
                             pl_tensor *const *saved, int n_saved, pl_tensor *out) {
    return record(op, NULL, p, inputs, n_in, saved, n_saved, out);
}

void pl_tape_truncate(int64_t mark) {
    for (int64_t i = tl_tape_n - 1; i >= mark; i--)
        node_free(tl_tape[i]);
    tl_tape_n = mark;
}

void pl_tape_clear(void) { pl_tape_truncate(0); }

int64_t pl_tape_size(void) { return tl_tape_n; }

pl_node *pl_tape_at(int64_t i) { return i >= 0 && i < tl_tape_n ? tl_tape[i] : NULL; }


/* ---- what the tape holds, by op (PL_TAPE_REPORT=1: printed at each backward) ----
 * Bytes of the distinct storages the tape keeps (inputs kept whole, saved
 * tensors, a checkpoint node's output), each counted once, under the op of
 * the oldest node keeping it. Leaves that require grad or have a name
 * (parameters, frozen weights: alive without the tape) are left out. */
pl_status pl_tape_held_bytes(size_t *per_op, int n_ops, size_t *total) {
    int64_t cap = 64;
    while (cap < 4 * (tl_tape_n * (PL_MAX_OP_INPUTS + PL_TAPE_MAX_SAVED + 1) + 1)) cap *= 2;
    const pl_storage **seen = calloc((size_t)cap, sizeof *seen);
    if (!seen) return pl_error_set(PL_ERR_NOMEM, "pl_tape_held_bytes: out of memory");
    if (per_op)
        for (int i = 0; i < n_ops; i++) per_op[i] = 0;
    size_t sum = 0;
    for (int64_t i = 0; i < tl_tape_n; i++) {
        pl_node *n = tl_tape[i];
        pl_tensor *held[PL_MAX_OP_INPUTS + PL_TAPE_MAX_SAVED + 1];
        int nh = 0;
        for (int j = 0; j < n->n_in; j++) held[nh++] = n->in[j];
        for (int j = 0; j < n->n_saved; j++) held[nh++] = n->saved[j];
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

/* Run k's forward kernel and record out[0] = op(k->in[0..n_in)) with
 * `saved`. Consumes the caller's references on k->in[*] and k->out[1..];
 * returns out[0] handed to the frame, or NULL (everything released). */
pl_tensor *pl_op_finish(pl_kernel_args *k, pl_tensor *const *saved, int n_saved) {
    pl_tensor *out = k->out[0];
    pl_status st = PL_OK;
    for (int i = 0; i < k->n_out; i++)
        if (!k->out[i]) st = PL_ERR_NOMEM;
    if (!st) st = pl_kernel_forward(k);
    if (!st) st = pl_autograd_record(k->op, &k->p, k->in, k->n_in, saved, n_saved, out);
    for (int i = 0; i < k->n_in; i++)
        pl_tensor_release(k->in[i]);
    for (int i = 1; i < k->n_out; i++)
        pl_tensor_release(k->out[i]);
    if (st) {
        pl_tensor_release(out);
        return NULL;
    }
    return pl_op_result(out);
}

void pl_tensors_release(pl_tensor **ts, int n) {
    for (int i = 0; i < n; i++)
        pl_tensor_release(ts[i]);
}
