/* lstm.h - LSTM forecaster internals shared by the plugin and its test
 * (not part of the SDK; the plugin exports only pl_plugin_entry).
 *
 * Shapes: B batch, T time steps, F input features, Hd hidden size,
 * D = 2 if bidirectional else 1, O outputs per prediction.
 */
#ifndef PL_MODEL_LSTM_H
#define PL_MODEL_LSTM_H

#include <stdbool.h>
#include <stdint.h>

#include "pipeline/pipeline.h"

#define LSTM_MAX_LAYERS 16
#define LSTM_MAX_OUT 256
#define LSTM_MAX_MEMBERS 16
#define LSTM_MAX_TF 7 /* further timeframe fields (multiframe.c) */

typedef enum { LSTM_HEAD_LAST, LSTM_HEAD_ALL } lstm_head;
typedef enum { LSTM_LOSS_MSE, LSTM_LOSS_MAE, LSTM_LOSS_HUBER } lstm_loss;
/* reversible instance normalization of each input window (Kim et al. 2022) */
typedef enum { LSTM_REVIN_OFF, LSTM_REVIN_MEAN, LSTM_REVIN_STD } lstm_revin;

typedef struct lstm_opts {
    int64_t input_size, hidden_size, output_size;
    int num_layers;
    double dropout; /* between layers (torch nn.LSTM dropout) */
    bool bidirectional;
    lstm_head head;
    bool stateful;  /* carry (h, c) of the forward direction across consecutive batches */
    lstm_loss loss;
    double huber_delta;
    /* target de-standardization, per output column o: y = y_std * scale[o] + shift[o] */
    double shift[LSTM_MAX_OUT], scale[LSTM_MAX_OUT];
    /* seasonal-naive baseline (0: off): forecast of horizon step h (1-based)
     * = x[:, T - 1 + h - period, naive_column], de-standardized with output 0's stats */
    int64_t seasonal_period, naive_column, horizon;
    /* add the seasonal-naive forecast to the head's output (the network
     * learns the correction; needs output_size == horizon <= period) */
    bool naive_skip;
    /* naive_skip = corrected: the base is the seasonal naive forecast plus the
     * last step's seasonal difference, x[T-1+h-period] + (x[T-1] - x[T-1-period])
     * (needs period < T) */
    bool skip_corrected;
    /* RevIN: per window and feature, x -> (x - mean_T) [/ sqrt(var_T + eps)]
     * [* w + b], statistics detached; the prediction is de-normalized with the
     * statistics (and affine) of input column naive_column (the target).
     * Needs head = last and one target (output_size == horizon). */
    lstm_revin revin;
    bool revin_affine;
    double revin_eps;
    /* > 0: the LSTM reads x_t - x_{t - input_diff} (T - input_diff steps),
     * after RevIN; the naive_skip base is read before differencing */
    int64_t input_diff;
    /* dropout on the LSTM's input (after revin / differencing): elementwise
     * (nn.Dropout) and whole features per window (nn.Dropout1d on [B, F, T]) */
    double input_dropout, feature_dropout;
    /* exogenous gate: every input column except naive_column (the target) is
     * multiplied by a learnable per-column gate that starts at 0, so the
     * network starts as a model of the target's own history and uses the
     * other columns as far as training (against the gates' weight decay:
     * optimizer group.<g>.match = *input_gate) pays for it */
    bool exogenous_gate;
    /* ensemble members (>= 1): independent networks (own init, own dropout
     * masks, own training loss), the forecast is their mean */
    int ensemble;
    const char *input_field, *target_field;
    /* multi-timeframe (multiframe.c): further input fields, each encoded by
     * its own LSTM stack; the head reads the joined last states */
    int n_tf;
    char tf_field[LSTM_MAX_TF][48];
    /* report persistence_mae, dir_acc, last_return_* (the target is a return) */
    bool return_metrics;
} lstm_opts;

