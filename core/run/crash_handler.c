/* crash_handler.c - the fatal-signal handler (see crash_handler.h): what the
 * core recorded (crash.h: the innermost call into a plugin, the mapped
 * files) printed to stderr, then the signal handed on. */
#define _GNU_SOURCE
#include "crash_handler.h"

#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <ucontext.h>
#include <unistd.h>

#include "crash.h"

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
        const char *ctx = pl_crash_context_top();
        if (ctx) {
            snprintf(line, sizeof line, " while %s", ctx);
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
