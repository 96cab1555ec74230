/* synth_regression.c - a synthetic linear-regression data set generated in
 * memory: y = w . x + noise.
 *
 * From `data_seed`: the true weights w_j ~ N(0, 1), inputs x_ij ~ N(0, 1)
 * and noise_i ~ N(0, noise^2), each a function of (data_seed, split, i, j)
 * only (a counter-based hash, splitmix64, and Box-Muller), so every process
 * builds the same data. Batches carry
 *   x  f32 [B, num_features]
 *   y  f32 [B, 1]
 * The train split is reshuffled every epoch by a permutation that is a pure
 * function of ([pipeline] seed, epoch) (Fisher-Yates); val and test keep
 * their order. epoch_begin(split, epoch, start_batch) starts at any batch of
 * that order, which is all the trainer needs to resume mid-epoch: the loader
 * keeps no position state (ABI 2 loader contract of <pipeline/plugin.h>).
 * It publishes "num_features" and "num_targets" (1) for the model.
 * Built only against the installed headers. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <pipeline/pipeline.h>

typedef struct split_data {
    int64_t n; /* samples */
    float *x;  /* [n, F] row-major */
    float *y;  /* [n] */
} split_data;

typedef struct synth {
    int64_t features, batch_size;
    bool shuffle, drop_last;
    uint64_t seed; /* [pipeline] seed: shuffling */
    split_data data[PL_SPLIT_COUNT];
    int64_t *order; /* train permutation of the current epoch */
    /* the epoch being served */
    pl_data_split split;
    int64_t next_batch, n_batches;
    /* batch buffers, owned (never adopted by a frame); fields are views of
     * these valid until the next call of next() */
    pl_tensor *bx, *by;
    int64_t rows; /* rows of bx/by */
} synth;

static const pl_option_spec sr_options[] = {
    {"num_features", PL_OPT_INT, "8", 1, 65536, NULL, "input width F"},
    {"train_samples", PL_OPT_INT, "2048", 1, 1e8, NULL, "samples of the train split"},
    {"val_samples", PL_OPT_INT, "512", 1, 1e8, NULL, "samples of the val split"},
    {"test_samples", PL_OPT_INT, "512", 1, 1e8, NULL, "samples of the test split"},
    {"batch_size", PL_OPT_INT, "64", 1, 1e7, NULL, "samples per batch"},
    {"noise", PL_OPT_FLOAT, "0.1", 0, 1e6, NULL, "standard deviation of the additive noise"},
    {"data_seed", PL_OPT_INT, "1234", 0, 9007199254740992.0, NULL,
     "seed of the weights, inputs and noise (the data set)"},
    {"shuffle", PL_OPT_BOOL, "true", PL_NO_BOUNDS, NULL, "reshuffle the train split every epoch"},
    {"drop_last", PL_OPT_BOOL, "false", PL_NO_BOUNDS, NULL, "drop the last incomplete train batch"},
    PL_OPTIONS_END};

/* ---- counter-based randomness ------------------------------------------- */

