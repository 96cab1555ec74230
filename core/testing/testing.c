/* testing.c - the plugin test harness (pipeline/testing.h): a stage built
 * from an INI snippet through the real registry and config validation, its
 * state round-tripped through in-memory snapshots, batches checked against
 * the declared field contract, and a numerical gradient check of a model's
 * training loss. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend_loader.h"
#include "config_internal.h"
#include "internal.h"
#include "pipeline/testing.h"
#include "registry.h"
#include "stage.h"

struct pl_harness {
    pl_registry *reg;
    pl_config *cfg;
    const pl_config_section *sec;
    const pl_plugin_desc *desc;
    pl_run_context own;  /* the context unless shared */
    pl_run_context *ctx; /* &own, or the base harness's */
    bool shared;
    pl_data_split split; /* of the loader's epoch in progress (pl_harness_epoch_begin) */
    struct pl_harness *older; /* the next live harness with its own context (this thread) */
};

/* The live harnesses with their own context on this thread, newest first,
 * and the context current before the first of them: the newest one's
 * context is current (plugin.h, "Autocast"), as a run's is for the run. */
static _Thread_local pl_harness *tl_live;
static _Thread_local pl_run_context *tl_outer;

static void ctx_enter(pl_harness *h) {
    if (!tl_live) tl_outer = pl_run_context_current();
    h->older = tl_live;
    tl_live = h;
    pl_run_context_make_current(&h->own);
}

static void ctx_leave(pl_harness *h) {
    pl_harness **p = &tl_live;
    while (*p && *p != h) p = &(*p)->older;
    if (!*p) return; /* never entered (failed build) or another thread's */
    *p = h->older;
    if (pl_run_context_current() == &h->own)
        pl_run_context_make_current(tl_live ? &tl_live->own : tl_outer);
}

/* ======================================================================
 * Building a stage
 * ====================================================================== */

static pl_registry *registry_with(const char *plugin_dirs) {
    pl_registry *r = pl_registry_new();
    if (!r) {
        pl_error_set(PL_ERR_NOMEM, "harness: out of memory");
        return NULL;
    }
    if (plugin_dirs && *plugin_dirs) {
        char *copy = strdup(plugin_dirs), *save = NULL;
        if (!copy) {
            pl_registry_free(r);
            pl_error_set(PL_ERR_NOMEM, "harness: out of memory");
            return NULL;
        }
        for (char *d = strtok_r(copy, ":", &save); d; d = strtok_r(NULL, ":", &save))
            pl_registry_add_dir(r, d);
        free(copy);
    }
    if (pl_registry_add_default_dirs(r)) {
        pl_registry_free(r);
        return NULL;
    }
    return r;
}

static pl_harness *harness_build(const char *plugin_dirs, pl_run_context *shared_ctx,
                                 const char *section, const char *plugin, const char *ini_body) {
    pl_harness *h = calloc(1, sizeof *h);
    if (!h) {
        pl_error_set(PL_ERR_NOMEM, "harness: out of memory");
        return NULL;
    }
    if (shared_ctx) {
        h->ctx = shared_ctx;
        h->shared = true;
    } else {
        h->ctx = &h->own;
        h->own.device = PL_CPU;
        h->own.seed = 1;
        h->own.params = pl_params_new();
        h->own.meta = pl_meta_new();
        if (!h->own.params || !h->own.meta) {
            pl_error_set(PL_ERR_NOMEM, "harness: out of memory");
            goto fail;
        }
        ctx_enter(h);
    }
    if (!section && !plugin) return h; /* context only */
    if (!section || !plugin) {
        pl_error_set(PL_ERR_INVALID, "pl_harness_new: a section needs a plugin and the reverse "
                     "(section %s, plugin %s)", section ? section : "NULL",
                     plugin ? plugin : "NULL");
        goto fail;
    }
    if (!(h->reg = registry_with(plugin_dirs))) goto fail;
    size_t n = strlen(section) + strlen(plugin) + (ini_body ? strlen(ini_body) : 0) + 32;
    char *ini = malloc(n);
    if (!ini) {
        pl_error_set(PL_ERR_NOMEM, "harness: out of memory");
        goto fail;
    }
    snprintf(ini, n, "[%s]\nplugin = %s\n%s\n", section, plugin, ini_body ? ini_body : "");
    h->cfg = pl_config_load_partial(ini, "test.ini", h->reg);
    free(ini);
    if (!h->cfg) goto fail;
    h->sec = pl_config_section_get(h->cfg, section);
    h->desc = pl_config_plugin(h->cfg, section);
    if (!h->sec || !h->desc) {
        pl_error_set(PL_ERR_CONFIG, "harness: [%s] is not a stage section", section);
        goto fail;
    }
    return h;
fail: {
    /* keep the first error: freeing must not overwrite it */
    pl_status st = pl_error_status();
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", pl_error_message());
    pl_harness_free(h);
    pl_error_set(st ? st : PL_ERR_INTERNAL, "%s", msg);
    return NULL;
}
}

