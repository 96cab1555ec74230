/* test_pl_h5.c - libpipeline_hdf5: one lock instance for every plugin in the
 * process, and the shared helpers (errors naming the file, overflow-checked
 * sizes, row-extendible writes read back). */
#include <dlfcn.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "pl_h5.h"
#include "pl_test.h"

static const char *tmp_path(const char *name, char *buf, size_t n) {
    return pl_test_tmp_path("pl_h5", name, buf, n);
}

/* Plugins are dlopen()ed RTLD_LOCAL like the registry does: each one's
 * pl_h5_lock resolves to this process's single libpipeline_hdf5 copy. */
START_TEST(lock_is_one_instance_across_plugins) {
    const char *names[] = {"hdf5_rows", "hdf5_series", "hdf5_chunk", "hdf5_graph", "hdf5_panel"};
    for (int i = 0; i < (int)(sizeof names / sizeof *names); i++) {
        char so[1024];
        snprintf(so, sizeof so, "%s/%s.so", PL_TEST_PLUGIN_DIR, names[i]);
        void *h = dlopen(so, RTLD_NOW | RTLD_LOCAL);
        ck_assert_msg(h != NULL, "dlopen %s: %s", so, dlerror());
        void *lock = dlsym(h, "pl_h5_lock");
        ck_assert_msg(lock == (void *)pl_h5_lock,
                      "%s sees a pl_h5_lock at %p, this process's is %p", names[i], lock,
                      (void *)pl_h5_lock);
        dlclose(h);
    }
}
END_TEST

/* Recursive: a helper called with the lock held does not deadlock. */
START_TEST(lock_is_recursive) {
    char p[512];
    tmp_path("rec.h5", p, sizeof p);
    pl_h5_lock();
    pl_h5_lock();
    hid_t f;
    PL_CK_OK(pl_h5_create(p, &f));
    PL_CK_OK(pl_h5_attr_write_int(p, f, "n", 7));
    PL_CK_OK(pl_h5_close(p, f));
    pl_h5_unlock();
    pl_h5_unlock();
}
END_TEST

START_TEST(open_errors_name_the_file) {
    hid_t f;
    ck_assert_int_eq(pl_h5_open_read("/nonexistent/x.h5", "run tools/prepare_data.sh", &f),
                     PL_ERR_IO);
    const char *m = pl_error_message();
    ck_assert_msg(strstr(m, "/nonexistent/x.h5: cannot open") && strstr(m, "prepare_data"), "%s",
                  m);
    char p[512];
    tmp_path("text.h5", p, sizeof p);
    FILE *t = fopen(p, "w");
    fputs("not hdf5\n", t);
    fclose(t);
    ck_assert_int_eq(pl_h5_open_read(p, NULL, &f), PL_ERR_IO);
    ck_assert_msg(strstr(pl_error_message(), "not an HDF5 file") && strstr(pl_error_message(), p),
                  "%s", pl_error_message());
}
END_TEST

/* A file HDF5 refuses is told apart from its bytes (issue 34: six damaged
 * files all got "HDF5 cannot open the file"): empty, no signature, ending
 * inside the superblock, shorter than the end of file address the
 * superblock records (versions 0 and 3), a superblock version unknown. */