static uint64_t splitmix64(uint64_t z) {
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* uniform in (0, 1) from the counter (seed, a, b, c) */
static double u01(uint64_t seed, uint64_t a, uint64_t b, uint64_t c) {
    uint64_t h = splitmix64(splitmix64(splitmix64(splitmix64(seed) ^ a) ^ b) ^ c);
    return ((double)(h >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

/* N(0, 1) by Box-Muller from two uniforms of the counter */
static double normal(uint64_t seed, uint64_t a, uint64_t b, uint64_t c) {
    double u1 = u01(seed, a, b, 2 * c), u2 = u01(seed, a, b, 2 * c + 1);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* ---- the data set ----------------------------------------------------------- */

enum { STREAM_WEIGHTS = 100 }; /* splits use streams 0..2 */

static pl_status build_split(synth *s, pl_data_split sp, int64_t n, uint64_t dseed, double noise,
                             const double *w) {
    split_data *d = &s->data[sp];
    const int64_t F = s->features;
    d->n = n;
    d->x = malloc((size_t)(n * F) * sizeof *d->x);
    d->y = malloc((size_t)n * sizeof *d->y);
    if (!d->x || !d->y)
        return pl_error_set(PL_ERR_NOMEM,
                            "synth_regression: out of memory for the %s split "
                            "(%lld x %lld)",
                            pl_split_name(sp), (long long)n, (long long)F);
    for (int64_t i = 0; i < n; i++) {
        double y = 0;
        for (int64_t j = 0; j < F; j++) {
            double x = normal(dseed, (uint64_t)sp, (uint64_t)i, (uint64_t)j);
            d->x[i * F + j] = (float)x;
            y += w[j] * x;
        }
        y += noise * normal(dseed, (uint64_t)sp, (uint64_t)i, (uint64_t)F);
        d->y[i] = (float)y;
    }
    return PL_OK;
}

static void sr_destroy(void *self) {
    synth *s = self;
    if (!s) return;
    for (int i = 0; i < PL_SPLIT_COUNT; i++) {
        free(s->data[i].x);
        free(s->data[i].y);
    }
    free(s->order);
    pl_tensor_release(s->bx);
    pl_tensor_release(s->by);
    free(s);
}

static pl_status sr_create(const pl_config_section *cfg, pl_run_context *ctx, void **self) {
    *self = NULL;
    synth *s = calloc(1, sizeof *s);
    if (!s) return pl_error_set(PL_ERR_NOMEM, "synth_regression: out of memory");
    s->features = pl_cfg_int(cfg, "num_features", 8);
    s->batch_size = pl_cfg_int(cfg, "batch_size", 64);
    s->shuffle = pl_cfg_bool(cfg, "shuffle", true);
    s->drop_last = pl_cfg_bool(cfg, "drop_last", false);
    s->seed = ctx->seed;
    const uint64_t dseed = (uint64_t)pl_cfg_int(cfg, "data_seed", 1234);
    const double noise = pl_cfg_float(cfg, "noise", 0.1);
    const int64_t n[PL_SPLIT_COUNT] = {pl_cfg_int(cfg, "train_samples", 2048),
                                       pl_cfg_int(cfg, "val_samples", 512),
                                       pl_cfg_int(cfg, "test_samples", 512)};
    double *w = malloc((size_t)s->features * sizeof *w);
    s->order = malloc((size_t)n[PL_SPLIT_TRAIN] * sizeof *s->order);
    pl_status st =
        (!w || !s->order) ? pl_error_set(PL_ERR_NOMEM, "synth_regression: out of memory") : PL_OK;
    for (int64_t j = 0; j < s->features && !st; j++)
        w[j] = normal(dseed, STREAM_WEIGHTS, 0, (uint64_t)j);
    for (int sp = 0; sp < PL_SPLIT_COUNT && !st; sp++)
        st = build_split(s, (pl_data_split)sp, n[sp], dseed, noise, w);
    free(w);
    /* facts for the model: it sizes its weight from num_features */
    if (!st) st = pl_meta_set_int(ctx->meta, "num_features", s->features);
    if (!st) st = pl_meta_set_int(ctx->meta, "num_targets", 1);
    if (st) {
        sr_destroy(s);
        return st;
    }
    s->split = PL_SPLIT_COUNT; /* no epoch begun */
    *self = s;
    return PL_OK;
}

static int64_t sr_num_batches(void *self, pl_data_split split) {
    const synth *s = self;
    if ((unsigned)split >= PL_SPLIT_COUNT) return 0;
    int64_t n = s->data[split].n, b = s->batch_size;
    if (split == PL_SPLIT_TRAIN && s->drop_last) return n / b;
    return (n + b - 1) / b;
}

static pl_status sr_epoch_begin(void *self, pl_data_split split, int64_t epoch,
                                int64_t start_batch) {
    synth *s = self;
    if ((unsigned)split >= PL_SPLIT_COUNT)
        return pl_error_set(PL_ERR_INVALID, "synth_regression: unknown split %d", (int)split);
    int64_t nb = sr_num_batches(s, split);
    if (start_batch < 0 || start_batch > nb)
        return pl_error_set(PL_ERR_INVALID,
                            "synth_regression: start batch %lld of the %s split "
                            "is outside [0, %lld]",
                            (long long)start_batch, pl_split_name(split), (long long)nb);
    if (split == PL_SPLIT_TRAIN) {
        /* the epoch's order: identity, then Fisher-Yates with draws that are
         * a pure function of (seed, epoch); batches before start_batch are
         * never read, only their place in the order counts */
        int64_t n = s->data[PL_SPLIT_TRAIN].n;
        for (int64_t i = 0; i < n; i++)
            s->order[i] = i;
        if (s->shuffle)
            for (int64_t i = n - 1; i > 0; i--) {
                int64_t j =
                    (int64_t)(u01(s->seed, 0x5eed, (uint64_t)epoch, (uint64_t)i) * (double)(i + 1));
                if (j > i) j = i;
                int64_t t = s->order[i];
                s->order[i] = s->order[j];
                s->order[j] = t;
            }
    }
    s->split = split;
    s->next_batch = start_batch;
    s->n_batches = nb;
    return PL_OK;
}

/* bx/by with `rows` rows, reallocated only when the row count changes (the
 * last, shorter batch of an epoch) */
static pl_status ensure_buffers(synth *s, int64_t rows) {
    if (s->bx && s->rows == rows) return PL_OK;
    pl_tensor_release(s->bx);
    pl_tensor_release(s->by);
    s->bx = pl_tensor_empty_owned(PL_F32, PL_SHAPE(rows, s->features), PL_CPU);
    s->by = pl_tensor_empty_owned(PL_F32, PL_SHAPE(rows, 1), PL_CPU);
    s->rows = rows;
    if (!s->bx || !s->by) {
        pl_tensor_release(s->bx);
        pl_tensor_release(s->by);
        s->bx = s->by = NULL;
        return pl_error_prefix(pl_error_status(), "synth_regression: batch buffers");
    }
    return PL_OK;
}

static int sr_next(void *self, pl_batch *out) {
    synth *s = self;
    if (s->split == PL_SPLIT_COUNT) {
        pl_error_set(PL_ERR_INVALID, "synth_regression: next() before epoch_begin()");
        return -1;
    }
    if (s->next_batch >= s->n_batches) return 0;
    const split_data *d = &s->data[s->split];
    const int64_t F = s->features, first = s->next_batch * s->batch_size;
    const int64_t rows = d->n - first < s->batch_size ? d->n - first : s->batch_size;
    if (ensure_buffers(s, rows)) return -1;
    float *x = pl_tensor_f32(s->bx), *y = pl_tensor_f32(s->by);
    for (int64_t r = 0; r < rows; r++) {
        int64_t i = s->split == PL_SPLIT_TRAIN ? s->order[first + r] : first + r;
        memcpy(x + r * F, d->x + i * F, (size_t)F * sizeof *x);
        y[r] = d->y[i];
    }
    memset(out, 0, sizeof *out);
    out->n = 2;
    out->names[0] = "x";
    out->fields[0] = s->bx;
    out->names[1] = "y";
    out->fields[1] = s->by;
    out->size = rows;
    out->index = s->next_batch++;
    return 1;
}

/* What every batch carries; a pure function of the config (no create). */
static pl_status sr_batch_fields(const pl_config_section *cfg, pl_field_list *out) {
    (void)cfg;
    pl_status st = pl_fields_add(out, "x", PL_F32, 2, false);
    if (!st) st = pl_fields_add(out, "y", PL_F32, 2, false);
    return st;
}

static const pl_loader_vtable sr_vtable = {
    .create = sr_create,
    .destroy = sr_destroy,
    .epoch_begin = sr_epoch_begin,
    .next = sr_next,
    .num_batches = sr_num_batches,
    .stats = NULL, /* optional: no I/O to report */
    .batch_fields = sr_batch_fields,
};

PL_PLUGIN_DEFINE(synth_regression, PL_KIND_LOADER, "1.0.0",
                 "synthetic linear regression y = w.x + noise, generated from a seed", sr_options,
                 &sr_vtable)
