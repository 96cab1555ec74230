/* cb_ema.c - an exponential moving average of the weights as a callback,
 * as PyTorch Lightning's EMAWeightAveraging (Lightning 2.5,
 * lightning.pytorch.callbacks.WeightAveraging over
 * torch.optim.swa_utils.AveragedModel with get_ema_multi_avg_fn(decay)):
 *
 *   after optimizer step i (0-based) with i >= ema_start_step:
 *     the first time   ema = w
 *     then             ema = ema + (1 - decay) * (w - ema)     (torch._foreach_lerp_,
 *                                                               = decay*ema + (1-decay)*w)
 *
 * for every trainable parameter, in the parameter's f32, on its device (a
 * few ops per tensor; nothing is read back). Buffers (non-trainable
 * tensors) are not averaged. [trainer] keys: ema_decay (0: off),
 * ema_start_step, ema_validate.
 *
 * ema_validate = true (the default): every validation runs on the averaged
 * weights (swapped in at on_validation_start, back at on_validation_end,
 * after the checkpoint callback), so the monitor, early stopping and the
 * best checkpoint judge the averaged weights and best.safetensors holds
 * them as its parameters: the test phase, which loads the best weights,
 * tests them (Lightning's checkpoints hold the averaged weights too). Before
 * the first update the live weights are validated.
 *
 * After the test phase (on_test_end) the final average is evaluated on
 * validation and test, reported as ema_val_* / ema_test_* (log.txt,
 * metrics.csv) and written to checkpoints/ema.safetensors, as the swa
 * averager's final weights are.
 *
 * Checkpoint state (every checkpoint): ema.n_averaged, ema.swapped (1 when
 * written while the average was swapped in: the parameters then hold the
 * average and ema.avg.* the live weights, which a resume swaps back) and
 * ema.avg.<param> for each trainable parameter. A resume needs them (a
 * checkpoint written without ema_decay is refused naming the key).
 *
 * What differs from Lightning: an optimizer step that a non-finite loss
 * skipped on the device (found_inf) still updates the average (with the
 * unchanged weights), as the swa averager does.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "callback.h"

typedef struct ema {
    tr_callback cb;
    trainer *t;
    double decay;
    int64_t start_step;
    bool validate;
    int n;            /* parameters at create */
    pl_tensor **avg;  /* [n]: owned f32 averages of the trainable ones, NULL for the others */
    int64_t n_averaged;
    bool swapped;     /* the average is in the parameters, the live weights in avg */
} ema;

static pl_tensor *live(ema *e, int i) { return pl_params_at(e->t->ctx.params, i)->t; }

static pl_status check_param(ema *e, int i) {
    pl_param *p = pl_params_at(e->t->ctx.params, i);
    char d[256];
    if (p->t->dtype != PL_F32 || pl_tensor_numel(p->t) != pl_tensor_numel(e->avg[i]))
        return pl_error_set(PL_ERR_SHAPE, "[trainer] ema_decay: parameter '%s' is %s: the EMA "
                            "keeps f32 parameters of %lld elements", p->name,
                            pl_tensor_describe(p->t, d, sizeof d),
                            (long long)pl_tensor_numel(e->avg[i]));
    return PL_OK;
}

/* AveragedModel.update_parameters with the EMA function */
static pl_status ema_update(ema *e) {
    pl_status st = PL_OK;
    float w = (float)(1.0 - e->decay);
    pl_no_grad_begin();
    for (int i = 0; i < e->n && !st; i++) {
        if (!e->avg[i] || (st = check_param(e, i))) continue;
        if (e->n_averaged == 0) {
            st = pl_tensor_copy_(e->avg[i], live(e, i));
            continue;
        }
        pl_frame_begin();
        pl_tensor *upd = pl_add(e->avg[i], pl_scale(pl_sub(live(e, i), e->avg[i]), w));
        st = upd ? pl_tensor_copy_(e->avg[i], upd) : pl_error_status();
        pl_frame_end();
    }
    pl_no_grad_end();
    if (st) return pl_error_prefix(st, "[trainer] ema_decay: averaging the weights");
    e->n_averaged++;
    return PL_OK;
}

/* exchange the average and the live weights, through a copy on the device */
static pl_status ema_swap(ema *e) {
    pl_status st = PL_OK;
    for (int i = 0; i < e->n && !st; i++) {
        if (!e->avg[i] || (st = check_param(e, i))) continue;
        pl_tensor *p = live(e, i);
        pl_tensor *tmp = pl_tensor_empty_owned(PL_F32, p->ndim, p->shape, p->device);
        st = tmp ? pl_tensor_copy_(tmp, p) : pl_error_status();
        if (!st) st = pl_tensor_copy_(p, e->avg[i]);
        if (!st) st = pl_tensor_copy_(e->avg[i], tmp);
        pl_tensor_release(tmp);
    }
    if (st) return pl_error_prefix(st, "[trainer] ema_decay: swapping the averaged weights");
    e->swapped = !e->swapped;
    return PL_OK;
}

static pl_status ema_step_end(void *self, trainer *t, const tr_step_info *s) {
    ema *e = self;
    (void)t;
    /* s->step counts the steps done: this one's 0-based index is s->step - 1 */
    return s->step - 1 >= e->start_step ? ema_update(e) : PL_OK;
}

