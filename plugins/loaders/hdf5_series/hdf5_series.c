/* hdf5_series.c - the hdf5_series loader plugin: one [T, F] time series
 * cut into overlapping windows (README.md has the options, the layout and
 * the batches). This file holds the options, the vtable and the epochs;
 * series_read.c reads the series at create.
 *
 * Batches: unshuffled ones are strided views (pl_tensor_as_strided) of one
 * feature matrix, never N copies. Shuffled train batches gather their
 * windows' rows into buffers allocated once, by one index_select per field
 * (lk_gather_rows: memcpy on the CPU, the backend's kernel on a device, the
 * rows' indices uploaded once per batch and field). The epoch's window
 * order is a Fisher-Yates permutation seeded by ctx->seed + epoch, so batch
 * k of an epoch starts at position k * batch_size of that permutation
 * (plugin.h loader contract: no position state).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hdf5_series.h"
#include "hdf5_series_api.h"

const pl_option_spec hdf5_series_options[] = {
    {"path", PL_OPT_STRING, NULL, PL_NO_BOUNDS, NULL, "HDF5 file"},
    {"series", PL_OPT_STRING, "series", PL_NO_BOUNDS, NULL, "the [T, F] dataset"},
    {"window", PL_OPT_INT, "0", 0, 1e9, NULL,
     "input window length (rows); required unless timeframes gives windows"},
    {"horizon", PL_OPT_INT, "1", 1, 1e9, NULL, "target steps after the window"},
    {"target_columns", PL_OPT_STRING, "0", PL_NO_BOUNDS, NULL, "target column names or indices"},
    {"feature_columns", PL_OPT_STRING, "", PL_NO_BOUNDS, NULL, "input columns (default all)"},
    {"standardize", PL_OPT_BOOL, "false", PL_NO_BOUNDS, NULL,
     "(x - mean) / std per column, stats from the training range only"},
    {"date_dataset", PL_OPT_STRING, "date", PL_NO_BOUNDS, NULL, "days since 1970 per row"},
    {"time_dataset", PL_OPT_STRING, "time", PL_NO_BOUNDS, NULL,
     "seconds since 1970-01-01T00:00Z per row, used instead of date_dataset when the file has "
     "it (tools/csv_to_h5.py with times of day); empty: dates only"},
    {"train_end", PL_OPT_STRING, "", PL_NO_BOUNDS, NULL,
     "last date (YYYY-MM-DD) of train targets, or time YYYY-MM-DDThh:mm[:ss]Z (files with a "
     "time dataset)"},
    {"val_end", PL_OPT_STRING, "", PL_NO_BOUNDS, NULL, "last date of val targets (test after)"},
    {"split_fractions", PL_OPT_STRING, "", PL_NO_BOUNDS, NULL,
     "'0.8,0.1,0.1': split the series' rows in order instead of by date"},
    {"timeframes", PL_OPT_STRING, "", PL_NO_BOUNDS, NULL,
     "multi-timeframe windows, bars per step of each timeframe ('1,4,24'); field x is the "
     "first, x_tf<k> the others; empty: one timeframe (window)"},
    {"windows", PL_OPT_STRING, "", PL_NO_BOUNDS, NULL,
     "with timeframes: window length of each timeframe ('24,12,5')"},
    {"timeframe_agg", PL_OPT_STRING, "open=first,high=max,low=min,ticks=sum,log_return=sum",
     PL_NO_BOUNDS, NULL,
     "with timeframes: how k bars of a column make one (first|last|max|min|sum|mean); columns "
     "not listed: last"},
    {"naive_period", PL_OPT_INT, "0", 0, 1e9, NULL,
     "> 0: publish the training windows' MAE of the first target column's seasonal naive "
     "forecast y[t-s] and of the corrected y[t-s] + y[e] - y[e-s] (s = naive_period, e = the "
     "window's last input row) as meta train_seasonal_naive_mae / "
     "train_seasonal_naive_corrected_mae (lstm naive_skip = auto); horizon <= s < window"},
    {"batch_size", PL_OPT_INT, "32", 1, 1e9, NULL, "windows per batch"},
    {"eval_batch_size", PL_OPT_INT, "0", 0, 1e9, NULL, "val/test batch size (0: batch_size)"},
    {"shuffle", PL_OPT_BOOL, "true", PL_NO_BOUNDS, NULL, "shuffle the train windows each epoch"},
    {"drop_last", PL_OPT_BOOL, "false", PL_NO_BOUNDS, NULL, "drop the last partial train batch"},
    PL_OPTIONS_END};

static void series_destroy(void *self) {
    series_loader *L = self;
    if (!L) return;
    lk_views_release(&L->views);
    pl_h5_lock();
    if (L->file > 0) H5Fclose(L->file);
    pl_h5_unlock();
    pl_tensor_release(L->feat);
    pl_tensor_release(L->targ);
    pl_tensor_release(L->wy_g);
    for (int i = 0; i < SR_MAX_TF; i++) {
        pl_tensor_release(L->tfm[i]);
        pl_tensor_release(L->tfg[i]);
    }
    for (int i = 0; i <= SR_MAX_TF; i++)
        pl_tensor_release(L->gidx_dev[i]);
    free(L->gidx);
    free(L->perm);
    free(L);
}

/* Options that contradict each other, refused before anything is read (by
 * `pipeline check` through batch_fields, and by create): one way to split,
 * and consistent timeframes. */
