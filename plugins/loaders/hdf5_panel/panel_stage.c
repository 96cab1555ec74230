/* panel_stage.c - hdf5_panel: the day-graphs and the staging.
 *
 * Day t's graph: the stocks are its nodes; node i receives edges j -> i from
 * the k stocks j != i with the largest |Pearson correlation| of graph_feature
 * with i over rows t-L+1..t (ties: lower j first; a constant series
 * correlates 0 with everything). graphs = once builds every usable day's
 * graph at create; graphs = per_batch builds a batch's days' graphs again in
 * every next() from the same host values (slow on purpose: the benchmark of
 * rebuilding per batch; the same edges).
 *
 * Staging: each split owns tensors on ctx->device holding the whole split
 * (x [n, W, F], edges, y, ret, factors) laid out in epoch order (train:
 * shuffled with ctx->seed + epoch at epoch_begin; val / test once at
 * create), and next() returns views of them. Every day has S nodes and
 * E_day edges, so batch b's rows are fixed (nodes b*B*S.., edges
 * b*B*E_day..) and the batch vector (node d*S + s -> day d) is one tensor
 * for every batch.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "hdf5_panel.h"

/* ---- the correlation graph of a day -------------------------------------- */

pl_status pn_dscratch_init(dscratch *d, int64_t S, int64_t L) {
    d->c = malloc(sizeof *d->c * (size_t)(S * L));
    d->ss = malloc(sizeof *d->ss * (size_t)S);
    d->a = malloc(sizeof *d->a * (size_t)(S * S));
    if (!d->c || !d->ss || !d->a)
        return pl_error_set(PL_ERR_NOMEM,
                            "hdf5_panel: out of memory for a day's graph (%lld "
                            "stocks)",
                            (long long)S);
    return PL_OK;
}

void pn_dscratch_free(dscratch *d) {
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
pl_status pn_build_all(panel *P) {
    const int64_t nu = P->T - P->t0;
    int fail = 0;
    double t0 = now_ms();
#pragma omp parallel if (nu * P->S * P->S * P->L > (1 << 22))
    {
        dscratch d = {0};
        bool ok = pn_dscratch_init(&d, P->S, P->L) == PL_OK;
        if (!ok) {
#pragma omp atomic write
            fail = 1;
        }
#pragma omp for schedule(dynamic, 16)
        for (int64_t u = 0; u < nu; u++)
            if (ok) day_graph(P, P->t0 + u, &d, P->esrc + u * P->E_day, P->edst + u * P->E_day, 0);
        pn_dscratch_free(&d);
    }
    if (fail)
        return pl_error_set(PL_ERR_NOMEM,
                            "hdf5_panel: out of memory for a day's graph (%lld "
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
pl_status pn_arrange(panel *P, psplit *Sp) {
    const int64_t S = P->S, W = P->W, F = P->F, K = P->K, Ed = P->E_day;
    bool cpu = pl_device_eq(pn_dev(P), PL_CPU);
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
    const pl_backend *be = pl_backend_get(pn_dev(P).type);
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
            return pl_error_prefix(st, "%s: copying the %s staging to the device", P->path,
                                   cp[i].t->name);
    }
    return PL_OK;
}

/* graphs = per_batch: days [d0, d0 + n) of Sp's order rebuilt into the
 * batch's edge rows (batch-local ids). */
pl_status pn_rebuild_batch(panel *P, psplit *Sp, int64_t d0, int64_t n) {
    const int64_t Ed = P->E_day;
    bool cpu = pl_device_eq(pn_dev(P), PL_CPU);
    int64_t *ps = cpu ? (int64_t *)pl_tensor_data(Sp->src) + d0 * Ed : P->ssrc;
    int64_t *pd = cpu ? (int64_t *)pl_tensor_data(Sp->dst) + d0 * Ed : P->sdst;
    double t0 = now_ms();
    for (int64_t d = 0; d < n; d++)
        day_graph(P, Sp->order[d0 + d], &P->ds, ps + d * Ed, pd + d * Ed, d * P->S);
    if (!cpu) {
        const pl_backend *be = pl_backend_get(pn_dev(P).type);
        size_t bytes = sizeof(int64_t) * (size_t)(n * Ed);
        pl_status st = !be ? pl_error_status()
                           : be->memcpy((int64_t *)pl_tensor_data(Sp->src) + d0 * Ed,
                                        Sp->src->device, ps, PL_CPU, bytes);
        if (!st)
            st = be->memcpy((int64_t *)pl_tensor_data(Sp->dst) + d0 * Ed, Sp->dst->device, pd,
                            PL_CPU, bytes);
        if (st) return pl_error_prefix(st, "%s: copying a batch's edges to the device", P->path);
    }
    P->build_ms += now_ms() - t0;
    P->graphs_built += n;
    if (P->ctx && P->ctx->meta) {
        pl_meta_set_int(P->ctx->meta, "graphs_built", P->graphs_built);
        pl_meta_set_float(P->ctx->meta, "graph_build_ms", P->build_ms);
    }
    return PL_OK;
}

/* Staging tensors of every split, the shared batch vector and, for a
 * non-CPU device, the host scratch. */
pl_status pn_make_staging(panel *P) {
    pl_device dev = pn_dev(P);
    const int64_t S = P->S;
    int64_t bmax = 0, max_nodes = 0, max_x = 0, max_e = 0;
    static const char *fname[6] = {"x", "edge_src", "edge_dst", "y", "ret", "factors"};
    for (int s = 0; s < PL_SPLIT_COUNT; s++) {
        psplit *Sp = &P->sp[s];
        int64_t nodes = Sp->nd * S, nx, ne, nf;
        if (!pn_size3(Sp->nd * S, P->W, P->F, &nx) || !pn_size3(Sp->nd, P->E_day, 1, &ne) ||
            !pn_size3(Sp->nd * S, P->K, 1, &nf))
            return pl_error_set(PL_ERR_SHAPE,
                                "%s: split '%s' (%lld days of %lld stocks, window %lld x %lld "
                                "features, %lld edges a day) is too large to stage",
                                P->path, pl_split_name((pl_data_split)s), (long long)Sp->nd,
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
                                   "%s: staging tensors of split '%s'", P->path,
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
    if (!bv) return pl_error_set(PL_ERR_NOMEM, "%s: out of memory", P->path);
    for (int64_t i = 0; i < bmax * S; i++)
        bv[i] = i / S;
    P->batch = lk_to_device(pn_dev(P), PL_I64, 1, (int64_t[]){bmax * S}, bv);
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
            return pl_error_set(PL_ERR_NOMEM, "%s: out of memory", P->path);
    }
    return PL_OK;
}
