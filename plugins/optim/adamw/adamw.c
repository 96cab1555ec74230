/* adamw.c - torch.optim.AdamW (decoupled weight decay) and, with l2 = true,
 * torch.optim.Adam with coupled L2 weight decay; optional AMSGrad; parameter
 * groups (../common/param_groups.h).
 *
 * Per parameter with a gradient, step t (1-based, counted per parameter):
 *   AdamW:  p <- p * (1 - lr * wd)              L2: g <- g + wd * p
 *   m <- m + (1 - beta1) (g - m)                (torch lerp_)
 *   v <- beta2 v + (1 - beta2) g^2
 *   vmax <- max(vmax, v)                        (amsgrad; v below means vmax)
 *   p <- p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
 * in f32 with the operation order of torch's single-tensor implementation
 * (torch/optim/adam.py, _single_tensor_adam); the per-element math is the
 * core's optim_math.h and runs on the parameters' device (pl_adamw_step_). Parameters without a gradient
 * are skipped and their step count does not advance, as in torch.
 *
 * The step count t lives on the parameter's device (an f32 [1] per
 * parameter, as torch's fused AdamW keeps state_steps; ABI 2.12): the kernel
 * increments it and computes the bias corrections from it, and leaves it
 * alone on a step skipped on the device (the trainer's found_inf: an fp16
 * scaler skip or a non-finite loss), as torch's `_foreach_sub_(state_steps,
 * found_inf)` does, so the host never reads it during training. A backend
 * whose kernels keep no count (pl_optim_counts_on_device) gets the host's
 * count, as before (there a device skip still advances it).
 *
 * foreach = true (the default; torch's foreach / fused): a group's
 * parameters with a gradient are updated by pl_adamw_step_multi_, one kernel
 * call per PL_OPTIM_MULTI_MAX parameters of a device instead of one per
 * parameter, with the same bits (the core falls back to per-tensor calls on
 * a backend without the multi-tensor kernel). foreach = false: one
 * pl_adamw_step_ per parameter (torch's _single_tensor_adam).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/param_groups.h"
#include "pipeline/optim_math.h"
#include "pipeline/pipeline.h"

/* ---- plugin ------------------------------------------------------------ */

typedef struct adamw_state {
    pl_tensor *exp_avg, *exp_avg_sq, *max_exp_avg_sq; /* f32, owned; NULL if not trainable */
    pl_tensor *count; /* the step count on the device (f32 [1], owned), or NULL: step */
    int64_t step;     /* the step count on the host (count NULL) */
} adamw_state;

typedef struct adamw {
    pl_params *params; /* borrowed from the run context */
    pl_optim_groups groups;
    double eps;
    bool l2, amsgrad, foreach;
    int n_params;
    adamw_state *st; /* [n_params], indexed like ctx->params */
    /* foreach: one group's lists, [n_params] each (scratch of step) */
    pl_tensor **lp, **lg, **lm, **lv, **lvm, **lc;
    pl_adamw_hyper *lh;
} adamw;

static void adamw_destroy(void *self) {
    adamw *a = self;
    if (!a) return;
    for (int i = 0; i < a->n_params && a->st; i++) {
        pl_tensor_release(a->st[i].exp_avg);
        pl_tensor_release(a->st[i].exp_avg_sq);
        pl_tensor_release(a->st[i].max_exp_avg_sq);
        pl_tensor_release(a->st[i].count);
    }
    free(a->st);
    free(a->lc);
    free(a->lp);
    free(a->lg);
    free(a->lm);
    free(a->lv);
    free(a->lvm);
    free(a->lh);
    pl_optim_groups_free(&a->groups);
    free(a);
}

static pl_tensor *zeros_f32_like(const pl_tensor *t) {
    return pl_tensor_zeros(PL_F32, t->ndim, t->shape, t->device);
}

