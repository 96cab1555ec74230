/* Indexing, shape, dropout, rope, causal softmax and fused LSTM ops:
 * forward against hand-computed values or formulas written out here,
 * gradients by central differences (pl_gradcheck) on odd shapes, and
 * pl_lstm against torch.nn.LSTM (tests/data/lstm_reference.h, written by
 * tools/gen_lstm_reference.py). */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "pl_test.h"

#include "../data/lstm_reference.h"

#define EPS 1e-2
#define ATOL 2e-3
#define RTOL 2e-2

static pl_tensor *f32(int ndim, const int64_t *shape, const float *data) {
    return pl_tensor_from_data(PL_F32, ndim, shape, data, PL_CPU);
}
static pl_tensor *i64(int ndim, const int64_t *shape, const int64_t *data) {
    return pl_tensor_from_data(PL_I64, ndim, shape, data, PL_CPU);
}
static pl_tensor *param(pl_tensor *t) {
    pl_tensor_set_requires_grad(t, true);
    return t;
}

static void expect_values(const pl_tensor *t, const float *want, int64_t n, double tol,
                          const char *what) {
    ck_assert_msg(t != NULL, "%s: NULL tensor (%s)", what, pl_error_message());
    ck_assert_msg(pl_tensor_numel(t) == n, "%s: %lld elements, expected %lld", what,
                  (long long)pl_tensor_numel(t), (long long)n);
    for (int64_t i = 0; i < n; i++) {
        double v = pl_tensor_get(t, i);
        ck_assert_msg(fabs(v - want[i]) <= tol, "%s[%lld] = %.8g, expected %.8g", what,
                      (long long)i, v, (double)want[i]);
    }
}

static void gradcheck(pl_test_fn f, pl_tensor **in, int n, void *ctx, const char *what) {
    char msg[512];
    bool ok = pl_gradcheck(f, in, n, ctx, EPS, ATOL, RTOL, msg, sizeof msg);
    ck_assert_msg(ok, "%s: %s", what, msg);
}

/* loss = sum(y * r) and backward; leaves' .grad filled */
static void backward_weighted(pl_tensor *y, pl_tensor *r) {
    pl_tensor *loss = pl_sum(pl_mul(y, r), PL_ALL_DIMS, false);
    PL_CK_OK(pl_backward(loss, 1.0));
}

/* ---- embedding ------------------------------------------------------------------ */

START_TEST(embedding_picks_rows_for_i64_i32_and_bf16) {
    pl_frame_begin();
    float w[12];
    for (int i = 0; i < 12; i++)
        w[i] = (float)i;
    pl_tensor *wt = f32(PL_SHAPE(4, 3), w);
    pl_tensor *ix = i64(PL_SHAPE(2, 2), (int64_t[]){3, 0, 1, 3});
    pl_tensor *y = pl_embedding(wt, ix);
    ck_assert_int_eq(y->ndim, 3);
    ck_assert_int_eq(y->shape[2], 3);
    expect_values(y, (float[]){9, 10, 11, 0, 1, 2, 3, 4, 5, 9, 10, 11}, 12, 0, "embedding i64");
    int32_t i32d[3] = {2, 2, 0};
    pl_tensor *ix32 = pl_tensor_from_data(PL_I32, PL_SHAPE(3), i32d, PL_CPU);
    expect_values(pl_embedding(wt, ix32), (float[]){6, 7, 8, 6, 7, 8, 0, 1, 2}, 9, 0,
                  "embedding i32");
    pl_tensor *wb = pl_tensor_to(wt, PL_BF16, PL_CPU);
    pl_tensor *yb = pl_embedding(wb, ix32);
    ck_assert_int_eq(yb->dtype, PL_BF16);
    expect_values(yb, (float[]){6, 7, 8, 6, 7, 8, 0, 1, 2}, 9, 0, "embedding bf16");
    pl_frame_end();
}
END_TEST

START_TEST(embedding_rejects_out_of_range_index) {
    pl_frame_begin();
    pl_tensor *wt = pl_test_randn(PL_SHAPE(4, 3), 1);
    pl_tensor *ix = i64(PL_SHAPE(3), (int64_t[]){1, 7, 0});
    ck_assert_ptr_null(pl_embedding(wt, ix));
    ck_assert_int_eq(pl_error_status(), PL_ERR_INVALID);
    ck_assert_msg(strstr(pl_error_message(), "embedding") && strstr(pl_error_message(), "7"),
                  "message: %s", pl_error_message());
    pl_tensor *neg = i64(PL_SHAPE(1), (int64_t[]){-1});
    ck_assert_ptr_null(pl_embedding(wt, neg));
    ck_assert_int_eq(pl_error_status(), PL_ERR_INVALID);
    pl_tensor *fl = pl_test_randn(PL_SHAPE(2), 2);
    ck_assert_ptr_null(pl_embedding(wt, fl));
    ck_assert_int_eq(pl_error_status(), PL_ERR_DTYPE);
    pl_frame_end();
}
END_TEST

static pl_tensor *fn_embedding(pl_tensor **in, int n, void *ctx) {
    return pl_embedding(in[0], ctx);
}

START_TEST(embedding_gradient_counts_repeated_rows) {
    pl_frame_begin();
    pl_tensor *w = param(pl_test_randn(PL_SHAPE(7, 5), 3));
    int64_t idx[33];
    for (int i = 0; i < 33; i++)
        idx[i] = (i * 5) % 7 == 3 ? 3 : (i * 3) % 7;
    pl_tensor *ix = i64(PL_SHAPE(33), idx);
    gradcheck(fn_embedding, &w, 1, ix, "embedding");
    /* d sum(y) / dW[r, :] = number of times r is picked */
    pl_tensor_zero_grad(w);
    PL_CK_OK(pl_backward(pl_sum(pl_embedding(w, ix), PL_ALL_DIMS, false), 1.0));
    for (int r = 0; r < 7; r++) {
        int cnt = 0;
        for (int i = 0; i < 33; i++)
            cnt += idx[i] == r;
        for (int j = 0; j < 5; j++)
            ck_assert_float_eq(pl_tensor_get(w->grad, r * 5 + j), (float)cnt);
    }
    pl_frame_end();
}
END_TEST

/* ---- index_select / gather / scatter_add ------------------------------------------- */

