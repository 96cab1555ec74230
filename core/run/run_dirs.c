/* run_dirs.c - run directories and the references between runs: the
 * runs/<name>/latest link (the newest run that ended ok), the
 * runs/<name>/last_attempt link (the newest run started), the configs of a
 * chain as its runs see them (the run-wide overrides), `@INI:best|last`
 * references in init_from and `@INI:outputs/FILE` values, `--resume last`,
 * and removing the NAME.tmp.<pid> files a killed run left in its run tree.
 * Below chain.c, which runs the requirements. */
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

const char *pl_trainer_latest_dir(const pl_config *cfg, char *buf, size_t n) {
    const pl_config_section *p = pl_config_section_get(cfg, "pipeline");
    const char *rd = pl_cfg_str(p, "run_dir", "runs");
    const char *name = pl_cfg_str(p, "name", "");
    char stem[128];
    if (!name[0]) {
        const char *path = pl_config_path(cfg), *b = strrchr(path, '/');
        snprintf(stem, sizeof stem, "%s", b ? b + 1 : path);
        char *dot = strrchr(stem, '.');
        if (dot) *dot = 0;
        name = stem;
    }
    snprintf(buf, n, "%s/%s/latest", rd, name);
    return buf;
}

/* RUN_DIR/NAME/<link> -> this run's directory: relative (the directory's own
 * name, so a runs/ tree can be moved), replaced by rename so the link is
 * never missing; a failure is a warning (the run itself is not affected). */
static void point_link(const trainer *t, const char *link) {
    char latest[PATH_MAX], path[PATH_MAX + 32], tmp[PATH_MAX + 64];
    pl_trainer_latest_dir(t->cfg, latest, sizeof latest);
    *strrchr(latest, '/') = 0; /* RUN_DIR/NAME */
    snprintf(path, sizeof path, "%s/%s", latest, link);
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    const char *leaf = strrchr(t->run_dir, '/') + 1;
    unlink(tmp);
    if (symlink(leaf, tmp) || rename(tmp, path)) {
        fprintf(stderr, "warning: cannot point %s at %s: %s\n", path, leaf, strerror(errno));
        unlink(tmp);
    }
}

void tr_mark_latest(trainer *t) { point_link(t, "latest"); }

/* ---- run-wide overrides down the chain ---------------------------------------------------------- */

void tr_runwide_of(const trainer *t, tr_runwide *rw) {
    memset(rw, 0, sizeof *rw);
    const pl_run_options *o = t->opts;
    if (!o) return;
    if (o->inherited_from)
        snprintf(rw->origin, sizeof rw->origin, "%s", o->inherited_from);
    else
        snprintf(rw->origin, sizeof rw->origin, "command line of %s",
                 o->config_path ? o->config_path : pl_config_path(t->cfg));
    size_t k = 0;
    for (int i = 0; i < o->argc; i++) {
        char sec[128], key[256];
        const char *value;
        if (pl_override_parse(o->argv[i], sec, sizeof sec, key, sizeof key, &value)) {
            pl_error_clear(); /* the config loaded with it: cannot happen */
            continue;
        }
        if (value && !strcmp(sec, "pipeline") && pl_pipeline_key_is_runwide(key) &&
            rw->n < RW_MAX) {
            rw->v[rw->n++] = o->argv[i];
        } else if (!o->inherited_from && k < sizeof rw->kept) {
            k += (size_t)snprintf(rw->kept + k, sizeof rw->kept - k, "%s%s", k ? " " : "",
                                  o->argv[i]);
        }
    }
}

/* A config of this run's chain (a requirement, an @INI reference) as the
 * runs of the chain see it: with the run-wide overrides, so that
 * `pipeline.run_dir=X` finds and makes the required runs under X. */
pl_config *tr_load_in_chain(const trainer *t, const char *ini) {
    tr_runwide rw;
    tr_runwide_of(t, &rw);
    return pl_config_load_as(ini, rw.n, (const char *const *)rw.v, rw.origin, t->reg);
}

/* Every `@INI:outputs/FILE` value of the config becomes the path of FILE in
 * that config's latest run (RUN_DIR/NAME/latest/outputs/FILE), which must
 * exist: called once the required runs have run, so config.ini of this run
 * records the file actually read. */
