/* series.c - hdf5_chunk series mode (`window` > 0): one [T, F] series read
 * once at create; window w has inputs rows [w, w + window) of the feature
 * columns and targets rows [w + window, w + window + horizon) of the target
 * columns. Splits by date (train_end / val_end: a window belongs to the split
 * of its last target row) or by row fractions; optional standardization with
 * training-range statistics.
 *
 * Unshuffled batches are strided views (pl_tensor_as_strided) of one feature
 * matrix, never N copies. Shuffled train batches gather their windows into a
 * [B, window, F] buffer allocated once; the epoch's window order is a
 * Fisher-Yates permutation seeded by ctx->seed + epoch, so batch k of an
 * epoch starts at position k * batch_size of that permutation.
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "hdf5_chunk.h"

/* days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm). */
static int64_t days_from_civil(int64_t y, unsigned m, unsigned d) {
    y -= m <= 2;
    const int64_t era = (y >= 0 ? y : y - 399) / 400;
    const unsigned yoe = (unsigned)(y - era * 400);
    const unsigned doy = (153 * (m > 2 ? m - 3 : m + 9) + 2) / 5 + d - 1;
    const unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + (int64_t)doe - 719468;
}

static pl_status parse_date(const char *key, const char *s, int64_t *out) {
    int y, m, d;
    char tail;
    if (sscanf(s, "%d-%d-%d%c", &y, &m, &d, &tail) != 3 || m < 1 || m > 12 || d < 1 || d > 31)
        return pl_error_set(PL_ERR_CONFIG, "hdf5_chunk: %s = '%s': expected a date YYYY-MM-DD", key,
                            s);
    *out = days_from_civil(y, (unsigned)m, (unsigned)d);
    return PL_OK;
}

/* Days since 1970-01-01 -> "YYYY-MM-DD" (UTC). */
static void format_day(int64_t day, char *out, size_t n) {
    /* the file's dates are untrusted: outside +-1e8 days (~273,000 years) no calendar */
    struct tm tm;
    time_t t = (time_t)((day > -100000000 && day < 100000000 ? day : 0) * 86400);
    if (day > -100000000 && day < 100000000 && gmtime_r(&t, &tm))
        strftime(out, n, "%Y-%m-%d", &tm);
    else
        snprintf(out, n, "day %lld", (long long)day);
}

/* Column names of the series: dataset "/columns" or attribute "columns". */
static int read_column_names(loader *L, const char *series, char names[][64], int maxn) {
    int n = 0;
    hid_t obj = -1, sp = -1, t = -1;
    bool is_attr = false;
    bool has_ds = pl_h5_exists(L->file, "/columns");
    pl_h5_lock();
    H5E_BEGIN_TRY {
        if (has_ds) obj = H5Dopen2(L->file, "/columns", H5P_DEFAULT);
        if (obj < 0) {
            hid_t ds = H5Dopen2(L->file, series, H5P_DEFAULT);
            if (ds >= 0) {
                if (H5Aexists(ds, "columns") > 0) {
                    obj = H5Aopen(ds, "columns", H5P_DEFAULT);
                    is_attr = true;
                }
                H5Dclose(ds);
            }
        }
    }
    H5E_END_TRY;
    if (obj < 0) {
        pl_h5_unlock();
        return 0;
    }
    sp = is_attr ? H5Aget_space(obj) : H5Dget_space(obj);
    t = is_attr ? H5Aget_type(obj) : H5Dget_type(obj);
    hssize_t cnt = H5Sget_simple_extent_npoints(sp);
    if (H5Tget_class(t) == H5T_STRING && H5Tis_variable_str(t) > 0 && cnt > 0 && cnt <= maxn) {
        char **s = calloc((size_t)cnt, sizeof *s);
        hid_t mt = H5Tcopy(H5T_C_S1);
        H5Tset_size(mt, H5T_VARIABLE);
        H5Tset_cset(mt, H5Tget_cset(t));
        herr_t e = !s        ? -1
                   : is_attr ? H5Aread(obj, mt, s)
                             : H5Dread(obj, mt, H5S_ALL, H5S_ALL, H5P_DEFAULT, s);
        if (e >= 0) {
            for (hssize_t i = 0; i < cnt; i++)
                snprintf(names[i], 64, "%s", s[i] ? s[i] : "");
            n = (int)cnt;
            H5Dvlen_reclaim(mt, sp, H5P_DEFAULT, s);
        }
        H5Tclose(mt);
        free(s);
    }
    H5Tclose(t);
    H5Sclose(sp);
    if (is_attr)
        H5Aclose(obj);
    else
        H5Dclose(obj);
    pl_h5_unlock();
    return n;
}

