/* hdf5_panel.c - the hdf5_panel loader plugin: a stock panel served as
 * batches of day-graphs (stocks = nodes, edges from the top-k absolute
 * return correlations over a lookback; README.md: options, file layout,
 * batches, math). This file holds the options, the vtable and the epochs;
 * panel_read.c reads the file at create, panel_stage.c builds the graphs and
 * the staging.
 *
 * Batch order (plugin.h loader contract): train days are shuffled with
 * ctx->seed + epoch (the loader kit's Fisher-Yates) and laid out at
 * epoch_begin; val / test are in order, laid out once. epoch_begin(split,
 * epoch, k) starts at batch k of that order; no position state.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hdf5_panel.h"
#include "hdf5_panel_api.h"

const pl_option_spec hdf5_panel_options[] = {
    {"path", PL_OPT_STRING, NULL, PL_NO_BOUNDS, NULL, "HDF5 file (tools/stocks_to_h5.py layout)"},
    {"features", PL_OPT_STRING, "features", PL_NO_BOUNDS, NULL,
     "features [T, S, F] (read as f32) with attribute feature_names"},
    {"target", PL_OPT_STRING, "target", PL_NO_BOUNDS, NULL,
     "f32 [T, S], row t: stock s's return over the day after row t"},
    {"time", PL_OPT_STRING, "time", PL_NO_BOUNDS, NULL,
     "i64 [T] seconds since 1970-01-01 UTC of each row, strictly increasing"},
    {"target_time", PL_OPT_STRING, "target_time", PL_NO_BOUNDS, NULL,
     "i64 [T] seconds since 1970 of the day each row's target is (after time)"},
    {"factors", PL_OPT_STRING, "factors", PL_NO_BOUNDS, NULL,
     "f32 [T, S, K] baseline factors served raw (attribute factor_names); empty: none"},
    {"train_end", PL_OPT_STRING, "", PL_NO_BOUNDS, NULL,
     "(required) last day YYYY-MM-DD of train target_time (inclusive)"},
    {"val_end", PL_OPT_STRING, "", PL_NO_BOUNDS, NULL,
     "(required) last day YYYY-MM-DD of val target_time (inclusive)"},
    {"test_end", PL_OPT_STRING, "", PL_NO_BOUNDS, NULL,
     "last day YYYY-MM-DD of test target_time (inclusive); empty: to the end"},
    {"window", PL_OPT_INT, "20", 1, 1e6, NULL, "W days of features per sample (rows t-W+1..t)"},
    {"graph_lookback", PL_OPT_INT, "60", 2, 1e6, NULL,
     "L days of graph_feature per correlation (rows t-L+1..t)"},
    {"graph_top_k", PL_OPT_INT, "5", 1, 1e6, NULL,
     "edges j -> i from the k stocks j != i of largest |corr(i, j)| (k <= S-1)"},
    {"graph_feature", PL_OPT_STRING, "ret_1d", PL_NO_BOUNDS, NULL,
     "the feature (a name of feature_names) the correlations are taken over"},
    {"graphs", PL_OPT_CHOICE, "once", PL_NO_BOUNDS, "once|per_batch",
     "once: every day's graph built at create; per_batch: rebuilt in every next() (slow; for "
     "benchmarks)"},
    {"add_self_loops", PL_OPT_BOOL, "false", PL_NO_BOUNDS, NULL,
     "add an edge (i, i) for every stock of every day"},
    {"standardize_features", PL_OPT_BOOL, "true", PL_NO_BOUNDS, NULL,
     "per feature (x - mean) / std, mean and unbiased std over the train days' rows"},
    {"target_norm", PL_OPT_CHOICE, "cross_section", PL_NO_BOUNDS, "cross_section|global|none",
     "y per day (r - mean) / std over stocks; global: train mean / std; none: raw"},
    {"batch_size", PL_OPT_INT, "32", 1, 1e9, NULL, "days per train batch"},
    {"eval_batch_size", PL_OPT_INT, "0", 0, 1e9, NULL,
     "days per val / test batch; 0: the whole split in one batch"},
    {"shuffle", PL_OPT_BOOL, "true", PL_NO_BOUNDS, NULL, "shuffle the train days each epoch"},
    {"drop_last", PL_OPT_BOOL, "false", PL_NO_BOUNDS, NULL, "drop the last partial train batch"},
    PL_OPTIONS_END};

static void panel_destroy(void *self) {
    panel *P = self;
    if (!P) return;
    for (int s = 0; s < PL_SPLIT_COUNT; s++) {
        psplit *Sp = &P->sp[s];
        pl_tensor_release(Sp->x);
        pl_tensor_release(Sp->src);
        pl_tensor_release(Sp->dst);
        pl_tensor_release(Sp->y);
        pl_tensor_release(Sp->ret);
        pl_tensor_release(Sp->fac);
        free(Sp->rows);
        free(Sp->order);
    }
    pl_tensor_release(P->batch);
    free(P->hx);
    free(P->g);
    free(P->hy);
    free(P->hret);
    free(P->hfac);
    free(P->esrc);
    free(P->edst);
    free(P->sx);
    free(P->sy);
    free(P->sret);
    free(P->sfac);
    free(P->ssrc);
    free(P->sdst);
    pn_dscratch_free(&P->ds);
    lk_views_release(&P->views);
    free(P);
}

static pl_status panel_create(const pl_config_section *cfg, pl_run_context *ctx, void **self) {
    if (lk_predict_split(ctx) >= 0)
        return pl_error_set(PL_ERR_UNSUPPORTED,
                            "hdf5_panel: cannot serve `pipeline predict` (the run saves no "
                            "feature statistics to read new days with)");
    panel *P = calloc(1, sizeof *P);
    if (!P) return pl_error_set(PL_ERR_NOMEM, "hdf5_panel: out of memory");
    P->ctx = ctx;
    P->cur = -1;
    snprintf(P->path, sizeof P->path, "%s", pl_cfg_str(cfg, "path", ""));
    pl_status st = pn_read(P, cfg);
    if (st) {
        panel_destroy(P);
        return st;
    }
    *self = P;
    return PL_OK;
}

static int64_t panel_num_batches(void *self, pl_data_split split) {
    panel *P = self;
    if ((int)split < 0 || split >= PL_SPLIT_COUNT) return 0;
    return P->sp[split].nb;
}

static pl_status panel_epoch_begin(void *self, pl_data_split split, int64_t epoch,
                                   int64_t start_batch) {
    panel *P = self;
    if ((int)split < 0 || split >= PL_SPLIT_COUNT)
        return pl_error_set(PL_ERR_INVALID, "hdf5_panel: bad split %d", (int)split);
    pl_status st =
        lk_check_start("hdf5_panel", split, epoch, start_batch, P->sp[split].nb, P->path);
    if (st) return st;
    lk_views_release(&P->views);
    psplit *Sp = &P->sp[split];
    if (split == PL_SPLIT_TRAIN && P->shuffle && Sp->arranged_epoch != epoch) {
        Sp->arranged_epoch = -1;
        lk_shuffle_order(Sp->order, Sp->rows, Sp->nd,
                         (P->ctx ? P->ctx->seed : 0) + (uint64_t)epoch);
        if ((st = pn_arrange(P, Sp))) return st;
        Sp->arranged_epoch = epoch;
    }
    P->cur = split;
    P->cur_batch = start_batch;
    return PL_OK;
}

static int panel_next(void *self, pl_batch *out) {
    panel *P = self;
    lk_views_release(&P->views);
    memset(out, 0, sizeof *out);
    if (P->cur < 0) {
        pl_error_set(PL_ERR_INVALID, "hdf5_panel: next() before epoch_begin()");
        return -1;
    }
    psplit *Sp = &P->sp[P->cur];
    const int64_t b = P->cur_batch;
    if (b >= Sp->nb) return 0;
    const int64_t d0 = b * Sp->B, nd = Sp->nd - d0 < Sp->B ? Sp->nd - d0 : Sp->B;
    const int64_t n0 = d0 * P->S, nn = nd * P->S, e0 = d0 * P->E_day, ne = nd * P->E_day;
    if (P->per_batch && pn_rebuild_batch(P, Sp, d0, nd)) return -1;
    lk_views *v = &P->views;
    if (lk_emit(v, out, "x", lk_view_rows(Sp->x, n0, nn)) ||
        lk_emit(v, out, "edge_src", lk_view_rows(Sp->src, e0, ne)) ||
        lk_emit(v, out, "edge_dst", lk_view_rows(Sp->dst, e0, ne)) ||
        lk_emit(v, out, "batch", lk_view_rows(P->batch, 0, nn)) ||
        lk_emit(v, out, "y", lk_view_rows(Sp->y, n0, nn)) ||
        lk_emit(v, out, "ret", lk_view_rows(Sp->ret, n0, nn)) ||
        (Sp->fac && lk_emit(v, out, "factors", lk_view_rows(Sp->fac, n0, nn)))) {
        lk_views_release(v);
        memset(out, 0, sizeof *out);
        return -1;
    }
    out->size = nd;
    out->index = b;
    P->cur_batch = b + 1;
    return 1;
}

static pl_loader_stats panel_stats(void *self) {
    return ((panel *)self)->st;
}

/* x f32 [n, W, F], edge_src / edge_dst i64 [e], batch i64 [n], y / ret f32
 * [n], factors f32 [n, K] when the `factors` option names a dataset: from
 * the config alone. */
