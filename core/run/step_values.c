/* step_values.c - a training step's values stay on the device until the
 * next read (issue 32, item 1).
 *
 * On a GPU, reading the loss back before backward (pl_tensor_item) and the
 * gradient norm after every step makes the host wait for the device twice
 * a step, and the device then waits for the host's next launches. Here, in
 * one process (world 1; data parallel keeps the host path of trainer.c):
 *  - each micro-batch's loss is copied into a device buffer slot, and the
 *    step's found_inf flag (f32 [1]) accumulates loss * 0 over its
 *    micro-batches: 0, or NaN as soon as one loss is not finite;
 *  - the gradient norm (sqrt of the sum of every gradient's sum of squares)
 *    goes into the slot of the step's last micro-batch, and norm clipping
 *    multiplies every gradient by min(1, max_norm / (norm + 1e-6)) computed
 *    on the device (torch.nn.utils.clip_grad_norm_ with foreach=True);
 *  - the optimizer step runs with the flag (pl_optim_set_found_inf): its
 *    kernels leave parameters and state untouched when it is set
 *    (GradScaler's found_inf); a precision that keeps its loss scale on the
 *    device (fp16, plugin.h's loss_scale_tensor) seeds backward with it and
 *    sets the flag to 1 when a gradient is inf / NaN (its skip: unlike a
 *    non-finite loss, not taken back from the step counts, as on the host
 *    path, where before_step's false skips the update and the step counts);
 *    the optimizers' own counts (AdamW's t, SGD's momentum count) live on
 *    the device and do not advance while the flag is set (ABI 2.12, torch's
 *    fused AdamW state_steps), so neither skip moves them;
 *  - the buffer is read back in one copy (tr_sv_flush) only at a logged
 *    step, before a validation, a checkpoint or an interrupt's save, at the
 *    epoch's end, and when it is full; the host then replays the on_nan
 *    policy over the values in order, exactly as it would have decided them
 *    one by one: the epoch's running loss (a double sum, as before), the last
 *    finite loss, the count of consecutive non-finite losses
 *    (max_consecutive_nan_skips), the warning of each skipped step and the
 *    error of on_nan = stop, naming the epoch, step and batch of the loss.
 * A skipped step ran as a step on the device (the flag made it a no-op), so
 * the replay takes it back from the counters: the step and micro-batch
 * counts are decremented, which restores the learning-rate schedule and the
 * dropout stream of an immediate decision from the next step on (with
 * log_every_n_steps = 1 the run is the same as deciding each step on the
 * host). What differs from deciding each step at once: the steps between
 * the skip and the next read used trainer step numbers one higher (the
 * learning-rate schedule; an optimizer's own count, AdamW's bias correction,
 * did not advance on the skip, as on the host path); an averager updated
 * after it saw unchanged weights; and with accumulate_grad_batches > 1 a
 * non-finite micro-batch skips its whole optimizer step (GradScaler's
 * behaviour) instead of restarting the accumulation. on_nan = stop fails at the read with the same message; the
 * weights are those before the bad step (it was skipped on the device).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "callback.h"
#include "trainer_internal.h"

#define SV_MAX_SLOTS 4096

/* Whether the device's optimizer kernels obey the found_inf flag (in[1]):
 * the CPU's do; a device backend says so by accepting the setting
 * "optimizer_found_inf" (backend.h, set_option). One that does not would
 * update the weights of a step whose loss is not finite, so the loss is then
 * read back every step, as before. */
static bool takes_found_inf(trainer *t) {
    if (t->ctx.device.type == PL_DEVICE_CPU) return true;
    const pl_backend *be = pl_backend_get(t->ctx.device.type);
    bool ok = be && PL_BACKEND_HAS(be, set_option) && be->set_option &&
              be->set_option("optimizer_found_inf", "true") == PL_OK;
    pl_error_clear();
    if (!ok)
        tr_log(t, "backend '%s': its optimizer kernels take no found_inf flag (setting "
               "optimizer_found_inf); the training loss is read back every step\n",
               be ? be->name : "?");
    return ok;
}

