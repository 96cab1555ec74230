#define _GNU_SOURCE /* vasprintf */
/* config.c - the configuration's store (sections, entries and their name
 * index), value parsing and the accessors of pipeline/config.h: the bottom
 * of the config layer, calling none of the other config_*.c files (the
 * loading entry points are config_load.c). See config_internal.h for the
 * contract. */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config_impl.h"

/* ====================================================================
 * Data structures
 * ==================================================================== */

static uint64_t name_hash(const char *k) { /* FNV-1a */
    uint64_t h = 1469598103934665603ull;
    for (; *k; k++) h = (h ^ (unsigned char)*k) * 1099511628211ull;
    return h;
}

void cfg_index_drop(name_index *ix) {
    free(ix->slot);
    ix->slot = NULL;
    ix->cap = 0;
}

static void index_put(name_index *ix, const char *name, int pos) {
    size_t m = ix->cap - 1, i = (size_t)name_hash(name) & m;
    while (ix->slot[i]) i = (i + 1) & m;
    ix->slot[i] = pos + 1;
}

/* (Re)build over n names (name_at(arr, i)); false (no index) when out of memory. */
static bool index_build(name_index *ix, int n, const char *(*name_at)(const void *, int),
                        const void *arr) {
    size_t cap = 64;
    while (cap < 2 * (size_t)n) cap *= 2;
    int *slot = calloc(cap, sizeof *slot);
    if (!slot) return false;
    free(ix->slot);
    ix->slot = slot;
    ix->cap = cap;
    for (int i = 0; i < n; i++) index_put(ix, name_at(arr, i), i);
    return true;
}

/* Position of `name` among n names, or -1. Builds the index when worth it. */
static int index_find(name_index *ix, int n, const char *(*name_at)(const void *, int),
                      const void *arr, const char *name) {
    if (n >= INDEX_MIN && !ix->cap) index_build(ix, n, name_at, arr);
    if (!ix->cap) {
        for (int i = 0; i < n; i++)
            if (strcmp(name_at(arr, i), name) == 0) return i;
        return -1;
    }
    size_t m = ix->cap - 1;
    for (size_t i = (size_t)name_hash(name) & m; ix->slot[i]; i = (i + 1) & m)
        if (strcmp(name_at(arr, ix->slot[i] - 1), name) == 0) return ix->slot[i] - 1;
    return -1;
}

/* After appending position pos (= n - 1): keep an index current. */
static void index_added(name_index *ix, int n, const char *(*name_at)(const void *, int),
                        const void *arr) {
    if (!ix->cap) return;
    if (2 * (size_t)n > ix->cap) {
        if (!index_build(ix, n, name_at, arr)) cfg_index_drop(ix);
        return;
    }
    index_put(ix, name_at(arr, n - 1), n - 1);
}

char *cfg_xstrdup(const char *s) {
    char *d = strdup(s ? s : "");
    if (!d) pl_error_set(PL_ERR_NOMEM, "config: out of memory");
    return d;
}

char *cfg_xprintf(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char *s = NULL;
    if (vasprintf(&s, fmt, ap) < 0) s = NULL;
    va_end(ap);
    if (!s) pl_error_set(PL_ERR_NOMEM, "config: out of memory");
    return s;
}

void cfg_entry_clear(entry *e) {
    free(e->key);
    free(e->value);
    free(e->origin_str);
    memset(e, 0, sizeof *e);
}

void cfg_section_free(pl_config_section *s) {
    if (!s) return;
    for (int i = 0; i < s->n; i++) cfg_entry_clear(&s->e[i]);
    free(s->e);
    free(s->name);
    free(s->file_plugin);
    cfg_index_drop(&s->ix);
    free(s);
}

void pl_config_free(pl_config *c) {
    if (!c) return;
    for (int i = 0; i < c->n; i++) cfg_section_free(c->s[i]);
    free(c->s);
    cfg_index_drop(&c->ix);
    for (int i = 0; i < c->n_req; i++) free(c->req[i]);
    free(c->req);
    free(c->path);
    free(c->dir);
    free(c);
}

static const char *section_name_at(const void *arr, int i) {
    return ((pl_config_section *const *)arr)[i]->name;
}
static const char *entry_key_at(const void *arr, int i) { return ((const entry *)arr)[i].key; }

