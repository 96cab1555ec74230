#include "pl_test.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pipeline/graph.h"
#include "pipeline/optim_math.h"

const char *pl_test_shared(const char *rel, char *buf, size_t n) {
    snprintf(buf, n, "%s/../shared/data/%s", PL_TEST_SOURCE_DIR, rel);
    if (access(buf, R_OK) != 0) {
        fprintf(stderr, "SKIP: shared data %s not found\n", buf);
        return NULL;
    }
    return buf;
}

pl_tensor *pl_test_randn(int ndim, const int64_t *shape, uint64_t seed) {
    pl_tensor *t = pl_tensor_empty(PL_F32, ndim, shape, PL_CPU);
    if (t) pl_tensor_normal_(t, 0.0, 1.0, seed, 0);
    return t;
}

pl_tensor *pl_test_rand(int ndim, const int64_t *shape, double lo, double hi, uint64_t seed) {
    pl_tensor *t = pl_tensor_empty(PL_F32, ndim, shape, PL_CPU);
    if (t) pl_tensor_uniform_(t, lo, hi, seed, 0);
    return t;
}

double pl_test_max_abs_diff(const pl_tensor *a, const pl_tensor *b) {
    int64_t n = pl_tensor_numel(a);
    if (n != pl_tensor_numel(b)) return INFINITY;
    double m = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs(pl_tensor_get(a, i) - pl_tensor_get(b, i));
        if (isnan(d)) return INFINITY;
        if (d > m) m = d;
    }
    return m;
}

/* L = sum(out * R) in f64; R drawn once per call shape from a fixed seed. */
static double weighted_sum(pl_tensor *out, pl_tensor *r) {
    double s = 0;
    int64_t n = pl_tensor_numel(out);
    for (int64_t i = 0; i < n; i++) s += pl_tensor_get(out, i) * pl_tensor_get(r, i);
    return s;
}

bool pl_gradcheck(pl_test_fn f, pl_tensor **inputs, int n, void *ctx, double eps, double atol,
                  double rtol, char *msg, size_t msgn) {
    bool ok = true;
    pl_frame_begin();
    pl_tensor *out = f(inputs, n, ctx);
    if (!out) {
        snprintf(msg, msgn, "forward failed: %s", pl_error_message());
        pl_frame_end();
        return false;
    }
    pl_tensor *r = pl_frame_keep(pl_test_randn(out->ndim, out->shape, 1234));
    pl_tensor *rw = r;
    if (out->dtype != PL_F32) rw = pl_cast(r, out->dtype);
    pl_tensor *loss = pl_sum(pl_mul(out, rw), PL_ALL_DIMS, false);
    for (int i = 0; i < n; i++)
        if (inputs[i] && inputs[i]->requires_grad) pl_tensor_zero_grad(inputs[i]);
    if (!loss || pl_backward(loss, 1.0) != PL_OK) {
        snprintf(msg, msgn, "backward failed: %s", pl_error_message());
        pl_frame_end();
        pl_tensor_release(r);
        return false;
    }
    pl_frame_end();
    pl_no_grad_begin();
    for (int i = 0; i < n && ok; i++) {
        pl_tensor *x = inputs[i];
        if (!x || !x->requires_grad) continue;
        if (!x->grad) {
            snprintf(msg, msgn, "input %d: no gradient was accumulated", i);
            ok = false;
            break;
        }
        int64_t m = pl_tensor_numel(x);
        float *xd = pl_tensor_f32(x);
        for (int64_t j = 0; j < m && ok; j++) {
            float orig = xd[j];
            xd[j] = orig + (float)eps;
            pl_frame_begin();
            double lp = weighted_sum(f(inputs, n, ctx), r);
            pl_frame_end();
            xd[j] = orig - (float)eps;
            pl_frame_begin();
            double lm = weighted_sum(f(inputs, n, ctx), r);
            pl_frame_end();
            xd[j] = orig;
            double num = (lp - lm) / (2 * eps);
            double ana = pl_tensor_get(x->grad, j);
            if (!(fabs(ana - num) <= atol + rtol * fabs(num))) {
                snprintf(msg, msgn, "input %d element %lld: analytic %.6g numerical %.6g", i,
                         (long long)j, ana, num);
                ok = false;
            }
        }
    }
    pl_no_grad_end();
    pl_tensor_release(r);
    return ok;
}

char *pl_test_read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "%s: cannot open", path);
    ck_assert_int_eq(fseek(f, 0, SEEK_END), 0);
    long n = ftell(f);
    ck_assert_msg(n >= 0, "%s: cannot size", path);
    ck_assert_int_eq(fseek(f, 0, SEEK_SET), 0);
    char *buf = malloc((size_t)n + 1);
    ck_assert_ptr_nonnull(buf);
    ck_assert_msg((long)fread(buf, 1, (size_t)n, f) == n, "%s: short read", path);
    buf[n] = 0;
    fclose(f);
    return buf;
}

