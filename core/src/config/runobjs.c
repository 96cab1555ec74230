/* runobjs.c - the small run objects handed to plugins: the ordered parameter
 * list, name globs, the loader->model meta store, metric accumulators, batch
 * field lookup and enum names. */

#include "pipeline/autograd.h"
#include "pipeline/plugin.h"
#include "internal.h"

#include <fnmatch.h>
#include <pthread.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- enum names ------------------------------------------------------ */

const char *pl_plugin_kind_name(pl_plugin_kind k) {
    static const char *names[PL_KIND_COUNT] = {"loader",    "model",     "optimizer", "averager",
                                               "scheduler", "precision", "backend",   "strategy"};
    if ((int)k < 0 || k >= PL_KIND_COUNT) return "unknown";
    return names[k];
}

const char *pl_split_name(pl_data_split s) {
    switch (s) {
    case PL_SPLIT_TRAIN: return "train";
    case PL_SPLIT_VAL: return "val";
    case PL_SPLIT_TEST: return "test";
    default: return "unknown";
    }
}

/* ---- parameters ------------------------------------------------------ */

/* A tensor a pl_params list holds counts that list in its param_lists
 * (tensor.h): pl_tensor_is_param, which lets the tape re-cast a frozen
 * parameter in backward instead of keeping its half copy (tape.c), is safe
 * only for tensors nothing rewrites during a step (a loader's named batch
 * buffers are). */
static void param_reg_add(pl_tensor *t) {
    if (t->param_lists < UINT16_MAX) t->param_lists++;
}

static void param_reg_remove(pl_tensor *t) {
    if (t->param_lists > 0) t->param_lists--;
}

struct pl_params {
    int n, cap;
    pl_param *items;
    pl_status (*seal)(void *ud, pl_params *ps, int i); /* the precision's convert_param */
    void *seal_ud;
};

void pl_params_set_seal(pl_params *ps, pl_status (*fn)(void *ud, pl_params *ps, int i),
                        void *ud) {
    if (!ps) return;
    ps->seal = fn;
    ps->seal_ud = ud;
}

pl_status pl_params_seal(pl_params *ps, int i) {
    pl_param *p = pl_params_at(ps, i);
    if (!p) return pl_error_status();
    if (!ps->seal) return PL_OK;
    pl_status st = ps->seal(ps->seal_ud, ps, i);
    return st ? pl_error_prefix(st, "parameter '%s'", p->name) : PL_OK;
}

pl_params *pl_params_new(void) {
    pl_params *ps = calloc(1, sizeof *ps);
    if (!ps) pl_error_set(PL_ERR_NOMEM, "pl_params_new: out of memory");
    return ps;
}

void pl_params_free(pl_params *ps) {
    if (!ps) return;
    for (int i = 0; i < ps->n; i++) {
        param_reg_remove(ps->items[i].t);
        pl_tensor_release(ps->items[i].t);
    }
    free(ps->items);
    free(ps);
}

pl_status pl_params_add(pl_params *ps, const char *name, pl_tensor *t, unsigned tags,
                        const char *role) {
    if (!ps || !name || !t)
        return pl_error_set(PL_ERR_INVALID, "pl_params_add: NULL %s",
                            !ps ? "params list" : !name ? "name" : "tensor");
    size_t len = strlen(name);
    if (len == 0 || len >= PL_NAME_MAX)
        return pl_error_set(PL_ERR_INVALID,
                            "pl_params_add: parameter name '%s' must have 1..%d characters, has %zu",
                            name, PL_NAME_MAX - 1, len);
    if (pl_params_find(ps, name))
        return pl_error_set(PL_ERR_INVALID, "pl_params_add: duplicate parameter name '%s'", name);
    if (ps->n == ps->cap) {
        int cap = ps->cap ? ps->cap * 2 : 16;
        pl_param *p = realloc(ps->items, (size_t)cap * sizeof *p);
        if (!p) return pl_error_set(PL_ERR_NOMEM, "pl_params_add: out of memory adding '%s'", name);
        ps->items = p;
        ps->cap = cap;
    }
    pl_param *p = &ps->items[ps->n++];
    memset(p, 0, sizeof *p);
    memcpy(p->name, name, len + 1);
    p->t = pl_tensor_retain(t);
    param_reg_add(t);
    p->tags = tags;
    if (role) snprintf(p->role, sizeof p->role, "%s", role); /* truncates to PL_ROLE_MAX - 1 */
    memcpy(t->name, name, len + 1);
    return PL_OK;
}

