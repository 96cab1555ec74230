/* sgd.c - torch.optim.SGD: momentum, dampening, Nesterov, coupled weight
 * decay; parameter groups (../common/param_groups.h).
 *
 * Per parameter with a gradient (torch/optim/sgd.py, _single_tensor_sgd):
 *   g <- g + wd * p
 *   momentum mu != 0:  b <- g on the first step, else b <- mu b + (1 - dampening) g
 *                      d <- g + mu b (nesterov) or d <- b
 *   p <- p - lr d
 * mu is the group's hyper-parameter "momentum" (pl_hparam), which a
 * scheduler may drive (onecycle's momentum cycling, as torch's OneCycleLR
 * cycles 'momentum' for SGD). The per-element math is the core's
 * optim_math.h, run on the parameters' device (pl_sgd_step_).
 *
 * The count of momentum updates, which says whether the buffer is
 * initialised, lives on the device with the buffer (an f32 [1] per
 * parameter; ABI 2.12): the kernel increments it and initialises the buffer
 * to the gradient when it reaches 1, unless the step is skipped on the device
 * (the trainer's found_inf), so a skipped first step leaves the buffer
 * uninitialised, as torch, whose GradScaler then calls no optimizer.step().
 * (torch's fused SGD decides its first step on the host instead and would
 * use an empty_like buffer after a skipped first step.) A backend whose
 * kernels keep no count gets the host's count, as before.
 *
 * foreach = true (the default; torch's foreach): a group's parameters with a
 * gradient are updated by pl_sgd_step_multi_, one kernel call per
 * PL_OPTIM_MULTI_MAX parameters of a device, with the same bits as one
 * pl_sgd_step_ per parameter (foreach = false; the core falls back to those
 * on a backend without the multi-tensor kernel).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/param_groups.h"
#include "pipeline/optim_math.h"
#include "pipeline/pipeline.h"

/* ---- plugin ------------------------------------------------------------ */

typedef struct sgd_state {
    bool trainable;
    pl_tensor *buf;   /* f32 momentum buffer, owned; NULL until needed */
    pl_tensor *count; /* momentum updates done, on the device (f32 [1], owned, with buf), or NULL */
    int64_t step;     /* momentum updates done on the host (count NULL; 0: not initialised) */
} sgd_state;

typedef struct sgd {
    pl_params *params; /* borrowed */
    pl_optim_groups groups;
    double dampening;
    bool nesterov, foreach;
    int n_params;
    sgd_state *st;
    /* foreach: one group's lists, [n_params] each (scratch of step) */
    pl_tensor **lp, **lg, **lb, **lc;
    pl_sgd_hyper *lh;
} sgd;

static void sgd_destroy(void *self) {
    sgd *o = self;
    if (!o) return;
    for (int i = 0; i < o->n_params && o->st; i++) {
        pl_tensor_release(o->st[i].buf);
        pl_tensor_release(o->st[i].count);
    }
    free(o->st);
    free(o->lc);
    free(o->lp);
    free(o->lg);
    free(o->lb);
    free(o->lh);
    pl_optim_groups_free(&o->groups);
    free(o);
}

static pl_status alloc_buf(sgd_state *st, const pl_param *p) {
    st->buf = pl_tensor_zeros(PL_F32, p->t->ndim, p->t->shape, p->t->device);
    if (st->buf && pl_optim_counts_on_device(p->t->device))
        st->count = pl_tensor_zeros_owned(PL_F32, 1, (int64_t[]){1}, p->t->device);
    if (!st->buf || (pl_optim_counts_on_device(p->t->device) && !st->count))
        return pl_error_prefix(pl_error_status() ? pl_error_status() : PL_ERR_NOMEM,
                               "sgd: momentum buffer of parameter '%s'", p->name);
    return PL_OK;
}

