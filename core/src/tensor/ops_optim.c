/* ops_optim.c - in-place optimizer updates (pl_adamw_step_, pl_sgd_step_,
 * ops.h) dispatched to the tensors' backend, so an optimizer plugin never
 * touches parameter memory from the host. The math is optim_math.h; the
 * kernels are cpu/kernels_optim.c and the CUDA plugin's. */
#include <string.h>

#include "graph_internal.h"
#include "internal.h"
#include "pipeline/optim_math.h"

/* t is an f32 contiguous tensor of n elements on device d. */
static pl_status check_state(const char *op, const char *pname, const char *what,
                             const pl_tensor *t, int64_t n, pl_device d) {
    char b[256];
    if (!t) return pl_error_set(PL_ERR_INVALID, "%s: parameter '%s': %s is NULL", op, pname, what);
    if (t->dtype != PL_F32 || !pl_tensor_is_contiguous(t) || pl_tensor_numel(t) != n)
        return pl_error_set(PL_ERR_SHAPE,
                            "%s: parameter '%s': %s is %s, expected a contiguous f32 tensor of "
                            "%lld elements",
                            op, pname, what, pl_tensor_describe(t, b, sizeof b), (long long)n);
    if (!pl_device_eq(t->device, d)) {
        char d1[32], d2[32];
        return pl_error_set(PL_ERR_DEVICE, "%s: parameter '%s': %s is on %s, the parameter on %s",
                            op, pname, what, pl_device_str(t->device, d1, sizeof d1),
                            pl_device_str(d, d2, sizeof d2));
    }
    return PL_OK;
}

/* pl_optim_set_found_inf: the flag every optimizer kernel gets as in[1] */
static pl_tensor *g_found_inf;

void pl_optim_set_found_inf(pl_tensor *flag) { g_found_inf = flag; }
pl_tensor *pl_optim_found_inf(void) { return g_found_inf; }

/* The found_inf flag, if set, fits the kernel call updating `param`. */
static pl_status check_found_inf(pl_op op, const pl_tensor *param) {
    pl_tensor *f = g_found_inf;
    if (f && (f->dtype != PL_F32 || pl_tensor_numel(f) != 1 || !pl_tensor_is_contiguous(f)))
        return pl_error_set(PL_ERR_SHAPE, "%s: parameter '%s': the found_inf flag is not a "
                            "1-element contiguous f32 tensor", pl_op_name(op), param->name);
    if (f && !pl_device_eq(f->device, param->device)) {
        char d1[32], d2[32];
        return pl_error_set(PL_ERR_DEVICE, "%s: parameter '%s': the found_inf flag is on %s, "
                            "the parameter on %s", pl_op_name(op), param->name,
                            pl_device_str(f->device, d1, sizeof d1),
                            pl_device_str(param->device, d2, sizeof d2));
    }
    return PL_OK;
}

bool pl_optim_counts_on_device(pl_device d) {
    return pl_backend_promises(d, "optimizer_step_count");
}

/* t is a 1-element contiguous tensor of dtype dt (on dev when dev is given). */
static pl_status check_scalar(const char *op, const char *what, const pl_tensor *t, pl_dtype dt,
                              const pl_device *dev) {
    char b[256];
    if (!t) return pl_error_set(PL_ERR_INVALID, "%s: %s is NULL", op, what);
    if (t->dtype != dt || pl_tensor_numel(t) != 1 || !pl_tensor_is_contiguous(t))
        return pl_error_set(PL_ERR_SHAPE, "%s: %s is %s, expected a contiguous %s tensor of one "
                            "element", op, what, pl_tensor_describe(t, b, sizeof b),
                            pl_dtype_name(dt));
    if (dev && !pl_device_eq(t->device, *dev)) {
        char d1[32], d2[32];
        return pl_error_set(PL_ERR_DEVICE, "%s: %s is on %s, expected %s", op, what,
                            pl_device_str(t->device, d1, sizeof d1), pl_device_str(*dev, d2, sizeof d2));
    }
    return PL_OK;
}

