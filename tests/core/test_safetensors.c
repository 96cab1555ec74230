/* test_safetensors.c - safetensors reader/writer: round trip of every dtype,
 * refusal of corrupt files with a message naming what is wrong, load_into
 * conversions and shape errors, crash safety of commit (SIGKILL mid-write),
 * and interoperability with the Python `safetensors` package
 * (tools/st_interop.py). */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "pl_test.h"
#include "pipeline/safetensors.h"
#include "crash_handler.h"

/* ---- helpers -------------------------------------------------------------- */

static char g_dir[256];

static void dir_setup(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/pl_st_test_XXXXXX");
    ck_assert_msg(mkdtemp(g_dir) != NULL, "mkdtemp: %s", strerror(errno));
}
static void dir_teardown(void) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", g_dir);
}
static const char *tpath(const char *name, char *buf) {
    snprintf(buf, 512, "%s/%s", g_dir, name);
    return buf;
}

/* Write a file from a header string and a data section (no padding). */
static void write_raw(const char *path, const char *json, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    uint64_t h = strlen(json);
    uint8_t lb[8];
    for (int i = 0; i < 8; i++) lb[i] = (uint8_t)(h >> (8 * i));
    ck_assert_int_eq(fwrite(lb, 1, 8, f), 8);
    ck_assert_int_eq(fwrite(json, 1, h, f), h);
    if (n) ck_assert_int_eq(fwrite(data, 1, n, f), n);
    fclose(f);
}

/* Open must fail with PL_ERR_IO and a message containing every needle. */
static void expect_refused(const char *path, const char *const *needles) {
    pl_st_file *f = (pl_st_file *)0x1;
    pl_status s = pl_st_open(path, &f);
    ck_assert_msg(s == PL_ERR_IO, "expected PL_ERR_IO opening %s, got %s (%s)", path,
                  pl_status_name(s), pl_error_message());
    ck_assert_ptr_null(f);
    const char *m = pl_error_message();
    ck_assert_msg(strstr(m, path) != NULL, "message does not name the path: %s", m);
    for (int i = 0; needles[i]; i++)
        ck_assert_msg(strstr(m, needles[i]) != NULL, "message lacks '%s': %s", needles[i], m);
}
#define REFUSED(path, ...) expect_refused(path, (const char *const[]){__VA_ARGS__, NULL})

/* The reference tensors shared with tools/st_interop.py (see its docstring). */
static double ref_value(const char *name, pl_dtype dt, int64_t i) {
    if (!strcmp(name, "g_scl")) return 42.5;
    switch (dt) {
    case PL_F32: case PL_F16: case PL_F64: case PL_BF16: return (double)(i % 13) * 0.25 - 1.5;
    case PL_I32: return (double)(i * 1000 - 3000);
    case PL_U8: return (double)((i * 37) % 256);
    default: return NAN; /* I64 checked exactly below */
    }
}
static int64_t ref_i64(int64_t i) { return i * ((int64_t)1 << 40) - 5; }

typedef struct {
    const char *name;
    pl_dtype dt;
    int ndim;
    int64_t shape[3];
} ref_spec;
static const ref_spec REF[] = {
    {"a_f32", PL_F32, 3, {2, 3, 4}}, {"b_f16", PL_F16, 1, {5}},   {"c_f64", PL_F64, 2, {3, 2}},
    {"d_i32", PL_I32, 1, {7}},       {"e_i64", PL_I64, 2, {2, 2}}, {"f_u8", PL_U8, 1, {10}},
    {"g_scl", PL_F32, 0, {0}},       {"h_emp", PL_F32, 2, {0, 3}}, {"i_bf16", PL_BF16, 2, {3, 3}},
};
#define N_REF ((int)(sizeof REF / sizeof REF[0]))

/* Build reference tensor k: values stored through f64 -> dtype by the core's
 * own conversion is avoided; fill raw host buffers here. */
static pl_tensor *ref_tensor(int k) {
    const ref_spec *r = &REF[k];
    int64_t n = 1;
    for (int d = 0; d < r->ndim; d++) n *= r->shape[d];
    size_t es = pl_dtype_size(r->dt);
    uint8_t *buf = calloc((size_t)(n ? n : 1), es);
    for (int64_t i = 0; i < n; i++) {
        double v = ref_value(r->name, r->dt, i);
        switch (r->dt) {
        case PL_F32: ((float *)buf)[i] = (float)v; break;
        case PL_F64: ((double *)buf)[i] = v; break;
        case PL_F16: ((uint16_t *)buf)[i] = pl_f32_to_f16((float)v); break;
        case PL_BF16: ((uint16_t *)buf)[i] = pl_f32_to_bf16((float)v); break;
        case PL_I32: ((int32_t *)buf)[i] = (int32_t)v; break;
        case PL_I64: ((int64_t *)buf)[i] = ref_i64(i); break;
        case PL_U8: buf[i] = (uint8_t)v; break;
        default: break;
        }
    }
    pl_tensor *t = pl_tensor_from_data(r->dt, r->ndim, r->shape, buf, PL_CPU);
    free(buf);
    return t;
}

/* Check a loaded tensor against reference k: dtype, shape, every value. */
static void check_ref(const pl_tensor *t, int k) {
    const ref_spec *r = &REF[k];
    ck_assert_msg(t->dtype == r->dt, "%s: dtype %s, expected %s", r->name, pl_dtype_name(t->dtype),
                  pl_dtype_name(r->dt));
    ck_assert_int_eq(t->ndim, r->ndim);
    for (int d = 0; d < r->ndim; d++) ck_assert_int_eq(t->shape[d], r->shape[d]);
    int64_t n = pl_tensor_numel(t);
    const void *p = pl_tensor_data(t);
    for (int64_t i = 0; i < n; i++) {
        if (r->dt == PL_I64) {
            ck_assert_msg(((const int64_t *)p)[i] == ref_i64(i), "%s[%lld]", r->name, (long long)i);
            continue;
        }
        double got = pl_tensor_get(t, i), want = ref_value(r->name, r->dt, i);
        ck_assert_msg(got == want, "%s[%lld] = %g, expected %g", r->name, (long long)i, got, want);
    }
}

