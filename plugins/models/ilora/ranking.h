/* ranking.h - full-ranking metrics and top-K selection of the ilora model
 * (plugin-internal; the test checks them against hand-computed cases).
 *
 * Rank of the target: the number of items whose score is STRICTLY greater
 * than the target's score (0 = best). Ties are therefore resolved in the
 * target's favour, as in the usual `(scores > scores[target]).sum()` code of
 * SASRec-style evaluations. Excluded items (history, padding) are given the
 * score -inf before ranking, so they never count, unless the target itself
 * is -inf (then every finite item counts).
 *
 *   HR@K    = 1 if rank < K else 0
 *   NDCG@K  = 1 / log2(rank + 2) if rank < K else 0   (one relevant item: IDCG = 1)
 *   Recall@K = HR@K (exactly one relevant item per user)
 */
#ifndef ILORA_RANKING_H
#define ILORA_RANKING_H

#include <stdint.h>

#include "pipeline/status.h"

/* scores [n]; target in [0, n). Returns the strict-greater count. */
int64_t ilora_rank_of(const float *scores, int64_t n, int64_t target);
double ilora_hit_at(int64_t rank, int64_t k);
double ilora_ndcg_at(int64_t rank, int64_t k);

/* The k best entries of scores [n] (k <= n), written to ids/vals in
 * descending score order; equal scores: lower index first; NaN above every
 * number (pl_topk's order: ops.h). -inf entries are only picked when fewer
 * than k other ones exist. O(n log k). */
void ilora_topk(const float *scores, int64_t n, int64_t k, int32_t *ids, float *vals);

/* The same ranks on the tensors' device, with no host read (evaluation on a
 * GPU reads back B values instead of the [B, V] scores):
 *   rank_i = #{j : j != 0, j not in seen row i, s_ij > s_i,t_i}
 * which is ilora_rank_of of row i with item 0 and the seen items at -inf
 * (the target itself never counts: s_it > s_it is false). s_ij > s_it is
 * computed as clamp((s_ij - s_it) * 1e30 * 1e30, 0, 1): for finite f32
 * scores exactly 1 or 0 (a nonzero f32 difference is at least 2^-149, which
 * the two scalings carry past 1; a flush-to-zero device could miss
 * differences below 2^-126, scores of magnitude < 1e-38). The seen items of
 * row i: min(1, the count of j in seen row i, or j == 0), one scatter-add of
 * ones at the flat positions i * V + j, computed in f32 (exact below 2^24);
 * ids outside [1, V) count as item 0. rank_i = sum_j gt_ij - sum_j gt_ij
 * seen_ij: sums of 0 / 1 values < 2^24, so exact in f32 and equal to
 * ilora_rank_of's. The rows go in chunks of ilora_rank_chunk_elems / V (at
 * least 1), each chunk's [rows, V] temporaries freed before the next: the
 * evaluation's device peak grows by ~7 x 4 MiB, not by 7 of [B, V].
 *   scores  f32 [B, V] (V <= 2^24), any device
 *   target  i64 [B, 1] in [1, V) (the caller clamps), same device
 *   seen    i32 / i64 [B, H] item ids, or NULL (item 0 only), same device
 *   offsets *offsets: f32 [R, 1] of i * V (R >= the chunk's rows) for this V
 *           (one per V), made on the device from one host copy when absent,
 *           too short or on another device (the caller owns it:
 *           pl_tensor_release), so a run uploads it once
 * Returns f32 [B] (a tensor of the current frame), NULL with the error set. */
struct pl_tensor;
/* The most elements of one chunk: 2^20 by default, at most 2^24 (a test
 * lowers it to take the chunked path on small inputs). */
extern int64_t ilora_rank_chunk_elems;
struct pl_tensor *ilora_rank_device(struct pl_tensor *scores, struct pl_tensor *target,
                                    struct pl_tensor *seen, struct pl_tensor **offsets);

/* The k best items of each row of scores [B, V] on its device, with item 0
 * and each row's seen items left out (set to -inf, as ilora_seen_mask does on
 * the host), in ilora_topk's order (pl_topk's: equal scores, lower id first;
 * NaN above every number): `pipeline predict` on a device reads [B, k] back,
 * not [B, V]. The same chunks, seen ids and offsets as ilora_rank_device. A
 * seen item whose logit is +inf or NaN keeps it here (the host sets -inf):
 * only a broken model has one.
 *   k       1 <= k <= V
 *   values  out: f32 [B, k]; ids: out, i64 [B, k]; tensors of the current
 *           frame, NULL on error
 * Errors: PL_ERR_UNSUPPORTED for V > 2^24, pl_topk's and the ops' errors. */
pl_status ilora_topk_device(struct pl_tensor *scores, struct pl_tensor *seen, int64_t k,
                            struct pl_tensor **offsets, struct pl_tensor **values,
                            struct pl_tensor **ids);

#endif
