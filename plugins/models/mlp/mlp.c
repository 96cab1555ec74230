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
#define MLP_MAX_UNSCALE 1024 /* outputs with their own target statistics (predict) */

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
    /* `pipeline predict`: rows seen, and output o in original units
     * = v * scale[o % n_scale] + shift[...] (the loader's target_mean_k /
     * target_std_k: series standardization; identity without them) */
    int64_t pred_rows, n_out;
    int n_scale;
    double shift[MLP_MAX_UNSCALE], scale[MLP_MAX_UNSCALE];
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
    m->n_out = out;
    if (m->loss != LOSS_CE) { /* the loader's target statistics, when it standardized them */
        int64_t nt = 1;
        if (pl_meta_get_int(ctx->meta, "num_targets", &nt) != PL_OK || nt < 1) nt = 1;
        m->n_scale = nt < MLP_MAX_UNSCALE ? (int)nt : MLP_MAX_UNSCALE;
        for (int k = 0; k < m->n_scale; k++) {
            char key[64];
            double v;
            snprintf(key, sizeof key, "target_mean_%d", k);
            m->shift[k] = pl_meta_get_float(ctx->meta, key, &v) == PL_OK ? v : 0.0;
            snprintf(key, sizeof key, "target_std_%d", k);
            m->scale[k] = pl_meta_get_float(ctx->meta, key, &v) == PL_OK ? v : 1.0;
        }
        pl_error_clear();
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

/* The network on inputs h [B, ...] (flattened to [B, F]) -> [B, out_features]. */
static pl_tensor *mlp_net(mlp *m, pl_tensor *h, bool training) {
    if (h && h->dtype != PL_F32) h = pl_tensor_to(h, PL_F32, h->device);
    if (h && h->ndim > 2) h = pl_reshape(h, PL_SHAPE(h->shape[0], -1));
    for (int i = 0; i < m->n_layers; i++) {
        h = pl_linear(h, m->w[i], m->b[i]);
        if (i == m->n_layers - 1) break;
        h = m->act == ACT_GELU ? pl_gelu(h, false) : m->act == ACT_TANH ? pl_tanh(h) : pl_relu(h);
        if (m->dropout > 0)
            h = pl_dropout(h, m->dropout, m->ctx->seed, 1000 + (uint64_t)m->ctx->micro_step * 64 + i,
                           training);
    }
    return h;
}

static pl_status mlp_forward(void *self, const pl_batch *b, pl_data_split split, bool training,
                             pl_tensor **loss_out, pl_metrics *metrics) {
    mlp *m = self;
    pl_tensor *h = pl_batch_get(b, m->input_field);
    pl_tensor *y = pl_batch_get(b, m->target_field);
    if (!h || !y) return pl_error_prefix(pl_error_status(), "mlp");
    h = mlp_net(m, h, training);
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

/* ---- pipeline predict ----------------------------------------------------------------
 * OUT.h5 (docs/run-files.md), one row per input row of the split (with
 * mask_field: per row its mask selects), in order:
 *   output f32 [N, out_features]  the network's output; regression: in the
 *                                 target's original units (the loader's
 *                                 target_mean_k / target_std_k, when it
 *                                 standardized; else as served)
 *   probs  f32 [N, C], pred i64 [N]  loss = cross_entropy: softmax and argmax
 *                                 of the output (first maximum, as accuracy)
 *   target f32 [N, out_features] (regression) / i64 [N] (classes), when present
 *   row    i64 [N]                the row's index in the split */

static pl_status mlp_predict_needs(const pl_config_section *cfg, pl_field_list *out) {
    bool ce = !strcmp(pl_cfg_str(cfg, "loss", "mse"), "cross_entropy");
    pl_status st =
        pl_fields_add(out, pl_cfg_str(cfg, "input_field", "x"), PL_DTYPE_FLOAT, -1, false);
    if (!st)
        st = pl_fields_add(out, pl_cfg_str(cfg, "target_field", "y"),
                           ce ? PL_DTYPE_INDEX : PL_DTYPE_FLOAT, -1, true);
    const char *mask = pl_cfg_str(cfg, "mask_field", "");
    if (!st && mask[0]) st = pl_fields_add(out, mask, PL_U8, 1, true);
    return st;
}

static pl_status mlp_outputs_begin(void *self, pl_outputs_purpose purpose, pl_outputs *out) {
    (void)out;
    mlp *m = self;
    if (purpose != PL_OUTPUTS_PREDICT)
        return pl_error_set(PL_ERR_UNSUPPORTED, "mlp: no outputs but predict's");
    m->pred_rows = 0;
    return PL_OK;
}

static pl_status mlp_outputs_batch(void *self, pl_outputs_purpose purpose, const pl_batch *b,
                                   pl_data_split split, pl_outputs *outs) {
    (void)split;
    (void)purpose;
    char d1[256];
    mlp *m = self;
    pl_tensor *x = pl_batch_get(b, m->input_field);
    if (!x) return pl_error_prefix(pl_error_status(), "mlp");
    pl_tensor *y = pl_batch_find(b, m->target_field), *mask = pl_batch_find(b, m->mask_field);
    int64_t B = x->ndim >= 1 ? x->shape[0] : 0, O = m->n_out;
    bool ce = m->loss == LOSS_CE;
    if (y && (y->ndim < 1 || y->shape[0] != B ||
              (ce ? pl_tensor_numel(y) != B : pl_tensor_numel(y) != B * O)))
        return pl_error_set(PL_ERR_SHAPE, "mlp: target '%s' %s: expected %lld rows of %lld",
                            m->target_field, pl_tensor_describe(y, d1, sizeof d1), (long long)B,
                            (long long)(ce ? 1 : O));
    if (mask && (mask->ndim != 1 || mask->shape[0] != B))
        return pl_error_set(PL_ERR_SHAPE, "mlp: mask '%s' %s: expected [%lld]", m->mask_field,
                            pl_tensor_describe(mask, d1, sizeof d1), (long long)B);
    pl_tensor *h = pl_contiguous(pl_tensor_to(mlp_net(m, x, false), PL_F32, PL_CPU));
    pl_tensor *hm = mask ? pl_tensor_to(mask, PL_U8, PL_CPU) : NULL;
    pl_tensor *hy = !y ? NULL : pl_contiguous(pl_tensor_to(y, ce ? PL_I64 : PL_F32, PL_CPU));
    if (!h || (mask && !hm) || (y && !hy)) return pl_error_prefix(pl_error_status(), "mlp predict");
    if (h->ndim != 2 || h->shape[0] != B || h->shape[1] != O)
        return pl_error_set(PL_ERR_SHAPE, "mlp: output %s, expected [%lld, %lld]",
                            pl_tensor_describe(h, d1, sizeof d1), (long long)B, (long long)O);
    const uint8_t *mv = hm ? pl_tensor_data(hm) : NULL;
    int64_t n = 0;
    for (int64_t i = 0; i < B; i++)
        n += !mv || mv[i];
    pl_tensor *out = pl_tensor_empty(PL_F32, 2, (int64_t[]){n, O}, PL_CPU);
    pl_tensor *row = pl_tensor_empty(PL_I64, 1, (int64_t[]){n}, PL_CPU);
    pl_tensor *probs = ce ? pl_tensor_empty(PL_F32, 2, (int64_t[]){n, O}, PL_CPU) : NULL;
    pl_tensor *pred = ce ? pl_tensor_empty(PL_I64, 1, (int64_t[]){n}, PL_CPU) : NULL;
    pl_tensor *tg = !hy  ? NULL
                    : ce ? pl_tensor_empty(PL_I64, 1, (int64_t[]){n}, PL_CPU)
                         : pl_tensor_empty(PL_F32, 2, (int64_t[]){n, O}, PL_CPU);
    if (!out || !row || (ce && (!probs || !pred)) || (hy && !tg)) return pl_error_status();
    const float *hv = pl_tensor_f32(h);
    float *ov = pl_tensor_data(out);
    int64_t *rv = pl_tensor_data(row);
    for (int64_t i = 0, r = 0; i < B; i++) {
        if (mv && !mv[i]) continue;
        const float *l = hv + i * O;
        rv[r] = m->pred_rows + i;
        for (int64_t o = 0; o < O; o++) {
            int k = m->n_scale > 0 ? (int)(o % m->n_scale) : 0;
            ov[r * O + o] = ce || !m->n_scale ? l[o] : (float)(l[o] * m->scale[k] + m->shift[k]);
            if (tg && !ce) {
                double t = pl_tensor_f32(hy)[i * O + o];
                ((float *)pl_tensor_data(tg))[r * O + o] =
                    (float)(m->n_scale ? t * m->scale[k] + m->shift[k] : t);
            }
        }
        if (ce) {
            int64_t best = 0;
            for (int64_t j = 1; j < O; j++)
                if (l[j] > l[best]) best = j;
            double z = 0;
            for (int64_t j = 0; j < O; j++)
                z += exp((double)l[j] - l[best]);
            float *pv = (float *)pl_tensor_data(probs) + r * O;
            for (int64_t j = 0; j < O; j++)
                pv[j] = (float)(exp((double)l[j] - l[best]) / z);
            ((int64_t *)pl_tensor_data(pred))[r] = best;
            if (tg) ((int64_t *)pl_tensor_data(tg))[r] = ((const int64_t *)pl_tensor_data(hy))[i];
        }
        r++;
    }
    m->pred_rows += B;
    pl_status st = pl_outputs_add(outs, "output", out);
    if (!st && ce) st = pl_outputs_add(outs, "probs", probs);
    if (!st && ce) st = pl_outputs_add(outs, "pred", pred);
    if (!st && tg) st = pl_outputs_add(outs, "target", tg);
    if (!st) st = pl_outputs_add(outs, "row", row);
    return st;
}

static const pl_model_vtable mlp_vtable = {
    .create = mlp_create,
    .destroy = mlp_destroy,
    .forward = mlp_forward,
    .batch_needs = mlp_batch_needs,
    .predict_needs = mlp_predict_needs,
    .outputs_begin = mlp_outputs_begin,
    .outputs_batch = mlp_outputs_batch,
};

PL_PLUGIN_DEFINE(mlp, PL_KIND_MODEL, "1.0.0",
                 "multi-layer perceptron (nn.Linear stack) for regression or classification",
                 mlp_options, &mlp_vtable)