static const char *NOTE = "quote \" and unicode \xc3\xbc";

static void write_ref_file(const char *path, int with_bf16) {
    pl_st_writer *w = PL_CK_NOTNULL(pl_st_writer_new(path));
    for (int k = 0; k < N_REF; k++) {
        if (!with_bf16 && REF[k].dt == PL_BF16) continue;
        pl_tensor *t = PL_CK_NOTNULL(ref_tensor(k));
        PL_CK_OK(pl_st_writer_add(w, REF[k].name, t));
        pl_tensor_release(t);
    }
    PL_CK_OK(pl_st_writer_meta(w, "producer", "pipeline"));
    PL_CK_OK(pl_st_writer_meta(w, "note", NOTE));
    PL_CK_OK(pl_st_writer_commit(w));
    pl_st_writer_free(w);
}

/* ---- round trip ------------------------------------------------------------- */

START_TEST(round_trip_every_dtype_with_metadata) {
    char p[512];
    tpath("rt.safetensors", p);
    write_ref_file(p, 1);

    /* on-disk layout: header padded with spaces to a multiple of 8 */
    FILE *fp = fopen(p, "rb");
    uint8_t lb[8];
    ck_assert_int_eq(fread(lb, 1, 8, fp), 8);
    uint64_t h = 0;
    for (int i = 0; i < 8; i++) h |= (uint64_t)lb[i] << (8 * i);
    ck_assert_msg(h % 8 == 0, "header length %llu not a multiple of 8", (unsigned long long)h);
    char *hdr = calloc(h + 1, 1);
    ck_assert_int_eq(fread(hdr, 1, h, fp), h);
    fclose(fp);
    ck_assert_ptr_nonnull(strstr(hdr, "\"a_f32\":{\"dtype\":\"F32\",\"shape\":[2,3,4],"
                                      "\"data_offsets\":[0,96]}"));
    ck_assert_ptr_nonnull(strstr(hdr, "\"i_bf16\":{\"dtype\":\"BF16\""));
    free(hdr);

    pl_st_file *f = NULL;
    PL_CK_OK(pl_st_open(p, &f));
    ck_assert_int_eq(pl_st_count(f), N_REF);
    for (int k = 0; k < N_REF; k++) {
        ck_assert_str_eq(pl_st_name_at(f, k), REF[k].name); /* order added */
        pl_dtype dt;
        int nd;
        int64_t shape[PL_MAX_DIMS];
        PL_CK_OK(pl_st_info(f, REF[k].name, &dt, &nd, shape));
        ck_assert_int_eq(dt, REF[k].dt);
        ck_assert_int_eq(nd, REF[k].ndim);
        pl_tensor *t = PL_CK_NOTNULL(pl_st_load(f, REF[k].name));
        ck_assert(t->device.type == PL_DEVICE_CPU);
        check_ref(t, k);
        pl_tensor_release(t);
    }
    ck_assert_ptr_null(pl_st_name_at(f, N_REF));
    ck_assert_str_eq(pl_st_meta(f, "producer"), "pipeline");
    ck_assert_str_eq(pl_st_meta(f, "note"), NOTE);
    ck_assert_ptr_null(pl_st_meta(f, "absent"));
    ck_assert_ptr_null(pl_st_load(f, "absent"));
    ck_assert_ptr_nonnull(strstr(pl_error_message(), "absent"));
    ck_assert_int_eq(pl_st_info(f, "absent", NULL, NULL, NULL), PL_ERR_INVALID);
    pl_st_close(f);
}
END_TEST

START_TEST(strided_view_and_nf4_round_trip) {
    char p[512];
    tpath("view.safetensors", p);
    /* a narrow() view along dim 1 is written as its logical contents */
    float base[12];
    for (int i = 0; i < 12; i++) base[i] = (float)i;
    pl_tensor *b = pl_tensor_from_data(PL_F32, PL_SHAPE(3, 4), base, PL_CPU);
    pl_tensor *v = PL_CK_NOTNULL(pl_tensor_narrow(b, 1, 1, 2)); /* [[1,2],[5,6],[9,10]] */
    uint8_t codes[4] = {0x21, 0x43, 0x65, 0x07};
    pl_tensor *q = PL_CK_NOTNULL(pl_tensor_empty(PL_NF4, PL_SHAPE(7), PL_CPU));
    memcpy(pl_tensor_data(q), codes, 4);
    pl_st_writer *w = PL_CK_NOTNULL(pl_st_writer_new(p));
    PL_CK_OK(pl_st_writer_add(w, "v", v));
    PL_CK_OK(pl_st_writer_add(w, "q", q));
    ck_assert_int_eq(pl_st_writer_add(w, "v", v), PL_ERR_INVALID); /* duplicate */
    ck_assert_ptr_nonnull(strstr(pl_error_message(), "'v'"));
    PL_CK_OK(pl_st_writer_commit(w));
    pl_st_writer_free(w);

    pl_st_file *f = NULL;
    PL_CK_OK(pl_st_open(p, &f));
    pl_tensor *lv = PL_CK_NOTNULL(pl_st_load(f, "v"));
    const float want[6] = {1, 2, 5, 6, 9, 10};
    ck_assert_int_eq(lv->ndim, 2);
    ck_assert_int_eq(lv->shape[0], 3);
    ck_assert_int_eq(lv->shape[1], 2);
    for (int i = 0; i < 6; i++) ck_assert_float_eq(pl_tensor_f32(lv)[i], want[i]);
    /* nf4 stored as U8 [ceil(7/2)] = [4] */
    pl_dtype dt;
    int nd;
    int64_t sh[PL_MAX_DIMS];
    PL_CK_OK(pl_st_info(f, "q", &dt, &nd, sh));
    ck_assert_int_eq(dt, PL_U8);
    ck_assert_int_eq(nd, 1);
    ck_assert_int_eq(sh[0], 4);
    pl_tensor *q2 = PL_CK_NOTNULL(pl_tensor_empty(PL_NF4, PL_SHAPE(7), PL_CPU));
    memset(pl_tensor_data(q2), 0, 4);
    PL_CK_OK(pl_st_load_into(f, "q", q2));
    ck_assert_mem_eq(pl_tensor_data(q2), codes, 4);
    pl_tensor *q3 = PL_CK_NOTNULL(pl_tensor_empty(PL_NF4, PL_SHAPE(9), PL_CPU));
    ck_assert_int_eq(pl_st_load_into(f, "q", q3), PL_ERR_SHAPE);
    ck_assert_ptr_nonnull(strstr(pl_error_message(), "U8 [5]"));
    ck_assert_ptr_nonnull(strstr(pl_error_message(), "[4]"));
    pl_st_close(f);
    pl_tensor_release(lv);
    pl_tensor_release(v);
    pl_tensor_release(b);
    pl_tensor_release(q);
    pl_tensor_release(q2);
    pl_tensor_release(q3);
}
END_TEST

