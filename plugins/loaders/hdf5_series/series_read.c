/* series_read.c - hdf5_series: one [T, F] series read once at create;
 * window w has inputs rows [w, w + window) of the feature columns and
 * targets rows [w + window, w + window + horizon) of the target columns.
 * Splits by date (train_end / val_end: a window belongs to the split of its
 * last target row) or by row fractions; optional standardization with
 * training-range statistics. With timeframes, every window ends at the same
 * last input row in each timeframe (timeframes.c).
 *
 * sr_open_series runs the steps in order over one `series_read` (what the
 * steps pass on: the raw series, its columns, the split rows, statistics),
 * each step a function below.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hdf5_series.h"

typedef struct column_ctx {
    series_loader *L;
    const char *key;
    char (*names)[64];
    int nnames;
    int64_t F;
    int *idx, *n;
} column_ctx;

static pl_status add_column(const char *tok, int index, void *ud) {
    (void)index;
    column_ctx *x = ud;
    int c = -1;
    for (int i = 0; i < x->nnames; i++)
        if (!strcmp(x->names[i], tok)) c = i;
    if (c < 0) {
        char *end;
        long v = strtol(tok, &end, 10);
        if (*end == 0 && v >= 0 && v < x->F) c = (int)v;
    }
    if (c < 0)
        return pl_error_set(PL_ERR_CONFIG,
                            "hdf5_series: %s: column '%s' is neither a name in %s "
                            "nor an index 0..%lld",
                            x->key, tok, x->L->path, (long long)x->F - 1);
    if (*x->n >= 1024)
        return pl_error_set(PL_ERR_CONFIG, "hdf5_series: %s: too many columns", x->key);
    x->idx[(*x->n)++] = c;
    return PL_OK;
}

/* "ridership,3" -> column indices. */
static pl_status parse_columns(series_loader *L, const char *key, const char *spec,
                               char names[][64], int nnames, int64_t F, int *idx, int *n) {
    *n = 0;
    column_ctx x = {L, key, names, nnames, F, idx, n};
    char what[128];
    snprintf(what, sizeof what, "hdf5_series: %s", key);
    pl_status st = pl_cfg_list(spec, what, add_column, &x, NULL);
    if (st) return st;
    if (*n == 0) return pl_error_set(PL_ERR_CONFIG, "hdf5_series: %s is empty", key);
    return PL_OK;
}

/* What the steps of sr_open_series hand on to each other. */
typedef struct series_read {
    char sname[SR_NAME_LEN]; /* the series dataset */
    pl_tensor *rawt;         /* [T, F] f32 as read */
    const float *raw;
    int64_t T, F;
    char (*names)[64]; /* column names (attribute `columns`), nnames of them */
    int nnames;
    int *fcols, *tcols, nfc, ntc; /* feature / target column indices */
    int *allc, nall;              /* fcols then tcols */
    sr_timeframes tf;
    int64_t W, H, Lb, nwin; /* window, horizon, lookback, windows in the series */
    int64_t a, b;           /* train rows [0, a), val [a, b), test [b, T) */
    int64_t *date;          /* row times (NULL: none) */
    bool secs;              /* date holds seconds (else days) */
    char dname[SR_NAME_LEN];
    double *mean, *sd; /* per allc column */
    bool stdz, predict, multi;
} series_read;

static void read_free(series_read *r) {
    pl_tensor_release(r->rawt);
    free(r->date);
    free(r->mean);
    free(r->sd);
    free(r->allc);
    free(r->fcols);
    free(r->tcols);
    free(r->names);
}

/* The series, its column names, the feature and target columns; NaN / Inf in
 * a used column is refused (README "Missing values"), other columns are
 * never read. */
