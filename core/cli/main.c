/* main.c - the `pipeline` command line: run, check, predict, plugins, plot,
 * export, help, --version.
 *
 * Exit codes: 0 ok, 1 the run failed, 2 usage or configuration error.
 * Errors go to stderr as one line naming the problem and one "hint:" line. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config_internal.h"
#include "check_groups.h"
#include "crash_handler.h"
#include "export.h"
#include "ops_cmd.h"
#include "registry.h"
#include "plot.h"
#include "png.h"
#include "predict.h"
#include "trainer.h"

#define EXIT_RUN_FAILED 1
#define EXIT_USAGE 2

static const char *status_hint(pl_status s) {
    switch (s) {
    case PL_ERR_IO: return "check that the file exists and is readable";
    case PL_ERR_ABI: return "rebuild the plugin against this pipeline's headers";
    case PL_ERR_NOMEM: return "free memory or reduce the batch size";
    case PL_ERR_CONFIG: return "`pipeline check FILE.ini` validates a config without running it";
    default: return "see `pipeline help`";
    }
}

/* Print the thread's error and hint to stderr. */
static void report_error(const char *fallback) {
    const char *msg = pl_error_message();
    const char *hint = pl_hint_get();
    fprintf(stderr, "error: %s\n", msg && *msg ? msg : fallback);
    fprintf(stderr, "hint: %s\n", hint && *hint ? hint : status_hint(pl_error_status()));
}

static int usage_error(const char *cmd, const char *fmt, const char *arg) {
    fprintf(stderr, "error: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\nhint: see `pipeline help%s%s`\n", cmd ? " " : "", cmd ? cmd : "");
    return EXIT_USAGE;
}

/* ---- help ------------------------------------------------------------- */

#define OVERRIDE_HELP                                                                         \
    "\n"                                                                                  \
    "OVERRIDE, applied after the file (removals first, then settings):\n"                  \
    "  section.key=value  set a key (section.key= sets the empty string, e.g.\n"           \
    "                     pipeline.requires= clears the list)\n"                           \
    "  ~section.key       drop a key the file sets, as if its line were not there\n"       \
    "                     (its default then applies); e.g. after optimizer.plugin=sgd,\n"  \
    "                     ~optimizer.beta1 drops a key only the old plugin knew\n"         \
    "  ~section           drop a section the file has, e.g. ~scheduler\n"                   \
    "Dropping what the file does not set is an error. Quote ~ if your shell expands it.\n"

static const char *general_help =
    "usage: pipeline COMMAND [ARGS]\n"
    "\n"
    "commands:\n"
    "  run FILE.ini [OVERRIDE]... [--resume PATH|last] [--plugin-path DIR]...\n"
    "                 resolve the config, then train, validate, test and export\n"
    "  check FILE.ini [OVERRIDE]... [--plugin-path DIR]...\n"
    "                 resolve and validate the config, print it, run nothing\n"
    "  predict RUN_DIR INPUT.h5 OUT.h5 [--checkpoint best|last|PATH] [--split test]\n"
    "          [OVERRIDE]...\n"
    "                 run a trained model on new rows; predictions to OUT.h5\n"
    "  plugins [NAME] [--plugin-path DIR]...\n"
    "                 list every plugin found, or one plugin's options\n"
    "  plot RUN_DIR [OUT.svg|OUT.png] | plot --compare RUN_DIR... [-o OUT.svg|OUT.png]\n"
    "                 draw the run's metrics.csv curves (train/val/test per panel, lr) to\n"
    "                 RUN_DIR/plot.svg; --compare overlays runs\n"
    "  export RUN_DIR --format hf OUT_DIR [--checkpoint best|last|PATH] [--lora peft|merge]\n"
    "         [--dtype f32|bf16|f16]\n"
    "                 write a run's weights for other tools (hf: a Hugging Face directory)\n"
    "  ops [--markdown]\n"
    "                 every built-in op: inputs, outputs, what its backward reads and saves\n"
    "  help [COMMAND] this text, or one command's usage\n"
    "  --version      print the version\n"
    "\n"
    "Plugins are searched in: --plugin-path DIRs, PIPELINE_PLUGIN_PATH (colon-separated),\n"
    "the build tree's plugin dir, then the install dir. Exit codes: 0 ok, 1 run failed,\n"
    "2 usage or configuration error. INI keys: docs/ini-reference.md.\n"
    OVERRIDE_HELP;