START_TEST(load_into_converts_float_dtypes) {
    char p[512];
    tpath("conv.safetensors", p);
    write_ref_file(p, 1);
    pl_st_file *f = NULL;
    PL_CK_OK(pl_st_open(p, &f));
    /* F32 [2,3,4] into bf16, BF16 [3,3] into f32, F16 into f32: values are
     * multiples of 0.25 in [-1.5, 1.5], exact in every float dtype */
    pl_tensor *d1 = PL_CK_NOTNULL(pl_tensor_zeros(PL_BF16, PL_SHAPE(2, 3, 4), PL_CPU));
    pl_tensor *d2 = PL_CK_NOTNULL(pl_tensor_zeros(PL_F32, PL_SHAPE(3, 3), PL_CPU));
    pl_tensor *d3 = PL_CK_NOTNULL(pl_tensor_zeros(PL_F32, PL_SHAPE(5), PL_CPU));
    PL_CK_OK(pl_st_load_into(f, "a_f32", d1));
    PL_CK_OK(pl_st_load_into(f, "i_bf16", d2));
    PL_CK_OK(pl_st_load_into(f, "b_f16", d3));
    for (int64_t i = 0; i < 24; i++) ck_assert(pl_tensor_get(d1, i) == (i % 13) * 0.25 - 1.5);
    for (int64_t i = 0; i < 9; i++) ck_assert(pl_tensor_get(d2, i) == (i % 13) * 0.25 - 1.5);
    for (int64_t i = 0; i < 5; i++) ck_assert(pl_tensor_get(d3, i) == (i % 13) * 0.25 - 1.5);
    /* integer <-> float is refused */
    pl_tensor *d4 = PL_CK_NOTNULL(pl_tensor_zeros(PL_F32, PL_SHAPE(7), PL_CPU));
    ck_assert_int_eq(pl_st_load_into(f, "d_i32", d4), PL_ERR_DTYPE);
    ck_assert_ptr_nonnull(strstr(pl_error_message(), "d_i32"));
    pl_tensor_release(d1);
    pl_tensor_release(d2);
    pl_tensor_release(d3);
    pl_tensor_release(d4);
    pl_st_close(f);
}
END_TEST

START_TEST(load_into_shape_mismatch_names_both_shapes) {
    char p[512];
    tpath("shape.safetensors", p);
    float data[6] = {1, 2, 3, 4, 5, 6};
    pl_tensor *t = pl_tensor_from_data(PL_F32, PL_SHAPE(2, 3), data, PL_CPU);
    pl_st_writer *w = PL_CK_NOTNULL(pl_st_writer_new(p));
    PL_CK_OK(pl_st_writer_add(w, "layer.weight", t));
    PL_CK_OK(pl_st_writer_commit(w));
    pl_st_writer_free(w);
    pl_st_file *f = NULL;
    PL_CK_OK(pl_st_open(p, &f));
    pl_tensor *dst = PL_CK_NOTNULL(pl_tensor_zeros(PL_F32, PL_SHAPE(3, 2), PL_CPU));
    ck_assert_int_eq(pl_st_load_into(f, "layer.weight", dst), PL_ERR_SHAPE);
    const char *m = pl_error_message();
    ck_assert_msg(strstr(m, "layer.weight") && strstr(m, "expected [3, 2]") &&
                      strstr(m, "found [2, 3]"), "message: %s", m);
    /* dst untouched */
    for (int i = 0; i < 6; i++) ck_assert_float_eq(pl_tensor_f32(dst)[i], 0.0f);
    pl_tensor_release(dst);
    pl_tensor_release(t);
    pl_st_close(f);
}
END_TEST

/* ---- zero-copy views ---------------------------------------------------------- */

