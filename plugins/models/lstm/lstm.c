/* lstm - multi-layer LSTM forecaster with a linear head.
 *
 * The recurrence is torch.nn.LSTM's (gate order i, f, g, o; Hochreiter &
 * Schmidhuber 1997 with the forget gate of Gers et al. 2000), computed by
 * the fused op pl_lstm (ops.h):
 *
 *   gates = x_t W_ih^T + b_ih + h_{t-1} W_hh^T + b_hh
 *   c_t = f * c_{t-1} + i * g,   h_t = o * tanh(c_t)
 *
 * Layers are stacked as in nn.LSTM(num_layers, dropout, bidirectional,
 * batch_first=True): layer l > 0 reads dropout(output of layer l-1), a
 * bidirectional layer concatenates [forward, reverse] outputs. The head is
 * nn.Linear on the last time step's output (head = last) or on every step
 * (head = all). Parameters and init follow PyTorch: U(-1/sqrt(H), 1/sqrt(H))
 * for the LSTM, U(-1/sqrt(in), 1/sqrt(in)) for the head.
 *
 * stateful = true keeps the forward direction's final (h, c) of a batch and
 * starts the next batch of the same split from it (detached: truncated
 * BPTT). It is reset at the first batch of every epoch / evaluation, when the
 * split or the batch size changes. The loader must then deliver row b of
 * batch k+1 as the continuation of row b of batch k (no shuffle).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lstm.h"
#include "lstm_check.h"

/* ---- parameters ------------------------------------------------------------ */

static pl_status add_param(lstm_model *m, const char *name, int ndim, const int64_t *shape, double bound,
                           uint64_t stream, unsigned tags, const char *role, int *idx) {
    pl_run_context *ctx = m->ctx;
    pl_frame_begin(); /* the frame owns our reference; params keeps its own */
    pl_tensor *t = pl_tensor_empty(PL_F32, ndim, shape, ctx->device);
    pl_status st = t ? PL_OK : pl_error_status();
    if (!st) st = pl_tensor_uniform_(t, -bound, bound, ctx->seed, stream);
    if (!st) {
        pl_tensor_set_requires_grad(t, true);
        st = pl_params_add(ctx->params, name, t, tags, role);
    }
    pl_frame_end();
    if (st) return pl_error_prefix(st, "lstm: parameter %s", name);
    *idx = pl_params_count(ctx->params) - 1;
    return PL_OK;
}

pl_status lstm_add_param(lstm_model *m, const char *name, int ndim, const int64_t *shape,
                         double bound, uint64_t stream, unsigned tags, const char *role, int *idx) {
    return add_param(m, name, ndim, shape, bound, stream, tags, role, idx);
}

static pl_tensor *P(const lstm_model *m, int idx) {
    return idx < 0 ? NULL : pl_params_at(m->ctx->params, idx)->t;
}

/* Every option combination the model cannot honour, refused with the
 * option names and values (lstm_create has filled the loader-derived ones). */
static pl_status validate_opts(const lstm_opts *o) {
    if (o->num_layers < 1 || o->num_layers > LSTM_MAX_LAYERS)
        return pl_error_set(PL_ERR_CONFIG, "lstm: num_layers = %d outside [1, %d]", o->num_layers,
                            LSTM_MAX_LAYERS);
    if (o->input_size < 1 || o->hidden_size < 1 || o->output_size < 1 || o->output_size > LSTM_MAX_OUT)
        return pl_error_set(PL_ERR_CONFIG, "lstm: input_size %lld, hidden_size %lld must be >= 1 and "
                            "output_size %lld in [1, %d]", (long long)o->input_size,
                            (long long)o->hidden_size, (long long)o->output_size, LSTM_MAX_OUT);
    if (o->ensemble < 0 || o->ensemble > LSTM_MAX_MEMBERS) /* 0 counts as 1 */
        return pl_error_set(PL_ERR_CONFIG, "lstm: ensemble = %d outside [1, %d]", o->ensemble,
                            LSTM_MAX_MEMBERS);
    bool uses_column = o->seasonal_period > 0 || o->revin != LSTM_REVIN_OFF || o->exogenous_gate;
    if (uses_column && (o->naive_column < 0 || o->naive_column >= o->input_size))
        return pl_error_set(PL_ERR_CONFIG, "lstm: naive_column %lld outside the %lld input features "
                            "(it names the target's input column for seasonal_period, revin and "
                            "exogenous_gate)", (long long)o->naive_column, (long long)o->input_size);
    if (o->naive_skip && (o->seasonal_period <= 0 || o->head != LSTM_HEAD_LAST ||
                          o->output_size != o->horizon || o->horizon > o->seasonal_period))
        return pl_error_set(PL_ERR_CONFIG, "lstm: naive_skip needs seasonal_period > 0 (%lld), head = "
                            "last, one target (output_size %lld = horizon %lld) and horizon <= "
                            "seasonal_period", (long long)o->seasonal_period,
                            (long long)o->output_size, (long long)o->horizon);
    if (o->skip_corrected && !o->naive_skip)
        return pl_error_set(PL_ERR_CONFIG, "lstm: skip_corrected is a form of naive_skip, which is off");
    if (o->revin != LSTM_REVIN_OFF &&
        (o->head != LSTM_HEAD_LAST || o->output_size != o->horizon || !(o->revin_eps > 0)))
        return pl_error_set(PL_ERR_CONFIG, "lstm: revin needs head = last, one target (output_size "
                            "%lld = horizon %lld) and revin_eps > 0 (%g)", (long long)o->output_size,
                            (long long)o->horizon, o->revin_eps);
    if (o->input_diff < 0 || (o->input_diff > 0 && o->head != LSTM_HEAD_LAST))
        return pl_error_set(PL_ERR_CONFIG, "lstm: input_diff %lld must be >= 0, and 0 with head = all",
                            (long long)o->input_diff);
    if (o->stateful && (o->revin != LSTM_REVIN_OFF || o->input_diff > 0 || o->ensemble > 1))
        return pl_error_set(PL_ERR_CONFIG, "lstm: stateful carries the state across windows; revin "
                            "and input_diff (%lld) act on one window, ensemble (%d) > 1 has no carry: "
                            "use one or the other", (long long)o->input_diff, o->ensemble);
    if (o->exogenous_gate && o->input_size < 2)
        return pl_error_set(PL_ERR_CONFIG, "lstm: exogenous_gate gates the columns other than "
                            "naive_column, but input_size = %lld leaves none", (long long)o->input_size);
    return lstm_mf_validate(o); /* multi-timeframe (multiframe.c) */
}

