/* config_impl.h - what the files of the configuration share (core/src only;
 * the contract is config_internal.h, the plugins' view pipeline/config.h).
 *
 * The config is split along its seams:
 *   config.c           the store (sections, entries, their name index), value
 *                      parsing and the accessors (the bottom: calls no other)
 *   config_ini.c       the INI reader (inih's dialect)
 *   config_validate.c  validation against the option schemas and the
 *                      resolution of plugins, `requires` and refs
 *   config_load.c      a config from INI text (the top: runs the others)
 * and, in libpipeline_run (core/run), what only a run and the command line do:
 *   config_file.c      a config from a file, with the command line's overrides
 *   config_override.c  the overrides (`section.key=value`, `~section.key`)
 *   config_write.c     config.ini of a run, the table of `pipeline check`, the hash
 * The functions below are not part of libpipeline_core's ABI: hidden
 * (PL_CFG_HIDDEN), or exported for those three files only (PL_CFG_RUN). */
#ifndef PL_CONFIG_IMPL_H
#define PL_CONFIG_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config_internal.h"

#define PL_CFG_HIDDEN __attribute__((visibility("hidden")))
/* Exported for libpipeline_run's config files (core/run/config_override.c,
 * config_file.c, config_write.c), which reach into the store; not part of
 * the plugins' ABI (no public header declares them). */
#define PL_CFG_RUN __attribute__((visibility("default")))

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

/* ---- the store (config.c) -------------------------------------------- */

/* strdup / vasprintf that set PL_ERR_NOMEM ("config: out of memory") on failure. */
PL_CFG_RUN char *cfg_xstrdup(const char *s);
PL_CFG_RUN char *cfg_xprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Drop a name index (rebuilt at the next lookup): after a removal. */
PL_CFG_RUN void cfg_index_drop(name_index *ix);
/* Free an entry's strings and zero it. */
PL_CFG_RUN void cfg_entry_clear(entry *e);
/* Free a section and everything it owns (NULL-safe). */
PL_CFG_RUN void cfg_section_free(pl_config_section *s);
/* Section `name`, NULL if absent. The index is a cache: lookups on a const
 * config may build it. */
PL_CFG_RUN pl_config_section *cfg_find_section(const pl_config *c, const char *name);
/* Append an empty section (header at `line`, 0 if none); NULL on NOMEM. */
PL_CFG_RUN pl_config_section *cfg_add_section(pl_config *c, const char *name, int line);
/* Entry `key` of `s`, NULL if absent (or s / key NULL). */
PL_CFG_RUN entry *cfg_find_entry(const pl_config_section *s, const char *key);
/* Append an entry; takes ownership of nothing (copies). NULL on NOMEM. */
PL_CFG_RUN entry *cfg_add_entry(pl_config_section *s, const char *key, const char *value,
                                   pl_value_origin origin, const char *origin_str, int line);

/* ---- value parsing (config.c) ----------------------------------------- */

/* A whole decimal int64 / finite double / boolean (true|false|yes|no|on|off|1|0,
 * case ignored); false when `s` is NULL, empty or not entirely that. */
PL_CFG_RUN bool cfg_parse_int(const char *s, int64_t *out);
PL_CFG_RUN bool cfg_parse_float(const char *s, double *out);
/* cfg_parse_float that also says (*range, when given) that the failure was
 * strtod's ERANGE (an overflow or an underflow), for the message. */
PL_CFG_RUN bool cfg_parse_float_r(const char *s, double *out, bool *range);
PL_CFG_RUN bool cfg_parse_bool(const char *s, bool *out);

/* ---- the stages of a load (config_load.c runs them in order) --------- */

/* A new config named `name` (base_dir for relative paths, "." when NULL;
 * partial: no required-sections check) holding INI `text`, not yet
 * resolved (config_load.c); NULL with the error set. */
PL_CFG_RUN pl_config *cfg_load_text(const char *text, const char *name, const char *base_dir,
                                    bool partial);
/* Parse INI `text` into `c` (config_ini.c); errors name "path:line". */
PL_CFG_HIDDEN pl_status cfg_parse_text(pl_config *c, const char *text);
/* Apply the removals, then the settings, of `over` (core/run/config_override.c);
 * `origin` NULL: "command line". */
pl_status cfg_apply_overrides(pl_config *c, int n, const char *const *over,
                                            const char *origin);
/* Load every stage section's plugin through `reg`, validate every key against
 * its schema, fill defaults, resolve `requires` and check references
 * (config_validate.c). */
PL_CFG_RUN pl_status cfg_resolve(pl_config *c, pl_registry *reg);

#endif
