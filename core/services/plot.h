/* plot.h - `pipeline plot`: runs' metrics.csv to an SVG of curves
 * (libpipeline_services, core/services/). */
#ifndef PL_PLOT_H
#define PL_PLOT_H

#include <stddef.h>

#include "pipeline/status.h"

/* Read RUN_DIR/metrics.csv (step,epoch,key,value, docs/run-files.md) of each
 * of the n runs (1..8) and write one SVG: a panel per metric, the splits of
 * a metric together (train_loss, epoch_train_loss, val_loss and test_loss on
 * the panel "loss"; train solid, epoch means thin, validation dashed, test as
 * marked points with their values), value against optimizer step; with n > 1
 * the colour is the run (a legend names the run directories). Written to
 * `out`, else RUN_DIR/plot.svg (n == 1) or the first RUN_DIR/compare.svg,
 * through a temporary name; the path is copied to `written`. Errors name the
 * file (missing, bad header or row, no rows). */
pl_status pl_plot_runs(const char *const *run_dirs, int n, const char *out, char *written,
                       size_t wn);
/* pl_plot_runs of one run. */
pl_status pl_plot_run(const char *run_dir, const char *out, char *written, size_t wn);

#endif
