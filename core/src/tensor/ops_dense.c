/* ops_dense.c - the dense differentiable ops of ops.h: matmul / linear,
 * broadcasting arithmetic, reductions, activations, softmax, losses,
 * normalization and cast. Kernels live in cpu/kernels_dense.c.
 *
 * Half precision: matmul and cast take bf16 / f16 directly. Every other op
 * here is recorded with its half tensors as they are and returns the input
 * dtype (binary ops of two different dtypes promote to f32, as torch's type
 * promotion does for bf16 + f32); the dispatch widens them around kernels
 * that compute on f32 data (half_io.c), so the tape keeps half tensors and
 * no recorded casts.
 */
#include <math.h>
#include <string.h>

#include "graph_internal.h"
#include "internal.h"

/* ---- plumbing ------------------------------------------------------------- */

/* Run k (inputs / outputs owned references; out[1..] are saved for
 * backward, after out[0] itself for an op whose derivative reads its output:
 * pl_autograd_saves_output), record it and hand out[0] to the frame.
 * Releases everything else. */
static pl_tensor *launch(pl_kernel_args *k) {
    bool keep_out = pl_autograd_saves_output(k->op); /* its output, when backward reads it */
    return pl_op_finish(k, k->out + !keep_out, k->n_out - !keep_out);
}

/* Contiguous owned copies of n inputs into k->in; false (all released) on error. */
static bool take_inputs(pl_kernel_args *k, pl_tensor *const *ts, int n) {
    k->n_in = n;
    for (int i = 0; i < n; i++) {
        k->in[i] = pl_contiguous_owned(ts[i]);
        if (!k->in[i]) {
            for (int j = 0; j < i; j++)
                pl_tensor_release(k->in[j]);
            return false;
        }
    }
    return true;
}

/* Close a private frame opened by a composite op, keeping its result r. */
static pl_tensor *frame_result(pl_tensor *r) {
    if (r) pl_frame_keep(r);
    pl_frame_end();
    return r ? pl_op_result(r) : NULL;
}

static const int64_t *shape0(const pl_tensor *t) {
    return t->shape;
}

/* ---- elementwise binary ---------------------------------------------------------- */

static pl_tensor *binary(const char *name, pl_op op, pl_tensor *a, pl_tensor *b) {
    if (!a || !b) return NULL;
    pl_tensor *ts[2] = {a, b};
    if (pl_check_float(name, a, true) || pl_check_float(name, b, true) ||
        pl_check_same_device(name, ts, 2))
        return NULL;
    int nd;
    int64_t shape[PL_MAX_DIMS];
    if (pl_broadcast_shapes(name, a, b, &nd, shape)) return NULL;
    pl_kernel_args k = {.op = op, .n_out = 1};
    if (!take_inputs(&k, ts, 2)) return NULL;
    k.out[0] = pl_tensor_new_owned(a->dtype == b->dtype ? a->dtype : PL_F32, nd, shape, a->device);
    return launch(&k);
}

pl_tensor *pl_add(pl_tensor *a, pl_tensor *b) {
    return binary("add", PL_OP_ADD, a, b);
}
pl_tensor *pl_sub(pl_tensor *a, pl_tensor *b) {
    return binary("sub", PL_OP_SUB, a, b);
}
pl_tensor *pl_mul(pl_tensor *a, pl_tensor *b) {
    return binary("mul", PL_OP_MUL, a, b);
}
pl_tensor *pl_div(pl_tensor *a, pl_tensor *b) {
    return binary("div", PL_OP_DIV, a, b);
}

/* ---- elementwise unary (scalar ops and activations) ------------------------------- */

static pl_tensor *unary_ab(const char *name, pl_op op, pl_tensor *a, double alpha, double beta,
                           int flags) {
    if (!a) return NULL;
    if (pl_check_float(name, a, true)) return NULL;
    pl_kernel_args k = {.op = op, .n_out = 1};
    k.p.alpha = alpha;
    k.p.beta = beta;
    k.p.flags = flags;
    if (!take_inputs(&k, &a, 1)) return NULL;
    k.out[0] = pl_tensor_new_owned(a->dtype, a->ndim, shape0(a), a->device);
    return launch(&k);
}

