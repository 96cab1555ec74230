/* test_backend_contract.c - the pl_backend contract of backend.h: kernels
 * are found through the backend's lookup, an op the backend does not
 * implement (or was built without) is PL_ERR_UNSUPPORTED naming op and
 * backend, no op id makes a lookup read past its table, and a table of
 * another layout is refused at registration.
 *
 * The device backend here is a stand-in registered for PL_DEVICE_CUDA: its
 * "device memory" is host memory and its kernels are the CPU's, but its
 * lookup table was "compiled" with an older op list (OLD_OP_COUNT), so it
 * behaves like a backend plugin built before PL_OP_CAST, PL_OP_NF4_MATMUL
 * and PL_OP_LSTM were appended. It also declines relu's backward. */
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pipeline/backend_util.h"
#include "pipeline/optim_math.h"
#include "pl_test.h"

/* ---- the stand-in backend ------------------------------------------------------ */

#define OLD_OP_COUNT PL_OP_CAST /* its op list ended before cast */

static pl_kernel_fn g_old_fwd[OLD_OP_COUNT], g_old_bwd[OLD_OP_COUNT];
static int g_max_asked = -1; /* largest op id the core asked about */
static int g_asked_unknown;  /* lookups for ids >= OLD_OP_COUNT (answered NULL) */

static pl_kernel_fn old_kernel(pl_op op, bool backward) {
    if ((int)op > g_max_asked) g_max_asked = (int)op;
    if ((int)op <= PL_OP_NONE || (int)op >= OLD_OP_COUNT) {
        g_asked_unknown++;
        return NULL;
    }
    return backward ? g_old_bwd[op] : g_old_fwd[op];
}

static int fake_count(void) {
    return 1;
}
static void *fake_alloc(int dev, size_t n) {
    return aligned_alloc(64, (n + 63) & ~(size_t)63);
}
static void fake_free(int dev, void *p) {
    free(p);
}
static pl_status fake_memcpy(void *d, pl_device dd, const void *s, pl_device sd, size_t n) {
    memmove(d, s, n);
    return PL_OK;
}
static pl_status fake_memset(void *d, pl_device dev, int v, size_t n) {
    memset(d, v, n);
    return PL_OK;
}
static pl_status fake_sync(int dev) {
    return PL_OK;
}

static pl_backend g_old = {
    .struct_size = PL_BACKEND_STRUCT_SIZE,
    .name = "oldgpu",
    .type = PL_DEVICE_CUDA,
    .device_count = fake_count,
    .raw_alloc = fake_alloc,
    .raw_free = fake_free,
    .memcpy = fake_memcpy,
    .memset = fake_memset,
    .synchronize = fake_sync,
    .kernel = old_kernel,
};

static const pl_device DEV = {PL_DEVICE_CUDA, 0};

static void register_old(void) {
    const pl_backend *cpu = pl_backend_cpu();
    for (int op = PL_OP_NONE + 1; op < OLD_OP_COUNT; op++) {
        g_old_fwd[op] = pl_backend_kernel(cpu, (pl_op)op, false);
        g_old_bwd[op] = pl_backend_kernel(cpu, (pl_op)op, true);
    }
    g_old_bwd[PL_OP_RELU] = NULL; /* forward only */
    PL_CK_OK(pl_backend_register(&g_old));
    ck_assert_ptr_eq(pl_backend_get(PL_DEVICE_CUDA), &g_old);
}

static pl_tensor *on_device(const float *v, int64_t n, bool grad) {
    pl_tensor *h = PL_CK_NOTNULL(pl_tensor_from_data(PL_F32, 1, (int64_t[]){n}, v, PL_CPU));
    pl_tensor *d = PL_CK_NOTNULL(pl_tensor_to(h, PL_F32, DEV));
    if (grad) pl_tensor_set_requires_grad(d, true);
    return d;
}

/* ---- tests ------------------------------------------------------------------------ */

/* The CPU lookup answers every op it has and NULL for every id it does not
 * know, whatever the id (no read outside its table). */
