/* config_validate.c - validation of every key against its owning schema (a
 * plugin's options, the core's for [pipeline] and [trainer]) and the
 * resolution of plugins, defaults, `requires` and @PATH references. See
 * config_internal.h for the contract. */
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

/* The message for a number strtod cannot hold. */
static pl_status range_error(const char *where, const char *sec, const char *key,
                             const char *value) {
    pl_hint_set("a number must lie within the range of a double, about 2.2e-308 to 1.8e308 in "
                "magnitude (or be 0)");
    bool under = fabs(strtod(value, NULL)) < 1.0;
    return pl_error_set(PL_ERR_CONFIG, "%s: [%s] %s = %s: the number %s the range of a double "
                        "(it would be read as %s)", where, sec, key, value,
                        under ? "underflows" : "overflows", under ? "0 or a denormal" : "infinity");
}

/* Does `key` match schema `pattern` whose '*' stands for one non-empty
 * dotted segment (no '.')? */
static bool pattern_match(const char *pattern, const char *key) {
    const char *star = strchr(pattern, '*');
    if (!star) return strcmp(pattern, key) == 0;
    size_t pre = (size_t)(star - pattern), post = strlen(star + 1), kl = strlen(key);
    if (kl < pre + post + 1) return false;
    if (strncmp(pattern, key, pre) != 0 || strcmp(key + kl - post, star + 1) != 0) return false;
    for (size_t i = pre; i < kl - post; i++)
        if (key[i] == '.') return false;
    return true;
}

/* v is one of choices "a|b|c"; a choice "x:N" admits "x:" followed by a
 * decimal index (at most 9 digits). */
static bool choice_has(const char *choices, const char *v) {
    size_t vl = strlen(v);
    const char *p = choices;
    while (p && *p) {
        const char *bar = strchr(p, '|');
        size_t n = bar ? (size_t)(bar - p) : strlen(p);
        if (n == vl && strncmp(p, v, n) == 0) return true;
        if (n >= 2 && strncmp(p + n - 2, ":N", 2) == 0 && vl > n - 1 && vl - (n - 1) <= 9 &&
            strncmp(p, v, n - 1) == 0 && strspn(v + n - 1, "0123456789") == vl - (n - 1))
            return true;
        p = bar ? bar + 1 : NULL;
    }
    return false;
}

static const char *choice_suggest(const char *choices, const char *v, char *buf, size_t bn) {
    const char *cands[64];
    char copy[1024];
    snprintf(copy, sizeof copy, "%s", choices);
    int n = 0;
    char *save = NULL;
    for (char *t = strtok_r(copy, "|", &save); t && n < 64; t = strtok_r(NULL, "|", &save))
        cands[n++] = t;
    const char *s = pl_suggest_name(v, cands, n);
    if (!s) return NULL;
    snprintf(buf, bn, "%s", s);
    return buf;
}

static void bounds_str(const pl_option_spec *o, char *buf, size_t n) {
    snprintf(buf, n, "%.17g <= %s <= %.17g", o->min, o->name, o->max);
}

/* Validate `value` against `o`. On error set PL_ERR_CONFIG with
 * "WHERE: [SEC] KEY = VALUE: expected ..., found ...". */
