/* panel_read.c - hdf5_panel: reading, checking and normalizing the panel
 * file at create (README.md: options, file layout, batches, math).
 *
 * The file: features [T, S, F] (attribute feature_names), target [T, S],
 * time / target_time [T] and optional factors [T, S, K]; row t holds what is
 * known at the close of day t, and target[t] the return over target_time[t].
 * Everything is read, checked and normalized once at create. Row t is a
 * usable day when its feature window (rows t-W+1..t) and its correlation
 * lookback (rows t-L+1..t) lie in the file; its split follows the day of its
 * target_time (train <= train_end < val <= val_end < test <= test_end).
 *
 * pn_read runs the steps in order over one `panel_in` (the options and what
 * the file holds beyond P), each step a function below; panel_stage.c then
 * builds the graphs and the staging.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hdf5_panel.h"

/* ---- dates ----------------------------------------------------------------
 * train_end / val_end / test_end are whole days YYYY-MM-DD (proleptic
 * Gregorian, UTC); the file's times are seconds since 1970-01-01 UTC. */

/* The day (floor) of a time in seconds since 1970. */
static int64_t day_of(int64_t sec) {
    return sec / 86400 - (sec % 86400 < 0);
}

/* "YYYY-MM-DD" (exactly; a real date) -> days since 1970. */
static pl_status parse_day(const char *key, const char *s, int64_t *day) {
    static const int mdays[12] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    bool shape = strlen(s) == 10 && s[4] == '-' && s[7] == '-';
    for (int i = 0; shape && i < 10; i++)
        shape = i == 4 || i == 7 || (s[i] >= '0' && s[i] <= '9');
    int y = 0, m = 0, d = 0;
    if (shape) {
        y = atoi(s);
        m = atoi(s + 5);
        d = atoi(s + 8);
    }
    bool leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    if (!shape || m < 1 || m > 12 || d < 1 || d > mdays[m - 1] + (m == 2 && leap))
        return pl_error_set(PL_ERR_CONFIG, "hdf5_panel: %s = '%s': expected a date YYYY-MM-DD", key,
                            s);
    *day = lk_days_from_civil(y, m, d);
    return PL_OK;
}

/* ---- reading and checking ------------------------------------------------- */

/* Names of a dataset's string attribute must be usable as metric / column
 * names: letters, digits, '_', '.', '-'. */
static pl_status check_names(const panel *P, const char *ds, const char *attr, char (*names)[64],
                             int n) {
    for (int i = 0; i < n; i++)
        for (const char *c = names[i]; *c; c++)
            if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') ||
                  (*c >= '0' && *c <= '9') || *c == '_' || *c == '.' || *c == '-'))
                return pl_error_set(PL_ERR_IO,
                                    "%s: attribute '%s' of dataset '%s': name %d '%s' has a "
                                    "character other than letters, digits, '_', '.', '-'",
                                    P->path, attr, ds, i, names[i]);
    return PL_OK;
}

/* time strictly increasing; target_time[t] after time[t]. */
static pl_status check_times(const panel *P, const char *tname, const char *ttname,
                             const int64_t *tm, const int64_t *tt, int64_t T) {
    char a[32], b[32];
    for (int64_t t = 1; t < T; t++)
        if (tm[t] <= tm[t - 1]) {
            lk_format_day(day_of(tm[t]), a, sizeof a);
            lk_format_day(day_of(tm[t - 1]), b, sizeof b);
            return pl_error_set(PL_ERR_INVALID,
                                "%s: dataset '%s' must strictly increase (one row per day, "
                                "seconds since 1970): %s[%lld] = %lld (%s) <= %s[%lld] = %lld (%s)",
                                P->path, tname, tname, (long long)t, (long long)tm[t], a, tname,
                                (long long)t - 1, (long long)tm[t - 1], b);
        }
    for (int64_t t = 0; t < T; t++)
        if (tt[t] <= tm[t]) {
            lk_format_day(day_of(tt[t]), a, sizeof a);
            lk_format_day(day_of(tm[t]), b, sizeof b);
            return pl_error_set(PL_ERR_INVALID,
                                "%s: dataset '%s': %s[%lld] = %lld (%s) is not after %s[%lld] = "
                                "%lld (%s); expected the time of a later day (the day row t's "
                                "target is)",
                                P->path, ttname, ttname, (long long)t, (long long)tt[t], a, tname,
                                (long long)t, (long long)tm[t], b);
        }
    return PL_OK;
}

