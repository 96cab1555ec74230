/* pretrained_model.c - a test-only model plugin with a pretrained backbone,
 * for tests/core/test_trainer.c (PL_TAG_PRETRAINED and lean loading). Built
 * into the build tree's test_plugins/ folder, never the plugin dir.
 *
 *   y = relu(x W^T) h^T + b,  loss = mse(y, target)
 * W "backbone.weight" [16, 5] is read at create from the safetensors file
 * `source` as a zero-copy view in the file's dtype (pl_st_view), tagged
 * PL_TAG_PRETRAINED | PL_TAG_BASE, frozen unless `train_backbone`; the head
 * h [1, 16] and b [1] are trainable, initialized from ctx->seed. Batch
 * fields: x f32 [B, 5], y f32 [B, 1] (the test_stateless_loader's). */
#include <math.h>
#include <stdlib.h>

#include "pipeline/pipeline.h"

#define NF 5
#define NH 16

typedef struct pm {
    pl_params *params;
    int iw, ih, ib; /* parameter indices: re-read at every forward */
} pm;

static const pl_option_spec opts[] = {
    {"source", PL_OPT_STRING, NULL, PL_NO_BOUNDS, NULL,
     "safetensors file holding backbone.weight [16, 5] (the pretrained source)"},
    {"train_backbone", PL_OPT_BOOL, "false", PL_NO_BOUNDS, NULL, "backbone trainable"},
    PL_OPTIONS_END};

static pl_status pm_create(const pl_config_section *cfg, pl_run_context *ctx, void **self) {
    const char *src = pl_cfg_str(cfg, "source", "");
    pl_st_file *f = NULL;
    pl_status st = pl_st_open(src, &f);
    if (st) return st;
    pl_tensor *w = pl_st_view(f, "backbone.weight");
    pl_st_close(f); /* the view keeps the mapping */
    if (!w) return pl_error_status();
    if (w->ndim != 2 || w->shape[0] != NH || w->shape[1] != NF) {
        pl_tensor_release(w);
        return pl_error_set(PL_ERR_SHAPE, "%s: backbone.weight must be [%d, %d]", src, NH, NF);
    }
    pl_tensor_set_requires_grad(w, pl_cfg_bool(cfg, "train_backbone", false));
    st = pl_params_add(ctx->params, "backbone.weight", w, PL_TAG_PRETRAINED | PL_TAG_BASE, NULL);
    pl_tensor_release(w);
    if (st) return st;
    pm *m = calloc(1, sizeof *m);
    if (!m) return pl_error_set(PL_ERR_NOMEM, "pretrained_model: out of memory");
    m->params = ctx->params;
    m->iw = pl_params_count(ctx->params) - 1;
    pl_tensor *h = NULL, *b = NULL;
    st = pl_param_new(ctx, "head.weight", PL_SHAPE(1, NH), 0, "head", true, &h);
    if (!st) st = pl_tensor_uniform_(h, -0.25, 0.25, ctx->seed, 1);
    if (!st) st = pl_param_new(ctx, "head.bias", PL_SHAPE(1), PL_TAG_NO_DECAY, "head", true, &b);
    if (st) {
        free(m);
        return st;
    }
    m->ih = m->iw + 1;
    m->ib = m->iw + 2;
    *self = m;
    return PL_OK;
}

static void pm_destroy(void *self) { free(self); }

static pl_status pm_forward(void *self, const pl_batch *b, pl_data_split split, bool training,
                            pl_tensor **loss_out, pl_metrics *metrics) {
    (void)split;
    pm *m = self;
    pl_tensor *x = pl_batch_get(b, "x"), *y = pl_batch_get(b, "y");
    if (!x || !y) return pl_error_prefix(pl_error_status(), "pretrained_model");
    pl_tensor *h = pl_relu(pl_linear(x, pl_params_at(m->params, m->iw)->t, NULL));
    h = pl_linear(h, pl_params_at(m->params, m->ih)->t, pl_params_at(m->params, m->ib)->t);
    pl_tensor *loss = pl_mse_loss(h, y);
    if (!loss) return pl_error_prefix(pl_error_status(), "pretrained_model forward");
    *loss_out = loss;
    if (!training && metrics) {
        double n = (double)x->shape[0];
        pl_metrics_add(metrics, "loss", pl_tensor_item(loss) * n, n);
    }
    return PL_OK;
}

static pl_status pm_needs(const pl_config_section *cfg, pl_field_list *out) {
    (void)cfg;
    pl_status st = pl_fields_add(out, "x", PL_F32, 2, false);
    return st ? st : pl_fields_add(out, "y", PL_F32, 2, false);
}

static const pl_model_vtable vt = {
    .create = pm_create, .destroy = pm_destroy, .forward = pm_forward, .batch_needs = pm_needs};

PL_PLUGIN_DEFINE(test_pretrained_model, PL_KIND_MODEL, "0.0.1",
                 "test-only: frozen pretrained backbone read as a checkpoint view, trainable head",
                 opts, &vt)