static pl_status validate_value(const pl_option_spec *o, const char *sec, const char *key,
                                const char *value, const char *where) {
    bool bounded = o->min <= o->max;
    char b[256];
    /* an empty value is the empty string (`pipeline.requires=` clears the
     * list); for a key that cannot be empty, point at the removal syntax */
    if (!*value && o->type != PL_OPT_STRING &&
        !(o->type == PL_OPT_CHOICE && choice_has(o->choices ? o->choices : "", value))) {
        static const char *const want[] = {
            [PL_OPT_INT] = "an integer", [PL_OPT_FLOAT] = "a number",
            [PL_OPT_BOOL] = "true or false", [PL_OPT_CHOICE] = "one of",
            [PL_OPT_NUMBER_OR_FRACTION] = "a count or a fraction"};
        const char *w = (unsigned)o->type < sizeof want / sizeof want[0] && want[o->type]
                            ? want[o->type]
                            : "a value";
        pl_hint_set("an empty value means the empty string; to drop a key the file sets, "
                    "write ~%s.%s on the command line (its default then applies)",
                    sec, key);
        return pl_error_set(PL_ERR_CONFIG, "%s: [%s] %s is empty: expected %s%s%s", where, sec,
                            key, w, o->type == PL_OPT_CHOICE ? " " : "",
                            o->type == PL_OPT_CHOICE && o->choices ? o->choices : "");
    }
    switch (o->type) {
    case PL_OPT_INT: {
        int64_t v;
        if (!cfg_parse_int(value, &v)) {
            pl_hint_set("%s takes an integer: %s", key, o->doc ? o->doc : "");
            return pl_error_set(PL_ERR_CONFIG, "%s: [%s] %s = %s: expected an integer, found '%s'",
                                where, sec, key, value, value);
        }
        if (bounded && ((double)v < o->min || (double)v > o->max)) {
            bounds_str(o, b, sizeof b);
            pl_hint_set("choose a value with %s", b);
            return pl_error_set(PL_ERR_CONFIG, "%s: [%s] %s = %s: out of range, expected %s", where,
                                sec, key, value, b);
        }
        return PL_OK;
    }
    case PL_OPT_FLOAT: {
        double v;
        bool range;
        if (!cfg_parse_float_r(value, &v, &range)) {
            if (range) return range_error(where, sec, key, value);
            pl_hint_set("%s takes a finite number such as 0.5 or 1e-3: %s", key,
                        o->doc ? o->doc : "");
            return pl_error_set(PL_ERR_CONFIG, "%s: [%s] %s = %s: expected a number, found '%s'",
                                where, sec, key, value, value);
        }
        if (bounded && (v < o->min || v > o->max)) {
            bounds_str(o, b, sizeof b);
            pl_hint_set("choose a value with %s", b);
            return pl_error_set(PL_ERR_CONFIG, "%s: [%s] %s = %s: out of range, expected %s", where,
                                sec, key, value, b);
        }
        return PL_OK;
    }
    case PL_OPT_BOOL: {
        bool v;
        if (!cfg_parse_bool(value, &v)) {
            pl_hint_set("use true or false (also accepted: 1/0, yes/no, on/off)");
            return pl_error_set(PL_ERR_CONFIG, "%s: [%s] %s = %s: expected true or false, found '%s'",
                                where, sec, key, value, value);
        }
        return PL_OK;
    }
    case PL_OPT_STRING: return PL_OK;
    case PL_OPT_CHOICE: {
        if (choice_has(o->choices ? o->choices : "", value)) return PL_OK;
        char sb[128];
        const char *s = choice_suggest(o->choices ? o->choices : "", value, sb, sizeof sb);
        if (s)
            pl_hint_set("did you mean '%s'? valid values: %s", s, o->choices);
        else
            pl_hint_set("valid values: %s", o->choices ? o->choices : "(none)");
        return pl_error_set(PL_ERR_CONFIG, "%s: [%s] %s = %s: expected one of %s, found '%s'%s%s%s",
                            where, sec, key, value, o->choices ? o->choices : "(none)", value,
                            s ? "; did you mean '" : "", s ? s : "", s ? "'?" : "");
    }
    case PL_OPT_NUMBER_OR_FRACTION: {
        bool looks_float = strpbrk(value, ".eE") != NULL;
        int64_t iv;
        double fv;
        if (!looks_float && cfg_parse_int(value, &iv)) {
            if (iv < 0 || (bounded && ((double)iv < o->min || (double)iv > o->max))) {
                pl_hint_set("an integer is a count (>= 0); a float in (0, 1] is a fraction");
                return pl_error_set(PL_ERR_CONFIG,
                                    "%s: [%s] %s = %s: out of range, expected a count >= 0", where,
                                    sec, key, value);
            }
            return PL_OK;
        }
        bool range;
        if (!cfg_parse_float_r(value, &fv, &range)) {
            if (range) return range_error(where, sec, key, value);
            pl_hint_set("an integer is a count (e.g. 100); a float in (0, 1] is a fraction (0.25)");
            return pl_error_set(PL_ERR_CONFIG,
                                "%s: [%s] %s = %s: expected a count (integer) or a fraction "
                                "(float in (0, 1]), found '%s'",
                                where, sec, key, value, value);
        }
        if (!(fv > 0.0 && fv <= 1.0)) {
            pl_hint_set("a float is a fraction in (0, 1]; write an integer for a count");
            return pl_error_set(PL_ERR_CONFIG,
                                "%s: [%s] %s = %s: out of range, a fraction must be in (0, 1]",
                                where, sec, key, value);
        }
        return PL_OK;
    }
    }
    return pl_error_set(PL_ERR_INTERNAL, "%s: [%s] %s: option has an unknown type %d", where, sec,
                        key, (int)o->type);
}

