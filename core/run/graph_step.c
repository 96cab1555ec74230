/* graph_step.c - [trainer] cuda_graphs: the training step captured once and
 * replayed (graph.h; torch.cuda.graphs' whole-network capture).
 *
 * With cuda_graphs on, the first GRAPH_WARMUP optimizer steps of a fit run
 * eagerly (as torch warms up on a side stream: optimizer state, gradients
 * and the caching allocator's blocks come into being), the last of them
 * with dropout's counters learned. The next step is captured: the batch is
 * copied into static input tensors (kept for the fit), then forward, the
 * loss into the step-value buffer, backward, gradient norm and clipping,
 * the optimizer step and the gradients' zeroing are recorded, and the graph
 * is replayed once to run them. Every later batch of the same shapes is
 * copied into the static inputs and the graph replayed, after the host has
 * set what changes per step on the device: the optimizer's coefficients
 * (the optimizer's step() run in refresh mode: schedulers' learning rates,
 * onecycle's momentum; AdamW's bias correction comes from its step count on
 * the device, which the replayed kernels advance, ABI 2.12) and dropout's
 * micro-step offset. The step count, the averager and the callbacks stay on the host,
 * outside the graph. A batch whose shapes differ from the captured one (a
 * short last batch) runs eagerly, with one logged reason.
 *
 * accumulate_grad_batches = k > 1: one graph per micro-batch index of a step
 * (as torch captures each micro-step of an accumulation), graph i the
 * micro-batch's forward, loss and backward into the accumulated gradients,
 * the last one (i = k - 1) with the optimizer step and the zeroing. Each is
 * captured on its own after an eager micro-batch that learned dropout's
 * counters (the one before it): g[0] after the warm-up, then, in each later
 * step, micro-batch i - 1 runs eagerly (learning) and micro-batch i is
 * captured, until every index has its graph (k steps). All read the same
 * static inputs. A step cut short at the epoch's end (fewer than k
 * micro-batches) replays its micro-batches' graphs and takes the optimizer
 * step eagerly; an eager micro-batch between replays adds to the same
 * gradients, loss buffer and found_inf as a replayed one would.
 *
 * Off (one logged reason) when: the device cannot capture (the CPU; a
 * backend without the ABI 2.8 verbs); data parallel, or a backend whose
 * optimizer kernels take no found_inf flag (the loss is read each step);
 * a precision with a host loss scale other than 1 (a dynamic scaler that
 * decides on the host: one without plugin.h's loss_scale_tensor, ABI 2.11;
 * fp16's lives on the device, its step is captured with the scale's update
 * and replays read the scale there). A capture that breaks the rules (a host read inside
 * the step, ...) fails the run with the backend's message, naming the call;
 * set cuda_graphs = false to run it eagerly.
 */
#include <stdlib.h>
#include <string.h>

#include "pipeline/graph.h"
#include "trainer_internal.h"

#define GRAPH_WARMUP 2

/* Log why steps run eagerly, once per fit for the reasons before a capture
 * and once for the batches after it (flag). */
static void reason_once(trainer *t, bool *flag, const char *fmt, const char *arg) {
    if (*flag) return;
    *flag = true;
    char msg[512];
    snprintf(msg, sizeof msg, fmt, arg);
    tr_log(t, "cuda_graphs: %s\n", msg);
}

static void reason(trainer *t, const char *fmt, const char *arg) {
    reason_once(t, &t->gs.reason_logged, fmt, arg);
}

void tr_graph_begin(trainer *t) {
    tr_graph_state *gs = &t->gs;
    int mode = gs->mode;
    bool explicit_on = gs->explicit_on;
    tr_graph_end(t);
    memset(gs, 0, sizeof *gs);
    gs->explicit_on = explicit_on;
    gs->learn_micro = -1;
    if (mode == 0) return;
    const pl_backend *be = t->ctx.device.type == PL_DEVICE_CPU ? NULL : pl_backend_get(t->ctx.device.type);
    pl_error_clear();
    const char *why = NULL, *arg = "";
    if (mode == 2 && !(be && !strcmp(be->name, "cuda")))
        return; /* auto: on for the cuda backend only */
    if (!pl_graph_supported(t->ctx.device)) {
        why = "the device '%s' cannot capture graphs; the step runs eagerly";
        arg = be ? be->name : "cpu";
    } else if (!t->dev_loop) {
        why = "%sthe training loss is read back every step (data parallel, or optimizer kernels "
              "without found_inf); the step runs eagerly";
    }
    if (why) {
        reason(t, why, arg);
        return;
    }
    gs->k = t->accum > 0 ? (int)t->accum : 1;
    gs->g = calloc((size_t)gs->k, sizeof *gs->g);
    gs->cap_micro = calloc((size_t)gs->k, sizeof *gs->cap_micro);
    if (!gs->g || !gs->cap_micro) {
        reason(t, "%sout of memory for the captured step's graphs; the step runs eagerly", "");
        return;
    }
    gs->mode = 1;
    t->sv.gvals = pl_tensor_zeros_owned(PL_F32, 1, (int64_t[]){2}, t->ctx.device);
    if (!t->sv.gvals) {
        pl_error_clear();
        gs->mode = 0;
        reason(t, "%scould not allocate the captured step's loss buffer; the step runs eagerly", "");
    }
}

