/* stock_metrics.c - the stock-ranking field's evaluation statistics on host
 * arrays: daily Spearman rank IC (average ranks for ties), its mean, sample
 * std and t-statistic over the days, and the annualized Sharpe ratio of a
 * daily long-top / short-bottom portfolio. Definitions and sources in
 * README.md ("Evaluation metrics"); the NumPy reference that checks them is
 * tools/gen_stock_gat_reference.py.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "stock_gat.h"

typedef struct keyed {
    float v;
    int64_t i;
} keyed;

/* ascending value, then ascending index: a total, deterministic order */
static int keyed_cmp(const void *pa, const void *pb) {
    const keyed *a = pa, *b = pb;
    if (a->v < b->v) return -1;
    if (a->v > b->v) return 1;
    return (a->i > b->i) - (a->i < b->i);
}

static bool all_finite(const float *v, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(v[i])) return false;
    return true;
}

static keyed *sorted_keys(const float *v, int64_t n) {
    keyed *k = malloc(sizeof *k * (size_t)(n ? n : 1));
    if (!k) return NULL;
    for (int64_t i = 0; i < n; i++)
        k[i] = (keyed){v[i], i};
    qsort(k, (size_t)n, sizeof *k, keyed_cmp);
    return k;
}

pl_status sg_rank_average(const float *v, int64_t n, double *r) {
    keyed *k = sorted_keys(v, n);
    if (!k)
        return pl_error_set(PL_ERR_NOMEM, "stock_gat: out of memory ranking %lld values",
                            (long long)n);
    for (int64_t a = 0; a < n;) {
        int64_t b = a;
        while (b + 1 < n && k[b + 1].v == k[a].v)
            b++;
        double rank = 0.5 * (double)(a + b) + 1.0; /* mean of the 1-based positions a+1 .. b+1 */
        for (int64_t j = a; j <= b; j++)
            r[k[j].i] = rank;
        a = b + 1;
    }
    free(k);
    return PL_OK;
}

/* Pearson correlation; 0 when either side has no variance. */
static double pearson(const double *a, const double *b, int64_t n) {
    double ma = 0, mb = 0;
    for (int64_t i = 0; i < n; i++) {
        ma += a[i];
        mb += b[i];
    }
    ma /= (double)n;
    mb /= (double)n;
    double sab = 0, saa = 0, sbb = 0;
    for (int64_t i = 0; i < n; i++) {
        sab += (a[i] - ma) * (b[i] - mb);
        saa += (a[i] - ma) * (a[i] - ma);
        sbb += (b[i] - mb) * (b[i] - mb);
    }
    return saa > 0 && sbb > 0 ? sab / sqrt(saa * sbb) : 0.0;
}

double sg_spearman(const float *a, const float *b, int64_t n) {
    if (!all_finite(a, n) || !all_finite(b, n)) return NAN;
    if (n < 2) return 0.0;
    double *ra = malloc(sizeof *ra * 2 * (size_t)n), *rb = ra ? ra + n : NULL;
    if (!ra) return NAN;
    double s = NAN;
    if (!sg_rank_average(a, n, ra) && !sg_rank_average(b, n, rb)) s = pearson(ra, rb, n);
    free(ra);
    return s;
}

double sg_long_short(const float *score, const float *ret, int64_t n, int64_t long_short) {
    if (!all_finite(score, n) || !all_finite(ret, n)) return NAN;
    int64_t L = long_short < n / 2 ? long_short : n / 2;
    if (L <= 0) return 0.0;
    keyed *k = sorted_keys(score, n);
    if (!k) return NAN;
    double r = 0.0;
    if (k[0].v != k[n - 1].v) { /* a constant score ranks nothing: no position */
        double lo = 0, hi = 0;
        for (int64_t j = 0; j < L; j++) {
            lo += expm1((double)ret[k[j].i]);
            hi += expm1((double)ret[k[n - 1 - j].i]);
        }
        r = (hi - lo) / (double)L;
    }
    free(k);
    return r;
}