/* ====================================================================
 * Resolution
 * ==================================================================== */

static const char *section_where(const pl_config *c, const pl_config_section *s, char *buf,
                                 size_t n) {
    if (s->line)
        snprintf(buf, n, "%s:%d", c->path, s->line);
    else if (s->n && s->e[0].origin == PL_FROM_FILE)
        snprintf(buf, n, "%s", s->e[0].origin_str);
    else if (s->n)
        snprintf(buf, n, "command line");
    else
        snprintf(buf, n, "%s", c->path);
    return buf;
}

static const pl_option_spec *find_spec(const pl_option_spec *schema, const char *key) {
    for (const pl_option_spec *o = schema; o && o->name; o++)
        if (!strchr(o->name, '*') && strcmp(o->name, key) == 0) return o;
    for (const pl_option_spec *o = schema; o && o->name; o++)
        if (strchr(o->name, '*') && pattern_match(o->name, key)) return o;
    return NULL;
}

static pl_status unknown_key(const pl_config_section *s, const entry *e,
                             const pl_option_spec *schema, const char *owner) {
    const char *cands[256] = {0};
    int n = 0;
    if (s->plugin) cands[n++] = "plugin";
    for (const pl_option_spec *o = schema; o && o->name && n < 255; o++) cands[n++] = o->name;
    const char *sug = pl_suggest_name(e->key, cands, n);
    char list[1024] = "";
    size_t off = 0;
    for (int i = 0; i < n && off < sizeof list; i++)
        off += (size_t)snprintf(list + off, sizeof list - off, "%s%s", i ? ", " : "", cands[i]);
    if (s->plugin)
        pl_hint_set("valid keys of %s: %s (see `pipeline plugins %s`)", owner, n ? list : "none",
                    s->plugin->name);
    else
        pl_hint_set("valid keys of [%s]: %s (see docs/ini-reference.md)", s->name, list);
    return pl_error_set(PL_ERR_CONFIG, "%s: unknown key '%s' in [%s] (%s)%s%s%s", e->origin_str,
                        e->key, s->name, owner, sug ? "; did you mean '" : "", sug ? sug : "",
                        sug ? "'?" : "");
}

/* The command line swapped the plugin of `s` (its file named another one)
 * and the file sets keys the new plugin does not know: name them all, say
 * where they came from, and how to drop them. PL_OK if there are none. */
static pl_status swapped_plugin_strays(const pl_config *c, const pl_config_section *s,
                                       const pl_option_spec *schema) {
    const entry *pe = cfg_find_entry(s, "plugin");
    if (!s->plugin || !pe || pe->origin != PL_FROM_CLI) return PL_OK;
    const entry *first = NULL;
    const char *cands[256] = {0};
    int nc = 0;
    for (const pl_option_spec *o = schema; o && o->name && nc < 256; o++) cands[nc++] = o->name;
    char keys[1024] = "", drops[512] = "";
    size_t ko = 0, dro = 0;
    int n = 0;
    for (int i = 0; i < s->n; i++) {
        const entry *e = &s->e[i];
        if (e->origin != PL_FROM_FILE || find_spec(schema, e->key)) continue;
        if (!first) first = e;
        const char *sug = pl_suggest_name(e->key, cands, nc);
        char near[160] = "";
        if (sug) snprintf(near, sizeof near, "; nearest in %s: '%s'", s->plugin->name, sug);
        if (ko < sizeof keys)
            ko += (size_t)snprintf(keys + ko, sizeof keys - ko, "%s'%s' (line %d%s)",
                                   n ? ", " : "", e->key, e->line, near);
        if (dro < sizeof drops)
            dro += (size_t)snprintf(drops + dro, sizeof drops - dro, "%s~%s.%s", n ? " " : "",
                                    s->name, e->key);
        n++;
    }
    if (!first) return PL_OK;
    char old[256];
    if (s->file_plugin)
        snprintf(old, sizeof old, "%s (%s:%d)", s->file_plugin, c->path, s->file_plugin_line);
    else
        snprintf(old, sizeof old, "the file's section (no plugin)");
    const char *name = s->plugin->name;
    char count[32];
    snprintf(count, sizeof count, n > 1 ? "%d keys" : "the key", n);
    pl_hint_set("add %s to the command line to drop %s, or ~%s to drop the file's [%s] whole "
                "and set it from the command line; `pipeline plugins %s` lists %s's keys",
                drops, n > 1 ? "them" : "it", s->name, s->name, name, name);
    return pl_error_set(PL_ERR_CONFIG,
                        "%s: [%s] plugin = %s (command line) replaces %s; %s does not know %s "
                        "the file sets for %s: %s",
                        first->origin_str, s->name, name, old, name, count,
                        s->file_plugin ? s->file_plugin : "it", keys);
}