static pl_status adamw_create(const pl_config_section *cfg, pl_run_context *ctx, void **self) {
    *self = NULL;
    if (!ctx || !ctx->params)
        return pl_error_set(PL_ERR_INVALID, "adamw: the run context has no parameter list");
    adamw *a = calloc(1, sizeof *a);
    if (!a) return pl_error_set(PL_ERR_NOMEM, "adamw: out of memory");
    a->params = ctx->params;
    a->eps = pl_cfg_float(cfg, "eps", 1e-8);
    a->l2 = pl_cfg_bool(cfg, "l2", false);
    a->amsgrad = pl_cfg_bool(cfg, "amsgrad", false);
    a->foreach = pl_cfg_bool(cfg, "foreach", true);
    pl_optim_group_defaults d = {
        .lr = pl_cfg_float(cfg, "lr", 1e-3),
        .weight_decay = pl_cfg_float(cfg, "weight_decay", 1e-2),
        /* torch's betas = (beta1, beta2), named so schedulers can drive them */
        .n_hparams = 2,
        .hparam_name = {"beta1", "beta2"},
        .hparam_value = {pl_cfg_float(cfg, "beta1", 0.9), pl_cfg_float(cfg, "beta2", 0.999)},
    };
    pl_status s = pl_optim_groups_build(cfg, ctx->params, "adamw", &d, &a->groups);
    if (s) {
        free(a);
        return s;
    }
    a->n_params = pl_params_count(ctx->params);
    size_t np = (size_t)(a->n_params > 0 ? a->n_params : 1);
    a->st = calloc(np, sizeof *a->st);
    a->lp = calloc(np, sizeof *a->lp);
    a->lg = calloc(np, sizeof *a->lg);
    a->lm = calloc(np, sizeof *a->lm);
    a->lv = calloc(np, sizeof *a->lv);
    a->lvm = calloc(np, sizeof *a->lvm);
    a->lh = calloc(np, sizeof *a->lh);
    a->lc = calloc(np, sizeof *a->lc);
    if (!a->st || !a->lp || !a->lg || !a->lm || !a->lv || !a->lvm || !a->lh || !a->lc) {
        adamw_destroy(a);
        return pl_error_set(PL_ERR_NOMEM, "adamw: out of memory");
    }
    for (int gi = 0; gi < a->groups.n; gi++) {
        const pl_param_group *g = &a->groups.g[gi];
        for (int k = 0; k < g->n_params; k++) {
            pl_param *p = pl_params_at(ctx->params, g->param_index[k]);
            adamw_state *st = &a->st[g->param_index[k]];
            st->exp_avg = zeros_f32_like(p->t);
            st->exp_avg_sq = zeros_f32_like(p->t);
            if (a->amsgrad) st->max_exp_avg_sq = zeros_f32_like(p->t);
            bool dev = pl_optim_counts_on_device(p->t->device);
            if (dev) st->count = pl_tensor_zeros_owned(PL_F32, 1, (int64_t[]){1}, p->t->device);
            if (!st->exp_avg || !st->exp_avg_sq || (a->amsgrad && !st->max_exp_avg_sq) ||
                (dev && !st->count)) {
                adamw_destroy(a);
                return pl_error_prefix(pl_error_status() ? pl_error_status() : PL_ERR_NOMEM,
                                       "adamw: state of parameter '%s'", p->name);
            }
        }
    }
    *self = a;
    return PL_OK;
}

static int adamw_num_groups(void *self) { return ((adamw *)self)->groups.n; }

static pl_param_group *adamw_group(void *self, int i) {
    adamw *a = self;
    return (i >= 0 && i < a->groups.n) ? &a->groups.g[i] : NULL;
}

/* The foreach lists of one group (nl parameters): one multi-tensor call,
 * counted on the device or on the host; per-tensor calls when the group
 * mixes the two (parameters on devices of both kinds). */
static pl_status step_lists(adamw *a, int nl) {
    int nc = 0;
    for (int i = 0; i < nl; i++) nc += a->lc[i] != NULL;
    if (nc == nl && nl > 0)
        return pl_adamw_step_multi_counted_(nl, a->lp, a->lg, a->lm, a->lv, a->lvm, a->lc, a->lh);
    if (nc == 0) return pl_adamw_step_multi_(nl, a->lp, a->lg, a->lm, a->lv, a->lvm, a->lh);
    pl_status s = PL_OK;
    for (int i = 0; i < nl && !s; i++)
        s = a->lc[i] ? pl_adamw_step_counted_(a->lp[i], a->lg[i], a->lm[i], a->lv[i], a->lvm[i],
                                              a->lc[i], &a->lh[i])
                     : pl_adamw_step_(a->lp[i], a->lg[i], a->lm[i], a->lv[i], a->lvm[i], &a->lh[i]);
    return s;
}

static pl_status adamw_step(void *self) {
    adamw *a = self;
    pl_status s;
    for (int gi = 0; gi < a->groups.n; gi++) {
        pl_param_group *g = &a->groups.g[gi];
        const double beta1 = pl_group_hparam(g, "beta1")->value;
        const double beta2 = pl_group_hparam(g, "beta2")->value;
        int nl = 0; /* foreach: the group's list */
        for (int k = 0; k < g->n_params; k++) {
            pl_param *p = pl_params_at(a->params, g->param_index[k]);
            adamw_state *st = &a->st[g->param_index[k]];
            pl_tensor *t = p->t;
            if (!t->grad) continue;
            if (!st->count) st->step++;
            pl_adamw_hyper h = {.lr = g->lr,
                                .beta1 = beta1,
                                .beta2 = beta2,
                                .eps = a->eps,
                                .weight_decay = g->weight_decay,
                                .l2 = a->l2,
                                .amsgrad = a->amsgrad,
                                .step = st->count ? 1 : st->step}; /* counted: the device's */
            if (a->foreach) {
                a->lp[nl] = t;
                a->lg[nl] = t->grad;
                a->lm[nl] = st->exp_avg;
                a->lv[nl] = st->exp_avg_sq;
                a->lvm[nl] = st->max_exp_avg_sq;
                a->lc[nl] = st->count;
                a->lh[nl++] = h;
                continue;
            }
            s = st->count ? pl_adamw_step_counted_(t, t->grad, st->exp_avg, st->exp_avg_sq,
                                                   st->max_exp_avg_sq, st->count, &h)
                          : pl_adamw_step_(t, t->grad, st->exp_avg, st->exp_avg_sq,
                                           st->max_exp_avg_sq, &h);
            if (s) return pl_error_prefix(s, "adamw");
        }
        if ((s = step_lists(a, nl))) return pl_error_prefix(s, "adamw");
    }
    return PL_OK;
}

