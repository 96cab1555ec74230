/* optim_testkit.c - see optim_testkit.h. */
#include "optim_testkit.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config_internal.h"
#include "registry.h"
#include "runobjs.h"

#ifndef PL_FIXTURE_GOOD_DIR
#define PL_FIXTURE_GOOD_DIR PL_TEST_BINARY_DIR "/tests/fixtures/plugins/good"
#endif

cJSON *tk_json(const char *file) {
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/data/optim/%s", PL_TEST_SOURCE_DIR, file);
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "%s: cannot open (run tools/gen_optim_reference.py)", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    ck_assert_ptr_nonnull(buf);
    ck_assert_int_eq((long)fread(buf, 1, (size_t)n, f), n);
    buf[n] = '\0';
    fclose(f);
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
    r->ctx.device = PL_CPU;
    r->ctx.seed = 1;
    r->ctx.params = PL_CK_NOTNULL(pl_params_new());
    r->ctx.meta = PL_CK_NOTNULL(pl_meta_new());
}

pl_status tk_try_open(tk_run *r, const char *section, const char *plugin, const char *ini_body) {
    char ini[8192];
    snprintf(ini, sizeof ini,
             "[data]\nplugin = fx_loader\n[model]\nplugin = fx_model\n[%s]\nplugin = %s\n%s",
             section, plugin, ini_body ? ini_body : "");
    if (!r->reg) {
        r->reg = pl_registry_new();
        ck_assert_ptr_nonnull(r->reg);
        PL_CK_OK(pl_registry_add_dir(r->reg, PL_TEST_PLUGIN_DIR));
        PL_CK_OK(pl_registry_add_dir(r->reg, PL_FIXTURE_GOOD_DIR));
    }
    if (r->cfg) pl_config_free(r->cfg);
    r->cfg = pl_config_load_string(ini, "test.ini", NULL, 0, NULL, r->reg);
    if (!r->cfg) return pl_error_status() ? pl_error_status() : PL_ERR_INTERNAL;
    r->sec = pl_config_section_get(r->cfg, section);
    const pl_plugin_desc *d = pl_config_plugin(r->cfg, section);
    ck_assert_msg(r->sec && d, "[%s] not resolved", section);
    r->vtable = d->vtable;
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

void tk_close(tk_run *r) {
    pl_config_free(r->cfg);
    if (r->reg) pl_registry_free(r->reg);
    pl_params_free(r->ctx.params);
    pl_meta_free(r->ctx.meta);
    memset(r, 0, sizeof *r);
}

pl_tensor *tk_add_param(tk_run *r, const char *name, int ndim, const int64_t *shape,
                        const double *vals, bool trainable) {
    pl_tensor *t = PL_CK_NOTNULL(pl_tensor_zeros(PL_F32, ndim, shape, PL_CPU));
    if (vals) {
        float *d = pl_tensor_f32(t);
        for (int64_t i = 0; i < pl_tensor_numel(t); i++) d[i] = (float)vals[i];
    }
    pl_tensor_set_requires_grad(t, trainable);
    PL_CK_OK(pl_params_add(r->ctx.params, name, t, 0, NULL));
    pl_tensor_release(t); /* the list holds its own reference */
    return pl_params_find(r->ctx.params, name)->t;
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

#define TK_STATE_MAX 256
struct tk_state {
    int n;
    char name[TK_STATE_MAX][PL_NAME_MAX + 64];
    pl_tensor *t[TK_STATE_MAX]; /* NULL for scalars */
    double v[TK_STATE_MAX];
    bool loading;
    int used;
};

static int state_find(const tk_state *st, const char *name) {
    for (int i = 0; i < st->n; i++)
        if (!strcmp(st->name[i], name)) return i;
    return -1;
}

static pl_status visit_tensor(void *ctx, const char *name, pl_tensor *t) {
    tk_state *st = ctx;
    if (st->loading) {
        int i = state_find(st, name);
        if (i < 0 || !st->t[i]) return pl_error_set(PL_ERR_IO, "checkpoint has no tensor '%s'", name);
        st->used++;
        return pl_tensor_copy_(t, st->t[i]);
    }
    if (st->n >= TK_STATE_MAX || state_find(st, name) >= 0)
        return pl_error_set(PL_ERR_INVALID, "state name '%s' repeated or too many", name);
    snprintf(st->name[st->n], sizeof st->name[0], "%s", name);
    st->t[st->n] = pl_tensor_to(t, PL_F32, PL_CPU);
    if (!st->t[st->n]) return pl_error_status();
    st->n++;
    return PL_OK;
}

static pl_status visit_scalar(void *ctx, const char *name, double *v) {
    tk_state *st = ctx;
    if (st->loading) {
        int i = state_find(st, name);
        if (i < 0 || st->t[i]) return pl_error_set(PL_ERR_IO, "checkpoint has no scalar '%s'", name);
        st->used++;
        *v = st->v[i];
        return PL_OK;
    }
    if (st->n >= TK_STATE_MAX || state_find(st, name) >= 0)
        return pl_error_set(PL_ERR_INVALID, "state name '%s' repeated or too many", name);
    snprintf(st->name[st->n], sizeof st->name[0], "%s", name);
    st->t[st->n] = NULL;
    st->v[st->n++] = *v;
    return PL_OK;
}

tk_state *tk_state_save(tk_state_fn fn, void *self) {
    tk_state *st = calloc(1, sizeof *st);
    ck_assert_ptr_nonnull(st);
    pl_state_visitor v = {st, visit_tensor, visit_scalar};
    PL_CK_OK(fn(self, &v));
    return st;
}

void tk_state_load(tk_state *st, tk_state_fn fn, void *self) {
    st->loading = true;
    st->used = 0;
    pl_state_visitor v = {st, visit_tensor, visit_scalar};
    PL_CK_OK(fn(self, &v));
    ck_assert_msg(st->used == st->n, "load visited %d of %d saved entries", st->used, st->n);
    st->loading = false;
}

int tk_state_count(const tk_state *st) { return st->n; }

double tk_state_scalar(const tk_state *st, const char *name, bool *found) {
    int i = state_find(st, name);
    if (found) *found = i >= 0 && !st->t[i];
    return (i >= 0 && !st->t[i]) ? st->v[i] : NAN;
}

void tk_state_free(tk_state *st) {
    if (!st) return;
    for (int i = 0; i < st->n; i++) pl_tensor_release(st->t[i]);
    free(st);
}

/* ---- optimizer reference runs --------------------------------------------------- */

static void set_grad(pl_tensor *t, const cJSON *g) {
    pl_tensor_release(t->grad);
    t->grad = NULL;
    if (cJSON_IsNull(g)) return;
    int n;
    double *v = tk_doubles(g, &n);
    ck_assert_int_eq(n, pl_tensor_numel(t));
    t->grad = PL_CK_NOTNULL(pl_tensor_zeros(PL_F32, t->ndim, t->shape, PL_CPU));
    float *d = pl_tensor_f32(t->grad);
    for (int i = 0; i < n; i++) d[i] = (float)v[i];
    free(v);
}

void tk_run_optimizer_case(const cJSON *c, const char *plugin, int resume_at) {
    const char *cname = cJSON_GetObjectItemCaseSensitive(c, "name")->valuestring;
    tk_run r;
    tk_init(&r);
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(c, "params"), *p;
    int np = 0;
    pl_tensor *ts[16];
    cJSON_ArrayForEach(p, params) {
        int n, nd;
        double *init = tk_doubles(cJSON_GetObjectItemCaseSensitive(p, "init"), &n);
        double *shp = tk_doubles(cJSON_GetObjectItemCaseSensitive(p, "shape"), &nd);
        int64_t shape[PL_MAX_DIMS];
        for (int i = 0; i < nd; i++) shape[i] = (int64_t)shp[i];
        ck_assert(np < 16);
        ts[np++] = tk_add_param(&r, cJSON_GetObjectItemCaseSensitive(p, "name")->valuestring, nd,
                                shape, init, true);
        free(init);
        free(shp);
    }
    tk_open(&r, "optimizer", plugin, cJSON_GetObjectItemCaseSensitive(c, "options"), NULL);
    const pl_optimizer_vtable *vt = r.vtable;
    void *self = NULL;
    PL_CK_OK(vt->create(r.sec, &r.ctx, &self));
    const cJSON *grads = cJSON_GetObjectItemCaseSensitive(c, "grads");
    const cJSON *expected = cJSON_GetObjectItemCaseSensitive(c, "expected");
    int steps = cJSON_GetArraySize(grads);
    for (int s = 0; s < steps; s++) {
        if (resume_at > 0 && s == resume_at) {
            tk_state *st = tk_state_save(vt->state, self);
            vt->destroy(self);
            self = NULL;
            PL_CK_OK(vt->create(r.sec, &r.ctx, &self));
            tk_state_load(st, vt->state, self);
            tk_state_free(st);
        }
        const cJSON *gs = cJSON_GetArrayItem(grads, s), *es = cJSON_GetArrayItem(expected, s);
        for (int i = 0; i < np; i++) set_grad(ts[i], cJSON_GetArrayItem(gs, i));
        PL_CK_OK(vt->step(self));
        for (int i = 0; i < np; i++) {
            int n;
            double *e = tk_doubles(cJSON_GetArrayItem(es, i), &n);
            const float *d = pl_tensor_f32(ts[i]);
            for (int k = 0; k < n; k++)
                ck_assert_msg(tk_near(d[k], e[k], 1e-6, 1e-7),
                              "%s (%s): step %d, %s[%d] = %.9g, torch %.9g", cname, plugin, s,
                              ts[i]->name, k, (double)d[k], e[k]);
            free(e);
        }
    }
    vt->destroy(self);
    tk_close(&r);
}