static const char *run_help =
    "usage: pipeline run FILE.ini [OVERRIDE]... [--resume PATH|last] [--plugin-path DIR]...\n"
    "\n"
    "Resolves FILE.ini (overrides applied after the file, e.g. optimizer.lr=5e-4 or\n"
    "precision.plugin=bf16), prints the resolved config, then runs fit, test and export\n"
    "into [pipeline] run_dir/NAME/TIMESTAMP/ (its files: docs/run-files.md).\n"
    "The configs in [pipeline] requires that have no finished run are run first; overrides\n"
    "of pipeline.device, threads, run_dir, allow_tf32 and verbose apply to them too, every\n"
    "other override to FILE.ini alone (docs/ini-reference.md, Stage chaining).\n"
    "  --resume PATH|last   resume from a checkpoint file, or the last run of this config\n"
    "                       (same as trainer.resume=...)\n"
    "  --plugin-path DIR    search DIR for plugins first (repeatable)\n"
    OVERRIDE_HELP;

static const char *check_help =
    "usage: pipeline check FILE.ini [OVERRIDE]... [--plugin-path DIR]...\n"
    "\n"
    "Resolves and validates FILE.ini with its overrides: every plugin is loaded and every\n"
    "key checked against its schema. Prints every key with its value and origin (default,\n"
    "file:line or command line). Exit code 0 if valid, 2 otherwise.\n"
    OVERRIDE_HELP;

static const char *predict_help =
    "usage: pipeline predict RUN_DIR INPUT.h5 OUT.h5 [--checkpoint best|last|PATH]\n"
    "                        [--split train|val|test] [OVERRIDE]... [--plugin-path DIR]...\n"
    "\n"
    "Runs the model a finished run trained on the rows of INPUT.h5 and writes its predictions\n"
    "to OUT.h5 (its layout per model: docs/run-files.md). The model, its precision and the\n"
    "loader are built from RUN_DIR/config.ini as the run built them; the loader reads INPUT.h5\n"
    "(its data.path) laid out as the run's data file, only the chosen split is read, and\n"
    "targets may be absent (new rows). OUT.h5 is written to a temporary name and renamed.\n"
    "  --checkpoint WHICH   best (default; last when the run saved no best), last, or a\n"
    "                       checkpoint file\n"
    "  --split SPLIT        the split (group, or mask for graphs) of INPUT.h5 to predict:\n"
    "                       test (default), val, train\n"
    "  OVERRIDE             section.key=value applied to the run's config, e.g.\n"
    "                       model.predict_top_k=20, data.eval_batch_size=64\n"
    "  --plugin-path DIR    search DIR for plugins first (repeatable)\n"
    "Exit codes: 0 ok, 1 predict failed (input file, data), 2 usage or configuration error\n"
    "(no run directory, a model without predict support).\n";

static const char *plugins_help =
    "usage: pipeline plugins [NAME [--markdown]] [--plugin-path DIR]...\n"
    "\n"
    "Without NAME: a table of every plugin found (name, kind, version, summary, path);\n"
    "plugins that were refused are listed with the reason. With NAME: that plugin's\n"
    "options (name, type, default, allowed values, description); --markdown prints\n"
    "them as the table of its README (tools/plugin_options.py).\n";

static const char *plot_help =
    "usage: pipeline plot RUN_DIR [OUT.svg|OUT.png]\n"
    "       pipeline plot --compare RUN_DIR RUN_DIR... [-o OUT.svg|OUT.png]\n"
    "\n"
    "Draws the curves of RUN_DIR/metrics.csv into an SVG file: one panel per metric with\n"
    "its splits together (train_loss, epoch_train_loss, val_loss and test_loss on \"loss\":\n"
    "train solid, validation dashed, test values as marked points), lr, grad_norm, ...\n"
    "against the optimizer step. Written to RUN_DIR/plot.svg unless OUT.svg is given.\n"
    "--compare overlays up to 8 runs (an ablation), one colour per run, into OUT.svg\n"
    "(default: the first RUN_DIR/compare.svg). An output name ending in .png writes a PNG\n"
    "instead (the same picture rendered by librsvg at 2x).\n";

