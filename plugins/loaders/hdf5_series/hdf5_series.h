/* hdf5_series.h - internals of the hdf5_series loader shared by its files
 * (not part of the SDK; nothing here is exported from the .so).
 *
 *   hdf5_series.c   the plugin: options, vtable, create/destroy, epochs,
 *                   batches (strided views, or a shuffled batch gathered by
 *                   one index_select per field)
 *   series_read.c   reading the [T, F] series: columns, split points,
 *                   windows, standardization, the timeframes' matrices, meta
 *   series_times.c  row times (/time seconds or /date days), split bounds
 *   series_stats.c  standardization.json, the seasonal naive baselines
 *   timeframes.c    the timeframes / windows options, k-bar aggregates
 *
 * Calls go one way: hdf5_series.c -> series_read.c -> the three others.
 */
#ifndef HDF5_SERIES_H
#define HDF5_SERIES_H

#include <hdf5.h>
#include <stdbool.h>
#include <stdint.h>

#include "loader_kit.h"
#include "pipeline/pipeline.h"

#define SR_NAME_LEN 256
#define SR_MAX_TF 8      /* timeframes of a multi-timeframe series */
#define SR_MAX_COLS 1024 /* feature or target columns */

/* The timeframes (options timeframes / windows): timeframe i has windows of
 * w[i] rows of trailing k[i]-bar aggregates; n = 1, k = {1}, w = {window}
 * for a plain series. */
typedef struct sr_timeframes {
    int n;
    int64_t k[SR_MAX_TF], w[SR_MAX_TF];
} sr_timeframes;

/* One split: windows [w0, w1). */
typedef struct series_split {
    bool present, shuffle, drop_last;
    int64_t batch, nrows, w0, w1;
    char where[SR_NAME_LEN]; /* "windows 0..80 of /series" for messages */
    char span[72];           /* its windows' last targets "2001-01-22..2013-12-31"; else "" */
} series_split;

typedef struct series_loader {
    pl_run_context *ctx;
    pl_device dev;
    char path[1024];
    hid_t file;
    series_split sp[PL_SPLIT_COUNT];
    /* epoch cursor */
    int cur_split;
    int64_t epoch, row_pos, batch_index;
    int64_t *perm; /* the train windows' order of the epoch */
    lk_views views;
    pl_loader_stats st;
    /* the series: [T, Ff] features, [T, Ft] targets (on the device) */
    pl_tensor *feat, *targ;
    int64_t T, Ff, Ft, window, horizon;
    /* timeframes: per timeframe its [T, Ff] matrix (tfm[i] is feat, retained,
     * when k = 1); a window's last input row is w + lookback - 1 */
    sr_timeframes tf;
    int64_t lookback;
    pl_tensor *tfm[SR_MAX_TF];
    char tfname[SR_MAX_TF][24]; /* batch field names: "x", "x_tf<k>" */
    /* shuffled batches: gather buffers [batch * W_i, Ff] per timeframe and
     * [batch * horizon, Ft], the rows to gather (host gidx, device gidx_dev
     * per field: one upload and one index_select per field and batch) */
    pl_tensor *tfg[SR_MAX_TF], *wy_g;
    int64_t *gidx;
    pl_tensor *gidx_dev[SR_MAX_TF + 1];
} series_loader;

/* ---- series_read.c ---- */
/* Read the series named by cfg into L (L->path, L->file open, the splits'
 * batch / shuffle / drop_last set): everything of README "Layout" and
 * "Splits"; publishes the meta. */
pl_status sr_open_series(series_loader *L, const pl_config_section *cfg);

/* ---- series_times.c ---- */
/* train_end / val_end: "YYYY-MM-DD" -> *day, *has_time = false; or
 * "YYYY-MM-DDThh:mm[:ss]" + zone -> *sec (UTC seconds), *has_time = true. */
pl_status sr_parse_bound(const char *key, const char *s, int64_t *day, int64_t *sec,
                         bool *has_time);
/* Seconds since 1970 -> "YYYY-MM-DDThh:mmZ" (":ss" when not 0), UTC. */
void sr_format_time(int64_t sec, char *out, size_t n);
/* The rows' times: *secs = true and /time (time_dataset) when the file has
 * it, else /date (date_dataset, days). `need`: an absent or unreadable
 * dataset is an error (and unsorted times); otherwise *out = NULL, no error. */
pl_status sr_read_row_times(series_loader *L, const pl_config_section *cfg, int64_t T,
                            const char *sname, bool need, int64_t **out, bool *secs, char *dname,
                            size_t dn);
/* Multi-timeframe rows must be regular bars: PL_ERR_INVALID naming the
 * dataset and the first irregular step. */
pl_status sr_check_regular(const series_loader *L, const int64_t *date, int64_t T, bool secs,
                           const char *dname);

/* ---- series_stats.c ---- */
/* run_dir/standardization.json: written by training, read by predict (its
 * columns must be this config's, in order). */
pl_status sr_write_standardization(series_loader *L, char names[][64], int nnames, const int *cols,
                                   int nc, const double *mean, const double *sd,
                                   int64_t train_rows);
pl_status sr_read_standardization(series_loader *L, char names[][64], int nnames, const int *cols,
                                  int nc, double *mean, double *sd);
/* naive_period = s > 0: the training windows' seasonal naive MAEs as meta
 * and run_dir/naive_baselines.json (predict: read from there). */
pl_status sr_naive_baselines(series_loader *L, const pl_config_section *cfg, const float *raw,
                             int64_t F, int tc, const char *tname, const sr_timeframes *tf,
                             int64_t Lb, int64_t H, int64_t nw, bool predict);

/* ---- timeframes.c ---- */
/* The timeframes of cfg (options timeframes, windows; window): refused with
 * PL_ERR_CONFIG when the lists differ in length, hold a value < 1, more than
 * SR_MAX_TF entries, bar counts not strictly increasing, or window is set
 * and differs from the first of windows. No timeframes: n = 1, {1}, {window}. */
pl_status sr_parse_timeframes(const pl_config_section *cfg, sr_timeframes *tf);
/* Batch field of timeframe i: "x" for i = 0, else "x_tf<k>" (n >= 24 bytes). */
void sr_timeframe_field(const sr_timeframes *tf, int i, char *out, size_t n);
typedef enum { AGG_LAST, AGG_FIRST, AGG_MAX, AGG_MIN, AGG_SUM, AGG_MEAN } sr_agg_rule;
/* timeframe_agg "open=first,high=max" -> the rule of each feature column. */
pl_status sr_parse_agg(const char *spec, char names[][64], int nnames, const int *fcols, int nfc,
                       sr_agg_rule *rule);
/* Timeframe of k bars: a new CPU tensor [T, nfc] of trailing k-bar
 * aggregates, standardized over the training rows [k-1, a) when stdz. */
pl_status sr_build_timeframe(const char *path, const float *raw, int64_t T, int64_t F,
                             const int *fcols, int nfc, const sr_agg_rule *rule, int64_t k,
                             int64_t a, bool stdz, pl_tensor **out);

#endif
