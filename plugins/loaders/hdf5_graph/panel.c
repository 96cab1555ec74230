/* panel.c - hdf5_graph mode = panel: a stock panel served as batches of
 * day-graphs (README.md "mode = panel": options, file layout, batches, math).
 *
 * The file: features [T, S, F] (attribute feature_names), target [T, S],
 * time / target_time [T] and optional factors [T, S, K]; row t holds what is
 * known at the close of day t, and target[t] the return over target_time[t].
 * Everything is read, checked and normalized once at create. Row t is a
 * usable day when its feature window (rows t-W+1..t) and its correlation
 * lookback (rows t-L+1..t) lie in the file; its split follows the day of its
 * target_time (train <= train_end < val <= val_end < test <= test_end).
 *
 * Day t's graph: the stocks are its nodes; node i receives edges j -> i from
 * the k stocks j != i with the largest |Pearson correlation| of graph_feature
 * with i over rows t-L+1..t (ties: lower j first; a constant series
 * correlates 0 with everything). graphs = once builds every usable day's
 * graph here at create; graphs = per_batch builds a batch's days' graphs
 * again in every next() from the same host values (slow on purpose: the
 * benchmark of rebuilding per batch; the same edges).
 *
 * Staging as in graphs mode: each split owns tensors on ctx->device holding
 * the whole split (x [n, W, F], edges, y, ret, factors) laid out in epoch
 * order (train: shuffled with ctx->seed + epoch at epoch_begin; val / test
 * once at create), and next() returns views of them. Every day has S nodes
 * and E_day edges, so batch b's rows are fixed (nodes b*B*S.., edges
 * b*B*E_day..) and the batch vector (node d*S + s -> day d) is one tensor
 * for every batch.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "hdf5_graph.h"

/* One split: its days, their epoch order, and its staging tensors. */
typedef struct psplit {
    int64_t nd;                               /* days (usable rows) in the split */
    int64_t B;                                /* days per batch */
    int64_t nb;                               /* batches served per epoch (after drop_last) */
    int64_t *rows;                            /* the days' rows t, file order */
    int64_t *order;                           /* the days' rows t, epoch order */
    pl_tensor *x, *src, *dst, *y, *ret, *fac; /* fac: NULL without factors */
    int64_t arranged_epoch;                   /* train: epoch whose order is staged; -1 none */
} psplit;

/* Scratch of one day's graph: the centered series [S, L], their sums of
 * squares [S] and the |corr| matrix [S, S]. */
typedef struct dscratch {
    double *c, *ss, *a;
} dscratch;

struct panel {
    int64_t T, S, F, K; /* rows, stocks, features, factors (0: none) */
    int64_t W, L, k;    /* window, lookback, top k */
    int64_t t0;         /* first usable row: max(W, L) - 1 */
    int64_t E_day;      /* edges per day: S * k (+ S self loops) */
    bool loops, per_batch, shuffle;
    float *hx;            /* [T, S, F] features (standardized) */
    float *g;             /* [T, S] graph_feature, as in the file */
    float *hy, *hret;     /* [T, S] normalized target, target as in the file */
    float *hfac;          /* [T, S, K] factors as in the file */
    int64_t *esrc, *edst; /* once: [(T - t0) * E_day] each usable day's edges, stock ids */
    psplit sp[PL_SPLIT_COUNT];
    pl_tensor *batch; /* i64 [B_max * S]: node d*S + s -> d */
    /* host scratch for a non-CPU device, sized for the largest split */
    float *sx, *sy, *sret, *sfac;
    int64_t *ssrc, *sdst; /* also per_batch's edges of one batch on such a device */
    dscratch ds;          /* per_batch: the graph builder's scratch */
    int64_t graphs_built;
    double build_ms;
};

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
        return pl_error_set(PL_ERR_CONFIG, "hdf5_graph: %s = '%s': expected a date YYYY-MM-DD", key,
                            s);
    *day = lk_days_from_civil(y, m, d);
    return PL_OK;
}

/* ---- the correlation graph of a day -------------------------------------- */

static pl_status dscratch_init(dscratch *d, int64_t S, int64_t L) {
    d->c = malloc(sizeof *d->c * (size_t)(S * L));
    d->ss = malloc(sizeof *d->ss * (size_t)S);
    d->a = malloc(sizeof *d->a * (size_t)(S * S));
    if (!d->c || !d->ss || !d->a)
        return pl_error_set(PL_ERR_NOMEM,
                            "hdf5_graph: out of memory for a day's graph (%lld "
                            "stocks)",
                            (long long)S);
    return PL_OK;
}

static void dscratch_free(dscratch *d) {
    free(d->c);
    free(d->ss);
    free(d->a);
    memset(d, 0, sizeof *d);
}

/* Day t's edges into src / dst [E_day], node ids + off: for each target i
 * ascending, the k sources j != i of largest |corr(i, j)| over rows
 * t-L+1..t of graph_feature in decreasing order (ties: lower j first), then
 * with self loops (i, i) for every i. corr = sum(ci cj) / sqrt(sum(ci^2)
 * sum(cj^2)) of the centered series, in double; a series whose L values are
 * all equal has corr 0 with every other. */
