/* test_ilora_kd.c - the ilora model's knowledge distillation (the student):
 * the KD term's value and gradient against tools/gen_kd_reference.py
 * (torch.nn.functional.kl_div over the teacher's top-K items plus the rest
 * bucket), the term read from batch fields through the model's forward, the
 * temperature check, and the export's log-normalizer against logsumexp of
 * the model's full logits recomputed here.
 */
#include <hdf5.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "distill.h"
#include "ilora.h"
#include "pipeline/testing.h"
#include "pl_test.h"
#include "teacher_export.h"
#include "test_env.h"

static const char *ref_path(void) {
    static char p[1024];
    snprintf(p, sizeof p, "%s/tests/data/ilora/kd_reference.safetensors", PL_TEST_SOURCE_DIR);
    return p;
}

START_TEST(kd_loss_and_gradient_match_pytorch_kl_div) {
    pl_st_file *f = NULL;
    PL_CK_OK(pl_st_open(ref_path(), &f));
    pl_frame_begin();
    pl_tensor *z = PL_CK_NOTNULL(pl_st_load(f, "student_logits"));
    pl_tensor *ids = PL_CK_NOTNULL(pl_st_load(f, "teacher_ids"));
    pl_tensor *tl = PL_CK_NOTNULL(pl_st_load(f, "teacher_topk_logits"));
    pl_tensor *ln = PL_CK_NOTNULL(pl_st_load(f, "teacher_lognorm"));
    pl_tensor *want = PL_CK_NOTNULL(pl_st_load(f, "loss"));
    pl_tensor *wgrad = PL_CK_NOTNULL(pl_st_load(f, "grad_student_logits"));
    int64_t np = z->shape[0], K = ids->shape[1];
    pl_tensor_set_requires_grad(z, true);
    pl_tensor *loss = PL_CK_NOTNULL(ilora_kd_loss(z, pl_tensor_data(ids), pl_tensor_f32(tl),
                                                  pl_tensor_f32(ln), np, K, 2.0, 0.7));
    ck_assert_double_eq_tol(pl_tensor_item(loss), pl_tensor_item(want), 1e-5);
    PL_CK_OK(pl_backward(loss, 1.0));
    ck_assert_ptr_nonnull(z->grad);
    double d = pl_test_max_abs_diff(z->grad, wgrad);
    ck_assert_msg(d < 1e-6, "gradient differs from PyTorch's by %g", d);
    pl_frame_end();
    pl_tensor *owned[] = {z, ids, tl, ln, want, wgrad}; /* pl_st_load: the caller's */
    for (int i = 0; i < 6; i++)
        pl_tensor_release(owned[i]);
    pl_st_close(f);
}
END_TEST

/* q = p (the student is the teacher): KL 0 and no gradient, whatever K. */
START_TEST(kd_loss_is_zero_when_the_student_is_the_teacher) {
    pl_frame_begin();
    const int64_t V = 7, K = 2;
    float z[7] = {0.0f, 1.0f, -0.5f, 2.0f, 0.25f, -1.0f, 0.75f};
    double lse = 0;
    for (int i = 1; i < V; i++)
        lse += exp(z[i] / 1.5);
    lse = log(lse);
    int32_t ids[2] = {3, 1};
    float tl[2] = {z[3] / 1.5f, z[1] / 1.5f}, ln[1] = {(float)lse};
    pl_tensor *lg = pl_tensor_from_data(PL_F32, 2, (int64_t[]){1, V}, z, PL_CPU);
    pl_tensor_set_requires_grad(lg, true);
    pl_tensor *loss = PL_CK_NOTNULL(ilora_kd_loss(lg, ids, tl, ln, 1, K, 1.5, 1.0));
    ck_assert_double_eq_tol(pl_tensor_item(loss), 0.0, 1e-6);
    PL_CK_OK(pl_backward(loss, 1.0));
    const float *g = pl_tensor_f32(lg->grad);
    for (int i = 0; i < V; i++)
        ck_assert_double_eq_tol(g[i], 0.0, 1e-6);
    /* an item id outside 1..V-1 is refused, naming it */
    ids[1] = 0;
    ck_assert_ptr_null(ilora_kd_loss(lg, ids, tl, ln, 1, K, 1.5, 1.0));
    ck_assert_ptr_nonnull(strstr(pl_error_message(), "teacher item 0"));
    pl_error_clear();
    pl_frame_end();
}
END_TEST