/* mean and unbiased std over the train rows of column `col` of rows laid out
 * [T, S, width]; std 1 when it is 0 or there is one value (centering only). */
static void train_stats(const panel *P, const float *v, int64_t width, int64_t col, double *mean,
                        double *sd) {
    const psplit *Tr = &P->sp[PL_SPLIT_TRAIN];
    double s = 0, ss = 0;
    for (int64_t i = 0; i < Tr->nd; i++)
        for (int64_t k = 0; k < P->S; k++)
            s += v[(Tr->rows[i] * P->S + k) * width + col];
    int64_t n = Tr->nd * P->S;
    *mean = s / (double)n;
    for (int64_t i = 0; i < Tr->nd; i++)
        for (int64_t k = 0; k < P->S; k++) {
            double d = v[(Tr->rows[i] * P->S + k) * width + col] - *mean;
            ss += d * d;
        }
    *sd = n > 1 ? sqrt(ss / (double)(n - 1)) : 0.0;
    if (!(*sd > 0)) *sd = 1.0;
}

/* The split of each usable row from the day of its target_time; a split with
 * no day is refused naming it and the bounds. */
static pl_status assign_splits(panel *P, const int64_t *tt, const char *ttname,
                               const int64_t end[3], bool has_test_end, int64_t *after) {
    int64_t *cls = malloc(sizeof *cls * (size_t)P->T);
    if (!cls) return pl_error_set(PL_ERR_NOMEM, "%s: out of memory", P->path);
    *after = 0;
    for (int64_t t = P->t0; t < P->T; t++) {
        int64_t d = day_of(tt[t]);
        cls[t] = d <= end[0] ? 0 : d <= end[1] ? 1 : (!has_test_end || d <= end[2]) ? 2 : -1;
        if (cls[t] >= 0)
            P->sp[cls[t]].nd++;
        else
            (*after)++;
    }
    static const char *key[3] = {"train_end", "val_end", "test_end"};
    pl_status st = PL_OK;
    for (int s = 0; s < PL_SPLIT_COUNT && !st; s++) {
        psplit *Sp = &P->sp[s];
        Sp->arranged_epoch = -1;
        if (Sp->nd == 0) {
            char lo[32], hi[32], want[128], f0[32], f1[32];
            lk_format_day(end[s > 0 ? s - 1 : 0], lo, sizeof lo);
            lk_format_day(end[s], hi, sizeof hi);
            if (s == 0)
                snprintf(want, sizeof want, "on or before train_end %s", lo);
            else if (s == 1 || has_test_end)
                snprintf(want, sizeof want, "after %s %s and on or before %s %s", key[s - 1], lo,
                         key[s], hi);
            else
                snprintf(want, sizeof want, "after val_end %s", lo);
            lk_format_day(day_of(tt[P->t0]), f0, sizeof f0);
            lk_format_day(day_of(tt[P->T - 1]), f1, sizeof f1);
            st = pl_error_set(PL_ERR_CONFIG,
                              "%s: split '%s' is empty: no usable row has a %s day %s; the usable "
                              "rows %lld..%lld (full window and lookback) have %s %s .. %s",
                              P->path, pl_split_name((pl_data_split)s), ttname, want,
                              (long long)P->t0, (long long)P->T - 1, ttname, f0, f1);
            break;
        }
        Sp->rows = malloc(sizeof *Sp->rows * (size_t)Sp->nd);
        Sp->order = malloc(sizeof *Sp->order * (size_t)Sp->nd);
        if (!Sp->rows || !Sp->order) st = pl_error_set(PL_ERR_NOMEM, "%s: out of memory", P->path);
        int64_t j = 0;
        for (int64_t t = P->t0; t < P->T && !st; t++)
            if (cls[t] == s) Sp->rows[j++] = t;
        if (!st) memcpy(Sp->order, Sp->rows, sizeof *Sp->order * (size_t)Sp->nd);
    }
    free(cls);
    return st;
}

