/* swa.c - Stochastic Weight Averaging (Izmailov et al. 2018, "Averaging
 * Weights Leads to Wider Optima and Better Generalization"), as
 * torch.optim.swa_utils.AveragedModel (equal-weight running mean of the
 * trainable parameters, n_averaged) plus the SWALR learning-rate annealing.
 *
 * Timeline, S = swa_start_epoch (0-based; `swa_start` fraction: S =
 * floor(swa_start * max_epochs)):
 *   - epochs < S: nothing (lr_factor returns NAN: the scheduler rules).
 *   - at the end of every epoch e >= S (or, with update_every_n_steps = N > 0,
 *     after an optimizer step of an epoch >= S that brings the count of steps
 *     done to a multiple of N) the live weights are folded into the average.
 *   - SWALR (swa_lr > 0): during epoch S + j the lr factor is
 *     swa_f * alpha(j) + f0 * (1 - alpha(j)), swa_f = swa_lr / base lr (the
 *     optimizer's group 0 initial_lr / lr_scale, through ctx->optimizer),
 *     f0 = the factor the trainer passed at the first call of epoch S
 *     (frozen from then on, like torch where the main scheduler stops being
 *     stepped once SWA starts), alpha(j) as in swa.h. This is torch's
 *     `if epoch >= S: swa_model.update_parameters(model); swa_scheduler.step()
 *      else: scheduler.step()` loop, with torch's example `epoch > swa_start`
 *     being S = swa_start + 1.
 * Buffers (PL_TAG_BUFFER, e.g. batch-norm statistics) are not averaged.
 */
#include "swa.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../schedulers/common/sched_common.h"
#include "pipeline/pipeline.h"


double pl_swalr(double swa_lr, double lr0, int64_t j, int64_t anneal_epochs, bool cos_anneal) {
    double t = (double)j / (double)(anneal_epochs > 1 ? anneal_epochs : 1);
    t = t < 0 ? 0 : t > 1 ? 1 : t;
    double alpha = cos_anneal ? (1.0 - cos(M_PI * t)) / 2.0 : t;
    return swa_lr * alpha + lr0 * (1.0 - alpha);
}

/* ---- plugin ------------------------------------------------------------ */

typedef struct swa {
    pl_params *params; /* borrowed */
    int n_params;
    pl_tensor **avg;   /* [n_params] f32 averages of trainable params, owned */
    int64_t start_epoch, every_n_steps, anneal_epochs;
    double swa_factor; /* swa_lr / the optimizer's base lr; <= 0: no SWALR */
    bool cos_anneal;
    int64_t n_averaged;
    double f0;         /* factor when SWA started; NAN until captured */
} swa;

static void swa_destroy(void *self) {
    swa *s = self;
    if (!s) return;
    for (int i = 0; i < s->n_params && s->avg; i++) pl_tensor_release(s->avg[i]);
    free(s->avg);
    free(s);
}