void tr_graph_end(trainer *t) {
    tr_graph_state *gs = &t->gs;
    if (gs->ng || gs->replays || gs->fallbacks) {
        char acc[160] = "";
        if (gs->k > 1)
            snprintf(acc, sizeof acc, " (accumulate_grad_batches = %d: %d of its %d micro-batch graphs "
                     "captured; replays and eager steps counted in micro-batches)", gs->k, gs->ng, gs->k);
        tr_log(t, "cuda_graphs: the training step was captured at step %lld and replayed %lld "
               "times; %lld steps after the capture ran eagerly%s\n", (long long)gs->cap_step,
               (long long)gs->replays, (long long)gs->fallbacks, acc);
    }
    for (int i = 0; gs->g && i < gs->k; i++) pl_graph_release(gs->g[i]);
    free(gs->g);
    free(gs->cap_micro);
    gs->g = NULL;
    gs->cap_micro = NULL;
    gs->ng = 0;
    for (int i = 0; i < gs->in.n; i++) pl_tensor_release(gs->in.fields[i]);
    gs->in.n = 0;
    gs->replays = gs->fallbacks = 0;
    pl_graph_dropout_learn(false);
    t->sv.graph = false;
}

/* Whether batch b has the captured batch's fields, dtypes, shapes and
 * devices (and the same host-side contents); NULL when it does, else why. */
static const char *batch_differs(const tr_graph_state *gs, const pl_batch *b, char *why, size_t n) {
    if (b->n != gs->in.n || b->size != gs->in.size) {
        snprintf(why, n, "a batch of %lld samples (%d fields), the captured one %lld (%d)",
                 (long long)b->size, b->n, (long long)gs->in.size, gs->in.n);
        return why;
    }
    for (int i = 0; i < b->n; i++) {
        const pl_tensor *x = b->fields[i], *s = gs->in.fields[i];
        bool same = x && x->dtype == s->dtype && x->ndim == s->ndim &&
                    pl_device_eq(x->device, s->device) && strcmp(b->names[i], gs->names[i]) == 0;
        for (int d = 0; same && d < x->ndim; d++) same = x->shape[d] == s->shape[d];
        if (same && gs->shared[i])
            same = pl_tensor_data(x) == pl_tensor_data(s);
        else if (same && x->device.type == PL_DEVICE_CPU && pl_tensor_is_contiguous(x))
            same = memcmp(pl_tensor_data(x), pl_tensor_data(s), pl_tensor_nbytes(x)) == 0;
        else if (same && x->device.type == PL_DEVICE_CPU)
            same = false;
        if (!same) {
            char d1[256], d2[256];
            snprintf(why, n, "batch field '%s' is %s, the captured one %s%s", b->names[i],
                     x ? pl_tensor_describe(x, d1, sizeof d1) : "NULL",
                     pl_tensor_describe(s, d2, sizeof d2),
                     gs->shared[i] ? " (read in place: its address must not change)"
                     : x && x->device.type == PL_DEVICE_CPU ? " (host fields must not change)" : "");
            return why;
        }
    }
    return NULL;
}

/* Whether b's fields differ from the remembered batch p in count, size,
 * dtype or shape. */
static bool shapes_differ(const pl_batch *p, const pl_batch *b) {
    if (p->n != b->n || p->size != b->size) return true;
    for (int i = 0; i < b->n; i++) {
        const pl_tensor *x = b->fields[i], *y = p->fields[i];
        if (!x || !y || x->dtype != y->dtype || x->ndim != y->ndim) return true;
        for (int d = 0; d < x->ndim; d++)
            if (x->shape[d] != y->shape[d]) return true;
    }
    return false;
}

/* Remember a warm-up batch's shapes and addresses. */
static void remember(tr_graph_state *gs, const pl_batch *b) {
    int n = b->n < PL_BATCH_MAX_FIELDS ? b->n : PL_BATCH_MAX_FIELDS;
    gs->prev_shape = (pl_batch){.n = n, .size = b->size};
    for (int i = 0; i < n; i++) {
        const pl_tensor *x = b->fields[i];
        gs->prev[i] = x ? pl_tensor_data(x) : NULL;
        if (x) {
            gs->prev_desc[i] = *x; /* the descriptor only: dtype, rank, shape */
            gs->prev_shape.fields[i] = &gs->prev_desc[i];
        }
    }
}