START_TEST(index_select_gather_scatter_match_torch_examples) {
    pl_frame_begin();
    float a[6] = {1, 2, 3, 4, 5, 6}; /* [[1,2,3],[4,5,6]] */
    pl_tensor *at = f32(PL_SHAPE(2, 3), a);
    pl_tensor *ix = i64(PL_SHAPE(3), (int64_t[]){2, 0, 2});
    expect_values(pl_index_select(at, 1, ix), (float[]){3, 1, 3, 6, 4, 6}, 6, 0,
                  "index_select dim 1");
    pl_tensor *ix0 = i64(PL_SHAPE(3), (int64_t[]){1, 1, 0});
    expect_values(pl_index_select(at, 0, ix0), (float[]){4, 5, 6, 4, 5, 6, 1, 2, 3}, 9, 0,
                  "index_select dim 0");
    /* torch.gather docs: t = [[1,2],[3,4]], gather(t, 1, [[0,0],[1,0]]) = [[1,1],[4,3]] */
    pl_tensor *t = f32(PL_SHAPE(2, 2), (float[]){1, 2, 3, 4});
    pl_tensor *gi = i64(PL_SHAPE(2, 2), (int64_t[]){0, 0, 1, 0});
    expect_values(pl_gather(t, 1, gi), (float[]){1, 1, 4, 3}, 4, 0, "gather dim 1");
    /* gather dim 0 with an index smaller than the input in dim 1 */
    pl_tensor *gi0 = i64(PL_SHAPE(1, 2), (int64_t[]){2, 0});
    pl_tensor *g0 = pl_gather(f32(PL_SHAPE(3, 3), (float[]){0, 1, 2, 3, 4, 5, 6, 7, 8}), 0, gi0);
    expect_values(g0, (float[]){6, 1}, 2, 0, "gather dim 0");
    /* scatter_add (index_add_) of rows [[1,1],[2,2],[3,3]] into 4 rows by [1,3,1] */
    pl_tensor *src = f32(PL_SHAPE(3, 2), (float[]){1, 1, 2, 2, 3, 3});
    pl_tensor *si = i64(PL_SHAPE(3), (int64_t[]){1, 3, 1});
    pl_tensor *sa = pl_scatter_add(src, 0, si, 4);
    ck_assert_int_eq(sa->shape[0], 4);
    expect_values(sa, (float[]){0, 0, 4, 4, 0, 0, 2, 2}, 8, 0, "scatter_add dim 0");
    pl_tensor *sa1 = pl_scatter_add(src, 1, i64(PL_SHAPE(2), (int64_t[]){0, 0}), 1);
    expect_values(sa1, (float[]){2, 4, 6}, 3, 0, "scatter_add dim 1");
    pl_frame_end();
}
END_TEST

START_TEST(index_ops_reject_bad_indices_naming_them) {
    pl_frame_begin();
    pl_tensor *a = pl_test_randn(PL_SHAPE(2, 3), 4);
    ck_assert_ptr_null(pl_index_select(a, 1, i64(PL_SHAPE(2), (int64_t[]){0, 3})));
    ck_assert_int_eq(pl_error_status(), PL_ERR_INVALID);
    ck_assert_msg(strstr(pl_error_message(), "index_select") &&
                      strstr(pl_error_message(), "index 3"),
                  "%s", pl_error_message());
    ck_assert_ptr_null(pl_gather(a, 0, i64(PL_SHAPE(1, 2), (int64_t[]){0, 2})));
    ck_assert_int_eq(pl_error_status(), PL_ERR_INVALID);
    ck_assert_msg(strstr(pl_error_message(), "gather") && strstr(pl_error_message(), "index 2"),
                  "%s", pl_error_message());
    ck_assert_ptr_null(pl_scatter_add(a, 0, i64(PL_SHAPE(2), (int64_t[]){0, 5}), 5 - 1));
    ck_assert_int_eq(pl_error_status(), PL_ERR_INVALID);
    ck_assert_msg(strstr(pl_error_message(), "scatter_add") &&
                      strstr(pl_error_message(), "index 5"),
                  "%s", pl_error_message());
    ck_assert_ptr_null(pl_segment_softmax(a, i64(PL_SHAPE(2), (int64_t[]){0, -2}), 3));
    ck_assert_int_eq(pl_error_status(), PL_ERR_INVALID);
    ck_assert_msg(strstr(pl_error_message(), "segment_softmax") && strstr(pl_error_message(), "-2"),
                  "%s", pl_error_message());
    /* wrong index length for scatter_add is a shape error */
    ck_assert_ptr_null(pl_scatter_add(a, 0, i64(PL_SHAPE(3), (int64_t[]){0, 1, 1}), 2));
    ck_assert_int_eq(pl_error_status(), PL_ERR_SHAPE);
    pl_frame_end();
}
END_TEST

typedef struct {
    int dim;
    pl_tensor *idx;
    int64_t n;
} idx_ctx;

static pl_tensor *fn_index_select(pl_tensor **in, int n, void *c) {
    idx_ctx *x = c;
    return pl_index_select(in[0], x->dim, x->idx);
}
static pl_tensor *fn_gather(pl_tensor **in, int n, void *c) {
    idx_ctx *x = c;
    return pl_gather(in[0], x->dim, x->idx);
}
static pl_tensor *fn_scatter_add(pl_tensor **in, int n, void *c) {
    idx_ctx *x = c;
    return pl_scatter_add(in[0], x->dim, x->idx, x->n);
}

