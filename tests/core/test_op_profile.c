/* test_op_profile.c - PL_PROFILE_OPS's table (core/src/tensor/op_profile.c): every
 * forward and backward kernel the core dispatches is counted under its op,
 * pass and dtype, on the CPU and on the strict device; nothing is counted
 * while it is off; the report lists the rows largest first. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend_loader.h"
#include "internal.h"
#include "pl_test.h"
#include "registry.h"

static char *report(void) {
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    ck_assert_ptr_nonnull(f);
    pl_op_profile_report(f);
    fclose(f);
    return buf;
}

/* the row of op NAME and PASS: its call count, or -1 when absent */
static long calls(const char *rep, const char *name, const char *pass) {
    for (const char *line = rep; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
        char op[32], ps[16], dt[16];
        long c;
        if (sscanf(line, " %31s %15s %15s %ld", op, ps, dt, &c) == 4 && !strcmp(op, name) &&
            !strcmp(ps, pass))
            return c;
    }
    return -1;
}

static void step(pl_device d) {
    pl_frame_begin();
    pl_tensor *a = pl_tensor_to(pl_test_randn(PL_SHAPE(4, 3), 1), PL_F32, d);
    pl_tensor *w = pl_tensor_to(pl_test_randn(PL_SHAPE(5, 3), 2), PL_F32, d);
    pl_tensor_set_requires_grad(w, true);
    pl_tensor *y = pl_sum(pl_relu(pl_linear(a, w, NULL)), PL_ALL_DIMS, false);
    PL_CK_OK(pl_backward(y, 1.0));
    pl_frame_end(); /* w, its gradient and the rest go with the frame */
}

START_TEST(counts_forward_and_backward_kernels_by_op) {
    pl_registry *reg = pl_registry_new();
    ck_assert_ptr_nonnull(reg);
    PL_CK_OK(pl_registry_add_dir(reg, PL_TEST_PLUGIN_DIR));
    PL_CK_OK(pl_backend_load_named(reg, PL_DEVICE_CUDA, "strict")); /* the GPU stand-in */
    pl_registry_free(reg);
    pl_device devs[2] = {PL_CPU, {PL_DEVICE_CUDA, 0}};
    for (int k = 0; k < 2; k++) {
        pl_op_profile_enable(false);
        step(devs[k]);
        char *off = report();
        ck_assert_msg(!off || !*off, "counted while off: %s", off);
        free(off);
        pl_op_profile_enable(true);
        step(devs[k]);
        step(devs[k]);
        char *rep = report();
        ck_assert_ptr_nonnull(strstr(rep, "op profile (PL_PROFILE_OPS=1"));
        ck_assert_int_eq(calls(rep, pl_op_name(PL_OP_RELU), "forward"), 2);
        ck_assert_int_eq(calls(rep, pl_op_name(PL_OP_RELU), "backward"), 2);
        ck_assert_int_ge(calls(rep, pl_op_name(PL_OP_SUM), "forward"), 2);
        ck_assert_int_eq(calls(rep, "embedding", "forward"), -1);
        free(rep);
        pl_op_profile_enable(false);
    }
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("op_profile");
    TCase *tc = tcase_create("op_profile");
    tcase_add_test(tc, counts_forward_and_backward_kernels_by_op);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    return pl_test_run(suite());
}