static const char *export_help =
    "usage: pipeline export RUN_DIR --format FORMAT OUT_DIR [--checkpoint best|last|PATH]\n"
    "                       [--lora peft|merge] [--dtype f32|bf16|f16] [--plugin-path DIR]...\n"
    "\n"
    "Writes the weights of a finished run for other tools. The run's own model plugin\n"
    "does the writing: the stages are rebuilt from RUN_DIR/config.ini as the run built\n"
    "them (on the CPU), the checkpoint's weights are loaded, and the model writes\n"
    "OUT_DIR (through OUT_DIR.tmp.<pid>, renamed at the end: nothing partial is left).\n"
    "OUT_DIR must not exist or be empty. OUT_DIR/pipeline_export.json records the run,\n"
    "the checkpoint and the options.\n"
    "  --format FORMAT      hf: a Hugging Face directory (config.json, model.safetensors,\n"
    "                       adapters as PEFT adapters); what a model writes is in its\n"
    "                       README (plugins/models/NAME/README.md)\n"
    "  --checkpoint WHICH   best (default; falls back to last with a note), last, or a\n"
    "                       checkpoint file\n"
    "  --lora peft|merge    adapters as PEFT adapters (the model's default) or merged\n"
    "                       into the base weights, where the model can merge them\n"
    "  --dtype f32|bf16|f16 dtype of the written weights (the model's default: f32)\n"
    "  --plugin-path DIR    search DIR for plugins first (repeatable)\n"
    "Exit code 0 ok, 1 the export failed, 2 usage, a run or option the model cannot\n"
    "export.\n";

static const char *version_help =
    "usage: pipeline --version\n"
    "\n"
    "Prints pipeline's version and the plugin ABI (major.minor) it provides.\n";

static const char *help_help =
    "usage: pipeline help [COMMAND]\n"
    "\n"
    "Without COMMAND: every command in one line each. With COMMAND (run, check, predict,\n"
    "plugins, plot, export, ops, help, version): that command's usage. `pipeline COMMAND --help`\n"
    "says the same for run, check, predict, plugins, plot, export and ops.\n";

static int cmd_help(int argc, char **argv) {
    const char *c = argc > 0 ? argv[0] : NULL;
    if (!c) fputs(general_help, stdout);
    else if (strcmp(c, "run") == 0) fputs(run_help, stdout);
    else if (strcmp(c, "check") == 0) fputs(check_help, stdout);
    else if (strcmp(c, "predict") == 0) fputs(predict_help, stdout);
    else if (strcmp(c, "plugins") == 0) fputs(plugins_help, stdout);
    else if (strcmp(c, "plot") == 0) fputs(plot_help, stdout);
    else if (strcmp(c, "export") == 0) fputs(export_help, stdout);
    else if (strcmp(c, "ops") == 0) fputs(pl_cli_ops_help, stdout);
    else if (strcmp(c, "help") == 0) fputs(help_help, stdout);
    else if (strcmp(c, "version") == 0 || strcmp(c, "--version") == 0) fputs(version_help, stdout);
    else
        return usage_error(NULL, "unknown command '%s' (commands: run, check, predict, plugins, "
                           "plot, export, ops, help, version)", c);
    return 0;
}

/* ---- argument parsing shared by run/check/plugins ------------------- */

typedef struct cli_args {
    const char *file;        /* run/check: the INI; plugins: NAME */
    const char **overrides;
    int n_over;
    const char *resume;
    pl_registry *reg;
    bool help;
} cli_args;

/* Parse the arguments after the command. Returns 0 or an exit code. */
static int parse_args(const char *cmd, int argc, char **argv, cli_args *a, bool allow_over,
                      bool allow_resume) {
    a->overrides = calloc((size_t)argc + 2, sizeof *a->overrides);
    a->reg = pl_registry_new();
    if (!a->overrides || !a->reg) {
        report_error("out of memory");
        return EXIT_RUN_FAILED;
    }
    for (int i = 0; i < argc; i++) {
        const char *s = argv[i];
        const char *val = NULL;
        if (strcmp(s, "-h") == 0 || strcmp(s, "--help") == 0) {
            a->help = true;
            return 0;
        }
        if (strncmp(s, "--plugin-path", 13) == 0 && (s[13] == '\0' || s[13] == '=')) {
            if (s[13] == '=') val = s + 14;
            else if (i + 1 < argc) val = argv[++i];
            else return usage_error(cmd, "%s needs a directory", "--plugin-path");
            if (!*val) return usage_error(cmd, "%s needs a directory", "--plugin-path");
            pl_registry_add_dir(a->reg, val);
            continue;
        }
        if (allow_resume && strncmp(s, "--resume", 8) == 0 && (s[8] == '\0' || s[8] == '=')) {
            if (s[8] == '=') val = s + 9;
            else if (i + 1 < argc) val = argv[++i];
            else return usage_error(cmd, "%s needs a checkpoint path or 'last'", "--resume");
            if (!*val) return usage_error(cmd, "%s needs a checkpoint path or 'last'", "--resume");
            a->resume = val;
            continue;
        }
        if (s[0] == '-' && s[1]) return usage_error(cmd, "unknown option '%s'", s);
        if (!a->file) {
            a->file = s;
            continue;
        }
        if (allow_over && (strchr(s, '=') || s[0] == '~')) {
            char sec[128], key[256];
            if (pl_override_parse(s, sec, sizeof sec, key, sizeof key, NULL)) {
                report_error("bad override");
                return EXIT_USAGE;
            }
            a->overrides[a->n_over++] = s;
            continue;
        }
        if (allow_over)
            return usage_error(cmd,
                               "unexpected argument '%s' (overrides are section.key=value, "
                               "~section.key or ~section)",
                               s);
        return usage_error(cmd, "unexpected argument '%s'", s);
    }
    if (pl_registry_add_default_dirs(a->reg)) {
        report_error("plugin search path");
        return EXIT_USAGE;
    }
    return 0;
}

