/* hdf5_rows.h - internals of the hdf5_rows loader shared by its files (not
 * part of the SDK; nothing here is exported from the .so).
 *
 *   hdf5_rows.c     the plugin: options, vtable, create/destroy, epoch checks
 *   rows.c          datasets of each split, history field, chunk order and
 *                   the rows of a batch
 *   teacher_join.c  the teacher outputs joined to the train rows
 *   prefetch.c      chunk buffers, reading a chunk, the prefetch thread
 *
 * Calls go one way: hdf5_rows.c -> rows.c -> teacher_join.c, prefetch.c
 * (and all of them to the loader kit).
 *
 * Threading: only the prefetch thread or the caller's thread touch HDF5 at
 * any time, always under the process-wide pl_h5_lock() (pl_h5.h); tensor
 * headers and reference counts are only touched on the caller's thread.
 */
#ifndef HDF5_ROWS_H
#define HDF5_ROWS_H

#include <hdf5.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "pipeline/pipeline.h"
#include "loader_kit.h"

#define MAXF PL_BATCH_MAX_FIELDS
#define NAME_LEN 256
#define MAX_EXTRA 4 /* resident extra fields per split (history; train: teacher targets) */

typedef struct field {
    char name[64];       /* batch field name */
    char dset[NAME_LEN]; /* dataset path (relative to the split's group, then absolute) */
    pl_dtype dt;         /* tensor dtype */
    hid_t memtype;       /* native HDF5 type matching dt (not to be closed) */
    int ndim;            /* rank of the dataset */
    int64_t dims[PL_MAX_DIMS];
    int64_t row_elems; /* elements per sample */
    size_t row_bytes;
} field;

typedef struct split_data {
    bool present;
    char where[NAME_LEN]; /* "group /val" or "rows 80..90 of /" for messages */
    int nf;
    field f[MAXF];
    hid_t ds[MAXF];
    int64_t row0, nrows; /* rows of the datasets used by this split */
    int64_t batch;       /* batch size of the split */
    bool shuffle, drop_last;
    /* resident extra fields (val/test: padded CSR histories, full [nrows, H]
     * tensors; train: teacher targets, teacher_join.c), gathered per batch
     * into xg when the split is shuffled */
    int nx;
    char xname[MAX_EXTRA][64];
    pl_tensor *xt[MAX_EXTRA];
    pl_tensor *xg[MAX_EXTRA];
} split_data;

typedef struct chunk_buf {
    pl_tensor *t[MAXF];     /* [cap, ...] on the device */
    pl_tensor *stage[MAXF]; /* host staging when the device is not the CPU */
    int split;              /* what it holds: split, chunk index (-1 none) */
    int64_t chunk, rows;
} chunk_buf;

typedef struct loader {
    pl_run_context *ctx;
    pl_device dev;
    char path[1024];
    hid_t file;
    split_data sp[PL_SPLIT_COUNT];
    int64_t cap;   /* rows per chunk */
    bool resident; /* every split fits: one buffer per split, read once */
    int nbuf;
    chunk_buf buf[PL_SPLIT_COUNT];
    /* shuffle gather buffers ([batch, ...] per field, allocated once) */
    pl_tensor *gather[MAXF];
    int64_t *perm;  /* within-chunk row order, cap entries */
    /* rows mode on a device: the current chunk's perm, and its rows within the
     * split (base + perm, for the resident extra fields), as i64 device
     * vectors, copied once per chunk; a shuffled batch is gathered from them
     * by one index_select per field (no per-row copies, no host wait) */
    pl_tensor *perm_dev, *xperm_dev;
    int64_t *xperm; /* host side of xperm_dev */
    int64_t *order; /* chunk order of the epoch */
    int64_t order_cap;
    /* epoch cursor */
    int cur_split;
    int64_t epoch, nchunks, chunk_pos, row_pos, batch_index;
    int cur_buf;
    bool exhausted; /* started at the end of the epoch: next() returns 0 */
    lk_views views; /* the current batch's views */
    /* row_field: the current chunk's rows in the data file in serving order
     * (i64 [cap], uploaded once per chunk; a batch's field is a view) */
    char row_field[64];
    pl_tensor *rows_t, *rows_host;
    int64_t *xidx; /* global rows of a shuffled batch (batch entries) */
    /* prefetch thread (the loader kit's engine; started when prefetch is on) */
    bool prefetch;
    lk_prefetch pf;
    /* stats */
    pl_loader_stats st;
} loader;

/* ---- rows.c ---- */
/* Open the splits' datasets, size the chunks, allocate the buffers, start the prefetch thread. */
pl_status rows_create(loader *L, const pl_config_section *cfg);
pl_status rows_epoch_begin(loader *L, int si, int64_t start);
int rows_next(loader *L, pl_batch *out);
pl_status rows_batch_fields(const pl_config_section *cfg, pl_field_list *out);

/* ---- teacher_join.c ---- */
/* Join the teacher outputs file `teacher_path` (ilora export layout) to the
 * train split: resident extra fields kd_ids, kd_logits (first top_k items;
 * 0: all) and kd_lognorm; meta teacher_temperature, teacher_top_k. */
pl_status rw_teacher_join(loader *L, const char *teacher_path, int64_t top_k);

/* ---- prefetch.c ---- */
/* Allocate buffer b with `rows` rows of split s's fields. */
pl_status chunk_buf_alloc(loader *L, chunk_buf *b, const split_data *s, int64_t rows);
void chunk_buf_free(chunk_buf *b);
/* Read chunk `chunk` of split si into b (any thread; takes pl_h5_lock). */
pl_status chunk_fill(loader *L, chunk_buf *b, int si, int64_t chunk);
pl_status prefetch_start(loader *L);
void prefetch_stop(loader *L);
/* Wait for the in-flight read (if any); returns its status. */
pl_status prefetch_wait(loader *L);
/* Ask the thread to read chunk `chunk` of split si into buffer bi. */
void prefetch_request(loader *L, int bi, int si, int64_t chunk);

#endif