static char *file_stem(const char *path) {
    const char *b = strrchr(path, '/');
    b = b ? b + 1 : path;
    char *s = cfg_xstrdup(b);
    if (!s) return NULL;
    char *dot = strrchr(s, '.');
    if (dot && dot != s) *dot = '\0';
    return s;
}

/* Rebuild section `s` in schema order, defaults included; validate. */
static pl_status resolve_section(pl_config *c, pl_config_section *s, const pl_option_spec *schema,
                                 const char *owner) {
    /* 1. every user key exists and has a valid value (file order); a
     * plugin swapped on the command line names every key left over */
    if (swapped_plugin_strays(c, s, schema)) return pl_error_status();
    for (int i = 0; i < s->n; i++) {
        entry *e = &s->e[i];
        if (s->plugin && strcmp(e->key, "plugin") == 0) continue;
        const pl_option_spec *o = find_spec(schema, e->key);
        if (!o) return unknown_key(s, e, schema, owner);
        pl_status st = validate_value(o, s->name, e->key, e->value, e->origin_str);
        if (st) return st;
    }
    /* 2. new ordered entry list */
    pl_config_section tmp = {0};
    pl_status st = PL_OK;
    if (s->plugin) {
        entry *e = cfg_find_entry(s, "plugin");
        if (!cfg_add_entry(&tmp, e->key, e->value, e->origin, e->origin_str, e->line)) goto nomem;
    }
    for (const pl_option_spec *o = schema; o && o->name; o++) {
        if (strchr(o->name, '*')) {
            for (int i = 0; i < s->n; i++) {
                entry *e = &s->e[i];
                if (cfg_find_entry(&tmp, e->key) || find_spec(schema, e->key) != o) continue;
                entry *ne = cfg_add_entry(&tmp, e->key, e->value, e->origin, e->origin_str, e->line);
                if (!ne) goto nomem;
                ne->file_default = e->file_default;
            }
            continue;
        }
        entry *e = cfg_find_entry(s, o->name);
        if (e) {
            entry *ne = cfg_add_entry(&tmp, e->key, e->value, e->origin, e->origin_str, e->line);
            if (!ne) goto nomem;
            ne->file_default = e->file_default;
        } else if (!o->default_value) {
            char w[512];
            pl_hint_set("add `%s = ...` to [%s] (%s) or pass %s.%s=VALUE", o->name, s->name,
                        o->doc ? o->doc : "required", s->name, o->name);
            st = pl_error_set(PL_ERR_CONFIG, "%s: [%s] is missing the required key '%s' (%s)",
                              section_where(c, s, w, sizeof w), s->name, o->name, owner);
            goto fail;
        } else {
            const char *def = o->default_value;
            char *stem = NULL;
            if (!s->plugin && strcmp(s->name, "pipeline") == 0 && strcmp(o->name, "name") == 0 &&
                !*def) {
                stem = file_stem(c->path);
                if (!stem) goto nomem;
                def = stem;
            }
            entry *ne = cfg_add_entry(&tmp, o->name, def, PL_FROM_DEFAULT, "default", 0);
            free(stem);
            if (!ne) goto nomem;
        }
    }
    for (int i = 0; i < s->n; i++) cfg_entry_clear(&s->e[i]);
    free(s->e);
    cfg_index_drop(&s->ix);
    s->e = tmp.e;
    s->n = tmp.n;
    s->cap = tmp.cap;
    s->ix = tmp.ix; /* indexes tmp.e, now s->e */
    return PL_OK;
nomem:
    st = pl_error_set(PL_ERR_NOMEM, "config: out of memory resolving [%s]", s->name);
fail:
    cfg_index_drop(&tmp.ix);
    for (int i = 0; i < tmp.n; i++) cfg_entry_clear(&tmp.e[i]);
    free(tmp.e);
    return st;
}

