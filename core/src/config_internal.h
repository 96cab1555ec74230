/* config_internal.h - loading, validating and printing the resolved INI
 * configuration (core only; plugins see pipeline/config.h).
 *
 * Loading: the INI file is parsed in inih's dialect by the core's own line
 * reader (lines of any length; config_ini.c says the rules), every key tagged
 * with its line number; duplicate keys and sections are refused with both lines, then command-line overrides are
 * applied: first the removals (`~section.key`, `~section`: drop what the file
 * sets; dropping what it does not set is an error), then the settings
 * (`section.key=value`, in order). Each stage section's `plugin` is loaded
 * from the registry (kind checked) and every key is validated against the
 * owning schema: the plugin's pl_option_spec list for stage sections, the
 * core's (core_schema.c) for [pipeline] and [trainer]. Defaults fill the rest.
 * When an override swaps a stage's plugin, the file's keys the new plugin
 * does not know are reported together, naming the old plugin and the
 * `~section.key` removals that drop them.
 * Errors: PL_ERR_CONFIG (or PL_ERR_IO / PL_ERR_ABI) with a message starting
 * with "file:line: " where a line is known; a hint for the user is available
 * from pl_hint_get() until the next pl_hint_clear().
 *
 * Ownership: pl_config_load returns a config owned by the caller
 * (pl_config_free). Every string it hands out is owned by the config.
 */
#ifndef PL_CONFIG_INTERNAL_H
#define PL_CONFIG_INTERNAL_H

#include <stdint.h>
#include <stdio.h>

#include "pipeline/pipeline.h"
#include "registry.h"

/* ---- core schema (core_schema.c) ------------------------------------- */

/* Option schema of a core section ("pipeline", "trainer"), NULL otherwise. */
const pl_option_spec *pl_core_schema(const char *section);
/* Kind of plugin a stage section names ("data" -> PL_KIND_LOADER, ...), or
 * -1 for a non-stage section. */
int pl_stage_section_kind(const char *section);
/* True for the [pipeline] keys about where and how a run runs rather than
 * what it trains (device, threads, run_dir, allow_tf32, verbose): a
 * command-line override of one applies to every run of a `requires` chain
 * (core/run/chain.c; docs/ini-reference.md lists them). */
bool pl_pipeline_key_is_runwide(const char *key);
/* The same list, NULL-terminated, in the order the docs give it. */
const char *const *pl_pipeline_runwide_keys(void);
/* Every section name the config accepts, in print order; NULL-terminated. */
const char *const *pl_config_known_sections(void);
/* Stage sections that must be present ("data", "model"); NULL-terminated. */
const char *const *pl_config_required_sections(void);

/* ---- loading --------------------------------------------------------- */

/* pl_config_load, _as, _string and the override parsers are libpipeline_run's
 * (core/run/config_file.c, config_override.c: the command line's and a run's
 * loaders); pl_config_load_partial and pl_config_free are the core's. */

/* Load `path`, apply `n_over` overrides ("section.key=value"), resolve
 * plugins through `reg` and validate. NULL on error (see above). */
pl_config *pl_config_load(const char *path, int n_over, const char *const *overrides,
                          pl_registry *reg);
/* Same, with `origin` (NULL: "command line") as the origin the overrides'
 * values carry in pl_cfg_origin, the printed table and the run's config.ini:
 * a required run's inherited overrides read "command line of configs/teacher.ini". */
pl_config *pl_config_load_as(const char *path, int n_over, const char *const *overrides,
                             const char *origin, pl_registry *reg);
/* Same from an in-memory INI text; `name` stands for the file in origins
 * and messages, and relative `requires` paths resolve against `base_dir`
 * (NULL: current directory). */
pl_config *pl_config_load_string(const char *text, const char *name, const char *base_dir,
                                 int n_over, const char *const *overrides, pl_registry *reg);
/* The same for a config that need not be runnable: the sections present
 * are resolved and validated exactly as above, but [data] and [model] may
 * be missing (the test harness validates one stage section this way). */
pl_config *pl_config_load_partial(const char *text, const char *name, pl_registry *reg);
void pl_config_free(pl_config *c);