/* The constant [F] tensors of the exogenous gate: onehot(naive_column) and its complement. */
static pl_status make_gate_constants(lstm_model *m) {
    int64_t F = m->o.input_size;
    float *fx = malloc(sizeof(float) * 2 * (size_t)F), *mk = fx ? fx + F : NULL;
    if (!fx) return pl_error_set(PL_ERR_NOMEM, "lstm: out of memory");
    for (int64_t f = 0; f < F; f++) {
        fx[f] = f == m->o.naive_column;
        mk[f] = f != m->o.naive_column;
    }
    pl_status st = PL_OK;
    pl_frame_begin();
    pl_tensor *a = pl_tensor_from_data(PL_F32, 1, &F, fx, m->ctx->device);
    pl_tensor *b = pl_tensor_from_data(PL_F32, 1, &F, mk, m->ctx->device);
    if (a && b) {
        m->gate_fixed = pl_frame_keep(a);
        m->gate_mask = pl_frame_keep(b);
    } else {
        st = pl_error_status();
    }
    pl_frame_end();
    free(fx);
    return st;
}

pl_status lstm_model_new(const lstm_opts *o, pl_run_context *ctx, lstm_model **out) {
    *out = NULL;
    pl_status vst = validate_opts(o);
    if (vst) return vst;
    lstm_model *m = calloc(1, sizeof *m);
    if (!m) return pl_error_set(PL_ERR_NOMEM, "lstm: out of memory");
    m->o = *o;
    if (m->o.ensemble == 0) m->o.ensemble = 1;
    o = &m->o;
    m->ctx = ctx;
    m->carry_split = -1;
    int64_t Hd = o->hidden_size, D = o->bidirectional ? 2 : 1;
    /* the head reads D * Hd features, (1 + n_tf) * Hd with timeframe fields */
    double k = 1.0 / sqrt((double)Hd), kh = 1.0 / sqrt((double)(D * Hd * (1 + o->n_tf)));
    pl_status st = PL_OK;
    /* one member: torch's names (lstm.*, head.*, revin.*); an ensemble:
     * members.<k>.lstm.* etc. Member k draws its init from streams offset by
     * k * 100000, so member 0 starts as the single model with the same seed. */
    for (int e = 0; e < o->ensemble && !st; e++) {
        char pre[32] = "";
        if (o->ensemble > 1) snprintf(pre, sizeof pre, "members.%d.", e);
        uint64_t stream = (uint64_t)e * 100000, s0 = stream;
        m->revin_w[e] = m->revin_b[e] = m->gate[e] = -1;
        for (int l = 0; l < o->num_layers && !st; l++) {
            int64_t in = l == 0 ? o->input_size : D * Hd;
            for (int d = 0; d < D && !st; d++) {
                const char *sfx = d ? "_reverse" : "";
                char name[PL_NAME_MAX];
                snprintf(name, sizeof name, "%slstm.weight_ih_l%d%s", pre, l, sfx);
                st = add_param(m, name, 2, (int64_t[]){4 * Hd, in}, k, stream++, 0, NULL,
                               &m->w_ih[e][l][d]);
                snprintf(name, sizeof name, "%slstm.weight_hh_l%d%s", pre, l, sfx);
                if (!st)
                    st = add_param(m, name, 2, (int64_t[]){4 * Hd, Hd}, k, stream++, 0, NULL,
                                   &m->w_hh[e][l][d]);
                snprintf(name, sizeof name, "%slstm.bias_ih_l%d%s", pre, l, sfx);
                if (!st)
                    st = add_param(m, name, 1, (int64_t[]){4 * Hd}, k, stream++, PL_TAG_NO_DECAY, NULL,
                                   &m->b_ih[e][l][d]);
                snprintf(name, sizeof name, "%slstm.bias_hh_l%d%s", pre, l, sfx);
                if (!st)
                    st = add_param(m, name, 1, (int64_t[]){4 * Hd}, k, stream++, PL_TAG_NO_DECAY, NULL,
                                   &m->b_hh[e][l][d]);
            }
        }
        char name[PL_NAME_MAX];
        snprintf(name, sizeof name, "%shead.weight", pre);
        if (!st)
            st = add_param(m, name, 2, (int64_t[]){o->output_size, D * Hd * (1 + o->n_tf)}, kh,
                           s0 + 1000, 0, "head", &m->head_w[e]);
        snprintf(name, sizeof name, "%shead.bias", pre);
        if (!st)
            st = add_param(m, name, 1, (int64_t[]){o->output_size}, kh, s0 + 1001,
                           PL_TAG_NO_DECAY, "head", &m->head_b[e]);
        /* RevIN affine (per input feature): weight ones, bias zeros, as RevIN's
         * _init_params; tagged no_decay like normalization weights */
        if (!st && o->revin != LSTM_REVIN_OFF && o->revin_affine) {
            snprintf(name, sizeof name, "%srevin.affine_weight", pre);
            st = add_param(m, name, 1, (int64_t[]){o->input_size}, 0, s0 + 1002, PL_TAG_NO_DECAY, NULL,
                           &m->revin_w[e]);
            if (!st) st = pl_tensor_fill_(P(m, m->revin_w[e]), 1.0);
            snprintf(name, sizeof name, "%srevin.affine_bias", pre);
            if (!st)
                st = add_param(m, name, 1, (int64_t[]){o->input_size}, 0, s0 + 1003,
                               PL_TAG_NO_DECAY, NULL, &m->revin_b[e]);
            if (!st) st = pl_tensor_fill_(P(m, m->revin_b[e]), 0.0);
        }
        /* exogenous gate [F], zero at init (the entry of the target column is unused) */
        if (!st && o->exogenous_gate) {
            snprintf(name, sizeof name, "%sinput_gate", pre);
            st = add_param(m, name, 1, (int64_t[]){o->input_size}, 0, s0 + 1004, 0, NULL, &m->gate[e]);
        }
    }
    if (!st && o->exogenous_gate) st = make_gate_constants(m);
    if (!st && o->n_tf) st = lstm_mf_add_params(m); /* multi-timeframe encoders */
    if (st) {
        lstm_model_free(m);
        return st;
    }
    *out = m;
    return PL_OK;
}