/* A counted call's step counter fits the parameter, whose device's kernels
 * keep it. */
static pl_status check_count(const char *op, const pl_tensor *param, const pl_tensor *count) {
    char what[PL_NAME_MAX + 48];
    snprintf(what, sizeof what, "the step counter of parameter '%s'", param->name);
    pl_status s = check_scalar(op, what, count, PL_F32, &param->device);
    if (!s && !pl_optim_counts_on_device(param->device))
        s = pl_error_set(PL_ERR_UNSUPPORTED, "%s: parameter '%s': backend '%s' keeps no step count "
                         "(setting optimizer_step_count)", op, param->name,
                         pl_backend_get(param->device.type)->name);
    return s;
}

/* Eager: the coefficients `coef` (n bytes) go by value through p.extra.
 * Capturing a graph (graph.h): they go into a slot of the graph's device
 * table, which the kernel reads (p.flags bit0, in[2]; in[1] is then the
 * found_inf flag or NULL), so that a replay sees the values the host sets
 * before it. Refreshing before a replay: only the slot is updated, nothing
 * runs. */
static pl_status run_step(pl_kernel_args *k, const void *coef, size_t n) {
    int mode = pl_graph_optim_mode();
    if (mode == 2) return pl_graph_optim_refresh(k->op, k->out[0], coef, n);
    pl_tensor *slot = NULL;
    if (mode == 1) {
        slot = pl_graph_optim_slot(k->op, k->out[0], coef, n);
        if (!slot) return pl_error_prefix(pl_error_status(), "%s of parameter '%s'",
                                          pl_op_name(k->op), k->out[0]->name);
        k->p.extra = NULL;
        k->p.flags |= 1;
    } else {
        k->p.extra = (void *)coef;
    }
    pl_status s = check_found_inf(k->op, k->out[0]);
    if (g_found_inf) k->in[k->n_in++] = g_found_inf;
    if (slot) {
        if (k->n_in == 1) k->in[k->n_in++] = NULL;
        k->in[k->n_in++] = slot;
    }
    if (!s) {
        s = pl_kernel_forward(k);
        if (s) s = pl_error_prefix(s, "%s of parameter '%s'", pl_op_name(k->op), k->out[0]->name);
    }
    pl_tensor_release(slot);
    return s;
}

/* count NULL: the host's step h->step; else a counted call (ops.h). */
static pl_status adamw_one(pl_tensor *param, const pl_tensor *grad, pl_tensor *exp_avg,
                           pl_tensor *exp_avg_sq, pl_tensor *max_exp_avg_sq, pl_tensor *count,
                           bool counted, const pl_adamw_hyper *h) {
    if (!param || !h) return pl_error_set(PL_ERR_INVALID, "adamw_step: NULL parameter or hyper");
    const char *nm = param->name;
    int64_t n = pl_tensor_numel(param);
    pl_status s = check_state("adamw_step", nm, "the parameter", param, n, param->device);
    if (!s) s = check_state("adamw_step", nm, "its gradient", grad, n, param->device);
    if (!s) s = check_state("adamw_step", nm, "exp_avg", exp_avg, n, param->device);
    if (!s) s = check_state("adamw_step", nm, "exp_avg_sq", exp_avg_sq, n, param->device);
    if (!s && h->amsgrad)
        s = check_state("adamw_step", nm, "max_exp_avg_sq", max_exp_avg_sq, n, param->device);
    if (!s && counted) s = check_count("adamw_step", param, count);
    if (s) return s;
    if (!counted && h->step < 1)
        return pl_error_set(PL_ERR_INVALID, "adamw_step: parameter '%s': step %lld, expected >= 1",
                            nm, (long long)h->step);
    pl_kernel_args k = {.op = PL_OP_ADAMW_STEP, .n_in = 1, .in = {(pl_tensor *)grad},
                        .n_out = counted ? 5 : h->amsgrad ? 4 : 3,
                        .out = {param, exp_avg, exp_avg_sq, h->amsgrad ? max_exp_avg_sq : NULL,
                                counted ? count : NULL}};
    if (counted) {
        pl_adamw_ccoef c = pl_adamw_ccoef_of(h);
        return run_step(&k, &c, sizeof c);
    }
    pl_adamw_coef c = pl_adamw_coef_of(h);
    return run_step(&k, &c, sizeof c);
}

