/* step.c - one training step: a micro-batch's forward and backward (the loss
 * kept on the device, or decided on the host under data parallel), the
 * gradient norm and clipping, the learning rates from the schedulers, and
 * the optimizer step (the part a CUDA graph captures, graph_step.c, and the
 * host tail). Called by the fit (trainer.c) and the graph step. */
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

/* ---- optimization step ---------------------------------------------------------------------- */

/* Total 2-norm of all gradients (as torch.nn.utils.clip_grad_norm_: the norm
 * of the per-tensor norms, i.e. sqrt of the sum of squares) and, when
 * gradient_clip_val > 0, clipping by norm (g *= clip / (norm + 1e-6) when
 * that is < 1) or by value (clamp to [-clip, clip]). Runs as ops on the
 * gradients' device; only the norm comes back to the host. NaN when an op
 * fails (the step's finite check then stops the run). */
static double grad_norm_and_clip(trainer *t) {
    pl_tensor **g;
    int n = tr_grad_list(t, &g);
    pl_no_grad_begin();
    pl_frame_begin();
    /* the sum of squares over every gradient: one call per 32 of them (ops.h) */
    pl_tensor *total = n > 0 ? pl_sum_squares_multi(n, g) : NULL;
    double norm = n < 0 || (n > 0 && !total) ? NAN : total ? sqrt(pl_tensor_item(total)) : 0.0;
    pl_frame_end();
    if (t->clip > 0 && t->clip_norm && t->clip / (norm + 1e-6) < 1.0 && n > 0) {
        /* every gradient *= (float)coef, as pl_scale(g, coef) did: one call per 32 */
        pl_frame_begin();
        pl_tensor *c = pl_tensor_scalar((float)(t->clip / (norm + 1e-6)), g[0]->device);
        if (!c || pl_mul_multi_(n, g, c)) norm = NAN;
        pl_frame_end();
    }
    for (int i = 0; i < n && t->clip > 0 && !t->clip_norm; i++) { /* by value: clamp */
        pl_frame_begin();
        pl_tensor *c = pl_clamp(g[i], -t->clip, t->clip);
        if (!c || pl_tensor_copy_(g[i], c)) norm = NAN;
        pl_frame_end();
    }
    pl_no_grad_end();
    return norm;
}

static void zero_grads(trainer *t) {
    for (int i = 0; i < pl_params_count(t->ctx.params); i++)
        pl_tensor_zero_grad(pl_params_at(t->ctx.params, i)->t);
}


/* Set every group's lr and let schedulers drive their hyper-parameters;
 * returns group 0's lr (logged). */
static double apply_lr(trainer *t) {
    double f = tr_lr_factor(t);
    double lr0 = NAN;
    int ng = OPTIM(t)->num_groups(t->optim.self);
    for (int g = 0; g < ng; g++) {
        pl_param_group *pg = OPTIM(t)->group(t->optim.self, g);
        pg->lr = pg->initial_lr * f;
        for (int k = 0; k < t->n_sched; k++)
            if (SCHED(&t->sched[k])->drive) SCHED(&t->sched[k])->drive(t->sched[k].self, t->step, pg);
        if (g == 0) lr0 = pg->lr;
    }
    return lr0;
}

double tr_apply_lr(trainer *t) { return apply_lr(t); }

/* An optimizer step up to the gradients' zeroing: what a captured step
 * records (graph_step.c); tr_optimizer_step_tail follows on the host. */
pl_status tr_optimizer_step_body(trainer *t, double *gnorm, double *lr) {
    bool do_step = true;
    /* DDP: the global batch's gradient, before the unscale, inf check and clip */
    pl_status dst = tr_dist_reduce_grads(t);
    if (dst) return dst;
    pl_status st = PL_OK;
    if (t->sv.scale) /* a device loss scale (plugin.h, ABI 2.11): its skip goes into found_inf */
        st = PREC(t)->before_step_device(t->prec.self, t->ctx.params, t->sv.found);
    else if (t->prec.self && PREC(t)->before_step)
        do_step = PREC(t)->before_step(t->prec.self, t->ctx.params);
    if (!st && t->dev_loop) /* the norm stays on the device (step_values.c) */
        st = tr_sv_grad_norm_and_clip(t);
    else if (!st)
        *gnorm = grad_norm_and_clip(t);
    *lr = apply_lr(t);
    if (do_step && !st) {
        /* one process: the kernels skip the update when the step's loss was not
         * finite (found_inf), decided on the device */
        if (t->dev_loop) pl_optim_set_found_inf(t->sv.found);
        st = OPTIM(t)->step(t->optim.self);
        pl_optim_set_found_inf(NULL);
        if (!st && t->prec.self && PREC(t)->after_step)
            st = PREC(t)->after_step(t->prec.self, t->ctx.params);
    }
    zero_grads(t);
    return st;
}