void pl_test_write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    ck_assert_msg(f != NULL, "%s: cannot create", path);
    ck_assert_msg(fputs(text, f) >= 0 && fclose(f) == 0, "%s: write failed", path);
}

int pl_test_run(Suite *s) {
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? 0 : 1;
}

void pl_test_st_replace(const char *src, const char *dst, const char *name, pl_tensor *t) {
    pl_st_file *f = NULL;
    PL_CK_OK(pl_st_open(src, &f));
    pl_st_writer *w = PL_CK_NOTNULL(pl_st_writer_new(dst));
    for (int i = 0; i < pl_st_count(f); i++) {
        const char *n = pl_st_name_at(f, i);
        pl_tensor *x = strcmp(n, name) ? PL_CK_NOTNULL(pl_st_load(f, n)) : pl_tensor_retain(t);
        if (x) PL_CK_OK(pl_st_writer_add(w, n, x));
        pl_tensor_release(x);
    }
    pl_st_close(f);
    PL_CK_OK(pl_st_writer_commit(w));
    pl_st_writer_free(w);
}

const char *pl_test_tmp_path(const char *suite, const char *name, char *buf, size_t n) {
    static char dir[256];
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "/tmp/pl_test_%s_XXXXXX", suite);
        ck_assert_ptr_nonnull(mkdtemp(dir));
    }
    snprintf(buf, n, "%s/%s", dir, name);
    return buf;
}

/* ---- whole-step graphs (pl_test_graph_step) ---- */

typedef struct gstep {
    pl_tensor *w, *m, *v, *y, *loss; /* loss: f32 [1], where every step writes its loss */
} gstep;

static pl_adamw_hyper gstep_hyper(int s) {
    pl_adamw_hyper hp = {.lr = 0.01 * (1.0 - 0.05 * s), .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8,
                         .weight_decay = 0.01, .step = s + 1};
    return hp;
}

/* The step on input x at step s (0-based): forward (dropout's counter a
 * function of s, as a model's of its micro-step), the loss into g->loss,
 * backward, AdamW, zero_grad. */
static pl_status gstep_run(gstep *g, pl_tensor *x, int s) {
    pl_frame_begin();
    pl_tensor *h = pl_gelu(pl_linear(x, g->w, NULL), false);
    h = pl_dropout(h, 0.2, 5, 1000 + (uint64_t)s * 8 + 1, true);
    pl_tensor *loss = pl_cross_entropy(h, g->y, -100, 0.0);
    pl_status st = loss ? PL_OK : pl_error_status();
    if (!st) {
        pl_no_grad_begin();
        st = pl_tensor_copy_(g->loss, loss);
        pl_no_grad_end();
    }
    if (!st) st = pl_backward(loss, 1.0);
    pl_frame_end();
    pl_adamw_hyper hp = gstep_hyper(s);
    if (!st) st = pl_adamw_step_(g->w, g->w->grad, g->m, g->v, NULL, &hp);
    if (!st) pl_tensor_zero_grad(g->w);
    return st;
}

/* One run: losses[steps] and the final weights (CPU); graphs: capture at 2. */
static pl_tensor *gstep_train(pl_device d, int steps, bool graphs, double *losses, int *replays) {
    gstep g;
    pl_frame_begin();
    g.w = pl_tensor_to(pl_test_randn(2, (int64_t[]){10, 32}, 2), PL_F32, d);
    g.m = pl_tensor_zeros(PL_F32, 2, (int64_t[]){10, 32}, d);
    g.v = pl_tensor_zeros(PL_F32, 2, (int64_t[]){10, 32}, d);
    g.loss = pl_tensor_zeros(PL_F32, 1, (int64_t[]){1}, d);
    int64_t yv[16];
    for (int i = 0; i < 16; i++) yv[i] = (i * 7) % 10;
    g.y = pl_tensor_from_data(PL_I64, 1, (int64_t[]){16}, yv, d);
    pl_tensor *xs = pl_tensor_zeros(PL_F32, 2, (int64_t[]){16, 32}, d); /* the static input */
    ck_assert_msg(g.w && g.m && g.v && g.loss && g.y && xs, "setup: %s", pl_error_message());
    pl_tensor_set_requires_grad(g.w, true);
    pl_graph *gr = NULL;
    *replays = 0;
    for (int s = 0; s < steps; s++) {
        pl_frame_begin();
        pl_tensor *xb = pl_tensor_to(pl_test_randn(2, (int64_t[]){16, 32}, 100 + (uint64_t)s), PL_F32, d);
        ck_assert_msg(xb != NULL, "%s", pl_error_message());
        pl_status st = PL_OK;
        if (!graphs || s < 2) {
            pl_graph_dropout_learn(graphs && s == 1); /* the step before the capture */
            st = gstep_run(&g, xb, s);
        } else if (s == 2) {
            pl_graph_dropout_learn(false);
            st = pl_tensor_copy_(xs, xb);
            if (!st) st = pl_graph_capture_begin(d);
            if (!st) {
                st = gstep_run(&g, xs, s);
                pl_status e = pl_graph_capture_end(&gr);
                if (!st) st = e;
            }
            if (!st) st = pl_graph_set_micro_delta(gr, 0);
            if (!st) st = pl_graph_replay(gr);
        } else {
            pl_adamw_hyper hp = gstep_hyper(s);
            st = pl_tensor_copy_(xs, xb);
            if (!st) st = pl_graph_refresh_begin(gr);
            if (!st) {
                st = pl_adamw_step_(g.w, g.w->grad, g.m, g.v, NULL, &hp); /* only the coefficients */
                pl_status e = pl_graph_refresh_end(gr);
                if (!st) st = e;
            }
            if (!st) st = pl_graph_set_micro_delta(gr, s - 2);
            if (!st) st = pl_graph_replay(gr);
            if (!st) ++*replays;
        }
        ck_assert_msg(st == PL_OK, "%s step %d: %s", graphs ? "graph" : "eager", s, pl_error_message());
        losses[s] = pl_tensor_item(g.loss);
        pl_frame_end();
    }
    if (graphs) ck_assert_int_eq(pl_graph_optim_calls(gr), 1);
    if (graphs) ck_assert_int_eq(pl_graph_dropout_calls(gr), 1);
    pl_tensor *wh = pl_tensor_retain(pl_tensor_to(g.w, PL_F32, PL_CPU));
    pl_frame_end();
    pl_graph_release(gr);
    return wh;
}