pl_status pl_param_new(pl_run_context *ctx, const char *name, int ndim, const int64_t *shape,
                       unsigned tags, const char *role, bool trainable, pl_tensor **out) {
    if (out) *out = NULL;
    if (!ctx || !ctx->params || !name || (ndim > 0 && !shape))
        return pl_error_set(PL_ERR_INVALID, "pl_param_new: NULL %s",
                            !ctx           ? "run context"
                            : !ctx->params ? "ctx->params"
                            : !name        ? "name"
                                           : "shape");
    if (pl_params_find(ctx->params, name))
        return pl_error_set(PL_ERR_INVALID, "pl_param_new: duplicate parameter name '%s'", name);
    /* owned, never adopted by an open frame: the list's reference is the only one */
    pl_tensor *t = pl_tensor_zeros_owned(PL_F32, ndim, shape, ctx->device);
    if (!t) {
        pl_status st = pl_error_status();
        return pl_error_prefix(st == PL_ERR_SHAPE ? PL_ERR_INVALID : st, "pl_param_new '%s'", name);
    }
    pl_tensor_set_requires_grad(t, trainable);
    pl_status st = pl_params_add(ctx->params, name, t, tags, role);
    pl_tensor_release(t);
    if (st) return st;
    if (out) *out = t;
    return PL_OK;
}

int pl_params_count(const pl_params *ps) { return ps ? ps->n : 0; }

pl_param *pl_params_at(pl_params *ps, int i) {
    if (!ps || i < 0 || i >= ps->n) {
        pl_error_set(PL_ERR_INVALID, "pl_params_at: index %d out of range [0, %d)", i,
                     ps ? ps->n : 0);
        return NULL;
    }
    return &ps->items[i];
}

pl_param *pl_params_find(pl_params *ps, const char *name) {
    if (!ps || !name) return NULL;
    for (int i = 0; i < ps->n; i++)
        if (strcmp(ps->items[i].name, name) == 0) return &ps->items[i];
    return NULL;
}

pl_status pl_params_replace(pl_params *ps, int i, pl_tensor *t) {
    if (!t) return pl_error_set(PL_ERR_INVALID, "pl_params_replace: NULL tensor for index %d", i);
    pl_param *p = pl_params_at(ps, i);
    if (!p) return pl_error_status();
    pl_tensor_retain(t);
    param_reg_add(t);
    param_reg_remove(p->t);
    pl_tensor_release(p->t);
    p->t = t;
    snprintf(t->name, sizeof t->name, "%s", p->name);
    return PL_OK;
}

pl_status pl_param_convert(pl_param *p, pl_dtype dt) {
    if (!p || !p->t) return pl_error_set(PL_ERR_INVALID, "pl_param_convert: NULL %s",
                                         !p ? "parameter" : "tensor");
    pl_tensor *t = p->t;
    char buf[256];
    if (dt != PL_F32 && dt != PL_BF16 && dt != PL_F16)
        return pl_error_set(PL_ERR_DTYPE, "pl_param_convert '%s': target dtype %s; expected f32, bf16 "
                            "or f16", p->name, pl_dtype_name(dt));
    if (t->dtype == dt) return PL_OK;
    if (!pl_dtype_is_float(t->dtype))
        return pl_error_set(PL_ERR_DTYPE, "pl_param_convert '%s': %s is not a float tensor (f32, bf16, "
                            "f16 or f64 convert)", p->name, pl_tensor_describe(t, buf, sizeof buf));
    if (!pl_tensor_is_contiguous(t))
        return pl_error_set(PL_ERR_INVALID, "pl_param_convert '%s': %s is not contiguous", p->name,
                            pl_tensor_describe(t, buf, sizeof buf));
    /* its own frame, so the copy is ours whatever frame the caller has open */
    pl_frame_begin();
    pl_tensor *n = pl_tensor_to(t, dt, t->device);
    if (n) pl_frame_keep(n);
    pl_frame_end();
    if (!n)
        return pl_error_prefix(pl_error_status(), "pl_param_convert '%s': %s to %s", p->name,
                               pl_tensor_describe(t, buf, sizeof buf), pl_dtype_name(dt));
    /* swap storages: t takes the new one, n the old one, released with n */
    pl_storage *old = t->storage;
    int64_t old_off = t->offset;
    pl_dtype old_dt = t->dtype;
    t->storage = n->storage;
    t->offset = 0;
    t->dtype = dt;
    for (int d = 0; d < t->ndim; d++) t->stride[d] = n->stride[d];
    n->storage = old;
    n->offset = old_off;
    n->dtype = old_dt;
    pl_tensor_release(n);
    return PL_OK;
}