pl_harness *pl_harness_new(const char *section, const char *plugin, const char *ini_body) {
    return harness_build(NULL, NULL, section, plugin, ini_body);
}

pl_harness *pl_harness_new_in(const char *plugin_dirs, const char *section, const char *plugin,
                              const char *ini_body) {
    return harness_build(plugin_dirs, NULL, section, plugin, ini_body);
}

pl_harness *pl_harness_new_shared(pl_harness *base, const char *section, const char *plugin,
                                  const char *ini_body) {
    if (!base) {
        pl_error_set(PL_ERR_INVALID, "pl_harness_new_shared: NULL base harness");
        return NULL;
    }
    return harness_build(NULL, base->ctx, section, plugin, ini_body);
}

void pl_harness_free(pl_harness *h) {
    if (!h) return;
    if (!h->shared) ctx_leave(h);
    pl_config_free(h->cfg);
    pl_registry_free(h->reg);
    if (!h->shared) {
        pl_params_free(h->own.params);
        pl_meta_free(h->own.meta);
    }
    free(h);
}

pl_run_context *pl_harness_ctx(pl_harness *h) { return h ? h->ctx : NULL; }
const pl_config_section *pl_harness_section(const pl_harness *h) { return h ? h->sec : NULL; }
const void *pl_harness_vtable(const pl_harness *h) {
    return h && h->desc ? h->desc->vtable : NULL;
}
const pl_plugin_desc *pl_harness_desc(const pl_harness *h) { return h ? h->desc : NULL; }

static pl_status stage_fns(const pl_harness *h, pl_stage_fns *f) {
    if (!h || !h->desc)
        return pl_error_set(PL_ERR_INVALID, "harness: no plugin (a context-only harness)");
    return pl_stage_fns_of(h->desc, "", f);
}

pl_status pl_harness_create(pl_harness *h, void **self) {
    if (!self) return pl_error_set(PL_ERR_INVALID, "pl_harness_create: NULL self");
    *self = NULL;
    pl_stage_fns f;
    pl_status s = stage_fns(h, &f);
    return s ? s : f.create(h->sec, h->ctx, self);
}

void pl_harness_destroy(pl_harness *h, void *self) {
    pl_stage_fns f;
    if (!self || stage_fns(h, &f)) return;
    f.destroy(self);
}

pl_status pl_harness_find_plugin(const char *name, pl_plugin_kind kind,
                                 const pl_plugin_desc **desc) {
    if (!name || !desc) return pl_error_set(PL_ERR_INVALID, "pl_harness_find_plugin: NULL argument");
    pl_registry *r = registry_with(NULL);
    if (!r) return pl_error_status();
    pl_status st = pl_registry_find(r, name, kind, desc, NULL);
    pl_registry_free(r); /* handles stay open: *desc stays valid */
    return st;
}

pl_status pl_harness_load_backend(pl_device_type type) {
    return pl_backend_load(NULL, type);
}
pl_status pl_harness_load_backend_named(pl_device_type type, const char *name) {
    return pl_backend_load_named(NULL, type, name);
}

/* ======================================================================
 * Parameters
 * ====================================================================== */

pl_tensor *pl_harness_add_param(pl_harness *h, const char *name, int ndim, const int64_t *shape,
                                const float *values, unsigned tags, const char *role,
                                bool trainable) {
    if (!h || !name) {
        pl_error_set(PL_ERR_INVALID, "pl_harness_add_param: NULL %s", !h ? "harness" : "name");
        return NULL;
    }
    pl_tensor *t = pl_tensor_new_owned_zeros(PL_F32, ndim, shape, PL_CPU);
    if (!t) {
        pl_error_prefix(pl_error_status(), "parameter '%s'", name);
        return NULL;
    }
    if (values) memcpy(pl_tensor_data(t), values, sizeof(float) * (size_t)pl_tensor_numel(t));
    pl_tensor_set_requires_grad(t, trainable);
    pl_status st = pl_params_add(h->ctx->params, name, t, tags, role);
    pl_tensor_release(t); /* the list holds its own reference */
    if (st) return NULL;
    return pl_params_find(h->ctx->params, name)->t;
}

