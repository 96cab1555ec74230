/* ops.h - differentiable tensor ops (forward here, backward in the engine).
 *
 * Conventions for every function below:
 *   - Returns a new tensor (owned per tensor.h's rule: by the open frame if
 *     any, else by the caller) or NULL with the thread's error set.
 *   - NULL-propagating: if any tensor argument is NULL the op returns NULL
 *     and keeps the existing error, so a chain of ops can be checked once.
 *   - Inputs must be on the same device; floating ops take f32, and bf16/f16
 *     where stated (compute in f32, result in the input dtype). nf4 is refused
 *     with PL_ERR_DTYPE naming the op and tensor, except by pl_nf4_matmul.
 *   - Broadcasting follows NumPy / PyTorch: shapes are right-aligned, a dim
 *     of 1 stretches.
 *   - Every op is recorded on the autograd tape when grad mode is on and an
 *     input requires grad; backward formulas are PyTorch's
 *     (tools/autograd/derivatives.yaml) unless stated.
 */
#ifndef PIPELINE_OPS_H
#define PIPELINE_OPS_H

#include "pipeline/autograd.h"

struct pl_adamw_hyper; /* optim_math.h */
struct pl_sgd_hyper;
#include "pipeline/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- linear algebra ------------------------------------------------- */

/* C = op(A) @ op(B), op = transpose of the last two dims when the flag is set.
 * A [..., M, K] (or [..., K, M] with trans_a), B [..., K, N] (or [..., N, K]).
 * Batch dims broadcast; a 2-D B is shared by every batch (x @ W^T with
 * trans_b is nn.Linear). f32 x f32 -> f32 (OpenBLAS sgemm); bf16 x bf16 ->
 * bf16 result with f32 accumulation (f16 likewise). Mixed dtypes are refused.
 * Autocast (like torch.autocast; plugin.h, "Autocast": the current run
 * context's dtype, or an open pl_autocast_begin scope's, on the calling
 * thread): when pl_autocast_get() is PL_BF16 or PL_F16,
 * every operand not already in that dtype is cast to it (a recorded pl_cast,
 * so the activations saved for backward are half precision) and the result
 * is in the autocast dtype; gradients reaching f32 leaves are f32.
 * pl_linear follows the same rule (bias cast too, output in autocast dtype). */
pl_tensor *pl_matmul(pl_tensor *a, pl_tensor *b, bool trans_a, bool trans_b);
/* y = x @ W^T + b (nn.Linear). x [..., in], W [out, in], b [out] or NULL. */
pl_tensor *pl_linear(pl_tensor *x, pl_tensor *w, pl_tensor *b);
/* A LoRA / MoE-LoRA adapter branch added to a base output, as one op:
 *   out = y + scale * ((x A^T) * gexp) B^T
 * LoRA (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language
 * Models", arXiv 2106.09685; PEFT's lora.Linear.forward: result +
 * lora_B(lora_A(dropout(x))) * scaling); with gexp, iLoRA's gated mixture
 * of E experts of rank r_e (R = E * r_e rank slots, gexp[.., k r_e + j] =
 * the gate of expert k: the experts' sum happens inside the second GEMM).
 * Dropout of x is pl_lora_add_dropout's (below); here none: pass
 * dropout(x) for the unfused form.
 *   y     the base output [.., O] (x's leading dims), or NULL: out is then
 *         the branch alone (no add)
 *   x     [.., D], the shared input; A [R, D]; B [O, R]: without autocast
 *         one dtype of f32 / bf16 / f16 for the three; under autocast
 *         (pl_autocast_get() bf16 / f16, as pl_linear) each is cast to the
 *         autocast dtype first (a trainable A, B once per forward: the cast
 *         cache)
 *   gexp  NULL (plain LoRA), or the gate per rank slot [.., R] of any float
 *         dtype, with x's number of dims: the leading dims equal x's, or a
 *         prefix of them followed by 1s (e.g. [B, 1, R] gates every
 *         position of row b of x [B, T, D])
 *   scale any finite double (PEFT's lora_alpha / r)
 * Returns out [.., O] (a new reference owned by the current frame): in y's
 * dtype when y's dtype is the compute dtype c (x's after autocast), else
 * f32 (pl_add's promotion); without y, in c. The math is f32 (half
 * operands widened), t = x A^T rounded to c, u = t * gexp rounded to c
 * (the chain pl_linear -> pl_mul -> pl_linear's cast rounds both the
 * same), then out = y + scale (u B^T) with f32 accumulation rounded once:
 * the chain pl_add(y, pl_scale(pl_linear(u, B, NULL), scale)) rounds
 * u B^T and its scaled copy to c first, so under bf16 the fused result is
 * the more accurate by up to two bf16 roundings of the branch. In f32 the
 * CPU gives the chain's bits (it rounds scale (u B^T) before adding y, as
 * the chain does); the CUDA kernel's beta = 1 epilogue may fuse that into
 * one FMA (a last-bit difference).
 * The tape keeps x, A, B, gexp (what backward reads, ops.def) and t
 * ([.., R] in c): not u, the scaled branch or y. Gradients (f32): dy =
 * dout; du = scale dout B; dB = scale dout^T u; dgexp = du * t summed over
 * the rows a gate broadcasts to; dA = (du gexp)^T x; dx = (du gexp) A.
 * Errors: PL_ERR_SHAPE (A, B, x, y or gexp shapes that do not fit, each
 * named), PL_ERR_DTYPE (non-float, nf4, or mixed x / A / B dtypes without
 * autocast), PL_ERR_INVALID (non-finite scale), PL_ERR_DEVICE (tensors on
 * two devices). */
