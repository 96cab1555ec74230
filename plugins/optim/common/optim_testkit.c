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
    PL_CK_OK(pl_params_add(r->ctx.params, name, t, 0));
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
