/* prec_model.c - see prec_model.h. */
#include "prec_model.h"

#include <math.h>

static void add(pl_params *ps, const char *name, int64_t r, int64_t c, double std, uint64_t seed,
                bool train, unsigned tags, const char *role) {
    pl_tensor *t = PL_CK_NOTNULL(pl_test_randn(PL_SHAPE(r, c), seed));
    float *d = pl_tensor_f32(t);
    for (int64_t i = 0; i < r * c; i++) d[i] = (float)(d[i] * std);
    pl_tensor_set_requires_grad(t, train);
    PL_CK_OK(pl_params_add(ps, name, t, tags, role));
    pl_tensor_release(t);
}

void pm_add_params(pl_params *ps, uint64_t seed) {
    add(ps, "base.weight", PM_H, PM_D, 0.2, seed, false, PL_TAG_BASE, NULL);
    add(ps, "lora.A", PM_R, PM_D, 0.1, seed + 1, true, 0, "lora");
    add(ps, "lora.B", PM_H, PM_R, 0.1, seed + 2, true, 0, "lora");
    add(ps, "head.weight", 1, PM_H, 0.2, seed + 3, true, 0, "head");
    pl_tensor *b = PL_CK_NOTNULL(pl_tensor_zeros(PL_F32, PL_SHAPE(1), PL_CPU));
    pl_tensor_set_requires_grad(b, true);
    PL_CK_OK(pl_params_add(ps, "head.bias", b, PL_TAG_NO_DECAY, "head"));
    pl_tensor_release(b);
}

void pm_batch(pl_tensor **x, pl_tensor **target) {
    *x = PL_CK_NOTNULL(pl_test_randn(PL_SHAPE(PM_B, PM_D), 900));
    *target = PL_CK_NOTNULL(pl_test_randn(PL_SHAPE(PM_B, 1), 901));
}

static pl_tensor *P(pl_params *ps, const char *n) {
    pl_param *p = pl_params_find(ps, n);
    return p ? p->t : NULL;
}

pl_tensor *pm_forward(pl_params *ps, pl_tensor *x) {
    pl_tensor *w = P(ps, "base.weight");
    pl_tensor *h = w->dtype == PL_NF4 ? pl_nf4_matmul(x, w) : pl_linear(x, w, NULL);
    pl_tensor *lora = pl_linear(pl_linear(x, P(ps, "lora.A"), NULL), P(ps, "lora.B"), NULL);
    h = pl_relu(pl_add(h, lora));
    return pl_linear(h, P(ps, "head.weight"), P(ps, "head.bias"));
}

pl_tensor *pm_loss(pl_params *ps, pl_tensor *x, pl_tensor *target) {
    return pl_mse_loss(pl_cast(pm_forward(ps, x), PL_F32), target);
}

double pm_train_step(const pl_precision_vtable *vt, void *self, pl_params *ps, pl_tensor *x,
                     pl_tensor *target, double lr, bool *stepped) {
    pl_frame_begin();
    pl_tensor *loss = pm_loss(ps, x, target);
    ck_assert_msg(loss != NULL, "forward: %s", pl_error_message());
    double lv = pl_tensor_item(loss);
    PL_CK_OK(pl_backward(loss, vt->loss_scale(self)));
    pl_frame_end();
    bool ok = vt->before_step(self, ps);
    if (ok) {
        for (int i = 0; i < pl_params_count(ps); i++) {
            pl_tensor *t = pl_params_at(ps, i)->t;
            if (!t->requires_grad || !t->grad) continue;
            float *w = pl_tensor_f32(t);
            const float *g = pl_tensor_f32(t->grad);
            for (int64_t j = 0; j < pl_tensor_numel(t); j++) w[j] -= (float)(lr * g[j]);
        }
        if (vt->after_step) PL_CK_OK(vt->after_step(self, ps));
    }
    for (int i = 0; i < pl_params_count(ps); i++) pl_tensor_zero_grad(pl_params_at(ps, i)->t);
    if (stepped) *stepped = ok;
    return lv;
}