pl_status pl_harness_set_grad(pl_harness *h, const char *name, const float *values) {
    pl_param *p = h && name ? pl_params_find(h->ctx->params, name) : NULL;
    if (!p) return pl_error_set(PL_ERR_INVALID, "harness: no parameter '%s'", name ? name : "NULL");
    pl_tensor *t = p->t;
    pl_tensor_release(t->grad);
    t->grad = NULL;
    if (!values) return PL_OK;
    pl_tensor *host = pl_tensor_new_owned(PL_F32, t->ndim, t->shape, PL_CPU);
    if (!host) return pl_error_status();
    memcpy(pl_tensor_data(host), values, sizeof(float) * (size_t)pl_tensor_numel(host));
    if (t->device.type == PL_DEVICE_CPU) {
        t->grad = host;
        return PL_OK;
    }
    t->grad = pl_tensor_new_owned(PL_F32, t->ndim, t->shape, t->device);
    pl_status st = t->grad ? pl_tensor_copy_(t->grad, host) : pl_error_status();
    pl_tensor_release(host);
    return st;
}

/* ======================================================================
 * Snapshots
 * ====================================================================== */

typedef struct snap_entry {
    char *name;
    pl_tensor *t; /* NULL: scalar */
    double v;
} snap_entry;

struct pl_snapshot {
    int n, cap;
    snap_entry *e;
};

/* state of one pass of the visitor over a snapshot */
typedef struct snap_pass {
    pl_snapshot *s;       /* saving */
    const pl_snapshot *r; /* loading */
    bool *used;
} snap_pass;

pl_snapshot *pl_snapshot_new(void) {
    pl_snapshot *s = calloc(1, sizeof *s);
    if (!s) pl_error_set(PL_ERR_NOMEM, "snapshot: out of memory");
    return s;
}

void pl_snapshot_free(pl_snapshot *s) {
    if (!s) return;
    for (int i = 0; i < s->n; i++) {
        free(s->e[i].name);
        pl_tensor_release(s->e[i].t);
    }
    free(s->e);
    free(s);
}

static int snap_find(const pl_snapshot *s, const char *name) {
    for (int i = 0; s && i < s->n; i++)
        if (!strcmp(s->e[i].name, name)) return i;
    return -1;
}

static pl_status snap_append(pl_snapshot *s, const char *name, const pl_tensor *t, double v) {
    if (snap_find(s, name) >= 0)
        return pl_error_set(PL_ERR_INVALID, "snapshot: state entry '%s' listed twice", name);
    if (s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 32;
        snap_entry *e = realloc(s->e, (size_t)cap * sizeof *e);
        if (!e) return pl_error_set(PL_ERR_NOMEM, "snapshot: out of memory");
        s->e = e;
        s->cap = cap;
    }
    snap_entry *e = &s->e[s->n];
    memset(e, 0, sizeof *e);
    if (!(e->name = strdup(name))) return pl_error_set(PL_ERR_NOMEM, "snapshot: out of memory");
    if (t) {
        if (t->dtype == PL_NF4) {
            free(e->name);
            return pl_error_set(PL_ERR_DTYPE, "snapshot: '%s' is nf4 (save its dequantized form)",
                                name);
        }
        e->t = pl_tensor_new_owned(t->dtype, t->ndim, t->shape, PL_CPU);
        pl_status st = e->t ? pl_tensor_copy_(e->t, t) : pl_error_status();
        if (st) {
            pl_tensor_release(e->t);
            free(e->name);
            return pl_error_prefix(st, "snapshot: '%s'", name);
        }
    }
    e->v = v;
    s->n++;
    return PL_OK;
}

