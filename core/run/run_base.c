/* run_base.c - what every file of the run uses: the clock and peak RSS, the
 * run's log (log.txt and the terminal; pl_message's sink during a run),
 * metrics.csv rows, batch limits, the schedulers' lr factor, and creating / destroying a stage from its
 * config section. The bottom of the run: calls nothing else of it. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <omp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "backend_loader.h"
#include "crash.h"
#include "message.h"
#include "callback.h"
#include "trainer_internal.h"

/* ---- small utilities ------------------------------------------------------------------------ */

double tr_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Peak resident memory of this process image: /proc/self/status VmHWM, the
 * high-water mark of the current address space. getrusage's ru_maxrss is not
 * it: Linux keeps ru_maxrss across execve, so a pipeline started from a
 * Python process that holds 500 MB reported the launcher's 500 MB. Falls
 * back to ru_maxrss where /proc is missing. */
size_t tr_peak_rss_bytes(void) {
    FILE *f = fopen("/proc/self/status", "r");
    if (f) {
        char line[256];
        unsigned long long kib = 0;
        bool found = false;
        while (!found && fgets(line, sizeof line, f))
            found = sscanf(line, "VmHWM: %llu kB", &kib) == 1;
        fclose(f);
        if (found) return (size_t)kib * 1024;
    }
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
    return (size_t)ru.ru_maxrss * 1024; /* Linux: KiB */
}

void tr_progress_clear(trainer *t) {
    if (!t->progress_shown) return;
    fputs("\r\033[K", stdout);
    t->progress_shown = false;
}

static void tr_vlog(trainer *t, const char *fmt, va_list ap) {
    if (t->rank > 0) return; /* rank 0 speaks for a data-parallel run */
    va_list aq;
    va_copy(aq, ap);
    tr_progress_clear(t);
    vprintf(fmt, ap);
    fflush(stdout);
    if (t->log) {
        vfprintf(t->log, fmt, aq);
        fflush(t->log);
    }
    va_end(aq);
}

void tr_log(trainer *t, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    tr_vlog(t, fmt, ap);
    va_end(ap);
}

/* pl_message's sink during a run (message.h): the line goes where the
 * trainer's own messages go, the terminal and log.txt */
static void message_to_run(void *ud, const char *line) { tr_log(ud, "%s", line); }

void tr_set_message_run(trainer *t) { pl_message_set_sink(t ? message_to_run : NULL, t); }

int tr_mkdir_p(const char *path) {
    char tmp[PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            if (mkdir(tmp, 0755) && errno != EEXIST) return -1;
            *p = '/';
        }
    if (mkdir(tmp, 0755) && errno != EEXIST) return -1;
    return 0;
}

void tr_metric_row(trainer *t, const char *key, double v) {
    if (t->metrics) fprintf(t->metrics, "%lld,%lld,%s,%.9g\n", (long long)t->step,
                            (long long)t->epoch, key, v);
}

/* A `limit_*_batches` / `val_check_interval` value, as Lightning reads it: an
 * integer ("1", "20") is a count of batches, a float ("1.0", "0.25") a
 * fraction of the split. The spelling decides, so 1 is one batch and 1.0 all. */
pl_limit tr_cfg_limit(const pl_config_section *s, const char *key) {
    const char *v = pl_cfg_get(s, key);
    pl_limit l = {1.0, false};
    if (!v) return l;
    l.value = pl_cfg_float(s, key, 1.0);
    l.is_count = strpbrk(v, ".eE") == NULL;
    return l;
}

int64_t tr_limit_batches(pl_limit lim, int64_t n) {
    if (lim.is_count) return (int64_t)lim.value < n ? (int64_t)lim.value : n;
    if (lim.value >= 1.0) return n; /* 1.0 = all (Lightning: float 1.0 means 100 %) */
    return (int64_t)floor(lim.value * (double)n);
}

/* ---- the learning-rate factor ---------------------------------------------------------------- */

/* The product of every scheduler's factor for the current step, unless the
 * averager overrides it (SWALR). */
static double current_factor(trainer *t) {
    double f = 1.0;
    for (int k = 0; k < t->n_sched; k++)
        f *= SCHED(&t->sched[k])->lr_factor(t->sched[k].self, t->step);
    if (t->avg.self && AVG(t)->lr_factor) {
        double o = AVG(t)->lr_factor(t->avg.self, t->epoch, t->step, f);
        if (!isnan(o)) f = o;
    }
    return f;
}

double tr_lr_factor(trainer *t) { return current_factor(t); }

/* ---- stages --------------------------------------------------------------------------------- */

pl_status tr_stage_create(trainer *t, stage *s, const char *section) {
    s->section = section;
    s->cfg = pl_config_section_get(t->cfg, section);
    s->desc = pl_config_plugin(t->cfg, section);
    if (!s->cfg || !s->desc) return PL_OK; /* optional stage absent */
    s->vt = s->desc->vtable;
    const char *path = pl_config_plugin_path(t->cfg, section);
    pl_status st = pl_stage_fns_of(s->desc, path, &s->fns);
    if (st) return pl_error_prefix(st, "[%s] plugin '%s' (%s)", section, s->desc->name, path);
    pl_crash_context_push("[%s] plugin '%s' (%s): create", section, s->desc->name, path);
    st = s->fns.create(s->cfg, &t->ctx, &s->self);
    pl_crash_context_pop();
    /* "create()" named: a plugin that fails without a message is then told apart */
    if (st) return pl_error_prefix(st, "[%s] plugin '%s' (%s): create()", section, s->desc->name,
                                   path);
    return PL_OK;
}

void tr_stage_destroy(stage *s) {
    if (!s->desc || !s->self) return;
    s->fns.destroy(s->self);
    s->self = NULL;
}
