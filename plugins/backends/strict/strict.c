/* strict.c - a device backend that behaves like a discrete GPU, on the CPU.
 *
 * Why: the machines this project is built and tested on have no GPU, and
 * code that reads or writes device memory from the host (a trainer summing
 * a loss with a host loop, an optimizer updating through a raw pointer, a
 * loader filling a device batch with memcpy) works on the CPU backend and
 * crashes on the first GPU. This backend registers in the accelerator slot
 * (PL_DEVICE_CUDA, name "strict"), so the core and every plugin take the
 * same paths as on CUDA, but its memory is mapped PROT_NONE: any host access
 * outside the backend's own kernels and copy functions is a SIGSEGV, in CI.
 *
 * Memory: every raw allocation is its own anonymous mapping, rounded up to
 * whole pages, PROT_NONE while closed. A kernel or copy "opens" the blocks
 * it touches (PROT_READ|PROT_WRITE) for its duration and closes them after;
 * opens are counted per block under one mutex, so a loader thread copying
 * into one block while the main thread runs a kernel on another (or the
 * same) block is safe. Blocks are found by their base address (the core's
 * caching allocator hands out whole blocks; tensors are views at an offset
 * into storage->data; blocks are kept sorted, so the one holding any
 * pointer is a binary search away).
 *
 * Kernels: the CPU backend's own kernels (which run the shared math of
 * backend_util.h / kernel_math.h), called with every tensor they receive
 * (inputs, outputs, an nf4 tensor's quantization state) opened; a CPU tensor
 * handed to one is an error, as a host pointer is to a GPU kernel. Results
 * are therefore the CPU's, bit for bit. A kernel's scratch comes from PL_CPU.
 *
 * Captured steps (graph.h): recorded and replayed in order; when the capture
 * ends, capture_end_step's fusion pass (strict_fuse.c) may fuse calls whose
 * intermediates are dead (backend.h, "Seeing the step").
 *
 * What it cannot catch: a host access to a block that another thread has
 * open at that moment (the window of one kernel). Device memory is ordinary
 * host memory underneath, so mem_info reports the host's.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <execinfo.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "pipeline/alloc.h"
#include "pipeline/backend.h"
#include "pipeline/backend_util.h"
#include "pipeline/optim_math.h"
#include "pipeline/plugin.h"
#include "pipeline/status.h"
#include "pipeline/tensor.h"
#include "strict_internal.h"

/* ---- counters: what would stall a GPU (pl_backend.counters) -----------------
 * Kept in their own section: relaxed atomics, bumped by the transfer, alloc
 * and kernel entry points below (a loader's prefetch thread copies too). */

static _Atomic uint64_t c_host_reads, c_host_read_bytes, c_host_writes, c_host_write_bytes;
static _Atomic uint64_t c_allocs, c_alloc_bytes, c_kernels;
/* device_stats: nanoseconds inside kernels, and bytes mapped as device memory */
static _Atomic uint64_t c_busy_ns, c_mapped_bytes;

/* PL_STRICT_MEMORY_ONLY=1: device memory is allocated, counted and handed out
 * exactly as usual, but no kernel, device copy, memset or fill runs, a
 * host-to-device copy writes nothing and a device-to-host copy hands the host
 * zeros. Device memory is never touched, so its pages are never committed:
 * the peaks of a 7B step (tens of GiB) can be measured on a machine with less
 * memory, in seconds. It is a measurement of memory only, valid where the
 * sizes allocated do not depend on device values (they depend on shapes;
 * test_precision_memory checks that the peaks equal a computing run's);
 * losses and metrics are meaningless (zeros). Read once, at the first call. */
static int memory_only(void) {
    static _Atomic int v = -1;
    int x = atomic_load_explicit(&v, memory_order_relaxed);
    if (x < 0) {
        const char *e = getenv("PL_STRICT_MEMORY_ONLY");
        x = e && *e && strcmp(e, "0") != 0;
        /* the first thread to settle it says so, once */
        if (atomic_exchange_explicit(&v, x, memory_order_relaxed) < 0 && x)
            pl_message("strict device: PL_STRICT_MEMORY_ONLY is set: no kernel runs; device "
                       "memory figures only, losses and metrics are zeros");
    }
    return x;
}

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void count(_Atomic uint64_t *n, _Atomic uint64_t *bytes, size_t nb) {
    atomic_fetch_add_explicit(n, 1, memory_order_relaxed);
    if (bytes) atomic_fetch_add_explicit(bytes, nb, memory_order_relaxed);
}

/* PL_STRICT_TRACE=reads (allocs, or reads,allocs): the call stack of every
 * device-to-host read (raw allocation) on stderr, to find what makes a step
 * wait for the device (summary.json device_stats). */
static void trace(const char *what, size_t n) {
    const char *e = getenv("PL_STRICT_TRACE");
    if (!e || !strstr(e, what)) return;
    fprintf(stderr, "strict device: %s of %zu bytes from:\n", what, n);
    void *frames[32];
    int k = backtrace(frames, 32);
    backtrace_symbols_fd(frames, k, 2);
}

#define CNT_GET(x) atomic_load_explicit(&(x), memory_order_relaxed)

/* Fill the fields out->struct_size covers (a caller built against an older,
 * shorter pl_backend_counters gets only those). */
