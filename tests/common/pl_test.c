#include "pl_test.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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
