/* test_strict.c - the strict device backend: it loads into the accelerator
 * slot by name, its memory is reachable through copies and kernels only (a
 * host read of a device tensor's data dies with SIGSEGV and a message naming
 * the cause), its kernels give the CPU's bits, and device names parse and
 * print with its name. Every shipped config on it: test_strict_configs.sh;
 * every op: test_backend_conformance under PL_CONFORMANCE_BACKEND=strict. */
#include <signal.h>
#include <stdlib.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "pipeline/alloc.h"
#include "pipeline/graph.h"
#include "pipeline/testing.h"
#include "pl_test.h"

static pl_device g_dev = {PL_DEVICE_CUDA, 0};

static void load(void) { PL_CK_OK(pl_harness_load_backend_named(PL_DEVICE_CUDA, "strict")); }

/* Loaded by name; "strict" parses to the accelerator slot and prints back;
 * "cuda" is refused while strict holds the slot, and so is loading cuda. */
START_TEST(loads_and_names_devices) {
    load();
    const pl_backend *b = pl_backend_get(PL_DEVICE_CUDA);
    ck_assert_ptr_nonnull(b);
    ck_assert_str_eq(b->name, "strict");
    /* the ABI 2.2 fields: background copies and run-wide settings */
    ck_assert(PL_BACKEND_HAS(b, set_option) && b->set_option && b->memcpy_h2d_background);
    PL_CK_OK(b->set_option("allow_tf32", "true"));
    /* its (the CPU's) optimizer kernels obey the found_inf flag: the trainer keeps
     * the loss on the device (step_values.c) */
    PL_CK_OK(b->set_option("optimizer_found_inf", "true"));
    ck_assert_int_eq(b->set_option("no_such_setting", "1"), PL_ERR_UNSUPPORTED);
    pl_error_clear();
    pl_device d;
    PL_CK_OK(pl_device_parse("strict", &d));
    ck_assert(pl_device_eq(d, g_dev));
    PL_CK_OK(pl_device_parse("strict:0", &d));
    char buf[32];
    ck_assert_str_eq(pl_device_str(d, buf, sizeof buf), "strict:0");
    ck_assert_int_eq(pl_device_parse("cuda", &d), PL_ERR_DEVICE);
    ck_assert_msg(strstr(pl_error_message(), "'strict'"), "%s", pl_error_message());
    ck_assert_int_eq(pl_device_parse("strict:x", &d), PL_ERR_INVALID);
    ck_assert_int_eq(pl_harness_load_backend_named(PL_DEVICE_CUDA, "cuda"), PL_ERR_DEVICE);
    ck_assert_msg(strstr(pl_error_message(), "already holds"), "%s", pl_error_message());
    pl_error_clear();
}
END_TEST

/* Copies in and out, memset, and a kernel: the CPU's values, bit for bit. */
START_TEST(copies_and_kernels) {
    load();
    pl_frame_begin();
    pl_tensor *x = pl_test_randn(PL_SHAPE(5, 7), 11), *w = pl_test_randn(PL_SHAPE(3, 7), 12);
    pl_tensor *xd = PL_CK_NOTNULL(pl_tensor_to(x, PL_F32, g_dev));
    pl_tensor *wd = PL_CK_NOTNULL(pl_tensor_to(w, PL_BF16, g_dev)); /* cast on the device */
    pl_tensor *y = PL_CK_NOTNULL(pl_gelu(pl_linear(x, pl_cast(pl_cast(w, PL_BF16), PL_F32), NULL), false));
    pl_tensor *yd = PL_CK_NOTNULL(pl_gelu(pl_linear(xd, pl_cast(wd, PL_F32), NULL), false));
    ck_assert(pl_device_eq(yd->device, g_dev));
    pl_tensor *yh = PL_CK_NOTNULL(pl_tensor_to(yd, PL_F32, PL_CPU));
    ck_assert_double_eq(pl_test_max_abs_diff(y, yh), 0.0);
    pl_tensor *z = PL_CK_NOTNULL(pl_tensor_zeros(PL_F32, 1, (int64_t[]){1000}, g_dev));
    ck_assert_double_eq(pl_tensor_item(pl_sum(z, PL_ALL_DIMS, false)), 0.0);
    ck_assert_double_eq(pl_tensor_item(pl_sum(xd, PL_ALL_DIMS, false)),
                        pl_tensor_item(pl_sum(x, PL_ALL_DIMS, false)));
    pl_frame_end();
}
END_TEST

/* Run fn in a child; its exit: the signal that killed it, -1 when it exited
 * non-zero (AddressSanitizer's SEGV handler, which the backend's handler
 * hands over to, reports and exits), 0 on a clean exit; and the first bytes
 * of its stderr. */
