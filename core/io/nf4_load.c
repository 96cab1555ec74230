/* nf4_load.c - pl_nf4_load_into (pipeline/nf4.h): a safetensors entry into an
 * nf4 or float parameter whose storage kind differs from the file's. Part of
 * libpipeline_io (it reads a pl_st_file); the quantization itself is the
 * core's (ops_nf4.c: pl_nf4_quantize_into, pl_nf4_dequantize).
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "internal.h"
#include "pipeline/nf4.h"
#include "pipeline/safetensors.h"

pl_status pl_nf4_load_into(const pl_st_file *f, const char *name, const char *state_prefix,
                           pl_tensor *dst) {
    pl_dtype fdt;
    int nd;
    int64_t sh[PL_MAX_DIMS];
    pl_status st = pl_st_info(f, name, &fdt, &nd, sh);
    if (st) return st;
    if (!dst) return pl_error_set(PL_ERR_INVALID, "nf4_load_into: '%s' into NULL tensor", name);
    bool file_float = pl_dtype_is_float(fdt) && fdt != PL_NF4;
    if (dst->dtype == PL_NF4 && file_float) {
        pl_tensor *w = pl_st_load(f, name);
        if (!w) return pl_error_status();
        if (pl_tensor_numel(w) != pl_tensor_numel(dst)) {
            char b1[256], b2[256];
            st = pl_error_set(PL_ERR_SHAPE, "tensor '%s': stored %s does not match the quantized "
                              "parameter %s", name, pl_tensor_describe(w, b1, sizeof b1),
                              pl_tensor_describe(dst, b2, sizeof b2));
        } else {
            st = pl_nf4_quantize_into(dst, w);
        }
        pl_tensor_release(w);
        return st;
    }
    if (dst->dtype != PL_NF4 && pl_dtype_is_float(dst->dtype) && fdt == PL_U8) {
        /* packed codes + saved state -> dequantized float weights */
        int64_t n = pl_tensor_numel(dst);
        if (nd != 1 || sh[0] != (n + 1) / 2)
            return pl_error_set(PL_ERR_SHAPE, "tensor '%s': stored U8 [%lld] is not the packed nf4 "
                                "codes of a %lld-element parameter", name,
                                (long long)(nd == 1 ? sh[0] : -1), (long long)n);
        char key[512];
        const char *pre = state_prefix ? state_prefix : "";
        snprintf(key, sizeof key, "%s%s.block", pre, name);
        const char *blk = pl_st_meta(f, key);
        int64_t block = blk ? strtoll(blk, NULL, 10) : PL_NF4_DEFAULT_BLOCK;
        snprintf(key, sizeof key, "%s%s.absmax", pre, name);
        pl_tensor *am = pl_st_load(f, key);
        if (!am)
            return pl_error_set(PL_ERR_IO, "tensor '%s' holds nf4 codes but the quantization state "
                                "'%s' is missing (a checkpoint without NF4 quantization state?)", name, key);
        pl_tensor *q = pl_tensor_new_owned(PL_NF4, dst->ndim, dst->shape, PL_CPU);
        if (!q) {
            pl_tensor_release(am);
            return pl_error_status();
        }
        q->quant.block = block;
        q->quant.absmax = am;
        if (am->dtype == PL_U8) {
            snprintf(key, sizeof key, "%s%s.absmax_scale", pre, name);
            q->quant.absmax_scale = pl_st_load(f, key);
            snprintf(key, sizeof key, "%s%s.absmax_mean", pre, name);
            const char *mean = pl_st_meta(f, key);
            if (!q->quant.absmax_scale || !mean) {
                pl_tensor_release(q);
                return pl_error_set(PL_ERR_IO, "tensor '%s': double-quantized state incomplete "
                                    "('%s' or its absmax_scale missing)", name, key);
            }
            q->quant.absmax_mean = strtof(mean, NULL);
        }
        st = pl_st_load_into(f, name, q);
        pl_tensor *deq = st ? NULL : pl_nf4_dequantize(q, dst->dtype);
        if (!st && !deq) st = pl_error_status();
        if (!st) st = pl_tensor_copy_(dst, deq);
        pl_tensor_release(deq);
        pl_tensor_release(q);
        return st ? pl_error_prefix(st, "dequantizing '%s'", name) : PL_OK;
    }
    return pl_st_load_into(f, name, dst);
}
