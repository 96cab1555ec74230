/* series.c - hdf5_chunk series mode (`window` > 0): one [T, F] series read
 * once at create; window w has inputs rows [w, w + window) of the feature
 * columns and targets rows [w + window, w + window + horizon) of the target
 * columns. Splits by date (train_end / val_end: a window belongs to the split
 * of its last target row) or by row fractions; optional standardization with
 * training-range statistics.
 *
 * Row times: /time (int64 seconds since 1970-01-01T00:00:00Z, option
 * time_dataset) when the file has it, else /date (int64 days); train_end /
 * val_end are YYYY-MM-DD (a whole day, inclusive) or, for seconds,
 * YYYY-MM-DDThh:mm[:ss] with a zone (Z, +07:00).
 *
 * Multi-timeframe (timeframes = k0,k1,.. bars, windows = W0,W1,..): for
 * every timeframe k a [T, Ff] matrix of trailing k-bar aggregates (row r =
 * bars r-k+1 .. r: open first, high max, ... per timeframe_agg), standardized
 * with its own training-row statistics; window w ends at the same last input
 * row e = w + lookback - 1 in every timeframe (rows e - (W-1)k, .., e - k, e)
 * and its targets are rows e+1 .. e+horizon, so no input covers a target bar.
 * lookback = max_i k_i W_i.
 *
 * Unshuffled batches are strided views (pl_tensor_as_strided) of one feature
 * matrix, never N copies. Shuffled train batches gather their windows into a
 * [B, window, F] buffer allocated once; the epoch's window order is a
 * Fisher-Yates permutation seeded by ctx->seed + epoch, so batch k of an
 * epoch starts at position k * batch_size of that permutation.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "hdf5_chunk.h"

/* train_end / val_end: "YYYY-MM-DD" -> *day, *has_time = false; or
 * "YYYY-MM-DDThh:mm[:ss]" + zone ("Z", "+07:00", "-0130") -> *sec (UTC
 * seconds since 1970), *has_time = true. A time of day without a zone is
 * refused (it would silently mean UTC or local time). */
static pl_status parse_bound(const char *key, const char *s, int64_t *day, int64_t *sec,
                             bool *has_time) {
    int y, m, d, n = 0;
    const char *want = "expected YYYY-MM-DD, or YYYY-MM-DDThh:mm[:ss] with a zone (Z or +hh:mm)";
    if (sscanf(s, "%5d-%2d-%2d%n", &y, &m, &d, &n) != 3 || n != 10 || m < 1 || m > 12 || d < 1 ||
        d > 31)
        return pl_error_set(PL_ERR_CONFIG, "hdf5_chunk: %s = '%s': %s", key, s, want);
    *day = lk_days_from_civil(y, m, d);
    *has_time = s[10] != 0;
    if (!*has_time) return PL_OK;
    const char *t = s + 11;
    int hh, mi, ss = 0, k = 0;
    if (s[10] != 'T' || sscanf(t, "%2d:%2d%n", &hh, &mi, &k) != 2 || k != 5)
        return pl_error_set(PL_ERR_CONFIG, "hdf5_chunk: %s = '%s': %s", key, s, want);
    t += 5;
    if (t[0] == ':') {
        if (sscanf(t + 1, "%2d%n", &ss, &k) != 1 || k != 2)
            return pl_error_set(PL_ERR_CONFIG, "hdf5_chunk: %s = '%s': %s", key, s, want);
        t += 3;
    }
    if (hh > 23 || mi > 59 || ss > 59)
        return pl_error_set(PL_ERR_CONFIG, "hdf5_chunk: %s = '%s': time of day out of range", key,
                            s);
    int off = 0;
    if (!strcmp(t, "Z")) {
        off = 0;
    } else if ((t[0] == '+' || t[0] == '-') && strlen(t) >= 3) {
        int zh = 0, zm = 0;
        char tail;
        if (!(sscanf(t + 1, "%2d:%2d%c", &zh, &zm, &tail) == 2 && strlen(t) == 6) &&
            !(sscanf(t + 1, "%2d%2d%c", &zh, &zm, &tail) == 2 && strlen(t) == 5) &&
            !(sscanf(t + 1, "%2d%c", &zh, &tail) == 1 && strlen(t) == 3))
            return pl_error_set(PL_ERR_CONFIG, "hdf5_chunk: %s = '%s': %s", key, s, want);
        if (zh > 23 || zm > 59)
            return pl_error_set(PL_ERR_CONFIG, "hdf5_chunk: %s = '%s': zone out of range", key, s);
        off = (t[0] == '-' ? -1 : 1) * (zh * 3600 + zm * 60);
    } else {
        return pl_error_set(PL_ERR_CONFIG,
                            "hdf5_chunk: %s = '%s': a time of day needs its zone (Z for UTC, or "
                            "+hh:mm); %s",
                            key, s, want);
    }
    *sec = *day * 86400 + hh * 3600 + mi * 60 + ss - off;
    return PL_OK;
}

/* Seconds since 1970 -> "YYYY-MM-DDThh:mmZ" (":ss" when not 0), UTC. */
static void format_time(int64_t sec, char *out, size_t n) {
    struct tm tm;
    bool ok = sec > -100000000LL * 86400 && sec < 100000000LL * 86400;
    time_t t = (time_t)(ok ? sec : 0);
    if (ok && gmtime_r(&t, &tm))
        strftime(out, n, tm.tm_sec ? "%Y-%m-%dT%H:%M:%SZ" : "%Y-%m-%dT%H:%MZ", &tm);
    else
        snprintf(out, n, "second %lld", (long long)sec);
}