static pl_tensor *unary(const char *name, pl_op op, pl_tensor *a, double alpha, int flags) {
    return unary_ab(name, op, a, alpha, 0.0, flags);
}

pl_tensor *pl_clamp(pl_tensor *a, double min, double max) {
    if (!(min <= max)) {
        pl_error_set(PL_ERR_INVALID, "clamp: min %g > max %g (or NaN)", min, max);
        return NULL;
    }
    return unary_ab("clamp", PL_OP_CLAMP, a, min, max, 0);
}

pl_tensor *pl_scale(pl_tensor *a, double s) {
    return unary("scale", PL_OP_SCALE, a, s, 0);
}
pl_tensor *pl_add_scalar(pl_tensor *a, double s) {
    return unary("add_scalar", PL_OP_ADD_SCALAR, a, s, 0);
}
pl_tensor *pl_relu(pl_tensor *a) {
    return unary("relu", PL_OP_RELU, a, 0, 0);
}
pl_tensor *pl_leaky_relu(pl_tensor *a, double negative_slope) {
    return unary("leaky_relu", PL_OP_LEAKY_RELU, a, negative_slope, 0);
}
pl_tensor *pl_elu(pl_tensor *a, double alpha) {
    return unary("elu", PL_OP_ELU, a, alpha, 0);
}
pl_tensor *pl_gelu(pl_tensor *a, bool tanh_approx) {
    return unary("gelu", PL_OP_GELU, a, 0, tanh_approx ? 1 : 0);
}
pl_tensor *pl_silu(pl_tensor *a) {
    return unary("silu", PL_OP_SILU, a, 0, 0);
}
pl_tensor *pl_sigmoid(pl_tensor *a) {
    return unary("sigmoid", PL_OP_SIGMOID, a, 0, 0);
}
pl_tensor *pl_tanh(pl_tensor *a) {
    return unary("tanh", PL_OP_TANH, a, 0, 0);
}
pl_tensor *pl_exp(pl_tensor *a) {
    return unary("exp", PL_OP_EXP, a, 0, 0);
}
pl_tensor *pl_log(pl_tensor *a) {
    return unary("log", PL_OP_LOG, a, 0, 0);
}
pl_tensor *pl_square(pl_tensor *a) {
    return unary("square", PL_OP_SQUARE, a, 0, 0);
}
pl_tensor *pl_sqrt(pl_tensor *a) {
    return unary("sqrt", PL_OP_SQRT, a, 0, 0);
}
pl_tensor *pl_swiglu(pl_tensor *gate, pl_tensor *up) {
    if (!gate || !up) return NULL;
    pl_tensor *ts[2] = {gate, up};
    if (pl_check_float("swiglu", gate, true) || pl_check_float("swiglu", up, true) ||
        pl_check_same_device("swiglu", ts, 2))
        return NULL;
    if (!pl_tensor_same_shape(gate, up)) {
        char bg[160], bu[160];
        pl_error_set(PL_ERR_SHAPE, "swiglu: gate %s and up %s must have the same shape",
                     pl_tensor_describe(gate, bg, sizeof bg), pl_tensor_describe(up, bu, sizeof bu));
        return NULL;
    }
    /* as pl_mul(pl_silu(gate), up) would: silu(gate) rounded to gate's
     * dtype (p.dtype), the product returned in the operands' common dtype
     * (f32 when they differ) */
    pl_kernel_args k = {.op = PL_OP_SWIGLU, .n_out = 1};
    k.p.dtype = gate->dtype;
    if (!take_inputs(&k, ts, 2)) return NULL;
    k.out[0] = pl_tensor_new_owned(gate->dtype == up->dtype ? gate->dtype : PL_F32, gate->ndim,
                                   shape0(gate), gate->device);
    return launch(&k);
}

pl_tensor *pl_softmax(pl_tensor *a) {
    return unary("softmax", PL_OP_SOFTMAX, a, 0, 0);
}
pl_tensor *pl_log_softmax(pl_tensor *a) {
    return unary("log_softmax", PL_OP_LOG_SOFTMAX, a, 0, 0);
}

/* ---- reductions -------------------------------------------------------------------- */

