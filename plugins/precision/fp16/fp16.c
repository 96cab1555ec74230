/* fp16.c - float16 mixed precision with dynamic loss scaling (Lightning
 * precision="16-mixed" = torch.autocast(float16) + torch.cuda.amp.GradScaler).
 *
 * Autocast f16 for matmuls (activations saved in f16), f32 master weights,
 * gradients and optimizer state. The loss is multiplied by `scale` (the
 * backward seed, loss_scale()); before the optimizer step every gradient is
 * multiplied by 1/scale (in f32, as torch's inv_scale) and checked for
 * inf/NaN (torch._amp_foreach_non_finite_check_and_unscale_). Then the
 * scale is updated exactly as GradScaler.update (torch._amp_update_scale_):
 *   inf/NaN found: step skipped, scale *= backoff_factor, tracker = 0;
 *   else: tracker += 1; if tracker == growth_interval: scale *= growth_factor,
 *         tracker = 0.
 * The trainer clips after before_step, so clipping sees unscaled gradients
 * (the order torch's docs prescribe: scaler.unscale_ then clip).
 * setup() converts every floating parameter that arrives in another dtype
 * (a model's bf16 / f16 checkpoint views) to f32: the master weights are
 * f32 (common/prec_convert.h).
 * State (checkpoints): fp16.v1.scale, fp16.v1.growth_tracker.
 */
#include <math.h>
#include <stdlib.h>

#include <pipeline/pipeline.h>
#include "../common/prec_convert.h"
#include "../common/prec_load.h"

typedef struct fp16 {
    double scale;
    double growth_factor, backoff_factor;
    int64_t growth_interval;
    int64_t tracker;
    int64_t skipped;
    pl_run_context *ctx; /* borrowed from create: setup sets its autocast (plugin.h) */
} fp16;

static const pl_option_spec opts[] = {
    {"init_scale", PL_OPT_FLOAT, "65536", 1e-30, 1e30, NULL, "initial loss scale (2^16)"},
    {"growth_factor", PL_OPT_FLOAT, "2.0", 1.0, 1e6, NULL,
     "scale multiplier after growth_interval finite steps"},
    {"backoff_factor", PL_OPT_FLOAT, "0.5", 1e-6, 1.0, NULL, "scale multiplier on inf/NaN"},
    {"growth_interval", PL_OPT_INT, "2000", 1, 1e12, NULL,
     "consecutive finite steps before the scale grows"},
    PL_OPTIONS_END};

static pl_status fp16_create(const pl_config_section *cfg, pl_run_context *ctx, void **self) {
    fp16 *p = calloc(1, sizeof *p);
    if (!p) return pl_error_set(PL_ERR_NOMEM, "fp16: out of memory");
    p->ctx = ctx;
    p->scale = (float)pl_cfg_float(cfg, "init_scale", 65536.0); /* torch keeps it in f32 */
    p->growth_factor = pl_cfg_float(cfg, "growth_factor", 2.0);
    p->backoff_factor = pl_cfg_float(cfg, "backoff_factor", 0.5);
    p->growth_interval = pl_cfg_int(cfg, "growth_interval", 2000);
    *self = p;
    return PL_OK;
}

static void fp16_destroy(void *self) { free(self); }

static pl_status fp16_setup(void *self, pl_params *ps) {
    fp16 *p = self;
    if (p->ctx) p->ctx->autocast = PL_F16;
    return pl_prec_convert_params(ps, PL_F32, "fp16", NULL);
}

static double fp16_loss_scale(void *self) { return ((fp16 *)self)->scale; }

/* g *= inv; true if any element is not finite. */
static bool unscale(float *g, int64_t n, float inv) {
    int bad = 0;
#pragma omp parallel for reduction(| : bad) if (n > 65536) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        g[i] *= inv;
        bad |= !isfinite(g[i]);
    }
    return bad != 0;
}

static bool fp16_before_step(void *self, pl_params *ps) {
    fp16 *p = self;
    float inv = (float)(1.0 / p->scale); /* torch: scale.double().reciprocal().float() */
    bool found_inf = false;
    /* other devices: unscale there with ops; a non-finite element makes
     * sum(g * 0) NaN (inf * 0 = NaN), summed over the parameters and read back
     * once, so no gradient crosses to the host */
    pl_tensor *probe = NULL;
    bool on_device = false;
    pl_frame_begin();
    for (int i = 0; i < pl_params_count(ps); i++) {
        pl_tensor *t = pl_params_at(ps, i)->t;
        if (!t->requires_grad || !t->grad) continue;
        pl_tensor *g = t->grad;
        if (g->device.type == PL_DEVICE_CPU) {
            found_inf |= unscale(pl_tensor_data(g), pl_tensor_numel(g), inv);
            continue;
        }
        on_device = true;
        pl_tensor *u = pl_scale(g, inv);
        pl_tensor *z = u && !pl_tensor_copy_(g, u) ? pl_sum(pl_scale(u, 0.0), PL_ALL_DIMS, false)
                                                   : NULL;
        probe = !z ? NULL : probe ? pl_add(probe, z) : z;
        if (!probe) break; /* an op failed: treated as an overflow (the step is skipped) */
    }
    if (on_device) found_inf |= !probe || !isfinite(pl_tensor_item(probe));
    pl_frame_end();
    if (found_inf) {
        p->scale = (float)(p->scale * p->backoff_factor);
        p->tracker = 0;
        p->skipped++;
        return false;
    }
    if (++p->tracker == p->growth_interval) {
        double s = (float)(p->scale * p->growth_factor);
        if (isfinite(s)) p->scale = s;
        p->tracker = 0;
    }
    return true;
}

static pl_status fp16_state(void *self, const pl_state_visitor *v) {
    fp16 *p = self;
    double tr = (double)p->tracker;
    pl_status st = v->scalar(v->ctx, "fp16.v1.scale", &p->scale);
    if (!st) st = v->scalar(v->ctx, "fp16.v1.growth_tracker", &tr);
    if (!st) p->tracker = (int64_t)tr;
    return st;
}

static const pl_precision_vtable vt = {
    .create = fp16_create,
    .destroy = fp16_destroy,
    .setup = fp16_setup,
    .loss_scale = fp16_loss_scale,
    .before_step = fp16_before_step,
    .state = fp16_state,
    .load_param = pl_prec_load_param,
};

PL_PLUGIN_DEFINE(fp16, PL_KIND_PRECISION, "1.0.0",
                 "float16 autocast with dynamic loss scaling (GradScaler)", opts, &vt)