START_TEST(cpu_lookup_is_bounded) {
    const pl_backend *cpu = pl_backend_cpu();
    ck_assert_uint_eq(cpu->struct_size, PL_BACKEND_STRUCT_SIZE);
    ck_assert(pl_backend_supports(cpu, PL_OP_MATMUL, false));
    ck_assert(pl_backend_supports(cpu, PL_OP_LSTM, true));
    const int bad[] = {PL_OP_NONE,
                       -1,
                       INT_MIN,
                       PL_OP_COUNT,
                       PL_OP_COUNT + 1,
                       PL_OP_COUNT + 500,
                       PL_OP_CUSTOM_BASE,
                       PL_OP_CUSTOM_BASE + 3,
                       INT_MAX};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        for (int bw = 0; bw < 2; bw++)
            ck_assert_msg(pl_backend_kernel(cpu, (pl_op)bad[i], bw) == NULL,
                          "cpu lookup of op id %d (%s) is not NULL", bad[i], bw ? "bwd" : "fwd");
    ck_assert_ptr_null(pl_backend_kernel(NULL, PL_OP_MATMUL, false));
    ck_assert_str_eq(pl_op_name(PL_OP_COUNT), "unknown");
    ck_assert_str_eq(pl_op_name((pl_op)(PL_OP_CUSTOM_BASE + 2)), "custom");
    ck_assert_str_eq(pl_op_name(PL_OP_LSTM), "lstm");
}
END_TEST

/* pl_kernel_table_get (backend_util.h) bounds by the table's PL_OP_COUNT. */
START_TEST(kernel_table_is_bounded) {
    static pl_kernel_table t;
    pl_kernel_fn f = pl_backend_kernel(pl_backend_cpu(), PL_OP_RELU, false);
    pl_kernel_table_set(&t, PL_OP_RELU, f, NULL);
    pl_kernel_table_set(&t, (pl_op)(PL_OP_COUNT + 3), f, f); /* ignored */
    ck_assert_ptr_eq(pl_kernel_table_get(&t, PL_OP_RELU, false), f);
    ck_assert_ptr_null(pl_kernel_table_get(&t, PL_OP_RELU, true));
    ck_assert_ptr_null(pl_kernel_table_get(&t, PL_OP_COUNT, false));
    ck_assert_ptr_null(pl_kernel_table_get(&t, (pl_op)-7, false));
    ck_assert_ptr_null(pl_kernel_table_get(&t, PL_OP_NONE, false));
}
END_TEST

/* Ops the backend has run through its kernels (here: the CPU's). */
START_TEST(supported_op_runs_on_the_backend) {
    register_old();
    const float v[4] = {-1.5f, 0.0f, 2.0f, -3.0f};
    pl_frame_begin();
    pl_tensor *x = on_device(v, 4, false);
    pl_tensor *y = PL_CK_NOTNULL(pl_relu(x));
    ck_assert(pl_device_eq(y->device, DEV));
    pl_tensor *h = PL_CK_NOTNULL(pl_tensor_to(y, PL_F32, PL_CPU));
    const float want[4] = {0, 0, 2, 0};
    for (int i = 0; i < 4; i++)
        ck_assert_float_eq(pl_tensor_f32(h)[i], want[i]);
    pl_frame_end();
}
END_TEST

/* An op appended after the backend was built: the core asks the lookup
 * (which answers NULL without touching its table) and the op fails with
 * PL_ERR_UNSUPPORTED naming the op and the backend. */
START_TEST(op_unknown_to_backend_is_unsupported) {
    register_old();
    const float v[3] = {1, 2, 3};
    pl_frame_begin();
    pl_tensor *x = on_device(v, 3, false);
    g_asked_unknown = 0;
    pl_tensor *y = pl_cast(x, PL_BF16);
    ck_assert_ptr_null(y);
    ck_assert_int_eq(pl_error_status(), PL_ERR_UNSUPPORTED);
    const char *m = pl_error_message();
    ck_assert_msg(strstr(m, "'cast'") && strstr(m, "'oldgpu'"), "message: %s", m);
    ck_assert_int_ge(g_asked_unknown, 1);
    ck_assert_int_eq(g_max_asked, PL_OP_CAST);
    /* the two ops appended last, asked directly */
    ck_assert(!pl_backend_supports(&g_old, PL_OP_NF4_MATMUL, false));
    ck_assert(!pl_backend_supports(&g_old, PL_OP_LSTM, true));
    ck_assert(!pl_backend_supports(&g_old, (pl_op)(PL_OP_COUNT + 10), false));
    pl_error_clear();
    pl_frame_end();
}
END_TEST