static void free_args(cli_args *a) {
    free(a->overrides);
    pl_registry_free(a->reg);
}

/* ---- check / run ------------------------------------------------------ */

static pl_config *load_config(cli_args *a, const char *cmd) {
    if (!a->file) {
        usage_error(cmd, "%s needs a config file (pipeline CMD FILE.ini)", cmd);
        return NULL;
    }
    pl_config *cfg = pl_config_load(a->file, a->n_over, a->overrides, a->reg);
    if (!cfg) report_error("invalid configuration");
    return cfg;
}

static int cmd_check(int argc, char **argv) {
    cli_args a = {0};
    int rc = parse_args("check", argc, argv, &a, true, false);
    if (!rc && a.help) fputs(check_help, stdout);
    if (rc || a.help) {
        free_args(&a);
        return rc;
    }
    pl_config *cfg = load_config(&a, "check");
    if (!cfg) {
        free_args(&a);
        return EXIT_USAGE;
    }
    pl_config_print(cfg, stdout);
    for (int i = 0; i < pl_config_requires_count(cfg); i++)
        printf("requires: %s\n", pl_config_requires_at(cfg, i));
    if (pl_trainer_check_requires(cfg, a.reg) || pl_trainer_check_options(cfg)) {
        report_error("invalid configuration");
        pl_config_free(cfg);
        free_args(&a);
        return EXIT_USAGE;
    }
    /* the typed data contract: what [data] yields satisfies what [model] reads */
    pl_hint_clear();
    pl_status fst = pl_trainer_check_fields(cfg);
    if (fst == PL_ERR_IO) {
        /* the data is not there yet (prepared later, or on another machine):
         * the run checks again before it builds anything */
        printf("warning: batch fields not checked: %s\n", pl_error_message());
        pl_error_clear();
    } else if (fst) {
        report_error("invalid configuration");
        pl_config_free(cfg);
        free_args(&a);
        return EXIT_USAGE;
    } else {
        printf("batch fields OK: [data] yields what [model] reads\n");
    }
    /* the optimizer's named parameter groups against the model's parameters */
    bool groups_checked = false;
    fflush(stdout);
    if (pl_trainer_check_param_groups(cfg, a.reg, &groups_checked)) {
        printf("warning: optimizer groups not checked (the model could not be built here): %s\n",
               pl_error_message());
        pl_error_clear();
    } else if (groups_checked) {
        printf("optimizer groups checked against the model's parameters\n");
    }
    printf("config OK\n");
    pl_config_free(cfg);
    free_args(&a);
    return 0;
}

static int cmd_run(int argc, char **argv) {
    cli_args a = {0};
    int rc = parse_args("run", argc, argv, &a, true, true);
    if (!rc && a.help) fputs(run_help, stdout);
    if (rc || a.help) {
        free_args(&a);
        return rc;
    }
    char resume_over[4200];
    if (a.resume) {
        for (int i = 0; i < a.n_over; i++)
            if (strncmp(a.overrides[i], "trainer.resume=", 15) == 0) {
                free_args(&a);
                return usage_error("run", "%s", "--resume and trainer.resume=... both given");
            }
        snprintf(resume_over, sizeof resume_over, "trainer.resume=%s", a.resume);
        a.overrides[a.n_over++] = resume_over;
    }
    pl_config *cfg = load_config(&a, "run");
    if (!cfg) {
        free_args(&a);
        return EXIT_USAGE;
    }
    /* under mpirun every rank resolves the same config: rank 0 prints it */
    if (pl_launcher_rank() == 0) pl_config_print(cfg, stdout);
    fflush(stdout);
    pl_run_options opts = {.resume = a.resume,
                           .config_path = a.file,
                           .argc = a.n_over,
                           .argv = (char **)a.overrides};
    rc = pl_trainer_run(cfg, a.reg, &opts);
    pl_config_free(cfg);
    free_args(&a);
    return rc;
}

/* ---- predict ---------------------------------------------------------- */

