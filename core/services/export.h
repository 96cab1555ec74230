/* export.h - `pipeline export`: a finished run's weights written for other
 * tools by the run's own model plugin (libpipeline_services).
 *
 * The core knows no model: it rebuilds the run's stages from
 * RUN_DIR/config.ini exactly as the run built them (tr_build_model: [data]
 * for the dataset facts, [model], [precision] and its setup; on the CPU),
 * loads a checkpoint's weights (tr_load_weights), and hands the model's
 * export_model (plugin.h, ABI 2.4) an empty temporary directory
 * OUT_DIR.tmp.<pid> next to OUT_DIR, renamed to OUT_DIR when the model is
 * done (removed with its contents on any error: nothing partial is left
 * under OUT_DIR). OUT_DIR/pipeline_export.json records where the weights
 * came from (run, checkpoint, model plugin, format, options, version).
 */
#ifndef PL_EXPORT_H
#define PL_EXPORT_H

#include "registry.h"

typedef struct pl_export_request {
    const char *run_dir;    /* a run directory: config.ini, checkpoints/ */
    const char *format;     /* "hf", or another the model writes */
    const char *out_dir;    /* must not exist, or be an empty directory */
    const char *checkpoint; /* NULL or "best" (falls back to last, with a note), "last", a path */
    const char *lora;       /* NULL: the model's default; passed as option "lora=..." */
    const char *dtype;      /* NULL: the model's default; passed as option "dtype=..." */
} pl_export_request;

/* Run the export. Progress lines go to stdout. Errors (thread error set,
 * hint where useful): PL_ERR_CONFIG for what the user must change (RUN_DIR
 * without config.ini, OUT_DIR not empty, a checkpoint missing, a config
 * that no longer loads); PL_ERR_UNSUPPORTED when the model plugin has no
 * export_model (named, with its ABI) or refuses the format or option
 * combination; the model's and the stages' own errors otherwise. */
pl_status pl_export_run(const pl_export_request *r, pl_registry *reg);

#endif
