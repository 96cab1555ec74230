/* multiframe.c - the lstm model's multi-timeframe path and return metrics
 * (kept apart from lstm.c, which calls in where it validates, builds the
 * head, creates, forwards, predicts and declares its fields).
 *
 * Multi-timeframe (timeframe_fields = x_tf4,x_tf24; hdf5_series'
 * `timeframes`): the input field x and every listed field [B, T_j, F] are
 * each encoded by their own LSTM stack (x by the model's `lstm.*` layers,
 * field j by `<field>.lstm.*`, same hidden_size and num_layers, dropout
 * between layers), and the head reads the concatenation of their last
 * hidden states:
 *
 *   h_0 = LSTM_x(x)[:, -1],  h_j = LSTM_j(x_j)[:, -1]      [B, Hd] each
 *   pred = head([h_0, h_1, .., h_J])                        [B, O], head [O, (1+J) Hd]
 *
 * as torch: `torch.cat([lstm(x)[0][:, -1]] + [l(xj)[0][:, -1] for l, xj in
 * zip(lstms, xs)], 1) @ head.weight.T + head.bias`.
 *
 * Return metrics (return_metrics = true; the target is a return, e.g.
 * log_return): beside mae, in original units,
 *   persistence_mae       MAE of the no-change forecast (return 0)
 *   dir_acc               share of targets != 0 whose sign the forecast has
 *                         (a forecast of 0 counts as wrong; "0" is within
 *                         1e-6 target std of 0, the f32 standardization's
 *                         round-off)
 *   last_return_mae,      the forecast "next return = last return": input
 *   last_return_dir_acc   x[:, T-1, naive_column] (the target's column)
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lstm.h"

static pl_tensor *PT(const lstm_model *m, int idx) { return pl_params_at(m->ctx->params, idx)->t; }

pl_status lstm_mf_validate(const lstm_opts *o) {
    if (o->n_tf == 0) return PL_OK;
    if (o->head != LSTM_HEAD_LAST || o->bidirectional || o->stateful || o->ensemble > 1 ||
        o->revin != LSTM_REVIN_OFF || o->input_diff > 0 || o->naive_skip || o->exogenous_gate ||
        o->input_dropout > 0 || o->feature_dropout > 0)
        return pl_error_set(PL_ERR_CONFIG,
                            "lstm: timeframe_fields (%d fields) encode each window with a plain "
                            "LSTM stack and join the last states: it needs head = last and none "
                            "of bidirectional, stateful, ensemble > 1, revin, input_diff, "
                            "naive_skip, exogenous_gate, input_dropout, feature_dropout",
                            o->n_tf);
    return PL_OK;
}

static pl_status add_tf_field(const char *tok, int index, void *ud) {
    (void)index;
    lstm_opts *o = ud;
    if (o->n_tf >= LSTM_MAX_TF || strlen(tok) >= sizeof o->tf_field[0])
        return pl_error_set(PL_ERR_CONFIG, "lstm: timeframe_fields: at most %d fields of at most "
                            "%zu characters ('%s')", LSTM_MAX_TF, sizeof o->tf_field[0] - 1, tok);
    snprintf(o->tf_field[o->n_tf++], sizeof o->tf_field[0], "%s", tok);
    return PL_OK;
}

pl_status lstm_mf_parse_fields(const char *spec, lstm_opts *o) {
    o->n_tf = 0;
    return pl_cfg_list(spec, "lstm: timeframe_fields", add_tf_field, o, NULL);
}

pl_status lstm_mf_add_params(lstm_model *m) {
    const lstm_opts *o = &m->o;
    int64_t Hd = o->hidden_size;
    double k = 1.0 / sqrt((double)Hd);
    pl_status st = PL_OK;
    for (int j = 0; j < o->n_tf && !st; j++) {
        /* streams 200000 + j * 1000: apart from the members' (k * 100000 + small) */
        uint64_t stream = 200000 + (uint64_t)j * 1000;
        for (int l = 0; l < o->num_layers && !st; l++) {
            int64_t in = l == 0 ? o->input_size : Hd;
            char name[PL_NAME_MAX];
            snprintf(name, sizeof name, "%s.lstm.weight_ih_l%d", o->tf_field[j], l);
            st = lstm_add_param(m, name, 2, (int64_t[]){4 * Hd, in}, k, stream++, 0, NULL,
                                &m->tf_w_ih[j][l]);
            snprintf(name, sizeof name, "%s.lstm.weight_hh_l%d", o->tf_field[j], l);
            if (!st)
                st = lstm_add_param(m, name, 2, (int64_t[]){4 * Hd, Hd}, k, stream++, 0, NULL,
                                    &m->tf_w_hh[j][l]);
            snprintf(name, sizeof name, "%s.lstm.bias_ih_l%d", o->tf_field[j], l);
            if (!st)
                st = lstm_add_param(m, name, 1, (int64_t[]){4 * Hd}, k, stream++, PL_TAG_NO_DECAY,
                                    NULL, &m->tf_b_ih[j][l]);
            snprintf(name, sizeof name, "%s.lstm.bias_hh_l%d", o->tf_field[j], l);
            if (!st)
                st = lstm_add_param(m, name, 1, (int64_t[]){4 * Hd}, k, stream++, PL_TAG_NO_DECAY,
                                    NULL, &m->tf_b_hh[j][l]);
        }
    }
    return st;
}

