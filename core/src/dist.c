/* dist.c - data-parallel training: the trainer's side of the strategy stage.
 *
 * What a data-parallel run does (PyTorch DistributedDataParallel and
 * Horovod semantics, which users know):
 *  - every process runs the same config with the same seed, so every rank
 *    builds the same model and the same batch order; the ranks' initial
 *    trainable parameters are compared (DDP broadcasts them from rank 0: we
 *    check instead, since a model whose initialization is not a pure
 *    function of the seed is a bug worth naming);
 *  - each rank takes its shard of every epoch: a loader that shards itself
 *    (pl_loader_vtable.shard: its part of every batch) or, by default, the
 *    batches r, r + N, r + 2N, ... of the single-process order
 *    (DistributedSampler interleaves samples; we interleave batches, which
 *    is the same thing for a loader whose order is a permutation of samples
 *    cut into batches). `batch_size` is per rank, as in Lightning: the global
 *    batch is batch_size x world_size x accumulate_grad_batches;
 *  - each training loss is averaged over ranks, weighted by the terms each
 *    rank's loss averages, before the non-finite check, so every rank takes
 *    the same decision (stop, or skip the step); the same all-reduce gives
 *    each rank its share of the global batch, which scales its backward, and
 *    tells every rank whether one has seen a signal;
 *  - at each optimizer step the (share-scaled) gradients are summed over
 *    ranks: the global batch's gradient (DDP averages the ranks' means, the
 *    same thing when the shares are equal), before clipping, the precision
 *    stage's unscale and inf check, and the step, so every rank steps its
 *    optimizer identically;
 *  - validation and test metrics are (sum, count) pairs summed over ranks,
 *    so they are the metrics of the whole split, and every rank takes the
 *    same early-stopping and checkpoint decisions;
 *  - only rank 0 writes the run directory.
 */
#include "trainer_internal.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>

/* processes a launcher started, from its environment (Open MPI, MPICH /
 * Intel MPI / Slurm's PMI); 1 when none says more */
static int launcher_world_size(void) {
    static const char *vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v && atoi(v) > 1) return atoi(v);
    }
    return 1;
}

int pl_launcher_rank(void) {
    static const char *vars[] = {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v && *v) return atoi(v);
    }
    return 0;
}

pl_status tr_dist_create(trainer *t) {
    t->rank = 0;
    t->world = 1;
    t->stride = 1;
    pl_status st = tr_stage_create(t, &t->strat, "strategy");
    if (st) return st;
    if (!t->strat.self && launcher_world_size() > 1) {
        /* mpirun -np N pipeline run X.ini with no [strategy]: ddp */
        const pl_plugin_desc *d = NULL;
        st = pl_registry_find(t->reg, "ddp", PL_KIND_STRATEGY, &d, NULL);
        if (st) {
            pl_hint_set("build with Open MPI (libopenmpi-dev) so the ddp plugin exists, or run "
                        "one process");
            return pl_error_prefix(st, "started as one of %d processes (mpirun) with no "
                                   "[strategy] section, but the ddp strategy plugin cannot be "
                                   "loaded", launcher_world_size());
        }
        t->strat.section = "strategy";
        t->strat.desc = d;
        t->strat.vt = d->vtable;
        st = pl_stage_fns_of(d, NULL, &t->strat.fns);
        if (!st) st = t->strat.fns.create(NULL, &t->ctx, &t->strat.self);
        if (st) return pl_error_prefix(st, "strategy 'ddp' (chosen because mpirun started %d "
                                       "processes)", launcher_world_size());
    }
    if (!t->strat.self) return PL_OK;
    t->rank = STRAT(t)->rank(t->strat.self);
    t->world = STRAT(t)->world_size(t->strat.self);
    if (t->world < 1 || t->rank < 0 || t->rank >= t->world)
        return pl_error_set(PL_ERR_INVALID, "strategy '%s': rank %d of world size %d",
                            t->strat.desc->name, t->rank, t->world);
    return PL_OK;
}

pl_status tr_dist_shard(trainer *t) {
    t->stride = 1;
    if (t->world <= 1) return PL_OK;
    const pl_plugin_desc *ld = t->loader.desc;
    if (ld->abi_minor >= 5 && LOADER(t)->shard) {
        pl_status st = LOADER(t)->shard(t->loader.self, t->rank, t->world);
        if (!st) {
            tr_log(t, "ddp: loader %s serves each of %d processes its part of every batch\n",
                   ld->name, t->world);
            return PL_OK;
        }
        if (st != PL_ERR_UNSUPPORTED)
            return pl_error_prefix(st, "[data] plugin '%s': sharding over %d ranks", ld->name,
                                   t->world);
        pl_error_clear(); /* this configuration of the loader declines: stride */
    }
    t->stride = t->world;
    return PL_OK;
}

