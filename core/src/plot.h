/* plot.h - `pipeline plot RUN_DIR`: metrics.csv to an SVG of curves (core only). */
#ifndef PL_PLOT_H
#define PL_PLOT_H

#include "pipeline/status.h"

/* Read RUN_DIR/metrics.csv (step,epoch,key,value) and write RUN_DIR/plot.svg
 * (or `out` when non-NULL): one panel per key (train_loss, lr, val_*...),
 * value against optimizer step. Errors name the file. */
pl_status pl_plot_run(const char *run_dir, const char *out, char *written, size_t n);

#endif
