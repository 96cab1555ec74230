/* pl_h5.h - HDF5 helpers shared by the plugins that read or write HDF5
 * (hdf5_rows, hdf5_series, hdf5_graph, hdf5_panel, ilora's history reader and teacher export, the
 * models' prediction files), and
 * THE process-wide HDF5 lock.
 *
 * Built as one shared library, libpipeline_hdf5.so, next to libpipeline_core:
 * the core dlopen()s plugins RTLD_LOCAL, so a `static` lock in each plugin
 * would be one lock per plugin; a shared library is loaded once per process
 * whatever loads it, so pl_h5_lock() is one mutex for every plugin.
 *
 * Locking: every HDF5 call of these plugins runs under pl_h5_lock(). The
 * lock is recursive. Each helper below takes it itself, so a single helper
 * call needs nothing; code that calls the HDF5 API directly, or wants several
 * calls to be one critical section, brackets them with pl_h5_lock() /
 * pl_h5_unlock(). HDF5 error-stack printing is suppressed inside helpers;
 * failures come back as pl_status with pl_error_set() naming the file and
 * the dataset or attribute.
 *
 * Ownership: hid_t handles returned are owned by the caller (close them under
 * the lock: pl_h5_close / H5Dclose); malloc'd buffers are owned by the caller
 * (free); tensors returned are owned by the caller (pl_tensor_release), not by
 * any frame the caller has open.
 */
#ifndef PL_H5_H
#define PL_H5_H

#include <hdf5.h>
#include <stdbool.h>
#include <stdint.h>

#include "pipeline/pipeline.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the lock ----------------------------------------------------------- */
void pl_h5_lock(void);
void pl_h5_unlock(void);

/* ---- files -------------------------------------------------------------- */
/* Open an existing file read-only. Errors (PL_ERR_IO) name `path`: missing or
 * unreadable ("PATH: cannot open (REASON)", plus "; HINT" when hint is not
 * NULL), or refused by HDF5, then told apart from the file's bytes: "PATH: not
 * an HDF5 file: it is empty" / ": no HDF5 superblock signature at byte 0,
 * 512, ..."; "PATH: truncated: N bytes, its superblock says M" (shorter than
 * the end of file address recorded) / "ending inside the superblock"; a
 * superblock version this library does not read or with a corrupt address
 * size; else "its metadata is damaged, or another process holds it open for
 * writing". */
pl_status pl_h5_open_read(const char *path, const char *hint, hid_t *out);
/* Create (truncate) `path` for writing. The file is built in memory (HDF5's
 * core driver, no backing store) and written to `path` by pl_h5_close, so it
 * costs its size in host memory until then, and a full disk fails in that
 * write, never inside HDF5 (1.10's close, when its own flush failed, left a
 * freed file registered and crashed at exit). Write to a temporary name and
 * rename (every caller does). PL_ERR_IO naming `path` when it cannot be
 * created. */
pl_status pl_h5_create(const char *path, hid_t *out);
/* Close a file opened above; an error names `path`. A file from pl_h5_create
 * is written out here (write(2), fsync): a full disk (ENOSPC) or a file size
 * limit (EFBIG) gives PL_ERR_IO "PATH: writing the HDF5 file failed after N
 * of M bytes (REASON)" and leaves `path` empty. The file id is released
 * either way, so the process exits cleanly. */
pl_status pl_h5_close(const char *path, hid_t file);

/* true when link `name` exists under `loc` (every intermediate group is
 * checked, so "/a/b/c" with no "/a" is false, not an HDF5 error). "/" exists. */
bool pl_h5_exists(hid_t loc, const char *name);

/* ---- datasets: metadata ------------------------------------------------- */
typedef struct pl_h5_info {
    int rank;
    int64_t dims[H5S_MAX_RANK];
    int64_t numel;   /* product of dims */
    H5T_class_t cls; /* H5T_INTEGER, H5T_FLOAT, ... */
    size_t size;     /* bytes per element in the file */
    bool is_signed;  /* integers */
} pl_h5_info;

/* Open dataset `name` under `loc`. PL_ERR_IO naming `path` and `name` when it
 * is missing, not a dataset, keeps its data outside the file (a virtual
 * dataset or external raw storage: refused, naming the first other file; see
 * docs/security.md), or uses a filter this HDF5 cannot decode (the filter is
 * named: h5py's lzf, blosc, ...). */
pl_status pl_h5_dataset_open(const char *path, hid_t loc, const char *name, hid_t *out);
/* Shape and file type of an open dataset. numel * max(elem_size, size) must
 * stay below 2^62 (sizes from a file are untrusted): else PL_ERR_SHAPE naming
 * the dataset. PL_ERR_IO when its data is not in the file: a virtual or
 * external layout (as pl_h5_dataset_open), or a declared shape whose data
 * (chunks) was never written. elem_size: the bytes per element the caller will read it as
 * (0: the file's). */
pl_status pl_h5_dataset_info(const char *path, const char *name, hid_t ds, size_t elem_size,
                             pl_h5_info *out);