static char *resolve_path(const pl_config *c, const char *p) {
    if (p[0] == '/') return cfg_xstrdup(p);
    if (!c->dir || !*c->dir || strcmp(c->dir, ".") == 0) return cfg_xstrdup(p);
    return cfg_xprintf("%s/%s", c->dir, p);
}

static pl_status resolve_requires(pl_config *c) {
    const pl_config_section *s = cfg_find_section(c, "pipeline");
    const entry *e = s ? cfg_find_entry(s, "requires") : NULL;
    if (!e || !*e->value) return PL_OK;
    char *copy = cfg_xstrdup(e->value), *save = NULL;
    if (!copy) return pl_error_status();
    pl_status st = PL_OK;
    for (char *t = strtok_r(copy, " ,\t", &save); t; t = strtok_r(NULL, " ,\t", &save)) {
        char *p = resolve_path(c, t);
        if (!p) {
            st = pl_error_status();
            break;
        }
        struct stat sb;
        if (stat(p, &sb) != 0 || !S_ISREG(sb.st_mode)) {
            pl_hint_set("paths in requires are relative to the directory of %s", c->path);
            st = pl_error_set(PL_ERR_CONFIG, "%s: [pipeline] requires: '%s' not found (looked for %s)",
                              e->origin_str, t, p);
            free(p);
            break;
        }
        char **r = realloc(c->req, (size_t)(c->n_req + 1) * sizeof *r);
        if (!r) {
            free(p);
            st = pl_error_set(PL_ERR_NOMEM, "config: out of memory");
            break;
        }
        c->req = r;
        c->req[c->n_req++] = p;
    }
    free(copy);
    return st;
}

/* The config path of a reference "@PATH.ini:..." (the text between '@' and
 * `end`), resolved against the referring config's folder into ini_path. -1
 * (PL_ERR_CONFIG naming the reference) when PATH is longer than a path. */
static int ref_config_path(const pl_config *c, const char *value, const char *end,
                           char *ini_path, size_t pn) {
    char rel[PATH_MAX];
    size_t n = (size_t)(end - value - 1);
    if (n >= sizeof rel) {
        pl_error_set(PL_ERR_CONFIG, "reference '%.64s...': the config path is longer than %d bytes",
                     value, PATH_MAX - 1);
        return -1;
    }
    memcpy(rel, value + 1, n);
    rel[n] = '\0';
    char *p = resolve_path(c, rel);
    if (!p) return -1;
    snprintf(ini_path, pn, "%s", p);
    free(p);
    return 0;
}

int pl_config_parse_ref(const pl_config *c, const char *value, char *ini_path, size_t pn,
                        char *which, size_t wn) {
    if (!value || value[0] != '@') return 0;
    const char *colon = strrchr(value, ':');
    if (!colon || colon == value + 1 ||
        (strcmp(colon + 1, "best") != 0 && strcmp(colon + 1, "last") != 0)) {
        pl_hint_set("write a stage reference as @PATH.ini:best or @PATH.ini:last");
        pl_error_set(PL_ERR_CONFIG, "reference '%s': expected @PATH.ini:best or @PATH.ini:last",
                     value);
        return -1;
    }
    if (ref_config_path(c, value, colon, ini_path, pn)) return -1;
    snprintf(which, wn, "%s", colon + 1);
    return 1;
}