static ilora_opts student_opts(void) {
    ilora_opts o;
    ck_assert_int_eq(ilora_opts_read(NULL, &o), PL_OK);
    o.num_items = 12;
    o.dim = 8;
    o.layers = 1;
    o.heads = 2;
    o.ffn_dim = 16;
    o.max_len = 6;
    o.dropout = 0;
    return o;
}

/* The forward adds kd_weight * KD of the labelled positions' fields to the
 * cross-entropy: equal to CE (kd_weight 0) + the term computed directly. */
START_TEST(forward_adds_the_kd_term_of_the_labelled_positions) {
    env e;
    env_init(&e, 3, 0);
    ilora_opts o = student_opts();
    o.kd_weight = 0.5;
    o.kd_temperature = 2.0;
    ilora_model *m = NULL;
    PL_CK_OK(ilora_model_create(&o, &e.ctx, &m));
    PL_CK_OK(ilora_kd_temperature(m)); /* no loader meta: the option stands */
    const int32_t idv[12] = {0, 0, 4, 9, 2, 11, 3, 3, 8, 1, 12, 5};
    const int32_t lab[12] = {0, 0, 9, 2, 11, 7, 3, 8, 1, 12, 5, 6};
    enum { B = 2, L = 6, K = 3 };
    int32_t kid[B * L * K];
    float klg[B * L * K], kln[B * L];
    for (int p = 0; p < B * L; p++) {
        for (int k = 0; k < K; k++) {
            kid[p * K + k] = lab[p] ? 1 + (lab[p] + 3 * k) % 12 : 0;
            klg[p * K + k] = lab[p] ? 1.5f - 0.5f * (float)k : 0.0f;
        }
        kln[p] = lab[p] ? 3.0f : 0.0f;
    }
    pl_frame_begin();
    pl_tensor *ids = pl_tensor_from_data(PL_I32, 2, (int64_t[]){B, L}, idv, PL_CPU);
    pl_tensor *lb = pl_tensor_from_data(PL_I32, 2, (int64_t[]){B, L}, lab, PL_CPU);
    pl_tensor *ti = pl_tensor_from_data(PL_I32, 3, (int64_t[]){B, L, K}, kid, PL_CPU);
    pl_tensor *tl = pl_tensor_from_data(PL_F32, 3, (int64_t[]){B, L, K}, klg, PL_CPU);
    pl_tensor *tn = pl_tensor_from_data(PL_F32, 2, (int64_t[]){B, L}, kln, PL_CPU);
    pl_batch bt = {.n = 5,
                   .names = {"input_ids", "labels", "kd_ids", "kd_logits", "kd_lognorm"},
                   .fields = {ids, lb, ti, tl, tn},
                   .size = B};
    pl_metrics mt;
    pl_metrics_reset(&mt);
    pl_tensor *loss = NULL;
    PL_CK_OK(ilora_forward(m, &bt, PL_SPLIT_TRAIN, false, &loss, &mt));
    double with_kd = pl_tensor_item(loss);
    m->o.kd_weight = 0;
    PL_CK_OK(ilora_forward(m, &bt, PL_SPLIT_TRAIN, false, &loss, &mt));
    double ce = pl_tensor_item(loss);
    /* the term by hand: the labelled positions' logits and fields */
    int64_t pos[12], np = 0;
    int32_t sid[12 * K];
    float slg[12 * K], sln[12];
    for (int p = 0; p < B * L; p++) {
        if (!lab[p]) continue;
        memcpy(sid + np * K, kid + p * K, sizeof(int32_t) * K);
        memcpy(slg + np * K, klg + p * K, sizeof(float) * K);
        sln[np] = kln[p];
        pos[np++] = p;
    }
    pl_tensor *h = pl_reshape(ilora_hidden(m, ids, false), 2, (int64_t[]){-1, o.dim});
    pl_tensor *pi = pl_tensor_from_data(PL_I64, 1, (int64_t[]){np}, pos, PL_CPU);
    pl_tensor *lg = ilora_logits(m, pl_index_select(h, 0, pi));
    pl_tensor *kd = PL_CK_NOTNULL(ilora_kd_loss(lg, sid, slg, sln, np, K, 2.0, 0.5));
    ck_assert_double_eq_tol(with_kd, ce + pl_tensor_item(kd), 1e-5);
    ck_assert(pl_tensor_item(kd) > 0);
    /* the device path (no host read: every position, masked) gives the same */
    m->device_loss = true;
    m->o.kd_weight = 0.5;
    PL_CK_OK(ilora_forward(m, &bt, PL_SPLIT_TRAIN, false, &loss, &mt));
    ck_assert_double_eq_tol(pl_tensor_item(loss), ce + pl_tensor_item(kd), 1e-5);
    m->device_loss = false;
    /* without the fields the forward names what is missing */
    m->o.kd_weight = 0.5;
    bt.n = 2;
    ck_assert_int_ne(ilora_forward(m, &bt, PL_SPLIT_TRAIN, false, &loss, &mt), PL_OK);
    ck_assert_ptr_nonnull(strstr(pl_error_message(), "kd_ids"));
    pl_error_clear();
    pl_frame_end();
    ilora_model_destroy(m);
    env_free(&e);
}
END_TEST

