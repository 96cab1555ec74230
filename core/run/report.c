/* report.c - the run report: summary.json (written for failed runs too)
 * and the report printed at the end of a successful run. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "trainer_internal.h"

/* ---- report ----------------------------------------------------------------------------------- */

static cJSON *metrics_json(const pl_metrics *m) {
    cJSON *o = cJSON_CreateObject();
    for (int i = 0; i < m->n; i++)
        cJSON_AddNumberToObject(o, m->name[i], pl_metrics_value_at(m, i));
    return o;
}

/* ---- device memory peaks (issue 31, item 4) ------------------------------------------------
 * The device allocator's counters (pipeline/alloc.h) with PyTorch's meaning:
 * peak_memory_allocated_bytes = torch.cuda.max_memory_allocated,
 * peak_memory_reserved_bytes = torch.cuda.max_memory_reserved, per phase
 * (load, fit, test, export; the allocator's peaks restart at each phase's
 * start), per epoch in metrics.csv, and over the run in summary.json. */

void tr_peak_fold(trainer *t, phase_time *p, bool reset) {
    pl_alloc_stats s = pl_alloc_get_stats(t->ctx.device);
    if (s.peak_bytes > p->peak_bytes) p->peak_bytes = s.peak_bytes;
    if (s.peak_reserved_bytes > p->peak_reserved_bytes)
        p->peak_reserved_bytes = s.peak_reserved_bytes;
    if (reset) pl_alloc_reset_peak(t->ctx.device);
}

void tr_peak_metric_rows(trainer *t) {
    pl_alloc_stats s = pl_alloc_get_stats(t->ctx.device);
    tr_metric_row(t, "peak_memory_allocated_bytes", (double)s.peak_bytes);
    tr_metric_row(t, "peak_memory_reserved_bytes", (double)s.peak_reserved_bytes);
}

static size_t run_peak(const trainer *t, bool reserved) {
    const phase_time *ph[] = {&t->ph_load, &t->ph_fit, &t->ph_test, &t->ph_export};
    size_t m = 0;
    for (size_t i = 0; i < sizeof ph / sizeof ph[0]; i++) {
        size_t v = reserved ? ph[i]->peak_reserved_bytes : ph[i]->peak_bytes;
        if (v > m) m = v;
    }
    return m;
}

static void add_phase(cJSON *o, const char *name, const phase_time *p, bool timed) {
    cJSON *ph = cJSON_AddObjectToObject(o, name);
    if (timed) cJSON_AddNumberToObject(ph, "seconds", p->seconds);
    cJSON_AddNumberToObject(ph, "peak_memory_bytes", (double)p->peak_bytes);
    cJSON_AddNumberToObject(ph, "peak_memory_allocated_bytes", (double)p->peak_bytes);
    cJSON_AddNumberToObject(ph, "peak_memory_reserved_bytes", (double)p->peak_reserved_bytes);
}
/* ---- end of device memory peaks ---- */

/* summary.json, step by step: the keys in the order readers know them. */

/* config, run dir, status and the wall-clock / throughput figures; returns
 * the mean seconds per epoch (0 without epochs). */