pl_status pl_params_convert(pl_params *ps, pl_dtype frozen, pl_convert_stats *stats) {
    for (int i = 0; i < pl_params_count(ps); i++) {
        pl_param *pp = pl_params_at(ps, i);
        pl_tensor *t = pp->t;
        if (!pl_dtype_is_float(t->dtype)) continue;
        bool frozen_weight = !t->requires_grad && !(pp->tags & PL_TAG_BUFFER);
        pl_dtype want = frozen_weight ? frozen : PL_F32;
        if (t->dtype == want) continue;
        size_t before = pl_tensor_nbytes(t);
        pl_status st = pl_param_convert(pp, want);
        if (st) return st;
        if (stats) {
            stats->converted++;
            stats->bytes_before += before;
            stats->bytes_after += pl_tensor_nbytes(t);
        }
    }
    return PL_OK;
}

bool pl_name_matches(const char *name, const char *globs) {
    if (!name || !globs) return false;
    const char *s = globs;
    char pat[256];
    while (*s) {
        const char *e = strchr(s, ',');
        size_t n = e ? (size_t)(e - s) : strlen(s);
        /* trim spaces around each alternative */
        const char *a = s;
        while (n && (*a == ' ' || *a == '\t')) a++, n--;
        while (n && (a[n - 1] == ' ' || a[n - 1] == '\t')) n--;
        if (n && n < sizeof pat) {
            memcpy(pat, a, n);
            pat[n] = '\0';
            if (fnmatch(pat, name, 0) == 0) return true;
        }
        if (!e) break;
        s = e + 1;
    }
    return false;
}

/* ---- optimizer hyper-parameters -------------------------------------- */

pl_hparam *pl_group_hparam(pl_param_group *g, const char *name) {
    if (!g || !name) return NULL;
    for (int i = 0; i < g->n_hparams && i < PL_HPARAMS_MAX; i++)
        if (strcmp(g->hparams[i].name, name) == 0) return &g->hparams[i];
    return NULL;
}

pl_status pl_group_hparam_set(pl_param_group *g, const char *name, double value) {
    if (!g || !name)
        return pl_error_set(PL_ERR_INVALID, "pl_group_hparam_set: NULL %s", !g ? "group" : "name");
    size_t len = strlen(name);
    if (len == 0 || len >= sizeof g->hparams[0].name)
        return pl_error_set(PL_ERR_INVALID,
                            "pl_group_hparam_set: group '%s': hyper-parameter name '%s' must have "
                            "1..%zu characters, has %zu",
                            g->name, name, sizeof g->hparams[0].name - 1, len);
    pl_hparam *h = pl_group_hparam(g, name);
    if (!h) {
        if (g->n_hparams < 0 || g->n_hparams >= PL_HPARAMS_MAX)
            return pl_error_set(PL_ERR_INVALID,
                                "pl_group_hparam_set: group '%s' has %d hyper-parameters, the "
                                "most there can be (PL_HPARAMS_MAX); cannot add '%s'",
                                g->name, g->n_hparams, name);
        h = &g->hparams[g->n_hparams++];
        memset(h, 0, sizeof *h);
        memcpy(h->name, name, len + 1);
    }
    h->value = h->initial = value;
    return PL_OK;
}

/* ---- model outputs (plugin.h, pl_outputs) ---------------------------- */