/* A flag's value: "--flag V" or "--flag=V"; NULL (usage error printed) when missing. */
static const char *flag_value(int argc, char **argv, int *i, const char *flag, const char *what) {
    const char *s = argv[*i];
    size_t n = strlen(flag);
    const char *v = s[n] == '=' ? s + n + 1 : *i + 1 < argc ? argv[++*i] : NULL;
    if (!v || !*v) {
        char msg[128];
        snprintf(msg, sizeof msg, "%s needs %s", flag, what);
        usage_error("predict", "%s", msg);
        return NULL;
    }
    return v;
}

static bool is_flag(const char *s, const char *flag) {
    size_t n = strlen(flag);
    return !strncmp(s, flag, n) && (s[n] == 0 || s[n] == '=');
}

static int cmd_predict(int argc, char **argv) {
    pl_registry *reg = pl_registry_new();
    const char **over = calloc((size_t)argc + 1, sizeof *over);
    const char *pos[3] = {0};
    int npos = 0, nover = 0, rc = 0;
    pl_predict_options o = {0};
    if (!reg || !over) {
        report_error("out of memory");
        rc = EXIT_RUN_FAILED;
        goto done;
    }
    for (int i = 0; i < argc && !rc; i++) {
        const char *s = argv[i];
        if (!strcmp(s, "-h") || !strcmp(s, "--help")) {
            fputs(predict_help, stdout);
            goto done;
        }
        if (is_flag(s, "--plugin-path")) {
            const char *v = flag_value(argc, argv, &i, "--plugin-path", "a directory");
            if (!v) rc = EXIT_USAGE;
            else pl_registry_add_dir(reg, v);
        } else if (is_flag(s, "--checkpoint")) {
            if (!(o.checkpoint = flag_value(argc, argv, &i, "--checkpoint", "best, last or a path")))
                rc = EXIT_USAGE;
        } else if (is_flag(s, "--split")) {
            if (!(o.split = flag_value(argc, argv, &i, "--split", "train, val or test")))
                rc = EXIT_USAGE;
        } else if (s[0] == '-' && s[1]) {
            rc = usage_error("predict", "unknown option '%s'", s);
        } else if (npos < 3) {
            pos[npos++] = s; /* RUN_DIR INPUT.h5 OUT.h5, whatever they contain */
        } else if (strchr(s, '=') || s[0] == '~') {
            char sec[128], key[256];
            if (pl_override_parse(s, sec, sizeof sec, key, sizeof key, NULL)) {
                report_error("bad override");
                rc = EXIT_USAGE;
            }
            over[nover++] = s;
        } else {
            rc = usage_error("predict", "unexpected argument '%s' (overrides are "
                             "section.key=value)", s);
        }
    }
    if (rc) goto done;
    if (npos < 3) {
        rc = usage_error("predict", "%s", "usage: pipeline predict RUN_DIR INPUT.h5 OUT.h5");
        goto done;
    }
    if (pl_registry_add_default_dirs(reg)) {
        report_error("plugin search path");
        rc = EXIT_USAGE;
        goto done;
    }
    o.run_dir = pos[0];
    o.input = pos[1];
    o.output = pos[2];
    o.argc = nover;
    o.argv = over;
    rc = pl_predict_run(reg, &o);
done:
    free(over);
    pl_registry_free(reg);
    return rc;
}

/* ---- plugins ---------------------------------------------------------- */

static const char *type_name(pl_option_type t) {
    switch (t) {
    case PL_OPT_INT: return "int";
    case PL_OPT_FLOAT: return "float";
    case PL_OPT_BOOL: return "bool";
    case PL_OPT_STRING: return "string";
    case PL_OPT_CHOICE: return "choice";
    case PL_OPT_NUMBER_OR_FRACTION: return "int|fraction";
    }
    return "?";
}

static void print_options(const pl_plugin_desc *d, const char *path) {
    printf("%s %s (%s plugin, ABI %u.%u)\n  %s\n  %s\n\n", d->name, d->version ? d->version : "?",
           pl_plugin_kind_name(d->kind), d->abi_major, d->abi_minor,
           d->summary ? d->summary : "", path ? path : "");
    int nw = 6, dw = 7;
    for (const pl_option_spec *o = d->options; o && o->name; o++) {
        int n = (int)strlen(o->name), dl = o->default_value ? (int)strlen(o->default_value) : 10;
        if (n > nw) nw = n;
        if (dl > dw) dw = dl;
    }
    if (dw > 24) dw = 24;
    printf("  %-*s  %-12s  %-*s  %-22s  %s\n", nw, "option", "type", dw, "default", "allowed",
           "description");
    for (const pl_option_spec *o = d->options; o && o->name; o++) {
        char allowed[128] = "";
        if (o->type == PL_OPT_CHOICE)
            snprintf(allowed, sizeof allowed, "%s", o->choices ? o->choices : "");
        else if (o->type != PL_OPT_BOOL && o->type != PL_OPT_STRING && o->min <= o->max)
            snprintf(allowed, sizeof allowed, "[%g, %g]", o->min, o->max);
        else if (o->type == PL_OPT_BOOL)
            snprintf(allowed, sizeof allowed, "true|false");
        const char *def = !o->default_value ? "(required)" : *o->default_value ? o->default_value
                                                                                : "\"\"";
        printf("  %-*s  %-12s  %-*s  %-22s  %s\n", nw, o->name, type_name(o->type), dw, def,
               allowed, o->doc ? o->doc : "");
    }
    if (!d->options || !d->options->name) printf("  (no options)\n");
}