static pl_status publish_meta(panel *P, pl_run_context *ctx, char (*fnames)[64],
                              const double *fmean, const double *fsd, const double *ty,
                              int64_t after) {
    pl_meta *m = ctx ? ctx->meta : NULL;
    if (!m) return PL_OK;
    pl_status st = PL_OK;
    char key[96], line[1024];
#define SET(call)                                                                                  \
    do {                                                                                           \
        if (!st) st = (call);                                                                      \
    } while (0)
    SET(pl_meta_set_int(m, "num_stocks", P->S));
    SET(pl_meta_set_int(m, "num_features", P->F));
    SET(pl_meta_set_int(m, "window", P->W));
    SET(pl_meta_set_int(m, "graph_lookback", P->L));
    SET(pl_meta_set_int(m, "graph_top_k", P->k));
    SET(pl_meta_set_int(m, "num_factors", P->K));
    for (int64_t k = 0; k < P->K; k++) {
        snprintf(key, sizeof key, "factor_name_%lld", (long long)k);
        SET(pl_meta_set_str(m, key, fnames[k]));
    }
    for (int64_t f = 0; f < P->F; f++) {
        snprintf(key, sizeof key, "feature_mean_%lld", (long long)f);
        SET(pl_meta_set_float(m, key, fmean[f]));
        snprintf(key, sizeof key, "feature_std_%lld", (long long)f);
        SET(pl_meta_set_float(m, key, fsd[f]));
    }
    if (ty) {
        SET(pl_meta_set_float(m, "target_mean", ty[0]));
        SET(pl_meta_set_float(m, "target_std", ty[1]));
    }
    SET(pl_meta_set_int(m, "num_train", P->sp[0].nd));
    SET(pl_meta_set_int(m, "num_val", P->sp[1].nd));
    SET(pl_meta_set_int(m, "num_test", P->sp[2].nd));
    SET(pl_meta_set_int(m, "graphs_built", P->graphs_built));
    SET(pl_meta_set_float(m, "graph_build_ms", P->build_ms));
    SET(pl_meta_set_str(m, "task", "stock_ranking"));
    char built[160], dropped[64] = "";
    if (P->per_batch)
        snprintf(built, sizeof built, "day-graphs rebuilt in every batch");
    else
        snprintf(built, sizeof built, "%lld day-graphs built once in %.0f ms",
                 (long long)P->graphs_built, P->build_ms);
    if (after) snprintf(dropped, sizeof dropped, ", %lld after test_end", (long long)after);
    snprintf(line, sizeof line,
             "%s: %lld stocks, %lld features, %lld days (%lld before the first full window%s); "
             "train %lld, val %lld, test %lld days; %s (top-%lld |corr| over %lld days%s)",
             P->path, (long long)P->S, (long long)P->F, (long long)P->T, (long long)P->t0, dropped,
             (long long)P->sp[0].nd, (long long)P->sp[1].nd, (long long)P->sp[2].nd, built,
             (long long)P->k, (long long)P->L, P->loops ? ", self loops" : "");
    SET(pl_meta_set_str(m, "data_summary", line));
#undef SET
    return st;
}

/* What the steps of pn_read hand on to each other. */
typedef struct panel_in {
    const char *xname, *yname, *tname, *ttname, *kname, *gname, *norm; /* datasets, options */
    int64_t end[3];    /* last day of train, val, test target_time */
    bool has_test_end; /* else test runs to the end */
    bool drop_last, standardize;
    int64_t B, Be;    /* batch_size, eval_batch_size */
    int64_t *tm, *tt; /* time, target_time [T] */
    char (*fnames)[64], (*knames)[64];
    int nf, nk;                  /* names found in the attributes */
    int64_t dx[3], dy[2], dk[3]; /* dataset shapes */
    int64_t gi;                  /* graph_feature's column */
    int64_t ek;                  /* edges of every usable day */
    int64_t after;               /* usable days after test_end */
    double *fmean, *fsd;         /* feature statistics (train rows) */
    double ty[2];                /* target_norm = global: train mean, std */
    bool global;
} panel_in;