pl_tensor *pl_lora_add(pl_tensor *y, pl_tensor *x, pl_tensor *a, pl_tensor *b, pl_tensor *gexp,
                       double scale);
/* pl_lora_add with PEFT's lora_dropout inside the op (ABI 2.12):
 *   out = y + scale * ((drop(x) A^T) * gexp) B^T
 * where drop(x) is exactly pl_dropout(x, p, seed, counter, true) (the same
 * Philox mask bits, kernel_math.h's dropout stream, and the same values:
 * kept elements x * pl_dropout_scale(p) rounded to x's dtype, the others
 * 0), and y (the base output) is computed by the caller from x undropped,
 * as PEFT's lora.Linear.forward does. Nothing of x's size is kept for
 * backward: the tape saves x itself (the reference the caller already
 * holds, not a copy), A, B, gexp and t = drop(x) A^T, as pl_lora_add; the
 * forward computes drop(x) in a transient workspace and the backward
 * regenerates it from (seed, counter) for dA = (du g)^T drop(x), and masks
 * dx = mask * pl_dropout_scale(p) * ((du g) A), in the chain's order.
 *   p         drop probability in [0, 1] (PL_ERR_INVALID otherwise)
 *   seed, counter  the Philox key and stream, as pl_dropout takes them;
 *             inside a captured graph the counter advances per micro-step
 *             as pl_dropout's does (graph.h)
 *   training  false, or p == 0: exactly pl_lora_add(y, x, a, b, gexp,
 *             scale) (the same kernel call and bits)
 * Other arguments, the result, dtypes, autocast and errors: pl_lora_add.
 * Under autocast (bf16 / f16) x is not cast: it is dropped in its own
 * dtype and drop(x) rounded once to the autocast dtype, as the chain's
 * dropout on f32 x then autocast's cast of it (torch: dropout is not an
 * autocast op); the tape then keeps x itself, not a half copy of it.
 * The result and every gradient are bit-identical to the chain
 * pl_lora_add(y, pl_dropout(x, p, seed, counter, true), a, b, gexp, scale)
 * on the CPU and strict backends (the same operands, GEMMs and order), in
 * f32, with half operands and under autocast. A device backend that does
 * not answer the setting "lora_add_dropout" (backend.h; one built before
 * ABI 2.12 would ignore the dropout bit) gets that chain recorded instead:
 * the same values, the dropped copy and its mask on the tape. */
pl_tensor *pl_lora_add_dropout(pl_tensor *y, pl_tensor *x, pl_tensor *a, pl_tensor *b,
                               pl_tensor *gexp, double scale, double p, uint64_t seed,
                               uint64_t counter, bool training);

/* ---- elementwise, broadcasting -------------------------------------- */

pl_tensor *pl_add(pl_tensor *a, pl_tensor *b);
pl_tensor *pl_sub(pl_tensor *a, pl_tensor *b);
pl_tensor *pl_mul(pl_tensor *a, pl_tensor *b);
pl_tensor *pl_div(pl_tensor *a, pl_tensor *b);
pl_tensor *pl_scale(pl_tensor *a, double s);       /* a * s */
pl_tensor *pl_add_scalar(pl_tensor *a, double s);  /* a + s */

/* ---- reductions ----------------------------------------------------- */

/* Sum / mean over `dim` (negative counts from the end) or over all dims
 * with dim = PL_ALL_DIMS (result 0-dim). keepdim as in torch.sum. */
pl_tensor *pl_sum(pl_tensor *a, int dim, bool keepdim);
pl_tensor *pl_mean(pl_tensor *a, int dim, bool keepdim);

/* ---- activations (elementwise, shape preserved) ---------------------- */

pl_tensor *pl_relu(pl_tensor *a);
pl_tensor *pl_leaky_relu(pl_tensor *a, double negative_slope); /* torch default 0.01 */
pl_tensor *pl_elu(pl_tensor *a, double alpha);                  /* torch default 1.0 */
/* GELU: erf form x*Phi(x), or tanh form 0.5x(1+tanh(sqrt(2/pi)(x+0.044715x^3)))
 * (Hendrycks & Gimpel 2016; torch approximate='tanh'). */