static pl_status swa_create(const pl_config_section *cfg, pl_run_context *ctx, void **self) {
    *self = NULL;
    if (!ctx || !ctx->params)
        return pl_error_set(PL_ERR_INVALID, "swa: the run context has no parameter list");
    swa *s = calloc(1, sizeof *s);
    if (!s) return pl_error_set(PL_ERR_NOMEM, "swa: out of memory");
    s->params = ctx->params;
    s->f0 = NAN;
    int64_t se = pl_cfg_int(cfg, "swa_start_epoch", -1);
    if (se >= 0 && (pl_cfg_is_set(cfg, "swa_start_epoch") || !pl_cfg_is_set(cfg, "swa_start")))
        s->start_epoch = se;
    else
        s->start_epoch = (int64_t)floor(pl_cfg_float(cfg, "swa_start", 0.8) * (double)ctx->max_epochs);
    s->every_n_steps = pl_cfg_int(cfg, "update_every_n_steps", 0);
    s->anneal_epochs = pl_cfg_int(cfg, "annealing_epochs", 10);
    const char *strategy = pl_cfg_str(cfg, "anneal_strategy", "cos");
    if (strcmp(strategy, "cos") && strcmp(strategy, "linear")) {
        swa_destroy(s);
        return pl_error_set(PL_ERR_CONFIG, "swa: anneal_strategy = '%s': expected cos|linear",
                            strategy);
    }
    s->cos_anneal = !strcmp(strategy, "cos");
    if (s->every_n_steps < 0 || s->anneal_epochs < 0) {
        pl_error_set(PL_ERR_CONFIG,
                     "swa: update_every_n_steps = %lld, annealing_epochs = %lld: expected >= 0",
                     (long long)s->every_n_steps, (long long)s->anneal_epochs);
        swa_destroy(s);
        return PL_ERR_CONFIG;
    }
    double swa_lr = pl_cfg_float(cfg, "swa_lr", 0.0);
    if (swa_lr > 0) {
        double base = 1.0;
        pl_status st = pl_sched_optimizer_lr(ctx, "swa", "swa_lr", &base);
        if (st) {
            swa_destroy(s);
            return st;
        }
        s->swa_factor = swa_lr / base;
    }
    s->n_params = pl_params_count(ctx->params);
    s->avg = calloc((size_t)(s->n_params > 0 ? s->n_params : 1), sizeof *s->avg);
    if (!s->avg) {
        swa_destroy(s);
        return pl_error_set(PL_ERR_NOMEM, "swa: out of memory");
    }
    for (int i = 0; i < s->n_params; i++) {
        pl_param *p = pl_params_at(ctx->params, i);
        if (!p->t || !p->t->requires_grad) continue;
        s->avg[i] = pl_tensor_zeros(PL_F32, p->t->ndim, p->t->shape, p->t->device);
        if (!s->avg[i]) {
            swa_destroy(s);
            return pl_error_prefix(pl_error_status() ? pl_error_status() : PL_ERR_NOMEM,
                                   "swa: average of parameter '%s'", p->name);
        }
    }
    *self = s;
    return PL_OK;
}

static pl_status check_avg(swa *s, int i) {
    pl_param *p = pl_params_at(s->params, i);
    char b[256];
    if (p->t->dtype != PL_F32 || pl_tensor_numel(p->t) != pl_tensor_numel(s->avg[i]))
        return pl_error_set(PL_ERR_SHAPE, "swa: parameter '%s' is %s: expected an f32 tensor of %lld "
                            "elements",
                            p->name, pl_tensor_describe(p->t, b, sizeof b),
                            (long long)pl_tensor_numel(s->avg[i]));
    return PL_OK;
}

/* torch.optim.swa_utils.AveragedModel.update_parameters for one tensor, as
 * ops on its device: n_averaged == 0: avg = cur; else
 * avg += (cur - avg) / (n_averaged + 1) in f32 (the same operations in the
 * same order as torch's default avg_fn). */
static pl_status swa_average(swa *s) {
    pl_status st = PL_OK;
    pl_no_grad_begin();
    for (int i = 0; i < s->n_params && !st; i++) {
        if (!s->avg[i]) continue;
        if ((st = check_avg(s, i))) break;
        pl_tensor *live = pl_params_at(s->params, i)->t;
        if (s->n_averaged == 0) {
            st = pl_tensor_copy_(s->avg[i], live);
            continue;
        }
        pl_frame_begin();
        pl_tensor *div = pl_tensor_scalar((float)(s->n_averaged + 1), live->device);
        pl_tensor *upd = pl_add(s->avg[i], pl_div(pl_sub(live, s->avg[i]), div));
        st = upd ? pl_tensor_copy_(s->avg[i], upd) : pl_error_status();
        pl_frame_end();
    }
    pl_no_grad_end();
    if (st) return pl_error_prefix(st, "swa: averaging");
    s->n_averaged++;
    return PL_OK;
}

static pl_status swa_update(void *self, int64_t epoch, int64_t step) {
    swa *s = self;
    if (epoch < s->start_epoch) return PL_OK;
    if (step < 0) return s->every_n_steps == 0 ? swa_average(s) : PL_OK;
    /* after a step, `step` counts the optimizer steps done so far (trainer.c) */
    if (s->every_n_steps > 0 && step > 0 && step % s->every_n_steps == 0) return swa_average(s);
    return PL_OK;
}

