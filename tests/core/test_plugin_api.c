/* test_plugin_api.c - the ABI 2.0 helpers plugins call: the batch field
 * contract (pl_fields_add / pl_fields_match), optimizer groups' named
 * hyper-parameters, pl_param_new and parameter roles, the owned tensor
 * constructors that no frame adopts, and pl_message (the core's, message.c:
 * stderr, or the sink a run installs). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <unistd.h>

#include "message.h"
#include "pl_test.h"

#define CK_HAS(msg, needle)                                                                        \
    ck_assert_msg(strstr((msg), (needle)) != NULL, "expected '%s' in: %s", (needle), (msg))

/* ---- batch field contract ------------------------------------------------ */

/* The loader of these tests: x f32 [B, F], y f32 [B, 1], id i64 [B]. */
static pl_field_list loader_fields(void) {
    pl_field_list l = {0};
    PL_CK_OK(pl_fields_add(&l, "x", PL_F32, 2, false));
    PL_CK_OK(pl_fields_add(&l, "y", PL_F32, 2, false));
    PL_CK_OK(pl_fields_add(&l, "id", PL_I64, 1, false));
    return l;
}

START_TEST(fields_add_keeps_order_and_refuses_duplicates_and_overflow) {
    pl_field_list l = loader_fields();
    ck_assert_int_eq(l.n, 3);
    ck_assert_str_eq(l.f[0].name, "x");
    ck_assert_int_eq(l.f[2].dtype, PL_I64);
    ck_assert_int_eq(l.f[1].rank, 2);
    ck_assert(!l.f[0].optional);
    ck_assert_int_eq(pl_fields_add(&l, "y", PL_F32, 1, false), PL_ERR_INVALID);
    CK_HAS(pl_error_message(), "'y'");
    ck_assert_int_eq(l.n, 3);
    pl_field_list full = {0};
    for (int i = 0; i < PL_FIELDS_MAX; i++) {
        char name[16];
        snprintf(name, sizeof name, "f%d", i);
        PL_CK_OK(pl_fields_add(&full, name, PL_F32, -1, false));
    }
    ck_assert_int_eq(pl_fields_add(&full, "one_more", PL_F32, 1, false), PL_ERR_INVALID);
    CK_HAS(pl_error_message(), "one_more");
    ck_assert_int_eq(full.n, PL_FIELDS_MAX);
    /* a name that does not fit the spec, a rank below -1 */
    char longname[80];
    memset(longname, 'a', sizeof longname - 1);
    longname[sizeof longname - 1] = '\0';
    ck_assert_int_eq(pl_fields_add(&l, longname, PL_F32, 1, false), PL_ERR_INVALID);
    ck_assert_int_eq(pl_fields_add(&l, "z", PL_F32, -2, false), PL_ERR_INVALID);
    ck_assert_int_eq(l.n, 3);
}
END_TEST

START_TEST(fields_match_accepts_exact_and_class_dtypes) {
    pl_field_list have = loader_fields();
    pl_field_list need = {0};
    PL_CK_OK(pl_fields_add(&need, "x", PL_DTYPE_FLOAT, 2, false));
    PL_CK_OK(pl_fields_add(&need, "y", PL_F32, -1, false));
    PL_CK_OK(pl_fields_add(&need, "id", PL_DTYPE_INDEX, 1, false));
    PL_CK_OK(pl_fields_match(&have, "synth", &need, "linreg"));
    pl_field_list any = {0};
    PL_CK_OK(pl_fields_add(&any, "id", PL_DTYPE_ANY, -1, false));
    PL_CK_OK(pl_fields_match(&have, "synth", &any, "linreg"));
    /* a model reading nothing matches any loader, also one yielding nothing */
    pl_field_list none = {0};
    PL_CK_OK(pl_fields_match(&have, "synth", &none, "linreg"));
    PL_CK_OK(pl_fields_match(&none, "synth", &none, "linreg"));
}
END_TEST