static int in_child(void (*fn)(void), char *err, size_t n) {
    int p[2];
    ck_assert_int_eq(pipe(p), 0);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(p[1], 2);
        close(p[0]);
        fn();
        _exit(0);
    }
    close(p[1]);
    size_t got = 0;
    ssize_t r;
    while (got + 1 < n && (r = read(p[0], err + got, n - 1 - got)) > 0) got += (size_t)r;
    err[got] = 0;
    close(p[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    return WIFSIGNALED(st) ? WTERMSIG(st) : (WEXITSTATUS(st) ? -1 : 0);
}

static volatile float g_sink;

static void host_reads_device(void) {
    load();
    pl_tensor *xd = pl_tensor_to(pl_test_randn(PL_SHAPE(4, 4), 3), PL_F32, g_dev);
    g_sink = ((float *)pl_tensor_data(xd))[5]; /* what a GPU would not allow */
}

static void host_reads_copy(void) {
    load();
    pl_tensor *xd = pl_tensor_to(pl_test_randn(PL_SHAPE(4, 4), 3), PL_F32, g_dev);
    pl_tensor *h = pl_tensor_to(xd, PL_F32, PL_CPU);
    g_sink = ((float *)pl_tensor_data(h))[5]; /* the right way: fine */
}

/* The host touching device memory dies with SIGSEGV and says why; the
 * same read through a copy is fine. */
START_TEST(host_access_crashes_with_a_message) {
    char err[8192];
    int sig = in_child(host_reads_device, err, sizeof err);
    ck_assert_msg(sig == SIGSEGV || sig == -1, "expected SIGSEGV, got %d; stderr: %s", sig, err);
    ck_assert_msg(strstr(err, "strict device: the host read or wrote device memory"), "stderr: %s",
                  err);
    sig = in_child(host_reads_copy, err, sizeof err);
    ck_assert_msg(sig == 0, "a read through a copy died with signal %d: %s", sig, err);
}
END_TEST

static pl_backend_counters counters(void) {
    const pl_backend *b = pl_backend_get(PL_DEVICE_CUDA);
    ck_assert(PL_BACKEND_HAS(b, counters) && b->counters);
    pl_backend_counters c = {.struct_size = sizeof c};
    PL_CK_OK(b->counters(&c));
    return c;
}

/* The kernel calls of one adapted projection's LoRA branch and its add, on
 * this device: pl_lora_add is one kernel call forward and one backward (a
 * GPU launches its GEMMs and gate kernel inside that call), where the chain
 * it replaced, linear -> mul -> linear -> scale -> add, made five each. */
static void lora_calls(bool fused, uint64_t *fwd, uint64_t *bwd) {
    pl_frame_begin();
    pl_tensor *h[5] = {pl_test_randn(PL_SHAPE(2, 3, 6), 1), pl_test_randn(PL_SHAPE(2, 3, 5), 2),
                       pl_test_randn(PL_SHAPE(4, 5), 3), pl_test_randn(PL_SHAPE(6, 4), 4),
                       pl_test_randn(PL_SHAPE(2, 1, 4), 5)};
    pl_tensor *d[5];
    for (int i = 0; i < 5; i++) {
        d[i] = PL_CK_NOTNULL(pl_tensor_to(h[i], PL_F32, g_dev));
        pl_tensor_set_requires_grad(d[i], true);
    }
    pl_backend_counters c0 = counters();
    pl_tensor *o = PL_CK_NOTNULL(
        fused ? pl_lora_add(d[0], d[1], d[2], d[3], d[4], 0.5)
              : pl_add(d[0],
                       pl_scale(pl_linear(pl_mul(pl_linear(d[1], d[2], NULL), d[4]), d[3], NULL),
                                0.5)));
    pl_backend_counters c1 = counters();
    pl_tensor *l = PL_CK_NOTNULL(pl_sum(o, PL_ALL_DIMS, false));
    pl_backend_counters c2 = counters();
    PL_CK_OK(pl_backward(l, 1.0));
    pl_backend_counters c3 = counters();
    *fwd = c1.kernel_calls - c0.kernel_calls;
    *bwd = c3.kernel_calls - c2.kernel_calls;
    pl_frame_end();
}

START_TEST(lora_add_is_one_kernel_call_each_way) {
    load();
    uint64_t ff, fb, cf, cb;
    lora_calls(true, &ff, &fb);
    lora_calls(false, &cf, &cb);
    ck_assert_uint_eq(ff, 1);
    ck_assert_uint_eq(cf, 5);
    /* backward: the same seeding and accumulation, one branch kernel for five */
    ck_assert_msg(cb - fb == 4, "backward kernel calls: fused %llu, chain %llu",
                  (unsigned long long)fb, (unsigned long long)cb);
}
END_TEST

/* pl_lora_add_dropout on this device: one kernel call forward and one
 * backward where the chain pl_dropout -> pl_lora_add made two each; the
 * tape holds neither the dropped copy of x nor the mask; the output and
 * every gradient are the chain's on this device bit for bit (f32). */
static void lora_drop_run(bool fused, double *vals, int nv, uint64_t *fwd, uint64_t *bwd,
                          size_t *held) {
    pl_frame_begin();
    /* x [3, 7, 24]: 504 elements, several 64-element Philox blocks and a tail */
    pl_tensor *h[5] = {pl_test_randn(PL_SHAPE(3, 7, 6), 11), pl_test_randn(PL_SHAPE(3, 7, 24), 12),
                       pl_test_randn(PL_SHAPE(4, 24), 13), pl_test_randn(PL_SHAPE(6, 4), 14),
                       pl_test_randn(PL_SHAPE(3, 1, 4), 15)};
    pl_tensor *d[5];
    for (int i = 0; i < 5; i++) {
        d[i] = PL_CK_NOTNULL(pl_tensor_to(h[i], PL_F32, g_dev));
        pl_tensor_set_requires_grad(d[i], true);
    }
    /* x as an activation (the tape keeps it either way: dA reads it) */
    pl_tensor *x = PL_CK_NOTNULL(pl_scale(d[1], 1.0));
    size_t h0 = 0, h1 = 0;
    PL_CK_OK(pl_tape_held_bytes(NULL, 0, &h0));
    pl_backend_counters c0 = counters();
    pl_tensor *o = PL_CK_NOTNULL(
        fused ? pl_lora_add_dropout(d[0], x, d[2], d[3], d[4], 0.5, 0.3, 77, 9, true)
              : pl_lora_add(d[0], pl_dropout(x, 0.3, 77, 9, true), d[2], d[3], d[4], 0.5));
    pl_backend_counters c1 = counters();
    PL_CK_OK(pl_tape_held_bytes(NULL, 0, &h1));
    *held = h1 - h0;
    pl_tensor *w = PL_CK_NOTNULL(pl_tensor_to(pl_test_randn(PL_SHAPE(3, 7, 6), 16), PL_F32, g_dev));
    pl_tensor *l = PL_CK_NOTNULL(pl_sum(pl_mul(o, w), PL_ALL_DIMS, false));
    pl_backend_counters c2 = counters();
    PL_CK_OK(pl_backward(l, 1.0));
    pl_backend_counters c3 = counters();
    *fwd = c1.kernel_calls - c0.kernel_calls;
    *bwd = c3.kernel_calls - c2.kernel_calls;
    pl_tensor *src[6] = {o, d[0]->grad, d[1]->grad, d[2]->grad, d[3]->grad, d[4]->grad};
    int k = 0;
    for (int j = 0; j < 6; j++) {
        pl_tensor *t = PL_CK_NOTNULL(pl_tensor_to(src[j], PL_F32, PL_CPU));
        for (int64_t i = 0; i < pl_tensor_numel(t) && k < nv; i++) vals[k++] = pl_tensor_get(t, i);
    }
    ck_assert_int_eq(k, 126 + 126 + 504 + 96 + 24 + 12);
    pl_frame_end();
}

/* pl_linear_cross_entropy on this device: the strict backend promises the
 * op (set_option "linear_cross_entropy"), so it runs as one kernel call
 * forward (the CPU's fused kernel) where the chain makes two (matmul,
 * cross_entropy); the tape holds dx and dW (f32 [70, 8] and [300, 8])
 * where the chain's holds the [70, 300] logits (and x, W); the loss equals
 * the chain's to f32 rounding (2e-6 relative). */
static double lce_run(bool fused, uint64_t *fwd, size_t *held) {
    pl_frame_begin();
    pl_tensor *x = PL_CK_NOTNULL(pl_tensor_to(pl_test_randn(PL_SHAPE(70, 8), 21), PL_F32, g_dev));
    pl_tensor *w = PL_CK_NOTNULL(pl_tensor_to(pl_test_randn(PL_SHAPE(300, 8), 22), PL_F32, g_dev));
    int64_t tv[70];
    for (int i = 0; i < 70; i++) tv[i] = i % 5 == 1 ? -100 : (i * 43) % 300;
    pl_tensor *t = PL_CK_NOTNULL(pl_tensor_from_data(PL_I64, PL_SHAPE(70), tv, g_dev));
    pl_tensor_set_requires_grad(x, true);
    pl_tensor_set_requires_grad(w, true);
    size_t h0 = 0, h1 = 0;
    PL_CK_OK(pl_tape_held_bytes(NULL, 0, &h0));
    pl_backend_counters c0 = counters();
    pl_tensor *l = PL_CK_NOTNULL(fused ? pl_linear_cross_entropy(x, w, t, -100, 0.0)
                                       : pl_cross_entropy(pl_matmul(x, w, false, true), t, -100, 0.0));
    pl_backend_counters c1 = counters();
    PL_CK_OK(pl_tape_held_bytes(NULL, 0, &h1));
    *held = h1 - h0;
    *fwd = c1.kernel_calls - c0.kernel_calls;
    double v = pl_tensor_item(l);
    PL_CK_OK(pl_backward(l, 1.0));
    ck_assert_ptr_nonnull(x->grad);
    ck_assert_ptr_nonnull(w->grad);
    pl_frame_end();
    return v;
}

START_TEST(linear_cross_entropy_runs_fused_here) {
    load();
    uint64_t ff, cf;
    size_t hf, hc;
    double lf = lce_run(true, &ff, &hf), lc = lce_run(false, &cf, &hc);
    ck_assert_uint_eq(ff, 1);
    ck_assert_uint_eq(cf, 2);
    ck_assert_msg(fabs(lf - lc) <= 2e-6 * fabs(lc), "loss: fused %.9g, chain %.9g", lf, lc);
    /* f32 dx 70 x 8 (2,240 bytes: a 4 KiB block) and dW 300 x 8 (9,600: a
     * 16 KiB block) against the logits 70 x 300 (84,000) and their lse */
    ck_assert_msg(hf == 4096 + 16384 && hc > 84000, "tape bytes: fused %zu, chain %zu", hf, hc);
}
END_TEST

START_TEST(lora_add_dropout_is_the_chain_in_one_call_each_way) {
    load();
    static double vf[1000], vc[1000];
    uint64_t ff, fb, cf, cb;
    size_t hf, hc;
    lora_drop_run(true, vf, 1000, &ff, &fb, &hf);
    lora_drop_run(false, vc, 1000, &cf, &cb, &hc);
    ck_assert_uint_eq(ff, 1);
    ck_assert_uint_eq(cf, 2);
    ck_assert_msg(cb - fb == 1, "backward kernel calls: fused %llu, chain %llu",
                  (unsigned long long)fb, (unsigned long long)cb);
    for (int i = 0; i < 126 + 126 + 504 + 96 + 24 + 12; i++)
        ck_assert_msg(vf[i] == vc[i], "value %d (out, dy, dx, dA, dB, dgexp in order): fused %.9g, "
                      "chain %.9g", i, vf[i], vc[i]);
    /* the fused tape holds x itself (dA reads it; in a model the tensor the
     * caller holds anyway, shared by every projection of x) and t; the
     * chain's holds drop(x) (x's size, a copy per projection), its u8 mask
     * (504 bytes, a 512-byte block) and t */
    ck_assert_msg(hc == hf + 512, "tape bytes: fused %zu, chain %zu", hf, hc);
}
END_TEST

/* The counters (pl_backend.counters, ABI 2.5): a device-to-host read (pl_tensor_item) is one host
 * read of its bytes, an upload one host write, a kernel one kernel call, and a
 * raw allocation one allocation; a cache hit of the caching allocator is none.
 * A caller with a shorter (older) struct gets only the fields it covers. */
START_TEST(counts_reads_writes_allocations_and_kernels) {
    load();
    pl_frame_begin();
    pl_tensor *x = pl_test_randn(PL_SHAPE(64, 64), 5);
    pl_backend_counters c0 = counters();
    pl_tensor *xd = PL_CK_NOTNULL(pl_tensor_to(x, PL_F32, g_dev));
    pl_backend_counters c1 = counters();
    ck_assert_uint_eq(c1.host_writes - c0.host_writes, 1);
    ck_assert_uint_eq(c1.host_write_bytes - c0.host_write_bytes, 64 * 64 * 4);
    ck_assert_uint_eq(c1.host_reads, c0.host_reads);
    pl_tensor *s = PL_CK_NOTNULL(pl_sum(xd, PL_ALL_DIMS, false));
    pl_backend_counters c2 = counters();
    ck_assert_uint_eq(c2.kernel_calls - c1.kernel_calls, 1);
    ck_assert_uint_eq(c2.host_reads, c1.host_reads);
    double v = pl_tensor_item(s);
    ck_assert(v == v);
    pl_backend_counters c3 = counters();
    ck_assert_uint_eq(c3.host_reads - c2.host_reads, 1);
    pl_frame_end();
    /* the same shapes again: the caching allocator reuses the freed blocks */
    pl_frame_begin();
    pl_backend_counters c4 = counters();
    PL_CK_NOTNULL(pl_sum(PL_CK_NOTNULL(pl_tensor_to(x, PL_F32, g_dev)), PL_ALL_DIMS, false));
    pl_backend_counters c5 = counters();
    ck_assert_uint_eq(c5.allocations - c4.allocations, 0);
    ck_assert_uint_eq(c5.host_reads - c4.host_reads, 0);
    /* a block no cached one fits: a raw allocation */
    PL_CK_NOTNULL(pl_tensor_zeros(PL_F32, 1, (int64_t[]){3 << 20}, g_dev));
    pl_backend_counters c6 = counters();
    ck_assert_uint_ge(c6.allocations - c5.allocations, 1);
    ck_assert_uint_ge(c6.allocation_bytes - c5.allocation_bytes, (uint64_t)(3 << 20) * 4);
    pl_frame_end();
    /* an older caller's struct: the fields it has, nothing past them */
    struct {
        pl_backend_counters c;
        uint64_t guard;
    } old;
    memset(&old, 0xAB, sizeof old);
    old.c.struct_size = (uint32_t)offsetof(pl_backend_counters, host_writes);
    PL_CK_OK(pl_backend_get(PL_DEVICE_CUDA)->counters(&old.c));
    ck_assert_uint_eq(old.c.host_reads, counters().host_reads);
    ck_assert_uint_eq(old.c.kernel_calls, 0xABABABABABABABABull);
    ck_assert_uint_eq(old.guard, 0xABABABABABABABABull);
}
END_TEST

/* device_stats, the stand-in for NVML (ABI 2.6 verb): utilization is the
 * share of wall time inside kernels since the cursor's snapshot, so a
 * stretch of kernels reads high and a stretch of host sleep reads low;
 * memory in use covers a live device tensor. */
START_TEST(device_stats_measure_kernel_time_and_mapped_memory) {
    load();
    uint64_t cur = 0;
    pl_device_stats ds;
    PL_CK_OK(pl_backend_device_stats(g_dev, &cur, &ds));
    ck_assert_int_eq(ds.n_samples, 0);
    ck_assert(ds.utilization >= 0 && ds.utilization <= 1);
    pl_frame_begin();
    pl_tensor *xd = PL_CK_NOTNULL(pl_tensor_to(pl_test_randn(PL_SHAPE(256, 256), 3), PL_F32, g_dev));
    PL_CK_OK(pl_backend_device_stats(g_dev, &cur, &ds)); /* the busy stretch starts here */
    for (int i = 0; i < 40; i++) PL_CK_NOTNULL(pl_matmul(xd, xd, false, false));
    PL_CK_OK(pl_backend_device_stats(g_dev, &cur, &ds));
    ck_assert_int_eq(ds.n_samples, 1);
    ck_assert_msg(ds.utilization > 0.5, "kernels back to back: utilization %g", ds.utilization);
    ck_assert_double_ge(ds.memory_used_bytes, 256.0 * 256 * 4);
    ck_assert(ds.memory_total_bytes > ds.memory_used_bytes);
    usleep(200000); /* the host alone: a GPU would idle */
    PL_CK_OK(pl_backend_device_stats(g_dev, &cur, &ds));
    ck_assert_msg(ds.utilization < 0.5, "host sleeping: utilization %g", ds.utilization);
    pl_frame_end();
}
END_TEST

/* fill_random (ABI 2.7): parameter init drawn in device memory gives the
 * host's values bit for bit (kernel_math.h pl_init_draw), in f32, bf16 and
 * f16, normal and uniform, with a length that is not a multiple of 4. */
START_TEST(fill_random_draws_the_hosts_values) {
    load();
    ck_assert(PL_BACKEND_HAS(pl_backend_get(PL_DEVICE_CUDA), fill_random));
    pl_dtype dts[3] = {PL_F32, PL_BF16, PL_F16};
    for (int k = 0; k < 3; k++)
        for (int normal = 0; normal < 2; normal++) {
            pl_frame_begin();
            pl_tensor *h = PL_CK_NOTNULL(pl_tensor_empty(PL_F32, 2, (int64_t[]){37, 29}, PL_CPU));
            pl_tensor *d = PL_CK_NOTNULL(pl_tensor_empty(dts[k], 2, (int64_t[]){37, 29}, g_dev));
            pl_backend_counters c0 = counters();
            PL_CK_OK(normal ? pl_tensor_normal_(d, 0.5, 0.02, 42, 7) : pl_tensor_uniform_(d, -0.3, 0.3, 42, 7));
            pl_backend_counters c1 = counters();
            ck_assert_uint_eq(c1.host_writes, c0.host_writes); /* drawn there, not copied */
            PL_CK_OK(normal ? pl_tensor_normal_(h, 0.5, 0.02, 42, 7) : pl_tensor_uniform_(h, -0.3, 0.3, 42, 7));
            pl_tensor *want = PL_CK_NOTNULL(pl_tensor_to(h, dts[k], PL_CPU));
            pl_tensor *got = PL_CK_NOTNULL(pl_tensor_to(d, dts[k], PL_CPU));
            ck_assert_int_eq(memcmp(pl_tensor_data(got), pl_tensor_data(want), pl_tensor_nbytes(want)), 0);
            pl_frame_end();
        }
}
END_TEST

/* Whole-step graphs (graph.h) on the strict device: a captured and replayed
 * training step gives the eager run's losses and weights bit for bit (the
 * learning rate, bias correction and dropout counter that change every step
 * reach the replays through the device); a host read while capturing fails
 * naming it. pl_test_graph_step / _violation (tests/common) run the same
 * checks on a GPU in test_cuda. */
START_TEST(graph_capture_replays_a_step) {
    load();
    pl_test_graph_step(g_dev, 7, 0.0);
    pl_test_graph_violation(g_dev);
}
END_TEST

/* The graph-private pool (alloc.c): a block the capture used, freed inside
 * the capture, is not handed to eager work while the graph lives (a replay
 * writes there), and goes back to the device's cache when it is released. */
START_TEST(graph_pool_keeps_its_blocks) {
    load();
    const int64_t n = 3000; /* a size class of its own in this test */
    PL_CK_OK(pl_graph_capture_begin(g_dev));
    pl_frame_begin();
    pl_tensor *a = PL_CK_NOTNULL(pl_tensor_empty(PL_F32, 1, &n, g_dev));
    void *pa = pl_tensor_data(a);
    PL_CK_OK(pl_tensor_fill_(a, 1.0));
    pl_frame_end(); /* a freed: back to the graph's pool */
    pl_graph *g = NULL;
    PL_CK_OK(pl_graph_capture_end(&g));
    pl_frame_begin();
    pl_tensor *b = PL_CK_NOTNULL(pl_tensor_empty(PL_F32, 1, &n, g_dev));
    ck_assert_msg(pl_tensor_data(b) != pa, "eager work got the graph's block");
    PL_CK_OK(pl_graph_replay(g)); /* writes pa, not b */
    pl_frame_end();
    pl_graph_release(g);
    /* released: the block is the device cache's again (LIFO: the next one of its class) */
    pl_frame_begin();
    pl_tensor *c = PL_CK_NOTNULL(pl_tensor_empty(PL_F32, 1, &n, g_dev));
    ck_assert_ptr_eq(pl_tensor_data(c), pa);
    pl_frame_end();
}
END_TEST

/* Seeing the step (backend.h, capture_end_step): the strict device fuses the
 * gradient norm's square + sum into one sum of squares when the squares are
 * dead after the sum (their block released by the step's end, nothing later
 * reading them), with the unfused calls' bits and one kernel call less per
 * replay (mode 0); with the add of a running total after it (modes 3, 4:
 * the sum first or second), one call instead of three, but only the pair
 * when the sum is read after the add (mode 5); it does not fuse when the
 * squares are read after the sum (mode 1) or still held when the capture
 * ends (mode 2), nor with set_option("fuse", "false") or
 * PL_GRAPH_FUSION=0. x has 100003 elements (the CPU sum's
 * OpenMP path) or 777 (its serial one). */
static int fuse_case(int mode, pl_tensor *x, pl_tensor *o, pl_tensor *acc, uint64_t *kcalls) {
    pl_graph *g = NULL;
    pl_tensor *kept = NULL;
    PL_CK_OK(pl_graph_capture_begin(g_dev));
    pl_frame_begin();
    pl_tensor *sq = PL_CK_NOTNULL(pl_square(x));
    pl_tensor *ssq = PL_CK_NOTNULL(pl_sum(sq, PL_ALL_DIMS, false));
    if (mode == 1) ssq = PL_CK_NOTNULL(pl_add(ssq, pl_sum(pl_scale(sq, 0.0), PL_ALL_DIMS, false)));
    if (mode == 2) kept = pl_tensor_retain(sq);
    if (mode == 3) ssq = PL_CK_NOTNULL(pl_add(ssq, acc)); /* a running total: one call of three */
    if (mode == 4) ssq = PL_CK_NOTNULL(pl_add(acc, ssq));
    if (mode == 5) ssq = PL_CK_NOTNULL(pl_add(pl_add(ssq, acc), ssq)); /* the sum read after the add */
    PL_CK_OK(pl_tensor_copy_(o, ssq));
    pl_frame_end();
    PL_CK_OK(pl_graph_capture_end(&g));
    const char *pat = NULL;
    int nf = pl_graph_fused(g, &pat);
    ck_assert_msg(nf == 0 || strcmp(pat, mode == 3 || mode == 4 ? "square+sum+add x1" : "square+sum x1") == 0,
                  "patterns '%s'", pat);
    PL_CK_OK(pl_tensor_fill_(o, -1.0));
    pl_backend_counters c0 = counters();
    PL_CK_OK(pl_graph_replay(g));
    *kcalls = counters().kernel_calls - c0.kernel_calls;
    pl_graph_release(g);
    pl_tensor_release(kept);
    return nf;
}

START_TEST(step_fusion_square_sum) {
    load();
    /* pl_step_released (backend.h): inside one released block, no more */
    pl_step_block bl[2] = {{(const void *)0x1000, 0x100}, {(const void *)0x3000, 0x200}};
    pl_step_facts f = {.struct_size = sizeof f, .released = bl, .n_released = 2};
    ck_assert(pl_step_released(&f, (const void *)0x1000, 0x100));
    ck_assert(pl_step_released(&f, (const void *)0x3100, 0x100));
    ck_assert(!pl_step_released(&f, (const void *)0x10ff, 2));
    ck_assert(!pl_step_released(&f, (const void *)0x0fff, 1));
    ck_assert(!pl_step_released(&f, (const void *)0x2000, 1));
    ck_assert(!pl_step_released(&f, (const void *)0x3100, 0x101));
    ck_assert(!pl_step_released(NULL, (const void *)0x1000, 1));
    const pl_backend *b = pl_backend_get(PL_DEVICE_CUDA);
    ck_assert(PL_BACKEND_HAS(b, capture_end_step) && b->capture_end_step);
    int64_t sizes[2] = {100003, 777};
    for (int k = 0; k < 2; k++) {
        int64_t n = sizes[k];
        pl_frame_begin();
        pl_tensor *xh = pl_test_randn(PL_SHAPE(n), 21 + k);
        pl_tensor *x = PL_CK_NOTNULL(pl_tensor_to(xh, PL_F32, g_dev));
        pl_tensor *o = PL_CK_NOTNULL(pl_tensor_zeros(PL_F32, 0, NULL, g_dev));
        pl_tensor *acc = PL_CK_NOTNULL(pl_tensor_zeros(PL_F32, 0, NULL, g_dev));
        PL_CK_OK(pl_tensor_fill_(acc, 0.3 + k));
        pl_tensor *ssq = PL_CK_NOTNULL(pl_sum(pl_square(x), PL_ALL_DIMS, false));
        pl_tensor *w[4] = {PL_CK_NOTNULL(pl_tensor_to(ssq, PL_F32, PL_CPU)),
                           PL_CK_NOTNULL(pl_tensor_to(pl_add(ssq, acc), PL_F32, PL_CPU)),
                           PL_CK_NOTNULL(pl_tensor_to(pl_add(acc, ssq), PL_F32, PL_CPU)),
                           PL_CK_NOTNULL(pl_tensor_to(pl_add(pl_add(ssq, acc), ssq), PL_F32, PL_CPU))};
        for (int mode = 0; mode < 6; mode++) {
            uint64_t kf = 0, ku = 0;
            pl_tensor *want = w[mode < 3 ? 0 : mode - 2];
            int nf = fuse_case(mode, x, o, acc, &kf);
            pl_tensor *got = PL_CK_NOTNULL(pl_tensor_to(o, PL_F32, PL_CPU));
            ck_assert_int_eq(memcmp(pl_tensor_data(got), pl_tensor_data(want), 4), 0);
            PL_CK_OK(b->set_option("fuse", "false"));
            ck_assert_int_eq(fuse_case(mode, x, o, acc, &ku), 0);
            PL_CK_OK(b->set_option("fuse", "true"));
            got = PL_CK_NOTNULL(pl_tensor_to(o, PL_F32, PL_CPU));
            ck_assert_int_eq(memcmp(pl_tensor_data(got), pl_tensor_data(want), 4), 0);
            ck_assert_msg(nf == (mode == 0 || mode >= 3), "n %lld mode %d: %d fusions", (long long)n,
                          mode, nf);
            ck_assert_msg(ku - kf == (uint64_t)(mode == 3 || mode == 4 ? 2 : nf), "n %lld mode %d: %llu kernel calls fused, %llu not",
                          (long long)n, mode, (unsigned long long)kf, (unsigned long long)ku);
        }
        uint64_t kc = 0;
        setenv("PL_GRAPH_FUSION", "0", 1); /* the core's switch: capture_end, nothing fused */
        ck_assert_int_eq(fuse_case(0, x, o, NULL, &kc), 0);
        unsetenv("PL_GRAPH_FUSION");
        pl_frame_end();
    }
    /* bad switches are errors naming the value, not silently "on" */
    const pl_backend *be = pl_backend_get(PL_DEVICE_CUDA);
    ck_assert_int_eq(be->set_option("fuse", "off"), PL_ERR_INVALID);
    ck_assert_ptr_nonnull(strstr(pl_error_message(), "'off'"));
    setenv("PL_GRAPH_FUSION", "false", 1);
    ck_assert_int_eq(pl_graph_capture_begin(g_dev), PL_ERR_INVALID);
    ck_assert_ptr_nonnull(strstr(pl_error_message(), "PL_GRAPH_FUSION='false'"));
    unsetenv("PL_GRAPH_FUSION");
    pl_graph *g = NULL; /* nothing was left capturing */
    PL_CK_OK(pl_graph_capture_begin(g_dev));
    PL_CK_OK(pl_graph_capture_end(&g));
    pl_graph_release(g);
}
END_TEST

/* The second family (strict_fuse.c): pl_linear's matmul followed by the add
 * of its bias row is one kernel call, a GEMM writing the add's output with
 * the bias added in the same kernel, when the product is dead after the add
 * (mode 0: pl_linear itself; mode 3: the bias as the add's first operand),
 * with the unfused pair's bits; not when the product is read after the add
 * (mode 1) or still held when the capture ends (mode 2), nor with
 * set_option("fuse", "false") or PL_GRAPH_FUSION=0. x [2, 150, 64] @ w^T
 * (128 x 64): 38400 outputs (the add's OpenMP path), or [5, 7] @ [3, 7]^T. */
static pl_tensor *linear_mode(int mode, pl_tensor *x, pl_tensor *w, pl_tensor *b,
                              pl_tensor **kept) {
    if (mode == 0) return pl_linear(x, w, b);
    pl_tensor *y = pl_matmul(x, w, false, true);
    if (mode == 1) return pl_add(pl_add(y, b), y);
    if (mode == 2) *kept = pl_tensor_retain(y);
    return mode == 3 ? pl_add(b, y) : pl_add(y, b);
}

static int bias_case(int mode, pl_tensor *x, pl_tensor *w, pl_tensor *b, pl_tensor *o,
                     uint64_t *kcalls) {
    pl_graph *g = NULL;
    pl_tensor *kept = NULL;
    PL_CK_OK(pl_graph_capture_begin(g_dev));
    pl_frame_begin();
    PL_CK_OK(pl_tensor_copy_(o, PL_CK_NOTNULL(linear_mode(mode, x, w, b, &kept))));
    pl_frame_end();
    PL_CK_OK(pl_graph_capture_end(&g));
    const char *pat = NULL;
    int nf = pl_graph_fused(g, &pat);
    ck_assert_msg(nf == 0 || strcmp(pat, "matmul+bias x1") == 0, "patterns '%s'", pat);
    PL_CK_OK(pl_tensor_fill_(o, -1.0));
    pl_backend_counters c0 = counters();
    PL_CK_OK(pl_graph_replay(g));
    *kcalls = counters().kernel_calls - c0.kernel_calls;
    pl_graph_release(g);
    pl_tensor_release(kept);
    return nf;
}

START_TEST(step_fusion_matmul_bias) {
    load();
    const pl_backend *be = pl_backend_get(PL_DEVICE_CUDA);
    struct {
        int64_t lead, m, k, n;
    } sz[2] = {{2, 150, 64, 128}, {1, 5, 7, 3}};
    for (int s = 0; s < 2; s++) {
        pl_frame_begin();
        pl_tensor *xh = sz[s].lead > 1
                            ? pl_test_randn(PL_SHAPE(sz[s].lead, sz[s].m, sz[s].k), 31 + s)
                            : pl_test_randn(PL_SHAPE(sz[s].m, sz[s].k), 31 + s);
        pl_tensor *x = PL_CK_NOTNULL(pl_tensor_to(xh, PL_F32, g_dev));
        pl_tensor *w = PL_CK_NOTNULL(
            pl_tensor_to(pl_test_randn(PL_SHAPE(sz[s].n, sz[s].k), 41 + s), PL_F32, g_dev));
        pl_tensor *b =
            PL_CK_NOTNULL(pl_tensor_to(pl_test_randn(PL_SHAPE(sz[s].n), 51 + s), PL_F32, g_dev));
        for (int mode = 0; mode < 4; mode++) {
            pl_tensor *kept = NULL;
            /* eager: the unfused pair's bits */
            pl_tensor *we = PL_CK_NOTNULL(linear_mode(mode, x, w, b, &kept));
            pl_tensor_release(kept);
            pl_tensor *want = PL_CK_NOTNULL(pl_tensor_to(we, PL_F32, PL_CPU));
            size_t nb = pl_tensor_nbytes(want);
            pl_tensor *o = PL_CK_NOTNULL(pl_tensor_zeros(PL_F32, we->ndim, we->shape, g_dev));
            uint64_t kf = 0, ku = 0;
            int nf = bias_case(mode, x, w, b, o, &kf);
            pl_tensor *got = PL_CK_NOTNULL(pl_tensor_to(o, PL_F32, PL_CPU));
            ck_assert_msg(memcmp(pl_tensor_data(got), pl_tensor_data(want), nb) == 0,
                          "size %d mode %d: fused bits differ from eager", s, mode);
            PL_CK_OK(be->set_option("fuse", "false"));
            ck_assert_int_eq(bias_case(mode, x, w, b, o, &ku), 0);
            PL_CK_OK(be->set_option("fuse", "true"));
            got = PL_CK_NOTNULL(pl_tensor_to(o, PL_F32, PL_CPU));
            ck_assert_int_eq(memcmp(pl_tensor_data(got), pl_tensor_data(want), nb), 0);
            ck_assert_msg(nf == (mode == 0 || mode == 3), "size %d mode %d: %d fusions", s, mode,
                          nf);
            ck_assert_msg(ku - kf == (uint64_t)nf,
                          "size %d mode %d: %llu kernel calls fused, %llu not", s, mode,
                          (unsigned long long)kf, (unsigned long long)ku);
        }
        uint64_t kc = 0;
        pl_tensor *y0 = PL_CK_NOTNULL(pl_linear(x, w, b));
        pl_tensor *o0 = PL_CK_NOTNULL(pl_tensor_zeros(PL_F32, y0->ndim, y0->shape, g_dev));
        setenv("PL_GRAPH_FUSION", "0", 1); /* the core's switch: capture_end, nothing fused */
        ck_assert_int_eq(bias_case(0, x, w, b, o0, &kc), 0);
        unsetenv("PL_GRAPH_FUSION");
        pl_frame_end();
    }
}
END_TEST

/* clip_grad_norm_'s foreach ops (pl_sum_squares_multi, pl_mul_multi_): on the
 * strict device the chain's bits (square + sum + add per tensor; mul + copy)
 * in ceil(n / 32) kernel calls instead of 3n - 1 and 2n, eager and replayed
 * from a captured graph (the list copied at capture). 40 tensors, one of
 * 100003 elements (the CPU sum's OpenMP path), one empty. */
START_TEST(foreach_norm_and_mul_match_the_chain_in_fewer_calls) {
    load();
    enum { N = 40 };
    pl_frame_begin();
    pl_tensor *g[N], *h[N];
    for (int i = 0; i < N; i++) {
        int64_t n = i == 3 ? 100003 : i == 7 ? 0 : 1 + (i * 37) % 501;
        pl_tensor *xh = PL_CK_NOTNULL(pl_test_randn(PL_SHAPE(n), 300 + i));
        g[i] = PL_CK_NOTNULL(pl_tensor_to(xh, PL_F32, g_dev));
        h[i] = PL_CK_NOTNULL(pl_tensor_to(xh, PL_F32, g_dev));
    }
    pl_backend_counters c0 = counters();
    pl_tensor *want = NULL;
    for (int i = 0; i < N; i++) {
        pl_tensor *q = PL_CK_NOTNULL(pl_sum(pl_square(h[i]), PL_ALL_DIMS, false));
        want = i ? PL_CK_NOTNULL(pl_add(want, q)) : q;
    }
    pl_backend_counters c1 = counters();
    pl_tensor *got = PL_CK_NOTNULL(pl_sum_squares_multi(N, g));
    pl_backend_counters c2 = counters();
    ck_assert_uint_eq(c1.kernel_calls - c0.kernel_calls, 3 * N - 1);
    ck_assert_uint_eq(c2.kernel_calls - c1.kernel_calls, 2);
    ck_assert_int_eq(got->ndim, 0);
    float a = pl_tensor_item(got), b = pl_tensor_item(want);
    ck_assert_msg(memcmp(&a, &b, 4) == 0, "sum_squares_multi %.9g, the chain %.9g", a, b);
    /* mul_multi_ by a device scalar: pl_mul's bits, then captured and replayed */
    pl_tensor *s = PL_CK_NOTNULL(pl_tensor_scalar(0.37f, g_dev));
    c0 = counters();
    PL_CK_OK(pl_mul_multi_(N, g, s));
    ck_assert_uint_eq(counters().kernel_calls - c0.kernel_calls, 2);
    for (int i = 0; i < N; i++) {
        pl_frame_begin();
        PL_CK_OK(pl_tensor_copy_(h[i], PL_CK_NOTNULL(pl_mul(h[i], s))));
        pl_frame_end();
    }
    pl_graph *gr = NULL;
    pl_tensor *o = PL_CK_NOTNULL(pl_tensor_zeros(PL_F32, 0, NULL, g_dev));
    PL_CK_OK(pl_graph_capture_begin(g_dev));
    pl_frame_begin();
    PL_CK_OK(pl_mul_multi_(N, g, s));
    PL_CK_OK(pl_tensor_copy_(o, PL_CK_NOTNULL(pl_sum_squares_multi(N, g))));
    pl_frame_end();
    PL_CK_OK(pl_graph_capture_end(&gr));
    PL_CK_OK(pl_tensor_fill_(s, -2.5)); /* the replay reads s from the device */
    for (int r = 0; r < 2; r++) {
        PL_CK_OK(pl_graph_replay(gr));
        want = NULL;
        for (int i = 0; i < N; i++) {
            pl_frame_begin();
            PL_CK_OK(pl_tensor_copy_(h[i], PL_CK_NOTNULL(pl_mul(h[i], s))));
            pl_frame_end();
            pl_tensor *q = PL_CK_NOTNULL(pl_sum(pl_square(h[i]), PL_ALL_DIMS, false));
            want = i ? PL_CK_NOTNULL(pl_add(want, q)) : q;
        }
        for (int i = 0; i < N; i++) {
            pl_tensor *x = PL_CK_NOTNULL(pl_tensor_to(g[i], PL_F32, PL_CPU));
            pl_tensor *y = PL_CK_NOTNULL(pl_tensor_to(h[i], PL_F32, PL_CPU));
            ck_assert_msg(memcmp(pl_tensor_data(x), pl_tensor_data(y), (size_t)pl_tensor_nbytes(x)) == 0,
                          "replay %d: tensor %d differs from mul + copy", r, i);
        }
        a = pl_tensor_item(o), b = pl_tensor_item(want);
        ck_assert_msg(memcmp(&a, &b, 4) == 0, "replay %d: %.9g, the chain %.9g", r, a, b);
    }
    pl_graph_release(gr);
    pl_frame_end();
}
END_TEST

/* PL_STRICT_MEMORY_CAPACITY makes the device a card of that size: mem_info
 * says so, a raw allocation past it fails as cudaMalloc would, the core's
 * allocator gives its cached blocks back and retries (so cached memory never
 * makes a run fail), and an allocation that does not fit even then fails
 * with PL_ERR_NOMEM naming the size, the device, what tensors hold and the
 * backend's reason. A value that does not parse is named. */
START_TEST(memory_capacity_is_a_cards) {
    setenv("PL_STRICT_MEMORY_CAPACITY", "8MiB", 1);
    load();
    pl_alloc_empty_cache(g_dev);
    const pl_backend *be = pl_backend_get(PL_DEVICE_CUDA);
    size_t fr = 0, tot = 0;
    PL_CK_OK(be->mem_info(0, &fr, &tot));
    ck_assert_uint_eq(tot, 8u << 20);
    ck_assert_uint_le(fr, tot);
    size_t c1 = 0, c2 = 0, c3 = 0;
    void *p1 = PL_CK_NOTNULL(pl_alloc(g_dev, 3u << 20, &c1));
    pl_free(g_dev, p1, c1); /* cached: 3 MiB stay mapped */
    ck_assert_uint_eq(pl_alloc_get_stats(g_dev).bytes_cached, c1);
    void *p2 = pl_alloc(g_dev, 6u << 20, &c2); /* 3 + 6 > 8: fits once the cache is released */
    ck_assert_msg(p2 != NULL, "6 MiB after releasing the cache: %s", pl_error_message());
    ck_assert_uint_eq(pl_alloc_get_stats(g_dev).bytes_cached, 0);
    void *p3 = pl_alloc(g_dev, 4u << 20, &c3); /* 6 + 4 > 8 with nothing cached */
    ck_assert_ptr_null(p3);
    ck_assert_int_eq(pl_error_status(), PL_ERR_NOMEM);
    const char *m = pl_error_message();
    ck_assert_msg(strstr(m, "out of memory allocating 4.00 MiB on strict") &&
                      strstr(m, "6.00 MiB held by tensors") &&
                      strstr(m, "PL_STRICT_MEMORY_CAPACITY of 8.00 MiB"),
                  "message: %s", m);
    pl_free(g_dev, p2, c2);
    pl_alloc_empty_cache(g_dev);
    setenv("PL_STRICT_MEMORY_CAPACITY", "8 potatoes", 1);
    ck_assert_ptr_null(pl_alloc(g_dev, 1024, &c3));
    ck_assert_msg(strstr(pl_error_message(), "PL_STRICT_MEMORY_CAPACITY = '8 potatoes'"),
                  "message: %s", pl_error_message());
    unsetenv("PL_STRICT_MEMORY_CAPACITY");
    void *p4 = PL_CK_NOTNULL(pl_alloc(g_dev, 64u << 20, &c3)); /* unset: no limit */
    pl_free(g_dev, p4, c3);
}
END_TEST

int main(void) {
    Suite *s = suite_create("strict_backend");
    TCase *tc = tcase_create("strict");
    tcase_add_test(tc, loads_and_names_devices);
    tcase_add_test(tc, copies_and_kernels);
    tcase_add_test(tc, host_access_crashes_with_a_message);
    tcase_add_test(tc, counts_reads_writes_allocations_and_kernels);
    tcase_add_test(tc, lora_add_is_one_kernel_call_each_way);
    tcase_add_test(tc, lora_add_dropout_is_the_chain_in_one_call_each_way);
    tcase_add_test(tc, linear_cross_entropy_runs_fused_here);
    tcase_add_test(tc, foreach_norm_and_mul_match_the_chain_in_fewer_calls);
    tcase_add_test(tc, device_stats_measure_kernel_time_and_mapped_memory);
    tcase_add_test(tc, fill_random_draws_the_hosts_values);
    tcase_add_test(tc, graph_capture_replays_a_step);
    tcase_add_test(tc, graph_pool_keeps_its_blocks);
    tcase_add_test(tc, step_fusion_square_sum);
    tcase_add_test(tc, step_fusion_matmul_bias);
    tcase_add_test(tc, memory_capacity_is_a_cards);
    suite_add_tcase(s, tc);
    return pl_test_run(s);
}
