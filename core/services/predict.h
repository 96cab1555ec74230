/* predict.h - `pipeline predict RUN_DIR INPUT.h5 OUT.h5`: a finished run's
 * model on new rows (libpipeline_services; predict.c says how the run is
 * rebuilt and what the model writes). */
#ifndef PL_PREDICT_H
#define PL_PREDICT_H

#include "registry.h"

/* `pipeline predict RUN_DIR INPUT.h5 OUT.h5` (predict.c). Strings borrowed. */
typedef struct pl_predict_options {
    const char *run_dir;    /* a directory `pipeline run` wrote (config.ini, checkpoints/) */
    const char *input;      /* the HDF5 file the run's loader reads instead of its data.path */
    const char *output;     /* OUT.h5, written to OUT.h5.tmp.<pid>, then renamed */
    const char *checkpoint; /* "best" (NULL: best, falling back to last), "last" or a path */
    const char *split;      /* "train", "val" or "test" (NULL: test) */
    int argc;               /* overrides applied to the run's config.ini */
    const char *const *argv;
} pl_predict_options;

/* Rebuild the run's loader (reading o->input), model and precision from
 * RUN_DIR/config.ini, load the checkpoint's weights and feed every batch of
 * the split to the model's outputs_batch (eval mode, grad off); its named
 * outputs are written to OUT.h5 (plugin.h, pl_outputs, ABI 2.9). Prints errors (with a
 * hint) to stderr. Returns the CLI exit code: 0 ok, 1 predict failed (I/O,
 * data), 2 usage or configuration error (no run directory, a model without
 * predict). */
int pl_predict_run(pl_registry *reg, const pl_predict_options *o);

#endif