/* String attribute `attr` of dataset `ds` into buf: 1 read, 0 absent, -1 not a string. */
static int read_str_attr(loader *L, const char *ds, const char *attr, char *buf, size_t n) {
    int r = 0;
    buf[0] = 0;
    pl_h5_lock();
    H5E_BEGIN_TRY {
        hid_t d = H5Dopen2(L->file, ds, H5P_DEFAULT);
        if (d >= 0 && H5Aexists(d, attr) > 0) {
            r = -1;
            hid_t a = H5Aopen(d, attr, H5P_DEFAULT), t = a >= 0 ? H5Aget_type(a) : -1;
            hid_t sp = a >= 0 ? H5Aget_space(a) : -1;
            if (t >= 0 && H5Tget_class(t) == H5T_STRING && H5Sget_simple_extent_npoints(sp) == 1) {
                hid_t mt = H5Tcopy(H5T_C_S1);
                if (H5Tis_variable_str(t) > 0) {
                    char *v = NULL;
                    H5Tset_size(mt, H5T_VARIABLE);
                    if (H5Aread(a, mt, &v) >= 0 && v) {
                        snprintf(buf, n, "%s", v);
                        r = 1;
                    }
                    if (v) H5free_memory(v);
                } else {
                    size_t sz = H5Tget_size(t);
                    char *v = sz > 0 && sz < 4096 ? calloc(1, sz + 1) : NULL;
                    H5Tset_size(mt, sz + 1);
                    if (v && H5Aread(a, mt, v) >= 0) {
                        snprintf(buf, n, "%s", v);
                        r = 1;
                    }
                    free(v);
                }
                H5Tclose(mt);
            }
            if (sp >= 0) H5Sclose(sp);
            if (t >= 0) H5Tclose(t);
            if (a >= 0) H5Aclose(a);
        }
        if (d >= 0) H5Dclose(d);
    }
    H5E_END_TRY;
    pl_h5_unlock();
    return r;
}

#define SECONDS_UNIT "seconds since 1970-01-01T00:00:00Z"

/* The rows' times: *secs = true and /time (time_dataset) when the file has
 * it, else /date (date_dataset, days). `need`: an absent or unreadable
 * dataset is an error; otherwise *out = NULL and no error. Sorted
 * (non-decreasing) is checked when `need`. */
static pl_status read_row_times(loader *L, const pl_config_section *cfg, int64_t T,
                                const char *sname, bool need, int64_t **out, bool *secs,
                                char *dname, size_t dn) {
    *out = NULL;
    const char *tds = pl_cfg_str(cfg, "time_dataset", "time");
    *secs = false;
    if (tds[0]) {
        lk_join_path(dname, dn, "/", tds);
        *secs = pl_h5_exists(L->file, dname);
    }
    if (!*secs) lk_join_path(dname, dn, "/", pl_cfg_str(cfg, "date_dataset", "date"));
    if (!need && !pl_h5_exists(L->file, dname)) return PL_OK;
    pl_status st = pl_h5_read_alloc(L->path, L->file, dname, H5T_NATIVE_INT64, 1, 1,
                                    (int64_t[]){T}, (void **)out, NULL);
    if (st) {
        if (!need) {
            pl_error_clear();
            return PL_OK;
        }
        return pl_error_prefix(st, "%s dataset '%s' must be [%lld] like '%s'",
                               *secs ? "time" : "date", dname, (long long)T, sname);
    }
    char unit[128];
    if (*secs && read_str_attr(L, dname, "unit", unit, sizeof unit) != 0 &&
        strcmp(unit, SECONDS_UNIT)) {
        free(*out);
        *out = NULL;
        if (!need) return PL_OK;
        return pl_error_set(PL_ERR_INVALID, "%s: '%s' has unit '%s'; expected '%s' (or no unit "
                            "attribute)", L->path, dname, unit, SECONDS_UNIT);
    }
    for (int64_t i = 1; need && i < T; i++)
        if ((*out)[i] < (*out)[i - 1]) {
            free(*out);
            *out = NULL;
            return pl_error_set(PL_ERR_INVALID, "%s: '%s' is not sorted (row %lld)", L->path,
                                dname, (long long)i);
        }
    return PL_OK;
}

typedef struct column_ctx {
    loader *L;
    const char *key;
    char (*names)[64];
    int nnames;
    int64_t F;
    int *idx, *n;
} column_ctx;

static pl_status add_column(const char *tok, int index, void *ud) {
    (void)index;
    column_ctx *x = ud;
    int c = -1;
    for (int i = 0; i < x->nnames; i++)
        if (!strcmp(x->names[i], tok)) c = i;
    if (c < 0) {
        char *end;
        long v = strtol(tok, &end, 10);
        if (*end == 0 && v >= 0 && v < x->F) c = (int)v;
    }
    if (c < 0)
        return pl_error_set(PL_ERR_CONFIG,
                            "hdf5_chunk: %s: column '%s' is neither a name in %s "
                            "nor an index 0..%lld",
                            x->key, tok, x->L->path, (long long)x->F - 1);
    if (*x->n >= 1024) return pl_error_set(PL_ERR_CONFIG, "hdf5_chunk: %s: too many columns", x->key);
    x->idx[(*x->n)++] = c;
    return PL_OK;
}

/* "ridership,3" -> column indices. */
static pl_status parse_columns(loader *L, const char *key, const char *spec, char names[][64],
                               int nnames, int64_t F, int *idx, int *n) {
    *n = 0;
    column_ctx x = {L, key, names, nnames, F, idx, n};
    char what[128];
    snprintf(what, sizeof what, "hdf5_chunk: %s", key);
    pl_status st = pl_cfg_list(spec, what, add_column, &x, NULL);
    if (st) return st;
    if (*n == 0) return pl_error_set(PL_ERR_CONFIG, "hdf5_chunk: %s is empty", key);
    return PL_OK;
}