void lstm_reset_state(lstm_model *m) {
    for (int l = 0; l < LSTM_MAX_LAYERS; l++) {
        pl_tensor_release(m->h[l]);
        pl_tensor_release(m->c[l]);
        m->h[l] = m->c[l] = NULL;
    }
}

void lstm_model_free(lstm_model *m) {
    if (!m) return;
    lstm_reset_state(m);
    pl_tensor_release(m->gate_fixed);
    pl_tensor_release(m->gate_mask);
    pl_tensor_release(m->drop_ones);
    free(m);
}

/* ---- forward ------------------------------------------------------------------ */

/* Store the final state of layer l (copied into tensors we own). */
static pl_status keep_state(lstm_model *m, int l, pl_tensor *hn, pl_tensor *cn) {
    if (!hn || !cn) return pl_error_status();
    if (!m->h[l] || !pl_tensor_same_shape(m->h[l], hn)) {
        pl_tensor_release(m->h[l]);
        pl_tensor_release(m->c[l]);
        pl_frame_begin();
        m->h[l] = pl_frame_keep(pl_tensor_empty(PL_F32, hn->ndim, hn->shape, hn->device));
        m->c[l] = pl_frame_keep(pl_tensor_empty(PL_F32, cn->ndim, cn->shape, cn->device));
        pl_frame_end();
        if (!m->h[l] || !m->c[l]) return pl_error_status();
    }
    pl_status st = pl_tensor_copy_(m->h[l], hn);
    if (!st) st = pl_tensor_copy_(m->c[l], cn);
    return st;
}

/* The [B, 1, F] ones that feature dropout masks, kept across forwards
 * (rebuilt when the batch size or device changes); borrowed by the caller. */
static pl_tensor *feature_ones(lstm_model *m, int64_t B, pl_device dev) {
    pl_tensor *t = m->drop_ones;
    if (t && t->shape[0] == B && pl_device_eq(t->device, dev)) return t;
    pl_tensor_release(m->drop_ones);
    m->drop_ones = NULL;
    pl_frame_begin();
    t = pl_tensor_empty(PL_F32, 3, (int64_t[]){B, 1, m->o.input_size}, dev);
    if (t && !pl_tensor_fill_(t, 1.0)) m->drop_ones = pl_frame_keep(t);
    pl_frame_end();
    return m->drop_ones;
}

