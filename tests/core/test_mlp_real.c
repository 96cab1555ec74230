/* A 2-layer MLP written only with the public API, trained with plain SGD on
 * a real table: predict Clark/Lake `ridership` from four other stations'
 * same-day ridership (Chicago CTA, ../shared/data/timeseries), standardized.
 * The training loss must fall well below the variance of the target (1.0). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pl_test.h"

#define MAXROWS 6000
#define NF 4

static int load_table(const char *path, float *x, float *y) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char line[8192];
    if (!fgets(line, sizeof line, f)) {
        fclose(f);
        return -1;
    }
    int n = 0;
    while (n < MAXROWS && fgets(line, sizeof line, f)) {
        /* columns: ridership, Austin, Quincy_Wells, Belmont, Archer_35th, ... */
        double v[5];
        char *p = line;
        for (int c = 0; c < 5; c++) {
            v[c] = strtod(p, &p);
            if (*p == ',') p++;
        }
        y[n] = (float)v[0];
        for (int c = 0; c < NF; c++) x[n * NF + c] = (float)v[1 + c];
        n++;
    }
    fclose(f);
    return n;
}

static void standardize(float *v, int n, int stride, int col) {
    double m = 0, s = 0;
    for (int i = 0; i < n; i++) m += v[i * stride + col];
    m /= n;
    for (int i = 0; i < n; i++) s += pow(v[i * stride + col] - m, 2);
    s = sqrt(s / n);
    for (int i = 0; i < n; i++) v[i * stride + col] = (float)((v[i * stride + col] - m) / s);
}

static void sgd(pl_tensor *p, double lr) {
    float *w = pl_tensor_f32(p);
    const float *g = pl_tensor_f32(p->grad);
    for (int64_t i = 0; i < pl_tensor_numel(p); i++) w[i] -= (float)(lr * g[i]);
    pl_tensor_zero_grad(p);
}

START_TEST(mlp_sgd_lowers_loss_on_chicago_ridership) {
    char buf[512];
    const char *path = pl_test_shared("timeseries/chicago_ridership.csv", buf, sizeof buf);
    if (!path) return;
    float *x = malloc(sizeof(float) * MAXROWS * NF), *y = malloc(sizeof(float) * MAXROWS);
    int n = load_table(path, x, y);
    ck_assert_int_eq(n, 5698);
    for (int c = 0; c < NF; c++) standardize(x, n, NF, c);
    standardize(y, n, 1, 0);
    pl_tensor *X = pl_tensor_from_data(PL_F32, PL_SHAPE(n, NF), x, PL_CPU);
    pl_tensor *Y = pl_tensor_from_data(PL_F32, PL_SHAPE(n, 1), y, PL_CPU);
    pl_tensor *w1 = pl_test_rand(2, (int64_t[]){16, NF}, -0.5, 0.5, 1);
    pl_tensor *b1 = pl_tensor_zeros(PL_F32, PL_SHAPE(16), PL_CPU);
    pl_tensor *w2 = pl_test_rand(2, (int64_t[]){1, 16}, -0.25, 0.25, 2);
    pl_tensor *b2 = pl_tensor_zeros(PL_F32, PL_SHAPE(1), PL_CPU);
    pl_tensor *params[] = {w1, b1, w2, b2};
    for (int i = 0; i < 4; i++) pl_tensor_set_requires_grad(params[i], true);
    double first = 0, last = 0;
    for (int step = 0; step < 300; step++) {
        pl_frame_begin();
        pl_tensor *h = pl_relu(pl_linear(X, w1, b1));
        pl_tensor *loss = pl_mse_loss(pl_linear(h, w2, b2), Y);
        ck_assert_msg(loss != NULL, "%s", pl_error_message());
        double lv = pl_tensor_item(loss);
        if (step == 0) first = lv;
        last = lv;
        PL_CK_OK(pl_backward(loss, 1.0));
        for (int i = 0; i < 4; i++) sgd(params[i], 0.1);
        pl_frame_end();
    }
    /* ridership at Clark/Lake is strongly explained by the other stations */
    ck_assert_msg(first > 0.5 && last < 0.35 * first, "loss %.4f -> %.4f", first, last);
    for (int i = 0; i < 4; i++) pl_tensor_release(params[i]);
    pl_tensor_release(X);
    pl_tensor_release(Y);
    free(x);
    free(y);
}
END_TEST

int main(void) {
    Suite *s = suite_create("mlp_real");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, mlp_sgd_lowers_loss_on_chicago_ridership);
    suite_add_tcase(s, tc);
    return pl_test_run(s);
}