static pl_status st_counters(pl_backend_counters *out) {
    if (!out || out->struct_size < offsetof(pl_backend_counters, host_reads) + sizeof(uint64_t))
        return pl_error_set(PL_ERR_INVALID, "strict device: counters: struct_size %u too small",
                            out ? out->struct_size : 0);
    pl_backend_counters c = {
        .struct_size = out->struct_size,
        .host_reads = CNT_GET(c_host_reads),
        .host_read_bytes = CNT_GET(c_host_read_bytes),
        .host_writes = CNT_GET(c_host_writes),
        .host_write_bytes = CNT_GET(c_host_write_bytes),
        .allocations = CNT_GET(c_allocs),
        .allocation_bytes = CNT_GET(c_alloc_bytes),
        .kernel_calls = CNT_GET(c_kernels),
    };
    size_t n = out->struct_size < sizeof c ? out->struct_size : sizeof c;
    memcpy(out, &c, n);
    return PL_OK;
}

/* ---- graph capture: state (the recording is further down) ------------------
 * While a thread captures (capture_begin), its kernels, device-to-device
 * copies and memsets are recorded, not run; its host reads / writes,
 * synchronize and fill_random are violations: refused with an error naming
 * the call (and its call stack on stderr), and the capture is poisoned
 * (capture_end returns the first violation). Other threads run as usual. */

typedef struct st_graph st_graph;
static _Thread_local st_graph *tl_cap;
static _Thread_local pl_status tl_cap_err;
static _Thread_local char tl_cap_msg[512];

/* A violation while capturing: the error, kept as the capture's first. */
static pl_status violation(const char *what, size_t n) {
    pl_status s = pl_error_set(PL_ERR_DEVICE,
                               "strict device: %s of %zu bytes while capturing a graph (a captured "
                               "step cannot contain one: on a GPU it would wait for the device or "
                               "bake a host value into the graph)",
                               what, n);
    if (!tl_cap_err) {
        tl_cap_err = s;
        snprintf(tl_cap_msg, sizeof tl_cap_msg, "%s", pl_error_message());
        fprintf(stderr, "strict device: %s while capturing a graph, from:\n", what);
        void *frames[32];
        int k = backtrace(frames, 32);
        backtrace_symbols_fd(frames, k, 2);
    }
    return s;
}

static pl_status rec_copy(void *dst, const void *src, size_t n);
static pl_status rec_memset(void *dst, int v, size_t n);

/* ---- the block table -----------------------------------------------------
 * Live mappings sorted by base address: the block containing any address
 * (a tensor's data pointer is a view into its storage's block) is one binary
 * search away. Inserts and removals move the tail; blocks are few (the core's
 * caching allocator reuses them), so that stays cheap. */

typedef struct block {
    uintptr_t base;
    size_t len; /* bytes mapped (whole pages) */
    int opens;  /* > 0: PROT_READ|PROT_WRITE */
} block;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static block *g_blocks; /* [g_n] sorted by base; [g_cap] allocated */
static size_t g_n, g_cap;
static size_t g_page;

