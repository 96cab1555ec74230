/* Tensor, allocator, frames and the autograd engine (via a custom op, so
 * these tests need no op from ops.h). */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "pl_test.h"

START_TEST(bf16_rounds_to_nearest_even) {
    /* 1 + 2^-8 is exactly half-way between bf16 1.0 and 1 + 2^-7: ties to even (1.0) */
    ck_assert_float_eq(pl_bf16_to_f32(pl_f32_to_bf16(1.0f + 0x1p-8f)), 1.0f);
    /* 1 + 3*2^-8 is half-way between 1+2^-7 (odd mantissa) and 1+2^-6: ties to even (1+2^-6) */
    ck_assert_float_eq(pl_bf16_to_f32(pl_f32_to_bf16(1.0f + 3 * 0x1p-8f)), 1.0f + 0x1p-6f);
    /* just above half-way rounds up */
    ck_assert_float_eq(pl_bf16_to_f32(pl_f32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f)), 1.0f + 0x1p-7f);
    ck_assert(isnan(pl_bf16_to_f32(pl_f32_to_bf16(NAN))));
    ck_assert(isinf(pl_bf16_to_f32(pl_f32_to_bf16(INFINITY))));
}
END_TEST

START_TEST(f16_conversion_matches_ieee) {
    ck_assert_float_eq(pl_f16_to_f32(pl_f32_to_f16(65504.0f)), 65504.0f);
    ck_assert(isinf(pl_f16_to_f32(pl_f32_to_f16(65520.0f)))); /* rounds past max -> inf */
    ck_assert_float_eq(pl_f16_to_f32(pl_f32_to_f16(0x1p-24f)), 0x1p-24f); /* smallest subnormal */
    ck_assert_uint_eq(pl_f32_to_f16(1.0f), 0x3c00);
    ck_assert_uint_eq(pl_f32_to_f16(-2.0f), 0xc000);
}
END_TEST

START_TEST(views_share_storage_and_check_bounds) {
    float data[12];
    for (int i = 0; i < 12; i++) data[i] = (float)i;
    pl_tensor *t = pl_tensor_from_data(PL_F32, PL_SHAPE(4, 3), data, PL_CPU);
    pl_tensor *rows = pl_tensor_view_rows(t, 1, 2);
    ck_assert_ptr_eq(rows->storage, t->storage);
    ck_assert(pl_tensor_is_contiguous(rows));
    ck_assert_float_eq(pl_tensor_get(rows, 0), 3.0f);
    pl_tensor *col = pl_tensor_narrow(t, 1, 2, 1);
    ck_assert(!pl_tensor_is_contiguous(col));
    ck_assert_float_eq(pl_tensor_get(col, 3), 11.0f);
    /* overlapping windows [3 windows, 2 rows, 3 cols] over 4 rows */
    pl_tensor *win = pl_tensor_as_strided(t, 3, (int64_t[]){3, 2, 3}, (int64_t[]){3, 3, 1}, 0);
    ck_assert_ptr_nonnull(win);
    ck_assert_float_eq(pl_tensor_get(win, 2 * 6 + 5), 11.0f);
    pl_tensor *c = pl_tensor_to(win, PL_F32, PL_CPU);
    ck_assert(pl_tensor_is_contiguous(c));
    ck_assert_float_eq(((float *)pl_tensor_data(c))[6], 3.0f);
    /* a window past the end is refused */
    pl_tensor *bad = pl_tensor_as_strided(t, 3, (int64_t[]){4, 2, 3}, (int64_t[]){3, 3, 1}, 0);
    ck_assert_ptr_null(bad);
    ck_assert_ptr_nonnull(strstr(pl_error_message(), "outside storage"));
    ck_assert_ptr_null(pl_tensor_narrow(t, 0, 3, 2));
    pl_tensor *r = pl_tensor_reshape(t, PL_SHAPE(2, -1));
    ck_assert_int_eq(r->shape[1], 6);
    ck_assert_ptr_null(pl_tensor_reshape(t, PL_SHAPE(5, -1)));
    pl_tensor *bf = pl_tensor_to(t, PL_BF16, PL_CPU);
    ck_assert_float_eq(pl_tensor_get(bf, 11), 11.0f);
    pl_tensor *objs[] = {t, rows, col, win, c, r, bf};
    for (size_t i = 0; i < sizeof objs / sizeof objs[0]; i++) pl_tensor_release(objs[i]);
}
END_TEST