START_TEST(index_ops_gradients_on_odd_shapes) {
    pl_frame_begin();
    pl_tensor *a = param(pl_test_randn(PL_SHAPE(7, 1, 33), 5));
    int64_t i9[9] = {6, 0, 6, 3, 3, 3, 1, 0, 6};
    idx_ctx c0 = {0, i64(PL_SHAPE(9), i9), 0};
    gradcheck(fn_index_select, &a, 1, &c0, "index_select dim 0");
    int64_t i40[40];
    for (int i = 0; i < 40; i++)
        i40[i] = (i * 7 + 3) % 33;
    idx_ctx c2 = {-1, i64(PL_SHAPE(40), i40), 0};
    gradcheck(fn_index_select, &a, 1, &c2, "index_select dim -1");
    /* gather along dim 2 with repeats, index [5, 1, 4] inside [7, 1, 33] */
    int64_t gi[20];
    for (int i = 0; i < 20; i++)
        gi[i] = (i * 13) % 33 == 5 ? 5 : (i * 11) % 33;
    idx_ctx cg = {2, pl_tensor_from_data(PL_I64, PL_SHAPE(5, 1, 4), gi, PL_CPU), 0};
    gradcheck(fn_gather, &a, 1, &cg, "gather dim 2");
    int64_t gi0[33];
    for (int i = 0; i < 33; i++)
        gi0[i] = i % 7;
    idx_ctx cg0 = {0, pl_tensor_from_data(PL_I64, PL_SHAPE(1, 1, 33), gi0, PL_CPU), 0};
    gradcheck(fn_gather, &a, 1, &cg0, "gather dim 0");
    /* scatter_add of 33 rows into 7 (i32 index) and along dim 1 */
    pl_tensor *s = param(pl_test_randn(PL_SHAPE(33, 3), 6));
    int32_t si[33];
    for (int i = 0; i < 33; i++)
        si[i] = (i * 4) % 7;
    idx_ctx cs = {0, pl_tensor_from_data(PL_I32, PL_SHAPE(33), si, PL_CPU), 7};
    gradcheck(fn_scatter_add, &s, 1, &cs, "scatter_add dim 0");
    idx_ctx cs1 = {1, i64(PL_SHAPE(3), (int64_t[]){0, 0, 0}), 1};
    gradcheck(fn_scatter_add, &s, 1, &cs1, "scatter_add dim 1");
    pl_frame_end();
}
END_TEST

START_TEST(scatter_add_is_identical_on_one_and_two_threads) {
    pl_frame_begin();
    int64_t E = 50000;
    pl_tensor *src = pl_test_randn(PL_SHAPE(E, 3), 7);
    pl_tensor *ix = pl_tensor_empty(PL_I64, PL_SHAPE(E), PL_CPU);
    for (int64_t i = 0; i < E; i++)
        pl_tensor_i64(ix)[i] = (i * 7919) % 11;
    omp_set_num_threads(1);
    pl_tensor *y1 = pl_scatter_add(src, 0, ix, 11);
    omp_set_num_threads(2);
    pl_tensor *y2 = pl_scatter_add(src, 0, ix, 11);
    ck_assert(memcmp(pl_tensor_data(y1), pl_tensor_data(y2), 33 * sizeof(float)) == 0);
    double want = 0;
    for (int64_t i = 0; i < E; i += 11)
        want += pl_tensor_get(src, i * 3); /* (i*7919)%11==0 iff i%11==0 */
    ck_assert_double_eq_tol(pl_tensor_get(y1, 0), want, 1e-2);
    pl_frame_end();
}
END_TEST

/* ---- segment softmax ---------------------------------------------------------------- */

START_TEST(segment_softmax_matches_hand_values_and_sums_to_one) {
    pl_frame_begin();
    /* 5 edges, 2 heads, segments {0: e0,e2}, {2: e1,e3,e4}, segment 1 empty */
    float s[10] = {0, 1, 2, 1000, 1, 3, 2, 1000, 3, 1000};
    pl_tensor *st = f32(PL_SHAPE(5, 2), s);
    pl_tensor *seg = i64(PL_SHAPE(5), (int64_t[]){0, 2, 0, 2, 2});
    pl_tensor *y = pl_segment_softmax(st, seg, 3);
    float want[10];
    /* head 0: seg0 {0,1}; seg2 {2,2,3} */
    double d0 = exp(0) + exp(1), d2 = 2 * exp(2) + exp(3);
    want[0] = exp(0) / d0, want[4] = exp(1) / d0;
    want[2] = exp(2) / d2, want[6] = exp(2) / d2, want[8] = exp(3) / d2;
    /* head 1: seg0 {1,3}; seg2 {1000,1000,1000}: stable with the segment max */
    double h0 = exp(1) + exp(3);
    want[1] = exp(1) / h0, want[5] = exp(3) / h0;
    want[3] = want[7] = want[9] = 1.0f / 3.0f;
    expect_values(y, want, 10, 1e-6, "segment_softmax");
    /* per segment and head the weights sum to 1 on random data */
    int64_t E = 33;
    pl_tensor *r = pl_test_randn(PL_SHAPE(E, 3), 8);
    pl_tensor *sg = pl_tensor_empty(PL_I64, PL_SHAPE(E), PL_CPU);
    for (int64_t e = 0; e < E; e++)
        pl_tensor_i64(sg)[e] = (e * 5) % 7;
    pl_tensor *yr = pl_segment_softmax(pl_scale(r, 20.0), sg, 7);
    for (int n = 0; n < 7; n++)
        for (int h = 0; h < 3; h++) {
            double sum = 0;
            for (int64_t e = 0; e < E; e++)
                if (pl_tensor_i64(sg)[e] == n) sum += pl_tensor_get(yr, e * 3 + h);
            ck_assert_double_eq_tol(sum, 1.0, 1e-5);
        }
    pl_frame_end();
}
END_TEST

static pl_tensor *fn_segsoft(pl_tensor **in, int n, void *c) {
    idx_ctx *x = c;
    return pl_segment_softmax(in[0], x->idx, x->n);
}

START_TEST(segment_softmax_gradient) {
    pl_frame_begin();
    pl_tensor *s = param(pl_test_randn(PL_SHAPE(33, 7), 9));
    int32_t seg[33];
    for (int i = 0; i < 33; i++)
        seg[i] = (i * 3) % 5 == 4 ? 0 : (i * 3) % 5; /* segment 4 empty */
    idx_ctx c = {0, pl_tensor_from_data(PL_I32, PL_SHAPE(33), seg, PL_CPU), 5};
    gradcheck(fn_segsoft, &s, 1, &c, "segment_softmax [33,7]");
    pl_tensor *s1 = param(pl_test_randn(PL_SHAPE(7), 10));
    idx_ctx c1 = {0, i64(PL_SHAPE(7), (int64_t[]){0, 0, 1, 0, 1, 2, 0}), 3};
    gradcheck(fn_segsoft, &s1, 1, &c1, "segment_softmax [7]");
    pl_frame_end();
}
END_TEST

/* ---- dropout ------------------------------------------------------------------------ */

static int64_t count_zero(const pl_tensor *t) {
    int64_t z = 0, n = pl_tensor_numel(t);
    for (int64_t i = 0; i < n; i++)
        z += pl_tensor_get(t, i) == 0.0;
    return z;
}

