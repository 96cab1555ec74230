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

/* scores [n]; target in [0, n). Returns the strict-greater count. */
int64_t ilora_rank_of(const float *scores, int64_t n, int64_t target);
double ilora_hit_at(int64_t rank, int64_t k);
double ilora_ndcg_at(int64_t rank, int64_t k);

/* The k best entries of scores [n] (k <= n), written to ids/vals in
 * descending score order; equal scores: lower index first. -inf entries are
 * only picked when fewer than k finite ones exist. O(n log k). */
void ilora_topk(const float *scores, int64_t n, int64_t k, int32_t *ids, float *vals);

#endif