START_TEST(view_equals_load_for_every_dtype) {
    char p[512];
    tpath("view.safetensors", p);
    write_ref_file(p, 1);
    pl_st_file *f = NULL;
    PL_CK_OK(pl_st_open(p, &f));
    for (int k = 0; k < N_REF; k++) {
        pl_tensor *v = PL_CK_NOTNULL(pl_st_view(f, REF[k].name));
        pl_tensor *l = PL_CK_NOTNULL(pl_st_load(f, REF[k].name));
        ck_assert(v->device.type == PL_DEVICE_CPU);
        ck_assert(pl_tensor_is_contiguous(v));
        ck_assert_str_eq(v->name, REF[k].name);
        /* the writer pads the header to 8 bytes but packs tensors back to
         * back: a_f32 (offset 0) is a view, c_f64 (offset 96 + 10) is not
         * aligned for f64 and comes back as a copy */
        if (!strcmp(REF[k].name, "a_f32"))
            ck_assert_msg(v->storage->external, "a_f32: copied, expected a view");
        if (!strcmp(REF[k].name, "c_f64"))
            ck_assert_msg(!v->storage->external, "c_f64: viewed at a misaligned address");
        check_ref(v, k);
        ck_assert_int_eq(pl_tensor_nbytes(v), pl_tensor_nbytes(l));
        if (pl_tensor_nbytes(v))
            ck_assert(!memcmp(pl_tensor_data(v), pl_tensor_data(l), pl_tensor_nbytes(v)));
        pl_tensor_release(l);
        pl_tensor_release(v);
    }
    ck_assert_ptr_null(pl_st_view(f, "absent"));
    ck_assert_int_eq(pl_error_status(), PL_ERR_INVALID);
    ck_assert_ptr_nonnull(strstr(pl_error_message(), p));
    ck_assert_ptr_nonnull(strstr(pl_error_message(), "'absent'"));
    pl_st_close(f);
}
END_TEST

START_TEST(view_outlives_close_and_is_not_adopted_by_a_frame) {
    char p[512];
    tpath("outlive.safetensors", p);
    write_ref_file(p, 1);
    pl_st_file *f = NULL;
    PL_CK_OK(pl_st_open(p, &f));
    pl_frame_begin();
    pl_tensor *a = PL_CK_NOTNULL(pl_st_view(f, "a_f32"));
    pl_tensor *b = PL_CK_NOTNULL(pl_st_view(f, "i_bf16"));
    pl_frame_end(); /* the views are ours, not the frame's */
    pl_st_close(f);
    check_ref(a, 0);
    check_ref(b, N_REF - 1);
    pl_tensor_release(a);
    check_ref(b, N_REF - 1); /* the mapping lives while one view does */
    pl_tensor_release(b);
}
END_TEST

START_TEST(writing_into_a_view_never_reaches_the_file) {
    char p[512];
    tpath("cow.safetensors", p);
    write_ref_file(p, 1);
    pl_st_file *f = NULL;
    PL_CK_OK(pl_st_open(p, &f));
    pl_tensor *v = PL_CK_NOTNULL(pl_st_view(f, "a_f32"));
    float *d = pl_tensor_f32(v);
    for (int64_t i = 0; i < pl_tensor_numel(v); i++) d[i] = 1234.5f;
    ck_assert(pl_tensor_get(v, 3) == 1234.5);
    pl_tensor_release(v);
    pl_st_close(f);
    PL_CK_OK(pl_st_open(p, &f));
    pl_tensor *l = PL_CK_NOTNULL(pl_st_load(f, "a_f32"));
    check_ref(l, 0);
    pl_tensor_release(l);
    pl_st_close(f);
}
END_TEST

START_TEST(misaligned_tensor_is_copied_not_viewed) {
    /* a header of odd length (no padding) puts the data section on an odd
     * address: an f32 there cannot be viewed */
    char p[512];
    tpath("odd.safetensors", p);
    char json[128];
    snprintf(json, sizeof json, "{\"x\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,12]}}");
    if (strlen(json) % 2 == 0) strcat(json, " ");
    float vals[3] = {1.5f, -2.25f, 3.0f};
    write_raw(p, json, vals, sizeof vals);
    pl_st_file *f = NULL;
    PL_CK_OK(pl_st_open(p, &f));
    pl_tensor *v = PL_CK_NOTNULL(pl_st_view(f, "x"));
    ck_assert(!v->storage->external); /* a copy in allocator memory */
    ck_assert_int_eq(v->dtype, PL_F32);
    for (int i = 0; i < 3; i++) ck_assert(pl_tensor_get(v, i) == vals[i]);
    pl_st_close(f);
    ck_assert(pl_tensor_get(v, 1) == vals[1]);
    pl_tensor_release(v);
}
END_TEST

/* Resident file-backed memory of this process in bytes (RssFile; VmRSS on
 * kernels without it); -1 where /proc is absent. */
static long long rss_file_bytes(void) {
    FILE *fp = fopen("/proc/self/status", "r");
    if (!fp) return -1;
    char line[256];
    long long file = -1, vm = -1;
    while (fgets(line, sizeof line, fp)) {
        long long kb;
        if (sscanf(line, "RssFile: %lld kB", &kb) == 1) file = kb * 1024;
        if (sscanf(line, "VmRSS: %lld kB", &kb) == 1) vm = kb * 1024;
    }
    fclose(fp);
    return file >= 0 ? file : vm;
}

