/* device_stats.c - what would stall a GPU, counted per optimizer step.
 *
 * On a GPU a training step runs at the device's pace only when the host
 * never waits for it: a device-to-host read (pl_tensor_item of a loss) waits
 * for every kernel queued before it, and a raw device allocation (cudaMalloc)
 * synchronizes the device. A backend that counts them (pl_backend.counters,
 * ABI 2.6: the strict device) is read at the start and the end of each
 * optimizer step's window; summary.json reports the means and maxima per
 * step as "device_stats" (see trainer_internal.h for the window and which
 * steps count), and CI holds every shipped config on the strict device to 0
 * host reads and 0 allocations in a step that does not log. Lightning's
 * DeviceStatsMonitor reports the device's own counters; these are the
 * host-side causes of an idle device, which only the host can count.
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "trainer_internal.h"

static bool read_counters(const pl_backend *be, pl_backend_counters *c) {
    memset(c, 0, sizeof *c);
    c->struct_size = (uint32_t)sizeof *c;
    if (be->counters(c)) {
        pl_error_clear(); /* a counter that fails is no reason to fail a run */
        return false;
    }
    return true;
}

void tr_devstats_begin(trainer *t) {
    tr_devstats *d = &t->devstats;
    /* the phases count over the run: a resumed or second fit keeps them */
    tr_phase_counts ph[TR_PH_COUNT];
    memcpy(ph, d->ph, sizeof ph);
    memset(d, 0, sizeof *d);
    memcpy(d->ph, ph, sizeof ph);
    d->first_epoch = t->epoch;
    if (t->ctx.device.type == PL_DEVICE_CPU) return;
    const pl_backend *be = pl_backend_get(t->ctx.device.type);
    if (be && PL_BACKEND_HAS(be, counters) && be->counters) d->be = be;
    pl_error_clear(); /* pl_backend_get's miss */
    /* the device's own view: a first reading sets the cursor the epochs count from */
    pl_device_stats ds;
    pl_status st = pl_backend_device_stats(t->ctx.device, &d->health_cursor, &ds);
    d->health = st == PL_OK;
    if (st && st != PL_ERR_UNSUPPORTED)
        tr_log(t, "device stats: %s\n", pl_error_message());
    else if (st && t->ctx.verbose)
        tr_log(t, "device stats: none (%s)\n", pl_error_message());
    pl_error_clear();
}

void tr_devhealth_epoch(trainer *t, char *buf, size_t n) {
    tr_devstats *d = &t->devstats;
    if (n) buf[0] = 0;
    if (!d->health) return;
    pl_device_stats ds;
    if (pl_backend_device_stats(t->ctx.device, &d->health_cursor, &ds)) {
        pl_error_clear();
        return;
    }
    if (isfinite(ds.utilization)) {
        tr_metric_row(t, "device_utilization", ds.utilization);
        tr_metric_row(t, "device_idle_fraction", 1.0 - ds.utilization);
        d->util_sum += ds.utilization;
        d->util_n++;
    }
    if (isfinite(ds.memory_used_bytes)) {
        tr_metric_row(t, "device_memory_used_bytes", ds.memory_used_bytes);
        if (ds.memory_used_bytes > d->mem_max) d->mem_max = ds.memory_used_bytes;
    }
    if (n && isfinite(ds.utilization))
        snprintf(buf, n, "  device %.0f%% busy, %.1f GiB in use", 100.0 * ds.utilization,
                 isfinite(ds.memory_used_bytes) ? ds.memory_used_bytes / 1073741824.0 : 0.0);
}

void tr_devstats_step_begin(trainer *t) {
    tr_devstats *d = &t->devstats;
    if (d->be) d->open = read_counters(d->be, &d->c0);
}

void tr_devstats_step_abort(trainer *t) { t->devstats.open = false; }

static void add(tr_devstats_sum *s, uint64_t r, uint64_t a, uint64_t k) {
    s->steps++;
    s->reads += r;
    s->allocs += a;
    s->kernels += k;
    if (r > s->max_reads) s->max_reads = r;
    if (a > s->max_allocs) s->max_allocs = a;
    if (k > s->max_kernels) s->max_kernels = k;
}

