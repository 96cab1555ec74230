/* hdf5_rows.c - the hdf5_rows loader plugin: samples along axis 0 of one or
 * more HDF5 datasets, read in device-resident mega-batch chunks and served as
 * views (README.md has the options and the layout). This file holds the
 * options, the vtable, create/destroy and the epoch cursor's checks:
 *   rows.c          the splits' datasets, the history field, chunk order and
 *                   the rows of a batch (a shuffled one gathered by one
 *                   index_select per field)
 *   prefetch.c      chunk buffers, reading a chunk, the prefetch thread
 *   teacher_join.c  the teacher outputs joined to the train rows
 *
 * Batch order (plugin.h loader contract): a split's order is a pure function
 * of (ctx->seed, epoch), so epoch_begin(split, epoch, k) starts at batch k of
 * that order, reading only what batches k.. need; the loader keeps no
 * position state.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hdf5_rows.h"
#include "hdf5_rows_api.h"

static int64_t split_batches(const loader *L, int si) {
    const split_data *s = &L->sp[si];
    return s->present ? lk_batches(s->nrows, s->batch, s->drop_last) : 0;
}

/* ---- options --------------------------------------------------------------- */

const pl_option_spec hdf5_rows_options[] = {
    {"path", PL_OPT_STRING, NULL, PL_NO_BOUNDS, NULL, "HDF5 file"},
    {"datasets", PL_OPT_STRING, "", PL_NO_BOUNDS, NULL,
     "'field=dataset,...' or 'dataset,...' (field = dataset's base name)"},
    {"val_datasets", PL_OPT_STRING, "", PL_NO_BOUNDS, NULL,
     "datasets of the val split (default: datasets)"},
    {"test_datasets", PL_OPT_STRING, "", PL_NO_BOUNDS, NULL,
     "datasets of the test split (default: datasets)"},
    {"train_group", PL_OPT_STRING, "/train", PL_NO_BOUNDS, NULL, "group of the train split"},
    {"val_group", PL_OPT_STRING, "/val", PL_NO_BOUNDS, NULL, "group of the val split"},
    {"test_group", PL_OPT_STRING, "/test", PL_NO_BOUNDS, NULL, "group of the test split"},
    {"split_fractions", PL_OPT_STRING, "", PL_NO_BOUNDS, NULL,
     "'0.8,0.1,0.1': split the rows in order instead of by groups"},
    {"history", PL_OPT_STRING, "", PL_NO_BOUNDS, NULL,
     "CSR group (offsets/items) under val/test groups exposed as a padded i32 [B, Hmax] field of "
     "that name"},
    {"row_field", PL_OPT_STRING, "", PL_NO_BOUNDS, NULL,
     "also emit this i64 [B] field, each sample's row in its split's datasets "
     "(ilora's teacher export records it as source_row); empty: none"},
    {"teacher_outputs", PL_OPT_STRING, "", PL_NO_BOUNDS, NULL,
     "teacher outputs file (models/ilora export) joined to the train rows as fields "
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
    PL_OPTIONS_END};

/* ---- destroy / create ------------------------------------------------------ */

static void rw_destroy(void *self) {
    loader *L = self;
    if (!L) return;
    prefetch_stop(L);
    lk_views_release(&L->views);
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
    free(L->perm);
    pl_tensor_release(L->perm_dev);
    pl_tensor_release(L->xperm_dev);
    free(L->xperm);
    free(L->order);
    free(L);
}

/* What was loaded, for the run's data line (ctx->meta "data_summary") and
 * summary.json: each split's size and where it comes from. */
static void publish_summary(loader *L) {
    if (!L->ctx || !L->ctx->meta) return;
    static const char *const key[PL_SPLIT_COUNT] = {"num_train", "num_val", "num_test"};
    char line[1024];
    int n = snprintf(line, sizeof line, "%s:", L->path);
    for (int si = 0; si < PL_SPLIT_COUNT && n > 0 && (size_t)n < sizeof line; si++) {
        const split_data *s = &L->sp[si];
        pl_meta_set_int(L->ctx->meta, key[si], s->present ? s->nrows : 0);
        n += snprintf(line + n, sizeof line - (size_t)n, "%s %s %lld rows (%s)", si ? "," : "",
                      pl_split_name((pl_data_split)si), (long long)(s->present ? s->nrows : 0),
                      s->where);
    }
    pl_meta_set_str(L->ctx->meta, "data_summary", line);
}

static pl_status rw_create(const pl_config_section *cfg, pl_run_context *ctx, void **self) {
    loader *L = calloc(1, sizeof *L);
    if (!L) return pl_error_set(PL_ERR_NOMEM, "hdf5_rows: out of memory");
    L->ctx = ctx;
    L->dev = ctx ? ctx->device : PL_CPU;
    L->file = H5I_INVALID_HID;
    L->cur_split = -1;
    for (int i = 0; i < PL_SPLIT_COUNT; i++)
        L->buf[i].split = -1;
    pl_status st = PL_OK;
    snprintf(L->path, sizeof L->path, "%s", pl_cfg_str(cfg, "path", ""));
    if (!L->path[0]) {
        st = pl_error_set(PL_ERR_CONFIG, "hdf5_rows: 'path' is empty");
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
    if ((st = rows_create(L, cfg))) goto fail;
    publish_summary(L);
    *self = L;
    return PL_OK;
fail:
    rw_destroy(L);
    return st;
}

/* ---- epochs ---------------------------------------------------------------- */

static int64_t rw_num_batches(void *self, pl_data_split split) {
    loader *L = self;
    if ((int)split < 0 || split >= PL_SPLIT_COUNT) return 0;
    return split_batches(L, split);
}

static pl_status rw_epoch_begin(void *self, pl_data_split split, int64_t epoch,
                                int64_t start_batch) {
    loader *L = self;
    if ((int)split < 0 || split >= PL_SPLIT_COUNT)
        return pl_error_set(PL_ERR_INVALID, "hdf5_rows: bad split %d", (int)split);
    split_data *s = &L->sp[split];
    lk_views_release(&L->views);
    if (!s->present || s->nrows == 0)
        return pl_error_set(PL_ERR_CONFIG, "%s: split '%s' is empty (%s)", L->path,
                            pl_split_name(split), s->where);
    char where[NAME_LEN + 32];
    snprintf(where, sizeof where, "%s, batch_size %lld", s->where, (long long)s->batch);
    pl_status st =
        lk_check_start("hdf5_rows", split, epoch, start_batch, split_batches(L, split), where);
    if (st) return st;
    L->cur_split = split;
    L->epoch = epoch;
    L->batch_index = start_batch;
    L->exhausted = false;
    return rows_epoch_begin(L, split, start_batch);
}

static int rw_next(void *self, pl_batch *out) {
    loader *L = self;
    lk_views_release(&L->views);
    memset(out, 0, sizeof *out);
    if (L->cur_split < 0) {
        pl_error_set(PL_ERR_INVALID, "hdf5_rows: next() before epoch_begin()");
        return -1;
    }
    if (L->exhausted) return 0;
    return rows_next(L, out);
}

static pl_loader_stats rw_stats(void *self) {
    loader *L = self;
    return L->st;
}

/* One field per listed dataset of each split with the dataset's rank and the
 * dtype it is read as, plus the history field, the teacher join's fields and
 * row_field. Reads the file's metadata only (README "Batch fields"). */
static pl_status rw_batch_fields(const pl_config_section *cfg, pl_field_list *out) {
    memset(out, 0, sizeof *out);
    pl_status st = rows_batch_fields(cfg, out);
    if (st) memset(out, 0, sizeof *out);
    return st;
}

const pl_loader_vtable hdf5_rows_vtable = {
    .create = rw_create,
    .destroy = rw_destroy,
    .epoch_begin = rw_epoch_begin,
    .next = rw_next,
    .num_batches = rw_num_batches,
    .stats = rw_stats,
    .batch_fields = rw_batch_fields,
};