static pl_status read_columns(series_loader *L, const pl_config_section *cfg, series_read *r) {
    lk_join_path(r->sname, sizeof r->sname, "/", pl_cfg_str(cfg, "series", "series"));
    pl_status st = pl_h5_read_tensor(L->path, L->file, r->sname, PL_F32, &r->rawt);
    if (st) return st;
    if (r->rawt->ndim != 2)
        return pl_error_set(PL_ERR_SHAPE, "%s: series dataset '%s' has rank %d; expected [T, F]",
                            L->path, r->sname, r->rawt->ndim);
    r->T = r->rawt->shape[0];
    r->F = r->rawt->shape[1];
    r->raw = pl_tensor_f32(r->rawt);
    r->names = calloc((size_t)(r->F > 0 ? r->F : 1), 64);
    r->fcols = malloc(sizeof *r->fcols * SR_MAX_COLS);
    r->tcols = malloc(sizeof *r->tcols * SR_MAX_COLS);
    if (!r->names || !r->fcols || !r->tcols)
        return pl_error_set(PL_ERR_NOMEM, "%s: out of memory", L->path);
    L->st.bytes_read += (uint64_t)(r->T * r->F) * 4;
    r->nnames = pl_h5_column_names(L->file, r->sname, r->names, (int)r->F);
    const char *fspec = pl_cfg_str(cfg, "feature_columns", "");
    if (!fspec[0]) {
        r->nfc = (int)(r->F < SR_MAX_COLS ? r->F : SR_MAX_COLS);
        for (int i = 0; i < r->nfc; i++)
            r->fcols[i] = i;
    } else if ((st = parse_columns(L, "feature_columns", fspec, r->names, r->nnames, r->F, r->fcols,
                                   &r->nfc))) {
        return st;
    }
    if ((st = parse_columns(L, "target_columns", pl_cfg_str(cfg, "target_columns", "0"), r->names,
                            r->nnames, r->F, r->tcols, &r->ntc)))
        return st;
    bool *used = calloc((size_t)(r->F > 0 ? r->F : 1), sizeof *used);
    if (!used) return pl_error_set(PL_ERR_NOMEM, "%s: out of memory", L->path);
    for (int i = 0; i < r->nfc; i++)
        used[r->fcols[i]] = true;
    for (int i = 0; i < r->ntc; i++)
        used[r->tcols[i]] = true;
    st = pl_h5_check_finite(L->path, r->sname, PL_F32, r->raw, 0, r->T, 2, r->rawt->shape, used,
                            (const char(*)[64])r->names, r->nnames);
    free(used);
    return st;
}

/* Window, horizon, the timeframes and how far back a window reaches. */
static pl_status size_windows(series_loader *L, const pl_config_section *cfg, series_read *r) {
    r->H = pl_cfg_int(cfg, "horizon", 1);
    pl_status st = sr_parse_timeframes(cfg, &r->tf);
    if (st) return st;
    r->W = r->tf.w[0];
    r->multi = r->tf.n > 1 || r->tf.k[0] > 1;
    /* a window's inputs reach back Lb rows: its last input row is w + Lb - 1 */
    r->Lb = 0;
    for (int i = 0; i < r->tf.n; i++)
        if (r->tf.k[i] * r->tf.w[i] > r->Lb) r->Lb = r->tf.k[i] * r->tf.w[i];
    r->nwin = r->T - r->Lb - r->H + 1;
    if (r->nwin > 0) return PL_OK;
    if (r->multi)
        return pl_error_set(PL_ERR_CONFIG,
                            "%s: series '%s' has %lld rows; the timeframes reach back %lld rows "
                            "(the largest bars x window) + horizon %lld needs more",
                            L->path, r->sname, (long long)r->T, (long long)r->Lb, (long long)r->H);
    return pl_error_set(PL_ERR_CONFIG,
                        "%s: series '%s' has %lld rows; window %lld + horizon %lld needs more",
                        L->path, r->sname, (long long)r->T, (long long)r->W, (long long)r->H);
}