pl_tensor *pl_gelu(pl_tensor *a, bool tanh_approx);
pl_tensor *pl_silu(pl_tensor *a);
pl_tensor *pl_sigmoid(pl_tensor *a);
pl_tensor *pl_tanh(pl_tensor *a);
pl_tensor *pl_exp(pl_tensor *a);
pl_tensor *pl_log(pl_tensor *a);
pl_tensor *pl_square(pl_tensor *a);
pl_tensor *pl_sqrt(pl_tensor *a);
/* SwiGLU, the gated MLP activation of Llama (Shazeer 2020, "GLU Variants
 * Improve Transformer"; transformers' LlamaMLP act_fn(gate_proj(x)) *
 * up_proj(x)): silu(gate) * up, elementwise. gate and up: float tensors of
 * one shape on one device (no broadcasting: PL_ERR_SHAPE names both);
 * bf16 / f16 compute in f32 and return gate's dtype. One op instead of
 * pl_mul(pl_silu(gate), up): the values and gradients are the same bits
 * (d gate = silu'(gate) (g up), d up = g silu(gate)), and the tape keeps
 * gate and up only, not silu(gate) too (docs/autograd-memory.md). */
pl_tensor *pl_swiglu(pl_tensor *gate, pl_tensor *up);

/* ---- softmax family (over the last dim) ------------------------------ */

pl_tensor *pl_softmax(pl_tensor *a);
pl_tensor *pl_log_softmax(pl_tensor *a);
/* Causal masked softmax for attention: scores [..., T, S] (S >= T, query i
 * sees keys j <= i + S - T), softmax(scale * scores) with masked entries 0. */
pl_tensor *pl_causal_softmax(pl_tensor *scores, double scale);
/* Fused scaled dot-product attention, FlashAttention-2 style (Dao 2023,
 * "FlashAttention-2: Faster Attention with Better Parallelism and Work
 * Partitioning", arXiv 2307.08691; PyTorch's
 * F.scaled_dot_product_attention with an additive attn_mask, is_causal and
 * enable_gqa; transformers' repeat_kv):
 *   out[b, h, i] = sum_j P[i, j] v[b, h / rep, j],
 *   P[i, :] = softmax_j(scale q[b, h, i] . k[b, h / rep, j] + bias[b, 0, 0, j])
 * over the keys j query i sees: all L, or with causal j <= L - T + i (the
 * queries are the last T of the L positions, as pl_causal_softmax's).
 *   q     [B, H, T, Dh]; k, v [B, KV, L, Dh]: one float dtype (f32, bf16
 *         or f16) for the three, one device; H a multiple of KV (grouped-query
 *         attention: rep = H / KV query heads share each kv head, read in
 *         place, not expanded); causal needs T <= L
 *   bias  NULL, or an additive key mask [B, 1, 1, L] or [1, 1, 1, L] of any
 *         float dtype (e.g. 0 / -1e9 for padding keys), added after the
 *         scale; a constant: it must not require a gradient
 *   scale finite, usually 1 / sqrt(Dh)
 * Returns out [B, H, T, Dh] in q's dtype (a new reference owned by the
 * current frame, as every op's result). The math is f32 whatever the dtype
 * (half inputs are widened in the kernel, the output rounded once). The
 * tape keeps q, k, v (and bias), out and the logsumexp of every query row
 * less the row's largest visible bias (f32 [B, H, T]; so a row whose every
 * visible key is masked by -1e9 keeps its log-sum, which -1e9 + log l in
 * f32 would round away), never the T x L probabilities: backward
 * recomputes them from it (FA-2's backward: dV = P^T dO, dP = dO V^T,
 * dS = P (dP - D) with D_i = rowsum(dO * O), dQ = scale dS K,
 * dK = scale dS^T Q; gradients of the rep heads sharing a kv head are
 * summed). The same numbers as pl_matmul(pl_causal_softmax(pl_add(
 * pl_matmul(q, k^T), bias / scale), scale), v) on kv heads expanded with
 * pl_index_select, up to f32 rounding.
 * Errors (NULL, pl_error_message() names the tensor, expected vs found):
 * PL_ERR_DTYPE (a non-float input, q / k / v of different dtypes),
 * PL_ERR_SHAPE (ranks, B / Dh / L mismatch, H not a multiple of KV, causal
 * with T > L, a bias not [B or 1, 1, 1, L]), PL_ERR_DEVICE (inputs on
 * different devices), PL_ERR_INVALID (non-finite scale, a bias that
 * requires a gradient), PL_ERR_UNSUPPORTED (a backend without the kernel,
 * or CUDA with Dh > 128). */
pl_tensor *pl_attention(pl_tensor *q, pl_tensor *k, pl_tensor *v, pl_tensor *bias, double scale,
                        bool causal);

/* ---- losses (return 0-dim f32, mean reduction) ------------------------ */

