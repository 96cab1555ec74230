/* test_foreach.c - the adamw and sgd plugins' multi-tensor step (foreach =
 * true, the default: ops.def's adamw_step_multi / sgd_step_multi through
 * pl_adamw_step_multi_ / pl_sgd_step_multi_) against their per-tensor step
 * (foreach = false), on the CPU and on the strict device:
 *   - parameters and every state tensor / count bit for bit equal after
 *     several steps, with weight decay, amsgrad / nesterov, two groups,
 *     parameters that miss a gradient on some steps (so their step counts,
 *     and their coefficients within one call, differ) and one step skipped
 *     by a NaN found_inf flag (GradScaler);
 *   - on strict, the launches of one optimizer step: one per parameter
 *     with a gradient per-tensor, ceil(n / PL_OPTIM_MULTI_MAX) per group
 *     with foreach;
 *   - on strict, the step captured in a graph (graph.h) and replayed with
 *     refreshed coefficients gives the eager bits, with more parameters than
 *     one chunk of the graph's coefficient table holds. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "optim_testkit.h"
#include "pipeline/graph.h"
#include "pipeline/optim_math.h"

#define NP 75    /* parameters: 3 chunks of 32 in the default group */
#define STEPS 5
#define SKIP_STEP 2 /* the step a NaN found_inf skips */

static const pl_device STRICT = {PL_DEVICE_CUDA, 0};

static void use_strict(void) { PL_CK_OK(pl_harness_load_backend_named(PL_DEVICE_CUDA, "strict")); }

/* A deterministic value in [-1, 1) for (a, b, c). */
static float val(uint32_t a, uint32_t b, uint32_t c) {
    uint32_t x = a * 2654435761u ^ (b + 0x9e3779b9u) * 40503u ^ c * 2246822519u;
    x ^= x >> 15;
    x *= 2246822519u;
    x ^= x >> 13;
    return (float)((x & 0xffffff) / 8388608.0 - 1.0);
}

static int64_t numel_of(int i) { return 1 + (i * 37) % 131 + (i % 7 == 0 ? 5000 : 0); }
static bool frozen(int i) { return i % 11 == 10; }
static bool is_bias(int i) { return i % 4 == 3; }
/* parameter i has no gradient at step s (graph runs: every one has) */
static bool no_grad(int i, int s) { return (i + s) % 6 == 0; }

/* NP parameters "l<i>.weight" / "l<i>.bias" on dev; tk_close frees them. */
static void add_params(tk_run *r, pl_device dev) {
    tk_init(r);
    for (int i = 0; i < NP; i++) {
        char name[32];
        snprintf(name, sizeof name, "l%d.%s", i, is_bias(i) ? "bias" : "weight");
        int64_t n = numel_of(i);
        float *v = malloc((size_t)n * sizeof *v);
        ck_assert_ptr_nonnull(v);
        for (int64_t e = 0; e < n; e++) v[e] = val((uint32_t)i, (uint32_t)e, 7);
        PL_CK_NOTNULL(pl_harness_add_param(r->base, name, 1, &n, v, 0, NULL, !frozen(i)));
        free(v);
        if (dev.type != PL_DEVICE_CPU) {
            pl_param *p = pl_params_at(r->ctx->params, i);
            pl_tensor *d = PL_CK_NOTNULL(pl_tensor_to(p->t, PL_F32, dev));
            pl_tensor_set_requires_grad(d, !frozen(i));
            PL_CK_OK(pl_params_replace(r->ctx->params, i, d));
            pl_tensor_release(d);
        }
    }
}

/* Set step s's gradients (graph: every trainable parameter gets one, copied
 * into the gradient tensor it already has, so a replay reads it). */
static void set_grads(tk_run *r, pl_device dev, int s, bool graph) {
    for (int i = 0; i < NP; i++) {
        pl_tensor *t = pl_params_at(r->ctx->params, i)->t;
        if (frozen(i)) continue;
        if (!graph && no_grad(i, s)) {
            pl_tensor_release(t->grad);
            t->grad = NULL;
            continue;
        }
        int64_t n = numel_of(i);
        float *g = malloc((size_t)n * sizeof *g);
        ck_assert_ptr_nonnull(g);
        for (int64_t e = 0; e < n; e++) g[e] = val((uint32_t)i, (uint32_t)e, 100 + (uint32_t)s);
        pl_tensor *h = PL_CK_NOTNULL(pl_tensor_from_data(PL_F32, 1, &n, g, PL_CPU));
        free(g);
        if (graph && t->grad) {
            PL_CK_OK(pl_tensor_copy_(t->grad, h));
        } else {
            pl_tensor_release(t->grad);
            t->grad = PL_CK_NOTNULL(pl_tensor_to(h, PL_F32, dev));
        }
        pl_tensor_release(h);
    }
}

static uint64_t launches(void) {
    const pl_backend *b = pl_backend_get(PL_DEVICE_CUDA);
    pl_backend_counters c = {.struct_size = sizeof c};
    PL_CK_OK(b->counters(&c));
    return c.kernel_calls;
}

