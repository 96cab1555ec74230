/* config_write.c - the resolved config written out: the aligned table of
 * `pipeline check` (pl_config_print), the run directory's config.ini with
 * every value's origin (pl_config_to_ini, pl_config_write_ini, through a
 * temporary name and a rename) and the config's hash that checkpoints record
 * (pl_config_hash). The run's, not the core's: plugins read a config, they
 * never write one. */
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
 * Output
 * ==================================================================== */

void pl_config_print(const pl_config *c, FILE *f) {
    if (!c || !f) return;
    int kw = 0, vw = 0;
    for (int i = 0; i < c->n; i++)
        for (int j = 0; j < c->s[i]->n; j++) {
            int k = (int)strlen(c->s[i]->e[j].key), v = (int)strlen(c->s[i]->e[j].value);
            if (k > kw) kw = k;
            if (v > vw) vw = v;
        }
    if (vw > 40) vw = 40;
    if (vw < 2) vw = 2;
    fprintf(f, "resolved configuration of %s (hash %016" PRIx64 ")\n", c->path, pl_config_hash(c));
    for (int i = 0; i < c->n; i++) {
        const pl_config_section *s = c->s[i];
        if (s->plugin)
            fprintf(f, "[%s]  %s %s %s  (%s)\n", s->name, pl_plugin_kind_name(s->plugin->kind),
                    s->plugin->name, s->plugin->version ? s->plugin->version : "?",
                    s->plugin_path ? s->plugin_path : "?");
        else
            fprintf(f, "[%s]\n", s->name);
        for (int j = 0; j < s->n; j++) {
            const entry *e = &s->e[j];
            const char *v = *e->value ? e->value : "\"\"";
            fprintf(f, "  %-*s = %-*s  %s\n", kw, e->key, vw, v, e->origin_str);
        }
    }
}

typedef struct sbuf {
    char *s;
    size_t n, cap;
    bool oom;
} sbuf;

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...) {
    if (b->oom) return;
    va_list ap;
    va_start(ap, fmt);
    int need = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (need < 0) return;
    if (b->n + (size_t)need + 1 > b->cap) {
        size_t cap = (b->n + (size_t)need + 1) * 2;
        char *t = realloc(b->s, cap);
        if (!t) {
            b->oom = true;
            return;
        }
        b->s = t;
        b->cap = cap;
    }
    va_start(ap, fmt);
    vsnprintf(b->s + b->n, b->cap - b->n, fmt, ap);
    va_end(ap);
    b->n += (size_t)need;
}

uint64_t pl_config_hash(const pl_config *c) {
    uint64_t h = 0xcbf29ce484222325ULL; /* FNV-1a 64 offset basis */
    if (!c) return h;
    for (int i = 0; i < c->n; i++)
        for (int j = 0; j < c->s[i]->n; j++) {
            const char *parts[5] = {c->s[i]->name, ".", c->s[i]->e[j].key, "=",
                                    c->s[i]->e[j].value};
            for (int k = 0; k < 5; k++)
                for (const unsigned char *p = (const unsigned char *)parts[k]; *p; p++) {
                    h ^= *p;
                    h *= 0x100000001b3ULL; /* FNV prime */
                }
            h ^= '\n';
            h *= 0x100000001b3ULL;
        }
    return h;
}

/* One `key = value  ; origin` line, aligned to `kw`: when the padding and
 * the origin would make it wider than PL_INI_ALIGN_MAX, the origin goes on a
 * comment line of its own above it (any length reads back). */
static void ini_entry(sbuf *b, int kw, const entry *e) {
    /* a default read back from a config.ini stays marked as one */
    const char *origin = e->file_default ? "default" : e->origin_str;
    size_t kl = strlen(e->key), vl = strlen(e->value), ol = strlen(origin);
    size_t width = kl > (size_t)kw ? kl : (size_t)kw;
    /* inih cuts a value at ';' after white space, '=' included: ";x" is
     * written "key =;x", as a file must hold it */
    bool leads_comment = e->value[0] == ';' || e->value[0] == '#';
    if (width + 3 + vl + 4 + ol <= PL_INI_ALIGN_MAX) {
        sb_printf(b, leads_comment ? "%-*s =%s  ; %s\n" : "%-*s = %s  ; %s\n", kw, e->key, e->value,
                  origin);
        return;
    }
    sb_printf(b, "; %s\n", origin);
    sb_printf(b, leads_comment ? "%s =%s\n" : "%s = %s\n", e->key, e->value);
}

char *pl_config_to_ini(const pl_config *c) {
    if (!c) return NULL;
    sbuf b = {0};
    sb_printf(&b, "; resolved configuration of %s\n; written by pipeline %s, hash %016" PRIx64 "\n",
              c->path, PL_VERSION_STRING, pl_config_hash(c));
    int kw = 0;
    for (int i = 0; i < c->n; i++)
        for (int j = 0; j < c->s[i]->n; j++) {
            int k = (int)strlen(c->s[i]->e[j].key);
            if (k > kw) kw = k;
        }
    for (int i = 0; i < c->n; i++) {
        const pl_config_section *s = c->s[i];
        sb_printf(&b, "\n[%s]\n", s->name);
        for (int j = 0; j < s->n; j++)
            ini_entry(&b, kw, &s->e[j]);
    }
    if (b.oom || !b.s) {
        free(b.s);
        pl_error_set(PL_ERR_NOMEM, "config: out of memory writing %s as INI", c->path);
        return NULL;
    }
    return b.s;
}

pl_status pl_config_write_ini(const pl_config *c, const char *path) {
    char *text = pl_config_to_ini(c);
    if (!text) return pl_error_status();
    FILE *f = fopen(path, "wb");
    if (!f) {
        free(text);
        return pl_error_set(PL_ERR_IO, "cannot write %s: %s", path, strerror(errno));
    }
    size_t n = strlen(text);
    bool ok = fwrite(text, 1, n, f) == n;
    ok &= fclose(f) == 0;
    free(text);
    if (!ok) return pl_error_set(PL_ERR_IO, "cannot write %s: %s", path, strerror(errno));
    return PL_OK;
}