pl_status tr_sv_begin(trainer *t) {
    tr_step_values *v = &t->sv;
    memset(v, 0, sizeof *v);
    t->dev_loop = t->world == 1 && takes_found_inf(t);
    if (!t->dev_loop) return PL_OK;
    int64_t cap = t->log_every * t->accum;
    if (cap < 1 || cap > SV_MAX_SLOTS) cap = SV_MAX_SLOTS;
    v->cap = cap;
    v->rec = calloc((size_t)cap, sizeof *v->rec);
    v->host = malloc((size_t)cap * 2 * sizeof *v->host);
    v->buf = pl_tensor_zeros_owned(PL_F32, 1, (int64_t[]){2 * cap}, t->ctx.device);
    v->found = pl_tensor_zeros_owned(PL_F32, 1, (int64_t[]){1}, t->ctx.device);
    if (t->clip > 0 && t->clip_norm) {
        pl_tensor *h = pl_tensor_zeros_owned(PL_F32, 1, (int64_t[]){1}, PL_CPU);
        if (h) ((float *)pl_tensor_data(h))[0] = (float)t->clip;
        v->clip = h ? pl_tensor_zeros_owned(PL_F32, 1, (int64_t[]){1}, t->ctx.device) : NULL;
        pl_status cs = v->clip ? pl_tensor_copy_(v->clip, h) : PL_ERR_NOMEM;
        pl_tensor_release(h);
        if (cs) {
            pl_tensor_release(v->clip);
            v->clip = NULL;
        }
    }
    if (!v->rec || !v->host || !v->buf || !v->found || (t->clip > 0 && t->clip_norm && !v->clip)) {
        tr_sv_end(t);
        return pl_error_set(PL_ERR_NOMEM, "trainer: the step-value buffers (%lld slots) on the "
                            "device", (long long)cap);
    }
    v->last_loss = v->last_gnorm = NAN;
    /* a precision whose loss scale lives on the device (fp16's GradScaler,
     * plugin.h ABI 2.11): backward is seeded with it and its unscale sets
     * found_inf, so a scaler skip is decided on the device too */
    if (t->prec.self && t->prec.desc->abi_minor >= 11 && PREC(t)->loss_scale_tensor &&
        PREC(t)->before_step_device) {
        pl_error_clear();
        v->scale = PREC(t)->loss_scale_tensor(t->prec.self, t->ctx.device);
        pl_status ps = v->scale ? PL_OK : pl_error_status();
        if (!ps && v->scale && t->accum > 1) {
            v->accum = pl_tensor_zeros_owned(PL_F32, 1, (int64_t[]){1}, t->ctx.device);
            ps = v->accum ? pl_tensor_fill_(v->accum, (double)t->accum) : pl_error_status();
        }
        if (ps) {
            tr_sv_end(t);
            return pl_error_prefix(ps, "trainer: the precision's device loss scale");
        }
    }
    return PL_OK;
}

void tr_sv_end(trainer *t) {
    tr_step_values *v = &t->sv;
    pl_tensor_release(v->gvals);
    pl_tensor_release(v->buf);
    pl_tensor_release(v->found);
    pl_tensor_release(v->clip);
    pl_tensor_release(v->accum); /* v->scale is the precision's */
    free(v->rec);
    free(v->host);
    free(v->grads);
    memset(v, 0, sizeof *v);
}

/* Element i of the buffer as a 1-element view (frame-owned in a frame). */
static pl_tensor *slot(trainer *t, int64_t i) { return pl_tensor_view_rows(t->sv.buf, i, 1); }

/* Where the step writes loss (k = 0) and grad norm (k = 1): the slot of
 * buffered value n, or, in a captured step, the fixed gvals. */
static pl_tensor *wslot(trainer *t, int64_t n, int k) {
    if (t->sv.graph) return pl_tensor_view_rows(t->sv.gvals, k, 1);
    return slot(t, 2 * n + k);
}

pl_status tr_sv_commit(trainer *t, int64_t b, bool step_end) {
    tr_step_values *v = &t->sv;
    if (v->n == v->cap) {
        pl_status fs = tr_sv_flush(t);
        if (fs) return fs;
    }
    pl_frame_begin();
    pl_status st = pl_tensor_copy_(pl_tensor_view_rows(v->buf, 2 * v->n, 2), v->gvals);
    pl_frame_end();
    if (st) return pl_error_prefix(st, "trainer: the captured step's loss into the buffer");
    v->rec[v->n] = (tr_sv_record){.epoch = t->epoch, .step = t->step, .batch = b, .step_end = step_end};
    v->n++;
    return PL_OK;
}

pl_status tr_sv_loss(trainer *t, pl_tensor *loss, bool first_micro, int64_t b) {
    tr_step_values *v = &t->sv;
    if (v->n == v->cap && !v->graph) {
        pl_status fs = tr_sv_flush(t); /* full: an extra read, counted like any other */
        if (fs) return fs;
    }
    if (!loss || pl_tensor_numel(loss) != 1) {
        char d[256];
        return pl_error_set(PL_ERR_SHAPE, "[model] plugin '%s': the training loss is %s, expected "
                            "one element", t->model.desc->name,
                            loss ? pl_tensor_describe(loss, d, sizeof d) : "NULL");
    }
    pl_no_grad_begin();
    pl_status st = pl_tensor_copy_(wslot(t, v->n, 0), loss);
    if (!st) {
        /* loss * 0: 0 for a finite loss, NaN for inf or NaN */
        pl_tensor *z = pl_scale(loss, 0.0);
        if (z && !first_micro) z = pl_add(v->found, z);
        st = z ? pl_tensor_copy_(v->found, z) : pl_error_status();
    }
    pl_no_grad_end();
    if (st) return pl_error_prefix(st, "trainer: keeping the training loss on the device");
    if (v->graph) return PL_OK; /* recorded by tr_sv_commit after each replay */
    v->rec[v->n] = (tr_sv_record){.epoch = t->epoch, .step = t->step, .batch = b};
    v->n++;
    return PL_OK;
}