static pl_status visit_tensor(void *ctx, const char *name, pl_tensor *t) {
    snap_pass *p = ctx;
    if (!name || !t) return pl_error_set(PL_ERR_INVALID, "snapshot: NULL name or tensor");
    if (p->s) return snap_append(p->s, name, t, 0);
    int i = snap_find(p->r, name);
    if (i < 0 || !p->r->e[i].t)
        return pl_error_set(PL_ERR_IO, "snapshot has no tensor '%s'", name);
    p->used[i] = true;
    pl_status st = pl_tensor_copy_(t, p->r->e[i].t);
    return st ? pl_error_prefix(st, "snapshot: loading '%s'", name) : PL_OK;
}

static pl_status visit_scalar(void *ctx, const char *name, double *v) {
    snap_pass *p = ctx;
    if (!name || !v) return pl_error_set(PL_ERR_INVALID, "snapshot: NULL name or scalar");
    if (p->s) return snap_append(p->s, name, NULL, *v);
    int i = snap_find(p->r, name);
    if (i < 0 || p->r->e[i].t) return pl_error_set(PL_ERR_IO, "snapshot has no scalar '%s'", name);
    p->used[i] = true;
    *v = p->r->e[i].v;
    return PL_OK;
}

pl_status pl_snapshot_save_state(pl_snapshot *s, pl_state_fn fn, void *self) {
    if (!s || !fn) return pl_error_set(PL_ERR_INVALID, "pl_snapshot_save_state: NULL argument");
    snap_pass p = {.s = s};
    pl_state_visitor v = {&p, visit_tensor, visit_scalar, false};
    return fn(self, &v);
}

static pl_status check_all_used(const pl_snapshot *s, const bool *used, const char *what) {
    for (int i = 0; i < s->n; i++)
        if (!used[i])
            return pl_error_set(PL_ERR_INVALID, "snapshot entry '%s' was not asked for by the %s",
                                s->e[i].name, what);
    return PL_OK;
}

pl_status pl_snapshot_load_state(const pl_snapshot *s, pl_state_fn fn, void *self) {
    if (!s || !fn) return pl_error_set(PL_ERR_INVALID, "pl_snapshot_load_state: NULL argument");
    bool *used = calloc((size_t)s->n + 1, sizeof *used);
    if (!used) return pl_error_set(PL_ERR_NOMEM, "snapshot: out of memory");
    snap_pass p = {.r = s, .used = used};
    pl_state_visitor v = {&p, visit_tensor, visit_scalar, true};
    pl_status st = fn(self, &v);
    if (!st) st = check_all_used(s, used, "plugin");
    free(used);
    return st;
}

pl_status pl_snapshot_save_params(pl_snapshot *s, pl_params *ps) {
    if (!s || !ps) return pl_error_set(PL_ERR_INVALID, "pl_snapshot_save_params: NULL argument");
    for (int i = 0; i < pl_params_count(ps); i++) {
        pl_param *p = pl_params_at(ps, i);
        pl_status st = snap_append(s, p->name, p->t, 0);
        if (st) return st;
    }
    return PL_OK;
}

pl_status pl_snapshot_load_params(const pl_snapshot *s, pl_params *ps) {
    if (!s || !ps) return pl_error_set(PL_ERR_INVALID, "pl_snapshot_load_params: NULL argument");
    bool *used = calloc((size_t)s->n + 1, sizeof *used);
    if (!used) return pl_error_set(PL_ERR_NOMEM, "snapshot: out of memory");
    snap_pass p = {.r = s, .used = used};
    pl_status st = PL_OK;
    for (int i = 0; i < pl_params_count(ps) && !st; i++) {
        pl_param *q = pl_params_at(ps, i);
        st = visit_tensor(&p, q->name, q->t);
    }
    if (!st) st = check_all_used(s, used, "parameter list");
    free(used);
    return st;
}

int pl_snapshot_count(const pl_snapshot *s) { return s ? s->n : 0; }
const char *pl_snapshot_name_at(const pl_snapshot *s, int i) {
    return s && i >= 0 && i < s->n ? s->e[i].name : NULL;
}

const pl_tensor *pl_snapshot_tensor(const pl_snapshot *s, const char *name) {
    int i = name ? snap_find(s, name) : -1;
    return i >= 0 ? s->e[i].t : NULL;
}

double pl_snapshot_scalar(const pl_snapshot *s, const char *name, bool *found) {
    int i = name ? snap_find(s, name) : -1;
    bool ok = i >= 0 && !s->e[i].t;
    if (found) *found = ok;
    return ok ? s->e[i].v : NAN;
}

static void put_msg(char *msg, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void put_msg(char *msg, size_t n, const char *fmt, ...) {
    if (!msg || !n) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, n, fmt, ap);
    va_end(ap);
}