START_TEST(releasing_a_view_drops_its_resident_pages) {
    char p[512];
    tpath("big.safetensors", p);
    const int64_t n = 16 * 1024 * 1024; /* 64 MiB of f32 */
    pl_tensor *w = PL_CK_NOTNULL(pl_tensor_empty_owned(PL_F32, PL_SHAPE(n), PL_CPU));
    float *wd = pl_tensor_f32(w);
    for (int64_t i = 0; i < n; i++) wd[i] = (float)(i & 1023);
    pl_st_writer *wr = PL_CK_NOTNULL(pl_st_writer_new(p));
    PL_CK_OK(pl_st_writer_add(wr, "big", w));
    PL_CK_OK(pl_st_writer_commit(wr));
    pl_st_writer_free(wr);
    pl_tensor_release(w);

    pl_st_file *f = NULL;
    PL_CK_OK(pl_st_open(p, &f));
    long long r0 = rss_file_bytes();
    if (r0 < 0) {
        pl_st_close(f);
        return; /* no /proc: nothing to measure */
    }
    pl_tensor *v = PL_CK_NOTNULL(pl_st_view(f, "big"));
    const float *d = pl_tensor_f32(v);
    double sum = 0;
    for (int64_t i = 0; i < n; i++) sum += d[i]; /* touch every page */
    ck_assert(sum == (double)(n / 1024) * (1023.0 * 1024 / 2));
    long long r1 = rss_file_bytes();
    pl_tensor_release(v); /* the file stays open: the drop is the view's own */
    long long r2 = rss_file_bytes();
    pl_st_close(f);
    long long half = n * 4 / 2;
    ck_assert_msg(r1 - r0 >= half, "touching the view added %lld bytes resident, expected >= %lld",
                  r1 - r0, half);
    ck_assert_msg(r1 - r2 >= half, "releasing the view dropped %lld resident bytes (%lld -> %lld), "
                  "expected >= %lld", r1 - r2, r1, r2, half);
}
END_TEST

/* ---- corrupt files ------------------------------------------------------------ */

START_TEST(truncated_file_refused) {
    char p[512], q[512];
    tpath("full.safetensors", p);
    write_ref_file(p, 0);
    struct stat sb;
    ck_assert_int_eq(stat(p, &sb), 0);
    /* shorter than the 8-byte length */
    tpath("tiny.safetensors", q);
    write_raw(q, "", NULL, 0);
    ck_assert_int_eq(truncate(q, 5), 0);
    REFUSED(q, "truncated", "5 bytes");
    /* data section cut short: the last tensor's end lies beyond it */
    ck_assert_int_eq(truncate(p, sb.st_size - 3), 0);
    REFUSED(p, "beyond the data section");
    /* cut inside the header */
    ck_assert_int_eq(truncate(p, 40), 0);
    REFUSED(p, "header length", "larger than the file", "32 bytes");
}
END_TEST

START_TEST(header_length_larger_than_file_refused) {
    char p[512];
    tpath("hlen.safetensors", p);
    const char *json = "{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}";
    float v = 1;
    write_raw(p, json, &v, 4);
    FILE *f = fopen(p, "r+b");
    uint8_t lb[8] = {0x00, 0x10, 0, 0, 0, 0, 0, 0}; /* 4096 */
    ck_assert_int_eq(fwrite(lb, 1, 8, f), 8);
    fclose(f);
    char want[64];
    snprintf(want, sizeof want, "%zu bytes after", strlen(json) + 4);
    REFUSED(p, "header length 4096", want);
    /* an absurd length (> 100 MB) in a large-enough file is also refused by the
     * size check first; a length of 2^63 must not wrap around */
    f = fopen(p, "r+b");
    uint8_t big[8] = {0, 0, 0, 0, 0, 0, 0, 0x80};
    ck_assert_int_eq(fwrite(big, 1, 8, f), 8);
    fclose(f);
    REFUSED(p, "header length 9223372036854775808");
}
END_TEST

START_TEST(corrupt_json_refused) {
    char p[512];
    tpath("json.safetensors", p);
    write_raw(p, "{\"x\": {\"dtype\": \"F32\", \"shape\": [1], ", NULL, 0);
    REFUSED(p, "not valid JSON");
    write_raw(p, "[1, 2, 3]", NULL, 0);
    REFUSED(p, "not an object");
    write_raw(p, "{\"x\": 5}", NULL, 0);
    REFUSED(p, "'x'", "not a JSON object");
    float v[2] = {0};
    write_raw(p, "{\"x\":{\"dtype\":\"Q7\",\"shape\":[2],\"data_offsets\":[0,8]}}", v, 8);
    REFUSED(p, "'x'", "unknown dtype 'Q7'");
    write_raw(p, "{\"x\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", v, 8);
    REFUSED(p, "'x'", "shape entry 0");
    write_raw(p, "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", v, 8);
    REFUSED(p, "'x'", "[8, 0]", "begin > end");
    write_raw(p, "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", v, 8);
    REFUSED(p, "'x'", "data_offsets");
    write_raw(p, "{\"__metadata__\":{\"k\":3}}", NULL, 0);
    REFUSED(p, "metadata 'k'");
    write_raw(p, "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}} trailing", v, 8);
    REFUSED(p, "trailing");
}
END_TEST

START_TEST(offsets_out_of_range_refused) {
    char p[512];
    tpath("range.safetensors", p);
    float v[4] = {0};
    write_raw(p,
              "{\"ok\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
              "\"w\":{\"dtype\":\"F32\",\"shape\":[25],\"data_offsets\":[0,100]}}",
              v, 16);
    REFUSED(p, "'w'", "[0, 100]", "end 100", "data section of 16 bytes");
}
END_TEST

START_TEST(overlapping_offsets_refused) {
    char p[512];
    tpath("overlap.safetensors", p);
    float v[6] = {0};
    write_raw(p,
              "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
              "\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[8,24]}}",
              v, 24);
    REFUSED(p, "'a' [0, 16)", "'b' [8, 24)", "overlap");
    /* adjacent and empty tensors are fine */
    write_raw(p,
              "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
              "\"e\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]},"
              "\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[8,24]}}",
              v, 24);
    pl_st_file *f = NULL;
    PL_CK_OK(pl_st_open(p, &f));
    ck_assert_int_eq(pl_st_count(f), 3);
    pl_st_close(f);
}
END_TEST

