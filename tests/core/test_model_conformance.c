/* test_model_conformance.c - what every model plugin must do, run over every
 * in-tree model (gat, ilora, lstm, mlp, stock_gat) through the public harness
 * (pipeline/testing.h) only, each with a small INI section, the meta a
 * loader would publish and a synthetic batch:
 *   - the synthetic batch satisfies the model's batch_needs;
 *   - dropout is keyed on ctx->micro_step: two training forwards at the
 *     same micro step give the same loss, another micro step another loss;
 *   - an evaluation forward (training false, grad off) records no tape node;
 *   - resume is bit-identical: k adamw steps, save parameters + optimizer
 *     state, n more steps; a fresh model + optimizer loaded from the saved
 *     state and stepped n times ends with the same parameters, bit for bit;
 *   - the training loss (dropout off) passes a numerical gradient check
 *     with respect to every trainable parameter.
 * A new model plugin joins by adding one entry to `cases`. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "pipeline/testing.h"
#include "pl_test.h"

/* ---- synthetic batches ------------------------------------------------- */

typedef struct synth {
    pl_tensor *t[PL_BATCH_MAX_FIELDS];
    int n;
    pl_batch b;
} synth;

static void put(synth *s, const char *name, pl_tensor *t) {
    ck_assert_msg(t != NULL, "%s: %s", name, pl_error_message());
    s->t[s->n++] = t;
    PL_CK_OK(pl_harness_batch_add(&s->b, name, t));
}

static pl_tensor *i64(int ndim, const int64_t *shape, const int64_t *v) {
    return pl_tensor_from_data(PL_I64, ndim, shape, v, PL_CPU);
}

static void synth_free(synth *s) {
    for (int i = 0; i < s->n; i++) pl_tensor_release(s->t[i]);
    memset(s, 0, sizeof *s);
}

/* mlp: regression x [4, 5] -> y [4, 2] */
static void mlp_meta(pl_meta *m) {
    PL_CK_OK(pl_meta_set_int(m, "num_features", 5));
    PL_CK_OK(pl_meta_set_int(m, "num_targets", 2));
}
static void mlp_batch(synth *s) {
    put(s, "x", pl_test_randn(PL_SHAPE(4, 5), 11));
    put(s, "y", pl_test_randn(PL_SHAPE(4, 2), 12));
    s->b.size = 4;
}

/* gat: node classification on a 6-node graph, 3 classes */
static void gat_meta(pl_meta *m) {
    PL_CK_OK(pl_meta_set_int(m, "num_features", 4));
    PL_CK_OK(pl_meta_set_int(m, "num_classes", 3));
}
static void gat_batch(synth *s) {
    static const int64_t src[8] = {0, 1, 1, 2, 3, 4, 5, 2}, dst[8] = {1, 0, 2, 1, 4, 3, 0, 5};
    static const int64_t y[6] = {0, 1, 2, 1, 0, 2};
    static const uint8_t mask[6] = {1, 1, 0, 1, 1, 1};
    put(s, "x", pl_test_randn(PL_SHAPE(6, 4), 21));
    put(s, "edge_src", i64(PL_SHAPE(8), src));
    put(s, "edge_dst", i64(PL_SHAPE(8), dst));
    put(s, "y", i64(PL_SHAPE(6), y));
    put(s, "mask", pl_tensor_from_data(PL_U8, PL_SHAPE(6), mask, PL_CPU));
    s->b.size = 6;
}

/* lstm: windows x [4, 6, 3] -> one target each */
static void lstm_meta(pl_meta *m) { PL_CK_OK(pl_meta_set_int(m, "num_features", 3)); }
static void lstm_batch(synth *s) {
    put(s, "x", pl_test_randn(PL_SHAPE(4, 6, 3), 31));
    put(s, "y", pl_test_randn(PL_SHAPE(4, 1), 32));
    s->b.size = 4;
}

/* ilora: 2 users x 5 positions of item ids and next-item labels (0 =
 * padding, no loss) */
static void ilora_meta(pl_meta *m) { PL_CK_OK(pl_meta_set_int(m, "num_items", 12)); }
static void ilora_batch(synth *s) {
    static const int64_t ids[10] = {0, 3, 7, 2, 9, 4, 4, 11, 1, 6};
    static const int64_t lab[10] = {0, 7, 2, 9, 5, 4, 11, 1, 6, 12};
    put(s, "input_ids", i64(PL_SHAPE(2, 5), ids));
    put(s, "labels", i64(PL_SHAPE(2, 5), lab));
    s->b.size = 2;
}