static double summary_timing(cJSON *o, trainer *t, int status) {
    cJSON_AddStringToObject(o, "config", pl_config_path(t->cfg));
    cJSON_AddStringToObject(o, "run_dir", t->run_dir);
    cJSON_AddStringToObject(o, "status",
                            t->interrupted ? "interrupted" : status ? "failed" : "ok");
    cJSON_AddNumberToObject(o, "total_wall_seconds", tr_now() - t->t_start);
    cJSON_AddNumberToObject(o, "fit_seconds", t->fit_s);
    cJSON *ep = cJSON_AddArrayToObject(o, "epoch_seconds");
    double sum = 0;
    for (int64_t i = 0; i < t->n_epoch_s; i++) {
        cJSON_AddItemToArray(ep, cJSON_CreateNumber(t->epoch_s[i]));
        sum += t->epoch_s[i];
    }
    cJSON_AddNumberToObject(o, "time_per_epoch_seconds", t->n_epoch_s ? sum / t->n_epoch_s : 0);
    cJSON_AddNumberToObject(o, "test_seconds", t->test_s);
    cJSON_AddNumberToObject(o, "export_seconds", t->export_s);
    cJSON_AddNumberToObject(o, "epochs", (double)t->epoch);
    cJSON_AddNumberToObject(o, "optimizer_steps", (double)t->step);
    cJSON_AddNumberToObject(o, "seconds_per_step",
                            t->step > 0 && t->train_seconds > 0 ? t->train_seconds / (double)t->step
                                                                 : 0);
    cJSON_AddNumberToObject(o, "load_seconds", t->load_s);
    cJSON_AddNumberToObject(o, "load_peak_rss_bytes", (double)t->load_peak_rss);
    cJSON_AddNumberToObject(o, "peak_rss_bytes", (double)tr_peak_rss_bytes());
    cJSON_AddNumberToObject(o, "frozen_parameter_bytes", (double)t->frozen_bytes);
    cJSON_AddNumberToObject(o, "trainable_parameter_bytes", (double)t->trainable_bytes);
    cJSON_AddBoolToObject(o, "stopped_early", t->stopped_early);
    cJSON_AddNumberToObject(o, "train_samples_per_second",
                            t->train_seconds > 0 ? t->train_samples / t->train_seconds : 0);
    /* after 5 warm-up steps, device synchronized at both ends (cb_throughput.c);
     * 0 when the fit had no step past the warm-up */
    cJSON_AddNumberToObject(o, "steady_seconds_per_step",
                            t->steady_steps > 0 ? t->steady_seconds / (double)t->steady_steps : 0);
    cJSON_AddNumberToObject(o, "steady_samples_per_second",
                            t->steady_seconds > 0 ? t->steady_samples / t->steady_seconds : 0);
    cJSON_AddNumberToObject(o, "data_wait_fraction",
                            t->train_seconds > 0 ? t->data_wait / t->train_seconds : 0);
    return t->n_epoch_s ? sum / t->n_epoch_s : 0;
}

/* each phase's time and device peaks, the device, the thread pools and the
 * CPU kernels chosen; `dev` receives the device's name. */
static void summary_host(cJSON *o, trainer *t, char *dev, size_t dn) {
    cJSON *mem = cJSON_AddObjectToObject(o, "phases");
    add_phase(mem, "load", &t->ph_load, false);
    add_phase(mem, "fit", &t->ph_fit, true);
    add_phase(mem, "test", &t->ph_test, true);
    add_phase(mem, "export", &t->ph_export, true);
    cJSON_AddStringToObject(o, "device", pl_device_str(t->ctx.device, dev, dn));
    cJSON_AddNumberToObject(o, "openmp_threads", omp_get_max_threads());
    /* the cpu backend's OpenBLAS pool; the CPU kernel bf16 x bf16 GEMMs ran
     * on, chosen at run time by cpuid (and PL_CPU_ISA): "avx512bf16", "avx2"
     * or "scalar"; and what the CPU has (pl_backend.get_option) */
    char v[128];
    cJSON_AddNumberToObject(o, "openblas_threads",
                            atoi(pl_backend_info(PL_DEVICE_CPU, "blas_threads", v, sizeof v)));
    cJSON_AddStringToObject(o, "openblas_core",
                            pl_backend_info(PL_DEVICE_CPU, "blas_core", v, sizeof v));
    cJSON_AddStringToObject(o, "openblas_parallel",
                            pl_backend_info(PL_DEVICE_CPU, "blas_parallel", v, sizeof v));
    cJSON_AddStringToObject(o, "cpu_gemm_bf16",
                            pl_backend_info(PL_DEVICE_CPU, "cpu_gemm_bf16", v, sizeof v));
    cJSON_AddStringToObject(o, "cpu_features",
                            pl_backend_info(PL_DEVICE_CPU, "cpu_features", v, sizeof v));
}