bool pl_snapshot_equal(const pl_snapshot *a, const pl_snapshot *b, char *msg, size_t msgn) {
    if (!a || !b) {
        put_msg(msg, msgn, "NULL snapshot");
        return false;
    }
    for (int i = 0; i < a->n && i < b->n; i++) {
        const snap_entry *x = &a->e[i], *y = &b->e[i];
        if (strcmp(x->name, y->name)) {
            put_msg(msg, msgn, "entry %d is '%s' in one and '%s' in the other", i, x->name, y->name);
            return false;
        }
        if (!x->t != !y->t) {
            put_msg(msg, msgn, "'%s' is a tensor in one and a scalar in the other", x->name);
            return false;
        }
        if (!x->t) {
            if (memcmp(&x->v, &y->v, sizeof x->v) && !(isnan(x->v) && isnan(y->v))) {
                put_msg(msg, msgn, "scalar '%s': %.17g vs %.17g", x->name, x->v, y->v);
                return false;
            }
            continue;
        }
        char d1[256], d2[256];
        if (x->t->dtype != y->t->dtype || !pl_tensor_same_shape(x->t, y->t)) {
            put_msg(msg, msgn, "'%s': %s vs %s", x->name, pl_tensor_describe(x->t, d1, sizeof d1),
                    pl_tensor_describe(y->t, d2, sizeof d2));
            return false;
        }
        size_t es = pl_dtype_size(x->t->dtype);
        const unsigned char *p = pl_tensor_data(x->t), *q = pl_tensor_data(y->t);
        for (int64_t k = 0; k < pl_tensor_numel(x->t); k++)
            if (memcmp(p + (size_t)k * es, q + (size_t)k * es, es)) {
                put_msg(msg, msgn, "'%s'[%lld]: %.9g vs %.9g", x->name, (long long)k,
                        pl_tensor_get(x->t, k), pl_tensor_get(y->t, k));
                return false;
            }
    }
    if (a->n != b->n) {
        const pl_snapshot *l = a->n > b->n ? a : b;
        put_msg(msg, msgn, "%d vs %d entries (first extra: '%s')", a->n, b->n,
                l->e[a->n < b->n ? a->n : b->n].name);
        return false;
    }
    return true;
}

/* a model's state is its parameters; a loader has none */
static pl_status model_params_state(void *self, const pl_state_visitor *v) {
    pl_params *ps = self;
    for (int i = 0; i < pl_params_count(ps); i++) {
        pl_param *p = pl_params_at(ps, i);
        pl_status st = v->tensor(v->ctx, p->name, p->t);
        if (st) return st;
    }
    return PL_OK;
}

static pl_status no_state(void *self, const pl_state_visitor *v) {
    (void)self;
    (void)v;
    return PL_OK;
}

static pl_status harness_state_fn(pl_harness *h, void **self, pl_state_fn *fn) {
    pl_stage_fns f;
    pl_status st = stage_fns(h, &f);
    if (st) return st;
    *fn = f.state;
    if (h->desc->kind == PL_KIND_MODEL) {
        *fn = model_params_state;
        *self = h->ctx->params;
    } else if (h->desc->kind == PL_KIND_LOADER) {
        *fn = no_state;
    } else if (!*fn) {
        return pl_error_set(PL_ERR_ABI, "harness: plugin %s has no state function", h->desc->name);
    }
    return PL_OK;
}

pl_snapshot *pl_harness_state_save(pl_harness *h, void *self) {
    pl_state_fn fn;
    if (harness_state_fn(h, &self, &fn)) return NULL;
    pl_snapshot *s = pl_snapshot_new();
    if (s && pl_snapshot_save_state(s, fn, self)) {
        pl_status st = pl_error_status();
        char m[1024];
        snprintf(m, sizeof m, "%s", pl_error_message());
        pl_snapshot_free(s);
        pl_error_set(st, "%s: %s", h->desc->name, m);
        return NULL;
    }
    return s;
}

pl_status pl_harness_state_load(pl_harness *h, void *self, const pl_snapshot *s) {
    pl_state_fn fn;
    pl_status st = harness_state_fn(h, &self, &fn);
    if (st) return st;
    st = pl_snapshot_load_state(s, fn, self);
    return st ? pl_error_prefix(st, "%s", h->desc->name) : PL_OK;
}

