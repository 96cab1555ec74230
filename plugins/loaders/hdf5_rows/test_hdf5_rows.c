/* test_hdf5_rows.c - the hdf5_rows loader on synthetic files written here
 * with the HDF5 C API (values are functions of the row index, so every batch
 * is checked against hand-computed numbers): views, shuffle, chunks and
 * prefetch, start_batch, batch_fields, the teacher join, a device's batches
 * equal to the CPU's, bad inputs, and MovieLens converted by tools/ when
 * ../shared/data and python3 + h5py are present. */
#include <hdf5.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "chunk_test_files.h"

#define PLUGIN "hdf5_rows"
const char *const lf_suite = "hdf5_rows";

static pl_status open_rows(lt_loader *L, const char *extra) {
    char p[512], body[2048];
    snprintf(body, sizeof body, "path = %s\ndatasets = x,label=y\nhistory = hist\n%s", lf_make_rows_file(p, sizeof p),
             extra);
    return lt_open(L, PLUGIN, body, NULL);
}

/* Batches are views of the chunk buffer; a whole epoch allocates nothing. */
START_TEST(test_views_and_no_alloc) {
    lt_loader L;
    PL_CK_OK(open_rows(&L, "batch_size = 10\nchunk_samples = 20\nshuffle = false\nprefetch = true\n"));
    ck_assert_int_eq(L.vt->num_batches(L.self, PL_SPLIT_TRAIN), 10);
    PL_CK_OK(L.vt->epoch_begin(L.self, PL_SPLIT_TRAIN, 0, 0));
    pl_batch b;
    ck_assert_int_eq(L.vt->next(L.self, &b), 1);
    pl_alloc_stats s0 = pl_alloc_get_stats(PL_CPU);
    pl_tensor *x = pl_batch_get(&b, "x");
    ck_assert_ptr_nonnull(x);
    ck_assert_ptr_nonnull(pl_batch_get(&b, "label"));
    pl_storage *chunk0 = x->storage;
    const char *d0 = pl_tensor_data(x);
    ck_assert_int_eq(x->shape[0], 10);
    ck_assert_int_eq(x->shape[1], 3);
    ck_assert(pl_tensor_is_contiguous(x));
    int64_t rows = 10, nb = 1;
    int r;
    while ((r = L.vt->next(L.self, &b)) == 1) {
        x = pl_batch_get(&b, "x");
        pl_tensor *y = pl_batch_get(&b, "label");
        ck_assert_int_eq(y->dtype, PL_I64);
        ck_assert_int_eq(b.index, nb);
        if (nb == 1) {
            /* second batch of the same chunk: same storage, 10 rows further */
            ck_assert_ptr_eq(x->storage, chunk0);
            ck_assert_ptr_eq((const char *)pl_tensor_data(x), d0 + 10 * 3 * sizeof(float));
        }
        for (int64_t i = 0; i < b.size; i++) {
            ck_assert_int_eq(pl_tensor_i64(y)[i], rows + i);
            ck_assert_float_eq(pl_tensor_f32(x)[i * 3 + 2], (float)((rows + i) * 10 + 2));
        }
        rows += b.size;
        nb++;
    }
    ck_assert_int_eq(r, 0);
    ck_assert_int_eq(rows, NTR);
    pl_alloc_stats s1 = pl_alloc_get_stats(PL_CPU);
    ck_assert_uint_eq(s1.system_allocs, s0.system_allocs);
    ck_assert_uint_eq(s1.allocations, s0.allocations);
    pl_loader_stats ls = L.vt->stats(L.self);
    ck_assert_uint_eq(ls.chunks_loaded, 5);
    ck_assert_uint_eq(ls.bytes_read, NTR * (3 * 4 + 8));
    lt_close(&L);
}
END_TEST

/* Shuffle: every row once per epoch, different order per epoch, same order for the same seed. */
START_TEST(test_shuffle) {
    lt_loader L, L2;
    PL_CK_OK(open_rows(&L, "batch_size = 8\nchunk_samples = 32\nshuffle = true\n"));
    PL_CK_OK(open_rows(&L2, "batch_size = 8\nchunk_samples = 32\nshuffle = true\nprefetch = false\n"));
    int64_t order[2][NTR];
    for (int e = 0; e < 2; e++) {
        int seen[NTR] = {0};
        PL_CK_OK(L.vt->epoch_begin(L.self, PL_SPLIT_TRAIN, e, 0));
        PL_CK_OK(L2.vt->epoch_begin(L2.self, PL_SPLIT_TRAIN, e, 0));
        pl_batch b, b2;
        int64_t k = 0;
        pl_alloc_stats s0 = pl_alloc_get_stats(PL_CPU);
        while (L.vt->next(L.self, &b) == 1) {
            ck_assert_int_eq(L2.vt->next(L2.self, &b2), 1);
            pl_tensor *y = pl_batch_get(&b, "label"), *x = pl_batch_get(&b, "x");
            for (int64_t i = 0; i < b.size; i++) {
                int64_t v = pl_tensor_i64(y)[i];
                ck_assert(v >= 0 && v < NTR);
                ck_assert_int_eq(pl_tensor_i64(pl_batch_get(&b2, "label"))[i], v);
                ck_assert_float_eq(pl_tensor_f32(x)[i * 3 + 1], (float)(v * 10 + 1));
                seen[v]++;
                order[e][k++] = v;
            }
        }
        pl_alloc_stats s1 = pl_alloc_get_stats(PL_CPU);
        ck_assert_uint_eq(s1.allocations, s0.allocations);
        ck_assert_int_eq(k, NTR);
        for (int i = 0; i < NTR; i++) ck_assert_int_eq(seen[i], 1);
    }
    int same = 0;
    for (int i = 0; i < NTR; i++) same += order[0][i] == order[1][i];
    ck_assert_int_lt(same, NTR / 2);
    int inorder = 0;
    for (int i = 0; i < NTR; i++) inorder += order[0][i] == i;
    ck_assert_int_lt(inorder, NTR / 2);
    lt_close(&L);
    lt_close(&L2);
}
END_TEST