/* torch.nn.functional.cross_entropy(logits [N, C], target i64 [N],
 * ignore_index, label_smoothing): mean over targets != ignore_index; with
 * smoothing eps the target distribution is (1-eps)*onehot + eps/C. If every
 * target is ignored the result is NaN, as in PyTorch. */
pl_tensor *pl_cross_entropy(pl_tensor *logits, pl_tensor *target, int64_t ignore_index,
                            double label_smoothing);
/* pl_cross_entropy(pl_matmul(x, weight, false, true), target, ignore_index,
 * label_smoothing) without the [N, V] logits: torch's
 * F.cross_entropy(x @ W.T, target, ignore_index=, label_smoothing=,
 * reduction='mean'), fused as Liger-Kernel's FusedLinearCrossEntropy and
 * Wijmans et al. 2024, "Cut Your Losses in Large-Vocabulary Language
 * Models" (arXiv 2411.09009): a tied or untied output head and its loss.
 *   x       [N, K] f32, any device (a view is made contiguous)
 *   weight  [V, K] f32 on x's device (the head: logits = x weight^T)
 *   target  [N] i64 or i32 class indices in [0, V), or ignore_index
 * Returns a new 0-dim f32 tensor (the frame's): the mean over the rows whose
 * target is not ignore_index; NaN when every row is ignored (torch; as
 * pl_cross_entropy). The math is pl_cross_entropy's on each row (the same
 * max, exponential and f64 sums: the loss equals the chain's to f32
 * rounding, ulps from the blocked GEMM's order); only the logits' storage
 * differs: the CPU kernel multiplies blocks of up to 128 rows against all
 * of weight into a scratch of a few MiB per thread (one run of blocks per
 * thread; the loss and dx do not depend on the thread count, dW's partial
 * sums do: the same bits run to run for a given count). Autograd (grad
 * mode on): the forward also computes the gradient of each of x and
 * weight that requires one, at a unit incoming gradient (dx = dl weight,
 * dW = dl^T x; Liger's choice, no second pass over the logits in
 * backward; a frozen weight costs no dW, as the chain's matmul), and the
 * tape keeps those, [N, K] and [V, K] f32, instead of the [N, V] logits
 * and their gradient; backward scales them by the incoming gradient
 * (weight's accumulates into weight->grad like any other use of it, e.g.
 * a tied embedding).
 * Falls back to the chain above (the same values to rounding, the logits
 * on the tape): under autocast, for a half x or weight, an empty shape
 * (N, K or V = 0), and on a device backend that does not answer the
 * setting "linear_cross_entropy" (backend.h, set_option; ABI 2.13: the
 * CPU and strict backends do, CUDA does not yet).
 * Errors (NULL, the message names the tensor, expected vs found):
 * PL_ERR_DTYPE (a non-float x / weight, a non-index target), PL_ERR_SHAPE
 * (x not 2-D, weight not [V, K] with x's K, target not [N]), PL_ERR_DEVICE
 * (inputs on different devices), PL_ERR_INVALID (label_smoothing outside
 * [0, 1], a target outside [0, V) that is not ignore_index). */
pl_tensor *pl_linear_cross_entropy(pl_tensor *x, pl_tensor *weight, pl_tensor *target,
                                   int64_t ignore_index, double label_smoothing);
pl_tensor *pl_mse_loss(pl_tensor *pred, pl_tensor *target);  /* mean (p-t)^2 */
pl_tensor *pl_mae_loss(pl_tensor *pred, pl_tensor *target);  /* mean |p-t| (l1_loss) */
/* torch huber_loss: 0.5 d^2 if |d| < delta else delta(|d| - 0.5 delta). */
pl_tensor *pl_huber_loss(pl_tensor *pred, pl_tensor *target, double delta);

/* ---- indexing --------------------------------------------------------- */

/* weight [V, D], idx i64/i32 of any shape -> [*idx.shape, D]. Gradient to
 * weight only (scatter-add of rows). Index out of [0, V) -> PL_ERR_INVALID. */
pl_tensor *pl_embedding(pl_tensor *weight, pl_tensor *idx);
/* torch.index_select(a, dim, idx 1-D). */
pl_tensor *pl_index_select(pl_tensor *a, int dim, pl_tensor *idx);
/* torch.gather(a, dim, idx): idx same ndim as a, out has idx's shape. */
pl_tensor *pl_gather(pl_tensor *a, int dim, pl_tensor *idx);
/* out = zeros(shape of src with size `dim_size` along dim); out.index_add_(dim, idx, src)
 * where idx is 1-D with src.shape[dim] entries (torch index_add / PyG scatter sum). */
pl_tensor *pl_scatter_add(pl_tensor *src, int dim, pl_tensor *idx, int64_t dim_size);
/* Softmax of scores [E, H] over edges grouped by seg i64 [E] (destination
 * node, values in [0, num_segments)), per column h; PyG softmax(src, index). */