/* A backend with a forward but no backward kernel: recording the op with an
 * input that requires grad is refused at once, naming op and backend. */
START_TEST(missing_backward_is_refused_when_recorded) {
    register_old();
    const float v[2] = {1, -1};
    pl_frame_begin();
    pl_tensor *x = on_device(v, 2, true);
    ck_assert_ptr_null(pl_relu(x));
    ck_assert_int_eq(pl_error_status(), PL_ERR_UNSUPPORTED);
    const char *m = pl_error_message();
    ck_assert_msg(strstr(m, "'relu'") && strstr(m, "backward") && strstr(m, "'oldgpu'"),
                  "message: %s", m);
    pl_error_clear();
    /* without grad the forward runs */
    pl_no_grad_begin();
    ck_assert_ptr_nonnull(pl_relu(x));
    pl_no_grad_end();
    pl_tape_clear();
    pl_frame_end();
}
END_TEST

static int g_stats_calls;
static pl_status fake_stats(int dev, uint64_t *cursor, pl_device_stats *out) {
    g_stats_calls++;
    out->utilization = 0.25 + dev;
    out->n_samples = (int)*cursor;
    out->memory_used_bytes = 1e9;
    out->memory_total_bytes = 8e9;
    *cursor += 10;
    return PL_OK;
}

/* pl_backend_device_stats: the CPU and a backend without the field say
 * PL_ERR_UNSUPPORTED with every value NAN; a backend's device_stats is
 * called with the cursor, and only when its struct_size covers the field. */
START_TEST(device_stats_only_from_backends_that_have_them) {
    pl_device_stats ds;
    uint64_t cur = 3;
    ck_assert_int_eq(pl_backend_device_stats(PL_CPU, &cur, &ds), PL_ERR_UNSUPPORTED);
    ck_assert(isnan(ds.utilization) && isnan(ds.memory_used_bytes) && ds.n_samples == 0);
    register_old(); /* device_stats NULL */
    ck_assert_int_eq(pl_backend_device_stats(DEV, &cur, &ds), PL_ERR_UNSUPPORTED);
    ck_assert_msg(strstr(pl_error_message(), "oldgpu has none"), "%s", pl_error_message());
    static pl_backend b;
    b = g_old;
    b.device_stats = fake_stats;
    b.struct_size = (uint32_t)offsetof(pl_backend, device_stats); /* built before the field */
    PL_CK_OK(pl_backend_register(&b));
    ck_assert_int_eq(pl_backend_device_stats(DEV, &cur, &ds), PL_ERR_UNSUPPORTED);
    ck_assert_int_eq(g_stats_calls, 0);
    b.struct_size = PL_BACKEND_STRUCT_SIZE;
    PL_CK_OK(pl_backend_device_stats(DEV, &cur, &ds));
    ck_assert_int_eq(g_stats_calls, 1);
    ck_assert_double_eq(ds.utilization, 0.25);
    ck_assert_int_eq(ds.n_samples, 3);
    ck_assert_double_eq(ds.memory_total_bytes, 8e9);
    ck_assert_uint_eq(cur, 13);
    PL_CK_OK(pl_backend_device_stats(DEV, NULL, &ds)); /* no cursor: a private one from 0 */
    ck_assert_int_eq(ds.n_samples, 0);
}
END_TEST

/* A table of another layout (struct_size too small) or without a lookup is
 * refused with PL_ERR_ABI naming the backend, before any other field is used. */
START_TEST(register_refuses_other_layouts) {
    pl_backend b = g_old;
    b.name = "shortgpu";
    b.struct_size = 8;
    ck_assert_int_eq(pl_backend_register(&b), PL_ERR_ABI);
    ck_assert_msg(strstr(pl_error_message(), "struct_size is 8"), "message: %s",
                  pl_error_message());
    b.struct_size = PL_BACKEND_STRUCT_SIZE;
    b.name = "nolookup";
    b.kernel = NULL;
    ck_assert_int_eq(pl_backend_register(&b), PL_ERR_ABI);
    ck_assert_msg(strstr(pl_error_message(), "nolookup") && strstr(pl_error_message(), "kernel"),
                  "message: %s", pl_error_message());
    pl_error_clear();
    /* the minimal size is the ABI 2.0 layout up to the lookup */
    ck_assert_uint_le(PL_BACKEND_MIN_SIZE, PL_BACKEND_STRUCT_SIZE);
}
END_TEST