static pl_status write_standardization(loader *L, char names[][64], int nnames, const int *cols,
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
static pl_status read_standardization(loader *L, char names[][64], int nnames, const int *cols,
                                      int nc, double *mean, double *sd) {
    char p[2048];
    snprintf(p, sizeof p, "%s/standardization.json", L->ctx && L->ctx->run_dir ? L->ctx->run_dir
                                                                              : ".");
    FILE *f = pl_file_fopen_read(p, NULL);
    if (!f && !errno) return pl_error_status(); /* not a regular file */
    if (!f) return pl_error_set(PL_ERR_IO, "%s: cannot open (the run standardized its series; "
                                "predict needs its statistics)", p);
    char *txt = NULL;
    long n = -1;
    if (!fseek(f, 0, SEEK_END) && (n = ftell(f)) >= 0 && n < (1L << 24) && !fseek(f, 0, SEEK_SET)) {
        txt = malloc((size_t)n + 1);
        if (txt && fread(txt, 1, (size_t)n, f) == (size_t)n) txt[n] = 0;
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
        st = pl_error_set(PL_ERR_IO, "%s: expected arrays columns, mean and std of %d entries "
                          "(the feature then target columns of this config)", p, nc);
    for (int i = 0; !st && i < nc; i++) {
        const cJSON *ci = cJSON_GetArrayItem(c, i), *mi = cJSON_GetArrayItem(m, i),
                    *di = cJSON_GetArrayItem(d, i);
        char nb[64];
        if (cols[i] < nnames) snprintf(nb, sizeof nb, "%s", names[cols[i]]);
        else snprintf(nb, sizeof nb, "%d", cols[i]);
        if (!cJSON_IsString(ci) || strcmp(ci->valuestring, nb))
            st = pl_error_set(PL_ERR_IO, "%s: column %d is '%s', %s has '%s' there (the input "
                              "file's columns must be the training file's)", p, i,
                              cJSON_IsString(ci) ? ci->valuestring : "?", L->path, nb);
        else if (!cJSON_IsNumber(mi) || !cJSON_IsNumber(di) || !isfinite(mi->valuedouble) ||
                 !(di->valuedouble > 0) || !isfinite(di->valuedouble))
            st = pl_error_set(PL_ERR_IO, "%s: mean/std of column '%s' must be finite numbers, "
                              "std > 0", p, nb);
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
static pl_status naive_baselines(loader *L, const pl_config_section *cfg, const float *raw,
                                 int64_t F, int tc, const char *tname, const h5c_timeframes *tf,
                                 int64_t Lb, int64_t H, int64_t nw, bool predict) {
    int64_t s = pl_cfg_int(cfg, "naive_period", 0), W = tf->w[0];
    if (s <= 0) return PL_OK;
    if (tf->k[0] != 1)
        return pl_error_set(PL_ERR_CONFIG,
                            "hdf5_chunk: naive_period = %lld needs the first "
                            "timeframe to be single bars (timeframes starts with %lld)",
                            (long long)s, (long long)tf->k[0]);
    if (s < H || s >= W)
        return pl_error_set(PL_ERR_CONFIG,
                            "hdf5_chunk: naive_period = %lld must be >= horizon "
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
        pl_message("hdf5_chunk: training windows (%lld) of '%s', naive_period %lld: seasonal "
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

/* ---- timeframes --------------------------------------------------------- */

bool h5c_series_mode(const pl_config_section *cfg) {
    return pl_cfg_int(cfg, "window", 0) > 0 || pl_cfg_str(cfg, "timeframes", "")[0];
}

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
            return pl_error_set(PL_ERR_CONFIG, "hdf5_chunk: %s = '%s': expected integers >= 1 "
                                "separated by commas", key, spec);
        if (*n >= H5C_MAX_TF)
            return pl_error_set(PL_ERR_CONFIG, "hdf5_chunk: %s = '%s': at most %d entries", key,
                                spec, H5C_MAX_TF);
        v[(*n)++] = x;
        p = *end ? end + 1 : end;
    }
    return PL_OK;
}

pl_status h5c_parse_timeframes(const pl_config_section *cfg, h5c_timeframes *tf) {
    const char *ks = pl_cfg_str(cfg, "timeframes", ""), *ws = pl_cfg_str(cfg, "windows", "");
    int64_t W = pl_cfg_int(cfg, "window", 0);
    memset(tf, 0, sizeof *tf);
    if (!ks[0]) {
        if (ws[0])
            return pl_error_set(PL_ERR_CONFIG, "hdf5_chunk: windows = %s without timeframes: "
                                "windows gives the length of each timeframe's window", ws);
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
        return pl_error_set(PL_ERR_CONFIG, "hdf5_chunk: timeframes = %s has %d entries, windows = "
                            "%s has %d: one window length per timeframe", ks, tf->n, ws, nw);
    for (int i = 1; i < tf->n; i++)
        if (tf->k[i] <= tf->k[i - 1])
            return pl_error_set(PL_ERR_CONFIG, "hdf5_chunk: timeframes = %s: bar counts must "
                                "increase (finest first; field x is the first)", ks);
    if (W > 0 && W != tf->w[0])
        return pl_error_set(PL_ERR_CONFIG, "hdf5_chunk: window = %lld but windows = %s starts "
                            "with %lld: with timeframes, leave window out (windows sets it)",
                            (long long)W, ws, (long long)tf->w[0]);
    return PL_OK;
}

void h5c_timeframe_field(const h5c_timeframes *tf, int i, char *out, size_t n) {
    if (i == 0)
        snprintf(out, n, "x");
    else
        snprintf(out, n, "x_tf%lld", (long long)tf->k[i]);
}

typedef enum { AGG_LAST, AGG_FIRST, AGG_MAX, AGG_MIN, AGG_SUM, AGG_MEAN } agg_rule;

typedef struct agg_ctx {
    const char *spec;
    char (*names)[64];
    int nnames;
    const int *fcols;
    int nfc;
    agg_rule *rule;
} agg_ctx;

static pl_status add_agg(const char *tok, int index, void *ud) {
    (void)index;
    static const char *const rn[] = {"last", "first", "max", "min", "sum", "mean"};
    agg_ctx *x = ud;
    const char *eq = strchr(tok, '=');
    int r = -1;
    const char *rule = eq ? eq + 1 : "";
    while (*rule == ' ') rule++;
    for (int j = 0; eq && j < 6; j++)
        if (!strcmp(rule, rn[j])) r = j;
    if (!eq || r < 0)
        return pl_error_set(PL_ERR_CONFIG, "hdf5_chunk: timeframe_agg = '%s': '%s' is not "
                            "COLUMN=first|last|max|min|sum|mean", x->spec, tok);
    size_t nlen = (size_t)(eq - tok);
    while (nlen && tok[nlen - 1] == ' ') nlen--;
    for (int i = 0; i < x->nfc; i++)
        if (x->fcols[i] < x->nnames && strlen(x->names[x->fcols[i]]) == nlen &&
            !strncmp(x->names[x->fcols[i]], tok, nlen))
            x->rule[i] = (agg_rule)r;
    return PL_OK;
}

/* timeframe_agg "open=first,high=max" -> the rule of each feature column
 * (columns not named: last; names that are no feature column: ignored). */
static pl_status parse_agg(const char *spec, char names[][64], int nnames, const int *fcols,
                           int nfc, agg_rule *rule) {
    for (int i = 0; i < nfc; i++)
        rule[i] = AGG_LAST;
    agg_ctx x = {spec, names, nnames, fcols, nfc, rule};
    return pl_cfg_list(spec, "hdf5_chunk: timeframe_agg", add_agg, &x, NULL);
}

/* Timeframe of k bars: out[r, i] = the aggregate of raw rows r-k+1 .. r of
 * feature column i (rows r < k-1: 0, never served), standardized with the
 * mean / population std of rows k-1 .. a-1 (the aggregates whose bars all
 * lie in the training rows) when stdz. A new CPU tensor [T, nfc]. */
static pl_status build_timeframe(loader *L, const float *raw, int64_t T, int64_t F,
                                 const int *fcols, int nfc, const agg_rule *rule, int64_t k,
                                 int64_t a, bool stdz, pl_tensor **out) {
    *out = NULL;
    if (stdz && a - (k - 1) < 1)
        return pl_error_set(PL_ERR_CONFIG, "%s: timeframe of %lld bars: the %lld training rows "
                            "hold no complete %lld-bar aggregate to standardize it with",
                            L->path, (long long)k, (long long)a, (long long)k);
    pl_tensor *t = lk_new_tensor(PL_F32, 2, (int64_t[]){T, nfc}, PL_CPU);
    double *v = malloc(sizeof *v * (size_t)(T > 0 ? T : 1));
    if (!t || !v) {
        pl_tensor_release(t);
        free(v);
        return t ? pl_error_set(PL_ERR_NOMEM, "%s: out of memory", L->path) : pl_error_status();
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

static pl_status open_series(loader *L, const pl_config_section *cfg) {
    const char *series = pl_cfg_str(cfg, "series", "series");
    char sname[NAME_LEN];
    lk_join_path(sname, sizeof sname, "/", series);
    pl_tensor *rawt = NULL;
    pl_status st = pl_h5_read_tensor(L->path, L->file, sname, PL_F32, &rawt);
    if (st) return st;
    if (rawt->ndim != 2) {
        st = pl_error_set(PL_ERR_SHAPE, "%s: series dataset '%s' has rank %d; expected [T, F]",
                          L->path, sname, rawt->ndim);
        pl_tensor_release(rawt);
        return st;
    }
    int64_t T = rawt->shape[0], F = rawt->shape[1];
    const float *raw = pl_tensor_f32(rawt);
    int64_t *date = NULL;
    double *mean = NULL, *sd = NULL;
    int *fcols = NULL, *tcols = NULL, *allc = NULL;
    char(*names)[64] = calloc((size_t)(F > 0 ? F : 1), 64);
    fcols = malloc(sizeof *fcols * 1024);
    tcols = malloc(sizeof *tcols * 1024);
    if (!names || !fcols || !tcols) {
        st = pl_error_set(PL_ERR_NOMEM, "%s: out of memory", L->path);
        goto out;
    }
    L->st.bytes_read += (uint64_t)(T * F) * 4;
    int nnames = pl_h5_column_names(L->file, sname, names, (int)F);
    int nfc = 0, ntc = 0;
    const char *fspec = pl_cfg_str(cfg, "feature_columns", "");
    if (!fspec[0]) {
        nfc = (int)(F < 1024 ? F : 1024);
        for (int i = 0; i < nfc; i++)
            fcols[i] = i;
    } else if ((st = parse_columns(L, "feature_columns", fspec, names, nnames, F, fcols, &nfc))) {
        goto out;
    }
    if ((st = parse_columns(L, "target_columns", pl_cfg_str(cfg, "target_columns", "0"), names,
                            nnames, F, tcols, &ntc)))
        goto out;
    /* NaN / Inf in a used column is refused (README "Missing values"); other columns are never read */
    bool *used = calloc((size_t)(F > 0 ? F : 1), sizeof *used);
    if (!used) {
        st = pl_error_set(PL_ERR_NOMEM, "%s: out of memory", L->path);
        goto out;
    }
    for (int i = 0; i < nfc; i++)
        used[fcols[i]] = true;
    for (int i = 0; i < ntc; i++)
        used[tcols[i]] = true;
    st = pl_h5_check_finite(L->path, sname, PL_F32, raw, 0, T, 2, rawt->shape, used,
                            (const char(*)[64])names, nnames);
    free(used);
    if (st) goto out;

    int64_t W = pl_cfg_int(cfg, "window", 0), H = pl_cfg_int(cfg, "horizon", 1);
    h5c_timeframes tf;
    if ((st = h5c_parse_timeframes(cfg, &tf))) goto out;
    W = tf.w[0];
    /* a window's inputs reach back Lb rows: its last input row is w + Lb - 1 */
    int64_t Lb = 0;
    for (int i = 0; i < tf.n; i++)
        if (tf.k[i] * tf.w[i] > Lb) Lb = tf.k[i] * tf.w[i];
    int64_t nwin = T - Lb - H + 1;
    if (nwin <= 0) {
        if (tf.n > 1 || tf.k[0] > 1)
            st = pl_error_set(PL_ERR_CONFIG,
                              "%s: series '%s' has %lld rows; the timeframes reach back %lld rows "
                              "(the largest bars x window) + horizon %lld needs more",
                              L->path, sname, (long long)T, (long long)Lb, (long long)H);
        else
            st = pl_error_set(PL_ERR_CONFIG,
                              "%s: series '%s' has %lld rows; window %lld + horizon %lld needs more",
                              L->path, sname, (long long)T, (long long)W, (long long)H);
        goto out;
    }
    /* split points as row indices: train rows [0, a), val [a, b), test [b, T) */
    int64_t a, b;
    bool secs = false;
    char dname[NAME_LEN];
    const char *fr = pl_cfg_str(cfg, "split_fractions", "");
    const char *te = pl_cfg_str(cfg, "train_end", ""), *ve = pl_cfg_str(cfg, "val_end", "");
    if (te[0]) {
        int64_t d_te, d_ve = INT64_MAX, s_te = 0, s_ve = INT64_MAX;
        bool t_te = false, t_ve = false;
        if ((st = parse_bound("train_end", te, &d_te, &s_te, &t_te))) goto out;
        if (ve[0] && (st = parse_bound("val_end", ve, &d_ve, &s_ve, &t_ve))) goto out;
        if ((st = read_row_times(L, cfg, T, sname, true, &date, &secs, dname, sizeof dname)))
            goto out;
        if (!secs && (t_te || t_ve)) {
            st = pl_error_set(PL_ERR_CONFIG,
                              "hdf5_chunk: %s = %s has a time of day, but %s holds calendar days "
                              "('%s'; no time dataset '%s'): give a date YYYY-MM-DD",
                              t_te ? "train_end" : "val_end", t_te ? te : ve, L->path, dname,
                              pl_cfg_str(cfg, "time_dataset", "time"));
            goto out;
        }
        /* the inclusive bounds in the file's unit; a date bound on seconds is its whole day */
        int64_t e_te = secs ? (t_te ? s_te : d_te * 86400 + 86399) : d_te;
        int64_t e_ve = !ve[0] ? INT64_MAX : secs ? (t_ve ? s_ve : d_ve * 86400 + 86399) : d_ve;
        if (e_ve < e_te) {
            st = pl_error_set(PL_ERR_CONFIG, "hdf5_chunk: val_end %s is before train_end %s", ve,
                              te);
            goto out;
        }
        a = 0;
        while (a < T && date[a] <= e_te)
            a++;
        b = a;
        while (b < T && date[b] <= e_ve)
            b++;
    } else if (fr[0]) {
        double f3[3];
        if ((st = lk_parse_fractions("hdf5_chunk", fr, f3))) goto out;
        a = (int64_t)floor(f3[0] * (double)T + 0.5);
        b = a + (int64_t)floor(f3[1] * (double)T + 0.5);
        if (b > T) b = T;
        /* the times only name the splits' spans on the data line (and are checked with timeframes) */
        bool tfs = tf.n > 1 || tf.k[0] > 1;
        if ((st = read_row_times(L, cfg, T, sname, false, &date, &secs, dname, sizeof dname)))
            goto out;
        for (int64_t i = 1; date && !tfs && i < T; i++)
            if (date[i] < date[i - 1]) { /* unsorted: no span (fractions split by row) */
                free(date);
                date = NULL;
            }
    } else {
        st = pl_error_set(PL_ERR_CONFIG,
                          "hdf5_chunk: series mode (window = %lld) needs train_end "
                          "(and val_end) or split_fractions",
                          (long long)W);
        goto out;
    }
    /* multi-timeframe rows must be regular bars: k rows = k bars of one length. The
     * times are untrusted: a step that overflows int64 is irregular, not undefined */
    if (date && (tf.n > 1 || tf.k[0] > 1) && T >= 2) {
        int64_t d0 = 0, di = 0;
        bool ok0 = !__builtin_sub_overflow(date[1], date[0], &d0) && d0 > 0;
        for (int64_t i = ok0 ? 2 : 1; i < T; i++) {
            bool oki = ok0 && !__builtin_sub_overflow(date[i], date[i - 1], &di) && di == d0;
            if (oki) continue;
            if (!ok0) di = d0;
            char t0[40], t1[40], s0[32], s1[32];
            (secs ? format_time : lk_format_day)(date[i - 1], t0, sizeof t0);
            (secs ? format_time : lk_format_day)(date[i], t1, sizeof t1);
            if (__builtin_sub_overflow(date[1], date[0], &d0))
                snprintf(s0, sizeof s0, "more than 2^63");
            else
                snprintf(s0, sizeof s0, "%lld", (long long)d0);
            if (__builtin_sub_overflow(date[i], date[i - 1], &di))
                snprintf(s1, sizeof s1, "more than 2^63");
            else
                snprintf(s1, sizeof s1, "%lld", (long long)di);
            st = pl_error_set(PL_ERR_INVALID,
                              "%s: timeframes need regular, increasing bars, but '%s' steps by "
                              "%s from row 0 to 1 and from row %lld (%s) to %lld (%s) by %s "
                              "(resample with tools/csv_to_h5.py --resample)",
                              L->path, dname, s0, (long long)i - 1, t0, (long long)i, t1, s1);
            goto out;
        }
    }
    /* a window w belongs to the split of its last target row w + Lb + H - 1 */
    int64_t cut[4] = {0, a - Lb - H + 1, b - Lb - H + 1, nwin};
    for (int k = 1; k < 3; k++) {
        if (cut[k] < 0) cut[k] = 0;
        if (cut[k] > nwin) cut[k] = nwin;
    }
    if (cut[2] < cut[1]) cut[2] = cut[1];
    for (int si = 0; si < PL_SPLIT_COUNT; si++) {
        split_data *s = &L->sp[si];
        s->w0 = cut[si];
        s->w1 = cut[si + 1];
        s->nrows = s->w1 - s->w0;
        s->present = s->nrows > 0;
        snprintf(s->where, sizeof s->where, "windows %lld..%lld of %s", (long long)s->w0,
                 (long long)s->w1, sname);
        s->span[0] = 0;
        if (date && s->nrows > 0) {
            /* window w predicts target rows w+Lb .. w+Lb+H-1 and belongs to the split of
             * the last one: the span is that of the windows' last targets */
            char d0[32], d1[32];
            (secs ? format_time : lk_format_day)(date[s->w0 + Lb + H - 1], d0, sizeof d0);
            (secs ? format_time : lk_format_day)(date[s->w1 - 1 + Lb + H - 1], d1, sizeof d1);
            snprintf(s->span, sizeof s->span, "%s..%s", d0, d1);
        }
    }
    bool predict = lk_predict_split(L->ctx) >= 0; /* new rows: the train split may be empty */
    if (!predict && L->sp[PL_SPLIT_TRAIN].nrows <= 0) {
        st = pl_error_set(PL_ERR_CONFIG,
                          "%s: the train split of '%s' has no window (train rows: %lld, "
                          "window %lld + horizon %lld)",
                          L->path, sname, (long long)a, (long long)Lb, (long long)H);
        goto out;
    }
    /* standardization over the training rows [0, a) */
    int nall = nfc + ntc;
    mean = calloc((size_t)nall, sizeof *mean);
    sd = calloc((size_t)nall, sizeof *sd);
    allc = malloc(sizeof *allc * (size_t)nall);
    if (!mean || !sd || !allc) {
        st = pl_error_set(PL_ERR_NOMEM, "%s: out of memory", L->path);
        goto out;
    }
    bool stdz = pl_cfg_bool(cfg, "standardize", false);
    for (int i = 0; i < nfc; i++)
        allc[i] = fcols[i];
    for (int i = 0; i < ntc; i++)
        allc[nfc + i] = tcols[i];
    for (int i = 0; i < nall; i++) {
        mean[i] = 0;
        sd[i] = 1;
    }
    if (stdz && predict &&
        (st = read_standardization(L, names, nnames, allc, nall, mean, sd)))
        goto out;
    for (int i = 0; i < nall; i++) {
        if (!stdz || predict) continue;
        double s1 = 0, s2 = 0;
        for (int64_t r = 0; r < a; r++)
            s1 += raw[r * F + allc[i]];
        double m = s1 / (double)a;
        for (int64_t r = 0; r < a; r++) {
            double d = raw[r * F + allc[i]] - m;
            s2 += d * d;
        }
        double v = sqrt(s2 / (double)a);
        mean[i] = m;
        sd[i] = v > 0 ? v : 1.0; /* constant column: leave scale alone */
    }
    L->feat = lk_new_tensor(PL_F32, 2, (int64_t[]){T, nfc}, PL_CPU);
    L->targ = lk_new_tensor(PL_F32, 2, (int64_t[]){T, ntc}, PL_CPU);
    if (!L->feat || !L->targ) {
        st = pl_error_status();
        goto out;
    }
    float *fx = pl_tensor_data(L->feat), *ty = pl_tensor_data(L->targ);
    for (int64_t r = 0; r < T; r++) {
        for (int i = 0; i < nfc; i++)
            fx[r * nfc + i] = (float)((raw[r * F + fcols[i]] - mean[i]) / sd[i]);
        for (int i = 0; i < ntc; i++)
            ty[r * ntc + i] = (float)((raw[r * F + tcols[i]] - mean[nfc + i]) / sd[nfc + i]);
    }
    /* the timeframes' matrices: feat itself for k = 1, trailing k-bar aggregates else */
    bool multi = tf.n > 1 || tf.k[0] > 1;
    if (multi && stdz && predict) {
        st = pl_error_set(PL_ERR_UNSUPPORTED, "hdf5_chunk: predict with timeframes and "
                          "standardize: the run's standardization.json holds the one-bar "
                          "statistics only; not supported yet");
        goto out;
    }
    agg_rule rule[1024];
    if (multi && (st = parse_agg(pl_cfg_str(cfg, "timeframe_agg",
                                            "open=first,high=max,low=min,ticks=sum,log_return=sum"),
                                 names, nnames, fcols, nfc, rule)))
        goto out;
    for (int i = 0; i < tf.n; i++) {
        if (tf.k[i] == 1) {
            L->tfm[i] = pl_tensor_retain(L->feat);
        } else if ((st = build_timeframe(L, raw, T, F, fcols, nfc, rule, tf.k[i], a,
                                         stdz && !predict, &L->tfm[i]))) {
            goto out;
        }
        h5c_timeframe_field(&tf, i, L->tfname[i], sizeof L->tfname[i]);
    }
    if (!pl_device_eq(L->dev, PL_CPU))
        for (int i = 0; i < tf.n; i++) {
            if (tf.k[i] == 1) continue; /* feat: moved below */
            pl_tensor *d = lk_new_tensor(PL_F32, 2, (int64_t[]){T, nfc}, L->dev);
            if (!d || pl_tensor_copy_(d, L->tfm[i])) {
                st = pl_error_status();
                pl_tensor_release(d);
                goto out;
            }
            pl_tensor_release(L->tfm[i]);
            L->tfm[i] = d;
        }
    if (!pl_device_eq(L->dev, PL_CPU)) {
        pl_tensor *df = lk_new_tensor(PL_F32, 2, (int64_t[]){T, nfc}, L->dev);
        pl_tensor *dt = lk_new_tensor(PL_F32, 2, (int64_t[]){T, ntc}, L->dev);
        if (!df || !dt || pl_tensor_copy_(df, L->feat) || pl_tensor_copy_(dt, L->targ)) {
            st = pl_error_status();
            pl_tensor_release(df);
            pl_tensor_release(dt);
            goto out;
        }
        for (int i = 0; i < tf.n; i++)
            if (tf.k[i] == 1) {
                pl_tensor_release(L->tfm[i]);
                L->tfm[i] = pl_tensor_retain(df);
            }
        pl_tensor_release(L->feat);
        pl_tensor_release(L->targ);
        L->feat = df;
        L->targ = dt;
    }
    L->tf = tf;
    L->lookback = Lb;
    L->T = T;
    L->Ff = nfc;
    L->Ft = ntc;
    L->window = W;
    L->horizon = H;
    lk_meta_int(L->ctx, "num_features", nfc);
    lk_meta_int(L->ctx, "num_targets", ntc);
    lk_meta_int(L->ctx, "window", W);
    lk_meta_int(L->ctx, "lookback", Lb);
    if (multi) {
        lk_meta_int(L->ctx, "num_timeframes", tf.n);
        for (int i = 0; i < tf.n; i++) {
            char k[64];
            snprintf(k, sizeof k, "timeframe_%d", i);
            lk_meta_int(L->ctx, k, tf.k[i]);
            snprintf(k, sizeof k, "timeframe_window_%d", i);
            lk_meta_int(L->ctx, k, tf.w[i]);
        }
    }
    lk_meta_int(L->ctx, "horizon", H);
    lk_meta_int(L->ctx, "num_rows", T);
    lk_meta_int(L->ctx, "train_rows", a);
    for (int i = 0; i < ntc; i++) {
        char k[64];
        snprintf(k, sizeof k, "target_mean_%d", i);
        lk_meta_float(L->ctx, k, mean[nfc + i]);
        snprintf(k, sizeof k, "target_std_%d", i);
        lk_meta_float(L->ctx, k, sd[nfc + i]);
    }
    lk_meta_float(L->ctx, "target_mean", mean[nfc]);
    lk_meta_float(L->ctx, "target_std", sd[nfc]);
    lk_meta_int(L->ctx, "standardized", stdz ? 1 : 0);
    if (stdz && !predict) st = write_standardization(L, names, nnames, allc, nall, mean, sd, a);
    if (!st) {
        char tn[64];
        if (tcols[0] < nnames)
            snprintf(tn, sizeof tn, "%s", names[tcols[0]]);
        else
            snprintf(tn, sizeof tn, "%d", tcols[0]);
        st = naive_baselines(L, cfg, raw, F, tcols[0], tn, &tf, Lb, H, L->sp[PL_SPLIT_TRAIN].nrows,
                             predict);
    }
out:
    pl_tensor_release(rawt);
    free(date);
    free(mean);
    free(sd);
    free(allc);
    free(fcols);
    free(tcols);
    free(names);
    return st;
}

pl_status series_create(loader *L, const pl_config_section *cfg) {
    pl_status st = open_series(L, cfg);
    if (st) return st;
    split_data *tr = &L->sp[PL_SPLIT_TRAIN];
    if (tr->drop_last && tr->nrows < tr->batch)
        return pl_error_set(
            PL_ERR_CONFIG,
            "%s: train split has %lld windows < batch_size %lld with drop_last: no batch", L->path,
            (long long)tr->nrows, (long long)tr->batch);
    if (tr->shuffle) {
        for (int i = 0; i < L->tf.n; i++)
            if (!(L->tfg[i] = lk_new_tensor(PL_F32, 3, (int64_t[]){tr->batch, L->tf.w[i], L->Ff},
                                             L->dev)))
                return pl_error_status();
        L->wy_g = lk_new_tensor(PL_F32, 3, (int64_t[]){tr->batch, L->horizon, L->Ft}, L->dev);
        L->perm = malloc(sizeof *L->perm * (size_t)tr->nrows);
        if (!L->wy_g) return pl_error_status();
        if (!L->perm) return pl_error_set(PL_ERR_NOMEM, "hdf5_chunk: out of memory");
    }
    for (int si = 0; si < PL_SPLIT_COUNT; si++) {
        char k[64];
        snprintf(k, sizeof k, "num_%s", pl_split_name((pl_data_split)si));
        lk_meta_int(L->ctx, k, L->sp[si].nrows);
    }
    return PL_OK;
}

pl_status series_epoch_begin(loader *L, int si, int64_t start) {
    split_data *s = &L->sp[si];
    L->row_pos = start * s->batch;
    if (s->shuffle) {
        for (int64_t i = 0; i < s->nrows; i++)
            L->perm[i] = i;
        uint64_t rs = (L->ctx ? L->ctx->seed : 0) + (uint64_t)L->epoch;
        lk_shuffle(L->perm, s->nrows, &rs);
    }
    return PL_OK;
}

int series_next(loader *L, pl_batch *out) {
    split_data *s = &L->sp[L->cur_split];
    int64_t left = s->nrows - L->row_pos;
    if (left <= 0 || (s->drop_last && left < s->batch)) return 0;
    int64_t n = left < s->batch ? left : s->batch;
    int64_t H = L->horizon, Ff = L->Ff, Ft = L->Ft, Lb = L->lookback;
    /* window w: last input row e = w + Lb - 1 in every timeframe; timeframe i
     * reads rows e - (W_i - 1) k_i, ..., e - k_i, e of its matrix; targets
     * rows e + 1 .. e + H */
    pl_tensor *x[H5C_MAX_TF], *y;
    if (s->shuffle) {
        size_t rb = (size_t)Ff * 4, yb = (size_t)(H * Ft) * 4;
        const pl_backend *be = pl_device_eq(L->dev, PL_CPU) ? NULL : pl_backend_get(L->dev.type);
        char *gy = pl_tensor_data(L->wy_g);
        const char *ty = pl_tensor_data(L->targ);
        for (int64_t i = 0; i < n; i++) {
            int64_t e = s->w0 + L->perm[L->row_pos + i] + Lb - 1;
            for (int f = 0; f < L->tf.n; f++) {
                int64_t W = L->tf.w[f], k = L->tf.k[f];
                char *gx = (char *)pl_tensor_data(L->tfg[f]) + (size_t)(i * W) * rb;
                const char *fx = pl_tensor_data(L->tfm[f]);
                int64_t r0 = e - (W - 1) * k;
                /* k = 1: one block of W rows; else W rows k apart */
                int64_t runs = k == 1 ? 1 : W;
                size_t len = k == 1 ? (size_t)W * rb : rb;
                for (int64_t j = 0; j < runs; j++) {
                    const char *src = fx + (size_t)(r0 + j * k) * rb;
                    if (!be)
                        memcpy(gx + (size_t)j * len, src, len);
                    else if (be->memcpy(gx + (size_t)j * len, L->dev, src, L->dev, len))
                        return -1;
                }
            }
            const char *sy = ty + (size_t)((e + 1) * Ft) * 4;
            if (!be)
                memcpy(gy + i * (int64_t)yb, sy, yb);
            else if (be->memcpy(gy + i * (int64_t)yb, L->dev, sy, L->dev, yb))
                return -1;
        }
        for (int f = 0; f < L->tf.n; f++)
            x[f] = lk_view_rows(L->tfg[f], 0, n);
        y = lk_view_rows(L->wy_g, 0, n);
    } else {
        int64_t e = s->w0 + L->row_pos + Lb - 1;
        for (int f = 0; f < L->tf.n; f++) {
            int64_t W = L->tf.w[f], k = L->tf.k[f];
            pl_tensor *m = L->tfm[f];
            x[f] = lk_as_strided(m, 3, (int64_t[]){n, W, Ff}, (int64_t[]){Ff, k * Ff, 1},
                                  m->offset + (e - (W - 1) * k) * Ff);
        }
        y = lk_as_strided(L->targ, 3, (int64_t[]){n, H, Ft}, (int64_t[]){Ft, Ft, 1},
                           L->targ->offset + (e + 1) * Ft);
    }
    if (h5c_emit(L, out, "x", x[0]) || h5c_emit(L, out, "y", y)) return -1;
    for (int f = 1; f < L->tf.n; f++)
        if (h5c_emit(L, out, L->tfname[f], x[f])) return -1;
    out->size = n;
    out->index = L->batch_index++;
    L->row_pos += n;
    return 1;
}

/* x f32 [B, window, Ff], y f32 [B, horizon, Ft] whatever the file holds
 * (the series is read as f32), and x_tf<k> f32 [B, W_k, Ff] per further
 * timeframe: nothing to read. */
pl_status series_batch_fields(const pl_config_section *cfg, pl_field_list *out) {
    h5c_timeframes tf;
    pl_status st = h5c_parse_timeframes(cfg, &tf);
    if (!st) st = pl_fields_add(out, "x", PL_F32, 3, false);
    if (!st) st = pl_fields_add(out, "y", PL_F32, 3, false);
    for (int i = 1; !st && i < tf.n; i++) {
        char name[24];
        h5c_timeframe_field(&tf, i, name, sizeof name);
        st = pl_fields_add(out, name, PL_F32, 3, false);
    }
    return st;
}
