/* png.h - `pipeline plot` to PNG (CLI only: the core library has no image dependency). */
#ifndef PL_CLI_PNG_H
#define PL_CLI_PNG_H

#include <stdbool.h>
#include <stddef.h>

#include "plot.h"

/* Whether `path` names a PNG (ends in ".png", any case). NULL: false. */
bool pl_png_wanted(const char *path);

/* pl_plot_runs() of the n runs, rendered to the PNG `png_path` at 2 device
 * pixels per SVG pixel (librsvg + cairo), written through a temporary name;
 * the path is copied to `written`. The intermediate SVG is a temporary file
 * next to `png_path`, removed afterwards. Errors: those of pl_plot_runs;
 * PL_ERR_IO naming the file when rendering or writing fails;
 * PL_ERR_UNSUPPORTED when the build has no librsvg. */
pl_status pl_png_plot(const char *const *run_dirs, int n, const char *png_path, char *written,
                      size_t wn);

#endif