/* The CPU backend is the cpu plugin, loaded by the first CPU lookup: one
 * table, registered once; another CPU table is refused naming both, the
 * same one again is PL_OK. Its get_option answers what summary.json reports
 * (pl_backend_info), "unknown" for anything else, and the caller's error
 * state survives the query. */
START_TEST(cpu_backend_is_the_plugin_registered_once) {
    const pl_backend *cpu = pl_backend_get(PL_DEVICE_CPU);
    ck_assert_msg(cpu != NULL, "%s", pl_error_message());
    ck_assert_str_eq(cpu->name, "cpu");
    ck_assert_ptr_eq(pl_backend_cpu(), cpu);
    PL_CK_OK(pl_backend_register(cpu));
    static pl_backend other;
    other = *cpu;
    other.name = "cpu2";
    ck_assert_int_eq(pl_backend_register(&other), PL_ERR_INVALID);
    ck_assert_msg(strstr(pl_error_message(), "'cpu2'") && strstr(pl_error_message(), "'cpu'"),
                  "%s", pl_error_message());
    ck_assert_ptr_eq(pl_backend_get(PL_DEVICE_CPU), cpu);

    char v[128];
    pl_error_set(PL_ERR_SHAPE, "an earlier error");
    const char *g = pl_backend_info(PL_DEVICE_CPU, "cpu_gemm_bf16", v, sizeof v);
    ck_assert_ptr_eq(g, v);
    ck_assert_msg(!strcmp(v, "avx512bf16") || !strcmp(v, "avx2") || !strcmp(v, "scalar"), "%s", v);
    ck_assert_int_eq(pl_error_status(), PL_ERR_SHAPE);
    ck_assert_str_eq(pl_error_message(), "an earlier error");
    pl_error_clear();
    ck_assert_int_gt(atoi(pl_backend_info(PL_DEVICE_CPU, "blas_threads", v, sizeof v)), 0);
    pl_backend_info(PL_DEVICE_CPU, "blas_parallel", v, sizeof v);
    ck_assert_msg(!strcmp(v, "openmp") || !strcmp(v, "pthreads") || !strcmp(v, "serial"), "%s",
                  v);
    pl_backend_info(PL_DEVICE_CPU, "cpu_features", v, sizeof v);
    ck_assert_msg(strcmp(v, "unknown") != 0 && v[0], "%s", v);
    ck_assert_str_eq(pl_backend_info(PL_DEVICE_CPU, "no_such_key", v, sizeof v), "unknown");
    ck_assert_str_eq(pl_backend_info(PL_DEVICE_CUDA, "blas_threads", v, sizeof v), "unknown");
    ck_assert_int_eq(pl_error_status(), PL_OK);
    /* set_option("threads") reaches OpenBLAS's pool */
    ck_assert(PL_BACKEND_HAS(cpu, set_option) && cpu->set_option);
    PL_CK_OK(cpu->set_option("threads", "1"));
    ck_assert_str_eq(pl_backend_info(PL_DEVICE_CPU, "blas_threads", v, sizeof v), "1");
    ck_assert_int_eq(cpu->set_option("threads", "0"), PL_ERR_INVALID);
    ck_assert_int_eq(cpu->set_option("allow_tf32", "true"), PL_ERR_UNSUPPORTED);
}
END_TEST

/* ---- a backend built before the multi-tensor optimizer ops ----------------------- */

static int g_single_calls; /* adamw_step / sgd_step kernel calls on it */
static pl_status counting_single(const pl_kernel_args *a) {
    g_single_calls++;
    return pl_backend_kernel(pl_backend_cpu(), a->op, false)(a);
}
/* Its op list ended before adamw_step_multi: the CPU's kernels below it. */
static pl_kernel_fn pre_multi_kernel(pl_op op, bool backward) {
    if ((int)op <= PL_OP_NONE || (int)op >= PL_OP_ADAMW_STEP_MULTI) return NULL;
    if (!backward && (op == PL_OP_ADAMW_STEP || op == PL_OP_SGD_STEP)) return counting_single;
    return pl_backend_kernel(pl_backend_cpu(), op, backward);
}