static pl_status sgd_create(const pl_config_section *cfg, pl_run_context *ctx, void **self) {
    *self = NULL;
    if (!ctx || !ctx->params)
        return pl_error_set(PL_ERR_INVALID, "sgd: the run context has no parameter list");
    double momentum = pl_cfg_float(cfg, "momentum", 0.0);
    double dampening = pl_cfg_float(cfg, "dampening", 0.0);
    bool nesterov = pl_cfg_bool(cfg, "nesterov", false);
    if (nesterov && (momentum <= 0 || dampening != 0))
        return pl_error_set(PL_ERR_CONFIG,
                            "sgd: nesterov = true requires momentum > 0 and dampening = 0 "
                            "(found momentum = %g, dampening = %g)",
                            momentum, dampening);
    sgd *o = calloc(1, sizeof *o);
    if (!o) return pl_error_set(PL_ERR_NOMEM, "sgd: out of memory");
    o->params = ctx->params;
    o->dampening = dampening;
    o->nesterov = nesterov;
    o->foreach = pl_cfg_bool(cfg, "foreach", true);
    pl_optim_group_defaults d = {.lr = pl_cfg_float(cfg, "lr", 1e-3),
                                 .weight_decay = pl_cfg_float(cfg, "weight_decay", 0.0),
                                 .n_hparams = 1,
                                 .hparam_name = {"momentum"},
                                 .hparam_value = {momentum}};
    pl_status s = pl_optim_groups_build(cfg, ctx->params, "sgd", &d, &o->groups);
    if (s) {
        free(o);
        return s;
    }
    o->n_params = pl_params_count(ctx->params);
    size_t np = (size_t)(o->n_params > 0 ? o->n_params : 1);
    o->st = calloc(np, sizeof *o->st);
    o->lp = calloc(np, sizeof *o->lp);
    o->lg = calloc(np, sizeof *o->lg);
    o->lb = calloc(np, sizeof *o->lb);
    o->lh = calloc(np, sizeof *o->lh);
    o->lc = calloc(np, sizeof *o->lc);
    if (!o->st || !o->lp || !o->lg || !o->lb || !o->lh || !o->lc) {
        sgd_destroy(o);
        return pl_error_set(PL_ERR_NOMEM, "sgd: out of memory");
    }
    for (int gi = 0; gi < o->groups.n; gi++) {
        const pl_param_group *g = &o->groups.g[gi];
        for (int k = 0; k < g->n_params; k++) {
            sgd_state *st = &o->st[g->param_index[k]];
            st->trainable = true;
            if (momentum != 0 && (s = alloc_buf(st, pl_params_at(ctx->params, g->param_index[k])))) {
                sgd_destroy(o);
                return s;
            }
        }
    }
    *self = o;
    return PL_OK;
}

static int sgd_num_groups(void *self) { return ((sgd *)self)->groups.n; }

static pl_param_group *sgd_group(void *self, int i) {
    sgd *o = self;
    return (i >= 0 && i < o->groups.n) ? &o->groups.g[i] : NULL;
}

/* The foreach lists of one group (nl parameters): one multi-tensor call,
 * counted on the device (every parameter with a buffer has a count) or on
 * the host; per-tensor calls when the group mixes the two. */
static pl_status step_lists(sgd *o, int nl) {
    int nb = 0, nc = 0;
    for (int i = 0; i < nl; i++) {
        nb += o->lb[i] != NULL;
        nc += o->lc[i] != NULL;
    }
    if (nc == 0 || nb == 0) return pl_sgd_step_multi_(nl, o->lp, o->lg, o->lb, o->lh);
    if (nc == nb) return pl_sgd_step_multi_counted_(nl, o->lp, o->lg, o->lb, o->lc, o->lh);
    pl_status s = PL_OK;
    for (int i = 0; i < nl && !s; i++)
        s = o->lc[i] ? pl_sgd_step_counted_(o->lp[i], o->lg[i], o->lb[i], o->lc[i], &o->lh[i])
                     : pl_sgd_step_(o->lp[i], o->lg[i], o->lb[i], &o->lh[i]);
    return s;
}

