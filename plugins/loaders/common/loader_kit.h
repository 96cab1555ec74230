/* loader_kit.h - what the HDF5 loader plugins share (hdf5_rows, hdf5_series,
 * hdf5_graph, hdf5_panel and the deprecated hdf5_chunk alias), on top of
 * pl_h5 (plugins/common/hdf5/pl_h5.h). Internal to the loaders: a static
 * library linked into each plugin, built with hidden visibility, so nothing
 * here is exported from any .so.
 *
 *   tensors    tensors owned by the loader even inside a caller's pl_frame;
 *              host arrays to the device; pinned host staging
 *   batches    the views a batch hands out (released at the next next());
 *              a shuffled batch gathered by one index_select per field
 *   order      the splitmix64 stream and Fisher-Yates shuffle every loader's
 *              batch order comes from (plugin.h loader contract: a pure
 *              function of seed and epoch)
 *   splits     split fractions, batch counts, the epoch_begin range check,
 *              `pipeline predict`'s split (meta predict_split)
 *   metadata   meta numbers, the file's root attributes as meta, dates
 *   prefetch   the background thread that fills the next buffer (lk_prefetch.c)
 *
 * Errors name the plugin (`plugin` arguments), the file and the split.
 */
#ifndef PL_LOADER_KIT_H
#define PL_LOADER_KIT_H

#include <hdf5.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "pipeline/pipeline.h"
#include "pl_h5.h"

/* ---- tensors ------------------------------------------------------------ */

/* A new tensor (uninitialized) owned by the caller even inside a caller's
 * pl_frame; NULL with the error set. */
pl_tensor *lk_new_tensor(pl_dtype dt, int ndim, const int64_t *shape, pl_device dev);
/* Rows [start, start + len) of t as a view owned by the caller. */
pl_tensor *lk_view_rows(pl_tensor *t, int64_t start, int64_t len);
/* pl_tensor_as_strided of t, owned by the caller. */
pl_tensor *lk_as_strided(pl_tensor *t, int ndim, const int64_t *shape, const int64_t *stride,
                         int64_t off);
/* A new tensor on dev holding a copy of the host array `host` (numel of
 * shape elements of dt); NULL with the error set. */
pl_tensor *lk_to_device(pl_device dev, pl_dtype dt, int nd, const int64_t *shape, const void *host);
/* Host staging for data bound to dev: pinned memory from dev's backend when
 * it has it (so the copy to the device can run asynchronously), else
 * ordinary host memory. Owned by the caller. */
pl_tensor *lk_stage_tensor(pl_device dev, pl_dtype dt, int ndim, const int64_t *shape);
/* Dataset `name` of open file f read whole as `memtype` into a new malloc'd
 * *out (pl_h5_read_alloc: rank in [min_rank, max_rank], axis i == want[i]
 * where want[i] >= 0; errors name `path` and the dataset); dims receives the
 * shape, *rank (may be NULL) the rank; the bytes read are added to
 * *bytes_read (may be NULL). */
pl_status lk_read_ds(const char *path, hid_t f, const char *name, hid_t memtype, int min_rank,
                     int max_rank, const int64_t *want, void **out, int64_t *dims, int *rank,
                     uint64_t *bytes_read);

/* ---- batches ------------------------------------------------------------ */

#define LK_MAX_VIEWS (PL_BATCH_MAX_FIELDS + 8)

/* The views the current batch hands out (owned until lk_views_release). */
typedef struct lk_views {
    pl_tensor *v[LK_MAX_VIEWS];
    int n;
} lk_views;

/* Add view `v` (owned by `views` until lk_views_release) to batch `out` as
 * `name`; -1 (nothing added) when v is NULL or the batch is full. */
int lk_emit(lk_views *views, pl_batch *out, const char *name, pl_tensor *v);
void lk_views_release(lk_views *views);

/* dst[0..n) = src[idx[i]] along axis 0 (rows of row_bytes bytes; dst and
 * src on dev, rank >= 1, same row shape): on the CPU by memcpy; on a device
 * by ONE launch of the backend's index_select kernel, with `idx_dev` (i64,
 * on dev) holding the same indices from position `off`: no per-row copy, no
 * host wait. PL_ERR_UNSUPPORTED naming `plugin` and the backend when it has
 * no index_select kernel. */
pl_status lk_gather_rows(const char *plugin, pl_device dev, pl_tensor *dst, pl_tensor *src,
                         const int64_t *idx, pl_tensor *idx_dev, int64_t off, int64_t n,
                         size_t row_bytes);

/* ---- order -------------------------------------------------------------- */

/* The next value of the splitmix64 stream *s (S. Vigna's splitmix64). */
uint64_t lk_rng_next(uint64_t *s);
/* Fisher-Yates shuffle of a[0..n) drawing from the splitmix64 stream *s
 * (reproducible per seed: the loaders' batch orders come from it). */