pl_tensor *pl_segment_softmax(pl_tensor *scores, pl_tensor *seg, int64_t num_segments);
/* torch.topk(x, k, dim=-1, largest=True, sorted=True) (ABI 2.12): the k
 * largest values of each row of x's last dim, best first, computed where x
 * lives (a GPU's logits come back as [.., k], not [.., V]). Order: a before
 * b when a > b, or a == b (-0 == +0) and a's index is lower; NaN ranks above
 * every number (torch's rule), NaNs among themselves by lower index; -inf
 * is an ordinary value (below every finite one). Deterministic on every
 * backend (cpu, strict, cuda): the same values and indices, bit for bit.
 *   x        f32, bf16 or f16, ndim >= 1, last dim V >= 1; borrowed (a
 *            strided x is copied contiguous first)
 *   k        1 <= k <= V
 *   values   out: [.., k] in x's dtype (the selected elements, exact)
 *   indices  out: [.., k] i64, positions in [0, V)
 * Both new tensors of the open frame (as any op's result). No autograd: the
 * results never require a gradient and nothing is recorded on the tape,
 * whatever x's requires_grad (as pl_nf4_quantize). On error *values and
 * *indices are NULL: PL_ERR_DTYPE (x not float; nf4), PL_ERR_SHAPE (0-dim
 * x), PL_ERR_INVALID (k < 1 or k > V, NULL arguments), naming x. */
pl_status pl_topk(pl_tensor *x, int64_t k, pl_tensor **values, pl_tensor **indices);

/* ---- normalization ------------------------------------------------------ */

/* layer_norm over the last dim: (x - mean)/sqrt(var + eps) * w + b (biased var).
 * w, b [D] or NULL. torch.nn.functional.layer_norm. */
pl_tensor *pl_layer_norm(pl_tensor *x, pl_tensor *w, pl_tensor *b, double eps);
/* RMSNorm (Zhang & Sennrich 2019; Llama): x / sqrt(mean(x^2) + eps) * w. */
pl_tensor *pl_rms_norm(pl_tensor *x, pl_tensor *w, double eps);

/* ---- dropout ------------------------------------------------------------ */

/* Inverted dropout: keep with prob 1-p, scale kept by 1/(1-p). The mask of
 * element i is a function of (seed, counter, i) via Philox4x32-10 (Salmon
 * et al. 2011), so it is identical on any thread count. `training` false or
 * p == 0 returns `a` itself (retained). */
pl_tensor *pl_dropout(pl_tensor *a, double p, uint64_t seed, uint64_t counter, bool training);

/* ---- shape ops ---------------------------------------------------------- */

pl_tensor *pl_concat(pl_tensor *const *ts, int n, int dim);
/* Split along dim into n parts of sizes[i] (sum = a.shape[dim]); outputs
 * written to outs[0..n). Returns PL_OK or an error. */
pl_status pl_split(pl_tensor *a, int dim, const int64_t *sizes, int n, pl_tensor **outs);
/* a[..., start:end, ...] along dim (copy, differentiable). */
pl_tensor *pl_slice(pl_tensor *a, int dim, int64_t start, int64_t end);
/* Swap two dims (contiguous copy, differentiable). */
pl_tensor *pl_transpose(pl_tensor *a, int d0, int d1);
pl_tensor *pl_permute(pl_tensor *a, const int *perm);
/* Differentiable reshape (a view when `a` is contiguous); one dim may be -1. */
pl_tensor *pl_reshape(pl_tensor *a, int ndim, const int64_t *shape);
/* Contiguous copy of a strided view (differentiable identity). */
pl_tensor *pl_contiguous(pl_tensor *a);
/* Differentiable dtype cast (f32 <-> bf16 / f16); grad cast back. */
pl_tensor *pl_cast(pl_tensor *a, pl_dtype dt);

/* ---- attention helpers --------------------------------------------------- */

/* Rotary position embedding (Su et al. 2021, RoFormer), Llama / HF
 * "rotate_half" layout: x [B, T, H, Dh] (Dh even); position of row t is
 * pos_offset + t; inv_freq_i = theta^(-2i/Dh). */
pl_tensor *pl_rope(pl_tensor *x, int64_t pos_offset, double theta);

/* ---- quantized ------------------------------------------------------------ */

/* y = x @ dequant(W)^T with W nf4 [N, K] (frozen, no grad), x f32/bf16
 * [..., K] -> [..., N] in x's dtype. Gradient flows to x only. */
pl_tensor *pl_nf4_matmul(pl_tensor *x, pl_tensor *w_nf4);

/* ---- clamp and optimizer updates --------------------------------------------- */

/* torch.clamp(a, min, max): f32/bf16/f16 a, same shape and dtype out; NaN
 * stays NaN; gradient passes where min <= a <= max (derivatives.yaml).
 * min > max: PL_ERR_INVALID. */
pl_tensor *pl_clamp(pl_tensor *a, double min, double max);