pl_tensor *lstm_predict_member(lstm_model *m, int e, pl_tensor *x, bool training) {
    char b1[256];
    if (!x) return NULL;
    if (x->ndim != 3 || x->shape[2] != m->o.input_size) {
        pl_error_set(PL_ERR_SHAPE, "lstm: input %s, expected [B, T, %lld]", pl_tensor_describe(x, b1, sizeof b1),
                     (long long)m->o.input_size);
        return NULL;
    }
    int64_t B = x->shape[0], T = x->shape[1];
    int D = m->o.bidirectional ? 2 : 1;
    /* dropout counters: member e in the bits above 48 (member 0: as a single model) */
    uint64_t mem = (uint64_t)e << 48, base = (uint64_t)m->ctx->micro_step * LSTM_MAX_LAYERS + mem;
    pl_tensor *xf = x->dtype == PL_F32 ? x : pl_tensor_to(x, PL_F32, x->device);
    int64_t skip_rows = !m->o.naive_skip ? 0 : m->o.seasonal_period + (m->o.skip_corrected ? 1 : 0);
    if (m->o.input_diff >= T || skip_rows > T) {
        pl_error_set(PL_ERR_CONFIG,
                     "lstm: input window of %lld steps, needs more than input_diff %lld and at "
                     "least %lld steps for naive_skip%s (seasonal_period %lld)",
                     (long long)T, (long long)m->o.input_diff, (long long)skip_rows,
                     m->o.skip_corrected ? " = corrected" : "", (long long)m->o.seasonal_period);
        return NULL;
    }
    /* RevIN normalization (Kim et al. 2022, ts-kim/RevIN RevIN.forward(x, 'norm')):
     * mean and stdev over the time axis, detached (computed without a tape) */
    pl_tensor *mu = NULL, *sd = NULL, *xn = xf;
    if (m->o.revin != LSTM_REVIN_OFF) {
        pl_no_grad_begin();
        mu = pl_mean(xf, 1, true);        /* [B, 1, F] */
        if (m->o.revin == LSTM_REVIN_STD) /* sqrt(biased var + eps) */
            sd =
                pl_sqrt(pl_add_scalar(pl_mean(pl_square(pl_sub(xf, mu)), 1, true), m->o.revin_eps));
        pl_no_grad_end();
        xn = pl_sub(xf, mu);
        if (m->o.revin == LSTM_REVIN_STD) xn = pl_div(xn, sd);
        if (m->revin_w[e] >= 0) xn = pl_add(pl_mul(xn, P(m, m->revin_w[e])), P(m, m->revin_b[e]));
        if (!xn) return NULL;
    }
    /* seasonal differencing: x_t - x_{t-p}, t = p .. T-1 */
    int64_t p = m->o.input_diff;
    pl_tensor *h = p > 0 ? pl_sub(pl_slice(xn, 1, p, T), pl_slice(xn, 1, 0, T - p)) : xn;
    int64_t Tl = p > 0 ? T - p : T;
    if (m->gate[e] >= 0) /* x * (onehot(target) + mask * gate): other columns start switched off */
        h = pl_mul(h, pl_add(m->gate_fixed, pl_mul(m->gate_mask, P(m, m->gate[e]))));
    if (training && m->o.feature_dropout > 0) {
        /* nn.Dropout1d over the feature channels: one keep/drop per (window,
         * feature) for all time steps, kept ones scaled by 1 / (1 - p) */
        pl_tensor *ones = feature_ones(m, B, xf->device);
        if (!ones) return NULL;
        h = pl_mul(h, pl_dropout(ones, m->o.feature_dropout, m->ctx->seed,
                                 ((uint64_t)1 << 62) | mem | (uint64_t)m->ctx->micro_step, true));
    }
    /* nn.Dropout on the input (counter slot 0: layers use 1 .. num_layers-1) */
    h = pl_dropout(h, m->o.input_dropout, m->ctx->seed, base, training);
    for (int l = 0; l < m->o.num_layers && h; l++) {
        if (l > 0) h = pl_dropout(h, m->o.dropout, m->ctx->seed, base + (uint64_t)l, training);
        pl_tensor *h0 = NULL, *c0 = NULL, *hn = NULL, *cn = NULL;
        if (m->o.stateful && m->h[l] && m->h[l]->shape[0] == B) {
            h0 = m->h[l];
            c0 = m->c[l];
        }
        pl_tensor *yf = pl_lstm(h, P(m, m->w_ih[e][l][0]), P(m, m->w_hh[e][l][0]),
                                P(m, m->b_ih[e][l][0]), P(m, m->b_hh[e][l][0]), h0, c0, false,
                                m->o.stateful ? &hn : NULL, m->o.stateful ? &cn : NULL);
        if (yf && m->o.stateful && keep_state(m, l, hn, cn)) return NULL;
        if (D == 2) {
            pl_tensor *yb =
                pl_lstm(h, P(m, m->w_ih[e][l][1]), P(m, m->w_hh[e][l][1]), P(m, m->b_ih[e][l][1]),
                        P(m, m->b_hh[e][l][1]), NULL, NULL, true, NULL, NULL);
            pl_tensor *parts[2] = {yf, yb};
            h = yf && yb ? pl_concat(parts, 2, 2) : NULL;
        } else {
            h = yf;
        }
    }
    if (!h) return NULL;
    if (m->o.head == LSTM_HEAD_LAST)
        h = pl_reshape(pl_slice(h, 1, Tl - 1, Tl), 2, (int64_t[]){B, D * m->o.hidden_size});
    pl_tensor *pred = pl_linear(h, P(m, m->head_w[e]), P(m, m->head_b[e]));
    if (m->o.naive_skip) {
        /* + x[:, T-1+h-period, naive_column] for horizon steps h = 1..Ho */
        /* t0 >= 0: the window length was checked above */
        int64_t Ho = m->o.horizon, t0 = T - m->o.seasonal_period, c = m->o.naive_column;
        pl_tensor *xc = pl_slice(xn, 2, c, c + 1); /* [B, T, 1] */
        pl_tensor *base = pl_reshape(pl_slice(xc, 1, t0, t0 + Ho), 2, (int64_t[]){B, Ho});
        if (m->o.skip_corrected) /* + x[:, T-1, c] - x[:, T-1-period, c] for every step */
            base = pl_add(base, pl_reshape(pl_sub(pl_slice(xc, 1, T - 1, T),
                                                  pl_slice(xc, 1, t0 - 1, t0)),
                                           2, (int64_t[]){B, 1}));
        pred = pl_add(pred, base);
    }
    if (m->o.revin != LSTM_REVIN_OFF) {
        /* RevIN de-normalization with the target column's statistics
         * (RevIN._denormalize): (y - b_c) / (w_c + eps^2) * stdev_c + mean_c */
        int64_t c = m->o.naive_column;
        if (m->revin_w[e] >= 0)
            pred = pl_div(pl_sub(pred, pl_slice(P(m, m->revin_b[e]), 0, c, c + 1)),
                          pl_add_scalar(pl_slice(P(m, m->revin_w[e]), 0, c, c + 1),
                                        m->o.revin_eps * m->o.revin_eps));
        if (sd) pred = pl_mul(pred, pl_reshape(pl_slice(sd, 2, c, c + 1), 2, (int64_t[]){B, 1}));
        pred = pl_add(pred, pl_reshape(pl_slice(mu, 2, c, c + 1), 2, (int64_t[]){B, 1}));
    }
    return pred;
}

pl_tensor *lstm_predict(lstm_model *m, pl_tensor *x, bool training) {
    pl_tensor *sum = lstm_predict_member(m, 0, x, training);
    if (m->o.ensemble == 1) return sum;
    for (int e = 1; e < m->o.ensemble && sum; e++)
        sum = pl_add(sum, lstm_predict_member(m, e, x, training));
    return pl_scale(sum, 1.0 / m->o.ensemble);
}

/* ---- metrics ---------------------------------------------------------------------- */

/* Evaluation metrics in the target's original units. pred/target [R, O]
 * standardized on the host; x the input window (for the naive forecast). */
