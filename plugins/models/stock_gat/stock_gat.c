/* stock_gat - cross-sectional stock ranking: a per-stock LSTM encoder over a
 * window of features, a GAT over the day's stock graph, a head predicting
 * each stock's next-day (normalized) return.
 *
 *   x [n, W, F] -> RevIN (optional; Kim et al. 2022)
 *               -> LSTM (torch.nn.LSTM, encoder_layers) -> h = last step [n, H]
 *   graph:  z = h + Linear(GAT(h))   GAT = gat_layers x (dropout -> GATConv
 *                                    (heads x gat_hidden, concat) -> ELU),
 *                                    the gat plugin's layer (gat_layers.c)
 *   else:   z = h
 *   pred = head(dropout(z)) [n]      Linear(H, 1) | Linear(H, hh) -> ELU -> dropout -> Linear(hh,
 * 1) revin:  pred = (pred - b_c) / (w_c + eps^2) * sd_c + mu_c   (c = revin_channel)
 *
 * Loss: mse(pred, y) + rank_loss_weight * mean over days (1 - Pearson(pred_d,
 * rank(y_d))), the ranks constant (average ranks, centered and scaled to unit
 * norm on the host). Evaluation: the daily Spearman IC statistics and the
 * long/short Sharpe ratio (stock_metrics.c) of the prediction and of every
 * factor the loader serves. README.md has the sources and definitions.
 *
 * Nodes are grouped into days by the batch's `batch` vector (day index of
 * every node), so nothing here depends on the node order within a batch.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stock_gat.h"

/* dropout counters of this file: bit 62 set (gat_stack draws micro_step * 32
 * + slot, far below), 16 slots per micro step */
#define SG_DROP_HEAD_IN 14
#define SG_DROP_HEAD_HIDDEN 15

static uint64_t drop_counter(const sg_model *m, int slot) {
    return ((uint64_t)1 << 62) | ((uint64_t)m->ctx->micro_step * 16 + (uint64_t)slot);
}

static pl_tensor *P(const sg_model *m, int idx) {
    return idx < 0 ? NULL : pl_params_at(m->ctx->params, idx)->t;
}

/* ---- parameters ----------------------------------------------------------- */

/* init streams of this file start here (gat_model_new uses 0 .. 16 * 17) */
#define SG_STREAM0 1024

static pl_status add(sg_model *m, const char *name, int ndim, const int64_t *shape, double bound,
                     uint64_t *stream, unsigned tags, const char *role, int *idx) {
    return gat_add_param(m->ctx, "stock_gat", name, ndim, shape, bound, (*stream)++, tags, role,
                         idx);
}

