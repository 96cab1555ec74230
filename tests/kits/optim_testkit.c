/* optim_testkit.c - see optim_testkit.h. */
#include "optim_testkit.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

cJSON *tk_json(const char *file) {
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/data/optim/%s", PL_TEST_SOURCE_DIR, file);
    char *buf = pl_test_read_file(path); /* missing: run tools/gen_optim_reference.py */
    cJSON *root = cJSON_Parse(buf);
    free(buf);
    ck_assert_msg(root != NULL, "%s: invalid JSON", path);
    return root;
}

const cJSON *tk_cases(const cJSON *root) {
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(root, "cases");
    ck_assert_msg(cJSON_IsArray(c), "reference file without a 'cases' array");
    return c;
}

const cJSON *tk_case(const cJSON *root, const char *name) {
    const cJSON *c;
    cJSON_ArrayForEach(c, tk_cases(root)) {
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(c, "name");
        if (cJSON_IsString(n) && !strcmp(n->valuestring, name)) return c;
    }
    ck_abort_msg("reference case '%s' not found", name);
    return NULL;
}

void tk_init(tk_run *r) {
    memset(r, 0, sizeof *r);
    r->base = PL_CK_NOTNULL(pl_harness_new(NULL, NULL, NULL));
    r->ctx = pl_harness_ctx(r->base);
    r->ctx->seed = 1;
}

pl_status tk_try_open(tk_run *r, const char *section, const char *plugin, const char *ini_body) {
    pl_harness_free(r->stage);
    r->stage = pl_harness_new_shared(r->base, section, plugin, ini_body);
    if (!r->stage) return pl_error_status() ? pl_error_status() : PL_ERR_INTERNAL;
    r->sec = pl_harness_section(r->stage);
    r->vtable = pl_harness_vtable(r->stage);
    return PL_OK;
}

void tk_open(tk_run *r, const char *section, const char *plugin, const cJSON *options,
             const char *extra) {
    char body[6144] = "";
    size_t off = 0;
    const cJSON *o;
    if (options)
        cJSON_ArrayForEach(o, options) {
            ck_assert_msg(cJSON_IsString(o), "option '%s' is not a string", o->string);
            off += (size_t)snprintf(body + off, sizeof body - off, "%s = %s\n", o->string,
                                    o->valuestring);
            ck_assert(off < sizeof body);
        }
    if (extra) snprintf(body + off, sizeof body - off, "%s", extra);
    pl_status s = tk_try_open(r, section, plugin, body);
    ck_assert_msg(s == PL_OK, "config for %s failed: %s\n%s", plugin, pl_error_message(), body);
}

void tk_optimizer(tk_run *r, const char *plugin, const char *ini_body) {
    if (r->optim) {
        r->ctx->optimizer = NULL;
        r->ctx->optimizer_self = NULL;
        pl_harness_destroy(r->optim, r->optim_self);
        pl_harness_free(r->optim);
        r->optim = NULL;
        r->optim_self = NULL;
    }
    if (pl_params_count(r->ctx->params) == 0) tk_add_param(r, "tk.w", PL_SHAPE(1), NULL, true);
    r->optim = pl_harness_new_shared(r->base, "optimizer", plugin, ini_body);
    ck_assert_msg(r->optim, "config for optimizer %s failed: %s", plugin, pl_error_message());
    PL_CK_OK(pl_harness_create(r->optim, &r->optim_self));
    r->ctx->optimizer = pl_harness_vtable(r->optim);
    r->ctx->optimizer_self = r->optim_self;
}

void tk_optimizer_lr(tk_run *r, double lr) {
    char body[64];
    snprintf(body, sizeof body, "lr = %.17g\n", lr);
    tk_optimizer(r, "sgd", body);
}

void tk_close(tk_run *r) {
    if (r->optim) {
        r->ctx->optimizer = NULL;
        r->ctx->optimizer_self = NULL;
        pl_harness_destroy(r->optim, r->optim_self);
        pl_harness_free(r->optim);
    }
    pl_harness_free(r->stage);
    pl_harness_free(r->base);
    memset(r, 0, sizeof *r);
}