START_TEST(dropout_mask_is_counter_based_and_scaled) {
    pl_frame_begin();
    const int64_t N = 100003;
    const double p = 0.3;
    pl_tensor *x = pl_test_rand(PL_SHAPE(N), 1.0, 2.0, 11); /* no zeros in x */
    pl_tensor *a = pl_dropout(x, p, 42, 7, true);
    pl_tensor *b = pl_dropout(x, p, 42, 7, true);
    pl_tensor *c = pl_dropout(x, p, 42, 8, true);
    pl_tensor *d = pl_dropout(x, p, 43, 7, true);
    ck_assert(memcmp(pl_tensor_data(a), pl_tensor_data(b), N * sizeof(float)) == 0);
    int64_t diff_c = 0, diff_d = 0;
    for (int64_t i = 0; i < N; i++) {
        diff_c += (pl_tensor_get(a, i) == 0) != (pl_tensor_get(c, i) == 0);
        diff_d += (pl_tensor_get(a, i) == 0) != (pl_tensor_get(d, i) == 0);
    }
    /* independent masks differ on about 2p(1-p) = 42 % of elements */
    ck_assert_msg(diff_c > N / 3 && diff_d > N / 3, "masks barely differ: %lld %lld",
                  (long long)diff_c, (long long)diff_d);
    /* fraction zeroed within 4 sigma of p */
    double frac = (double)count_zero(a) / N, sigma = sqrt(p * (1 - p) / N);
    ck_assert_msg(fabs(frac - p) < 4 * sigma, "zeroed fraction %.5f, p %.2f", frac, p);
    /* kept elements are x / (1 - p); the decision follows the documented
     * Philox counter layout: ctr = {i/4, 0, counter, 0}, key = seed */
    for (int64_t i = 0; i < N; i++) {
        uint32_t ctr[4] = {(uint32_t)(i / 4), 0, 7, 0}, key[2] = {42, 0}, r[4];
        pl_philox4x32_10(ctr, key, r);
        bool keep = pl_philox_u01(r[i % 4]) >= (float)p;
        double want = keep ? pl_tensor_get(x, i) / (1 - p) : 0.0;
        ck_assert_msg(fabs(pl_tensor_get(a, i) - want) <= 1e-6 * fabs(want),
                      "element %lld: %g vs %g", (long long)i, pl_tensor_get(a, i), want);
    }
    /* eval mode and p = 0 return the input itself */
    ck_assert_ptr_eq(pl_dropout(x, p, 42, 7, false), x);
    ck_assert_ptr_eq(pl_dropout(x, 0.0, 42, 7, true), x);
    ck_assert_ptr_null(pl_dropout(x, 1.5, 42, 7, true));
    ck_assert_int_eq(pl_error_status(), PL_ERR_INVALID);
    pl_frame_end();
}
END_TEST

START_TEST(dropout_mask_is_identical_on_one_and_two_threads) {
    pl_frame_begin();
    const int64_t N = 200001;
    pl_tensor *x = pl_test_rand(PL_SHAPE(N), 1.0, 2.0, 12);
    omp_set_num_threads(1);
    pl_tensor *a = pl_dropout(x, 0.5, 1234567890123ull, 99, true);
    omp_set_num_threads(2);
    pl_tensor *b = pl_dropout(x, 0.5, 1234567890123ull, 99, true);
    ck_assert(memcmp(pl_tensor_data(a), pl_tensor_data(b), N * sizeof(float)) == 0);
    /* bf16 input: same mask, values rounded */
    pl_tensor *xb = pl_tensor_to(x, PL_BF16, PL_CPU);
    pl_tensor *cb = pl_dropout(xb, 0.5, 1234567890123ull, 99, true);
    ck_assert_int_eq(cb->dtype, PL_BF16);
    for (int64_t i = 0; i < N; i += 97)
        ck_assert((pl_tensor_get(cb, i) == 0) == (pl_tensor_get(a, i) == 0));
    pl_frame_end();
}
END_TEST

static pl_tensor *fn_dropout(pl_tensor **in, int n, void *c) {
    return pl_dropout(in[0], 0.4, 5, 6, true);
}

START_TEST(dropout_gradient_uses_the_saved_mask) {
    pl_frame_begin();
    pl_tensor *x = param(pl_test_randn(PL_SHAPE(7, 33), 13));
    gradcheck(fn_dropout, &x, 1, NULL, "dropout");
    pl_tensor_zero_grad(x);
    pl_tensor *y = pl_dropout(x, 0.4, 5, 6, true);
    PL_CK_OK(pl_backward(pl_sum(y, PL_ALL_DIMS, false), 1.0));
    for (int64_t i = 0; i < 7 * 33; i++) {
        double want = pl_tensor_get(y, i) == 0 ? 0.0 : 1.0 / 0.6;
        ck_assert_double_eq_tol(pl_tensor_get(x->grad, i), want, 1e-6);
    }
    pl_frame_end();
}
END_TEST

/* ---- concat / split / slice ------------------------------------------------------------ */

START_TEST(concat_split_slice_hand_values) {
    pl_frame_begin();
    pl_tensor *a = f32(PL_SHAPE(2, 2), (float[]){1, 2, 3, 4});
    pl_tensor *b = f32(PL_SHAPE(2, 1), (float[]){5, 6});
    pl_tensor *ab = pl_concat((pl_tensor *[]){a, b}, 2, 1);
    expect_values(ab, (float[]){1, 2, 5, 3, 4, 6}, 6, 0, "concat dim 1");
    pl_tensor *c = f32(PL_SHAPE(1, 2), (float[]){7, 8});
    expect_values(pl_concat((pl_tensor *[]){a, c}, 2, 0), (float[]){1, 2, 3, 4, 7, 8}, 6, 0,
                  "concat dim 0");
    ck_assert_ptr_null(pl_concat((pl_tensor *[]){a, c}, 2, 1));
    ck_assert_int_eq(pl_error_status(), PL_ERR_SHAPE);
    pl_tensor *parts[3];
    PL_CK_OK(pl_split(ab, -1, (int64_t[]){1, 0, 2}, 3, parts));
    expect_values(parts[0], (float[]){1, 3}, 2, 0, "split 0");
    ck_assert_int_eq(parts[1]->shape[1], 0);
    expect_values(parts[2], (float[]){2, 5, 4, 6}, 4, 0, "split 2");
    ck_assert_int_eq(pl_split(ab, 1, (int64_t[]){1, 1}, 2, parts), PL_ERR_SHAPE);
    pl_tensor *m = f32(PL_SHAPE(2, 4), (float[]){0, 1, 2, 3, 4, 5, 6, 7});
    expect_values(pl_slice(m, 1, 1, 3), (float[]){1, 2, 5, 6}, 4, 0, "slice");
    expect_values(pl_slice(m, 1, -2, 4), (float[]){2, 3, 6, 7}, 4, 0, "slice negative start");
    ck_assert_ptr_null(pl_slice(m, 1, 2, 5));
    ck_assert_int_eq(pl_error_status(), PL_ERR_INVALID);
    /* more inputs than one tape node holds */
    pl_tensor *many[9];
    float want[9];
    for (int i = 0; i < 9; i++) {
        want[i] = (float)i;
        many[i] = f32(PL_SHAPE(1), &want[i]);
    }
    expect_values(pl_concat(many, 9, 0), want, 9, 0, "concat of 9");
    pl_frame_end();
}
END_TEST

