/* series_times.c - hdf5_series: the rows' times and the split bounds.
 *
 * Row times: /time (int64 seconds since 1970-01-01T00:00:00Z, option
 * time_dataset) when the file has it, else /date (int64 days); train_end /
 * val_end are YYYY-MM-DD (a whole day, inclusive) or, for seconds,
 * YYYY-MM-DDThh:mm[:ss] with a zone (Z, +07:00).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "hdf5_series.h"

/* train_end / val_end: "YYYY-MM-DD" -> *day, *has_time = false; or
 * "YYYY-MM-DDThh:mm[:ss]" + zone ("Z", "+07:00", "-0130") -> *sec (UTC
 * seconds since 1970), *has_time = true. A time of day without a zone is
 * refused (it would silently mean UTC or local time). */
pl_status sr_parse_bound(const char *key, const char *s, int64_t *day, int64_t *sec,
                         bool *has_time) {
    int y, m, d, n = 0;
    const char *want = "expected YYYY-MM-DD, or YYYY-MM-DDThh:mm[:ss] with a zone (Z or +hh:mm)";
    if (sscanf(s, "%5d-%2d-%2d%n", &y, &m, &d, &n) != 3 || n != 10 || m < 1 || m > 12 || d < 1 ||
        d > 31)
        return pl_error_set(PL_ERR_CONFIG, "hdf5_series: %s = '%s': %s", key, s, want);
    *day = lk_days_from_civil(y, m, d);
    *has_time = s[10] != 0;
    if (!*has_time) return PL_OK;
    const char *t = s + 11;
    int hh, mi, ss = 0, k = 0;
    if (s[10] != 'T' || sscanf(t, "%2d:%2d%n", &hh, &mi, &k) != 2 || k != 5)
        return pl_error_set(PL_ERR_CONFIG, "hdf5_series: %s = '%s': %s", key, s, want);
    t += 5;
    if (t[0] == ':') {
        if (sscanf(t + 1, "%2d%n", &ss, &k) != 1 || k != 2)
            return pl_error_set(PL_ERR_CONFIG, "hdf5_series: %s = '%s': %s", key, s, want);
        t += 3;
    }
    if (hh > 23 || mi > 59 || ss > 59)
        return pl_error_set(PL_ERR_CONFIG, "hdf5_series: %s = '%s': time of day out of range", key,
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
            return pl_error_set(PL_ERR_CONFIG, "hdf5_series: %s = '%s': %s", key, s, want);
        if (zh > 23 || zm > 59)
            return pl_error_set(PL_ERR_CONFIG, "hdf5_series: %s = '%s': zone out of range", key, s);
        off = (t[0] == '-' ? -1 : 1) * (zh * 3600 + zm * 60);
    } else {
        return pl_error_set(PL_ERR_CONFIG,
                            "hdf5_series: %s = '%s': a time of day needs its zone (Z for UTC, or "
                            "+hh:mm); %s",
                            key, s, want);
    }
    *sec = *day * 86400 + hh * 3600 + mi * 60 + ss - off;
    return PL_OK;
}

/* Seconds since 1970 -> "YYYY-MM-DDThh:mmZ" (":ss" when not 0), UTC. */
void sr_format_time(int64_t sec, char *out, size_t n) {
    struct tm tm;
    bool ok = sec > -100000000LL * 86400 && sec < 100000000LL * 86400;
    time_t t = (time_t)(ok ? sec : 0);
    if (ok && gmtime_r(&t, &tm))
        strftime(out, n, tm.tm_sec ? "%Y-%m-%dT%H:%M:%SZ" : "%Y-%m-%dT%H:%MZ", &tm);
    else
        snprintf(out, n, "second %lld", (long long)sec);
}

/* String attribute `attr` of dataset `ds` into buf: 1 read, 0 absent, -1 not a string. */
static int read_str_attr(series_loader *L, const char *ds, const char *attr, char *buf, size_t n) {
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
pl_status sr_read_row_times(series_loader *L, const pl_config_section *cfg, int64_t T,
                            const char *sname, bool need, int64_t **out, bool *secs, char *dname,
                            size_t dn) {
    *out = NULL;
    const char *tds = pl_cfg_str(cfg, "time_dataset", "time");
    *secs = false;
    if (tds[0]) {
        lk_join_path(dname, dn, "/", tds);
        *secs = pl_h5_exists(L->file, dname);
    }
    if (!*secs) lk_join_path(dname, dn, "/", pl_cfg_str(cfg, "date_dataset", "date"));
    if (!need && !pl_h5_exists(L->file, dname)) return PL_OK;
    pl_status st = pl_h5_read_alloc(L->path, L->file, dname, H5T_NATIVE_INT64, 1, 1, (int64_t[]){T},
                                    (void **)out, NULL);
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
        return pl_error_set(PL_ERR_INVALID,
                            "%s: '%s' has unit '%s'; expected '%s' (or no unit "
                            "attribute)",
                            L->path, dname, unit, SECONDS_UNIT);
    }
    for (int64_t i = 1; need && i < T; i++)
        if ((*out)[i] < (*out)[i - 1]) {
            free(*out);
            *out = NULL;
            return pl_error_set(PL_ERR_INVALID, "%s: '%s' is not sorted (row %lld)", L->path, dname,
                                (long long)i);
        }
    return PL_OK;
}

/* Multi-timeframe rows must be regular bars: k rows = k bars of one length.
 * The times are untrusted: a step that overflows int64 is irregular, not
 * undefined. */
pl_status sr_check_regular(const series_loader *L, const int64_t *date, int64_t T, bool secs,
                           const char *dname) {
    if (!date || T < 2) return PL_OK;
    int64_t d0 = 0, di = 0;
    bool ok0 = !__builtin_sub_overflow(date[1], date[0], &d0) && d0 > 0;
    for (int64_t i = ok0 ? 2 : 1; i < T; i++) {
        bool oki = ok0 && !__builtin_sub_overflow(date[i], date[i - 1], &di) && di == d0;
        if (oki) continue;
        if (!ok0) di = d0;
        char t0[40], t1[40], s0[32], s1[32];
        (secs ? sr_format_time : lk_format_day)(date[i - 1], t0, sizeof t0);
        (secs ? sr_format_time : lk_format_day)(date[i], t1, sizeof t1);
        if (__builtin_sub_overflow(date[1], date[0], &d0))
            snprintf(s0, sizeof s0, "more than 2^63");
        else
            snprintf(s0, sizeof s0, "%lld", (long long)d0);
        if (__builtin_sub_overflow(date[i], date[i - 1], &di))
            snprintf(s1, sizeof s1, "more than 2^63");
        else
            snprintf(s1, sizeof s1, "%lld", (long long)di);
        return pl_error_set(PL_ERR_INVALID,
                            "%s: timeframes need regular, increasing bars, but '%s' steps by "
                            "%s from row 0 to 1 and from row %lld (%s) to %lld (%s) by %s "
                            "(resample with tools/csv_to_h5.py --resample)",
                            L->path, dname, s0, (long long)i - 1, t0, (long long)i, t1, s1);
    }
    return PL_OK;
}