START_TEST(allocator_reaches_steady_state) {
    /* varying batch shapes: after one pass over the shapes, no system allocation */
    int64_t sizes[] = {32, 17, 64, 5, 48, 64, 33};
    for (int pass = 0; pass < 3; pass++) {
        pl_alloc_stats before = pl_alloc_get_stats(PL_CPU);
        for (int i = 0; i < 7; i++) {
            pl_frame_begin();
            pl_tensor *a = pl_tensor_empty(PL_F32, PL_SHAPE(sizes[i], 50, 64), PL_CPU);
            pl_tensor *b = pl_tensor_empty(PL_I64, PL_SHAPE(sizes[i], 50), PL_CPU);
            ck_assert(a && b);
            pl_frame_end();
        }
        pl_alloc_stats after = pl_alloc_get_stats(PL_CPU);
        if (pass > 0) ck_assert_uint_eq(after.system_allocs, before.system_allocs);
        ck_assert_uint_eq(after.bytes_in_use, before.bytes_in_use);
        ck_assert(after.cache_hits >= before.cache_hits + (pass ? 14 : 0));
    }
    pl_alloc_reset_peak(PL_CPU);
    pl_alloc_stats s = pl_alloc_get_stats(PL_CPU);
    ck_assert_uint_eq(s.peak_bytes, s.bytes_in_use);
}
END_TEST

/* Reserved bytes (allocated + cached) and their peak, with torch.cuda's meaning:
 * a freed block stays reserved; reset_peak restarts both peaks at the current
 * values; empty_cache gives cached blocks back (reserved drops, allocated not). */
START_TEST(allocator_reports_allocated_and_reserved_peaks) {
    pl_alloc_empty_cache(PL_CPU);
    pl_alloc_reset_peak(PL_CPU);
    pl_alloc_stats s0 = pl_alloc_get_stats(PL_CPU);
    ck_assert_uint_eq(s0.peak_reserved_bytes, s0.bytes_reserved);
    ck_assert_uint_eq(s0.bytes_cached, 0);
    size_t cap_a = 0, cap_b = 0;
    void *a = pl_alloc(PL_CPU, 3 << 20, &cap_a); /* a class of its own, not cached */
    void *b = pl_alloc(PL_CPU, 5 << 20, &cap_b);
    ck_assert(a && b);
    pl_alloc_stats s1 = pl_alloc_get_stats(PL_CPU);
    ck_assert_uint_eq(s1.bytes_in_use - s0.bytes_in_use, cap_a + cap_b);
    ck_assert_uint_eq(s1.peak_bytes, s1.bytes_in_use);
    ck_assert_uint_eq(s1.bytes_reserved - s0.bytes_reserved, cap_a + cap_b);
    ck_assert_uint_eq(s1.peak_reserved_bytes, s1.bytes_reserved);
    pl_free(PL_CPU, b, cap_b);
    pl_alloc_stats s2 = pl_alloc_get_stats(PL_CPU);
    ck_assert_uint_eq(s2.bytes_in_use, s1.bytes_in_use - cap_b);
    ck_assert_uint_eq(s2.peak_bytes, s1.peak_bytes);       /* a peak stays */
    ck_assert_uint_eq(s2.bytes_reserved, s1.bytes_reserved); /* cached, still reserved */
    pl_alloc_reset_peak(PL_CPU);
    pl_alloc_stats s3 = pl_alloc_get_stats(PL_CPU);
    ck_assert_uint_eq(s3.peak_bytes, s2.bytes_in_use);
    ck_assert_uint_eq(s3.peak_reserved_bytes, s2.bytes_reserved);
    /* reuse from the cache: allocated rises again, reserved does not */
    void *b2 = pl_alloc(PL_CPU, 5 << 20, NULL);
    pl_alloc_stats s4 = pl_alloc_get_stats(PL_CPU);
    ck_assert_uint_eq(s4.bytes_reserved, s3.bytes_reserved);
    ck_assert_uint_eq(s4.peak_bytes, s1.bytes_in_use);
    pl_free(PL_CPU, b2, cap_b);
    pl_free(PL_CPU, a, cap_a);
    pl_alloc_empty_cache(PL_CPU);
    pl_alloc_stats s5 = pl_alloc_get_stats(PL_CPU);
    ck_assert_uint_eq(s5.bytes_reserved, s0.bytes_reserved);
    ck_assert_uint_eq(s5.peak_reserved_bytes, s3.peak_reserved_bytes); /* peak kept */
}
END_TEST

/* A miss in host memory takes a cached block up to 1/2 larger (alloc.c:
 * batches whose rows vary reuse the last one's blocks), not one larger
 * than that, and the block handed out is the cached one's size. */
