/* mlp - a multi-layer perceptron for regression or classification.
 *
 * y = W_L act(... act(W_1 x + b_1) ...) + b_L, nn.Linear init
 * (kaiming-uniform weights, U(-1/sqrt(in), 1/sqrt(in)) biases, as PyTorch).
 * The small reference model used by the trainer's tests and quick baselines. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pipeline/pipeline.h"

#define MLP_MAX_LAYERS 16

typedef enum { ACT_RELU, ACT_GELU, ACT_TANH } act_kind;
typedef enum { LOSS_MSE, LOSS_MAE, LOSS_HUBER, LOSS_CE } loss_kind;

typedef struct mlp {
    int n_layers;
    pl_tensor *w[MLP_MAX_LAYERS], *b[MLP_MAX_LAYERS];
    act_kind act;
    loss_kind loss;
    double dropout, huber_delta;
    const char *input_field, *target_field, *mask_field;
    pl_run_context *ctx;
} mlp;

static const pl_option_spec mlp_options[] = {
    {"in_features", PL_OPT_INT, "0", 0, 1e9, NULL,
     "input width (0: the loader's `num_features`)"},
    {"out_features", PL_OPT_INT, "0", 0, 1e9, NULL,
     "output width (0: `num_classes` for cross_entropy, else `num_targets` or 1)"},
    {"hidden", PL_OPT_INT, "64", 1, 1e7, NULL, "width of each hidden layer"},
    {"layers", PL_OPT_INT, "2", 1, MLP_MAX_LAYERS, NULL, "number of linear layers"},
    {"activation", PL_OPT_CHOICE, "relu", PL_NO_BOUNDS, "relu|gelu|tanh", "hidden activation"},
    {"dropout", PL_OPT_FLOAT, "0", 0, 0.99, NULL, "dropout after each hidden activation"},
    {"loss", PL_OPT_CHOICE, "mse", PL_NO_BOUNDS, "mse|mae|huber|cross_entropy", "training loss"},
    {"huber_delta", PL_OPT_FLOAT, "1.0", 0, 1e9, NULL, "delta of the huber loss"},
    {"input_field", PL_OPT_STRING, "x", PL_NO_BOUNDS, NULL, "batch field with inputs [B, F]"},
    {"target_field", PL_OPT_STRING, "y", PL_NO_BOUNDS, NULL,
     "batch field with targets ([B, K] f32, or [B] i64 classes)"},
    {"mask_field", PL_OPT_STRING, "", PL_NO_BOUNDS, NULL,
     "optional u8 [B] field selecting the rows that count (node masks)"},
    PL_OPTIONS_END};

static void mlp_destroy(void *self) {
    mlp *m = self;
    if (!m) return;
    for (int i = 0; i < m->n_layers; i++) {
        pl_tensor_release(m->w[i]);
        pl_tensor_release(m->b[i]);
    }
    free(m);
}

static pl_status mlp_create(const pl_config_section *cfg, pl_run_context *ctx, void **self) {
    mlp *m = calloc(1, sizeof *m);
    if (!m) return pl_error_set(PL_ERR_NOMEM, "mlp: out of memory");
    m->ctx = ctx;
    m->n_layers = (int)pl_cfg_int(cfg, "layers", 2);
    const char *act = pl_cfg_str(cfg, "activation", "relu");
    m->act = !strcmp(act, "gelu") ? ACT_GELU : !strcmp(act, "tanh") ? ACT_TANH : ACT_RELU;
    const char *loss = pl_cfg_str(cfg, "loss", "mse");
    m->loss = !strcmp(loss, "mae")     ? LOSS_MAE
              : !strcmp(loss, "huber") ? LOSS_HUBER
              : !strcmp(loss, "cross_entropy") ? LOSS_CE
                                               : LOSS_MSE;
    m->dropout = pl_cfg_float(cfg, "dropout", 0);
    m->huber_delta = pl_cfg_float(cfg, "huber_delta", 1.0);
    m->input_field = pl_cfg_str(cfg, "input_field", "x");
    m->target_field = pl_cfg_str(cfg, "target_field", "y");
    m->mask_field = pl_cfg_str(cfg, "mask_field", "");
    int64_t in = pl_cfg_int(cfg, "in_features", 0), out = pl_cfg_int(cfg, "out_features", 0);
    pl_status st = PL_OK;
    if (!in) st = pl_meta_get_int(ctx->meta, "num_features", &in);
    if (!st && !out) {
        if (m->loss == LOSS_CE)
            st = pl_meta_get_int(ctx->meta, "num_classes", &out);
        else if (pl_meta_get_int(ctx->meta, "num_targets", &out) != PL_OK) {
            pl_error_clear();
            out = 1;
        }
    }
    if (st) {
        mlp_destroy(m);
        return pl_error_prefix(st, "mlp: set in_features/out_features or use a loader that "
                               "publishes them");
    }
    int64_t hidden = pl_cfg_int(cfg, "hidden", 64);
    for (int i = 0; i < m->n_layers && !st; i++) {
        int64_t fi = i == 0 ? in : hidden, fo = i == m->n_layers - 1 ? out : hidden;
        double bound = 1.0 / sqrt((double)fi); /* nn.Linear: kaiming_uniform(a=sqrt(5)) */
        m->w[i] = pl_tensor_empty(PL_F32, PL_SHAPE(fo, fi), ctx->device);
        m->b[i] = pl_tensor_empty(PL_F32, PL_SHAPE(fo), ctx->device);
        if (!m->w[i] || !m->b[i]) {
            st = pl_error_status();
            break;
        }
        st = pl_tensor_uniform_(m->w[i], -bound, bound, ctx->seed, 2 * (uint64_t)i);
        if (!st) st = pl_tensor_uniform_(m->b[i], -bound, bound, ctx->seed, 2 * (uint64_t)i + 1);
        pl_tensor_set_requires_grad(m->w[i], true);
        pl_tensor_set_requires_grad(m->b[i], true);
        char name[64];
        snprintf(name, sizeof name, "mlp.%d.weight", i);
        if (!st) st = pl_params_add(ctx->params, name, m->w[i], 0, NULL);
        snprintf(name, sizeof name, "mlp.%d.bias", i);
        if (!st) st = pl_params_add(ctx->params, name, m->b[i], PL_TAG_NO_DECAY, NULL);
    }
    if (st) {
        mlp_destroy(m);
        return st;
    }
    *self = m;
    return PL_OK;
}

