/* test_autocast_cache.c - what autocast keeps and casts. The cast cache
 * (autocast_cache.c): inside a scope, a trainable parameter used by several
 * matmuls / linears is cast to bf16 once; its gradient equals the uncached
 * one; a cast made with grad mode off is not reused with grad mode on (the
 * gradient would be lost); outside a scope, and for activations and frozen
 * weights, every use casts; the scope's end drops the cache's references.
 * And a frozen parameter's bf16 copy is not kept on the tape: backward casts
 * it again (tape.c, pl_autocast_recast_hint), with the same gradients. A
 * tensor is a parameter while a pl_params list holds it (param_lists). */
#include <math.h>
#include <string.h>

#include "internal.h"
#include "pl_test.h"

/* W.grad after loss = sum(linear(x, W)^2) + sum(linear(x2, W)) under bf16
 * autocast, with the cache scope open or not; stats of the forward */
static pl_tensor *two_uses_grad(bool scope, pl_autocast_cache_stats *st) {
    pl_tensor *w = PL_CK_NOTNULL(pl_test_randn(PL_SHAPE(8, 16), 3));
    pl_tensor_set_requires_grad(w, true);
    PL_CK_OK(pl_autocast_begin(PL_BF16));
    pl_frame_begin();
    pl_tensor *x = pl_test_randn(PL_SHAPE(4, 16), 4), *x2 = pl_test_randn(PL_SHAPE(5, 16), 5);
    pl_autocast_cache_stats_reset();
    if (scope) pl_autocast_cache_begin();
    pl_tensor *y1 = pl_linear(x, w, NULL), *y2 = pl_linear(x2, w, NULL);
    pl_tensor *loss = pl_add(pl_sum(pl_cast(pl_mul(y1, y1), PL_F32), PL_ALL_DIMS, false),
                             pl_sum(pl_cast(y2, PL_F32), PL_ALL_DIMS, false));
    if (scope) pl_autocast_cache_end();
    *st = pl_autocast_cache_stats_get();
    PL_CK_OK(pl_backward(PL_CK_NOTNULL(loss), 1.0));
    pl_frame_end();
    pl_autocast_end();
    ck_assert_ptr_nonnull(w->grad);
    pl_tensor *g = pl_tensor_retain(w->grad);
    pl_tensor_release(w);
    return g;
}

START_TEST(a_parameter_used_twice_is_cast_once_with_the_same_gradient) {
    pl_autocast_cache_stats on, off;
    pl_tensor *g_on = two_uses_grad(true, &on), *g_off = two_uses_grad(false, &off);
    /* x, x2 and W twice: 4 casts asked; the second W is a hit */
    ck_assert_uint_eq(on.casts_requested, 4);
    ck_assert_uint_eq(on.casts, 3);
    ck_assert_uint_eq(on.hits, 1);
    ck_assert_uint_eq(off.casts, 4);
    ck_assert_uint_eq(off.hits, 0);
    /* the same values reach W.grad (a + b in either order is exact) */
    ck_assert_double_eq(pl_test_max_abs_diff(g_on, g_off), 0.0);
    double norm = 0;
    for (int64_t i = 0; i < pl_tensor_numel(g_on); i++) norm += fabs(pl_tensor_get(g_on, i));
    ck_assert_msg(norm > 0, "W.grad is zero: the cached cast cut the gradient");
    pl_tensor_release(g_on);
    pl_tensor_release(g_off);
}
END_TEST