pl_status tr_dist_share_run_dir(trainer *t) {
    if (t->world <= 1) return PL_OK;
    pl_status st = STRAT(t)->broadcast_bytes(t->strat.self, t->run_dir, sizeof t->run_dir, 0);
    if (st) return pl_error_prefix(st, "sharing the run directory");
    t->run_dir[sizeof t->run_dir - 1] = 0;
    snprintf(t->last_path, sizeof t->last_path, "%s/checkpoints/last.safetensors", t->run_dir);
    t->ctx.run_dir = t->run_dir;
    return PL_OK;
}

/* FNV-1a over a host tensor's bytes (contiguous parameters) */
static uint64_t fnv1a(const void *p, size_t n, uint64_t h) {
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++) h = (h ^ c[i]) * 1099511628211ull;
    return h;
}

pl_status tr_dist_check_params(trainer *t) {
    if (t->world <= 1) return PL_OK;
    int n = pl_params_count(t->ctx.params);
    uint64_t *mine = calloc((size_t)n + 1, sizeof *mine), *root = calloc((size_t)n + 1, sizeof *root);
    if (!mine || !root) {
        free(mine);
        free(root);
        return pl_error_set(PL_ERR_NOMEM, "ddp: parameter hashes");
    }
    for (int i = 0; i < n; i++) {
        pl_param *p = pl_params_at(t->ctx.params, i);
        if (!p->t->requires_grad) continue;
        pl_frame_begin();
        pl_tensor *h = p->t;
        if (h->device.type != PL_DEVICE_CPU || !pl_tensor_is_contiguous(h))
            h = pl_tensor_to(p->t, p->t->dtype, PL_CPU);
        if (h) mine[i] = fnv1a(pl_tensor_data(h), pl_tensor_nbytes(h), 1469598103934665603ull);
        pl_frame_end();
        if (!h) {
            free(mine);
            free(root);
            return pl_error_prefix(pl_error_status(), "ddp: reading parameter %s", p->name);
        }
    }
    memcpy(root, mine, (size_t)n * sizeof *mine);
    root[n] = (uint64_t)n;
    pl_status st = STRAT(t)->broadcast_bytes(t->strat.self, root, ((size_t)n + 1) * sizeof *root, 0);
    if (!st && root[n] != (uint64_t)n)
        st = pl_error_set(PL_ERR_CONFIG, "ddp: rank %d has %d parameters, rank 0 has %llu", t->rank,
                          n, (unsigned long long)root[n]);
    for (int i = 0; i < n && !st; i++)
        if (root[i] != mine[i])
            st = pl_error_set(PL_ERR_CONFIG, "ddp: rank %d's initial value of trainable parameter "
                              "'%s' differs from rank 0's: every rank must start from the same "
                              "weights (same seed, same init_from / resume checkpoint)", t->rank,
                              pl_params_at(t->ctx.params, i)->name);
    free(mine);
    free(root);
    /* every rank learns whether one failed: a lone failure would leave the
     * others waiting in the first all-reduce */
    double bad = st ? 1 : 0;
    pl_status st2 = STRAT(t)->all_reduce_f64(t->strat.self, &bad, 1);
    if (st) return st;
    if (st2) return st2;
    if (bad > 0)
        return pl_error_set(PL_ERR_CONFIG, "ddp: another rank's initial parameters differ from "
                            "rank 0's (see its message)");
    return PL_OK;
}

pl_status tr_dist_reduce_grads(trainer *t) {
    if (t->world <= 1) return PL_OK;
    int n = pl_params_count(t->ctx.params);
    if (t->dist_grads_cap < n + 1) { /* once: the parameter list does not change in a fit */
        pl_tensor **g = realloc(t->dist_grads, ((size_t)n + 1) * sizeof *g);
        if (!g) return pl_error_set(PL_ERR_NOMEM, "ddp: gradient list");
        t->dist_grads = g;
        t->dist_grads_cap = n + 1;
    }
    pl_tensor **gs = t->dist_grads;
    int k = 0;
    pl_status st = PL_OK;
    for (int i = 0; i < n && !st; i++) {
        pl_param *p = pl_params_at(t->ctx.params, i);
        if (!p->t->requires_grad) continue;
        if (!p->t->grad) {
            /* unused by this rank's batch (a gated branch): it adds zeros, as in DDP with
             * find_unused_parameters */
            p->t->grad = pl_tensor_zeros_owned(p->t->dtype, p->t->ndim, p->t->shape, p->t->device);
            if (!p->t->grad) {
                st = pl_error_prefix(pl_error_status(), "ddp: zero gradient of %s", p->name);
                break;
            }
        }
        if (p->t->grad->dtype != PL_F32)
            st = pl_error_set(PL_ERR_UNSUPPORTED, "ddp: the gradient of %s is %s; data-parallel "
                              "training all-reduces f32 gradients (use precision fp32, bf16-mixed "
                              "or fp16-mixed, whose master weights are f32)", p->name,
                              pl_dtype_name(p->t->grad->dtype));
        gs[k++] = p->t->grad;
    }
    if (!st && k) st = STRAT(t)->all_reduce_sum(t->strat.self, gs, k);
    if (st) return pl_error_prefix(st, "ddp: summing gradients at step %lld", (long long)t->step);
    return PL_OK;
}