static pl_status check_options(const pl_config_section *cfg) {
    const char *fr = pl_cfg_str(cfg, "split_fractions", ""), *te = pl_cfg_str(cfg, "train_end", ""),
               *ve = pl_cfg_str(cfg, "val_end", "");
    if (fr[0] && (te[0] || ve[0])) {
        pl_hint_set("give train_end (and val_end) to split by date, or split_fractions to split by "
                    "share of rows; remove the other with ~data.%s",
                    te[0] ? "train_end" : "val_end");
        return pl_error_set(PL_ERR_CONFIG,
                            "hdf5_series: split_fractions = %s and %s = %s are both set; they are "
                            "two ways to split and only one can apply",
                            fr, te[0] ? "train_end" : "val_end", te[0] ? te : ve);
    }
    if (ve[0] && !te[0])
        return pl_error_set(PL_ERR_CONFIG,
                            "hdf5_series: val_end = %s without train_end: val_end "
                            "ends the validation period that starts at train_end",
                            ve);
    sr_timeframes tf;
    pl_status st = sr_parse_timeframes(cfg, &tf);
    if (!st && tf.w[0] <= 0)
        st = pl_error_set(PL_ERR_CONFIG, "hdf5_series: window = 0: set window (rows per input "
                                         "window) or timeframes and windows");
    return st;
}

/* What was loaded, for the run's data line (meta "data_summary") and
 * summary.json: each split's windows and where they come from. */
static void publish_summary(series_loader *L) {
    if (!L->ctx || !L->ctx->meta) return;
    char line[1024];
    int n = snprintf(line, sizeof line, "%s:", L->path);
    for (int si = 0; si < PL_SPLIT_COUNT; si++) {
        const series_split *s = &L->sp[si];
        char k[64];
        snprintf(k, sizeof k, "num_%s", pl_split_name((pl_data_split)si));
        lk_meta_int(L->ctx, k, s->nrows);
        if (n > 0 && (size_t)n < sizeof line)
            n += snprintf(line + n, sizeof line - (size_t)n, "%s %s %lld windows (%s%s%s)",
                          si ? "," : "", pl_split_name((pl_data_split)si), (long long)s->nrows,
                          s->where, s->span[0] ? ", last targets " : "", s->span);
    }
    pl_meta_set_str(L->ctx->meta, "data_summary", line);
}

/* Shuffled train batches: the gather buffers ([batch * W_i, Ff] per
 * timeframe, [batch * horizon, Ft]), the rows' index buffers, the order. */
static pl_status alloc_gather(series_loader *L) {
    const series_split *tr = &L->sp[PL_SPLIT_TRAIN];
    int64_t B = tr->batch, maxr = B * L->horizon;
    for (int i = 0; i < L->tf.n; i++) {
        int64_t rows = B * L->tf.w[i];
        if (rows > maxr) maxr = rows;
        if (!(L->tfg[i] = lk_new_tensor(PL_F32, 2, (int64_t[]){rows, L->Ff}, L->dev)))
            return pl_error_status();
    }
    L->wy_g = lk_new_tensor(PL_F32, 2, (int64_t[]){B * L->horizon, L->Ft}, L->dev);
    if (!L->wy_g) return pl_error_status();
    L->perm = malloc(sizeof *L->perm * (size_t)(tr->nrows > 0 ? tr->nrows : 1));
    L->gidx = malloc(sizeof *L->gidx * (size_t)maxr);
    if (!L->perm || !L->gidx) return pl_error_set(PL_ERR_NOMEM, "hdf5_series: out of memory");
    if (pl_device_eq(L->dev, PL_CPU)) return PL_OK;
    for (int i = 0; i <= L->tf.n; i++)
        if (!(L->gidx_dev[i] = lk_new_tensor(PL_I64, 1, (int64_t[]){maxr}, L->dev)))
            return pl_error_status();
    return PL_OK;
}