typedef struct {
    int dim;
    int n;
} cat_ctx;

static pl_tensor *fn_concat(pl_tensor **in, int n, void *c) {
    cat_ctx *x = c;
    return pl_concat(in, x->n, x->dim);
}
static pl_tensor *fn_split_mid(pl_tensor **in, int n, void *c) {
    pl_tensor *o[3];
    if (pl_split(in[0], 1, (int64_t[]){2, 3, 2}, 3, o)) return NULL;
    return pl_concat((pl_tensor *[]){o[2], pl_scale(o[1], 3.0), o[0]}, 3, 1);
}
static pl_tensor *fn_slice(pl_tensor **in, int n, void *c) {
    return pl_slice(in[0], -1, 3, 30);
}

START_TEST(concat_split_slice_gradients) {
    pl_frame_begin();
    pl_tensor *in[9];
    for (int i = 0; i < 9; i++)
        in[i] = param(pl_test_randn(PL_SHAPE(7, 1 + i % 3, 1), 20 + i));
    cat_ctx c9 = {1, 9};
    gradcheck(fn_concat, in, 9, &c9, "concat of 9 along dim 1");
    pl_tensor *x = param(pl_test_randn(PL_SHAPE(3, 7), 30));
    gradcheck(fn_split_mid, &x, 1, NULL, "split + concat");
    pl_tensor *s = param(pl_test_randn(PL_SHAPE(1, 7, 33), 31));
    gradcheck(fn_slice, &s, 1, NULL, "slice");
    pl_frame_end();
}
END_TEST

/* ---- permute / transpose / reshape / contiguous -------------------------------------------- */

START_TEST(permute_transpose_reshape_hand_values) {
    pl_frame_begin();
    float v[24];
    for (int i = 0; i < 24; i++)
        v[i] = (float)i;
    pl_tensor *x = f32(PL_SHAPE(2, 3, 4), v);
    pl_tensor *t = pl_transpose(x, 0, 2); /* [4, 3, 2], t[i,j,k] = x[k,j,i] */
    ck_assert_int_eq(t->shape[0], 4);
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 3; j++)
            for (int k = 0; k < 2; k++)
                ck_assert_float_eq(pl_tensor_get(t, (i * 3 + j) * 2 + k), v[(k * 3 + j) * 4 + i]);
    pl_tensor *p = pl_permute(x, (int[]){1, 2, 0}); /* [3, 4, 2], p[j,i,k] = x[k,j,i] */
    for (int j = 0; j < 3; j++)
        for (int i = 0; i < 4; i++)
            for (int k = 0; k < 2; k++)
                ck_assert_float_eq(pl_tensor_get(p, (j * 4 + i) * 2 + k), v[(k * 3 + j) * 4 + i]);
    ck_assert_ptr_null(pl_permute(x, (int[]){0, 0, 1}));
    ck_assert_int_eq(pl_error_status(), PL_ERR_INVALID);
    pl_tensor *r = pl_reshape(x, PL_SHAPE(4, -1));
    ck_assert_int_eq(r->shape[1], 6);
    ck_assert_ptr_eq(pl_tensor_data(r), pl_tensor_data(x)); /* a view */
    ck_assert_ptr_null(pl_reshape(x, PL_SHAPE(5, -1)));
    ck_assert_int_eq(pl_error_status(), PL_ERR_SHAPE);
    /* contiguous of a strided view */
    pl_tensor *col = pl_tensor_narrow(x, 2, 1, 2); /* [2, 3, 2] */
    pl_tensor *cc = pl_contiguous(col);
    ck_assert(pl_tensor_is_contiguous(cc));
    for (int i = 0; i < 12; i++)
        ck_assert_float_eq(pl_tensor_get(cc, i), v[(i / 2) * 4 + 1 + i % 2]);
    ck_assert_ptr_eq(pl_contiguous(x), x);
    /* gradient of contiguous() of a view leaf is the incoming gradient */
    pl_tensor_set_requires_grad(col, true);
    pl_tensor *rr = pl_test_randn(PL_SHAPE(2, 3, 2), 40);
    backward_weighted(pl_contiguous(col), rr);
    for (int i = 0; i < 12; i++)
        ck_assert_float_eq(pl_tensor_get(col->grad, i), pl_tensor_get(rr, i));
    pl_frame_end();
}
END_TEST

static pl_tensor *fn_permute(pl_tensor **in, int n, void *c) {
    return pl_permute(in[0], (int[]){2, 0, 3, 1});
}
static pl_tensor *fn_transpose(pl_tensor **in, int n, void *c) {
    return pl_transpose(in[0], -1, -2);
}
static pl_tensor *fn_reshape(pl_tensor **in, int n, void *c) {
    /* reshape then a non-linear op so a wrong mapping shows */
    return pl_mul(pl_reshape(in[0], PL_SHAPE(-1, 11)), pl_reshape(in[1], PL_SHAPE(3, 11)));
}

