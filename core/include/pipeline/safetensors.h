/* safetensors.h - read and write safetensors files (checkpoints, weights).
 *
 * Format (https://huggingface.co/docs/safetensors): 8-byte little-endian
 * header length N, N bytes of UTF-8 JSON {"name": {"dtype": "F32", "shape":
 * [..], "data_offsets": [begin, end]}, ..., "__metadata__": {str: str}},
 * then the raw little-endian tensor bytes. The JSON is read and written with
 * cJSON. Every offset and length is bounds-checked against the file size
 * before use; overlapping or out-of-range tensors are refused with the tensor
 * name and the numbers found.
 *
 * dtype mapping: F32, BF16, F16, F64, I32, I64, U8 <-> pl_dtype; nf4 tensors
 * are stored as U8 packed codes under the caller's names (quantization state
 * in sibling tensors, see plugins/precision/qlora4).
 *
 * Library: these functions are defined in libpipeline_io (core/io), not in
 * libpipeline_core: link it (`pkg-config --libs pipeline-io`, CMake
 * `pipeline::io`) besides the core. The types are declared here for every
 * includer (plugin.h's precision load_param takes a pl_st_file).
 */
#ifndef PIPELINE_SAFETENSORS_H
#define PIPELINE_SAFETENSORS_H

#include "pipeline/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pl_st_writer pl_st_writer;

/* Start a file; nothing touches `path` until pl_st_writer_commit(), which
 * writes PATH.tmp.<pid>, fsyncs it, renames it over PATH and fsyncs the
 * directory, so a crash leaves either the old file or the new one. */
pl_st_writer *pl_st_writer_new(const char *path);
/* Add a tensor (retained until commit/free; any device; nf4 stored as U8). */
pl_status pl_st_writer_add(pl_st_writer *w, const char *name, pl_tensor *t);
/* Add a metadata string (copied). */
pl_status pl_st_writer_meta(pl_st_writer *w, const char *key, const char *value);
pl_status pl_st_writer_commit(pl_st_writer *w);
void pl_st_writer_free(pl_st_writer *w); /* NULL-safe; discards if not committed */

typedef struct pl_st_file pl_st_file;

/* Open and validate a file (header parsed, every entry bounds-checked).
 * Errors: PL_ERR_IO naming the path and what is wrong (truncated, header
 * length larger than file, bad JSON, unknown dtype, offsets out of range). */
pl_status pl_st_open(const char *path, pl_st_file **out);
void pl_st_close(pl_st_file *f);
int pl_st_count(const pl_st_file *f);
const char *pl_st_name_at(const pl_st_file *f, int i);
/* Shape/dtype of a tensor; PL_ERR_INVALID if absent. */
pl_status pl_st_info(const pl_st_file *f, const char *name, pl_dtype *dt, int *ndim,
                     int64_t *shape);
/* New CPU tensor with the stored contents (caller owns). NULL if absent. */
pl_tensor *pl_st_load(const pl_st_file *f, const char *name);
/* Zero-copy view of a stored tensor: a new contiguous CPU tensor, dtype and
 * shape as stored (f32, bf16, f16, f64, i32, i64 or u8; u8 for packed nf4
 * codes), whose data are the stored bytes inside the file's mapping. No
 * bytes are read or copied here: pages are read from the file when first
 * touched (the page cache), so creating every view of a 1B-parameter
 * checkpoint costs no resident memory until they are used.
 *
 * Ownership: the caller owns the returned reference (never adopted by an
 * open autograd frame) and releases it with pl_tensor_release(). The
 * mapping is reference counted: each view holds a reference, so a view
 * stays valid after pl_st_close(f); the file is unmapped when the file and
 * its last view are gone. When the last reference to a view goes, the
 * whole pages inside its byte range are dropped from the process
 * (madvise MADV_DONTNEED; the pages at its two ends, shared with
 * neighbouring tensors, stay), so releasing a view after converting it
 * returns its resident memory at once.
 *
 * Writing: the file is mapped MAP_PRIVATE and writable, so a write into a
 * view is copy-on-write into this process's memory (those pages then count
 * as anonymous memory until the view is released) and never reaches the
 * file; it is seen only by this process's other reads of the same open
 * file (its other views, pl_st_load). Treat views as read-only all the same: the trainer's frozen
 * weights are.
 *
 * Alignment: if the stored bytes are not aligned for the dtype (a foreign
 * writer that did not pad the header to 8 bytes), the result is a copy
 * (what pl_st_load returns: caller-owned, allocator memory) instead of a
 * view; values are the same either way.
 *
 * Errors: NULL with the thread error set: PL_ERR_INVALID "<file>: no
 * tensor named '<name>'" when absent (or a NULL argument), PL_ERR_NOMEM. */
pl_tensor *pl_st_view(const pl_st_file *f, const char *name);
/* Copy the stored tensor into `dst`, which must have the same shape;
 * dtypes may differ among f32/bf16/f16 (converted). Error names the tensor,
 * the expected shape (dst's) and the stored one. */
pl_status pl_st_load_into(const pl_st_file *f, const char *name, pl_tensor *dst);
/* Metadata value or NULL. */
const char *pl_st_meta(const pl_st_file *f, const char *key);

/* Check that every stored element of tensor `name` is a finite number: for
 * F32, F64, BF16 and F16 entries each element's exponent bits are tested
 * (all ones: NaN or +-Inf, IEEE 754 binary32/64/16 and bfloat16, the top
 * half of binary32), reading the stored bytes in place (no conversion, no
 * copy; the pages are read from the file once). Integer and U8 entries
 * always pass. Used on pretrained weights (a Hugging Face backbone) at
 * load, where a NaN would otherwise be dropped silently (NF4
 * quantization) or surface much later as a non-finite loss.
 * Errors: PL_ERR_NUMERIC "<file>: tensor '<name>' (<dtype> <shape>) holds
 * <k> non-finite values of <n> (first at flat index <i>: nan)"; PL_ERR_INVALID
 * when the tensor is absent. */
pl_status pl_st_check_finite(const pl_st_file *f, const char *name);

#ifdef __cplusplus
}
#endif
#endif
