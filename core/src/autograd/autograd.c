/* autograd.c - the autograd layer above the ops: backward (the reverse walk
 * over the tape, each node's backward kernel), activation checkpointing and
 * custom ops (see autograd.h). Ops record their nodes below it, in tape.c
 * (tensor + ops layer); this file reads the nodes through tape_internal.h
 * and calls ops and kernels, never the reverse (docs/architecture.md,
 * "Layers"). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "op_table.h"
#include "tape_internal.h"

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
    pl_kernel_fn fn = pl_tape_backward_fn(n->op, n->custom, n->dev.type);
    if (!fn)
        return pl_error_set(PL_ERR_UNSUPPORTED, "op '%s' has no backward kernel on backend '%s'",
                            name, pl_tape_backend_name(n->dev.type));
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
    for (int64_t i = pl_tape_size() - 1; i >= lo && !st; i--) {
        pl_node *n = pl_tape_at(i);
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
        /* free this node's gradient and what it kept early: nothing
         * downstream needs them */
        pl_tensor_release(n->grad_out);
        n->grad_out = NULL;
        if (!st) pl_tape_node_drop_saved(n);
    }
    return st;
}

static void tape_report(void) {
    static int on = -1;
    if (on < 0) on = getenv("PL_TAPE_REPORT") && atoi(getenv("PL_TAPE_REPORT")) > 0;
    if (!on) return;
    size_t per[PL_OP_COUNT], total;
    if (pl_tape_held_bytes(per, PL_OP_COUNT, &total)) return;
    fprintf(stderr, "tape: %lld nodes hold %.1f MiB:", (long long)pl_tape_size(), total / 1048576.0);
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
    bool outer_saw = pl_no_grad_saw_grad_swap(false);
    pl_no_grad_begin();
    pl_frame_begin();
    pl_tensor *y = fn(ctx, inputs, n_in);
    /* a new header, so that the node never claims a tensor fn passed through */
    pl_tensor *out = y ? pl_tensor_view_owned(y) : NULL;
    /* or fn handed back a tensor requiring grad without an op */
    bool saw = pl_no_grad_saw_grad_swap(false) || (y && y->requires_grad);
    pl_frame_end();
    pl_no_grad_end();
    pl_no_grad_saw_grad_swap(outer_saw || saw);
    if (!out) {
        if (!y && !pl_error_status())
            pl_error_set(PL_ERR_INVALID, "checkpoint: fn returned NULL without setting an error");
        return NULL;
    }
    /* saw: some op in fn read a tensor requiring grad (an input or a parameter) */
    pl_node *n = saw ? pl_tape_push(PL_OP_NONE, NULL, NULL, inputs, n_in, NULL, 0, out) : NULL;
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
    int64_t mark = pl_tape_size();
    int no_grad = pl_no_grad_depth();
    pl_status st = PL_OK;
    for (int j = 0; j < n->n_in && !st; j++) {
        pl_tensor *in = n->in[j];
        x[j] = in->requires_grad ? pl_tensor_view_owned(in) : pl_tensor_retain(in);
        if (!x[j])
            st = pl_error_status();
        else
            x[j]->requires_grad = in->requires_grad; /* a leaf: grad_fn NULL */
    }
    pl_no_grad_set_depth(0);
    /* the recompute's temporaries go as soon as it returns: the segment's
     * tape keeps what its backward reads (a frame held every intermediate
     * of the layer until the segment's backward had run) */
    pl_frame_begin();
    pl_tensor *y = st ? NULL : pl_tensor_retain(n->ckpt_fn(n->ckpt_ctx, x, n->n_in));
    pl_frame_end();
    if (!st && !y)
        st = pl_error_status() ? pl_error_status()
                               : pl_error_set(PL_ERR_INVALID, "fn returned NULL without setting "
                                                              "an error");
    if (!st && (y->dtype != n->out_meta->dtype || !pl_tensor_same_shape(y, n->out_meta)))
        st = pl_error_set(PL_ERR_INVALID,
                          "recomputed output %s differs from the forward's %s; fn must be "
                          "deterministic given ctx",
                          pl_tensor_describe(y, b1, sizeof b1),
                          pl_tensor_describe(n->out_meta, b2, sizeof b2));
    if (!st) st = give_grad(y, pl_tensor_retain(n->grad_out));
    if (!st) st = backward_from(mark);
    if (st) pl_error_prefix(st, "backward of checkpoint");
    pl_tape_truncate(mark);
    pl_tensor_release(y);
    pl_no_grad_set_depth(no_grad);
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

static const pl_custom_op *g_custom[256];
static int g_n_custom;

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
    if (pl_tape_record_custom(id, op, p, k.in, n_in, k.out + 1, ns, k.out[0])) goto done;
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