/* x [B, T, F] through a plain stack (layer l: weights w_ih[l] ..) -> the last
 * step's output [B, Hd]; dropout between layers with counters from `base`. */
static pl_tensor *encode_last(lstm_model *m, pl_tensor *x, const int *w_ih, const int *w_hh,
                              const int *b_ih, const int *b_hh, uint64_t base, bool training,
                              const char *field) {
    char b1[256];
    if (!x) return NULL;
    if (x->ndim != 3 || x->shape[2] != m->o.input_size || x->shape[1] < 1) {
        pl_error_set(PL_ERR_SHAPE, "lstm: input '%s' %s, expected [B, T >= 1, %lld]", field,
                     pl_tensor_describe(x, b1, sizeof b1), (long long)m->o.input_size);
        return NULL;
    }
    int64_t B = x->shape[0], T = x->shape[1];
    pl_tensor *h = x->dtype == PL_F32 ? x : pl_tensor_to(x, PL_F32, x->device);
    for (int l = 0; l < m->o.num_layers && h; l++) {
        if (l > 0) h = pl_dropout(h, m->o.dropout, m->ctx->seed, base + (uint64_t)l, training);
        h = pl_lstm(h, PT(m, w_ih[l]), PT(m, w_hh[l]), PT(m, b_ih[l]), PT(m, b_hh[l]), NULL, NULL,
                    false, NULL, NULL);
    }
    return h ? pl_reshape(pl_slice(h, 1, T - 1, T), 2, (int64_t[]){B, m->o.hidden_size}) : NULL;
}

pl_tensor *lstm_mf_predict(lstm_model *m, const pl_batch *b, bool training) {
    pl_tensor *x = pl_batch_get(b, m->o.input_field);
    if (!x) return NULL;
    pl_tensor *parts[1 + LSTM_MAX_TF];
    uint64_t base = (uint64_t)m->ctx->micro_step * LSTM_MAX_LAYERS;
    int w_ih[LSTM_MAX_LAYERS], w_hh[LSTM_MAX_LAYERS], b_ih[LSTM_MAX_LAYERS], b_hh[LSTM_MAX_LAYERS];
    for (int l = 0; l < m->o.num_layers; l++) {
        w_ih[l] = m->w_ih[0][l][0];
        w_hh[l] = m->w_hh[0][l][0];
        b_ih[l] = m->b_ih[0][l][0];
        b_hh[l] = m->b_hh[0][l][0];
    }
    parts[0] = encode_last(m, x, w_ih, w_hh, b_ih, b_hh, base, training, m->o.input_field);
    for (int j = 0; j < m->o.n_tf && parts[j]; j++) {
        pl_tensor *xj = pl_batch_get(b, m->o.tf_field[j]);
        if (xj && xj->shape[0] != x->shape[0]) {
            pl_error_set(PL_ERR_SHAPE, "lstm: '%s' has %lld windows, '%s' %lld",
                         m->o.tf_field[j], (long long)xj->shape[0], m->o.input_field,
                         (long long)x->shape[0]);
            return NULL;
        }
        /* dropout counters of encoder j in bits 40.. (the members use 48..) */
        parts[j + 1] = encode_last(m, xj, m->tf_w_ih[j], m->tf_w_hh[j], m->tf_b_ih[j],
                                   m->tf_b_hh[j], base | ((uint64_t)(j + 1) << 40), training,
                                   m->o.tf_field[j]);
    }
    for (int j = 0; j <= m->o.n_tf; j++)
        if (!parts[j]) return NULL;
    pl_tensor *h = pl_concat(parts, 1 + m->o.n_tf, 1);
    return pl_linear(h, PT(m, m->head_w[0]), PT(m, m->head_b[0]));
}