static pl_tensor *reduce(const char *name, pl_op op, pl_tensor *a, int dim, bool keepdim) {
    if (!a) return NULL;
    if (pl_check_float(name, a, true)) return NULL;
    int d = PL_ALL_DIMS;
    if (dim != PL_ALL_DIMS) {
        d = pl_tensor_dim(a, dim);
        if (d < 0) {
            char buf[160];
            pl_error_set(PL_ERR_SHAPE, "%s: dim %d out of range for %s", name, dim,
                         pl_tensor_describe(a, buf, sizeof buf));
            return NULL;
        }
    }
    int nd = 0;
    int64_t shape[PL_MAX_DIMS];
    for (int i = 0; i < a->ndim; i++) {
        bool reduced = d == PL_ALL_DIMS || i == d;
        if (reduced && !keepdim) continue;
        shape[nd++] = reduced ? 1 : a->shape[i];
    }
    pl_kernel_args k = {.op = op, .n_out = 1};
    k.p.dim = d;
    k.p.flags = keepdim ? 1 : 0;
    if (!take_inputs(&k, &a, 1)) return NULL;
    k.out[0] = pl_tensor_new_owned(a->dtype, nd, shape, a->device);
    return launch(&k);
}

pl_tensor *pl_sum(pl_tensor *a, int dim, bool keepdim) {
    return reduce("sum", PL_OP_SUM, a, dim, keepdim);
}
pl_tensor *pl_mean(pl_tensor *a, int dim, bool keepdim) {
    return reduce("mean", PL_OP_MEAN, a, dim, keepdim);
}

/* ---- matmul / linear ------------------------------------------------------------------ */

pl_tensor *pl_matmul(pl_tensor *a, pl_tensor *b, bool trans_a, bool trans_b) {
    if (!a || !b) return NULL;
    pl_tensor *ts[2] = {a, b};
    if (pl_check_float("matmul", a, true) || pl_check_float("matmul", b, true) ||
        pl_check_same_device("matmul", ts, 2) || pl_check_ndim("matmul", a, 2, PL_MAX_DIMS) ||
        pl_check_ndim("matmul", b, 2, PL_MAX_DIMS))
        return NULL;
    pl_dtype ac = pl_autocast_get();
    if ((ac == PL_BF16 || ac == PL_F16) && (a->dtype != ac || b->dtype != ac)) {
        pl_frame_begin();
        /* a trainable parameter is cast once per forward (autocast_cache.c);
         * a frozen one's copy is not kept for backward, but cast again there */
        pl_tensor *ca = pl_autocast_operand(a, ac), *cb = pl_autocast_operand(b, ac);
        pl_autocast_recast_hint(0, ca, a);
        pl_autocast_recast_hint(1, cb, b);
        pl_tensor *r = pl_matmul(ca, cb, trans_a, trans_b);
        pl_autocast_recast_hint(0, NULL, NULL);
        pl_autocast_recast_hint(1, NULL, NULL);
        return frame_result(r);
    }
    char ba[160], bb[160];
    if (a->dtype != b->dtype || a->dtype == PL_F64) {
        pl_error_set(PL_ERR_DTYPE,
                     "matmul: operands must share one dtype of f32/bf16/f16, found %s and %s",
                     pl_tensor_describe(a, ba, sizeof ba), pl_tensor_describe(b, bb, sizeof bb));
        return NULL;
    }
    int na = a->ndim, nb = b->ndim;
    int64_t M = trans_a ? a->shape[na - 1] : a->shape[na - 2];
    int64_t K = trans_a ? a->shape[na - 2] : a->shape[na - 1];
    int64_t Kb = trans_b ? b->shape[nb - 1] : b->shape[nb - 2];
    int64_t N = trans_b ? b->shape[nb - 2] : b->shape[nb - 1];
    if (K != Kb) {
        pl_error_set(PL_ERR_SHAPE, "matmul: inner dims differ: %s%s has K=%lld, %s%s has K=%lld",
                     pl_tensor_describe(a, ba, sizeof ba), trans_a ? " (transposed)" : "",
                     (long long)K, pl_tensor_describe(b, bb, sizeof bb),
                     trans_b ? " (transposed)" : "", (long long)Kb);
        return NULL;
    }
    /* broadcast batch dims */
    int bnd = (na > nb ? na : nb) - 2;
    int64_t shape[PL_MAX_DIMS];
    for (int d = 0; d < bnd; d++) {
        int da = d - (bnd - (na - 2)), db = d - (bnd - (nb - 2));
        int64_t ea = da >= 0 ? a->shape[da] : 1, eb = db >= 0 ? b->shape[db] : 1;
        if (ea != eb && ea != 1 && eb != 1) {
            pl_error_set(PL_ERR_SHAPE, "matmul: batch dims of %s and %s do not broadcast",
                         pl_tensor_describe(a, ba, sizeof ba),
                         pl_tensor_describe(b, bb, sizeof bb));
            return NULL;
        }
        shape[d] = ea == 1 ? eb : ea;
    }
    shape[bnd] = M;
    shape[bnd + 1] = N;
    pl_kernel_args k = {.op = PL_OP_MATMUL, .n_out = 1};
    k.p.flags = (trans_a ? 1 : 0) | (trans_b ? 2 : 0);
    if (!take_inputs(&k, ts, 2)) return NULL;
    k.out[0] = pl_tensor_new_owned(a->dtype, bnd + 2, shape, a->device);
    return launch(&k);
}