START_TEST(kd_temperature_must_be_the_exported_one) {
    env e;
    env_init(&e, 3, 0);
    ilora_opts o = student_opts();
    o.kd_weight = 1.0;
    ilora_model *m = NULL;
    PL_CK_OK(ilora_model_create(&o, &e.ctx, &m));
    /* kd_temperature 0 and no teacher meta: refused */
    ck_assert_int_eq(ilora_kd_temperature(m), PL_ERR_CONFIG);
    ck_assert_ptr_nonnull(strstr(pl_error_message(), "teacher_outputs"));
    pl_meta_set_float(e.ctx.meta, "teacher_temperature", 2.0);
    PL_CK_OK(ilora_kd_temperature(m));
    ck_assert_double_eq(m->o.kd_temperature, 2.0);
    m->o.kd_temperature = 1.0;
    ck_assert_int_eq(ilora_kd_temperature(m), PL_ERR_CONFIG);
    ck_assert_ptr_nonnull(strstr(pl_error_message(), "exported at temperature 2"));
    pl_error_clear();
    ilora_model_destroy(m);
    env_free(&e);
}
END_TEST

static void read_f32(hid_t f, const char *name, float *dst, int64_t n) {
    hid_t d = H5Dopen2(f, name, H5P_DEFAULT);
    ck_assert_int_ge(d, 0);
    hid_t sp = H5Dget_space(d);
    ck_assert_int_eq((int)H5Sget_simple_extent_npoints(sp), (int)n);
    H5Sclose(sp);
    ck_assert_int_ge(H5Dread(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, dst), 0);
    H5Dclose(d);
}

/* /train/lognorm and /test/lognorm = logsumexp over items 1..N of logits / T,
 * recomputed from the model's full logits; exp(topk - lognorm) are then the
 * teacher's probabilities (they sum to at most 1). */