/* train_end / val_end: the split rows a, b from the row times. */
static pl_status split_by_date(series_loader *L, const pl_config_section *cfg, series_read *r,
                               const char *te, const char *ve) {
    int64_t d_te, d_ve = INT64_MAX, s_te = 0, s_ve = INT64_MAX;
    bool t_te = false, t_ve = false;
    pl_status st = sr_parse_bound("train_end", te, &d_te, &s_te, &t_te);
    if (!st && ve[0]) st = sr_parse_bound("val_end", ve, &d_ve, &s_ve, &t_ve);
    if (!st)
        st = sr_read_row_times(L, cfg, r->T, r->sname, true, &r->date, &r->secs, r->dname,
                               sizeof r->dname);
    if (st) return st;
    if (!r->secs && (t_te || t_ve))
        return pl_error_set(PL_ERR_CONFIG,
                            "hdf5_series: %s = %s has a time of day, but %s holds calendar days "
                            "('%s'; no time dataset '%s'): give a date YYYY-MM-DD",
                            t_te ? "train_end" : "val_end", t_te ? te : ve, L->path, r->dname,
                            pl_cfg_str(cfg, "time_dataset", "time"));
    /* the inclusive bounds in the file's unit; a date bound on seconds is its whole day */
    int64_t e_te = r->secs ? (t_te ? s_te : d_te * 86400 + 86399) : d_te;
    int64_t e_ve = !ve[0] ? INT64_MAX : r->secs ? (t_ve ? s_ve : d_ve * 86400 + 86399) : d_ve;
    if (e_ve < e_te)
        return pl_error_set(PL_ERR_CONFIG, "hdf5_series: val_end %s is before train_end %s", ve,
                            te);
    r->a = 0;
    while (r->a < r->T && r->date[r->a] <= e_te)
        r->a++;
    r->b = r->a;
    while (r->b < r->T && r->date[r->b] <= e_ve)
        r->b++;
    return PL_OK;
}

/* The split rows a, b: by date (train_end / val_end) or split_fractions;
 * multi-timeframe rows must be regular bars. */
static pl_status split_rows(series_loader *L, const pl_config_section *cfg, series_read *r) {
    const char *fr = pl_cfg_str(cfg, "split_fractions", "");
    const char *te = pl_cfg_str(cfg, "train_end", ""), *ve = pl_cfg_str(cfg, "val_end", "");
    pl_status st;
    if (te[0]) {
        if ((st = split_by_date(L, cfg, r, te, ve))) return st;
    } else if (fr[0]) {
        double f3[3];
        if ((st = lk_parse_fractions("hdf5_series", fr, f3))) return st;
        r->a = (int64_t)floor(f3[0] * (double)r->T + 0.5);
        r->b = r->a + (int64_t)floor(f3[1] * (double)r->T + 0.5);
        if (r->b > r->T) r->b = r->T;
        /* the times only name the splits' spans on the data line (and are checked with
         * timeframes) */
        if ((st = sr_read_row_times(L, cfg, r->T, r->sname, false, &r->date, &r->secs, r->dname,
                                    sizeof r->dname)))
            return st;
        for (int64_t i = 1; r->date && !r->multi && i < r->T; i++)
            if (r->date[i] < r->date[i - 1]) { /* unsorted: no span (fractions split by row) */
                free(r->date);
                r->date = NULL;
            }
    } else {
        return pl_error_set(PL_ERR_CONFIG,
                            "hdf5_series: window = %lld needs train_end (and val_end) or "
                            "split_fractions",
                            (long long)r->W);
    }
    return r->multi ? sr_check_regular(L, r->date, r->T, r->secs, r->dname) : PL_OK;
}

/* The splits' windows: a window w belongs to the split of its last target
 * row w + Lb + H - 1. */
static pl_status cut_windows(series_loader *L, series_read *r) {
    int64_t Lb = r->Lb, H = r->H;
    int64_t cut[4] = {0, r->a - Lb - H + 1, r->b - Lb - H + 1, r->nwin};
    for (int k = 1; k < 3; k++) {
        if (cut[k] < 0) cut[k] = 0;
        if (cut[k] > r->nwin) cut[k] = r->nwin;
    }
    if (cut[2] < cut[1]) cut[2] = cut[1];
    for (int si = 0; si < PL_SPLIT_COUNT; si++) {
        series_split *s = &L->sp[si];
        s->w0 = cut[si];
        s->w1 = cut[si + 1];
        s->nrows = s->w1 - s->w0;
        s->present = s->nrows > 0;
        snprintf(s->where, sizeof s->where, "windows %lld..%lld of %s", (long long)s->w0,
                 (long long)s->w1, r->sname);
        s->span[0] = 0;
        if (r->date && s->nrows > 0) {
            /* window w predicts target rows w+Lb .. w+Lb+H-1 and belongs to the split of
             * the last one: the span is that of the windows' last targets */
            char d0[32], d1[32];
            (r->secs ? sr_format_time : lk_format_day)(r->date[s->w0 + Lb + H - 1], d0, sizeof d0);
            (r->secs ? sr_format_time : lk_format_day)(r->date[s->w1 - 1 + Lb + H - 1], d1,
                                                       sizeof d1);
            snprintf(s->span, sizeof s->span, "%s..%s", d0, d1);
        }
    }
    if (!r->predict && L->sp[PL_SPLIT_TRAIN].nrows <= 0)
        return pl_error_set(PL_ERR_CONFIG,
                            "%s: the train split of '%s' has no window (train rows: %lld, "
                            "window %lld + horizon %lld)",
                            L->path, r->sname, (long long)r->a, (long long)Lb, (long long)H);
    return PL_OK;
}