int tr_grad_list(trainer *t, pl_tensor ***out) {
    tr_step_values *v = &t->sv;
    int n = pl_params_count(t->ctx.params), k = 0;
    if (n > v->grads_cap) {
        pl_tensor **g = realloc(v->grads, (size_t)n * sizeof *g);
        if (!g) {
            *out = v->grads;
            pl_error_set(PL_ERR_NOMEM, "trainer: the list of %d gradients", n);
            return -1;
        }
        v->grads = g;
        v->grads_cap = n;
    }
    pl_tensor **g = *out = v->grads;
    for (int i = 0; i < n; i++) {
        pl_param *p = pl_params_at(t->ctx.params, i);
        if (p->t->requires_grad && p->t->grad) g[k++] = p->t->grad; /* frozen ones too, wherever they sit */
    }
    return k;
}

pl_status tr_sv_grad_norm_and_clip(trainer *t) {
    tr_step_values *v = &t->sv;
    if (v->n == 0 && !v->graph)
        return pl_error_set(PL_ERR_INTERNAL, "trainer: an optimizer step without a loss");
    pl_tensor **g;
    int n = tr_grad_list(t, &g);
    pl_no_grad_begin();
    pl_frame_begin();
    /* the sum of squares over every gradient: one call per 32 of them (ops.h) */
    pl_tensor *total = n > 0 ? pl_sum_squares_multi(n, g) : NULL;
    pl_status st = n < 0 || (n > 0 && !total) ? pl_error_status() : PL_OK;
    pl_tensor *norm = NULL, *gslot = wslot(t, v->n - 1, 1);
    if (!st && total) {
        norm = pl_sqrt(total);
        st = norm ? pl_tensor_copy_(gslot, norm) : pl_error_status();
    } else if (!st) {
        st = pl_tensor_fill_(gslot, 0.0); /* no gradient at all: norm 0 */
    }
    if (!st && t->clip > 0 && t->clip_norm && norm) {
        /* coef = min(1, max_norm / (norm + 1e-6)) on the device, every gradient *= coef */
        pl_tensor *coef = pl_clamp(pl_div(v->clip, pl_add_scalar(norm, 1e-6)), 0.0, 1.0);
        st = coef ? pl_mul_multi_(n, g, coef) : pl_error_status();
    }
    for (int i = 0; i < n && !st && t->clip > 0 && !t->clip_norm; i++) { /* by value: clamp */
        pl_frame_begin();
        pl_tensor *c = pl_clamp(g[i], -t->clip, t->clip);
        st = c ? pl_tensor_copy_(g[i], c) : pl_error_status();
        pl_frame_end();
    }
    pl_frame_end();
    pl_no_grad_end();
    if (st) return pl_error_prefix(st, "trainer: gradient norm and clipping on the device");
    if (!v->graph) v->rec[v->n - 1].step_end = true;
    return PL_OK;
}

void tr_sv_last(trainer *t, pl_tensor **loss, pl_tensor **gnorm) {
    tr_step_values *v = &t->sv;
    *loss = *gnorm = NULL;
    if (!t->dev_loop || v->n == 0) return;
    *loss = slot(t, 2 * (v->n - 1));
    if (v->rec[v->n - 1].step_end) *gnorm = slot(t, 2 * (v->n - 1) + 1);
}

pl_status tr_sv_flush(trainer *t) {
    tr_step_values *v = &t->sv;
    if (!t->dev_loop || v->n == 0) return PL_OK;
    int64_t n = v->n;
    v->n = 0;
    /* one device-to-host read of every value since the last one */
    pl_frame_begin();
    pl_tensor *h = pl_tensor_to(pl_tensor_view_rows(v->buf, 0, 2 * n), PL_F32, PL_CPU);
    if (h) memcpy(v->host, pl_tensor_data(h), (size_t)(2 * n) * sizeof(float));
    pl_frame_end();
    if (!h) return pl_error_prefix(pl_error_status(), "trainer: reading the training losses back");
    /* replay, in order; skipped steps so far are taken back from the step
     * numbers the records carry */
    int64_t skipped = 0, bad_micro = 0;
    pl_status st = PL_OK;
    v->last_step_skipped = false;
    for (int64_t i = 0; i < n && !st; i++) {
        const tr_sv_record *r = &v->rec[i];
        double lv = v->host[2 * i];
        /* the NaN policy (cb_nan.c) and any other on_loss_read callback */
        st = tr_loss_read(t, lv, r->epoch, r->step - skipped, r->batch);
        if (!isfinite(lv)) {
            v->step_bad = true;
            bad_micro++;
        } else {
            t->ep_loss_sum += lv;
            t->ep_loss_n++;
        }
        v->last_loss = lv;
        if (r->step_end) {
            v->last_gnorm = v->host[2 * i + 1];
            v->last_step_skipped = v->step_bad;
            if (v->step_bad) skipped++;
            v->step_bad = false;
        }
    }
    if (st) return st;
    t->step -= skipped;
    t->micro -= bad_micro;
    return PL_OK;
}