/* pl_adamw_step_multi_ / pl_sgd_step_multi_ over a list whose parameters
 * live on the CPU (which has the multi-tensor kernels) and on a backend that
 * lacks them: grouped by device, the CPU's in one call, the others in one
 * per-tensor call each, and the values those of the multi-tensor kernel. */
START_TEST(multi_tensor_step_falls_back_per_tensor_where_the_backend_lacks_it) {
    static pl_backend pre = {.struct_size = PL_BACKEND_STRUCT_SIZE, .name = "premulti",
                             .type = PL_DEVICE_CUDA, .device_count = fake_count,
                             .raw_alloc = fake_alloc, .raw_free = fake_free,
                             .memcpy = fake_memcpy, .memset = fake_memset,
                             .synchronize = fake_sync, .kernel = pre_multi_kernel};
    PL_CK_OK(pl_backend_register(&pre));
    pl_frame_begin();
    for (int sgd = 0; sgd < 2; sgd++) {
        pl_tensor *p[2][4], *m[2][4], *v[2][4];
        pl_adamw_hyper ha[4];
        pl_sgd_hyper hs[4];
        for (int i = 0; i < 4; i++) {
            float pv[5], gv[5], zv[5] = {0};
            for (int e = 0; e < 5; e++) pv[e] = 0.3f * (float)(i - e), gv[e] = 0.1f * (float)(e + i + 1);
            for (int run = 0; run < 2; run++) { /* run 0: one CPU parameter among three; 1: all */
                pl_device d = run || i == 1 ? PL_CPU : DEV;
                p[run][i] = PL_CK_NOTNULL(pl_tensor_from_data(PL_F32, 1, (int64_t[]){5}, pv, d));
                m[run][i] = PL_CK_NOTNULL(pl_tensor_from_data(PL_F32, 1, (int64_t[]){5}, zv, d));
                v[run][i] = PL_CK_NOTNULL(pl_tensor_from_data(PL_F32, 1, (int64_t[]){5}, zv, d));
                p[run][i]->grad = pl_tensor_retain(
                    PL_CK_NOTNULL(pl_tensor_from_data(PL_F32, 1, (int64_t[]){5}, gv, d)));
            }
            ha[i] = (pl_adamw_hyper){.lr = 0.01, .beta1 = 0.9, .beta2 = 0.99, .eps = 1e-8,
                                     .weight_decay = 0.1, .step = 1 + i};
            hs[i] = (pl_sgd_hyper){.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01, .first = true};
        }
        pl_tensor *gl[2][4];
        for (int run = 0; run < 2; run++)
            for (int i = 0; i < 4; i++) gl[run][i] = p[run][i]->grad;
        g_single_calls = 0;
        for (int run = 0; run < 2; run++)
            PL_CK_OK(sgd ? pl_sgd_step_multi_(4, p[run], gl[run], m[run], hs)
                         : pl_adamw_step_multi_(4, p[run], gl[run], m[run], v[run], NULL, ha));
        ck_assert_int_eq(g_single_calls, 3); /* the 3 premulti parameters, one call each */
        for (int i = 0; i < 4; i++) {
            pl_tensor *a = PL_CK_NOTNULL(pl_tensor_to(p[0][i], PL_F32, PL_CPU));
            pl_tensor *b = PL_CK_NOTNULL(pl_tensor_to(m[0][i], PL_F32, PL_CPU));
            ck_assert_int_eq(memcmp(pl_tensor_f32(a), pl_tensor_f32(p[1][i]), 5 * sizeof(float)), 0);
            ck_assert_int_eq(memcmp(pl_tensor_f32(b), pl_tensor_f32(m[1][i]), 5 * sizeof(float)), 0);
            ck_assert_float_ne(pl_tensor_f32(a)[0], 0.3f * (float)i); /* updated */
        }
        for (int run = 0; run < 2; run++)
            for (int i = 0; i < 4; i++) {
                pl_tensor_release(p[run][i]->grad);
                p[run][i]->grad = NULL;
            }
    }
    pl_frame_end();
}
END_TEST

/* A backend built before ABI 2.12 ignores lora_add's dropout bit: it does
 * not answer the setting "lora_add_dropout", so pl_lora_add_dropout records
 * the chain pl_dropout then pl_lora_add on it (a dropout call; the CPU's
 * values, which the fused kernel gives). */
