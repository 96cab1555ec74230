/* test_mlp.c - the mlp model plugin, built from INI sections through the
 * public harness: a 2-3-2 network with hand-set weights against the
 * nn.Linear / activation / loss formulas computed here in double (the same
 * as torch.nn.functional's), the masked rows, evaluation metrics, the
 * numerical gradient check, nn.Linear's init bounds and option errors. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "pipeline/testing.h"
#include "pl_test.h"

/* x [B=3, F=2]; W1 [H=3, 2], b1 [3]; W2 [K=2, 3], b2 [2] */
#define B 3
#define F 2
#define H 3
#define K 2
static const float X[B * F] = {0.5f, -1.0f, 1.5f, 0.25f, -0.75f, 2.0f};
static const float W1[H * F] = {0.2f, -0.4f, 0.7f, 0.1f, -0.3f, 0.5f};
static const float B1[H] = {0.05f, -0.2f, 0.3f};
static const float W2[K * H] = {0.6f, -0.1f, 0.4f, -0.5f, 0.3f, 0.2f};
static const float B2[K] = {-0.1f, 0.25f};
static const float Y[B * K] = {0.3f, -0.2f, 1.1f, 0.4f, -0.6f, 0.9f};
static const int64_t CLS[B] = {1, 0, 1};

typedef enum { A_RELU, A_TANH, A_GELU } act;

static double act_of(act a, double v) {
    if (a == A_RELU) return v > 0 ? v : 0;
    if (a == A_TANH) return tanh(v);
    return 0.5 * v * (1 + erf(v / sqrt(2.0))); /* exact GELU */
}

/* out[B, K] = W2 act(W1 x + b1) + b2, the nn.Linear stack by hand */
static void reference_logits(act a, double out[B][K]) {
    for (int i = 0; i < B; i++) {
        double h[H];
        for (int j = 0; j < H; j++) {
            double z = B1[j];
            for (int f = 0; f < F; f++) z += (double)W1[j * F + f] * X[i * F + f];
            h[j] = act_of(a, z);
        }
        for (int k = 0; k < K; k++) {
            double z = B2[k];
            for (int j = 0; j < H; j++) z += (double)W2[k * H + j] * h[j];
            out[i][k] = z;
        }
    }
}

static const char *NET = "in_features = 2\nout_features = 2\nhidden = 3\nlayers = 2\n";

typedef struct net {
    pl_harness *h;
    void *m;
    pl_tensor *x, *y, *cls, *mask;
    pl_batch b;
} net;

static void set(pl_harness *h, const char *name, const float *v, int64_t n) {
    pl_param *p = pl_params_find(pl_harness_ctx(h)->params, name);
    ck_assert_msg(p != NULL, "parameter %s missing", name);
    ck_assert_int_eq(pl_tensor_numel(p->t), n);
    memcpy(pl_tensor_f32(p->t), v, sizeof(float) * (size_t)n);
}

/* The network of the reference with `extra` options; classes: y = CLS. */
static void net_open(net *n, const char *extra, bool classes, const uint8_t *mask) {
    memset(n, 0, sizeof *n);
    char ini[512];
    snprintf(ini, sizeof ini, "%s%s", NET, extra);
    n->h = pl_harness_new("model", "mlp", ini);
    ck_assert_msg(n->h != NULL, "%s", pl_error_message());
    PL_CK_OK(pl_harness_create(n->h, &n->m));
    set(n->h, "mlp.0.weight", W1, H * F);
    set(n->h, "mlp.0.bias", B1, H);
    set(n->h, "mlp.1.weight", W2, K * H);
    set(n->h, "mlp.1.bias", B2, K);
    n->x = pl_tensor_from_data(PL_F32, PL_SHAPE(B, F), X, PL_CPU);
    PL_CK_OK(pl_harness_batch_add(&n->b, "x", n->x));
    if (classes) {
        n->cls = pl_tensor_from_data(PL_I64, PL_SHAPE(B), CLS, PL_CPU);
        PL_CK_OK(pl_harness_batch_add(&n->b, "y", n->cls));
    } else {
        n->y = pl_tensor_from_data(PL_F32, PL_SHAPE(B, K), Y, PL_CPU);
        PL_CK_OK(pl_harness_batch_add(&n->b, "y", n->y));
    }
    if (mask) {
        n->mask = pl_tensor_from_data(PL_U8, PL_SHAPE(B), mask, PL_CPU);
        PL_CK_OK(pl_harness_batch_add(&n->b, "mask", n->mask));
    }
    n->b.size = B;
    PL_CK_OK(pl_harness_check_batch(n->h, &n->b, PL_SPLIT_TRAIN));
}

