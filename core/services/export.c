/* export.c - `pipeline export RUN_DIR --format F OUT_DIR`: see export.h.
 *
 * Order: check RUN_DIR, OUT_DIR and the checkpoint (nothing built yet), load
 * RUN_DIR/config.ini (on the CPU, without the run's requires / init_from /
 * resume: the checkpoint holds the weights), check that the model plugin
 * exports at all, build the stages as the run did (tr_build_model), load the
 * checkpoint's weights (tr_load_weights, every parameter required), then the
 * model writes into OUT_DIR.tmp.<pid>, which is renamed to OUT_DIR.
 */
#define _GNU_SOURCE /* nftw */
#include "export.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "trainer_internal.h"

static bool is_dir(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static bool is_file(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* OUT_DIR may be absent or an empty directory (rename(2) replaces one). */
static pl_status check_out_dir(const char *out) {
    struct stat sb;
    if (stat(out, &sb) != 0) return PL_OK;
    if (!S_ISDIR(sb.st_mode)) {
        pl_hint_set("choose another OUT_DIR, or remove the file");
        return pl_error_set(PL_ERR_CONFIG, "export: OUT_DIR %s exists and is not a directory", out);
    }
    DIR *d = opendir(out);
    if (!d)
        return pl_error_set(PL_ERR_IO, "export: cannot read OUT_DIR %s: %s", out, strerror(errno));
    struct dirent *e;
    bool empty = true;
    while (empty && (e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) empty = false;
    closedir(d);
    if (!empty) {
        pl_hint_set("export writes a new directory: remove %s or choose another OUT_DIR", out);
        return pl_error_set(PL_ERR_CONFIG, "export: OUT_DIR %s exists and is not empty", out);
    }
    return PL_OK;
}

/* The checkpoint to export: best (else last, with a note), last, or a path. */
static pl_status resolve_checkpoint(const char *run_dir, const char *which, char *out, size_t n) {
    if (!which || !strcmp(which, "best") || !strcmp(which, "last")) {
        bool best = !which || !strcmp(which, "best");
        snprintf(out, n, "%s/checkpoints/%s.safetensors", run_dir, best ? "best" : "last");
        if (is_file(out)) return PL_OK;
        if (best) {
            char last[PATH_MAX];
            snprintf(last, sizeof last, "%s/checkpoints/last.safetensors", run_dir);
            if (is_file(last)) {
                printf("export: %s has no best checkpoint (no validation ran, or save_best = "
                       "false); using the last one\n",
                       run_dir);
                snprintf(out, n, "%s", last);
                return PL_OK;
            }
        }
        pl_hint_set("give a checkpoint file with --checkpoint PATH (ls %s/checkpoints)", run_dir);
        return pl_error_set(PL_ERR_CONFIG, "export: run %s has no %s checkpoint (%s)", run_dir,
                            best ? "best or last" : "last", out);
    }
    snprintf(out, n, "%s", which);
    if (!is_file(out))
        return pl_error_set(PL_ERR_CONFIG, "export: checkpoint %s does not exist", out);
    return PL_OK;
}

/* Absolute form of a path whose last component may not exist yet. */
static void absolute_path(const char *p, char *out, size_t n) {
    char a[PATH_MAX], b[PATH_MAX], dir[PATH_MAX];
    snprintf(a, sizeof a, "%s", p);
    snprintf(b, sizeof b, "%s", p);
    if (realpath(dirname(a), dir))
        snprintf(out, n, "%s/%s", dir, basename(b));
    else
        snprintf(out, n, "%s", p);
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

/* Remove a directory and what is in it (the temporary export on error). */
static void remove_tree(const char *dir) {
    nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* OUT_DIR/pipeline_export.json: where the weights came from. */
static pl_status write_record(const char *dir, const pl_export_request *r, const char *ckpt,
                              const char *model, const char *const *opts) {
    cJSON *j = cJSON_CreateObject();
    char run[PATH_MAX], path[PATH_MAX + 32];
    absolute_path(r->run_dir, run, sizeof run);
    cJSON_AddStringToObject(j, "format", r->format);
    cJSON_AddStringToObject(j, "run_dir", run);
    cJSON_AddStringToObject(j, "checkpoint", ckpt);
    cJSON_AddStringToObject(j, "model_plugin", model);
    cJSON *o = cJSON_AddObjectToObject(j, "options");
    for (int i = 0; opts[i]; i++) {
        const char *eq = strchr(opts[i], '=');
        char key[64];
        snprintf(key, sizeof key, "%.*s", (int)(eq - opts[i]), opts[i]);
        cJSON_AddStringToObject(o, key, eq + 1);
    }
    cJSON_AddStringToObject(j, "pipeline_version", PL_VERSION_STRING);
    char *text = cJSON_Print(j);
    cJSON_Delete(j);
    snprintf(path, sizeof path, "%s/pipeline_export.json", dir);
    FILE *f = text ? fopen(path, "w") : NULL;
    bool ok = f && fputs(text, f) >= 0 && fputc('\n', f) != EOF;
    if (f && fclose(f)) ok = false;
    free(text);
    return ok ? PL_OK : pl_error_set(PL_ERR_IO, "export: cannot write %s", path);
}

/* RUN_DIR/config.ini as the run resolved it: a key the run took from its
 * default is written `key = value  ; default` and loads as a default again
 * (config.c: pl_cfg_is_set is false for it), so a plugin that tells a key the
 * user set from its default (ilora refuses a shape option that disagrees with
 * a backbone's config.json, and dim = 64 is written as a default) sees what
 * the run saw. */
static pl_config *load_run_config(const char *path, int n_over, const char *const *over,
                                  pl_registry *reg) {
    return pl_config_load(path, n_over, over, reg);
}

pl_status pl_export_run(const pl_export_request *r, pl_registry *reg) {
    char cfg_path[PATH_MAX + 16], ckpt[PATH_MAX], dest[PATH_MAX], tmp[PATH_MAX + 32];
    if (!is_dir(r->run_dir)) {
        pl_hint_set("RUN_DIR is a run's directory, e.g. runs/teacher/latest");
        return pl_error_set(PL_ERR_CONFIG, "export: run directory %s does not exist", r->run_dir);
    }
    snprintf(cfg_path, sizeof cfg_path, "%s/config.ini", r->run_dir);
    if (!is_file(cfg_path)) {
        pl_hint_set("RUN_DIR is a run's directory (it holds config.ini, log.txt, checkpoints/), "
                    "e.g. runs/teacher/latest");
        return pl_error_set(PL_ERR_CONFIG, "export: %s is not a run directory (no config.ini)",
                            r->run_dir);
    }
    pl_status st = check_out_dir(r->out_dir);
    if (!st) st = resolve_checkpoint(r->run_dir, r->checkpoint, ckpt, sizeof ckpt);
    if (st) return st;
    /* the weights come from the checkpoint: no requirement runs, nothing is
     * initialized from elsewhere; an export needs no accelerator */
    const char *over[] = {"pipeline.device=cpu",
                          "pipeline.requires=", "trainer.init_from=", "trainer.resume="};
    pl_config *cfg = load_run_config(cfg_path, 4, over, reg);
    if (!cfg) return pl_error_prefix(PL_ERR_CONFIG, "export: the run's configuration");
    const pl_plugin_desc *md = pl_config_plugin(cfg, "model");
    if (!md) {
        pl_config_free(cfg);
        return pl_error_set(PL_ERR_CONFIG, "export: %s has no [model] section", cfg_path);
    }
    if (!pl_model_export_of(md)) {
        pl_hint_set("a model plugin exports by implementing export_model (plugin ABI 2.4, "
                    "docs/plugin-authors.md)");
        st = pl_error_set(PL_ERR_UNSUPPORTED,
                          "export: model plugin '%s' (%s, ABI %u.%u) has no "
                          "export (export_model)",
                          md->name, pl_config_plugin_path(cfg, "model"), md->abi_major,
                          md->abi_minor);
        pl_config_free(cfg);
        return st;
    }

    trainer T, *t = &T;
    st = tr_offline_init(t, cfg, reg, r->run_dir);
    t->ctx.device = PL_CPU;
    printf("export: run %s, model %s, checkpoint %s, format %s\n", r->run_dir, md->name, ckpt,
           r->format);
    fflush(stdout);
    if (!st) st = pl_trainer_check_fields(cfg);
    if (!st) st = tr_build_model(t, NULL);
    if (!st) st = tr_load_weights(t, ckpt);

    absolute_path(r->out_dir, dest, sizeof dest);
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", dest, (long)getpid());
    char parent[PATH_MAX];
    snprintf(parent, sizeof parent, "%s", dest);
    if (!st && tr_mkdir_p(dirname(parent)))
        st = pl_error_set(PL_ERR_IO, "export: cannot create %s: %s", parent, strerror(errno));
    bool made = false;
    if (!st) {
        if (mkdir(tmp, 0755))
            st = pl_error_set(PL_ERR_IO, "export: cannot create %s: %s", tmp, strerror(errno));
        else
            made = true;
    }
    char o_dest[PATH_MAX + 8], o_ckpt[PATH_MAX + 16], o_lora[80], o_dtype[80];
    char ckpt_abs[PATH_MAX];
    absolute_path(ckpt, ckpt_abs, sizeof ckpt_abs);
    snprintf(o_dest, sizeof o_dest, "dest=%s", dest);
    snprintf(o_ckpt, sizeof o_ckpt, "checkpoint=%s", ckpt_abs);
    const char *opts[5] = {o_dest, o_ckpt, NULL, NULL, NULL};
    int no = 2;
    if (r->lora) {
        snprintf(o_lora, sizeof o_lora, "lora=%s", r->lora);
        opts[no++] = o_lora;
    }
    if (r->dtype) {
        snprintf(o_dtype, sizeof o_dtype, "dtype=%s", r->dtype);
        opts[no++] = o_dtype;
    }
    if (!st) {
        pl_no_grad_begin();
        st = pl_model_export_of(md)(t->model.self, r->format, tmp, opts);
        pl_no_grad_end();
        if (st) pl_error_prefix(st, "export: model '%s' (format %s)", md->name, r->format);
    }
    if (!st) st = write_record(tmp, r, ckpt_abs, md->name, opts);
    if (!st && rename(tmp, dest))
        st = pl_error_set(PL_ERR_IO, "export: cannot rename %s to %s: %s", tmp, dest,
                          strerror(errno));
    if (st && made) remove_tree(tmp); /* nothing partial is left */
    if (!st) printf("export: wrote %s\n", dest);

    tr_destroy_stages(t);
    tr_offline_free(t);
    pl_config_free(cfg);
    return st;
}
