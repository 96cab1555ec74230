/* ops_index.c - indexing, shape, attention-helper, dropout and fused LSTM ops.
 *
 * Each public function validates its arguments (naming the op and tensor),
 * makes inputs contiguous, allocates outputs, runs the forward kernel of the
 * input's backend and records the node on the tape. Kernels live in
 * cpu/kernels_index.c and cpu/kernels_lstm.c. Index values are range-checked
 * by the kernels before they write anything (PL_ERR_INVALID naming the op
 * and the bad index).
 */
#include <math.h>
#include <string.h>

#include "graph_internal.h"
#include "internal.h"

/* ---- helpers ------------------------------------------------------------ */

/* Data ops (copies) take any dtype but nf4. */
static pl_status check_data(const char *op, const pl_tensor *t) {
    char b[256];
    if (t->dtype == PL_NF4)
        return pl_error_set(PL_ERR_DTYPE,
                            "%s: tensor %s is nf4; this op takes f32/bf16/f16 or integer data", op,
                            pl_tensor_describe(t, b, sizeof b));
    return PL_OK;
}

static int norm_dim(const char *op, const pl_tensor *t, int dim) {
    char b[256];
    int d = pl_tensor_dim(t, dim);
    if (d < 0)
        pl_error_set(PL_ERR_INVALID, "%s: dim %d out of range for %s", op, dim,
                     pl_tensor_describe(t, b, sizeof b));
    return d;
}

/* ---- indexing ----------------------------------------------------------- */

pl_tensor *pl_embedding(pl_tensor *weight, pl_tensor *idx) {
    char b[256];
    if (!weight || !idx) return NULL;
    pl_tensor *ts[2] = {weight, idx};
    if (check_data("embedding", weight) || pl_check_ndim("embedding", weight, 2, 2) ||
        pl_check_index("embedding", idx) || pl_check_same_device("embedding", ts, 2))
        return NULL;
    if (idx->ndim + 1 > PL_MAX_DIMS) {
        pl_error_set(PL_ERR_SHAPE, "embedding: index %s has too many dims (max %d)",
                     pl_tensor_describe(idx, b, sizeof b), PL_MAX_DIMS - 1);
        return NULL;
    }
    int64_t shape[PL_MAX_DIMS];
    memcpy(shape, idx->shape, (size_t)idx->ndim * sizeof(int64_t));
    shape[idx->ndim] = weight->shape[1];
    pl_kernel_args k = {.op = PL_OP_EMBEDDING, .n_in = 2, .n_out = 1};
    k.in[0] = pl_contiguous_owned(weight);
    k.in[1] = pl_contiguous_owned(idx);
    if (!k.in[0] || !k.in[1]) {
        pl_tensors_release(k.in, 2);
        return NULL;
    }
    k.out[0] = pl_tensor_new_owned(weight->dtype, idx->ndim + 1, shape, weight->device);
    return pl_op_finish(&k, NULL, 0);
}

pl_tensor *pl_index_select(pl_tensor *a, int dim, pl_tensor *idx) {
    if (!a || !idx) return NULL;
    pl_tensor *ts[2] = {a, idx};
    if (check_data("index_select", a) || pl_check_index("index_select", idx) ||
        pl_check_ndim("index_select", idx, 1, 1) ||
        pl_check_ndim("index_select", a, 1, PL_MAX_DIMS) ||
        pl_check_same_device("index_select", ts, 2))
        return NULL;
    int d = norm_dim("index_select", a, dim);
    if (d < 0) return NULL;
    int64_t shape[PL_MAX_DIMS];
    memcpy(shape, a->shape, sizeof shape);
    shape[d] = idx->shape[0];
    pl_kernel_args k = {.op = PL_OP_INDEX_SELECT, .n_in = 2, .n_out = 1, .p.dim = d};
    k.in[0] = pl_contiguous_owned(a);
    k.in[1] = pl_contiguous_owned(idx);
    if (!k.in[0] || !k.in[1]) {
        pl_tensors_release(k.in, 2);
        return NULL;
    }
    k.out[0] = pl_tensor_new_owned(a->dtype, a->ndim, shape, a->device);
    return pl_op_finish(&k, NULL, 0);
}