static pl_status series_create(const pl_config_section *cfg, pl_run_context *ctx, void **self) {
    pl_status st = check_options(cfg);
    if (st) return st;
    series_loader *L = calloc(1, sizeof *L);
    if (!L) return pl_error_set(PL_ERR_NOMEM, "hdf5_series: out of memory");
    L->ctx = ctx;
    L->dev = ctx ? ctx->device : PL_CPU;
    L->file = H5I_INVALID_HID;
    L->cur_split = -1;
    snprintf(L->path, sizeof L->path, "%s", pl_cfg_str(cfg, "path", ""));
    int64_t bs = pl_cfg_int(cfg, "batch_size", 32), ebs = pl_cfg_int(cfg, "eval_batch_size", 0);
    bool shuffle = pl_cfg_bool(cfg, "shuffle", true), drop = pl_cfg_bool(cfg, "drop_last", false);
    for (int si = 0; si < PL_SPLIT_COUNT; si++) {
        bool train = si == PL_SPLIT_TRAIN;
        L->sp[si].batch = train || ebs <= 0 ? bs : ebs;
        L->sp[si].shuffle = train && shuffle;
        L->sp[si].drop_last = train && drop;
    }
    const series_split *tr = &L->sp[PL_SPLIT_TRAIN];
    if (!L->path[0]) st = pl_error_set(PL_ERR_CONFIG, "hdf5_series: 'path' is empty");
    if (!st) st = pl_h5_open_read(L->path, "run tools/prepare_data.sh", &L->file);
    if (!st) {
        lk_publish_file_attrs(L->ctx, L->path, L->file);
        st = sr_open_series(L, cfg);
    }
    if (!st && tr->drop_last && tr->nrows < tr->batch)
        st = pl_error_set(
            PL_ERR_CONFIG,
            "%s: train split has %lld windows < batch_size %lld with drop_last: no batch", L->path,
            (long long)tr->nrows, (long long)tr->batch);
    if (!st && tr->shuffle) st = alloc_gather(L);
    if (st) {
        series_destroy(L);
        return st;
    }
    publish_summary(L);
    *self = L;
    return PL_OK;
}

static int64_t series_num_batches(void *self, pl_data_split split) {
    series_loader *L = self;
    if ((int)split < 0 || split >= PL_SPLIT_COUNT) return 0;
    const series_split *s = &L->sp[split];
    return s->present ? lk_batches(s->nrows, s->batch, s->drop_last) : 0;
}

static pl_status series_epoch_begin(void *self, pl_data_split split, int64_t epoch,
                                    int64_t start_batch) {
    series_loader *L = self;
    if ((int)split < 0 || split >= PL_SPLIT_COUNT)
        return pl_error_set(PL_ERR_INVALID, "hdf5_series: bad split %d", (int)split);
    series_split *s = &L->sp[split];
    lk_views_release(&L->views);
    if (!s->present || s->nrows == 0)
        return pl_error_set(PL_ERR_CONFIG, "%s: split '%s' is empty (%s)", L->path,
                            pl_split_name(split), s->where);
    char where[SR_NAME_LEN + 32];
    snprintf(where, sizeof where, "%s, batch_size %lld", s->where, (long long)s->batch);
    pl_status st = lk_check_start("hdf5_series", split, epoch, start_batch,
                                  series_num_batches(L, split), where);
    if (st) return st;
    L->cur_split = split;
    L->epoch = epoch;
    L->batch_index = start_batch;
    L->row_pos = start_batch * s->batch;
    if (s->shuffle) {
        for (int64_t i = 0; i < s->nrows; i++)
            L->perm[i] = i;
        uint64_t rs = (L->ctx ? L->ctx->seed : 0) + (uint64_t)epoch;
        lk_shuffle(L->perm, s->nrows, &rs);
    }
    return PL_OK;
}

/* Gather `rows` rows of matrix src ([T, C]) listed in L->gidx into dst
 * ([>= rows, C]) with index buffer `slot`; NULL-free view [n, rows / n, C]. */
static pl_tensor *gather(series_loader *L, int slot, pl_tensor *dst, pl_tensor *src, int64_t n,
                         int64_t per) {
    int64_t rows = n * per, C = src->shape[1];
    pl_tensor *iv = L->gidx_dev[slot];
    if (iv) {
        const pl_backend *be = pl_backend_get(L->dev.type);
        if (!be ||
            be->memcpy(pl_tensor_data(iv), L->dev, L->gidx, PL_CPU, (size_t)rows * sizeof *L->gidx))
            return NULL;
    }
    if (lk_gather_rows("hdf5_series", L->dev, dst, src, L->gidx, iv, 0, rows,
                       (size_t)C * sizeof(float)))
        return NULL;
    return lk_as_strided(dst, 3, (int64_t[]){n, per, C}, (int64_t[]){per * C, C, 1}, dst->offset);
}