/* ======================================================================
 * Batches
 * ====================================================================== */

pl_status pl_harness_batch_add(pl_batch *b, const char *name, pl_tensor *t) {
    if (!b || !name || !t) return pl_error_set(PL_ERR_INVALID, "pl_harness_batch_add: NULL argument");
    for (int i = 0; i < b->n; i++)
        if (!strcmp(b->names[i], name))
            return pl_error_set(PL_ERR_INVALID, "batch: field '%s' added twice", name);
    if (b->n >= PL_BATCH_MAX_FIELDS)
        return pl_error_set(PL_ERR_INVALID, "batch: more than %d fields ('%s')",
                            PL_BATCH_MAX_FIELDS, name);
    b->names[b->n] = name;
    b->fields[b->n++] = t;
    return PL_OK;
}

pl_status pl_harness_check_batch(pl_harness *h, const pl_batch *b, pl_data_split split) {
    if (!h || !h->desc || !b) return pl_error_set(PL_ERR_INVALID, "pl_harness_check_batch: NULL argument");
    pl_field_list l;
    memset(&l, 0, sizeof l);
    pl_status st;
    bool loader = h->desc->kind == PL_KIND_LOADER;
    if (loader)
        st = ((const pl_loader_vtable *)h->desc->vtable)->batch_fields(h->sec, &l);
    else if (h->desc->kind == PL_KIND_MODEL)
        st = ((const pl_model_vtable *)h->desc->vtable)->batch_needs(h->sec, &l);
    else
        return pl_error_set(PL_ERR_INVALID, "harness: %s is a %s: only loaders and models have "
                            "batch fields", h->desc->name, pl_plugin_kind_name(h->desc->kind));
    if (st) return pl_error_prefix(st, "%s: %s", h->desc->name, loader ? "batch_fields" : "batch_needs");
    const char *who = h->desc->name, *sp = pl_split_name(split);
    for (int i = 0; i < l.n; i++) {
        const pl_field_spec *f = &l.f[i];
        if (!pl_field_in_split(f, split)) continue;
        const pl_tensor *t = NULL;
        for (int k = 0; k < b->n && !t; k++)
            if (!strcmp(b->names[k], f->name)) t = b->fields[k];
        if (!t) {
            if (f->optional) continue;
            return pl_error_set(PL_ERR_INVALID, "%s: %s batch has no field '%s' (%s declares it%s)",
                                who, sp, f->name, loader ? "batch_fields" : "batch_needs",
                                loader ? "" : " required");
        }
        if (!pl_field_dtype_accepts(f->dtype, t->dtype))
            return pl_error_set(PL_ERR_INVALID, "%s: %s batch field '%s' is %s, declared %s", who,
                                sp, f->name, pl_dtype_name(t->dtype), pl_field_dtype_name(f->dtype));
        if (f->rank >= 0 && t->ndim != f->rank)
            return pl_error_set(PL_ERR_INVALID, "%s: %s batch field '%s' has rank %d, declared %d",
                                who, sp, f->name, t->ndim, f->rank);
    }
    if (!loader) return PL_OK;
    for (int k = 0; k < b->n; k++) {
        bool declared = false;
        for (int i = 0; i < l.n && !declared; i++)
            declared = pl_field_in_split(&l.f[i], split) && !strcmp(l.f[i].name, b->names[k]);
        if (!declared)
            return pl_error_set(PL_ERR_INVALID, "%s: %s batch carries field '%s' that "
                                "batch_fields does not declare for that split", who, sp,
                                b->names[k]);
    }
    return PL_OK;
}

static const pl_loader_vtable *loader_vt(pl_harness *h) {
    if (!h || !h->desc || h->desc->kind != PL_KIND_LOADER) {
        pl_error_set(PL_ERR_INVALID, "harness: %s is not a loader",
                     h && h->desc ? h->desc->name : "(no plugin)");
        return NULL;
    }
    return h->desc->vtable;
}

pl_status pl_harness_epoch_begin(pl_harness *h, void *self, pl_data_split split, int64_t epoch,
                                 int64_t start_batch) {
    const pl_loader_vtable *vt = loader_vt(h);
    if (!vt) return pl_error_status();
    h->split = split;
    return vt->epoch_begin(self, split, epoch, start_batch);
}