static pl_status ema_validation_start(void *self, trainer *t) {
    ema *e = self;
    (void)t;
    return e->validate && e->n_averaged > 0 && !e->swapped ? ema_swap(e) : PL_OK;
}

static pl_status ema_validation_end(void *self, trainer *t, const pl_metrics *m, double seconds) {
    ema *e = self;
    (void)t;
    (void)m;
    (void)seconds;
    return e->swapped ? ema_swap(e) : PL_OK;
}

static pl_status ema_test_end(void *self, trainer *t) {
    ema *e = self;
    if (e->n_averaged == 0) return PL_OK;
    pl_metrics val, test;
    pl_status st = ema_swap(e);
    if (!st) st = tr_evaluate(t, PL_SPLIT_VAL, &val, t->limit[PL_SPLIT_VAL]);
    if (!st) st = tr_check_finite("val (ema averaged weights)", &val);
    if (!st) st = tr_evaluate(t, PL_SPLIT_TEST, &test, t->limit[PL_SPLIT_TEST]);
    if (!st) st = tr_check_finite("test (ema averaged weights)", &test);
    if (!st) {
        tr_print_metrics(t, "val (ema averaged weights):", "ema_val", &val);
        tr_print_metrics(t, "test (ema averaged weights):", "ema_test", &test);
        char p[PATH_MAX + 32];
        snprintf(p, sizeof p, "%s/checkpoints/ema.safetensors", t->run_dir);
        st = tr_save_checkpoint(t, p);
    }
    pl_status sb = e->swapped ? ema_swap(e) : PL_OK;
    return st ? st : sb;
}

static pl_status ema_state(void *self, const pl_state_visitor *v) {
    ema *e = self;
    pl_status st;
    double n = (double)e->n_averaged, sw = e->swapped ? 1 : 0;
    if ((st = v->scalar(v->ctx, "n_averaged", &n)) || (st = v->scalar(v->ctx, "swapped", &sw)))
        return st;
    if (!(n >= 0) || n != floor(n) || (sw != 0 && sw != 1))
        return pl_error_set(PL_ERR_IO, "checkpoint: ema.n_averaged = %g, ema.swapped = %g: expected "
                            "a count and 0 or 1 (corrupt checkpoint?)", n, sw);
    char name[PL_NAME_MAX + 16];
    for (int i = 0; i < e->n; i++) {
        if (!e->avg[i]) continue;
        snprintf(name, sizeof name, "avg.%s", pl_params_at(e->t->ctx.params, i)->name);
        if ((st = v->tensor(v->ctx, name, e->avg[i]))) return st;
    }
    if (v->loading) {
        e->n_averaged = (int64_t)n;
        /* written while the average was swapped in: the parameters just loaded hold
         * the average and avg.* the live weights; a resume goes on from the live ones */
        e->swapped = sw == 1;
        if (e->swapped) return ema_swap(e);
    }
    return PL_OK;
}

static void ema_destroy(void *self) {
    ema *e = self;
    if (!e) return;
    for (int i = 0; i < e->n && e->avg; i++) pl_tensor_release(e->avg[i]);
    free(e->avg);
    free(e);
}

pl_status tr_cb_ema_create(trainer *t, tr_callback **out) {
    *out = NULL;
    double decay = pl_cfg_float(t->tr, "ema_decay", 0);
    if (decay == 0) return PL_OK;
    if (!(decay > 0 && decay < 1))
        return pl_error_set(PL_ERR_CONFIG, "[trainer] ema_decay = %g: expected 0 (off) or a value "
                            "in (0, 1)", decay);
    ema *e = calloc(1, sizeof *e);
    int n = pl_params_count(t->ctx.params);
    if (e) e->avg = calloc((size_t)(n > 0 ? n : 1), sizeof *e->avg);
    if (!e || !e->avg) {
        ema_destroy(e);
        return pl_error_set(PL_ERR_NOMEM, "[trainer] ema_decay: out of memory");
    }
    e->t = t;
    e->n = n;
    e->decay = decay;
    e->start_step = pl_cfg_int(t->tr, "ema_start_step", 0);
    e->validate = pl_cfg_bool(t->tr, "ema_validate", true);
    for (int i = 0; i < n; i++) {
        pl_param *p = pl_params_at(t->ctx.params, i);
        if (!p->t || !p->t->requires_grad) continue;
        e->avg[i] = pl_tensor_zeros_owned(PL_F32, p->t->ndim, p->t->shape, p->t->device);
        pl_status st = e->avg[i] ? check_param(e, i) : pl_error_set(PL_ERR_NOMEM, "out of memory");
        if (st) {
            ema_destroy(e);
            return pl_error_prefix(st, "[trainer] ema_decay: the average of parameter '%s'",
                                   p->name);
        }
    }
    e->cb = (tr_callback){.struct_size = sizeof(tr_callback), .name = "ema", .self = e,
                          .on_train_step_end = ema_step_end,
                          .on_validation_start = ema_validation_start,
                          .on_validation_end = ema_validation_end,
                          .on_test_end = ema_test_end,
                          .state = ema_state,
                          .destroy = ema_destroy};
    tr_log(t, "ema: decay %g from optimizer step %lld; validation on the %s weights\n", decay,
           (long long)e->start_step, e->validate ? "averaged" : "live");
    *out = &e->cb;
    return PL_OK;
}