static pl_status add_metrics(lstm_model *m, pl_tensor *pred, pl_tensor *target, pl_tensor *x, bool first,
                             pl_metrics *mt) {
    pl_tensor *hp = pl_tensor_to(pred, PL_F32, PL_CPU), *ht = pl_tensor_to(target, PL_F32, PL_CPU);
    if (!hp || !ht) return pl_error_status();
    const float *p = pl_tensor_data(hp), *y = pl_tensor_data(ht);
    int64_t O = m->o.output_size, R = pl_tensor_numel(hp) / O;
    double ae = 0, se = 0, ape = 0, n_ape = 0;
    for (int64_t r = 0; r < R; r++)
        for (int64_t o = 0; o < O; o++) {
            double pv = p[r * O + o] * m->o.scale[o] + m->o.shift[o];
            double yv = y[r * O + o] * m->o.scale[o] + m->o.shift[o];
            double e = pv - yv;
            ae += fabs(e);
            se += e * e;
            if (fabs(yv) > 1e-6) {
                ape += fabs(e) / fabs(yv);
                n_ape++;
            }
        }
    double n = (double)(R * O);
    pl_metrics_add(mt, "mae", ae, n);
    pl_metrics_add(mt, "mape", 100.0 * ape, n_ape);
    (void)first;
    /* rmse = sqrt(total sse / total n), over batches and data-parallel ranks */
    pl_metrics_add_rms(mt, "rmse", se, n);

    if (m->o.seasonal_period > 0 && m->o.head == LSTM_HEAD_LAST) {
        int64_t T = x->shape[1], Ho = m->o.horizon, Kt = O / Ho, B = x->shape[0];
        pl_tensor *hx = pl_tensor_to(x, PL_F32, PL_CPU);
        if (!hx) return pl_error_status();
        const float *xv = pl_tensor_data(hx);
        int64_t F = x->shape[2];
        /* seasonal naive y[t - s] and, when the window holds y[T-1-s], the same
         * corrected by the last step's seasonal difference y[T-1] - y[T-1-s] */
        int64_t s = m->o.seasonal_period, c = m->o.naive_column;
        bool corrected = s < T;
        double nae = 0, cae = 0;
        for (int64_t b = 0; b < B; b++)
            for (int64_t hs = 1; hs <= Ho; hs++) {
                const float *xb = xv + b * T * F;
                double fc = xb[(T - 1 + hs - s) * F + c] * m->o.scale[0] + m->o.shift[0];
                double yv = y[b * O + (hs - 1) * Kt] * m->o.scale[0] + m->o.shift[0];
                nae += fabs(fc - yv);
                if (corrected) {
                    double d = (xb[(T - 1) * F + c] - xb[(T - 1 - s) * F + c]) * m->o.scale[0];
                    cae += fabs(fc + d - yv);
                }
            }
        pl_metrics_add(mt, "seasonal_naive_mae", nae, (double)(B * Ho));
        if (corrected) pl_metrics_add(mt, "seasonal_naive_corrected_mae", cae, (double)(B * Ho));
    }
    return PL_OK;
}

/* ---- plugin ------------------------------------------------------------------------ */

static const pl_option_spec lstm_options[] = {
    {"hidden_size", PL_OPT_INT, "64", 1, 1e6, NULL, "hidden units per direction"},
    {"num_layers", PL_OPT_INT, "1", 1, LSTM_MAX_LAYERS, NULL, "stacked LSTM layers"},
    {"dropout", PL_OPT_FLOAT, "0", 0, 0.99, NULL,
     "dropout on the outputs of every layer but the last"},
    {"bidirectional", PL_OPT_BOOL, "false", PL_NO_BOUNDS, NULL,
     "add a reverse-time direction per layer"},
    {"head", PL_OPT_CHOICE, "last", PL_NO_BOUNDS, "last|all",
     "linear head on the last step (target [B, O]) or on every step (target [B, T, O])"},
    {"stateful", PL_OPT_BOOL, "false", PL_NO_BOUNDS, NULL,
     "carry (h, c) across consecutive batches (truncated BPTT; loader must not shuffle)"},
    {"loss", PL_OPT_CHOICE, "mse", PL_NO_BOUNDS, "mse|mae|huber",
     "training loss (standardized units)"},
    {"huber_delta", PL_OPT_FLOAT, "1.0", 1e-12, 1e9, NULL, "delta of the huber loss"},
    {"input_size", PL_OPT_INT, "0", 0, 1e9, NULL, "input features (0: the loader's num_features)"},
    {"output_size", PL_OPT_INT, "0", 0, LSTM_MAX_OUT, NULL,
     "outputs per prediction (0: num_targets x horizon for head = last, num_targets for all)"},
    {"seasonal_period", PL_OPT_INT, "0", 0, 1e6, NULL,
     "report seasonal_naive_mae with this period in steps (7: same weekday last week); 0: off"},
    {"naive_column", PL_OPT_INT, "-1", -1, 1e6, NULL,
     "input feature column that holds the target (standardized like the target), for the naive "
     "forecast; -1: derived from [data] target_columns among feature_columns (0 if the loader "
     "does not say)"},
    {"naive_skip", PL_OPT_CHOICE, "false", PL_NO_BOUNDS, "false|true|corrected|auto",
     "add a naive forecast to the output, the network predicts the correction: true the seasonal "
     "naive y[t-s], corrected y[t-s] + (y[T-1] - y[T-1-s]), auto the one of the two with the "
     "lower MAE on the training windows (the loader's meta, [data] naive_period = "
     "seasonal_period) (head = last, one target, horizon <= seasonal_period)"},
    {"revin", PL_OPT_CHOICE, "off", PL_NO_BOUNDS, "off|mean|std",
     "reversible instance normalization of every input window and feature (Kim et al. 2022): "
     "subtract the "
     "window mean (mean) and divide by sqrt(var + eps) (std); the output gets the target column's "
     "back "
     "(head = last, one target, target in input column naive_column)"},
    {"revin_affine", PL_OPT_BOOL, "false", PL_NO_BOUNDS, NULL,
     "learnable per-feature scale and shift after the RevIN normalization "
     "(revin.affine_weight/_bias)"},
    {"revin_eps", PL_OPT_FLOAT, "1e-5", 1e-12, 1, NULL, "eps of the RevIN stdev sqrt(var + eps)"},
    {"input_diff", PL_OPT_INT, "0", 0, 1e6, NULL,
     "> 0: the LSTM reads x_t - x_{t-input_diff} (seasonal differencing, T - input_diff steps, "
     "after revin)"},
    {"input_dropout", PL_OPT_FLOAT, "0", 0, 0.99, NULL,
     "dropout on the LSTM input values (nn.Dropout, after revin / input_diff)"},
    {"exogenous_gate", PL_OPT_BOOL, "false", PL_NO_BOUNDS, NULL,
     "multiply every input column but naive_column by a learnable gate that starts at 0 "
     "(input_gate; shrink it with an optimizer group's weight_decay)"},
    {"feature_dropout", PL_OPT_FLOAT, "0", 0, 0.99, NULL,
     "drop whole input features of a window (all its time steps; nn.Dropout1d over features)"},
    {"ensemble", PL_OPT_INT, "1", 1, LSTM_MAX_MEMBERS, NULL,
     "independent networks (own init, dropout masks and loss) whose forecasts are averaged"},
    {"input_field", PL_OPT_STRING, "x", PL_NO_BOUNDS, NULL, "batch field with inputs [B, T, F]"},
    {"target_field", PL_OPT_STRING, "y", PL_NO_BOUNDS, NULL, "batch field with targets"},
    {"timeframe_fields", PL_OPT_STRING, "", PL_NO_BOUNDS, NULL,
     "further input fields [B, T_j, F] (hdf5_series timeframes: 'x_tf4,x_tf24'), each encoded by "
     "its own LSTM stack; the head reads the joined last states (multiframe.c)"},
    {"return_metrics", PL_OPT_BOOL, "false", PL_NO_BOUNDS, NULL,
     "the target is a return: also report persistence_mae (no change), dir_acc, last_return_mae "
     "and last_return_dir_acc (last input value of naive_column)"},
    PL_OPTIONS_END};