pl_tensor *pl_gather(pl_tensor *a, int dim, pl_tensor *idx) {
    char b1[256], b2[256];
    if (!a || !idx) return NULL;
    pl_tensor *ts[2] = {a, idx};
    if (check_data("gather", a) || pl_check_index("gather", idx) ||
        pl_check_ndim("gather", a, 1, PL_MAX_DIMS) || pl_check_same_device("gather", ts, 2))
        return NULL;
    int d = norm_dim("gather", a, dim);
    if (d < 0) return NULL;
    if (idx->ndim != a->ndim) {
        pl_error_set(PL_ERR_SHAPE, "gather: index %s must have the same number of dims as input %s",
                     pl_tensor_describe(idx, b1, sizeof b1), pl_tensor_describe(a, b2, sizeof b2));
        return NULL;
    }
    for (int i = 0; i < a->ndim; i++)
        if (i != d && idx->shape[i] > a->shape[i]) {
            pl_error_set(PL_ERR_SHAPE, "gather: index %s is larger than input %s in dim %d",
                         pl_tensor_describe(idx, b1, sizeof b1),
                         pl_tensor_describe(a, b2, sizeof b2), i);
            return NULL;
        }
    pl_kernel_args k = {.op = PL_OP_GATHER, .n_in = 2, .n_out = 1, .p.dim = d};
    k.in[0] = pl_contiguous_owned(a);
    k.in[1] = pl_contiguous_owned(idx);
    if (!k.in[0] || !k.in[1]) {
        pl_tensors_release(k.in, 2);
        return NULL;
    }
    k.out[0] = pl_tensor_new_owned(a->dtype, idx->ndim, idx->shape, a->device);
    return pl_op_finish(&k, NULL, 0);
}

pl_tensor *pl_scatter_add(pl_tensor *src, int dim, pl_tensor *idx, int64_t dim_size) {
    char b1[256], b2[256];
    if (!src || !idx) return NULL;
    pl_tensor *ts[2] = {src, idx};
    if (pl_check_float("scatter_add", src, false) || pl_check_index("scatter_add", idx) ||
        pl_check_ndim("scatter_add", idx, 1, 1) ||
        pl_check_ndim("scatter_add", src, 1, PL_MAX_DIMS) ||
        pl_check_same_device("scatter_add", ts, 2))
        return NULL;
    int d = norm_dim("scatter_add", src, dim);
    if (d < 0) return NULL;
    if (idx->shape[0] != src->shape[d]) {
        pl_error_set(PL_ERR_SHAPE, "scatter_add: index %s must have %lld entries (src %s dim %d)",
                     pl_tensor_describe(idx, b1, sizeof b1), (long long)src->shape[d],
                     pl_tensor_describe(src, b2, sizeof b2), d);
        return NULL;
    }
    if (dim_size < 0) {
        pl_error_set(PL_ERR_INVALID, "scatter_add: dim_size %lld must be >= 0",
                     (long long)dim_size);
        return NULL;
    }
    int64_t shape[PL_MAX_DIMS];
    memcpy(shape, src->shape, sizeof shape);
    shape[d] = dim_size;
    pl_kernel_args k = {.op = PL_OP_SCATTER_ADD, .n_in = 2, .n_out = 1, .p.dim = d};
    k.p.shape[0] = dim_size;
    k.in[0] = pl_contiguous_owned(src);
    k.in[1] = pl_contiguous_owned(idx);
    if (!k.in[0] || !k.in[1]) {
        pl_tensors_release(k.in, 2);
        return NULL;
    }
    k.out[0] = pl_tensor_new_owned(src->dtype, src->ndim, shape, src->device);
    return pl_op_finish(&k, NULL, 0);
}

