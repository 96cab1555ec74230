/* nf4.h - 4-bit NormalFloat (NF4) quantization of frozen weights (QLoRA).
 *
 * Source: Dettmers et al. 2023, "QLoRA: Efficient Finetuning of Quantized
 * LLMs" (arXiv:2305.14314), and bitsandbytes' implementation
 * (csrc/kernels.cu dQuantizeNF4 / dDequantizeNF4, bitsandbytes/functional.py
 * quantize_4bit / create_dynamic_map), which this file follows:
 *
 *   Block-wise absmax: the flat weight (row-major, numel elements) is cut into
 *   blocks of `block` elements (64 by default; the last block may be short).
 *   absmax[b] = max |w_i| over block b. Each element is normalized
 *   x = w_i / absmax[b] in [-1, 1] and mapped to the 4-bit index of the NF4
 *   code value nearest to it, using bitsandbytes' decision tree (thresholds
 *   are the midpoints of consecutive code values, ties go to the lower code).
 *   Dequantization: w'_i = code[q_i] * absmax[b]. An all-zero block has
 *   absmax 0 and dequantizes to exact zeros.
 *
 *   Packing: two codes per byte, element 2j in the LOW nibble and element
 *   2j+1 in the HIGH nibble (tensor.h's rule; bitsandbytes puts the first
 *   element in the high nibble, so the raw bytes differ, the values do not).
 *
 *   Double quantization (QLoRA section 3, "Double Quantization"; bitsandbytes
 *   quantize_4bit(compress_statistics=True)): the f32 absmax constants are
 *   quantized again: mean = mean(absmax); a = absmax - mean; blocks of 256
 *   constants; absmax2[g] = max |a| over group g (f32); q8 = index of the
 *   entry of the signed 8-bit dynamic map (bitsandbytes create_dynamic_map(
 *   signed=True, max_exponent_bits=7, total_bits=8), 256 sorted values in
 *   [-1, 1]) nearest to a / absmax2[g]. Recovered absmax[b] =
 *   dyn[q8[b]] * absmax2[b / 256] + mean.
 *   Storage per parameter: without double quantization 32/64 = 0.5 bit,
 *   with it 8/64 + 32/(64*256) = 0.127 bit (+ one f32 mean per tensor).
 *
 * Quantization state of an nf4 tensor (t->quant, see tensor.h):
 *   block        elements per block
 *   absmax       f32 [n_blocks] (no double quantization) or
 *                u8 [n_blocks] (codes into the dynamic map)
 *   absmax_scale f32 [ceil(n_blocks / 256)] when double quantized, else NULL
 *   absmax_mean  the mean subtracted before double quantization (0 otherwise)
 *   orig_dtype   dtype of the source tensor
 * with n_blocks = ceil(numel / block). The state tensors live on the nf4
 * tensor's device and are owned by it (released with it).
 */
#ifndef PIPELINE_NF4_H
#define PIPELINE_NF4_H

#include <stdbool.h>
#include <stdint.h>

#include "pipeline/safetensors.h"
#include "pipeline/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define PL_NF4_DEFAULT_BLOCK 64
#define PL_NF4_DQ_BLOCK 256 /* constants per group in double quantization */

/* The 16 NF4 code values (index 0..15, ascending from -1 to 1), exactly the
 * float constants of bitsandbytes' csrc/kernels.cu. Static, borrowed. */
const float *pl_nf4_code_table(void);
/* The 256-entry signed dynamic map used for double quantization (sorted
 * ascending, generated like bitsandbytes create_dynamic_map(signed=True)).
 * Static, borrowed. */
const float *pl_nf4_dynamic_map(void);
/* Index of the NF4 code for a normalized value x in [-1, 1]
 * (bitsandbytes dQuantizeNF4). NaN maps to 0 (-1.0), as there. */
uint8_t pl_nf4_quantize_value(float x);

/* Quantize a float tensor (f32/bf16/f16, any shape, any device; a strided
 * view is read contiguously) into a new nf4 tensor of the same shape and
 * device with t->quant filled. `block` > 0 (64 for QLoRA); `double_quant`
 * quantizes the absmax constants as above. The block absmax and the codes
 * are computed on w's device (the NF4_QUANTIZE kernel, bit-identical to the
 * CPU's); only the double quantization of the absmax (one f32 per block)
 * runs on the host. The result does not require
 * grad. Returns a new reference owned by the caller (never adopted by a
 * frame), NULL with the error set (PL_ERR_DTYPE for a non-float source,
 * PL_ERR_NUMERIC naming w's name, the count and the first index when w holds
 * NaN or +-Inf: bitsandbytes' absmax skips a NaN, which then becomes an
 * ordinary code and vanishes, and an Inf turns its block into NaN; neither
 * is represented, so both are refused). */
pl_tensor *pl_nf4_quantize(const pl_tensor *w, int64_t block, bool double_quant);

/* Re-quantize `w` into an existing nf4 tensor `q` of the same numel, keeping
 * q's block size and double-quantization choice (its state tensors are
 * overwritten in place, shapes unchanged). Used when float weights are
 * loaded onto an already quantized parameter. Non-finite values in w are
 * refused as by pl_nf4_quantize (q is left unchanged). */
pl_status pl_nf4_quantize_into(pl_tensor *q, const pl_tensor *w);

/* Dequantize an nf4 tensor to a new contiguous tensor of dtype `dt`
 * (f32/bf16/f16) with q's shape and device; values are code * absmax
 * computed in f32 then rounded to `dt`. Owned by the caller, not recorded
 * on the tape. NULL with error if q is not nf4 or its state is missing. */
pl_tensor *pl_nf4_dequantize(const pl_tensor *q, pl_dtype dt);

/* The f32 absmax of every block (dequantizing the constants when double
 * quantized) written to out[0 .. n_blocks). CPU and CUDA tensors. */
pl_status pl_nf4_block_absmax(const pl_tensor *q, float *out);

/* Number of blocks of an nf4 tensor, and bytes it stores: packed codes and
 * quantization constants (absmax, absmax_scale, 4 bytes for the mean). */
int64_t pl_nf4_num_blocks(const pl_tensor *q);
size_t pl_nf4_code_nbytes(const pl_tensor *q);
size_t pl_nf4_state_nbytes(const pl_tensor *q);

/* Checkpoint interop (used by the trainer's weights-only load and by the
 * qlora4 precision plugin). Copy the checkpoint tensor `name` of `f` into a
 * destination whose storage kind differs from the file's:
 *   - dst nf4, file float (F32/BF16/F16) of dst's shape: the weights are
 *     quantized into dst (pl_nf4_quantize_into), e.g. init_from an fp32
 *     checkpoint under qlora4;
 *   - dst float, file U8 [ceil(numel/2)] packed nf4 codes: the quantization
 *     state is read from `<state_prefix><name>.absmax` (+ `.absmax_scale`
 *     and the metadata `<state_prefix><name>.absmax_mean` / `.block` when
 *     present, as the qlora4 plugin saves them) and dst receives the
 *     dequantized weights, e.g. a qlora4 checkpoint loaded onto an fp32 or
 *     bf16 base;
 *   - same kinds: plain pl_st_load_into.
 * state_prefix is "precision.qlora4.v1." for the trainer's checkpoints.
 * Errors name the file, the tensor and what is missing. Defined in
 * libpipeline_io (core/io/nf4_load.c), like the rest of safetensors.h. */
pl_status pl_nf4_load_into(const pl_st_file *f, const char *name, const char *state_prefix,
                           pl_tensor *dst);

#ifdef __cplusplus
}
#endif
#endif
