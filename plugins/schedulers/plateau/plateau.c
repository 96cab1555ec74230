/* plateau.c - torch.optim.lr_scheduler.ReduceLROnPlateau, epoch level:
 * on_validation(metric) after each validation; lr_factor() returns the
 * current lr / optimizer.lr whatever the step.
 *
 *   better(a) = a < best (1 - threshold)   min, rel      a > best (1 + threshold)  max, rel
 *               a < best - threshold       min, abs      a > best + threshold      max, abs
 *   better: best = a, bad = 0;  else bad += 1
 *   in cooldown (counter > 0): counter -= 1, bad = 0
 *   bad > patience: lr' = max(lr * factor, min_lr), applied if lr - lr' > eps;
 *                   counter = cooldown, bad = 0
 * best starts at +inf (min) / -inf (max); a NaN metric is never better.
 */
#include "plateau.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/sched_common.h"
#include "pipeline/pipeline.h"

void pl_plateau_reset(pl_plateau *p, double lr0) {
    p->lr = lr0;
    p->best = p->mode_max ? -INFINITY : INFINITY;
    p->num_bad_epochs = 0;
    p->cooldown_counter = 0;
    p->last_epoch = 0;
}

static bool is_better(const pl_plateau *p, double a) {
    if (!p->mode_max) return p->rel ? a < p->best * (1.0 - p->threshold) : a < p->best - p->threshold;
    return p->rel ? a > p->best * (p->threshold + 1.0) : a > p->best + p->threshold;
}

bool pl_plateau_step(pl_plateau *p, double metric) {
    bool reduced = false;
    p->last_epoch++;
    if (is_better(p, metric)) {
        p->best = metric;
        p->num_bad_epochs = 0;
    } else {
        p->num_bad_epochs++;
    }
    if (p->cooldown_counter > 0) {
        p->cooldown_counter--;
        p->num_bad_epochs = 0;
    }
    if (p->num_bad_epochs > p->patience) {
        double old_lr = p->lr;
        double new_lr = fmax(old_lr * p->factor, p->min_lr);
        if (old_lr - new_lr > p->eps) {
            p->lr = new_lr;
            reduced = true;
        }
        p->cooldown_counter = p->cooldown;
        p->num_bad_epochs = 0;
    }
    return reduced;
}

/* ---- plugin ------------------------------------------------------------ */

typedef struct plateau {
    pl_plateau p;
    double base_lr; /* optimizer.lr */
    char monitor[64];
    int verbose;
} plateau;

static pl_status plateau_create(const pl_config_section *cfg, pl_run_context *ctx, void **self) {
    *self = NULL;
    plateau o;
    memset(&o, 0, sizeof o);
    const char *mode = pl_cfg_str(cfg, "mode", "min");
    const char *tmode = pl_cfg_str(cfg, "threshold_mode", "rel");
    if (strcmp(mode, "min") && strcmp(mode, "max"))
        return pl_error_set(PL_ERR_CONFIG, "plateau: mode = '%s': expected min|max", mode);
    if (strcmp(tmode, "rel") && strcmp(tmode, "abs"))
        return pl_error_set(PL_ERR_CONFIG, "plateau: threshold_mode = '%s': expected rel|abs",
                            tmode);
    o.p.mode_max = !strcmp(mode, "max");
    o.p.rel = !strcmp(tmode, "rel");
    o.p.factor = pl_cfg_float(cfg, "factor", 0.1);
    o.p.patience = pl_cfg_int(cfg, "patience", 10);
    o.p.threshold = pl_cfg_float(cfg, "threshold", 1e-4);
    o.p.cooldown = pl_cfg_int(cfg, "cooldown", 0);
    o.p.min_lr = pl_cfg_float(cfg, "min_lr", 0.0);
    o.p.eps = pl_cfg_float(cfg, "eps", 1e-8);
    if (!(o.p.factor < 1.0) || o.p.factor < 0)
        return pl_error_set(PL_ERR_CONFIG, "plateau: factor = %g: expected in [0, 1)", o.p.factor);
    const char *mon = pl_cfg_str(cfg, "monitor", "val_loss");
    if (!mon || !mon[0] || strlen(mon) >= sizeof o.monitor)
        return pl_error_set(PL_ERR_CONFIG, "plateau: monitor = '%s': expected a metric name of "
                            "1-63 characters", mon ? mon : "");
    strcpy(o.monitor, mon);
    pl_status s = pl_sched_optimizer_lr(ctx, "plateau", "min_lr/eps", &o.base_lr);
    if (s) return s;
    pl_plateau_reset(&o.p, o.base_lr);
    o.verbose = ctx ? ctx->verbose : 0;
    plateau *p = malloc(sizeof *p);
    if (!p) return pl_error_set(PL_ERR_NOMEM, "plateau: out of memory");
    *p = o;
    *self = p;
    return PL_OK;
}

