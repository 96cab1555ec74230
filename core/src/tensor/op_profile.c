/* op_profile.c - where a step's device time goes, op by op
 * (PL_PROFILE_OPS=1; internal.h).
 *
 * With the variable set, every forward and backward kernel the core
 * dispatches (pl_kernel_forward, the tape's backward nodes) is bracketed by
 * the backend's synchronize: the device's queue is drained before the
 * kernel, the clock read, the kernel issued, the queue drained again. The
 * difference is that kernel's device time plus its launch and one
 * synchronize, so the table says which ops dominate a step on a GPU (the
 * question a 5x gap to PyTorch at 7B left open, docs/benchmarks.md) without
 * nsys; the run itself gets slower (every launch waits), so its timings are
 * not the run's. On the CPU the kernels are synchronous and the table is
 * plain wall time per op. At exit the table goes to stderr: per op and
 * direction (and the first input's dtype), calls, total milliseconds, mean
 * microseconds per call and the share of the profiled total, largest first.
 * Threads (a loader's staging copies) share the table under a mutex.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"
#include "pipeline/backend.h"

typedef struct prof_row {
    int op;        /* pl_op, or PL_OP_COUNT + custom index */
    int backward;  /* 0 forward, 1 backward */
    pl_dtype dtype; /* first input's */
    int64_t calls;
    double seconds;
} prof_row;

#define PROF_MAX 512
static prof_row g_rows[PROF_MAX];
static int g_n;
static int g_on = -1; /* -1: not read yet */
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_rows(const void *a, const void *b) {
    double x = ((const prof_row *)a)->seconds, y = ((const prof_row *)b)->seconds;
    return x < y ? 1 : x > y ? -1 : 0;
}

static void report_at_exit(void) { pl_op_profile_report(stderr); }

bool pl_op_profile_on(void) {
    if (g_on < 0) {
        const char *e = getenv("PL_PROFILE_OPS");
        pl_op_profile_enable(e && atoi(e) > 0);
        if (g_on) atexit(report_at_exit);
    }
    return g_on > 0;
}

void pl_op_profile_enable(bool on) {
    pthread_mutex_lock(&g_mu);
    g_on = on;
    g_n = 0;
    pthread_mutex_unlock(&g_mu);
}


double pl_op_profile_begin(pl_device d) {
    (void)pl_device_synchronize(d);
    return now_s();
}

void pl_op_profile_end(int op, bool backward, const pl_tensor *first, pl_device d, double t0) {
    (void)pl_device_synchronize(d);
    double dt = now_s() - t0;
    pl_dtype dt_in = first ? first->dtype : PL_F32;
    pthread_mutex_lock(&g_mu);
    int i = 0;
    while (i < g_n && !(g_rows[i].op == op && g_rows[i].backward == (int)backward &&
                        g_rows[i].dtype == dt_in))
        i++;
    if (i == g_n && g_n < PROF_MAX) g_rows[g_n++] = (prof_row){op, backward, dt_in, 0, 0};
    if (i < g_n) {
        g_rows[i].calls++;
        g_rows[i].seconds += dt;
    }
    pthread_mutex_unlock(&g_mu);
}

void pl_op_profile_report(FILE *f) {
    pthread_mutex_lock(&g_mu);
    int n = g_n;
    prof_row rows[PROF_MAX];
    memcpy(rows, g_rows, sizeof(prof_row) * (size_t)n);
    pthread_mutex_unlock(&g_mu);
    if (!n || !f) return;
    qsort(rows, (size_t)n, sizeof *rows, cmp_rows);
    double total = 0;
    for (int i = 0; i < n; i++) total += rows[i].seconds;
    fprintf(f, "op profile (PL_PROFILE_OPS=1: each kernel between two synchronizes; device time "
               "+ launch, the run itself slowed): %.1f ms in %d rows\n", 1e3 * total, n);
    fprintf(f, "  %-18s %-8s %-5s %10s %12s %12s %7s\n", "op", "pass", "dtype", "calls",
            "total ms", "mean us", "share");
    for (int i = 0; i < n; i++) {
        const prof_row *r = &rows[i];
        fprintf(f, "  %-18s %-8s %-5s %10lld %12.3f %12.2f %6.1f%%\n",
                r->op < PL_OP_COUNT ? pl_op_name((pl_op)r->op) : "custom",
                r->backward ? "backward" : "forward", pl_dtype_name(r->dtype),
                (long long)r->calls, 1e3 * r->seconds, 1e6 * r->seconds / (double)r->calls,
                total > 0 ? 100.0 * r->seconds / total : 0.0);
    }
}