static void net_close(net *n) {
    pl_tensor_release(n->x);
    pl_tensor_release(n->y);
    pl_tensor_release(n->cls);
    pl_tensor_release(n->mask);
    pl_harness_destroy(n->h, n->m);
    pl_harness_free(n->h);
}

static double train_loss(net *n) {
    double v;
    PL_CK_OK(pl_harness_forward(n->h, n->m, &n->b, PL_SPLIT_TRAIN, true, &v, NULL));
    return v;
}

/* mean over rows in `mask` (NULL: all) and the K outputs of loss(d = out - y) */
static double reference_regression(act a, const char *loss, double delta, const uint8_t *mask) {
    double out[B][K], s = 0;
    int rows = 0;
    reference_logits(a, out);
    for (int i = 0; i < B; i++) {
        if (mask && !mask[i]) continue;
        rows++;
        for (int k = 0; k < K; k++) {
            double d = out[i][k] - Y[i * K + k], ad = fabs(d);
            s += !strcmp(loss, "mse")   ? d * d
                 : !strcmp(loss, "mae") ? ad
                 : ad < delta           ? 0.5 * d * d
                                        : delta * (ad - 0.5 * delta);
        }
    }
    return s / (rows * K);
}

START_TEST(regression_losses_match_the_formulas) {
    static const struct {
        const char *opts, *loss;
        act a;
        double delta;
    } c[] = {
        {"activation = relu\nloss = mse\n", "mse", A_RELU, 0},
        {"activation = tanh\nloss = mae\n", "mae", A_TANH, 0},
        {"activation = gelu\nloss = huber\nhuber_delta = 0.3\n", "huber", A_GELU, 0.3},
    };
    for (size_t i = 0; i < sizeof c / sizeof *c; i++) {
        net n;
        net_open(&n, c[i].opts, false, NULL);
        double want = reference_regression(c[i].a, c[i].loss, c[i].delta, NULL);
        double got = train_loss(&n);
        ck_assert_msg(fabs(got - want) < 1e-6, "%s: loss %.9g, formula %.9g", c[i].loss, got, want);
        net_close(&n);
    }
}
END_TEST

/* cross entropy (F.cross_entropy, mean) and accuracy in evaluation */
START_TEST(cross_entropy_and_accuracy_match_the_formulas) {
    net n;
    net_open(&n, "loss = cross_entropy\n", true, NULL);
    double out[B][K], ce = 0;
    int correct = 0;
    reference_logits(A_RELU, out);
    for (int i = 0; i < B; i++) {
        double mx = fmax(out[i][0], out[i][1]);
        double lse = mx + log(exp(out[i][0] - mx) + exp(out[i][1] - mx));
        ce += lse - out[i][CLS[i]];
        correct += (out[i][1] > out[i][0] ? 1 : 0) == CLS[i];
    }
    ck_assert_double_eq_tol(train_loss(&n), ce / B, 1e-6);
    pl_metrics m;
    pl_metrics_reset(&m);
    double loss;
    PL_CK_OK(pl_harness_forward(n.h, n.m, &n.b, PL_SPLIT_VAL, false, &loss, &m));
    ck_assert_double_eq_tol(pl_metrics_get(&m, "loss"), ce / B, 1e-6);
    ck_assert_double_eq_tol(pl_metrics_get(&m, "accuracy"), correct / (double)B, 1e-12);
    net_close(&n);
}
END_TEST