/* Mean and population std of every used column over the training rows
 * [0, a) (predict: the run's standardization.json); then the [T, Ff]
 * feature and [T, Ft] target matrices on the CPU. */
static pl_status standardize(series_loader *L, series_read *r) {
    int nfc = r->nfc, ntc = r->ntc, nall = r->nall = nfc + ntc;
    r->mean = calloc((size_t)nall, sizeof *r->mean);
    r->sd = calloc((size_t)nall, sizeof *r->sd);
    r->allc = malloc(sizeof *r->allc * (size_t)nall);
    if (!r->mean || !r->sd || !r->allc)
        return pl_error_set(PL_ERR_NOMEM, "%s: out of memory", L->path);
    for (int i = 0; i < nall; i++) {
        r->allc[i] = i < nfc ? r->fcols[i] : r->tcols[i - nfc];
        r->mean[i] = 0;
        r->sd[i] = 1;
    }
    pl_status st;
    if (r->stdz && r->predict &&
        (st = sr_read_standardization(L, r->names, r->nnames, r->allc, nall, r->mean, r->sd)))
        return st;
    const float *raw = r->raw;
    int64_t F = r->F, a = r->a;
    for (int i = 0; i < nall && r->stdz && !r->predict; i++) {
        double s1 = 0, s2 = 0;
        for (int64_t row = 0; row < a; row++)
            s1 += raw[row * F + r->allc[i]];
        double m = s1 / (double)a;
        for (int64_t row = 0; row < a; row++) {
            double d = raw[row * F + r->allc[i]] - m;
            s2 += d * d;
        }
        double v = sqrt(s2 / (double)a);
        r->mean[i] = m;
        r->sd[i] = v > 0 ? v : 1.0; /* constant column: leave scale alone */
    }
    L->feat = lk_new_tensor(PL_F32, 2, (int64_t[]){r->T, nfc}, PL_CPU);
    L->targ = lk_new_tensor(PL_F32, 2, (int64_t[]){r->T, ntc}, PL_CPU);
    if (!L->feat || !L->targ) return pl_error_status();
    float *fx = pl_tensor_data(L->feat), *ty = pl_tensor_data(L->targ);
    for (int64_t row = 0; row < r->T; row++) {
        for (int i = 0; i < nfc; i++)
            fx[row * nfc + i] = (float)((raw[row * F + r->fcols[i]] - r->mean[i]) / r->sd[i]);
        for (int i = 0; i < ntc; i++)
            ty[row * ntc + i] =
                (float)((raw[row * F + r->tcols[i]] - r->mean[nfc + i]) / r->sd[nfc + i]);
    }
    return PL_OK;
}

/* A CPU matrix moved to L->dev (the reference passed on). */
static pl_status to_dev(series_loader *L, pl_tensor **t) {
    pl_tensor *d = lk_new_tensor((*t)->dtype, (*t)->ndim, (*t)->shape, L->dev);
    if (!d || pl_tensor_copy_(d, *t)) {
        pl_tensor_release(d);
        return pl_error_status();
    }
    pl_tensor_release(*t);
    *t = d;
    return PL_OK;
}

/* The timeframes' matrices (feat itself for k = 1, trailing k-bar
 * aggregates else), then everything to the device. */