static pl_status meta_int_or(const pl_meta *mt, const char *k, int64_t fallback, int64_t *v) {
    if (pl_meta_get_int(mt, k, v) == PL_OK) return PL_OK;
    pl_error_clear();
    *v = fallback;
    return PL_OK;
}

static double meta_float_or(const pl_meta *mt, const char *k, double fallback) {
    double v;
    if (pl_meta_get_float(mt, k, &v) == PL_OK) return v;
    pl_error_clear();
    return fallback;
}

/* naive_skip = auto: the baseline with the lower MAE over the training
 * windows, as the loader measured them (hdf5_series naive_period), decided
 * before training; ties keep the plain seasonal naive. The choice is logged
 * and recorded in the run's meta (summary.json "data"). */
static pl_status choose_naive_skip(const pl_config_section *cfg, pl_run_context *ctx,
                                   lstm_opts *o) {
    int64_t np = 0;
    double nae = 0, cae = 0;
    bool have = pl_meta_get_int(ctx->meta, "naive_period", &np) == PL_OK &&
                pl_meta_get_float(ctx->meta, "train_seasonal_naive_mae", &nae) == PL_OK &&
                pl_meta_get_float(ctx->meta, "train_seasonal_naive_corrected_mae", &cae) == PL_OK;
    if (!have) {
        pl_error_clear();
        pl_hint_set("set [data] naive_period = %lld (hdf5_series)",
                    (long long)o->seasonal_period);
        return pl_error_set(PL_ERR_CONFIG,
                            "lstm: naive_skip = auto (%s) compares the two baselines' "
                            "MAE on the training windows, which the loader publishes as meta "
                            "naive_period, train_seasonal_naive_mae and "
                            "train_seasonal_naive_corrected_mae; the run's meta has none",
                            pl_cfg_origin(cfg, "naive_skip"));
    }
    if (np != o->seasonal_period)
        return pl_error_set(PL_ERR_CONFIG,
                            "lstm: naive_skip = auto with seasonal_period = %lld (%s): "
                            "the loader measured the baselines with naive_period = %lld",
                            (long long)o->seasonal_period, pl_cfg_origin(cfg, "seasonal_period"),
                            (long long)np);
    o->naive_skip = true;
    o->skip_corrected = cae < nae;
    pl_message("lstm: naive_skip = auto: training-window MAE seasonal naive %.6g, corrected %.6g "
               "(period %lld): starting from the %s",
               nae, cae, (long long)np,
               o->skip_corrected ? "corrected one (corrected)" : "seasonal naive (true)");
    return pl_meta_set_str(ctx->meta, "naive_skip_auto", o->skip_corrected ? "corrected" : "true");
}

static pl_status lstm_create(const pl_config_section *cfg, pl_run_context *ctx, void **self) {
    lstm_opts o = {
        .input_size = pl_cfg_int(cfg, "input_size", 0),
        .hidden_size = pl_cfg_int(cfg, "hidden_size", 64),
        .output_size = pl_cfg_int(cfg, "output_size", 0),
        .num_layers = (int)pl_cfg_int(cfg, "num_layers", 1),
        .dropout = pl_cfg_float(cfg, "dropout", 0),
        .bidirectional = pl_cfg_bool(cfg, "bidirectional", false),
        .head = strcmp(pl_cfg_str(cfg, "head", "last"), "all") ? LSTM_HEAD_LAST : LSTM_HEAD_ALL,
        .stateful = pl_cfg_bool(cfg, "stateful", false),
        .huber_delta = pl_cfg_float(cfg, "huber_delta", 1.0),
        .seasonal_period = pl_cfg_int(cfg, "seasonal_period", 0),
        .naive_column = pl_cfg_int(cfg, "naive_column", -1),
        .naive_skip = strcmp(pl_cfg_str(cfg, "naive_skip", "false"), "false") != 0,
        .skip_corrected = !strcmp(pl_cfg_str(cfg, "naive_skip", "false"), "corrected"),
        .revin_affine = pl_cfg_bool(cfg, "revin_affine", false),
        .revin_eps = pl_cfg_float(cfg, "revin_eps", 1e-5),
        .input_diff = pl_cfg_int(cfg, "input_diff", 0),
        .input_dropout = pl_cfg_float(cfg, "input_dropout", 0),
        .feature_dropout = pl_cfg_float(cfg, "feature_dropout", 0),
        .exogenous_gate = pl_cfg_bool(cfg, "exogenous_gate", false),
        .ensemble = (int)pl_cfg_int(cfg, "ensemble", 1),
        .input_field = pl_cfg_str(cfg, "input_field", "x"),
        .target_field = pl_cfg_str(cfg, "target_field", "y"),
        .return_metrics = pl_cfg_bool(cfg, "return_metrics", false),
    };
    pl_status fst = lstm_mf_parse_fields(pl_cfg_str(cfg, "timeframe_fields", ""), &o);
    if (fst) return fst;
    const char *loss = pl_cfg_str(cfg, "loss", "mse");
    o.loss = !strcmp(loss, "mae") ? LSTM_LOSS_MAE : !strcmp(loss, "huber") ? LSTM_LOSS_HUBER : LSTM_LOSS_MSE;
    const char *revin = pl_cfg_str(cfg, "revin", "off");
    o.revin = !strcmp(revin, "mean")  ? LSTM_REVIN_MEAN
              : !strcmp(revin, "std") ? LSTM_REVIN_STD
                                      : LSTM_REVIN_OFF;
    pl_status st = PL_OK;
    if (!strcmp(pl_cfg_str(cfg, "naive_skip", "false"), "auto") &&
        (st = choose_naive_skip(cfg, ctx, &o)))
        return st;
    if (!o.input_size) st = pl_meta_get_int(ctx->meta, "num_features", &o.input_size);
    if (st) return pl_error_prefix(st, "lstm: set input_size or use a loader that publishes num_features");
    /* the target's input column from [data] (checked against an explicit
     * naive_column by batch_needs before the run) */
    lstm_data_facts facts;
    lstm_data_facts_read(cfg, &facts);
    if (o.naive_column < 0) o.naive_column = facts.target_input >= 0 ? facts.target_input : 0;
    if (o.exogenous_gate && o.input_size < 2) {
        /* warned by batch_needs; the gated model of one column is the plain one */
        pl_message("lstm: exogenous_gate: one input column, nothing to gate; the model runs "
                   "without the gate");
        o.exogenous_gate = false;
    }
    int64_t nt, horizon;
    meta_int_or(ctx->meta, "num_targets", 1, &nt);
    meta_int_or(ctx->meta, "horizon", 1, &horizon);
    o.horizon = o.head == LSTM_HEAD_LAST ? horizon : 1;
    if (!o.output_size) o.output_size = o.head == LSTM_HEAD_LAST ? nt * horizon : nt;
    if (o.output_size > LSTM_MAX_OUT)
        return pl_error_set(PL_ERR_CONFIG, "lstm: %lld outputs, at most %d", (long long)o.output_size,
                            LSTM_MAX_OUT);
    /* output o predicts target column o % nt (loader layout [horizon, num_targets]) */
    for (int64_t i = 0; i < o.output_size; i++) {
        char k[64];
        int64_t col = nt > 0 ? i % nt : 0;
        snprintf(k, sizeof k, "target_mean_%lld", (long long)col);
        o.shift[i] = meta_float_or(ctx->meta, k, meta_float_or(ctx->meta, "target_mean", 0.0));
        snprintf(k, sizeof k, "target_std_%lld", (long long)col);
        o.scale[i] = meta_float_or(ctx->meta, k, meta_float_or(ctx->meta, "target_std", 1.0));
    }
    lstm_model *m;
    st = lstm_model_new(&o, ctx, &m);
    if (!st) *self = m;
    return st;
}