pl_tensor *pl_linear(pl_tensor *x, pl_tensor *w, pl_tensor *b) {
    if (!x || !w) return NULL;
    if (pl_check_ndim("linear", w, 2, 2) || pl_check_ndim("linear", x, 1, PL_MAX_DIMS) ||
        (b && pl_check_ndim("linear", b, 1, 1)))
        return NULL;
    char bx[160], bw[160];
    if (x->shape[x->ndim - 1] != w->shape[1] || (b && b->shape[0] != w->shape[0])) {
        pl_error_set(PL_ERR_SHAPE, "linear: x %s, weight %s (expected [out, %lld]), bias [%lld]",
                     pl_tensor_describe(x, bx, sizeof bx), pl_tensor_describe(w, bw, sizeof bw),
                     (long long)x->shape[x->ndim - 1], b ? (long long)b->shape[0] : 0LL);
        return NULL;
    }
    pl_frame_begin();
    pl_tensor *xx = x;
    if (x->ndim == 1) xx = pl_reshape(x, PL_SHAPE(1, x->shape[0]));
    pl_tensor *y = pl_matmul(xx, w, false, true);
    if (b) {
        pl_dtype ac = pl_autocast_get();
        pl_tensor *bb = b;
        /* torch.autocast runs the whole linear (bias included) in the autocast dtype */
        if ((ac == PL_BF16 || ac == PL_F16) && b->dtype != ac) bb = pl_autocast_operand(b, ac);
        y = pl_add(y, bb);
    }
    if (y && x->ndim == 1) y = pl_reshape(y, PL_SHAPE(w->shape[0]));
    return frame_result(y);
}

/* ---- LoRA / MoE-LoRA branch (ops.h pl_lora_add) ----------------------------------------- */

static bool lora_float(const pl_tensor *t) {
    return t->dtype == PL_F32 || t->dtype == PL_BF16 || t->dtype == PL_F16;
}

/* gexp [.., R] against x [.., D]: same ndim, x's leading dims or a prefix of
 * them followed by 1s */
static bool lora_gate_fits(const pl_tensor *g, const pl_tensor *x, int64_t R) {
    if (g->ndim != x->ndim || g->shape[g->ndim - 1] != R) return false;
    bool ones = false;
    for (int d = 0; d < x->ndim - 1; d++) {
        if (!ones && g->shape[d] == x->shape[d]) continue;
        if (g->shape[d] != 1) return false;
        ones = true;
    }
    return true;
}

/* The dropout of x inside lora_add (pl_lora_add_dropout): on iff p > 0
 * and training. autocast: set by the autocast branch, x keeps its own
 * dtype (the kernel rounds drop(x) to A's, the chain's dropout then cast). */
typedef struct lora_drop {
    double p;
    uint64_t seed, counter;
    bool autocast;
} lora_drop;