/* stock_gat: 2 days x 4 stocks, windows of 5 steps, 3 features, 1 factor;
 * per day each stock receives 2 edges and a self loop (hdf5_graph panel) */
static void stock_gat_meta(pl_meta *m) {
    PL_CK_OK(pl_meta_set_int(m, "num_stocks", 4));
    PL_CK_OK(pl_meta_set_int(m, "num_features", 3));
    PL_CK_OK(pl_meta_set_int(m, "window", 5));
    PL_CK_OK(pl_meta_set_int(m, "num_factors", 1));
    PL_CK_OK(pl_meta_set_str(m, "factor_name_0", "reversal_1d"));
    PL_CK_OK(pl_meta_set_int(m, "num_train", 2)); /* evaluation needs the whole split in a batch */
}
static void stock_gat_batch(synth *s) {
    static const int64_t src[24] = {1, 2, 2, 3, 3, 0, 0, 1, 0, 1, 2, 3,
                                    5, 6, 6, 7, 7, 4, 4, 5, 4, 5, 6, 7};
    static const int64_t dst[24] = {0, 0, 1, 1, 2, 2, 3, 3, 0, 1, 2, 3,
                                    4, 4, 5, 5, 6, 6, 7, 7, 4, 5, 6, 7};
    static const int64_t day[8] = {0, 0, 0, 0, 1, 1, 1, 1};
    put(s, "x", pl_test_randn(PL_SHAPE(8, 5, 3), 41));
    put(s, "edge_src", i64(PL_SHAPE(24), src));
    put(s, "edge_dst", i64(PL_SHAPE(24), dst));
    put(s, "batch", i64(PL_SHAPE(8), day));
    put(s, "y", pl_test_randn(PL_SHAPE(8), 42));
    put(s, "ret", pl_test_rand(PL_SHAPE(8), -0.02, 0.02, 43));
    put(s, "factors", pl_test_randn(PL_SHAPE(8, 1), 44));
    s->b.size = 2;
}

typedef struct model_case {
    const char *plugin;
    const char *ini;        /* dropout on */
    const char *ini_nodrop; /* the same model with every dropout off (gradient check) */
    void (*meta)(pl_meta *m);
    void (*batch)(synth *s);
} model_case;

static const model_case cases[] = {
    {"mlp", "hidden = 6\nlayers = 3\nactivation = tanh\ndropout = 0.3\n",
     "hidden = 6\nlayers = 3\nactivation = tanh\ndropout = 0\n", mlp_meta, mlp_batch},
    {"gat", "layers = 2\nhidden = 3\nheads = 2\noutput_heads = 2\nresidual = true\n"
            "dropout = 0.5\nattn_dropout = 0.5\n",
     "layers = 2\nhidden = 3\nheads = 2\noutput_heads = 2\nresidual = true\n"
     "dropout = 0\nattn_dropout = 0\n",
     gat_meta, gat_batch},
    {"lstm", "hidden_size = 5\nnum_layers = 2\ndropout = 0.3\ninput_dropout = 0.2\n",
     "hidden_size = 5\nnum_layers = 2\ndropout = 0\ninput_dropout = 0\n", lstm_meta, lstm_batch},
    {"ilora", "dim = 8\nlayers = 1\nheads = 2\nffn_dim = 16\nmax_len = 6\ndropout = 0.3\n"
              "adapters = lora\nlora_rank = 2\nlora_dropout = 0.2\nfreeze_base = false\n"
              "exclude_history = false\n",
     "dim = 8\nlayers = 1\nheads = 2\nffn_dim = 16\nmax_len = 6\ndropout = 0\n"
     "adapters = lora\nlora_rank = 2\nlora_dropout = 0\nfreeze_base = false\n"
     "exclude_history = false\n",
     ilora_meta, ilora_batch},
    {"stock_gat", "hidden = 4\nencoder_layers = 2\nheads = 2\ngat_hidden = 3\nhead_hidden = 3\n"
                  "revin = true\nrank_loss_weight = 0.5\ndropout = 0.3\nattn_dropout = 0.2\n",
     "hidden = 4\nencoder_layers = 2\nheads = 2\ngat_hidden = 3\nhead_hidden = 3\n"
     "revin = true\nrank_loss_weight = 0.5\ndropout = 0\nattn_dropout = 0\n",
     stock_gat_meta, stock_gat_batch},
};
#define N_CASES ((int)(sizeof cases / sizeof *cases))