static pl_status build_matrices(series_loader *L, const pl_config_section *cfg, series_read *r) {
    if (r->multi && r->stdz && r->predict)
        return pl_error_set(PL_ERR_UNSUPPORTED,
                            "hdf5_series: predict with timeframes and "
                            "standardize: the run's standardization.json holds the one-bar "
                            "statistics only; not supported yet");
    sr_agg_rule rule[SR_MAX_COLS];
    pl_status st;
    if (r->multi &&
        (st = sr_parse_agg(pl_cfg_str(cfg, "timeframe_agg",
                                      "open=first,high=max,low=min,ticks=sum,log_return=sum"),
                           r->names, r->nnames, r->fcols, r->nfc, rule)))
        return st;
    bool on_cpu = pl_device_eq(L->dev, PL_CPU);
    if (!on_cpu && ((st = to_dev(L, &L->feat)) || (st = to_dev(L, &L->targ)))) return st;
    for (int i = 0; i < r->tf.n; i++) {
        sr_timeframe_field(&r->tf, i, L->tfname[i], sizeof L->tfname[i]);
        if (r->tf.k[i] == 1) {
            L->tfm[i] = pl_tensor_retain(L->feat);
            continue;
        }
        if ((st = sr_build_timeframe(L->path, r->raw, r->T, r->F, r->fcols, r->nfc, rule,
                                     r->tf.k[i], r->a, r->stdz && !r->predict, &L->tfm[i])))
            return st;
        if (!on_cpu && (st = to_dev(L, &L->tfm[i]))) return st;
    }
    return PL_OK;
}

/* The series' shape and statistics as meta (README "Meta"). */
static void publish_meta(series_loader *L, const series_read *r) {
    pl_run_context *c = L->ctx;
    lk_meta_int(c, "num_features", r->nfc);
    lk_meta_int(c, "num_targets", r->ntc);
    lk_meta_int(c, "window", r->W);
    lk_meta_int(c, "lookback", r->Lb);
    if (r->multi) {
        lk_meta_int(c, "num_timeframes", r->tf.n);
        for (int i = 0; i < r->tf.n; i++) {
            char k[64];
            snprintf(k, sizeof k, "timeframe_%d", i);
            lk_meta_int(c, k, r->tf.k[i]);
            snprintf(k, sizeof k, "timeframe_window_%d", i);
            lk_meta_int(c, k, r->tf.w[i]);
        }
    }
    lk_meta_int(c, "horizon", r->H);
    lk_meta_int(c, "num_rows", r->T);
    lk_meta_int(c, "train_rows", r->a);
    for (int i = 0; i < r->ntc; i++) {
        char k[64];
        snprintf(k, sizeof k, "target_mean_%d", i);
        lk_meta_float(c, k, r->mean[r->nfc + i]);
        snprintf(k, sizeof k, "target_std_%d", i);
        lk_meta_float(c, k, r->sd[r->nfc + i]);
    }
    lk_meta_float(c, "target_mean", r->mean[r->nfc]);
    lk_meta_float(c, "target_std", r->sd[r->nfc]);
    lk_meta_int(c, "standardized", r->stdz ? 1 : 0);
}

pl_status sr_open_series(series_loader *L, const pl_config_section *cfg) {
    series_read r = {0};
    r.predict = lk_predict_split(L->ctx) >= 0; /* new rows: the train split may be empty */
    r.stdz = pl_cfg_bool(cfg, "standardize", false);
    pl_status st = read_columns(L, cfg, &r);
    if (!st) st = size_windows(L, cfg, &r);
    if (!st) st = split_rows(L, cfg, &r);
    if (!st) st = cut_windows(L, &r);
    if (!st) st = standardize(L, &r);
    if (!st) st = build_matrices(L, cfg, &r);
    if (!st) {
        L->tf = r.tf;
        L->lookback = r.Lb;
        L->T = r.T;
        L->Ff = r.nfc;
        L->Ft = r.ntc;
        L->window = r.W;
        L->horizon = r.H;
        publish_meta(L, &r);
    }
    if (!st && r.stdz && !r.predict)
        st = sr_write_standardization(L, r.names, r.nnames, r.allc, r.nall, r.mean, r.sd, r.a);
    if (!st) {
        char tn[64];
        if (r.tcols[0] < r.nnames)
            snprintf(tn, sizeof tn, "%s", r.names[r.tcols[0]]);
        else
            snprintf(tn, sizeof tn, "%d", r.tcols[0]);
        st = sr_naive_baselines(L, cfg, r.raw, r.F, r.tcols[0], tn, &r.tf, r.Lb, r.H,
                                L->sp[PL_SPLIT_TRAIN].nrows, r.predict);
    }
    read_free(&r);
    return st;
}