void tr_devstats_step_end(trainer *t, bool logged) {
    tr_devstats *d = &t->devstats;
    if (!d->be || !d->open) return;
    d->open = false;
    pl_backend_counters c1;
    if (!read_counters(d->be, &c1)) return;
    uint64_t r = c1.host_reads - d->c0.host_reads, a = c1.allocations - d->c0.allocations,
             k = c1.kernel_calls - d->c0.kernel_calls;
    /* warm-up: the first epoch, and at least the first two steps (the first
     * creates the gradients; the second is the first to accumulate into them,
     * which takes one temporary more: gat_cora's one batch per epoch puts it
     * in the second epoch) */
    d->steps_seen++;
    bool warm_up = t->epoch == d->first_epoch || d->steps_seen <= 2;
    add(warm_up ? &d->first : logged ? &d->logged : &d->quiet, r, a, k);
}

int tr_devstats_phase(trainer *t, int ph, bool new_pass) {
    tr_devstats *d = &t->devstats;
    int prev = d->cur;
    pl_backend_counters c = {0};
    bool have = d->be && read_counters(d->be, &c);
    double now = tr_now();
    tr_phase_counts *p = &d->ph[prev];
    if (prev != TR_PH_NONE) {
        p->seconds += now - d->at_s;
        if (have) {
            p->reads += c.host_reads - d->at.host_reads;
            p->read_bytes += c.host_read_bytes - d->at.host_read_bytes;
            p->writes += c.host_writes - d->at.host_writes;
            p->write_bytes += c.host_write_bytes - d->at.host_write_bytes;
            p->allocs += c.allocations - d->at.allocations;
            p->alloc_bytes += c.allocation_bytes - d->at.allocation_bytes;
            p->kernels += c.kernel_calls - d->at.kernel_calls;
            p->pass_reads += c.host_reads - d->at.host_reads;
            if (p->pass_reads > p->max_reads) p->max_reads = p->pass_reads;
        }
    }
    if (ph != TR_PH_NONE && new_pass) {
        d->ph[ph].passes++;
        d->ph[ph].pass_reads = 0;
    }
    d->cur = ph;
    d->at = c;
    d->at_s = now;
    return prev;
}

static double per(uint64_t x, int64_t n) { return n > 0 ? (double)x / (double)n : 0; }

void tr_devstats_log(trainer *t) {
    const tr_devstats *d = &t->devstats;
    if (!d->be) return;
    const tr_devstats_sum *q = &d->quiet, *f = &d->first;
    tr_log(t, "device stats (%s), per optimizer step: first epoch %.1f host reads, %.1f "
           "allocations, %.1f kernel calls (%lld steps); later steps that do not log %.1f host "
           "reads (max %llu), %.1f allocations (max %llu), %.1f kernel calls (%lld steps)\n",
           d->be->name, per(f->reads, f->steps), per(f->allocs, f->steps),
           per(f->kernels, f->steps), (long long)f->steps, per(q->reads, q->steps),
           (unsigned long long)q->max_reads, per(q->allocs, q->steps),
           (unsigned long long)q->max_allocs, per(q->kernels, q->steps), (long long)q->steps);
}

static void sum_json(cJSON *o, const char *name, const tr_devstats_sum *s) {
    cJSON *j = cJSON_AddObjectToObject(o, name);
    cJSON_AddNumberToObject(j, "steps", (double)s->steps);
    cJSON_AddNumberToObject(j, "host_reads_per_step", per(s->reads, s->steps));
    cJSON_AddNumberToObject(j, "allocations_per_step", per(s->allocs, s->steps));
    cJSON_AddNumberToObject(j, "kernel_calls_per_step", per(s->kernels, s->steps));
    cJSON_AddNumberToObject(j, "host_reads_max", (double)s->max_reads);
    cJSON_AddNumberToObject(j, "allocations_max", (double)s->max_allocs);
    cJSON_AddNumberToObject(j, "kernel_calls_max", (double)s->max_kernels);
}