static void day_graph(const panel *P, int64_t t, dscratch *d, int64_t *src, int64_t *dst,
                      int64_t off) {
    const int64_t S = P->S, L = P->L;
    const float *g = P->g + (t - L + 1) * S; /* g[l * S + s]: row t-L+1+l, stock s */
    for (int64_t s = 0; s < S; s++) {
        double m = 0;
        bool flat = true;
        for (int64_t l = 0; l < L; l++) {
            m += g[l * S + s];
            flat = flat && g[l * S + s] == g[s];
        }
        m /= (double)L;
        double ss = 0;
        for (int64_t l = 0; l < L; l++) {
            double c = flat ? 0.0 : (double)g[l * S + s] - m;
            d->c[s * L + l] = c;
            ss += c * c;
        }
        d->ss[s] = flat ? 0.0 : ss;
    }
    for (int64_t i = 0; i < S; i++) {
        d->a[i * S + i] = -1.0; /* never its own source */
        for (int64_t j = i + 1; j < S; j++) {
            double r = 0;
            if (d->ss[i] > 0 && d->ss[j] > 0) {
                double dot = 0;
                for (int64_t l = 0; l < L; l++)
                    dot += d->c[i * L + l] * d->c[j * L + l];
                r = fabs(dot / sqrt(d->ss[i] * d->ss[j]));
            }
            d->a[i * S + j] = d->a[j * S + i] = r;
        }
    }
    int64_t e = 0;
    for (int64_t i = 0; i < S; i++) {
        double *row = d->a + i * S;
        for (int64_t m = 0; m < P->k; m++) {
            int64_t best = 0;
            double bv = -0.5; /* every |corr| >= 0 beats it; taken ones and i are -1 */
            for (int64_t j = 0; j < S; j++)
                if (row[j] > bv) {
                    bv = row[j];
                    best = j;
                }
            row[best] = -1.0;
            src[e] = best + off;
            dst[e++] = i + off;
        }
    }
    for (int64_t i = 0; P->loops && i < S; i++, e++)
        src[e] = dst[e] = i + off;
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* graphs = once: every usable day's graph into P->esrc / P->edst. */
static pl_status build_all(panel *P) {
    const int64_t nu = P->T - P->t0;
    int fail = 0;
    double t0 = now_ms();
#pragma omp parallel if (nu * P->S * P->S * P->L > (1 << 22))
    {
        dscratch d = {0};
        bool ok = dscratch_init(&d, P->S, P->L) == PL_OK;
        if (!ok) {
#pragma omp atomic write
            fail = 1;
        }
#pragma omp for schedule(dynamic, 16)
        for (int64_t u = 0; u < nu; u++)
            if (ok) day_graph(P, P->t0 + u, &d, P->esrc + u * P->E_day, P->edst + u * P->E_day, 0);
        dscratch_free(&d);
    }
    if (fail)
        return pl_error_set(PL_ERR_NOMEM,
                            "hdf5_graph: out of memory for a day's graph (%lld "
                            "stocks)",
                            (long long)P->S);
    P->build_ms = now_ms() - t0;
    P->graphs_built = nu;
    return PL_OK;
}

/* ---- staging --------------------------------------------------------------- */

/* Lay split Sp out in Sp->order into its staging tensors: day i of the order
 * (batch-local day d = i mod B) gets node rows i*S.. (x windows, y, ret,
 * factors) and, with graphs = once, edge rows i*E_day.. (its edges + d*S). On
 * a non-CPU device through the host scratch and one copy per tensor. */
static pl_status arrange(graph *G, panel *P, psplit *Sp) {
    const int64_t S = P->S, W = P->W, F = P->F, K = P->K, Ed = P->E_day;
    bool cpu = pl_device_eq(dev_of(G), PL_CPU);
    float *px = cpu ? pl_tensor_data(Sp->x) : P->sx;
    float *py = cpu ? pl_tensor_data(Sp->y) : P->sy;
    float *pr = cpu ? pl_tensor_data(Sp->ret) : P->sret;
    float *pf = !Sp->fac ? NULL : cpu ? pl_tensor_data(Sp->fac) : P->sfac;
    int64_t *ps = cpu ? pl_tensor_data(Sp->src) : P->ssrc,
            *pd = cpu ? pl_tensor_data(Sp->dst) : P->sdst;
#pragma omp parallel for schedule(static) if (Sp->nd * S * W * F > 65536)
    for (int64_t i = 0; i < Sp->nd; i++) {
        const int64_t t = Sp->order[i], off = (i % Sp->B) * S;
        for (int64_t s = 0; s < S; s++)
            for (int64_t w = 0; w < W; w++)
                memcpy(px + ((i * S + s) * W + w) * F, P->hx + ((t - W + 1 + w) * S + s) * F,
                       sizeof *px * (size_t)F);
        memcpy(py + i * S, P->hy + t * S, sizeof *py * (size_t)S);
        memcpy(pr + i * S, P->hret + t * S, sizeof *pr * (size_t)S);
        if (pf) memcpy(pf + i * S * K, P->hfac + t * S * K, sizeof *pf * (size_t)(S * K));
        if (P->per_batch) continue; /* next() builds them */
        const int64_t *es = P->esrc + (t - P->t0) * Ed, *ed = P->edst + (t - P->t0) * Ed;
        for (int64_t e = 0; e < Ed; e++) {
            ps[i * Ed + e] = es[e] + off;
            pd[i * Ed + e] = ed[e] + off;
        }
    }
    if (cpu) return PL_OK;
    const pl_backend *be = pl_backend_get(dev_of(G).type);
    if (!be) return pl_error_status();
    const size_t nodes = (size_t)(Sp->nd * S), edges = P->per_batch ? 0 : (size_t)(Sp->nd * Ed);
    struct {
        pl_tensor *t;
        const void *h;
        size_t bytes;
    } cp[6] = {{Sp->x, px, sizeof(float) * nodes * (size_t)(W * F)},
               {Sp->y, py, sizeof(float) * nodes},
               {Sp->ret, pr, sizeof(float) * nodes},
               {Sp->fac, pf, sizeof(float) * nodes * (size_t)K},
               {Sp->src, ps, sizeof(int64_t) * edges},
               {Sp->dst, pd, sizeof(int64_t) * edges}};
    for (int i = 0; i < 6; i++) {
        if (!cp[i].bytes || !cp[i].t) continue;
        pl_status st =
            be->memcpy(pl_tensor_data(cp[i].t), cp[i].t->device, cp[i].h, PL_CPU, cp[i].bytes);
        if (st)
            return pl_error_prefix(st, "%s: copying the %s staging to the device", G->path,
                                   cp[i].t->name);
    }
    return PL_OK;
}

/* graphs = per_batch: days [d0, d0 + n) of Sp's order rebuilt into the
 * batch's edge rows (batch-local ids). */
static pl_status rebuild_batch(graph *G, panel *P, psplit *Sp, int64_t d0, int64_t n) {
    const int64_t Ed = P->E_day;
    bool cpu = pl_device_eq(dev_of(G), PL_CPU);
    int64_t *ps = cpu ? (int64_t *)pl_tensor_data(Sp->src) + d0 * Ed : P->ssrc;
    int64_t *pd = cpu ? (int64_t *)pl_tensor_data(Sp->dst) + d0 * Ed : P->sdst;
    double t0 = now_ms();
    for (int64_t d = 0; d < n; d++)
        day_graph(P, Sp->order[d0 + d], &P->ds, ps + d * Ed, pd + d * Ed, d * P->S);
    if (!cpu) {
        const pl_backend *be = pl_backend_get(dev_of(G).type);
        size_t bytes = sizeof(int64_t) * (size_t)(n * Ed);
        pl_status st = !be ? pl_error_status()
                           : be->memcpy((int64_t *)pl_tensor_data(Sp->src) + d0 * Ed,
                                        Sp->src->device, ps, PL_CPU, bytes);
        if (!st)
            st = be->memcpy((int64_t *)pl_tensor_data(Sp->dst) + d0 * Ed, Sp->dst->device, pd,
                            PL_CPU, bytes);
        if (st) return pl_error_prefix(st, "%s: copying a batch's edges to the device", G->path);
    }
    P->build_ms += now_ms() - t0;
    P->graphs_built += n;
    if (G->ctx && G->ctx->meta) {
        pl_meta_set_int(G->ctx->meta, "graphs_built", P->graphs_built);
        pl_meta_set_float(G->ctx->meta, "graph_build_ms", P->build_ms);
    }
    return PL_OK;
}

/* ---- reading and checking ------------------------------------------------- */

/* a * b * c into *out when it stays below 2^58 elements (file sizes are untrusted). */
static bool size3(int64_t a, int64_t b, int64_t c, int64_t *out) {
    int64_t ab;
    return !__builtin_mul_overflow(a, b, &ab) && !__builtin_mul_overflow(ab, c, out) &&
           *out < ((int64_t)1 << 58);
}

/* Names of a dataset's string attribute must be usable as metric / column
 * names: letters, digits, '_', '.', '-'. */
static pl_status check_names(const graph *G, const char *ds, const char *attr, char (*names)[64],
                             int n) {
    for (int i = 0; i < n; i++)
        for (const char *c = names[i]; *c; c++)
            if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') ||
                  (*c >= '0' && *c <= '9') || *c == '_' || *c == '.' || *c == '-'))
                return pl_error_set(PL_ERR_IO,
                                    "%s: attribute '%s' of dataset '%s': name %d '%s' has a "
                                    "character other than letters, digits, '_', '.', '-'",
                                    G->path, attr, ds, i, names[i]);
    return PL_OK;
}