pl_status pl_adamw_step_(pl_tensor *param, const pl_tensor *grad, pl_tensor *exp_avg,
                         pl_tensor *exp_avg_sq, pl_tensor *max_exp_avg_sq,
                         const pl_adamw_hyper *h) {
    return adamw_one(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, NULL, false, h);
}

pl_status pl_adamw_step_counted_(pl_tensor *param, const pl_tensor *grad, pl_tensor *exp_avg,
                                 pl_tensor *exp_avg_sq, pl_tensor *max_exp_avg_sq,
                                 pl_tensor *count, const pl_adamw_hyper *h) {
    return adamw_one(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, count, true, h);
}

/* count: a counted call's counter (used where momentum_buf is set). */
static pl_status sgd_one(pl_tensor *param, const pl_tensor *grad, pl_tensor *momentum_buf,
                         pl_tensor *count, bool counted, const pl_sgd_hyper *h) {
    if (!param || !h) return pl_error_set(PL_ERR_INVALID, "sgd_step: NULL parameter or hyper");
    const char *nm = param->name;
    int64_t n = pl_tensor_numel(param);
    pl_status s = check_state("sgd_step", nm, "the parameter", param, n, param->device);
    if (!s) s = check_state("sgd_step", nm, "its gradient", grad, n, param->device);
    if (!s && momentum_buf)
        s = check_state("sgd_step", nm, "the momentum buffer", momentum_buf, n, param->device);
    counted = counted && momentum_buf; /* no buffer: nothing to count */
    if (!s && counted) s = check_count("sgd_step", param, count);
    if (s) return s;
    pl_sgd_coef c = pl_sgd_coef_of(h, momentum_buf != NULL);
    if (counted) c.first = 0; /* the kernel's count decides */
    pl_kernel_args k = {.op = PL_OP_SGD_STEP, .n_in = 1, .in = {(pl_tensor *)grad},
                        .n_out = counted ? 3 : momentum_buf ? 2 : 1,
                        .out = {param, momentum_buf, counted ? count : NULL}};
    return run_step(&k, &c, sizeof c);
}

pl_status pl_sgd_step_(pl_tensor *param, const pl_tensor *grad, pl_tensor *momentum_buf,
                       const pl_sgd_hyper *h) {
    return sgd_one(param, grad, momentum_buf, NULL, false, h);
}

pl_status pl_sgd_step_counted_(pl_tensor *param, const pl_tensor *grad, pl_tensor *momentum_buf,
                               pl_tensor *count, const pl_sgd_hyper *h) {
    return sgd_one(param, grad, momentum_buf, count, true, h);
}

/* ---- multi-tensor (foreach) updates: ops.h, optim_math.h ---- */

typedef struct mlists { /* one call's lists: adamw (ha) or sgd (hs) */
    pl_tensor *const *param, *const *grad, *const *s0, *const *s1, *const *s2;
    const pl_adamw_hyper *ha;
    const pl_sgd_hyper *hs;
    pl_tensor *const *count; /* a counted call's counters, or NULL */
} mlists;

static pl_tensor *mstate(const mlists *L, int i, int k);

/* Tensor i's counter in a kernel call: adamw all, sgd where it has a buffer. */
static pl_tensor *mcount(const mlists *L, int i) {
    if (!L->count || (L->hs && !mstate(L, i, 0))) return NULL;
    return L->count[i];
}