/* Caller holds g_mu. How many blocks have base <= a. */
static size_t n_at_or_below(uintptr_t a) {
    size_t lo = 0, hi = g_n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (g_blocks[mid].base <= a)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Caller holds g_mu. The block holding address a, or NULL. */
static block *containing(uintptr_t a) {
    size_t i = n_at_or_below(a);
    return i > 0 && a < g_blocks[i - 1].base + g_blocks[i - 1].len ? &g_blocks[i - 1] : NULL;
}

/* Caller holds g_mu. */
static bool insert(uintptr_t base, size_t len) {
    if (g_n == g_cap) {
        size_t nc = g_cap ? 2 * g_cap : 256;
        block *nb = realloc(g_blocks, nc * sizeof *nb);
        if (!nb) return false;
        g_blocks = nb;
        g_cap = nc;
    }
    size_t i = n_at_or_below(base);
    memmove(&g_blocks[i + 1], &g_blocks[i], (g_n - i) * sizeof *g_blocks);
    g_blocks[i] = (block){.base = base, .len = len, .opens = 0};
    g_n++;
    return true;
}

/* PL_STRICT_MEMORY_CAPACITY: the device's memory, as a GPU's (bytes, or a number
 * with a KiB / MiB / GiB suffix; unset or 0: no limit). A raw allocation that
 * would map more fails as cudaMalloc does, and the core's allocator then gives
 * its cached blocks back and retries before it reports an out-of-memory error
 * (alloc.c), so whether a run fits a card of that size is checked without one.
 * Read at each raw allocation (a test sets it in its own process). 0 with
 * *bad set: a value that does not parse. */
static size_t capacity_bytes(const char **bad) {
    const char *e = getenv("PL_STRICT_MEMORY_CAPACITY");
    *bad = NULL;
    if (!e || !*e) return 0;
    char *end = NULL;
    double v = strtod(e, &end);
    double unit = !strcmp(end, "") || !strcmp(end, "B")  ? 1.0
                  : !strcmp(end, "KiB")                   ? 1024.0
                  : !strcmp(end, "MiB")                   ? 1048576.0
                  : !strcmp(end, "GiB")                   ? 1073741824.0
                                                          : -1.0;
    if (end == e || unit < 0 || !(v >= 0) || v * unit > 0x1p62) {
        *bad = e;
        return 0;
    }
    return (size_t)(v * unit);
}

static void *st_raw_alloc(int device, size_t n) {
    (void)device;
    /* while capturing, only the core's allocator may map memory (it serves the
     * capture from the graph's pool); anything else is not reserved for the graph */
    if (tl_cap && !pl_alloc_in_raw_alloc()) {
        violation("an allocation outside the graph's pool (a raw_alloc not from the core's "
                  "allocator)", n);
        return NULL;
    }
    if (!g_page) g_page = (size_t)sysconf(_SC_PAGESIZE);
    size_t len = ((n ? n : 1) + g_page - 1) / g_page * g_page;
    const char *bad;
    size_t cap = capacity_bytes(&bad);
    if (bad) {
        pl_error_set(PL_ERR_CONFIG, "strict device: PL_STRICT_MEMORY_CAPACITY = '%s': expected "
                     "bytes, or a number with a KiB, MiB or GiB suffix (e.g. 24GiB)", bad);
        return NULL;
    }
    size_t mapped = atomic_load_explicit(&c_mapped_bytes, memory_order_relaxed);
    if (cap && (len > cap || mapped > cap - len)) {
        pl_error_set(PL_ERR_NOMEM, "strict device: a device allocation of %.2f MiB does not fit "
                     "its PL_STRICT_MEMORY_CAPACITY of %.2f MiB (%.2f MiB mapped)",
                     (double)len / 1048576.0, (double)cap / 1048576.0, (double)mapped / 1048576.0);
        return NULL;
    }
    void *p = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
    pthread_mutex_lock(&g_mu);
    bool ok = insert((uintptr_t)p, len);
    pthread_mutex_unlock(&g_mu);
    if (!ok) {
        munmap(p, len);
        return NULL;
    }
    count(&c_allocs, &c_alloc_bytes, n);
    atomic_fetch_add_explicit(&c_mapped_bytes, len, memory_order_relaxed);
    trace("allocs", n);
    return p;
}

static void st_raw_free(int device, void *p) {
    (void)device;
    if (!p) return;
    pthread_mutex_lock(&g_mu);
    block *b = containing((uintptr_t)p);
    size_t len = b && b->base == (uintptr_t)p ? b->len : 0;
    if (len) {
        size_t i = (size_t)(b - g_blocks);
        memmove(&g_blocks[i], &g_blocks[i + 1], (g_n - i - 1) * sizeof *g_blocks);
        g_n--;
    }
    pthread_mutex_unlock(&g_mu);
    if (len) {
        munmap(p, len);
        atomic_fetch_sub_explicit(&c_mapped_bytes, len, memory_order_relaxed);
    }
}

/* Open (or close) the block holding device pointer p; returns its base in
 * *base (to close the same block later) when base is non-NULL. NULL p:
 * nothing. A pointer in no block of ours is an error: it is not device
 * memory (a host pointer handed to a device kernel or copy). */
static pl_status open_block(const void *p, bool open, const char *what, uintptr_t *base) {
    if (!p) return PL_OK;
    pthread_mutex_lock(&g_mu);
    block *b = containing((uintptr_t)p);
    if (!b) {
        pthread_mutex_unlock(&g_mu);
        return pl_error_set(PL_ERR_DEVICE,
                            "strict device: %s at %p is not strict device memory (a host "
                            "pointer handed to a device kernel or copy)",
                            what, p);
    }
    int rc = 0;
    if (open && b->opens++ == 0)
        rc = mprotect((void *)b->base, b->len, PROT_READ | PROT_WRITE);
    else if (!open && --b->opens == 0)
        rc = mprotect((void *)b->base, b->len, PROT_NONE);
    if (base) *base = b->base;
    pthread_mutex_unlock(&g_mu);
    if (rc) return pl_error_set(PL_ERR_DEVICE, "strict device: mprotect: %s", strerror(errno));
    return PL_OK;
}

/* ---- transfers ------------------------------------------------------------- */

/* Open the device side of a copy (a CPU pointer needs nothing). */
static pl_status open_side(const void *p, pl_device d, bool open, const char *what) {
    return d.type == PL_DEVICE_CPU ? PL_OK : open_block(p, open, what, NULL);
}

static pl_status st_memcpy(void *dst, pl_device dd, const void *src, pl_device sd, size_t n) {
    if (!n) return PL_OK;
    bool dd_host = dd.type == PL_DEVICE_CPU, sd_host = sd.type == PL_DEVICE_CPU;
    if (tl_cap) {
        if (dd_host && !sd_host) return violation("a host read (device-to-host copy)", n);
        if (!dd_host && sd_host) return violation("a host write (host-to-device copy)", n);
        if (!dd_host && !sd_host) return rec_copy(dst, src, n);
    }
    if (dd_host && !sd_host) {
        count(&c_host_reads, &c_host_read_bytes, n);
        trace("reads", n);
    }
    if (!dd_host && sd_host)
        count(&c_host_writes, &c_host_write_bytes, n);
    else if (!dd_host && !sd_host)
        count(&c_kernels, NULL, 0);
    if (memory_only()) { /* nothing is computed: the host reads zeros */
        if (dd_host) memset(dst, 0, n);
        return PL_OK;
    }
    pl_status s = open_side(dst, dd, true, "copy destination");
    if (s) return s;
    s = open_side(src, sd, true, "copy source");
    if (!s) {
        memmove(dst, src, n);
        open_side(src, sd, false, "copy source");
    }
    open_side(dst, dd, false, "copy destination");
    return s;
}

/* "Pinned" host memory is ordinary host memory here (the host may touch it,
 * as it may touch cudaHostAlloc'd memory); it exercises the callers' pinned
 * staging paths. */
static void *st_host_alloc(size_t n) { return aligned_alloc(64, (n + 63) & ~(size_t)63); }
static void st_host_free(void *p) { free(p); }

/* allow_tf32 is accepted and has no effect (the CPU's kernels compute in f32);
 * optimizer_found_inf, optimizer_step_count: the CPU's optimizer kernels,
 * which this backend runs, obey the flag and keep a counted call's count;
 * lora_add_dropout: its lora_add honours the dropout bit (ops.h);
 * linear_cross_entropy: it runs the CPU's fused kernel (ops.h); fuse ("true" by default): whether capture_end_step fuses. */
static _Atomic bool g_no_fuse;
static pl_status st_set_option(const char *key, const char *value) {
    if (!strcmp(key, "allow_tf32")) return PL_OK;
    if (!strcmp(key, "optimizer_found_inf")) return PL_OK;
    if (!strcmp(key, "optimizer_step_count")) return PL_OK; /* the CPU's kernels keep it (ops.h) */
    if (!strcmp(key, "lora_add_dropout")) return PL_OK; /* its (CPU) lora_add kernel honours bit1 */
    if (!strcmp(key, "linear_cross_entropy")) return PL_OK; /* the CPU's kernel (ABI 2.13) */
    if (!strcmp(key, "fuse")) {
        if (!value || (strcmp(value, "true") && strcmp(value, "false")))
            return pl_error_set(PL_ERR_INVALID, "strict backend: fuse = '%s' (expected true or false)",
                                value ? value : "(null)");
        atomic_store(&g_no_fuse, !strcmp(value, "false"));
        return PL_OK;
    }
    return pl_error_set(PL_ERR_UNSUPPORTED, "strict backend: no setting '%s'", key);
}

/* Synchronous here: every kernel has completed when it is issued. */
static pl_status st_memcpy_h2d_background(void *dst, pl_device dd, const void *src, size_t n) {
    return st_memcpy(dst, dd, src, PL_CPU, n); /* the capturing thread's: a violation */
}

static pl_status st_memset(void *dst, pl_device dev, int v, size_t n) {
    if (!n) return PL_OK;
    if (tl_cap && dev.type != PL_DEVICE_CPU) return rec_memset(dst, v, n);
    if (dev.type != PL_DEVICE_CPU) count(&c_kernels, NULL, 0);
    if (memory_only() && dev.type != PL_DEVICE_CPU) return PL_OK;
    pl_status s = open_side(dst, dev, true, "memset destination");
    if (s) return s;
    memset(dst, v, n);
    return open_side(dst, dev, false, "memset destination");
}

static pl_status st_sync(int device) {
    (void)device;
    if (tl_cap) return violation("synchronize", 0);
    return PL_OK;
}

/* ---- a host access to device memory: say so before the crash ----------------------- */

static struct sigaction g_prev_segv;

/* Async-signal-safe enough for a process that is about to die: a trylock on
 * the block table (a crash inside the allocator itself skips the lookup),
 * write(2) and backtrace_symbols_fd (which does not allocate). */
static void on_segv(int sig, siginfo_t *si, void *uctx) {
    uintptr_t a = (uintptr_t)si->si_addr;
    bool ours = false;
    if (pthread_mutex_trylock(&g_mu) == 0) {
        ours = containing(a) != NULL;
        pthread_mutex_unlock(&g_mu);
    }
    if (ours) {
        static const char msg[] =
            "\nstrict device: the host read or wrote device memory outside a kernel or copy "
            "(a stage, the trainer or a loader used a device tensor's data pointer; on a GPU this "
            "is a crash or garbage). Call stack:\n";
        ssize_t w = write(2, msg, sizeof msg - 1);
        (void)w;
        void *frames[48];
        int n = backtrace(frames, 48);
        backtrace_symbols_fd(frames, n, 2);
    }
    /* hand over to whoever handled it before (or the default: core dump) */
    sigaction(SIGSEGV, &g_prev_segv, NULL);
    if (g_prev_segv.sa_flags & SA_SIGINFO && g_prev_segv.sa_sigaction)
        g_prev_segv.sa_sigaction(sig, si, uctx);
    else if (g_prev_segv.sa_handler != SIG_DFL && g_prev_segv.sa_handler != SIG_IGN)
        g_prev_segv.sa_handler(sig);
    else
        raise(sig);
}

static void install_segv_handler(void) {
    if (!g_page) g_page = (size_t)sysconf(_SC_PAGESIZE);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &g_prev_segv);
}

