/* stateless_loader.c - a minimal in-memory loader plugin used only by the
 * trainer tests (tests/core/test_trainer.c). Since ABI 2 no loader has a
 * `state` function: like every loader it serves a split in an order fixed by
 * (seed, epoch) (here: row order) and starts at any batch. Built into the
 * test folder, not the plugin dir.
 *
 * Synthetic regression rows served in order (no shuffle), split s in 0..2:
 *   x[i][j] = sin(0.37 * (i + 1000 s) + j),  y[i] = sum_j (j + 1) x[i][j] / 5.
 */
#include <math.h>
#include <stdlib.h>

#include "pipeline/pipeline.h"

#define NF 5

typedef struct sl {
    pl_tensor *x[PL_SPLIT_COUNT], *y[PL_SPLIT_COUNT];
    int64_t n[PL_SPLIT_COUNT], batch, pos;
    int split;
    pl_tensor *views[2];
} sl;

static void release_views(sl *L) {
    for (int i = 0; i < 2; i++) pl_tensor_release(L->views[i]);
    L->views[0] = L->views[1] = NULL;
}

static void sl_destroy(void *self) {
    sl *L = self;
    if (!L) return;
    release_views(L);
    for (int s = 0; s < PL_SPLIT_COUNT; s++) {
        pl_tensor_release(L->x[s]);
        pl_tensor_release(L->y[s]);
    }
    free(L);
}

static pl_status sl_create(const pl_config_section *cfg, pl_run_context *ctx, void **self) {
    sl *L = calloc(1, sizeof *L);
    if (!L) return pl_error_set(PL_ERR_NOMEM, "test_stateless_loader: out of memory");
    L->batch = pl_cfg_int(cfg, "batch_size", 8);
    L->n[PL_SPLIT_TRAIN] = pl_cfg_int(cfg, "num_train", 64);
    L->n[PL_SPLIT_VAL] = L->n[PL_SPLIT_TEST] = 32;
    L->split = -1;
    pl_frame_begin();
    for (int s = 0; s < PL_SPLIT_COUNT; s++) {
        int64_t n = L->n[s];
        L->x[s] = pl_frame_keep(pl_tensor_empty(PL_F32, 2, (int64_t[]){n, NF}, PL_CPU));
        L->y[s] = pl_frame_keep(pl_tensor_empty(PL_F32, 2, (int64_t[]){n, 1}, PL_CPU));
        if (!L->x[s] || !L->y[s]) break;
        float *x = pl_tensor_f32(L->x[s]), *y = pl_tensor_f32(L->y[s]);
        for (int64_t i = 0; i < n; i++) {
            double t = 0;
            for (int j = 0; j < NF; j++) {
                x[i * NF + j] = (float)sin(0.37 * (double)(i + 1000 * s) + j);
                t += (j + 1) * x[i * NF + j];
            }
            y[i] = (float)(t / 5);
        }
    }
    pl_frame_end();
    for (int s = 0; s < PL_SPLIT_COUNT; s++)
        if (!L->x[s] || !L->y[s]) {
            sl_destroy(L);
            return pl_error_status();
        }
    if (ctx && ctx->meta) {
        pl_meta_set_int(ctx->meta, "num_features", NF);
        pl_meta_set_int(ctx->meta, "num_train", L->n[PL_SPLIT_TRAIN]);
    }
    *self = L;
    return PL_OK;
}

static pl_status sl_epoch_begin(void *self, pl_data_split split, int64_t epoch, int64_t start) {
    (void)epoch;
    sl *L = self;
    release_views(L);
    int64_t nb = (L->n[split] + L->batch - 1) / L->batch;
    if (start < 0 || start > nb)
        return pl_error_set(PL_ERR_INVALID, "test_stateless_loader: start_batch %lld of split '%s' "
                            "outside 0..%lld", (long long)start, pl_split_name(split), (long long)nb);
    L->split = split;
    L->pos = start * L->batch;
    return PL_OK;
}

static int sl_next(void *self, pl_batch *out) {
    sl *L = self;
    release_views(L);
    *out = (pl_batch){0};
    int64_t left = L->n[L->split] - L->pos;
    if (left <= 0) return 0;
    int64_t n = left < L->batch ? left : L->batch;
    pl_frame_begin();
    L->views[0] = pl_frame_keep(pl_tensor_view_rows(L->x[L->split], L->pos, n));
    L->views[1] = pl_frame_keep(pl_tensor_view_rows(L->y[L->split], L->pos, n));
    pl_frame_end();
    if (!L->views[0] || !L->views[1]) return -1;
    out->n = 2;
    out->names[0] = "x";
    out->names[1] = "y";
    out->fields[0] = L->views[0];
    out->fields[1] = L->views[1];
    out->size = n;
    out->index = L->pos / L->batch;
    L->pos += n;
    return 1;
}

static int64_t sl_num_batches(void *self, pl_data_split split) {
    sl *L = self;
    return (L->n[split] + L->batch - 1) / L->batch;
}

static pl_status sl_batch_fields(const pl_config_section *cfg, pl_field_list *out) {
    (void)cfg;
    out->n = 0;
    pl_status st = pl_fields_add(out, "x", PL_F32, 2, false);
    return st ? st : pl_fields_add(out, "y", PL_F32, 2, false);
}

static const pl_option_spec opts[] = {
    {"batch_size", PL_OPT_INT, "8", 1, 1e6, NULL, "samples per batch"},
    {"num_train", PL_OPT_INT, "64", 1, 1e6, NULL, "train rows (val and test: 32)"},
    PL_OPTIONS_END};
static const pl_loader_vtable vt = {.create = sl_create,
                                    .destroy = sl_destroy,
                                    .epoch_begin = sl_epoch_begin,
                                    .next = sl_next,
                                    .num_batches = sl_num_batches,
                                    .batch_fields = sl_batch_fields};
PL_PLUGIN_DEFINE(test_stateless_loader, PL_KIND_LOADER, "0.0.1",
                 "test-only in-memory loader", opts, &vt)
