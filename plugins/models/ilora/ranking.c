/* ranking.c - rank of a target in a score vector, HR/NDCG@K, top-K. */
#include "ranking.h"

#include <math.h>
#include <stdlib.h>

#include "pipeline/kernel_math.h"
#include "pipeline/pipeline.h"

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

/* pl_topk's order (kernel_math.h): the export's top-K on a device and this
 * one agree; before it, a NaN's rank hung on its position */
PL_TOPK_SELECT_DEFINE(topk_select, int32_t)

void ilora_topk(const float *scores, int64_t n, int64_t k, int32_t *ids, float *vals) {
    if (k <= 0) return;
    topk_select(scores, n, k > n ? n : k, vals, ids);
}

/* ---- the ranks on the device (ranking.h) ---- */

/* *offsets as f32 [>= n, 1] of i * V on dev: one host copy when it must grow. */
static pl_tensor *row_offsets(pl_tensor **offsets, int64_t n, int64_t V, pl_device dev) {
    pl_tensor *o = *offsets;
    if (o && (o->shape[0] < n || !pl_device_eq(o->device, dev))) {
        pl_tensor_release(o);
        *offsets = o = NULL;
    }
    if (!o) {
        float *v = malloc((size_t)n * sizeof *v);
        if (!v) {
            pl_error_set(PL_ERR_NOMEM, "ilora: out of memory for the ranking's row offsets");
            return NULL;
        }
        for (int64_t i = 0; i < n; i++)
            v[i] = (float)(i * V);
        pl_frame_begin();
        o = pl_tensor_from_data(PL_F32, 2, (int64_t[]){n, 1}, v, dev);
        if (o) pl_frame_keep(o);
        pl_frame_end();
        free(v);
        if (!o) return NULL;
        *offsets = o;
    }
    return pl_tensor_view_rows(o, 0, n);
}

/* [n * V] f32 of rows [n, V]: per element the count of the row's seen items
 * (ids outside [1, V) count as item 0) and item 0 at it (one chunk: n * V <=
 * 2^24, positions exact in f32) */
static pl_tensor *seen_counts(pl_tensor *seen, pl_tensor *off, int64_t n, int64_t V,
                              pl_device dev) {
    pl_tensor *pos = pl_reshape(off, 1, (int64_t[]){n}); /* item 0 of every row */
    if (seen) {
        int64_t H = seen->shape[1];
        pl_tensor *hf = pl_tensor_to(seen, PL_F32, dev);
        /* 1 for an id in [1, V), else 0 (ids are integers) */
        pl_tensor *ok = pl_mul(pl_clamp(hf, 0.0, 1.0),
                               pl_clamp(pl_add_scalar(pl_scale(hf, -1.0), (double)V), 0.0, 1.0));
        pl_tensor *p = pl_reshape(pl_add(pl_mul(hf, ok), off), 1, (int64_t[]){n * H});
        pos = pl_concat((pl_tensor *[]){p, pos}, 2, 0);
    }
    pl_tensor *pi = pos ? pl_tensor_to(pos, PL_I64, dev) : NULL;
    pl_tensor *one = pi ? pl_tensor_full(PL_F32, 1, pi->shape, 1.0, dev) : NULL;
    return one ? pl_scatter_add(one, 0, pi, n * V) : NULL;
}

/* One chunk's result, rows [n, V] (n * V <= 2^24), a tensor of the caller's
 * frame with its temporaries freed; tc (targets) or k as the function needs. */
typedef pl_tensor *(*chunk_fn)(pl_tensor *lg, pl_tensor *tc, pl_tensor *seen, pl_tensor *off,
                               int64_t k);

/* ranks of a chunk: f32 [n] */
static pl_tensor *rank_chunk(pl_tensor *lg, pl_tensor *tc, pl_tensor *seen, pl_tensor *off,
                             int64_t k) {
    (void)k;
    int64_t n = lg->shape[0], V = lg->shape[1];
    pl_frame_begin();
    pl_tensor *ts = pl_gather(lg, 1, tc); /* [n, 1]: the target's score */
    pl_tensor *gt = pl_clamp(pl_scale(pl_scale(pl_sub(lg, ts), 1e30), 1e30), 0.0, 1.0);
    pl_tensor *cnt = seen_counts(seen, off, n, V, lg->device);
    pl_tensor *out = NULL;
    if (gt && cnt) { /* the items above the target, less the seen ones among them */
        pl_tensor *left = pl_mul(gt, pl_reshape(pl_clamp(cnt, 0.0, 1.0), 2, (int64_t[]){n, V}));
        out = pl_sub(pl_sum(gt, 1, false), pl_sum(left, 1, false));
    }
    return pl_frame_end_keep(out);
}