/* Called once when the core loads this backend: the handler is installed only
 * in processes that use the strict device. */
static int st_device_count(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, install_segv_handler);
    (void)memory_only(); /* its notice, from the loading thread */
    return 1;
}

static pl_status st_mem_info(int device, size_t *free_b, size_t *total_b) {
    (void)device;
    const char *bad;
    size_t cap = capacity_bytes(&bad);
    if (cap) { /* a card of that size: what is not mapped is free */
        size_t mapped = atomic_load_explicit(&c_mapped_bytes, memory_order_relaxed);
        *total_b = cap;
        *free_b = mapped < cap ? cap - mapped : 0;
        return PL_OK;
    }
    const pl_backend *cpu = pl_backend_cpu(); /* the cpu plugin, through the registry */
    return cpu ? cpu->mem_info(0, free_b, total_b) : pl_error_status();
}

/* fill_random: the host's draw (kernel_math.h pl_init_draw) written into the
 * device block, rounded to the tensor's dtype as a host-to-device copy of
 * f32 values would be: the same values as the core's host path, bit for bit. */
static pl_status st_fill_random(pl_tensor *t, int normal, double a, double b, uint64_t seed,
                                uint64_t stream) {
    void *d = pl_tensor_data(t);
    int64_t n = pl_tensor_numel(t);
    if (tl_cap) return violation("fill_random", pl_tensor_nbytes(t));
    count(&c_kernels, NULL, 0);
    if (memory_only()) return PL_OK;
    pl_status s = open_side(d, t->device, true, "fill_random destination");
    if (s) return s;
    int dt = t->dtype;
    int64_t ng = (n + 3) / 4;
#pragma omp parallel for if (n > 65536) schedule(static)
    for (int64_t g = 0; g < ng; g++) {
        float v[4];
        pl_init_draw((uint64_t)g, seed, stream, normal, a, b, v);
        for (int k = 0; k < 4 && g * 4 + k < n; k++) {
            int64_t i = g * 4 + k;
            if (dt == PL_F32) ((float *)d)[i] = v[k];
            else if (dt == PL_BF16) ((uint16_t *)d)[i] = pl_bf16_round(v[k]);
            else ((uint16_t *)d)[i] = pl_f16_round(v[k]);
        }
    }
    return open_side(d, t->device, false, "fill_random destination");
}