static void lstm_destroy(void *self) { lstm_model_free(self); }

static pl_tensor *train_loss(const lstm_model *m, pl_tensor *pred, pl_tensor *target) {
    switch (m->o.loss) {
    case LSTM_LOSS_MAE: return pl_mae_loss(pred, target);
    case LSTM_LOSS_HUBER: return pl_huber_loss(pred, target, m->o.huber_delta);
    default: return pl_mse_loss(pred, target);
    }
}

static pl_status lstm_forward(void *self, const pl_batch *b, pl_data_split split, bool training,
                              pl_tensor **loss_out, pl_metrics *metrics) {
    char b1[256], b2[256];
    lstm_model *m = self;
    pl_tensor *x = pl_batch_get(b, m->o.input_field), *y = pl_batch_get(b, m->o.target_field);
    if (!x || !y) return pl_error_prefix(pl_error_status(), "lstm");
    if (x->ndim != 3)
        return pl_error_set(PL_ERR_SHAPE, "lstm: input '%s' %s must be [B, T, F]", m->o.input_field,
                            pl_tensor_describe(x, b1, sizeof b1));
    int64_t B = x->shape[0], T = x->shape[1], O = m->o.output_size;
    if (m->o.stateful && (b->index == 0 || (int)split != m->carry_split || training != m->carry_training ||
                          B != m->carry_batch))
        lstm_reset_state(m);
    m->carry_split = (int)split;
    m->carry_training = training;
    m->carry_batch = B;
    if (m->o.seasonal_period > T)
        return pl_error_set(PL_ERR_CONFIG, "lstm: seasonal_period %lld longer than the input window %lld",
                            (long long)m->o.seasonal_period, (long long)T);
    int64_t rows = m->o.head == LSTM_HEAD_LAST ? B : B * T;
    if (pl_tensor_numel(y) != rows * O)
        return pl_error_set(PL_ERR_SHAPE, "lstm: target '%s' %s has %lld values; head = %s with %lld "
                            "outputs needs %lld (input %s)", m->o.target_field,
                            pl_tensor_describe(y, b1, sizeof b1), (long long)pl_tensor_numel(y),
                            m->o.head == LSTM_HEAD_LAST ? "last" : "all", (long long)O,
                            (long long)(rows * O), pl_tensor_describe(x, b2, sizeof b2));
    /* training an ensemble: the mean of the members' own losses (each
     * member's gradient comes from its own forecast only); evaluation: the
     * loss of the averaged forecast */
    bool per_member = training && m->o.ensemble > 1;
    pl_tensor *pred = m->o.n_tf   ? lstm_mf_predict(m, b, training) /* multiframe.c */
                      : per_member ? lstm_predict_member(m, 0, x, true)
                                   : lstm_predict(m, x, training);
    if (!pred) return pl_error_prefix(pl_error_status(), "lstm forward");
    pl_tensor *target = y->dtype == PL_F32 ? y : pl_tensor_to(y, PL_F32, y->device);
    target = pl_reshape(pl_contiguous(target), pred->ndim, pred->shape);
    pl_tensor *loss = train_loss(m, pred, target);
    if (per_member) {
        for (int e = 1; e < m->o.ensemble; e++)
            loss = pl_add(loss, train_loss(m, lstm_predict_member(m, e, x, true), target));
        loss = pl_scale(loss, 1.0 / m->o.ensemble);
    }
    if (!loss) return pl_error_prefix(pl_error_status(), "lstm loss");
    *loss_out = loss;
    if (training || !metrics) return PL_OK;
    double n = (double)(rows * O);
    pl_metrics_add(metrics, "loss", pl_tensor_item(loss) * n, n);
    pl_status mst = add_metrics(m, pred, target, x, b->index == 0, metrics);
    return mst ? mst : lstm_return_metrics(m, pred, target, x, metrics); /* multiframe.c */
}