static void summary_distributed(cJSON *o, trainer *t) {
    /* data parallel: who trained, and the global batch (Lightning: batch_size is per
     * process; the global batch is batch_size x world_size x accumulate_grad_batches) */
    cJSON *dist = cJSON_AddObjectToObject(o, "distributed");
    cJSON_AddStringToObject(dist, "strategy", t->strat.desc ? t->strat.desc->name : "single");
    cJSON_AddNumberToObject(dist, "world_size", t->world);
    cJSON_AddStringToObject(dist, "sharding", t->world <= 1 ? "none"
                                              : t->stride > 1 ? "batches r, r+N, ... per rank"
                                                              : "the loader's (each batch split)");
    const pl_config_section *data = pl_config_section_get(t->cfg, "data");
    int64_t bs = pl_cfg_int(data, "batch_size", -1);
    if (bs > 0 && !(t->world > 1 && t->stride == 1)) { /* a self-sharding loader's batch is
                                                          * split, not multiplied */
        cJSON_AddNumberToObject(dist, "per_rank_batch_size", (double)bs);
        cJSON_AddNumberToObject(dist, "global_batch_size",
                                (double)bs * t->world * (double)t->accum);
    }
    cJSON_AddNumberToObject(dist, "accumulate_grad_batches", (double)t->accum);
    double lrs = 1; /* looked up without pl_meta_get_float, whose miss would replace the
                     * error of a failed run that fail() prints after this summary */
    for (int i = 0; t->world > 1 && i < pl_meta_count(t->ctx.meta); i++)
        if (!strcmp(pl_meta_key_at(t->ctx.meta, i), "strategy.lr_scale"))
            pl_meta_get_float(t->ctx.meta, "strategy.lr_scale", &lrs);
    cJSON_AddNumberToObject(dist, "lr_scale", lrs);
}

static void summary_data(cJSON *o, trainer *t) {
    /* the run's meta table: what the loader found in the data (split sizes,
     * num_items, num_nodes, data_summary, ...) and values stages shared */
    cJSON *meta = cJSON_AddObjectToObject(o, "data");
    for (int i = 0; meta && i < pl_meta_count(t->ctx.meta); i++) {
        const char *k = pl_meta_key_at(t->ctx.meta, i), *sv = pl_meta_get_str(t->ctx.meta, k);
        double v;
        if (sv)
            cJSON_AddStringToObject(meta, k, sv);
        else if (!pl_meta_get_float(t->ctx.meta, k, &v) && isfinite(v))
            cJSON_AddNumberToObject(meta, k, v);
    }
}

/* the device's peaks over the phases and the allocator's counters */
static void summary_memory(cJSON *o, trainer *t) {
    pl_alloc_stats as = pl_alloc_get_stats(t->ctx.device);
    cJSON_AddNumberToObject(o, "peak_memory_bytes",
                            (double)fmax(fmax((double)t->ph_fit.peak_bytes,
                                              (double)t->ph_test.peak_bytes),
                                         (double)t->ph_export.peak_bytes));
    /* the run's device peaks, load included (torch.cuda.max_memory_allocated /
     * max_memory_reserved over the whole run) */
    cJSON_AddNumberToObject(o, "peak_memory_allocated_bytes", (double)run_peak(t, false));
    cJSON_AddNumberToObject(o, "peak_memory_reserved_bytes", (double)run_peak(t, true));
    cJSON_AddNumberToObject(o, "allocator_system_allocs", (double)as.system_allocs);
    cJSON_AddNumberToObject(o, "allocator_cache_hits", (double)as.cache_hits);
    tr_devstats_json(t, o); /* "device_stats": host reads, allocations, kernel calls per step */
}

/* validation and test metrics, the monitored best, the averager's metrics,
 * the checkpoints and outputs */