static pl_tensor *lora_add_impl(pl_tensor *y, pl_tensor *x, pl_tensor *a, pl_tensor *b,
                                pl_tensor *gexp, double scale, const lora_drop *drop) {
    if (!x || !a || !b) return NULL;
    const char *op = "lora_add";
    pl_tensor *ts[5] = {x, a, b, gexp, y};
    int nt = 3;
    if (gexp) ts[nt++] = gexp;
    if (y) ts[nt++] = y;
    for (int i = 0; i < nt; i++)
        if (pl_check_float(op, ts[i], true)) return NULL;
    if (pl_check_same_device(op, ts, nt) || pl_check_ndim(op, x, 1, PL_MAX_DIMS) ||
        pl_check_ndim(op, a, 2, 2) || pl_check_ndim(op, b, 2, 2))
        return NULL;
    if (!isfinite(scale)) {
        pl_error_set(PL_ERR_INVALID, "lora_add: scale %g is not finite", scale);
        return NULL;
    }
    char bx[160], ba[160], bb[160], bo[160];
    int64_t D = x->shape[x->ndim - 1], R = a->shape[0], O = b->shape[0];
    if (a->shape[1] != D || b->shape[1] != R) {
        pl_error_set(PL_ERR_SHAPE,
                     "lora_add: x %s, A %s, B %s: expected A [R, %lld] and B [O, R] with R = A's "
                     "rows",
                     pl_tensor_describe(x, bx, sizeof bx), pl_tensor_describe(a, ba, sizeof ba),
                     pl_tensor_describe(b, bb, sizeof bb), (long long)D);
        return NULL;
    }
    int64_t oshape[PL_MAX_DIMS], tshape[PL_MAX_DIMS];
    memcpy(oshape, x->shape, sizeof oshape);
    memcpy(tshape, x->shape, sizeof tshape);
    oshape[x->ndim - 1] = O;
    tshape[x->ndim - 1] = R;
    if (y) {
        bool fits = y->ndim == x->ndim;
        for (int d = 0; fits && d < x->ndim; d++)
            fits = y->shape[d] == oshape[d];
        if (!fits) {
            pl_error_set(PL_ERR_SHAPE,
                         "lora_add: y %s must be x %s's leading dims by B's %lld rows",
                         pl_tensor_describe(y, bo, sizeof bo), pl_tensor_describe(x, bx, sizeof bx),
                         (long long)O);
            return NULL;
        }
    }
    if (gexp && !lora_gate_fits(gexp, x, R)) {
        pl_error_set(PL_ERR_SHAPE,
                     "lora_add: gexp %s must be [.., %lld] with x %s's leading dims (or a prefix "
                     "of them, then 1s)",
                     pl_tensor_describe(gexp, bo, sizeof bo), (long long)R,
                     pl_tensor_describe(x, bx, sizeof bx));
        return NULL;
    }
    pl_dtype ac = pl_autocast_get();
    /* with dropout x is not cast (drop->autocast below): the kernel drops it
     * and rounds drop(x) to the autocast dtype, as torch's dropout on f32 x
     * then lora_A's cast; the tape keeps x itself, not a half copy */
    bool x_own = drop && drop->autocast;
    if ((ac == PL_BF16 || ac == PL_F16) &&
        ((x->dtype != ac && !x_own) || a->dtype != ac || b->dtype != ac)) {
        /* as pl_linear: every GEMM operand in the autocast dtype, a
         * trainable A / B cast once per forward (autocast_cache.c) */
        pl_frame_begin();
        lora_drop d2 = drop ? *drop : (lora_drop){0};
        d2.autocast = true;
        pl_tensor *r = lora_add_impl(y, drop ? x : pl_autocast_operand(x, ac),
                                     pl_autocast_operand(a, ac), pl_autocast_operand(b, ac), gexp,
                                     scale, drop ? &d2 : NULL);
        return frame_result(r);
    }
    if ((x->dtype != a->dtype && !x_own) || a->dtype != b->dtype || !lora_float(x) ||
        !lora_float(a) || (y && !lora_float(y)) || (gexp && !lora_float(gexp))) {
        pl_error_set(PL_ERR_DTYPE,
                     "lora_add: x %s, A %s, B %s must share one dtype of f32/bf16/f16 (y and "
                     "gexp: f32/bf16/f16)",
                     pl_tensor_describe(x, bx, sizeof bx), pl_tensor_describe(a, ba, sizeof ba),
                     pl_tensor_describe(b, bb, sizeof bb));
        return NULL;
    }
    pl_dtype c = a->dtype; /* x's, but under autocast with dropout (x_own) */
    pl_kernel_args k = {.op = PL_OP_LORA_ADD, .n_out = 2};
    k.p.alpha = scale;
    k.p.dtype = c;
    k.p.flags = y ? 0 : 1;
    if (drop) {
        /* bit1: drop x with p.beta = p, p.seed, p.counter (ops.def) */
        k.p.flags |= 2;
        k.p.beta = drop->p;
        k.p.seed = drop->seed;
        k.p.counter = drop->counter;
        if (pl_graph_dropout_active()) { /* a captured graph: as pl_dropout (backward too) */
            int64_t stride = 0;
            pl_tensor *delta = pl_graph_dropout_offset(drop->counter, &stride);
            if (!delta && pl_graph_capturing()) return NULL;
            k.p.extra = delta;
            k.p.start = stride;
        }
    }
    pl_tensor *in[5] = {y, x, a, b, gexp};
    if (!take_inputs(&k, in + 1, gexp ? 4 : 3)) return NULL;
    /* in = {y or a placeholder, x, A, B[, gexp]} */
    memmove(k.in + 1, k.in, (size_t)k.n_in * sizeof k.in[0]);
    k.n_in++;
    if (y) {
        k.in[0] = pl_contiguous_owned(y);
    } else if ((k.in[0] = pl_tensor_stub_owned(x))) { /* no data, no gradient */
        k.in[0]->requires_grad = false;
        k.in[0]->grad_fn = NULL;
    }
    if (!k.in[0]) {
        pl_tensors_release(k.in + 1, k.n_in - 1);
        return NULL;
    }
    pl_dtype odt = y && y->dtype != c ? PL_F32 : c;
    k.out[0] = pl_tensor_new_owned(odt, x->ndim, oshape, x->device);
    k.out[1] = pl_tensor_new_owned(c, x->ndim, tshape, x->device);
    return launch(&k);
}

