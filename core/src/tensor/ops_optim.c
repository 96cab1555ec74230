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
    pl_status s = PL_OK;
    if (g_found_inf) {
        pl_tensor *f = g_found_inf;
        const char *nm = k->out[0]->name;
        if (f->dtype != PL_F32 || pl_tensor_numel(f) != 1 || !pl_tensor_is_contiguous(f))
            s = pl_error_set(PL_ERR_SHAPE, "%s: parameter '%s': the found_inf flag is not a "
                                "1-element contiguous f32 tensor", pl_op_name(k->op), nm);
        else if (!pl_device_eq(f->device, k->out[0]->device)) {
            char d1[32], d2[32];
            s = pl_error_set(PL_ERR_DEVICE, "%s: parameter '%s': the found_inf flag is on %s, "
                                "the parameter on %s", pl_op_name(k->op), nm,
                                pl_device_str(f->device, d1, sizeof d1),
                                pl_device_str(k->out[0]->device, d2, sizeof d2));
        }
        k->in[k->n_in++] = f;
    }
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

pl_status pl_adamw_step_(pl_tensor *param, const pl_tensor *grad, pl_tensor *exp_avg,
                         pl_tensor *exp_avg_sq, pl_tensor *max_exp_avg_sq,
                         const pl_adamw_hyper *h) {
    if (!param || !h) return pl_error_set(PL_ERR_INVALID, "adamw_step: NULL parameter or hyper");
    const char *nm = param->name;
    int64_t n = pl_tensor_numel(param);
    pl_status s = check_state("adamw_step", nm, "the parameter", param, n, param->device);
    if (!s) s = check_state("adamw_step", nm, "its gradient", grad, n, param->device);
    if (!s) s = check_state("adamw_step", nm, "exp_avg", exp_avg, n, param->device);
    if (!s) s = check_state("adamw_step", nm, "exp_avg_sq", exp_avg_sq, n, param->device);
    if (!s && h->amsgrad)
        s = check_state("adamw_step", nm, "max_exp_avg_sq", max_exp_avg_sq, n, param->device);
    if (s) return s;
    if (h->step < 1)
        return pl_error_set(PL_ERR_INVALID, "adamw_step: parameter '%s': step %lld, expected >= 1",
                            nm, (long long)h->step);
    pl_adamw_coef c = pl_adamw_coef_of(h);
    pl_kernel_args k = {.op = PL_OP_ADAMW_STEP, .n_in = 1, .in = {(pl_tensor *)grad},
                        .n_out = h->amsgrad ? 4 : 3,
                        .out = {param, exp_avg, exp_avg_sq, h->amsgrad ? max_exp_avg_sq : NULL}};
    return run_step(&k, &c, sizeof c);
}

pl_status pl_sgd_step_(pl_tensor *param, const pl_tensor *grad, pl_tensor *momentum_buf,
                       const pl_sgd_hyper *h) {
    if (!param || !h) return pl_error_set(PL_ERR_INVALID, "sgd_step: NULL parameter or hyper");
    const char *nm = param->name;
    int64_t n = pl_tensor_numel(param);
    pl_status s = check_state("sgd_step", nm, "the parameter", param, n, param->device);
    if (!s) s = check_state("sgd_step", nm, "its gradient", grad, n, param->device);
    if (!s && momentum_buf)
        s = check_state("sgd_step", nm, "the momentum buffer", momentum_buf, n, param->device);
    if (s) return s;
    pl_sgd_coef c = pl_sgd_coef_of(h, momentum_buf != NULL);
    pl_kernel_args k = {.op = PL_OP_SGD_STEP, .n_in = 1, .in = {(pl_tensor *)grad},
                        .n_out = momentum_buf ? 2 : 1, .out = {param, momentum_buf}};
    return run_step(&k, &c, sizeof c);
}