/* "ridership,3" -> column indices. */
static pl_status parse_columns(loader *L, const char *key, const char *spec, char names[][64],
                               int nnames, int64_t F, int *idx, int *n) {
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", spec);
    *n = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        while (*tok == ' ')
            tok++;
        if (!*tok) continue;
        int c = -1;
        for (int i = 0; i < nnames; i++)
            if (!strcmp(names[i], tok)) c = i;
        if (c < 0) {
            char *end;
            long v = strtol(tok, &end, 10);
            if (*end == 0 && v >= 0 && v < F) c = (int)v;
        }
        if (c < 0)
            return pl_error_set(PL_ERR_CONFIG,
                                "hdf5_chunk: %s: column '%s' is neither a name in %s "
                                "nor an index 0..%lld",
                                key, tok, L->path, (long long)F - 1);
        if (*n >= 1024) return pl_error_set(PL_ERR_CONFIG, "hdf5_chunk: %s: too many columns", key);
        idx[(*n)++] = c;
    }
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
    FILE *f = fopen(p, "rb");
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

static pl_status open_series(loader *L, const pl_config_section *cfg) {
    const char *series = pl_cfg_str(cfg, "series", "series");
    char sname[NAME_LEN];
    h5c_join_path(sname, sizeof sname, "/", series);
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
    int nnames = read_column_names(L, sname, names, (int)F);
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
    int64_t nwin = T - W - H + 1;
    if (nwin <= 0) {
        st = pl_error_set(PL_ERR_CONFIG,
                          "%s: series '%s' has %lld rows; window %lld + horizon %lld needs more",
                          L->path, sname, (long long)T, (long long)W, (long long)H);
        goto out;
    }
    /* split points as row indices: train rows [0, a), val [a, b), test [b, T) */
    int64_t a, b;
    const char *fr = pl_cfg_str(cfg, "split_fractions", "");
    const char *te = pl_cfg_str(cfg, "train_end", ""), *ve = pl_cfg_str(cfg, "val_end", "");
    if (te[0]) {
        int64_t d_te, d_ve = INT64_MAX;
        if ((st = parse_date("train_end", te, &d_te))) goto out;
        if (ve[0] && (st = parse_date("val_end", ve, &d_ve))) goto out;
        if (d_ve < d_te) {
            st = pl_error_set(PL_ERR_CONFIG, "hdf5_chunk: val_end %s is before train_end %s", ve,
                              te);
            goto out;
        }
        char dname[NAME_LEN];
        h5c_join_path(dname, sizeof dname, "/", pl_cfg_str(cfg, "date_dataset", "date"));
        if ((st = pl_h5_read_alloc(L->path, L->file, dname, H5T_NATIVE_INT64, 1, 1, (int64_t[]){T},
                                   (void **)&date, NULL))) {
            pl_error_prefix(st, "date dataset '%s' must be [%lld] like '%s'", dname, (long long)T,
                            sname);
            goto out;
        }
        for (int64_t i = 1; i < T; i++)
            if (date[i] < date[i - 1]) {
                st = pl_error_set(PL_ERR_INVALID, "%s: '%s' is not sorted (row %lld)", L->path,
                                  dname, (long long)i);
                goto out;
            }
        a = 0;
        while (a < T && date[a] <= d_te)
            a++;
        b = a;
        while (b < T && date[b] <= d_ve)
            b++;
    } else if (fr[0]) {
        double f3[3];
        if ((st = h5c_parse_fractions(fr, f3))) goto out;
        a = (int64_t)floor(f3[0] * (double)T + 0.5);
        b = a + (int64_t)floor(f3[1] * (double)T + 0.5);
        if (b > T) b = T;
    } else {
        st = pl_error_set(PL_ERR_CONFIG,
                          "hdf5_chunk: series mode (window = %lld) needs train_end "
                          "(and val_end) or split_fractions",
                          (long long)W);
        goto out;
    }
    /* a window w belongs to the split of its last target row w + W + H - 1 */
    int64_t cut[4] = {0, a - W - H + 1, b - W - H + 1, nwin};
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
            /* window w predicts target rows w+W .. w+W+H-1 and belongs to the split of
             * the last one: the span is that of the windows' last targets */
            char d0[32], d1[32];
            format_day(date[s->w0 + W + H - 1], d0, sizeof d0);
            format_day(date[s->w1 - 1 + W + H - 1], d1, sizeof d1);
            snprintf(s->span, sizeof s->span, "%s..%s", d0, d1);
        }
    }
    bool predict = h5c_predict_split(L) >= 0; /* new rows: the train split may be empty */
    if (!predict && L->sp[PL_SPLIT_TRAIN].nrows <= 0) {
        st = pl_error_set(PL_ERR_CONFIG,
                          "%s: the train split of '%s' has no window (train rows: %lld, "
                          "window %lld + horizon %lld)",
                          L->path, sname, (long long)a, (long long)W, (long long)H);
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
    L->feat = h5c_new_tensor(PL_F32, 2, (int64_t[]){T, nfc}, PL_CPU);
    L->targ = h5c_new_tensor(PL_F32, 2, (int64_t[]){T, ntc}, PL_CPU);
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
    if (!pl_device_eq(L->dev, PL_CPU)) {
        pl_tensor *df = h5c_new_tensor(PL_F32, 2, (int64_t[]){T, nfc}, L->dev);
        pl_tensor *dt = h5c_new_tensor(PL_F32, 2, (int64_t[]){T, ntc}, L->dev);
        if (!df || !dt || pl_tensor_copy_(df, L->feat) || pl_tensor_copy_(dt, L->targ)) {
            st = pl_error_status();
            pl_tensor_release(df);
            pl_tensor_release(dt);
            goto out;
        }
        pl_tensor_release(L->feat);
        pl_tensor_release(L->targ);
        L->feat = df;
        L->targ = dt;
    }
    L->T = T;
    L->Ff = nfc;
    L->Ft = ntc;
    L->window = W;
    L->horizon = H;
    h5c_meta_int(L, "num_features", nfc);
    h5c_meta_int(L, "num_targets", ntc);
    h5c_meta_int(L, "window", W);
    h5c_meta_int(L, "horizon", H);
    h5c_meta_int(L, "num_rows", T);
    h5c_meta_int(L, "train_rows", a);
    for (int i = 0; i < ntc; i++) {
        char k[64];
        snprintf(k, sizeof k, "target_mean_%d", i);
        h5c_meta_float(L, k, mean[nfc + i]);
        snprintf(k, sizeof k, "target_std_%d", i);
        h5c_meta_float(L, k, sd[nfc + i]);
    }
    h5c_meta_float(L, "target_mean", mean[nfc]);
    h5c_meta_float(L, "target_std", sd[nfc]);
    h5c_meta_int(L, "standardized", stdz ? 1 : 0);
    if (stdz && !predict) st = write_standardization(L, names, nnames, allc, nall, mean, sd, a);
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
        L->wx_g = h5c_new_tensor(PL_F32, 3, (int64_t[]){tr->batch, L->window, L->Ff}, L->dev);
        L->wy_g = h5c_new_tensor(PL_F32, 3, (int64_t[]){tr->batch, L->horizon, L->Ft}, L->dev);
        L->perm = malloc(sizeof *L->perm * (size_t)tr->nrows);
        if (!L->wx_g || !L->wy_g) return pl_error_status();
        if (!L->perm) return pl_error_set(PL_ERR_NOMEM, "hdf5_chunk: out of memory");
    }
    for (int si = 0; si < PL_SPLIT_COUNT; si++) {
        char k[64];
        snprintf(k, sizeof k, "num_%s", pl_split_name((pl_data_split)si));
        h5c_meta_int(L, k, L->sp[si].nrows);
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
        h5c_shuffle(L->perm, s->nrows, &rs);
    }
    return PL_OK;
}

