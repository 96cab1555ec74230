/* hdf5_chunk.c - mega-batch HDF5 loader: the plugin entry (options, create,
 * destroy, the epoch cursor, batch fields) and helpers of both modes.
 *
 * Two modes (README.md has the option table and the layouts):
 *   rows mode (rows.c): samples along axis 0 of one or more datasets, read in
 *     device-resident chunks (prefetch.c) and served as views;
 *   series mode (series.c, `window` > 0): one [T, F] series cut into
 *     overlapping windows served as strided views.
 *
 * Batch order (plugin.h loader contract): a split's order is a pure function
 * of (ctx->seed, epoch), so epoch_begin(split, epoch, k) starts at batch k of
 * that order, reading only what batches k.. need; the loader keeps no
 * position state.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hdf5_chunk.h"

/* ---- helpers shared by both modes (the rest is the loader kit) ------- */

int h5c_emit(loader *L, pl_batch *out, const char *name, pl_tensor *v) {
    if (!v) return -1;
    L->out_views[L->n_out++] = v;
    out->names[out->n] = name;
    out->fields[out->n++] = v;
    return 0;
}

int64_t h5c_split_batches(const loader *L, int si) {
    const split_data *s = &L->sp[si];
    if (!s->present) return 0;
    return s->drop_last ? s->nrows / s->batch : (s->nrows + s->batch - 1) / s->batch;
}

static void release_views(loader *L) {
    for (int i = 0; i < L->n_out; i++)
        pl_tensor_release(L->out_views[i]);
    L->n_out = 0;
}

/* ---- options --------------------------------------------------------------- */