pl_status pl_outputs_add(pl_outputs *o, const char *name, pl_tensor *t) {
    const char *nm = name ? name : "(null)";
    size_t len = name ? strlen(name) : 0;
    if (!o || !t)
        return !t && pl_error_status() ? pl_error_prefix(pl_error_status(), "output '%s'", nm)
                                       : pl_error_set(PL_ERR_INVALID, "pl_outputs_add: output "
                                                      "'%s': NULL %s", nm, o ? "tensor" : "list");
    if (len == 0 || len >= PL_OUTPUTS_NAME_MAX || name[0] == '/' || name[len - 1] == '/' ||
        strstr(name, "//"))
        return pl_error_set(PL_ERR_INVALID, "pl_outputs_add: output name '%s': expected 1..%d "
                            "characters, groups split by single '/'", nm, PL_OUTPUTS_NAME_MAX - 1);
    if (t->ndim < 1)
        return pl_error_set(PL_ERR_INVALID, "pl_outputs_add: output '%s' is a scalar; outputs "
                            "are rows (rank >= 1)", name);
    for (int i = 0; i < o->n; i++)
        if (!strcmp(o->name[i], name))
            return pl_error_set(PL_ERR_INVALID, "pl_outputs_add: output '%s' given twice", name);
    if (o->n >= PL_OUTPUTS_MAX)
        return pl_error_set(PL_ERR_INVALID, "pl_outputs_add: output '%s': more than %d outputs",
                            name, PL_OUTPUTS_MAX);
    memcpy(o->name[o->n], name, len + 1);
    o->t[o->n++] = t;
    return PL_OK;
}

/* ---- batch field declarations ---------------------------------------- */

pl_status pl_fields_add(pl_field_list *l, const char *name, pl_dtype dtype, int rank,
                        bool optional) {
    return pl_fields_add_in(l, 0, name, dtype, rank, optional);
}

#define ALL_SPLITS ((1u << PL_SPLIT_COUNT) - 1u)
static unsigned split_mask(unsigned s) { return s ? s & ALL_SPLITS : ALL_SPLITS; }

bool pl_field_in_split(const pl_field_spec *f, pl_data_split s) {
    return f && (unsigned)s < PL_SPLIT_COUNT && (split_mask(f->splits) & (1u << s)) != 0;
}

pl_status pl_fields_add_in(pl_field_list *l, unsigned splits, const char *name, pl_dtype dtype,
                           int rank, bool optional) {
    if (!l || !name)
        return pl_error_set(PL_ERR_INVALID, "pl_fields_add: NULL %s", !l ? "field list" : "name");
    size_t len = strlen(name);
    if (len == 0 || len >= sizeof l->f[0].name)
        return pl_error_set(PL_ERR_INVALID,
                            "pl_fields_add: field name '%s' must have 1..%zu characters, has %zu",
                            name, sizeof l->f[0].name - 1, len);
    if (rank < -1 || rank > PL_MAX_DIMS)
        return pl_error_set(
            PL_ERR_INVALID,
            "pl_fields_add: field '%s': rank %d out of range (-1 for any, or 0..%d)", name, rank,
            PL_MAX_DIMS);
    bool known = (dtype >= 0 && dtype < PL_DTYPE_COUNT) || dtype == PL_DTYPE_ANY ||
                 dtype == PL_DTYPE_FLOAT || dtype == PL_DTYPE_INDEX;
    if (!known)
        return pl_error_set(PL_ERR_INVALID, "pl_fields_add: field '%s': unknown dtype %d", name,
                            (int)dtype);
    if (splits & ~ALL_SPLITS)
        return pl_error_set(PL_ERR_INVALID, "pl_fields_add: field '%s': split mask 0x%x has bits "
                            "beyond the %d splits", name, splits, PL_SPLIT_COUNT);
    for (int i = 0; i < l->n && i < PL_FIELDS_MAX; i++)
        if (strcmp(l->f[i].name, name) == 0 && (split_mask(l->f[i].splits) & split_mask(splits)))
            return pl_error_set(PL_ERR_INVALID, "pl_fields_add: field '%s' declared twice", name);
    if (l->n < 0 || l->n >= PL_FIELDS_MAX)
        return pl_error_set(PL_ERR_INVALID,
                            "pl_fields_add: cannot add field '%s': the list already has %d fields, "
                            "the most there can be (PL_FIELDS_MAX)",
                            name, l->n);
    pl_field_spec *f = &l->f[l->n++];
    memset(f, 0, sizeof *f);
    memcpy(f->name, name, len + 1);
    f->dtype = dtype;
    f->rank = rank;
    f->optional = optional;
    f->splits = splits;
    return PL_OK;
}