pl_tensor *pl_segment_softmax(pl_tensor *scores, pl_tensor *seg, int64_t num_segments) {
    char b1[256], b2[256];
    if (!scores || !seg) return NULL;
    pl_tensor *ts[2] = {scores, seg};
    if (pl_check_float("segment_softmax", scores, false) ||
        pl_check_index("segment_softmax", seg) || pl_check_ndim("segment_softmax", seg, 1, 1) ||
        pl_check_ndim("segment_softmax", scores, 1, PL_MAX_DIMS) ||
        pl_check_same_device("segment_softmax", ts, 2))
        return NULL;
    if (seg->shape[0] != scores->shape[0]) {
        pl_error_set(PL_ERR_SHAPE,
                     "segment_softmax: segment ids %s must have one entry per row of scores %s",
                     pl_tensor_describe(seg, b1, sizeof b1),
                     pl_tensor_describe(scores, b2, sizeof b2));
        return NULL;
    }
    if (num_segments < 0) {
        pl_error_set(PL_ERR_INVALID, "segment_softmax: num_segments %lld must be >= 0",
                     (long long)num_segments);
        return NULL;
    }
    pl_kernel_args k = {
        .op = PL_OP_SEGMENT_SOFTMAX, .n_in = 2, .n_out = 1, .p.num_segments = num_segments};
    k.in[0] = pl_contiguous_owned(scores);
    k.in[1] = pl_contiguous_owned(seg);
    if (!k.in[0] || !k.in[1]) {
        pl_tensors_release(k.in, 2);
        return NULL;
    }
    k.out[0] = pl_tensor_new_owned(scores->dtype, scores->ndim, scores->shape, scores->device);
    /* backward needs the output y: grad_s = y * (g - sum_seg(g * y)) */
    pl_tensor *out = k.out[0];
    return pl_op_finish(&k, &out, 1);
}

/* ---- dropout -------------------------------------------------------------- */

/* ops.h: the k largest per row, no autograd (nothing recorded) */
pl_status pl_topk(pl_tensor *x, int64_t k, pl_tensor **values, pl_tensor **indices) {
    char b[256];
    if (!values || !indices) return pl_error_set(PL_ERR_INVALID, "topk: NULL output pointer");
    *values = *indices = NULL;
    if (!x) return pl_error_set(PL_ERR_INVALID, "topk: NULL input");
    pl_status st = pl_check_float("topk", x, true);
    if (!st) st = pl_check_ndim("topk", x, 1, PL_MAX_DIMS);
    int64_t sh[PL_MAX_DIMS], V = st ? 0 : x->shape[x->ndim - 1];
    if (st || k < 1 || k > V)
        return st ? st : pl_error_set(PL_ERR_INVALID, "topk: k = %lld for %s; expected 1 <= k <= "
                                      "%lld (the last dim)", (long long)k,
                                      pl_tensor_describe(x, b, sizeof b), (long long)V);
    memcpy(sh, x->shape, sizeof sh);
    sh[x->ndim - 1] = k;
    pl_kernel_args a = {.op = PL_OP_TOPK, .n_in = 1, .n_out = 2, .p.start = k};
    a.in[0] = pl_contiguous_owned(x);
    a.out[0] = pl_tensor_new_owned(x->dtype, x->ndim, sh, x->device);
    a.out[1] = pl_tensor_new_owned(PL_I64, x->ndim, sh, x->device);
    st = a.in[0] && a.out[0] && a.out[1] ? pl_kernel_forward(&a) : PL_ERR_NOMEM;
    pl_tensor_release(a.in[0]);
    if (st) pl_tensors_release(a.out, 2);
    if (!st) *values = pl_op_result(a.out[0]);
    if (!st) *indices = pl_op_result(a.out[1]);
    return st;
}

pl_tensor *pl_dropout(pl_tensor *a, double p, uint64_t seed, uint64_t counter, bool training) {
    if (!a) return NULL;
    if (pl_check_float("dropout", a, true)) return NULL;
    if (!(p >= 0.0 && p <= 1.0)) {
        pl_error_set(PL_ERR_INVALID, "dropout: probability %g outside [0, 1]", p);
        return NULL;
    }
    if (!training || p == 0.0) return pl_op_result(pl_tensor_retain(a));
    pl_kernel_args k = {.op = PL_OP_DROPOUT,
                        .n_in = 1,
                        .n_out = 2,
                        .p.alpha = p,
                        .p.seed = seed,
                        .p.counter = counter};
    if (pl_graph_dropout_active()) {
        /* a captured graph's dropout: the kernel adds p.start * (*delta) to the
         * counter, delta being the micro-steps since the capture (graph.h) */
        int64_t stride = 0;
        pl_tensor *delta = pl_graph_dropout_offset(counter, &stride);
        if (!delta && pl_graph_capturing()) return NULL;
        k.p.extra = delta;
        k.p.start = stride;
    }
    k.in[0] = pl_contiguous_owned(a);
    if (!k.in[0]) return NULL;
    k.out[0] = pl_tensor_new_owned(a->dtype, a->ndim, a->shape, a->device);
    k.out[1] = pl_tensor_new_owned(PL_U8, a->ndim, a->shape, a->device);
    pl_tensor *mask = k.out[1];
    return pl_op_finish(&k, &mask, 1);
}