START_TEST(fields_match_float_and_index_classes_cover_their_dtypes) {
    const pl_dtype floats[] = {PL_F32, PL_BF16, PL_F16};
    const pl_dtype others[] = {PL_I32, PL_I64, PL_U8, PL_F64};
    const pl_dtype index[] = {PL_I32, PL_I64};
    pl_field_list needf = {0}, needi = {0};
    PL_CK_OK(pl_fields_add(&needf, "v", PL_DTYPE_FLOAT, 1, false));
    PL_CK_OK(pl_fields_add(&needi, "v", PL_DTYPE_INDEX, 1, false));
    for (int i = 0; i < 3; i++) {
        pl_field_list h = {0};
        PL_CK_OK(pl_fields_add(&h, "v", floats[i], 1, false));
        PL_CK_OK(pl_fields_match(&h, "ld", &needf, "md"));
        ck_assert_int_eq(pl_fields_match(&h, "ld", &needi, "md"), PL_ERR_CONFIG);
        CK_HAS(pl_error_message(), "i32 or i64");
        CK_HAS(pl_error_message(), pl_dtype_name(floats[i]));
    }
    for (int i = 0; i < 4; i++) {
        pl_field_list h = {0};
        PL_CK_OK(pl_fields_add(&h, "v", others[i], 1, false));
        ck_assert_int_eq(pl_fields_match(&h, "ld", &needf, "md"), PL_ERR_CONFIG);
        CK_HAS(pl_error_message(), "f32, bf16 or f16");
    }
    for (int i = 0; i < 2; i++) {
        pl_field_list h = {0};
        PL_CK_OK(pl_fields_add(&h, "v", index[i], 1, false));
        PL_CK_OK(pl_fields_match(&h, "ld", &needi, "md"));
    }
}
END_TEST

START_TEST(fields_match_names_missing_field_and_lists_the_loaders) {
    pl_field_list have = loader_fields();
    pl_field_list need = {0};
    PL_CK_OK(pl_fields_add(&need, "x", PL_F32, 2, false));
    PL_CK_OK(pl_fields_add(&need, "mask", PL_U8, 1, false));
    ck_assert_int_eq(pl_fields_match(&have, "synth", &need, "linreg"), PL_ERR_CONFIG);
    const char *e = pl_error_message();
    CK_HAS(e, "'mask'");
    CK_HAS(e, "linreg");
    CK_HAS(e, "synth");
    CK_HAS(e, "no such field");
    CK_HAS(e, "x, y, id");
    pl_field_list empty = {0};
    ck_assert_int_eq(pl_fields_match(&empty, "synth", &need, "linreg"), PL_ERR_CONFIG);
    CK_HAS(pl_error_message(), "none");
}
END_TEST

START_TEST(fields_match_names_wrong_dtype_with_both_sides) {
    pl_field_list have = loader_fields();
    pl_field_list need = {0};
    PL_CK_OK(pl_fields_add(&need, "id", PL_I32, 1, false));
    ck_assert_int_eq(pl_fields_match(&have, "synth", &need, "linreg"), PL_ERR_CONFIG);
    const char *e = pl_error_message();
    CK_HAS(e, "'id'");
    CK_HAS(e, "model 'linreg' needs i32, rank 1");
    CK_HAS(e, "loader 'synth' yields i64, rank 1");
}
END_TEST

START_TEST(fields_match_names_wrong_rank_with_both_sides) {
    pl_field_list have = loader_fields();
    pl_field_list need = {0};
    PL_CK_OK(pl_fields_add(&need, "y", PL_F32, 1, false));
    ck_assert_int_eq(pl_fields_match(&have, "synth", &need, "linreg"), PL_ERR_CONFIG);
    const char *e = pl_error_message();
    CK_HAS(e, "'y'");
    CK_HAS(e, "needs f32, rank 1");
    CK_HAS(e, "yields f32, rank 2");
    /* a loader whose rank varies (-1) satisfies only a model taking any rank */
    pl_field_list varies = {0};
    PL_CK_OK(pl_fields_add(&varies, "y", PL_F32, -1, false));
    ck_assert_int_eq(pl_fields_match(&varies, "synth", &need, "linreg"), PL_ERR_CONFIG);
    CK_HAS(pl_error_message(), "any rank");
    pl_field_list anyrank = {0};
    PL_CK_OK(pl_fields_add(&anyrank, "y", PL_F32, -1, false));
    PL_CK_OK(pl_fields_match(&varies, "synth", &anyrank, "linreg"));
}
END_TEST