/* ---- device_stats: the stand-in for NVML's utilization and memory ----------
 * "Utilization" here is the share of wall time spent inside kernels (this
 * device's kernels are the CPU's, run synchronously): what is left is the
 * host's own work between kernels, which a GPU would spend idle waiting for
 * the host's next launch. Memory in use: the bytes mapped as device memory
 * (what the caching allocator reserved); total: the host's memory. The
 * cursor names a snapshot of (busy, wall) taken by the previous call; the
 * value is over the time since that snapshot (n_samples 1), or since the
 * backend was loaded for a first call (cursor 0, n_samples 0). */
#define ST_SNAPS 1024
static struct { uint64_t busy, wall; } g_snap[ST_SNAPS];
static uint64_t g_nsnap, g_t_load;
__attribute__((constructor)) static void st_loaded(void) { g_t_load = now_ns(); }

static pl_status st_device_stats(int device, uint64_t *cursor, pl_device_stats *out) {
    (void)device;
    uint64_t wall = now_ns(), busy = atomic_load_explicit(&c_busy_ns, memory_order_relaxed);
    pthread_mutex_lock(&g_mu);
    uint64_t c = cursor ? *cursor : 0, b0 = 0, w0 = g_t_load;
    bool have = c > 0 && c <= g_nsnap && g_nsnap - c < ST_SNAPS;
    if (have) {
        b0 = g_snap[(c - 1) % ST_SNAPS].busy;
        w0 = g_snap[(c - 1) % ST_SNAPS].wall;
    }
    g_snap[g_nsnap % ST_SNAPS].busy = busy;
    g_snap[g_nsnap % ST_SNAPS].wall = wall;
    g_nsnap++;
    if (cursor) *cursor = g_nsnap;
    pthread_mutex_unlock(&g_mu);
    double u = wall > w0 ? (double)(busy - b0) / (double)(wall - w0) : 0.0;
    size_t fr = 0, tot = 0;
    pl_status st = st_mem_info(0, &fr, &tot);
    *out = (pl_device_stats){.utilization = u < 0 ? 0 : u > 1 ? 1 : u,
                             .n_samples = have ? 1 : 0,
                             .memory_used_bytes = (double)atomic_load_explicit(&c_mapped_bytes,
                                                                                memory_order_relaxed),
                             .memory_total_bytes = st ? NAN : (double)tot};
    if (st) pl_error_clear();
    return PL_OK;
}

/* ---- kernels: the CPU's, with their tensors opened --------------------------- */

/* a multi-tensor call: param, grad, 3 states and a step counter per tensor */
#define MAX_OPEN (2 * (PL_MAX_OP_INPUTS + PL_MAX_OP_OUTPUTS) * 3 + 6 * PL_OPTIM_MULTI_MAX)

typedef struct opened {
    uintptr_t base[MAX_OPEN]; /* blocks opened for this kernel call */
    int n;
} opened;

static pl_status open_tensor(opened *o, const pl_tensor *t, const char *what) {
    if (!t) return PL_OK;
    /* issue 31: a tape stub (an input whose data backward does not read) has
     * no device memory; its data is a PROT_NONE host page, so a kernel that
     * reads it anyway still dies here, as it would on a GPU */
    if (pl_tensor_is_stub(t)) return PL_OK;
    if (t->device.type == PL_DEVICE_CPU) {
        /* on a GPU a kernel cannot read host memory: the op front end (or the
         * stage that built the tensor) should have moved it */
        char b[256];
        return pl_error_set(PL_ERR_DEVICE, "strict device: %s %s is on the cpu", what,
                            pl_tensor_describe(t, b, sizeof b));
    }
    if (o->n == MAX_OPEN) return pl_error_set(PL_ERR_INTERNAL, "strict device: too many tensors");
    /* opens are counted per block: a block shared by several tensors of this
     * call is simply opened (and later closed) once per tensor */
    pl_status s = open_block(t->storage->data, true, what, &o->base[o->n]);
    if (s) return pl_error_prefix(s, "tensor '%s'", t->name);
    o->n++;
    if (t->dtype == PL_NF4) {
        if ((s = open_tensor(o, t->quant.absmax, what))) return s;
        if ((s = open_tensor(o, t->quant.absmax_scale, what))) return s;
    }
    return PL_OK;
}

static void close_all(opened *o) {
    for (int i = o->n - 1; i >= 0; i--)
        open_block((const void *)o->base[i], false, "kernel tensor", NULL);
    o->n = 0;
}

