/* chain.c - stage chaining and the entry point of a run: `[pipeline]
 * requires` configs run first (depth first, each once, a finished run
 * reused), then this config's run. pl_trainer_run is here so that the
 * recursion of a chain (a required run requires others) stays in one file:
 * the rest of the run (trainer_setup.c, trainer_phases.c, run_dirs.c) sits
 * below it. */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <sys/stat.h>
#include <time.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "trainer_internal.h"
/* summary.json of run directory `dir` says status "ok"; a run without one
 * (written before summaries existed) counts by its last checkpoint alone. */
static bool run_finished_ok(const char *dir) {
    char p[PATH_MAX + 32];
    snprintf(p, sizeof p, "%s/summary.json", dir);
    FILE *f = pl_file_fopen_read(p, NULL); /* a FIFO there must not block */
    if (!f) {
        pl_error_clear();
        return true;
    }
    char buf[65536];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    cJSON *o = cJSON_Parse(buf);
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(o, "status");
    bool ok = cJSON_IsString(st) && !strcmp(st->valuestring, "ok");
    cJSON_Delete(o);
    return ok;
}

/* ---- stage chaining -------------------------------------------------------------------------- */

/* Depth-first walk of the requires graph from `cfg`; `stack` holds the
 * real paths of the configs on the current path (depth of them). */
#define REQ_MAX_DEPTH 32
static pl_status req_walk(const pl_config *cfg, pl_registry *reg, char (*stack)[PATH_MAX],
                          int depth) {
    for (int i = 0; i < pl_config_requires_count(cfg); i++) {
        const char *req = pl_config_requires_at(cfg, i);
        char rp[PATH_MAX];
        if (!realpath(req, rp)) snprintf(rp, sizeof rp, "%s", req);
        for (int d = 0; d < depth; d++) {
            if (strcmp(stack[d], rp)) continue;
            char chain[4096];
            size_t k = 0;
            for (int e = d; e < depth && k < sizeof chain; e++)
                k += (size_t)snprintf(chain + k, sizeof chain - k, "%s -> ", stack[e]);
            if (k < sizeof chain) snprintf(chain + k, sizeof chain - k, "%s", rp);
            pl_hint_set("a config cannot require itself, directly or through others");
            return pl_error_set(PL_ERR_CONFIG, "[pipeline] requires forms a cycle: %s", chain);
        }
        if (depth == REQ_MAX_DEPTH)
            return pl_error_set(PL_ERR_CONFIG, "[pipeline] requires chain deeper than %d configs "
                                "(at %s)", REQ_MAX_DEPTH, rp);
        pl_config *rc = pl_config_load(req, 0, NULL, reg);
        if (!rc)
            return pl_error_prefix(pl_error_status(), "%s (required by %s)", req,
                                   pl_config_path(cfg));
        snprintf(stack[depth], PATH_MAX, "%s", rp);
        pl_status st = req_walk(rc, reg, stack, depth + 1);
        pl_config_free(rc);
        if (st) return st;
    }
    return PL_OK;
}

pl_status pl_trainer_check_requires(const pl_config *cfg, pl_registry *reg) {
    char (*stack)[PATH_MAX] = calloc(REQ_MAX_DEPTH + 1, PATH_MAX);
    if (!stack) return pl_error_set(PL_ERR_NOMEM, "requires: out of memory");
    if (!realpath(pl_config_path(cfg), stack[0]))
        snprintf(stack[0], PATH_MAX, "%s", pl_config_path(cfg));
    pl_status st = req_walk(cfg, reg, stack, 1);
    free(stack);
    return st;
}

int tr_run_requirements(trainer *t) {
    /* a cycle would recurse until the stack overflows: refuse it first (the
     * requirements' own runs check again, which is cheap) */
    if (pl_trainer_check_requires(t->cfg, t->reg)) {
        fprintf(stderr, "error: %s\n", pl_error_message());
        const char *h = pl_hint_get();
        if (h && h[0]) fprintf(stderr, "hint: %s\n", h);
        return 2;
    }
    int n = pl_config_requires_count(t->cfg);
    tr_runwide rw;
    tr_runwide_of(t, &rw);
    if (n > 0 && pl_launcher_rank() == 0 && (rw.n || rw.kept[0])) {
        char list[256];
        size_t k = 0;
        for (const char *const *key = pl_pipeline_runwide_keys(); *key && k < sizeof list; key++)
            k += (size_t)snprintf(list + k, sizeof list - k, "%s%s", k ? ", " : "", *key);
        for (int i = 0; i < rw.n; i++)
            printf("%s: the runs it requires inherit %s (%s)\n", pl_config_path(t->cfg), rw.v[i],
                   rw.origin);
        if (rw.kept[0])
            printf("%s: these overrides apply to it alone, not to the runs it requires (only "
                   "[pipeline] %s are handed on): %s\n",
                   pl_config_path(t->cfg), list, rw.kept);
    }
    for (int i = 0; i < n; i++) {
        const char *req = pl_config_requires_at(t->cfg, i);
        pl_config *rc = tr_load_in_chain(t, req);
        if (!rc) {
            fprintf(stderr, "error: %s (required by %s): %s\n", req, pl_config_path(t->cfg),
                    pl_error_message());
            return 2;
        }
        char latest[PATH_MAX], ck[PATH_MAX + 64];
        pl_trainer_latest_dir(rc, latest, sizeof latest);
        snprintf(ck, sizeof ck, "%s/checkpoints/last.safetensors", latest);
        if (access(ck, R_OK) == 0 && run_finished_ok(latest)) {
            if (pl_launcher_rank() == 0)
                printf("%s: requirement %s satisfied by %s\n", pl_config_path(t->cfg), req,
                       latest);
            pl_config_free(rc);
            continue;
        }
        if (pl_launcher_rank() == 0) {
            printf("%s needs %s, which has no finished run (no %s from a run that ended ok): "
                   "running it first\n",
                   pl_config_path(t->cfg), req, ck);
            pl_config_print(rc, stdout);
        }
        pl_run_options o = {.config_path = req,
                            .argc = rw.n,
                            .argv = rw.v,
                            .inherited_from = rw.n ? rw.origin : NULL};
        int rc_code = pl_trainer_run(rc, t->reg, &o);
        pl_config_free(rc);
        if (rc_code) return rc_code;
    }
    return 0;
}

int pl_trainer_run(pl_config *cfg, pl_registry *reg, const pl_run_options *opts) {
    trainer T = {0}, *t = &T;
    /* the run's context is this thread's current one for the whole run: the
     * ops read its autocast, which the precision sets (plugin.h, "Autocast");
     * a required run makes its own current and puts this one back */
    pl_run_context *prev_ctx = pl_run_context_make_current(&t->ctx);
    int code = tr_run_settings(t, cfg, reg, opts);
    if (!code) code = tr_run_requirements(t);
    if (!code) code = tr_run_open(t);
    if (!code) code = tr_run_main(t);
    pl_run_context_make_current(prev_ctx);
    return code;
}