static double swa_lr_factor(void *self, int64_t epoch, int64_t step, double current_factor) {
    swa *s = self;
    if (s->swa_factor <= 0 || epoch < s->start_epoch) return NAN;
    if (isnan(s->f0)) s->f0 = current_factor;
    return pl_swalr(s->swa_factor, s->f0, epoch - s->start_epoch, s->anneal_epochs, s->cos_anneal);
}

static pl_status swa_swap(void *self) {
    swa *s = self;
    if (s->n_averaged == 0)
        return pl_error_set(PL_ERR_INVALID,
                            "swa: swap requested but no weights were averaged yet (averaging "
                            "starts at epoch %lld)",
                            (long long)s->start_epoch);
    pl_status st = PL_OK;
    for (int i = 0; i < s->n_params && !st; i++) {
        if (!s->avg[i]) continue;
        if ((st = check_avg(s, i))) break;
        /* exchange through a copy on the same device */
        pl_tensor *live = pl_params_at(s->params, i)->t;
        pl_tensor *tmp = pl_tensor_empty_owned(PL_F32, live->ndim, live->shape, live->device);
        st = tmp ? pl_tensor_copy_(tmp, live) : pl_error_status();
        if (!st) st = pl_tensor_copy_(live, s->avg[i]);
        if (!st) st = pl_tensor_copy_(s->avg[i], tmp);
        pl_tensor_release(tmp);
    }
    return st;
}

static bool swa_has_average(void *self) { return ((swa *)self)->n_averaged > 0; }

/* State names (version 1): swa.n_averaged, swa.lr_start_factor (NaN until
 * SWA starts), swa.avg.<param> (f32, one per trainable parameter). */
static pl_status swa_state(void *self, const pl_state_visitor *v) {
    swa *s = self;
    pl_status st;
    if (v->scalar) {
        double n = (double)s->n_averaged;
        if ((st = v->scalar(v->ctx, "swa.n_averaged", &n)) ||
            (st = v->scalar(v->ctx, "swa.lr_start_factor", &s->f0)))
            return st;
        if (n < 0 || n != floor(n))
            return pl_error_set(PL_ERR_INVALID, "swa: state 'swa.n_averaged' = %g: expected a count",
                                n);
        s->n_averaged = (int64_t)n;
    }
    if (!v->tensor) return PL_OK;
    char name[PL_NAME_MAX + 16];
    for (int i = 0; i < s->n_params; i++) {
        if (!s->avg[i]) continue;
        snprintf(name, sizeof name, "swa.avg.%s", pl_params_at(s->params, i)->name);
        if ((st = v->tensor(v->ctx, name, s->avg[i]))) return st;
    }
    return PL_OK;
}

static const pl_option_spec swa_options[] = {
    {"swa_start_epoch", PL_OPT_INT, "-1", -1, 1e9, NULL,
     "first 0-based epoch whose end is averaged (-1: use swa_start)"},
    {"swa_start", PL_OPT_FLOAT, "0.8", 0, 1, NULL,
     "start as a fraction of max_epochs, floor(swa_start * max_epochs)"},
    {"update_every_n_steps", PL_OPT_INT, "0", 0, 1e12, NULL,
     "average every N optimizer steps instead of every epoch end (0: epoch ends)"},
    {"swa_lr", PL_OPT_FLOAT, "0", 0, 1e9, NULL,
     "SWALR target learning rate, absolute (0: no lr override)"},
    {"anneal_strategy", PL_OPT_CHOICE, "cos", PL_NO_BOUNDS, "cos|linear",
     "SWALR annealing shape"},
    {"annealing_epochs", PL_OPT_INT, "10", 0, 1e9, NULL, "epochs to anneal from the lr to swa_lr"},
    PL_OPTIONS_END};

static const pl_averager_vtable swa_vtable = {
    .create = swa_create,
    .destroy = swa_destroy,
    .update = swa_update,
    .lr_factor = swa_lr_factor,
    .swap = swa_swap,
    .has_average = swa_has_average,
    .state = swa_state,
};

PL_PLUGIN_DEFINE(swa, PL_KIND_AVERAGER, "1.0.0",
                 "stochastic weight averaging + SWALR (torch.optim.swa_utils)", swa_options,
                 &swa_vtable)