START_TEST(fields_match_skips_missing_optional_but_checks_present_optional) {
    pl_field_list have = loader_fields();
    pl_field_list need = {0};
    PL_CK_OK(pl_fields_add(&need, "x", PL_F32, 2, false));
    PL_CK_OK(pl_fields_add(&need, "weight", PL_F32, 1, true));
    PL_CK_OK(pl_fields_match(&have, "synth", &need, "linreg"));
    /* present but incompatible: still an error */
    pl_field_list need2 = {0};
    PL_CK_OK(pl_fields_add(&need2, "id", PL_DTYPE_FLOAT, 1, true));
    ck_assert_int_eq(pl_fields_match(&have, "synth", &need2, "linreg"), PL_ERR_CONFIG);
    CK_HAS(pl_error_message(), "'id'");
}
END_TEST

/* ---- optimizer hyper-parameters ------------------------------------------ */

START_TEST(hparams_set_get_reset_and_refuse_overflow) {
    pl_param_group g = {0};
    snprintf(g.name, sizeof g.name, "decay");
    ck_assert_ptr_null(pl_group_hparam(&g, "beta1"));
    PL_CK_OK(pl_group_hparam_set(&g, "beta1", 0.9));
    PL_CK_OK(pl_group_hparam_set(&g, "beta2", 0.999));
    ck_assert_int_eq(g.n_hparams, 2);
    pl_hparam *h = PL_CK_NOTNULL(pl_group_hparam(&g, "beta1"));
    ck_assert_double_eq(h->value, 0.9);
    ck_assert_double_eq(h->initial, 0.9);
    /* a scheduler drives value; initial stays the configured one */
    h->value = 0.85;
    ck_assert_double_eq(pl_group_hparam(&g, "beta1")->value, 0.85);
    ck_assert_double_eq(pl_group_hparam(&g, "beta1")->initial, 0.9);
    /* set again: both reset, no new entry */
    PL_CK_OK(pl_group_hparam_set(&g, "beta1", 0.95));
    ck_assert_int_eq(g.n_hparams, 2);
    ck_assert_double_eq(h->value, 0.95);
    ck_assert_double_eq(h->initial, 0.95);
    ck_assert_ptr_null(pl_group_hparam(&g, "momentum"));
    for (int i = 2; i < PL_HPARAMS_MAX; i++) {
        char name[16];
        snprintf(name, sizeof name, "h%d", i);
        PL_CK_OK(pl_group_hparam_set(&g, name, i));
    }
    ck_assert_int_eq(g.n_hparams, PL_HPARAMS_MAX);
    ck_assert_int_eq(pl_group_hparam_set(&g, "overflow", 1.0), PL_ERR_INVALID);
    CK_HAS(pl_error_message(), "overflow");
    CK_HAS(pl_error_message(), "decay");
    ck_assert_int_eq(g.n_hparams, PL_HPARAMS_MAX);
    /* an existing one can still be reset when the group is full */
    PL_CK_OK(pl_group_hparam_set(&g, "beta2", 0.98));
    ck_assert_double_eq(pl_group_hparam(&g, "beta2")->value, 0.98);
    /* a name longer than the field is refused, not truncated into another name */
    char longname[64];
    memset(longname, 'b', sizeof longname - 1);
    longname[sizeof longname - 1] = '\0';
    ck_assert_int_eq(pl_group_hparam_set(&g, longname, 1.0), PL_ERR_INVALID);
    ck_assert_ptr_null(pl_group_hparam(NULL, "beta1"));
    ck_assert_ptr_null(pl_group_hparam(&g, NULL));
}
END_TEST

/* ---- parameters ------------------------------------------------------------ */