void lk_shuffle(int64_t *a, int64_t n, uint64_t *s);
/* order = ids[0..n) shuffled by lk_shuffle seeded `seed`. */
void lk_shuffle_order(int64_t *order, const int64_t *ids, int64_t n, uint64_t seed);

/* ---- splits ------------------------------------------------------------- */

/* "0.8,0.1,0.1" -> fr (train > 0, val, test >= 0, sum <= 1); else
 * PL_ERR_CONFIG naming `plugin` and the value. */
pl_status lk_parse_fractions(const char *plugin, const char *s, double fr[3]);
/* Batches of a split of n samples: ceil(n / batch), floor with drop_last. */
int64_t lk_batches(int64_t n, int64_t batch, bool drop_last);
/* The epoch_begin contract's range check: start_batch in 0..nb, else
 * PL_ERR_INVALID naming plugin, split, epoch, value, batch count and `where`
 * (the split's source, for the message). */
pl_status lk_check_start(const char *plugin, pl_data_split split, int64_t epoch, int64_t start,
                         int64_t nb, const char *where);
/* `pipeline predict` (meta "predict_split", plugin.h ABI 2.4): the split it
 * reads, or -1 in a training run (or without a context). */
int lk_predict_split(const pl_run_context *ctx);

/* ---- prefetch (lk_prefetch.c) ------------------------------------------- */

/* Fill buffer `buf` with chunk `chunk` of split `split` (the loader's
 * reader; runs on the prefetch thread, so it may touch HDF5 only under
 * pl_h5_lock and no tensor reference counts). */
typedef pl_status (*lk_fill_fn)(void *user, int buf, int split, int64_t chunk);

/* One background thread serving one fill request at a time. */
typedef struct lk_prefetch {
    lk_fill_fn fill;
    void *user;
    pthread_t th;
    bool started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool pending, busy, quit; /* under mu */
    int buf, split;
    int64_t chunk;
    pl_status status; /* the last fill's, until lk_prefetch_wait reports it */
    char err[1024];
} lk_prefetch;

/* Ready to start (no thread yet); lk_prefetch_free undoes it. */
void lk_prefetch_init(lk_prefetch *p, lk_fill_fn fill, void *user);
/* Start the thread; PL_ERR_INTERNAL naming `plugin` when it cannot. */
pl_status lk_prefetch_start(lk_prefetch *p, const char *plugin);
bool lk_prefetch_running(const lk_prefetch *p);
/* Ask the thread to fill(buf, split, chunk) (a no-op when not running). */
void lk_prefetch_request(lk_prefetch *p, int buf, int split, int64_t chunk);
/* Wait for the request in flight (if any); returns its status with its
 * error message; the wait is added to *wait_seconds (may be NULL). */
pl_status lk_prefetch_wait(lk_prefetch *p, double *wait_seconds);
/* Stop and join the thread, release the mutex / condition. */
void lk_prefetch_free(lk_prefetch *p);

/* ---- deprecated aliases ------------------------------------------------ */

/* out = the options of lists[0], then those of lists[1].. whose names are
 * not in out yet (a deprecated plugin that dispatches to several accepts
 * the union of their options), PL_OPTIONS_END-terminated; at most cap - 1
 * entries (the rest are dropped: cap is sized at compile time). */
void lk_merge_options(pl_option_spec *out, int cap, const pl_option_spec *const *lists, int nlists);
/* The deprecation line of an alias (pl_message, once per process and
 * alias): "PLUGIN[ with KEY = VALUE] is deprecated: use plugin = NEW ...". */
void lk_deprecated(const char *old, const char *what, const char *new_name);

/* ---- metadata ----------------------------------------------------------- */

/* name under group ("/train" + "x" -> "/train/x"; absolute names stay). */
void lk_join_path(char *out, size_t n, const char *group, const char *name);
/* ctx->meta setters; no-ops without a context or meta. */
void lk_meta_int(pl_run_context *ctx, const char *k, int64_t v);
void lk_meta_float(pl_run_context *ctx, const char *k, double v);
/* Every scalar numeric root attribute of open file `file` (at `path`)
 * becomes meta (num_items, ...); takes the HDF5 lock. */
void lk_publish_file_attrs(pl_run_context *ctx, const char *path, hid_t file);
/* Days since 1970-01-01 of y-m-d, proleptic Gregorian (H. Hinnant's
 * days_from_civil). */
int64_t lk_days_from_civil(int64_t y, int m, int d);
/* Its inverse, for messages: "YYYY-MM-DD", or "day N" outside +-1e8 days. */
void lk_format_day(int64_t day, char *out, size_t n);
/* Monotonic seconds (loader stats). */
double lk_now(void);

#endif