pl_status tr_resolve_output_refs(trainer *t) {
    for (int i = 0; i < pl_config_section_count(t->cfg); i++) {
        const pl_config_section *s = pl_config_section_at(t->cfg, i);
        for (int k = 0; k < pl_cfg_count(s); k++) {
            const char *v = pl_cfg_value_at(s, k);
            char ini[PATH_MAX], rel[PATH_MAX], out[2 * PATH_MAX + 8], latest[PATH_MAX];
            int r = pl_config_parse_output_ref(t->cfg, v, ini, sizeof ini, rel, sizeof rel);
            if (r < 0) return pl_error_status();
            if (r == 0) continue;
            pl_config *rc = tr_load_in_chain(t, ini);
            if (!rc)
                return pl_error_prefix(pl_error_status(), "[%s] %s = %s", pl_cfg_section_name(s),
                                       pl_cfg_key_at(s, k), v);
            pl_trainer_latest_dir(rc, latest, sizeof latest);
            pl_config_free(rc);
            snprintf(out, sizeof out, "%s/%s", latest, rel);
            if (access(out, R_OK) != 0) {
                pl_hint_set("run %s (with what writes %s) first, or list it in [pipeline] "
                            "requires", ini, rel);
                return pl_error_set(PL_ERR_IO, "[%s] %s = %s: %s does not exist",
                                    pl_cfg_section_name(s), pl_cfg_key_at(s, k), v, out);
            }
            char real[PATH_MAX];
            const char *use = realpath(out, real) ? real : out;
            pl_status st = pl_config_set_resolved(t->cfg, pl_cfg_section_name(s),
                                                  pl_cfg_key_at(s, k), use);
            if (st) return st;
        }
    }
    return PL_OK;
}

/* init_from: a path or @INI:best|last */
pl_status tr_resolve_init_from(trainer *t, const char *v, char *out, size_t n) {
    char ini[PATH_MAX], which[32];
    int r = pl_config_parse_ref(t->cfg, v, ini, sizeof ini, which, sizeof which);
    if (r < 0) return pl_error_status();
    if (r == 0) {
        snprintf(out, n, "%s", v);
        return PL_OK;
    }
    pl_config *rc = tr_load_in_chain(t, ini);
    if (!rc) return pl_error_prefix(pl_error_status(), "init_from %s", v);
    char latest[PATH_MAX];
    pl_trainer_latest_dir(rc, latest, sizeof latest);
    pl_config_free(rc);
    snprintf(out, n, "%s/checkpoints/%s.safetensors", latest, which);
    if (access(out, R_OK) != 0) {
        /* a config without validation writes no best: fall back to last */
        if (!strcmp(which, "best")) {
            snprintf(out, n, "%s/checkpoints/last.safetensors", latest);
            if (access(out, R_OK) == 0) return PL_OK;
        }
        return pl_error_set(PL_ERR_IO, "init_from %s: %s does not exist (run %s first, or list it "
                            "in [pipeline] requires)", v, out, ini);
    }
    return PL_OK;
}

/* The newest run directory under `base` (timestamped names sort in time
 * order) other than `self` that holds checkpoints/last.safetensors. */
int tr_newest_last_checkpoint(const char *base, const char *self, char *out, size_t n) {
    struct dirent **ents = NULL;
    int k = scandir(base, &ents, NULL, alphasort), found = -1;
    const char *self_leaf = strrchr(self, '/') ? strrchr(self, '/') + 1 : self;
    for (int i = k - 1; i >= 0; i--) {
        const char *d = ents[i]->d_name;
        if (found < 0 && d[0] != '.' && strcmp(d, "latest") && strcmp(d, "last_attempt") &&
            !strstr(d, ".tmp.") && strcmp(d, self_leaf)) {
            snprintf(out, n, "%s/%s/checkpoints/last.safetensors", base, d);
            if (access(out, R_OK) == 0) found = 0;
        }
        free(ents[i]);
    }
    free(ents);
    return found;
}

/* ---- orphan temporary files -------------------------------------------------------------------- */