START_TEST(params_store_role_and_truncate_long_ones) {
    pl_params *ps = PL_CK_NOTNULL(pl_params_new());
    pl_tensor *a = PL_CK_NOTNULL(pl_tensor_zeros_owned(PL_F32, PL_SHAPE(2), PL_CPU));
    PL_CK_OK(pl_params_add(ps, "head.weight", a, 0, "head"));
    PL_CK_OK(pl_params_add(ps, "head.bias", a, PL_TAG_NO_DECAY, NULL));
    char role[PL_ROLE_MAX + 20];
    memset(role, 'r', sizeof role - 1);
    role[sizeof role - 1] = '\0';
    PL_CK_OK(pl_params_add(ps, "long.role", a, 0, role));
    ck_assert_str_eq(pl_params_find(ps, "head.weight")->role, "head");
    ck_assert_str_eq(pl_params_find(ps, "head.bias")->role, "");
    ck_assert_uint_eq(pl_params_find(ps, "head.bias")->tags, PL_TAG_NO_DECAY);
    const char *r = pl_params_find(ps, "long.role")->role;
    ck_assert_uint_eq(strlen(r), PL_ROLE_MAX - 1);
    ck_assert(strncmp(r, role, PL_ROLE_MAX - 1) == 0);
    ck_assert_int_eq(pl_params_add(ps, "head.weight", a, 0, "head"), PL_ERR_INVALID);
    ck_assert_int_eq(pl_params_count(ps), 3);
    ck_assert_int_eq(a->refcount, 4);
    pl_tensor_release(a);
    pl_params_free(ps);
}
END_TEST

static pl_run_context test_ctx(pl_params *ps) {
    pl_run_context ctx = {0};
    ctx.device = PL_CPU;
    ctx.seed = 7;
    ctx.params = ps;
    return ctx;
}

START_TEST(param_new_outside_a_frame_is_a_zero_f32_owned_by_the_list) {
    pl_params *ps = PL_CK_NOTNULL(pl_params_new());
    pl_run_context ctx = test_ctx(ps);
    pl_tensor *w = NULL;
    PL_CK_OK(pl_param_new(&ctx, "lin.weight", PL_SHAPE(3, 4), 0, "head", true, &w));
    ck_assert_ptr_nonnull(w);
    ck_assert_int_eq(w->dtype, PL_F32);
    ck_assert_int_eq(w->ndim, 2);
    ck_assert_int_eq(w->shape[0], 3);
    ck_assert_int_eq(w->shape[1], 4);
    ck_assert(w->requires_grad);
    ck_assert(pl_device_eq(w->device, PL_CPU));
    ck_assert_str_eq(w->name, "lin.weight");
    ck_assert_int_eq(w->refcount, 1); /* the list's, nobody else's */
    for (int64_t i = 0; i < 12; i++)
        ck_assert_double_eq(pl_tensor_get(w, i), 0.0);
    pl_param *p = PL_CK_NOTNULL(pl_params_find(ps, "lin.weight"));
    ck_assert_ptr_eq(p->t, w);
    ck_assert_str_eq(p->role, "head");
    pl_tensor *b = NULL;
    PL_CK_OK(pl_param_new(&ctx, "lin.bias", PL_SHAPE(3), PL_TAG_NO_DECAY, NULL, false, &b));
    ck_assert(!b->requires_grad);
    ck_assert_str_eq(pl_params_find(ps, "lin.bias")->role, "");
    /* *out may be NULL: the parameter is still created */
    PL_CK_OK(pl_param_new(&ctx, "scalar", 0, NULL, PL_TAG_BUFFER, NULL, false, NULL));
    ck_assert_int_eq(pl_params_find(ps, "scalar")->t->ndim, 0);
    ck_assert_int_eq(pl_params_count(ps), 3);
    pl_params_free(ps);
}
END_TEST

