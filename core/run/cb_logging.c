/* cb_logging.c - progress and logging as a callback: the progress line,
 * metrics.csv rows of logged steps (step_seconds, train_loss, lr,
 * grad_norm), the epoch's line and rows, the validation line, the epoch's
 * device-memory peaks. The only callback that reads a step's values back
 * from the device: at a logged step (step % log_every_n_steps == 0), through
 * tr_sv_flush, which also replays the NaN policy over the values it reads. */
#include <math.h>
#include <stdio.h>

#include "callback.h"

/* "M:SS" or "H:MM:SS" (as tqdm), "?" when unknown */
static const char *format_duration(char *buf, size_t n, double s) {
    if (!(s >= 0) || s > 1e9) {
        snprintf(buf, n, "?");
        return buf;
    }
    long long x = (long long)(s + 0.5);
    if (x >= 3600)
        snprintf(buf, n, "%lld:%02lld:%02lld", x / 3600, x / 60 % 60, x % 60);
    else
        snprintf(buf, n, "%lld:%02lld", x / 60, x % 60);
    return buf;
}

/* The progress line after batch b of nb (b0: the batch this process started
 * the epoch at, > 0 after a mid-epoch resume). Epochs are 0-based indices,
 * as everywhere (Lightning's convention): "epoch 3/9" is the fourth of ten,
 * 9 the index of the last epoch planned; "batch 5/20" counts the epoch's
 * batches done. On a terminal it is one line refreshed in place; otherwise a
 * line every log_every_n_steps optimizer steps and at the epoch's end. The
 * loss shown is the epoch's running mean as last read (it may lag the steps
 * not read yet). */
static pl_status log_batch_end(void *self, trainer *t, const tr_step_info *s) {
    (void)self;
    int64_t b0 = s->batch0, b = s->batch, nb = s->batches;
    bool show = t->tty || (t->step % t->log_every) == 0 || b + 1 == nb;
    if (!show) return PL_OK;
    double loss = t->ep_loss_n ? t->ep_loss_sum / t->ep_loss_n : NAN;
    double now = tr_now(), el = now - s->epoch_t0;
    double ips = el > 0 ? (double)(b + 1 - b0) / el : 0;
    double eta = ips > 0 ? (double)(nb - b - 1) / ips : -1;
    /* whole run: batches left at this process's rate, validations included */
    int64_t total = tr_planned_batches(t, nb), at = t->epoch * nb + b + 1;
    double run_el = now - t->fit_t0;
    double run_rate = run_el > 0 ? (double)(at - t->fit_batch0) / run_el : 0;
    double run_eta = total >= 0 && run_rate > 0 ? (double)(total > at ? total - at : 0) / run_rate
                                                : -1;
    char ep[48], e1[32], e2[32], line[256], lossbuf[32];
    /* nothing read back yet this epoch (the device keeps it until a logged
     * step): "-", not a "nan" that looks like a non-finite loss */
    if (t->ep_loss_n) snprintf(lossbuf, sizeof lossbuf, "%.4f", loss);
    else snprintf(lossbuf, sizeof lossbuf, "-");
    if (total >= 0)
        snprintf(ep, sizeof ep, "epoch %lld/%lld", (long long)t->epoch,
                 (long long)((total - 1) / nb));
    else
        snprintf(ep, sizeof ep, "epoch %lld", (long long)t->epoch);
    snprintf(line, sizeof line, "%s  batch %lld/%lld  %.2f it/s  eta epoch %s run %s  loss %s  lr %.3g",
             ep, (long long)b + 1, (long long)nb, ips, format_duration(e1, sizeof e1, eta),
             format_duration(e2, sizeof e2, run_eta), lossbuf, s->lr);
    if (t->tty) {
        fputs("\r\033[K", stdout);
        fputs(line, stdout);
        fflush(stdout);
        t->progress_shown = true;
    } else {
        tr_log(t, "%s\n", line);
    }
    return PL_OK;
}

/* A logged step: read the buffered values back (one copy; the NaN policy is
 * replayed over them) and write its metrics.csv rows, unless the read found
 * the step skipped (then it is as if never stepped). */
static pl_status log_step_end(void *self, trainer *t, const tr_step_info *s) {
    (void)self;
    if (!s->logged) return PL_OK;
    double lv = s->host_loss, gnorm = s->host_grad_norm;
    if (t->dev_loop) {
        pl_status st = tr_sv_flush(t);
        if (st) return st;
        if (t->sv.last_step_skipped) return PL_OK;
        lv = t->sv.last_loss;
        gnorm = t->sv.last_gnorm;
    }
    /* wall seconds of this optimizer step: its micro-batches' loading,
     * forward, backward and the update */
    tr_metric_row(t, "step_seconds", s->step_seconds);
    tr_metric_row(t, "train_loss", lv);
    tr_metric_row(t, "lr", s->lr);
    tr_metric_row(t, "grad_norm", gnorm);
    return PL_OK;
}

static pl_status log_train_epoch_end(void *self, trainer *t, const tr_epoch_info *e) {
    (void)self;
    double te = e->seconds;
    char health[96]; /* the device's own view (NVML; strict's stand-in): device_* rows too */
    tr_devhealth_epoch(t, health, sizeof health);
    tr_log(t, "epoch %lld: train_loss %.5f  %.1fs  %.0f samples/s  data-wait %.1f%%%s\n",
           (long long)t->epoch, e->train_loss, te, e->samples / te, 100.0 * e->data_wait / te,
           health);
    tr_metric_row(t, "epoch_train_loss", e->train_loss);
    tr_metric_row(t, "samples_per_s", e->samples / te);
    tr_metric_row(t, "data_wait_ms", e->data_wait * 1e3);
    return PL_OK;
}

static pl_status log_validation_end(void *self, trainer *t, const pl_metrics *m, double seconds) {
    (void)self;
    char heading[128];
    snprintf(heading, sizeof heading, "epoch %lld step %lld validation (%.1fs):",
             (long long)t->epoch, (long long)t->step, seconds);
    tr_print_metrics(t, heading, "val", m);
    return PL_OK;
}

static pl_status log_epoch_end(void *self, trainer *t) {
    (void)self;
    tr_peak_metric_rows(t);
    if (t->metrics) fflush(t->metrics);
    return PL_OK;
}

static tr_callback log_cb = {.struct_size = sizeof(tr_callback), .name = "logging",
                             .on_train_step_end = log_step_end,
                             .on_train_batch_end = log_batch_end,
                             .on_train_epoch_end = log_train_epoch_end,
                             .on_validation_end = log_validation_end,
                             .on_epoch_end = log_epoch_end};

pl_status tr_cb_logging_create(trainer *t, tr_callback **out) {
    (void)t;
    *out = &log_cb;
    return PL_OK;
}