int pl_config_parse_output_ref(const pl_config *c, const char *value, char *ini_path, size_t pn,
                               char *rel, size_t rn) {
    if (!value || value[0] != '@') return 0;
    const char *mark = strstr(value, ":outputs/");
    if (!mark) return 0;
    const char *file = mark + strlen(":outputs/");
    if (mark == value + 1 || !*file || strstr(file, "..")) {
        pl_hint_set("write a run's output as @PATH.ini:outputs/FILE");
        pl_error_set(PL_ERR_CONFIG, "reference '%s': expected @PATH.ini:outputs/FILE (FILE "
                     "inside the run's outputs/, no '..')", value);
        return -1;
    }
    if (ref_config_path(c, value, mark, ini_path, pn)) return -1;
    snprintf(rel, rn, "outputs/%s", file);
    return 1;
}

pl_status pl_config_set_resolved(pl_config *c, const char *section, const char *key,
                                 const char *value) {
    entry *e = cfg_find_entry(cfg_find_section(c, section), key);
    if (!e)
        return pl_error_set(PL_ERR_INVALID, "config: no key %s.%s to resolve", section, key);
    char *v = cfg_xstrdup(value);
    if (!v) return pl_error_status();
    free(e->value);
    e->value = v;
    return PL_OK;
}

static bool same_file(const char *a, const char *b) {
    char ra[PATH_MAX], rb[PATH_MAX];
    if (realpath(a, ra) && realpath(b, rb)) return strcmp(ra, rb) == 0;
    return strcmp(a, b) == 0;
}

/* Every string key of the config may be a @reference; check the ones the
 * core documents (trainer.init_from) and any value starting with '@' in
 * [trainer]. */
static pl_status check_output_refs(pl_config *c) {
    for (int i = 0; i < c->n; i++) {
        const pl_config_section *s = c->s[i];
        for (int k = 0; k < s->n; k++) {
            const entry *e = &s->e[k];
            char path[PATH_MAX], rel[PATH_MAX];
            int r = pl_config_parse_output_ref(c, e->value, path, sizeof path, rel, sizeof rel);
            if (r < 0) return pl_error_prefix(PL_ERR_CONFIG, "%s: [%s] %s", e->origin_str, s->name,
                                              e->key);
            if (r == 0) continue;
            bool listed = false;
            for (int q = 0; q < c->n_req && !listed; q++)
                listed = same_file(c->req[q], path);
            if (listed) continue;
            pl_hint_set("add it to [pipeline] requires so the run it depends on is known");
            return pl_error_set(PL_ERR_CONFIG, "%s: [%s] %s = %s: %s is not listed in [pipeline] "
                                "requires", e->origin_str, s->name, e->key, e->value, path);
        }
    }
    return PL_OK;
}

static pl_status check_refs(pl_config *c) {
    pl_status ost = check_output_refs(c);
    if (ost) return ost;
    const pl_config_section *s = cfg_find_section(c, "trainer");
    const entry *e = s ? cfg_find_entry(s, "init_from") : NULL;
    if (!e || e->value[0] != '@') return PL_OK;
    char path[PATH_MAX], which[16];
    int r = pl_config_parse_ref(c, e->value, path, sizeof path, which, sizeof which);
    if (r < 0) return pl_error_prefix(PL_ERR_CONFIG, "%s: [trainer] init_from", e->origin_str);
    for (int i = 0; i < c->n_req; i++)
        if (same_file(c->req[i], path)) return PL_OK;
    pl_hint_set("add it to [pipeline] requires so the run it depends on is known");
    return pl_error_set(PL_ERR_CONFIG,
                        "%s: [trainer] init_from = %s: %s is not listed in [pipeline] requires",
                        e->origin_str, e->value, path);
}

/* Resolve one section: a core section against its schema, a stage section
 * by finding its plugin and checking keys against the plugin's options. */
