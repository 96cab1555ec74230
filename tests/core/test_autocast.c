/* test_autocast.c - autocast is a property of the run's context, read per
 * thread (plugin.h, "Autocast"; torch.autocast): the current context's
 * dtype reaches pl_matmul, a scope overrides it until its end (nested, f32
 * turning it off), another thread sees neither, and the deprecated
 * pl_autocast_set writes the current context. */
#include <pthread.h>
#include <string.h>

#include "pipeline/pipeline.h"
#include "pl_test.h"

static pl_dtype matmul_dtype(void) {
    pl_tensor *a = PL_CK_NOTNULL(pl_test_randn(PL_SHAPE(3, 8), 1));
    pl_tensor *b = PL_CK_NOTNULL(pl_test_randn(PL_SHAPE(5, 8), 2));
    pl_tensor *y = PL_CK_NOTNULL(pl_matmul(a, b, false, true));
    pl_dtype dt = y->dtype;
    pl_tensor_release(y);
    pl_tensor_release(a);
    pl_tensor_release(b);
    return dt;
}

START_TEST(the_current_contexts_autocast_reaches_matmul) {
    ck_assert_ptr_null(pl_run_context_current());
    ck_assert_int_eq(pl_autocast_get(), PL_F32);
    ck_assert_int_eq(matmul_dtype(), PL_F32);
    pl_run_context ctx = {.device = PL_CPU, .autocast = PL_BF16};
    ck_assert_ptr_null(pl_run_context_make_current(&ctx));
    ck_assert_ptr_eq(pl_run_context_current(), &ctx);
    ck_assert_int_eq(matmul_dtype(), PL_BF16);
    ctx.autocast = PL_F16; /* read at each op, not copied */
    ck_assert_int_eq(matmul_dtype(), PL_F16);
    pl_run_context other = {.device = PL_CPU}; /* a zeroed context: autocast off */
    ck_assert_ptr_eq(pl_run_context_make_current(&other), &ctx);
    ck_assert_int_eq(matmul_dtype(), PL_F32);
    ck_assert_ptr_eq(pl_run_context_make_current(&ctx), &other);
    ck_assert_ptr_eq(pl_run_context_make_current(NULL), &ctx);
    ck_assert_int_eq(matmul_dtype(), PL_F32);
}
END_TEST

START_TEST(scopes_nest_and_override_the_context_until_their_end) {
    pl_run_context ctx = {.device = PL_CPU, .autocast = PL_BF16};
    pl_run_context *prev = pl_run_context_make_current(&ctx);
    PL_CK_OK(pl_autocast_begin(PL_F32)); /* torch.autocast(enabled=False) */
    ck_assert_int_eq(matmul_dtype(), PL_F32);
    PL_CK_OK(pl_autocast_begin(PL_F16));
    ck_assert_int_eq(matmul_dtype(), PL_F16);
    pl_autocast_end();
    ck_assert_int_eq(pl_autocast_get(), PL_F32);
    pl_autocast_end();
    ck_assert_int_eq(matmul_dtype(), PL_BF16); /* the context's again */
    pl_autocast_end(); /* none open: nothing */
    ck_assert_int_eq(pl_autocast_get(), PL_BF16);
    ck_assert_int_eq(ctx.autocast, PL_BF16); /* scopes never write the context */
    pl_run_context_make_current(prev);
}
END_TEST

START_TEST(begin_refuses_a_non_float_dtype_and_a_33rd_scope) {
    ck_assert_int_eq(pl_autocast_begin(PL_I64), PL_ERR_DTYPE);
    ck_assert_msg(strstr(pl_error_message(), "i64"), "%s", pl_error_message());
    ck_assert_int_eq(pl_autocast_get(), PL_F32); /* nothing opened */
    for (int i = 0; i < 32; i++) PL_CK_OK(pl_autocast_begin(i % 2 ? PL_BF16 : PL_F16));
    ck_assert_int_eq(pl_autocast_begin(PL_F32), PL_ERR_INVALID);
    ck_assert_int_eq(pl_autocast_get(), PL_BF16); /* the 32nd */
    for (int i = 0; i < 32; i++) pl_autocast_end();
    ck_assert_int_eq(pl_autocast_get(), PL_F32);
    pl_error_clear();
}
END_TEST

static void *other_thread(void *arg) {
    pl_dtype *seen = arg;
    seen[0] = pl_autocast_get();
    seen[1] = pl_run_context_current() ? PL_I64 : PL_F32; /* I64: a context leaked */
    return NULL;
}

START_TEST(another_thread_sees_neither_the_context_nor_the_scope) {
    pl_run_context ctx = {.device = PL_CPU, .autocast = PL_BF16};
    pl_run_context *prev = pl_run_context_make_current(&ctx);
    PL_CK_OK(pl_autocast_begin(PL_F16));
    pl_dtype seen[2] = {PL_U8, PL_U8};
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, other_thread, seen), 0);
    ck_assert_int_eq(pthread_join(th, NULL), 0);
    ck_assert_int_eq(seen[0], PL_F32);
    ck_assert_int_eq(seen[1], PL_F32);
    ck_assert_int_eq(pl_autocast_get(), PL_F16); /* this thread's own */
    pl_autocast_end();
    pl_run_context_make_current(prev);
}
END_TEST

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
START_TEST(deprecated_set_writes_the_current_context) {
    pl_run_context ctx = {.device = PL_CPU};
    pl_run_context *prev = pl_run_context_make_current(&ctx);
    pl_autocast_set(PL_BF16);
    ck_assert_int_eq(ctx.autocast, PL_BF16);
    ck_assert_int_eq(matmul_dtype(), PL_BF16);
    pl_run_context_make_current(prev);
    ck_assert_int_eq(pl_autocast_get(), PL_F32); /* it went with its context */
    /* no context current: this thread's fallback, until set back */
    pl_autocast_set(PL_F16);
    ck_assert_int_eq(matmul_dtype(), PL_F16);
    pl_autocast_set(PL_F32);
    ck_assert_int_eq(pl_autocast_get(), PL_F32);
}
END_TEST
#pragma GCC diagnostic pop

int main(void) {
    Suite *s = suite_create("autocast");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, the_current_contexts_autocast_reaches_matmul);
    tcase_add_test(tc, scopes_nest_and_override_the_context_until_their_end);
    tcase_add_test(tc, begin_refuses_a_non_float_dtype_and_a_33rd_scope);
    tcase_add_test(tc, another_thread_sees_neither_the_context_nor_the_scope);
    tcase_add_test(tc, deprecated_set_writes_the_current_context);
    suite_add_tcase(s, tc);
    return pl_test_run(s);
}