typedef struct lstm_model {
    lstm_opts o;
    /* parameter indices into ctx->params: [member][layer][direction] */
    int w_ih[LSTM_MAX_MEMBERS][LSTM_MAX_LAYERS][2], w_hh[LSTM_MAX_MEMBERS][LSTM_MAX_LAYERS][2],
        b_ih[LSTM_MAX_MEMBERS][LSTM_MAX_LAYERS][2], b_hh[LSTM_MAX_MEMBERS][LSTM_MAX_LAYERS][2];
    int head_w[LSTM_MAX_MEMBERS], head_b[LSTM_MAX_MEMBERS];
    int revin_w[LSTM_MAX_MEMBERS], revin_b[LSTM_MAX_MEMBERS]; /* -1 unless revin_affine */
    int gate[LSTM_MAX_MEMBERS];                               /* -1 unless exogenous_gate */
    pl_tensor *gate_fixed, *gate_mask; /* [F]: 1 at naive_column; 1 elsewhere (owned) */
    pl_tensor *drop_ones;              /* [B, 1, F] ones for feature_dropout (owned, cached) */
    pl_run_context *ctx; /* borrowed; live counters read at every forward */
    /* stateful carry (forward direction), owned */
    pl_tensor *h[LSTM_MAX_LAYERS], *c[LSTM_MAX_LAYERS];
    int carry_split;
    bool carry_training;
    int64_t carry_batch;
    /* running sums of the evaluation in progress (RMSE needs the total) */
    int64_t pred_rows;      /* `pipeline predict`: rows named so far (outputs_batch) */
    /* parameter indices of the timeframe encoders [field][layer] (multiframe.c) */
    int tf_w_ih[LSTM_MAX_TF][LSTM_MAX_LAYERS], tf_w_hh[LSTM_MAX_TF][LSTM_MAX_LAYERS],
        tf_b_ih[LSTM_MAX_TF][LSTM_MAX_LAYERS], tf_b_hh[LSTM_MAX_TF][LSTM_MAX_LAYERS];
} lstm_model;

pl_status lstm_model_new(const lstm_opts *o, pl_run_context *ctx, lstm_model **out);
void lstm_model_free(lstm_model *m);
/* Drop the carried hidden state (next batch starts from zeros). */
void lstm_reset_state(lstm_model *m);

/* Predictions (standardized units): x [B, T, F] -> [B, O] (head last) or
 * [B, T, O] (head all); the mean of the members' forecasts. With
 * `stateful`, h0/c0 come from the carried state and the new state is
 * stored. Dropout counters from ctx->micro_step. */
pl_tensor *lstm_predict(lstm_model *m, pl_tensor *x, bool training);
/* The forecast of ensemble member k alone (0 <= k < ensemble). */
pl_tensor *lstm_predict_member(lstm_model *m, int k, pl_tensor *x, bool training);

/* A new f32 parameter of `shape` on the run's device, U(-bound, bound) from
 * (seed, stream), registered in ctx->params under `name` with `tags`/`role`
 * (the params own it); its index in *idx. Errors name the parameter. */
pl_status lstm_add_param(lstm_model *m, const char *name, int ndim, const int64_t *shape,
                         double bound, uint64_t stream, unsigned tags, const char *role, int *idx);

/* ---- multiframe.c: multi-timeframe windows and return metrics ----
 * "x_tf4,x_tf24" -> o->tf_field / n_tf; PL_ERR_CONFIG past LSTM_MAX_TF
 * fields or 47 characters a name. */
pl_status lstm_mf_parse_fields(const char *spec, lstm_opts *o);
/* PL_ERR_CONFIG naming the options the multi-timeframe path cannot honour. */
pl_status lstm_mf_validate(const lstm_opts *o);
/* The timeframe encoders' parameters `<field>.lstm.{weight,bias}_{ih,hh}_l<l>`. */
pl_status lstm_mf_add_params(lstm_model *m);
/* Forecast [B, O] (standardized) from batch fields input_field [B, T, F] and
 * every tf_field [B, T_j, F] (borrowed; the frame owns the result); NULL
 * with the error set on a missing field or a shape mismatch. */
pl_tensor *lstm_mf_predict(lstm_model *m, const pl_batch *b, bool training);
/* The tf_fields of cfg's timeframe_fields, appended to out (f32/bf16/f16, rank 3). */
pl_status lstm_mf_needs(const pl_config_section *cfg, pl_field_list *out);
/* return_metrics: persistence_mae, dir_acc, last_return_mae,
 * last_return_dir_acc of pred / target [B, 1] (standardized, any device)
 * and input x [B, T, F] (last step, naive_column), in original units. */
pl_status lstm_return_metrics(const lstm_model *m, pl_tensor *pred, pl_tensor *target,
                              pl_tensor *x, pl_metrics *mt);

#endif
