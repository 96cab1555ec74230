/* test_hdf5_chunk.c - the deprecated hdf5_chunk alias: an old config (rows
 * mode, or series mode with window > 0) still validates and serves exactly
 * the batches of hdf5_rows / hdf5_series, with one deprecation line naming
 * the new plugin; the date keys stay refused in rows mode. The loaders
 * themselves are tested in hdf5_rows/ and hdf5_series/. */
#include <fcntl.h>
#include <hdf5.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "chunk_test_files.h"

const char *const lf_suite = "hdf5_chunk";

/* Epoch 1 of train (shuffled) and val through `plugin`, and its batch fields. */
static void read_both(const char *plugin, const char *body, lt_epoch *tr, lt_epoch *va,
                      pl_field_list *fl) {
    lt_loader L;
    PL_CK_OK(lt_open(&L, plugin, body, NULL));
    PL_CK_OK(L.vt->batch_fields(L.sec, fl));
    PL_CK_OK(L.vt->epoch_begin(L.self, PL_SPLIT_TRAIN, 1, 0));
    ck_assert_int_eq(lt_read_epoch(&L, tr), 0);
    PL_CK_OK(L.vt->epoch_begin(L.self, PL_SPLIT_VAL, 0, 0));
    ck_assert_int_eq(lt_read_epoch(&L, va), 0);
    ck_assert_int_eq(tr->nb, L.vt->num_batches(L.self, PL_SPLIT_TRAIN));
    lt_close(&L);
}

/* stderr of `fn` as a string (malloc'd). */
static char *stderr_of(void (*fn)(void)) {
    char p[512];
    lf_tmp_path("stderr.txt", p, sizeof p);
    fflush(stderr);
    int keep = dup(2), fd = open(p, O_CREAT | O_TRUNC | O_WRONLY, 0600);
    ck_assert(keep >= 0 && fd >= 0);
    dup2(fd, 2);
    close(fd);
    fn();
    fflush(stderr);
    dup2(keep, 2);
    close(keep);
    FILE *f = fopen(p, "r");
    char *s = calloc(1, 65536);
    if (f) {
        size_t n = fread(s, 1, 65535, f);
        s[n] = 0;
        fclose(f);
    }
    return s;
}

static const char *const rows_body_fmt =
    "path = %s\ndatasets = x,label=y\nhistory = hist\nbatch_size = 8\nchunk_samples = 16\n";
static const char *const series_body_fmt =
    "path = %s\nwindow = 3\nhorizon = 1\ntarget_columns = 0,sq\nsplit_fractions = 0.6,0.2,0.2\n"
    "batch_size = 4\nstandardize = true\n";

/* Both modes through the alias equal the new plugins batch for batch. */
START_TEST(alias_serves_the_new_plugins_batches) {
    char p[512], body[1024], why[512];
    for (int series = 0; series < 2; series++) {
        if (series)
            snprintf(body, sizeof body, series_body_fmt, lf_make_series_file(p, sizeof p));
        else
            snprintf(body, sizeof body, rows_body_fmt, lf_make_rows_file(p, sizeof p));
        lt_epoch at, av, nt, nv;
        pl_field_list af, nf;
        read_both("hdf5_chunk", body, &at, &av, &af);
        read_both(series ? "hdf5_series" : "hdf5_rows", body, &nt, &nv, &nf);
        ck_assert_int_gt(nt.nb, 1);
        const char *d = lt_epoch_tail_diff(&nt, 0, &at, why, sizeof why);
        ck_assert_msg(d == NULL, "train, series %d: %s", series, d);
        d = lt_epoch_tail_diff(&nv, 0, &av, why, sizeof why);
        ck_assert_msg(d == NULL, "val, series %d: %s", series, d);
        ck_assert_int_eq(af.n, nf.n);
        for (int i = 0; i < af.n; i++) {
            ck_assert_str_eq(af.f[i].name, nf.f[i].name);
            ck_assert_int_eq(af.f[i].dtype, nf.f[i].dtype);
            ck_assert_int_eq(af.f[i].rank, nf.f[i].rank);
        }
        lt_epoch_free(&at);
        lt_epoch_free(&av);
        lt_epoch_free(&nt);
        lt_epoch_free(&nv);
    }
}
END_TEST

static void open_rows_twice_and_series(void) {
    char p[512], body[1024];
    snprintf(body, sizeof body, rows_body_fmt, lf_make_rows_file(p, sizeof p));
    for (int i = 0; i < 2; i++) {
        lt_loader L;
        PL_CK_OK(lt_open(&L, "hdf5_chunk", body, NULL));
        lt_close(&L);
    }
    snprintf(body, sizeof body, series_body_fmt, lf_make_series_file(p, sizeof p));
    lt_loader L;
    PL_CK_OK(lt_open(&L, "hdf5_chunk", body, NULL));
    lt_close(&L);
}

/* One deprecation line per new plugin named (not one per loader created). */
START_TEST(alias_says_once_which_plugin_to_use) {
    char *err = stderr_of(open_rows_twice_and_series);
    const char *r = "hdf5_chunk is deprecated: use plugin = hdf5_rows";
    const char *s = "hdf5_chunk (series mode) is deprecated: use plugin = hdf5_series";
    const char *a = strstr(err, r), *b = strstr(err, s);
    ck_assert_msg(a && !strstr(a + 1, r), "stderr: %s", err);
    ck_assert_msg(b && !strstr(b + 1, s), "stderr: %s", err);
    free(err);
}
END_TEST

/* The series' date keys in rows mode were refused by hdf5_chunk (they would
 * be ignored): still, by batch_fields (`pipeline check`) and create. */
START_TEST(alias_refuses_dates_in_rows_mode) {
    char p[512], body[1024];
    snprintf(body, sizeof body, "path = %s\ndatasets = x\ntrain_end = 1970-01-20\n",
             lf_make_rows_file(p, sizeof p));
    const char *want = "train_end = 1970-01-20 applies to series mode";
    pl_harness *h = pl_harness_new("data", "hdf5_chunk", body);
    ck_assert_msg(h != NULL, "%s", pl_error_message());
    const pl_loader_vtable *vt = pl_harness_vtable(h);
    pl_field_list fl;
    ck_assert_int_eq(vt->batch_fields(pl_harness_section(h), &fl), PL_ERR_CONFIG);
    ck_assert_msg(strstr(pl_error_message(), want), "%s", pl_error_message());
    pl_harness_free(h);
    lt_loader L;
    ck_assert_int_eq(lt_open(&L, "hdf5_chunk", body, NULL), PL_ERR_CONFIG);
    ck_assert_msg(strstr(pl_error_message(), want), "%s", pl_error_message());
}
END_TEST

int main(void) {
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    Suite *s = suite_create("hdf5_chunk");
    TCase *tc = tcase_create("alias");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, alias_serves_the_new_plugins_batches);
    tcase_add_test(tc, alias_says_once_which_plugin_to_use);
    tcase_add_test(tc, alias_refuses_dates_in_rows_mode);
    suite_add_tcase(s, tc);
    return pl_test_run(s);
}
