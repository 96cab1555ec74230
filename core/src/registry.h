/* registry.h - finds, loads and checks stage plugins (core only).
 *
 * Search order (first listed first): every dir given to pl_registry_add_dir()
 * in call order (the CLI adds --plugin-path DIRs), then
 * pl_registry_add_default_dirs() appends PIPELINE_PLUGIN_PATH (colon
 * separated), then EITHER the build-tree plugin dir (PL_BUILD_PLUGIN_DIR),
 * when the running executable or this libpipeline_core lives in that build
 * tree, OR the install dirs (PL_INSTALL_PLUGIN_DIR, <exe dir>/../lib/
 * pipeline/plugins and <this library's dir>/pipeline/plugins: a program
 * built against an SDK installed under any prefix finds the plugins
 * installed with it, the cpu backend first of all), so an installed binary
 * never sees the build tree's copies as duplicates. A directory listed
 * twice is searched once (install dirs by their real path).
 *
 * A plugin NAME lives in `<dir>/NAME.so`. Loading refuses (PL_ERR_ABI /
 * PL_ERR_CONFIG, message naming the file) a wrong ABI major, a newer ABI
 * minor, a missing entry symbol, a descriptor whose name differs from the
 * file name, a kind other than the one expected, and the same name provided
 * by two different files in the search path.
 *
 * Ownership: the registry owns the dlopen handles; they stay open for the
 * process lifetime (pl_registry_free frees bookkeeping only, never dlclose, so
 * vtables and option tables stay valid). Descriptors are borrowed.
 */
#ifndef PL_REGISTRY_H
#define PL_REGISTRY_H

#include <stdbool.h>

#include "pipeline/plugin.h"

typedef struct pl_registry pl_registry;

/* One plugin entry as listed by pl_registry_list. */
typedef struct pl_plugin_info {
    const char *name;           /* file stem */
    const char *path;           /* full path of the .so */
    const pl_plugin_desc *desc; /* NULL when it failed to load */
    const char *error;          /* load error message, NULL when desc != NULL */
} pl_plugin_info;

pl_registry *pl_registry_new(void);
void pl_registry_free(pl_registry *r);

/* Append a search dir. A dir that does not exist is kept (it may be created
 * later) but never errors. */
pl_status pl_registry_add_dir(pl_registry *r, const char *dir);
/* Append PIPELINE_PLUGIN_PATH, the build dir, the install dirs. */
pl_status pl_registry_add_default_dirs(pl_registry *r);
int pl_registry_dir_count(const pl_registry *r);
const char *pl_registry_dir_at(const pl_registry *r, int i);

/* A valid plugin name: [A-Za-z0-9_-]+, at most 63 characters. */
bool pl_plugin_name_valid(const char *name);

/* Load plugin `name` expecting `kind` (PL_KIND_COUNT: any kind). On success
 * *desc is set and PL_OK returned; on failure the status is returned and
 * *err (if non-NULL) points to the thread's error message. The INI section
 * naming the plugin is used in the kind-mismatch message when `section` is
 * non-NULL. */
pl_status pl_registry_find(pl_registry *r, const char *name, pl_plugin_kind kind,
                           const pl_plugin_desc **desc, const char **err);
/* Same, with the INI section (and origin, e.g. "teacher.ini:12") named in
 * messages. */
pl_status pl_registry_find_for(pl_registry *r, const char *name, pl_plugin_kind kind,
                               const char *section, const char *origin,
                               const pl_plugin_desc **desc);

/* Path of the .so that provided `name` (after a successful find), or NULL. */
const char *pl_registry_path_of(const pl_registry *r, const char *name);

/* Scan every search dir for *.so and try to load each (sorted by name, then
 * search order). Entries are owned by the registry and valid until free or
 * the next list call. Returns the count (or -1 on allocation failure). */
int pl_registry_list(pl_registry *r, const pl_plugin_info **out);

#endif