/* The tensor dtype and native memory type to read a numeric dataset as:
 * floats f32 (f64 stays f64 unless floats_to_f32; f16 and others -> f32),
 * unsigned 1-byte integers u8, integers that fit -> i32, else i64.
 * Non-numeric: PL_ERR_DTYPE naming the dataset. */
pl_status pl_h5_dataset_dtype(const char *path, const char *name, hid_t ds, bool floats_to_f32,
                              pl_dtype *dt, hid_t *memtype);
/* Native HDF5 memory type of a tensor dtype (f32, f64, i32, i64, u8), or
 * H5I_INVALID_HID for the others. */
hid_t pl_h5_memtype(pl_dtype dt);

/* ---- datasets: data ----------------------------------------------------- */
/* Rows [r0, r0 + n) along axis 0 of an open dataset (every other axis whole)
 * into `dst` (host memory, n x row elements of memtype). */
pl_status pl_h5_read_rows(const char *path, const char *name, hid_t ds, hid_t memtype, int64_t r0,
                          int64_t n, void *dst);
/* A whole dataset `name` under `loc` into a new malloc'd buffer (*out; at
 * least one byte). Its rank must lie in [min_rank, max_rank] and axis i have
 * want[i] entries where want != NULL and want[i] >= 0 (else PL_ERR_SHAPE
 * naming both). info (may be NULL) receives its shape. */
pl_status pl_h5_read_alloc(const char *path, hid_t loc, const char *name, hid_t memtype,
                           int min_rank, int max_rank, const int64_t *want, void **out,
                           pl_h5_info *info);
/* A whole dataset as a new CPU tensor of dtype `dt` (converted by HDF5) and
 * the dataset's shape (rank 1..PL_MAX_DIMS). */
pl_status pl_h5_read_tensor(const char *path, hid_t loc, const char *name, pl_dtype dt,
                            pl_tensor **out);

/* ---- checking data ------------------------------------------------------ */
/* Every value of rows [first_row, first_row + rows) of dataset `name`, read
 * into host memory `data` as f32 or f64 (`dt`; other dtypes: PL_OK, nothing
 * to check), must be finite. dims[1..ndim-1] are the dataset's trailing dims
 * (a row holds their product; dims[0] is not read). use_col (NULL: all)
 * marks the elements of a row that are used (series mode: the feature and
 * target columns); col_names (NULL, or n_names names) names columns in the
 * message. One pass, no allocation. On a NaN or Inf: PL_ERR_INVALID naming
 * the file, the dataset, the row and column of the first one, its value, how
 * many there are in these rows, and what to do (missing values are refused:
 * drop or fill them when writing the file). */
pl_status pl_h5_check_finite(const char *path, const char *name, pl_dtype dt, const void *data,
                             int64_t first_row, int64_t rows, int ndim, const int64_t *dims,
                             const bool *use_col, const char (*col_names)[64], int n_names);

/* ---- attributes ---------------------------------------------------------- */
/* Scalar numeric attribute `name` of `obj`: *found = false (and PL_OK) when
 * absent; PL_ERR_IO naming it when present but not readable as a number. */
pl_status pl_h5_attr_read_int(const char *path, hid_t obj, const char *name, int64_t *v,
                              bool *found);
pl_status pl_h5_attr_read_double(const char *path, hid_t obj, const char *name, double *v,
                                 bool *found);
/* The names in string attribute `attr` of object `obj` (a path under `loc`,
 * "/" for the file): a scalar string holding a comma-separated list
 * ("ret_1d,ret_5d"; spaces around names dropped) or a 1-D array of strings
 * (one name each), variable or fixed length. Fills names[0..*n-1]; *n = 0
 * and PL_OK when the attribute is absent. A file's names are untrusted:
 * PL_ERR_IO naming the file, object and attribute when it is not strings,
 * holds more than `maxn` names, or a name is empty or longer than 63 bytes.
 * Takes the lock itself. */
pl_status pl_h5_attr_read_names(const char *path, hid_t loc, const char *obj, const char *attr,
                                char (*names)[64], int maxn, int *n);
pl_status pl_h5_attr_write_int(const char *path, hid_t obj, const char *name, int64_t v);
pl_status pl_h5_attr_write_double(const char *path, hid_t obj, const char *name, double v);
pl_status pl_h5_attr_write_str(const char *path, hid_t obj, const char *name, const char *v);

/* ---- writing row-extendible datasets ------------------------------------ */
/* Create `name` under `loc`: [0] (width 0) or [0, width] rows of file type
 * `type`, chunked, extendible along axis 0 (H5S_UNLIMITED). */
pl_status pl_h5_create_rows(const char *path, hid_t loc, const char *name, hid_t type,
                            int64_t width, hid_t *out);
/* Grow such a dataset to start + n rows and write rows [start, start + n)
 * from `data` (n x max(width, 1) elements of memtype). n == 0: no-op. */
pl_status pl_h5_append_rows(const char *path, hid_t ds, hid_t memtype, int64_t start, int64_t n,
                            int64_t width, const void *data);

