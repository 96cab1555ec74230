/* linreg.c - linear regression, y_hat = x W^T + b, trained on the mean
 * squared error (torch.nn.Linear(F, 1) with torch.nn.MSELoss()).
 *
 * Parameters (nn.Linear's init, U(-1/sqrt(F), 1/sqrt(F)) for both):
 *   linreg.weight  f32 [1, F]
 *   linreg.bias    f32 [1]    tagged no_decay
 * Batch fields read (declared by batch_needs, matched against the loader's
 * batch_fields before anything is built):
 *   x  float [B, F]   (f32, bf16 or f16; computed in f32)
 *   y  float [B, 1]
 * Evaluation metrics: "loss" (MSE) and "mae", averaged over samples.
 * An example of the model contract of <pipeline/plugin.h>. Built only
 * against the installed headers. */
#include <math.h>
#include <stdlib.h>

#include <pipeline/pipeline.h>

typedef struct linreg {
    pl_params *params; /* borrowed from the run context */
    int weight, bias;  /* indices in params: a precision stage may replace the tensors */
} linreg;

static const pl_option_spec lr_options[] = {
    {"in_features", PL_OPT_INT, "0", 0, 1e9, NULL, "input width (0: the loader's num_features)"},
    PL_OPTIONS_END};

/* the params list owns the tensors */
static void lr_destroy(void *self) {
    free(self);
}

static pl_status lr_create(const pl_config_section *cfg, pl_run_context *ctx, void **self) {
    *self = NULL;
    int64_t F = pl_cfg_int(cfg, "in_features", 0);
    if (F == 0 && pl_meta_get_int(ctx->meta, "num_features", &F))
        return pl_error_prefix(pl_error_status(), "linreg: set in_features or use a loader that "
                                                  "publishes num_features");
    linreg *m = calloc(1, sizeof *m);
    if (!m) return pl_error_set(PL_ERR_NOMEM, "linreg: out of memory");
    m->params = ctx->params;
    /* pl_param_new: zero f32 on ctx->device, the list holds the only reference */
    pl_tensor *w = NULL, *b = NULL;
    pl_status st = pl_param_new(ctx, "linreg.weight", PL_SHAPE(1, F), 0, "linear", true, &w);
    if (!st) m->weight = pl_params_count(ctx->params) - 1;
    if (!st)
        st = pl_param_new(ctx, "linreg.bias", PL_SHAPE(1), PL_TAG_NO_DECAY, "linear", true, &b);
    if (!st) m->bias = pl_params_count(ctx->params) - 1;
    const double bound = 1.0 / sqrt((double)F);
    if (!st) st = pl_tensor_uniform_(w, -bound, bound, ctx->seed, 0);
    if (!st) st = pl_tensor_uniform_(b, -bound, bound, ctx->seed, 1);
    if (st) {
        free(m);
        return st;
    }
    *self = m;
    return PL_OK;
}

static pl_status lr_forward(void *self, const pl_batch *batch, pl_data_split split, bool training,
                            pl_tensor **loss_out, pl_metrics *metrics) {
    (void)split;
    linreg *m = self;
    pl_tensor *x = pl_batch_get(batch, "x"), *y = pl_batch_get(batch, "y");
    if (!x || !y) return pl_error_prefix(pl_error_status(), "linreg");
    /* everything created here belongs to the trainer's frame: no releases */
    if (x->dtype != PL_F32) x = pl_tensor_to(x, PL_F32, x->device);
    if (y->dtype != PL_F32) y = pl_tensor_to(y, PL_F32, y->device);
    pl_tensor *w = pl_params_at(m->params, m->weight)->t;
    pl_tensor *b = pl_params_at(m->params, m->bias)->t;
    pl_tensor *pred = pl_linear(x, w, b);   /* [B, 1] */
    pl_tensor *loss = pl_mse_loss(pred, y); /* 0-dim, mean over B */
    if (!loss) return pl_error_prefix(pl_error_status(), "linreg forward");
    *loss_out = loss;
    if (!training && metrics) {
        double n = (double)pred->shape[0];
        pl_metrics_add(metrics, "loss", pl_tensor_item(loss) * n, n);
        pl_tensor *mae = pl_mae_loss(pred, y);
        if (!mae) return pl_error_prefix(pl_error_status(), "linreg mae");
        pl_metrics_add(metrics, "mae", pl_tensor_item(mae) * n, n);
    }
    return PL_OK;
}

/* The fields forward() reads; a pure function of the config (no create). */
static pl_status lr_batch_needs(const pl_config_section *cfg, pl_field_list *out) {
    (void)cfg;
    pl_status st = pl_fields_add(out, "x", PL_DTYPE_FLOAT, 2, false);
    if (!st) st = pl_fields_add(out, "y", PL_DTYPE_FLOAT, 2, false);
    return st;
}

static const pl_model_vtable lr_vtable = {
    .create = lr_create,
    .destroy = lr_destroy,
    .forward = lr_forward,
    .batch_needs = lr_batch_needs,
    /* optional members left NULL: on_load, export_model, predict_needs,
     * outputs_begin/_batch/_end */
};

PL_PLUGIN_DEFINE(linreg, PL_KIND_MODEL, "1.0.0",
                 "linear regression with MSE loss (nn.Linear(F, 1))", lr_options, &lr_vtable)