void pl_test_graph_step(pl_device d, int steps, double tol) {
    ck_assert_int_ge(steps, 4);
    ck_assert_msg(pl_graph_supported(d), "the device cannot capture graphs");
    double le[64], lg[64];
    ck_assert_int_le(steps, 64);
    int r0 = 0, reps = 0;
    pl_tensor *we = gstep_train(d, steps, false, le, &r0);
    pl_tensor *wg = gstep_train(d, steps, true, lg, &reps);
    ck_assert_int_eq(reps, steps - 3);
    for (int s = 0; s < steps; s++)
        ck_assert_msg(fabs(le[s] - lg[s]) <= tol && isfinite(le[s]),
                      "step %d: eager loss %.9g, graph %.9g (tol %g)", s, le[s], lg[s], tol);
    /* the losses move: a replay that ran nothing would repeat the capture's */
    ck_assert_msg(lg[steps - 1] != lg[2], "the replayed losses do not change");
    double dw = pl_test_max_abs_diff(we, wg);
    ck_assert_msg(dw <= tol, "final weights differ by %g (tol %g)", dw, tol);
    pl_tensor_release(we);
    pl_tensor_release(wg);
}

void pl_test_graph_violation(pl_device d) {
    pl_frame_begin();
    pl_tensor *t = pl_tensor_zeros(PL_F32, 1, (int64_t[]){4}, d);
    ck_assert_ptr_nonnull(t);
    PL_CK_OK(pl_graph_capture_begin(d));
    ck_assert_int_eq(pl_graph_capture_begin(d), PL_ERR_INVALID);
    double v = pl_tensor_item(pl_tensor_view_rows(t, 0, 1));
    ck_assert_msg(isnan(v) || v == 0.0, "%g", v);
    ck_assert_msg(strstr(pl_error_message(), "host read"), "pl_tensor_item while capturing: %s",
                  pl_error_message());
    pl_graph *g = NULL;
    ck_assert_int_ne(pl_graph_capture_end(&g), PL_OK);
    ck_assert_msg(strstr(pl_error_message(), "host read"), "capture_end: %s", pl_error_message());
    ck_assert_ptr_null(g);
    ck_assert(!pl_graph_capturing());
    /* memory the core's allocator did not ask for (a kernel's own scratch) */
    const pl_backend *b = pl_backend_get(d.type);
    PL_CK_OK(pl_graph_capture_begin(d));
    ck_assert_ptr_null(b->raw_alloc(d.index, 4096));
    ck_assert_msg(strstr(pl_error_message(), "outside the graph's pool"), "raw_alloc while capturing: %s",
                  pl_error_message());
    ck_assert_int_ne(pl_graph_capture_end(&g), PL_OK);
    ck_assert_msg(strstr(pl_error_message(), "outside the graph's pool"), "capture_end: %s",
                  pl_error_message());
    /* the core's allocator inside a capture: served from the graph's pool */
    PL_CK_OK(pl_graph_capture_begin(d));
    pl_tensor *big = pl_tensor_empty(PL_F32, 1, (int64_t[]){1 << 20}, d); /* the frame's */
    ck_assert_msg(big != NULL, "%s", pl_error_message());
    PL_CK_OK(pl_tensor_fill_(big, 0.0)); /* a memset: a graph with one node */
    PL_CK_OK(pl_graph_capture_end(&g));
    PL_CK_OK(pl_graph_replay(g));
    pl_graph_release(g);
    pl_error_clear();
    pl_frame_end();
}