START_TEST(permute_transpose_reshape_gradients) {
    pl_frame_begin();
    pl_tensor *x = param(pl_test_randn(PL_SHAPE(3, 1, 7, 5), 41));
    gradcheck(fn_permute, &x, 1, NULL, "permute");
    gradcheck(fn_transpose, &x, 1, NULL, "transpose");
    pl_tensor *in[2] = {param(pl_test_randn(PL_SHAPE(33), 42)),
                        param(pl_test_randn(PL_SHAPE(1, 33), 43))};
    gradcheck(fn_reshape, in, 2, NULL, "reshape");
    pl_frame_end();
}
END_TEST

/* ---- rope ------------------------------------------------------------------------------ */

START_TEST(rope_matches_rotate_half_formula) {
    pl_frame_begin();
    const int B = 2, T = 3, H = 2, D = 6, off = 5;
    const double theta = 10000.0;
    pl_tensor *x = pl_test_randn(PL_SHAPE(B, T, H, D), 50);
    pl_tensor *y = pl_rope(x, off, theta);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < H; h++)
                for (int d = 0; d < D; d++) {
                    int64_t base = ((b * T + t) * H + h) * D;
                    int i = d % (D / 2);
                    double ang = (off + t) * pow(theta, -2.0 * i / D);
                    /* rotate_half(x) = cat(-x2, x1) */
                    double rot = d < D / 2 ? -pl_tensor_get(x, base + d + D / 2)
                                           : pl_tensor_get(x, base + d - D / 2);
                    double want = pl_tensor_get(x, base + d) * cos(ang) + rot * sin(ang);
                    ck_assert_msg(fabs(pl_tensor_get(y, base + d) - want) < 1e-5,
                                  "rope (%d,%d,%d,%d)", b, t, h, d);
                }
    /* position 0 is the identity */
    pl_tensor *y0 = pl_rope(pl_slice(x, 1, 0, 1), 0, theta);
    ck_assert_double_eq_tol(pl_test_max_abs_diff(y0, pl_slice(x, 1, 0, 1)), 0.0, 1e-7);
    ck_assert_ptr_null(pl_rope(pl_test_randn(PL_SHAPE(1, 2, 1, 5), 51), 0, theta));
    ck_assert_int_eq(pl_error_status(), PL_ERR_SHAPE);
    pl_frame_end();
}
END_TEST

static pl_tensor *fn_rope(pl_tensor **in, int n, void *c) {
    return pl_rope(in[0], 3, 500.0);
}

START_TEST(rope_gradient) {
    pl_frame_begin();
    pl_tensor *x = param(pl_test_randn(PL_SHAPE(1, 7, 3, 4), 52));
    gradcheck(fn_rope, &x, 1, NULL, "rope");
    pl_frame_end();
}
END_TEST

/* ---- causal softmax -------------------------------------------------------------------------- */

START_TEST(causal_softmax_masks_future_keys) {
    pl_frame_begin();
    /* T = 2, S = 3: query 0 sees keys 0..1, query 1 sees keys 0..2 */
    pl_tensor *s = f32(PL_SHAPE(2, 3), (float[]){1, 2, 100, 0, 2, 4});
    pl_tensor *y = pl_causal_softmax(s, 0.5);
    double d0 = exp(0.5) + exp(1.0), d1 = exp(0.0) + exp(1.0) + exp(2.0);
    expect_values(y,
                  (float[]){exp(0.5) / d0, exp(1.0) / d0, 0, 1 / d1, exp(1.0) / d1, exp(2.0) / d1},
                  6, 1e-6, "causal_softmax");
    /* square case: row i has i+1 non-zeros summing to 1 */
    pl_tensor *r = pl_causal_softmax(pl_test_randn(PL_SHAPE(3, 7, 7), 60), 1.0);
    for (int b = 0; b < 3; b++)
        for (int i = 0; i < 7; i++) {
            double sum = 0;
            for (int j = 0; j < 7; j++) {
                double v = pl_tensor_get(r, (b * 7 + i) * 7 + j);
                if (j > i) ck_assert(v == 0.0);
                sum += v;
            }
            ck_assert_double_eq_tol(sum, 1.0, 1e-6);
        }
    pl_frame_end();
}
END_TEST

static pl_tensor *fn_causal(pl_tensor **in, int n, void *c) {
    return pl_causal_softmax(in[0], 0.7);
}

START_TEST(causal_softmax_gradient) {
    pl_frame_begin();
    pl_tensor *x = param(pl_test_randn(PL_SHAPE(2, 1, 7, 9), 61));
    gradcheck(fn_causal, &x, 1, NULL, "causal_softmax");
    pl_frame_end();
}
END_TEST

/* ---- LSTM ---------------------------------------------------------------------------------- */

static void lstm_vs_torch(bool reverse) {
    pl_frame_begin();
    const int B = LSTM_REF_B, T = LSTM_REF_T, In = LSTM_REF_IN, H = LSTM_REF_H;
    pl_tensor *x = param(f32(PL_SHAPE(B, T, In), lstm_ref_x));
    pl_tensor *r = f32(PL_SHAPE(B, T, H), lstm_ref_r);
#define REF(name) (reverse ? lstm_ref_rev_##name : lstm_ref_fwd_##name)
    pl_tensor *wih = param(f32(PL_SHAPE(4 * H, In), REF(w_ih)));
    pl_tensor *whh = param(f32(PL_SHAPE(4 * H, H), REF(w_hh)));
    pl_tensor *bih = param(f32(PL_SHAPE(4 * H), REF(b_ih)));
    pl_tensor *bhh = param(f32(PL_SHAPE(4 * H), REF(b_hh)));
    pl_tensor *h0 = param(f32(PL_SHAPE(B, H), REF(h0)));
    pl_tensor *c0 = param(f32(PL_SHAPE(B, H), REF(c0)));
    pl_tensor *hn = NULL, *cn = NULL;
    pl_tensor *y = pl_lstm(x, wih, whh, bih, bhh, h0, c0, reverse, &hn, &cn);
    const char *dir = reverse ? "reverse" : "forward";
    ck_assert_msg(y != NULL, "lstm %s: %s", dir, pl_error_message());
    expect_values(y, REF(y), B * T * H, 1e-5, "y");
    expect_values(hn, REF(hn), B * H, 1e-5, "h_n");
    expect_values(cn, REF(cn), B * H, 1e-5, "c_n");
    backward_weighted(y, r);
    expect_values(x->grad, REF(dx), B * T * In, 1e-5, "dx");
    expect_values(wih->grad, REF(dw_ih), 4 * H * In, 1e-5, "dw_ih");
    expect_values(whh->grad, REF(dw_hh), 4 * H * H, 1e-5, "dw_hh");
    expect_values(bih->grad, REF(db_ih), 4 * H, 1e-5, "db_ih");
    expect_values(bhh->grad, REF(db_hh), 4 * H, 1e-5, "db_hh");
    expect_values(h0->grad, REF(dh0), B * H, 1e-5, "dh0");
    expect_values(c0->grad, REF(dc0), B * H, 1e-5, "dc0");
#undef REF
    pl_frame_end();
}

