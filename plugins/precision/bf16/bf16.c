/* bf16.c - bfloat16 precision, Lightning's two modes by name.
 *
 * mode = bf16-mixed (Lightning precision="bf16-mixed", torch.autocast with
 *   dtype=torch.bfloat16): parameters, gradients and optimizer state stay
 *   f32 (the master weights); pl_matmul / pl_linear / pl_nf4_matmul cast
 *   their operands to bf16 (recorded casts, so the activations saved for
 *   backward are bf16) and accumulate in f32; every other op computes in f32
 *   (losses and reductions are f32).
 * mode = bf16-true (Lightning precision="bf16-true"): as bf16-mixed, and in
 *   addition every frozen floating parameter (requires_grad false, not a
 *   PL_TAG_BUFFER) is STORED in bf16: half the bytes of the frozen weights.
 *   Trainable parameters stay f32 (our optimizers update f32 tensors;
 *   Lightning would update bf16 weights in place, which loses small updates
 *   below bf16's 8-bit mantissa: we keep the f32 master copy instead).
 *   The conversion swaps the storage of the parameter's own tensor header
 *   (pl_param_convert), so a model that kept pointers to its parameters
 *   sees the bf16 weights.
 * Parameters may arrive in any float dtype (a model's bf16 / f16 checkpoint
 * views): setup() converts each to the dtype the mode keeps, one at a time
 * (common/prec_convert.h): bf16-mixed everything f32; bf16-true trainable
 * and buffers f32, frozen weights bf16 (a bf16 view is kept as it is).
 *
 * Nothing else is stored (no state for checkpoints): a bf16 parameter is
 * saved as BF16 and loads back into f32 or bf16 alike.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <pipeline/pipeline.h>
#include "../common/prec_convert.h"
#include "../common/prec_load.h"

typedef struct bf16 {
    bool true_mode;
    int verbose;
    pl_run_context *ctx; /* borrowed from create: setup sets its autocast (plugin.h) */
} bf16;

static const pl_option_spec opts[] = {
    {"mode", PL_OPT_CHOICE, "bf16-mixed", PL_NO_BOUNDS, "bf16-mixed|bf16-true",
     "bf16-mixed: f32 weights + bf16 matmuls; bf16-true: also frozen weights stored in bf16"},
    PL_OPTIONS_END};

static pl_status bf16_create(const pl_config_section *cfg, pl_run_context *ctx, void **self) {
    bf16 *p = calloc(1, sizeof *p);
    if (!p) return pl_error_set(PL_ERR_NOMEM, "bf16: out of memory");
    p->true_mode = !strcmp(pl_cfg_str(cfg, "mode", "bf16-mixed"), "bf16-true");
    p->verbose = ctx ? ctx->verbose : 0;
    p->ctx = ctx;
    *self = p;
    return PL_OK;
}

static void bf16_destroy(void *self) { free(self); }

static pl_status bf16_setup(void *self, pl_params *ps) {
    bf16 *p = self;
    if (p->ctx) p->ctx->autocast = PL_BF16;
    if (!p->true_mode) return pl_prec_convert_params(ps, PL_F32, "bf16-mixed", NULL);
    pl_convert_stats cs = {0};
    pl_status st = pl_prec_convert_params(ps, PL_BF16, "bf16-true", &cs);
    if (st) return st;
    if (p->verbose && cs.converted)
        pl_message("bf16-true: %d parameters converted to the dtype kept (%zu -> %zu bytes)",
                   cs.converted, cs.bytes_before, cs.bytes_after);
    return PL_OK;
}

static double bf16_loss_scale(void *self) {
    (void)self;
    return 1.0;
}

static bool bf16_before_step(void *self, pl_params *ps) {
    (void)self;
    (void)ps;
    return true;
}

static const pl_precision_vtable vt = {
    .create = bf16_create,
    .destroy = bf16_destroy,
    .setup = bf16_setup,
    .loss_scale = bf16_loss_scale,
    .before_step = bf16_before_step,
    .load_param = pl_prec_load_param,
};

PL_PLUGIN_DEFINE(bf16, PL_KIND_PRECISION, "1.0.0",
                 "bfloat16 autocast (bf16-mixed) or bf16-stored frozen weights (bf16-true)", opts,
                 &vt)