static pl_status create_params(sg_model *m) {
    const sg_opts *o = &m->o;
    uint64_t stream = SG_STREAM0;
    char name[PL_NAME_MAX];
    pl_status st = PL_OK;
    int64_t F = o->features, H = o->hidden;
    if (o->revin) { /* RevIN affine: weight 1, bias 0 (ts-kim/RevIN) */
        st = add(m, "revin.affine_weight", 1, &F, 0, &stream, PL_TAG_NO_DECAY, NULL, &m->revin_w);
        if (!st) st = pl_tensor_fill_(P(m, m->revin_w), 1.0);
        if (!st)
            st = add(m, "revin.affine_bias", 1, &F, 0, &stream, PL_TAG_NO_DECAY, NULL, &m->revin_b);
    }
    /* torch.nn.LSTM init: U(-1/sqrt(H), 1/sqrt(H)) for every weight and bias */
    double k = 1.0 / sqrt((double)H);
    for (int l = 0; l < o->encoder_layers && !st; l++) {
        int64_t in = l == 0 ? F : H;
        snprintf(name, sizeof name, "encoder.weight_ih_l%d", l);
        st = add(m, name, 2, (int64_t[]){4 * H, in}, k, &stream, 0, NULL, &m->w_ih[l]);
        snprintf(name, sizeof name, "encoder.weight_hh_l%d", l);
        if (!st) st = add(m, name, 2, (int64_t[]){4 * H, H}, k, &stream, 0, NULL, &m->w_hh[l]);
        snprintf(name, sizeof name, "encoder.bias_ih_l%d", l);
        if (!st)
            st =
                add(m, name, 1, (int64_t[]){4 * H}, k, &stream, PL_TAG_NO_DECAY, NULL, &m->b_ih[l]);
        snprintf(name, sizeof name, "encoder.bias_hh_l%d", l);
        if (!st)
            st =
                add(m, name, 1, (int64_t[]){4 * H}, k, &stream, PL_TAG_NO_DECAY, NULL, &m->b_hh[l]);
    }
    if (!st && o->graph) {
        /* the GAT part: hidden layers only (GAT_ENCODER), the loader's graph as given */
        gat_opts g = {.layers = o->gat_layers,
                      .hidden = o->gat_hidden,
                      .heads = o->heads,
                      .output_heads = o->heads,
                      .dropout = o->dropout,
                      .attn_dropout = o->attn_dropout,
                      .negative_slope = 0.2,
                      .concat = true,
                      .residual = false,
                      .add_self_loops = false,
                      .bias = true,
                      .in_features = H,
                      .num_classes = 1,
                      .task = GAT_ENCODER};
        st = gat_model_new(&g, m->ctx, &m->gat);
        /* torch.nn.Linear init: U(-1/sqrt(in), 1/sqrt(in)) */
        int64_t D = (int64_t)o->heads * o->gat_hidden;
        double kp = 1.0 / sqrt((double)D);
        if (!st)
            st = add(m, "gat_proj.weight", 2, (int64_t[]){H, D}, kp, &stream, 0, NULL, &m->proj_w);
        if (!st)
            st = add(m, "gat_proj.bias", 1, &H, kp, &stream, PL_TAG_NO_DECAY, NULL, &m->proj_b);
    }
    int n_lin = o->head_hidden > 0 ? 2 : 1;
    int64_t in = H;
    for (int i = 0; i < n_lin && !st; i++) {
        int64_t out = i == n_lin - 1 ? 1 : o->head_hidden;
        double kh = 1.0 / sqrt((double)in);
        snprintf(name, sizeof name, "head.%d.weight", i);
        st = add(m, name, 2, (int64_t[]){out, in}, kh, &stream, 0, "head", &m->head_w[i]);
        snprintf(name, sizeof name, "head.%d.bias", i);
        if (!st) st = add(m, name, 1, &out, kh, &stream, PL_TAG_NO_DECAY, "head", &m->head_b[i]);
        in = out;
    }
    return st;
}

static void sg_model_free(sg_model *m) {
    if (!m) return;
    gat_model_free(m->gat);
    free(m);
}

/* ---- forward -------------------------------------------------------------------- */