pl_tensor *tk_add_param(tk_run *r, const char *name, int ndim, const int64_t *shape,
                        const double *vals, bool trainable) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    float *f = NULL;
    if (vals) {
        f = malloc(sizeof(float) * (size_t)(n ? n : 1));
        ck_assert_ptr_nonnull(f);
        for (int64_t i = 0; i < n; i++) f[i] = (float)vals[i];
    }
    pl_tensor *t = PL_CK_NOTNULL(pl_harness_add_param(r->base, name, ndim, shape, f, 0, NULL, trainable));
    free(f);
    return t;
}

double *tk_doubles(const cJSON *a, int *n) {
    ck_assert_msg(cJSON_IsArray(a), "expected a JSON array");
    *n = cJSON_GetArraySize(a);
    double *v = malloc(sizeof(double) * (size_t)(*n > 0 ? *n : 1));
    ck_assert_ptr_nonnull(v);
    int i = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, a) v[i++] = cJSON_IsNumber(x) ? x->valuedouble : NAN;
    return v;
}

bool tk_near(double a, double b, double rtol, double atol) {
    if (isnan(a) || isnan(b)) return isnan(a) && isnan(b);
    return fabs(a - b) <= rtol * fabs(b) + atol;
}

/* ---- checkpoint state round trip ------------------------------------------ */

tk_state *tk_state_save(tk_state_fn fn, void *self) {
    tk_state *st = PL_CK_NOTNULL(pl_snapshot_new());
    PL_CK_OK(pl_snapshot_save_state(st, fn, self));
    return st;
}

/* every saved entry must be asked for (pl_snapshot_load_state checks) */
void tk_state_load(tk_state *st, tk_state_fn fn, void *self) {
    PL_CK_OK(pl_snapshot_load_state(st, fn, self));
}

int tk_state_count(const tk_state *st) { return pl_snapshot_count(st); }

double tk_state_scalar(const tk_state *st, const char *name, bool *found) {
    return pl_snapshot_scalar(st, name, found);
}

void tk_state_free(tk_state *st) { pl_snapshot_free(st); }

/* ---- optimizer reference runs --------------------------------------------------- */

/* Gradient g (JSON array, or null: none) of t, made on the host and moved to t's device. */
static void set_grad_on(pl_tensor *t, const cJSON *g) {
    pl_tensor_release(t->grad);
    t->grad = NULL;
    if (cJSON_IsNull(g)) return;
    int n;
    double *v = tk_doubles(g, &n);
    ck_assert_int_eq(n, pl_tensor_numel(t));
    float *f = malloc(sizeof(float) * (size_t)(n ? n : 1));
    ck_assert_ptr_nonnull(f);
    for (int i = 0; i < n; i++) f[i] = (float)v[i];
    pl_tensor *h = PL_CK_NOTNULL(pl_tensor_from_data(PL_F32, t->ndim, t->shape, f, PL_CPU));
    t->grad = PL_CK_NOTNULL(pl_tensor_to(h, PL_F32, t->device));
    pl_tensor_release(h);
    free(f);
    free(v);
}

static bool in_list(const cJSON *a, int s) {
    const cJSON *x;
    cJSON_ArrayForEach(x, a) if ((int)x->valuedouble == s) return true;
    return false;
}