static int g_dropout_calls;
static pl_kernel_fn g_cpu_dropout;
static pl_status counting_dropout(const pl_kernel_args *a) {
    g_dropout_calls++;
    return g_cpu_dropout(a);
}
static pl_kernel_fn pre_lora_drop_kernel(pl_op op, bool backward) {
    if ((int)op <= PL_OP_NONE || (int)op >= PL_OP_COUNT) return NULL;
    if (!backward && op == PL_OP_DROPOUT) return counting_dropout;
    return pl_backend_kernel(pl_backend_cpu(), op, backward);
}

START_TEST(lora_dropout_is_the_chain_where_the_backend_predates_it) {
    static pl_backend pre = {.struct_size = PL_BACKEND_STRUCT_SIZE, .name = "prelora",
                             .type = PL_DEVICE_CUDA, .device_count = fake_count,
                             .raw_alloc = fake_alloc, .raw_free = fake_free,
                             .memcpy = fake_memcpy, .memset = fake_memset,
                             .synchronize = fake_sync, .kernel = pre_lora_drop_kernel};
    g_cpu_dropout = pl_backend_kernel(pl_backend_cpu(), PL_OP_DROPOUT, false);
    PL_CK_OK(pl_backend_register(&pre));
    pl_frame_begin();
    float xv[24], av[12], bv[8];
    for (int i = 0; i < 24; i++) xv[i] = 0.1f * (float)(i % 7) - 0.3f;
    for (int i = 0; i < 12; i++) av[i] = 0.05f * (float)(i - 5);
    for (int i = 0; i < 8; i++) bv[i] = 0.2f - 0.03f * (float)i;
    pl_tensor *out[2];
    for (int run = 0; run < 2; run++) { /* run 0: the old backend; 1: the CPU (fused) */
        pl_device d = run ? PL_CPU : DEV;
        pl_tensor *x = PL_CK_NOTNULL(pl_tensor_from_data(PL_F32, 2, (int64_t[]){4, 6}, xv, d));
        pl_tensor *a = PL_CK_NOTNULL(pl_tensor_from_data(PL_F32, 2, (int64_t[]){2, 6}, av, d));
        pl_tensor *b = PL_CK_NOTNULL(pl_tensor_from_data(PL_F32, 2, (int64_t[]){4, 2}, bv, d));
        g_dropout_calls = 0;
        pl_tensor *o = PL_CK_NOTNULL(pl_lora_add_dropout(NULL, x, a, b, NULL, 2.0, 0.5, 7, 3, true));
        ck_assert_int_eq(g_dropout_calls, run ? 0 : 1);
        out[run] = PL_CK_NOTNULL(pl_tensor_to(o, PL_F32, PL_CPU));
    }
    ck_assert_int_eq(memcmp(pl_tensor_f32(out[0]), pl_tensor_f32(out[1]), 16 * sizeof(float)), 0);
    pl_frame_end();
}
END_TEST

/* A backend without the fused head + loss (no kernel for
 * linear_cross_entropy and no answer to the setting, as CUDA's):
 * pl_linear_cross_entropy records the chain matmul + cross_entropy there
 * (one matmul call forward), and its loss and gradients equal the CPU's
 * fused kernel to f32 rounding (loss within 2e-6 relative, each gradient
 * element within 1e-6 of that gradient's largest magnitude). */
static int g_matmul_calls;
static pl_kernel_fn g_cpu_matmul;
static pl_status counting_matmul(const pl_kernel_args *a) {
    g_matmul_calls++;
    return g_cpu_matmul(a);
}
static pl_kernel_fn no_lce_kernel(pl_op op, bool backward) {
    if ((int)op <= PL_OP_NONE || (int)op >= PL_OP_COUNT) return NULL;
    if (op == PL_OP_LINEAR_CROSS_ENTROPY) return NULL;
    if (!backward && op == PL_OP_MATMUL) return counting_matmul;
    return pl_backend_kernel(pl_backend_cpu(), op, backward);
}