/* Tensor i's state k (adamw: exp_avg, exp_avg_sq, max_exp_avg_sq when
 * amsgrad; sgd: the momentum buffer or NULL), or NULL. */
static pl_tensor *mstate(const mlists *L, int i, int k) {
    pl_tensor *const *s = k == 0 ? L->s0 : k == 1 ? L->s1 : L->s2;
    if (!s || (L->hs && k > 0) || (L->ha && k == 2 && !L->ha[i].amsgrad)) return NULL;
    return s[i];
}

/* Parameter i, checked as its per-tensor call would be (or made as one). */
static pl_status mone(const mlists *L, int i, bool run) {
    pl_tensor *p = L->param[i];
    if (!p) return pl_error_set(PL_ERR_INVALID, "optimizer step: parameter %d is NULL", i);
    if (run && L->ha)
        return adamw_one(p, L->grad[i], mstate(L, i, 0), mstate(L, i, 1), mstate(L, i, 2),
                         mcount(L, i), L->count != NULL, &L->ha[i]);
    if (run) return sgd_one(p, L->grad[i], mstate(L, i, 0), mcount(L, i), L->count != NULL, &L->hs[i]);
    const char *op = L->ha ? "adamw_step_multi" : "sgd_step_multi", *nm = p->name;
    static const char *const what[2][3] = {{"exp_avg", "exp_avg_sq", "max_exp_avg_sq"},
                                           {"the momentum buffer", "", ""}};
    int64_t n = pl_tensor_numel(p);
    pl_status s = check_state(op, nm, "the parameter", p, n, p->device);
    if (!s) s = check_state(op, nm, "its gradient", L->grad[i], n, p->device);
    for (int k = 0; k < 3 && !s; k++) {
        bool need = L->ha ? (k < 2 || L->ha[i].amsgrad) : (k == 0 && mstate(L, i, 0));
        if (need) s = check_state(op, nm, what[L->hs != NULL][k], mstate(L, i, k), n, p->device);
    }
    if (!s && L->count && (L->ha || mstate(L, i, 0))) s = check_count(op, p, L->count[i]);
    if (!s && !L->count && L->ha && L->ha[i].step < 1)
        s = pl_error_set(PL_ERR_INVALID, "%s: parameter '%s': step %lld, expected >= 1", op, nm,
                         (long long)L->ha[i].step);
    return s;
}

/* One kernel call of m (tensors of one device, checked): eager, capturing
 * (coefficients into adjacent slots of the graph's table) or refreshing
 * (only the slots' new values). */
static pl_status mcall(pl_op op, pl_optim_multi *m, size_t cb) {
    int mode = pl_graph_optim_mode();
    pl_status s = mode == 2 ? PL_OK : check_found_inf(op, m->param[0]);
    for (int i = 0; i < m->n && mode == 2 && !s; i++)
        s = pl_graph_optim_refresh(op, m->param[i], &m->coef[i], cb);
    if (mode == 2 || s) return s;
    pl_kernel_args k = {.op = op, .n_in = 1, .in = {g_found_inf}, .n_out = 1, .out = {m->param[0]}};
    k.p.extra = m;
    pl_tensor *slot = NULL;
    if (mode == 1 && !(slot = pl_graph_optim_slots(op, (const pl_tensor *const *)m->param, m->coef,
                                                   cb, sizeof m->coef[0], m->n)))
        s = pl_error_status();
    if (slot) {
        k.p.flags |= 1;
        k.in[k.n_in++] = slot;
    }
    if (!s) s = pl_kernel_forward(&k);
    pl_tensor_release(slot);
    return s ? pl_error_prefix(s, "%s of parameter '%s' and %d more", pl_op_name(op),
                               m->param[0]->name, m->n - 1)
             : PL_OK;
}

/* Check all, then per device (in order of first appearance, order kept
 * within one: torch's _group_tensors_by_device_and_dtype; all f32) chunks
 * of PL_OPTIM_MULTI_MAX, or per-tensor calls where the backend lacks op. */