/* mean and sample std (ddof 1; 0 for fewer than 2 values) */
static void mean_std(const double *v, int64_t n, double *mean, double *sd) {
    double s = 0, ss = 0;
    for (int64_t i = 0; i < n; i++)
        s += v[i];
    *mean = n > 0 ? s / (double)n : 0.0;
    for (int64_t i = 0; i < n; i++)
        ss += (v[i] - *mean) * (v[i] - *mean);
    *sd = n > 1 ? sqrt(ss / (double)(n - 1)) : 0.0;
}

pl_status sg_group_days(const int64_t *day, int64_t n, int64_t num_days, int64_t *start,
                        int64_t *order) {
    for (int64_t i = 0; i < n; i++)
        if (day[i] < 0 || day[i] >= num_days)
            return pl_error_set(PL_ERR_INVALID,
                                "stock_gat: node %lld has day id %lld outside the "
                                "batch's %lld days (field 'batch')",
                                (long long)i, (long long)day[i], (long long)num_days);
    memset(start, 0, sizeof *start * (size_t)(num_days + 1));
    for (int64_t i = 0; i < n; i++)
        start[day[i] + 1]++;
    for (int64_t d = 0; d < num_days; d++)
        start[d + 1] += start[d];
    /* stable counting sort: fill positions from the front of each day */
    for (int64_t i = 0; i < n; i++)
        order[start[day[i]]++] = i;
    for (int64_t d = num_days; d > 0; d--)
        start[d] = start[d - 1];
    start[0] = 0;
    return PL_OK;
}

pl_status sg_daily_stats(const float *score, int64_t stride, const float *ret, const int64_t *day,
                         int64_t n, int64_t num_days, int64_t long_short, sg_stats *out) {
    memset(out, 0, sizeof *out);
    int64_t *start = malloc(sizeof *start * (size_t)(num_days + 1));
    int64_t *order = malloc(sizeof *order * (size_t)(n ? n : 1));
    float *s = malloc(sizeof *s * 2 * (size_t)(n ? n : 1)), *r = s ? s + (n ? n : 1) : NULL;
    double *ic = malloc(sizeof *ic * 2 * (size_t)(num_days ? num_days : 1));
    double *ls = ic ? ic + (num_days ? num_days : 1) : NULL;
    pl_status st = PL_OK;
    if (!start || !order || !s || !ic)
        st = pl_error_set(PL_ERR_NOMEM, "stock_gat: out of memory for the metrics of %lld nodes",
                          (long long)n);
    if (!st) st = sg_group_days(day, n, num_days, start, order);
    if (st) goto done;
    int64_t days = 0;
    for (int64_t d = 0; d < num_days; d++) {
        int64_t m = start[d + 1] - start[d];
        if (m == 0) continue;
        for (int64_t j = 0; j < m; j++) {
            int64_t i = order[start[d] + j]; /* ascending node id = stock order within the day */
            s[j] = score[i * stride];
            r[j] = ret[i];
        }
        ic[days] = sg_spearman(s, r, m);
        ls[days] = sg_long_short(s, r, m, long_short);
        days++;
    }
    double ls_mean, ls_sd;
    mean_std(ic, days, &out->ic, &out->ic_std);
    mean_std(ls, days, &ls_mean, &ls_sd);
    out->days = days;
    out->ic_t = out->ic_std > 0 ? out->ic / out->ic_std * sqrt((double)days) : 0.0;
    out->sharpe = ls_sd > 0 ? ls_mean / ls_sd * sqrt(252.0) : 0.0;
    /* a non-finite day (a diverged model) makes every statistic NaN: the
     * trainer refuses non-finite metrics with its own message */
    if (isnan(out->ic)) out->ic_t = out->ic_std = NAN;
    if (isnan(ls_mean)) out->sharpe = NAN;
done:
    free(start);
    free(order);
    free(s);
    free(ic);
    return st;
}
