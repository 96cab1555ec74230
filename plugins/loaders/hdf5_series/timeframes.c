/* timeframes.c - hdf5_series: the timeframes / windows options and the
 * matrices of trailing k-bar aggregates.
 *
 * Multi-timeframe (timeframes = k0,k1,.. bars, windows = W0,W1,..): for
 * every timeframe k a [T, Ff] matrix of trailing k-bar aggregates (row r =
 * bars r-k+1 .. r: open first, high max, ... per timeframe_agg), standardized
 * with its own training-row statistics; window w ends at the same last input
 * row e = w + lookback - 1 in every timeframe (rows e - (W-1)k, .., e - k, e)
 * and its targets are rows e+1 .. e+horizon, so no input covers a target bar.
 * lookback = max_i k_i W_i.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hdf5_series.h"

/* "1,4,24" -> v[0..*n), each an integer >= 1. */
static pl_status parse_int_list(const char *key, const char *spec, int64_t *v, int *n) {
    *n = 0;
    const char *p = spec;
    while (*p) {
        char *end;
        while (*p == ' ')
            p++;
        long long x = strtoll(p, &end, 10);
        while (*end == ' ')
            end++;
        if (end == p || (*end && *end != ',') || x < 1 || x > 1000000000LL)
            return pl_error_set(PL_ERR_CONFIG,
                                "hdf5_series: %s = '%s': expected integers >= 1 "
                                "separated by commas",
                                key, spec);
        if (*n >= SR_MAX_TF)
            return pl_error_set(PL_ERR_CONFIG, "hdf5_series: %s = '%s': at most %d entries", key,
                                spec, SR_MAX_TF);
        v[(*n)++] = x;
        p = *end ? end + 1 : end;
    }
    return PL_OK;
}

pl_status sr_parse_timeframes(const pl_config_section *cfg, sr_timeframes *tf) {
    const char *ks = pl_cfg_str(cfg, "timeframes", ""), *ws = pl_cfg_str(cfg, "windows", "");
    int64_t W = pl_cfg_int(cfg, "window", 0);
    memset(tf, 0, sizeof *tf);
    if (!ks[0]) {
        if (ws[0])
            return pl_error_set(PL_ERR_CONFIG,
                                "hdf5_series: windows = %s without timeframes: "
                                "windows gives the length of each timeframe's window",
                                ws);
        tf->n = 1;
        tf->k[0] = 1;
        tf->w[0] = W;
        return PL_OK;
    }
    int nw = 0;
    pl_status st = parse_int_list("timeframes", ks, tf->k, &tf->n);
    if (!st) st = parse_int_list("windows", ws, tf->w, &nw);
    if (st) return st;
    if (nw != tf->n)
        return pl_error_set(PL_ERR_CONFIG,
                            "hdf5_series: timeframes = %s has %d entries, windows = "
                            "%s has %d: one window length per timeframe",
                            ks, tf->n, ws, nw);
    for (int i = 1; i < tf->n; i++)
        if (tf->k[i] <= tf->k[i - 1])
            return pl_error_set(PL_ERR_CONFIG,
                                "hdf5_series: timeframes = %s: bar counts must "
                                "increase (finest first; field x is the first)",
                                ks);
    if (W > 0 && W != tf->w[0])
        return pl_error_set(PL_ERR_CONFIG,
                            "hdf5_series: window = %lld but windows = %s starts "
                            "with %lld: with timeframes, leave window out (windows sets it)",
                            (long long)W, ws, (long long)tf->w[0]);
    return PL_OK;
}

void sr_timeframe_field(const sr_timeframes *tf, int i, char *out, size_t n) {
    if (i == 0)
        snprintf(out, n, "x");
    else
        snprintf(out, n, "x_tf%lld", (long long)tf->k[i]);
}

typedef struct agg_ctx {
    const char *spec;
    char (*names)[64];
    int nnames;
    const int *fcols;
    int nfc;
    sr_agg_rule *rule;
} agg_ctx;