void tr_devstats_json(const trainer *t, void *obj) {
    cJSON *o = obj;
    const tr_devstats *d = &t->devstats;
    if (d->util_n > 0) { /* the device's own view, per epoch (tr_devhealth_epoch) */
        cJSON *h = cJSON_AddObjectToObject(o, "device_health");
        cJSON_AddNumberToObject(h, "epochs", (double)d->util_n);
        cJSON_AddNumberToObject(h, "utilization_mean", d->util_sum / (double)d->util_n);
        cJSON_AddNumberToObject(h, "idle_fraction_mean", 1.0 - d->util_sum / (double)d->util_n);
        cJSON_AddNumberToObject(h, "memory_used_bytes_max", d->mem_max);
    } else {
        cJSON_AddNullToObject(o, "device_health");
    }
    /* each phase's wall seconds, on every device (cuda counts nothing else) */
    static const char *const names[TR_PH_COUNT] = {NULL, "train", "validate", "test", "export"};
    cJSON *sec = cJSON_AddObjectToObject(o, "phase_seconds");
    for (int i = TR_PH_NONE + 1; i < TR_PH_COUNT; i++)
        cJSON_AddNumberToObject(sec, names[i], d->ph[i].seconds);
    if (!d->be) {
        cJSON_AddNullToObject(o, "device_stats");
        return;
    }
    cJSON *j = cJSON_AddObjectToObject(o, "device_stats");
    cJSON_AddStringToObject(j, "backend", d->be->name);
    cJSON_AddStringToObject(j, "measured_over",
                            "optimizer steps after this process's first epoch (and its first 2 steps) that do not log "
                            "(step % log_every_n_steps != 0); a step spans fetching its batches, "
                            "forward, backward, the optimizer step and the progress line, not "
                            "validation, checkpoints or the epoch's end");
    /* the headline: the steps that must not stall a GPU */
    const tr_devstats_sum *q = &d->quiet;
    cJSON_AddNumberToObject(j, "steps", (double)q->steps);
    cJSON_AddNumberToObject(j, "host_reads_per_step", per(q->reads, q->steps));
    cJSON_AddNumberToObject(j, "allocations_per_step", per(q->allocs, q->steps));
    cJSON_AddNumberToObject(j, "kernel_calls_per_step", per(q->kernels, q->steps));
    cJSON_AddNumberToObject(j, "host_reads_max", (double)q->max_reads);
    cJSON_AddNumberToObject(j, "allocations_max", (double)q->max_allocs);
    cJSON_AddNumberToObject(j, "kernel_calls_max", (double)q->max_kernels);
    sum_json(j, "logged_steps", &d->logged);
    sum_json(j, "first_epoch", &d->first); /* the warm-up: first epoch and first 2 steps */
    cJSON *ps = cJSON_AddObjectToObject(j, "phases");
    for (int i = TR_PH_NONE + 1; i < TR_PH_COUNT; i++) {
        const tr_phase_counts *p = &d->ph[i];
        cJSON *o1 = cJSON_AddObjectToObject(ps, names[i]);
        cJSON_AddNumberToObject(o1, "passes", (double)p->passes);
        cJSON_AddNumberToObject(o1, "seconds", p->seconds);
        cJSON_AddNumberToObject(o1, "host_reads", (double)p->reads);
        cJSON_AddNumberToObject(o1, "host_read_bytes", (double)p->read_bytes);
        cJSON_AddNumberToObject(o1, "host_writes", (double)p->writes);
        cJSON_AddNumberToObject(o1, "host_write_bytes", (double)p->write_bytes);
        cJSON_AddNumberToObject(o1, "allocations", (double)p->allocs);
        cJSON_AddNumberToObject(o1, "allocation_bytes", (double)p->alloc_bytes);
        cJSON_AddNumberToObject(o1, "kernel_calls", (double)p->kernels);
        cJSON_AddNumberToObject(o1, "host_reads_per_pass", per(p->reads, p->passes));
        cJSON_AddNumberToObject(o1, "host_reads_max_per_pass", (double)p->max_reads);
    }
}