/* ---- shape ops -------------------------------------------------------------- */

/* Concat of at most PL_MAX_OP_INPUTS - 1 tensors (backward args hold the
 * gradient plus every input). */
static pl_tensor *concat_small(pl_tensor *const *ts, int n, int d) {
    char b1[256], b2[256];
    int64_t shape[PL_MAX_DIMS];
    memcpy(shape, ts[0]->shape, sizeof shape);
    shape[d] = 0;
    for (int i = 0; i < n; i++) {
        const pl_tensor *t = ts[i];
        if (t->ndim != ts[0]->ndim || t->dtype != ts[0]->dtype) {
            pl_error_set(
                PL_ERR_SHAPE, "concat: tensor %d %s does not match tensor 0 %s in rank/dtype", i,
                pl_tensor_describe(t, b1, sizeof b1), pl_tensor_describe(ts[0], b2, sizeof b2));
            return NULL;
        }
        for (int j = 0; j < t->ndim; j++)
            if (j != d && t->shape[j] != ts[0]->shape[j]) {
                pl_error_set(PL_ERR_SHAPE,
                             "concat: tensor %d %s differs from tensor 0 %s in dim %d", i,
                             pl_tensor_describe(t, b1, sizeof b1),
                             pl_tensor_describe(ts[0], b2, sizeof b2), j);
                return NULL;
            }
        shape[d] += t->shape[d];
    }
    if (n == 1) return pl_op_result(pl_tensor_retain(ts[0]));
    pl_kernel_args k = {.op = PL_OP_CONCAT, .n_in = n, .n_out = 1, .p.dim = d, .p.start = n};
    bool ok = true;
    for (int i = 0; i < n; i++) {
        k.in[i] = pl_contiguous_owned(ts[i]);
        ok = ok && k.in[i];
    }
    if (!ok) {
        pl_tensors_release(k.in, n);
        return NULL;
    }
    k.out[0] = pl_tensor_new_owned(ts[0]->dtype, ts[0]->ndim, shape, ts[0]->device);
    return pl_op_finish(&k, NULL, 0);
}

pl_tensor *pl_concat(pl_tensor *const *ts, int n, int dim) {
    if (!ts || n <= 0) {
        pl_error_set(PL_ERR_INVALID, "concat: need at least one tensor (got %d)", n);
        return NULL;
    }
    for (int i = 0; i < n; i++)
        if (!ts[i]) return NULL;
    for (int i = 0; i < n; i++)
        if (check_data("concat", ts[i])) return NULL;
    if (pl_check_same_device("concat", ts, n)) return NULL;
    int d = norm_dim("concat", ts[0], dim);
    if (d < 0) return NULL;
    const int group = PL_MAX_OP_INPUTS - 1;
    if (n <= group) return concat_small(ts, n, d);
    /* More inputs than one node can hold: concat groups, then the groups.
     * A private frame owns the partial results. */
    int ng = (n + group - 1) / group;
    pl_tensor *parts[ng];
    pl_tensor *res = NULL;
    pl_frame_begin();
    bool ok = true;
    for (int g = 0; g < ng && ok; g++) {
        int cnt = n - g * group < group ? n - g * group : group;
        parts[g] = concat_small(ts + g * group, cnt, d);
        ok = parts[g] != NULL;
    }
    if (ok) res = pl_tensor_retain(pl_concat(parts, ng, d));
    pl_frame_end();
    return res ? pl_op_result(res) : NULL;
}