START_TEST(wrong_byte_count_refused) {
    char p[512];
    tpath("count.safetensors", p);
    float v[4] = {0};
    write_raw(p, "{\"m\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,12]}}", v, 16);
    REFUSED(p, "'m'", "hold 12 bytes", "expected 16", "[2, 2]");
    write_raw(p, "{\"m\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[0,8]}}", v, 16);
    REFUSED(p, "'m'", "hold 8 bytes", "expected 6");
}
END_TEST

START_TEST(missing_file_and_commit_error_name_the_path) {
    pl_st_file *f = NULL;
    ck_assert_int_eq(pl_st_open("/nonexistent/dir/x.safetensors", &f), PL_ERR_IO);
    ck_assert_ptr_nonnull(strstr(pl_error_message(), "/nonexistent/dir/x.safetensors"));
    ck_assert_ptr_nonnull(strstr(pl_error_message(), strerror(ENOENT)));
    pl_st_writer *w = PL_CK_NOTNULL(pl_st_writer_new("/nonexistent/dir/y.safetensors"));
    pl_tensor *t = pl_tensor_zeros(PL_F32, PL_SHAPE(2), PL_CPU);
    PL_CK_OK(pl_st_writer_add(w, "t", t));
    ck_assert_int_eq(pl_st_writer_commit(w), PL_ERR_IO);
    ck_assert_ptr_nonnull(strstr(pl_error_message(), "/nonexistent/dir/y.safetensors"));
    ck_assert_ptr_nonnull(strstr(pl_error_message(), strerror(ENOENT)));
    pl_st_writer_free(w);
    pl_tensor_release(t);
}
END_TEST

/* ---- crash safety ------------------------------------------------------------- */

START_TEST(kill_during_commit_keeps_previous_file) {
    char p[512], tmp[600];
    tpath("ckpt.safetensors", p);
    int tried = 0, caught = 0;
    while (!caught && tried < 5) {
        tried++;
        /* the previous checkpoint */
        float old[3] = {7, 8, 9};
        pl_tensor *t = pl_tensor_from_data(PL_F32, PL_SHAPE(3), old, PL_CPU);
        pl_st_writer *w = PL_CK_NOTNULL(pl_st_writer_new(p));
        PL_CK_OK(pl_st_writer_add(w, "w", t));
        PL_CK_OK(pl_st_writer_meta(w, "step", "1"));
        PL_CK_OK(pl_st_writer_commit(w));
        pl_st_writer_free(w);
        pl_tensor_release(t);

        pid_t child = fork();
        ck_assert_int_ge(child, 0);
        if (child == 0) { /* writes a 200 MB replacement */
            pl_tensor *big = pl_tensor_full(PL_F32, PL_SHAPE(50 * 1000 * 1000), 1.0, PL_CPU);
            pl_st_writer *cw = pl_st_writer_new(p);
            if (!big || !cw || pl_st_writer_add(cw, "w", big) || pl_st_writer_meta(cw, "step", "2"))
                _exit(2);
            _exit(pl_st_writer_commit(cw) ? 3 : 0);
        }
        snprintf(tmp, sizeof tmp, "%s.tmp.%ld", p, (long)child);
        /* wait until the child is well into the temp file, then SIGKILL it */
        struct timespec nap = {0, 100 * 1000};
        int status = 0, done = 0;
        for (long it = 0; it < 2000000; it++) {
            struct stat sb;
            if (stat(tmp, &sb) == 0 && sb.st_size > (1 << 20)) break;
            if (waitpid(child, &status, WNOHANG) == child) {
                done = 1;
                break;
            }
            nanosleep(&nap, NULL);
        }
        if (!done) {
            kill(child, SIGKILL);
            ck_assert_int_eq(waitpid(child, &status, 0), child);
        }
        struct stat sb;
        int tmp_left = stat(tmp, &sb) == 0;
        if (!tmp_left) continue; /* the child got to rename() first: try again */
        caught = 1;
        fprintf(stderr, "kill_during_commit: child killed with %lld bytes of the temp file "
                "written (try %d)\n", (long long)sb.st_size, tried);
        ck_assert_msg(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL,
                      "child was not killed (status %d)", status);
        ck_assert_msg(sb.st_size < 200 * 1000 * 1000, "temp file complete (%lld bytes)",
                      (long long)sb.st_size);
        /* the previous file is intact and loadable */
        pl_st_file *f = NULL;
        PL_CK_OK(pl_st_open(p, &f));
        ck_assert_str_eq(pl_st_meta(f, "step"), "1");
        pl_tensor *l = PL_CK_NOTNULL(pl_st_load(f, "w"));
        ck_assert_int_eq(l->shape[0], 3);
        ck_assert_float_eq(pl_tensor_f32(l)[2], 9.0f);
        pl_tensor_release(l);
        pl_st_close(f);
        /* the partial temp file is not a valid checkpoint either */
        ck_assert_int_eq(pl_st_open(tmp, &f), PL_ERR_IO);
        unlink(tmp);
    }
    ck_assert_msg(caught, "could not interrupt a commit in %d tries", tried);
}
END_TEST

/* ---- interoperability with Python safetensors --------------------------------- */

static int have_python_safetensors(void) {
    return system("python3 -c 'import safetensors.numpy' >/dev/null 2>&1") == 0;
}