static const pl_option_spec opts[] = {
    {"path", PL_OPT_STRING, NULL, PL_NO_BOUNDS, NULL, "HDF5 file"},
    {"datasets", PL_OPT_STRING, "", PL_NO_BOUNDS, NULL,
     "rows mode: 'field=dataset,...' or 'dataset,...' (field = dataset's base name)"},
    {"val_datasets", PL_OPT_STRING, "", PL_NO_BOUNDS, NULL,
     "datasets of the val split (default: datasets)"},
    {"test_datasets", PL_OPT_STRING, "", PL_NO_BOUNDS, NULL,
     "datasets of the test split (default: datasets)"},
    {"train_group", PL_OPT_STRING, "/train", PL_NO_BOUNDS, NULL, "group of the train split"},
    {"val_group", PL_OPT_STRING, "/val", PL_NO_BOUNDS, NULL, "group of the val split"},
    {"test_group", PL_OPT_STRING, "/test", PL_NO_BOUNDS, NULL, "group of the test split"},
    {"split_fractions", PL_OPT_STRING, "", PL_NO_BOUNDS, NULL,
     "'0.8,0.1,0.1': split the rows (or the series) in order instead of groups/dates"},
    {"history", PL_OPT_STRING, "", PL_NO_BOUNDS, NULL,
     "CSR group (offsets/items) under val/test groups exposed as a padded i32 [B, Hmax] field of "
     "that name"},
    {"row_field", PL_OPT_STRING, "", PL_NO_BOUNDS, NULL,
     "rows mode: also emit this i64 [B] field, each sample's row in its split's datasets "
     "(ilora's teacher export records it as source_row); empty: none"},
    {"teacher_outputs", PL_OPT_STRING, "", PL_NO_BOUNDS, NULL,
     "rows mode: teacher outputs file (models/ilora export) joined to the train rows as fields "
     "kd_ids, kd_logits, kd_lognorm (@CONFIG.ini:outputs/teacher_outputs.h5 names a run's)"},
    {"teacher_top_k", PL_OPT_INT, "0", 0, 1e6, NULL,
     "items per position kept from the teacher outputs (the best ones); 0: all in the file"},
    {"batch_size", PL_OPT_INT, "32", 1, 1e9, NULL, "samples per batch"},
    {"eval_batch_size", PL_OPT_INT, "0", 0, 1e9, NULL, "val/test batch size (0: batch_size)"},
    {"chunk_samples", PL_OPT_INT, "0", 0, 1e12, NULL, "rows per chunk (0: from chunk_size_gb)"},
    {"chunk_size_gb", PL_OPT_FLOAT, "0", 0, 1e6, NULL,
     "chunk budget in GiB (0: 75 % of free device memory, clamped to the data size)"},
    {"shuffle", PL_OPT_BOOL, "true", PL_NO_BOUNDS, NULL,
     "shuffle train (chunk order and rows in a chunk)"},
    {"drop_last", PL_OPT_BOOL, "false", PL_NO_BOUNDS, NULL, "drop the last partial train batch"},
    {"prefetch", PL_OPT_BOOL, "true", PL_NO_BOUNDS, NULL,
     "read the next chunk in a background thread"},
    {"convert", PL_OPT_CHOICE, "none", PL_NO_BOUNDS, "none|f32",
     "convert floating datasets to f32"},
    {"series", PL_OPT_STRING, "series", PL_NO_BOUNDS, NULL, "series mode: the [T, F] dataset"},
    {"window", PL_OPT_INT, "0", 0, 1e9, NULL, "series mode when > 0: input window length"},
    {"horizon", PL_OPT_INT, "1", 1, 1e9, NULL, "series mode: target steps after the window"},
    {"target_columns", PL_OPT_STRING, "0", PL_NO_BOUNDS, NULL,
     "series: target column names or indices"},
    {"feature_columns", PL_OPT_STRING, "", PL_NO_BOUNDS, NULL,
     "series: input columns (default all)"},
    {"standardize", PL_OPT_BOOL, "false", PL_NO_BOUNDS, NULL,
     "series: (x - mean) / std per column, stats from the training range only"},
    {"date_dataset", PL_OPT_STRING, "date", PL_NO_BOUNDS, NULL, "series: days since 1970 per row"},
    {"time_dataset", PL_OPT_STRING, "time", PL_NO_BOUNDS, NULL,
     "series: seconds since 1970-01-01T00:00Z per row, used instead of date_dataset when the "
     "file has it (tools/csv_to_h5.py with times of day); empty: dates only"},
    {"timeframes", PL_OPT_STRING, "", PL_NO_BOUNDS, NULL,
     "series: multi-timeframe windows, bars per step of each timeframe ('1,4,24'); field x is "
     "the first, x_tf<k> the others; empty: one timeframe (window)"},
    {"windows", PL_OPT_STRING, "", PL_NO_BOUNDS, NULL,
     "series with timeframes: window length of each timeframe ('24,12,5')"},
    {"timeframe_agg", PL_OPT_STRING, "open=first,high=max,low=min,ticks=sum,log_return=sum",
     PL_NO_BOUNDS, NULL,
     "series with timeframes: how k bars of a column make one (first|last|max|min|sum|mean); "
     "columns not listed: last"},
    {"train_end", PL_OPT_STRING, "", PL_NO_BOUNDS, NULL,
     "series: last date (YYYY-MM-DD) of train targets, or time YYYY-MM-DDThh:mm[:ss]Z (files "
     "with a time dataset)"},
    {"val_end", PL_OPT_STRING, "", PL_NO_BOUNDS, NULL,
     "series: last date of val targets (test after)"},
    {"naive_period", PL_OPT_INT, "0", 0, 1e9, NULL,
     "series: > 0: publish the training windows' MAE of the first target column's seasonal "
     "naive forecast y[t-s] and of the corrected y[t-s] + y[e] - y[e-s] (s = naive_period, e = "
     "the window's last input row) as meta train_seasonal_naive_mae / "
     "train_seasonal_naive_corrected_mae (lstm naive_skip = auto); horizon <= s < window"},
    PL_OPTIONS_END};

/* ---- destroy / create ------------------------------------------------------ */

static void h5c_destroy(void *self) {
    loader *L = self;
    if (!L) return;
    prefetch_stop(L);
    pthread_mutex_destroy(&L->mu);
    pthread_cond_destroy(&L->cv);
    release_views(L);
    for (int i = 0; i < PL_SPLIT_COUNT; i++)
        chunk_buf_free(&L->buf[i]);
    for (int i = 0; i < MAXF; i++)
        pl_tensor_release(L->gather[i]);
    pl_h5_lock();
    for (int si = 0; si < PL_SPLIT_COUNT; si++) {
        split_data *s = &L->sp[si];
        for (int i = 0; i < s->nf; i++)
            if (s->ds[i] > 0) H5Dclose(s->ds[i]);
        for (int i = 0; i < s->nx; i++) {
            pl_tensor_release(s->xt[i]);
            pl_tensor_release(s->xg[i]);
        }
    }
    if (L->file > 0) H5Fclose(L->file);
    pl_h5_unlock();
    pl_tensor_release(L->rows_t);
    pl_tensor_release(L->rows_host);
    free(L->xidx);
    pl_tensor_release(L->feat);
    pl_tensor_release(L->targ);
    pl_tensor_release(L->wx_g);
    pl_tensor_release(L->wy_g);
    for (int i = 0; i < H5C_MAX_TF; i++) {
        pl_tensor_release(L->tfm[i]);
        pl_tensor_release(L->tfg[i]);
    }
    free(L->perm);
    pl_tensor_release(L->perm_dev);
    pl_tensor_release(L->xperm_dev);
    free(L->xperm);
    free(L->order);
    free(L);
}

