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
 *
 * In a one-process run (ABI 2.11, loss_scale_tensor / before_step_device,
 * plugin.h) the scaler lives on the run's device, as torch's does: `scale` an f32 [1] and
 * `growth_tracker` an i32 [1] device tensor; the trainer seeds backward with
 * the device scale; before_step_device unscales every gradient by
 * 1 / scale (f32 division = torch's scale.double().reciprocal().float())
 * with amp_unscale_multi into the trainer's found_inf flag, which the
 * optimizer kernels obey, and updates the scale with amp_update_scale: no
 * host read, so the step can be a captured graph. Same arithmetic as the
 * host path below (optim_math.h's element functions), so the same scales
 * and gradients; the host path (before_step) stays for data parallel. What
 * differs from the host path in a run: a skipped step still calls the
 * optimizer (its kernels skip), so AdamW's own step count (bias correction)
 * advances, as for any step skipped on the device (step_values.c); torch's
 * fused AdamW takes it back on the device, this trainer does not. The host copy (scale, tracker) is refreshed from the
 * device only when asked (loss_scale(), state()); `skipped` counts only the
 * host path's skips (nothing reads it; the trainer's step counts are
 * unaffected by a scaler skip either way).
 */
#include <math.h>
#include <stdint.h>
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
    /* the device scaler (loss_scale_tensor), or NULL: the host path */
    pl_tensor *dscale;   /* f32 [1] */
    pl_tensor *dtracker; /* i32 [1], torch's int32 growth tracker */
    pl_tensor *one;      /* f32 [1] = 1: inv_scale = one / scale */
    pl_tensor **grads;   /* before_step_device's list, [ngrads_cap] */
    int grads_cap;
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

static void fp16_destroy(void *self) {
    fp16 *p = self;
    if (!p) return;
    pl_tensor_release(p->dscale);
    pl_tensor_release(p->dtracker);
    pl_tensor_release(p->one);
    free(p->grads);
    free(p);
}

static pl_status fp16_setup(void *self, pl_params *ps) {
    fp16 *p = self;
    if (p->ctx) p->ctx->autocast = PL_F16;
    return pl_prec_convert_params(ps, PL_F32, "fp16", NULL);
}

/* The host copy from the device scaler (a host read: checkpoints, tests). */
static pl_status pull(fp16 *p) {
    if (!p->dscale) return PL_OK;
    double s = pl_tensor_item(p->dscale), tr = pl_tensor_item(p->dtracker);
    if (isnan(tr))
        return pl_error_prefix(pl_error_status() ? pl_error_status() : PL_ERR_INTERNAL,
                               "fp16: reading the device loss scale");
    p->scale = s;
    p->tracker = (int64_t)tr;
    return PL_OK;
}

static double fp16_loss_scale(void *self) {
    fp16 *p = self;
    if (p->dscale && pull(p)) return NAN;
    return p->scale;
}

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

/* The device scaler from the host copy (setup, a checkpoint's load). */
static pl_status push(fp16 *p) {
    if (!p->dscale) return PL_OK;
    pl_status st = pl_tensor_fill_(p->dscale, (float)p->scale);
    if (!st) st = pl_tensor_fill_(p->dtracker, (double)p->tracker);
    return st ? pl_error_prefix(st, "fp16: writing the device loss scale") : PL_OK;
}

/* ABI 2.11: the scaler on dev, made once (the CPU too: the trainer then
 * runs one path on every device, so a CPU run and a GPU run skip alike);
 * NULL (host path) where dev's backend lacks the GradScaler ops or the
 * tracker (torch's int32) could not count to growth_interval. */
static pl_tensor *fp16_loss_scale_tensor(void *self, pl_device dev) {
    fp16 *p = self;
    if (p->dscale) return p->dscale;
    if (p->growth_interval > INT32_MAX) return NULL;
    const pl_backend *b = pl_backend_get(dev.type);
    if (!b || !pl_backend_supports(b, PL_OP_AMP_UNSCALE_MULTI, false) ||
        !pl_backend_supports(b, PL_OP_AMP_UPDATE_SCALE, false)) {
        pl_error_clear();
        return NULL;
    }
    const int64_t one[1] = {1};
    p->dscale = pl_tensor_zeros_owned(PL_F32, 1, one, dev);
    p->dtracker = pl_tensor_zeros_owned(PL_I32, 1, one, dev);
    p->one = pl_tensor_zeros_owned(PL_F32, 1, one, dev);
    pl_status st = p->dscale && p->dtracker && p->one ? push(p) : pl_error_status();
    if (!st) st = pl_tensor_fill_(p->one, 1.0);
    if (st) {
        pl_error_prefix(st, "fp16: the device loss scale");
        pl_tensor_release(p->dscale);
        pl_tensor_release(p->dtracker);
        pl_tensor_release(p->one);
        p->dscale = p->dtracker = p->one = NULL;
    }
    return p->dscale;
}

/* torch's GradScaler.unscale_ + update on the device: every gradient (f32, on
 * found_inf's device) *= 1 / scale, found_inf set on inf / NaN, then the
 * scale and tracker updated from found_inf (which also carries the trainer's
 * non-finite-loss NaN: that step backs off too, as its gradients would). */
static pl_status fp16_before_step_device(void *self, pl_params *ps, pl_tensor *found_inf) {
    fp16 *p = self;
    if (!p->dscale)
        return pl_error_set(PL_ERR_INTERNAL, "fp16: before_step_device without a device scale");
    int np = pl_params_count(ps), n = 0;
    if (np > p->grads_cap) {
        pl_tensor **g = realloc(p->grads, (size_t)np * sizeof *g);
        if (!g) return pl_error_set(PL_ERR_NOMEM, "fp16: the gradient list (%d)", np);
        p->grads = g;
        p->grads_cap = np;
    }
    for (int i = 0; i < np; i++) {
        pl_tensor *t = pl_params_at(ps, i)->t;
        if (t->requires_grad && t->grad) p->grads[n++] = t->grad;
    }
    pl_frame_begin();
    pl_tensor *inv = pl_div(p->one, p->dscale);
    pl_status st = inv ? pl_amp_unscale_multi_(n, p->grads, found_inf, inv) : pl_error_status();
    pl_frame_end();
    if (!st)
        st = pl_amp_update_scale_(p->dscale, p->dtracker, found_inf, p->growth_factor,
                                  p->backoff_factor, p->growth_interval);
    return st ? pl_error_prefix(st, "fp16: unscaling the gradients on the device") : PL_OK;
}

static pl_status fp16_state(void *self, const pl_state_visitor *v) {
    fp16 *p = self;
    pl_status st = pull(p); /* a save reads the device scaler; a load writes it below */
    const double s0 = p->scale;
    const int64_t t0 = p->tracker;
    double tr = (double)p->tracker;
    if (!st) st = v->scalar(v->ctx, "fp16.v1.scale", &p->scale);
    if (!st) st = v->scalar(v->ctx, "fp16.v1.growth_tracker", &tr);
    if (!st) p->tracker = (int64_t)tr;
    if (!st && (p->scale != s0 || p->tracker != t0)) st = push(p);
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
    .loss_scale_tensor = fp16_loss_scale_tensor,
    .before_step_device = fp16_before_step_device,
};

PL_PLUGIN_DEFINE(fp16, PL_KIND_PRECISION, "1.0.0",
                 "float16 autocast with dynamic loss scaling (GradScaler)", opts, &vt)
