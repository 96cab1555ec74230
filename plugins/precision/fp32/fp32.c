/* fp32.c - default precision: every parameter, activation and gradient in
 * f32; matmuls through OpenBLAS sgemm. Matches Lightning precision="32-true".
 *
 * setup() converts every floating parameter that arrives in another dtype
 * (a model's bf16 / f16 checkpoint views) to f32 (common/prec_convert.h).
 *
 * allow_tf32 is accepted for configs shared with GPU runs: on a CUDA backend
 * it lets cuBLAS use TF32 tensor cores for f32 matmuls
 * (torch.backends.cuda.matmul.allow_tf32); on the CPU it has no effect.
 */
#include <stdlib.h>

#include <pipeline/pipeline.h>
#include "../common/prec_convert.h"
#include "../common/prec_load.h"

typedef struct fp32 {
    bool allow_tf32;
    pl_run_context *ctx; /* borrowed from create: setup sets its autocast (plugin.h) */
} fp32;

static const pl_option_spec opts[] = {
    {"allow_tf32", PL_OPT_BOOL, "false", PL_NO_BOUNDS, NULL,
     "GPU only: let f32 matmuls use TF32 tensor cores; no effect on CPU"},
    PL_OPTIONS_END};

static pl_status fp32_create(const pl_config_section *cfg, pl_run_context *ctx, void **self) {
    fp32 *p = calloc(1, sizeof *p);
    if (!p) return pl_error_set(PL_ERR_NOMEM, "fp32: out of memory");
    p->ctx = ctx;
    p->allow_tf32 = pl_cfg_bool(cfg, "allow_tf32", false);
    *self = p;
    return PL_OK;
}

static void fp32_destroy(void *self) { free(self); }

static pl_status fp32_setup(void *self, pl_params *ps) {
    fp32 *p = self;
    if (p->ctx) p->ctx->autocast = PL_F32;
    return pl_prec_convert_params(ps, PL_F32, "fp32", NULL);
}

static double fp32_loss_scale(void *self) {
    (void)self;
    return 1.0;
}

static bool fp32_before_step(void *self, pl_params *ps) {
    (void)self;
    (void)ps;
    return true;
}

static const pl_precision_vtable vt = {
    .create = fp32_create,
    .destroy = fp32_destroy,
    .setup = fp32_setup,
    .loss_scale = fp32_loss_scale,
    .before_step = fp32_before_step,
    .load_param = pl_prec_load_param,
};

PL_PLUGIN_DEFINE(fp32, PL_KIND_PRECISION, "1.0.0", "f32 everything (default precision)", opts, &vt)