static pl_status multi(pl_op op, int n, const mlists *L) {
    if (n < 0 || (n > 0 && (!L->param || !L->grad || (!L->ha && !L->hs))))
        return pl_error_set(PL_ERR_INVALID, "%s: %d tensors, a NULL list", pl_op_name(op), n);
    pl_status s = PL_OK;
    for (int i = 0; i < n && !s; i++) s = mone(L, i, false);
    pl_optim_multi m;
    const size_t cb = L->ha ? (L->count ? sizeof(pl_adamw_ccoef) : sizeof(pl_adamw_coef))
                            : sizeof(pl_sgd_coef);
    for (int i = 0; i < n && !s; i++) {
        pl_device d = L->param[i]->device;
        bool first = true;
        for (int j = 0; j < i && first; j++) first = !pl_device_eq(L->param[j]->device, d);
        const pl_backend *b = first ? pl_backend_get(d.type) : NULL;
        if (!first) continue;
        if (!b) return pl_error_status();
        bool fused = pl_backend_supports(b, op, false);
        m.n = 0;
        for (int j = i; j < n && !s; j++) {
            if (!pl_device_eq(L->param[j]->device, d)) continue;
            if (!fused) {
                s = mone(L, j, true);
                continue;
            }
            int t = m.n++;
            m.param[t] = L->param[j];
            m.grad[t] = L->grad[j];
            for (int k = 0; k < 3; k++) m.state[k][t] = mstate(L, j, k);
            m.count[t] = mcount(L, j);
            if (L->ha && L->count) m.coef[t].adamw_counted = pl_adamw_ccoef_of(&L->ha[j]);
            else if (L->ha) m.coef[t].adamw = pl_adamw_coef_of(&L->ha[j]);
            else m.coef[t].sgd = pl_sgd_coef_of(&L->hs[j], m.state[0][t] != NULL);
            if (m.count[t] && L->hs) m.coef[t].sgd.first = 0; /* the kernel's count decides */
            if (m.n == PL_OPTIM_MULTI_MAX) {
                s = mcall(op, &m, cb);
                m.n = 0;
            }
        }
        if (!s && m.n) s = mcall(op, &m, cb);
    }
    return s;
}

pl_status pl_adamw_step_multi_(int n, pl_tensor *const *param, pl_tensor *const *grad,
                               pl_tensor *const *exp_avg, pl_tensor *const *exp_avg_sq,
                               pl_tensor *const *max_exp_avg_sq, const pl_adamw_hyper *h) {
    mlists L = {param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, h, NULL, NULL};
    return multi(PL_OP_ADAMW_STEP_MULTI, n, &L);
}

pl_status pl_adamw_step_multi_counted_(int n, pl_tensor *const *param, pl_tensor *const *grad,
                                       pl_tensor *const *exp_avg, pl_tensor *const *exp_avg_sq,
                                       pl_tensor *const *max_exp_avg_sq, pl_tensor *const *count,
                                       const pl_adamw_hyper *h) {
    if (n > 0 && !count)
        return pl_error_set(PL_ERR_INVALID, "adamw_step_multi: %d tensors, a NULL counter list", n);
    mlists L = {param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, h, NULL, count};
    return multi(PL_OP_ADAMW_STEP_MULTI, n, &L);
}

pl_status pl_sgd_step_multi_(int n, pl_tensor *const *param, pl_tensor *const *grad,
                             pl_tensor *const *momentum_buf, const pl_sgd_hyper *h) {
    mlists L = {param, grad, momentum_buf, NULL, NULL, NULL, h, NULL};
    return multi(PL_OP_SGD_STEP_MULTI, n, &L);
}

pl_status pl_sgd_step_multi_counted_(int n, pl_tensor *const *param, pl_tensor *const *grad,
                                     pl_tensor *const *momentum_buf, pl_tensor *const *count,
                                     const pl_sgd_hyper *h) {
    if (n > 0 && momentum_buf && !count)
        return pl_error_set(PL_ERR_INVALID, "sgd_step_multi: %d tensors, a NULL counter list", n);
    mlists L = {param, grad, momentum_buf, NULL, NULL, NULL, h, momentum_buf ? count : NULL};
    return multi(PL_OP_SGD_STEP_MULTI, n, &L);
}