float *tk_run_optimizer_case_on(const cJSON *c, const char *plugin, int resume_at, pl_device dev,
                                bool device_skip, int *n_out) {
    const char *cname = cJSON_GetObjectItemCaseSensitive(c, "name")->valuestring;
    char dname[32];
    pl_device_str(dev, dname, sizeof dname);
    tk_run r;
    tk_init(&r);
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(c, "params"), *p;
    int np = 0, total = 0;
    pl_tensor *ts[16];
    cJSON_ArrayForEach(p, params) {
        int n, nd;
        double *init = tk_doubles(cJSON_GetObjectItemCaseSensitive(p, "init"), &n);
        double *shp = tk_doubles(cJSON_GetObjectItemCaseSensitive(p, "shape"), &nd);
        int64_t shape[PL_MAX_DIMS];
        for (int i = 0; i < nd; i++) shape[i] = (int64_t)shp[i];
        ck_assert(np < 16);
        tk_add_param(&r, cJSON_GetObjectItemCaseSensitive(p, "name")->valuestring, nd, shape,
                     init, true);
        if (dev.type != PL_DEVICE_CPU) {
            pl_tensor *d = PL_CK_NOTNULL(pl_tensor_to(pl_params_at(r.ctx->params, np)->t, PL_F32, dev));
            pl_tensor_set_requires_grad(d, true);
            PL_CK_OK(pl_params_replace(r.ctx->params, np, d));
            pl_tensor_release(d);
        }
        ts[np] = pl_params_at(r.ctx->params, np)->t;
        total += n;
        np++;
        free(init);
        free(shp);
    }
    tk_open(&r, "optimizer", plugin, cJSON_GetObjectItemCaseSensitive(c, "options"), NULL);
    const pl_optimizer_vtable *vt = r.vtable;
    void *self = NULL;
    PL_CK_OK(vt->create(r.sec, r.ctx, &self));
    const cJSON *grads = cJSON_GetObjectItemCaseSensitive(c, "grads");
    const cJSON *expected = cJSON_GetObjectItemCaseSensitive(c, "expected");
    const cJSON *skips = cJSON_GetObjectItemCaseSensitive(c, "found_inf");
    pl_tensor *flag = PL_CK_NOTNULL(pl_tensor_zeros_owned(PL_F32, 1, (int64_t[]){1}, dev));
    int steps = cJSON_GetArraySize(grads);
    for (int s = 0; s < steps; s++) {
        if (resume_at > 0 && s == resume_at) {
            tk_state *st = tk_state_save(vt->state, self);
            vt->destroy(self);
            self = NULL;
            PL_CK_OK(vt->create(r.sec, r.ctx, &self));
            tk_state_load(st, vt->state, self);
            tk_state_free(st);
        }
        const cJSON *gs = cJSON_GetArrayItem(grads, s), *es = cJSON_GetArrayItem(expected, s);
        for (int i = 0; i < np; i++) set_grad_on(ts[i], cJSON_GetArrayItem(gs, i));
        bool skip = in_list(skips, s);
        if (device_skip) {
            PL_CK_OK(pl_tensor_fill_(flag, skip ? 1.0 : 0.0));
            pl_optim_set_found_inf(flag);
            pl_status st = vt->step(self);
            pl_optim_set_found_inf(NULL);
            PL_CK_OK(st);
        } else if (!skip) {
            PL_CK_OK(vt->step(self));
        }
        for (int i = 0; i < np; i++) {
            int n;
            double *e = tk_doubles(cJSON_GetArrayItem(es, i), &n);
            pl_tensor *h = PL_CK_NOTNULL(pl_tensor_to(ts[i], PL_F32, PL_CPU));
            const float *d = pl_tensor_f32(h);
            for (int k = 0; k < n; k++)
                ck_assert_msg(tk_near(d[k], e[k], 1e-6, 1e-7),
                              "%s (%s on %s, %s skip): step %d, %s[%d] = %.9g, torch %.9g", cname,
                              plugin, dname, device_skip ? "device" : "host", s, ts[i]->name, k,
                              (double)d[k], e[k]);
            pl_tensor_release(h);
            free(e);
        }
    }
    const cJSON *after = cJSON_GetObjectItemCaseSensitive(c, "steps_after");
    if (after) {
        tk_state *st = tk_state_save(vt->state, self);
        for (int i = 0; i < np; i++) {
            char key[PL_NAME_MAX + 64];
            bool found;
            snprintf(key, sizeof key, "%s.step.%s", plugin, ts[i]->name);
            double got = tk_state_scalar(st, key, &found);
            ck_assert_msg(found && got == cJSON_GetArrayItem(after, i)->valuedouble,
                          "%s (%s on %s, %s skip): %s = %g, torch's fused step %g", cname, plugin,
                          dname, device_skip ? "device" : "host", key, got,
                          cJSON_GetArrayItem(after, i)->valuedouble);
        }
        tk_state_free(st);
    }
    float *out = malloc(sizeof(float) * (size_t)(total ? total : 1));
    ck_assert_ptr_nonnull(out);
    for (int i = 0, at = 0; i < np; i++) {
        pl_tensor *h = PL_CK_NOTNULL(pl_tensor_to(ts[i], PL_F32, PL_CPU));
        memcpy(out + at, pl_tensor_f32(h), sizeof(float) * (size_t)pl_tensor_numel(h));
        at += (int)pl_tensor_numel(h);
        pl_tensor_release(h);
    }
    *n_out = total;
    pl_tensor_release(flag);
    vt->destroy(self);
    tk_close(&r);
    return out;
}

void tk_run_optimizer_case(const cJSON *c, const char *plugin, int resume_at) {
    int n;
    free(tk_run_optimizer_case_on(c, plugin, resume_at, PL_CPU, false, &n));
}