/* ---- half inputs: the CUDA backend's set, widened in host memory ----------
 * The CUDA kernels of these ops read and write bf16 / f16 themselves
 * (cuda_backend.cu, cu_half_native), so on a GPU no f32 copy of their half
 * tensors exists in device memory. This device claims the same set, so that
 * its device memory peaks are a GPU's; the CPU kernels it runs compute on
 * f32, so the copies are made here in host memory (the CPU's allocator),
 * which device accounting does not see. Same values as the core's widening
 * (half_io.c): a cast to f32, the f32 kernel, one rounding of the outputs. */
static bool st_half_native(const pl_kernel_args *a, bool backward) {
    (void)backward;
    return pl_gpu_half_native_op(a->op);
}

static bool is_half(const pl_tensor *t) {
    return t && !pl_tensor_is_stub(t) && (t->dtype == PL_BF16 || t->dtype == PL_F16);
}

static pl_status cast_into(pl_tensor *src, pl_tensor *dst) {
    pl_kernel_fn cast = pl_backend_kernel(pl_backend_cpu(), PL_OP_CAST, false);
    if (!cast) return pl_error_set(PL_ERR_UNSUPPORTED, "strict device: no CPU cast kernel");
    pl_kernel_args k = {.op = PL_OP_CAST, .n_in = 1, .n_out = 1};
    k.p.dtype = dst->dtype;
    k.in[0] = src;
    k.out[0] = dst;
    return cast(&k);
}

/* f runs on a copy of *a whose half tensors are host f32 copies (the blocks
 * are open); the outputs are rounded back into the device tensors. */
static pl_status run_widened(pl_kernel_fn f, const pl_kernel_args *a) {
    pl_kernel_args k = *a;
    pl_tensor *tin[PL_MAX_OP_INPUTS] = {0}, *tout[PL_MAX_OP_OUTPUTS] = {0};
    pl_status s = PL_OK;
    for (int i = 0; i < a->n_in && !s; i++) {
        if (!is_half(a->in[i])) continue;
        pl_tensor *x = a->in[i];
        if (!(tin[i] = pl_tensor_empty_owned(PL_F32, x->ndim, x->shape, PL_CPU)))
            s = pl_error_status() ? pl_error_status() : PL_ERR_NOMEM;
        else if (!(s = cast_into(x, tin[i])))
            k.in[i] = tin[i];
    }
    for (int i = 0; i < a->n_out && !s; i++) {
        if (!is_half(a->out[i])) continue;
        const pl_tensor *o = a->out[i];
        if (!(tout[i] = pl_tensor_empty_owned(PL_F32, o->ndim, o->shape, PL_CPU)))
            s = pl_error_status() ? pl_error_status() : PL_ERR_NOMEM;
        else
            k.out[i] = tout[i];
    }
    if (!s) s = f(&k);
    for (int i = 0; i < a->n_out && !s; i++)
        if (tout[i]) s = cast_into(tout[i], a->out[i]);
    for (int i = 0; i < a->n_in; i++) pl_tensor_release(tin[i]);
    for (int i = 0; i < a->n_out; i++) pl_tensor_release(tout[i]);
    return s;
}

static bool any_half(const pl_kernel_args *a) {
    for (int i = 0; i < a->n_in; i++)
        if (is_half(a->in[i])) return true;
    for (int i = 0; i < a->n_out; i++)
        if (is_half(a->out[i])) return true;
    return false;
}

/* Kernel f on a (one kernel call), its tensors opened. */
static pl_status run_kernel(pl_kernel_fn f, const pl_kernel_args *a, bool backward) {
    count(&c_kernels, NULL, 0);
    if (memory_only()) return PL_OK;
    opened o = {.n = 0};
    pl_status s = PL_OK;
    for (int i = 0; i < a->n_in && !s; i++)
        s = open_tensor(&o, a->in[i], "kernel input");
    for (int i = 0; i < a->n_out && !s; i++)
        s = open_tensor(&o, a->out[i], "kernel output");
    /* a captured graph's dropout reads its counter offset (graph.h); so
     * does lora_add's (pl_lora_add_dropout), forward and backward */
    if (!s && (a->op == PL_OP_DROPOUT || a->op == PL_OP_LORA_ADD) && a->p.extra)
        s = open_tensor(&o, a->p.extra, "dropout counter offset");
    /* a multi-tensor optimizer call: its tensor list (optim_math.h) */
    if (!s && pl_op_has_multi_list(a->op) && a->p.extra) {
        const pl_optim_multi *m = a->p.extra;
        for (int i = 0; i < m->n && !s; i++) {
            s = open_tensor(&o, m->param[i], "kernel output");
            if (!s) s = open_tensor(&o, m->grad[i], "kernel input");
            for (int k = 0; k < 3 && !s; k++) s = open_tensor(&o, m->state[k][i], "kernel output");
            if (!s && pl_optim_multi_counted(a->op)) s = open_tensor(&o, m->count[i], "kernel output");
        }
    }
    if (!s) {
        uint64_t t0 = now_ns();
        const pl_backend *cpu = pl_backend_cpu();
        bool cpu_native = cpu && PL_BACKEND_HAS(cpu, half_native) && cpu->half_native &&
                          cpu->half_native(a, backward);
        s = st_half_native(a, backward) && !cpu_native && any_half(a) ? run_widened(f, a) : f(a);
        atomic_fetch_add_explicit(&c_busy_ns, now_ns() - t0, memory_order_relaxed);
    }
    close_all(&o);
    return s;
}