/* The index is a cache: lookups on a const config may build it. */
pl_config_section *cfg_find_section(const pl_config *c, const char *name) {
    int i = index_find((name_index *)&c->ix, c->n, section_name_at, c->s, name);
    return i < 0 ? NULL : c->s[i];
}

pl_config_section *cfg_add_section(pl_config *c, const char *name, int line) {
    if (c->n == c->cap) {
        int cap = c->cap ? c->cap * 2 : 16;
        pl_config_section **s = realloc(c->s, (size_t)cap * sizeof *s);
        if (!s) {
            pl_error_set(PL_ERR_NOMEM, "config: out of memory");
            return NULL;
        }
        c->s = s;
        c->cap = cap;
    }
    pl_config_section *s = calloc(1, sizeof *s);
    if (!s || !(s->name = cfg_xstrdup(name))) {
        free(s);
        pl_error_set(PL_ERR_NOMEM, "config: out of memory");
        return NULL;
    }
    s->line = line;
    s->owner = c;
    c->s[c->n++] = s;
    index_added(&c->ix, c->n, section_name_at, c->s);
    return s;
}

entry *cfg_find_entry(const pl_config_section *s, const char *key) {
    if (!s || !key) return NULL;
    int i = index_find((name_index *)&s->ix, s->n, entry_key_at, s->e, key);
    return i < 0 ? NULL : &s->e[i];
}

/* Append an entry; takes ownership of nothing (copies). */
entry *cfg_add_entry(pl_config_section *s, const char *key, const char *value,
                     pl_value_origin origin, const char *origin_str, int line) {
    if (s->n == s->cap) {
        int cap = s->cap ? s->cap * 2 : 16;
        entry *e = realloc(s->e, (size_t)cap * sizeof *e);
        if (!e) {
            pl_error_set(PL_ERR_NOMEM, "config: out of memory");
            return NULL;
        }
        s->e = e;
        s->cap = cap;
    }
    entry *e = &s->e[s->n];
    memset(e, 0, sizeof *e);
    e->key = cfg_xstrdup(key);
    e->value = cfg_xstrdup(value);
    e->origin_str = cfg_xstrdup(origin_str);
    if (!e->key || !e->value || !e->origin_str) {
        cfg_entry_clear(e);
        return NULL;
    }
    e->origin = origin;
    e->line = line;
    s->n++;
    index_added(&s->ix, s->n, entry_key_at, s->e);
    return e;
}

/* ====================================================================
 * Value parsing (config_impl.h)
 * ==================================================================== */

bool cfg_parse_int(const char *s, int64_t *out) {
    if (!s || !*s) return false;
    errno = 0;
    char *end;
    long long v = strtoll(s, &end, 10);
    if (errno || *end) return false;
    *out = (int64_t)v;
    return true;
}

/* A finite double. strtod's ERANGE is refused both ways: an overflow
 * (1e400 -> HUGE_VAL) and an underflow (1e-400 -> 0, 1e-310 -> a denormal),
 * so that "lr = 1e-400" is not silently read as 0. *range (when given) says
 * that the failure was one of those. */
bool cfg_parse_float_r(const char *s, double *out, bool *range) {
    if (range) *range = false;
    if (!s || !*s) return false;
    errno = 0;
    char *end;
    double v = strtod(s, &end);
    if (*end) return false;
    if (errno == ERANGE) {
        if (range) *range = true;
        return false;
    }
    if (!isfinite(v)) return false;
    *out = v;
    return true;
}
bool cfg_parse_float(const char *s, double *out) { return cfg_parse_float_r(s, out, NULL); }

bool cfg_parse_bool(const char *s, bool *out) {
    static const char *yes[] = {"true", "1", "yes", "on"}, *no[] = {"false", "0", "no", "off"};
    if (!s) return false;
    for (int i = 0; i < 4; i++) {
        if (strcasecmp(s, yes[i]) == 0) return *out = true, true;
        if (strcasecmp(s, no[i]) == 0) return *out = false, true;
    }
    return false;
}

/* ====================================================================
 * Accessors (pipeline/config.h)
 * ==================================================================== */

const char *pl_cfg_section_name(const pl_config_section *s) { return s ? s->name : NULL; }

const char *pl_cfg_get(const pl_config_section *s, const char *key) {
    const entry *e = cfg_find_entry(s, key);
    return e ? e->value : NULL;
}