typedef struct result {
    pl_snapshot *params, *state;
    uint64_t step_launches[STEPS]; /* strict only */
} result;

static void result_free(result *r) {
    pl_snapshot_free(r->params);
    pl_snapshot_free(r->state);
}

/* STEPS optimizer steps of `plugin` with `body` (+ foreach) on dev. */
static result run(const char *plugin, const char *body, bool foreach, pl_device dev) {
    tk_run r;
    add_params(&r, dev);
    char ini[512];
    snprintf(ini, sizeof ini, "%sforeach = %s\ngroup.nd.match = *bias\n", body,
             foreach ? "true" : "false");
    tk_optimizer(&r, plugin, ini);
    const pl_optimizer_vtable *vt = r.ctx->optimizer;
    result res = {0};
    for (int s = 0; s < STEPS; s++) {
        set_grads(&r, dev, s, false);
        pl_tensor *flag = NULL;
        if (s == SKIP_STEP) {
            float nan = NAN;
            flag = PL_CK_NOTNULL(pl_tensor_from_data(PL_F32, 1, (int64_t[]){1}, &nan, dev));
            pl_optim_set_found_inf(flag);
        }
        uint64_t k0 = dev.type == PL_DEVICE_CPU ? 0 : launches();
        PL_CK_OK(vt->step(r.optim_self));
        if (dev.type != PL_DEVICE_CPU) res.step_launches[s] = launches() - k0;
        pl_optim_set_found_inf(NULL);
        pl_tensor_release(flag);
    }
    res.params = PL_CK_NOTNULL(pl_snapshot_new());
    PL_CK_OK(pl_snapshot_save_params(res.params, r.ctx->params));
    res.state = PL_CK_NOTNULL(pl_harness_state_save(r.optim, r.optim_self));
    tk_close(&r);
    return res;
}

static void assert_same(const result *a, const result *b, const char *what) {
    char msg[512];
    ck_assert_msg(pl_snapshot_equal(a->params, b->params, msg, sizeof msg), "%s: parameters: %s",
                  what, msg);
    ck_assert_msg(pl_snapshot_equal(a->state, b->state, msg, sizeof msg), "%s: state: %s", what,
                  msg);
}

/* Launches of step s: per-tensor, one per trainable parameter with a
 * gradient; foreach, ceil(n / 32) per group (default, nd); a skipped step
 * launches as many (the kernels read the flag). */
static uint64_t expected_launches(int s, bool foreach) {
    int n[2] = {0, 0};
    for (int i = 0; i < NP; i++)
        if (!frozen(i) && !no_grad(i, s)) n[is_bias(i)]++;
    if (!foreach) return (uint64_t)(n[0] + n[1]);
    uint64_t k = 0;
    for (int g = 0; g < 2; g++) k += (uint64_t)(n[g] + PL_OPTIM_MULTI_MAX - 1) / PL_OPTIM_MULTI_MAX;
    return k;
}

static const struct {
    const char *plugin, *body;
} g_cfg[] = {
    {"adamw", "lr = 0.01\nweight_decay = 0.1\n"},
    {"adamw", "lr = 0.02\nweight_decay = 0.05\namsgrad = true\nl2 = true\nbeta1 = 0.8\n"},
    {"sgd", "lr = 0.05\nmomentum = 0.9\ndampening = 0.1\nweight_decay = 0.01\n"},
    {"sgd", "lr = 0.05\nmomentum = 0.9\nnesterov = true\nweight_decay = 0.02\n"},
    {"sgd", "lr = 0.1\nweight_decay = 0.01\n"},
};
#define N_CFG ((int)(sizeof g_cfg / sizeof g_cfg[0]))

START_TEST(foreach_equals_per_tensor_on_cpu) {
    int c = _i;
    result a = run(g_cfg[c].plugin, g_cfg[c].body, true, PL_CPU);
    result b = run(g_cfg[c].plugin, g_cfg[c].body, false, PL_CPU);
    assert_same(&a, &b, g_cfg[c].body);
    result_free(&a);
    result_free(&b);
}
END_TEST

START_TEST(foreach_equals_per_tensor_on_strict_in_fewer_launches) {
    int c = _i;
    use_strict();
    result a = run(g_cfg[c].plugin, g_cfg[c].body, true, STRICT);
    result b = run(g_cfg[c].plugin, g_cfg[c].body, false, STRICT);
    assert_same(&a, &b, g_cfg[c].body);
    result cpu = run(g_cfg[c].plugin, g_cfg[c].body, true, PL_CPU);
    assert_same(&a, &cpu, "strict vs cpu");
    for (int s = 0; s < STEPS; s++) {
        ck_assert_uint_eq(a.step_launches[s], expected_launches(s, true));
        ck_assert_uint_eq(b.step_launches[s], expected_launches(s, false));
        ck_assert_uint_lt(a.step_launches[s], b.step_launches[s]);
    }
    result_free(&a);
    result_free(&b);
    result_free(&cpu);
}
END_TEST

