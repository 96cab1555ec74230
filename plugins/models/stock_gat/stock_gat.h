/* stock_gat.h - stock ranking model internals shared by the plugin and its
 * test (not part of the SDK; the plugin exports only pl_plugin_entry).
 *
 * Shapes: n nodes = B' days x S stocks (node d*S + s), W window steps, F
 * features, H encoder hidden size, K factors.
 */
#ifndef PL_MODEL_STOCK_GAT_H
#define PL_MODEL_STOCK_GAT_H

#include <stdbool.h>
#include <stdint.h>

#include "gat.h"
#include "pipeline/pipeline.h"

#define SG_MAX_LAYERS 8   /* encoder_layers */
#define SG_MAX_FACTORS 8  /* 6 model metrics + 3 per factor fit PL_METRICS_MAX (32) */
#define SG_FACTOR_NAME 40 /* "sharpe_" + name fits a metric name (48) */
#define SG_RANK_EPS 1e-8  /* per-day Pearson of the rank loss: sum(pc rn) / sqrt(sum pc^2 + eps) */

typedef struct sg_opts {
    int64_t features;      /* F (meta num_features) */
    int64_t hidden;        /* LSTM hidden size H */
    int encoder_layers;    /* stacked LSTM layers */
    bool graph;            /* GAT over the day's graph */
    int gat_layers;        /* GATConv layers */
    int heads;             /* heads per GATConv (concatenated) */
    int64_t gat_hidden;    /* channels per head */
    double dropout;        /* between LSTM layers, GAT inputs, head input */
    double attn_dropout;   /* on the attention coefficients */
    int64_t head_hidden;   /* 0: Linear(H, 1); else Linear(H, hh) -> ELU -> Linear(hh, 1) */
    bool revin;            /* reversible instance normalization of every window */
    int64_t revin_channel; /* input feature whose statistics de-normalize the prediction */
    double revin_eps;
    double rank_loss_weight;
    int64_t long_short; /* stocks per leg of the Sharpe portfolio */
} sg_opts;

typedef struct sg_model {
    sg_opts o;
    pl_run_context *ctx; /* borrowed; live counters read at every forward */
    /* parameter indices into ctx->params (-1: absent) */
    int w_ih[SG_MAX_LAYERS], w_hh[SG_MAX_LAYERS], b_ih[SG_MAX_LAYERS], b_hh[SG_MAX_LAYERS];
    int revin_w, revin_b;
    int proj_w, proj_b;
    int head_w[2], head_b[2];
    gat_model *gat; /* the GATConv stack (gat_layers.c), NULL without graph; owned */
    /* loader meta read at create: days per split (-1: not published), factor names */
    int64_t split_days[PL_SPLIT_COUNT];
    int num_factor_names;
    char factor_name[SG_MAX_FACTORS][SG_FACTOR_NAME + 1];
} sg_model;

/* Predictions pred f32 [n] (the target y's units) for windows x [n, W, F]
 * and, with graph, the day graphs' edges src/dst i64 [e] (batch-local node
 * ids, used as given: no self loops added). Dropout counters from
 * ctx->micro_step (training only). A tensor of the current frame; NULL with
 * the error set. */
pl_tensor *sg_predict(sg_model *m, pl_tensor *x, pl_tensor *src, pl_tensor *dst, bool training);

/* ---- stock_metrics.c: the field's evaluation statistics on host arrays ----
 * Days are the groups of equal `day` ids (0 <= day < num_days; days with no
 * node are not counted). A day on which the score or the return is constant
 * (or that has one stock) has IC 0; a day with a constant score has
 * long/short return 0: the score ranks nothing. */

/* Average ranks, 1-based (ties share the mean of their positions, as
 * scipy.stats.rankdata "average") of v[0..n) into r. */
pl_status sg_rank_average(const float *v, int64_t n, double *r);
/* Spearman correlation of a and b: Pearson of their average ranks; 0 when
 * either is constant or n < 2; NaN when a value is not finite. */
double sg_spearman(const float *a, const float *b, int64_t n);
/* One day's long/short simple return: mean(exp(ret) - 1) of the L stocks
 * with the highest score minus that of the L lowest, L = min(long_short,
 * n / 2); order by (score, stock index) ascending, so ties at the cut go to
 * the lower index on the short side. 0 for a constant score or L = 0. */
double sg_long_short(const float *score, const float *ret, int64_t n, int64_t long_short);

/* Group nodes by day: order[start[d] .. start[d+1]) are day d's nodes in
 * ascending node order (start has num_days + 1 entries, order n).
 * PL_ERR_INVALID naming the node for a day id outside [0, num_days). */
pl_status sg_group_days(const int64_t *day, int64_t n, int64_t num_days, int64_t *start,
                        int64_t *order);

typedef struct sg_stats {
    int64_t days;  /* days with at least one node */
    double ic;     /* mean daily Spearman IC */
    double ic_std; /* its sample std (ddof 1; 0 with < 2 days) */
    double ic_t;   /* ic / ic_std * sqrt(days) (0 when ic_std is 0) */
    double sharpe; /* mean / std (ddof 1) of the daily long/short return * sqrt(252) (0 when std is
                      0) */
} sg_stats;

/* The statistics of score[i * stride] against ret[i] for nodes i < n of
 * days day[i]. Errors as sg_group_days; PL_ERR_NOMEM. */
pl_status sg_daily_stats(const float *score, int64_t stride, const float *ret, const int64_t *day,
                         int64_t n, int64_t num_days, int64_t long_short, sg_stats *out);

#endif