START_TEST(lstm_matches_torch_forward_direction) {
    lstm_vs_torch(false);
}
END_TEST

START_TEST(lstm_matches_torch_reverse_direction) {
    lstm_vs_torch(true);
}
END_TEST

typedef struct {
    bool reverse, bias, state;
} lstm_ctx;

static pl_tensor *fn_lstm(pl_tensor **in, int n, void *c) {
    lstm_ctx *l = c;
    return pl_lstm(in[0], in[1], in[2], l->bias ? in[3] : NULL, NULL, l->state ? in[4] : NULL,
                   l->state ? in[5] : NULL, l->reverse, NULL, NULL);
}

START_TEST(lstm_gradient_on_odd_shapes) {
    pl_frame_begin();
    const int B = 1, T = 7, In = 3, H = 5;
    pl_tensor *in[6] = {
        param(pl_test_randn(PL_SHAPE(B, T, In), 70)),
        param(pl_test_rand(PL_SHAPE(4 * H, In), -0.5, 0.5, 71)),
        param(pl_test_rand(PL_SHAPE(4 * H, H), -0.5, 0.5, 72)),
        param(pl_test_rand(PL_SHAPE(4 * H), -0.5, 0.5, 73)),
        param(pl_test_randn(PL_SHAPE(B, H), 74)),
        param(pl_test_randn(PL_SHAPE(B, H), 75)),
    };
    lstm_ctx full = {true, true, true};
    gradcheck(fn_lstm, in, 6, &full, "lstm reverse with bias and state");
    lstm_ctx bare = {false, false, false};
    gradcheck(fn_lstm, in, 3, &bare, "lstm without bias and state");
    pl_tensor *hn = NULL;
    ck_assert_ptr_null(pl_lstm(in[0], in[2], in[2], NULL, NULL, NULL, NULL, false, &hn, NULL));
    ck_assert_int_eq(pl_error_status(), PL_ERR_SHAPE);
    ck_assert_msg(strstr(pl_error_message(), "w_ih"), "%s", pl_error_message());
    pl_frame_end();
}
END_TEST

/* Large inputs take the OpenMP paths: results (values and gradients) must
 * not depend on the thread count. */
static void run_large(int threads, pl_tensor **outs) {
    omp_set_num_threads(threads);
    pl_tensor *a = param(pl_test_randn(PL_SHAPE(64, 300, 5), 80));
    pl_tensor *gi = pl_tensor_empty(PL_I64, PL_SHAPE(64, 400, 5), PL_CPU);
    for (int64_t i = 0; i < 64 * 400 * 5; i++)
        pl_tensor_i64(gi)[i] = (i * 7 + i / 13) % 300;
    pl_tensor *si = pl_tensor_empty(PL_I32, PL_SHAPE(64 * 300), PL_CPU);
    for (int64_t i = 0; i < 64 * 300; i++)
        pl_tensor_i32(si)[i] = (int32_t)((i * 31) % 97);
    pl_tensor *g = pl_gather(a, 1, gi);
    pl_tensor *seg = pl_segment_softmax(pl_reshape(a, PL_SHAPE(64 * 300, 5)), si, 97);
    pl_tensor *c = pl_causal_softmax(pl_reshape(a, PL_SHAPE(64, 25, 60)), 0.3);
    pl_tensor *ro = pl_rope(pl_reshape(a, PL_SHAPE(4, 16, 50, 30)), 2, 10000.0);
    pl_tensor *pe = pl_permute(a, (int[]){2, 0, 1});
    pl_tensor *loss = pl_add(pl_add(pl_sum(pl_mul(g, g), PL_ALL_DIMS, false),
                                    pl_sum(pl_mul(seg, seg), PL_ALL_DIMS, false)),
                             pl_add(pl_sum(pl_mul(c, c), PL_ALL_DIMS, false),
                                    pl_add(pl_sum(pl_mul(ro, ro), PL_ALL_DIMS, false),
                                           pl_sum(pl_exp(pe), PL_ALL_DIMS, false))));
    PL_CK_OK(pl_backward(loss, 1.0));
    outs[0] = pl_frame_keep(g);
    outs[1] = pl_frame_keep(seg);
    outs[2] = pl_frame_keep(c);
    outs[3] = pl_frame_keep(ro);
    outs[4] = pl_frame_keep(pe);
    outs[5] = pl_frame_keep(a->grad);
}

START_TEST(large_ops_do_not_depend_on_thread_count) {
    pl_frame_begin();
    pl_tensor *o1[6], *o2[6];
    run_large(1, o1);
    run_large(2, o2);
    for (int i = 0; i < 6; i++) {
        ck_assert(pl_tensor_numel(o1[i]) > 32768);
        ck_assert_msg(
            memcmp(pl_tensor_data(o1[i]), pl_tensor_data(o2[i]), pl_tensor_nbytes(o1[i])) == 0,
            "output %d differs between 1 and 2 threads", i);
        pl_tensor_release(o1[i]);
        pl_tensor_release(o2[i]);
    }
    pl_frame_end();
}
END_TEST

/* ---- topk -------------------------------------------------------------------- */

/* The reference order written out on its own (not kernel_math.h's): NaN
 * first, then larger values, ties (and NaNs) by lower index. */
static const float *g_ref_row;
static int ref_cmp(const void *pa, const void *pb) {
    int64_t a = *(const int64_t *)pa, b = *(const int64_t *)pb;
    float va = g_ref_row[a], vb = g_ref_row[b];
    int ca = isnan(va) ? 0 : 1, cb = isnan(vb) ? 0 : 1;
    if (ca != cb) return ca - cb;
    if (!ca || va == vb) return a < b ? -1 : a > b;
    return va > vb ? -1 : 1;
}

/* A full sort of each row against pl_topk for k = 1, 7, V; rows with ties,
 * -inf, +inf and NaN; f32 and bf16 (whose values come back as bf16, exact). */