/* mask_field: only the selected rows count, in the loss and the metrics */
START_TEST(masked_rows_are_the_only_ones_that_count) {
    static const uint8_t mask[B] = {1, 0, 1};
    net n;
    net_open(&n, "mask_field = mask\n", false, mask);
    double want = reference_regression(A_RELU, "mse", 0, mask);
    ck_assert_double_eq_tol(train_loss(&n), want, 1e-6);
    pl_metrics m;
    pl_metrics_reset(&m);
    PL_CK_OK(pl_harness_forward(n.h, n.m, &n.b, PL_SPLIT_VAL, false, NULL, &m));
    ck_assert_double_eq_tol(pl_metrics_get(&m, "loss"), want, 1e-6);
    ck_assert_double_eq(m.count[0], 2); /* two rows */
    ck_assert_double_eq_tol(pl_metrics_get(&m, "mae"),
                            reference_regression(A_RELU, "mae", 0, mask), 1e-6);
    net_close(&n);
}
END_TEST

START_TEST(gradients_match_finite_differences) {
    static const char *acts[] = {"activation = tanh\nloss = huber\nhuber_delta = 0.5\n",
                                 "activation = gelu\nloss = cross_entropy\n"};
    for (int i = 0; i < 2; i++) {
        net n;
        net_open(&n, acts[i], i == 1, NULL);
        pl_status st = pl_harness_gradcheck(n.h, n.m, &n.b, 1e-3, 1e-4, 1e-2, 0);
        ck_assert_msg(st == PL_OK, "%s", pl_error_message());
        net_close(&n);
    }
}
END_TEST

/* nn.Linear's init: weights and biases in U(-1/sqrt(fan_in), 1/sqrt(fan_in));
 * widths from the loader's meta when in/out_features are 0 */
START_TEST(init_bounds_and_widths_from_the_loader_meta) {
    pl_harness *h = PL_CK_NOTNULL(pl_harness_new("model", "mlp", "hidden = 16\nlayers = 3\n"));
    PL_CK_OK(pl_meta_set_int(pl_harness_ctx(h)->meta, "num_features", 9));
    PL_CK_OK(pl_meta_set_int(pl_harness_ctx(h)->meta, "num_targets", 4));
    void *m;
    PL_CK_OK(pl_harness_create(h, &m));
    pl_params *ps = pl_harness_ctx(h)->params;
    ck_assert_int_eq(pl_params_count(ps), 6);
    static const int64_t fan_in[3] = {9, 16, 16}, fan_out[3] = {16, 16, 4};
    for (int l = 0; l < 3; l++) {
        pl_tensor *w = pl_params_at(ps, 2 * l)->t, *b = pl_params_at(ps, 2 * l + 1)->t;
        ck_assert_int_eq(w->shape[0], fan_out[l]);
        ck_assert_int_eq(w->shape[1], fan_in[l]);
        ck_assert_int_eq(b->shape[0], fan_out[l]);
        ck_assert(pl_params_at(ps, 2 * l + 1)->tags & PL_TAG_NO_DECAY);
        double bound = 1 / sqrt((double)fan_in[l]), mx = 0;
        for (int64_t i = 0; i < pl_tensor_numel(w); i++) mx = fmax(mx, fabs(pl_tensor_get(w, i)));
        for (int64_t i = 0; i < pl_tensor_numel(b); i++) mx = fmax(mx, fabs(pl_tensor_get(b, i)));
        ck_assert_msg(mx <= bound && mx > 0.5 * bound, "layer %d: max |w| %g, bound %g", l, mx, bound);
    }
    pl_harness_destroy(h, m);
    pl_harness_free(h);
}
END_TEST