/* the router's pattern: a no-grad pass, then the trained pass, one forward */
START_TEST(a_cast_made_without_grad_is_not_reused_with_grad) {
    pl_tensor *w = PL_CK_NOTNULL(pl_test_randn(PL_SHAPE(8, 16), 7));
    pl_tensor_set_requires_grad(w, true);
    PL_CK_OK(pl_autocast_begin(PL_BF16));
    pl_frame_begin();
    pl_tensor *x = pl_test_randn(PL_SHAPE(4, 16), 8);
    pl_autocast_cache_stats_reset();
    pl_autocast_cache_begin();
    pl_no_grad_begin();
    pl_tensor *y0 = pl_linear(x, w, NULL);
    pl_tensor *y0b = pl_linear(x, w, NULL); /* no grad after no grad: a hit */
    pl_no_grad_end();
    pl_tensor *y = pl_linear(x, w, NULL);
    pl_tensor *y2 = pl_linear(x, w, NULL); /* grad after grad: a hit */
    pl_autocast_cache_end();
    pl_autocast_cache_stats s = pl_autocast_cache_stats_get();
    ck_assert_ptr_nonnull(y0);
    ck_assert_ptr_nonnull(y0b);
    ck_assert(!y0->requires_grad);
    ck_assert(y->requires_grad && y2->requires_grad);
    ck_assert_uint_eq(s.hits, 2);
    PL_CK_OK(pl_backward(pl_sum(pl_cast(pl_add(y, y2), PL_F32), PL_ALL_DIMS, false), 1.0));
    ck_assert_msg(w->grad != NULL, "no gradient reached W through the grad-mode uses");
    /* dL/dW[n, k] = 2 * sum_m bf16(x[m, k]) (both uses), up to bf16 rounding */
    double worst = 0;
    for (int64_t n = 0; n < 8; n++)
        for (int64_t k = 0; k < 16; k++) {
            double want = 0;
            for (int64_t m = 0; m < 4; m++)
                want += 2.0 * pl_bf16_to_f32(pl_f32_to_bf16((float)pl_tensor_get(x, m * 16 + k)));
            double d = fabs(pl_tensor_get(w->grad, n * 16 + k) - want);
            worst = d > worst ? d : worst;
        }
    pl_frame_end();
    pl_autocast_end();
    ck_assert_msg(worst < 0.05, "W.grad differs from 2 * sum_m x[m, k] by %g", worst);
    pl_tensor_release(w);
}
END_TEST

/* activations and frozen weights are cast at each use; outside a scope
 * nothing is cached; the scope's end releases its references */
START_TEST(only_trainable_leaves_inside_a_scope_are_cached) {
    pl_tensor *w = PL_CK_NOTNULL(pl_test_randn(PL_SHAPE(8, 16), 9)); /* frozen */
    pl_tensor *v = PL_CK_NOTNULL(pl_test_randn(PL_SHAPE(8, 16), 10));
    pl_tensor_set_requires_grad(v, true);
    int refs = v->refcount;
    PL_CK_OK(pl_autocast_begin(PL_BF16));
    pl_frame_begin();
    pl_tensor *x = pl_test_randn(PL_SHAPE(4, 16), 11);
    pl_autocast_cache_stats_reset();
    pl_linear(x, v, NULL);
    pl_linear(x, v, NULL); /* no scope: cast again */
    ck_assert_uint_eq(pl_autocast_cache_stats_get().hits, 0);
    pl_autocast_cache_begin();
    pl_linear(x, w, NULL);
    pl_linear(x, w, NULL); /* frozen: cast again */
    pl_linear(x, v, NULL);
    ck_assert_int_gt(v->refcount, refs); /* the cache holds v */
    pl_autocast_cache_end();
    pl_autocast_cache_stats s = pl_autocast_cache_stats_get();
    ck_assert_uint_eq(s.hits, 0);
    ck_assert_uint_eq(s.casts, s.casts_requested);
    pl_tape_clear();
    pl_frame_end();
    pl_autocast_end();
    ck_assert_int_eq(v->refcount, refs); /* and no longer */
    pl_tensor_release(w);
    pl_tensor_release(v);
}
END_TEST

/* "a parameter" is a count on the tensor (param_lists), one per pl_params
 * list holding it: the tape asks the tensor, not the run objects */
START_TEST(a_tensor_is_a_parameter_while_some_list_holds_it) {
    pl_tensor *w = PL_CK_NOTNULL(pl_test_randn(PL_SHAPE(4, 4), 31));
    pl_tensor *other = PL_CK_NOTNULL(pl_test_randn(PL_SHAPE(4, 4), 32));
    pl_params *a = pl_params_new(), *b = pl_params_new();
    ck_assert(!pl_tensor_is_param(w));
    PL_CK_OK(pl_params_add(a, "w", w, 0, NULL));
    PL_CK_OK(pl_params_add(b, "w", w, 0, NULL));
    ck_assert_int_eq(w->param_lists, 2);
    pl_tensor *v = PL_CK_NOTNULL(pl_tensor_view_owned(w));
    ck_assert(!pl_tensor_is_param(v)); /* a view is a new header */
    pl_tensor_release(v);
    pl_params_free(a);
    ck_assert(pl_tensor_is_param(w)); /* b still holds it */
    PL_CK_OK(pl_params_replace(b, 0, other));
    ck_assert(!pl_tensor_is_param(w));
    ck_assert(pl_tensor_is_param(other));
    pl_params_free(b);
    ck_assert(!pl_tensor_is_param(other));
    pl_tensor_release(w);
    pl_tensor_release(other);
}
END_TEST

