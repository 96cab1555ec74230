/* trainer_phases.c - a run once it can start (tr_run_main, called by
 * chain.c's pl_trainer_run): building the stages (trainer_setup.c), the fit
 * (trainer.c), then the phases test and export, summary.json and the exit
 * code.
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <omp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "backend_loader.h"
#include "crash.h"
#include "callback.h"
#include "trainer_internal.h"


/* ---- test and export ------------------------------------------------------------------------ */

static pl_status run_test(trainer *t) {
    pl_status st = PL_OK;
    double t0 = tr_now();
    pl_alloc_reset_peak(t->ctx.device);
    tr_devstats_phase(t, TR_PH_TEST, true);
    st = tr_dist_barrier(t); /* DDP: rank 0 has finished writing the checkpoints */
    if (st) return st;
    if (t->best_path[0] && access(t->best_path, R_OK) == 0) {
        tr_log(t, "test: using the best checkpoint %s (%s = %.5f)\n", t->best_path, t->monitor,
              t->best);
        st = tr_load_checkpoint(t, t->best_path, true);
    } else {
        tr_log(t, "test: using the last weights\n");
    }
    if (!st) st = tr_evaluate(t, PL_SPLIT_TEST, &t->test_metrics, t->limit[PL_SPLIT_TEST]);
    if (!st) st = tr_check_finite("test", &t->test_metrics);
    if (!st) {
        t->have_test = true;
        tr_print_metrics(t, "test:", "test", &t->test_metrics);
    }
    if (!st && t->avg.self && AVG(t)->has_average(t->avg.self)) {
        /* averaged weights are reported under the averager's own name */
        const char *who = t->avg.desc->name;
        st = AVG(t)->swap(t->avg.self);
        /* validation of the averaged weights too: whether averaging pays is
         * then decided on validation, like every other choice */
        if (!st) st = tr_evaluate(t, PL_SPLIT_VAL, &t->avg_val_metrics, t->limit[PL_SPLIT_VAL]);
        if (!st) st = tr_check_finite("val (averaged weights)", &t->avg_val_metrics);
        if (!st) st = tr_evaluate(t, PL_SPLIT_TEST, &t->avg_test_metrics, t->limit[PL_SPLIT_TEST]);
        if (!st) st = tr_check_finite("test (averaged weights)", &t->avg_test_metrics);
        if (!st) {
            t->have_avg_test = true;
            char prefix[96], heading[128];
            snprintf(prefix, sizeof prefix, "%s_val", who);
            snprintf(heading, sizeof heading, "val (%s averaged weights):", who);
            tr_print_metrics(t, heading, prefix, &t->avg_val_metrics);
            snprintf(prefix, sizeof prefix, "%s_test", who);
            snprintf(heading, sizeof heading, "test (%s averaged weights):", who);
            tr_print_metrics(t, heading, prefix, &t->avg_test_metrics);
            char p[PATH_MAX];
            snprintf(p, sizeof p, "%s/checkpoints/%s.safetensors", t->run_dir, who);
            st = tr_save_checkpoint(t, p);
        }
        if (!st) st = AVG(t)->swap(t->avg.self);
    }
    if (!st) st = TR_CB_DISPATCH(t, on_test_end);
    tr_devstats_phase(t, TR_PH_NONE, false);
    t->test_s = tr_now() - t0;
    t->ph_test.seconds = t->test_s;
    tr_peak_fold(t, &t->ph_test, false);
    return st;
}

static pl_status export_batch(trainer *t, const pl_batch *b, pl_data_split split, void *arg) {
    return tr_outputs_batch(t, PL_OUTPUTS_EXPORT, arg, b, split);
}

static pl_status run_export_all(trainer *t);

/* A model plugin built against ABI 2.4 - 2.8 writes its export itself
 * (export_begin / export_batch / export_end), as it did then: a minor
 * version adds, it never takes away. */
static bool legacy_export(const trainer *t) {
    const pl_model_vtable *M = MODEL(t);
    return t->model.desc->abi_minor < 9 && M->export_begin && M->export_batch && M->export_end;
}

static pl_status legacy_export_batch(trainer *t, const pl_batch *b, pl_data_split split,
                                     void *arg) {
    (void)arg;
    return MODEL(t)->export_batch(t->model.self, b, split);
}

static pl_status run_export(trainer *t) {
    if (!tr_outputs_supported(t) && !legacy_export(t)) {
        tr_log(t, "export: model '%s' has no outputs (plugin ABI 2.9); skipped\n",
               t->model.desc->name);
        return PL_OK;
    }
    if (t->rank > 0) return PL_OK; /* data parallel: rank 0 exports every split whole */
    if (t->world > 1 && t->stride == 1) {
        /* a loader that shards itself serves rank 0's part: undo it for the export */
        pl_status us = LOADER(t)->shard(t->loader.self, 0, 1);
        if (us) return pl_error_prefix(us, "export: unsharding the loader");
    }
    int stride = t->stride;
    t->stride = 1;
    pl_status st = run_export_all(t);
    tr_devstats_phase(t, TR_PH_NONE, false);
    t->stride = stride; /* the run's sharding, as summary.json reports it */
    return st;
}

