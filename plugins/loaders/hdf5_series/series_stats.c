/* series_stats.c - hdf5_series: the statistics a run writes into its
 * directory and `pipeline predict` reads back (standardization.json, the
 * seasonal naive baselines of naive_period), so new rows are scaled and
 * judged as in training.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hdf5_series.h"

pl_status sr_write_standardization(series_loader *L, char names[][64], int nnames, const int *cols,
                                   int nc, const double *mean, const double *sd,
                                   int64_t train_rows) {
    if (!L->ctx || !L->ctx->run_dir) return PL_OK;
    cJSON *root = cJSON_CreateObject();
    cJSON *c = cJSON_AddArrayToObject(root, "columns");
    cJSON *m = cJSON_AddArrayToObject(root, "mean");
    cJSON *s = cJSON_AddArrayToObject(root, "std");
    for (int i = 0; i < nc; i++) {
        char nb[64];
        if (cols[i] < nnames)
            snprintf(nb, sizeof nb, "%s", names[cols[i]]);
        else
            snprintf(nb, sizeof nb, "%d", cols[i]);
        cJSON_AddItemToArray(c, cJSON_CreateString(nb));
        cJSON_AddItemToArray(m, cJSON_CreateNumber(mean[i]));
        cJSON_AddItemToArray(s, cJSON_CreateNumber(sd[i]));
    }
    cJSON_AddNumberToObject(root, "train_rows", (double)train_rows);
    cJSON_AddStringToObject(root, "source", L->path);
    cJSON_AddStringToObject(root, "formula",
                            "x_std = (x - mean) / std, population std of the training rows");
    char *txt = cJSON_Print(root);
    cJSON_Delete(root);
    char p[2048];
    snprintf(p, sizeof p, "%s/standardization.json", L->ctx->run_dir);
    FILE *f = fopen(p, "w");
    pl_status st = PL_OK;
    if (!f || fputs(txt, f) < 0) st = pl_error_set(PL_ERR_IO, "%s: cannot write", p);
    if (f) fclose(f);
    free(txt);
    return st;
}

/* `pipeline predict`: the mean and std the run computed over its training
 * rows (run_dir/standardization.json), so new rows are scaled as the model
 * was trained, whatever rows the input file holds. The file is untrusted:
 * its columns must be this config's, in order. */
pl_status sr_read_standardization(series_loader *L, char names[][64], int nnames, const int *cols,
                                  int nc, double *mean, double *sd) {
    char p[2048];
    snprintf(p, sizeof p, "%s/standardization.json",
             L->ctx && L->ctx->run_dir ? L->ctx->run_dir : ".");
    FILE *f = pl_file_fopen_read(p, NULL);
    if (!f && !errno) return pl_error_status(); /* not a regular file */
    if (!f)
        return pl_error_set(PL_ERR_IO,
                            "%s: cannot open (the run standardized its series; "
                            "predict needs its statistics)",
                            p);
    char *txt = NULL;
    long n = -1;
    if (!fseek(f, 0, SEEK_END) && (n = ftell(f)) >= 0 && n < (1L << 24) && !fseek(f, 0, SEEK_SET)) {
        txt = malloc((size_t)n + 1);
        if (txt && fread(txt, 1, (size_t)n, f) == (size_t)n)
            txt[n] = 0;
        else {
            free(txt);
            txt = NULL;
        }
    }
    fclose(f);
    if (!txt) return pl_error_set(PL_ERR_IO, "%s: cannot read (or larger than 16 MiB)", p);
    cJSON *root = cJSON_Parse(txt);
    free(txt);
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(root, "columns");
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(root, "mean");
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(root, "std");
    pl_status st = PL_OK;
    if (!cJSON_IsArray(c) || !cJSON_IsArray(m) || !cJSON_IsArray(d) ||
        cJSON_GetArraySize(c) != nc || cJSON_GetArraySize(m) != nc || cJSON_GetArraySize(d) != nc)
        st = pl_error_set(PL_ERR_IO,
                          "%s: expected arrays columns, mean and std of %d entries "
                          "(the feature then target columns of this config)",
                          p, nc);
    for (int i = 0; !st && i < nc; i++) {
        const cJSON *ci = cJSON_GetArrayItem(c, i), *mi = cJSON_GetArrayItem(m, i),
                    *di = cJSON_GetArrayItem(d, i);
        char nb[64];
        if (cols[i] < nnames)
            snprintf(nb, sizeof nb, "%s", names[cols[i]]);
        else
            snprintf(nb, sizeof nb, "%d", cols[i]);
        if (!cJSON_IsString(ci) || strcmp(ci->valuestring, nb))
            st = pl_error_set(PL_ERR_IO,
                              "%s: column %d is '%s', %s has '%s' there (the input "
                              "file's columns must be the training file's)",
                              p, i, cJSON_IsString(ci) ? ci->valuestring : "?", L->path, nb);
        else if (!cJSON_IsNumber(mi) || !cJSON_IsNumber(di) || !isfinite(mi->valuedouble) ||
                 !(di->valuedouble > 0) || !isfinite(di->valuedouble))
            st = pl_error_set(PL_ERR_IO,
                              "%s: mean/std of column '%s' must be finite numbers, "
                              "std > 0",
                              p, nb);
        else {
            mean[i] = mi->valuedouble;
            sd[i] = di->valuedouble;
        }
    }
    cJSON_Delete(root);
    return st;
}

/* ---- naive baselines on the training windows (naive_period) ------------- */

#define NAIVE_FILE "naive_baselines.json"