START_TEST(param_new_inside_a_frame_survives_frame_end) {
    pl_params *ps = PL_CK_NOTNULL(pl_params_new());
    pl_run_context ctx = test_ctx(ps);
    pl_tensor *w = NULL;
    pl_frame_begin();
    pl_frame_begin(); /* nested: still not adopted by either */
    PL_CK_OK(pl_param_new(&ctx, "w", PL_SHAPE(5), 0, NULL, true, &w));
    PL_CK_OK(pl_tensor_fill_(w, 2.5));
    pl_frame_end();
    pl_frame_end();
    ck_assert_ptr_eq(pl_params_find(ps, "w")->t, w);
    ck_assert_int_eq(w->refcount, 1);
    ck_assert_double_eq(pl_tensor_get(w, 4), 2.5);
    /* and it trains: a backward in a later frame fills its grad */
    pl_frame_begin();
    pl_tensor *loss = pl_sum(pl_square(w), -1, false);
    ck_assert_ptr_nonnull(loss);
    PL_CK_OK(pl_backward(loss, 1.0));
    pl_frame_end();
    ck_assert_ptr_nonnull(w->grad);
    ck_assert_double_eq_tol(pl_tensor_get(w->grad, 0), 5.0, 1e-6);
    pl_params_free(ps);
}
END_TEST

START_TEST(param_new_refuses_duplicates_and_bad_shapes) {
    pl_params *ps = PL_CK_NOTNULL(pl_params_new());
    pl_run_context ctx = test_ctx(ps);
    pl_tensor *w = (pl_tensor *)1;
    PL_CK_OK(pl_param_new(&ctx, "w", PL_SHAPE(2), 0, NULL, true, &w));
    ck_assert_int_eq(pl_param_new(&ctx, "w", PL_SHAPE(2), 0, NULL, true, &w), PL_ERR_INVALID);
    CK_HAS(pl_error_message(), "'w'");
    ck_assert_ptr_null(w);
    ck_assert_int_eq(pl_param_new(&ctx, "neg", PL_SHAPE(2, -1), 0, NULL, true, &w), PL_ERR_INVALID);
    CK_HAS(pl_error_message(), "neg");
    ck_assert_int_eq(pl_param_new(&ctx, "rank", PL_MAX_DIMS + 1, (int64_t[PL_MAX_DIMS + 1]){1}, 0,
                                  NULL, true, &w),
                     PL_ERR_INVALID);
    ck_assert_int_eq(pl_params_count(ps), 1);
    pl_run_context noparams = test_ctx(NULL);
    ck_assert_int_eq(pl_param_new(&noparams, "x", PL_SHAPE(2), 0, NULL, true, &w), PL_ERR_INVALID);
    pl_params_free(ps);
}
END_TEST

/* ---- owned tensors --------------------------------------------------------- */

static int g_ext_freed;
static void ext_free(void *data, void *ctx) {
    (void)ctx;
    g_ext_freed++;
    free(data);
}

START_TEST(param_convert_swaps_storage_in_place_and_releases_the_old_at_once) {
    pl_params *ps = PL_CK_NOTNULL(pl_params_new());
    uint16_t *d = malloc(6 * sizeof *d);
    const float v[6] = {1.0f, -2.5f, 3.140625f, 0.0f, 65504.0f, -1e-3f};
    for (int i = 0; i < 6; i++) d[i] = pl_f32_to_bf16(v[i]);
    g_ext_freed = 0;
    pl_tensor *t = PL_CK_NOTNULL(pl_tensor_from_external(PL_BF16, PL_SHAPE(2, 3), d, ext_free, NULL));
    PL_CK_OK(pl_params_add(ps, "w", t, PL_TAG_BASE, NULL));
    pl_tensor_release(t);
    pl_param *p = pl_params_find(ps, "w");
    PL_CK_OK(pl_param_convert(p, PL_BF16)); /* already bf16: no-op */
    ck_assert_int_eq(g_ext_freed, 0);
    PL_CK_OK(pl_param_convert(p, PL_F32));
    ck_assert_ptr_eq(p->t, t); /* same header */
    ck_assert_int_eq(g_ext_freed, 1); /* old storage gone right away */
    ck_assert_int_eq(t->dtype, PL_F32);
    ck_assert_str_eq(t->name, "w");
    for (int i = 0; i < 6; i++) ck_assert(pl_tensor_f32(t)[i] == pl_bf16_to_f32(pl_f32_to_bf16(v[i])));
    PL_CK_OK(pl_param_convert(p, PL_F16));
    ck_assert_int_eq(t->dtype, PL_F16);
    ck_assert(pl_tensor_get(t, 0) == 1.0);
    ck_assert_int_eq(pl_param_convert(p, PL_NF4), PL_ERR_DTYPE);
    ck_assert_int_eq(pl_param_convert(p, PL_I32), PL_ERR_DTYPE);
    ck_assert_ptr_nonnull(strstr(pl_error_message(), "'w'"));
    pl_tensor *ix = PL_CK_NOTNULL(pl_tensor_zeros_owned(PL_I64, PL_SHAPE(3), PL_CPU));
    PL_CK_OK(pl_params_add(ps, "idx", ix, 0, NULL));
    pl_tensor_release(ix);
    ck_assert_int_eq(pl_param_convert(pl_params_find(ps, "idx"), PL_F32), PL_ERR_DTYPE);
    ck_assert_int_eq(pl_params_find(ps, "idx")->t->dtype, PL_I64);
    pl_params_free(ps);
}
END_TEST