static void in_free(panel_in *in) {
    free(in->tm);
    free(in->tt);
    free(in->fnames);
    free(in->knames);
    free(in->fmean);
    free(in->fsd);
}

/* The options and the split bounds (config errors before the file is read). */
static pl_status read_options(panel *P, const pl_config_section *cfg, panel_in *in) {
    in->xname = pl_cfg_str(cfg, "features", "features");
    in->yname = pl_cfg_str(cfg, "target", "target");
    in->tname = pl_cfg_str(cfg, "time", "time");
    in->ttname = pl_cfg_str(cfg, "target_time", "target_time");
    in->kname = pl_cfg_str(cfg, "factors", "factors");
    in->gname = pl_cfg_str(cfg, "graph_feature", "ret_1d");
    in->norm = pl_cfg_str(cfg, "target_norm", "cross_section");
    P->W = pl_cfg_int(cfg, "window", 20);
    P->L = pl_cfg_int(cfg, "graph_lookback", 60);
    P->k = pl_cfg_int(cfg, "graph_top_k", 5);
    P->loops = pl_cfg_bool(cfg, "add_self_loops", false);
    P->per_batch = !strcmp(pl_cfg_str(cfg, "graphs", "once"), "per_batch");
    P->shuffle = pl_cfg_bool(cfg, "shuffle", true);
    in->drop_last = pl_cfg_bool(cfg, "drop_last", false);
    in->standardize = pl_cfg_bool(cfg, "standardize_features", true);
    in->B = pl_cfg_int(cfg, "batch_size", 32);
    in->Be = pl_cfg_int(cfg, "eval_batch_size", 0);
    if (!strcmp(in->kname, "\"\""))
        return pl_error_set(PL_ERR_CONFIG,
                            "hdf5_panel: factors = \"\" names a dataset called \"\" (INI values "
                            "are not quoted); write `factors =` to serve no factors");
    static const char *end_key[3] = {"train_end", "val_end", "test_end"};
    in->has_test_end = pl_cfg_str(cfg, "test_end", "")[0] != 0;
    for (int s = 0; s < 3; s++) {
        const char *v = pl_cfg_str(cfg, end_key[s], "");
        if (!v[0] && s < 2)
            return pl_error_set(PL_ERR_CONFIG,
                                "hdf5_panel: needs %s = YYYY-MM-DD (the last day of the %s "
                                "split's target_time)",
                                end_key[s], s == 0 ? "train" : "val");
        pl_status st = v[0] ? parse_day(end_key[s], v, &in->end[s]) : PL_OK;
        if (st) return st;
        if (s > 0 && v[0] && in->end[s] <= in->end[s - 1])
            return pl_error_set(PL_ERR_CONFIG, "hdf5_panel: %s = %s must be after %s = %s",
                                end_key[s], v, end_key[s - 1], pl_cfg_str(cfg, end_key[s - 1], ""));
    }
    return PL_OK;
}

/* Dataset `name` read whole (lk_read_ds), its bytes counted in P->st. */
static pl_status pn_read_ds(panel *P, hid_t f, const char *name, hid_t memtype, int min_rank,
                            int max_rank, const int64_t *want, void **out, int64_t *dims,
                            int *rank) {
    return lk_read_ds(P->path, f, name, memtype, min_rank, max_rank, want, out, dims, rank,
                      &P->st.bytes_read);
}

/* The factors [T, S, K] (`factors =` serves none); under the HDF5 lock. */
static pl_status read_factors(panel *P, hid_t f, panel_in *in) {
    pl_status st = pn_read_ds(P, f, in->kname, H5T_NATIVE_FLOAT, 3, 3, (int64_t[]){P->T, P->S, -1},
                              (void **)&P->hfac, in->dk, NULL);
    if (st)
        return pl_error_prefix(st,
                               "panel factors: [T, S, K] with [T, S] = [%lld, %lld] as features "
                               "'%s' (`factors =` serves none)",
                               (long long)P->T, (long long)P->S, in->xname);
    P->K = in->dk[2];
    if (P->K < 1 || P->K > INT32_MAX - 1)
        return pl_error_set(PL_ERR_SHAPE,
                            "%s: dataset '%s' has %lld factors (axis 2); expected 1..2^31-1 "
                            "(`factors =` serves none)",
                            P->path, in->kname, (long long)P->K);
    return PL_OK;
}