/* time strictly increasing; target_time[t] after time[t]. */
static pl_status check_times(const graph *G, const char *tname, const char *ttname,
                             const int64_t *tm, const int64_t *tt, int64_t T) {
    char a[32], b[32];
    for (int64_t t = 1; t < T; t++)
        if (tm[t] <= tm[t - 1]) {
            lk_format_day(day_of(tm[t]), a, sizeof a);
            lk_format_day(day_of(tm[t - 1]), b, sizeof b);
            return pl_error_set(PL_ERR_INVALID,
                                "%s: dataset '%s' must strictly increase (one row per day, "
                                "seconds since 1970): %s[%lld] = %lld (%s) <= %s[%lld] = %lld (%s)",
                                G->path, tname, tname, (long long)t, (long long)tm[t], a, tname,
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
                                G->path, ttname, ttname, (long long)t, (long long)tt[t], a, tname,
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
static pl_status assign_splits(graph *G, panel *P, const int64_t *tt, const char *ttname,
                               const int64_t end[3], bool has_test_end, int64_t *after) {
    int64_t *cls = malloc(sizeof *cls * (size_t)P->T);
    if (!cls) return pl_error_set(PL_ERR_NOMEM, "%s: out of memory", G->path);
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
                              G->path, pl_split_name((pl_data_split)s), ttname, want,
                              (long long)P->t0, (long long)P->T - 1, ttname, f0, f1);
            break;
        }
        Sp->rows = malloc(sizeof *Sp->rows * (size_t)Sp->nd);
        Sp->order = malloc(sizeof *Sp->order * (size_t)Sp->nd);
        if (!Sp->rows || !Sp->order) st = pl_error_set(PL_ERR_NOMEM, "%s: out of memory", G->path);
        int64_t j = 0;
        for (int64_t t = P->t0; t < P->T && !st; t++)
            if (cls[t] == s) Sp->rows[j++] = t;
        if (!st) memcpy(Sp->order, Sp->rows, sizeof *Sp->order * (size_t)Sp->nd);
    }
    free(cls);
    return st;
}