pl_status pl_split(pl_tensor *a, int dim, const int64_t *sizes, int n, pl_tensor **outs) {
    char b[256];
    if (!outs || n <= 0 || !sizes)
        return pl_error_set(PL_ERR_INVALID, "split: need n > 0 sizes and outputs (got n = %d)", n);
    for (int i = 0; i < n; i++)
        outs[i] = NULL;
    if (!a)
        return pl_error_status() ? pl_error_status()
                                 : pl_error_set(PL_ERR_INVALID, "split: NULL tensor");
    if (check_data("split", a)) return PL_ERR_DTYPE;
    int d = norm_dim("split", a, dim);
    if (d < 0) return PL_ERR_INVALID;
    int64_t total = 0;
    for (int i = 0; i < n; i++) {
        if (sizes[i] < 0)
            return pl_error_set(PL_ERR_INVALID, "split: size %d is negative (%lld)", i,
                                (long long)sizes[i]);
        total += sizes[i];
    }
    if (total != a->shape[d])
        return pl_error_set(PL_ERR_SHAPE, "split: sizes sum to %lld but %s has %lld in dim %d",
                            (long long)total, pl_tensor_describe(a, b, sizeof b),
                            (long long)a->shape[d], d);
    int64_t start = 0;
    for (int i = 0; i < n; i++) {
        outs[i] = pl_slice(a, d, start, start + sizes[i]);
        if (!outs[i]) return pl_error_status();
        start += sizes[i];
    }
    return PL_OK;
}

pl_tensor *pl_slice(pl_tensor *a, int dim, int64_t start, int64_t end) {
    char b[256];
    if (!a) return NULL;
    if (check_data("slice", a) || pl_check_ndim("slice", a, 1, PL_MAX_DIMS)) return NULL;
    int d = norm_dim("slice", a, dim);
    if (d < 0) return NULL;
    int64_t n = a->shape[d];
    if (start < 0) start += n;
    if (end < 0) end += n;
    if (start < 0 || end > n || start > end) {
        pl_error_set(PL_ERR_INVALID, "slice: range [%lld, %lld) out of bounds for %s dim %d",
                     (long long)start, (long long)end, pl_tensor_describe(a, b, sizeof b), d);
        return NULL;
    }
    int64_t shape[PL_MAX_DIMS];
    memcpy(shape, a->shape, sizeof shape);
    shape[d] = end - start;
    pl_kernel_args k = {
        .op = PL_OP_SLICE, .n_in = 1, .n_out = 1, .p.dim = d, .p.start = start, .p.end = end};
    k.in[0] = pl_contiguous_owned(a);
    if (!k.in[0]) return NULL;
    k.out[0] = pl_tensor_new_owned(a->dtype, a->ndim, shape, a->device);
    return pl_op_finish(&k, NULL, 0);
}

pl_tensor *pl_permute(pl_tensor *a, const int *perm) {
    char b[256];
    if (!a) return NULL;
    if (check_data("permute", a)) return NULL;
    if (!perm) {
        pl_error_set(PL_ERR_INVALID, "permute: NULL permutation");
        return NULL;
    }
    bool seen[PL_MAX_DIMS] = {false};
    pl_kernel_args k = {.op = PL_OP_PERMUTE, .n_in = 1, .n_out = 1};
    int64_t shape[PL_MAX_DIMS];
    for (int i = 0; i < a->ndim; i++) {
        int p = perm[i] < 0 ? perm[i] + a->ndim : perm[i];
        if (p < 0 || p >= a->ndim || seen[p]) {
            pl_error_set(PL_ERR_INVALID,
                         "permute: entry %d (%d) is not a valid permutation of the %d dims of %s",
                         i, perm[i], a->ndim, pl_tensor_describe(a, b, sizeof b));
            return NULL;
        }
        seen[p] = true;
        k.p.perm[i] = p;
        shape[i] = a->shape[p];
    }
    k.p.ndim = a->ndim;
    k.in[0] = pl_contiguous_owned(a);
    if (!k.in[0]) return NULL;
    k.out[0] = pl_tensor_new_owned(a->dtype, a->ndim, shape, a->device);
    return pl_op_finish(&k, NULL, 0);
}

pl_tensor *pl_transpose(pl_tensor *a, int d0, int d1) {
    if (!a) return NULL;
    int e0 = norm_dim("transpose", a, d0);
    if (e0 < 0) return NULL;
    int e1 = norm_dim("transpose", a, d1);
    if (e1 < 0) return NULL;
    int perm[PL_MAX_DIMS];
    for (int i = 0; i < a->ndim; i++)
        perm[i] = i;
    perm[e0] = e1;
    perm[e1] = e0;
    return pl_permute(a, perm);
}