/* Rows selected by the mask field (u8 [B]) as an i64 index, or NULL (all rows). */
static pl_tensor *mask_index(const pl_batch *b, const char *field, pl_device dev) {
    if (!field[0]) return NULL;
    pl_tensor *mask = pl_batch_get(b, field);
    if (!mask) return NULL;
    pl_tensor *mc = pl_tensor_to(mask, PL_U8, PL_CPU);
    int64_t n = pl_tensor_numel(mc), k = 0;
    const uint8_t *mv = pl_tensor_data(mc);
    for (int64_t i = 0; i < n; i++) k += mv[i] != 0;
    pl_tensor *idx = pl_tensor_empty(PL_I64, PL_SHAPE(k), PL_CPU);
    int64_t *iv = pl_tensor_data(idx);
    for (int64_t i = 0, j = 0; i < n; i++)
        if (mv[i]) iv[j++] = i;
    return dev.type == PL_DEVICE_CPU ? idx : pl_tensor_to(idx, PL_I64, dev);
}

static pl_status mlp_forward(void *self, const pl_batch *b, pl_data_split split, bool training,
                             pl_tensor **loss_out, pl_metrics *metrics) {
    mlp *m = self;
    pl_tensor *h = pl_batch_get(b, m->input_field);
    pl_tensor *y = pl_batch_get(b, m->target_field);
    if (!h || !y) return pl_error_prefix(pl_error_status(), "mlp");
    if (h->dtype != PL_F32) h = pl_tensor_to(h, PL_F32, h->device);
    if (h && h->ndim > 2) h = pl_reshape(h, PL_SHAPE(h->shape[0], -1));
    for (int i = 0; i < m->n_layers; i++) {
        h = pl_linear(h, m->w[i], m->b[i]);
        if (i == m->n_layers - 1) break;
        h = m->act == ACT_GELU ? pl_gelu(h, false) : m->act == ACT_TANH ? pl_tanh(h) : pl_relu(h);
        if (m->dropout > 0)
            h = pl_dropout(h, m->dropout, m->ctx->seed, 1000 + (uint64_t)m->ctx->micro_step * 64 + i,
                           training);
    }
    pl_tensor *idx = mask_index(b, m->mask_field, h ? h->device : PL_CPU);
    if (idx) {
        h = pl_index_select(h, 0, idx);
        y = pl_index_select(y, 0, idx);
    }
    pl_tensor *loss = NULL;
    if (m->loss == LOSS_CE) {
        if (y && y->ndim == 2 && y->shape[1] == 1) y = pl_reshape(y, PL_SHAPE(y->shape[0]));
        loss = pl_cross_entropy(h, y, -100, 0.0);
    } else {
        if (y && y->dtype != PL_F32) y = pl_tensor_to(y, PL_F32, y->device);
        if (y && h && y->ndim == 1) y = pl_reshape(y, PL_SHAPE(y->shape[0], 1));
        if (y && y->ndim > 2) y = pl_reshape(y, PL_SHAPE(y->shape[0], -1));
        loss = m->loss == LOSS_MAE     ? pl_mae_loss(h, y)
               : m->loss == LOSS_HUBER ? pl_huber_loss(h, y, m->huber_delta)
                                       : pl_mse_loss(h, y);
    }
    if (!loss) return pl_error_prefix(pl_error_status(), "mlp forward");
    *loss_out = loss;
    if (!training && metrics) {
        int64_t n = h->shape[0];
        pl_metrics_add(metrics, "loss", pl_tensor_item(loss) * (double)n, (double)n);
        if (m->loss == LOSS_CE) {
            pl_tensor *hc = pl_tensor_to(h, PL_F32, PL_CPU), *yc = pl_tensor_to(y, PL_I64, PL_CPU);
            const float *hv = pl_tensor_data(hc);
            const int64_t *yv = pl_tensor_data(yc);
            int64_t c = hc->shape[1], correct = 0;
            for (int64_t i = 0; i < n; i++) {
                int64_t best = 0;
                for (int64_t j = 1; j < c; j++)
                    if (hv[i * c + j] > hv[i * c + best]) best = j;
                correct += best == yv[i];
            }
            pl_metrics_add(metrics, "accuracy", (double)correct, (double)n);
        } else {
            pl_tensor *mae = pl_mae_loss(h, y);
            pl_metrics_add(metrics, "mae", pl_tensor_item(mae) * (double)n, (double)n);
        }
    }
    return PL_OK;
}