START_TEST(test_drop_last_and_resident) {
    lt_loader L;
    PL_CK_OK(open_rows(&L, "batch_size = 30\ndrop_last = true\nshuffle = false\n"));
    ck_assert_int_eq(L.vt->num_batches(L.self, PL_SPLIT_TRAIN), 3);
    ck_assert_int_eq(L.vt->num_batches(L.self, PL_SPLIT_VAL), 1); /* eval: never dropped */
    for (int e = 0; e < 3; e++) {
        PL_CK_OK(L.vt->epoch_begin(L.self, PL_SPLIT_TRAIN, e, 0));
        pl_batch b;
        int n = 0;
        while (L.vt->next(L.self, &b) == 1) {
            ck_assert_int_eq(b.size, 30);
            n++;
        }
        ck_assert_int_eq(n, 3);
    }
    /* resident (everything fits): the train split was read once for 3 epochs */
    ck_assert_uint_eq(L.vt->stats(L.self).chunks_loaded, 1);
    int64_t v;
    PL_CK_OK(pl_meta_get_int(L.ctx->meta, "num_items", &v));
    ck_assert_int_eq(v, 42);
    PL_CK_OK(pl_meta_get_int(L.ctx->meta, "num_train", &v));
    ck_assert_int_eq(v, NTR);
    lt_close(&L);
    PL_CK_OK(open_rows(&L, "batch_size = 30\ndrop_last = false\nshuffle = false\n"));
    ck_assert_int_eq(L.vt->num_batches(L.self, PL_SPLIT_TRAIN), 4);
    lt_close(&L);
}
END_TEST

/* val split: the CSR history becomes a padded [B, Hmax] i32 field. */
START_TEST(test_history_field) {
    lt_loader L;
    PL_CK_OK(open_rows(&L, "batch_size = 4\neval_batch_size = 4\n"));
    PL_CK_OK(L.vt->epoch_begin(L.self, PL_SPLIT_VAL, 0, 0));
    pl_batch b;
    int64_t row = 0;
    while (L.vt->next(L.self, &b) == 1) {
        pl_tensor *h = pl_batch_get(&b, "hist"), *y = pl_batch_get(&b, "label");
        ck_assert_ptr_nonnull(h);
        ck_assert_int_eq(h->dtype, PL_I32);
        ck_assert_int_eq(h->shape[1], 3);
        for (int64_t i = 0; i < b.size; i++, row++) {
            ck_assert_int_eq(pl_tensor_i64(y)[i], 1000 + row);
            for (int k = 0; k < 3; k++)
                ck_assert_int_eq(pl_tensor_i32(h)[i * 3 + k], k < row % 4 ? 7 + k : 0);
        }
    }
    ck_assert_int_eq(row, NV);
    lt_close(&L);
}
END_TEST

START_TEST(test_fractions) {
    char p[512], body[1024];
    snprintf(body, sizeof body, "path = %s\ndatasets = x=/train/x,y=/train/y\nsplit_fractions = 0.8,0.1,0.1\n"
             "batch_size = 16\nshuffle = false\n", lf_make_rows_file(p, sizeof p));
    lt_loader L;
    PL_CK_OK(lt_open(&L, PLUGIN, body, NULL));
    int64_t first[3] = {0, 80, 90}, count[3] = {80, 10, 10};
    for (int s = 0; s < 3; s++) {
        PL_CK_OK(L.vt->epoch_begin(L.self, (pl_data_split)s, 0, 0));
        pl_batch b;
        int64_t n = 0;
        while (L.vt->next(L.self, &b) == 1) {
            for (int64_t i = 0; i < b.size; i++) ck_assert_int_eq(pl_tensor_i64(pl_batch_get(&b, "y"))[i], first[s] + n + i);
            n += b.size;
        }
        ck_assert_int_eq(n, count[s]);
    }
    lt_close(&L);
}
END_TEST