/* ---- GradScaler on the device: ops.h, optim_math.h ---- */

pl_status pl_amp_unscale_multi_(int n, pl_tensor *const *grads, pl_tensor *found_inf,
                                const pl_tensor *inv_scale) {
    const char *op = "amp_unscale_multi";
    if (n < 0 || (n > 0 && !grads))
        return pl_error_set(PL_ERR_INVALID, "%s: %d tensors, a NULL list", op, n);
    pl_status s = check_scalar(op, "found_inf", found_inf, PL_F32, NULL);
    if (!s) s = check_scalar(op, "inv_scale", inv_scale, PL_F32, &found_inf->device);
    for (int i = 0; i < n && !s; i++) {
        const pl_tensor *g = grads[i];
        if (!g) return pl_error_set(PL_ERR_INVALID, "%s: gradient %d is NULL", op, i);
        s = check_state(op, g->name, "the gradient", g, pl_tensor_numel(g), found_inf->device);
    }
    if (s) return s;
    pl_optim_multi m;
    memset(&m, 0, offsetof(pl_optim_multi, coef)); /* the coefficients are unused */
    memset(m.count, 0, sizeof m.count);
    for (int i = 0; i < n && !s; i += PL_OPTIM_MULTI_MAX) {
        m.n = n - i < PL_OPTIM_MULTI_MAX ? n - i : PL_OPTIM_MULTI_MAX;
        for (int j = 0; j < m.n; j++) m.grad[j] = grads[i + j];
        pl_kernel_args k = {.op = PL_OP_AMP_UNSCALE_MULTI, .n_in = 1,
                            .in = {(pl_tensor *)inv_scale}, .n_out = 1, .out = {found_inf}};
        k.p.extra = &m;
        s = pl_kernel_forward(&k);
        if (s) s = pl_error_prefix(s, "%s of gradient '%s' and %d more", op,
                                   m.grad[0]->name, m.n - 1);
    }
    return s;
}

pl_status pl_amp_update_scale_(pl_tensor *scale, pl_tensor *growth_tracker,
                               const pl_tensor *found_inf, double growth_factor,
                               double backoff_factor, int64_t growth_interval) {
    const char *op = "amp_update_scale";
    pl_status s = check_scalar(op, "scale", scale, PL_F32, NULL);
    if (!s) s = check_scalar(op, "growth_tracker", growth_tracker, PL_I32, &scale->device);
    if (!s) s = check_scalar(op, "found_inf", found_inf, PL_F32, &scale->device);
    if (s) return s;
    if (growth_interval < 1 || growth_interval > INT32_MAX || !(growth_factor > 0.0) ||
        !(backoff_factor > 0.0))
        return pl_error_set(PL_ERR_INVALID, "%s: growth_interval %lld (expected 1..%d), "
                            "growth_factor %g, backoff_factor %g (expected > 0)", op,
                            (long long)growth_interval, INT32_MAX, growth_factor, backoff_factor);
    pl_kernel_args k = {.op = PL_OP_AMP_UPDATE_SCALE, .n_in = 1, .in = {(pl_tensor *)found_inf},
                        .n_out = 2, .out = {scale, growth_tracker}};
    k.p.alpha = growth_factor;
    k.p.beta = backoff_factor;
    k.p.start = growth_interval;
    s = pl_kernel_forward(&k);
    return s ? pl_error_prefix(s, "%s", op) : PL_OK;
}

/* ---- clip_grad_norm_'s foreach ops (ops.h, ops.def); the per-tensor chain
 * where a tensor is not f32 contiguous on ts[0]'s device or its backend lacks op ---- */