START_TEST(export_lognorm_is_logsumexp_of_all_item_logits) {
    env e;
    env_init(&e, 5, 0);
    ilora_opts o = student_opts();
    o.init_std = 0.7;
    o.export_top_k = 4;
    o.export_temperature = 2.0;
    ilora_model *m = NULL;
    PL_CK_OK(ilora_model_create(&o, &e.ctx, &m));
    char dir[256];
    snprintf(dir, sizeof dir, "/tmp/test_ilora_kd_export_%d", (int)getpid());
    ck_assert_int_eq(mkdir(dir, 0700), 0);
    PL_CK_OK(ilora_export_begin(m, dir));
    const int32_t idv[12] = {0, 0, 4, 9, 2, 11, 3, 3, 8, 1, 12, 5};
    const int32_t lab[12] = {0, 0, 9, 2, 11, 7, 3, 8, 1, 12, 5, 6};
    pl_frame_begin();
    pl_no_grad_begin();
    pl_tensor *ids = pl_tensor_from_data(PL_I32, 2, (int64_t[]){2, 6}, idv, PL_CPU);
    pl_tensor *lb = pl_tensor_from_data(PL_I32, 2, (int64_t[]){2, 6}, lab, PL_CPU);
    pl_batch bt = {.n = 2, .names = {"input_ids", "labels"}, .fields = {ids, lb}, .size = 2};
    PL_CK_OK(ilora_export_batch(m, &bt, PL_SPLIT_TRAIN));
    pl_tensor *tg = pl_tensor_from_data(PL_I32, 1, (int64_t[]){2}, (int32_t[]){6, 2}, PL_CPU);
    pl_batch bv = {.n = 2, .names = {"input_ids", "target"}, .fields = {ids, tg}, .size = 2};
    PL_CK_OK(ilora_export_batch(m, &bv, PL_SPLIT_TEST));
    pl_tensor *lg = pl_tensor_to(ilora_logits(m, ilora_hidden(m, ids, false)), PL_F32, PL_CPU);
    pl_no_grad_end();
    PL_CK_OK(ilora_export_end(m));
    const float *z = pl_tensor_f32(lg); /* [2, 6, 13] */
    char path[300];
    snprintf(path, sizeof path, "%s/teacher_outputs.h5", dir);
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    ck_assert_int_ge(f, 0);
    float ln[10], tv[10][4], lt[2], tvt[2][4];
    read_f32(f, "/train/lognorm", ln, 10);
    read_f32(f, "/train/topk_logits", &tv[0][0], 40);
    read_f32(f, "/test/lognorm", lt, 2);
    read_f32(f, "/test/topk_logits", &tvt[0][0], 8);
    H5Fclose(f);
    int n = 0;
    for (int p = 0; p < 12; p++) {
        bool last = p % 6 == 5;
        if (!lab[p] && !last) continue;
        double mx = -INFINITY, s = 0;
        for (int v = 1; v < 13; v++)
            mx = fmax(mx, z[p * 13 + v] / 2.0);
        for (int v = 1; v < 13; v++)
            s += exp(z[p * 13 + v] / 2.0 - mx);
        double want = mx + log(s);
        if (lab[p]) {
            ck_assert_double_eq_tol(ln[n], want, 1e-5);
            double mass = 0;
            for (int k = 0; k < 4; k++)
                mass += exp(tv[n][k] - ln[n]);
            ck_assert(mass > 0 && mass <= 1 + 1e-6);
            n++;
        }
        if (last) ck_assert_double_eq_tol(lt[p / 6], want, 1e-5);
    }
    ck_assert_int_eq(n, 10);
    (void)tvt;
    unlink(path);
    rmdir(dir);
    pl_frame_end();
    ilora_model_destroy(m);
    env_free(&e);
}
END_TEST

int main(void) {
    Suite *s = suite_create("ilora_kd");
    TCase *t = tcase_create("ilora_kd");
    tcase_set_timeout(t, 60);
    tcase_add_test(t, kd_loss_and_gradient_match_pytorch_kl_div);
    tcase_add_test(t, kd_loss_is_zero_when_the_student_is_the_teacher);
    tcase_add_test(t, forward_adds_the_kd_term_of_the_labelled_positions);
    tcase_add_test(t, kd_temperature_must_be_the_exported_one);
    tcase_add_test(t, export_lognorm_is_logsumexp_of_all_item_logits);
    suite_add_tcase(s, t);
    return pl_test_run(s);
}