static void summary_results(cJSON *o, trainer *t) {
    cJSON_AddItemToObject(o, "val_metrics", metrics_json(&t->last_val));
    if (t->have_best) {
        cJSON_AddStringToObject(o, "monitor", t->monitor);
        cJSON_AddNumberToObject(o, "best_monitor", t->best);
        if (t->n_monitor > 1) { /* the GAT rule: each metric's best so far */
            cJSON *b = cJSON_AddObjectToObject(o, "best_monitors");
            for (int k = 0; b && k < t->n_monitor; k++)
                cJSON_AddNumberToObject(b, t->monitors[k], t->bests[k]);
        }
    }
    if (t->have_test) cJSON_AddItemToObject(o, "test_metrics", metrics_json(&t->test_metrics));
    if (t->have_avg_test) {
        char key[96];
        snprintf(key, sizeof key, "%s_val_metrics", t->avg.desc->name);
        cJSON_AddItemToObject(o, key, metrics_json(&t->avg_val_metrics));
        snprintf(key, sizeof key, "%s_test_metrics", t->avg.desc->name);
        cJSON_AddItemToObject(o, key, metrics_json(&t->avg_test_metrics));
    }
    cJSON_AddStringToObject(o, "best_checkpoint", t->best_path);
    cJSON_AddStringToObject(o, "last_checkpoint", t->last_path);
    cJSON_AddStringToObject(o, "outputs", t->outputs_path);
}

/* `text` (may be NULL: out of memory) to `path` through a temporary name
 * renamed over the old one: a full disk leaves the previous summary (or
 * none), never a truncated one; errors are reported, not returned. */
static void summary_write(trainer *t, const char *text, const char *path) {
    char tmp[PATH_MAX + 32];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    FILE *f = text ? fopen(tmp, "w") : NULL;
    bool ok = f && fputs(text, f) >= 0 && fputc('\n', f) != EOF && fflush(f) == 0 &&
              fsync(fileno(f)) == 0;
    if (f && fclose(f) != 0) ok = false;
    if (ok && rename(tmp, path) != 0) ok = false;
    if (!ok) {
        fprintf(stderr, "error: writing %s failed: %s\n", path, text ? strerror(errno) : "no memory");
        if (t->log) fprintf(t->log, "error: writing %s failed\n", path);
        unlink(tmp);
    }
}

/* the report printed at the end of a successful run */
static void print_report(trainer *t, const char *path, const char *dev, double per_epoch) {
    tr_log(t, "\n== run report (%s) ==\n", t->run_dir);
    tr_log(t, "  total wall time    %10.1f s\n", tr_now() - t->t_start);
    tr_log(t, "  fit                %10.1f s   (%lld epochs, %.2f s/epoch)\n", t->fit_s,
          (long long)t->epoch, per_epoch);
    tr_log(t, "  test               %10.1f s\n", t->test_s);
    tr_log(t, "  export             %10.1f s\n", t->export_s);
    tr_log(t, "  peak memory (%s)  fit %.1f MiB  test %.1f MiB  export %.1f MiB\n", dev,
          t->ph_fit.peak_bytes / 1048576.0, t->ph_test.peak_bytes / 1048576.0,
          t->ph_export.peak_bytes / 1048576.0);
    tr_log(t, "  device peak        allocated %.1f MiB  reserved %.1f MiB  (load %.1f / %.1f)\n",
          run_peak(t, false) / 1048576.0, run_peak(t, true) / 1048576.0,
          t->ph_load.peak_bytes / 1048576.0, t->ph_load.peak_reserved_bytes / 1048576.0);
    if (t->have_test)
        for (int i = 0; i < t->test_metrics.n; i++)
            tr_log(t, "  test_%-18s %10.5f\n", t->test_metrics.name[i],
                  pl_metrics_get(&t->test_metrics, t->test_metrics.name[i]));
    if (t->best_path[0]) tr_log(t, "  best checkpoint    %s\n", t->best_path);
    if (t->outputs_path[0]) tr_log(t, "  outputs            %s\n", t->outputs_path);
    tr_log(t, "  summary            %s\n", path);
}

void tr_write_summary(trainer *t, int status) {
    cJSON *o = cJSON_CreateObject();
    char dev[32];
    double per_epoch = summary_timing(o, t, status);
    summary_host(o, t, dev, sizeof dev);
    summary_distributed(o, t);
    summary_data(o, t);
    summary_memory(o, t);
    summary_results(o, t);
    char *txt = cJSON_Print(o);
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/summary.json", t->run_dir);
    summary_write(t, txt, path);
    /* a failed run: summary.json records what there is; no report */
    if (!status) print_report(t, path, dev, per_epoch);
    free(txt);
    cJSON_Delete(o);
}