pl_tensor *sg_predict(sg_model *m, pl_tensor *x, pl_tensor *src, pl_tensor *dst, bool training) {
    if (!x) return NULL;
    const sg_opts *o = &m->o;
    int64_t n = x->shape[0], W = x->shape[1];
    pl_tensor *xf = x->dtype == PL_F32 ? x : pl_tensor_to(x, PL_F32, x->device);
    /* RevIN normalization (ts-kim/RevIN RevIN.forward(x, 'norm')): mean and
     * sqrt(biased var + eps) over the W steps of every node and feature,
     * detached (computed without a tape), then the learnable affine */
    pl_tensor *mu = NULL, *sd = NULL, *h = xf;
    if (o->revin) {
        pl_no_grad_begin();
        mu = pl_mean(xf, 1, true); /* [n, 1, F] */
        sd = pl_sqrt(pl_add_scalar(pl_mean(pl_square(pl_sub(xf, mu)), 1, true), o->revin_eps));
        pl_no_grad_end();
        h = pl_add(pl_mul(pl_div(pl_sub(xf, mu), sd), P(m, m->revin_w)), P(m, m->revin_b));
    }
    /* nn.LSTM(batch_first, num_layers = encoder_layers, dropout between layers) */
    for (int l = 0; l < o->encoder_layers && h; l++) {
        if (l > 0) h = pl_dropout(h, o->dropout, m->ctx->seed, drop_counter(m, l), training);
        h = pl_lstm(h, P(m, m->w_ih[l]), P(m, m->w_hh[l]), P(m, m->b_ih[l]), P(m, m->b_hh[l]), NULL,
                    NULL, false, NULL, NULL);
    }
    h = pl_reshape(pl_slice(h, 1, W - 1, W), 2, (int64_t[]){n, o->hidden}); /* [n, H] */
    if (o->graph) {
        /* the GAT's own dropout acts on its input h (gat_stack) */
        pl_tensor *g = gat_stack(m->gat, h, src, dst, training, true); /* [n, heads * gat_hidden] */
        h = pl_add(h, pl_linear(g, P(m, m->proj_w), P(m, m->proj_b)));
    }
    h = pl_dropout(h, o->dropout, m->ctx->seed, drop_counter(m, SG_DROP_HEAD_IN), training);
    if (m->head_w[1] >= 0) {
        h = pl_elu(pl_linear(h, P(m, m->head_w[0]), P(m, m->head_b[0])), 1.0);
        h = pl_dropout(h, o->dropout, m->ctx->seed, drop_counter(m, SG_DROP_HEAD_HIDDEN), training);
        h = pl_linear(h, P(m, m->head_w[1]), P(m, m->head_b[1]));
    } else {
        h = pl_linear(h, P(m, m->head_w[0]), P(m, m->head_b[0]));
    }
    pl_tensor *pred = pl_reshape(h, 1, &n);
    if (o->revin) {
        /* RevIN._denormalize on channel c: (y - b_c) / (w_c + eps^2) * stdev_c + mean_c */
        int64_t c = o->revin_channel;
        pred = pl_div(
            pl_sub(pred, pl_slice(P(m, m->revin_b), 0, c, c + 1)),
            pl_add_scalar(pl_slice(P(m, m->revin_w), 0, c, c + 1), o->revin_eps * o->revin_eps));
        pred = pl_mul(pred, pl_reshape(pl_slice(sd, 2, c, c + 1), 1, &n));
        pred = pl_add(pred, pl_reshape(pl_slice(mu, 2, c, c + 1), 1, &n));
    }
    return pred;
}

/* The rank loss: mean over the batch's days of 1 - Pearson(pred_d, rank(y_d)).
 * pred [n] on the device; yh, dayh host copies; the centered, unit-norm
 * ranks of y per day are constants (a day with constant y contributes 1,
 * without gradient). Pearson = sum(pc * rn) / sqrt(sum pc^2 + SG_RANK_EPS)
 * with pc = pred - the day's mean. */