START_TEST(host_miss_reuses_a_block_up_to_half_larger) {
    pl_alloc_empty_cache(PL_CPU);
    size_t cap = 0, cap2 = 0;
    void *a = pl_alloc(PL_CPU, (size_t)29 << 20, &cap);
    ck_assert(a);
    pl_free(PL_CPU, a, cap);
    pl_alloc_stats s0 = pl_alloc_get_stats(PL_CPU);
    void *b = pl_alloc(PL_CPU, (size_t)23 << 20, &cap2); /* 29 MiB is < 1/2 larger */
    pl_alloc_stats s1 = pl_alloc_get_stats(PL_CPU);
    ck_assert(b);
    ck_assert_uint_eq(s1.system_allocs, s0.system_allocs);
    ck_assert_uint_eq(cap2, cap);
    pl_free(PL_CPU, b, cap2);
    void *c = pl_alloc(PL_CPU, (size_t)17 << 20, &cap2); /* 29 MiB is > 1/2 larger */
    pl_alloc_stats s2 = pl_alloc_get_stats(PL_CPU);
    ck_assert(c);
    ck_assert_uint_eq(s2.system_allocs, s1.system_allocs + 1);
    pl_free(PL_CPU, c, cap2);
    pl_alloc_empty_cache(PL_CPU);
}
END_TEST

START_TEST(random_fill_is_thread_count_independent) {
    pl_tensor *a = pl_tensor_empty(PL_F32, PL_SHAPE(300001), PL_CPU);
    pl_tensor *b = pl_tensor_empty(PL_F32, PL_SHAPE(300001), PL_CPU);
    omp_set_num_threads(1);
    pl_tensor_normal_(a, 0, 1, 7, 3);
    omp_set_num_threads(2);
    pl_tensor_normal_(b, 0, 1, 7, 3);
    ck_assert(memcmp(pl_tensor_data(a), pl_tensor_data(b), 300001 * 4) == 0);
    double m = 0, v = 0;
    for (int i = 0; i < 300001; i++) m += pl_tensor_get(a, i);
    m /= 300001;
    for (int i = 0; i < 300001; i++) v += pow(pl_tensor_get(a, i) - m, 2);
    v /= 300001;
    ck_assert_msg(fabs(m) < 0.01 && fabs(v - 1) < 0.02, "mean %g var %g", m, v);
    pl_tensor_release(a);
    pl_tensor_release(b);
}
END_TEST

/* custom op: y = x^2 (elementwise), backward dx = 2 x dy */
static pl_status sq_infer(const pl_kernel_args *a, int *n_out, pl_dtype *dt, int *nd,
                          int64_t (*shapes)[PL_MAX_DIMS]) {
    *n_out = 1;
    dt[0] = PL_F32;
    nd[0] = a->in[0]->ndim;
    memcpy(shapes[0], a->in[0]->shape, sizeof(int64_t) * PL_MAX_DIMS);
    return PL_OK;
}
static pl_status sq_fwd(const pl_kernel_args *a) {
    const float *x = pl_tensor_data(a->in[0]);
    float *y = pl_tensor_data(a->out[0]);
    for (int64_t i = 0; i < pl_tensor_numel(a->in[0]); i++) y[i] = x[i] * x[i];
    return PL_OK;
}
static pl_status sq_bwd(const pl_kernel_args *a) {
    const float *g = pl_tensor_data(a->in[0]), *x = pl_tensor_data(a->in[1]);
    float *dx = pl_tensor_data(a->out[0]);
    for (int64_t i = 0; i < pl_tensor_numel(a->in[1]); i++) dx[i] = 2 * x[i] * g[i];
    return PL_OK;
}
static const pl_custom_op sq_op = {"test_square", sq_infer, {sq_fwd, NULL}, {sq_bwd, NULL}, 0};
static const pl_custom_op nograd_op = {"test_nograd", sq_infer, {sq_fwd, NULL}, {NULL, NULL}, 0};

START_TEST(backward_accumulates_through_custom_op) {
    int id = pl_custom_op_register(&sq_op);
    ck_assert_int_ge(id, PL_OP_CUSTOM_BASE);
    pl_frame_begin();
    pl_tensor *x = pl_tensor_from_data(PL_F32, PL_SHAPE(1), (float[]){3}, PL_CPU);
    pl_tensor_set_requires_grad(x, true);
    pl_tensor *y = pl_custom_op_apply(id, &x, 1, NULL, NULL);
    pl_tensor *z = pl_custom_op_apply(id, &y, 1, NULL, NULL); /* x^4 */
    ck_assert_ptr_nonnull(z);
    ck_assert(z->requires_grad);
    ck_assert_int_eq(pl_tape_size(), 2);
    PL_CK_OK(pl_backward(z, 1.0));
    ck_assert_int_eq(pl_tape_size(), 0); /* tape cleared, saved tensors released */
    ck_assert_float_eq_tol(pl_tensor_get(x->grad, 0), 4 * 27.0f, 1e-4); /* d x^4 = 4x^3 */
    /* a second backward accumulates: + 0.5 * d(x^2) = 0.5 * 2 * 3 */
    PL_CK_OK(pl_backward(pl_custom_op_apply(id, &x, 1, NULL, NULL), 0.5));
    ck_assert_float_eq_tol(pl_tensor_get(x->grad, 0), 111.0f, 1e-4);
    /* backward of a tensor that was not recorded is an error, not a crash */
    ck_assert_int_eq(pl_backward(x, 1.0), PL_ERR_INVALID);
    /* an op without backward is refused when recorded, naming the op */
    int nid = pl_custom_op_register(&nograd_op);
    ck_assert_ptr_null(pl_custom_op_apply(nid, &x, 1, NULL, NULL));
    ck_assert_ptr_nonnull(strstr(pl_error_message(), "test_nograd"));
    /* but it runs under no_grad, recording nothing */
    pl_no_grad_begin();
    ck_assert_ptr_nonnull(pl_custom_op_apply(nid, &x, 1, NULL, NULL));
    ck_assert_int_eq(pl_tape_size(), 0);
    pl_no_grad_end();
    pl_frame_end();
}
END_TEST