/* What was loaded, for the run's data line (ctx->meta "data_summary") and
 * summary.json: each split's size and where it comes from (series split by
 * date: the dates of its targets). */
static void publish_summary(loader *L) {
    if (!L->ctx || !L->ctx->meta) return;
    static const char *const key[PL_SPLIT_COUNT] = {"num_train", "num_val", "num_test"};
    char line[1024];
    int n = snprintf(line, sizeof line, "%s:", L->path);
    for (int si = 0; si < PL_SPLIT_COUNT && n > 0 && (size_t)n < sizeof line; si++) {
        const split_data *s = &L->sp[si];
        pl_meta_set_int(L->ctx->meta, key[si], s->present ? s->nrows : 0);
        n += snprintf(line + n, sizeof line - (size_t)n, "%s %s %lld %s (%s%s%s)",
                      si ? "," : "", pl_split_name((pl_data_split)si),
                      (long long)(s->present ? s->nrows : 0),
                      L->series_mode ? "windows" : "rows", s->where, s->span[0] ? ", last targets " : "",
                      s->span);
    }
    pl_meta_set_str(L->ctx->meta, "data_summary", line);
}

/* Options that contradict each other, refused before anything is read (by
 * `pipeline check` through batch_fields, and by create): one way to split a
 * series, and the date keys only where there are dates (series mode). */
static pl_status h5c_check_options(const pl_config_section *cfg) {
    bool series = h5c_series_mode(cfg);
    const char *fr = pl_cfg_str(cfg, "split_fractions", ""), *te = pl_cfg_str(cfg, "train_end", ""),
               *ve = pl_cfg_str(cfg, "val_end", "");
    if (fr[0] && (te[0] || ve[0])) {
        pl_hint_set("give train_end (and val_end) to split by date, or split_fractions to split by "
                    "share of rows; remove the other with ~data.%s",
                    te[0] ? "train_end" : "val_end");
        return pl_error_set(PL_ERR_CONFIG,
                            "hdf5_chunk: split_fractions = %s and %s = %s are both set; they are two "
                            "ways to split and only one can apply",
                            fr, te[0] ? "train_end" : "val_end", te[0] ? te : ve);
    }
    if (ve[0] && !te[0])
        return pl_error_set(PL_ERR_CONFIG, "hdf5_chunk: val_end = %s without train_end: val_end "
                            "ends the validation period that starts at train_end", ve);
    h5c_timeframes tf;
    pl_status st = series ? h5c_parse_timeframes(cfg, &tf) : PL_OK;
    if (st) return st;
    if (!series && (te[0] || ve[0]))
        return pl_error_set(PL_ERR_CONFIG, "hdf5_chunk: %s = %s applies to series mode (window > 0) "
                            "only; rows mode splits by group (train_group, ...) or split_fractions",
                            te[0] ? "train_end" : "val_end", te[0] ? te : ve);
    return PL_OK;
}

