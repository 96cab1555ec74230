/* alias.c - hdf5_chunk, the deprecated name of two loaders: it was one
 * plugin with a rows mode and a series mode (window > 0 or timeframes),
 * which are now hdf5_rows and hdf5_series (plugins/loaders/README.md).
 *
 * It accepts the union of their options (an old config validates as before),
 * creates the loader the section's mode names, prints one deprecation line
 * naming it, and forwards every call. Nothing else: the two loaders are
 * linked in from their static libraries.
 */
#include <stdlib.h>
#include <string.h>

#include "hdf5_rows_api.h"
#include "hdf5_series_api.h"
#include "loader_kit.h"

typedef struct alias {
    const pl_loader_vtable *vt;
    void *self;
} alias;

static pl_option_spec options[64];

__attribute__((constructor)) static void merge_options(void) {
    const pl_option_spec *const lists[] = {hdf5_rows_options, hdf5_series_options};
    lk_merge_options(options, (int)(sizeof options / sizeof *options), lists, 2);
}

/* The old rule: series mode when window > 0 or timeframes are given. */
static bool series_mode(const pl_config_section *cfg) {
    return pl_cfg_int(cfg, "window", 0) > 0 || pl_cfg_str(cfg, "timeframes", "")[0];
}

/* The loader cfg selects; the series-only date keys are refused in rows mode
 * (they would be ignored silently). */
static pl_status pick(const pl_config_section *cfg, const pl_loader_vtable **vt,
                      const char **name) {
    bool series = series_mode(cfg);
    *vt = series ? &hdf5_series_vtable : &hdf5_rows_vtable;
    *name = series ? "hdf5_series" : "hdf5_rows";
    const char *te = pl_cfg_str(cfg, "train_end", ""), *ve = pl_cfg_str(cfg, "val_end", "");
    if (!series && (te[0] || ve[0]))
        return pl_error_set(PL_ERR_CONFIG,
                            "hdf5_chunk: %s = %s applies to series mode (window > 0) "
                            "only; rows mode splits by group (train_group, ...) or split_fractions",
                            te[0] ? "train_end" : "val_end", te[0] ? te : ve);
    return PL_OK;
}

static pl_status a_create(const pl_config_section *cfg, pl_run_context *ctx, void **self) {
    const pl_loader_vtable *vt;
    const char *name;
    pl_status st = pick(cfg, &vt, &name);
    if (st) return st;
    lk_deprecated("hdf5_chunk", series_mode(cfg) ? " (series mode)" : "", name);
    alias *A = calloc(1, sizeof *A);
    if (!A) return pl_error_set(PL_ERR_NOMEM, "hdf5_chunk: out of memory");
    A->vt = vt;
    if ((st = vt->create(cfg, ctx, &A->self))) {
        free(A);
        return st;
    }
    *self = A;
    return PL_OK;
}

static void a_destroy(void *self) {
    alias *A = self;
    if (!A) return;
    A->vt->destroy(A->self);
    free(A);
}

static pl_status a_epoch_begin(void *self, pl_data_split split, int64_t epoch, int64_t start) {
    alias *A = self;
    return A->vt->epoch_begin(A->self, split, epoch, start);
}

static int a_next(void *self, pl_batch *out) {
    alias *A = self;
    return A->vt->next(A->self, out);
}

static int64_t a_num_batches(void *self, pl_data_split split) {
    alias *A = self;
    return A->vt->num_batches(A->self, split);
}

static pl_loader_stats a_stats(void *self) {
    alias *A = self;
    return A->vt->stats(A->self);
}

static pl_status a_batch_fields(const pl_config_section *cfg, pl_field_list *out) {
    const pl_loader_vtable *vt;
    const char *name;
    memset(out, 0, sizeof *out);
    pl_status st = pick(cfg, &vt, &name);
    return st ? st : vt->batch_fields(cfg, out);
}

static const pl_loader_vtable vt = {
    .create = a_create,
    .destroy = a_destroy,
    .epoch_begin = a_epoch_begin,
    .next = a_next,
    .num_batches = a_num_batches,
    .stats = a_stats,
    .batch_fields = a_batch_fields,
};

PL_PLUGIN_DEFINE(hdf5_chunk, PL_KIND_LOADER, "0.3.0",
                 "deprecated: rows mode is hdf5_rows, series mode (window > 0) hdf5_series; "
                 "forwards to them",
                 options, &vt)
