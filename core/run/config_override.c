/* config_override.c - command-line overrides: `section.key=value` settings and
 * `~section.key` / `~section` removals, applied after the file is read.
 * See config_internal.h for the contract. */
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
        cfg_section_free(S);
        memmove(&c->s[si], &c->s[si + 1], (size_t)(c->n - si - 1) * sizeof *c->s);
        c->n--;
        cfg_index_drop(&c->ix); /* positions moved: rebuilt at the next lookup */
        return PL_OK;
    }
    for (int i = 0; i < S->n; i++) {
        if (strcmp(S->e[i].key, key) != 0) continue;
        cfg_entry_clear(&S->e[i]);
        memmove(&S->e[i], &S->e[i + 1], (size_t)(S->n - i - 1) * sizeof *S->e);
        S->n--;
        cfg_index_drop(&S->ix);
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
pl_status cfg_apply_overrides(pl_config *c, int n, const char *const *over,
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
        pl_config_section *S = cfg_find_section(c, sec);
        if (!S && !(S = cfg_add_section(c, sec, 0))) return pl_error_status();
        entry *e = cfg_find_entry(S, key);
        if (e && e->origin == PL_FROM_CLI) {
            pl_hint_set("give each override once");
            return pl_error_set(PL_ERR_CONFIG, "command line: override '%s.%s' given twice", sec,
                                key);
        }
        if (e) {
            char *v = cfg_xstrdup(value), *o = cfg_xstrdup(origin);
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
        } else if (!cfg_add_entry(S, key, value, PL_FROM_CLI, origin, 0)) {
            return pl_error_status();
        }
    }
    return PL_OK;
}