static pl_tensor *rank_loss(pl_tensor *pred, const float *yh, const int64_t *dayh, pl_tensor *day,
                            int64_t n, int64_t D) {
    size_t nn = (size_t)(n ? n : 1);
    float *rn = malloc(sizeof *rn * nn), *vals = malloc(sizeof *vals * nn);
    float *inv = malloc(sizeof *inv * (size_t)(D ? D : 1));
    int64_t *start = malloc(sizeof *start * (size_t)(D + 1)), *order = malloc(sizeof *order * nn);
    double *r = malloc(sizeof *r * nn);
    pl_tensor *out = NULL;
    if (!rn || !vals || !inv || !start || !order || !r) {
        pl_error_set(PL_ERR_NOMEM, "stock_gat: out of memory for the rank loss of %lld nodes",
                     (long long)n);
        goto done;
    }
    if (sg_group_days(dayh, n, D, start, order)) goto done;
    int64_t days = 0;
    for (int64_t d = 0; d < D; d++) {
        int64_t k = start[d + 1] - start[d];
        const int64_t *idx = order + start[d];
        inv[d] = k ? 1.0f / (float)k : 0.0f;
        if (k == 0) continue;
        days++;
        /* the day's y ranks, centered and scaled to unit norm */
        for (int64_t j = 0; j < k; j++)
            vals[j] = yh[idx[j]];
        if (sg_rank_average(vals, k, r)) goto done;
        double mean = 0.5 * (double)(k + 1), ss = 0; /* average ranks always sum to k(k+1)/2 */
        for (int64_t j = 0; j < k; j++)
            ss += (r[j] - mean) * (r[j] - mean);
        for (int64_t j = 0; j < k; j++)
            rn[idx[j]] = ss > 0 ? (float)((r[j] - mean) / sqrt(ss)) : 0.0f;
    }
    pl_device dev = pred->device;
    pl_tensor *rnt = pl_tensor_from_data(PL_F32, 1, &n, rn, dev);
    pl_tensor *invt = pl_tensor_from_data(PL_F32, 1, &D, inv, dev);
    pl_tensor *mean = pl_mul(pl_scatter_add(pred, 0, day, D), invt); /* [D] */
    pl_tensor *pc = pl_sub(pred, pl_index_select(mean, 0, day));     /* [n] */
    pl_tensor *num = pl_scatter_add(pl_mul(pc, rnt), 0, day, D);     /* [D] */
    pl_tensor *den = pl_sqrt(pl_add_scalar(pl_scatter_add(pl_square(pc), 0, day, D), SG_RANK_EPS));
    pl_tensor *corr = pl_sum(pl_div(num, den), PL_ALL_DIMS, false);
    out = pl_add_scalar(pl_scale(corr, -1.0 / (double)(days ? days : 1)), 1.0);
done:
    free(rn);
    free(vals);
    free(inv);
    free(start);
    free(order);
    free(r);
    return out;
}

/* The batch fields forward reads, shape-checked (factors may be NULL). */
typedef struct sg_fields {
    pl_tensor *x, *es, *ed, *day, *y, *ret, *factors;
    int64_t n, K;
} sg_fields;

static pl_status read_fields(const sg_model *m, const pl_batch *b, sg_fields *f) {
    char d1[256], d2[256];
    memset(f, 0, sizeof *f);
    f->x = pl_batch_get(b, "x");
    f->day = pl_batch_get(b, "batch");
    f->y = pl_batch_get(b, "y");
    f->ret = pl_batch_get(b, "ret");
    if (!f->x || !f->day || !f->y || !f->ret)
        return pl_error_prefix(pl_error_status(), "stock_gat: batch needs x, batch, y, ret "
                                                  "(hdf5_panel)");
    if (m->o.graph) {
        f->es = pl_batch_get(b, "edge_src");
        f->ed = pl_batch_get(b, "edge_dst");
        if (!f->es || !f->ed)
            return pl_error_prefix(pl_error_status(),
                                   "stock_gat: graph = true needs edge_src, edge_dst");
    }
    f->factors = pl_batch_find(b, "factors");
    pl_error_clear();
    if (f->x->ndim != 3 || f->x->shape[2] != m->o.features || f->x->shape[1] < 1)
        return pl_error_set(PL_ERR_SHAPE, "stock_gat: x %s, expected [n, W, %lld] (num_features)",
                            pl_tensor_describe(f->x, d1, sizeof d1), (long long)m->o.features);
    f->n = f->x->shape[0];
    pl_tensor *one[3] = {f->day, f->y, f->ret};
    for (int i = 0; i < 3; i++)
        if (pl_tensor_numel(one[i]) != f->n)
            return pl_error_set(PL_ERR_SHAPE,
                                "stock_gat: field %s %s, expected [%lld] (one per node of x %s)",
                                i == 0   ? "batch"
                                : i == 1 ? "y"
                                         : "ret",
                                pl_tensor_describe(one[i], d1, sizeof d1), (long long)f->n,
                                pl_tensor_describe(f->x, d2, sizeof d2));
    if (f->factors) {
        if (f->factors->ndim != 2 || f->factors->shape[0] != f->n)
            return pl_error_set(PL_ERR_SHAPE, "stock_gat: factors %s, expected [%lld, K]",
                                pl_tensor_describe(f->factors, d1, sizeof d1), (long long)f->n);
        f->K = f->factors->shape[1];
        if (f->K > SG_MAX_FACTORS)
            return pl_error_set(PL_ERR_SHAPE,
                                "stock_gat: %lld factors, at most %d (the metrics table "
                                "holds %d metrics)",
                                (long long)f->K, SG_MAX_FACTORS, PL_METRICS_MAX);
    }
    if (b->size < 1)
        return pl_error_set(PL_ERR_SHAPE, "stock_gat: a batch of %lld days", (long long)b->size);
    return PL_OK;
}