/* One AdamW / Adam update in place on the tensors' device (optim_math.h has
 * the math and the sources): param, exp_avg, exp_avg_sq (and max_exp_avg_sq
 * when h->amsgrad, else NULL) are f32, contiguous, of grad's element count,
 * on one device; grad f32 contiguous, not modified. Not recorded on the tape
 * (call it with grad mode in any state). Errors: PL_ERR_DTYPE / PL_ERR_SHAPE /
 * PL_ERR_DEVICE naming param->name; h->step < 1 PL_ERR_INVALID. */
pl_status pl_adamw_step_(pl_tensor *param, const pl_tensor *grad, pl_tensor *exp_avg,
                         pl_tensor *exp_avg_sq, pl_tensor *max_exp_avg_sq,
                         const struct pl_adamw_hyper *h);
/* One SGD update in place (optim_math.h): param f32, grad f32, momentum_buf
 * f32 or NULL (no momentum), as for pl_adamw_step_. */
pl_status pl_sgd_step_(pl_tensor *param, const pl_tensor *grad, pl_tensor *momentum_buf,
                       const struct pl_sgd_hyper *h);
/* Multi-tensor (foreach) forms of pl_adamw_step_ / pl_sgd_step_: the same
 * updates of n parameters, bit for bit (torch.optim.AdamW(foreach=True),
 * SGD(foreach=True); torch/optim/adamw.py `_multi_tensor_adamw`), issued as
 * ceil(n_d / PL_OPTIM_MULTI_MAX) kernel calls per device d holding n_d of the
 * parameters (ops.def's adamw_step_multi / sgd_step_multi: one launch each on
 * a GPU, optim_math.h's pl_optim_multi) instead of n. The parameters are
 * grouped by device, keeping their order within a device, as torch's
 * _group_tensors_by_device_and_dtype does (every tensor is f32, so the dtype
 * makes no second key). On a device whose backend lacks the multi op, the
 * call makes the n per-tensor calls itself. Honours the found_inf flag and a
 * graph capture / refresh (graph.h: parameter i's coefficients take one slot
 * of the table, as its per-tensor call would) as the per-tensor calls do.
 *
 * Arrays of n (n >= 0; n == 0 does nothing), borrowed, indexed alike:
 *   param[i]           f32 contiguous, updated in place
 *   grad[i]            f32 contiguous, param[i]'s element count, read
 *   exp_avg[i], exp_avg_sq[i]   f32 state, as for pl_adamw_step_
 *   max_exp_avg_sq     NULL when no h[i].amsgrad; else [i] f32 where
 *                      h[i].amsgrad (ignored where not)
 *   h[i]               parameter i's update (its own step count)
 *   momentum_buf       NULL (no momentum anywhere) or [i] f32 / NULL, as
 *                      pl_sgd_step_'s momentum_buf for parameter i
 * Errors: those of the per-tensor calls, naming the parameter (every
 * tensor is checked before any update runs, so a bad tensor updates none on
 * its device); PL_ERR_INVALID for n < 0 or NULL arrays. */
pl_status pl_adamw_step_multi_(int n, pl_tensor *const *param, pl_tensor *const *grad,
                               pl_tensor *const *exp_avg, pl_tensor *const *exp_avg_sq,
                               pl_tensor *const *max_exp_avg_sq, const struct pl_adamw_hyper *h);
pl_status pl_sgd_step_multi_(int n, pl_tensor *const *param, pl_tensor *const *grad,
                             pl_tensor *const *momentum_buf, const struct pl_sgd_hyper *h);
/* Counted forms (ABI 2.12): the step count lives on the device, as torch's
 * fused AdamW keeps `state_steps` (optim_math.h, "the step count on the
 * device"). count (count[i]) is an f32 tensor of one element on the
 * parameter's device, written: the kernel increments it unless the
 * found_inf flag (pl_optim_set_found_inf) is set, and then updates with it,
 * so a skipped step neither moves the weights nor advances the count, and
 * the host reads nothing. adamw: the bias corrections come from the count
 * (h->step is ignored; an initial count of 0 gives update 1); the count must
 * stay below 2^24, as torch's f32 step, to count exactly. sgd: the momentum
 * buffer is initialised to the gradient when the count reaches 1 (h->first
 * is ignored); count (count[i]) is needed where momentum_buf (its [i]) is
 * set and ignored elsewhere. Otherwise as the forms above (the same checks,
 * the same bits for the same count: pl_adamw_coef_at). Errors as theirs,
 * and PL_ERR_UNSUPPORTED naming the parameter and backend when that
 * device's optimizer kernels keep no count (pl_optim_counts_on_device). */
pl_status pl_adamw_step_counted_(pl_tensor *param, const pl_tensor *grad, pl_tensor *exp_avg,
                                 pl_tensor *exp_avg_sq, pl_tensor *max_exp_avg_sq,
                                 pl_tensor *count, const struct pl_adamw_hyper *h);