START_TEST(interop_with_python_safetensors) {
    if (!have_python_safetensors()) {
        fprintf(stderr, "SKIP interop_with_python_safetensors: python3 or its 'safetensors' "
                        "module is not available\n");
        return;
    }
    char p[512], q[512], b[512], cmd[2048];
    const char *tool = PL_TEST_SOURCE_DIR "/tools/st_interop.py";
    /* Python writes, we read */
    tpath("py.safetensors", p);
    snprintf(cmd, sizeof cmd, "python3 '%s' write '%s'", tool, p);
    ck_assert_msg(system(cmd) == 0, "%s failed", cmd);
    pl_st_file *f = NULL;
    PL_CK_OK(pl_st_open(p, &f));
    ck_assert_int_eq(pl_st_count(f), N_REF - 1);
    for (int k = 0; k < N_REF; k++) {
        if (REF[k].dt == PL_BF16) continue;
        pl_tensor *t = PL_CK_NOTNULL(pl_st_load(f, REF[k].name));
        check_ref(t, k);
        pl_tensor_release(t);
    }
    ck_assert_str_eq(pl_st_meta(f, "producer"), "python-safetensors");
    ck_assert_str_eq(pl_st_meta(f, "note"), NOTE);
    pl_st_close(f);
    /* BF16 from torch, when available */
    tpath("py_bf16.safetensors", b);
    snprintf(cmd, sizeof cmd, "python3 '%s' write_bf16 '%s'", tool, b);
    int rc = system(cmd);
    if (WIFEXITED(rc) && WEXITSTATUS(rc) == 3) {
        fprintf(stderr, "SKIP bf16 part of interop: torch not available\n");
    } else {
        ck_assert_msg(rc == 0, "%s failed", cmd);
        PL_CK_OK(pl_st_open(b, &f));
        pl_tensor *t = PL_CK_NOTNULL(pl_st_load(f, "i_bf16"));
        check_ref(t, N_REF - 1);
        pl_tensor_release(t);
        pl_st_close(f);
    }
    /* we write, Python reads and checks */
    tpath("c.safetensors", q);
    write_ref_file(q, 1);
    snprintf(cmd, sizeof cmd, "python3 '%s' read '%s'", tool, q);
    ck_assert_msg(system(cmd) == 0, "%s reported a mismatch (see its output)", cmd);
}
END_TEST

/* ---- hostile files (issue 34) ------------------------------------------------- */

/* A FIFO, a directory and a character device are refused at once, by type
 * (a FIFO used to block pl_st_open forever: it opened before it checked). */
START_TEST(non_regular_files_refused_without_blocking) {
    char p[512];
    tpath("fifo.safetensors", p);
    ck_assert_int_eq(mkfifo(p, 0600), 0);
    alarm(20); /* a regression blocks: fail by SIGALRM instead of hanging */
    REFUSED(p, "is a FIFO, expected a regular file");
    ck_assert_int_eq(pl_file_check_regular(p, "shard"), PL_ERR_IO);
    ck_assert_msg(strstr(pl_error_message(), "shard ") && strstr(pl_error_message(), p) &&
                      strstr(pl_error_message(), "is a FIFO"),
                  "%s", pl_error_message());
    ck_assert_ptr_null(pl_file_fopen_read(p, "config file"));
    ck_assert_int_eq(errno, 0);
    ck_assert_msg(strstr(pl_error_message(), "config file ") &&
                      strstr(pl_error_message(), "is a FIFO, expected a regular file"),
                  "%s", pl_error_message());
    ck_assert_int_lt(pl_file_open_read(p, NULL), 0);
    alarm(0);
    REFUSED(g_dir, "is a directory, expected a regular file");
    REFUSED("/dev/zero", "is a character device, expected a regular file");
    /* a missing file: errno stays ENOENT (callers tell "absent" from "refused") */
    tpath("absent.safetensors", p);
    ck_assert_int_eq(pl_file_check_regular(p, NULL), PL_ERR_IO);
    ck_assert_int_eq(errno, ENOENT);
    ck_assert_ptr_null(pl_file_fopen_read(p, NULL));
    ck_assert_int_eq(errno, ENOENT);
    /* a regular file passes, and reads block as usual */
    write_ref_file(tpath("ok.safetensors", p), 0);
    PL_CK_OK(pl_file_check_regular(p, NULL));
    FILE *f = PL_CK_NOTNULL(pl_file_fopen_read(p, NULL));
    uint8_t b[8];
    ck_assert_int_eq(fread(b, 1, 8, f), 8);
    fclose(f);
}
END_TEST

/* pl_st_check_finite: NaN, +Inf and -Inf found in F32, F64, BF16 and F16
 * entries by their bits, named with the file, the tensor, the count and the
 * first index; finite (and integer) tensors pass. */