int pl_harness_next(pl_harness *h, void *self, pl_batch *out) {
    const pl_loader_vtable *vt = loader_vt(h);
    if (!vt) return -1;
    memset(out, 0, sizeof *out);
    int r = vt->next(self, out);
    if (r == 1 && pl_harness_check_batch(h, out, h->split)) return -1;
    return r;
}

pl_status pl_harness_run_epoch(pl_harness *h, void *self, pl_data_split split, int64_t epoch,
                               int64_t *batches, int64_t *samples) {
    const pl_loader_vtable *vt = loader_vt(h);
    if (!vt) return pl_error_status();
    pl_status st = pl_harness_epoch_begin(h, self, split, epoch, 0);
    if (st) return st;
    int64_t nb = 0, ns = 0;
    pl_batch b;
    for (;;) {
        memset(&b, 0, sizeof b);
        int r = vt->next(self, &b);
        if (r < 0) return pl_error_status() ? pl_error_status() : PL_ERR_INTERNAL;
        if (r == 0) break;
        if ((st = pl_harness_check_batch(h, &b, split))) return st;
        if (b.index != nb)
            return pl_error_set(PL_ERR_INVALID, "%s: %s batch %lld carries index %lld",
                                h->desc->name, pl_split_name(split), (long long)nb,
                                (long long)b.index);
        nb++;
        ns += b.size;
    }
    int64_t want = vt->num_batches(self, split);
    if (nb != want)
        return pl_error_set(PL_ERR_INVALID, "%s: %s epoch served %lld batches, num_batches says %lld",
                            h->desc->name, pl_split_name(split), (long long)nb, (long long)want);
    if (batches) *batches = nb;
    if (samples) *samples = ns;
    return PL_OK;
}

/* ======================================================================
 * Models
 * ====================================================================== */

static const pl_model_vtable *model_vt(pl_harness *h) {
    if (!h || !h->desc || h->desc->kind != PL_KIND_MODEL) {
        pl_error_set(PL_ERR_INVALID, "harness: %s is not a model",
                     h && h->desc ? h->desc->name : "(no plugin)");
        return NULL;
    }
    return h->desc->vtable;
}

pl_status pl_harness_forward(pl_harness *h, void *self, const pl_batch *b, pl_data_split split,
                             bool training, double *loss, pl_metrics *m) {
    const pl_model_vtable *vt = model_vt(h);
    if (!vt) return pl_error_status();
    if (!training) pl_no_grad_begin();
    pl_frame_begin();
    pl_tensor *l = NULL;
    pl_status st = vt->forward(self, b, split, training, &l, m);
    if (loss) *loss = !st && l ? pl_tensor_item(l) : NAN;
    if (training) pl_tape_clear();
    pl_frame_end();
    if (!training) pl_no_grad_end();
    return st;
}

void pl_harness_zero_grad(pl_harness *h) {
    if (!h) return;
    for (int i = 0; i < pl_params_count(h->ctx->params); i++)
        pl_tensor_zero_grad(pl_params_at(h->ctx->params, i)->t);
}

pl_status pl_harness_backward(pl_harness *h, void *self, const pl_batch *b, double *loss) {
    const pl_model_vtable *vt = model_vt(h);
    if (!vt) return pl_error_status();
    pl_frame_begin();
    pl_tensor *l = NULL;
    pl_status st = vt->forward(self, b, PL_SPLIT_TRAIN, true, &l, NULL);
    if (!st && !l) st = pl_error_set(PL_ERR_INVALID, "%s: training forward set no loss", h->desc->name);
    if (loss) *loss = st ? NAN : pl_tensor_item(l);
    if (!st) st = pl_backward(l, 1.0);
    if (st) pl_tape_clear();
    pl_frame_end();
    return st;
}

pl_status pl_harness_train_step(pl_harness *mh, void *model, pl_harness *oh, void *opt,
                                const pl_batch *b, double *loss) {
    if (!oh || !oh->desc || oh->desc->kind != PL_KIND_OPTIMIZER)
        return pl_error_set(PL_ERR_INVALID, "pl_harness_train_step: the second harness is not an optimizer");
    if (!mh || oh->ctx != mh->ctx)
        return pl_error_set(PL_ERR_INVALID, "pl_harness_train_step: the optimizer harness must "
                            "share the model's context (pl_harness_new_shared)");
    const pl_optimizer_vtable *ovt = oh->desc->vtable;
    pl_harness_zero_grad(mh);
    pl_status st = pl_harness_backward(mh, model, b, loss);
    if (st) return st;
    for (int i = 0; i < ovt->num_groups(opt); i++) {
        pl_param_group *g = ovt->group(opt, i);
        g->lr = g->initial_lr;
    }
    if ((st = ovt->step(opt))) return st;
    mh->ctx->micro_step++;
    mh->ctx->global_step++;
    return PL_OK;
}