int series_next(loader *L, pl_batch *out) {
    split_data *s = &L->sp[L->cur_split];
    int64_t left = s->nrows - L->row_pos;
    if (left <= 0 || (s->drop_last && left < s->batch)) return 0;
    int64_t n = left < s->batch ? left : s->batch;
    int64_t W = L->window, H = L->horizon, Ff = L->Ff, Ft = L->Ft;
    pl_tensor *x, *y;
    if (s->shuffle) {
        /* gather the windows: x[b] = feat[w : w+W], y[b] = targ[w+W : w+W+H] */
        size_t xb = (size_t)(W * Ff) * 4, yb = (size_t)(H * Ft) * 4;
        char *gx = pl_tensor_data(L->wx_g), *gy = pl_tensor_data(L->wy_g);
        const char *fx = pl_tensor_data(L->feat), *ty = pl_tensor_data(L->targ);
        const pl_backend *be = pl_device_eq(L->dev, PL_CPU) ? NULL : pl_backend_get(L->dev.type);
        for (int64_t i = 0; i < n; i++) {
            int64_t w = s->w0 + L->perm[L->row_pos + i];
            const char *sx = fx + (size_t)(w * Ff) * 4, *sy = ty + (size_t)((w + W) * Ft) * 4;
            if (!be) {
                memcpy(gx + i * (int64_t)xb, sx, xb);
                memcpy(gy + i * (int64_t)yb, sy, yb);
            } else if (be->memcpy(gx + i * (int64_t)xb, L->dev, sx, L->dev, xb) ||
                       be->memcpy(gy + i * (int64_t)yb, L->dev, sy, L->dev, yb)) {
                return -1;
            }
        }
        x = h5c_view_rows(L->wx_g, 0, n);
        y = h5c_view_rows(L->wy_g, 0, n);
    } else {
        int64_t w = s->w0 + L->row_pos;
        x = h5c_as_strided(L->feat, 3, (int64_t[]){n, W, Ff}, (int64_t[]){Ff, Ff, 1},
                           L->feat->offset + w * Ff);
        y = h5c_as_strided(L->targ, 3, (int64_t[]){n, H, Ft}, (int64_t[]){Ft, Ft, 1},
                           L->targ->offset + (w + W) * Ft);
    }
    if (h5c_emit(L, out, "x", x) || h5c_emit(L, out, "y", y)) return -1;
    out->size = n;
    out->index = L->batch_index++;
    L->row_pos += n;
    return 1;
}

/* x f32 [B, window, Ff], y f32 [B, horizon, Ft] whatever the file holds
 * (the series is read as f32): nothing to read. */
pl_status series_batch_fields(const pl_config_section *cfg, pl_field_list *out) {
    (void)cfg;
    pl_status st = pl_fields_add(out, "x", PL_F32, 3, false);
    return st ? st : pl_fields_add(out, "y", PL_F32, 3, false);
}