START_TEST(frames_release_what_they_own) {
    pl_alloc_stats before = pl_alloc_get_stats(PL_CPU);
    pl_frame_begin();
    pl_tensor *kept = NULL;
    for (int i = 0; i < 10; i++) {
        pl_tensor *t = pl_tensor_zeros(PL_F32, PL_SHAPE(1000), PL_CPU);
        if (i == 3) kept = pl_frame_keep(t);
    }
    pl_frame_end();
    pl_alloc_stats mid = pl_alloc_get_stats(PL_CPU);
    ck_assert_uint_gt(mid.bytes_in_use, before.bytes_in_use);
    pl_tensor_release(kept);
    pl_alloc_stats after = pl_alloc_get_stats(PL_CPU);
    ck_assert_uint_eq(after.bytes_in_use, before.bytes_in_use);
}
END_TEST

START_TEST(frame_end_keep_hands_the_result_to_the_enclosing_frame) {
    pl_alloc_stats before = pl_alloc_get_stats(PL_CPU);
    pl_frame_begin();
    pl_frame_begin();
    for (int i = 0; i < 5; i++) pl_tensor_zeros(PL_F32, PL_SHAPE(1000), PL_CPU);
    pl_tensor *kept = pl_tensor_full(PL_F32, PL_SHAPE(1000), 3.0, PL_CPU);
    ck_assert_ptr_eq(pl_frame_end_keep(kept), kept);
    /* the five temporaries are gone, the kept tensor is alive in the outer frame */
    pl_alloc_stats mid = pl_alloc_get_stats(PL_CPU);
    ck_assert_uint_eq(mid.bytes_in_use - before.bytes_in_use, 4096);
    ck_assert_float_eq(pl_tensor_get(kept, 999), 3.0f);
    ck_assert_ptr_null(pl_frame_end_keep(NULL)); /* ends the outer frame: releases kept */
    pl_alloc_stats after = pl_alloc_get_stats(PL_CPU);
    ck_assert_uint_eq(after.bytes_in_use, before.bytes_in_use);
}
END_TEST

START_TEST(nf4_tensor_is_refused_by_copy_conversion) {
    pl_tensor *q = pl_tensor_empty(PL_NF4, PL_SHAPE(64), PL_CPU);
    pl_tensor *f = pl_tensor_empty(PL_F32, PL_SHAPE(64), PL_CPU);
    pl_tensor_set_name(q, "w_q");
    ck_assert_int_eq(pl_tensor_copy_(f, q), PL_ERR_DTYPE);
    ck_assert_ptr_nonnull(strstr(pl_error_message(), "w_q"));
    ck_assert_uint_eq(pl_tensor_nbytes(q), 32);
    pl_tensor_release(q);
    pl_tensor_release(f);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("tensor");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, bf16_rounds_to_nearest_even);
    tcase_add_test(tc, f16_conversion_matches_ieee);
    tcase_add_test(tc, views_share_storage_and_check_bounds);
    tcase_add_test(tc, allocator_reaches_steady_state);
    tcase_add_test(tc, allocator_reports_allocated_and_reserved_peaks);
    tcase_add_test(tc, host_miss_reuses_a_block_up_to_half_larger);
    tcase_add_test(tc, random_fill_is_thread_count_independent);
    tcase_add_test(tc, backward_accumulates_through_custom_op);
    tcase_add_test(tc, frames_release_what_they_own);
    tcase_add_test(tc, frame_end_keep_hands_the_result_to_the_enclosing_frame);
    tcase_add_test(tc, nf4_tensor_is_refused_by_copy_conversion);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return pl_test_run(suite()); }