START_TEST(topk_matches_a_full_sort_with_ties_inf_and_nan) {
    enum { R = 9, V = 41 };
    float h[R * V];
    for (int e = 0; e < R * V; e++) {
        int r = e / V;
        h[e] = r < 3 ? (float)((e * 7919) % 97) / 8.0f - 5.0f : (float)((e * 13) % 4);
        if (r >= 5 && e % 6 == 1) h[e] = -INFINITY;
        if (r >= 6 && e % 9 == 4) h[e] = NAN;
        if (r == 8 && e % 10 == 0) h[e] = INFINITY;
    }
    h[V - 1] = -0.0f; /* -0 == +0: a tie by index */
    h[V - 2] = 0.0f;
    const int64_t ks[] = {1, 7, V};
    for (int dt = 0; dt < 2; dt++)
        for (int ki = 0; ki < 3; ki++) {
            pl_frame_begin();
            int64_t k = ks[ki];
            pl_tensor *x = f32(2, (int64_t[]){R, V}, h), *v, *i;
            if (dt) x = pl_cast(x, PL_BF16);
            pl_tensor *xf = pl_tensor_to(x, PL_F32, PL_CPU); /* the values the op sees */
            ck_assert_int_eq(pl_topk(x, k, &v, &i), PL_OK);
            ck_assert_int_eq(v->dtype, x->dtype);
            ck_assert_int_eq(i->dtype, PL_I64);
            ck_assert_int_eq(v->shape[1], k);
            pl_tensor *vf = pl_tensor_to(v, PL_F32, PL_CPU);
            const float *xs = pl_tensor_data(xf), *vs = pl_tensor_data(vf);
            const int64_t *is = pl_tensor_data(i);
            for (int r = 0; r < R; r++) {
                int64_t ord[V];
                for (int j = 0; j < V; j++) ord[j] = j;
                g_ref_row = xs + r * V;
                qsort(ord, V, sizeof ord[0], ref_cmp);
                for (int64_t j = 0; j < k; j++) {
                    ck_assert_msg(is[r * k + j] == ord[j], "dtype %d k %lld row %d rank %lld: index "
                                  "%lld, expected %lld", dt, (long long)k, r, (long long)j,
                                  (long long)is[r * k + j], (long long)ord[j]);
                    float want = g_ref_row[ord[j]], got = vs[r * k + j];
                    ck_assert(isnan(want) ? isnan(got) : memcmp(&want, &got, 4) == 0);
                }
            }
            pl_frame_end();
        }
}
END_TEST

START_TEST(topk_refuses_bad_k_dtype_and_rank_naming_the_tensor) {
    pl_frame_begin();
    pl_tensor *x = pl_test_rand(2, (int64_t[]){3, 5}, -1, 1, 7), *v = x, *i = x;
    pl_tensor_set_name(x, "logits");
    ck_assert_int_eq(pl_topk(x, 0, &v, &i), PL_ERR_INVALID);
    ck_assert_ptr_null(v);
    ck_assert_ptr_null(i);
    ck_assert_ptr_nonnull(strstr(pl_error_message(), "logits"));
    ck_assert_int_eq(pl_topk(x, 6, &v, &i), PL_ERR_INVALID);
    ck_assert_ptr_nonnull(strstr(pl_error_message(), "k = 6"));
    ck_assert_int_eq(pl_topk(pl_tensor_to(x, PL_I64, PL_CPU), 2, &v, &i), PL_ERR_DTYPE);
    ck_assert_int_eq(pl_topk(pl_sum(x, PL_ALL_DIMS, false), 1, &v, &i), PL_ERR_SHAPE);
    ck_assert_int_eq(pl_topk(NULL, 1, &v, &i), PL_ERR_INVALID);
    ck_assert_int_eq(pl_topk(x, 1, NULL, &i), PL_ERR_INVALID);
    /* no autograd: a parameter's top-k is a plain result, nothing recorded */
    pl_tensor_set_requires_grad(x, true);
    ck_assert_int_eq(pl_topk(x, 5, &v, &i), PL_OK);
    ck_assert(!v->requires_grad && !i->requires_grad);
    ck_assert_ptr_null(v->grad_fn);
    pl_tape_clear();
    pl_frame_end();
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("ops_index");
    TCase *tc = tcase_create("ops_index");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, embedding_picks_rows_for_i64_i32_and_bf16);
    tcase_add_test(tc, embedding_rejects_out_of_range_index);
    tcase_add_test(tc, embedding_gradient_counts_repeated_rows);
    tcase_add_test(tc, index_select_gather_scatter_match_torch_examples);
    tcase_add_test(tc, index_ops_reject_bad_indices_naming_them);
    tcase_add_test(tc, index_ops_gradients_on_odd_shapes);
    tcase_add_test(tc, scatter_add_is_identical_on_one_and_two_threads);
    tcase_add_test(tc, segment_softmax_matches_hand_values_and_sums_to_one);
    tcase_add_test(tc, segment_softmax_gradient);
    tcase_add_test(tc, dropout_mask_is_counter_based_and_scaled);
    tcase_add_test(tc, dropout_mask_is_identical_on_one_and_two_threads);
    tcase_add_test(tc, dropout_gradient_uses_the_saved_mask);
    tcase_add_test(tc, concat_split_slice_hand_values);
    tcase_add_test(tc, concat_split_slice_gradients);
    tcase_add_test(tc, permute_transpose_reshape_hand_values);
    tcase_add_test(tc, permute_transpose_reshape_gradients);
    tcase_add_test(tc, rope_matches_rotate_half_formula);
    tcase_add_test(tc, rope_gradient);
    tcase_add_test(tc, causal_softmax_masks_future_keys);
    tcase_add_test(tc, causal_softmax_gradient);
    tcase_add_test(tc, lstm_matches_torch_forward_direction);
    tcase_add_test(tc, lstm_matches_torch_reverse_direction);
    tcase_add_test(tc, lstm_gradient_on_odd_shapes);
    tcase_add_test(tc, large_ops_do_not_depend_on_thread_count);
    tcase_add_test(tc, topk_matches_a_full_sort_with_ties_inf_and_nan);
    tcase_add_test(tc, topk_refuses_bad_k_dtype_and_rank_naming_the_tensor);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    return pl_test_run(suite());
}
