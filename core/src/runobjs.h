/* runobjs.h - constructors of the run objects plugins receive (core only).
 *
 * pl_params and pl_meta are opaque to plugins (plugin.h declares their
 * accessors); the core creates and frees them here.
 * Ownership: pl_params_new()/pl_meta_new() return objects owned by the caller,
 * freed with pl_params_free()/pl_meta_free() (NULL-safe). pl_params holds one
 * reference on each of its tensors, released by pl_params_free().
 */
#ifndef PL_RUNOBJS_H
#define PL_RUNOBJS_H

#include "pipeline/plugin.h"

pl_params *pl_params_new(void);
void pl_params_free(pl_params *ps);
pl_meta *pl_meta_new(void);
void pl_meta_free(pl_meta *m);
/* Number of entries and i-th key (for logging/summary). */
int pl_meta_count(const pl_meta *m);
const char *pl_meta_key_at(const pl_meta *m, int i);

#endif
