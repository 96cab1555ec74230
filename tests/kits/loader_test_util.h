/* loader_test_util.h - open a loader plugin from an INI [data] body in tests
 * (over the public harness, pipeline/testing.h). */
#ifndef LOADER_TEST_UTIL_H
#define LOADER_TEST_UTIL_H

#include "pipeline/pipeline.h"
#include "pipeline/testing.h"

typedef struct lt_loader {
    pl_harness *h;               /* owns the section and the run context */
    const pl_config_section *sec; /* the resolved [data] section */
    const pl_loader_vtable *vt;
    void *self;
    pl_run_context *ctx;         /* borrowed from h */
} lt_loader;

/* Validate `[data] plugin = PLUGIN` + `body` (key = value lines) as a config
 * would, create the loader (seed 42, CPU, run_dir may be NULL). On failure
 * returns the status with the error message set; L is cleaned. */
pl_status lt_open(lt_loader *L, const char *plugin, const char *body, const char *run_dir);
/* The same on device `dev` (ctx->device; its backend must be loaded). */
pl_status lt_open_on(lt_loader *L, const char *plugin, const char *body, const char *run_dir,
                     pl_device dev);
void lt_close(lt_loader *L);
/* A batch copied to host memory (every field contiguous), to compare epochs
 * bit for bit after the loader moved on. */
typedef struct lt_batch_copy {
    int64_t size, index;
    int n;
    char name[PL_BATCH_MAX_FIELDS][48];
    pl_dtype dt[PL_BATCH_MAX_FIELDS];
    int ndim[PL_BATCH_MAX_FIELDS];
    int64_t shape[PL_BATCH_MAX_FIELDS][PL_MAX_DIMS];
    size_t nbytes[PL_BATCH_MAX_FIELDS];
    void *data[PL_BATCH_MAX_FIELDS];
} lt_batch_copy;
typedef struct lt_epoch {
    int nb;
    lt_batch_copy *b;
} lt_epoch;
/* Copy every remaining batch of the current epoch (next() until 0). 0 on
 * success, -1 when next() failed (pl_error_message() says why). */
int lt_read_epoch(lt_loader *L, lt_epoch *e);
void lt_epoch_free(lt_epoch *e);
/* NULL when `rest` is exactly batches k.. of `full`: same count, sizes,
 * fields (names, dtypes, shapes) and bytes, indices k, k+1, ...; else a
 * message (in buf) naming the first difference. */
const char *lt_epoch_tail_diff(const lt_epoch *full, int k, const lt_epoch *rest, char *buf, size_t n);
/* NULL when batch b of `split` agrees with the loader's declared fields
 * (pl_harness_check_batch: every field of b declared for that split with b's
 * dtype and rank, every required declared field present); else the message
 * (in buf). *used (may be NULL) gets bit i set for each field i of `fl` (the
 * loader's batch_fields) that b carries. */
const char *lt_fields_diff(lt_loader *L, const pl_field_list *fl, pl_data_split split,
                           const pl_batch *b, unsigned *used, char *buf, size_t n);
/* The device the loaders' device tests run on: the strict backend (GPU-like
 * memory the host cannot touch), or the backend PL_TEST_DEVICE_BACKEND names
 * (cuda: the same comparisons on a real GPU), loaded into the accelerator
 * slot. *dev = {PL_DEVICE_CUDA, 0}. */
pl_status lt_test_device(pl_device *dev);
/* Open `plugin` with `body` on the CPU and on `dev`, read `epochs` training
 * epochs (0, 1, ...) from both and compare them batch for batch, byte for
 * byte (lt_epoch_tail_diff). NULL when they agree, with *batches the device
 * loader's batch count and *fields its first batch's field count in the last
 * epoch; else why (into buf: an open or read failure, or the first
 * difference, naming the epoch). */
const char *lt_device_equals_cpu(const char *plugin, const char *body, pl_device dev, int epochs,
                                 int *batches, int *fields, char *buf, size_t n);
/* Write an HDF5 dataset (creating parent groups) with a native type. */
int lt_write(const char *file, const char *name, long type, int ndim, const long long *dims, const void *data);

#endif
