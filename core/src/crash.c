/* crash.c - see crash.h. */
#define _GNU_SOURCE
#include "crash.h"

#include <dlfcn.h>
#include <execinfo.h>
#include <pthread.h>
#include <stdint.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <ucontext.h>
#include <unistd.h>

#define MAX_CTX 8
static _Thread_local char tl_ctx[MAX_CTX][256];
static _Thread_local int tl_depth;

void pl_crash_context_push(const char *fmt, ...) {
    if (tl_depth < MAX_CTX) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(tl_ctx[tl_depth], sizeof tl_ctx[0], fmt, ap);
        va_end(ap);
    }
    tl_depth++;
}

void pl_crash_context_pop(void) {
    if (tl_depth > 0) tl_depth--;
}

/* ---- mapped files ---------------------------------------------------------
 * Writers take g_map_lock; the handler reads without it. A slot is claimed
 * by setting `base` last (release) and freed by clearing it first, so a
 * reader that sees a base sees its size and path (a slot reused while the
 * handler runs could name the wrong file: a crash message, never a
 * crash). */
#define MAP_SLOTS 256
static struct map_slot {
    uintptr_t base; /* 0: free */
    size_t size;
    char path[512];
} g_maps[MAP_SLOTS];
static pthread_mutex_t g_map_lock = PTHREAD_MUTEX_INITIALIZER;

void pl_crash_map_register(const void *base, size_t size, const char *path) {
    if (!base || !size) return;
    pthread_mutex_lock(&g_map_lock);
    for (int i = 0; i < MAP_SLOTS; i++)
        if (!__atomic_load_n(&g_maps[i].base, __ATOMIC_RELAXED)) {
            g_maps[i].size = size;
            snprintf(g_maps[i].path, sizeof g_maps[i].path, "%s", path ? path : "?");
            __atomic_store_n(&g_maps[i].base, (uintptr_t)base, __ATOMIC_RELEASE);
            break;
        }
    pthread_mutex_unlock(&g_map_lock);
}

void pl_crash_map_unregister(const void *base) {
    if (!base) return;
    pthread_mutex_lock(&g_map_lock);
    for (int i = 0; i < MAP_SLOTS; i++)
        if (__atomic_load_n(&g_maps[i].base, __ATOMIC_RELAXED) == (uintptr_t)base) {
            __atomic_store_n(&g_maps[i].base, 0, __ATOMIC_RELEASE);
            break;
        }
    pthread_mutex_unlock(&g_map_lock);
}

_Bool pl_crash_map_lookup(const void *addr, char *buf, size_t n, size_t *offset) {
    uintptr_t a = (uintptr_t)addr;
    for (int i = 0; i < MAP_SLOTS; i++) {
        uintptr_t b = __atomic_load_n(&g_maps[i].base, __ATOMIC_ACQUIRE);
        if (!b || a < b || a - b >= g_maps[i].size) continue;
        if (buf && n) { /* strncpy-like, async-signal-safe */
            size_t k = 0;
            for (; k + 1 < n && g_maps[i].path[k]; k++) buf[k] = g_maps[i].path[k];
            buf[k] = 0;
        }
        if (offset) *offset = (size_t)(a - b);
        return 1;
    }
    return 0;
}

static const int k_signals[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};
#define N_SIG ((int)(sizeof k_signals / sizeof k_signals[0]))
static struct sigaction g_prev[N_SIG];
static volatile sig_atomic_t g_in_handler;

static void put(const char *s) {
    ssize_t w = write(STDERR_FILENO, s, strlen(s));
    (void)w;
}

static void *fault_pc(void *uctx) {
#if defined(__x86_64__)
    return uctx ? (void *)((ucontext_t *)uctx)->uc_mcontext.gregs[REG_RIP] : NULL;
#elif defined(__aarch64__)
    return uctx ? (void *)((ucontext_t *)uctx)->uc_mcontext.pc : NULL;
#else
    (void)uctx;
    return NULL;
#endif
}

static void on_fatal(int sig, siginfo_t *si, void *uctx) {
    int k = 0;
    while (k < N_SIG && k_signals[k] != sig) k++;
    if (!g_in_handler) {
        g_in_handler = 1;
        char line[640];
        snprintf(line, sizeof line, "\npipeline: fatal signal %d (%s)", sig, strsignal(sig));
        put(line);
        if (tl_depth > 0) {
            int d = tl_depth <= MAX_CTX ? tl_depth - 1 : MAX_CTX - 1;
            snprintf(line, sizeof line, " while %s", tl_ctx[d]);
            put(line);
        }
        put("\n");
        Dl_info di;
        void *pc = fault_pc(uctx);
        if (pc && dladdr(pc, &di) && di.dli_fname) {
            snprintf(line, sizeof line, "  faulting code in %s%s%s\n", di.dli_fname,
                     di.dli_sname ? ", function " : "", di.dli_sname ? di.dli_sname : "");
            put(line);
        }
        if ((sig == SIGSEGV || sig == SIGBUS) && si) {
            snprintf(line, sizeof line, "  at address %p\n", si->si_addr);
            put(line);
            char mpath[512];
            size_t moff = 0;
            if (pl_crash_map_lookup(si->si_addr, mpath, sizeof mpath, &moff)) {
                put("  the address is inside the memory-mapped file ");
                put(mpath);
                snprintf(line, sizeof line, " (offset %zu)%s\n", moff,
                         sig == SIGBUS ? ": the file was truncated or rewritten while this "
                                         "process had it mapped; files a run reads (a backbone, "
                                         "a checkpoint) must not change until it ends"
                                       : "");
                put(line);
            }
        }
        put("  call stack:\n");
        void *frames[48];
        int n = backtrace(frames, 48);
        backtrace_symbols_fd(frames, n, STDERR_FILENO);
    }
    /* hand over: the previous handler (a sanitizer's, a strict device's), or the default */
    if (k < N_SIG) sigaction(sig, &g_prev[k], NULL);
    if (k < N_SIG && (g_prev[k].sa_flags & SA_SIGINFO) && g_prev[k].sa_sigaction) {
        g_prev[k].sa_sigaction(sig, si, uctx);
        return;
    }
    if (k < N_SIG && g_prev[k].sa_handler != SIG_DFL && g_prev[k].sa_handler != SIG_IGN) {
        g_prev[k].sa_handler(sig);
        return;
    }
    signal(sig, SIG_DFL);
    raise(sig);
}

void pl_crash_handler_install(void) {
    static int done;
    if (done) return;
    done = 1;
    /* the handler must run even when the stack overflowed */
    static char alt[64 * 1024];
    stack_t ss = {.ss_sp = alt, .ss_size = sizeof alt, .ss_flags = 0};
    sigaltstack(&ss, NULL);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_fatal;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    for (int k = 0; k < N_SIG; k++) sigaction(k_signals[k], &sa, &g_prev[k]);
}