pl_status pl_sgd_step_counted_(pl_tensor *param, const pl_tensor *grad, pl_tensor *momentum_buf,
                               pl_tensor *count, const struct pl_sgd_hyper *h);
pl_status pl_adamw_step_multi_counted_(int n, pl_tensor *const *param, pl_tensor *const *grad,
                                       pl_tensor *const *exp_avg, pl_tensor *const *exp_avg_sq,
                                       pl_tensor *const *max_exp_avg_sq, pl_tensor *const *count,
                                       const struct pl_adamw_hyper *h);
pl_status pl_sgd_step_multi_counted_(int n, pl_tensor *const *param, pl_tensor *const *grad,
                                     pl_tensor *const *momentum_buf, pl_tensor *const *count,
                                     const struct pl_sgd_hyper *h);
/* Whether the optimizer kernels of device d take the counted calls above:
 * the CPU's do; another backend says so by accepting the setting
 * "optimizer_step_count" (backend.h's set_option; strict and cuda do). An
 * optimizer keeps its count on the host where this is false. Clears the
 * error state it may set. */
bool pl_optim_counts_on_device(pl_device d);
/* torch.cuda.amp.GradScaler's device kernels (ATen native/cuda/AmpKernels.cu;
 * the math is optim_math.h's pl_amp_unscale_elem / pl_amp_update_scale_elem).
 * Neither is recorded on the tape (no autograd, so no numerical gradient
 * check applies: the conformance suite compares their results with the
 * CPU's, as for the optimizer updates). Every per-step value is read from
 * device memory, none from the host, so a captured graph (graph.h) replays
 * them with the values of each step.
 *
 * pl_amp_unscale_multi_ = torch._amp_foreach_non_finite_check_and_unscale_
 * (grads, found_inf, inv_scale): every element g of grads[0..n) is checked
 * as it arrives (found_inf[0] = 1.0f when g is inf or NaN; found_inf is never
 * cleared, so the caller zeroes it, or leaves a flag it keeps adding to) and
 * multiplied in place by inv_scale[0] (left as it is when inv_scale is 1).
 *   grads[i]    f32, contiguous, any shape, on found_inf's device; updated
 *               in place; borrowed (n >= 0; n == 0 does nothing)
 *   found_inf   f32 [1] (one element), contiguous; updated; borrowed
 *   inv_scale   f32 [1] on the same device, read (torch computes it as
 *               scale.double().reciprocal().float(): pl_div(one, scale) in
 *               f32 gives the same value)
 * Issued as ceil(n / PL_OPTIM_MULTI_MAX) kernel calls (ops.def's
 * amp_unscale_multi: one launch each on a GPU, the list in a pl_optim_multi).
 * Errors: PL_ERR_INVALID (n < 0, a NULL list or tensor), PL_ERR_SHAPE (a
 * tensor of another dtype, not contiguous, found_inf / inv_scale not one
 * element), PL_ERR_DEVICE (a tensor on another device), naming it;
 * PL_ERR_UNSUPPORTED when the device's backend has no such kernel (every
 * tensor is checked before a kernel runs). */
pl_status pl_amp_unscale_multi_(int n, pl_tensor *const *grads, pl_tensor *found_inf,
                                const pl_tensor *inv_scale);
/* pl_amp_update_scale_ = torch._amp_update_scale_(scale, growth_tracker,
 * found_inf, growth_factor, backoff_factor, growth_interval), in place, one
 * thread: found_inf[0] != 0 (NaN included): scale *= backoff_factor, tracker
 * = 0; else tracker + 1 == growth_interval: scale *= growth_factor, kept only
 * when the result is finite, tracker = 0; else tracker += 1 (the products in
 * double, rounded to f32, as torch's).
 *   scale          f32 [1], contiguous; updated; borrowed
 *   growth_tracker i32 [1] (torch's int32), same device; updated; borrowed
 *   found_inf      f32 [1], same device; read
 *   growth_factor, backoff_factor  > 0; growth_interval 1..INT32_MAX (the
 *   tracker is an i32): constants of the call (a captured graph bakes them)
 * Errors: PL_ERR_SHAPE / PL_ERR_DEVICE naming the tensor, PL_ERR_INVALID for
 * a NULL tensor or a factor / interval out of range, PL_ERR_UNSUPPORTED when
 * the backend has no such kernel. */
pl_status pl_amp_update_scale_(pl_tensor *scale, pl_tensor *growth_tracker,
                               const pl_tensor *found_inf, double growth_factor,
                               double backoff_factor, int64_t growth_interval);
