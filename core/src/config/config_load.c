/* config_load.c - a config from INI text: the store (config.c) filled by the
 * INI reader (config_ini.c), then resolved against the plugins' schemas
 * (config_validate.c). pl_config_load_partial is the whole load of a plugin's
 * test harness; the run's loaders (core/run/config_file.c: a file, the
 * command line's overrides) run cfg_load_text, their overrides, then
 * cfg_resolve. The top of the config layer: nothing in it calls back here. */
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

pl_config *cfg_load_text(const char *text, const char *name, const char *base_dir, bool partial) {
    pl_config *c = calloc(1, sizeof *c);
    if (!c) {
        pl_error_set(PL_ERR_NOMEM, "config: out of memory");
        return NULL;
    }
    c->partial = partial;
    c->path = cfg_xstrdup(name);
    c->dir = cfg_xstrdup(base_dir ? base_dir : ".");
    if (!c->path || !c->dir || cfg_parse_text(c, text)) {
        pl_config_free(c);
        return NULL;
    }
    return c;
}

pl_config *pl_config_load_partial(const char *text, const char *name, pl_registry *reg) {
    pl_hint_clear();
    pl_error_clear();
    if (!text || !reg) {
        pl_error_set(PL_ERR_INVALID, "pl_config_load_partial: NULL %s", !text ? "text" : "registry");
        return NULL;
    }
    pl_config *c = cfg_load_text(text, name ? name : "<string>", NULL, true);
    if (c && cfg_resolve(c, reg)) {
        pl_config_free(c);
        return NULL;
    }
    return c;
}