pl_tensor *pl_reshape(pl_tensor *a, int ndim, const int64_t *shape) {
    char b[256];
    if (!a) return NULL;
    if (check_data("reshape", a)) return NULL;
    if (ndim < 0 || ndim > PL_MAX_DIMS || (ndim > 0 && !shape)) {
        pl_error_set(PL_ERR_SHAPE, "reshape: rank %d out of range [0, %d]", ndim, PL_MAX_DIMS);
        return NULL;
    }
    int64_t sh[PL_MAX_DIMS], known = 1, numel = pl_tensor_numel(a);
    int infer = -1;
    for (int i = 0; i < ndim; i++) {
        sh[i] = shape[i];
        if (sh[i] == -1) {
            if (infer >= 0) {
                pl_error_set(PL_ERR_SHAPE, "reshape: more than one -1 in the new shape of %s",
                             pl_tensor_describe(a, b, sizeof b));
                return NULL;
            }
            infer = i;
        } else if (sh[i] < 0) {
            pl_error_set(PL_ERR_SHAPE, "reshape: negative size %lld in dim %d", (long long)sh[i],
                         i);
            return NULL;
        } else {
            known *= sh[i];
        }
    }
    if (infer >= 0) {
        if (known == 0 || numel % known) {
            pl_error_set(PL_ERR_SHAPE, "reshape: cannot infer dim %d of %s from the other sizes",
                         infer, pl_tensor_describe(a, b, sizeof b));
            return NULL;
        }
        sh[infer] = numel / known;
        known *= sh[infer];
    }
    if (known != numel) {
        pl_error_set(PL_ERR_SHAPE, "reshape: %s has %lld elements, new shape has %lld",
                     pl_tensor_describe(a, b, sizeof b), (long long)numel, (long long)known);
        return NULL;
    }
    pl_tensor *x = pl_contiguous_owned(a);
    if (!x) return NULL;
    pl_tensor *v = pl_tensor_view_owned(x);
    if (!v) {
        pl_tensor_release(x);
        return NULL;
    }
    v->ndim = ndim;
    int64_t s = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        v->shape[i] = sh[i];
        v->stride[i] = s;
        s *= sh[i];
    }
    for (int i = ndim; i < PL_MAX_DIMS; i++)
        v->shape[i] = v->stride[i] = 0;
    pl_op_params p = {.ndim = ndim};
    memcpy(p.shape, sh, sizeof sh);
    /* a view: no forward kernel runs, the node only maps the gradient back */
    pl_status st = pl_autograd_record(PL_OP_RESHAPE, &p, &x, 1, NULL, 0, v);
    pl_tensor_release(x);
    if (st) {
        pl_tensor_release(v);
        return NULL;
    }
    return pl_op_result(v);
}

pl_tensor *pl_contiguous(pl_tensor *a) {
    if (!a) return NULL;
    if (pl_tensor_is_contiguous(a)) return pl_op_result(pl_tensor_retain(a));
    if (check_data("contiguous", a)) return NULL;
    pl_kernel_args k = {.op = PL_OP_COPY, .n_in = 1, .n_out = 1};
    k.in[0] = pl_tensor_retain(a); /* the copy kernel reads strided input */
    k.out[0] = pl_tensor_new_owned(a->dtype, a->ndim, a->shape, a->device);
    return pl_op_finish(&k, NULL, 0);
}

/* ---- attention helpers ------------------------------------------------------- */

pl_tensor *pl_rope(pl_tensor *x, int64_t pos_offset, double theta) {
    char b[256];
    if (!x) return NULL;
    if (pl_check_float("rope", x, true) || pl_check_ndim("rope", x, 4, 4)) return NULL;
    if (x->shape[3] % 2) {
        pl_error_set(PL_ERR_SHAPE, "rope: head dim of %s must be even",
                     pl_tensor_describe(x, b, sizeof b));
        return NULL;
    }
    if (!(theta > 0.0) || pos_offset < 0) {
        pl_error_set(PL_ERR_INVALID, "rope: theta %g must be > 0 and pos_offset %lld >= 0", theta,
                     (long long)pos_offset);
        return NULL;
    }
    pl_kernel_args k = {
        .op = PL_OP_ROPE, .n_in = 1, .n_out = 1, .p.alpha = theta, .p.start = pos_offset};
    k.in[0] = pl_contiguous_owned(x);
    if (!k.in[0]) return NULL;
    k.out[0] = pl_tensor_new_owned(x->dtype, x->ndim, x->shape, x->device);
    return pl_op_finish(&k, NULL, 0);
}

