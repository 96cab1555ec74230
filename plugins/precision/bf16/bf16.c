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
 *   The conversion swaps the storage of the parameter's own tensor header,
 *   so a model that kept pointers to its parameters sees the bf16 weights.
 *
 * Nothing else is stored (no state for checkpoints): a bf16 parameter is
 * saved as BF16 and loads back into f32 or bf16 alike.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <pipeline/pipeline.h>
#include "../common/prec_load.h"

typedef struct bf16 {
    bool true_mode;
    int verbose;
    int converted;
    size_t bytes_before, bytes_after;
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
    *self = p;
    return PL_OK;
}

static void bf16_destroy(void *self) { free(self); }

/* Replace t's storage by a bf16 copy of its values (same header). */
static pl_status to_bf16_in_place(pl_tensor *t) {
    char buf[256];
    if (!pl_tensor_is_contiguous(t))
        return pl_error_set(PL_ERR_INVALID, "bf16-true: parameter %s is not contiguous",
                            pl_tensor_describe(t, buf, sizeof buf));
    pl_frame_begin();
    pl_tensor *n = pl_tensor_to(t, PL_BF16, t->device);
    if (n) pl_frame_keep(n);
    pl_frame_end();
    if (!n) return pl_error_prefix(pl_error_status(), "bf16-true: converting %s",
                                   pl_tensor_describe(t, buf, sizeof buf));
    pl_storage *old = t->storage;
    int64_t old_off = t->offset;
    t->storage = n->storage;
    t->offset = 0;
    t->dtype = PL_BF16;
    n->storage = old; /* released with n */
    n->offset = old_off;
    n->dtype = PL_F32;
    pl_tensor_release(n);
    return PL_OK;
}

static pl_status bf16_setup(void *self, pl_params *ps) {
    bf16 *p = self;
    pl_autocast_set(PL_BF16);
    if (!p->true_mode) return PL_OK;
    for (int i = 0; i < pl_params_count(ps); i++) {
        pl_param *pp = pl_params_at(ps, i);
        pl_tensor *t = pp->t;
        if (t->requires_grad || (pp->tags & PL_TAG_BUFFER) || t->dtype != PL_F32) continue;
        size_t before = pl_tensor_nbytes(t);
        pl_status st = to_bf16_in_place(t);
        if (st) return st;
        p->converted++;
        p->bytes_before += before;
        p->bytes_after += pl_tensor_nbytes(t);
    }
    if (p->verbose && p->converted)
        fprintf(stderr, "bf16-true: %d frozen parameters stored in bf16 (%zu -> %zu bytes)\n",
                p->converted, p->bytes_before, p->bytes_after);
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