START_TEST(owned_tensors_outlive_the_open_frame) {
    pl_frame_begin();
    pl_tensor *z = pl_tensor_zeros_owned(PL_F32, PL_SHAPE(2, 3), PL_CPU);
    pl_tensor *e = pl_tensor_empty_owned(PL_I64, PL_SHAPE(4), PL_CPU);
    pl_tensor *adopted = pl_tensor_zeros(PL_F32, PL_SHAPE(2), PL_CPU);
    ck_assert_ptr_nonnull(z);
    ck_assert_ptr_nonnull(e);
    ck_assert_ptr_nonnull(adopted);
    pl_tensor_retain(adopted); /* to look at it after the frame */
    pl_frame_end();
    ck_assert_int_eq(adopted->refcount, 1); /* the frame dropped its reference */
    pl_tensor_release(adopted);
    ck_assert_int_eq(z->refcount, 1);
    ck_assert_int_eq(e->refcount, 1);
    ck_assert_int_eq(z->dtype, PL_F32);
    ck_assert_int_eq(z->ndim, 2);
    ck_assert(pl_tensor_is_contiguous(z));
    ck_assert(!z->requires_grad);
    for (int64_t i = 0; i < 6; i++)
        ck_assert_double_eq(pl_tensor_get(z, i), 0.0);
    ck_assert_int_eq(e->dtype, PL_I64);
    ck_assert_int_eq(e->shape[0], 4);
    int64_t *ev = PL_CK_NOTNULL(pl_tensor_i64(e));
    for (int i = 0; i < 4; i++)
        ev[i] = i; /* writable storage of the right size */
    ck_assert_double_eq(pl_tensor_get(e, 3), 3.0);
    pl_tensor_release(z);
    pl_tensor_release(e);
}
END_TEST

START_TEST(owned_tensors_refuse_bad_shapes_and_dtypes) {
    ck_assert_ptr_null(pl_tensor_zeros_owned(PL_F32, PL_SHAPE(2, -3), PL_CPU));
    ck_assert_int_eq(pl_error_status(), PL_ERR_SHAPE);
    ck_assert_ptr_null(pl_tensor_empty_owned(PL_F32, -1, NULL, PL_CPU));
    ck_assert_int_eq(pl_error_status(), PL_ERR_SHAPE);
    ck_assert_ptr_null(pl_tensor_empty_owned((pl_dtype)99, PL_SHAPE(2), PL_CPU));
    ck_assert_int_eq(pl_error_status(), PL_ERR_DTYPE);
    /* zero-size is a valid shape */
    pl_tensor *t = PL_CK_NOTNULL(pl_tensor_zeros_owned(PL_F32, PL_SHAPE(0, 3), PL_CPU));
    ck_assert_int_eq(pl_tensor_numel(t), 0);
    pl_tensor_release(t);
}
END_TEST

/* ---- pl_message ----------------------------------------------------------- */

static char g_seen[4][4096];
static int g_n_seen;
static void *g_seen_ud;
static void record_line(void *ud, const char *line) {
    if (g_n_seen < 4) snprintf(g_seen[g_n_seen++], sizeof g_seen[0], "%s", line);
    g_seen_ud = ud;
}

