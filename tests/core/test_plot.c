/* test_plot.c - `pipeline plot` (core/services/plot.c) on hand-written metrics.csv
 * files: the splits of a metric share one panel (train and validation curves,
 * the test value a marked point), keys without a split have their own panel,
 * --compare overlays runs with a legend naming them, and bad input names the
 * file. The SVG is read back as text: its structure (panels, curves, points,
 * legend) is what is checked, not pixels. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "pl_test.h"
#include "plot.h"

#define CK_HAS(hay, needle) \
    ck_assert_msg(strstr((hay), (needle)) != NULL, "expected '%s' in:\n%.4000s", (needle), (hay))

static char g_tmp[64];

static void fresh_tmp(void) {
    snprintf(g_tmp, sizeof g_tmp, "/tmp/pl_test_plot_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(g_tmp));
}

static void remove_tmp(void) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_tmp);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_tmp);
}

static int count(const char *s, const char *what) {
    int n = 0;
    for (const char *p = s; (p = strstr(p, what)); p += strlen(what)) n++;
    return n;
}

/* a run directory under g_tmp with this metrics.csv */
static const char *run_dir(const char *name, const char *csv) {
    static char dirs[4][512];
    static int k;
    char *d = dirs[k++ % 4];
    snprintf(d, 512, "%s/%s", g_tmp, name);
    mkdir(d, 0755);
    char p[600];
    snprintf(p, sizeof p, "%s/metrics.csv", d);
    pl_test_write_file(p, csv);
    return d;
}

static const char *k_csv = "step,epoch,key,value\n"
                           "1,0,train_loss,2.0\n"
                           "1,0,lr,0.001\n"
                           "2,0,train_loss,1.5\n"
                           "2,0,lr,0.002\n"
                           "2,0,val_loss,1.7\n"
                           "3,1,train_loss,1.2\n"
                           "3,1,lr,0.001\n"
                           "4,1,train_loss,nan\n"
                           "4,1,val_loss,1.4\n"
                           "4,1,val_accuracy,0.6\n"
                           "4,2,test_loss,1.45\n"
                           "4,2,test_accuracy,0.58\n";

START_TEST(splits_share_a_panel_and_test_is_a_point) {
    fresh_tmp();
    const char *d = run_dir("a", k_csv);
    char written[4096];
    PL_CK_OK(pl_plot_run(d, NULL, written, sizeof written));
    char want[600];
    snprintf(want, sizeof want, "%s/plot.svg", d);
    ck_assert_str_eq(written, want);
    char *svg = pl_test_read_file(written);
    /* panels: loss (train, val, test), lr, accuracy (val, test) */
    ck_assert_int_eq(count(svg, "class=\"panel\""), 3);
    CK_HAS(svg, "font-weight=\"bold\">loss<");
    CK_HAS(svg, "font-weight=\"bold\">accuracy<");
    CK_HAS(svg, "font-weight=\"bold\">lr<");
    /* curves: train_loss (the NaN row dropped), val_loss, lr */
    ck_assert_int_eq(count(svg, "class=\"curve\""), 3);
    CK_HAS(svg, "<title>train_loss</title>");
    CK_HAS(svg, "stroke-dasharray=\"5,3\" points="); /* validation dashed */
    /* test values, and any single value (val_accuracy), are marked points with
     * their values, not empty panels */
    ck_assert_int_eq(count(svg, "class=\"point\""), 3);
    CK_HAS(svg, "<title>val_accuracy = 0.6</title>");
    CK_HAS(svg, "<title>test_loss = 1.45</title>");
    CK_HAS(svg, "<title>test_accuracy = 0.58</title>");
    ck_assert_int_eq(count(svg, "class=\"run\""), 0); /* no run legend for one run */
    free(svg);
    remove_tmp();
}
END_TEST

START_TEST(compare_overlays_runs_with_a_legend) {
    fresh_tmp();
    const char *runs[2] = {run_dir("lora", k_csv), run_dir("ilora", k_csv)};
    char written[4096], out[600];
    snprintf(out, sizeof out, "%s/ablation.svg", g_tmp);
    PL_CK_OK(pl_plot_runs(runs, 2, out, written, sizeof written));
    ck_assert_str_eq(written, out);
    char *svg = pl_test_read_file(out);
    ck_assert_int_eq(count(svg, "class=\"panel\""), 3);
    ck_assert_int_eq(count(svg, "class=\"curve\""), 6);
    ck_assert_int_eq(count(svg, "class=\"point\""), 6);
    ck_assert_int_eq(count(svg, "class=\"run\""), 2);
    CK_HAS(svg, runs[0]);
    CK_HAS(svg, runs[1]);
    CK_HAS(svg, "stroke=\"#1f77b4\""); /* run 0's colour */
    CK_HAS(svg, "stroke=\"#ff7f0e\""); /* run 1's */
    free(svg);
    /* default output: the first run's compare.svg */
    PL_CK_OK(pl_plot_runs(runs, 2, NULL, written, sizeof written));
    char want[600];
    snprintf(want, sizeof want, "%s/compare.svg", runs[0]);
    ck_assert_str_eq(written, want);
    remove_tmp();
}
END_TEST

START_TEST(bad_input_names_the_file) {
    fresh_tmp();
    char missing[600];
    snprintf(missing, sizeof missing, "%s/none", g_tmp);
    ck_assert_int_eq(pl_plot_run(missing, NULL, NULL, 0), PL_ERR_IO);
    CK_HAS(pl_error_message(), "none/metrics.csv");
    const char *d = run_dir("bad", "step,key,value\n1,loss,2\n");
    ck_assert_int_eq(pl_plot_run(d, NULL, NULL, 0), PL_ERR_IO);
    CK_HAS(pl_error_message(), "metrics.csv:1: header is not 'step,epoch,key,value'");
    d = run_dir("row", "step,epoch,key,value\n1,0,train_loss\n");
    ck_assert_int_eq(pl_plot_run(d, NULL, NULL, 0), PL_ERR_IO);
    CK_HAS(pl_error_message(), "metrics.csv:2: expected step,epoch,key,value");
    d = run_dir("empty", "step,epoch,key,value\n");
    ck_assert_int_eq(pl_plot_run(d, NULL, NULL, 0), PL_ERR_IO);
    CK_HAS(pl_error_message(), "no metric rows to plot");
    const char *nine[9];
    for (int i = 0; i < 9; i++) nine[i] = d;
    ck_assert_int_eq(pl_plot_runs(nine, 9, NULL, NULL, 0), PL_ERR_INVALID);
    pl_error_clear();
    remove_tmp();
}
END_TEST

int main(void) {
    Suite *s = suite_create("plot");
    TCase *tc = tcase_create("plot");
    tcase_add_test(tc, splits_share_a_panel_and_test_is_a_point);
    tcase_add_test(tc, compare_overlays_runs_with_a_legend);
    tcase_add_test(tc, bad_input_names_the_file);
    suite_add_tcase(s, tc);
    return pl_test_run(s);
}