/* The datasets and the name attributes; under the HDF5 lock. */
static pl_status read_datasets(panel *P, hid_t f, panel_in *in) {
    pl_status st =
        pn_read_ds(P, f, in->xname, H5T_NATIVE_FLOAT, 3, 3, NULL, (void **)&P->hx, in->dx, NULL);
    if (st) return pl_error_prefix(st, "panel features: [T days, S stocks, F features]");
    P->T = in->dx[0];
    P->S = in->dx[1];
    P->F = in->dx[2];
    if (P->T < 1 || P->S < 1 || P->F < 1 || P->F > INT32_MAX - 1)
        return pl_error_set(PL_ERR_SHAPE,
                            "%s: dataset '%s' is [%lld, %lld, %lld]; expected [T days, S "
                            "stocks, F features], each >= 1 (F < 2^31)",
                            P->path, in->xname, (long long)P->T, (long long)P->S, (long long)P->F);
    if ((st = pn_read_ds(P, f, in->yname, H5T_NATIVE_FLOAT, 2, 2, (int64_t[]){P->T, P->S},
                         (void **)&P->hret, in->dy, NULL)))
        return pl_error_prefix(st, "panel target: [T, S] = [%lld, %lld] as features '%s'",
                               (long long)P->T, (long long)P->S, in->xname);
    int64_t dt[1];
    if ((st = pn_read_ds(P, f, in->tname, H5T_NATIVE_INT64, 1, 1, (int64_t[]){P->T},
                         (void **)&in->tm, dt, NULL)) ||
        (st = pn_read_ds(P, f, in->ttname, H5T_NATIVE_INT64, 1, 1, (int64_t[]){P->T},
                         (void **)&in->tt, dt, NULL)))
        return pl_error_prefix(st, "panel times: [T] = [%lld] as features '%s'", (long long)P->T,
                               in->xname);
    if (in->kname[0] && (st = read_factors(P, f, in))) return st;
    in->fnames = calloc((size_t)P->F + 1, sizeof *in->fnames);
    in->knames = calloc((size_t)P->K + 1, sizeof *in->knames);
    if (!in->fnames || !in->knames) return pl_error_set(PL_ERR_NOMEM, "%s: out of memory", P->path);
    if ((st = pl_h5_attr_read_names(P->path, f, in->xname, "feature_names", in->fnames,
                                    (int)(P->F + 1), &in->nf)))
        return st;
    if (P->K)
        st = pl_h5_attr_read_names(P->path, f, in->kname, "factor_names", in->knames,
                                   (int)(P->K + 1), &in->nk);
    return st;
}

/* The file, read whole under the process-wide HDF5 lock. */
static pl_status read_file(panel *P, panel_in *in) {
    hid_t f = H5I_INVALID_HID;
    pl_h5_lock();
    pl_status st = pl_h5_open_read(P->path, "make it with tools/stocks_to_h5.py", &f);
    if (!st) st = read_datasets(P, f, in);
    if (f >= 0) {
        pl_status cs = pl_h5_close(P->path, f);
        if (!st) st = cs;
    }
    pl_h5_unlock();
    return st;
}