/* The static inputs: a copy of every field of b, kept for the fit. */
static pl_status make_static(trainer *t, const pl_batch *b) {
    tr_graph_state *gs = &t->gs;
    gs->in = (pl_batch){.n = 0, .size = b->size, .index = b->index};
    for (int i = 0; i < b->n; i++) {
        pl_tensor *x = b->fields[i];
        if (!x) return pl_error_set(PL_ERR_INVALID, "cuda_graphs: batch field '%s' is NULL", b->names[i]);
        gs->shared[i] = pl_tensor_data(x) == gs->prev[i];
        pl_tensor *s = gs->shared[i] ? pl_tensor_retain(x)
                                     : pl_tensor_empty_owned(x->dtype, x->ndim, x->shape, x->device);
        if (!s) return pl_error_status();
        if (!gs->shared[i]) snprintf(s->name, sizeof s->name, "%s", x->name);
        snprintf(gs->names[i], sizeof gs->names[i], "%s", b->names[i]);
        gs->in.names[i] = gs->names[i];
        gs->in.fields[i] = s;
        gs->in.n = i + 1;
    }
    return PL_OK;
}

/* Copy batch b into the static inputs (device fields: a device copy each). */
static pl_status load_static(trainer *t, const pl_batch *b) {
    tr_graph_state *gs = &t->gs;
    gs->in.index = b->index;
    for (int i = 0; i < b->n; i++) {
        if (gs->shared[i]) continue; /* read in place (batch_differs checked the address) */
        pl_status s = pl_tensor_copy_(gs->in.fields[i], b->fields[i]);
        if (s) return pl_error_prefix(s, "cuda_graphs: batch field '%s' into the captured input",
                                      b->names[i]);
    }
    return PL_OK;
}

/* The host's part of a replayed micro-batch i, then the replay: for the
 * step's last one (the graph with the optimizer step), the optimizer's
 * coefficients (its step() in refresh mode: nothing launches); dropout's
 * offset; the graph; the loss into the step-value buffer. */
static pl_status replay(trainer *t, int i, int64_t b, double *lr) {
    tr_graph_state *gs = &t->gs;
    pl_graph *g = gs->g[i];
    bool last = i == gs->k - 1;
    pl_status st = PL_OK;
    if (last) {
        *lr = tr_apply_lr(t);
        st = pl_graph_refresh_begin(g);
        if (!st) {
            st = OPTIM(t)->step(t->optim.self);
            pl_status e = pl_graph_refresh_end(g);
            if (!st) st = e;
        }
    }
    if (!st) st = pl_graph_set_micro_delta(g, t->micro - gs->cap_micro[i]);
    if (!st) st = pl_graph_replay(g);
    if (!st) st = tr_sv_commit(t, b, last);
    return st;
}

/* Capture micro-batch i of a step on batch b (its inputs copied into the
 * static ones, made at the first capture), then replay it once: the
 * micro-batch of batch b. */
static pl_status capture(trainer *t, const pl_batch *b, int i, int64_t bi, double *lr,
                         bool *in_optim) {
    tr_graph_state *gs = &t->gs;
    bool last = i == gs->k - 1;
    pl_graph_dropout_learn(false);
    pl_status st = gs->ng == 0 ? make_static(t, b) : PL_OK;
    if (!st) st = load_static(t, b);
    if (st) return st;
    int64_t micro0 = t->micro, pending = i;
    double lv = 0, gnorm = 0;
    t->sv.graph = true;
    st = pl_graph_capture_begin(t->ctx.device);
    if (!st) {
        int r = tr_train_micro_batch(t, &gs->in, bi, &pending, &lv, &st);
        /* a test hook (test_strict_graphs.sh): a host read inside the captured step */
        const char *tv = getenv("PL_GRAPH_TEST_VIOLATION");
        if (!st && tv && !strcmp(tv, "host_read")) {
            pl_frame_begin();
            double x = pl_tensor_item(pl_tensor_view_rows(t->sv.gvals, 0, 1));
            (void)x;
            st = pl_error_status();
            pl_frame_end();
        }
        if (r > 0 && !st && last) {
            *in_optim = true;
            st = tr_optimizer_step_body(t, &gnorm, lr);
        }
        pl_graph *g = NULL;
        pl_status es = pl_graph_capture_end(&g);
        if (!st) st = es;
        else pl_graph_release(g);
        if (!st) gs->g[i] = g;
    }
    t->micro = micro0; /* the replay below is this step's micro-batch */
    t->sv.graph = false;
    if (st) return st;
    gs->cap_micro[i] = t->micro;
    gs->ng++;
    if (gs->ng == gs->k) gs->cap_step = t->step;
    /* what the backend fused inside the captured step (backend.h, "Seeing the step") */
    const char *pat = "";
    int nf = pl_graph_fused(gs->g[i], &pat);
    char fused[256] = "";
    if (nf > 0)
        snprintf(fused, sizeof fused, "; the backend fused %d call groups (%s; PL_GRAPH_FUSION=0 "
                 "turns that off)", nf, pat);
    if (gs->k == 1)
        tr_log(t, "cuda_graphs: captured the training step at step %lld (%d optimizer calls, %d "
               "dropout calls with a device offset)%s\n", (long long)t->step,
               pl_graph_optim_calls(gs->g[i]), pl_graph_dropout_calls(gs->g[i]), fused);
    else
        tr_log(t, "cuda_graphs: captured micro-batch %d of %d of the training step at step %lld "
               "(%d optimizer calls, %d dropout calls with a device offset)%s%s\n", i + 1, gs->k,
               (long long)t->step, pl_graph_optim_calls(gs->g[i]), pl_graph_dropout_calls(gs->g[i]),
               fused, gs->ng == gs->k ? "; every micro-batch of the step is captured" : "");
    st = pl_graph_set_micro_delta(gs->g[i], 0);
    if (!st) st = pl_graph_replay(gs->g[i]);
    if (!st) st = tr_sv_commit(t, bi, last);
    return st;
}