static pl_status panel_batch_fields(const pl_config_section *cfg, pl_field_list *out) {
    memset(out, 0, sizeof *out);
    pl_status st = pl_fields_add(out, "x", PL_F32, 3, false);
    if (!st) st = pl_fields_add(out, "edge_src", PL_I64, 1, false);
    if (!st) st = pl_fields_add(out, "edge_dst", PL_I64, 1, false);
    if (!st) st = pl_fields_add(out, "batch", PL_I64, 1, false);
    if (!st) st = pl_fields_add(out, "y", PL_F32, 1, false);
    if (!st) st = pl_fields_add(out, "ret", PL_F32, 1, false);
    if (!st && pl_cfg_str(cfg, "factors", "factors")[0])
        st = pl_fields_add(out, "factors", PL_F32, 2, false);
    return st;
}

/* Data parallel: whole batches to the ranks in turn (the trainer strides). */
static pl_status panel_shard(void *self, int rank, int world_size) {
    (void)self;
    (void)rank;
    (void)world_size;
    return pl_error_set(PL_ERR_UNSUPPORTED, "hdf5_panel: sharded by batch");
}

const pl_loader_vtable hdf5_panel_vtable = {
    .create = panel_create,
    .destroy = panel_destroy,
    .epoch_begin = panel_epoch_begin,
    .next = panel_next,
    .num_batches = panel_num_batches,
    .stats = panel_stats,
    .batch_fields = panel_batch_fields,
    .shard = panel_shard,
};