/* The step count and the averager (host decisions: never captured). */
pl_status tr_optimizer_step_tail(trainer *t) {
    t->step++;
    return t->avg.self ? AVG(t)->update(t->avg.self, t->epoch, t->step) : PL_OK;
}

pl_status tr_optimizer_step(trainer *t, double *gnorm, double *lr) {
    pl_status st = tr_optimizer_step_body(t, gnorm, lr);
    pl_status ts = tr_optimizer_step_tail(t);
    return st ? st : ts;
}

/* A micro-batch's loss decided on the host, as data parallel needs it (the
 * ranks agree on the global batch's loss before backward; one process keeps
 * it on the device instead, step_values.c): read back, the on_nan policy
 * (on_loss_read), backward scaled by this rank's share. Ends the batch's
 * frame. Returns 1 to go on to the step, 0 when on_nan = skip dropped the
 * step's micro-batches, -1 on an error (*st). */
static int host_micro_batch(trainer *t, pl_tensor *loss, pl_status *st, double *lv,
                            pl_metrics *m, int64_t size, int64_t b, int64_t *pending) {
    *lv = *st ? NAN : pl_tensor_item(loss);
    /* DDP: the loss of the global batch (every rank decides on the same value),
     * this rank's share of it, which scales its backward, and whether any rank
     * has seen a signal (all stop at the same step boundary) */
    double share = 1.0;
    if (!*st) *st = tr_dist_loss(t, lv, m, size, &share, tr_signal_pending(), &t->peer_signal);
    if (!*st) *st = tr_loss_read(t, *lv, t->epoch, t->step, b);
    if (!*st && !isfinite(*lv)) { /* skipped: the step's micro-batches so far go too */
        pl_tape_clear();
        zero_grads(t);
        tr_devstats_step_abort(t);
        *pending = 0;
        t->batch = b + 1;
        t->accum_pending = 0;
        pl_frame_end();
        return 0;
    }
    if (!*st) {
        double scale = t->prec.self ? PREC(t)->loss_scale(t->prec.self) : 1.0;
        *st = pl_backward(loss, scale * share / (double)t->accum);
    }
    pl_frame_end();
    if (*st) return -1;
    t->ep_loss_sum += *lv;
    t->ep_loss_n++;
    t->micro++;
    return 1;
}

/* Backward seeded with the precision's device loss scale (step_values.c,
 * plugin.h's loss_scale_tensor): backward of loss * (scale / accum) from 1,
 * so d loss is the f32 quotient scale / accum, the host path's seed
 * (float)(scale / accum) (an f32 division of f32 operands is the exact
 * quotient rounded once), computed on the device: no host read, and a
 * captured graph's replay uses the scale of its step. */
static pl_status backward_device_scale(trainer *t, pl_tensor *loss) {
    pl_tensor *seed = t->sv.accum ? pl_div(t->sv.scale, t->sv.accum) : t->sv.scale;
    pl_tensor *scaled = seed && loss ? pl_mul(loss, seed) : NULL;
    if (scaled) return pl_backward(scaled, 1.0);
    pl_tape_clear();
    return pl_error_status() ? pl_error_status() : PL_ERR_INTERNAL;
}

/* One training micro-batch: forward, then the loss kept on the device (one
 * process: nothing is read back; its finiteness and the on_nan policy are
 * decided at the next read, step_values.c) or decided on the host (data
 * parallel), and backward. 1 / 0 / -1 as host_micro_batch. */
int tr_train_micro_batch(trainer *t, const pl_batch *batch, int64_t b, int64_t *pending,
                         double *lv, pl_status *st) {
    t->ctx.epoch = t->epoch;
    t->ctx.global_step = t->step;
    t->ctx.micro_step = t->micro;
    pl_frame_begin();
    pl_tensor *loss = NULL;
    pl_metrics m;
    pl_metrics_reset(&m);
    /* one process asks for no training metrics (NULL): a model then reads
     * nothing back; data parallel needs the loss's count to weight the ranks */
    pl_autocast_cache_begin(); /* a parameter is cast once per forward */
    *st = MODEL(t)->forward(t->model.self, batch, PL_SPLIT_TRAIN, true, &loss,
                            t->dev_loop ? NULL : &m);
    pl_autocast_cache_end(); /* before backward: the tape keeps what it reads */
    if (!t->dev_loop) return host_micro_batch(t, loss, st, lv, &m, batch->size, b, pending);
    if (!*st) *st = tr_sv_loss(t, loss, *pending == 0, b);
    if (!*st && t->sv.scale) {
        *st = backward_device_scale(t, loss);
    } else if (!*st) {
        double scale = t->prec.self ? PREC(t)->loss_scale(t->prec.self) : 1.0;
        *st = pl_backward(loss, scale / (double)t->accum);
    }
    pl_frame_end();
    if (*st) return -1;
    t->micro++;
    return 1;
}