/* ---- create ----------------------------------------------------------------- */

static pl_status publish_meta(graph *G, panel *P, pl_run_context *ctx, char (*fnames)[64],
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
             G->path, (long long)P->S, (long long)P->F, (long long)P->T, (long long)P->t0, dropped,
             (long long)P->sp[0].nd, (long long)P->sp[1].nd, (long long)P->sp[2].nd, built,
             (long long)P->k, (long long)P->L, P->loops ? ", self loops" : "");
    SET(pl_meta_set_str(m, "data_summary", line));
#undef SET
    return st;
}

/* Staging tensors of every split, the shared batch vector and, for a
 * non-CPU device, the host scratch. */
static pl_status make_staging(graph *G, panel *P) {
    pl_device dev = dev_of(G);
    const int64_t S = P->S;
    int64_t bmax = 0, max_nodes = 0, max_x = 0, max_e = 0;
    static const char *fname[6] = {"x", "edge_src", "edge_dst", "y", "ret", "factors"};
    for (int s = 0; s < PL_SPLIT_COUNT; s++) {
        psplit *Sp = &P->sp[s];
        int64_t nodes = Sp->nd * S, nx, ne, nf;
        if (!size3(Sp->nd * S, P->W, P->F, &nx) || !size3(Sp->nd, P->E_day, 1, &ne) ||
            !size3(Sp->nd * S, P->K, 1, &nf))
            return pl_error_set(PL_ERR_SHAPE,
                                "%s: split '%s' (%lld days of %lld stocks, window %lld x %lld "
                                "features, %lld edges a day) is too large to stage",
                                G->path, pl_split_name((pl_data_split)s), (long long)Sp->nd,
                                (long long)S, (long long)P->W, (long long)P->F,
                                (long long)P->E_day);
        Sp->x = lk_new_tensor(PL_F32, 3, (int64_t[]){nodes, P->W, P->F}, dev);
        Sp->src = lk_new_tensor(PL_I64, 1, (int64_t[]){ne}, dev);
        Sp->dst = lk_new_tensor(PL_I64, 1, (int64_t[]){ne}, dev);
        Sp->y = lk_new_tensor(PL_F32, 1, (int64_t[]){nodes}, dev);
        Sp->ret = lk_new_tensor(PL_F32, 1, (int64_t[]){nodes}, dev);
        if (P->K) Sp->fac = lk_new_tensor(PL_F32, 2, (int64_t[]){nodes, P->K}, dev);
        if (!Sp->x || !Sp->src || !Sp->dst || !Sp->y || !Sp->ret || (P->K && !Sp->fac))
            return pl_error_prefix(pl_error_status() ? pl_error_status() : PL_ERR_NOMEM,
                                   "%s: staging tensors of split '%s'", G->path,
                                   pl_split_name((pl_data_split)s));
        pl_tensor *t[6] = {Sp->x, Sp->src, Sp->dst, Sp->y, Sp->ret, Sp->fac};
        for (int i = 0; i < 6; i++)
            if (t[i]) pl_tensor_set_name(t[i], "%s", fname[i]);
        int64_t b = Sp->B < Sp->nd ? Sp->B : Sp->nd;
        bmax = b > bmax ? b : bmax;
        max_nodes = nodes > max_nodes ? nodes : max_nodes;
        max_x = nx > max_x ? nx : max_x;
        max_e = ne > max_e ? ne : max_e;
    }
    int64_t *bv = malloc(sizeof *bv * (size_t)(bmax * S));
    if (!bv) return pl_error_set(PL_ERR_NOMEM, "%s: out of memory", G->path);
    for (int64_t i = 0; i < bmax * S; i++)
        bv[i] = i / S;
    P->batch = lk_to_device(dev_of(G), PL_I64, 1, (int64_t[]){bmax * S}, bv);
    free(bv);
    if (!P->batch) return pl_error_status() ? pl_error_status() : PL_ERR_NOMEM;
    pl_tensor_set_name(P->batch, "batch");
    if (!pl_device_eq(dev, PL_CPU)) {
        P->sx = malloc(sizeof *P->sx * (size_t)max_x);
        P->sy = malloc(sizeof *P->sy * (size_t)max_nodes);
        P->sret = malloc(sizeof *P->sret * (size_t)max_nodes);
        P->sfac = malloc(sizeof *P->sfac * (size_t)(max_nodes * (P->K ? P->K : 1)));
        P->ssrc = malloc(sizeof *P->ssrc * (size_t)max_e);
        P->sdst = malloc(sizeof *P->sdst * (size_t)max_e);
        if (!P->sx || !P->sy || !P->sret || !P->sfac || !P->ssrc || !P->sdst)
            return pl_error_set(PL_ERR_NOMEM, "%s: out of memory", G->path);
    }
    return PL_OK;
}

