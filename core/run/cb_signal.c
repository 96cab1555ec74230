/* cb_signal.c - SIGINT / SIGTERM as a callback (Lightning's graceful
 * interrupt). The first signal is noted; at the next optimizer-step
 * boundary the callback writes `last` (mid-epoch: --resume last continues
 * at the next batch) and marks the run interrupted, which ends the fit;
 * pl_trainer_run then writes summary.json with status "interrupted", skips
 * test and export, and the process exits 128 + the signal (130, 143). A
 * second signal aborts at once (the default action). Data parallel: every
 * rank acts on the signal the ranks agreed on with the step's loss
 * (t->peer_signal), so all stop at the same step. */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "callback.h"

static volatile sig_atomic_t g_signal;
/* set once an interrupted run has written its summary: there is nothing left
 * to abort, so a later signal is ignored while the process exits 128 + sig
 * (a second signal that landed after the save used to kill it, reporting an
 * abort of a run that had saved everything) */
static volatile sig_atomic_t g_saved;
static struct sigaction g_prev_int, g_prev_term;

static void on_signal(int sig) {
    if (g_signal) {
        if (g_saved) return;
        /* second signal: give up at once */
        sigaction(SIGINT, &g_prev_int, NULL);
        sigaction(SIGTERM, &g_prev_term, NULL);
        signal(sig, SIG_DFL);
        raise(sig);
        return;
    }
    g_signal = sig;
    static const char msg[] = "\ninterrupted: finishing this step, then saving the last "
                              "checkpoint and summary (again to abort now)\n";
    ssize_t w = write(STDERR_FILENO, msg, sizeof msg - 1);
    (void)w;
}

void tr_signals_install(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    g_signal = 0;
    g_saved = 0;
    sigaction(SIGINT, &sa, &g_prev_int);
    sigaction(SIGTERM, &sa, &g_prev_term);
}

void tr_signals_restore(void) {
    if (g_saved) return;
    sigaction(SIGINT, &g_prev_int, NULL);
    sigaction(SIGTERM, &g_prev_term, NULL);
}

int tr_signal_pending(void) { return (int)g_signal; }

void tr_signals_mark_saved(void) { g_saved = 1; }

static pl_status signal_step_boundary(void *self, trainer *t, const tr_step_info *s) {
    (void)self;
    (void)s;
    if (t->max_steps >= 0 && t->step >= t->max_steps) return PL_OK; /* the fit ends here anyway */
    int sig = t->world > 1 ? t->peer_signal : (int)g_signal;
    if (!sig) return PL_OK;
    /* at an optimizer-step boundary: last records the next batch */
    pl_status st = tr_sv_flush(t);
    if (st) return st;
    t->interrupted = sig;
    if (t->tty) printf("\n");
    tr_log(t, "interrupted (signal %d) at epoch %lld batch %lld, step %lld: saving %s\n", sig,
           (long long)t->epoch, (long long)t->batch, (long long)t->step, t->last_path);
    return tr_save_checkpoint(t, t->last_path);
}

static tr_callback signal_cb = {.struct_size = sizeof(tr_callback), .name = "signals",
                                .on_step_boundary = signal_step_boundary};

pl_status tr_cb_signal_create(trainer *t, tr_callback **out) {
    (void)t;
    *out = &signal_cb;
    return PL_OK;
}