pl_tensor *pl_causal_softmax(pl_tensor *scores, double scale) {
    char b[256];
    if (!scores) return NULL;
    if (pl_check_float("causal_softmax", scores, true) ||
        pl_check_ndim("causal_softmax", scores, 2, PL_MAX_DIMS))
        return NULL;
    int nd = scores->ndim;
    if (scores->shape[nd - 1] < scores->shape[nd - 2]) {
        pl_error_set(PL_ERR_SHAPE, "causal_softmax: scores %s need S >= T in the last two dims",
                     pl_tensor_describe(scores, b, sizeof b));
        return NULL;
    }
    pl_kernel_args k = {.op = PL_OP_CAUSAL_SOFTMAX, .n_in = 1, .n_out = 1, .p.alpha = scale};
    k.in[0] = pl_contiguous_owned(scores);
    if (!k.in[0]) return NULL;
    k.out[0] = pl_tensor_new_owned(scores->dtype, nd, scores->shape, scores->device);
    pl_tensor *out = k.out[0];
    return pl_op_finish(&k, &out, 1);
}

/* pl_attention's shape checks (ops.h): q [B, H, T, Dh], k and v [B, KV, L, Dh],
 * bias [B or 1, 1, 1, L]. */
static bool attention_shapes_ok(pl_tensor *q, pl_tensor *k, pl_tensor *v, pl_tensor *bias,
                                bool causal) {
    char bq[200], bk[200], bv[200];
    pl_tensor_describe(q, bq, sizeof bq);
    pl_tensor_describe(k, bk, sizeof bk);
    pl_tensor_describe(v, bv, sizeof bv);
    if (q->ndim != 4 || k->ndim != 4 || v->ndim != 4) {
        pl_error_set(PL_ERR_SHAPE,
                     "attention: q %s, k %s, v %s: expected [B, H, T, Dh], [B, KV, L, Dh], "
                     "[B, KV, L, Dh]",
                     bq, bk, bv);
        return false;
    }
    if (!pl_tensor_same_shape(k, v) || k->shape[0] != q->shape[0] || k->shape[3] != q->shape[3] ||
        q->shape[3] < 1) {
        pl_error_set(PL_ERR_SHAPE,
                     "attention: q %s, k %s, v %s: k and v must have one shape [B, KV, L, Dh] "
                     "with q's B and Dh (Dh >= 1)",
                     bq, bk, bv);
        return false;
    }
    int64_t H = q->shape[1], KV = k->shape[1], T = q->shape[2], L = k->shape[2];
    if (KV < 1 || H % KV) {
        pl_error_set(PL_ERR_SHAPE,
                     "attention: q %s has %lld heads, k %s %lld kv heads: H must be a multiple "
                     "of KV",
                     bq, (long long)H, bk, (long long)KV);
        return false;
    }
    if (causal && T > L) {
        pl_error_set(PL_ERR_SHAPE,
                     "attention: causal needs T <= L (the queries are the last T of the L "
                     "positions); q %s has T %lld, k %s L %lld",
                     bq, (long long)T, bk, (long long)L);
        return false;
    }
    if (bias && (bias->ndim != 4 || (bias->shape[0] != 1 && bias->shape[0] != q->shape[0]) ||
                 bias->shape[1] != 1 || bias->shape[2] != 1 || bias->shape[3] != L)) {
        char bb[200];
        pl_error_set(
            PL_ERR_SHAPE, "attention: bias %s must be [%lld or 1, 1, 1, %lld] (keys of k %s)",
            pl_tensor_describe(bias, bb, sizeof bb), (long long)q->shape[0], (long long)L, bk);
        return false;
    }
    return true;
}