/* A model harness with the case's meta; the instance in *self. */
static pl_harness *open_model(const model_case *c, const char *ini, void **self) {
    pl_harness *h = pl_harness_new("model", c->plugin, ini);
    ck_assert_msg(h != NULL, "%s: %s", c->plugin, pl_error_message());
    pl_harness_ctx(h)->seed = 17;
    c->meta(pl_harness_ctx(h)->meta);
    PL_CK_OK(pl_harness_create(h, self));
    return h;
}

/* ---- the contract ------------------------------------------------------- */

START_TEST(synthetic_batch_satisfies_batch_needs) {
    const model_case *c = &cases[_i];
    void *m;
    pl_harness *h = open_model(c, c->ini, &m);
    synth s = {0};
    c->batch(&s);
    pl_status st = pl_harness_check_batch(h, &s.b, PL_SPLIT_TRAIN);
    ck_assert_msg(st == PL_OK, "%s: %s", c->plugin, pl_error_message());
    /* and the check has teeth: without its first field the batch is refused */
    pl_batch less = s.b;
    less.n = 0;
    for (int i = 1; i < s.b.n; i++) PL_CK_OK(pl_harness_batch_add(&less, s.b.names[i], s.b.fields[i]));
    ck_assert_int_eq(pl_harness_check_batch(h, &less, PL_SPLIT_TRAIN), PL_ERR_INVALID);
    ck_assert_msg(strstr(pl_error_message(), s.b.names[0]) != NULL, "%s", pl_error_message());
    synth_free(&s);
    pl_harness_destroy(h, m);
    pl_harness_free(h);
}
END_TEST

START_TEST(dropout_is_keyed_on_the_micro_step) {
    const model_case *c = &cases[_i];
    void *m;
    pl_harness *h = open_model(c, c->ini, &m);
    synth s = {0};
    c->batch(&s);
    double v[3];
    const int64_t steps[3] = {5, 5, 6};
    for (int i = 0; i < 3; i++) {
        pl_harness_ctx(h)->micro_step = steps[i];
        PL_CK_OK(pl_harness_forward(h, m, &s.b, PL_SPLIT_TRAIN, true, &v[i], NULL));
    }
    ck_assert_msg(isfinite(v[0]), "%s: loss %g", c->plugin, v[0]);
    ck_assert_msg(v[0] == v[1], "%s: same micro step, losses %.9g and %.9g", c->plugin, v[0], v[1]);
    ck_assert_msg(v[0] != v[2], "%s: dropout did not change with the micro step (%.9g)", c->plugin,
                  v[0]);
    synth_free(&s);
    pl_harness_destroy(h, m);
    pl_harness_free(h);
}
END_TEST

START_TEST(evaluation_records_no_tape) {
    const model_case *c = &cases[_i];
    void *m;
    pl_harness *h = open_model(c, c->ini, &m);
    synth s = {0};
    c->batch(&s);
    pl_metrics mt;
    pl_metrics_reset(&mt);
    /* a training forward records (so the eval check below is not vacuous) */
    pl_frame_begin();
    pl_tensor *loss = NULL;
    PL_CK_OK(((const pl_model_vtable *)pl_harness_vtable(h))
                 ->forward(m, &s.b, PL_SPLIT_TRAIN, true, &loss, NULL));
    ck_assert_msg(pl_tape_size() > 0, "%s: a training forward recorded nothing", c->plugin);
    pl_tape_clear();
    pl_frame_end();
    /* the trainer's evaluation: training false under no_grad */
    pl_no_grad_begin();
    pl_frame_begin();
    loss = NULL;
    PL_CK_OK(((const pl_model_vtable *)pl_harness_vtable(h))
                 ->forward(m, &s.b, PL_SPLIT_TRAIN, false, &loss, &mt));
    int64_t nodes = pl_tape_size();
    pl_frame_end();
    pl_no_grad_end();
    ck_assert_msg(nodes == 0, "%s: evaluation recorded %lld tape nodes", c->plugin, (long long)nodes);
    ck_assert_msg(mt.n > 0, "%s: evaluation reported no metric", c->plugin);
    synth_free(&s);
    pl_harness_destroy(h, m);
    pl_harness_free(h);
}
END_TEST

/* model + adamw over its parameters, sharing one run context */
typedef struct trained {
    pl_harness *mh, *oh;
    void *model, *opt;
} trained;