/* A shuffled batch of n windows from position L->row_pos of the order:
 * timeframe i of window w reads rows e - (W_i - 1) k_i, ..., e - k_i, e of
 * its matrix (e = w + lookback - 1), the targets rows e + 1 .. e + H. */
static int shuffled_batch(series_loader *L, const series_split *s, int64_t n, pl_tensor **x,
                          pl_tensor **y) {
    for (int f = 0; f < L->tf.n; f++) {
        int64_t W = L->tf.w[f], k = L->tf.k[f];
        for (int64_t i = 0; i < n; i++) {
            int64_t e = s->w0 + L->perm[L->row_pos + i] + L->lookback - 1;
            for (int64_t j = 0; j < W; j++)
                L->gidx[i * W + j] = e - (W - 1 - j) * k;
        }
        if (!(x[f] = gather(L, f, L->tfg[f], L->tfm[f], n, W))) return -1;
    }
    int64_t H = L->horizon;
    for (int64_t i = 0; i < n; i++) {
        int64_t e = s->w0 + L->perm[L->row_pos + i] + L->lookback - 1;
        for (int64_t h = 0; h < H; h++)
            L->gidx[i * H + h] = e + 1 + h;
    }
    return (*y = gather(L, L->tf.n, L->wy_g, L->targ, n, H)) ? 0 : -1;
}

static int series_next(void *self, pl_batch *out) {
    series_loader *L = self;
    lk_views_release(&L->views);
    memset(out, 0, sizeof *out);
    if (L->cur_split < 0) {
        pl_error_set(PL_ERR_INVALID, "hdf5_series: next() before epoch_begin()");
        return -1;
    }
    const series_split *s = &L->sp[L->cur_split];
    int64_t left = s->nrows - L->row_pos;
    if (left <= 0 || (s->drop_last && left < s->batch)) return 0;
    int64_t n = left < s->batch ? left : s->batch;
    int64_t H = L->horizon, Ff = L->Ff, Ft = L->Ft;
    pl_tensor *x[SR_MAX_TF] = {0}, *y = NULL;
    int bad = 0;
    if (s->shuffle) {
        bad = shuffled_batch(L, s, n, x, &y);
    } else {
        int64_t e = s->w0 + L->row_pos + L->lookback - 1;
        for (int f = 0; f < L->tf.n; f++) {
            int64_t W = L->tf.w[f], k = L->tf.k[f];
            pl_tensor *m = L->tfm[f];
            x[f] = lk_as_strided(m, 3, (int64_t[]){n, W, Ff}, (int64_t[]){Ff, k * Ff, 1},
                                 m->offset + (e - (W - 1) * k) * Ff);
        }
        y = lk_as_strided(L->targ, 3, (int64_t[]){n, H, Ft}, (int64_t[]){Ft, Ft, 1},
                          L->targ->offset + (e + 1) * Ft);
    }
    /* every view is handed to the batch (or released) */
    bad |= lk_emit(&L->views, out, "x", x[0]) | lk_emit(&L->views, out, "y", y);
    for (int f = 1; f < L->tf.n; f++)
        bad |= lk_emit(&L->views, out, L->tfname[f], x[f]);
    if (bad) return -1;
    out->size = n;
    out->index = L->batch_index++;
    L->row_pos += n;
    return 1;
}

static pl_loader_stats series_stats(void *self) {
    return ((series_loader *)self)->st;
}

/* x f32 [B, window, Ff], y f32 [B, horizon, Ft] whatever the file holds
 * (the series is read as f32), and x_tf<k> f32 [B, W_k, Ff] per further
 * timeframe: nothing to read. */
static pl_status series_batch_fields(const pl_config_section *cfg, pl_field_list *out) {
    memset(out, 0, sizeof *out);
    sr_timeframes tf;
    pl_status st = check_options(cfg);
    if (!st) st = sr_parse_timeframes(cfg, &tf);
    if (!st) st = pl_fields_add(out, "x", PL_F32, 3, false);
    if (!st) st = pl_fields_add(out, "y", PL_F32, 3, false);
    for (int i = 1; !st && i < tf.n; i++) {
        char name[24];
        sr_timeframe_field(&tf, i, name, sizeof name);
        st = pl_fields_add(out, name, PL_F32, 3, false);
    }
    if (st) memset(out, 0, sizeof *out);
    return st;
}

const pl_loader_vtable hdf5_series_vtable = {
    .create = series_create,
    .destroy = series_destroy,
    .epoch_begin = series_epoch_begin,
    .next = series_next,
    .num_batches = series_num_batches,
    .stats = series_stats,
    .batch_fields = series_batch_fields,
};