pl_tensor *pl_lora_add(pl_tensor *y, pl_tensor *x, pl_tensor *a, pl_tensor *b, pl_tensor *gexp,
                       double scale) {
    return lora_add_impl(y, x, a, b, gexp, scale, NULL);
}

pl_tensor *pl_lora_add_dropout(pl_tensor *y, pl_tensor *x, pl_tensor *a, pl_tensor *b,
                               pl_tensor *gexp, double scale, double p, uint64_t seed,
                               uint64_t counter, bool training) {
    if (!(p >= 0.0 && p <= 1.0)) {
        pl_error_set(PL_ERR_INVALID, "lora_add: dropout probability %g outside [0, 1]", p);
        return NULL;
    }
    /* a backend built before ABI 2.12 would ignore the dropout bit: the chain, same bits */
    if (x && training && p > 0.0 && !pl_backend_promises(x->device, "lora_add_dropout"))
        return pl_lora_add(y, pl_dropout(x, p, seed, counter, true), a, b, gexp, scale);
    lora_drop d = {.p = p, .seed = seed, .counter = counter};
    return lora_add_impl(y, x, a, b, gexp, scale, training && p > 0.0 ? &d : NULL);
}

/* ---- losses ------------------------------------------------------------------------------ */

pl_tensor *pl_cross_entropy(pl_tensor *logits, pl_tensor *target, int64_t ignore_index,
                            double label_smoothing) {
    if (!logits || !target) return NULL;
    pl_tensor *ts[2] = {logits, target};
    if (pl_check_float("cross_entropy", logits, true) || pl_check_index("cross_entropy", target) ||
        pl_check_same_device("cross_entropy", ts, 2) ||
        pl_check_ndim("cross_entropy", logits, 2, 2) ||
        pl_check_ndim("cross_entropy", target, 1, 1))
        return NULL;
    if (target->shape[0] != logits->shape[0]) {
        char bl[160], bt[160];
        pl_error_set(PL_ERR_SHAPE, "cross_entropy: logits %s and target %s: expected [N, C], [N]",
                     pl_tensor_describe(logits, bl, sizeof bl),
                     pl_tensor_describe(target, bt, sizeof bt));
        return NULL;
    }
    if (!(label_smoothing >= 0.0 && label_smoothing <= 1.0)) {
        pl_error_set(PL_ERR_INVALID, "cross_entropy: label_smoothing %g outside [0, 1]",
                     label_smoothing);
        return NULL;
    }
    /* half logits are recorded as they are: the CPU kernel reads bf16 in
     * place, other kernels get a transient f32 copy (half_io.c) */
    pl_kernel_args k = {.op = PL_OP_CROSS_ENTROPY, .n_out = 2};
    k.p.ignore_index = ignore_index;
    k.p.alpha = label_smoothing;
    if (!take_inputs(&k, ts, 2)) return NULL;
    k.out[0] = pl_tensor_new_owned(PL_F32, 0, NULL, logits->device);
    k.out[1] = pl_tensor_new_owned(PL_F32, 1, logits->shape, logits->device);
    return launch(&k);
}