static pl_status run_cpu(const pl_kernel_args *a, bool backward) {
    pl_kernel_fn f = pl_backend_kernel(pl_backend_cpu(), a->op, backward);
    if (!f)
        return pl_error_set(PL_ERR_UNSUPPORTED, "strict device: no CPU kernel for %s %s",
                            pl_op_name(a->op), backward ? "backward" : "forward");
    return run_kernel(f, a, backward);
}

static pl_status rec_kernel(const pl_kernel_args *a, bool backward);

static pl_status st_forward(const pl_kernel_args *a) {
    return tl_cap ? rec_kernel(a, false) : run_cpu(a, false);
}
static pl_status st_backward(const pl_kernel_args *a) {
    return tl_cap ? rec_kernel(a, true) : run_cpu(a, true);
}

/* ---- graph capture: the recording -------------------------------------------
 * Each recorded kernel call is a deep copy of its pl_kernel_args: every
 * tensor descriptor (shape, strides, offset, dtype) with a storage of its
 * own holding the same data pointer, an nf4 tensor's quantization state
 * too, and the parameters by value, as a GPU graph bakes a launch's
 * arguments. p.extra is a host pointer a replay could not follow: only the
 * graph-aware forms are accepted (dropout's and lora_add's device offset tensor, copied
 * like the others; the optimizer ops then pass none, and the multi-tensor
 * ones their tensor list, copied by value with its tensors). A replay runs the
 * list in order with the CPU's kernels (run_cpu: the blocks are opened as
 * for any kernel, so a block freed since the capture is an error naming the
 * tensor). */

struct st_graph {
    rec *r;
    size_t n, cap;
    void **owned; /* tensor and storage copies, freed with the graph */
    size_t n_owned, cap_owned;
    bool oom;
};

static void *gown(st_graph *g, size_t nb) {
    if (g->n_owned == g->cap_owned) {
        size_t nc = g->cap_owned ? 2 * g->cap_owned : 256;
        void **no = realloc(g->owned, nc * sizeof *no);
        if (!no) return NULL;
        g->owned = no;
        g->cap_owned = nc;
    }
    void *p = calloc(1, nb);
    if (p) g->owned[g->n_owned++] = p;
    return p;
}

static pl_tensor *dup_tensor(st_graph *g, const pl_tensor *t) {
    if (!t) return NULL;
    pl_tensor *c = gown(g, sizeof *c);
    if (!c) return NULL;
    *c = *t;
    c->grad = NULL;
    c->grad_fn = NULL;
    c->refcount = 1;
    if (t->storage && !pl_tensor_is_stub(t)) { /* a stub keeps the core's guard storage */
        pl_storage *st = gown(g, sizeof *st);
        if (!st) return NULL;
        *st = *t->storage;
        st->refcount = 1;
        st->external = true;
        st->external_free = NULL;
        c->storage = st;
    }
    if (t->dtype == PL_NF4) {
        c->quant.absmax = t->quant.absmax ? dup_tensor(g, t->quant.absmax) : NULL;
        c->quant.absmax_scale = t->quant.absmax_scale ? dup_tensor(g, t->quant.absmax_scale) : NULL;
        if ((t->quant.absmax && !c->quant.absmax) || (t->quant.absmax_scale && !c->quant.absmax_scale))
            return NULL;
    }
    return c;
}

static rec *rec_push(st_graph *g) {
    if (g->n == g->cap) {
        size_t nc = g->cap ? 2 * g->cap : 256;
        rec *nr = realloc(g->r, nc * sizeof *nr);
        if (!nr) return NULL;
        g->r = nr;
        g->cap = nc;
    }
    rec *r = &g->r[g->n++];
    memset(r, 0, sizeof *r);
    return r;
}

static pl_status rec_oom(void) {
    pl_status s = pl_error_set(PL_ERR_NOMEM, "strict device: recording a graph");
    if (!tl_cap_err) {
        tl_cap_err = s;
        snprintf(tl_cap_msg, sizeof tl_cap_msg, "%s", pl_error_message());
    }
    return s;
}

static pl_status rec_kernel(const pl_kernel_args *a, bool backward) {
    st_graph *g = tl_cap;
    if (a->p.extra && a->op != PL_OP_DROPOUT && a->op != PL_OP_LORA_ADD &&
        !pl_op_has_multi_list(a->op)) {
        char msg[160];
        snprintf(msg, sizeof msg, "op %s %s with a host pointer in p.extra (baked at capture)",
                 pl_op_name(a->op), backward ? "backward" : "forward");
        return violation(msg, 0);
    }
    rec *r = rec_push(g);
    if (!r) return rec_oom();
    r->kind = REC_KERNEL;
    r->backward = backward;
    r->a = *a;
    for (int i = 0; i < a->n_in; i++)
        if (a->in[i] && !(r->a.in[i] = dup_tensor(g, a->in[i]))) return rec_oom();
    for (int i = 0; i < a->n_out; i++)
        if (a->out[i] && !(r->a.out[i] = dup_tensor(g, a->out[i]))) return rec_oom();
    if (a->p.extra && pl_op_has_multi_list(a->op)) {
        /* the list by value, as a GPU launch bakes its tensor-list argument
         * (the coefficients then come from in[1], the graph's table) */
        const pl_optim_multi *m = a->p.extra;
        pl_optim_multi *c = gown(g, sizeof *c);
        if (!c) return rec_oom();
        *c = *m;
        for (int i = 0; i < m->n; i++) {
            if ((m->param[i] && !(c->param[i] = dup_tensor(g, m->param[i]))) ||
                !(c->grad[i] = dup_tensor(g, m->grad[i])))
                return rec_oom();
            for (int k = 0; k < 3; k++)
                if (m->state[k][i] && !(c->state[k][i] = dup_tensor(g, m->state[k][i])))
                    return rec_oom();
            if (!pl_optim_multi_counted(a->op)) c->count[i] = NULL;
            else if (m->count[i] && !(c->count[i] = dup_tensor(g, m->count[i]))) return rec_oom();
        }
        r->a.p.extra = c;
    } else if (a->p.extra && !(r->a.p.extra = dup_tensor(g, a->p.extra))) {
        return rec_oom();
    }
    return PL_OK;
}