START_TEST(check_finite_every_float_dtype) {
    static const struct {
        pl_dtype dt;
        uint64_t bits; /* the poisoned element's bit pattern */
        const char *kind;
    } cases[] = {{PL_F32, 0x7fc00000u, "nan"},          {PL_F32, 0xff800000u, "-inf"},
                 {PL_F64, 0x7ff0000000000000ull, "inf"}, {PL_BF16, 0x7fc1u, "nan"},
                 {PL_BF16, 0x7f80u, "inf"},             {PL_F16, 0x7c00u, "inf"},
                 {PL_F16, 0xfe00u, "nan"}};
    char p[512];
    tpath("nonfinite.safetensors", p);
    int64_t shape[2] = {3, 5};
    pl_st_writer *w = PL_CK_NOTNULL(pl_st_writer_new(p));
    char names[8][32];
    int nc = (int)(sizeof cases / sizeof cases[0]);
    for (int k = 0; k < nc; k++) {
        pl_tensor *t = PL_CK_NOTNULL(pl_tensor_zeros_owned(cases[k].dt, 2, shape, PL_CPU));
        memset(pl_tensor_data(t), 0, pl_tensor_nbytes(t)); /* +0.0: finite */
        size_t es = pl_dtype_size(cases[k].dt);
        uint8_t *d = pl_tensor_data(t);
        memcpy(d + 7 * es, &cases[k].bits, es); /* little-endian low bytes */
        memcpy(d + 11 * es, &cases[k].bits, es);
        snprintf(names[k], sizeof names[k], "bad%d", k);
        PL_CK_OK(pl_st_writer_add(w, names[k], t));
        pl_tensor_release(t);
    }
    pl_tensor *ok = PL_CK_NOTNULL(pl_test_randn(2, shape, 5));
    PL_CK_OK(pl_st_writer_add(w, "ok", ok));
    pl_tensor_release(ok);
    pl_tensor *ints = PL_CK_NOTNULL(pl_tensor_zeros_owned(PL_I32, 2, shape, PL_CPU));
    memset(pl_tensor_data(ints), 0xff, pl_tensor_nbytes(ints)); /* -1: exponent-like bits */
    PL_CK_OK(pl_st_writer_add(w, "ints", ints));
    pl_tensor_release(ints);
    PL_CK_OK(pl_st_writer_commit(w));
    pl_st_writer_free(w);

    pl_st_file *f = NULL;
    PL_CK_OK(pl_st_open(p, &f));
    PL_CK_OK(pl_st_check_finite(f, "ok"));
    PL_CK_OK(pl_st_check_finite(f, "ints"));
    for (int k = 0; k < nc; k++) {
        ck_assert_int_eq(pl_st_check_finite(f, names[k]), PL_ERR_NUMERIC);
        const char *m = pl_error_message();
        char want[64];
        snprintf(want, sizeof want, "first at flat index 7: %s)", cases[k].kind);
        ck_assert_msg(strstr(m, p) && strstr(m, names[k]) && strstr(m, "2 non-finite values of 15") &&
                          strstr(m, want),
                      "case %d: %s", k, m);
    }
    ck_assert_int_eq(pl_st_check_finite(f, "absent"), PL_ERR_INVALID);
    pl_st_close(f);
}
END_TEST

/* A mapped file truncated under the process: touching a page past the new
 * end is a SIGBUS, and the crash report names the mapped file (it used to
 * name only libpipeline_core). In a child process, stderr to a file. */
START_TEST(sigbus_in_a_truncated_mapping_names_the_file) {
    char p[512], log[512];
    tpath("mapped.safetensors", p);
    tpath("crash.log", log);
    long pg = sysconf(_SC_PAGESIZE);
    int64_t n = 4 * pg; /* f32: 16 pages of data */
    pl_st_writer *w = PL_CK_NOTNULL(pl_st_writer_new(p));
    pl_tensor *t = PL_CK_NOTNULL(pl_test_randn(1, &n, 3));
    PL_CK_OK(pl_st_writer_add(w, "big", t));
    pl_tensor_release(t);
    PL_CK_OK(pl_st_writer_commit(w));
    pl_st_writer_free(w);
    fflush(NULL);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        FILE *e = freopen(log, "w", stderr);
        if (!e) _exit(90);
        pl_crash_handler_install();
        pl_st_file *f = NULL;
        if (pl_st_open(p, &f)) _exit(91);
        if (truncate(p, pg) != 0) _exit(92); /* another process rewrote the shard */
        pl_tensor *v = pl_st_view(f, "big");
        if (!v) _exit(93);
        volatile float s = 0;
        const float *x = pl_tensor_data(v);
        for (int64_t i = 0; i < n; i += pg / 4) s += x[i]; /* SIGBUS past the first page */
        _exit(94);                                        /* not reached */
    }
    int status = 0;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    char *out = pl_test_read_file(log);
    /* killed by SIGBUS; under a sanitizer its handler (ours hands over) exits non-zero */
    ck_assert_msg((WIFSIGNALED(status) && WTERMSIG(status) == SIGBUS) ||
                      (WIFEXITED(status) && WEXITSTATUS(status) != 0 && WEXITSTATUS(status) < 90),
                  "child status %d, output:\n%s", status, out);
    ck_assert_msg(strstr(out, "fatal signal 7") || strstr(out, "fatal signal 10"), "%s", out);
    ck_assert_msg(strstr(out, "inside the memory-mapped file") && strstr(out, p) &&
                      strstr(out, "truncated or rewritten while this process had it mapped"),
                  "the crash report does not name the mapped file:\n%s", out);
    free(out);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("safetensors");
    TCase *tc = tcase_create("core");
    tcase_add_checked_fixture(tc, dir_setup, dir_teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, round_trip_every_dtype_with_metadata);
    tcase_add_test(tc, strided_view_and_nf4_round_trip);
    tcase_add_test(tc, load_into_converts_float_dtypes);
    tcase_add_test(tc, load_into_shape_mismatch_names_both_shapes);
    tcase_add_test(tc, view_equals_load_for_every_dtype);
    tcase_add_test(tc, view_outlives_close_and_is_not_adopted_by_a_frame);
    tcase_add_test(tc, writing_into_a_view_never_reaches_the_file);
    tcase_add_test(tc, misaligned_tensor_is_copied_not_viewed);
    tcase_add_test(tc, releasing_a_view_drops_its_resident_pages);
    tcase_add_test(tc, truncated_file_refused);
    tcase_add_test(tc, header_length_larger_than_file_refused);
    tcase_add_test(tc, corrupt_json_refused);
    tcase_add_test(tc, offsets_out_of_range_refused);
    tcase_add_test(tc, overlapping_offsets_refused);
    tcase_add_test(tc, wrong_byte_count_refused);
    tcase_add_test(tc, missing_file_and_commit_error_name_the_path);
    tcase_add_test(tc, kill_during_commit_keeps_previous_file);
    tcase_add_test(tc, interop_with_python_safetensors);
    tcase_add_test(tc, non_regular_files_refused_without_blocking);
    tcase_add_test(tc, check_finite_every_float_dtype);
    tcase_add_test(tc, sigbus_in_a_truncated_mapping_names_the_file);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return pl_test_run(suite()); }