/* x @ W^T under bf16 autocast with W frozen, x trainable: the tape's bytes
 * and x's gradient, W held by a pl_params list (a parameter) or not */
static pl_tensor *frozen_weight_step(bool registered, size_t *tape_matmul) {
    pl_params *ps = pl_params_new();
    pl_tensor *w = PL_CK_NOTNULL(pl_test_randn(PL_SHAPE(64, 96), 21)); /* frozen */
    pl_tensor *x = PL_CK_NOTNULL(pl_test_randn(PL_SHAPE(3, 96), 22));
    pl_tensor_set_requires_grad(x, true);
    if (registered) PL_CK_OK(pl_params_add(ps, "layer.weight", w, 0, NULL));
    ck_assert(pl_tensor_is_param(w) == registered);
    PL_CK_OK(pl_autocast_begin(PL_BF16));
    pl_frame_begin();
    pl_tensor *y = PL_CK_NOTNULL(pl_linear(pl_mul(x, x), w, NULL)); /* x*x: not a leaf */
    pl_tensor *loss = pl_sum(pl_cast(pl_mul(y, y), PL_F32), PL_ALL_DIMS, false);
    size_t per[PL_OP_COUNT], total;
    PL_CK_OK(pl_tape_held_bytes(per, PL_OP_COUNT, &total));
    *tape_matmul = per[PL_OP_MATMUL];
    PL_CK_OK(pl_backward(PL_CK_NOTNULL(loss), 1.0));
    pl_frame_end();
    pl_autocast_end();
    pl_tensor *g = pl_tensor_retain(x->grad);
    pl_params_free(ps);
    ck_assert(!pl_tensor_is_param(w));
    pl_tensor_release(w);
    pl_tensor_release(x);
    return g;
}

START_TEST(a_frozen_parameters_copy_is_cast_again_in_backward_not_kept) {
    size_t kept_param, kept_plain;
    pl_tensor *g_param = frozen_weight_step(true, &kept_param);
    pl_tensor *g_plain = frozen_weight_step(false, &kept_plain);
    /* the matmul keeps x's bf16 copy either way (3 x 96), W's (64 x 96)
     * only when W is not a parameter */
    size_t wbytes = 64 * 96 * sizeof(uint16_t);
    ck_assert_msg(kept_plain >= kept_param + wbytes,
                  "tape's matmul bytes: %zu with W a parameter, %zu without; W's copy is %zu",
                  kept_param, kept_plain, wbytes);
    ck_assert_msg(kept_param < wbytes, "the tape kept %zu bytes for the matmul, W's copy is %zu",
                  kept_param, wbytes);
    /* the same bf16 values in backward: the same gradient, bit for bit */
    ck_assert_ptr_nonnull(g_param);
    ck_assert_double_eq(pl_test_max_abs_diff(g_param, g_plain), 0.0);
    pl_tensor_release(g_param);
    pl_tensor_release(g_plain);
}
END_TEST

int main(void) {
    Suite *s = suite_create("autocast_cache");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, a_parameter_used_twice_is_cast_once_with_the_same_gradient);
    tcase_add_test(tc, a_cast_made_without_grad_is_not_reused_with_grad);
    tcase_add_test(tc, only_trainable_leaves_inside_a_scope_are_cached);
    tcase_add_test(tc, a_frozen_parameters_copy_is_cast_again_in_backward_not_kept);
    tcase_add_test(tc, a_tensor_is_a_parameter_while_some_list_holds_it);
    suite_add_tcase(s, tc);
    return pl_test_run(s);
}