/* Inputs [B, F], targets ([B, K] floats or [B] class indices), and the
 * row mask when mask_field is set. */
static pl_status mlp_batch_needs(const pl_config_section *cfg, pl_field_list *out) {
    bool ce = !strcmp(pl_cfg_str(cfg, "loss", "mse"), "cross_entropy");
    pl_status st = pl_fields_add(out, pl_cfg_str(cfg, "input_field", "x"), PL_DTYPE_FLOAT, 2, false);
    if (!st) st = pl_fields_add(out, pl_cfg_str(cfg, "target_field", "y"),
                                ce ? PL_DTYPE_INDEX : PL_DTYPE_FLOAT, ce ? 1 : -1, false);
    const char *mask = pl_cfg_str(cfg, "mask_field", "");
    if (!st && mask[0]) st = pl_fields_add(out, mask, PL_U8, 1, false);
    return st;
}

static const pl_model_vtable mlp_vtable = {
    .create = mlp_create,
    .destroy = mlp_destroy,
    .forward = mlp_forward,
    .batch_needs = mlp_batch_needs,
};

PL_PLUGIN_DEFINE(mlp, PL_KIND_MODEL, "1.0.0",
                 "multi-layer perceptron (nn.Linear stack) for regression or classification",
                 mlp_options, &mlp_vtable)