int tr_graph_try(trainer *t, const pl_batch *batch, int64_t b, int64_t pending, double *lr,
                 pl_status *st) {
    tr_graph_state *gs = &t->gs;
    if (gs->mode != 1 || gs->failed) return 0;
    t->ctx.epoch = t->epoch;
    t->ctx.global_step = t->step;
    t->ctx.micro_step = t->micro;
    char why[768];
    int i = (int)(pending % gs->k), nx = (i + 1) % gs->k; /* this micro-batch's graph, the next one's */
    bool last = i == gs->k - 1;
    if (gs->ng < gs->k && (!gs->g[i] || !gs->g[nx])) {
        /* capture a batch of the shapes the micro-batch before had (batches of
         * graphs, whose shapes change every step, are never captured) */
        bool stable = gs->eager_steps >= GRAPH_WARMUP && !shapes_differ(&gs->prev_shape, batch);
        if (gs->eager_steps >= GRAPH_WARMUP && !stable && gs->ng == 0)
            reason(t, "%sbatch shapes change from step to step; steps run eagerly until two in a "
                   "row have the same shapes", "");
        bool learned = gs->learn_micro >= 0 && gs->learn_micro + 1 == t->micro;
        if (gs->g[i] || !stable || !learned ||
            (gs->ng > 0 && batch_differs(gs, batch, why, sizeof why))) {
            /* warm-up, or the micro-batch before a graph not captured yet: eager
             * (from the one before a capture on, dropout's counters are learned) */
            bool learn_now = gs->eager_steps >= GRAPH_WARMUP - 1 && !gs->g[nx];
            gs->eager_steps++;
            remember(gs, batch);
            pl_graph_dropout_learn(learn_now);
            gs->learn_micro = learn_now ? t->micro : -1;
            return 0;
        }
        if (t->prec.self && !t->sv.scale && PREC(t)->loss_scale(t->prec.self) != 1.0) {
            reason(t, "%sthe precision's loss scale is not 1 (a dynamic scaler decides on the host "
                   "each step); the step runs eagerly", "");
            gs->failed = true;
            pl_graph_dropout_learn(false);
            return 0;
        }
        /* bookkeeping as an eager step's (b, batch index, the loss record) */
        bool in_optim = false;
        *st = capture(t, batch, i, b, lr, &in_optim);
        gs->learn_micro = -1;
        if (*st) {
            gs->failed = true;
            pl_graph_dropout_learn(false);
            tr_log(t, "cuda_graphs: capturing the training step failed: %s\n", pl_error_message());
            if (!gs->explicit_on && !in_optim) {
                /* auto: nothing of it ran on the device and the optimizer did not
                 * step (a graph captured before is a whole micro-batch, replayed);
                 * this batch and the rest run eagerly */
                pl_tape_clear();
                pl_error_clear();
                *st = PL_OK;
                tr_log(t, "cuda_graphs: the training step runs eagerly\n");
                return 0;
            }
            pl_hint_set("set [trainer] cuda_graphs = false to train eagerly; the message names what "
                        "in the step reads the host or allocates outside the graph");
            return -1;
        }
    } else {
        const char *d = batch_differs(gs, batch, why, sizeof why);
        if (d) {
            reason_once(t, &gs->fallback_logged, "%s; that step runs eagerly (logged once)", d);
            gs->fallbacks++;
            return 0;
        }
        *st = load_static(t, batch);
        if (!*st) *st = replay(t, i, b, lr);
        if (*st) return -1;
        gs->replays++;
    }
    t->micro++;
    if (!last) return 2;
    *st = tr_optimizer_step_tail(t);
    return *st ? -1 : 1;
}
