#define _GNU_SOURCE /* vasprintf */
/* config.c - INI loading (inih's dialect), command-line overrides, validation against
 * option schemas, the resolved config (values + origins), its printing,
 * INI writing and hash. See config_internal.h for the contract. */
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

#include "config_internal.h"


/* ====================================================================
 * Data structures
 * ==================================================================== */

/* A hash index from names to positions in an array (sections of a config,
 * keys of a section), so a file with 100,000 sections or keys loads in
 * linear time. Built when the array reaches INDEX_MIN names (below that a
 * scan is as fast), kept up to date by appends, dropped by removals (rare:
 * `~` on the command line) and rebuilt at the next lookup. Open addressing,
 * load factor <= 1/2; slot = position + 1, 0 empty. */
#define INDEX_MIN 32
/* config.ini of a run puts the origin of a value after it (`key = value  ;
 * origin`) while the line stays within this width, on a comment line of its
 * own above it otherwise. Only layout: the parser reads lines of any length. */
#define PL_INI_ALIGN_MAX 198
/* The comment that marks a key as a default the run took (its own line above
 * the key, or after the value): read back as a default (entry.file_default). */
#define PL_INI_DEFAULT_MARK "; default"
typedef struct name_index {
    int *slot;
    size_t cap; /* power of two, 0: no index */
} name_index;

static uint64_t name_hash(const char *k) { /* FNV-1a */
    uint64_t h = 1469598103934665603ull;
    for (; *k; k++) h = (h ^ (unsigned char)*k) * 1099511628211ull;
    return h;
}

static void index_drop(name_index *ix) {
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
        if (!index_build(ix, n, name_at, arr)) index_drop(ix);
        return;
    }
    index_put(ix, name_at(arr, n - 1), n - 1);
}

typedef struct entry {
    char *key;
    char *value;
    pl_value_origin origin;
    char *origin_str; /* "file.ini:12", "command line", "default" */
    int line;         /* 0 unless from the file */
    /* From the file, marked `; default` (a run's config.ini, written by
     * pl_config_write_ini, records the defaults it took that way): the value
     * is used, but pl_cfg_is_set says the user did not set it. */
    bool file_default;
} entry;

struct pl_config_section {
    char *name;
    int line;        /* line of the [name] header, 0 if none */
    int n, cap;
    entry *e;
    const pl_plugin_desc *plugin;
    const char *plugin_path; /* borrowed from the registry */
    char *file_plugin;       /* the file's `plugin` when the command line replaced it */
    int file_plugin_line;
    name_index ix;           /* keys -> positions in e (config.c's name_index) */
    const pl_config *owner;  /* the config holding this section (pl_cfg_sibling) */
};

struct pl_config {
    char *path; /* name used in origins and messages */
    char *dir;  /* base for relative paths */
    int n, cap;
    pl_config_section **s;
    name_index ix; /* section names -> positions in s */
    int n_req;
    char **req;
    bool partial; /* pl_config_load_partial: no required-sections check */
};

static char *xstrdup(const char *s) {
    char *d = strdup(s ? s : "");
    if (!d) pl_error_set(PL_ERR_NOMEM, "config: out of memory");
    return d;
}

static char *xprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *xprintf(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char *s = NULL;
    if (vasprintf(&s, fmt, ap) < 0) s = NULL;
    va_end(ap);
    if (!s) pl_error_set(PL_ERR_NOMEM, "config: out of memory");
    return s;
}

static void entry_clear(entry *e) {
    free(e->key);
    free(e->value);
    free(e->origin_str);
    memset(e, 0, sizeof *e);
}

static void section_free(pl_config_section *s) {
    if (!s) return;
    for (int i = 0; i < s->n; i++) entry_clear(&s->e[i]);
    free(s->e);
    free(s->name);
    free(s->file_plugin);
    index_drop(&s->ix);
    free(s);
}

