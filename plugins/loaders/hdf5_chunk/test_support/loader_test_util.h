/* loader_test_util.h - open a loader plugin from an INI [data] body in tests. */
#ifndef LOADER_TEST_UTIL_H
#define LOADER_TEST_UTIL_H

#include "pipeline/pipeline.h"

typedef struct lt_loader {
    void *reg;    /* pl_registry */
    void *cfg;    /* pl_config */
    const pl_loader_vtable *vt;
    void *self;
    pl_run_context ctx;
} lt_loader;

/* Load `[data] plugin = PLUGIN` + `body` (key = value lines) with a test-only
 * [model] section, create the loader (seed 42, CPU, run_dir may be NULL).
 * On failure returns the status with the error message set; L is cleaned. */
pl_status lt_open(lt_loader *L, const char *plugin, const char *body, const char *run_dir);
void lt_close(lt_loader *L);
/* Write an HDF5 dataset (creating parent groups) with a native type. */
int lt_write(const char *file, const char *name, long type, int ndim, const long long *dims, const void *data);

#endif