/* Windows [B, T, F] of a series and their targets (any float shape). */
static pl_status lstm_batch_needs(const pl_config_section *cfg, pl_field_list *out) {
    pl_status st = pl_fields_add(out, pl_cfg_str(cfg, "input_field", "x"), PL_DTYPE_FLOAT, 3, false);
    if (!st) st = pl_fields_add(out, pl_cfg_str(cfg, "target_field", "y"), PL_DTYPE_FLOAT, -1, false);
    if (st) return st;
    /* `pipeline check` time (and the trainer's, before it builds anything):
     * the options that must agree with [data] */
    lstm_data_facts facts;
    lstm_data_facts_read(cfg, &facts);
    st = lstm_check_against_data(cfg, &facts);
    return st ? st : lstm_mf_needs(cfg, out);
}

/* ---- pipeline predict ------------------------------------------------------------------
 * The forecast of every window of the split, in the target's original units
 * (v * std + mean with the statistics the loader published: for `pipeline
 * predict` those of the run's standardization.json), and the window's
 * targets the same way when the input has them. OUT.h5 (docs/run-files.md):
 *   forecast f32 [N, horizon, num_targets]  (head = all: [N, T, outputs])
 *   target   f32, the same shape             (when the batches carry targets)
 *   row      i64 [N]                         the window's index in the split */

static pl_status lstm_predict_needs(const pl_config_section *cfg, pl_field_list *out) {
    pl_status st = pl_fields_add(out, pl_cfg_str(cfg, "input_field", "x"), PL_DTYPE_FLOAT, 3, false);
    if (!st) st = pl_fields_add(out, pl_cfg_str(cfg, "target_field", "y"), PL_DTYPE_FLOAT, -1, true);
    return st ? st : lstm_mf_needs(cfg, out);
}

static pl_status lstm_outputs_begin(void *self, pl_outputs_purpose purpose, pl_outputs *out) {
    (void)out;
    lstm_model *m = self;
    if (purpose != PL_OUTPUTS_PREDICT)
        return pl_error_set(PL_ERR_UNSUPPORTED, "lstm: no outputs but predict's");
    m->pred_rows = 0;
    return PL_OK;
}

/* [B*S, O] standardized values -> a new f32 CPU tensor [B, S', O'] in
 * original units (output o: v * scale[o] + shift[o]); the frame owns it. */
static pl_tensor *original_units(const lstm_model *m, pl_tensor *v, int64_t B) {
    pl_tensor *h = pl_contiguous(pl_tensor_to(v, PL_F32, PL_CPU));
    if (!h) return NULL;
    int64_t O = m->o.output_size, R = pl_tensor_numel(h) / O;
    int64_t shape[3] = {B, m->o.horizon, O / m->o.horizon}; /* head = last: [horizon, targets] */
    if (m->o.head == LSTM_HEAD_ALL) shape[1] = R / B, shape[2] = O;
    pl_tensor *out = pl_tensor_empty(PL_F32, 3, shape, PL_CPU);
    if (!out) return NULL;
    const float *src = pl_tensor_f32(h);
    float *dst = pl_tensor_data(out);
    for (int64_t r = 0; r < R; r++)
        for (int64_t o = 0; o < O; o++)
            dst[r * O + o] = (float)(src[r * O + o] * m->o.scale[o] + m->o.shift[o]);
    return out;
}

static pl_status lstm_outputs_batch(void *self, pl_outputs_purpose purpose, const pl_batch *b,
                                    pl_data_split split, pl_outputs *out) {
    (void)purpose;
    char d1[256];
    lstm_model *m = self;
    pl_tensor *x = pl_batch_get(b, m->o.input_field);
    if (!x) return pl_error_prefix(pl_error_status(), "lstm");
    pl_error_clear();
    pl_tensor *y = NULL;
    for (int i = 0; i < b->n; i++)
        if (!strcmp(b->names[i], m->o.target_field)) y = b->fields[i];
    if (x->ndim != 3)
        return pl_error_set(PL_ERR_SHAPE, "lstm: input '%s' %s must be [B, T, F]", m->o.input_field,
                            pl_tensor_describe(x, d1, sizeof d1));
    int64_t B = x->shape[0], O = m->o.output_size;
    int64_t rows = m->o.head == LSTM_HEAD_LAST ? B : B * x->shape[1];
    if (y && pl_tensor_numel(y) != rows * O)
        return pl_error_set(PL_ERR_SHAPE, "lstm: target '%s' %s: expected %lld values",
                            m->o.target_field, pl_tensor_describe(y, d1, sizeof d1),
                            (long long)(rows * O));
    /* the stateful carry as in evaluation */
    if (m->o.stateful && (b->index == 0 || (int)split != m->carry_split || m->carry_training ||
                          B != m->carry_batch))
        lstm_reset_state(m);
    m->carry_split = (int)split;
    m->carry_training = false;
    m->carry_batch = B;
    pl_tensor *pred = m->o.n_tf ? lstm_mf_predict(m, b, false) : lstm_predict(m, x, false);
    if (!pred) return pl_error_prefix(pl_error_status(), "lstm predict");
    int64_t *ri = malloc((size_t)(B ? B : 1) * sizeof *ri);
    if (!ri) return pl_error_set(PL_ERR_NOMEM, "lstm: out of memory");
    for (int64_t i = 0; i < B; i++) ri[i] = m->pred_rows + i;
    pl_status st = pl_outputs_add(out, "forecast", original_units(m, pred, B));
    if (!st && y) st = pl_outputs_add(out, "target", original_units(m, y, B));
    if (!st)
        st = pl_outputs_add(out, "row", pl_tensor_from_data(PL_I64, 1, (int64_t[]){B}, ri, PL_CPU));
    if (!st) m->pred_rows += B;
    free(ri);
    return st;
}

static const pl_model_vtable lstm_vtable = {
    .create = lstm_create,
    .destroy = lstm_destroy,
    .forward = lstm_forward,
    .batch_needs = lstm_batch_needs,
    .predict_needs = lstm_predict_needs,
    .outputs_begin = lstm_outputs_begin,
    .outputs_batch = lstm_outputs_batch,
};

PL_PLUGIN_DEFINE(lstm, PL_KIND_MODEL, "1.0.0",
                 "multi-layer (bi)LSTM forecaster with a linear head (torch.nn.LSTM equations)",
                 lstm_options, &lstm_vtable)