const char *pl_field_dtype_name(pl_dtype dt) {
    if (dt == PL_DTYPE_ANY) return "any dtype";
    if (dt == PL_DTYPE_FLOAT) return "a float dtype (f32, bf16 or f16)";
    if (dt == PL_DTYPE_INDEX) return "an index dtype (i32 or i64)";
    return pl_dtype_name(dt);
}

bool pl_field_dtype_accepts(pl_dtype need, pl_dtype have) {
    if (need == PL_DTYPE_ANY) return true;
    if (need == PL_DTYPE_FLOAT) return have == PL_F32 || have == PL_BF16 || have == PL_F16;
    if (need == PL_DTYPE_INDEX) return have == PL_I32 || have == PL_I64;
    return need == have;
}

/* "rank 2", "any rank" */
static const char *field_rank_str(int rank, char *buf, size_t n) {
    if (rank < 0) return "any rank";
    snprintf(buf, n, "rank %d", rank);
    return buf;
}

pl_status pl_fields_match(const pl_field_list *have, const char *loader, const pl_field_list *need,
                          const char *model) {
    const char *ln = loader ? loader : "loader";
    const char *mn = model ? model : "model";
    if (!have || !need)
        return pl_error_set(PL_ERR_INVALID, "pl_fields_match: NULL %s field list",
                            !have ? "loader" : "model");
    int nh = have->n < PL_FIELDS_MAX ? have->n : PL_FIELDS_MAX;
    int nn = need->n < PL_FIELDS_MAX ? need->n : PL_FIELDS_MAX;
    for (int sp = 0; sp < PL_SPLIT_COUNT; sp++) {
        for (int i = 0; i < nn; i++) {
            const pl_field_spec *w = &need->f[i];
            if (!pl_field_in_split(w, (pl_data_split)sp)) continue;
            const pl_field_spec *h = NULL;
            for (int j = 0; j < nh && !h; j++)
                if (pl_field_in_split(&have->f[j], (pl_data_split)sp) &&
                    strcmp(have->f[j].name, w->name) == 0)
                    h = &have->f[j];
            char rw[24], rh[24];
            if (!h) {
                if (w->optional) continue;
                char list[PL_FIELDS_MAX * 50] = "";
                size_t off = 0;
                for (int j = 0; j < nh && off < sizeof list; j++)
                    if (pl_field_in_split(&have->f[j], (pl_data_split)sp))
                        off += (size_t)snprintf(list + off, sizeof list - off, "%s%s",
                                                off ? ", " : "", have->f[j].name);
                return pl_error_set(PL_ERR_CONFIG,
                                    "batch field '%s': model '%s' needs it in %s batches (%s, %s) "
                                    "but loader '%s' yields no such field there (it yields: %s)",
                                    w->name, mn, pl_split_name((pl_data_split)sp),
                                    pl_field_dtype_name(w->dtype),
                                    field_rank_str(w->rank, rw, sizeof rw), ln,
                                    list[0] ? list : "none");
            }
            bool dt_ok = pl_field_dtype_accepts(w->dtype, h->dtype);
            /* a loader's rank -1 (varies) satisfies only a model that takes any rank */
            bool rank_ok = w->rank < 0 || h->rank == w->rank;
            if (!dt_ok || !rank_ok)
                return pl_error_set(PL_ERR_CONFIG,
                                    "batch field '%s' (%s batches): model '%s' needs %s, %s; loader "
                                    "'%s' yields %s, %s",
                                    w->name, pl_split_name((pl_data_split)sp), mn,
                                    pl_field_dtype_name(w->dtype),
                                    field_rank_str(w->rank, rw, sizeof rw), ln,
                                    pl_field_dtype_name(h->dtype),
                                    field_rank_str(h->rank, rh, sizeof rh));
        }
    }
    return PL_OK;
}