static pl_status check_list(const char *op, int n, pl_tensor *const *ts, int min) {
    if (n < min || (n > 0 && !ts))
        return pl_error_set(PL_ERR_INVALID, "%s: %d tensors or a NULL list, expected >= %d", op, n, min);
    for (int i = 0; i < n; i++)
        if (!ts[i] || pl_check_float(op, ts[i], true))
            return ts[i] ? pl_error_status() : pl_error_set(PL_ERR_INVALID, "%s: tensor %d is NULL", op, i);
    return PL_OK;
}

static bool fusable(pl_op op, int n, pl_tensor *const *ts) {
    const pl_backend *b = pl_backend_get(ts[0]->device.type);
    bool ok = b && pl_backend_supports(b, op, false);
    for (int i = 0; i < n && ok; i++)
        ok = ts[i]->dtype == PL_F32 && pl_tensor_is_contiguous(ts[i]) &&
             pl_device_eq(ts[i]->device, ts[0]->device);
    return ok;
}

/* Calls of PL_OPTIM_MULTI_MAX (a zeroed list's grad[]): in[0] s or the call's
 * first tensor, out[0] acc (the first call starts it at 0) or that tensor. */
static pl_status chunks(pl_op op, int n, pl_tensor *const *ts, pl_tensor *s, pl_tensor *acc) {
    pl_optim_multi m;
    memset(&m, 0, offsetof(pl_optim_multi, coef));
    memset(m.count, 0, sizeof m.count);
    pl_status st = PL_OK;
    for (int i = 0; i < n && !st; i += PL_OPTIM_MULTI_MAX) {
        m.n = n - i < PL_OPTIM_MULTI_MAX ? n - i : PL_OPTIM_MULTI_MAX;
        memcpy(m.grad, ts + i, (size_t)m.n * sizeof *ts);
        pl_kernel_args k = {.op = op, .n_in = 1, .in = {s ? s : ts[i]}, .n_out = 1,
                            .out = {acc ? acc : ts[i]}, .p = {.flags = acc && !i, .extra = &m}};
        if ((st = pl_kernel_forward(&k)))
            st = pl_error_prefix(st, "%s of '%s' and %d more", pl_op_name(op), ts[i]->name, m.n - 1);
    }
    return st;
}

pl_tensor *pl_sum_squares_multi(int n, pl_tensor *const *ts) {
    if (check_list("sum_squares_multi", n, ts, 1)) return NULL;
    bool f = fusable(PL_OP_SUM_SQUARES_MULTI, n, ts);
    pl_tensor *t = f ? pl_tensor_new_owned(PL_F32, 0, NULL, ts[0]->device) : NULL;
    for (int i = 0; i < n && !f; i++) { /* the per-tensor chain */
        pl_tensor *q = pl_sum(pl_square(ts[i]), PL_ALL_DIMS, false);
        if (!(t = i ? pl_add(t, q) : q)) return NULL;
    }
    if (!f || !t) return t;
    if (!chunks(PL_OP_SUM_SQUARES_MULTI, n, ts, NULL, t)) return pl_op_result(t);
    pl_tensor_release(t);
    return NULL;
}

pl_status pl_mul_multi_(int n, pl_tensor *const *ts, const pl_tensor *s) {
    pl_status st = check_list("mul_multi", n, ts, 0);
    if (!st) st = check_scalar("mul_multi", "s", s, PL_F32, n ? &ts[0]->device : NULL);
    if (st || !n) return st;
    if (fusable(PL_OP_MUL_MULTI, n, ts)) return chunks(PL_OP_MUL_MULTI, n, ts, (pl_tensor *)s, NULL);
    for (int i = 0; i < n && !st; i++) { /* the per-tensor mul and copy */
        pl_frame_begin();
        pl_tensor *c = pl_mul(ts[i], (pl_tensor *)s);
        st = c ? pl_tensor_copy_(ts[i], c) : pl_error_status();
        pl_frame_end();
    }
    return st;
}