static pl_status sgd_step(void *self) {
    sgd *o = self;
    pl_status s;
    for (int gi = 0; gi < o->groups.n; gi++) {
        pl_param_group *g = &o->groups.g[gi];
        const double mu = pl_group_hparam(g, "momentum")->value;
        int nl = 0; /* foreach: the group's list */
        for (int k = 0; k < g->n_params; k++) {
            pl_param *p = pl_params_at(o->params, g->param_index[k]);
            sgd_state *st = &o->st[g->param_index[k]];
            pl_tensor *t = p->t;
            if (!t->grad) continue;
            bool mom = mu != 0.0;
            if (mom && !st->buf && (s = alloc_buf(st, p))) return s; /* momentum cycled on */
            if (mom && pl_tensor_numel(st->buf) != pl_tensor_numel(t))
                return pl_error_set(PL_ERR_SHAPE, "sgd: parameter '%s' changed size", p->name);
            pl_sgd_hyper h = {.lr = g->lr,
                              .momentum = mu,
                              .dampening = o->dampening,
                              .weight_decay = g->weight_decay,
                              .nesterov = o->nesterov,
                              .first = st->step == 0};
            pl_tensor *count = mom ? st->count : NULL; /* a count on the device */
            if (o->foreach) {
                o->lp[nl] = t;
                o->lg[nl] = t->grad;
                o->lb[nl] = mom ? st->buf : NULL;
                o->lc[nl] = count;
                o->lh[nl++] = h;
                if (mom && !count) st->step++;
                continue;
            }
            s = count ? pl_sgd_step_counted_(t, t->grad, st->buf, count, &h)
                      : pl_sgd_step_(t, t->grad, mom ? st->buf : NULL, &h);
            if (s) return pl_error_prefix(s, "sgd");
            if (mom && !count) st->step++;
        }
        if ((s = step_lists(o, nl))) return pl_error_prefix(s, "sgd");
    }
    return PL_OK;
}

/* State names (version 1): "sgd.step.<param>" (momentum updates done, 0 =
 * buffer not initialised; read from the device when counted there, written
 * back on a load), "sgd.momentum_buffer.<param>" (when momentum is used). */
static pl_status sgd_state_visit(void *self, const pl_state_visitor *v) {
    sgd *o = self;
    char name[PL_NAME_MAX + 64];
    pl_status s;
    /* every device count in one read (a save; a load compares against it) */
    pl_tensor **counts = calloc((size_t)(o->n_params > 0 ? o->n_params : 1), sizeof *counts);
    if (!counts) return pl_error_set(PL_ERR_NOMEM, "sgd: out of memory");
    for (int i = 0; i < o->n_params; i++)
        if (o->st[i].trainable && o->st[i].buf) counts[i] = o->st[i].count;
    double *now = NULL;
    s = pl_optim_counts_read(counts, o->n_params, &now);
    free(counts);
    if (s) return pl_error_prefix(s, "sgd");
    for (int i = 0; i < o->n_params; i++) {
        sgd_state *st = &o->st[i];
        if (!st->trainable || !st->buf) continue;
        const char *pn = pl_params_at(o->params, i)->name;
        snprintf(name, sizeof name, "sgd.step.%s", pn);
        if ((s = pl_optim_count_visit(v, name, st->count, &st->step, "sgd",
                                        now ? &now[i] : NULL)))
            break;
        snprintf(name, sizeof name, "sgd.momentum_buffer.%s", pn);
        if (v->tensor && (s = v->tensor(v->ctx, name, st->buf))) break;
    }
    free(now);
    return s;
}

static const pl_option_spec sgd_options[] = {
    {"lr", PL_OPT_FLOAT, "1e-3", 0, 1e9, NULL, "base learning rate (group initial_lr = lr x lr_scale)"},
    {"momentum", PL_OPT_FLOAT, "0", 0, 1, NULL, "momentum factor mu (group hyper-parameter 'momentum'; cycled by onecycle)"},
    {"dampening", PL_OPT_FLOAT, "0", 0, 1, NULL, "dampening of the gradient in the momentum buffer"},
    {"nesterov", PL_OPT_BOOL, "false", PL_NO_BOUNDS, NULL,
     "Nesterov momentum (needs momentum > 0, dampening = 0)"},
    {"weight_decay", PL_OPT_FLOAT, "0", 0, 1e9, NULL, "coupled L2: g += weight_decay * p"},
    {"foreach", PL_OPT_BOOL, "true", PL_NO_BOUNDS, NULL,
     "multi-tensor step (torch foreach): one kernel per 32 parameters of a group, same bits; false: one per parameter"},
    PL_PARAM_GROUP_OPTIONS,
    PL_OPTIONS_END};

static const pl_optimizer_vtable sgd_vtable = {
    .create = sgd_create,
    .destroy = sgd_destroy,
    .num_groups = sgd_num_groups,
    .group = sgd_group,
    .step = sgd_step,
    .state = sgd_state_visit,
};

PL_PLUGIN_DEFINE(sgd, PL_KIND_OPTIMIZER, "1.0.0",
                 "SGD with momentum / Nesterov (torch.optim.SGD) and parameter groups", sgd_options,
                 &sgd_vtable)