/* Host f32 copy of a float tensor (the frame owns it). */
static const float *host_f32(pl_tensor *t) {
    pl_tensor *h = pl_tensor_to(t, PL_F32, PL_CPU);
    return h ? pl_tensor_f32(h) : NULL;
}

/* Each evaluation batch must be the whole split: the IC statistics are
 * over days, and a mean of per-batch IC statistics is not the split's. */
static pl_status check_whole_split(const sg_model *m, const pl_batch *b, pl_data_split split) {
    const char *sn = pl_split_name(split);
    int64_t want = m->split_days[split];
    if (want < 0)
        return pl_error_set(PL_ERR_CONFIG,
                            "stock_gat: the loader publishes no meta num_%s (the %s "
                            "split's days): evaluation needs every day of a split in one batch; "
                            "use plugin = hdf5_panel",
                            sn, sn);
    if (b->size != want || b->index != 0)
        return pl_error_set(PL_ERR_CONFIG,
                            "stock_gat: %s batch %lld holds %lld days but the %s split "
                            "has %lld (meta num_%s): the IC and Sharpe statistics need the whole "
                            "split in one batch; set data.eval_batch_size = 0",
                            sn, (long long)b->index, (long long)b->size, sn, (long long)want, sn);
    return PL_OK;
}

static void add_stats(pl_metrics *mt, const char *suffix, const sg_stats *s, bool with_std) {
    char k[64];
    snprintf(k, sizeof k, "ic%s", suffix);
    pl_metrics_add(mt, k, s->ic, 1);
    if (with_std) {
        snprintf(k, sizeof k, "ic_std%s", suffix);
        pl_metrics_add(mt, k, s->ic_std, 1);
    }
    snprintf(k, sizeof k, "ic_t%s", suffix);
    pl_metrics_add(mt, k, s->ic_t, 1);
    snprintf(k, sizeof k, "sharpe%s", suffix);
    pl_metrics_add(mt, k, s->sharpe, 1);
}