/* splitmix64: the gradcheck's element picker */
static uint64_t mix(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static pl_status eval_loss(pl_harness *h, const pl_model_vtable *vt, void *self, const pl_batch *b,
                           double *out) {
    pl_no_grad_begin();
    pl_frame_begin();
    pl_tensor *l = NULL;
    pl_status st = vt->forward(self, b, PL_SPLIT_TRAIN, true, &l, NULL);
    if (!st && !l) st = pl_error_set(PL_ERR_INVALID, "%s: training forward set no loss", h->desc->name);
    *out = st ? NAN : pl_tensor_item(l);
    pl_frame_end();
    pl_no_grad_end();
    return st;
}

pl_status pl_harness_gradcheck(pl_harness *h, void *self, const pl_batch *b, double eps,
                               double atol, double rtol, int max_per_param) {
    const pl_model_vtable *vt = model_vt(h);
    if (!vt) return pl_error_status();
    if (!(eps > 0)) return pl_error_set(PL_ERR_INVALID, "gradcheck: eps must be > 0 (got %g)", eps);
    pl_params *ps = h->ctx->params;
    pl_harness_zero_grad(h);
    pl_status st = pl_harness_backward(h, self, b, NULL);
    if (st) return pl_error_prefix(st, "gradcheck: analytic pass");
    int checked_params = 0;
    for (int pi = 0; pi < pl_params_count(ps) && !st; pi++) {
        pl_param *p = pl_params_at(ps, pi);
        pl_tensor *t = p->t;
        if (!t->requires_grad || t->dtype != PL_F32) continue;
        if (t->device.type != PL_DEVICE_CPU || !pl_tensor_is_contiguous(t))
            return pl_error_set(PL_ERR_UNSUPPORTED, "gradcheck: '%s' is not a contiguous CPU tensor",
                                p->name);
        int64_t n = pl_tensor_numel(t), k = max_per_param <= 0 || n <= max_per_param ? n : max_per_param;
        float *w = pl_tensor_f32(t);
        float *g = t->grad ? pl_tensor_f32(t->grad) : NULL;
        int64_t *idx = malloc(sizeof(int64_t) * (size_t)(n ? n : 1));
        if (!idx) return pl_error_set(PL_ERR_NOMEM, "gradcheck: out of memory");
        for (int64_t i = 0; i < n; i++) idx[i] = i;
        uint64_t rs = h->ctx->seed * 0x100000001B3ull + (uint64_t)pi;
        for (int64_t i = 0; i < k && k < n; i++) { /* partial Fisher-Yates */
            int64_t j = i + (int64_t)(mix(&rs) % (uint64_t)(n - i));
            int64_t tmp = idx[i];
            idx[i] = idx[j];
            idx[j] = tmp;
        }
        checked_params++;
        for (int64_t c = 0; c < k && !st; c++) {
            int64_t i = idx[c];
            float orig = w[i];
            float up = (float)(orig + eps), down = (float)(orig - eps);
            double lp, lm;
            w[i] = up;
            st = eval_loss(h, vt, self, b, &lp);
            w[i] = down;
            if (!st) st = eval_loss(h, vt, self, b, &lm);
            w[i] = orig;
            if (st) break;
            double num = (lp - lm) / ((double)up - (double)down);
            double ana = g ? (double)g[i] : 0.0;
            if (!(fabs(ana - num) <= atol + rtol * fabs(num)))
                st = pl_error_set(PL_ERR_NUMERIC,
                                  "gradcheck: %s: '%s'[%lld]: analytic %.7g, numerical %.7g "
                                  "(eps %g, atol %g, rtol %g)",
                                  h->desc->name, p->name, (long long)i, ana, num, eps, atol, rtol);
        }
        free(idx);
    }
    pl_harness_zero_grad(h);
    if (!st && !checked_params)
        st = pl_error_set(PL_ERR_INVALID, "gradcheck: %s has no trainable f32 parameter",
                          h->desc->name);
    return st;
}