START_TEST(start_batch_streaming_shuffled_across_chunks) {
    /* 100 rows in chunks of 16 (2 batches each; the 4-row chunk 6 is one short batch
     * somewhere in the shuffled order), with and without the prefetch thread */
    lf_check_start(PLUGIN, "batch_size = 8\nchunk_samples = 16\nshuffle = true\nprefetch = true\n", false, 16);
    lf_check_start(PLUGIN, "batch_size = 8\nchunk_samples = 16\nshuffle = true\nprefetch = false\n", false, 16);
    /* in order, drop_last: 12 batches, chunk 6 (4 rows) serves none */
    lf_check_start(PLUGIN, "batch_size = 8\nchunk_samples = 24\nshuffle = false\ndrop_last = true\n", false, 24);
}
END_TEST

START_TEST(start_batch_resident) {
    lf_check_start(PLUGIN, "batch_size = 16\nshuffle = true\n", false, 0);
}
END_TEST


START_TEST(batch_fields_rows_mode) {
    lt_loader L;
    PL_CK_OK(open_rows(&L, "batch_size = 8\nchunk_samples = 16\nshuffle = true\n"));
    pl_field_list fl;
    PL_CK_OK(L.vt->batch_fields(L.sec, &fl));
    ck_assert_int_eq(fl.n, 3);
    const pl_field_spec *x = lf_find_field(&fl, "x"), *y = lf_find_field(&fl, "label"), *h = lf_find_field(&fl, "hist");
    ck_assert(x->dtype == PL_F32 && x->rank == 2 && !x->optional);
    ck_assert(y->dtype == PL_I64 && y->rank == 1 && !y->optional);
    ck_assert(h->dtype == PL_I32 && h->rank == 2 && !h->optional);
    /* val/test batches only */
    ck_assert_uint_eq(h->splits, PL_SPLIT_BIT(PL_SPLIT_VAL) | PL_SPLIT_BIT(PL_SPLIT_TEST));
    ck_assert_uint_eq(x->splits, 0);
    lf_check_fields_against_batches(&L, "rows");
    lt_close(&L);
    /* convert = f32 and split_fractions */
    char p[512], body[1024];
    snprintf(body, sizeof body, "path = %s\ndatasets = x=/train/x,y=/train/y\nsplit_fractions = 0.8,0.1,0.1\n"
             "batch_size = 16\nconvert = f32\n", lf_make_rows_file(p, sizeof p));
    PL_CK_OK(lt_open(&L, PLUGIN, body, NULL));
    lf_check_fields_against_batches(&L, "rows, fractions");
    lt_close(&L);
}
END_TEST

/* One field name with a dtype that depends on the split cannot be declared. */
START_TEST(batch_fields_refuses_split_dependent_dtype) {
    char q[512], body[1024];
    lf_tmp_path("dtypes.h5", q, sizeof q);
    float xf[8] = {0};
    double xd[8] = {0};
    ck_assert_int_eq(lt_write(q, "/train/x", H5T_NATIVE_FLOAT, 2, (long long[]){4, 2}, xf), 0);
    ck_assert_int_eq(lt_write(q, "/val/x", H5T_NATIVE_DOUBLE, 2, (long long[]){4, 2}, xd), 0);
    snprintf(body, sizeof body, "path = %s\ndatasets = x\nbatch_size = 2\n", q);
    lt_loader L;
    PL_CK_OK(lt_open(&L, PLUGIN, body, NULL));
    pl_field_list fl;
    ck_assert_int_eq(L.vt->batch_fields(L.sec, &fl), PL_ERR_CONFIG);
    ck_assert_msg(strstr(pl_error_message(), "'x'") && strstr(pl_error_message(), "val") &&
                  strstr(pl_error_message(), q), "%s", pl_error_message());
    lt_close(&L);
    snprintf(body, sizeof body, "path = %s\ndatasets = x\nbatch_size = 2\nconvert = f32\n", q);
    PL_CK_OK(lt_open(&L, PLUGIN, body, NULL));
    lf_check_fields_against_batches(&L, "convert = f32");
    lt_close(&L);
}
END_TEST
/* ---- teacher outputs joined to the train rows (teacher_join.c) ---------- */

#define JN 20 /* train rows */
#define JL 4  /* positions */
#define JK 3  /* teacher items per position in the file */

static int32_t j_input(int r, int p) { return p == 0 && r % 2 == 0 ? 0 : (r * 4 + p) % 9 + 1; }
static int32_t j_label(int r, int p) { return p == 0 && r % 2 == 0 ? 0 : (r + p) % 9 + 1; }
static int32_t j_item(int src, int p, int k) { return 1 + (src * 7 + p * 3 + k) % 9; }
static float j_logit(int p, int k) { return -(float)k - 0.1f * (float)p; }
static float j_lognorm(int src, int p) { return (float)src + 0.01f * (float)p; }