/* One plugin's options as the markdown table its README carries between
 * tools/plugin_options.py's markers (generated, so the README cannot drift
 * from the schema the config checker enforces). */
static void md_cell(const char *s) {
    for (; s && *s; s++) {
        if (*s == '|') fputs("\\|", stdout);
        else if (*s != '\n') putchar(*s);
        else putchar(' ');
    }
}

static void print_options_markdown(const pl_plugin_desc *d) {
    if (!d->options || !d->options->name) {
        printf("(no options)\n");
        return;
    }
    printf("| option | type | default | allowed | description |\n|---|---|---|---|---|\n");
    for (const pl_option_spec *o = d->options; o && o->name; o++) {
        printf("| `%s` | %s | ", o->name, type_name(o->type));
        if (!o->default_value) printf("(required)");
        else if (!*o->default_value) printf("\"\"");
        else {
            putchar('`');
            md_cell(o->default_value);
            putchar('`');
        }
        printf(" | ");
        if (o->type == PL_OPT_CHOICE && o->choices) {
            const char *c = o->choices;
            while (*c) {
                size_t n = strcspn(c, "|");
                printf("`%.*s`%s", (int)n, c, c[n] ? ", " : "");
                c += n + (c[n] ? 1 : 0);
            }
        } else if (o->type == PL_OPT_BOOL) {
            printf("`true`, `false`");
        } else if (o->type != PL_OPT_STRING && o->min <= o->max) {
            printf("[%g, %g]", o->min, o->max);
        }
        printf(" | ");
        md_cell(o->doc);
        printf(" |\n");
    }
}

static int cmd_plugins(int argc, char **argv) {
    cli_args a = {0};
    bool markdown = false;
    for (int i = 0; i < argc; i++)
        if (!strcmp(argv[i], "--markdown")) { /* drop it: parse_args knows no such flag */
            markdown = true;
            memmove(&argv[i], &argv[i + 1], (size_t)(argc - i - 1) * sizeof *argv);
            argc--;
            i--;
        }
    int rc = parse_args("plugins", argc, argv, &a, false, false);
    if (!rc && a.help) fputs(plugins_help, stdout);
    if (rc || a.help) {
        free_args(&a);
        return rc;
    }
    if (a.file) {
        const pl_plugin_desc *d = NULL;
        if (pl_registry_find(a.reg, a.file, PL_KIND_COUNT, &d, NULL)) {
            report_error("plugin not found");
            free_args(&a);
            return EXIT_USAGE;
        }
        if (markdown) print_options_markdown(d);
        else print_options(d, pl_registry_path_of(a.reg, d->name));
        free_args(&a);
        return 0;
    }
    const pl_plugin_info *info = NULL;
    int n = pl_registry_list(a.reg, &info);
    if (n < 0) {
        report_error("cannot list plugins");
        free_args(&a);
        return EXIT_RUN_FAILED;
    }
    int nw = 4, vw = 7, sw = 7;
    for (int i = 0; i < n; i++) {
        int l = (int)strlen(info[i].name);
        if (l > nw) nw = l;
        if (info[i].desc && info[i].desc->version && (int)strlen(info[i].desc->version) > vw)
            vw = (int)strlen(info[i].desc->version);
        if (info[i].desc && info[i].desc->summary && (int)strlen(info[i].desc->summary) > sw)
            sw = (int)strlen(info[i].desc->summary);
    }
    if (sw > 50) sw = 50;
    printf("%-*s  %-9s  %-*s  %-*s  %s\n", nw, "name", "kind", vw, "version", sw, "summary", "path");
    for (int i = 0; i < n; i++) {
        const pl_plugin_desc *d = info[i].desc;
        if (d)
            printf("%-*s  %-9s  %-*s  %-*.*s  %s\n", nw, info[i].name, pl_plugin_kind_name(d->kind),
                   vw, d->version ? d->version : "?", sw, sw, d->summary ? d->summary : "",
                   info[i].path);
        else
            printf("%-*s  %-9s  %-*s  REFUSED: %s\n", nw, info[i].name, "-", vw, "-",
                   info[i].error ? info[i].error : "?");
    }
    if (n == 0) {
        printf("(no plugins found; searched:");
        for (int i = 0; i < pl_registry_dir_count(a.reg); i++)
            printf(" %s", pl_registry_dir_at(a.reg, i));
        printf(")\n");
    }
    free_args(&a);
    return 0;
}