static pl_status sg_forward(void *self, const pl_batch *b, pl_data_split split, bool training,
                            pl_tensor **loss_out, pl_metrics *metrics) {
    sg_model *m = self;
    sg_fields f;
    pl_status st = read_fields(m, b, &f);
    if (!st && !training) st = check_whole_split(m, b, split);
    if (st) return st;
    int64_t n = f.n, D = b->size;
    pl_tensor *src = NULL, *dst = NULL;
    if (m->o.graph && (st = gat_edges_batch(m->gat, f.es, f.ed, n, &src, &dst)))
        return pl_error_prefix(st, "stock_gat");
    /* the day of every node is read on the host only where it is used (the
     * rank loss, the evaluation metrics): a plain training step copies
     * nothing back. sg_group_days checks every id before any use. */
    pl_tensor *day = NULL;
    const int64_t *dayh = NULL;
    if (!training || m->o.rank_loss_weight > 0) {
        day = f.day->dtype == PL_I64 ? f.day : pl_tensor_to(f.day, PL_I64, f.day->device);
        pl_tensor *dayc = day ? pl_tensor_to(day, PL_I64, PL_CPU) : NULL;
        if (!dayc) return pl_error_prefix(pl_error_status(), "stock_gat");
        dayh = pl_tensor_i64(dayc);
    }
    pl_tensor *pred = sg_predict(m, f.x, src, dst, training);
    pl_tensor *y = pl_reshape(
        pl_contiguous(f.y->dtype == PL_F32 ? f.y : pl_tensor_to(f.y, PL_F32, f.y->device)), 1, &n);
    pl_tensor *mse = pl_mse_loss(pred, y), *loss = mse;
    if (mse && m->o.rank_loss_weight > 0) {
        const float *yh = host_f32(y);
        if (!yh) return pl_error_prefix(pl_error_status(), "stock_gat");
        pl_tensor *rl = rank_loss(pred, yh, dayh, day, n, D);
        loss = pl_add(mse, pl_scale(rl, m->o.rank_loss_weight));
    }
    if (!loss) return pl_error_prefix(pl_error_status(), "stock_gat forward");
    *loss_out = loss;
    if (!metrics) return PL_OK;
    /* loss and mse are means over the nodes: the count weights this rank's
     * part in a data-parallel run */
    pl_metrics_add(metrics, "loss", pl_tensor_item(loss) * (double)n, (double)n);
    if (training) {
        pl_metrics_add(metrics, "mse", pl_tensor_item(mse) * (double)n, (double)n);
        return PL_OK;
    }
    const float *ph = host_f32(pred), *rh = host_f32(f.ret);
    const float *fh = f.factors ? host_f32(pl_contiguous(f.factors)) : NULL;
    if (!ph || !rh || (f.factors && !fh))
        return pl_error_prefix(pl_error_status(), "stock_gat metrics");
    sg_stats s;
    if ((st = sg_daily_stats(ph, 1, rh, dayh, n, D, m->o.long_short, &s))) return st;
    add_stats(metrics, "", &s, true);
    pl_metrics_add(metrics, "mse", pl_tensor_item(mse) * (double)n, (double)n);
    for (int64_t k = 0; k < f.K; k++) {
        char sfx[SG_FACTOR_NAME + 8];
        if (k < m->num_factor_names)
            snprintf(sfx, sizeof sfx, "_%s", m->factor_name[k]);
        else
            snprintf(sfx, sizeof sfx, "_factor_%lld", (long long)k);
        if ((st = sg_daily_stats(fh + k, f.K, rh, dayh, n, D, m->o.long_short, &s))) return st;
        add_stats(metrics, sfx, &s, false);
    }
    return PL_OK;
}

/* ---- plugin ---------------------------------------------------------------------- */