static void write_attr_double(const char *path, const char *name, double v) {
    hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
    hid_t sp = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(f, name, H5T_IEEE_F64LE, sp, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(a, H5T_NATIVE_DOUBLE, &v);
    H5Aclose(a);
    H5Sclose(sp);
    H5Fclose(f);
}

/* data: /train/input_ids, /train/labels i32 [JN, JL] (+ val/test copies);
 * teacher (ilora export layout): the rows in reverse order (source_row
 * JN-1-t), one entry per labelled position. `bad_row` >= 0: that teacher
 * row's input_ids copy differs at position 2; `no_lognorm`: no
 * /train/lognorm. */
static void make_join_files(const char *dp, const char *tp, int bad_row, bool no_lognorm) {
    unlink(dp);
    unlink(tp);
    int32_t in[JN * JL], lab[JN * JL], tin[JN * JL], tlab[JN * JL], src[JN];
    int32_t row[JN * JL], pos[JN * JL], lbl[JN * JL], ids[JN * JL * JK];
    float lg[JN * JL * JK], ln[JN * JL];
    long long n = 0;
    for (int r = 0; r < JN; r++)
        for (int p = 0; p < JL; p++) {
            in[r * JL + p] = j_input(r, p);
            lab[r * JL + p] = j_label(r, p);
        }
    for (int t = 0; t < JN; t++) {
        int s = JN - 1 - t;
        src[t] = s;
        for (int p = 0; p < JL; p++) {
            tin[t * JL + p] = j_input(s, p) + (t == bad_row && p == 2 ? 1 : 0);
            tlab[t * JL + p] = j_label(s, p);
            if (!j_label(s, p)) continue;
            row[n] = t;
            pos[n] = p;
            lbl[n] = j_label(s, p);
            for (int k = 0; k < JK; k++) {
                ids[n * JK + k] = j_item(s, p, k);
                lg[n * JK + k] = j_logit(p, k);
            }
            ln[n++] = j_lognorm(s, p);
        }
    }
    long long d2[2] = {JN, JL}, d1[1] = {JN};
    ck_assert_int_eq(lt_write(dp, "/train/input_ids", H5T_NATIVE_INT, 2, d2, in), 0);
    ck_assert_int_eq(lt_write(dp, "/train/labels", H5T_NATIVE_INT, 2, d2, lab), 0);
    ck_assert_int_eq(lt_write(dp, "/val/input_ids", H5T_NATIVE_INT, 2, d2, in), 0);
    ck_assert_int_eq(lt_write(dp, "/val/labels", H5T_NATIVE_INT, 2, d2, lab), 0);
    ck_assert_int_eq(lt_write(tp, "/train/input_ids", H5T_NATIVE_INT, 2, d2, tin), 0);
    ck_assert_int_eq(lt_write(tp, "/train/labels", H5T_NATIVE_INT, 2, d2, tlab), 0);
    ck_assert_int_eq(lt_write(tp, "/train/source_row", H5T_NATIVE_INT, 1, d1, src), 0);
    long long pk[2] = {n, JK}, p1[1] = {n};
    ck_assert_int_eq(lt_write(tp, "/train/row", H5T_NATIVE_INT, 1, p1, row), 0);
    ck_assert_int_eq(lt_write(tp, "/train/pos", H5T_NATIVE_INT, 1, p1, pos), 0);
    ck_assert_int_eq(lt_write(tp, "/train/label", H5T_NATIVE_INT, 1, p1, lbl), 0);
    ck_assert_int_eq(lt_write(tp, "/train/topk_ids", H5T_NATIVE_INT, 2, pk, ids), 0);
    ck_assert_int_eq(lt_write(tp, "/train/topk_logits", H5T_NATIVE_FLOAT, 2, pk, lg), 0);
    if (!no_lognorm)
        ck_assert_int_eq(lt_write(tp, "/train/lognorm", H5T_NATIVE_FLOAT, 1, p1, ln), 0);
    write_attr_double(tp, "temperature", 2.0);
}

static pl_status open_join(lt_loader *L, const char *dp, const char *tp, const char *extra) {
    char body[2048];
    snprintf(body, sizeof body,
             "path = %s\ndatasets = input_ids,labels\nrow_field = row\nteacher_outputs = %s\n%s",
             dp, tp, extra);
    return lt_open(L, PLUGIN, body, NULL);
}

/* Every train row of a shuffled epoch carries the teacher's targets of ITS
 * row (found through source_row, whatever the teacher file's row order),
 * the first teacher_top_k items of each labelled position, 0 elsewhere. */
START_TEST(teacher_outputs_join_follows_the_shuffled_rows) {
    char dp[512], tp[512];
    lf_tmp_path("join_data.h5", dp, sizeof dp);
    lf_tmp_path("join_teacher.h5", tp, sizeof tp);
    make_join_files(dp, tp, -1, false);
    for (int streaming = 0; streaming < 2; streaming++) {
        lt_loader L;
        PL_CK_OK(open_join(&L, dp, tp, streaming ? "batch_size = 3\nteacher_top_k = 2\n"
                                                   "chunk_samples = 6\n"
                                                 : "batch_size = 3\nteacher_top_k = 2\n"));
        double T;
        PL_CK_OK(pl_meta_get_float(L.ctx->meta, "teacher_temperature", &T));
        ck_assert_double_eq(T, 2.0);
        PL_CK_OK(L.vt->epoch_begin(L.self, PL_SPLIT_TRAIN, 1, 0));
        pl_batch b;
        int seen[JN] = {0}, n = 0, inorder = 0;
        while (L.vt->next(L.self, &b) == 1) {
            pl_tensor *rw = pl_batch_get(&b, "row"), *in = pl_batch_get(&b, "input_ids");
            pl_tensor *ki = pl_batch_get(&b, "kd_ids"), *kl = pl_batch_get(&b, "kd_logits");
            pl_tensor *kn = pl_batch_get(&b, "kd_lognorm");
            ck_assert_ptr_nonnull(rw);
            ck_assert_ptr_nonnull(ki);
            ck_assert_int_eq(ki->ndim, 3);
            ck_assert_int_eq(ki->shape[2], 2);
            ck_assert_int_eq(kn->ndim, 2);
            for (int64_t i = 0; i < b.size; i++) {
                int r = (int)pl_tensor_i64(rw)[i];
                ck_assert(r >= 0 && r < JN);
                seen[r]++;
                inorder += r == n;
                n++;
                for (int p = 0; p < JL; p++) {
                    ck_assert_int_eq(((int32_t *)pl_tensor_data(in))[i * JL + p], j_input(r, p));
                    const int32_t *id = (int32_t *)pl_tensor_data(ki) + (i * JL + p) * 2;
                    const float *lv = pl_tensor_f32(kl) + (i * JL + p) * 2;
                    float nv = pl_tensor_f32(kn)[i * JL + p];
                    for (int k = 0; k < 2; k++) {
                        ck_assert_int_eq(id[k], j_label(r, p) ? j_item(r, p, k) : 0);
                        ck_assert_float_eq(lv[k], j_label(r, p) ? j_logit(p, k) : 0.0f);
                    }
                    ck_assert_float_eq(nv, j_label(r, p) ? j_lognorm(r, p) : 0.0f);
                }
            }
        }
        ck_assert_int_eq(n, JN);
        ck_assert_int_lt(inorder, JN / 2);
        for (int r = 0; r < JN; r++) ck_assert_int_eq(seen[r], 1);
        /* val batches: the row field, no teacher fields */
        PL_CK_OK(L.vt->epoch_begin(L.self, PL_SPLIT_VAL, 0, 0));
        ck_assert_int_eq(L.vt->next(L.self, &b), 1);
        ck_assert_ptr_nonnull(pl_batch_get(&b, "row"));
        ck_assert_ptr_null(pl_batch_get(&b, "kd_ids"));
        lt_close(&L);
    }
    /* declared: row everywhere, the teacher fields for train only */
    char body[2048];
    snprintf(body, sizeof body, "path = %s\ndatasets = input_ids,labels\nrow_field = row\n"
             "teacher_outputs = %s\n", dp, tp);
    lt_loader L;
    PL_CK_OK(lt_open(&L, PLUGIN, body, NULL));
    lf_check_fields_against_batches(&L, "teacher join");
    pl_field_list fl;
    PL_CK_OK(L.vt->batch_fields(L.sec, &fl));
    ck_assert_uint_eq(lf_find_field(&fl, "kd_ids")->splits, PL_SPLIT_BIT(PL_SPLIT_TRAIN));
    ck_assert_uint_eq(lf_find_field(&fl, "row")->splits, 0u);
    lt_close(&L);
}
END_TEST

/* On a device (the strict one: GPU-like memory the host cannot touch) a
 * shuffled batch is gathered by one index_select per field from the chunk's
 * row order, copied to the device once per chunk: every batch of an epoch
 * equals the CPU loader's, byte for byte, resident and streaming, with the
 * teacher join's extra fields and row_field. */
START_TEST(shuffled_batches_on_a_device_equal_the_cpu_ones) {
    pl_device dev;
    PL_CK_OK(lt_test_device(&dev)); /* strict, or PL_TEST_DEVICE_BACKEND=cuda */
    char p[512], dp[512], tp[512], body[2048];
    lf_make_rows_file(p, sizeof p);
    lf_tmp_path("join_data.h5", dp, sizeof dp);
    lf_tmp_path("join_teacher.h5", tp, sizeof tp);
    make_join_files(dp, tp, -1, false);
    const char *cases[] = {
        "batch_size = 8\nshuffle = true\n",                           /* resident */
        "batch_size = 8\nchunk_samples = 32\nshuffle = true\n",      /* streaming, prefetch */
        "batch_size = 7\nchunk_samples = 21\nshuffle = true\nprefetch = false\n",
        "JOIN batch_size = 3\nteacher_top_k = 2\n",                   /* extra fields, resident */
        "JOIN batch_size = 3\nteacher_top_k = 2\nchunk_samples = 6\n", /* streaming */
    };
    for (int c = 0; c < 5; c++) {
        bool join = !strncmp(cases[c], "JOIN ", 5);
        if (join)
            snprintf(body, sizeof body, "path = %s\ndatasets = input_ids,labels\nrow_field = row\n"
                     "teacher_outputs = %s\n%s", dp, tp, cases[c] + 5);
        else
            snprintf(body, sizeof body, "path = %s\ndatasets = x,label=y\nrow_field = row\n%s", p,
                     cases[c]);
        int nb = 0, nf = 0;
        char why[1024];
        const char *d = lt_device_equals_cpu(PLUGIN, body, dev, 2, &nb, &nf, why, sizeof why);
        ck_assert_msg(d == NULL, "case %d: %s", c, d);
        ck_assert_int_gt(nb, 1);
        ck_assert_int_ge(nf, join ? 6 : 3);
    }
}
END_TEST

/* Rows that do not match are refused naming both files and the first
 * mismatching row; so are a missing log-normalizer and a K too large. */
START_TEST(teacher_outputs_mismatch_is_refused_naming_both_files_and_the_row) {
    char dp[512], tp[512];
    lf_tmp_path("join_data_bad.h5", dp, sizeof dp);
    lf_tmp_path("join_teacher_bad.h5", tp, sizeof tp);
    lt_loader L;
    make_join_files(dp, tp, 7, false);
    ck_assert_int_ne(open_join(&L, dp, tp, ""), PL_OK);
    const char *m = pl_error_message();
    ck_assert_msg(strstr(m, dp) && strstr(m, tp), "message '%s' lacks a file name", m);
    ck_assert_msg(strstr(m, "row 7 (source_row 12)") && strstr(m, "input_ids position 2"),
                  "message '%s' lacks the row", m);
    make_join_files(dp, tp, -1, true);
    ck_assert_int_ne(open_join(&L, dp, tp, ""), PL_OK);
    ck_assert_ptr_nonnull(strstr(pl_error_message(), "/train/lognorm"));
    make_join_files(dp, tp, -1, false);
    ck_assert_int_ne(open_join(&L, dp, tp, "teacher_top_k = 4\n"), PL_OK);
    ck_assert_ptr_nonnull(strstr(pl_error_message(), "teacher_top_k = 4"));
    /* a teacher "item" that is no item (0, the padding id) is refused at the join, naming
     * the file, the dataset and its place: the model reads them on the device unchecked */
    {
        hid_t f = H5Fopen(tp, H5F_ACC_RDWR, H5P_DEFAULT);
        hid_t d = H5Dopen2(f, "/train/topk_ids", H5P_DEFAULT);
        int32_t v[4096];
        hid_t sp = H5Dget_space(d);
        ck_assert_int_le(H5Sget_simple_extent_npoints(sp), 4096);
        H5Sclose(sp);
        ck_assert_int_ge(H5Dread(d, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, v), 0);
        v[1 * JK + 2] = 0;
        ck_assert_int_ge(H5Dwrite(d, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, v), 0);
        H5Dclose(d);
        H5Fclose(f);
    }
    ck_assert_int_ne(open_join(&L, dp, tp, ""), PL_OK);
    m = pl_error_message();
    ck_assert_msg(strstr(m, tp) && strstr(m, "/train/topk_ids[1][2] = 0 is not an item"), "%s", m);
    make_join_files(dp, tp, -1, false);
    /* a data file with another row count: the first data row without a teacher row */
    char dp2[512];
    lf_tmp_path("join_data_more.h5", dp2, sizeof dp2);
    unlink(dp2);
    int32_t in[(JN + 1) * JL], lab[(JN + 1) * JL];
    for (int r = 0; r <= JN; r++)
        for (int p = 0; p < JL; p++) {
            in[r * JL + p] = j_input(r, p);
            lab[r * JL + p] = j_label(r, p);
        }
    long long d2[2] = {JN + 1, JL};
    ck_assert_int_eq(lt_write(dp2, "/train/input_ids", H5T_NATIVE_INT, 2, d2, in), 0);
    ck_assert_int_eq(lt_write(dp2, "/train/labels", H5T_NATIVE_INT, 2, d2, lab), 0);
    ck_assert_int_ne(open_join(&L, dp2, tp, ""), PL_OK);
    m = pl_error_message();
    ck_assert_msg(strstr(m, "no row for train row 20") && strstr(m, dp2) && strstr(m, tp),
                  "message '%s'", m);
    pl_error_clear();
}
END_TEST

/* ---- bad inputs ------------------------------------------------------- */

static void expect_error(const char *body, const char *needle1, const char *needle2) {
    lt_loader L;
    pl_status st = lt_open(&L, PLUGIN, body, NULL);
    ck_assert_msg(st != PL_OK, "expected an error for:\n%s", body);
    const char *m = pl_error_message();
    ck_assert_msg(strstr(m, needle1) != NULL, "message '%s' lacks '%s'", m, needle1);
    if (needle2) ck_assert_msg(strstr(m, needle2) != NULL, "message '%s' lacks '%s'", m, needle2);
}

START_TEST(test_errors) {
    char p[512], body[2048], q[512];
    expect_error("path = /nonexistent/x.h5\ndatasets = x\n", "/nonexistent/x.h5", "cannot open");
    lf_tmp_path("not.h5", q, sizeof q);
    FILE *f = fopen(q, "w");
    fputs("hello, I am text\n", f);
    fclose(f);
    snprintf(body, sizeof body, "path = %s\ndatasets = x\n", q);
    expect_error(body, q, "not an HDF5 file");
    lf_make_rows_file(p, sizeof p);
    snprintf(body, sizeof body, "path = %s\ndatasets = x,nope\n", p);
    expect_error(body, p, "'/train/nope' not found");
    /* first dims disagree */
    lf_tmp_path("bad.h5", q, sizeof q);
    float z[12] = {0};
    lt_write(q, "/train/a", H5T_NATIVE_FLOAT, 2, (long long[]){4, 3}, z);
    lt_write(q, "/train/b", H5T_NATIVE_FLOAT, 1, (long long[]){5}, z);
    lt_write(q, "/train/s", H5T_NATIVE_FLOAT, 0, NULL, z);
    lt_write(q, "/empty/a", H5T_NATIVE_FLOAT, 2, (long long[]){0, 3}, z);
    snprintf(body, sizeof body, "path = %s\ndatasets = a,b\n", q);
    expect_error(body, "'/train/a' (4 rows) and '/train/b' (5 rows)", "disagree");
    snprintf(body, sizeof body, "path = %s\ndatasets = s\n", q);
    expect_error(body, "'/train/s' has rank 0", q);
    snprintf(body, sizeof body, "path = %s\ndatasets = a\ntrain_group = /empty\n", q);
    expect_error(body, "split 'train'", "0 rows");
    snprintf(body, sizeof body, "path = %s\ndatasets = a\nbatch_size = 8\ndrop_last = true\n", q);
    expect_error(body, "4 rows < batch_size 8", "drop_last");
    /* a filter the C library cannot decode (h5py's LZF) */
    snprintf(body, sizeof body, "path = tests/data/loaders/lzf.h5\ndatasets = x,y\n");
    expect_error(body, "dataset '/train/x' uses HDF5 filter 32000 (lzf)", "tests/data/loaders/lzf.h5");
    /* an empty val split is refused at epoch_begin, naming it */
    lt_loader L;
    snprintf(body, sizeof body, "path = %s\ndatasets = a\n", q);
    PL_CK_OK(lt_open(&L, PLUGIN, body, NULL));
    ck_assert_int_eq(L.vt->num_batches(L.self, PL_SPLIT_VAL), 0);
    ck_assert_int_ne(L.vt->epoch_begin(L.self, PL_SPLIT_VAL, 0, 0), PL_OK);
    ck_assert_ptr_nonnull(strstr(pl_error_message(), "split 'val' is empty"));
    lt_close(&L);
}
END_TEST

/* ---- NaN / Inf in the data ------------------------------------------- */

/* /train/x f32 [40, 3] = row, with NaN at row 25 column 2 and Inf at row 28
 * column 0; /train/z f64 [40] = row with NaN at row 3; /train/ok f32 [40, 3]. */
static const char *make_nan_file(char *buf, size_t n) {
    const char *p = lf_tmp_path("nan.h5", buf, n);
    remove(p);
    float x[40 * 3], ok[40 * 3];
    double z[40];
    for (int i = 0; i < 40; i++) {
        z[i] = i;
        for (int j = 0; j < 3; j++) x[i * 3 + j] = ok[i * 3 + j] = (float)i;
    }
    x[25 * 3 + 2] = NAN;
    x[28 * 3 + 0] = INFINITY;
    z[3] = NAN;
    ck_assert_int_eq(lt_write(p, "/train/x", H5T_NATIVE_FLOAT, 2, (long long[]){40, 3}, x), 0);
    ck_assert_int_eq(lt_write(p, "/train/z", H5T_NATIVE_DOUBLE, 1, (long long[]){40}, z), 0);
    ck_assert_int_eq(lt_write(p, "/train/ok", H5T_NATIVE_FLOAT, 2, (long long[]){40, 3}, ok), 0);
    return p;
}


/* Rows mode: a chunk holding NaN / Inf is refused when it is read, naming
 * the file, the dataset, the row and column of the first one and the count in
 * that chunk (streaming: the read of a later chunk; resident: the first epoch). */
START_TEST(nonfinite_rows_are_refused_naming_dataset_row_and_column) {
    char p[512], body[1024];
    make_nan_file(p, sizeof p);
    for (int prefetch = 0; prefetch < 2; prefetch++) {
        /* streaming, chunks of 10 rows in file order: chunk 2 (rows 20..29) fails */
        snprintf(body, sizeof body,
                 "path = %s\ndatasets = x\nbatch_size = 10\nchunk_samples = 10\nshuffle = "
                 "false\nprefetch = %s\n",
                 p, prefetch ? "true" : "false");
        lt_loader L;
        PL_CK_OK(lt_open(&L, PLUGIN, body, NULL));
        pl_status st = L.vt->epoch_begin(L.self, PL_SPLIT_TRAIN, 0, 0);
        pl_batch b;
        int r = 0, nb = 0;
        while (!st && (r = L.vt->next(L.self, &b)) == 1)
            nb++;
        ck_assert_msg(st || r < 0, "an epoch over NaN data ended without an error");
        ck_assert_int_le(nb, 2); /* batches of chunks 0 and 1 are clean */
        lf_expect_in_message(pl_error_message(), p, "dataset '/train/x' row 25, column 2 is nan",
                          "2 non-finite values in rows 20..29");
        /* the chunks before it are served */
        PL_CK_OK(L.vt->epoch_begin(L.self, PL_SPLIT_TRAIN, 0, 0));
        ck_assert_int_eq(L.vt->next(L.self, &b), 1);
        lt_close(&L);
    }
    /* resident (everything fits): refused at the first epoch_begin */
    snprintf(body, sizeof body, "path = %s\ndatasets = ok,x\nbatch_size = 8\nshuffle = false\n",
             p);
    lt_loader L;
    PL_CK_OK(lt_open(&L, PLUGIN, body, NULL));
    ck_assert_int_ne(L.vt->epoch_begin(L.self, PL_SPLIT_TRAIN, 0, 0), PL_OK);
    lf_expect_in_message(pl_error_message(), "dataset '/train/x' row 25, column 2 is nan",
                      "2 non-finite values in rows 0..39", "fillna()");
    lt_close(&L);
    /* f64 kept as f64, rank 1: no column; split_fractions rows are dataset rows */
    snprintf(body, sizeof body,
             "path = %s\ndatasets = /train/z\nbatch_size = 2\nshuffle = false\n"
             "split_fractions = 0.05,0.95,0\n",
             p);
    PL_CK_OK(lt_open(&L, PLUGIN, body, NULL));
    PL_CK_OK(L.vt->epoch_begin(L.self, PL_SPLIT_TRAIN, 0, 0)); /* rows 0..1 are clean */
    ck_assert_int_ne(L.vt->epoch_begin(L.self, PL_SPLIT_VAL, 0, 0), PL_OK);
    lf_expect_in_message(pl_error_message(), "dataset '/train/z' row 3 is nan",
                      "1 non-finite value in rows 2..39", NULL);
    lt_close(&L);
}
END_TEST


START_TEST(test_movielens_real) {
    char csv[512], out[512];
    if (!pl_test_shared("movielens/ratings.csv", csv, sizeof csv)) {
        printf("test_movielens_real: ../shared/data absent, skipped\n");
        return;
    }
    lf_tmp_path("ml.h5", out, sizeof out);
    if (!lf_convert("movielens_to_h5.py", csv, out)) {
        printf("test_movielens_real: python3 + h5py unavailable, skipped\n");
        return;
    }
    char body[1024];
    snprintf(body, sizeof body, "path = %s\ndatasets = input_ids,labels\n"
             "val_datasets = input_ids,target,user_index\ntest_datasets = input_ids,target,user_index\n"
             "history = history\nbatch_size = 128\neval_batch_size = 256\n", out);
    lt_loader L;
    PL_CK_OK(lt_open(&L, PLUGIN, body, NULL));
    int64_t v;
    PL_CK_OK(pl_meta_get_int(L.ctx->meta, "num_items", &v));
    ck_assert_int_eq(v, 9066);
    PL_CK_OK(pl_meta_get_int(L.ctx->meta, "num_users", &v));
    ck_assert_int_eq(v, 671);
    PL_CK_OK(pl_meta_get_int(L.ctx->meta, "num_ratings", &v));
    ck_assert_int_eq(v, 100004);
    PL_CK_OK(pl_meta_get_int(L.ctx->meta, "seq_len", &v));
    ck_assert_int_eq(v, 50);
    /* test split: the target never appears in the padded history; histories of
     * all users hold 100004 - 671 items in total */
    PL_CK_OK(L.vt->epoch_begin(L.self, PL_SPLIT_TEST, 0, 0));
    pl_batch b;
    int64_t users = 0, hist_items = 0;
    while (L.vt->next(L.self, &b) == 1) {
        pl_tensor *h = pl_batch_get(&b, "history"), *t = pl_batch_get(&b, "target");
        pl_tensor *in = pl_batch_get(&b, "input_ids");
        int64_t H = h->shape[1];
        for (int64_t i = 0; i < b.size; i++, users++) {
            int32_t tg = pl_tensor_i32(t)[i];
            ck_assert(tg >= 1 && tg <= 9066);
            for (int64_t k = 0; k < H; k++) {
                int32_t it = pl_tensor_i32(h)[i * H + k];
                hist_items += it != 0;
                ck_assert_int_ne(it, tg);
            }
            /* the last input is the validation target: nonzero */
            ck_assert_int_ne(pl_tensor_i32(in)[i * 50 + 49], 0);
        }
    }
    ck_assert_int_eq(users, 671);
    ck_assert_int_eq(hist_items, 100004 - 671);
    lt_close(&L);
}
END_TEST
int main(void) {
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    Suite *s = suite_create("hdf5_rows");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_views_and_no_alloc);
    tcase_add_test(tc, test_shuffle);
    tcase_add_test(tc, test_drop_last_and_resident);
    tcase_add_test(tc, test_history_field);
    tcase_add_test(tc, test_fractions);
    tcase_add_test(tc, start_batch_streaming_shuffled_across_chunks);
    tcase_add_test(tc, start_batch_resident);
    tcase_add_test(tc, batch_fields_rows_mode);
    tcase_add_test(tc, batch_fields_refuses_split_dependent_dtype);
    tcase_add_test(tc, teacher_outputs_join_follows_the_shuffled_rows);
    tcase_add_test(tc, teacher_outputs_mismatch_is_refused_naming_both_files_and_the_row);
    tcase_add_test(tc, shuffled_batches_on_a_device_equal_the_cpu_ones);
    tcase_add_test(tc, test_errors);
    tcase_add_test(tc, nonfinite_rows_are_refused_naming_dataset_row_and_column);
    tcase_add_test(tc, test_movielens_real);
    suite_add_tcase(s, tc);
    return pl_test_run(s);
}