/* ---- export ------------------------------------------------------------ */

/* "--name VALUE" or "--name=VALUE" at argv[*i]: the value (advancing *i), or
 * NULL when argv[*i] is another argument. *missing: the option had no value. */
static const char *option_value(int argc, char **argv, int *i, const char *name, bool *missing) {
    size_t n = strlen(name);
    const char *s = argv[*i];
    *missing = false;
    if (strncmp(s, name, n) || (s[n] != '\0' && s[n] != '=')) return NULL;
    const char *v = s[n] == '=' ? s + n + 1 : *i + 1 < argc ? argv[++*i] : NULL;
    if (!v || !*v) {
        *missing = true;
        return NULL;
    }
    return v;
}

static int cmd_export(int argc, char **argv) {
    pl_export_request r = {0};
    pl_registry *reg = pl_registry_new();
    const char *pos[2] = {NULL, NULL};
    int npos = 0, rc = 0;
    static const char *const names[] = {"--format", "--checkpoint", "--lora", "--dtype",
                                        "--plugin-path"};
    if (!reg) {
        report_error("out of memory");
        return EXIT_RUN_FAILED;
    }
    for (int i = 0; i < argc && !rc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            fputs(export_help, stdout);
            pl_registry_free(reg);
            return 0;
        }
        const char *v = NULL;
        bool missing = false;
        int k = 0;
        for (; k < 5; k++)
            if ((v = option_value(argc, argv, &i, names[k], &missing)) || missing) break;
        if (missing) {
            rc = usage_error("export", "%s needs a value", names[k]);
        } else if (k == 0) {
            r.format = v;
        } else if (k == 1) {
            r.checkpoint = v;
        } else if (k == 2) {
            r.lora = v;
        } else if (k == 3) {
            r.dtype = v;
        } else if (k == 4) {
            pl_registry_add_dir(reg, v);
        } else if (argv[i][0] == '-' && argv[i][1]) {
            rc = usage_error("export", "unknown option '%s'", argv[i]);
        } else if (npos == 2) {
            rc = usage_error("export", "unexpected argument '%s' (pipeline export RUN_DIR --format "
                             "FORMAT OUT_DIR)", argv[i]);
        } else {
            pos[npos++] = argv[i];
        }
    }
    if (!rc && npos < 2)
        rc = usage_error("export", "%s", "pipeline export needs RUN_DIR and OUT_DIR (pipeline "
                         "export RUN_DIR --format hf OUT_DIR)");
    if (!rc && !r.format)
        rc = usage_error("export", "%s", "--format is required (hf: a Hugging Face directory)");
    if (!rc && pl_registry_add_default_dirs(reg)) {
        report_error("plugin search path");
        rc = EXIT_USAGE;
    }
    if (rc) {
        pl_registry_free(reg);
        return rc;
    }
    r.run_dir = pos[0];
    r.out_dir = pos[1];
    pl_hint_clear();
    pl_status st = pl_export_run(&r, reg);
    if (st) {
        report_error("export failed");
        rc = st == PL_ERR_CONFIG || st == PL_ERR_UNSUPPORTED ? EXIT_USAGE : EXIT_RUN_FAILED;
    }
    pl_registry_free(reg);
    return rc;
}

/* OpenMP's worker threads and OpenBLAS's own thread pool both busy-wait by
 * default; on a small machine (or one shared with other jobs) they spin
 * against each other and a training step runs several times slower (the
 * iLoRA pretraining step: 10.2 s vs 1.8 s for 12 batches on 2 busy cores).
 * libgomp reads OMP_WAIT_POLICY once, when it is loaded, so the CLI re-executes
 * itself with PASSIVE unless the user chose a policy. */
static void ensure_passive_wait(char **argv) {
    if (getenv("OMP_WAIT_POLICY")) return;
    setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
    execv("/proc/self/exe", argv);
    /* exec failed (no /proc): carry on with the default policy */
}