static size_t slurp(const char *p, unsigned char **out) {
    FILE *f = fopen(p, "rb");
    ck_assert_ptr_nonnull(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    *out = malloc((size_t)n);
    ck_assert_int_eq(fread(*out, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    return (size_t)n;
}

static void expect_open_error(const char *p, const unsigned char *b, size_t n, const char *want) {
    FILE *f = fopen(p, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_int_eq(fwrite(b, 1, n, f), n);
    fclose(f);
    hid_t h = 0;
    ck_assert_int_eq(pl_h5_open_read(p, NULL, &h), PL_ERR_IO);
    ck_assert_int_lt(h, 0);
    ck_assert_msg(strstr(pl_error_message(), p) && strstr(pl_error_message(), want),
                  "%zu bytes: expected '%s' in: %s", n, want, pl_error_message());
}

START_TEST(damaged_files_say_truncated_or_not_hdf5) {
    for (int latest = 0; latest < 2; latest++) {
        char good[512], bad[512];
        tmp_path(latest ? "sb3.h5" : "sb0.h5", good, sizeof good);
        tmp_path("damaged.h5", bad, sizeof bad);
        pl_h5_lock();
        hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
        if (latest) H5Pset_libver_bounds(fapl, H5F_LIBVER_LATEST, H5F_LIBVER_LATEST);
        hid_t f = H5Fcreate(good, H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
        ck_assert_int_ge(f, 0);
        hsize_t n = 2000;
        hid_t sp = H5Screate_simple(1, &n, NULL);
        hid_t d = H5Dcreate2(f, "x", H5T_IEEE_F32LE, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        static float v[2000];
        ck_assert_int_ge(H5Dwrite(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v), 0);
        H5Dclose(d);
        H5Sclose(sp);
        H5Pclose(fapl);
        ck_assert_int_ge(H5Fclose(f), 0);
        pl_h5_unlock();
        unsigned char *b;
        size_t size = slurp(good, &b);
        ck_assert_uint_gt(size, 8000);
        ck_assert_uint_eq(b[8], latest ? 3 : 0); /* the superblock version exercised */
        char want[160];
        snprintf(want, sizeof want, ": truncated: %zu bytes, its superblock says %zu", size / 2,
                 size);
        expect_open_error(bad, b, size / 2, want);
        snprintf(want, sizeof want, ": truncated: %zu bytes, its superblock says %zu", size - 1,
                 size);
        expect_open_error(bad, b, size - 1, want);
        expect_open_error(bad, b, 30, ": truncated: 30 bytes, ending inside the superblock");
        expect_open_error(bad, b, 0, ": not an HDF5 file: it is empty (0 bytes)");
        expect_open_error(bad, b, 5, ": not an HDF5 file: no HDF5 superblock signature");
        b[8] = 9;
        expect_open_error(bad, b, size, "superblock (byte 0) has version 9");
        b[8] = latest ? 3 : 0;
        b[latest ? 9 : 13] = 3;
        expect_open_error(bad, b, size, "is corrupt (addresses of 3 bytes");
        free(b);
    }
}
END_TEST

/* Write [0, 3] rows twice, attributes of each kind; read them back whole, by
 * rows, as a tensor; shape and rank checks name the dataset. */
START_TEST(write_rows_then_read_back) {
    char p[512];
    tmp_path("rows.h5", p, sizeof p);
    hid_t f, d, v;
    PL_CK_OK(pl_h5_create(p, &f));
    PL_CK_OK(pl_h5_create_rows(p, f, "m", H5T_STD_I32LE, 3, &d));
    PL_CK_OK(pl_h5_create_rows(p, f, "v", H5T_IEEE_F32LE, 0, &v));
    int32_t a[6] = {1, 2, 3, 4, 5, 6}, b[3] = {7, 8, 9};
    float fv[3] = {0.5f, 1.5f, 2.5f};
    PL_CK_OK(pl_h5_append_rows(p, d, H5T_NATIVE_INT32, 0, 2, 3, a));
    PL_CK_OK(pl_h5_append_rows(p, d, H5T_NATIVE_INT32, 2, 1, 3, b));
    PL_CK_OK(pl_h5_append_rows(p, v, H5T_NATIVE_FLOAT, 0, 3, 0, fv));
    PL_CK_OK(pl_h5_attr_write_int(p, f, "k", 42));
    PL_CK_OK(pl_h5_attr_write_double(p, f, "t", 0.25));
    PL_CK_OK(pl_h5_attr_write_str(p, f, "s", "hello"));
    pl_h5_lock();
    H5Dclose(d);
    H5Dclose(v);
    pl_h5_unlock();
    PL_CK_OK(pl_h5_close(p, f));

    PL_CK_OK(pl_h5_open_read(p, NULL, &f));
    int64_t k;
    double t;
    bool found;
    PL_CK_OK(pl_h5_attr_read_int(p, f, "k", &k, &found));
    ck_assert(found && k == 42);
    PL_CK_OK(pl_h5_attr_read_double(p, f, "t", &t, &found));
    ck_assert(found && t == 0.25);
    PL_CK_OK(pl_h5_attr_read_int(p, f, "absent", &k, &found));
    ck_assert(!found);
    ck_assert_int_eq(pl_h5_attr_read_int(p, f, "s", &k, &found), PL_ERR_IO);
    ck_assert_ptr_nonnull(strstr(pl_error_message(), "attribute 's'"));

    int32_t *all;
    pl_h5_info in;
    PL_CK_OK(pl_h5_read_alloc(p, f, "m", H5T_NATIVE_INT32, 2, 2, (int64_t[]){-1, 3}, (void **)&all,
                              &in));
    ck_assert_int_eq(in.rank, 2);
    ck_assert_int_eq(in.dims[0], 3);
    ck_assert_int_eq(in.numel, 9);
    for (int i = 0; i < 9; i++)
        ck_assert_int_eq(all[i], i + 1);
    free(all);
    ck_assert_int_eq(pl_h5_read_alloc(p, f, "m", H5T_NATIVE_INT32, 1, 1, NULL, (void **)&all, NULL),
                     PL_ERR_SHAPE);
    ck_assert_msg(strstr(pl_error_message(), "'m' has rank 2; expected 1"), "%s",
                  pl_error_message());
    ck_assert_int_eq(pl_h5_read_alloc(p, f, "m", H5T_NATIVE_INT32, 2, 2, (int64_t[]){4, -1},
                                      (void **)&all, NULL),
                     PL_ERR_SHAPE);
    ck_assert_msg(strstr(pl_error_message(), "has 3 entries on axis 0; expected 4"), "%s",
                  pl_error_message());
    ck_assert_int_eq(
        pl_h5_read_alloc(p, f, "nope", H5T_NATIVE_INT32, 1, 1, NULL, (void **)&all, NULL),
        PL_ERR_IO);
    ck_assert_msg(strstr(pl_error_message(), "dataset 'nope' not found") &&
                      strstr(pl_error_message(), p),
                  "%s", pl_error_message());

    hid_t ds;
    PL_CK_OK(pl_h5_dataset_open(p, f, "m", &ds));
    int32_t row[3];
    PL_CK_OK(pl_h5_read_rows(p, "m", ds, H5T_NATIVE_INT32, 1, 1, row));
    ck_assert(row[0] == 4 && row[2] == 6);
    pl_dtype dt;
    hid_t mt;
    PL_CK_OK(pl_h5_dataset_dtype(p, "m", ds, false, &dt, &mt));
    ck_assert_int_eq(dt, PL_I32);
    pl_h5_lock();
    H5Dclose(ds);
    pl_h5_unlock();

    pl_tensor *tv;
    PL_CK_OK(pl_h5_read_tensor(p, f, "v", PL_F64, &tv));
    ck_assert_int_eq(tv->ndim, 1);
    ck_assert_int_eq(tv->shape[0], 3);
    ck_assert(((double *)pl_tensor_data(tv))[2] == 2.5);
    pl_tensor_release(tv);
    PL_CK_OK(pl_h5_close(p, f));
}
END_TEST

/* A shape whose byte size overflows is refused before any allocation. */
/* A predictions file's life on the heap: new opens it, finish closes and frees
 * it (NULL after), a finish without a file names the model, free after an
 * error is NULL-safe, and a file that cannot be created leaves nothing. */
START_TEST(out_new_finish_free) {
    char p[512];
    tmp_path("pred.h5", p, sizeof p);
    pl_h5_out *o = NULL;
    PL_CK_OK(pl_h5_out_new(p, NULL, &o));
    ck_assert_ptr_nonnull(o);
    int64_t shape[1] = {3};
    pl_tensor *t = PL_CK_NOTNULL(pl_tensor_zeros(PL_F32, 1, shape, PL_CPU));
    PL_CK_OK(pl_h5_out_append(o, "y", t));
    pl_tensor_release(t);
    PL_CK_OK(pl_h5_out_finish(&o, "mymodel"));
    ck_assert_ptr_null(o);
    ck_assert_int_eq(pl_h5_out_finish(&o, "mymodel"), PL_ERR_INVALID);
    ck_assert_msg(strstr(pl_error_message(), "mymodel: predict_end before predict_begin"), "%s",
                  pl_error_message());
    pl_h5_out_free(&o); /* NULL: nothing */
    ck_assert_int_eq(pl_h5_out_new("/nonexistent/dir/pred.h5", NULL, &o), PL_ERR_IO);
    ck_assert_ptr_null(o);
    PL_CK_OK(pl_h5_out_new(p, NULL, &o));
    pl_h5_out_free(&o); /* destroyed mid-predict */
    ck_assert_ptr_null(o);
    pl_error_clear();
}
END_TEST


/* A model's outputs (plugin.h pl_outputs) as the run and `pipeline predict`
 * write them: the file holds exactly the names given (groups made for "a/b",
 * a declared 0-row dataset kept, rows appended in call order), the root
 * attributes keep their types (a float of integral value stays a double),
 * and nothing is under the final name until commit. A later tensor of
 * another dtype fails naming the dataset, and abandoning leaves no file. */
START_TEST(outputs_write_the_named_tensors) {
    char p[512], tmp[600];
    tmp_path("outs.h5", p, sizeof p);
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", p, (long)getpid());
    unlink(p);
    pl_meta *a = PL_CK_NOTNULL(pl_meta_new());
    PL_CK_OK(pl_meta_set_float(a, "temperature", 2.0));
    PL_CK_OK(pl_meta_set_int(a, "top_k", 3));
    pl_outputs decl = {.attrs = a};
    pl_frame_begin();
    PL_CK_OK(pl_outputs_add(&decl, "val/empty", pl_tensor_empty(PL_I32, PL_SHAPE(0, 3), PL_CPU)));
    pl_h5_out *o = NULL;
    PL_CK_OK(pl_h5_outputs_open(p, &decl, &o));
    ck_assert_int_eq(access(tmp, F_OK), 0);
    float v[4] = {1, 2, 3, 4};
    for (int k = 0; k < 2; k++) {
        pl_outputs out = {0};
        PL_CK_OK(pl_outputs_add(&out, "train/x", pl_tensor_from_data(PL_F32, PL_SHAPE(2, 2), v,
                                                                     PL_CPU)));
        PL_CK_OK(pl_outputs_add(&out, "row", pl_tensor_full(PL_I64, PL_SHAPE(2), k, PL_CPU)));
        ck_assert_int_eq(pl_outputs_add(&out, "row", out.t[1]), PL_ERR_INVALID); /* twice */
        ck_assert_int_eq(pl_outputs_add(&out, "/bad", out.t[1]), PL_ERR_INVALID);
        PL_CK_OK(pl_h5_outputs_write(o, &out));
    }
    ck_assert_int_ne(access(p, F_OK), 0); /* not yet under its name */
    PL_CK_OK(pl_h5_outputs_commit(&o));
    ck_assert_ptr_null(o);
    ck_assert_int_ne(access(tmp, F_OK), 0);
    pl_frame_end();
    pl_meta_free(a);

    hid_t f = H5Fopen(p, H5F_ACC_RDONLY, H5P_DEFAULT);
    ck_assert_int_ge(f, 0);
    H5G_info_t gi;
    ck_assert_int_ge(H5Gget_info(f, &gi), 0);
    ck_assert_int_eq((int)gi.nlinks, 3); /* /train, /val, /row and nothing else */
    const char *want[3] = {"/train/x", "/row", "/val/empty"};
    const hsize_t rows[3] = {4, 4, 0};
    for (int i = 0; i < 3; i++) {
        hid_t d = H5Dopen2(f, want[i], H5P_DEFAULT);
        ck_assert_msg(d >= 0, "%s missing", want[i]);
        hid_t sp = H5Dget_space(d);
        hsize_t dims[2] = {0, 0};
        H5Sget_simple_extent_dims(sp, dims, NULL);
        ck_assert_int_eq((int)dims[0], (int)rows[i]);
        if (i == 1) {
            int64_t r[4];
            H5Dread(d, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, r);
            ck_assert(r[0] == 0 && r[1] == 0 && r[2] == 1 && r[3] == 1); /* call order */
        }
        H5Sclose(sp);
        H5Dclose(d);
    }
    hid_t at = H5Aopen(f, "temperature", H5P_DEFAULT);
    hid_t ty = H5Aget_type(at);
    ck_assert_int_eq(H5Tget_class(ty), H5T_FLOAT);
    H5Tclose(ty);
    H5Aclose(at);
    H5Fclose(f);
    unlink(p);

    /* another dtype under a name already written: an error naming it; abandoned: no file */
    pl_frame_begin();
    PL_CK_OK(pl_h5_outputs_open(p, NULL, &o));
    pl_outputs out = {0};
    PL_CK_OK(pl_outputs_add(&out, "pred", pl_tensor_zeros(PL_F32, PL_SHAPE(2), PL_CPU)));
    PL_CK_OK(pl_h5_outputs_write(o, &out));
    out.t[0] = pl_tensor_zeros(PL_I64, PL_SHAPE(2), PL_CPU);
    ck_assert_int_eq(pl_h5_outputs_write(o, &out), PL_ERR_SHAPE);
    ck_assert_msg(strstr(pl_error_message(), "'pred'"), "%s", pl_error_message());
    pl_h5_outputs_abandon(&o);
    ck_assert_ptr_null(o);
    pl_frame_end();
    ck_assert_int_ne(access(p, F_OK), 0);
    ck_assert_int_ne(access(tmp, F_OK), 0);
    pl_error_clear();
}
END_TEST

START_TEST(huge_shape_is_refused) {
    char p[512];
    tmp_path("huge.h5", p, sizeof p);
    hid_t f;
    PL_CK_OK(pl_h5_create(p, &f));
    pl_h5_lock();
    hsize_t dims[2] = {(hsize_t)1 << 40, (hsize_t)1 << 30}, chunk[2] = {1, 16};
    hid_t sp = H5Screate_simple(2, dims, NULL), pl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_chunk(pl, 2, chunk);
    hid_t d = H5Dcreate2(f, "big", H5T_IEEE_F32LE, sp, H5P_DEFAULT, pl, H5P_DEFAULT);
    ck_assert_int_ge(d, 0);
    H5Pclose(pl);
    H5Sclose(sp);
    pl_h5_info in;
    ck_assert_int_eq(pl_h5_dataset_info(p, "big", d, 4, &in), PL_ERR_SHAPE);
    ck_assert_msg(strstr(pl_error_message(), "'big' is too large"), "%s", pl_error_message());
    H5Dclose(d);
    /* an empty axis 0 bounds nothing: [0, 2^61, 2^44] has no element but a
     * row of 2^105 (found by fuzz_hdf5: hdf5_chunk's row size overflowed) */
    hsize_t dims3[3] = {0, (hsize_t)1 << 61, (hsize_t)1 << 44}, max3[3], chunk3[3] = {1, 1, 1};
    for (int i = 0; i < 3; i++)
        max3[i] = H5S_UNLIMITED;
    sp = H5Screate_simple(3, dims3, max3);
    pl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_chunk(pl, 3, chunk3);
    d = H5Dcreate2(f, "hollow_rows", H5T_IEEE_F32LE, sp, H5P_DEFAULT, pl, H5P_DEFAULT);
    ck_assert_int_ge(d, 0);
    H5Pclose(pl);
    H5Sclose(sp);
    ck_assert_int_eq(pl_h5_dataset_info(p, "hollow_rows", d, 4, &in), PL_ERR_SHAPE);
    ck_assert_msg(strstr(pl_error_message(), "'hollow_rows' is too large (axis 1"), "%s",
                  pl_error_message());
    H5Dclose(d);
    pl_h5_unlock();
    PL_CK_OK(pl_h5_close(p, f));
}
END_TEST

/* A shape with no data behind it (a 1 GiB declared dataset in a small file,
 * chunks never written; or only some written) is refused naming the
 * dataset and the declared shape, before anything is allocated for it. */
START_TEST(declared_shape_without_data_is_refused) {
    char p[512];
    tmp_path("hollow.h5", p, sizeof p);
    hid_t f;
    PL_CK_OK(pl_h5_create(p, &f));
    pl_h5_lock();
    hsize_t dims[2] = {(hsize_t)1 << 22, 64}, chunk[2] = {1024, 64};
    hid_t sp = H5Screate_simple(2, dims, NULL), pl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_chunk(pl, 2, chunk);
    hid_t d = H5Dcreate2(f, "hollow", H5T_IEEE_F32LE, sp, H5P_DEFAULT, pl, H5P_DEFAULT);
    hid_t d2 = H5Dcreate2(f, "partial", H5T_IEEE_F32LE, sp, H5P_DEFAULT, pl, H5P_DEFAULT);
    ck_assert_int_ge(d, 0);
    ck_assert_int_ge(d2, 0);
    static float rows[1024 * 64];
    hsize_t start[2] = {0, 0}, cnt[2] = {1024, 64};
    hid_t ms = H5Screate_simple(2, cnt, NULL);
    H5Sselect_hyperslab(sp, H5S_SELECT_SET, start, NULL, cnt, NULL);
    ck_assert_int_ge(H5Dwrite(d2, H5T_NATIVE_FLOAT, ms, sp, H5P_DEFAULT, rows), 0);
    H5Sclose(ms);
    H5Pclose(pl);
    H5Sclose(sp);
    pl_h5_info in;
    ck_assert_int_eq(pl_h5_dataset_info(p, "hollow", d, 4, &in), PL_ERR_IO);
    ck_assert_msg(strstr(pl_error_message(), "'hollow' declares shape [4194304, 64]") &&
                      strstr(pl_error_message(), "stores none of its data"), "%s", pl_error_message());
    ck_assert_int_eq(pl_h5_dataset_info(p, "partial", d2, 4, &in), PL_ERR_IO);
    ck_assert_msg(strstr(pl_error_message(), "only 1 of its 4096 chunks"), "%s", pl_error_message());
    H5Dclose(d);
    H5Dclose(d2);
    pl_h5_unlock();
    PL_CK_OK(pl_h5_close(p, f));
}
END_TEST

/* Storage the declared-shape check cannot see (issue 34): a virtual dataset
 * whose source file is missing, external raw storage shorter than declared
 * or on /dev/zero read as fill values. Refused at open (and by
 * pl_h5_dataset_info for a dataset opened directly), naming file, dataset
 * and the other file. */
START_TEST(virtual_and_external_storage_is_refused) {
    char p[512], bin[512];
    tmp_path("layouts.h5", p, sizeof p);
    tmp_path("short.bin", bin, sizeof bin);
    FILE *b = fopen(bin, "wb");
    ck_assert_ptr_nonnull(b);
    fwrite((float[5]){1, 2, 3, 4, 5}, 4, 5, b); /* 20 of the 80 bytes declared */
    fclose(b);
    hid_t f;
    PL_CK_OK(pl_h5_create(p, &f));
    pl_h5_lock();
    hsize_t dims[2] = {10, 2};
    hid_t sp = H5Screate_simple(2, dims, NULL);
    hid_t pv = H5Pcreate(H5P_DATASET_CREATE), pe = H5Pcreate(H5P_DATASET_CREATE),
          pz = H5Pcreate(H5P_DATASET_CREATE);
    ck_assert_int_ge(H5Pset_virtual(pv, sp, "missing_source.h5", "/x", sp), 0);
    ck_assert_int_ge(H5Pset_external(pe, bin, 0, 80), 0);
    ck_assert_int_ge(H5Pset_external(pz, "/dev/zero", 0, 80), 0);
    const char *names[3] = {"vds", "ext", "zero"};
    hid_t pls[3] = {pv, pe, pz};
    for (int i = 0; i < 3; i++) {
        hid_t d = H5Dcreate2(f, names[i], H5T_IEEE_F32LE, sp, H5P_DEFAULT, pls[i], H5P_DEFAULT);
        ck_assert_int_ge(d, 0);
        H5Dclose(d);
        H5Pclose(pls[i]);
    }
    H5Sclose(sp);
    pl_h5_unlock();
    PL_CK_OK(pl_h5_close(p, f));

    PL_CK_OK(pl_h5_open_read(p, NULL, &f));
    const char *want[3] = {"is a virtual dataset", "keeps its data in 1 external file",
                           "keeps its data in 1 external file"};
    const char *other[3] = {"missing_source.h5", bin, "/dev/zero"};
    for (int i = 0; i < 3; i++) {
        hid_t d = 0;
        ck_assert_int_eq(pl_h5_dataset_open(p, f, names[i], &d), PL_ERR_IO);
        ck_assert_int_lt(d, 0);
        const char *m = pl_error_message();
        ck_assert_msg(strstr(m, p) && strstr(m, names[i]) && strstr(m, want[i]) &&
                          strstr(m, other[i]) && strstr(m, "h5repack -l CONTI"),
                      "%s", m);
        void *buf = NULL;
        ck_assert_int_eq(pl_h5_read_alloc(p, f, names[i], H5T_NATIVE_FLOAT, 2, 2, NULL, &buf, NULL),
                         PL_ERR_IO);
        ck_assert_ptr_null(buf);
        /* opened by hand: the shape check refuses it too */
        pl_h5_lock();
        d = H5Dopen2(f, names[i], H5P_DEFAULT);
        ck_assert_int_ge(d, 0);
        pl_h5_info in;
        ck_assert_int_eq(pl_h5_dataset_info(p, names[i], d, 4, &in), PL_ERR_IO);
        ck_assert_msg(strstr(pl_error_message(), want[i]), "%s", pl_error_message());
        H5Dclose(d);
        pl_h5_unlock();
    }
    PL_CK_OK(pl_h5_close(p, f));
}
END_TEST

/* NaN / Inf: first one by row and column (the index beyond rank 2), the
 * count, used columns only; integer dtypes are not checked */
START_TEST(check_finite_names_row_column_and_count) {
    float x[2 * 3 * 2] = {0};
    const int64_t dims[3] = {2, 3, 2};
    PL_CK_OK(pl_h5_check_finite("f.h5", "/x", PL_F32, x, 10, 2, 3, dims, NULL, NULL, 0));
    x[1 * 6 + 2 * 2 + 1] = NAN; /* row 1, element [2][1] */
    x[1 * 6 + 0] = INFINITY;    /* row 1, element [0][0] comes first */
    ck_assert_int_eq(pl_h5_check_finite("f.h5", "/x", PL_F32, x, 10, 2, 3, dims, NULL, NULL, 0),
                     PL_ERR_INVALID);
    const char *m = pl_error_message();
    ck_assert_msg(strstr(m, "f.h5: dataset '/x' row 11, column 0 (index [11][0][0]) is inf") &&
                      strstr(m, "2 non-finite values in rows 10..11"),
                  "%s", m);
    const double d[4] = {1, 2, NAN, 4};
    const int64_t d2[2] = {2, 2};
    const bool use[2] = {true, false};
    const char names[2][64] = {"a", "b"};
    PL_CK_OK(pl_h5_check_finite("f.h5", "/d", PL_F64, d, 0, 2, 2, d2, (const bool[]){false, true},
                                names, 2));
    ck_assert_int_eq(pl_h5_check_finite("f.h5", "/d", PL_F64, d, 0, 2, 2, d2, use, names, 2),
                     PL_ERR_INVALID);
    ck_assert_msg(strstr(pl_error_message(), "dataset '/d' row 1, column 0 ('a') is nan"), "%s",
                  pl_error_message());
    PL_CK_OK(pl_h5_check_finite("f.h5", "/i", PL_I64, d, 0, 2, 2, d2, NULL, NULL, 0));
}
END_TEST

/* String-list attributes as h5py writes them: a scalar "a,b" (variable or
 * fixed length) or a 1-D array of strings; absent -> 0 names; anything else,
 * too many names or an empty one -> an error naming file, object, attribute. */
static void write_str_attr(hid_t obj, const char *name, bool vlen, int n, const char **v) {
    hid_t t = H5Tcopy(H5T_C_S1);
    size_t len = 1;
    for (int i = 0; i < (n ? n : 1); i++)
        len = strlen(v[i]) + 1 > len ? strlen(v[i]) + 1 : len;
    H5Tset_size(t, vlen ? H5T_VARIABLE : len);
    hsize_t d = (hsize_t)n;
    hid_t sp = n == 0 ? H5Screate(H5S_SCALAR) : H5Screate_simple(1, &d, NULL);
    hid_t a = H5Acreate2(obj, name, t, sp, H5P_DEFAULT, H5P_DEFAULT);
    ck_assert(a >= 0);
    if (vlen) {
        ck_assert(H5Awrite(a, t, n == 0 ? (const void *)&v[0] : (const void *)v) >= 0);
    } else {
        char *buf = calloc((size_t)(n ? n : 1), len);
        for (int i = 0; i < (n ? n : 1); i++)
            memcpy(buf + (size_t)i * len, v[i], strlen(v[i]));
        ck_assert(H5Awrite(a, t, buf) >= 0);
        free(buf);
    }
    H5Aclose(a);
    H5Sclose(sp);
    H5Tclose(t);
}

START_TEST(attr_names_scalar_list_or_array) {
    char p[512];
    tmp_path("names.h5", p, sizeof p);
    hid_t f;
    PL_CK_OK(pl_h5_create(p, &f));
    hsize_t one = 1;
    hid_t sp = H5Screate_simple(1, &one, NULL);
    hid_t ds = H5Dcreate2(f, "x", H5T_NATIVE_FLOAT, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    write_str_attr(ds, "vscalar", true, 0, (const char *[]){"ret_1d, ret_5d,vol_20d"});
    write_str_attr(ds, "fscalar", false, 0, (const char *[]){"a,b"});
    write_str_attr(ds, "varray", true, 2, (const char *[]){"u", "v,w"});
    write_str_attr(ds, "farray", false, 3, (const char *[]){"p", "qq", "r"});
    write_str_attr(ds, "empty", true, 0, (const char *[]){"a,,b"});
    PL_CK_OK(pl_h5_attr_write_int(p, ds, "num", 3));
    H5Dclose(ds);
    H5Sclose(sp);
    char names[4][64];
    int n = -1;
    PL_CK_OK(pl_h5_attr_read_names(p, f, "x", "vscalar", names, 4, &n));
    ck_assert_int_eq(n, 3);
    ck_assert_str_eq(names[0], "ret_1d");
    ck_assert_str_eq(names[1], "ret_5d");
    ck_assert_str_eq(names[2], "vol_20d");
    PL_CK_OK(pl_h5_attr_read_names(p, f, "x", "fscalar", names, 4, &n));
    ck_assert_int_eq(n, 2);
    ck_assert_str_eq(names[1], "b");
    PL_CK_OK(pl_h5_attr_read_names(p, f, "x", "varray", names, 4, &n));
    ck_assert_int_eq(n, 2);
    ck_assert_str_eq(names[1], "v,w"); /* an array entry is one name */
    PL_CK_OK(pl_h5_attr_read_names(p, f, "x", "farray", names, 4, &n));
    ck_assert_int_eq(n, 3);
    ck_assert_str_eq(names[1], "qq");
    PL_CK_OK(pl_h5_attr_read_names(p, f, "x", "absent", names, 4, &n));
    ck_assert_int_eq(n, 0);
    ck_assert_int_eq(pl_h5_attr_read_names(p, f, "x", "vscalar", names, 2, &n), PL_ERR_IO);
    ck_assert_msg(strstr(pl_error_message(), p) &&
                      strstr(pl_error_message(), "attribute 'vscalar' of 'x' holds more than 2"),
                  "%s", pl_error_message());
    ck_assert_int_eq(n, 0);
    ck_assert_int_eq(pl_h5_attr_read_names(p, f, "x", "empty", names, 4, &n), PL_ERR_IO);
    ck_assert_msg(strstr(pl_error_message(), "attribute 'empty' of 'x': name 1 is empty"), "%s",
                  pl_error_message());
    ck_assert_int_eq(pl_h5_attr_read_names(p, f, "x", "num", names, 4, &n), PL_ERR_IO);
    ck_assert_msg(strstr(pl_error_message(), "attribute 'num' of 'x' is not a string"), "%s",
                  pl_error_message());
    PL_CK_OK(pl_h5_close(p, f));
}
END_TEST



/* A full disk during a write (issue 34, class 1): the file size limit makes
 * every write past 64 KiB fail as ENOSPC would. The append reports the
 * failure naming the file, the abort closes what HDF5 still holds, and the
 * process then exits cleanly: HDF5's atexit close used to find the failed file
 * still open and crash in H5F__close_cb (SIGSEGV after the error was printed,
 * so no summary.json). Run in a child, whose exit is the assertion. */
static int write_until_full(const char *p) {
    struct rlimit rl = {64 << 10, 64 << 10};
    signal(SIGXFSZ, SIG_IGN);
    if (setrlimit(RLIMIT_FSIZE, &rl)) return 10;
    pl_h5_out *o = NULL;
    if (pl_h5_out_new(p, NULL, &o)) return 11;
    int64_t shape[2] = {1024, 64};
    pl_tensor *t = pl_tensor_zeros(PL_F32, 2, shape, PL_CPU);
    if (!t) return 12;
    pl_status st = PL_OK;
    for (int i = 0; i < 64 && !st; i++)
        st = pl_h5_out_append(o, "logits", t);
    pl_tensor_release(t);
    if (!st) st = pl_h5_out_finish(&o, "test");
    if (!st) return 13; /* 16 MiB fit under a 64 KiB limit? */
    if (!strstr(pl_error_message(), p)) return 14;
    pl_h5_out_free(&o);
    return 0;
}

START_TEST(full_disk_during_write_fails_cleanly) {
    char p[512];
    tmp_path("full.h5", p, sizeof p);
    fflush(NULL);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) exit(write_until_full(p)); /* exit(): HDF5's atexit handlers run */
    int status = 0;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(WIFEXITED(status), "the writer died of signal %d",
                  WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    ck_assert_msg(WEXITSTATUS(status) == 0, "the writer exited %d", WEXITSTATUS(status));
}
END_TEST

int main(void) {
    Suite *s = suite_create("pl_h5");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, lock_is_one_instance_across_plugins);
    tcase_add_test(tc, lock_is_recursive);
    tcase_add_test(tc, open_errors_name_the_file);
    tcase_add_test(tc, damaged_files_say_truncated_or_not_hdf5);
    tcase_add_test(tc, write_rows_then_read_back);
    tcase_add_test(tc, out_new_finish_free);
    tcase_add_test(tc, outputs_write_the_named_tensors);
    tcase_add_test(tc, huge_shape_is_refused);
    tcase_add_test(tc, declared_shape_without_data_is_refused);
    tcase_add_test(tc, virtual_and_external_storage_is_refused);
    tcase_add_test(tc, check_finite_names_row_column_and_count);
    tcase_add_test(tc, attr_names_scalar_list_or_array);
    tcase_add_test(tc, full_disk_during_write_fails_cleanly);
    suite_add_tcase(s, tc);
    return pl_test_run(s);
}