/* The names: feature_names (graph_feature among them), factor_names. */
static pl_status check_file_names(panel *P, panel_in *in) {
    if (in->nf != P->F)
        return pl_error_set(PL_ERR_INVALID,
                            "%s: dataset '%s' needs attribute 'feature_names' with its %lld "
                            "feature names (comma-separated, or an array of strings) to find "
                            "graph_feature '%s'; found %d names",
                            P->path, in->xname, (long long)P->F, in->gname, in->nf);
    in->gi = -1;
    for (int64_t i = 0; i < P->F && in->gi < 0; i++)
        if (!strcmp(in->fnames[i], in->gname)) in->gi = i;
    if (in->gi < 0) {
        char list[512] = "";
        for (int64_t i = 0; i < P->F && strlen(list) < 400; i++)
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "",
                     in->fnames[i]);
        return pl_error_set(PL_ERR_CONFIG,
                            "%s: graph_feature '%s' is not one of the %lld names of attribute "
                            "'feature_names' of dataset '%s' (%s%s)",
                            P->path, in->gname, (long long)P->F, in->xname, list,
                            strlen(list) >= 400 ? ", ..." : "");
    }
    if (!P->K) return PL_OK;
    if (in->nk == 0)
        for (int64_t k = 0; k < P->K; k++)
            snprintf(in->knames[k], sizeof in->knames[k], "factor_%lld", (long long)k);
    else if (in->nk != P->K)
        return pl_error_set(PL_ERR_INVALID,
                            "%s: attribute 'factor_names' of dataset '%s' has %d names; "
                            "expected %lld, one per factor (axis 2)",
                            P->path, in->kname, in->nk, (long long)P->K);
    return check_names(P, in->kname, "factor_names", in->knames, (int)P->K);
}

/* The options against the file; NaN / Inf refused (README "Missing
 * values"); the times; the edge count. */
static pl_status check_file(panel *P, panel_in *in) {
    pl_status st = check_file_names(P, in);
    if (st) return st;
    if (P->S < 2 || P->k > P->S - 1)
        return pl_error_set(PL_ERR_CONFIG,
                            "%s: graph_top_k = %lld must lie in 1..S-1 = %lld (dataset '%s' has "
                            "S = %lld stocks)",
                            P->path, (long long)P->k, (long long)P->S - 1, in->xname,
                            (long long)P->S);
    P->t0 = (P->W > P->L ? P->W : P->L) - 1;
    if (P->t0 >= P->T)
        return pl_error_set(PL_ERR_CONFIG,
                            "%s: window = %lld and graph_lookback = %lld need at least %lld "
                            "rows; dataset '%s' has T = %lld",
                            P->path, (long long)P->W, (long long)P->L, (long long)P->t0 + 1,
                            in->xname, (long long)P->T);
    if ((st = pl_h5_check_finite(P->path, in->xname, PL_F32, P->hx, 0, P->T, 3, in->dx, NULL, NULL,
                                 0)) ||
        (st = pl_h5_check_finite(P->path, in->yname, PL_F32, P->hret, 0, P->T, 2, in->dy, NULL,
                                 NULL, 0)) ||
        (P->K && (st = pl_h5_check_finite(P->path, in->kname, PL_F32, P->hfac, 0, P->T, 3, in->dk,
                                          NULL, NULL, 0))) ||
        (st = check_times(P, in->tname, in->ttname, in->tm, in->tt, P->T)))
        return st;
    int64_t ss;
    if (__builtin_mul_overflow(P->S, P->k + (P->loops ? 1 : 0), &P->E_day) ||
        !pn_size3(P->T - P->t0, P->E_day, 1, &in->ek) || !pn_size3(P->S, P->S, 1, &ss))
        return pl_error_set(PL_ERR_SHAPE, "%s: %lld stocks with graph_top_k = %lld: too many edges",
                            P->path, (long long)P->S, (long long)P->k);
    return PL_OK;
}

/* The splits' days and batches. */
static pl_status make_splits(panel *P, panel_in *in) {
    pl_status st = assign_splits(P, in->tt, in->ttname, in->end, in->has_test_end, &in->after);
    for (int s = 0; s < PL_SPLIT_COUNT && !st; s++) {
        psplit *Sp = &P->sp[s];
        Sp->B = s == PL_SPLIT_TRAIN ? in->B : in->Be > 0 ? in->Be : Sp->nd;
        bool drop = s == PL_SPLIT_TRAIN && in->drop_last;
        if (drop && Sp->nd < Sp->B)
            return pl_error_set(PL_ERR_CONFIG,
                                "%s: train split has %lld days < batch_size %lld with drop_last "
                                "= true: no batch",
                                P->path, (long long)Sp->nd, (long long)Sp->B);
        Sp->nb = lk_batches(Sp->nd, Sp->B, drop);
    }
    return st;
}