/* OpenBLAS (a DYNAMIC_ARCH build) picks its kernels from cpuid when it
 * loads, but a release older than the CPU falls back to its oldest x86-64
 * kernels: Debian bookworm's 0.3.21 runs Prescott (SSE3) GEMMs on a Sapphire
 * Rapids-class Xeon, a 2.4x slower iLoRA teacher step than its SkylakeX
 * kernels (2026-11-27). OpenBLAS reads OPENBLAS_CORETYPE once, when cpu.so
 * loads it (after this), so the CLI names the target the CPU's features
 * allow, unless the user set one: AVX-512 F/BW/VL/DQ (OS-enabled, as
 * libgcc's cpuid checks) -> SkylakeX, with AVX512_BF16 -> Cooperlake; AVX2 +
 * FMA -> Haswell, Zen on AMD. PL_CPU_ISA caps it as it caps our kernels
 * (avx2: no AVX-512 target; scalar: OpenBLAS's own choice). The run log and
 * summary.json name the kernels that ran (cpu backend's "blas_core"). */
static void choose_blas_core(void) {
    if (getenv("OPENBLAS_CORETYPE")) return;
#if defined(__x86_64__) && defined(__GNUC__)
    const char *cap = getenv("PL_CPU_ISA");
    if (cap && !strcmp(cap, "scalar")) return;
    __builtin_cpu_init();
    const char *core = NULL;
    if (!(cap && !strcmp(cap, "avx2")) && __builtin_cpu_supports("avx512f") &&
        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512dq"))
        core = __builtin_cpu_supports("avx512bf16") ? "Cooperlake" : "SkylakeX";
    else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        core = __builtin_cpu_is("amd") ? "Zen" : "Haswell";
    if (core) setenv("OPENBLAS_CORETYPE", core, 0);
#endif
}

int main(int argc, char **argv) {
    choose_blas_core();
    ensure_passive_wait(argv);
    pl_crash_handler_install(); /* a crashing plugin is named before the process dies */
    if (argc < 2) {
        fputs(general_help, stderr);
        fprintf(stderr, "error: no command given\nhint: try `pipeline help`\n");
        return EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "--version") == 0 || strcmp(cmd, "version") == 0) {
        printf("pipeline %s (plugin ABI %d.%d)\n", PL_VERSION_STRING, PL_ABI_MAJOR, PL_ABI_MINOR);
        return 0;
    }
    if (strcmp(cmd, "help") == 0) return cmd_help(argc - 2, argv + 2);
    if (strcmp(cmd, "-h") == 0 || strcmp(cmd, "--help") == 0) return cmd_help(0, NULL);
    if (strcmp(cmd, "run") == 0) return cmd_run(argc - 2, argv + 2);
    if (strcmp(cmd, "check") == 0) return cmd_check(argc - 2, argv + 2);
    if (strcmp(cmd, "predict") == 0) return cmd_predict(argc - 2, argv + 2);
    if (strcmp(cmd, "plugins") == 0) return cmd_plugins(argc - 2, argv + 2);
    if (strcmp(cmd, "export") == 0) return cmd_export(argc - 2, argv + 2);
    if (strcmp(cmd, "ops") == 0) return pl_cli_ops(argc - 2, argv + 2);
    if (strcmp(cmd, "plot") == 0) {
        if (argc == 3 && (strcmp(argv[2], "-h") == 0 || strcmp(argv[2], "--help") == 0)) {
            fputs(plot_help, stdout);
            return 0;
        }
        char out[4096];
        pl_status ps;
        if (argc >= 3 && strcmp(argv[2], "--compare") == 0) {
            const char *runs[8], *o = NULL;
            int n = 0;
            for (int i = 3; i < argc; i++) {
                if (strcmp(argv[i], "-o") == 0 && i + 1 < argc) {
                    o = argv[++i];
                    continue;
                }
                if (n == 8) return usage_error("plot", "%s", "--compare takes at most 8 runs");
                runs[n++] = argv[i];
            }
            if (n < 2)
                return usage_error("plot", "%s",
                                   "usage: pipeline plot --compare RUN_DIR RUN_DIR... [-o OUT.svg]");
            ps = pl_png_wanted(o) ? pl_png_plot(runs, n, o, out, sizeof out)
                                  : pl_plot_runs(runs, n, o, out, sizeof out);
        } else {
            if (argc < 3 || argc > 4)
                return usage_error("plot", "%s", "usage: pipeline plot RUN_DIR [OUT.svg|OUT.png]");
            const char *o = argc == 4 ? argv[3] : NULL;
            ps = pl_png_wanted(o) ? pl_png_plot((const char *const *)argv + 2, 1, o, out, sizeof out)
                                  : pl_plot_run(argv[2], o, out, sizeof out);
        }
        if (ps) {
            report_error("plot failed");
            return EXIT_RUN_FAILED;
        }
        printf("wrote %s\n", out);
        return 0;
    }
    return usage_error(NULL, "unknown command '%s'", cmd);
}
