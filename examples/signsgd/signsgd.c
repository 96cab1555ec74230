/* signsgd.c - signSGD with momentum (Signum), decoupled weight decay.
 *
 * Bernstein et al. 2018, "signSGD: Compressed Optimisation for Non-Convex
 * Problems", Algorithm 3 (Signum), per parameter p with gradient g:
 *   m <- beta m + (1 - beta) g          (beta = 0: plain signSGD, m = g)
 *   p <- p - lr (sign(m) + wd p)        (wd skipped for PL_TAG_NO_DECAY params)
 * with sign(0) = 0 and m = 0 before the first step.
 *
 * An example of the optimizer contract of <pipeline/plugin.h>: one group
 * over the trainable parameters, its momentum exposed as the named
 * hyper-parameter "momentum" (a scheduler may drive it through
 * pl_group_hparam), momentum buffers as owned tensors saved in checkpoints
 * through the state visitor. CPU f32 parameters only.
 * Built only against the installed headers. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <pipeline/pipeline.h>

typedef struct signsgd {
    pl_params *params;    /* borrowed from the run context */
    pl_param_group group; /* one group: every trainable parameter */
    pl_tensor **m;        /* owned momentum buffers, one per group member */
} signsgd;

static const pl_option_spec sg_options[] = {
    {"lr", PL_OPT_FLOAT, "1e-3", 0, 1e3, NULL, "learning rate (step size of each sign)"},
    {"momentum", PL_OPT_FLOAT, "0.9", 0, 0.999999, NULL,
     "beta of the gradient average whose sign is taken (0: plain signSGD)"},
    {"weight_decay", PL_OPT_FLOAT, "0", 0, 1e3, NULL,
     "decoupled weight decay, skipped for no_decay parameters"},
    PL_OPTIONS_END};

static void sg_destroy(void *self) {
    signsgd *o = self;
    if (!o) return;
    for (int k = 0; k < o->group.n_params && o->m; k++)
        pl_tensor_release(o->m[k]);
    free(o->m);
    free(o->group.param_index);
    free(o);
}

static pl_status sg_create(const pl_config_section *cfg, pl_run_context *ctx, void **self) {
    *self = NULL;
    if (!ctx || !ctx->params)
        return pl_error_set(PL_ERR_INVALID, "signsgd: the run context has no parameter list");
    if (ctx->device.type != PL_DEVICE_CPU)
        return pl_error_set(PL_ERR_DEVICE, "signsgd: runs on the CPU only (device is %s)",
                            pl_device_str(ctx->device, (char[32]){0}, 32));
    signsgd *o = calloc(1, sizeof *o);
    int n = pl_params_count(ctx->params);
    if (o) o->group.param_index = calloc((size_t)(n > 0 ? n : 1), sizeof(int));
    if (o) o->m = calloc((size_t)(n > 0 ? n : 1), sizeof(pl_tensor *));
    if (!o || !o->group.param_index || !o->m) {
        sg_destroy(o);
        return pl_error_set(PL_ERR_NOMEM, "signsgd: out of memory");
    }
    o->params = ctx->params;
    pl_param_group *g = &o->group;
    snprintf(g->name, sizeof g->name, "default");
    g->lr_scale = 1.0;
    g->initial_lr = g->lr = pl_cfg_float(cfg, "lr", 1e-3);
    g->weight_decay = pl_cfg_float(cfg, "weight_decay", 0.0);
    pl_status st = pl_group_hparam_set(g, "momentum", pl_cfg_float(cfg, "momentum", 0.9));
    for (int i = 0; i < n && !st; i++) {
        const pl_param *p = pl_params_at(ctx->params, i);
        if (!p->t->requires_grad) continue; /* frozen weights and buffers */
        if (p->t->dtype != PL_F32 || !pl_tensor_is_contiguous(p->t)) {
            st = pl_error_set(PL_ERR_DTYPE,
                              "signsgd: parameter '%s' is %s%s; expected a "
                              "contiguous f32 tensor",
                              p->name, pl_dtype_name(p->t->dtype),
                              pl_tensor_is_contiguous(p->t) ? "" : " (strided)");
            break;
        }
        /* owned: survives whatever frame is open; released in destroy */
        pl_tensor *m = pl_tensor_zeros_owned(PL_F32, p->t->ndim, p->t->shape, p->t->device);
        if (!m) {
            st = pl_error_prefix(pl_error_status(), "signsgd: momentum of '%s'", p->name);
            break;
        }
        o->m[g->n_params] = m;
        g->param_index[g->n_params++] = i;
    }
    if (st) {
        sg_destroy(o);
        return st;
    }
    *self = o;
    return PL_OK;
}

static int sg_num_groups(void *self) {
    (void)self;
    return 1;
}

static pl_param_group *sg_group(void *self, int i) {
    return i == 0 ? &((signsgd *)self)->group : NULL;
}

static pl_status sg_step(void *self) {
    signsgd *o = self;
    const pl_param_group *g = &o->group;
    /* read every step: a scheduler may have driven it */
    const pl_hparam *h = pl_group_hparam(&o->group, "momentum");
    const float beta = h ? (float)h->value : 0.0f;
    const float lr = (float)g->lr;
    for (int k = 0; k < g->n_params; k++) {
        pl_param *p = pl_params_at(o->params, g->param_index[k]);
        if (!p) return pl_error_status();
        pl_tensor *t = p->t;
        if (!t->grad) continue; /* not reached by this backward */
        float *w = pl_tensor_f32(t), *gr = pl_tensor_f32(t->grad), *m = pl_tensor_f32(o->m[k]);
        if (!w || !gr || !m)
            return pl_error_prefix(pl_error_status(), "signsgd: parameter '%s'", p->name);
        const float wd = (p->tags & PL_TAG_NO_DECAY) ? 0.0f : (float)g->weight_decay;
        const int64_t n = pl_tensor_numel(t);
        for (int64_t i = 0; i < n; i++) {
            float mi = beta * m[i] + (1.0f - beta) * gr[i];
            m[i] = mi;
            float s = (float)((mi > 0.0f) - (mi < 0.0f));
            w[i] -= lr * (s + wd * w[i]);
        }
    }
    return PL_OK;
}

/* Checkpoint state: "signsgd.momentum.<parameter name>" per buffer. The same
 * function saves (the visitor reads the tensor) and loads (it writes it). */
static pl_status sg_state(void *self, const pl_state_visitor *v) {
    signsgd *o = self;
    char name[PL_NAME_MAX + 32];
    for (int k = 0; k < o->group.n_params; k++) {
        const pl_param *p = pl_params_at(o->params, o->group.param_index[k]);
        snprintf(name, sizeof name, "signsgd.momentum.%s", p->name);
        pl_status st = v->tensor(v->ctx, name, o->m[k]);
        if (st) return st;
    }
    return PL_OK;
}

static const pl_optimizer_vtable sg_vtable = {
    .create = sg_create,
    .destroy = sg_destroy,
    .num_groups = sg_num_groups,
    .group = sg_group,
    .step = sg_step,
    .state = sg_state,
};

PL_PLUGIN_DEFINE(signsgd, PL_KIND_OPTIMIZER, "1.0.0",
                 "signSGD with momentum (Signum), decoupled weight decay", sg_options, &sg_vtable)