pl_status lstm_mf_needs(const pl_config_section *cfg, pl_field_list *out) {
    lstm_opts o;
    pl_status st = lstm_mf_parse_fields(pl_cfg_str(cfg, "timeframe_fields", ""), &o);
    for (int j = 0; !st && j < o.n_tf; j++)
        st = pl_fields_add(out, o.tf_field[j], PL_DTYPE_FLOAT, 3, false);
    return st;
}

pl_status lstm_return_metrics(const lstm_model *m, pl_tensor *pred, pl_tensor *target,
                              pl_tensor *x, pl_metrics *mt) {
    if (!m->o.return_metrics) return PL_OK;
    if (m->o.head != LSTM_HEAD_LAST || m->o.output_size != 1)
        return pl_error_set(PL_ERR_CONFIG, "lstm: return_metrics needs head = last and one output "
                            "(output_size %lld)", (long long)m->o.output_size);
    pl_tensor *hp = pl_contiguous(pl_tensor_to(pred, PL_F32, PL_CPU));
    pl_tensor *ht = pl_contiguous(pl_tensor_to(target, PL_F32, PL_CPU));
    pl_tensor *hx = pl_contiguous(pl_tensor_to(x, PL_F32, PL_CPU));
    if (!hp || !ht || !hx) return pl_error_status();
    const float *p = pl_tensor_data(hp), *y = pl_tensor_data(ht), *xv = pl_tensor_data(hx);
    int64_t B = pl_tensor_numel(hp), T = x->shape[1], F = x->shape[2], c = m->o.naive_column;
    if (c < 0 || c >= F || x->shape[0] != B)
        return pl_error_set(PL_ERR_CONFIG, "lstm: return_metrics: naive_column %lld outside the "
                            "%lld input features (or %lld windows for %lld forecasts)",
                            (long long)c, (long long)F, (long long)x->shape[0], (long long)B);
    double sc = m->o.scale[0], sh = m->o.shift[0];
    /* a value standardized in f32 and back is off zero by ~1e-7 std: within
     * 1e-6 std of 0 is no change (no direction) */
    double eps = 1e-6 * fabs(sc);
    double pers = 0, lae = 0, hit = 0, lhit = 0, nz = 0;
    for (int64_t b = 0; b < B; b++) {
        double pv = p[b] * sc + sh, yv = y[b] * sc + sh;
        double lv = xv[(b * T + T - 1) * F + c] * sc + sh;
        pers += fabs(yv);
        lae += fabs(lv - yv);
        if (fabs(yv) > eps) {
            nz++;
            hit += (pv > eps && yv > 0) || (pv < -eps && yv < 0);
            lhit += (lv > eps && yv > 0) || (lv < -eps && yv < 0);
        }
    }
    pl_metrics_add(mt, "persistence_mae", pers, (double)B);
    pl_metrics_add(mt, "last_return_mae", lae, (double)B);
    pl_metrics_add(mt, "dir_acc", hit, nz);
    pl_metrics_add(mt, "last_return_dir_acc", lhit, nz);
    return PL_OK;
}