/* State names (version 1): "adamw.step.<param>" (scalar, per parameter),
 * "adamw.exp_avg.<param>", "adamw.exp_avg_sq.<param>",
 * "adamw.max_exp_avg_sq.<param>" (amsgrad only). A count on the device is
 * read for the scalars (all of them in one read: pl_optim_counts_read) and written back
 * when the visitor changed it (a load); the names and values are those of
 * the host count, so checkpoints of either kind load into the other. */
static pl_status adamw_state_visit(void *self, const pl_state_visitor *v) {
    adamw *a = self;
    char name[PL_NAME_MAX + 64];
    pl_status s;
    /* every device count in one read (a save; a load compares against it) */
    pl_tensor **counts = calloc((size_t)(a->n_params > 0 ? a->n_params : 1), sizeof *counts);
    if (!counts) return pl_error_set(PL_ERR_NOMEM, "adamw: out of memory");
    for (int i = 0; i < a->n_params; i++)
        if (a->st[i].exp_avg) counts[i] = a->st[i].count;
    double *now = NULL;
    s = pl_optim_counts_read(counts, a->n_params, &now);
    free(counts);
    if (s) return pl_error_prefix(s, "adamw");
    for (int i = 0; i < a->n_params; i++) {
        adamw_state *st = &a->st[i];
        if (!st->exp_avg) continue;
        const char *pn = pl_params_at(a->params, i)->name;
        snprintf(name, sizeof name, "adamw.step.%s", pn);
        if ((s = pl_optim_count_visit(v, name, st->count, &st->step, "adamw",
                                        now ? &now[i] : NULL)))
            break;
        if (!v->tensor) continue;
        snprintf(name, sizeof name, "adamw.exp_avg.%s", pn);
        if ((s = v->tensor(v->ctx, name, st->exp_avg))) break;
        snprintf(name, sizeof name, "adamw.exp_avg_sq.%s", pn);
        if ((s = v->tensor(v->ctx, name, st->exp_avg_sq))) break;
        if (st->max_exp_avg_sq) {
            snprintf(name, sizeof name, "adamw.max_exp_avg_sq.%s", pn);
            if ((s = v->tensor(v->ctx, name, st->max_exp_avg_sq))) break;
        }
    }
    free(now);
    return s;
}

static const pl_option_spec adamw_options[] = {
    {"lr", PL_OPT_FLOAT, "1e-3", 0, 1e9, NULL, "base learning rate (group initial_lr = lr x lr_scale)"},
    {"beta1", PL_OPT_FLOAT, "0.9", 0, 0.999999, NULL, "first-moment decay (group hyper-parameter 'beta1'; cycled by onecycle)"},
    {"beta2", PL_OPT_FLOAT, "0.999", 0, 0.999999999, NULL, "second-moment decay"},
    {"eps", PL_OPT_FLOAT, "1e-8", 0, 1, NULL, "added to sqrt(v_hat)"},
    {"weight_decay", PL_OPT_FLOAT, "1e-2", 0, 1e9, NULL,
     "decoupled decay p *= 1 - lr*wd (L2 penalty with l2 = true)"},
    {"l2", PL_OPT_BOOL, "false", PL_NO_BOUNDS, NULL,
     "coupled L2 (g += wd*p, torch.optim.Adam) instead of decoupled decay"},
    {"amsgrad", PL_OPT_BOOL, "false", PL_NO_BOUNDS, NULL, "use max of past v (AMSGrad)"},
    {"foreach", PL_OPT_BOOL, "true", PL_NO_BOUNDS, NULL,
     "multi-tensor step (torch foreach / fused): one kernel per 32 parameters of a group, same bits; false: one per parameter"},
    PL_PARAM_GROUP_OPTIONS,
    PL_OPTIONS_END};

static const pl_optimizer_vtable adamw_vtable = {
    .create = adamw_create,
    .destroy = adamw_destroy,
    .num_groups = adamw_num_groups,
    .group = adamw_group,
    .step = adamw_step,
    .state = adamw_state_visit,
};

PL_PLUGIN_DEFINE(adamw, PL_KIND_OPTIMIZER, "1.0.0",
                 "AdamW / Adam-L2 (torch.optim.AdamW, Adam) with parameter groups", adamw_options,
                 &adamw_vtable)