static pl_status h5c_create(const pl_config_section *cfg, pl_run_context *ctx, void **self) {
    pl_status cst = h5c_check_options(cfg);
    if (cst) return cst;
    loader *L = calloc(1, sizeof *L);
    if (!L) return pl_error_set(PL_ERR_NOMEM, "hdf5_chunk: out of memory");
    L->ctx = ctx;
    L->dev = ctx ? ctx->device : PL_CPU;
    L->file = H5I_INVALID_HID;
    pthread_mutex_init(&L->mu, NULL);
    pthread_cond_init(&L->cv, NULL);
    L->cur_split = -1;
    for (int i = 0; i < PL_SPLIT_COUNT; i++)
        L->buf[i].split = -1;
    pl_status st = PL_OK;
    snprintf(L->path, sizeof L->path, "%s", pl_cfg_str(cfg, "path", ""));
    if (!L->path[0]) {
        st = pl_error_set(PL_ERR_CONFIG, "hdf5_chunk: 'path' is empty");
        goto fail;
    }
    if ((st = pl_h5_open_read(L->path, "run tools/prepare_data.sh", &L->file))) goto fail;
    lk_publish_file_attrs(L->ctx, L->path, L->file);
    int64_t bs = pl_cfg_int(cfg, "batch_size", 32), ebs = pl_cfg_int(cfg, "eval_batch_size", 0);
    if (ebs <= 0) ebs = bs;
    bool shuffle = pl_cfg_bool(cfg, "shuffle", true),
         drop_last = pl_cfg_bool(cfg, "drop_last", false);
    for (int si = 0; si < PL_SPLIT_COUNT; si++) {
        L->sp[si].batch = si == PL_SPLIT_TRAIN ? bs : ebs;
        L->sp[si].shuffle = si == PL_SPLIT_TRAIN && shuffle;
        L->sp[si].drop_last = si == PL_SPLIT_TRAIN && drop_last;
    }
    L->series_mode = h5c_series_mode(cfg);
    st = L->series_mode ? series_create(L, cfg) : rows_create(L, cfg);
    if (st) goto fail;
    publish_summary(L);
    *self = L;
    return PL_OK;
fail:
    h5c_destroy(L);
    return st;
}

/* ---- epochs ---------------------------------------------------------------- */

static int64_t h5c_num_batches(void *self, pl_data_split split) {
    loader *L = self;
    if ((int)split < 0 || split >= PL_SPLIT_COUNT) return 0;
    return h5c_split_batches(L, split);
}

static pl_status h5c_epoch_begin(void *self, pl_data_split split, int64_t epoch,
                                 int64_t start_batch) {
    loader *L = self;
    if ((int)split < 0 || split >= PL_SPLIT_COUNT)
        return pl_error_set(PL_ERR_INVALID, "hdf5_chunk: bad split %d", (int)split);
    split_data *s = &L->sp[split];
    release_views(L);
    if (!s->present || s->nrows == 0)
        return pl_error_set(PL_ERR_CONFIG, "%s: split '%s' is empty (%s)", L->path,
                            pl_split_name(split), s->where);
    int64_t nb = h5c_split_batches(L, split);
    if (start_batch < 0 || start_batch > nb)
        return pl_error_set(
            PL_ERR_INVALID,
            "hdf5_chunk: epoch_begin(%s, epoch %lld, start_batch %lld): start_batch "
            "must lie in 0..%lld, split '%s' has %lld batches (%s, batch_size %lld)",
            pl_split_name(split), (long long)epoch, (long long)start_batch, (long long)nb,
            pl_split_name(split), (long long)nb, s->where, (long long)s->batch);
    L->cur_split = split;
    L->epoch = epoch;
    L->batch_index = start_batch;
    L->exhausted = false;
    return L->series_mode ? series_epoch_begin(L, split, start_batch)
                          : rows_epoch_begin(L, split, start_batch);
}

static int h5c_next(void *self, pl_batch *out) {
    loader *L = self;
    release_views(L);
    memset(out, 0, sizeof *out);
    if (L->cur_split < 0) {
        pl_error_set(PL_ERR_INVALID, "hdf5_chunk: next() before epoch_begin()");
        return -1;
    }
    if (L->exhausted) return 0;
    return L->series_mode ? series_next(L, out) : rows_next(L, out);
}

static pl_loader_stats h5c_stats(void *self) {
    loader *L = self;
    return L->st;
}

/* Rows mode: one field per listed dataset of each split with the dataset's
 * rank and the dtype it is read as, plus the history field; series mode: x
 * and y. Reads the file's metadata only (README "Batch fields"). */
static pl_status h5c_batch_fields(const pl_config_section *cfg, pl_field_list *out) {
    memset(out, 0, sizeof *out);
    pl_status st = h5c_check_options(cfg);
    if (st) return st;
    st = h5c_series_mode(cfg) ? series_batch_fields(cfg, out) : rows_batch_fields(cfg, out);
    if (st) memset(out, 0, sizeof *out);
    return st;
}

static const pl_loader_vtable vt = {
    .create = h5c_create,
    .destroy = h5c_destroy,
    .epoch_begin = h5c_epoch_begin,
    .next = h5c_next,
    .num_batches = h5c_num_batches,
    .stats = h5c_stats,
    .batch_fields = h5c_batch_fields,
};

PL_PLUGIN_DEFINE(
    hdf5_chunk, PL_KIND_LOADER, "0.2.0",
    "HDF5 rows/series loader: mega-batch chunks on the device, batches are views, prefetch", opts,
    &vt)
