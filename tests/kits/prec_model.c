/* prec_model.c - see prec_model.h. */
#include "prec_model.h"

#include <math.h>
#include <stdlib.h>

#include "optim_testkit.h"

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

static const char *k_half[4] = {"half.base_bf16", "half.norm_f16", "half.lora_bf16",
                                "half.stat_f16"};

void pm_add_half_params(pl_params *ps, float *vals[4]) {
    const struct {
        pl_dtype dt;
        int nd;
        int64_t shape[2];
        bool train;
        unsigned tags;
    } spec[4] = {{PL_BF16, 2, {8, 64}, false, PL_TAG_BASE},
                 {PL_F16, 1, {64}, false, 0},
                 {PL_BF16, 2, {4, 8}, true, 0},
                 {PL_F16, 1, {4}, false, PL_TAG_BUFFER}};
    for (int k = 0; k < 4; k++) {
        int64_t n = spec[k].shape[0] * (spec[k].nd == 2 ? spec[k].shape[1] : 1);
        pl_tensor *r = PL_CK_NOTNULL(pl_test_randn(1, (int64_t[]){n}, 700 + (uint64_t)k));
        uint16_t *bits = malloc((size_t)n * sizeof *bits);
        vals[k] = malloc((size_t)n * sizeof *vals[k]);
        for (int64_t i = 0; i < n; i++) {
            float x = pl_tensor_f32(r)[i];
            bits[i] = spec[k].dt == PL_BF16 ? pl_f32_to_bf16(x) : pl_f32_to_f16(x);
            vals[k][i] = spec[k].dt == PL_BF16 ? pl_bf16_to_f32(bits[i]) : pl_f16_to_f32(bits[i]);
        }
        pl_tensor *t = PL_CK_NOTNULL(
            pl_tensor_from_data(spec[k].dt, spec[k].nd, spec[k].shape, bits, PL_CPU));
        pl_tensor_set_requires_grad(t, spec[k].train);
        PL_CK_OK(pl_params_add(ps, k_half[k], t, spec[k].tags, NULL));
        pl_tensor_release(t);
        pl_tensor_release(r);
        free(bits);
    }
}

static float round_to(float x, pl_dtype dt) {
    return dt == PL_BF16 ? pl_bf16_to_f32(pl_f32_to_bf16(x))
           : dt == PL_F16 ? pl_f16_to_f32(pl_f32_to_f16(x))
                          : x;
}

void pm_check_half_params(pl_params *ps, float *vals[4], pl_tensor *hdr[4], pl_dtype base,
                          pl_dtype norm) {
    const pl_dtype want[4] = {base, norm, PL_F32, PL_F32};
    for (int k = 0; k < 4; k++) {
        pl_tensor *t = PL_CK_NOTNULL(pl_params_find(ps, k_half[k]))->t;
        ck_assert_msg(t->dtype == want[k], "%s: dtype %s after setup, expected %s", k_half[k],
                      pl_dtype_name(t->dtype), pl_dtype_name(want[k]));
        if (want[k] == PL_NF4) continue;
        ck_assert_msg(t == hdr[k], "%s: converted into a new header, expected in place", k_half[k]);
        ck_assert(pl_tensor_is_contiguous(t));
        for (int64_t i = 0; i < pl_tensor_numel(t); i++) {
            float got = (float)pl_tensor_get(t, i), exp = round_to(vals[k][i], want[k]);
            ck_assert_msg(got == exp, "%s[%lld] = %.9g, expected %.9g", k_half[k], (long long)i,
                          got, exp);
        }
    }
}

void pm_setup_converts_half_params(const char *plugin, const char *ini_body, pl_dtype base,
                                   pl_dtype norm) {
    tk_run r;
    tk_init(&r);
    float *vals[4];
    pm_add_half_params(r.ctx->params, vals);
    pl_tensor *hdr[4];
    for (int k = 0; k < 4; k++) hdr[k] = pl_tensor_retain(pl_params_find(r.ctx->params, k_half[k])->t);
    pl_status s = tk_try_open(&r, "precision", plugin, ini_body);
    ck_assert_msg(s == PL_OK, "%s: %s", plugin, pl_error_message());
    const pl_precision_vtable *vt = r.vtable;
    void *self = NULL;
    PL_CK_OK(vt->create(r.sec, r.ctx, &self));
    PL_CK_OK(vt->setup(self, r.ctx->params));
    pm_check_half_params(r.ctx->params, vals, hdr, base, norm);
    PL_CK_OK(vt->setup(self, r.ctx->params)); /* after init_from: nothing changes */
    pm_check_half_params(r.ctx->params, vals, hdr, base, norm);
    vt->destroy(self);
    for (int k = 0; k < 4; k++) {
        pl_tensor_release(hdr[k]);
        free(vals[k]);
    }
    tk_close(&r);
}