pl_status panel_create(graph *G, const pl_config_section *cfg, pl_run_context *ctx) {
    if (G->predict >= 0)
        return pl_error_set(PL_ERR_UNSUPPORTED,
                            "hdf5_graph: mode = panel cannot serve `pipeline predict` (the run "
                            "saves no feature statistics to read new days with)");
    panel *P = calloc(1, sizeof *P);
    if (!P) return pl_error_set(PL_ERR_NOMEM, "hdf5_graph: out of memory");
    G->panel = P;
    const char *xname = pl_cfg_str(cfg, "features", "features");
    const char *yname = pl_cfg_str(cfg, "target", "target");
    const char *tname = pl_cfg_str(cfg, "time", "time");
    const char *ttname = pl_cfg_str(cfg, "target_time", "target_time");
    const char *kname = pl_cfg_str(cfg, "factors", "factors");
    const char *gname = pl_cfg_str(cfg, "graph_feature", "ret_1d");
    const char *norm = pl_cfg_str(cfg, "target_norm", "cross_section");
    P->W = pl_cfg_int(cfg, "window", 20);
    P->L = pl_cfg_int(cfg, "graph_lookback", 60);
    P->k = pl_cfg_int(cfg, "graph_top_k", 5);
    P->loops = pl_cfg_bool(cfg, "add_self_loops", false);
    P->per_batch = !strcmp(pl_cfg_str(cfg, "graphs", "once"), "per_batch");
    P->shuffle = pl_cfg_bool(cfg, "shuffle", true);
    const bool drop_last = pl_cfg_bool(cfg, "drop_last", false);
    const bool standardize = pl_cfg_bool(cfg, "standardize_features", true);
    const int64_t B = pl_cfg_int(cfg, "batch_size", 32), Be = pl_cfg_int(cfg, "eval_batch_size", 0);

    if (!strcmp(kname, "\"\""))
        return pl_error_set(PL_ERR_CONFIG,
                            "hdf5_graph: factors = \"\" names a dataset called \"\" (INI values "
                            "are not quoted); write `factors =` to serve no factors");
    /* the split bounds (config errors before the file is read) */
    static const char *end_key[3] = {"train_end", "val_end", "test_end"};
    int64_t end[3] = {0, 0, 0};
    bool has_test_end = pl_cfg_str(cfg, "test_end", "")[0] != 0;
    for (int s = 0; s < 3; s++) {
        const char *v = pl_cfg_str(cfg, end_key[s], "");
        if (!v[0] && s < 2)
            return pl_error_set(PL_ERR_CONFIG,
                                "hdf5_graph: mode = panel needs %s = YYYY-MM-DD (the last day of "
                                "the %s split's target_time)",
                                end_key[s], s == 0 ? "train" : "val");
        pl_status st = v[0] ? parse_day(end_key[s], v, &end[s]) : PL_OK;
        if (st) return st;
        if (s > 0 && v[0] && end[s] <= end[s - 1])
            return pl_error_set(PL_ERR_CONFIG, "hdf5_graph: %s = %s must be after %s = %s",
                                end_key[s], v, end_key[s - 1], pl_cfg_str(cfg, end_key[s - 1], ""));
    }

    pl_status st = PL_OK;
    int64_t *tm = NULL, *tt = NULL;
    char(*fnames)[64] = NULL, (*knames)[64] = NULL;
    double *fmean = NULL, *fsd = NULL;
    int nf = 0, nk = 0;
    hid_t f = H5I_INVALID_HID;
    pl_h5_lock();
    if ((st = pl_h5_open_read(G->path, "make it with tools/stocks_to_h5.py", &f))) goto out;
    int64_t dx[3], dy[2], dt[1], dk[3];
    if ((st = read_ds(G, f, xname, H5T_NATIVE_FLOAT, 3, 3, NULL, (void **)&P->hx, dx, NULL))) {
        pl_error_prefix(st, "panel features: [T days, S stocks, F features]");
        goto out;
    }
    P->T = dx[0];
    P->S = dx[1];
    P->F = dx[2];
    if (P->T < 1 || P->S < 1 || P->F < 1 || P->F > INT32_MAX - 1) {
        st = pl_error_set(PL_ERR_SHAPE,
                          "%s: dataset '%s' is [%lld, %lld, %lld]; expected [T days, S stocks, F "
                          "features], each >= 1 (F < 2^31)",
                          G->path, xname, (long long)P->T, (long long)P->S, (long long)P->F);
        goto out;
    }
    if ((st = read_ds(G, f, yname, H5T_NATIVE_FLOAT, 2, 2, (int64_t[]){P->T, P->S},
                      (void **)&P->hret, dy, NULL))) {
        pl_error_prefix(st, "panel target: [T, S] = [%lld, %lld] as features '%s'", (long long)P->T,
                        (long long)P->S, xname);
        goto out;
    }
    if ((st = read_ds(G, f, tname, H5T_NATIVE_INT64, 1, 1, (int64_t[]){P->T}, (void **)&tm, dt,
                      NULL)) ||
        (st = read_ds(G, f, ttname, H5T_NATIVE_INT64, 1, 1, (int64_t[]){P->T}, (void **)&tt, dt,
                      NULL))) {
        pl_error_prefix(st, "panel times: [T] = [%lld] as features '%s'", (long long)P->T, xname);
        goto out;
    }
    if (kname[0]) {
        if ((st = read_ds(G, f, kname, H5T_NATIVE_FLOAT, 3, 3, (int64_t[]){P->T, P->S, -1},
                          (void **)&P->hfac, dk, NULL))) {
            pl_error_prefix(st,
                            "panel factors: [T, S, K] with [T, S] = [%lld, %lld] as features "
                            "'%s' (`factors =` serves none)",
                            (long long)P->T, (long long)P->S, xname);
            goto out;
        }
        P->K = dk[2];
        if (P->K < 1 || P->K > INT32_MAX - 1) {
            st = pl_error_set(PL_ERR_SHAPE,
                              "%s: dataset '%s' has %lld factors (axis 2); expected 1..2^31-1 "
                              "(`factors =` serves none)",
                              G->path, kname, (long long)P->K);
            goto out;
        }
    }
    fnames = calloc((size_t)P->F + 1, sizeof *fnames);
    knames = calloc((size_t)P->K + 1, sizeof *knames);
    if (!fnames || !knames) {
        st = pl_error_set(PL_ERR_NOMEM, "%s: out of memory", G->path);
        goto out;
    }
    if ((st = pl_h5_attr_read_names(G->path, f, xname, "feature_names", fnames, (int)(P->F + 1),
                                    &nf)) ||
        (P->K && (st = pl_h5_attr_read_names(G->path, f, kname, "factor_names", knames,
                                             (int)(P->K + 1), &nk))))
        goto out;
    st = pl_h5_close(G->path, f);
    f = H5I_INVALID_HID;
out:
    if (f >= 0) pl_h5_close(G->path, f);
    pl_h5_unlock();
    if (st) goto done;

    /* names and options against the file */
    if (nf != P->F) {
        st = pl_error_set(PL_ERR_INVALID,
                          "%s: dataset '%s' needs attribute 'feature_names' with its %lld feature "
                          "names (comma-separated, or an array of strings) to find graph_feature "
                          "'%s'; found %d names",
                          G->path, xname, (long long)P->F, gname, nf);
        goto done;
    }
    int64_t gi = -1;
    for (int64_t i = 0; i < P->F && gi < 0; i++)
        if (!strcmp(fnames[i], gname)) gi = i;
    if (gi < 0) {
        char list[512] = "";
        for (int64_t i = 0; i < P->F && strlen(list) < 400; i++)
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "",
                     fnames[i]);
        st = pl_error_set(PL_ERR_CONFIG,
                          "%s: graph_feature '%s' is not one of the %lld names of attribute "
                          "'feature_names' of dataset '%s' (%s%s)",
                          G->path, gname, (long long)P->F, xname, list,
                          strlen(list) >= 400 ? ", ..." : "");
        goto done;
    }
    if (P->K) {
        if (nk == 0)
            for (int64_t k = 0; k < P->K; k++)
                snprintf(knames[k], sizeof knames[k], "factor_%lld", (long long)k);
        else if (nk != P->K) {
            st = pl_error_set(PL_ERR_INVALID,
                              "%s: attribute 'factor_names' of dataset '%s' has %d names; "
                              "expected %lld, one per factor (axis 2)",
                              G->path, kname, nk, (long long)P->K);
            goto done;
        }
        if ((st = check_names(G, kname, "factor_names", knames, (int)P->K))) goto done;
    }
    if (P->S < 2 || P->k > P->S - 1) {
        st = pl_error_set(PL_ERR_CONFIG,
                          "%s: graph_top_k = %lld must lie in 1..S-1 = %lld (dataset '%s' has S "
                          "= %lld stocks)",
                          G->path, (long long)P->k, (long long)P->S - 1, xname, (long long)P->S);
        goto done;
    }
    P->t0 = (P->W > P->L ? P->W : P->L) - 1;
    if (P->t0 >= P->T) {
        st = pl_error_set(PL_ERR_CONFIG,
                          "%s: window = %lld and graph_lookback = %lld need at least %lld rows; "
                          "dataset '%s' has T = %lld",
                          G->path, (long long)P->W, (long long)P->L, (long long)P->t0 + 1, xname,
                          (long long)P->T);
        goto done;
    }
    /* NaN / Inf refused (README "Missing values"); times */
    if ((st = pl_h5_check_finite(G->path, xname, PL_F32, P->hx, 0, P->T, 3, dx, NULL, NULL, 0)) ||
        (st = pl_h5_check_finite(G->path, yname, PL_F32, P->hret, 0, P->T, 2, dy, NULL, NULL, 0)) ||
        (P->K && (st = pl_h5_check_finite(G->path, kname, PL_F32, P->hfac, 0, P->T, 3, dk, NULL,
                                          NULL, 0))) ||
        (st = check_times(G, tname, ttname, tm, tt, P->T)))
        goto done;
    int64_t ek, ss;
    if (__builtin_mul_overflow(P->S, P->k + (P->loops ? 1 : 0), &P->E_day) ||
        !size3(P->T - P->t0, P->E_day, 1, &ek) || !size3(P->S, P->S, 1, &ss)) {
        st = pl_error_set(PL_ERR_SHAPE, "%s: %lld stocks with graph_top_k = %lld: too many edges",
                          G->path, (long long)P->S, (long long)P->k);
        goto done;
    }

    /* splits */
    int64_t after = 0;
    if ((st = assign_splits(G, P, tt, ttname, end, has_test_end, &after))) goto done;
    for (int s = 0; s < PL_SPLIT_COUNT; s++) {
        psplit *Sp = &P->sp[s];
        Sp->B = s == PL_SPLIT_TRAIN ? B : Be > 0 ? Be : Sp->nd;
        bool drop = s == PL_SPLIT_TRAIN && drop_last;
        if (drop && Sp->nd < Sp->B) {
            st = pl_error_set(PL_ERR_CONFIG,
                              "%s: train split has %lld days < batch_size %lld with drop_last = "
                              "true: no batch",
                              G->path, (long long)Sp->nd, (long long)Sp->B);
            goto done;
        }
        Sp->nb = drop ? Sp->nd / Sp->B : (Sp->nd + Sp->B - 1) / Sp->B;
    }

    /* graph_feature as in the file; features standardized with the train rows' statistics */
    P->g = malloc(sizeof *P->g * (size_t)(P->T * P->S));
    P->hy = malloc(sizeof *P->hy * (size_t)(P->T * P->S));
    fmean = calloc((size_t)P->F, sizeof *fmean);
    fsd = calloc((size_t)P->F, sizeof *fsd);
    if (!P->g || !P->hy || !fmean || !fsd) {
        st = pl_error_set(PL_ERR_NOMEM, "%s: out of memory", G->path);
        goto done;
    }
    for (int64_t i = 0; i < P->T * P->S; i++)
        P->g[i] = P->hx[i * P->F + gi];
    for (int64_t c = 0; c < P->F; c++) {
        fsd[c] = 1.0;
        if (standardize) train_stats(P, P->hx, P->F, c, &fmean[c], &fsd[c]);
    }
    if (standardize)
        for (int64_t i = 0; i < P->T * P->S; i++)
            for (int64_t c = 0; c < P->F; c++)
                P->hx[i * P->F + c] = (float)((P->hx[i * P->F + c] - fmean[c]) / fsd[c]);
    /* y: per day over the stocks, with the train statistics, or as in the file */
    double ty[2] = {0, 1};
    bool global = !strcmp(norm, "global");
    if (global) train_stats(P, P->hret, 1, 0, &ty[0], &ty[1]);
    for (int64_t t = 0; t < P->T; t++) {
        const float *r = P->hret + t * P->S;
        double mean = ty[0], sd = ty[1];
        if (!strcmp(norm, "cross_section")) {
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

    /* the day-graphs (once), the staging, val / test (and an unshuffled train) laid out */
    if (P->per_batch) {
        st = dscratch_init(&P->ds, P->S, P->L);
    } else {
        P->esrc = malloc(sizeof *P->esrc * (size_t)ek);
        P->edst = malloc(sizeof *P->edst * (size_t)ek);
        st = !P->esrc || !P->edst ? pl_error_set(PL_ERR_NOMEM, "%s: out of memory", G->path)
                                  : build_all(P);
    }
    if (st || (st = make_staging(G, P))) goto done;
    for (int s = 0; s < PL_SPLIT_COUNT; s++) {
        if (s == PL_SPLIT_TRAIN && P->shuffle) continue;
        if ((st = arrange(G, P, &P->sp[s]))) goto done;
        P->sp[s].arranged_epoch = 0;
    }
    st = publish_meta(G, P, ctx, knames, fmean, fsd, global ? ty : NULL, after);
    G->st.chunks_loaded = 1;
done:
    free(tm);
    free(tt);
    free(fnames);
    free(knames);
    free(fmean);
    free(fsd);
    return st;
}

/* ---- the loader verbs --------------------------------------------------------- */

void panel_free(panel *P) {
    if (!P) return;
    for (int s = 0; s < PL_SPLIT_COUNT; s++) {
        psplit *Sp = &P->sp[s];
        pl_tensor_release(Sp->x);
        pl_tensor_release(Sp->src);
        pl_tensor_release(Sp->dst);
        pl_tensor_release(Sp->y);
        pl_tensor_release(Sp->ret);
        pl_tensor_release(Sp->fac);
        free(Sp->rows);
        free(Sp->order);
    }
    pl_tensor_release(P->batch);
    free(P->hx);
    free(P->g);
    free(P->hy);
    free(P->hret);
    free(P->hfac);
    free(P->esrc);
    free(P->edst);
    free(P->sx);
    free(P->sy);
    free(P->sret);
    free(P->sfac);
    free(P->ssrc);
    free(P->sdst);
    dscratch_free(&P->ds);
    free(P);
}

int64_t panel_num_batches(const panel *P, pl_data_split split) {
    return P->sp[split].nb;
}

pl_status panel_epoch_begin(graph *G, pl_data_split split, int64_t epoch) {
    panel *P = G->panel;
    psplit *Sp = &P->sp[split];
    if (split != PL_SPLIT_TRAIN || !P->shuffle || Sp->arranged_epoch == epoch) return PL_OK;
    Sp->arranged_epoch = -1;
    lk_shuffle_order(Sp->order, Sp->rows, Sp->nd, (G->ctx ? G->ctx->seed : 0) + (uint64_t)epoch);
    pl_status st = arrange(G, P, Sp);
    if (!st) Sp->arranged_epoch = epoch;
    return st;
}

int panel_next(graph *G, pl_batch *out) {
    panel *P = G->panel;
    psplit *Sp = &P->sp[G->cur];
    const int64_t b = G->cur_batch;
    if (b >= Sp->nb) return 0;
    const int64_t d0 = b * Sp->B, nd = Sp->nd - d0 < Sp->B ? Sp->nd - d0 : Sp->B;
    const int64_t n0 = d0 * P->S, nn = nd * P->S, e0 = d0 * P->E_day, ne = nd * P->E_day;
    if (P->per_batch && rebuild_batch(G, P, Sp, d0, nd)) return -1;
    if (emit(G, out, "x", lk_view_rows(Sp->x, n0, nn)) ||
        emit(G, out, "edge_src", lk_view_rows(Sp->src, e0, ne)) ||
        emit(G, out, "edge_dst", lk_view_rows(Sp->dst, e0, ne)) ||
        emit(G, out, "batch", lk_view_rows(P->batch, 0, nn)) ||
        emit(G, out, "y", lk_view_rows(Sp->y, n0, nn)) ||
        emit(G, out, "ret", lk_view_rows(Sp->ret, n0, nn)) ||
        (Sp->fac && emit(G, out, "factors", lk_view_rows(Sp->fac, n0, nn)))) {
        release_views(G);
        memset(out, 0, sizeof *out);
        return -1;
    }
    out->size = nd;
    out->index = b;
    G->cur_batch = b + 1;
    return 1;
}

/* x f32 [n, W, F], edge_src / edge_dst i64 [e], batch i64 [n], y / ret f32
 * [n], factors f32 [n, K] when the `factors` option names a dataset: from
 * the config alone. */
pl_status panel_batch_fields(const pl_config_section *cfg, pl_field_list *out) {
    pl_status st = pl_fields_add(out, "x", PL_F32, 3, false);
    if (!st) st = pl_fields_add(out, "edge_src", PL_I64, 1, false);
    if (!st) st = pl_fields_add(out, "edge_dst", PL_I64, 1, false);
    if (!st) st = pl_fields_add(out, "batch", PL_I64, 1, false);
    if (!st) st = pl_fields_add(out, "y", PL_F32, 1, false);
    if (!st) st = pl_fields_add(out, "ret", PL_F32, 1, false);
    if (!st && pl_cfg_str(cfg, "factors", "factors")[0])
        st = pl_fields_add(out, "factors", PL_F32, 2, false);
    return st;
}