/* ---- meta ------------------------------------------------------------ */

typedef enum { META_INT, META_FLOAT, META_STR } meta_type;
typedef struct {
    char *key;
    meta_type type;
    int64_t i;
    double f;
    char *s;
} meta_entry;

struct pl_meta {
    int n, cap;
    meta_entry *e;
};

pl_meta *pl_meta_new(void) {
    pl_meta *m = calloc(1, sizeof *m);
    if (!m) pl_error_set(PL_ERR_NOMEM, "pl_meta_new: out of memory");
    return m;
}

void pl_meta_free(pl_meta *m) {
    if (!m) return;
    for (int i = 0; i < m->n; i++) {
        free(m->e[i].key);
        free(m->e[i].s);
    }
    free(m->e);
    free(m);
}

int pl_meta_count(const pl_meta *m) { return m ? m->n : 0; }
const char *pl_meta_key_at(const pl_meta *m, int i) {
    return (m && i >= 0 && i < m->n) ? m->e[i].key : NULL;
}

static meta_entry *meta_find(const pl_meta *m, const char *key) {
    if (!m || !key) return NULL;
    for (int i = 0; i < m->n; i++)
        if (strcmp(m->e[i].key, key) == 0) return &m->e[i];
    return NULL;
}

static meta_entry *meta_slot(pl_meta *m, const char *key) {
    if (!m || !key) {
        pl_error_set(PL_ERR_INVALID, "pl_meta_set: NULL %s", !m ? "meta" : "key");
        return NULL;
    }
    meta_entry *e = meta_find(m, key);
    if (e) {
        free(e->s);
        e->s = NULL;
        return e;
    }
    if (m->n == m->cap) {
        int cap = m->cap ? m->cap * 2 : 8;
        meta_entry *p = realloc(m->e, (size_t)cap * sizeof *p);
        if (!p) {
            pl_error_set(PL_ERR_NOMEM, "pl_meta_set: out of memory for '%s'", key);
            return NULL;
        }
        m->e = p;
        m->cap = cap;
    }
    e = &m->e[m->n];
    memset(e, 0, sizeof *e);
    e->key = strdup(key);
    if (!e->key) {
        pl_error_set(PL_ERR_NOMEM, "pl_meta_set: out of memory for '%s'", key);
        return NULL;
    }
    m->n++;
    return e;
}

pl_status pl_meta_set_int(pl_meta *m, const char *key, int64_t v) {
    meta_entry *e = meta_slot(m, key);
    if (!e) return pl_error_status();
    e->type = META_INT;
    e->i = v;
    e->f = (double)v;
    return PL_OK;
}

/* Whether a double converts to int64_t (C leaves NaN, Inf and values out of
 * range undefined: a loader publishes whatever numbers its file holds). */
static bool f64_is_i64(double f) {
    return f >= -9223372036854775808.0 && f < 9223372036854775808.0 && f == (double)(int64_t)f;
}

pl_status pl_meta_set_float(pl_meta *m, const char *key, double v) {
    meta_entry *e = meta_slot(m, key);
    if (!e) return pl_error_status();
    e->type = META_FLOAT;
    e->f = v;
    e->i = v >= -9223372036854775808.0 && v < 9223372036854775808.0 ? (int64_t)v : 0;
    return PL_OK;
}

pl_status pl_meta_set_str(pl_meta *m, const char *key, const char *v) {
    meta_entry *e = meta_slot(m, key);
    if (!e) return pl_error_status();
    e->type = META_STR;
    e->s = strdup(v ? v : "");
    if (!e->s) return pl_error_set(PL_ERR_NOMEM, "pl_meta_set_str: out of memory for '%s'", key);
    return PL_OK;
}

