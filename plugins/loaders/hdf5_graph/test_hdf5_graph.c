/* test_hdf5_graph.c - the whole-graph loader on the real Planetoid Cora file
 * (../shared/data/planetoid/cora.h5: 2708 nodes, 10556 edges, 140/500/1000)
 * and on small synthetic graphs written here (hand-computed expectations). */
#include <hdf5.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loader_test_util.h"
#include "pl_test.h"

static char g_dir[256];
static const char *tmp_path(const char *name, char *buf, size_t n) {
    if (!g_dir[0]) {
        snprintf(g_dir, sizeof g_dir, "/tmp/pl_test_hdf5_graph_XXXXXX");
        ck_assert_ptr_nonnull(mkdtemp(g_dir));
    }
    snprintf(buf, n, "%s/%s", g_dir, name);
    return buf;
}

/* 4 nodes, 2 features; edges 0->1, 1->0, 2->2 (a self loop), 3->edge_to */
static const char *make_graph(const char *name, long long edge_to, char *buf, size_t n) {
    const char *p = tmp_path(name, buf, n);
    float x[8] = {1, 3, 0, 0, 2, 2, 4, 0};
    long long ei[8] = {0, 1, 2, 3, 1, 0, 2, edge_to}, y[4] = {0, 1, 2, 1};
    unsigned char tr[4] = {1, 1, 0, 0}, va[4] = {0, 0, 1, 0}, te[4] = {0, 0, 0, 1};
    ck_assert_int_eq(lt_write(p, "features", H5T_NATIVE_FLOAT, 2, (long long[]){4, 2}, x), 0);
    ck_assert_int_eq(lt_write(p, "edge_index", H5T_NATIVE_LLONG, 2, (long long[]){2, 4}, ei), 0);
    ck_assert_int_eq(lt_write(p, "labels", H5T_NATIVE_LLONG, 1, (long long[]){4}, y), 0);
    ck_assert_int_eq(lt_write(p, "train_mask", H5T_NATIVE_UCHAR, 1, (long long[]){4}, tr), 0);
    ck_assert_int_eq(lt_write(p, "val_mask", H5T_NATIVE_UCHAR, 1, (long long[]){4}, va), 0);
    ck_assert_int_eq(lt_write(p, "test_mask", H5T_NATIVE_UCHAR, 1, (long long[]){4}, te), 0);
    return p;
}

START_TEST(test_small_graph) {
    char p[512], body[1024];
    snprintf(body, sizeof body, "path = %s\nadd_self_loops = true\nrow_normalize = true\n",
             make_graph("g.h5", 1, p, sizeof p));
    lt_loader L;
    PL_CK_OK(lt_open(&L, "hdf5_graph", body, NULL));
    int64_t v;
    PL_CK_OK(pl_meta_get_int(L.ctx.meta, "num_classes", &v));
    ck_assert_int_eq(v, 3); /* no attribute: max label + 1 */
    PL_CK_OK(pl_meta_get_int(L.ctx.meta, "num_edges", &v));
    ck_assert_int_eq(v, 3 + 4); /* 2->2 removed, one loop per node added */
    PL_CK_OK(L.vt->epoch_begin(L.self, PL_SPLIT_VAL, 0));
    pl_batch b;
    ck_assert_int_eq(L.vt->next(L.self, &b), 1);
    const int64_t want_src[7] = {0, 1, 3, 0, 1, 2, 3}, want_dst[7] = {1, 0, 1, 0, 1, 2, 3};
    for (int i = 0; i < 7; i++) {
        ck_assert_int_eq(pl_tensor_i64(pl_batch_get(&b, "edge_src"))[i], want_src[i]);
        ck_assert_int_eq(pl_tensor_i64(pl_batch_get(&b, "edge_dst"))[i], want_dst[i]);
    }
    /* rows / clamp(sum, 1): [1,3]/4, [0,0]/1, [2,2]/4, [4,0]/4 */
    const float want_x[8] = {0.25f, 0.75f, 0, 0, 0.5f, 0.5f, 1, 0};
    for (int i = 0; i < 8; i++) ck_assert_float_eq_tol(pl_tensor_f32(pl_batch_get(&b, "x"))[i], want_x[i], 1e-7);
    const uint8_t want_m[4] = {0, 0, 1, 0};
    for (int i = 0; i < 4; i++) ck_assert_int_eq(pl_tensor_u8(pl_batch_get(&b, "mask"))[i], want_m[i]);
    ck_assert_int_eq(L.vt->next(L.self, &b), 0);
    lt_close(&L);
}
END_TEST

