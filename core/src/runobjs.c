/* runobjs.c - the small run objects handed to plugins: the ordered parameter
 * list, name globs, the loader->model meta store, metric accumulators, batch
 * field lookup and enum names. */
#include "runobjs.h"

#include <fnmatch.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- enum names ------------------------------------------------------ */

const char *pl_plugin_kind_name(pl_plugin_kind k) {
    static const char *names[PL_KIND_COUNT] = {"loader",    "model",     "optimizer", "averager",
                                               "scheduler", "precision", "backend"};
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

struct pl_params {
    int n, cap;
    pl_param *items;
};

pl_params *pl_params_new(void) {
    pl_params *ps = calloc(1, sizeof *ps);
    if (!ps) pl_error_set(PL_ERR_NOMEM, "pl_params_new: out of memory");
    return ps;
}

void pl_params_free(pl_params *ps) {
    if (!ps) return;
    for (int i = 0; i < ps->n; i++) pl_tensor_release(ps->items[i].t);
    free(ps->items);
    free(ps);
}

pl_status pl_params_add(pl_params *ps, const char *name, pl_tensor *t, unsigned tags) {
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
    p->tags = tags;
    memcpy(t->name, name, len + 1);
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
    pl_tensor_release(p->t);
    p->t = t;
    snprintf(t->name, sizeof t->name, "%s", p->name);
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

pl_status pl_meta_set_float(pl_meta *m, const char *key, double v) {
    meta_entry *e = meta_slot(m, key);
    if (!e) return pl_error_status();
    e->type = META_FLOAT;
    e->f = v;
    e->i = (int64_t)v;
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
    if (e->type == META_FLOAT && e->f != (double)(int64_t)e->f)
        return pl_error_set(PL_ERR_CONFIG, "meta '%s': expected an integer, found %g", key, e->f);
    if (v) *v = e->type == META_INT ? e->i : (int64_t)e->f;
    return PL_OK;
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

double pl_metrics_get(const pl_metrics *m, const char *name) {
    if (!m || !name) return NAN;
    for (int i = 0; i < m->n; i++)
        if (strcmp(m->name[i], name) == 0) return m->count[i] != 0 ? m->sum[i] / m->count[i] : NAN;
    return NAN;
}

/* ---- batch ----------------------------------------------------------- */

pl_tensor *pl_batch_get(const pl_batch *b, const char *name) {
    if (!b || !name) {
        pl_error_set(PL_ERR_INVALID, "pl_batch_get: NULL %s", !b ? "batch" : "field name");
        return NULL;
    }
    for (int i = 0; i < b->n && i < PL_BATCH_MAX_FIELDS; i++)
        if (b->names[i] && strcmp(b->names[i], name) == 0) return b->fields[i];
    char have[512] = "";
    size_t off = 0;
    for (int i = 0; i < b->n && i < PL_BATCH_MAX_FIELDS && off < sizeof have; i++)
        off += (size_t)snprintf(have + off, sizeof have - off, "%s%s", i ? ", " : "",
                                b->names[i] ? b->names[i] : "?");
    pl_error_set(PL_ERR_INVALID, "batch has no field '%s' (fields: %s)", name,
                 b->n ? have : "none");
    return NULL;
}
