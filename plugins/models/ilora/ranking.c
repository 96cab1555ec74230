/* ranking.c - rank of a target in a score vector, HR/NDCG@K, top-K. */
#include "ranking.h"

#include <math.h>

int64_t ilora_rank_of(const float *scores, int64_t n, int64_t target) {
    float s = scores[target];
    int64_t r = 0;
    for (int64_t j = 0; j < n; j++)
        r += scores[j] > s;
    return r;
}

double ilora_hit_at(int64_t rank, int64_t k) { return rank < k ? 1.0 : 0.0; }

double ilora_ndcg_at(int64_t rank, int64_t k) {
    return rank < k ? 1.0 / log2((double)rank + 2.0) : 0.0;
}

/* "a ranks before b": higher score, or equal score and lower id. */
static inline int before(float va, int32_t ia, float vb, int32_t ib) {
    return va > vb || (va == vb && ia < ib);
}

/* Min-heap on `before` order: the root is the worst of the kept k. */
static void sift_down(float *v, int32_t *id, int64_t k, int64_t i) {
    for (;;) {
        int64_t l = 2 * i + 1, r = l + 1, w = i;
        if (l < k && before(v[w], id[w], v[l], id[l])) w = l;
        if (r < k && before(v[w], id[w], v[r], id[r])) w = r;
        if (w == i) return;
        float tv = v[i];
        v[i] = v[w];
        v[w] = tv;
        int32_t ti = id[i];
        id[i] = id[w];
        id[w] = ti;
        i = w;
    }
}

void ilora_topk(const float *scores, int64_t n, int64_t k, int32_t *ids, float *vals) {
    if (k <= 0) return;
    if (k > n) k = n;
    for (int64_t j = 0; j < k; j++) {
        vals[j] = scores[j];
        ids[j] = (int32_t)j;
    }
    for (int64_t i = k / 2 - 1; i >= 0; i--)
        sift_down(vals, ids, k, i);
    for (int64_t j = k; j < n; j++) {
        if (before(scores[j], (int32_t)j, vals[0], ids[0])) {
            vals[0] = scores[j];
            ids[0] = (int32_t)j;
            sift_down(vals, ids, k, 0);
        }
    }
    /* heap sort: repeatedly move the worst to the end -> best-first order */
    for (int64_t m = k - 1; m > 0; m--) {
        float tv = vals[0];
        vals[0] = vals[m];
        vals[m] = tv;
        int32_t ti = ids[0];
        ids[0] = ids[m];
        ids[m] = ti;
        sift_down(vals, ids, m, 0);
    }
}