static const pl_option_spec sg_options[] = {
    {"hidden", PL_OPT_INT, "32", 1, 1e6, NULL, "LSTM hidden size H (the node state width)"},
    {"encoder_layers", PL_OPT_INT, "1", 1, SG_MAX_LAYERS, NULL, "stacked LSTM layers"},
    {"graph", PL_OPT_BOOL, "true", PL_NO_BOUNDS, NULL,
     "GAT over the day's graph with a residual: h + Linear(GAT(h)) (false: the encoder alone)"},
    {"gat_layers", PL_OPT_INT, "1", 1, GAT_MAX_LAYERS, NULL, "GATConv layers (ELU after each)"},
    {"heads", PL_OPT_INT, "4", 1, 256, NULL, "attention heads per GATConv (concatenated)"},
    {"gat_hidden", PL_OPT_INT, "8", 1, 1e6, NULL, "channels per head"},
    {"dropout", PL_OPT_FLOAT, "0.1", 0, 0.99, NULL,
     "dropout between LSTM layers, on every GATConv input and on the head's inputs"},
    {"attn_dropout", PL_OPT_FLOAT, "0", 0, 0.99, NULL, "dropout on the attention coefficients"},
    {"head_hidden", PL_OPT_INT, "0", 0, 1e6, NULL,
     "0: Linear(H, 1) head; else Linear(H, head_hidden) -> ELU -> Linear(head_hidden, 1)"},
    {"revin", PL_OPT_BOOL, "false", PL_NO_BOUNDS, NULL,
     "reversible instance normalization of every window (Kim et al. 2022): per node and feature "
     "subtract the window mean, divide by sqrt(var + revin_eps), learnable affine; the prediction "
     "is de-normalized with revin_channel's statistics"},
    {"revin_channel", PL_OPT_INT, "0", 0, 1e6, NULL,
     "input feature whose window statistics de-normalize the prediction (ret_1d, feature 0 of "
     "dowjones30.h5)"},
    {"revin_eps", PL_OPT_FLOAT, "1e-5", 1e-12, 1, NULL, "eps of the RevIN stdev sqrt(var + eps)"},
    {"rank_loss_weight", PL_OPT_FLOAT, "0", 0, 1e6, NULL,
     "weight of the rank loss mean over days (1 - Pearson(pred, rank(y))) added to the mse"},
    {"long_short", PL_OPT_INT, "5", 1, 1e6, NULL,
     "stocks per leg of the Sharpe portfolio: long the highest predictions, short the lowest"},
    PL_OPTIONS_END};