/* graph_feature as in the file; features standardized with the train rows'
 * statistics; y per day over the stocks (cross_section), with the train
 * statistics (global), or as in the file. */
static pl_status normalize(panel *P, panel_in *in) {
    const int64_t TS = P->T * P->S, F = P->F;
    P->g = malloc(sizeof *P->g * (size_t)TS);
    P->hy = malloc(sizeof *P->hy * (size_t)TS);
    in->fmean = calloc((size_t)F, sizeof *in->fmean);
    in->fsd = calloc((size_t)F, sizeof *in->fsd);
    if (!P->g || !P->hy || !in->fmean || !in->fsd)
        return pl_error_set(PL_ERR_NOMEM, "%s: out of memory", P->path);
    for (int64_t i = 0; i < TS; i++)
        P->g[i] = P->hx[i * F + in->gi];
    for (int64_t c = 0; c < F; c++) {
        in->fsd[c] = 1.0;
        if (in->standardize) train_stats(P, P->hx, F, c, &in->fmean[c], &in->fsd[c]);
    }
    if (in->standardize)
        for (int64_t i = 0; i < TS; i++)
            for (int64_t c = 0; c < F; c++)
                P->hx[i * F + c] = (float)((P->hx[i * F + c] - in->fmean[c]) / in->fsd[c]);
    in->ty[0] = 0;
    in->ty[1] = 1;
    in->global = !strcmp(in->norm, "global");
    if (in->global) train_stats(P, P->hret, 1, 0, &in->ty[0], &in->ty[1]);
    bool cross = !strcmp(in->norm, "cross_section");
    for (int64_t t = 0; t < P->T; t++) {
        const float *r = P->hret + t * P->S;
        double mean = in->ty[0], sd = in->ty[1];
        if (cross) {
            double s = 0, ss = 0;
            for (int64_t i = 0; i < P->S; i++)
                s += r[i];
            mean = s / (double)P->S;
            for (int64_t i = 0; i < P->S; i++)
                ss += (r[i] - mean) * (r[i] - mean);
            sd = sqrt(ss / (double)(P->S - 1));
            if (!(sd > 0)) sd = 1.0;
        }
        for (int64_t i = 0; i < P->S; i++)
            P->hy[t * P->S + i] = (float)((r[i] - mean) / sd);
    }
    return PL_OK;
}

/* The day-graphs (once), the staging, val / test (and an unshuffled train)
 * laid out. */
static pl_status stage(panel *P, const panel_in *in) {
    pl_status st;
    if (P->per_batch) {
        st = pn_dscratch_init(&P->ds, P->S, P->L);
    } else {
        P->esrc = malloc(sizeof *P->esrc * (size_t)in->ek);
        P->edst = malloc(sizeof *P->edst * (size_t)in->ek);
        st = !P->esrc || !P->edst ? pl_error_set(PL_ERR_NOMEM, "%s: out of memory", P->path)
                                  : pn_build_all(P);
    }
    if (st || (st = pn_make_staging(P))) return st;
    for (int s = 0; s < PL_SPLIT_COUNT; s++) {
        if (s == PL_SPLIT_TRAIN && P->shuffle) continue;
        if ((st = pn_arrange(P, &P->sp[s]))) return st;
        P->sp[s].arranged_epoch = 0;
    }
    return PL_OK;
}

pl_status pn_read(panel *P, const pl_config_section *cfg) {
    panel_in in = {0};
    pl_status st = read_options(P, cfg, &in);
    if (!st) st = read_file(P, &in);
    if (!st) st = check_file(P, &in);
    if (!st) st = make_splits(P, &in);
    if (!st) st = normalize(P, &in);
    if (!st) st = stage(P, &in);
    if (!st)
        st = publish_meta(P, P->ctx, in.knames, in.fmean, in.fsd, in.global ? in.ty : NULL,
                          in.after);
    P->st.chunks_loaded = 1;
    in_free(&in);
    return st;
}