/* The step captured at step 1 and replayed after a refresh (as
 * core/run/graph_step.c does), against the eager steps: same bits. With 68
 * trainable parameters the coefficient table needs a second chunk, and the
 * calls of the second group pad to it. */
static result run_graph(const char *plugin, const char *body, bool foreach, bool graph) {
    tk_run r;
    add_params(&r, STRICT);
    char ini[512];
    snprintf(ini, sizeof ini, "%sforeach = %s\ngroup.nd.match = *bias\n", body,
             foreach ? "true" : "false");
    tk_optimizer(&r, plugin, ini);
    const pl_optimizer_vtable *vt = r.ctx->optimizer;
    pl_graph *g = NULL;
    result res = {0};
    for (int s = 0; s < STEPS; s++) {
        set_grads(&r, STRICT, s, true);
        uint64_t k0 = launches();
        if (!graph || s == 0) {
            PL_CK_OK(vt->step(r.optim_self));
        } else if (s == 1) {
            PL_CK_OK(pl_graph_capture_begin(STRICT));
            pl_status st = vt->step(r.optim_self);
            pl_status e = pl_graph_capture_end(&g);
            PL_CK_OK(st);
            PL_CK_OK(e);
            PL_CK_OK(pl_graph_replay(g));
        } else {
            PL_CK_OK(pl_graph_refresh_begin(g));
            pl_status st = vt->step(r.optim_self);
            pl_status e = pl_graph_refresh_end(g);
            PL_CK_OK(st);
            PL_CK_OK(e);
            PL_CK_OK(pl_graph_replay(g));
        }
        res.step_launches[s] = launches() - k0;
    }
    if (graph) {
        int trainable = 0;
        for (int i = 0; i < NP; i++) trainable += !frozen(i);
        ck_assert_int_eq(pl_graph_optim_calls(g), trainable);
    }
    pl_graph_release(g);
    res.params = PL_CK_NOTNULL(pl_snapshot_new());
    PL_CK_OK(pl_snapshot_save_params(res.params, r.ctx->params));
    res.state = PL_CK_NOTNULL(pl_harness_state_save(r.optim, r.optim_self));
    tk_close(&r);
    return res;
}

START_TEST(foreach_step_in_a_captured_graph_replays_the_eager_bits) {
    int c = _i;
    use_strict();
    result eager = run_graph(g_cfg[c].plugin, g_cfg[c].body, false, false);
    result graph = run_graph(g_cfg[c].plugin, g_cfg[c].body, true, true);
    result graph1 = run_graph(g_cfg[c].plugin, g_cfg[c].body, false, true);
    assert_same(&eager, &graph, "graph foreach vs eager per-tensor");
    assert_same(&eager, &graph1, "graph per-tensor vs eager per-tensor");
    /* a replay launches what the capture recorded: ceil(n / 32) per group
     * (from step 2: step 1's capture_begin also zeroes the graph's counter
     * offset, one memset) */
    int n[2] = {0, 0};
    for (int i = 0; i < NP; i++) n[is_bias(i)] += !frozen(i);
    uint64_t want = (uint64_t)((n[0] + 31) / 32 + (n[1] + 31) / 32);
    for (int s = 2; s < STEPS; s++) {
        ck_assert_uint_eq(graph.step_launches[s], want);
        ck_assert_uint_eq(graph1.step_launches[s], (uint64_t)(n[0] + n[1]));
    }
    result_free(&eager);
    result_free(&graph);
    result_free(&graph1);
}
END_TEST

/* foreach = false is the option's documented way back to one call per
 * parameter; the default is true. */
START_TEST(foreach_is_on_by_default) {
    use_strict();
    result def = run("adamw", "lr = 0.01\n", true, STRICT);
    tk_run r;
    add_params(&r, STRICT);
    tk_optimizer(&r, "adamw", "lr = 0.01\ngroup.nd.match = *bias\n");
    set_grads(&r, STRICT, 0, false);
    uint64_t k0 = launches();
    PL_CK_OK(((const pl_optimizer_vtable *)r.ctx->optimizer)->step(r.optim_self));
    ck_assert_uint_eq(launches() - k0, expected_launches(0, true));
    tk_close(&r);
    result_free(&def);
}
END_TEST

int main(void) {
    Suite *s = suite_create("optim_foreach");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, foreach_equals_per_tensor_on_cpu, 0, N_CFG);
    tcase_add_loop_test(tc, foreach_equals_per_tensor_on_strict_in_fewer_launches, 0, N_CFG);
    tcase_add_loop_test(tc, foreach_step_in_a_captured_graph_replays_the_eager_bits, 0, N_CFG);
    tcase_add_test(tc, foreach_is_on_by_default);
    suite_add_tcase(s, tc);
    return pl_test_run(s);
}