/* The fused head + loss (ops.h); the chain where the device does not
 * promise the kernel, autocast or a half operand asks for the matmul's
 * dtype, or a dimension is empty. */
pl_tensor *pl_linear_cross_entropy(pl_tensor *x, pl_tensor *weight, pl_tensor *target,
                                   int64_t ignore_index, double label_smoothing) {
    static const char *op = "linear_cross_entropy";
    if (!x || !weight || !target) return NULL;
    pl_tensor *ts[3] = {x, weight, target};
    if (pl_check_float(op, x, true) || pl_check_float(op, weight, true) ||
        pl_check_index(op, target) || pl_check_same_device(op, ts, 3) ||
        pl_check_ndim(op, x, 2, 2) || pl_check_ndim(op, weight, 2, 2) ||
        pl_check_ndim(op, target, 1, 1))
        return NULL;
    if (weight->shape[1] != x->shape[1] || target->shape[0] != x->shape[0]) {
        char bx[160], bw[160], bt[160];
        pl_error_set(PL_ERR_SHAPE, "%s: x %s, weight %s, target %s: expected [N, K], [V, K], [N]",
                     op, pl_tensor_describe(x, bx, sizeof bx),
                     pl_tensor_describe(weight, bw, sizeof bw),
                     pl_tensor_describe(target, bt, sizeof bt));
        return NULL;
    }
    if (!(label_smoothing >= 0.0 && label_smoothing <= 1.0)) {
        pl_error_set(PL_ERR_INVALID, "%s: label_smoothing %g outside [0, 1]", op, label_smoothing);
        return NULL;
    }
    pl_dtype ac = pl_autocast_get();
    if (ac == PL_BF16 || ac == PL_F16 || x->dtype != PL_F32 || weight->dtype != PL_F32 ||
        x->shape[0] == 0 || x->shape[1] == 0 || weight->shape[0] == 0 ||
        !pl_backend_promises(x->device, "linear_cross_entropy")) {
        pl_frame_begin();
        pl_tensor *r = pl_cross_entropy(pl_matmul(x, weight, false, true), target, ignore_index,
                                        label_smoothing);
        return frame_result(r);
    }
    bool gx = pl_grad_enabled() && x->requires_grad, gw = pl_grad_enabled() && weight->requires_grad;
    pl_kernel_args k = {.op = PL_OP_LINEAR_CROSS_ENTROPY, .n_out = 3};
    k.p.ignore_index = ignore_index;
    k.p.alpha = label_smoothing;
    k.p.flags = (int)gx | (int)gw << 1;
    if (!take_inputs(&k, ts, 3)) return NULL;
    static const int64_t empty[1] = {0};
    k.out[0] = pl_tensor_new_owned(PL_F32, 0, NULL, x->device);
    k.out[1] = pl_tensor_new_owned(PL_F32, gx ? 2 : 1, gx ? x->shape : empty, x->device);
    k.out[2] = pl_tensor_new_owned(PL_F32, gw ? 2 : 1, gw ? weight->shape : empty, x->device);
    return launch(&k);
}

static pl_tensor *loss(const char *name, pl_op op, pl_tensor *p, pl_tensor *t, double delta) {
    if (!p || !t) return NULL;
    pl_tensor *ts[2] = {p, t};
    if (pl_check_float(name, p, true) || pl_check_float(name, t, true) ||
        pl_check_same_device(name, ts, 2))
        return NULL;
    if (!pl_tensor_same_shape(p, t)) {
        char bp[160], bt[160];
        pl_error_set(PL_ERR_SHAPE, "%s: pred %s and target %s must have the same shape", name,
                     pl_tensor_describe(p, bp, sizeof bp), pl_tensor_describe(t, bt, sizeof bt));
        return NULL;
    }
    pl_kernel_args k = {.op = op, .n_out = 1};
    k.p.alpha = delta;
    if (!take_inputs(&k, ts, 2)) return NULL;
    k.out[0] = pl_tensor_new_owned(PL_F32, 0, NULL, p->device);
    return launch(&k);
}