static pl_status sg_create(const pl_config_section *cfg, pl_run_context *ctx, void **self) {
    sg_opts o = {
        .hidden = pl_cfg_int(cfg, "hidden", 32),
        .encoder_layers = (int)pl_cfg_int(cfg, "encoder_layers", 1),
        .graph = pl_cfg_bool(cfg, "graph", true),
        .gat_layers = (int)pl_cfg_int(cfg, "gat_layers", 1),
        .heads = (int)pl_cfg_int(cfg, "heads", 4),
        .gat_hidden = pl_cfg_int(cfg, "gat_hidden", 8),
        .dropout = pl_cfg_float(cfg, "dropout", 0.1),
        .attn_dropout = pl_cfg_float(cfg, "attn_dropout", 0),
        .head_hidden = pl_cfg_int(cfg, "head_hidden", 0),
        .revin = pl_cfg_bool(cfg, "revin", false),
        .revin_channel = pl_cfg_int(cfg, "revin_channel", 0),
        .revin_eps = pl_cfg_float(cfg, "revin_eps", 1e-5),
        .rank_loss_weight = pl_cfg_float(cfg, "rank_loss_weight", 0),
        .long_short = pl_cfg_int(cfg, "long_short", 5),
    };
    pl_status st = pl_meta_get_int(ctx->meta, "num_features", &o.features);
    if (st)
        return pl_error_prefix(st,
                               "stock_gat: the loader publishes no num_features (use plugin = "
                               "hdf5_panel)");
    if (o.revin && o.revin_channel >= o.features)
        return pl_error_set(PL_ERR_CONFIG,
                            "stock_gat: revin_channel = %lld (%s) outside the %lld input "
                            "features",
                            (long long)o.revin_channel, pl_cfg_origin(cfg, "revin_channel"),
                            (long long)o.features);
    const char *task = pl_meta_get_str(ctx->meta, "task");
    if (task && strcmp(task, "stock_ranking"))
        return pl_error_set(PL_ERR_CONFIG,
                            "stock_gat: the loader serves task '%s', this model "
                            "ranks stocks (hdf5_panel serves 'stock_ranking')",
                            task);
    sg_model *m = calloc(1, sizeof *m);
    if (!m) return pl_error_set(PL_ERR_NOMEM, "stock_gat: out of memory");
    m->o = o;
    m->ctx = ctx;
    for (int i = 0; i < SG_MAX_LAYERS; i++)
        m->w_ih[i] = m->w_hh[i] = m->b_ih[i] = m->b_hh[i] = -1;
    m->revin_w = m->revin_b = m->proj_w = m->proj_b = -1;
    m->head_w[0] = m->head_w[1] = m->head_b[0] = m->head_b[1] = -1;
    /* what the loader says about the splits and factors (absent: -1 / none) */
    static const char *split_key[PL_SPLIT_COUNT] = {"num_train", "num_val", "num_test"};
    for (int s = 0; s < PL_SPLIT_COUNT; s++)
        if (pl_meta_get_int(ctx->meta, split_key[s], &m->split_days[s])) m->split_days[s] = -1;
    int64_t K = 0;
    if (pl_meta_get_int(ctx->meta, "num_factors", &K)) K = 0;
    pl_error_clear();
    if (K > SG_MAX_FACTORS) {
        sg_model_free(m);
        return pl_error_set(PL_ERR_CONFIG,
                            "stock_gat: the loader serves %lld factors, at most %d "
                            "(3 metrics each in a table of %d)",
                            (long long)K, SG_MAX_FACTORS, PL_METRICS_MAX);
    }
    for (int64_t k = 0; k < K; k++) {
        char key[64];
        snprintf(key, sizeof key, "factor_name_%lld", (long long)k);
        const char *nm = pl_meta_get_str(ctx->meta, key);
        if (!nm || !*nm || strlen(nm) > SG_FACTOR_NAME) {
            sg_model_free(m);
            return pl_error_set(PL_ERR_CONFIG,
                                "stock_gat: meta %s %s%s%s: expected a name of 1 to %d "
                                "characters (metrics ic_<name>, ...)",
                                key, nm ? "'" : "", nm ? nm : "missing", nm ? "'" : "",
                                SG_FACTOR_NAME);
        }
        snprintf(m->factor_name[k], sizeof m->factor_name[k], "%s", nm);
    }
    m->num_factor_names = (int)K;
    st = create_params(m);
    if (st) {
        sg_model_free(m);
        return st;
    }
    *self = m;
    return PL_OK;
}

static void sg_destroy(void *self) {
    sg_model_free(self);
}

/* The panel batch of hdf5_panel; edges only with graph. */
static pl_status sg_batch_needs(const pl_config_section *cfg, pl_field_list *out) {
    bool graph = pl_cfg_bool(cfg, "graph", true);
    pl_status st = pl_fields_add(out, "x", PL_DTYPE_FLOAT, 3, false);
    if (!st) st = pl_fields_add(out, "edge_src", PL_DTYPE_INDEX, 1, !graph);
    if (!st) st = pl_fields_add(out, "edge_dst", PL_DTYPE_INDEX, 1, !graph);
    if (!st) st = pl_fields_add(out, "batch", PL_DTYPE_INDEX, 1, false);
    if (!st) st = pl_fields_add(out, "y", PL_DTYPE_FLOAT, 1, false);
    if (!st) st = pl_fields_add(out, "ret", PL_DTYPE_FLOAT, 1, false);
    if (!st) st = pl_fields_add(out, "factors", PL_DTYPE_FLOAT, 2, true);
    return st;
}

static const pl_model_vtable sg_vtable = {
    .create = sg_create,
    .destroy = sg_destroy,
    .forward = sg_forward,
    .batch_needs = sg_batch_needs,
};

PL_PLUGIN_DEFINE(stock_gat, PL_KIND_MODEL, "1.0.0",
                 "stock ranking: per-stock LSTM over a feature window, GAT over the day's graph, "
                 "next-day return head; daily rank IC and long/short Sharpe",
                 sg_options, &sg_vtable)