/* The model's PL_OUTPUTS_EXPORT outputs of every batch of train, val and
 * test into outputs/<the file it names> (outputs.c). A model that exports
 * nothing (outputs_begin: PL_ERR_UNSUPPORTED) is skipped with a line. */
static pl_status run_export_all(trainer *t) {
    double t0 = tr_now();
    pl_alloc_reset_peak(t->ctx.device);
    tr_devstats_phase(t, TR_PH_EXPORT, true);
    snprintf(t->outputs_path, sizeof t->outputs_path, "%s/outputs", t->run_dir);
    if (tr_mkdir_p(t->outputs_path))
        return pl_error_set(PL_ERR_IO, "cannot create %s: %s", t->outputs_path, strerror(errno));
    if (legacy_export(t)) {
        pl_status st = MODEL(t)->export_begin(t->model.self, t->outputs_path);
        for (int s = 0; s < PL_SPLIT_COUNT && !st; s++)
            st = tr_each_batch(t, (pl_data_split)s, -1, legacy_export_batch, NULL);
        if (!st) st = MODEL(t)->export_end(t->model.self);
        t->export_s = tr_now() - t0;
        t->ph_export.seconds = t->export_s;
        tr_peak_fold(t, &t->ph_export, false);
        if (!st) tr_log(t, "export: outputs in %s (%.1fs)\n", t->outputs_path, t->export_s);
        return st;
    }
    struct pl_h5_out *f = NULL;
    pl_meta *attrs = pl_meta_new();
    pl_status st = attrs ? PL_OK : pl_error_status();
    if (!st) st = tr_outputs_begin(t, PL_OUTPUTS_EXPORT, t->outputs_path, attrs, &f, NULL, 0);
    pl_meta_free(attrs);
    if (st == PL_ERR_UNSUPPORTED) {
        pl_error_clear();
        tr_log(t, "export: model '%s' exports nothing; skipped\n", t->model.desc->name);
        return PL_OK;
    }
    for (int s = 0; s < PL_SPLIT_COUNT && !st; s++)
        st = tr_each_batch(t, (pl_data_split)s, -1, export_batch, f);
    if (f || !st) st = tr_outputs_finish(t, PL_OUTPUTS_EXPORT, &f, st);
    t->export_s = tr_now() - t0;
    t->ph_export.seconds = t->export_s;
    tr_peak_fold(t, &t->ph_export, false);
    if (!st) tr_log(t, "export: outputs in %s (%.1fs)\n", t->outputs_path, t->export_s);
    return st;
}

/* ---- the run -------------------------------------------------------------------------------- */

/* fit, then test and export; a signal during validation, test or export: the
 * phase ends, the next is skipped */
static pl_status run_phases(trainer *t) {
    pl_status st = tr_fit(t);
    if (!st && tr_signal_pending()) t->interrupted = tr_signal_pending();
    if (!st && t->do_test && !t->interrupted) st = run_test(t);
    if (!st && tr_signal_pending()) t->interrupted = tr_signal_pending();
    if (!st && t->do_export && !t->interrupted) st = run_export(t);
    return st;
}

/* summary.json, the latest link, the last barrier and the error or the resume
 * hint; `st` is the run's status (setup's or a phase's). Returns the exit code. */
static int run_finish(trainer *t, pl_status st) {
    int code = st ? (st == PL_ERR_CONFIG ? 2 : 1) : t->interrupted ? 128 + t->interrupted : 0;
    /* the error goes last, where the user looks, not above a report of nothing */
    if (t->rank == 0) tr_write_summary(t, code);
    if (t->interrupted && !st) tr_signals_mark_saved();
    if (!code && t->rank == 0) tr_mark_latest(t);
    /* the next run of a chain (or the caller) sees this one's files on every rank */
    if (!code && tr_dist_barrier(t)) code = 1;
    tr_signals_restore();
    if (st || code == 1) {
        tr_fail(t, code);
        tr_dist_abort(t, code); /* a failing rank stops the others (no return when N > 1) */
    }
    if (!st && t->interrupted)
        tr_log(t, "run interrupted: resume with `pipeline run %s --resume last`\n",
               pl_config_path(t->cfg));
    return code;
}

static void run_free(trainer *t) {
    tr_callbacks_destroy(t);
    tr_destroy_stages(t);
    pl_params_free(t->ctx.params);
    pl_meta_free(t->ctx.meta);
    free(t->epoch_s);
    free(t->dist_grads);
    tr_set_message_run(NULL);
    if (t->log) fclose(t->log);
    if (t->metrics) fclose(t->metrics);
}

int tr_run_main(trainer *t) {
    double load_start = 0;
    pl_status st = tr_run_build(t, &load_start);
    if (!st) st = tr_run_load(t, load_start);
    tr_signals_install();
    if (!st) st = run_phases(t);
    int code = run_finish(t, st);
    run_free(t);
    return code;
}