pl_tensor *pl_mse_loss(pl_tensor *pred, pl_tensor *target) {
    return loss("mse_loss", PL_OP_MSE, pred, target, 0);
}
pl_tensor *pl_mae_loss(pl_tensor *pred, pl_tensor *target) {
    return loss("mae_loss", PL_OP_MAE, pred, target, 0);
}
pl_tensor *pl_huber_loss(pl_tensor *pred, pl_tensor *target, double delta) {
    if (!(delta > 0)) {
        pl_error_set(PL_ERR_INVALID, "huber_loss: delta must be > 0, found %g", delta);
        return NULL;
    }
    return loss("huber_loss", PL_OP_HUBER, pred, target, delta);
}

/* ---- normalization ---------------------------------------------------------------------- */

/* x [..., D]; params (w, b) 1-D of D or NULL. */
static bool norm_check(const char *name, pl_tensor *x, pl_tensor *w, pl_tensor *b) {
    if (pl_check_float(name, x, true) || pl_check_ndim(name, x, 1, PL_MAX_DIMS)) return false;
    int64_t D = x->shape[x->ndim - 1];
    pl_tensor *ps[2] = {w, b};
    for (int i = 0; i < 2; i++) {
        if (!ps[i]) continue;
        pl_tensor *pair[2] = {x, ps[i]};
        if (pl_check_float(name, ps[i], true) || pl_check_same_device(name, pair, 2)) return false;
        if (ps[i]->ndim != 1 || ps[i]->shape[0] != D) {
            char bx[160], bp[160];
            pl_error_set(PL_ERR_SHAPE, "%s: %s %s must be [%lld] to match x %s", name,
                         i == 0 ? "weight" : "bias", pl_tensor_describe(ps[i], bp, sizeof bp),
                         (long long)D, pl_tensor_describe(x, bx, sizeof bx));
            return false;
        }
    }
    return true;
}

pl_tensor *pl_layer_norm(pl_tensor *x, pl_tensor *w, pl_tensor *b, double eps) {
    if (!x) return NULL;
    if (!norm_check("layer_norm", x, w, b)) return NULL;
    pl_tensor *ts[3];
    int n = 0;
    ts[n++] = x;
    if (w) ts[n++] = w;
    if (b) ts[n++] = b;
    pl_kernel_args k = {.op = PL_OP_LAYER_NORM, .n_out = 3};
    k.p.eps = eps;
    k.p.flags = (w ? 1 : 0) | (b ? 2 : 0);
    if (!take_inputs(&k, ts, n)) return NULL;
    int64_t rows = x->shape[x->ndim - 1] > 0 ? pl_tensor_numel(x) / x->shape[x->ndim - 1] : 0;
    k.out[0] = pl_tensor_new_owned(x->dtype, x->ndim, x->shape, x->device);
    k.out[1] = pl_tensor_new_owned(PL_F32, 1, &rows, x->device);
    k.out[2] = pl_tensor_new_owned(PL_F32, 1, &rows, x->device);
    return launch(&k);
}

pl_tensor *pl_rms_norm(pl_tensor *x, pl_tensor *w, double eps) {
    if (!x) return NULL;
    if (!norm_check("rms_norm", x, w, NULL)) return NULL;
    pl_tensor *ts[2] = {x, w};
    pl_kernel_args k = {.op = PL_OP_RMS_NORM, .n_out = 2};
    k.p.eps = eps;
    k.p.flags = w ? 1 : 0;
    if (!take_inputs(&k, ts, w ? 2 : 1)) return NULL;
    int64_t rows = x->shape[x->ndim - 1] > 0 ? pl_tensor_numel(x) / x->shape[x->ndim - 1] : 0;
    k.out[0] = pl_tensor_new_owned(x->dtype, x->ndim, x->shape, x->device);
    k.out[1] = pl_tensor_new_owned(PL_F32, 1, &rows, x->device);
    return launch(&k);
}