START_TEST(message_goes_to_the_installed_sink_as_one_line) {
    int ud = 7;
    g_n_seen = 0;
    pl_message_set_sink(record_line, &ud);
    pl_message("lstm: %d parameters", 12);
    pl_message("already ends in a newline\n");
    char long_msg[3000];
    memset(long_msg, 'a', sizeof long_msg - 1);
    long_msg[sizeof long_msg - 1] = 0;
    pl_message("%s", long_msg);
    pl_message_set_sink(NULL, NULL);
    ck_assert_int_eq(g_n_seen, 3);
    ck_assert_ptr_eq(g_seen_ud, &ud);
    ck_assert_str_eq(g_seen[0], "lstm: 12 parameters\n");
    ck_assert_str_eq(g_seen[1], "already ends in a newline\n");
    /* truncated to 2047 bytes, then the newline */
    ck_assert_uint_eq(strlen(g_seen[2]), 2048);
    ck_assert_int_eq(g_seen[2][2047], '\n');
    ck_assert_int_eq(g_seen[2][2046], 'a');
}
END_TEST

START_TEST(message_without_a_sink_goes_to_stderr) {
    char path[] = "/tmp/pl_message_XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    fflush(stderr);
    int saved = dup(STDERR_FILENO);
    ck_assert_int_ge(dup2(fd, STDERR_FILENO), 0);
    g_n_seen = 0;
    pl_message_set_sink(record_line, NULL);
    pl_message_set_sink(NULL, NULL); /* cleared: stderr again */
    pl_message("bf16: %s", "converted 3 tensors");
    fflush(stderr);
    dup2(saved, STDERR_FILENO);
    close(saved);
    char buf[256] = {0};
    ck_assert_int_ge(pread(fd, buf, sizeof buf - 1, 0), 0);
    close(fd);
    unlink(path);
    ck_assert_int_eq(g_n_seen, 0);
    ck_assert_str_eq(buf, "bf16: converted 3 tensors\n");
}
END_TEST

int main(void) {
    Suite *s = suite_create("plugin_api");
    TCase *f = tcase_create("fields");
    tcase_add_test(f, fields_add_keeps_order_and_refuses_duplicates_and_overflow);
    tcase_add_test(f, fields_match_accepts_exact_and_class_dtypes);
    tcase_add_test(f, fields_match_float_and_index_classes_cover_their_dtypes);
    tcase_add_test(f, fields_match_names_missing_field_and_lists_the_loaders);
    tcase_add_test(f, fields_match_names_wrong_dtype_with_both_sides);
    tcase_add_test(f, fields_match_names_wrong_rank_with_both_sides);
    tcase_add_test(f, fields_match_skips_missing_optional_but_checks_present_optional);
    suite_add_tcase(s, f);
    TCase *h = tcase_create("hparams");
    tcase_add_test(h, hparams_set_get_reset_and_refuse_overflow);
    suite_add_tcase(s, h);
    TCase *p = tcase_create("params");
    tcase_add_test(p, params_store_role_and_truncate_long_ones);
    tcase_add_test(p, param_new_outside_a_frame_is_a_zero_f32_owned_by_the_list);
    tcase_add_test(p, param_new_inside_a_frame_survives_frame_end);
    tcase_add_test(p, param_new_refuses_duplicates_and_bad_shapes);
    tcase_add_test(p, param_convert_swaps_storage_in_place_and_releases_the_old_at_once);
    suite_add_tcase(s, p);
    TCase *t = tcase_create("owned_tensors");
    tcase_add_test(t, owned_tensors_outlive_the_open_frame);
    tcase_add_test(t, owned_tensors_refuse_bad_shapes_and_dtypes);
    suite_add_tcase(s, t);
    TCase *m = tcase_create("message");
    tcase_add_test(m, message_goes_to_the_installed_sink_as_one_line);
    tcase_add_test(m, message_without_a_sink_goes_to_stderr);
    suite_add_tcase(s, m);
    return pl_test_run(s);
}