static pl_status resolve_one(pl_config *c, pl_registry *reg, pl_config_section *s) {
    const pl_option_spec *core = pl_core_schema(s->name);
    if (core) {
        pl_status st = resolve_section(c, s, core, "core section");
        const entry *rd = st || strcmp(s->name, "pipeline") ? NULL : cfg_find_entry(s, "run_dir");
        if (rd && !*rd->value) {
            /* RUN_DIR/NAME/... with an empty RUN_DIR is /NAME/... at the root */
            pl_hint_set("give a directory (the default is runs, relative to the working "
                        "directory), or drop the key: ~pipeline.run_dir");
            return pl_error_set(PL_ERR_CONFIG,
                                "%s: [pipeline] run_dir is empty: runs would be written to "
                                "/NAME/... at the filesystem root",
                                rd->origin_str);
        }
        return st;
    }
    int kind = pl_stage_section_kind(s->name);
    entry *pe = cfg_find_entry(s, "plugin");
    if (!pe) {
        char w[512];
        pl_hint_set("add `plugin = NAME` to [%s]; `pipeline plugins` lists the %s plugins",
                    s->name, pl_plugin_kind_name((pl_plugin_kind)kind));
        return pl_error_set(PL_ERR_CONFIG, "%s: [%s] is missing the required key 'plugin'",
                            section_where(c, s, w, sizeof w), s->name);
    }
    pl_status st = pl_registry_find_for(reg, pe->value, (pl_plugin_kind)kind, s->name,
                                        pe->origin_str, &s->plugin);
    if (st) return st;
    s->plugin_path = pl_registry_path_of(reg, s->plugin->name);
    char owner[160];
    snprintf(owner, sizeof owner, "plugin %s", s->plugin->name);
    return resolve_section(c, s, s->plugin->options, owner);
}

pl_status cfg_resolve(pl_config *c, pl_registry *reg) {
    const char *const *known = pl_config_known_sections();
    /* unknown sections (file order); scheduler<SUFFIX> sections are a list */
    for (int i = 0; i < c->n; i++) {
        pl_config_section *s = c->s[i];
        bool ok = pl_stage_section_kind(s->name) >= 0;
        for (int k = 0; known[k]; k++) ok |= strcmp(known[k], s->name) == 0;
        if (ok) continue;
        char w[512];
        const char *sug = pl_suggest_name(s->name, known, -1);
        pl_hint_set("valid sections: [pipeline] [data] [model] [optimizer] [averager] [scheduler] "
                    "(more schedulers: [scheduler2], [scheduler_NAME]) [precision] [trainer]");
        return pl_error_set(PL_ERR_CONFIG, "%s: unknown section [%s]%s%s%s",
                            section_where(c, s, w, sizeof w), s->name,
                            sug ? "; did you mean [" : "", sug ? sug : "", sug ? "]?" : "");
    }
    const char *const *req = pl_config_required_sections();
    for (int k = 0; req[k] && !c->partial; k++) {
        if (cfg_find_section(c, req[k])) continue;
        pl_hint_set("add a [%s] section with `plugin = NAME` (see `pipeline plugins`)", req[k]);
        return pl_error_set(PL_ERR_CONFIG, "%s: missing section [%s]", c->path, req[k]);
    }
    /* resolve in canonical order (schedulers in file order at the place of
     * [scheduler]); core sections always present */
    pl_config_section **ordered = calloc((size_t)c->n + 8, sizeof *ordered);
    if (!ordered) return pl_error_set(PL_ERR_NOMEM, "config: out of memory");
    int n = 0;
    pl_status st = PL_OK;
    for (int k = 0; known[k] && !st; k++) {
        if (!strcmp(known[k], "scheduler")) {
            for (int i = 0; i < c->n && !st; i++) {
                if (pl_stage_section_kind(c->s[i]->name) != PL_KIND_SCHEDULER) continue;
                ordered[n++] = c->s[i];
                st = resolve_one(c, reg, c->s[i]);
            }
            continue;
        }
        pl_config_section *s = cfg_find_section(c, known[k]);
        if (!s && !pl_core_schema(known[k])) continue;
        if (!s && !(s = cfg_add_section(c, known[k], 0))) {
            st = pl_error_status();
            break;
        }
        ordered[n++] = s;
        st = resolve_one(c, reg, s);
    }
    if (!st) {
        /* every section was known, so `ordered` holds them all */
        free(c->s);
        c->s = ordered;
        cfg_index_drop(&c->ix); /* positions changed: rebuilt at the next lookup */
        c->n = n;
        c->cap = c->n + 8;
        ordered = NULL;
        st = resolve_requires(c);
        if (!st) st = check_refs(c);
    }
    free(ordered);
    return st;
}