static void trained_open(trained *t, const model_case *c) {
    t->mh = open_model(c, c->ini, &t->model);
    t->oh = pl_harness_new_shared(t->mh, "optimizer", "adamw", "lr = 0.01\nweight_decay = 0.01\n");
    ck_assert_msg(t->oh != NULL, "%s", pl_error_message());
    PL_CK_OK(pl_harness_create(t->oh, &t->opt));
}

static void trained_steps(trained *t, const model_case *c, const synth *s, int n) {
    for (int i = 0; i < n; i++) {
        double loss;
        pl_status st = pl_harness_train_step(t->mh, t->model, t->oh, t->opt, &s->b, &loss);
        ck_assert_msg(st == PL_OK && isfinite(loss), "%s step: %s (loss %g)", c->plugin,
                      pl_error_message(), loss);
    }
}

static void trained_close(trained *t) {
    pl_harness_destroy(t->oh, t->opt);
    pl_harness_free(t->oh);
    pl_harness_destroy(t->mh, t->model);
    pl_harness_free(t->mh);
}

START_TEST(resume_is_bit_identical) {
    const model_case *c = &cases[_i];
    synth s = {0};
    c->batch(&s);
    trained a;
    trained_open(&a, c);
    trained_steps(&a, c, &s, 3);
    pl_snapshot *params = PL_CK_NOTNULL(pl_snapshot_new());
    PL_CK_OK(pl_snapshot_save_params(params, pl_harness_ctx(a.mh)->params));
    pl_snapshot *opt = PL_CK_NOTNULL(pl_harness_state_save(a.oh, a.opt));
    ck_assert_int_gt(pl_snapshot_count(opt), 0);
    pl_run_context saved = *pl_harness_ctx(a.mh);
    trained_steps(&a, c, &s, 3);
    pl_snapshot *uninterrupted = PL_CK_NOTNULL(pl_harness_state_save(a.mh, a.model));

    /* a fresh process: new instances, state loaded, counters restored */
    trained b;
    trained_open(&b, c);
    PL_CK_OK(pl_snapshot_load_params(params, pl_harness_ctx(b.mh)->params));
    const pl_model_vtable *vt = pl_harness_vtable(b.mh);
    if (vt->on_load) PL_CK_OK(vt->on_load(b.model));
    PL_CK_OK(pl_harness_state_load(b.oh, b.opt, opt));
    pl_harness_ctx(b.mh)->micro_step = saved.micro_step;
    pl_harness_ctx(b.mh)->global_step = saved.global_step;
    trained_steps(&b, c, &s, 3);
    pl_snapshot *resumed = PL_CK_NOTNULL(pl_harness_state_save(b.mh, b.model));

    char msg[512];
    ck_assert_msg(pl_snapshot_equal(uninterrupted, resumed, msg, sizeof msg), "%s: %s", c->plugin,
                  msg);
    /* and training moved the parameters at all */
    ck_assert(!pl_snapshot_equal(params, resumed, NULL, 0));
    pl_snapshot_free(params);
    pl_snapshot_free(opt);
    pl_snapshot_free(uninterrupted);
    pl_snapshot_free(resumed);
    trained_close(&a);
    trained_close(&b);
    synth_free(&s);
}
END_TEST

START_TEST(training_loss_passes_the_gradient_check) {
    const model_case *c = &cases[_i];
    void *m;
    pl_harness *h = open_model(c, c->ini_nodrop, &m);
    synth s = {0};
    c->batch(&s);
    pl_harness_ctx(h)->micro_step = 3;
    pl_status st = pl_harness_gradcheck(h, m, &s.b, 1e-3, 2e-3, 2e-2, 12);
    ck_assert_msg(st == PL_OK, "%s", pl_error_message());
    synth_free(&s);
    pl_harness_destroy(h, m);
    pl_harness_free(h);
}
END_TEST

int main(void) {
    Suite *s = suite_create("model_conformance");
    TCase *tc = tcase_create("every model plugin");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, synthetic_batch_satisfies_batch_needs, 0, N_CASES);
    tcase_add_loop_test(tc, dropout_is_keyed_on_the_micro_step, 0, N_CASES);
    tcase_add_loop_test(tc, evaluation_records_no_tape, 0, N_CASES);
    tcase_add_loop_test(tc, resume_is_bit_identical, 0, N_CASES);
    tcase_add_loop_test(tc, training_loss_passes_the_gradient_check, 0, N_CASES);
    suite_add_tcase(s, tc);
    return pl_test_run(s);
}
