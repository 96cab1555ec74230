/* config_ini.c - the INI reader (inih's dialect, lines of any length) and the
 * resolved config's output: the printed table, the INI text a run writes
 * (config.ini) and the hash. See config_internal.h for the contract. */
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
    char *copy = cfg_xstrdup(name);
    if (!copy) {
        fail_at(p, p->lineno, PL_ERR_NOMEM, "config: out of memory");
        return;
    }
    free(p->section);
    p->section = copy;
    free(p->prev_name);
    p->prev_name = NULL;
    pl_config_section *sec = cfg_find_section(p->c, name);
    if (sec && sec->line) {
        fail_at(p, p->lineno, PL_ERR_CONFIG, "%s:%d: section [%s] appears twice (first at %s:%d)",
                p->c->path, p->lineno, name, p->c->path, sec->line);
        pl_hint_set("merge the two [%s] sections into one", name);
    } else if (sec) {
        sec->line = p->lineno;
    } else if (!cfg_add_section(p->c, name, p->lineno)) {
        fail_at(p, p->lineno, PL_ERR_NOMEM, "config: out of memory");
    }
}

static void on_key(parse_ctx *p, const char *name, const char *value, bool is_default) {
    int line = p->lineno;
    char *copy = cfg_xstrdup(name);
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
    pl_config_section *sec = cfg_find_section(p->c, section);
    if (!sec && !(sec = cfg_add_section(p->c, section, 0))) {
        fail_at(p, line, PL_ERR_NOMEM, "config: out of memory");
        return;
    }
    entry *old = cfg_find_entry(sec, name);
    if (old) {
        fail_at(p, line, PL_ERR_CONFIG, "%s:%d: duplicate key '%s' in [%s] (first set at %s)",
                p->c->path, line, name, section, old->origin_str);
        pl_hint_set("keep one of %s and %s:%d", old->origin_str, p->c->path, line);
        return;
    }
    char *origin = cfg_xprintf("%s:%d%s", p->c->path, line, is_default ? " (default)" : "");
    entry *e = origin ? cfg_add_entry(sec, name, value, PL_FROM_FILE, origin, line) : NULL;
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

pl_status cfg_parse_text(pl_config *c, const char *text) {
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