pl_status tr_dist_loss(trainer *t, double *lv, const pl_metrics *m, int64_t size, double *share,
                       int signal, int *any_signal) {
    *share = 1.0;
    *any_signal = signal;
    if (t->world <= 1) return PL_OK;
    double w = (double)size;
    for (int i = 0; i < m->n; i++)
        if (!strcmp(m->name[i], "loss") && m->count[i] > 0) w = m->count[i];
    /* sum of weighted losses, total weight, and the signals (max via the sum's sign:
     * every signal number is positive, so any rank's makes it non-zero) */
    double v[3] = {*lv * w, w, (double)signal};
    pl_status st = STRAT(t)->all_reduce_f64(t->strat.self, v, 3);
    if (st) return pl_error_prefix(st, "ddp: the training loss at step %lld", (long long)t->step);
    *any_signal = v[2] > 0 ? (signal ? signal : SIGTERM) : 0;
    if (!(v[1] > 0)) { /* nothing to weight by: the plain mean */
        *lv = v[0];
        *share = 1.0 / t->world;
        return PL_OK;
    }
    *lv = v[0] / v[1];
    *share = w / v[1];
    return PL_OK;
}

pl_status tr_dist_reduce_metrics(trainer *t, pl_metrics *m) {
    if (t->world <= 1) return PL_OK;
    /* rank 0 has served batch 0 of every split, so its names are all there are; the
     * others line theirs up with rank 0's */
    char names[PL_METRICS_MAX][48];
    int n = m->n;
    memset(names, 0, sizeof names);
    for (int i = 0; i < m->n; i++) memcpy(names[i], m->name[i], sizeof names[i]);
    pl_status st = STRAT(t)->broadcast_bytes(t->strat.self, names, sizeof names, 0);
    double cnt = n;
    if (!st) st = STRAT(t)->broadcast_bytes(t->strat.self, &cnt, sizeof cnt, 0);
    if (st) return pl_error_prefix(st, "ddp: reducing metrics");
    int n0 = (int)cnt;
    double v[2 * PL_METRICS_MAX] = {0};
    int missing = -1;
    for (int i = 0; i < m->n; i++) {
        int j = 0;
        while (j < n0 && strncmp(names[j], m->name[i], sizeof names[j])) j++;
        if (j == n0) {
            missing = i;
            continue;
        }
        v[2 * j] = m->sum[i];
        v[2 * j + 1] = m->count[i];
    }
    st = STRAT(t)->all_reduce_f64(t->strat.self, v, 2 * (int64_t)n0);
    if (st) return pl_error_prefix(st, "ddp: reducing metrics");
    if (missing >= 0)
        return pl_error_set(PL_ERR_INVALID, "ddp: rank %d reports metric '%s', which rank 0 does "
                            "not", t->rank, m->name[missing]);
    unsigned char kind[PL_METRICS_MAX];
    memcpy(kind, m->kind, sizeof kind); /* rank 0's, in the order of its names */
    st = STRAT(t)->broadcast_bytes(t->strat.self, kind, sizeof kind, 0);
    if (st) return pl_error_prefix(st, "ddp: reducing metrics");
    pl_metrics_reset(m);
    for (int j = 0; j < n0; j++) {
        names[j][sizeof names[j] - 1] = 0;
        pl_metrics_add(m, names[j], v[2 * j], v[2 * j + 1]);
        m->kind[j] = kind[j];
    }
    return PL_OK;
}

pl_status tr_dist_barrier(trainer *t) {
    if (t->world <= 1) return PL_OK;
    return STRAT(t)->barrier(t->strat.self);
}

void tr_dist_abort(trainer *t, int code) {
    if (t->world <= 1 || !t->strat.self) return;
    fflush(stdout);
    fflush(stderr);
    STRAT(t)->abort(t->strat.self, code);
}

int tr_next_batch(trainer *t, pl_batch *b) {
    const pl_loader_vtable *L = LOADER(t);
    if (t->stride > 1) {
        int skip = t->pass_start ? t->rank : t->stride - 1;
        for (int i = 0; i < skip; i++) {
            int r = L->next(t->loader.self, b);
            if (r <= 0) {
                t->pass_start = false;
                return r;
            }
        }
    }
    t->pass_start = false;
    return L->next(t->loader.self, b);
}