static pl_status rec_copy(void *dst, const void *src, size_t n) {
    rec *r = rec_push(tl_cap);
    if (!r) return rec_oom();
    *r = (rec){.kind = REC_COPY, .dst = dst, .src = src, .n = n};
    return PL_OK;
}

static pl_status rec_memset(void *dst, int v, size_t n) {
    rec *r = rec_push(tl_cap);
    if (!r) return rec_oom();
    *r = (rec){.kind = REC_MEMSET, .dst = dst, .v = v, .n = n};
    return PL_OK;
}

static void graph_free(st_graph *g) {
    if (!g) return;
    for (size_t i = 0; i < g->n_owned; i++) free(g->owned[i]);
    free(g->owned);
    free(g->r);
    free(g);
}

static pl_status st_capture_begin(int device) {
    (void)device;
    if (tl_cap) return pl_error_set(PL_ERR_INVALID, "strict device: this thread is already capturing");
    st_graph *g = calloc(1, sizeof *g);
    if (!g) return pl_error_set(PL_ERR_NOMEM, "strict device: capture_begin");
    tl_cap_err = PL_OK;
    tl_cap_msg[0] = 0;
    tl_cap = g;
    return PL_OK;
}

static pl_status st_capture_end(int device, void **graph) {
    (void)device;
    *graph = NULL;
    st_graph *g = tl_cap;
    if (!g) return pl_error_set(PL_ERR_INVALID, "strict device: capture_end without capture_begin");
    tl_cap = NULL;
    if (tl_cap_err) {
        graph_free(g);
        pl_status s = pl_error_set(tl_cap_err, "%s", tl_cap_msg);
        tl_cap_err = PL_OK;
        return s;
    }
    *graph = g;
    return PL_OK;
}

/* capture_end with the step's released blocks: the fusion pass
 * (strict_fuse.c) over the recorded calls. */
static pl_status st_capture_end_step(int device, pl_step_facts *facts, void **graph) {
    pl_status s = st_capture_end(device, graph);
    if (s || !facts || atomic_load(&g_no_fuse)) return s;
    st_graph *g = *graph;
    st_fuse_step(g->r, g->n, facts);
    return PL_OK;
}

static pl_status st_graph_replay(void *graph) {
    st_graph *g = graph;
    if (!g) return pl_error_set(PL_ERR_INVALID, "strict device: replay of no graph");
    if (tl_cap) return violation("a graph replay", 0);
    for (size_t i = 0; i < g->n; i++) {
        rec *r = &g->r[i];
        if (r->kind == REC_NONE) continue; /* taken into a fused call */
        pl_status s = r->kind == REC_KERNEL  ? run_cpu(&r->a, r->backward)
                      : r->kind == REC_FUSED ? run_kernel(r->fused, &r->a, false)
                      : r->kind == REC_COPY ? st_memcpy(r->dst, (pl_device){PL_DEVICE_CUDA, 0}, r->src,
                                                       (pl_device){PL_DEVICE_CUDA, 0}, r->n)
                                            : st_memset(r->dst, (pl_device){PL_DEVICE_CUDA, 0}, r->v, r->n);
        if (s) return pl_error_prefix(s, "strict device: graph replay, call %zu of %zu", i + 1, g->n);
    }
    return PL_OK;
}

static void st_graph_release(void *graph) { graph_free(graph); }

static pl_kernel_fn st_kernel(pl_op op, bool backward) {
    if (!pl_backend_kernel(pl_backend_cpu(), op, backward)) return NULL;
    return backward ? st_backward : st_forward;
}

static const pl_backend g_strict = {
    .struct_size = PL_BACKEND_STRUCT_SIZE,
    .name = "strict",
    .type = PL_DEVICE_CUDA,
    .device_count = st_device_count,
    .raw_alloc = st_raw_alloc,
    .raw_free = st_raw_free,
    .memcpy = st_memcpy,
    .memset = st_memset,
    .synchronize = st_sync,
    .mem_info = st_mem_info,
    .host_alloc_pinned = st_host_alloc,
    .host_free_pinned = st_host_free,
    .kernel = st_kernel,
    .memcpy_h2d_background = st_memcpy_h2d_background,
    .set_option = st_set_option,
    .counters = st_counters,
    .device_stats = st_device_stats,
    .fill_random = st_fill_random,
    .capture_begin = st_capture_begin,
    .capture_end = st_capture_end,
    .graph_replay = st_graph_replay,
    .graph_release = st_graph_release,
    .half_native = st_half_native,
    .capture_end_step = st_capture_end_step,
};

static const pl_option_spec g_strict_opts[] = {PL_OPTIONS_END};

PL_PLUGIN_DEFINE(strict, PL_KIND_BACKEND, "0.1.0",
                 "strict device emulation: GPU-like memory the host cannot touch, CPU kernels",
                 g_strict_opts, &g_strict)