/* torch.nn.utils.clip_grad_norm_'s foreach kernels (torch/nn/utils/clip_grad.py,
 * PyTorch 2.x: torch._foreach_norm, then torch._foreach_mul_ by the clip
 * coefficient), on the tensors' device, no host read, not recorded on the
 * tape (no autograd). Issued as ceil(n / PL_OPTIM_MULTI_MAX) kernel calls
 * (ops.def's sum_squares_multi / mul_multi: one launch each on a GPU, the
 * list by value in a pl_optim_multi's grad[], optim_math.h) instead of 3n
 * (square, sum, add) and 2n (mul, copy); graph-safe (the scalars stay in
 * device memory). Where the list is not all f32 contiguous tensors of one
 * device, or that device's backend lacks the op, the call makes the
 * per-tensor calls it replaces itself (the same result).
 *
 * pl_sum_squares_multi: sum over i in order of sum(ts[i]^2), returned as a
 * new 0-dim f32 tensor on the tensors' device (the frame's, as any op's
 * result; the shape of pl_sum(.., PL_ALL_DIMS, false)). Bit for bit the
 * chain it replaces, total = s_0, total = pl_add(total, s_i) with s_i =
 * pl_sum(pl_square(ts[i]), PL_ALL_DIMS, false): each square rounded to f32,
 * each s_i summed in the order of that backend's sum kernel (CPU / strict:
 * in double, OpenMP's split over 32768 elements; CUDA: k_sum_block's 1024
 * threads), each add one f32 add. torch's _foreach_norm returns the per-
 * tensor norms and clip_grad_norm_ takes the norm of those: the same value
 * up to rounding, not the same bits. NaN / inf propagate (an inf square
 * gives inf, a NaN gives NaN); an empty tensor adds 0.
 *   ts[i]   f32 (other float dtypes: the per-tensor chain), any shape, any
 *           element count (0 allowed); borrowed; n >= 1
 * NULL (error set) on PL_ERR_INVALID (n < 1, a NULL list or tensor), a
 * dtype error naming the tensor, or a kernel's error.
 *
 * pl_mul_multi_ = torch._foreach_mul_(ts, s): every element of every ts[i]
 * multiplied in place by s[0] (x * s in f32, the bits of pl_mul(ts[i], s)
 * copied back).
 *   ts[i]   f32 contiguous (else the per-tensor calls), on s's device;
 *           updated in place; borrowed (n >= 0; n == 0 does nothing)
 *   s       f32, one element, contiguous; read on the device
 * Errors (before any change): PL_ERR_INVALID (n < 0, a NULL list or
 * tensor), PL_ERR_SHAPE (s not one f32 element), PL_ERR_DEVICE (s on another
 * device than ts[0]), a dtype error naming the tensor; a later tensor on
 * another device fails its per-tensor mul (those before it are updated). */
pl_tensor *pl_sum_squares_multi(int n, pl_tensor *const *ts);
pl_status pl_mul_multi_(int n, pl_tensor *const *ts, const pl_tensor *s);
/* A step skipped on the device (GradScaler's found_inf, as torch's fused
 * Adam / SGD take it): while `flag` is set, every pl_adamw_step_ and
 * pl_sgd_step_ hands it to its kernel as in[1], and the kernel leaves the
 * parameter and its state untouched when flag[0] != 0 (NaN included), so the
 * host decides nothing and reads nothing (the multi-tensor forms above too). `flag`: a 1-element f32 tensor on
 * the parameters' device (PL_ERR_DEVICE / PL_ERR_SHAPE from the step naming
 * the parameter otherwise), borrowed until cleared. NULL (the default):
 * every step updates. Process-wide (autocast is per thread, plugin.h): the trainer sets it
 * around its optimizer step and clears it after, on a device whose backend
 * accepts the setting "optimizer_found_inf" (backend.h): its adamw_step /
 * sgd_step kernels read in[1] when n_in > 1 (cpu, strict and cuda do). */
void pl_optim_set_found_inf(pl_tensor *flag);
/* The flag set by pl_optim_set_found_inf (borrowed), or NULL when none is set:
 * for an optimizer plugin that launches its own update kernels and must obey
 * the same skip. */
pl_tensor *pl_optim_found_inf(void);

/* ---- fused recurrent --------------------------------------------------------- */

/* One LSTM layer, PyTorch gate order (i, f, g, o) and equations:
 *   gates = x_t W_ih^T + b_ih + h_{t-1} W_hh^T + b_hh
 *   c_t = f*c_{t-1} + i*g,  h_t = o*tanh(c_t)
 * x [B, T, In], w_ih [4H, In], w_hh [4H, H], b_ih/b_hh [4H] (may be NULL),
 * h0/c0 [B, H] or NULL (zeros). Returns y [B, T, H]; h_n/c_n [B, H] written
 * to *h_n / *c_n when non-NULL (not differentiable). reverse = process time
 * backwards (bidirectional's second direction). CPU: one GEMM for the input
 * projection of all time steps, then the recurrence. */
pl_tensor *pl_lstm(pl_tensor *x, pl_tensor *w_ih, pl_tensor *w_hh, pl_tensor *b_ih,
                   pl_tensor *b_hh, pl_tensor *h0, pl_tensor *c0, bool reverse,
                   pl_tensor **h_n, pl_tensor **c_n);

#ifdef __cplusplus
}
#endif
#endif
