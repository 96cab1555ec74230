/* config_file.c - the run's config loaders (config_internal.h): a config
 * from a file or a string, with the command line's overrides
 * (config_override.c) applied between the INI reader and the resolution
 * (the core's cfg_load_text and cfg_resolve). */
#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config_impl.h"

/* ====================================================================
 * Loading entry points
 * ==================================================================== */

/* INI text, then the overrides, then the resolution; a runnable config (not
 * partial: [data] and [model] required). */
static pl_config *load_common(const char *text, const char *name, const char *base_dir, int n_over,
                              const char *const *overrides, const char *origin, pl_registry *reg) {
    pl_config *c = cfg_load_text(text, name, base_dir, false);
    if (!c) return NULL;
    if (cfg_apply_overrides(c, n_over, overrides, origin ? origin : "command line")) goto fail;
    if (cfg_resolve(c, reg)) goto fail;
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
    return load_common(text, name ? name : "<string>", base_dir, n_over, overrides, NULL, reg);
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
    pl_config *c = load_common(text, path, dir, n_over, overrides, origin, reg);
    free(text);
    return c;
}