START_TEST(linear_cross_entropy_is_the_chain_where_the_backend_lacks_it) {
    static pl_backend pre = {.struct_size = PL_BACKEND_STRUCT_SIZE, .name = "prelce",
                             .type = PL_DEVICE_CUDA, .device_count = fake_count,
                             .raw_alloc = fake_alloc, .raw_free = fake_free,
                             .memcpy = fake_memcpy, .memset = fake_memset,
                             .synchronize = fake_sync, .kernel = no_lce_kernel};
    g_cpu_matmul = pl_backend_kernel(pl_backend_cpu(), PL_OP_MATMUL, false);
    PL_CK_OK(pl_backend_register(&pre));
    pl_frame_begin();
    enum { N = 70, K = 6, V = 300 };
    static float xv[N * K], wv[V * K];
    int64_t tv[N];
    for (int i = 0; i < N * K; i++) xv[i] = 0.01f * (float)((i * 37) % 101) - 0.5f;
    for (int i = 0; i < V * K; i++) wv[i] = 0.02f * (float)((i * 53) % 89) - 0.9f;
    for (int i = 0; i < N; i++) tv[i] = i % 9 == 4 ? -100 : (i * 41) % V;
    double loss[2];
    pl_tensor *gx[2], *gw[2];
    for (int run = 0; run < 2; run++) { /* run 0: the backend without it; 1: the CPU (fused) */
        pl_device d = run ? PL_CPU : DEV;
        pl_tensor *x = PL_CK_NOTNULL(pl_tensor_from_data(PL_F32, 2, (int64_t[]){N, K}, xv, d));
        pl_tensor *w = PL_CK_NOTNULL(pl_tensor_from_data(PL_F32, 2, (int64_t[]){V, K}, wv, d));
        pl_tensor *t = PL_CK_NOTNULL(pl_tensor_from_data(PL_I64, 1, (int64_t[]){N}, tv, d));
        pl_tensor_set_requires_grad(x, true);
        pl_tensor_set_requires_grad(w, true);
        g_matmul_calls = 0;
        pl_tensor *l = PL_CK_NOTNULL(pl_linear_cross_entropy(x, w, t, -100, 0.0));
        ck_assert_int_eq(g_matmul_calls, run ? 0 : 1);
        loss[run] = pl_tensor_item(l);
        PL_CK_OK(pl_backward(l, 1.0));
        gx[run] = PL_CK_NOTNULL(pl_tensor_to(x->grad, PL_F32, PL_CPU));
        gw[run] = PL_CK_NOTNULL(pl_tensor_to(w->grad, PL_F32, PL_CPU));
    }
    ck_assert_msg(fabs(loss[0] - loss[1]) <= 2e-6 * fabs(loss[1]), "loss: chain %.9g, fused %.9g",
                  loss[0], loss[1]);
    for (int which = 0; which < 2; which++) {
        const float *a = pl_tensor_f32(which ? gw[0] : gx[0]), *b = pl_tensor_f32(which ? gw[1] : gx[1]);
        int64_t n = which ? V * K : N * K;
        double mx = 0;
        for (int64_t i = 0; i < n; i++) mx = fmax(mx, fabs(b[i]));
        ck_assert(mx > 0);
        for (int64_t i = 0; i < n; i++)
            ck_assert_msg(fabs(a[i] - b[i]) <= 1e-6 * mx, "d%s[%lld]: chain %.9g, fused %.9g",
                          which ? "W" : "x", (long long)i, a[i], b[i]);
    }
    pl_frame_end();
}
END_TEST

int main(void) {
    Suite *s = suite_create("backend_contract");
    TCase *tc = tcase_create("lookup");
    tcase_add_test(tc, cpu_lookup_is_bounded);
    tcase_add_test(tc, cpu_backend_is_the_plugin_registered_once);
    tcase_add_test(tc, kernel_table_is_bounded);
    tcase_add_test(tc, supported_op_runs_on_the_backend);
    tcase_add_test(tc, op_unknown_to_backend_is_unsupported);
    tcase_add_test(tc, missing_backward_is_refused_when_recorded);
    tcase_add_test(tc, register_refuses_other_layouts);
    tcase_add_test(tc, device_stats_only_from_backends_that_have_them);
    tcase_add_test(tc, multi_tensor_step_falls_back_per_tensor_where_the_backend_lacks_it);
    tcase_add_test(tc, lora_dropout_is_the_chain_where_the_backend_predates_it);
    tcase_add_test(tc, linear_cross_entropy_is_the_chain_where_the_backend_lacks_it);
    suite_add_tcase(s, tc);
    return pl_test_run(s);
}