START_TEST(option_errors_are_refused_like_a_config) {
    static const struct {
        const char *body, *needle;
    } bad[] = {
        {"layers = 0\n", "layers"},
        {"layers = 17\n", "layers"},
        {"activation = sigmoid\n", "sigmoid"},
        {"loss = hinge\n", "hinge"},
        {"dropout = 1.5\n", "dropout"},
        {"hiden = 8\n", "did you mean 'hidden'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        ck_assert_ptr_null(pl_harness_new("model", "mlp", bad[i].body));
        ck_assert_int_eq(pl_error_status(), PL_ERR_CONFIG);
        ck_assert_msg(strstr(pl_error_message(), bad[i].needle) != NULL, "%s -> %s", bad[i].body,
                      pl_error_message());
    }
    /* widths nobody provides: create says which meta key is missing */
    pl_harness *h = PL_CK_NOTNULL(pl_harness_new("model", "mlp", NULL));
    void *m = NULL;
    ck_assert_int_eq(pl_harness_create(h, &m), PL_ERR_CONFIG);
    ck_assert_msg(strstr(pl_error_message(), "num_features") != NULL, "%s", pl_error_message());
    ck_assert_ptr_null(m);
    pl_harness_free(h);
    /* cross entropy needs the class count */
    h = PL_CK_NOTNULL(pl_harness_new("model", "mlp", "in_features = 3\nloss = cross_entropy\n"));
    ck_assert_int_eq(pl_harness_create(h, &m), PL_ERR_CONFIG);
    ck_assert_msg(strstr(pl_error_message(), "num_classes") != NULL, "%s", pl_error_message());
    pl_harness_free(h);
}
END_TEST

START_TEST(batch_needs_follow_the_options) {
    net n;
    net_open(&n, "loss = cross_entropy\n", true, NULL);
    /* classes must be an index field */
    pl_tensor *fy = pl_tensor_from_data(PL_F32, PL_SHAPE(B, K), Y, PL_CPU);
    pl_batch b = {0};
    PL_CK_OK(pl_harness_batch_add(&b, "x", n.x));
    PL_CK_OK(pl_harness_batch_add(&b, "y", fy));
    ck_assert_int_eq(pl_harness_check_batch(n.h, &b, PL_SPLIT_TRAIN), PL_ERR_INVALID);
    ck_assert_msg(strstr(pl_error_message(), "'y'") != NULL, "%s", pl_error_message());
    pl_tensor_release(fy);
    net_close(&n);
    /* a mask field, when named, is required */
    pl_harness *h = PL_CK_NOTNULL(pl_harness_new("model", "mlp", "mask_field = train_mask\n"));
    pl_tensor *x = pl_tensor_from_data(PL_F32, PL_SHAPE(B, F), X, PL_CPU);
    pl_tensor *y = pl_tensor_from_data(PL_F32, PL_SHAPE(B, K), Y, PL_CPU);
    pl_batch c = {0};
    PL_CK_OK(pl_harness_batch_add(&c, "x", x));
    PL_CK_OK(pl_harness_batch_add(&c, "y", y));
    ck_assert_int_eq(pl_harness_check_batch(h, &c, PL_SPLIT_TRAIN), PL_ERR_INVALID);
    ck_assert_msg(strstr(pl_error_message(), "train_mask") != NULL, "%s", pl_error_message());
    pl_tensor_release(x);
    pl_tensor_release(y);
    pl_harness_free(h);
}
END_TEST

int main(void) {
    Suite *s = suite_create("mlp");
    TCase *tc = tcase_create("mlp");
    tcase_add_test(tc, regression_losses_match_the_formulas);
    tcase_add_test(tc, cross_entropy_and_accuracy_match_the_formulas);
    tcase_add_test(tc, masked_rows_are_the_only_ones_that_count);
    tcase_add_test(tc, gradients_match_finite_differences);
    tcase_add_test(tc, init_bounds_and_widths_from_the_loader_meta);
    tcase_add_test(tc, option_errors_are_refused_like_a_config);
    tcase_add_test(tc, batch_needs_follow_the_options);
    suite_add_tcase(s, tc);
    return pl_test_run(s);
}