/* The pid of a temporary name NAME.tmp.<pid>, or 0 for any other name. */
static long tmp_pid(const char *name) {
    const char *p = strstr(name, ".tmp."), *next;
    if (!p) return 0;
    while ((next = strstr(p + 1, ".tmp."))) p = next;
    p += 5;
    if (!*p) return 0;
    long pid = 0;
    for (; *p; p++) {
        if (*p < '0' || *p > '9' || pid > 100000000) return 0;
        pid = pid * 10 + (*p - '0');
    }
    return pid;
}

int tr_remove_orphan_tmp(const char *dir, double min_age_s,
                         void (*report)(void *ud, const char *path, long pid), void *ud) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    int removed = 0;
    time_t now = time(NULL);
    for (struct dirent *e; (e = readdir(d));) {
        long pid = tmp_pid(e->d_name);
        if (pid <= 0) continue;
        char p[PATH_MAX];
        struct stat st;
        if ((size_t)snprintf(p, sizeof p, "%s/%s", dir, e->d_name) >= sizeof p || lstat(p, &st) ||
            !(S_ISREG(st.st_mode) || S_ISLNK(st.st_mode)))
            continue;
        /* a live pid (ours, or EPERM: another user's) may still be writing it; a
         * recent file may be written by a process of another host sharing the
         * directory, whose pid means nothing here */
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue;
        if (difftime(now, st.st_mtime) < min_age_s) continue;
        if (unlink(p) == 0) {
            removed++;
            if (report) report(ud, p, pid);
        }
    }
    closedir(d);
    return removed;
}

static void report_orphan(void *ud, const char *path, long pid) {
    tr_log(ud, "removed %s: a temporary file left by process %ld, which no longer runs (killed "
           "while writing)\n", path, pid);
}

void tr_sweep_orphan_tmp(trainer *t) {
    char base[PATH_MAX];
    pl_trainer_latest_dir(t->cfg, base, sizeof base);
    *strrchr(base, '/') = 0; /* RUN_DIR/NAME: the links' temporaries */
    tr_remove_orphan_tmp(base, TR_ORPHAN_MIN_AGE_S, report_orphan, t);
    struct dirent **ents = NULL;
    int k = scandir(base, &ents, NULL, alphasort);
    for (int i = 0; i < k; i++) {
        const char *d = ents[i]->d_name;
        if (d[0] != '.' && strcmp(d, "latest") && strcmp(d, "last_attempt") && !tmp_pid(d)) {
            /* a run: summary.json at its top, checkpoints/, outputs/ */
            static const char *const sub[] = {"", "/checkpoints", "/outputs"};
            for (int j = 0; j < 3; j++) {
                char p[PATH_MAX + 300];
                snprintf(p, sizeof p, "%s/%s%s", base, d, sub[j]);
                tr_remove_orphan_tmp(p, TR_ORPHAN_MIN_AGE_S, report_orphan, t);
            }
        }
        free(ents[i]);
    }
    free(ents);
}

pl_status tr_make_run_dir(trainer *t) {
    const char *rd = pl_cfg_str(t->pipe, "run_dir", "runs");
    char latest[PATH_MAX];
    pl_trainer_latest_dir(t->cfg, latest, sizeof latest);
    char base[PATH_MAX];
    snprintf(base, sizeof base, "%s", latest);
    *strrchr(base, '/') = 0;
    const char *slash = strrchr(base, '/');
    snprintf(t->name, sizeof t->name, "%s", slash ? slash + 1 : base);
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    char stamp[64];
    strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &tm);
    for (int k = 0; k < 100; k++) {
        if (k)
            snprintf(t->run_dir, sizeof t->run_dir, "%s/%s-%d", base, stamp, k);
        else
            snprintf(t->run_dir, sizeof t->run_dir, "%s/%s", base, stamp);
        if (access(t->run_dir, F_OK) != 0) break;
    }
    char ck[PATH_MAX + 16];
    snprintf(ck, sizeof ck, "%s/checkpoints", t->run_dir);
    if (tr_mkdir_p(ck))
        return pl_error_set(PL_ERR_IO, "cannot create run directory %s (run_dir = %s): %s",
                            t->run_dir, rd, strerror(errno));
    /* `latest` moves only when the run ends ok (tr_mark_latest), so a failed
     * or interrupted run never replaces the finished run requirements use */
    point_link(t, "last_attempt");
    snprintf(t->last_path, sizeof t->last_path, "%s/checkpoints/last.safetensors", t->run_dir);
    return PL_OK;
}