/* The training windows' MAE, in the target's original units, of the seasonal
 * naive forecast of target row r = e + h (h = 1..horizon, e = the window's
 * last input row), y[r - s], and of the same corrected by the last step's
 * seasonal difference, y[r - s] + y[e] - y[e - s]. Every row read is a
 * training row (a training window's last target is one), so the figures are
 * a function of the training data alone. A model that picks its baseline by
 * them (lstm naive_skip = auto) decides before it sees a batch. */
static void naive_mae(const float *raw, int64_t F, int tc, int64_t s, int64_t Lb, int64_t H,
                      int64_t nw, double *nae, double *cae) {
    double n = 0, c = 0;
    for (int64_t w = 0; w < nw; w++) {
        int64_t e = w + Lb - 1;
        double d = (double)raw[e * F + tc] - raw[(e - s) * F + tc];
        for (int64_t h = 1; h <= H; h++) {
            double y = raw[(e + h) * F + tc], f = raw[(e + h - s) * F + tc];
            n += fabs(f - y);
            c += fabs(f + d - y);
        }
    }
    *nae = n / (double)(nw * H);
    *cae = c / (double)(nw * H);
}

/* naive_period = s: checks it against the window, computes the two MAEs over
 * the training windows (or, under `pipeline predict`, reads the run's
 * run_dir/naive_baselines.json: the decision must be the training run's),
 * publishes them as meta and writes the file. */
pl_status sr_naive_baselines(series_loader *L, const pl_config_section *cfg, const float *raw,
                             int64_t F, int tc, const char *tname, const sr_timeframes *tf,
                             int64_t Lb, int64_t H, int64_t nw, bool predict) {
    int64_t s = pl_cfg_int(cfg, "naive_period", 0), W = tf->w[0];
    if (s <= 0) return PL_OK;
    if (tf->k[0] != 1)
        return pl_error_set(PL_ERR_CONFIG,
                            "hdf5_series: naive_period = %lld needs the first "
                            "timeframe to be single bars (timeframes starts with %lld)",
                            (long long)s, (long long)tf->k[0]);
    if (s < H || s >= W)
        return pl_error_set(PL_ERR_CONFIG,
                            "hdf5_series: naive_period = %lld must be >= horizon "
                            "(%lld: the forecast of step h reads row t + h - s, which must be an "
                            "input) and < window (%lld: the corrected one reads y[e - s] from "
                            "the window)",
                            (long long)s, (long long)H, (long long)W);
    char p[2048];
    snprintf(p, sizeof p, "%s/" NAIVE_FILE, L->ctx && L->ctx->run_dir ? L->ctx->run_dir : ".");
    double nae = 0, cae = 0;
    if (predict) {
        FILE *f = pl_file_fopen_read(p, NULL);
        if (!f && !errno) return pl_error_status(); /* not a regular file */
        char txt[4096];
        size_t n = f ? fread(txt, 1, sizeof txt - 1, f) : 0;
        if (f) fclose(f);
        txt[n] = 0;
        cJSON *root = f ? cJSON_Parse(txt) : NULL;
        const cJSON *jp = cJSON_GetObjectItemCaseSensitive(root, "naive_period");
        const cJSON *jn = cJSON_GetObjectItemCaseSensitive(root, "train_seasonal_naive_mae");
        const cJSON *jc =
            cJSON_GetObjectItemCaseSensitive(root, "train_seasonal_naive_corrected_mae");
        bool ok = cJSON_IsNumber(jp) && cJSON_IsNumber(jn) && cJSON_IsNumber(jc) &&
                  isfinite(jn->valuedouble) && isfinite(jc->valuedouble);
        int64_t fs = ok ? (int64_t)jp->valuedouble : -1;
        if (ok) {
            nae = jn->valuedouble;
            cae = jc->valuedouble;
        }
        cJSON_Delete(root);
        if (!f)
            return pl_error_set(PL_ERR_IO,
                                "%s: cannot open (the run had naive_period = %lld; "
                                "predict needs its training-window figures)",
                                p, (long long)s);
        if (!ok)
            return pl_error_set(PL_ERR_IO,
                                "%s: expected numbers naive_period, "
                                "train_seasonal_naive_mae and train_seasonal_naive_corrected_mae",
                                p);
        if (fs != s)
            return pl_error_set(PL_ERR_IO, "%s: naive_period %lld, the config has %lld", p,
                                (long long)fs, (long long)s);
    } else {
        naive_mae(raw, F, tc, s, Lb, H, nw, &nae, &cae);
        pl_message("hdf5_series: training windows (%lld) of '%s', naive_period %lld: seasonal "
                   "naive MAE %.6g, corrected %.6g",
                   (long long)nw, tname, (long long)s, nae, cae);
    }
    lk_meta_int(L->ctx, "naive_period", s);
    lk_meta_float(L->ctx, "train_seasonal_naive_mae", nae);
    lk_meta_float(L->ctx, "train_seasonal_naive_corrected_mae", cae);
    if (predict || !L->ctx || !L->ctx->run_dir) return PL_OK;
    cJSON *root = cJSON_CreateObject();
    cJSON_AddNumberToObject(root, "naive_period", (double)s);
    cJSON_AddStringToObject(root, "target", tname);
    cJSON_AddNumberToObject(root, "train_windows", (double)nw);
    cJSON_AddNumberToObject(root, "train_seasonal_naive_mae", nae);
    cJSON_AddNumberToObject(root, "train_seasonal_naive_corrected_mae", cae);
    char *txt = cJSON_Print(root);
    cJSON_Delete(root);
    FILE *f = txt ? fopen(p, "w") : NULL;
    pl_status st = PL_OK;
    if (!f || fputs(txt, f) < 0) st = pl_error_set(PL_ERR_IO, "%s: cannot write", p);
    if (f) fclose(f);
    free(txt);
    return st;
}
