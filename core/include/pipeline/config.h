/* config.h - resolved INI configuration as seen by plugins and the core.
 *
 * The core parses the INI file (inih's dialect, lines of any length), applies command-line overrides
 * (`section.key=value`, Hydra style), validates every key against the owning
 * plugin's option schema (plugin.h) and fills in defaults. A plugin receives
 * its own section, already validated: getters for declared options cannot
 * fail on type or range. Pattern options (schema names containing `*`, e.g.
 * `group.*.lr_scale`) are enumerated with pl_cfg_count/pl_cfg_key_at.
 *
 * Ownership: all strings are owned by the config and live as long as it.
 */
#ifndef PIPELINE_CONFIG_H
#define PIPELINE_CONFIG_H

#include <stdbool.h>
#include <stdint.h>

#include "pipeline/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pl_config pl_config;
typedef struct pl_config_section pl_config_section;

/* Where a resolved value came from. */
typedef enum pl_value_origin { PL_FROM_DEFAULT, PL_FROM_FILE, PL_FROM_CLI } pl_value_origin;

/* Section name ("optimizer"). */
const char *pl_cfg_section_name(const pl_config_section *s);
/* Raw string value of `key` (default applied), or NULL if absent. */
const char *pl_cfg_get(const pl_config_section *s, const char *key);
/* Typed getters. For a key not in the section they return `fallback`. */
int64_t pl_cfg_int(const pl_config_section *s, const char *key, int64_t fallback);
double pl_cfg_float(const pl_config_section *s, const char *key, double fallback);
bool pl_cfg_bool(const pl_config_section *s, const char *key, bool fallback);
const char *pl_cfg_str(const pl_config_section *s, const char *key, const char *fallback);
/* The items of a comma-separated list option (ABI 2.7): `s` split at commas,
 * each item with the spaces and tabs around it trimmed, empty items skipped
 * ("a, b,,c " -> "a", "b", "c"). fn(item, index, ud) is called for each in
 * order with a NUL-terminated copy (index counts the items passed, from 0);
 * the first status other than PL_OK from fn stops the walk and is returned.
 * An item longer than PL_CFG_LIST_ITEM_MAX - 1 bytes is PL_ERR_CONFIG naming
 * `what` (the option, e.g. "[model] lora_targets"), the item's start and the
 * limit: nothing is silently truncated. *n (when n is non-NULL) gets the
 * number of items passed. NULL s: no items. The one tokenizer of the
 * product's comma lists (datasets, lora_targets, timeframe_fields, ...). */
#define PL_CFG_LIST_ITEM_MAX 512
typedef pl_status (*pl_cfg_list_fn)(const char *item, int index, void *ud);
pl_status pl_cfg_list(const char *s, const char *what, pl_cfg_list_fn fn, void *ud, int *n);
/* True if the user set the key (file or command line), false for defaults. */
bool pl_cfg_is_set(const pl_config_section *s, const char *key);
/* "file.ini:12", "command line" or "default" for a key. Static or owned. */
const char *pl_cfg_origin(const pl_config_section *s, const char *key);
/* Iterate over every key of the section (defaults included), in order. */
int pl_cfg_count(const pl_config_section *s);
const char *pl_cfg_key_at(const pl_config_section *s, int i);
const char *pl_cfg_value_at(const pl_config_section *s, int i);

/* Another section of the config that holds `s` (a model's batch_needs
 * reading [data] window), or NULL when that config has no such section or
 * `s` did not come from a loaded config. For checks across stages at
 * `pipeline check` time, when a plugin sees only its own section. Borrowed:
 * lives as long as the config. (ABI 2.5) */
const pl_config_section *pl_cfg_sibling(const pl_config_section *s, const char *name);

/* Whole config access (core and tests). */
const pl_config_section *pl_config_section_get(const pl_config *c, const char *name);

#ifdef __cplusplus
}
#endif
#endif