/* Split "section.key=value" (section: [A-Za-z0-9_]+; key non-empty, may
 * contain dots; value may be empty: the empty string). A removal
 * "~section.key" gives *value = NULL, "~section" also an empty key. Writes
 * into the caller's buffers. PL_ERR_CONFIG naming the argument on bad
 * syntax. */
pl_status pl_override_parse(const char *arg, char *section, size_t sn, char *key, size_t kn,
                            const char **value);
/* True if `arg` looks like an override: '=' before any '/', or a removal
 * ('~' then a section name, no '/' or '='). */
bool pl_is_override(const char *arg);

/* ---- access ---------------------------------------------------------- */

const char *pl_config_path(const pl_config *c);
int pl_config_section_count(const pl_config *c);
const pl_config_section *pl_config_section_at(const pl_config *c, int i);
/* Descriptor of the plugin a stage section names, NULL if the section is
 * absent or not a stage section. Borrowed from the registry. */
const pl_plugin_desc *pl_config_plugin(const pl_config *c, const char *section);
/* Path of that plugin's .so (borrowed), NULL if none. */
const char *pl_config_plugin_path(const pl_config *c, const char *section);
/* Line of `[section]` in the file (0 if only from the command line/absent). */
int pl_cfg_section_line(const pl_config_section *s);

/* `[pipeline] requires`: the INI files this run needs, resolved relative to
 * the requiring INI's directory. Owned by the config. */
int pl_config_requires_count(const pl_config *c);
const char *pl_config_requires_at(const pl_config *c, int i);

/* A stage reference `@PATH:WHICH` (e.g. init_from = @configs/pretrain.ini:best).
 * Returns 1 and fills the resolved INI path and WHICH ("best"|"last") if
 * `value` is a reference, 0 if it is not, -1 (PL_ERR_CONFIG set) if it starts
 * with '@' but is malformed. PATH resolves like `requires`. */
int pl_config_parse_ref(const pl_config *c, const char *value, char *ini_path, size_t pn,
                        char *which, size_t wn);

/* A run's output file `@PATH:outputs/FILE` (e.g. teacher_outputs =
 * @teacher.ini:outputs/teacher_outputs.h5), in any key of any section.
 * Returns 1 and fills the resolved INI path and "outputs/FILE", 0 if `value`
 * is not such a reference, -1 (PL_ERR_CONFIG set) if malformed (empty FILE,
 * or '..' in it). PATH resolves like `requires`, and must be listed there.
 * The trainer replaces the value by RUN_DIR/NAME/latest/outputs/FILE of that
 * config after the required runs ran (tr_resolve_output_refs). */
int pl_config_parse_output_ref(const pl_config *c, const char *value, char *ini_path, size_t pn,
                               char *rel, size_t rn);
/* Replace the value of an existing key (a resolved reference); the origin
 * stays. PL_ERR_INVALID if the key is absent. */
pl_status pl_config_set_resolved(pl_config *c, const char *section, const char *key,
                                 const char *value);

/* ---- output (libpipeline_run: core/run/config_write.c) ---------------- */

/* Aligned table of every key with its value and origin (`pipeline check`). */
void pl_config_print(const pl_config *c, FILE *f);
/* The resolved config as INI text (origins as comments); malloc'd, caller frees. */
char *pl_config_to_ini(const pl_config *c);
/* Write pl_config_to_ini() to `path` (the run dir's config.ini). */
pl_status pl_config_write_ini(const pl_config *c, const char *path);
/* FNV-1a 64 of the canonical "section.key=value\n" text of every resolved
 * key (origins excluded): equal configs hash equal however they were set. */
uint64_t pl_config_hash(const pl_config *c);

/* Edit distance (Levenshtein), exposed for tests. */
int pl_edit_distance(const char *a, const char *b);
/* The nearest of `cands` (n of them, or NULL-terminated when n < 0; names
 * holding '*' are skipped) to `word`, for "did you mean": the name itself,
 * else a match ignoring case, else the fewest edits (case ignored) within
 * max(2, len/3); NULL when none is that near. Borrowed from `cands`. Used for
 * section, key and choice names (config_validate.c) and plugin names (registry.c). */
const char *pl_suggest_name(const char *word, const char *const *cands, int n);

#endif
