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
 * into storage->data, which is a block base).
 *
 * Kernels: the CPU backend's own kernels (which run the shared math of
 * backend_util.h / kernel_math.h), called with every tensor they receive
 * (inputs, outputs, an nf4 tensor's quantization state) opened. Results are
 * therefore the CPU's, bit for bit. A kernel's scratch comes from PL_CPU.
 *
 * What it cannot catch: a host access to a block that another thread has
 * open at that moment (the window of one kernel). Device memory is ordinary
 * host memory underneath, so mem_info reports the host's.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <execinfo.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "pipeline/backend.h"
#include "pipeline/backend_util.h"
#include "pipeline/plugin.h"
#include "pipeline/status.h"
#include "pipeline/tensor.h"

/* ---- the block table ----------------------------------------------------- */

typedef struct block {
    uintptr_t base;
    size_t len;   /* bytes mapped (whole pages) */
    int opens;    /* > 0: PROT_READ|PROT_WRITE */
    bool used;
} block;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static block *g_blocks;     /* open addressing on base, linear probing */
static size_t g_cap, g_n;   /* slots (power of two), live blocks */
static size_t g_page;

static size_t slot_of(uintptr_t base, size_t cap) {
    uint64_t h = (uint64_t)base * 0x9E3779B97F4A7C15ull;
    return (size_t)(h >> 17) & (cap - 1);
}

/* Caller holds g_mu. */
static block *find(uintptr_t base) {
    if (!g_cap) return NULL;
    for (size_t i = slot_of(base, g_cap), k = 0; k < g_cap; k++, i = (i + 1) & (g_cap - 1)) {
        if (!g_blocks[i].used) return NULL;
        if (g_blocks[i].base == base) return &g_blocks[i];
    }
    return NULL;
}

/* Caller holds g_mu. Backward-shift deletion keeps probe chains intact. */
static void erase(block *b) {
    size_t i = (size_t)(b - g_blocks);
    g_blocks[i].used = false;
    for (size_t j = (i + 1) & (g_cap - 1); g_blocks[j].used; j = (j + 1) & (g_cap - 1)) {
        size_t home = slot_of(g_blocks[j].base, g_cap);
        /* move j into the hole i when its home is not in (i, j] (cyclically) */
        bool in_range = i <= j ? (home > i && home <= j) : (home > i || home <= j);
        if (!in_range) {
            g_blocks[i] = g_blocks[j];
            g_blocks[j].used = false;
            i = j;
        }
    }
    g_n--;
}

/* Caller holds g_mu. */
static bool insert(uintptr_t base, size_t len) {
    if ((g_n + 1) * 2 > g_cap) {
        size_t nc = g_cap ? g_cap * 2 : 1024;
        block *nb = calloc(nc, sizeof *nb);
        if (!nb) return false;
        for (size_t i = 0; i < g_cap; i++) {
            if (!g_blocks[i].used) continue;
            size_t s = slot_of(g_blocks[i].base, nc);
            while (nb[s].used) s = (s + 1) & (nc - 1);
            nb[s] = g_blocks[i];
        }
        free(g_blocks);
        g_blocks = nb;
        g_cap = nc;
    }
    size_t s = slot_of(base, g_cap);
    while (g_blocks[s].used) s = (s + 1) & (g_cap - 1);
    g_blocks[s] = (block){.base = base, .len = len, .opens = 0, .used = true};
    g_n++;
    return true;
}

static void *st_raw_alloc(int device, size_t n) {
    (void)device;
    if (!g_page) g_page = (size_t)sysconf(_SC_PAGESIZE);
    size_t len = ((n ? n : 1) + g_page - 1) / g_page * g_page;
    void *p = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
    pthread_mutex_lock(&g_mu);
    bool ok = insert((uintptr_t)p, len);
    pthread_mutex_unlock(&g_mu);
    if (!ok) {
        munmap(p, len);
        return NULL;
    }
    return p;
}

static void st_raw_free(int device, void *p) {
    (void)device;
    if (!p) return;
    pthread_mutex_lock(&g_mu);
    block *b = find((uintptr_t)p);
    size_t len = b ? b->len : 0;
    if (b) erase(b);
    pthread_mutex_unlock(&g_mu);
    if (len) munmap(p, len);
}

/* Open (or close) the block whose base is `base`. NULL base: nothing. A base
 * that is no block of ours is an error: the pointer is not device memory. */
static pl_status open_block(const void *base, bool open, const char *what) {
    if (!base) return PL_OK;
    pthread_mutex_lock(&g_mu);
    block *b = find((uintptr_t)base);
    if (!b) {
        pthread_mutex_unlock(&g_mu);
        return pl_error_set(PL_ERR_DEVICE,
                            "strict device: %s at %p is not strict device memory (a host "
                            "pointer handed to a device kernel or copy)",
                            what, base);
    }
    int rc = 0;
    if (open && b->opens++ == 0)
        rc = mprotect((void *)b->base, b->len, PROT_READ | PROT_WRITE);
    else if (!open && --b->opens == 0)
        rc = mprotect((void *)b->base, b->len, PROT_NONE);
    pthread_mutex_unlock(&g_mu);
    if (rc) return pl_error_set(PL_ERR_DEVICE, "strict device: mprotect: %s", strerror(errno));
    return PL_OK;
}

/* The block base and byte offset of a device pointer inside it (the copy
 * functions get tensor data pointers, which may be views into a block).
 * Found by scanning back page by page to a known base: views start inside
 * their storage's first pages in practice, and a miss is reported. */
static const void *base_of(const void *p) {
    uintptr_t a = (uintptr_t)p & ~(uintptr_t)(g_page - 1);
    pthread_mutex_lock(&g_mu);
    for (int k = 0; k < (1 << 20) && a; k++, a -= g_page) {
        block *b = find(a);
        if (b) {
            bool inside = (uintptr_t)p < b->base + b->len;
            pthread_mutex_unlock(&g_mu);
            return inside ? (const void *)a : NULL;
        }
    }
    pthread_mutex_unlock(&g_mu);
    return NULL;
}

/* ---- transfers ------------------------------------------------------------- */

static pl_status open_ptr(const void *p, pl_device d, bool open, const void **base,
                          const char *what) {
    *base = NULL;
    if (d.type == PL_DEVICE_CPU || !p) return PL_OK;
    *base = base_of(p);
    if (!*base)
        return pl_error_set(PL_ERR_DEVICE, "strict device: %s %p is not strict device memory",
                            what, p);
    return open_block(*base, open, what);
}

static pl_status st_memcpy(void *dst, pl_device dd, const void *src, pl_device sd, size_t n) {
    if (!n) return PL_OK;
    const void *bd = NULL, *bs = NULL;
    pl_status s = open_ptr(dst, dd, true, &bd, "copy destination");
    if (s) return s;
    s = open_ptr(src, sd, true, &bs, "copy source");
    if (!s) memmove(dst, src, n);
    if (bs) open_block(bs, false, "copy source");
    if (bd) open_block(bd, false, "copy destination");
    return s;
}

/* "Pinned" host memory is ordinary host memory here (the host may touch it,
 * as it may touch cudaHostAlloc'd memory); it exercises the callers' pinned
 * staging paths. */
static void *st_host_alloc(size_t n) { return aligned_alloc(64, (n + 63) & ~(size_t)63); }
static void st_host_free(void *p) { free(p); }

/* allow_tf32 is accepted and has no effect (the CPU's kernels compute in f32). */
static pl_status st_set_option(const char *key, const char *value) {
    (void)value;
    if (!strcmp(key, "allow_tf32")) return PL_OK;
    return pl_error_set(PL_ERR_UNSUPPORTED, "strict backend: no setting '%s'", key);
}

/* Synchronous here: every kernel has completed when it is issued. */
static pl_status st_memcpy_h2d_background(void *dst, pl_device dd, const void *src, size_t n) {
    return st_memcpy(dst, dd, src, PL_CPU, n);
}

static pl_status st_memset(void *dst, pl_device dev, int v, size_t n) {
    if (!n) return PL_OK;
    const void *b = NULL;
    pl_status s = open_ptr(dst, dev, true, &b, "memset destination");
    if (s) return s;
    memset(dst, v, n);
    return open_block(b, false, "memset destination");
}

static pl_status st_sync(int device) {
    (void)device;
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
        for (uintptr_t p = a & ~(uintptr_t)(g_page - 1), k = 0; k < 4096 && p; k++, p -= g_page) {
            block *b = find(p);
            if (b) {
                ours = a < b->base + b->len;
                break;
            }
        }
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
    return 1;
}

static pl_status st_mem_info(int device, size_t *free_b, size_t *total_b) {
    (void)device;
    return pl_backend_cpu()->mem_info(0, free_b, total_b);
}

/* ---- kernels: the CPU's, with their tensors opened --------------------------- */

#define MAX_OPEN (2 * (PL_MAX_OP_INPUTS + PL_MAX_OP_OUTPUTS) * 3)

typedef struct opened {
    const void *base[MAX_OPEN];
    int n;
} opened;

static pl_status open_tensor(opened *o, const pl_tensor *t, const char *what) {
    if (!t || !t->storage || t->device.type == PL_DEVICE_CPU) {
        /* a host tensor reaching a device kernel: the op front end should
         * have refused mixed devices; the CPU kernel will simply read it */
        return PL_OK;
    }
    const void *base = t->storage->data;
    for (int i = 0; i < o->n; i++)
        if (o->base[i] == base) return PL_OK;
    if (o->n == MAX_OPEN) return pl_error_set(PL_ERR_INTERNAL, "strict device: too many tensors");
    pl_status s = open_block(base, true, what);
    if (s) return pl_error_prefix(s, "tensor '%s'", t->name);
    o->base[o->n++] = base;
    if (t->dtype == PL_NF4) {
        if ((s = open_tensor(o, t->quant.absmax, what))) return s;
        if ((s = open_tensor(o, t->quant.absmax_scale, what))) return s;
    }
    return PL_OK;
}

static void close_all(opened *o) {
    for (int i = o->n - 1; i >= 0; i--)
        open_block(o->base[i], false, "kernel tensor");
    o->n = 0;
}

static pl_status run_cpu(const pl_kernel_args *a, bool backward) {
    pl_kernel_fn f = pl_backend_kernel(pl_backend_cpu(), a->op, backward);
    if (!f)
        return pl_error_set(PL_ERR_UNSUPPORTED, "strict device: no CPU kernel for %s %s",
                            pl_op_name(a->op), backward ? "backward" : "forward");
    opened o = {.n = 0};
    pl_status s = PL_OK;
    for (int i = 0; i < a->n_in && !s; i++)
        s = open_tensor(&o, a->in[i], "kernel input");
    for (int i = 0; i < a->n_out && !s; i++)
        s = open_tensor(&o, a->out[i], "kernel output");
    if (!s) s = f(a);
    close_all(&o);
    return s;
}

static pl_status st_forward(const pl_kernel_args *a) { return run_cpu(a, false); }
static pl_status st_backward(const pl_kernel_args *a) { return run_cpu(a, true); }

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
};

static const pl_option_spec g_strict_opts[] = {PL_OPTIONS_END};

PL_PLUGIN_DEFINE(strict, PL_KIND_BACKEND, "0.1.0",
                 "strict device emulation: GPU-like memory the host cannot touch, CPU kernels",
                 g_strict_opts, &g_strict)