void pl_config_free(pl_config *c) {
    if (!c) return;
    for (int i = 0; i < c->n; i++) section_free(c->s[i]);
    free(c->s);
    index_drop(&c->ix);
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
static pl_config_section *find_section(const pl_config *c, const char *name) {
    int i = index_find((name_index *)&c->ix, c->n, section_name_at, c->s, name);
    return i < 0 ? NULL : c->s[i];
}

static pl_config_section *add_section(pl_config *c, const char *name, int line) {
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
    if (!s || !(s->name = xstrdup(name))) {
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

static entry *find_entry(const pl_config_section *s, const char *key) {
    if (!s || !key) return NULL;
    int i = index_find((name_index *)&s->ix, s->n, entry_key_at, s->e, key);
    return i < 0 ? NULL : &s->e[i];
}

/* Append an entry; takes ownership of nothing (copies). */
static entry *add_entry(pl_config_section *s, const char *key, const char *value,
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
    e->key = xstrdup(key);
    e->value = xstrdup(value);
    e->origin_str = xstrdup(origin_str);
    if (!e->key || !e->value || !e->origin_str) {
        entry_clear(e);
        return NULL;
    }
    e->origin = origin;
    e->line = line;
    s->n++;
    index_added(&s->ix, s->n, entry_key_at, s->e);
    return e;
}

/* ====================================================================
 * Small helpers: edit distance, suggestions, value parsing
 * ==================================================================== */

int pl_edit_distance(const char *a, const char *b) {
    size_t n = strlen(a), m = strlen(b);
    if (n > 255 || m > 255) return (int)(n > m ? n : m);
    int row[256];
    for (size_t j = 0; j <= m; j++) row[j] = (int)j;
    for (size_t i = 1; i <= n; i++) {
        int prev = row[0];
        row[0] = (int)i;
        for (size_t j = 1; j <= m; j++) {
            int cur = row[j];
            int sub = prev + (a[i - 1] != b[j - 1]);
            int del = row[j] + 1, ins = row[j - 1] + 1;
            row[j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
            prev = cur;
        }
    }
    return row[m];
}

/* Edit distance ignoring ASCII case ("adamW" is 0 from "adamw"). */
static int edit_distance_nocase(const char *a, const char *b) {
    char la[256], lb[256];
    size_t i;
    for (i = 0; a[i] && i < sizeof la - 1; i++) la[i] = (char)tolower((unsigned char)a[i]);
    la[i] = 0;
    for (i = 0; b[i] && i < sizeof lb - 1; i++) lb[i] = (char)tolower((unsigned char)b[i]);
    lb[i] = 0;
    return pl_edit_distance(la, lb);
}

const char *pl_suggest_name(const char *word, const char *const *cands, int n) {
    int len = (int)strlen(word);
    int limit = len / 3 > 2 ? len / 3 : 2;
    const char *best = NULL;
    int bestd = INT_MAX;
    for (int i = 0; n < 0 ? cands[i] != NULL : i < n; i++) {
        if (!cands[i] || strchr(cands[i], '*')) continue;
        /* a case-only difference first, then the fewest edits (case ignored) */
        int d = !strcmp(word, cands[i])       ? -1
                : !strcasecmp(word, cands[i]) ? 0
                                              : 1 + edit_distance_nocase(word, cands[i]);
        if (d < bestd) {
            bestd = d;
            best = cands[i];
        }
    }
    return (best && bestd <= limit + 1) ? best : NULL;
}

static bool parse_int(const char *s, int64_t *out) {
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
static bool parse_float_r(const char *s, double *out, bool *range) {
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
static bool parse_float(const char *s, double *out) { return parse_float_r(s, out, NULL); }

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

static bool parse_bool(const char *s, bool *out) {
    static const char *yes[] = {"true", "1", "yes", "on"}, *no[] = {"false", "0", "no", "off"};
    if (!s) return false;
    for (int i = 0; i < 4; i++) {
        if (strcasecmp(s, yes[i]) == 0) return *out = true, true;
        if (strcasecmp(s, no[i]) == 0) return *out = false, true;
    }
    return false;
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
        if (!parse_int(value, &v)) {
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
        if (!parse_float_r(value, &v, &range)) {
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
        if (!parse_bool(value, &v)) {
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
        if (!looks_float && parse_int(value, &iv)) {
            if (iv < 0 || (bounded && ((double)iv < o->min || (double)iv > o->max))) {
                pl_hint_set("an integer is a count (>= 0); a float in (0, 1] is a fraction");
                return pl_error_set(PL_ERR_CONFIG,
                                    "%s: [%s] %s = %s: out of range, expected a count >= 0", where,
                                    sec, key, value);
            }
            return PL_OK;
        }
        bool range;
        if (!parse_float_r(value, &fv, &range)) {
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
 * Parsing
 *
 * The INI dialect of inih (r55, Debian's libinih with its defaults), read
 * line by line here so that a line has no length limit: inih reads into a
 * fixed buffer (INI_MAX_LINE, 200 bytes in Debian's build, a compile-time
 * constant of the shared library), which refused any path longer than ~190
 * bytes. Same rules as inih: a UTF-8 BOM is skipped on line 1; lines are
 * trimmed (isspace); a line starting with ';' or '#' is a comment; an
 * indented line after a key continues its value (refused here); `[name]`
 * opens a section (text after ']' ignored); `name = value` or
 * `name : value` sets a key, the value cut at ';' after white space (an
 * inline comment) and trimmed; anything else is a syntax error. Parsing goes
 * on after an error and the first error line is reported.
 *
 * One addition: a key whose comment is exactly `; default` (after the
 * value, or alone on the line above it) is a default the run took, as a
 * run's config.ini records it: its value is used but pl_cfg_is_set is false,
 * so `pipeline run RUN/config.ini`, predict and export treat it as the run
 * did (a backbone's config.json supplies the shape the run took from it).
 * ==================================================================== */

typedef struct parse_ctx {
    pl_config *c;
    const char *text;
    size_t pos, len;
    int lineno;
    char *section;     /* current section name ("" before the first header) */
    char *prev_name;   /* key of the last `name = value`, NULL after a header */
    int prev_line;
    bool failed;
    int err_line;
} parse_ctx;

static void fail_at(parse_ctx *p, int line, pl_status st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void fail_at(parse_ctx *p, int line, pl_status st, const char *fmt, ...) {
    if (p->failed) return;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    p->failed = true;
    p->err_line = line;
    pl_error_set(st, "%s", msg);
}

static char *ini_rstrip(char *s) {
    char *e = s + strlen(s);
    while (e > s && isspace((unsigned char)e[-1])) *--e = '\0';
    return s;
}

static char *ini_lskip(char *s) {
    while (*s && isspace((unsigned char)*s)) s++;
    return s;
}

/* First of `chars` (NULL: none) or of an inline comment (';' after white
 * space) in s, or its terminating NUL (inih's find_chars_or_comment). */
static char *ini_find(char *s, const char *chars) {
    bool was_space = false;
    while (*s && !(chars && strchr(chars, *s)) && !(was_space && *s == ';')) {
        was_space = isspace((unsigned char)*s);
        s++;
    }
    return s;
}

static void on_section(parse_ctx *p, const char *name) {
    char *copy = xstrdup(name);
    if (!copy) {
        fail_at(p, p->lineno, PL_ERR_NOMEM, "config: out of memory");
        return;
    }
    free(p->section);
    p->section = copy;
    free(p->prev_name);
    p->prev_name = NULL;
    pl_config_section *sec = find_section(p->c, name);
    if (sec && sec->line) {
        fail_at(p, p->lineno, PL_ERR_CONFIG, "%s:%d: section [%s] appears twice (first at %s:%d)",
                p->c->path, p->lineno, name, p->c->path, sec->line);
        pl_hint_set("merge the two [%s] sections into one", name);
    } else if (sec) {
        sec->line = p->lineno;
    } else if (!add_section(p->c, name, p->lineno)) {
        fail_at(p, p->lineno, PL_ERR_NOMEM, "config: out of memory");
    }
}

static void on_key(parse_ctx *p, const char *name, const char *value, bool is_default) {
    int line = p->lineno;
    char *copy = xstrdup(name);
    if (!copy) {
        fail_at(p, line, PL_ERR_NOMEM, "config: out of memory");
        return;
    }
    free(p->prev_name);
    p->prev_name = copy;
    p->prev_line = line;
    if (p->failed) return;
    const char *section = p->section ? p->section : "";
    if (!*section) {
        fail_at(p, line, PL_ERR_CONFIG, "%s:%d: key '%s' is outside any section", p->c->path, line,
                name);
        pl_hint_set("put it under a section header such as [pipeline] or [trainer]");
        return;
    }
    pl_config_section *sec = find_section(p->c, section);
    if (!sec && !(sec = add_section(p->c, section, 0))) {
        fail_at(p, line, PL_ERR_NOMEM, "config: out of memory");
        return;
    }
    entry *old = find_entry(sec, name);
    if (old) {
        fail_at(p, line, PL_ERR_CONFIG, "%s:%d: duplicate key '%s' in [%s] (first set at %s)",
                p->c->path, line, name, section, old->origin_str);
        pl_hint_set("keep one of %s and %s:%d", old->origin_str, p->c->path, line);
        return;
    }
    char *origin = xprintf("%s:%d%s", p->c->path, line, is_default ? " (default)" : "");
    entry *e = origin ? add_entry(sec, name, value, PL_FROM_FILE, origin, line) : NULL;
    if (!e)
        fail_at(p, line, PL_ERR_NOMEM, "config: out of memory");
    else
        e->file_default = is_default;
    free(origin);
}

/* Text of line `n` (1-based) of p->text, trimmed, into buf (cut at bn - 1
 * bytes with "..." when longer). */
static void line_text(const parse_ctx *p, int n, char *buf, size_t bn) {
    const char *s = p->text, *end = p->text + p->len;
    for (int i = 1; i < n && s < end; i++) {
        const char *nl = memchr(s, '\n', (size_t)(end - s));
        s = nl ? nl + 1 : end;
    }
    const char *nl = memchr(s, '\n', (size_t)(end - s));
    size_t len = nl ? (size_t)(nl - s) : (size_t)(end - s);
    while (len && (s[len - 1] == '\r' || s[len - 1] == ' ')) len--;
    if (len >= bn) {
        snprintf(buf, bn, "%.*s...", (int)(bn - 4), s);
        return;
    }
    memcpy(buf, s, len);
    buf[len] = '\0';
}

static pl_status parse_text(pl_config *c, const char *text) {
    parse_ctx p = {.c = c, .text = text, .len = strlen(text)};
    char *line = NULL;
    size_t cap = 0;
    int syntax = 0;            /* first line inih would call an error */
    bool default_next = false; /* the line before was the comment `; default` */
    while (p.pos < p.len) {
        const char *start = text + p.pos;
        const char *nl = memchr(start, '\n', p.len - p.pos);
        size_t linelen = nl ? (size_t)(nl - start) : p.len - p.pos;
        p.pos += linelen + (nl != NULL);
        p.lineno++;
        if (linelen + 1 > cap) {
            size_t ncap = linelen + 1 > 2 * cap ? linelen + 1 : 2 * cap;
            char *nb = realloc(line, ncap);
            if (!nb) {
                free(line);
                free(p.section);
                free(p.prev_name);
                return pl_error_set(PL_ERR_NOMEM, "%s: out of memory while parsing line %d",
                                    c->path, p.lineno);
            }
            line = nb;
            cap = ncap;
        }
        memcpy(line, start, linelen);
        line[linelen] = '\0';
        char *s = line;
        if (p.lineno == 1 && (unsigned char)s[0] == 0xEF && (unsigned char)s[1] == 0xBB &&
            (unsigned char)s[2] == 0xBF)
            s += 3;
        s = ini_lskip(ini_rstrip(s));
        bool marked = default_next;
        default_next = !strcmp(s, PL_INI_DEFAULT_MARK);
        if (!*s || *s == ';' || *s == '#') continue;
        if (p.prev_name && s > line) {
            /* an indented line after a key: inih's multi-line value */
            if (!p.failed) {
                fail_at(&p, p.lineno, PL_ERR_CONFIG,
                        "%s:%d: indented line continues the value of '%s' (line %d); "
                        "multi-line values are not supported",
                        c->path, p.lineno, p.prev_name, p.prev_line);
                pl_hint_set("remove the indentation at %s:%d, or put the whole value on line %d",
                            c->path, p.lineno, p.prev_line);
            }
            continue;
        }
        if (*s == '[') {
            char *end = ini_find(s + 1, "]");
            if (*end == ']') {
                *end = '\0';
                on_section(&p, s + 1);
            } else if (!syntax) {
                syntax = p.lineno;
            }
            continue;
        }
        char *end = ini_find(s, "=:");
        if (*end != '=' && *end != ':') {
            if (!syntax) syntax = p.lineno;
            continue;
        }
        *end = '\0';
        char *value = end + 1;
        char *cut = ini_find(value, NULL);
        marked |= !strcmp(cut, PL_INI_DEFAULT_MARK);
        *cut = '\0';
        value = ini_rstrip(ini_lskip(value));
        on_key(&p, ini_rstrip(s), value, marked);
    }
    free(line);
    free(p.section);
    free(p.prev_name);
    if (syntax && (!p.failed || syntax < p.err_line)) {
        char txt[256];
        line_text(&p, syntax, txt, sizeof txt);
        pl_hint_set("lines must be `key = value`, `[section]`, blank, or a comment starting "
                    "with ';' or '#'");
        return pl_error_set(PL_ERR_CONFIG, "%s:%d: cannot parse '%s'", c->path, syntax, txt);
    }
    if (p.failed) return pl_error_status();
    return PL_OK;
}

/* ====================================================================
 * Overrides
 * ==================================================================== */

static bool is_name_char(char ch) { return isalnum((unsigned char)ch) || ch == '_'; }

bool pl_is_override(const char *arg) {
    if (!arg || arg[0] == '-') return false;
    if (arg[0] == '~') return is_name_char(arg[1]) && !strchr(arg, '/') && !strchr(arg, '=');
    const char *eq = strchr(arg, '=');
    if (!eq) return false;
    const char *slash = strchr(arg, '/');
    return !slash || slash > eq;
}

/* Key name rules shared by setting and removal: non-empty, no blanks, no
 * INI syntax characters, not ending with '.'. */
static bool key_ok(const char *k, size_t kl) {
    if (kl == 0 || k[kl - 1] == '.') return false;
    for (size_t i = 0; i < kl; i++)
        if (isspace((unsigned char)k[i]) || k[i] == '[' || k[i] == ']' || k[i] == ';' ||
            k[i] == '=')
            return false;
    return true;
}

static pl_status parse_removal(const char *arg, char *section, size_t sn, char *key, size_t kn,
                               const char **value) {
    const char *name = arg + 1, *dot = strchr(name, '.');
    size_t sl = dot ? (size_t)(dot - name) : strlen(name);
    size_t kl = dot ? strlen(dot + 1) : 0;
    bool ok = sl > 0 && sl < sn && kl < kn && !strchr(arg, '=');
    for (size_t i = 0; ok && i < sl; i++) ok = is_name_char(name[i]);
    if (ok && dot) ok = key_ok(dot + 1, kl);
    if (!ok) {
        pl_hint_set("write ~section.key to drop a key the file sets, ~section to drop a whole "
                    "section, e.g. ~optimizer.beta1 or ~averager");
        return pl_error_set(PL_ERR_CONFIG,
                            "override '%s': bad removal (expected ~section.key or ~section)", arg);
    }
    memcpy(section, name, sl);
    section[sl] = '\0';
    if (kl) memcpy(key, dot + 1, kl);
    key[kl] = '\0';
    if (value) *value = NULL;
    return PL_OK;
}

pl_status pl_override_parse(const char *arg, char *section, size_t sn, char *key, size_t kn,
                            const char **value) {
    if (arg && arg[0] == '~') return parse_removal(arg, section, sn, key, kn, value);
    const char *eq = arg ? strchr(arg, '=') : NULL;
    if (!eq) {
        pl_hint_set("write overrides as section.key=value (e.g. optimizer.lr=5e-4), or "
                    "~section.key to drop a key the file sets");
        return pl_error_set(PL_ERR_CONFIG, "override '%s': missing '=' (expected section.key=value)",
                            arg ? arg : "");
    }
    const char *dot = memchr(arg, '.', (size_t)(eq - arg));
    if (!dot) {
        pl_hint_set("write overrides as section.key=value, e.g. optimizer.lr=5e-4");
        return pl_error_set(PL_ERR_CONFIG,
                            "override '%s': missing section (expected section.key=value)", arg);
    }
    size_t sl = (size_t)(dot - arg), kl = (size_t)(eq - dot - 1);
    bool ok = sl > 0 && sl < sn && kl < kn;
    for (size_t i = 0; ok && i < sl; i++) ok = is_name_char(arg[i]);
    if (ok) ok = key_ok(dot + 1, kl);
    if (!ok) {
        pl_hint_set("write overrides as section.key=value, e.g. optimizer.lr=5e-4");
        return pl_error_set(PL_ERR_CONFIG,
                            "override '%s': bad section or key name (expected section.key=value)",
                            arg);
    }
    memcpy(section, arg, sl);
    section[sl] = '\0';
    memcpy(key, dot + 1, kl);
    key[kl] = '\0';
    if (value) *value = eq + 1;
    return PL_OK;
}

/* Is `~sec` (a whole-section removal) among the overrides? */
static bool section_dropped(int n, const char *const *over, const char *sec) {
    for (int i = 0; i < n; i++)
        if (over[i][0] == '~' && strcmp(over[i] + 1, sec) == 0) return true;
    return false;
}

/* One removal `~sec` or `~sec.key` (key ""): drops what the file set, as if
 * its lines were not there. Removing what the file does not have is an
 * error (a typo would otherwise be silently ignored). */
static pl_status apply_removal(pl_config *c, const char *arg, const char *sec, const char *key,
                               bool section_also_dropped) {
    int si = -1;
    for (int i = 0; i < c->n; i++)
        if (strcmp(c->s[i]->name, sec) == 0) si = i;
    if (*key && section_also_dropped) {
        pl_hint_set("~%s already drops every key of [%s]; leave out %s", sec, sec, arg);
        return pl_error_set(PL_ERR_CONFIG, "command line: %s: [%s] is already dropped by ~%s", arg,
                            sec, sec);
    }
    if (si < 0) {
        const char *names[64];
        int n = 0;
        char list[512] = "";
        size_t off = 0;
        for (int i = 0; i < c->n && n < 64; i++) {
            names[n++] = c->s[i]->name;
            if (off < sizeof list)
                off += (size_t)snprintf(list + off, sizeof list - off, "%s[%s]", i ? " " : "",
                                        c->s[i]->name);
        }
        const char *sug = pl_suggest_name(sec, names, n);
        pl_hint_set("~ drops only what %s sets; its sections: %s", c->path, n ? list : "none");
        return pl_error_set(PL_ERR_CONFIG, "command line: %s: %s has no section [%s]%s%s%s", arg,
                            c->path, sec, sug ? "; did you mean [" : "", sug ? sug : "",
                            sug ? "]?" : "");
    }
    pl_config_section *S = c->s[si];
    if (!*key) {
        section_free(S);
        memmove(&c->s[si], &c->s[si + 1], (size_t)(c->n - si - 1) * sizeof *c->s);
        c->n--;
        index_drop(&c->ix); /* positions moved: rebuilt at the next lookup */
        return PL_OK;
    }
    for (int i = 0; i < S->n; i++) {
        if (strcmp(S->e[i].key, key) != 0) continue;
        entry_clear(&S->e[i]);
        memmove(&S->e[i], &S->e[i + 1], (size_t)(S->n - i - 1) * sizeof *S->e);
        S->n--;
        index_drop(&S->ix);
        return PL_OK;
    }
    const char *names[256];
    int n = 0;
    char list[512] = "";
    size_t off = 0;
    for (int i = 0; i < S->n && n < 256; i++) {
        names[n++] = S->e[i].key;
        if (off < sizeof list)
            off += (size_t)snprintf(list + off, sizeof list - off, "%s%s", i ? ", " : "",
                                    S->e[i].key);
    }
    const char *sug = pl_suggest_name(key, names, n);
    pl_hint_set("~ drops only keys the file sets; [%s] in %s sets: %s", sec, c->path,
                n ? list : "nothing");
    return pl_error_set(PL_ERR_CONFIG, "command line: %s: [%s] in %s has no key '%s'%s%s%s", arg,
                        sec, c->path, key, sug ? "; did you mean '" : "", sug ? sug : "",
                        sug ? "'?" : "");
}

/* Why `v` cannot be an INI value (inih trims white space at both ends and
 * cuts a value at white space followed by ';'), or NULL when it can. */
static const char *ini_value_problem(const char *v) {
    size_t n = strlen(v);
    if (n && isspace((unsigned char)v[0])) return "starts with white space";
    if (n && isspace((unsigned char)v[n - 1])) return "ends with white space";
    for (size_t i = 0; i < n; i++) {
        if (v[i] == '\n' || v[i] == '\r') return "holds a line break";
        if (i && v[i] == ';' && isspace((unsigned char)v[i - 1]))
            return "holds white space followed by ';', which starts an INI comment";
    }
    return NULL;
}

/* Removals first (they act on the file, whatever their place on the command
 * line), then settings in order. */
static pl_status apply_overrides(pl_config *c, int n, const char *const *over,
                                 const char *origin) {
    for (int i = 0; i < n; i++) {
        char sec[128], key[256];
        const char *value;
        pl_status s = pl_override_parse(over[i], sec, sizeof sec, key, sizeof key, &value);
        if (s) return s;
        if (value) continue;
        for (int j = 0; j < i; j++)
            if (strcmp(over[j], over[i]) == 0) {
                pl_hint_set("give each override once");
                return pl_error_set(PL_ERR_CONFIG, "command line: '%s' given twice", over[i]);
            }
        for (int j = 0; *key && j < n; j++) {
            size_t len = strlen(over[i]) - 1;
            if (strncmp(over[j], over[i] + 1, len) == 0 && over[j][len] == '=') {
                pl_hint_set("give one of %s and %s", over[i], over[j]);
                return pl_error_set(PL_ERR_CONFIG,
                                    "command line: %s.%s is both dropped (%s) and set (%s)", sec,
                                    key, over[i], over[j]);
            }
        }
        s = apply_removal(c, over[i], sec, key, section_dropped(n, over, sec));
        if (s) return s;
    }
    for (int i = 0; i < n; i++) {
        char sec[128], key[256];
        const char *value;
        pl_status s = pl_override_parse(over[i], sec, sizeof sec, key, sizeof key, &value);
        if (s) return s;
        if (!value) continue;
        const char *why = ini_value_problem(value);
        if (why) {
            pl_hint_set("quote the whole override for the shell, without spaces around the value "
                        "or before ';'");
            return pl_error_set(PL_ERR_CONFIG,
                                "command line: override '%s.%s': the value %s; an INI file "
                                "cannot hold it (the run's config.ini must read back)",
                                sec, key, why);
        }
        pl_config_section *S = find_section(c, sec);
        if (!S && !(S = add_section(c, sec, 0))) return pl_error_status();
        entry *e = find_entry(S, key);
        if (e && e->origin == PL_FROM_CLI) {
            pl_hint_set("give each override once");
            return pl_error_set(PL_ERR_CONFIG, "command line: override '%s.%s' given twice", sec,
                                key);
        }
        if (e) {
            char *v = xstrdup(value), *o = xstrdup(origin);
            if (!v || !o) {
                free(v);
                free(o);
                return pl_error_status();
            }
            if (strcmp(key, "plugin") == 0 && !S->file_plugin) {
                /* remembered for the error when the file's keys do not fit the new plugin */
                S->file_plugin = e->value;
                S->file_plugin_line = e->line;
            } else {
                free(e->value);
            }
            free(e->origin_str);
            e->value = v;
            e->origin_str = o;
            e->origin = PL_FROM_CLI;
            e->line = 0;
            e->file_default = false;
        } else if (!add_entry(S, key, value, PL_FROM_CLI, origin, 0)) {
            return pl_error_status();
        }
    }
    return PL_OK;
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
    const entry *pe = find_entry(s, "plugin");
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
    char *s = xstrdup(b);
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
        entry *e = find_entry(s, "plugin");
        if (!add_entry(&tmp, e->key, e->value, e->origin, e->origin_str, e->line)) goto nomem;
    }
    for (const pl_option_spec *o = schema; o && o->name; o++) {
        if (strchr(o->name, '*')) {
            for (int i = 0; i < s->n; i++) {
                entry *e = &s->e[i];
                if (find_entry(&tmp, e->key) || find_spec(schema, e->key) != o) continue;
                entry *ne = add_entry(&tmp, e->key, e->value, e->origin, e->origin_str, e->line);
                if (!ne) goto nomem;
                ne->file_default = e->file_default;
            }
            continue;
        }
        entry *e = find_entry(s, o->name);
        if (e) {
            entry *ne = add_entry(&tmp, e->key, e->value, e->origin, e->origin_str, e->line);
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
            entry *ne = add_entry(&tmp, o->name, def, PL_FROM_DEFAULT, "default", 0);
            free(stem);
            if (!ne) goto nomem;
        }
    }
    for (int i = 0; i < s->n; i++) entry_clear(&s->e[i]);
    free(s->e);
    index_drop(&s->ix);
    s->e = tmp.e;
    s->n = tmp.n;
    s->cap = tmp.cap;
    s->ix = tmp.ix; /* indexes tmp.e, now s->e */
    return PL_OK;
nomem:
    st = pl_error_set(PL_ERR_NOMEM, "config: out of memory resolving [%s]", s->name);
fail:
    index_drop(&tmp.ix);
    for (int i = 0; i < tmp.n; i++) entry_clear(&tmp.e[i]);
    free(tmp.e);
    return st;
}

static char *resolve_path(const pl_config *c, const char *p) {
    if (p[0] == '/') return xstrdup(p);
    if (!c->dir || !*c->dir || strcmp(c->dir, ".") == 0) return xstrdup(p);
    return xprintf("%s/%s", c->dir, p);
}

static pl_status resolve_requires(pl_config *c) {
    const pl_config_section *s = find_section(c, "pipeline");
    const entry *e = s ? find_entry(s, "requires") : NULL;
    if (!e || !*e->value) return PL_OK;
    char *copy = xstrdup(e->value), *save = NULL;
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
    entry *e = find_entry(find_section(c, section), key);
    if (!e)
        return pl_error_set(PL_ERR_INVALID, "config: no key %s.%s to resolve", section, key);
    char *v = xstrdup(value);
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
    const pl_config_section *s = find_section(c, "trainer");
    const entry *e = s ? find_entry(s, "init_from") : NULL;
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
        const entry *rd = st || strcmp(s->name, "pipeline") ? NULL : find_entry(s, "run_dir");
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
    entry *pe = find_entry(s, "plugin");
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

static pl_status resolve(pl_config *c, pl_registry *reg) {
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
        if (find_section(c, req[k])) continue;
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
        pl_config_section *s = find_section(c, known[k]);
        if (!s && !pl_core_schema(known[k])) continue;
        if (!s && !(s = add_section(c, known[k], 0))) {
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
        index_drop(&c->ix); /* positions changed: rebuilt at the next lookup */
        c->n = n;
        c->cap = c->n + 8;
        ordered = NULL;
        st = resolve_requires(c);
        if (!st) st = check_refs(c);
    }
    free(ordered);
    return st;
}

/* ====================================================================
 * Loading entry points
 * ==================================================================== */

static pl_config *load_common(const char *text, const char *name, const char *base_dir, int n_over,
                              const char *const *overrides, const char *origin, pl_registry *reg,
                              bool partial) {
    pl_config *c = calloc(1, sizeof *c);
    if (!c) {
        pl_error_set(PL_ERR_NOMEM, "config: out of memory");
        return NULL;
    }
    c->partial = partial;
    c->path = xstrdup(name);
    c->dir = xstrdup(base_dir ? base_dir : ".");
    if (!c->path || !c->dir) goto fail;
    if (parse_text(c, text)) goto fail;
    if (apply_overrides(c, n_over, overrides, origin ? origin : "command line")) goto fail;
    if (resolve(c, reg)) goto fail;
    return c;
fail:
    pl_config_free(c);
    return NULL;
}

pl_config *pl_config_load_string(const char *text, const char *name, const char *base_dir,
                                 int n_over, const char *const *overrides, pl_registry *reg) {
    pl_hint_clear();
    pl_error_clear();
    if (!text || !reg) {
        pl_error_set(PL_ERR_INVALID, "pl_config_load_string: NULL %s", !text ? "text" : "registry");
        return NULL;
    }
    return load_common(text, name ? name : "<string>", base_dir, n_over, overrides, NULL, reg,
                       false);
}

pl_config *pl_config_load_partial(const char *text, const char *name, pl_registry *reg) {
    pl_hint_clear();
    pl_error_clear();
    if (!text || !reg) {
        pl_error_set(PL_ERR_INVALID, "pl_config_load_partial: NULL %s", !text ? "text" : "registry");
        return NULL;
    }
    return load_common(text, name ? name : "<string>", NULL, 0, NULL, NULL, reg, true);
}

pl_config *pl_config_load(const char *path, int n_over, const char *const *overrides,
                          pl_registry *reg) {
    return pl_config_load_as(path, n_over, overrides, NULL, reg);
}

pl_config *pl_config_load_as(const char *path, int n_over, const char *const *overrides,
                             const char *origin, pl_registry *reg) {
    pl_hint_clear();
    pl_error_clear();
    if (!path || !reg) {
        pl_error_set(PL_ERR_INVALID, "pl_config_load: NULL %s", !path ? "path" : "registry");
        return NULL;
    }
    /* a FIFO or a device named as the config is refused, never waited on */
    FILE *f = pl_file_fopen_read(path, "config file");
    if (!f) {
        if (errno) { /* else: not a regular file, the message says which type */
            pl_hint_set("check the path; it is relative to the current directory");
            pl_error_set(PL_ERR_IO, "cannot open config file %s: %s", path, strerror(errno));
        }
        return NULL;
    }
    char *text = NULL;
    size_t len = 0, cap = 0;
    char buf[8192];
    size_t r;
    while ((r = fread(buf, 1, sizeof buf, f)) > 0) {
        if (len + r + 1 > cap) {
            cap = (len + r + 1) * 2;
            char *t = realloc(text, cap);
            if (!t) {
                free(text);
                fclose(f);
                pl_error_set(PL_ERR_NOMEM, "%s: out of memory reading the file", path);
                return NULL;
            }
            text = t;
        }
        memcpy(text + len, buf, r);
        len += r;
    }
    bool err = ferror(f);
    fclose(f);
    if (err) {
        free(text);
        pl_error_set(PL_ERR_IO, "cannot read config file %s", path);
        return NULL;
    }
    if (!text && !(text = calloc(1, 1))) {
        pl_error_set(PL_ERR_NOMEM, "%s: out of memory", path);
        return NULL;
    }
    text[len] = '\0';
    if (memchr(text, '\0', len)) {
        free(text);
        pl_hint_set("a config must be a text INI file");
        pl_error_set(PL_ERR_CONFIG, "%s: not a text file (contains NUL bytes)", path);
        return NULL;
    }
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash == dir)
        dir[1] = '\0';
    else if (slash)
        *slash = '\0';
    else
        snprintf(dir, sizeof dir, ".");
    pl_config *c = load_common(text, path, dir, n_over, overrides, origin, reg, false);
    free(text);
    return c;
}

/* ====================================================================
 * Accessors (pipeline/config.h)
 * ==================================================================== */

const char *pl_cfg_section_name(const pl_config_section *s) { return s ? s->name : NULL; }

const char *pl_cfg_get(const pl_config_section *s, const char *key) {
    const entry *e = find_entry(s, key);
    return e ? e->value : NULL;
}

int64_t pl_cfg_int(const pl_config_section *s, const char *key, int64_t fallback) {
    const char *v = pl_cfg_get(s, key);
    int64_t i;
    double d;
    if (v && parse_int(v, &i)) return i;
    if (v && parse_float(v, &d) && d >= -9.2e18 && d <= 9.2e18) return (int64_t)d;
    return fallback;
}

double pl_cfg_float(const pl_config_section *s, const char *key, double fallback) {
    const char *v = pl_cfg_get(s, key);
    double d;
    return (v && parse_float(v, &d)) ? d : fallback;
}

bool pl_cfg_bool(const pl_config_section *s, const char *key, bool fallback) {
    const char *v = pl_cfg_get(s, key);
    bool b;
    return (v && parse_bool(v, &b)) ? b : fallback;
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
    const entry *e = find_entry(s, key);
    return e && e->origin != PL_FROM_DEFAULT && !e->file_default;
}

const char *pl_cfg_origin(const pl_config_section *s, const char *key) {
    const entry *e = find_entry(s, key);
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
    return (c && name) ? find_section(c, name) : NULL;
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