START_TEST(test_errors) {
    char p[512], body[1024];
    lt_loader L;
    snprintf(body, sizeof body, "path = %s\n", make_graph("bad.h5", 9, p, sizeof p));
    ck_assert_int_ne(lt_open(&L, "hdf5_graph", body, NULL), PL_OK);
    ck_assert_msg(strstr(pl_error_message(), "edge_index[1][3] = 9 is outside 0..3") &&
                      strstr(pl_error_message(), p),
                  "%s", pl_error_message());
    snprintf(body, sizeof body, "path = %s\nlabels = nope\n", make_graph("ok.h5", 0, p, sizeof p));
    ck_assert_int_ne(lt_open(&L, "hdf5_graph", body, NULL), PL_OK);
    ck_assert_msg(strstr(pl_error_message(), "dataset 'nope' not found"), "%s", pl_error_message());
    ck_assert_int_ne(lt_open(&L, "hdf5_graph", "path = /no/such.h5\n", NULL), PL_OK);
    ck_assert_msg(strstr(pl_error_message(), "/no/such.h5"), "%s", pl_error_message());
}
END_TEST

START_TEST(test_cora) {
    char p[512], body[1024];
    if (!pl_test_shared("planetoid/cora.h5", p, sizeof p)) {
        printf("test_cora: ../shared/data absent, skipped\n");
        return;
    }
    snprintf(body, sizeof body, "path = %s\nrow_normalize = true\n", p);
    lt_loader L;
    PL_CK_OK(lt_open(&L, "hdf5_graph", body, NULL));
    int64_t v;
    PL_CK_OK(pl_meta_get_int(L.ctx.meta, "num_nodes", &v));
    ck_assert_int_eq(v, 2708);
    PL_CK_OK(pl_meta_get_int(L.ctx.meta, "num_features", &v));
    ck_assert_int_eq(v, 1433);
    PL_CK_OK(pl_meta_get_int(L.ctx.meta, "num_classes", &v));
    ck_assert_int_eq(v, 7);
    PL_CK_OK(pl_meta_get_int(L.ctx.meta, "num_edges", &v));
    ck_assert_int_eq(v, 10556);
    const int64_t want[3] = {140, 500, 1000};
    pl_tensor *x0 = NULL;
    for (int e = 0; e < 2; e++)
        for (int s = 0; s < 3; s++) {
            ck_assert_int_eq(L.vt->num_batches(L.self, (pl_data_split)s), 1);
            PL_CK_OK(L.vt->epoch_begin(L.self, (pl_data_split)s, e));
            pl_batch b;
            ck_assert_int_eq(L.vt->next(L.self, &b), 1);
            pl_tensor *m = pl_batch_get(&b, "mask");
            int64_t c = 0;
            for (int64_t i = 0; i < 2708; i++) c += pl_tensor_u8(m)[i];
            ck_assert_int_eq(c, want[s]);
            /* built once: every split and epoch gets the same cached tensor */
            if (!x0) x0 = pl_batch_get(&b, "x");
            ck_assert_ptr_eq(pl_batch_get(&b, "x"), x0);
            ck_assert_int_eq(L.vt->next(L.self, &b), 0);
        }
    /* row-normalized: every row of Cora has words, so rows sum to 1 */
    const float *x = pl_tensor_f32(x0);
    for (int64_t i = 0; i < 2708; i++) {
        double s = 0;
        for (int64_t j = 0; j < 1433; j++) s += x[i * 1433 + j];
        ck_assert_double_eq_tol(s, 1.0, 1e-4);
    }
    lt_close(&L);
}
END_TEST

int main(void) {
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    Suite *s = suite_create("hdf5_graph");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_small_graph);
    tcase_add_test(tc, test_errors);
    tcase_add_test(tc, test_cora);
    suite_add_tcase(s, tc);
    return pl_test_run(s);
}
