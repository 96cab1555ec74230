/* stage.h - a stage plugin's vtable, checked and read generically (core only).
 *
 * Every kind's vtable starts with create and destroy; each kind has further
 * required members (plugin.h) and optionally a `state` function. The trainer
 * and the test harness read them here, so a plugin missing a required member
 * is refused the same way in a run and in a plugin's own tests.
 */
#ifndef PL_STAGE_H
#define PL_STAGE_H

#include "pipeline/plugin.h"

typedef struct pl_stage_fns {
    pl_status (*create)(const pl_config_section *cfg, pl_run_context *ctx, void **self);
    void (*destroy)(void *self);
    pl_state_fn state; /* NULL: stateless, or a kind without state (loader, model) */
} pl_stage_fns;

/* The functions of stage plugin `d` after checking that its vtable has every
 * member its kind requires. Errors: PL_ERR_ABI naming the plugin, `where`
 * (its file, or "" when unknown), and the first missing member;
 * PL_ERR_INVALID for a kind that is no stage (a backend). */
pl_status pl_stage_fns_of(const pl_plugin_desc *d, const char *where, pl_stage_fns *out);

/* The export_model member of model plugin `d`'s vtable (plugin.h, ABI 2.4),
 * or NULL when the plugin has none: it was built against ABI minor < 4
 * (its vtable ends before the member, which must then not be read at all)
 * or left it NULL. NULL for a NULL `d`, a plugin of another kind or without
 * a vtable. Never sets an error: the caller says what is missing. */
typedef pl_status (*pl_model_export_fn)(void *self, const char *format, const char *dir,
                                        const char *const *options);
pl_model_export_fn pl_model_export_of(const pl_plugin_desc *d);

#endif