/* ---- column names of a series ------------------------------------------ */
/* The column names of the 2-D series dataset `series` (an absolute path in
 * `file`), as tools/csv_to_h5.py writes them: the dataset "/columns" or, when
 * the file has none, the series dataset's attribute "columns"; either a 1-D
 * array of variable-length strings. Fills names[0..n-1] (each cut to 63
 * bytes) and returns n; 0 when neither exists, either is not such an array,
 * or it holds more than `maxn` entries (a file's names are untrusted: the
 * caller then goes by column index). Takes the lock itself. */
int pl_h5_column_names(hid_t file, const char *series, char (*names)[64], int maxn);

/* ---- output files (`pipeline predict`, the run's export) ---------------- */
/* A file of named datasets that grow by rows, one call per batch: the
 * files of a model's outputs (plugin.h pl_outputs, ABI 2.9), which the CLI's
 * predict service and the run write through pl_h5_outputs_* below. Each
 * dataset takes its dtype and trailing dims from the first tensor appended
 * to it; later tensors must match them (PL_ERR_SHAPE naming the dataset). A
 * name with '/' ("train/topk_ids") is a dataset in groups, made as needed. */
#define PL_H5_OUT_MAX PL_OUTPUTS_MAX
typedef struct pl_h5_out_dataset {
    char name[PL_OUTPUTS_NAME_MAX];
    hid_t ds;
    pl_dtype dt;
    int rank;
    int64_t dims[PL_MAX_DIMS]; /* dims[0]: rows written so far */
} pl_h5_out_dataset;
typedef struct pl_h5_out {
    char path[1024];
    char final[1024]; /* pl_h5_outputs_*: the name `path` is renamed to on commit */
    hid_t file; /* H5I_INVALID_HID when closed */
    int n;
    pl_h5_out_dataset d[PL_H5_OUT_MAX];
} pl_h5_out;
/* Create (truncate) `path` and write every entry of `attrs` (may be NULL;
 * borrowed) as a root attribute: strings as strings, numbers as int64 or
 * double. On error nothing stays open. */
pl_status pl_h5_out_open(pl_h5_out *o, const char *path, const pl_meta *attrs);
/* Append the rows of `t` (axis 0; any device, dtype f32, f64, i32, i64 or
 * u8, any strides: copied to host as needed) to dataset `name`, created on
 * first use as [0, t's trailing dims...] extendible along axis 0. */
pl_status pl_h5_out_append(pl_h5_out *o, const char *name, const pl_tensor *t);
/* Rows written to `name` so far (-1: no such dataset). */
int64_t pl_h5_out_rows(const pl_h5_out *o, const char *name);
/* Close every dataset and the file; the error names the file. */
pl_status pl_h5_out_close(pl_h5_out *o);
/* Close without reporting (after an error, or from a model's destroy); a
 * no-op when closed. The caller removes the file. */
void pl_h5_out_abort(pl_h5_out *o);
/* The life of a model's predictions file (`pipeline predict`, predict_begin
 * / predict_end / destroy), on a heap pl_h5_out the model keeps:
 * pl_h5_out_new allocates and opens it (*out NULL on error, nothing left
 * open: PL_ERR_NOMEM, or pl_h5_out_open's error); pl_h5_out_finish closes
 * and frees *o and sets it NULL (PL_ERR_INVALID naming `who` when *o is NULL:
 * predict_end without predict_begin; else pl_h5_out_close's error);
 * pl_h5_out_free aborts and frees (NULL-safe; a model destroyed mid-predict:
 * the core removes the file). */
pl_status pl_h5_out_new(const char *path, const pl_meta *attrs, pl_h5_out **out);
pl_status pl_h5_out_finish(pl_h5_out **o, const char *who);
void pl_h5_out_free(pl_h5_out **o);

/* A model's outputs (plugin.h pl_outputs) into the file `final_path`, as
 * the CLI's predict service and the run's export phase write them:
 * pl_h5_outputs_open creates final_path.tmp.<pid> (so a failed write never
 * leaves a partial file under the final name), writes decl->attrs (may be
 * NULL) as root attributes and appends decl's tensors (0-row tensors: the
 * datasets a model declares in outputs_begin); *out NULL on error with the
 * temporary file removed. pl_h5_outputs_write appends every tensor of `out`
 * to the dataset of its name (errors as pl_h5_out_append's, naming the
 * file and dataset). pl_h5_outputs_commit closes the file and renames it to
 * final_path, frees *o and sets it NULL; on an error (closing, renaming) it
 * removes the temporary file. pl_h5_outputs_abandon closes without
 * reporting (the thread's error, the one that stopped the write, is kept),
 * removes the temporary file, frees (NULL-safe). */
pl_status pl_h5_outputs_open(const char *final_path, const pl_outputs *decl, pl_h5_out **out);
pl_status pl_h5_outputs_write(pl_h5_out *o, const pl_outputs *out);
pl_status pl_h5_outputs_commit(pl_h5_out **o);
void pl_h5_outputs_abandon(pl_h5_out **o);

#ifdef __cplusplus
}
#endif
#endif