int64_t pl_cfg_int(const pl_config_section *s, const char *key, int64_t fallback) {
    const char *v = pl_cfg_get(s, key);
    int64_t i;
    double d;
    if (v && cfg_parse_int(v, &i)) return i;
    if (v && cfg_parse_float(v, &d) && d >= -9.2e18 && d <= 9.2e18) return (int64_t)d;
    return fallback;
}

double pl_cfg_float(const pl_config_section *s, const char *key, double fallback) {
    const char *v = pl_cfg_get(s, key);
    double d;
    return (v && cfg_parse_float(v, &d)) ? d : fallback;
}

bool pl_cfg_bool(const pl_config_section *s, const char *key, bool fallback) {
    const char *v = pl_cfg_get(s, key);
    bool b;
    return (v && cfg_parse_bool(v, &b)) ? b : fallback;
}

const char *pl_cfg_str(const pl_config_section *s, const char *key, const char *fallback) {
    const char *v = pl_cfg_get(s, key);
    return v ? v : fallback;
}

pl_status pl_cfg_list(const char *s, const char *what, pl_cfg_list_fn fn, void *ud, int *n) {
    int k = 0;
    if (n) *n = 0;
    for (const char *p = s; p && *p;) {
        size_t len = strcspn(p, ",");
        const char *a = p, *e = p + len;
        while (a < e && (*a == ' ' || *a == '\t')) a++;
        while (e > a && (e[-1] == ' ' || e[-1] == '\t')) e--;
        if (e > a) {
            char item[PL_CFG_LIST_ITEM_MAX];
            if ((size_t)(e - a) >= sizeof item)
                return pl_error_set(PL_ERR_CONFIG, "%s: item '%.40s...' has %zu characters; at "
                                    "most %d", what ? what : "list", a, (size_t)(e - a),
                                    PL_CFG_LIST_ITEM_MAX - 1);
            memcpy(item, a, (size_t)(e - a));
            item[e - a] = 0;
            pl_status st = fn ? fn(item, k, ud) : PL_OK;
            if (st) return st;
            k++;
            if (n) *n = k;
        }
        p += len;
        if (*p == ',') p++;
    }
    return PL_OK;
}

bool pl_cfg_is_set(const pl_config_section *s, const char *key) {
    const entry *e = cfg_find_entry(s, key);
    return e && e->origin != PL_FROM_DEFAULT && !e->file_default;
}

const char *pl_cfg_origin(const pl_config_section *s, const char *key) {
    const entry *e = cfg_find_entry(s, key);
    return e ? e->origin_str : NULL;
}

int pl_cfg_count(const pl_config_section *s) { return s ? s->n : 0; }
const char *pl_cfg_key_at(const pl_config_section *s, int i) {
    return (s && i >= 0 && i < s->n) ? s->e[i].key : NULL;
}
const char *pl_cfg_value_at(const pl_config_section *s, int i) {
    return (s && i >= 0 && i < s->n) ? s->e[i].value : NULL;
}
int pl_cfg_section_line(const pl_config_section *s) { return s ? s->line : 0; }

const pl_config_section *pl_config_section_get(const pl_config *c, const char *name) {
    return (c && name) ? cfg_find_section(c, name) : NULL;
}
const pl_config_section *pl_cfg_sibling(const pl_config_section *s, const char *name) {
    return s ? pl_config_section_get(s->owner, name) : NULL;
}
const char *pl_config_path(const pl_config *c) { return c ? c->path : NULL; }
int pl_config_section_count(const pl_config *c) { return c ? c->n : 0; }
const pl_config_section *pl_config_section_at(const pl_config *c, int i) {
    return (c && i >= 0 && i < c->n) ? c->s[i] : NULL;
}
const pl_plugin_desc *pl_config_plugin(const pl_config *c, const char *section) {
    const pl_config_section *s = pl_config_section_get(c, section);
    return s ? s->plugin : NULL;
}
const char *pl_config_plugin_path(const pl_config *c, const char *section) {
    const pl_config_section *s = pl_config_section_get(c, section);
    return s ? s->plugin_path : NULL;
}
int pl_config_requires_count(const pl_config *c) { return c ? c->n_req : 0; }
const char *pl_config_requires_at(const pl_config *c, int i) {
    return (c && i >= 0 && i < c->n_req) ? c->req[i] : NULL;
}