static void plateau_destroy(void *self) { free(self); }

static double plateau_factor(void *self, int64_t step) {
    const plateau *o = self;
    return o->p.lr / o->base_lr;
}

static void plateau_on_validation(void *self, double metric) {
    plateau *o = self;
    double before = o->p.lr;
    if (pl_plateau_step(&o->p, metric) && o->verbose)
        pl_message("plateau: %s = %g did not improve on %g for %lld validations: lr %g -> %g",
                   o->monitor, metric, o->p.best, (long long)(o->p.patience + 1), before, o->p.lr);
}

static const char *plateau_monitor(void *self) { return ((plateau *)self)->monitor; }

/* State names (version 1): plateau.lr (absolute), plateau.best,
 * plateau.num_bad_epochs, plateau.cooldown_counter, plateau.last_epoch. */
static pl_status plateau_state(void *self, const pl_state_visitor *v) {
    plateau *o = self;
    if (!v->scalar) return PL_OK;
    double bad = (double)o->p.num_bad_epochs, cd = (double)o->p.cooldown_counter,
           last = (double)o->p.last_epoch;
    pl_status s;
    if ((s = v->scalar(v->ctx, "plateau.lr", &o->p.lr)) ||
        (s = v->scalar(v->ctx, "plateau.best", &o->p.best)) ||
        (s = v->scalar(v->ctx, "plateau.num_bad_epochs", &bad)) ||
        (s = v->scalar(v->ctx, "plateau.cooldown_counter", &cd)) ||
        (s = v->scalar(v->ctx, "plateau.last_epoch", &last)))
        return s;
    o->p.num_bad_epochs = (int64_t)bad;
    o->p.cooldown_counter = (int64_t)cd;
    o->p.last_epoch = (int64_t)last;
    return PL_OK;
}

static const pl_option_spec plateau_options[] = {
    {"monitor", PL_OPT_STRING, "val_loss", PL_NO_BOUNDS, NULL,
     "validation metric watched (\"val_\" + metric name)"},
    {"mode", PL_OPT_CHOICE, "min", PL_NO_BOUNDS, "min|max", "min: lower is better; max: higher"},
    {"factor", PL_OPT_FLOAT, "0.1", 0, 0.999999, NULL, "lr multiplier on a plateau (< 1)"},
    {"patience", PL_OPT_INT, "10", 0, 1e9, NULL, "validations without improvement tolerated"},
    {"threshold", PL_OPT_FLOAT, "1e-4", 0, 1e9, NULL, "minimal improvement (see threshold_mode)"},
    {"threshold_mode", PL_OPT_CHOICE, "rel", PL_NO_BOUNDS, "rel|abs",
     "rel: best * (1 -/+ threshold); abs: best -/+ threshold"},
    {"cooldown", PL_OPT_INT, "0", 0, 1e9, NULL, "validations to wait after a reduction"},
    {"min_lr", PL_OPT_FLOAT, "0", 0, 1e9, NULL, "lower bound of the lr, absolute"},
    {"eps", PL_OPT_FLOAT, "1e-8", 0, 1e9, NULL, "reductions smaller than eps (absolute) are skipped"},
    PL_OPTIONS_END};

static const pl_scheduler_vtable plateau_vtable = {
    .create = plateau_create,
    .destroy = plateau_destroy,
    .lr_factor = plateau_factor,
    .on_validation = plateau_on_validation,
    .state = plateau_state,
    .monitor = plateau_monitor,
};

PL_PLUGIN_DEFINE(plateau, PL_KIND_SCHEDULER, "1.0.0",
                 "reduce the lr when a validation metric stops improving "
                 "(torch.optim.lr_scheduler.ReduceLROnPlateau)",
                 plateau_options, &plateau_vtable)