/* top-k of a chunk: item 0 and the seen items -inf, then pl_topk; f32 [n, 2k],
 * values then ids (exact in f32: ids < V <= 2^24) */
static pl_tensor *topk_chunk(pl_tensor *lg, pl_tensor *tc, pl_tensor *seen, pl_tensor *off,
                             int64_t k) {
    (void)tc;
    int64_t n = lg->shape[0], V = lg->shape[1];
    pl_frame_begin();
    pl_tensor *cnt = seen_counts(seen, off, n, V, lg->device), *v = NULL, *ix = NULL;
    /* s: -3e38 at a masked item, -0 elsewhere; (lg + s) + s is lg exactly where
     * s = -0, and overflows to -inf where s = -3e38 (for any logit below 3e38) */
    pl_tensor *sm = cnt ? pl_reshape(pl_scale(pl_clamp(cnt, 0.0, 1.0), -3e38), 2,
                                     (int64_t[]){n, V})
                        : NULL;
    pl_tensor *x = sm ? pl_add(pl_add(lg, sm), sm) : NULL;
    pl_tensor *r = x && !pl_topk(x, k, &v, &ix)
                       ? pl_concat((pl_tensor *[]){v, pl_tensor_to(ix, PL_F32, ix->device)}, 2, 1)
                       : NULL;
    return pl_frame_end_keep(r);
}

int64_t ilora_rank_chunk_elems = 1 << 20;

/* fn over scores [B, V] in chunks of ilora_rank_chunk_elems / V rows (at
 * least 1; row views, no copies), the results concatenated along rows; what
 * names the work in the error for V > 2^24 */
static pl_tensor *by_chunks(pl_tensor *scores, pl_tensor *tc, pl_tensor *seen, pl_tensor **offsets,
                            int64_t k, chunk_fn fn, const char *what) {
    int64_t B = scores->shape[0], V = scores->shape[1];
    if (V > (1 << 24)) {
        pl_error_set(PL_ERR_UNSUPPORTED, "ilora: %s of %lld items (at most 2^24)", what,
                     (long long)V);
        return NULL;
    }
    int64_t cap = ilora_rank_chunk_elems < (1 << 24) ? ilora_rank_chunk_elems : (1 << 24);
    int64_t rows = cap / V < 1 ? 1 : cap / V < B ? cap / V : B;
    pl_tensor *off = row_offsets(offsets, rows, V, scores->device);
    if (!off || B <= rows) return off ? fn(scores, tc, seen, off, k) : NULL;
    int64_t nc = (B + rows - 1) / rows, c = 0;
    pl_tensor **part = calloc((size_t)nc, sizeof *part), *r = NULL;
    if (!part) {
        pl_error_set(PL_ERR_NOMEM, "ilora: out of memory");
        return NULL;
    }
    for (int64_t r0 = 0; r0 < B; r0 += rows, c++) {
        int64_t len = r0 + rows < B ? rows : B - r0;
        part[c] = fn(pl_tensor_view_rows(scores, r0, len),
                     tc ? pl_tensor_view_rows(tc, r0, len) : NULL,
                     seen ? pl_tensor_view_rows(seen, r0, len) : NULL,
                     pl_tensor_view_rows(off, 0, len), k);
        if (!part[c]) break;
    }
    if (c == nc) r = pl_concat(part, (int)nc, 0);
    free(part);
    return r;
}

pl_tensor *ilora_rank_device(pl_tensor *scores, pl_tensor *target, pl_tensor *seen,
                             pl_tensor **offsets) {
    if (!scores || !target) return NULL;
    return by_chunks(scores, target, seen, offsets, 0, rank_chunk, "device ranking");
}

pl_status ilora_topk_device(pl_tensor *scores, pl_tensor *seen, int64_t k, pl_tensor **offsets,
                            pl_tensor **values, pl_tensor **ids) {
    *values = *ids = NULL;
    if (!scores) return pl_error_status();
    pl_tensor *all = by_chunks(scores, NULL, seen, offsets, k, topk_chunk, "device top-k");
    *values = all ? pl_slice(all, 1, 0, k) : NULL;
    *ids = all ? pl_tensor_to(pl_slice(all, 1, k, 2 * k), PL_I64, all->device) : NULL;
    if (*values && *ids) return PL_OK;
    *values = *ids = NULL;
    return pl_error_status();
}