static pl_status add_agg(const char *tok, int index, void *ud) {
    (void)index;
    static const char *const rn[] = {"last", "first", "max", "min", "sum", "mean"};
    agg_ctx *x = ud;
    const char *eq = strchr(tok, '=');
    int r = -1;
    const char *rule = eq ? eq + 1 : "";
    while (*rule == ' ')
        rule++;
    for (int j = 0; eq && j < 6; j++)
        if (!strcmp(rule, rn[j])) r = j;
    if (!eq || r < 0)
        return pl_error_set(PL_ERR_CONFIG,
                            "hdf5_series: timeframe_agg = '%s': '%s' is not "
                            "COLUMN=first|last|max|min|sum|mean",
                            x->spec, tok);
    size_t nlen = (size_t)(eq - tok);
    while (nlen && tok[nlen - 1] == ' ')
        nlen--;
    for (int i = 0; i < x->nfc; i++)
        if (x->fcols[i] < x->nnames && strlen(x->names[x->fcols[i]]) == nlen &&
            !strncmp(x->names[x->fcols[i]], tok, nlen))
            x->rule[i] = (sr_agg_rule)r;
    return PL_OK;
}

/* timeframe_agg "open=first,high=max" -> the rule of each feature column
 * (columns not named: last; names that are no feature column: ignored). */
pl_status sr_parse_agg(const char *spec, char names[][64], int nnames, const int *fcols, int nfc,
                       sr_agg_rule *rule) {
    for (int i = 0; i < nfc; i++)
        rule[i] = AGG_LAST;
    agg_ctx x = {spec, names, nnames, fcols, nfc, rule};
    return pl_cfg_list(spec, "hdf5_series: timeframe_agg", add_agg, &x, NULL);
}

/* Timeframe of k bars: out[r, i] = the aggregate of raw rows r-k+1 .. r of
 * feature column i (rows r < k-1: 0, never served), standardized with the
 * mean / population std of rows k-1 .. a-1 (the aggregates whose bars all
 * lie in the training rows) when stdz. A new CPU tensor [T, nfc]. */
pl_status sr_build_timeframe(const char *path, const float *raw, int64_t T, int64_t F,
                             const int *fcols, int nfc, const sr_agg_rule *rule, int64_t k,
                             int64_t a, bool stdz, pl_tensor **out) {
    *out = NULL;
    if (stdz && a - (k - 1) < 1)
        return pl_error_set(PL_ERR_CONFIG,
                            "%s: timeframe of %lld bars: the %lld training rows "
                            "hold no complete %lld-bar aggregate to standardize it with",
                            path, (long long)k, (long long)a, (long long)k);
    pl_tensor *t = lk_new_tensor(PL_F32, 2, (int64_t[]){T, nfc}, PL_CPU);
    double *v = malloc(sizeof *v * (size_t)(T > 0 ? T : 1));
    if (!t || !v) {
        pl_tensor_release(t);
        free(v);
        return t ? pl_error_set(PL_ERR_NOMEM, "%s: out of memory", path) : pl_error_status();
    }
    float *o = pl_tensor_data(t);
    for (int i = 0; i < nfc; i++) {
        const float *c = raw + fcols[i];
        for (int64_t r = 0; r < T; r++) {
            if (r < k - 1) {
                v[r] = 0;
                continue;
            }
            double acc = rule[i] == AGG_FIRST ? c[(r - k + 1) * F] : c[r * F];
            if (rule[i] == AGG_MAX || rule[i] == AGG_MIN || rule[i] == AGG_SUM ||
                rule[i] == AGG_MEAN)
                for (int64_t j = r - k + 1; j < r; j++) {
                    double x = c[j * F];
                    acc = rule[i] == AGG_MAX   ? (x > acc ? x : acc)
                          : rule[i] == AGG_MIN ? (x < acc ? x : acc)
                                               : acc + x;
                }
            v[r] = rule[i] == AGG_MEAN ? acc / (double)k : acc;
        }
        double m = 0, sdv = 1;
        if (stdz) {
            double s1 = 0, s2 = 0;
            int64_t n = a - (k - 1);
            for (int64_t r = k - 1; r < a; r++)
                s1 += v[r];
            m = s1 / (double)n;
            for (int64_t r = k - 1; r < a; r++)
                s2 += (v[r] - m) * (v[r] - m);
            sdv = sqrt(s2 / (double)n);
            if (!(sdv > 0)) sdv = 1.0;
        }
        for (int64_t r = 0; r < T; r++)
            o[r * nfc + i] = r < k - 1 ? 0.0f : (float)((v[r] - m) / sdv);
    }
    free(v);
    *out = t;
    return PL_OK;
}