pl_status pl_meta_get_int(const pl_meta *m, const char *key, int64_t *v) {
    const meta_entry *e = meta_find(m, key);
    if (!e) return pl_error_set(PL_ERR_CONFIG, "'%s' was not provided by the loader", key ? key : "");
    if (e->type == META_STR)
        return pl_error_set(PL_ERR_CONFIG, "meta '%s': expected an integer, found string '%s'", key,
                            e->s);
    if (e->type == META_FLOAT && !f64_is_i64(e->f))
        return pl_error_set(PL_ERR_CONFIG, "meta '%s': expected an integer, found %g", key, e->f);
    if (v) *v = e->i;
    return PL_OK;
}

bool pl_meta_is_float(const pl_meta *m, const char *key) {
    const meta_entry *e = meta_find(m, key);
    return e && e->type == META_FLOAT;
}

pl_status pl_meta_get_float(const pl_meta *m, const char *key, double *v) {
    const meta_entry *e = meta_find(m, key);
    if (!e) return pl_error_set(PL_ERR_CONFIG, "'%s' was not provided by the loader", key ? key : "");
    if (e->type == META_STR)
        return pl_error_set(PL_ERR_CONFIG, "meta '%s': expected a number, found string '%s'", key,
                            e->s);
    if (v) *v = e->type == META_INT ? (double)e->i : e->f;
    return PL_OK;
}

const char *pl_meta_get_str(const pl_meta *m, const char *key) {
    const meta_entry *e = meta_find(m, key);
    return (e && e->type == META_STR) ? e->s : NULL;
}

/* ---- metrics --------------------------------------------------------- */

void pl_metrics_reset(pl_metrics *m) {
    if (m) memset(m, 0, sizeof *m);
}

void pl_metrics_add(pl_metrics *m, const char *name, double sum, double count) {
    if (!m || !name) return;
    for (int i = 0; i < m->n; i++) {
        if (strcmp(m->name[i], name) == 0) {
            m->sum[i] += sum;
            m->count[i] += count;
            return;
        }
    }
    if (m->n >= PL_METRICS_MAX) return; /* full: silently bounded by design */
    snprintf(m->name[m->n], sizeof m->name[0], "%s", name);
    m->sum[m->n] = sum;
    m->count[m->n] = count;
    m->n++;
}

double pl_metrics_value_at(const pl_metrics *m, int i) {
    if (!m || i < 0 || i >= m->n || m->count[i] == 0) return NAN;
    double v = m->sum[i] / m->count[i];
    return m->kind[i] == PL_METRIC_RMS ? sqrt(v) : v;
}

double pl_metrics_get(const pl_metrics *m, const char *name) {
    if (!m || !name) return NAN;
    for (int i = 0; i < m->n; i++)
        if (strcmp(m->name[i], name) == 0) return pl_metrics_value_at(m, i);
    return NAN;
}

void pl_metrics_add_rms(pl_metrics *m, const char *name, double sum_sq, double count) {
    if (!m || !name) return;
    int had = m->n;
    pl_metrics_add(m, name, sum_sq, count);
    if (m->n > had) m->kind[m->n - 1] = PL_METRIC_RMS;
}

/* ---- batch ----------------------------------------------------------- */

pl_tensor *pl_batch_find(const pl_batch *b, const char *name) {
    if (!b || !name) return NULL;
    for (int i = 0; i < b->n && i < PL_BATCH_MAX_FIELDS; i++)
        if (b->names[i] && strcmp(b->names[i], name) == 0) return b->fields[i];
    return NULL;
}

pl_tensor *pl_batch_get(const pl_batch *b, const char *name) {
    if (!b || !name) {
        pl_error_set(PL_ERR_INVALID, "pl_batch_get: NULL %s", !b ? "batch" : "field name");
        return NULL;
    }
    pl_tensor *t = pl_batch_find(b, name);
    if (t) return t;
    char have[512] = "";
    size_t off = 0;
    for (int i = 0; i < b->n && i < PL_BATCH_MAX_FIELDS && off < sizeof have; i++)
        off += (size_t)snprintf(have + off, sizeof have - off, "%s%s", i ? ", " : "",
                                b->names[i] ? b->names[i] : "?");
    pl_error_set(PL_ERR_INVALID, "batch has no field '%s' (fields: %s)", name,
                 b->n ? have : "none");
    return NULL;
}