pl_tensor *pl_attention(pl_tensor *q, pl_tensor *k, pl_tensor *v, pl_tensor *bias, double scale,
                        bool causal) {
    char b1[200], b2[200];
    if (!q || !k || !v) {
        pl_error_set(PL_ERR_INVALID, "attention: %s is NULL", !q ? "q" : !k ? "k" : "v");
        return NULL;
    }
    pl_tensor *ts[4] = {q, k, v, bias};
    int n = bias ? 4 : 3;
    for (int i = 0; i < n; i++)
        if (pl_check_float("attention", ts[i], true)) return NULL;
    if (pl_check_same_device("attention", ts, n)) return NULL;
    if (k->dtype != q->dtype || v->dtype != q->dtype) {
        pl_error_set(PL_ERR_DTYPE, "attention: q %s, k and v %s must have one dtype",
                     pl_tensor_describe(q, b1, sizeof b1),
                     pl_tensor_describe(k->dtype != q->dtype ? k : v, b2, sizeof b2));
        return NULL;
    }
    if (!attention_shapes_ok(q, k, v, bias, causal)) return NULL;
    if (!isfinite(scale)) {
        pl_error_set(PL_ERR_INVALID, "attention: scale %g is not finite", scale);
        return NULL;
    }
    if (bias && bias->requires_grad) {
        pl_error_set(PL_ERR_INVALID,
                     "attention: bias %s requires a gradient; it is a fixed additive mask "
                     "(compute it under pl_no_grad_begin)",
                     pl_tensor_describe(bias, b1, sizeof b1));
        return NULL;
    }
    pl_kernel_args kk = {.op = PL_OP_ATTENTION, .n_in = n, .n_out = 2, .p.alpha = scale};
    kk.p.flags = causal ? 1 : 0;
    for (int i = 0; i < n; i++) {
        kk.in[i] = pl_contiguous_owned(ts[i]);
        if (!kk.in[i]) {
            pl_tensors_release(kk.in, i);
            return NULL;
        }
    }
    kk.out[0] = pl_tensor_new_owned(q->dtype, 4, q->shape, q->device);
    kk.out[1] = pl_tensor_new_owned(PL_F32, 3, q->shape, q->device); /* [B, H, T] */
    /* the node saves its output and the logsumexp (ops.def: saves_out, 1 saved) */
    return pl_op_finish(&kk, kk.out, 2);
}

pl_tensor *pl_contiguous_owned(pl_tensor *t) {
    if (!t) return NULL;
    if (pl_tensor_is_contiguous(t)) return pl_tensor_retain(t);
    if (t->requires_grad) {
        /* differentiable copy (ops_index.c); adopted by the frame, so retain */
        pl_tensor *c = pl_contiguous(t);
        return pl_tensor_retain(c);
    }
    pl_tensor *c = pl_tensor_new_owned(t->dtype, t->ndim, t->shape, t->device);
    if (!c) return NULL;
    pl_kernel_args k = {.op = PL_OP_COPY, .n_in = 1, .in = {t}, .n_out = 1, .out = {c}};
    if (pl_kernel_forward(&k)) {
        pl_tensor_release(c);
        return NULL;
    }
    return c;
}

/* ---- cast ------------------------------------------------------------------- */

pl_tensor *pl_cast(pl_tensor *a, pl_dtype dt) {
    if (!a) return NULL;
    if (pl_check_float("cast", a, true)) return NULL;
    if (!pl_dtype_is_float(dt) || dt == PL_NF4) {
        pl_error_set(PL_ERR_DTYPE, "cast: target dtype %s is not a float dtype (f32/bf16/f16)",
                     pl_dtype_name(dt));
        return NULL;
    }
    if (a->dtype == dt) return pl_op_result(pl_tensor_retain(a));
    pl_kernel_args k = {.op = PL_OP_CAST, .n_in = 1, .n_out = 1};
    k.p.dtype = dt;
    if (!(k.in[0] = pl_contiguous_owned(a))) return NULL;
    k.out[0] = pl_tensor_new_owned(dt, a->ndim, a->shape, a->device);
    bool keep_out = pl_autograd_saves_output(k.op);
    return pl_op_finish(&k, k.out + !keep_out, k.n_out - !keep_out);
}
