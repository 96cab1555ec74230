/* hdf5_chunk.h - internals of the hdf5_chunk loader shared by its files
 * (not part of the SDK; nothing here is exported from the .so).
 *
 *   hdf5_chunk.c  plugin entry: options, create/destroy, epoch_begin/next
 *                 dispatch, batch_fields, small helpers used by both modes
 *   rows.c        rows mode: datasets of each split, history field, chunk
 *                 order and the rows of a batch
 *   series.c      series mode: one [T, F] series cut into windows
 *   prefetch.c    chunk buffers, reading a chunk, the prefetch thread
 *
 * Threading: only the prefetch thread or the caller's thread touch HDF5 at
 * any time, always under the process-wide pl_h5_lock() (pl_h5.h); tensor
 * headers and reference counts are only touched on the caller's thread.
 */
#ifndef HDF5_CHUNK_H
#define HDF5_CHUNK_H

#include <hdf5.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "pipeline/pipeline.h"
#include "loader_kit.h"

#define MAXF PL_BATCH_MAX_FIELDS
#define NAME_LEN 256
#define MAX_EXTRA 4 /* resident extra fields per split (history; train: teacher targets) */

#define H5C_MAX_TF 8 /* timeframes of a multi-timeframe series */

/* Series mode's timeframes (options timeframes / windows): timeframe i has
 * windows of w[i] rows of trailing k[i]-bar aggregates; n = 1, k = {1},
 * w = {window} for a plain series. */
typedef struct h5c_timeframes {
    int n;
    int64_t k[H5C_MAX_TF], w[H5C_MAX_TF];
} h5c_timeframes;

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
    /* series mode: windows [w0, w1) */
    int64_t w0, w1;
    char span[72]; /* split by date: "2001-01-22..2013-12-31", its windows' last targets; else "" */
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
    bool series_mode;
    split_data sp[PL_SPLIT_COUNT];
    int64_t cap;   /* rows per chunk */
    bool resident; /* every split fits: one buffer per split, read once */
    int nbuf;
    chunk_buf buf[PL_SPLIT_COUNT];
    /* shuffle gather buffers ([batch, ...] per field, allocated once) */
    pl_tensor *gather[MAXF];
    int64_t *perm;  /* within-chunk row order (series: window order), cap entries */
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
    pl_tensor *out_views[MAXF + MAX_EXTRA + 1];
    /* row_field: the batch's rows in the data file (i64 [batch]), one buffer */
    char row_field[64];
    pl_tensor *rows_t, *rows_host;
    int64_t *xidx; /* global rows of a shuffled batch (batch entries) */
    int n_out;
    /* prefetch thread */
    bool prefetch;
    pthread_t th;
    bool th_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool req_pending, busy, quit;
    int req_buf, req_split;
    int64_t req_chunk;
    pl_status req_status;
    char req_err[1024];
    /* stats */
    pl_loader_stats st;
    /* series mode */
    pl_tensor *feat, *targ, *wx_g, *wy_g; /* [T,Ff], [T,Ft], gather buffers */
    int64_t T, Ff, Ft, window, horizon;
    /* multi-timeframe: tf.k/w, per timeframe its [T, Ff] matrix (tfm[i] is
     * feat, retained, when k = 1) and gather buffer [batch, w, Ff] (tfg[0]
     * is wx_g's role for i = 0); a window's last input row is w + lookback - 1 */
    h5c_timeframes tf;
    int64_t lookback;
    pl_tensor *tfm[H5C_MAX_TF], *tfg[H5C_MAX_TF];
    char tfname[H5C_MAX_TF][24]; /* batch field names: "x", "x_tf<k>" */
} loader;

/* ---- hdf5_chunk.c: helpers for both modes (loader_kit.h has the rest) ---- */
/* Publish field f of a batch (the view is released at the next next()). */
int h5c_emit(loader *L, pl_batch *out, const char *name, pl_tensor *v);
int64_t h5c_split_batches(const loader *L, int si);

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
pl_status h5c_teacher_join(loader *L, const char *teacher_path, int64_t top_k);

/* ---- series.c ---- */
/* Whether cfg selects series mode: window > 0 or timeframes given. */
bool h5c_series_mode(const pl_config_section *cfg);
/* The timeframes of cfg (options timeframes, windows; window): refused with
 * PL_ERR_CONFIG when the lists differ in length, hold a value < 1, more than
 * H5C_MAX_TF entries, bar counts not strictly increasing, or window is set
 * and differs from the first of windows. No timeframes: n = 1, {1}, {window}. */
pl_status h5c_parse_timeframes(const pl_config_section *cfg, h5c_timeframes *tf);
/* Batch field of timeframe i: "x" for i = 0, else "x_tf<k>" (n >= 24 bytes). */
void h5c_timeframe_field(const h5c_timeframes *tf, int i, char *out, size_t n);
pl_status series_create(loader *L, const pl_config_section *cfg);
pl_status series_epoch_begin(loader *L, int si, int64_t start);
int series_next(loader *L, pl_batch *out);
pl_status series_batch_fields(const pl_config_section *cfg, pl_field_list *out);

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
