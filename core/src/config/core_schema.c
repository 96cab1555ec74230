/* core_schema.c - option schemas of the core's own INI sections, [pipeline]
 * and [trainer], and the map from stage sections to plugin kinds. Names and
 * defaults follow PyTorch Lightning's Trainer where one exists. Documented in
 * docs/ini-reference.md (keep both in sync). */
#include <stdbool.h>
#include <stddef.h>
#include <ctype.h>
#include <string.h>

#include "config_internal.h"

static const pl_option_spec pipeline_schema[] = {
    {"name", PL_OPT_STRING, "", PL_NO_BOUNDS, NULL,
     "run name; runs go to RUN_DIR/NAME/TIMESTAMP (empty: the INI file's stem)"},
    {"run_dir", PL_OPT_STRING, "runs", PL_NO_BOUNDS, NULL, "parent directory of run directories"},
    {"device", PL_OPT_CHOICE, "cpu", PL_NO_BOUNDS, "cpu|cuda|strict|auto|cuda:N|strict:N",
     "device to train on (auto: cuda when a CUDA backend plugin finds a GPU; strict: the "
     "GPU-like emulation on the CPU that crashes on host access to device memory)"},
    {"allow_tf32", PL_OPT_BOOL, "false", PL_NO_BOUNDS, NULL,
     "let f32 GEMMs on a GPU use TF32 tensor cores (10-bit mantissa inputs, f32 accumulation; "
     "torch.backends.cuda.matmul.allow_tf32, off by default as in PyTorch); no effect on the CPU"},
    {"seed", PL_OPT_INT, "42", 0, 9007199254740992.0, NULL,
     "global seed (weights init, shuffling, dropout)"},
    {"requires", PL_OPT_STRING, "", PL_NO_BOUNDS, NULL,
     "space/comma-separated INI files whose runs this one needs (relative to this file)"},
    {"threads", PL_OPT_INT, "0", 0, 4096, NULL, "CPU threads of OpenMP and OpenBLAS (0: their defaults)"},
    {"verbose", PL_OPT_BOOL, "false", PL_NO_BOUNDS, NULL,
     "plugins print what they do (pl_run_context.verbose: a scheduler's lr reductions, precision "
     "conversions, loader sizes) to the terminal and log.txt"},
    PL_OPTIONS_END};

static const pl_option_spec trainer_schema[] = {
    {"max_epochs", PL_OPT_INT, "1000", -1, 1e9, NULL, "epochs to train (-1: until max_steps)"},
    {"max_steps", PL_OPT_INT, "-1", -1, 1e15, NULL, "optimizer steps to train (-1: no limit)"},
    {"accumulate_grad_batches", PL_OPT_INT, "1", 1, 1e6, NULL,
     "batches whose gradients are summed per optimizer step"},
    {"gradient_clip_val", PL_OPT_FLOAT, "0", 0, 1e30, NULL, "gradient clipping threshold (0: off)"},
    {"gradient_clip_algorithm", PL_OPT_CHOICE, "norm", PL_NO_BOUNDS, "norm|value",
     "clip the global L2 norm or each value"},
    {"val_check_interval", PL_OPT_NUMBER_OR_FRACTION, "1.0", 0, 1e15, NULL,
     "validate every N training batches (int) or fraction of an epoch (float)"},
    {"check_val_every_n_epoch", PL_OPT_INT, "1", 1, 1e9, NULL, "validate every N epochs"},
    {"limit_train_batches", PL_OPT_NUMBER_OR_FRACTION, "1.0", 0, 1e15, NULL,
     "training batches per epoch: count (int) or fraction (float)"},
    {"limit_val_batches", PL_OPT_NUMBER_OR_FRACTION, "1.0", 0, 1e15, NULL,
     "validation batches: count (int) or fraction (float)"},
    {"limit_test_batches", PL_OPT_NUMBER_OR_FRACTION, "1.0", 0, 1e15, NULL,
     "test batches: count (int) or fraction (float)"},
    {"early_stopping", PL_OPT_BOOL, "false", PL_NO_BOUNDS, NULL,
     "stop when `monitor` stops improving for `patience` validations"},
    {"monitor", PL_OPT_STRING, "val_loss", PL_NO_BOUNDS, NULL,
     "metric for early stopping and the best checkpoint; several (val_loss,val_accuracy): the "
     "GAT rule (patience while none improves, best where all are best)"},
    {"mode", PL_OPT_STRING, "min", PL_NO_BOUNDS, NULL,
     "min|max: whether `monitor` improves down or up (a list: one per monitored metric)"},
    {"patience", PL_OPT_INT, "3", 0, 1e9, NULL, "validations without improvement before stopping"},
    {"min_delta", PL_OPT_FLOAT, "0", 0, 1e30, NULL, "smallest change of `monitor` that counts"},
    {"on_nan", PL_OPT_CHOICE, "stop", PL_NO_BOUNDS, "stop|skip",
     "non-finite loss: stop the run, or skip the step"},
    {"max_consecutive_nan_skips", PL_OPT_INT, "10", 0, 1e15, NULL,
     "on_nan = skip: non-finite losses skipped in a row before the run fails (0: no limit)"},
    {"checkpoint_every_n_epochs", PL_OPT_INT, "0", 0, 1e9, NULL,
     "keep a checkpoint every N epochs (0: only last/best)"},
    {"checkpoint_every_n_train_steps", PL_OPT_INT, "0", 0, 1e15, NULL,
     "every N optimizer steps write last and keep step-NNNNNN, resumable mid-epoch (0: off)"},
    {"save_last", PL_OPT_BOOL, "true", PL_NO_BOUNDS, NULL, "write checkpoints/last.safetensors"},
    {"save_best", PL_OPT_BOOL, "true", PL_NO_BOUNDS, NULL,
     "write checkpoints/best.safetensors (by `monitor`)"},
    {"resume", PL_OPT_STRING, "", PL_NO_BOUNDS, NULL,
     "checkpoint to resume from: a path, or `last` (latest run of this config)"},
    {"log_every_n_steps", PL_OPT_INT, "50", 1, 1e9, NULL, "metrics.csv row every N steps"},
    {"cuda_graphs", PL_OPT_CHOICE, "auto", PL_NO_BOUNDS, "auto|true|false",
     "capture the training step once and replay it (CUDA graphs) while batch shapes stay the "
     "same; auto: on for the cuda backend; true on the strict device runs its capture mode"},
    {"test", PL_OPT_BOOL, "true", PL_NO_BOUNDS, NULL, "run the test split after fitting"},
    {"export", PL_OPT_BOOL, "false", PL_NO_BOUNDS, NULL,
     "export model outputs to outputs/ after fitting"},
    {"init_from", PL_OPT_STRING, "", PL_NO_BOUNDS, NULL,
     "safetensors file (or @OTHER.ini:best|last) to load weights from before training"},
    {"ema_decay", PL_OPT_FLOAT, "0", 0, 0.999999999, NULL,
     "exponential moving average of the trainable weights after each optimizer step: "
     "ema = decay*ema + (1-decay)*w (0: off; Lightning's EMAWeightAveraging)"},
    {"ema_start_step", PL_OPT_INT, "0", 0, 1e15, NULL,
     "ema_decay: first optimizer step (0-based) folded into the average; earlier ones are not"},
    {"ema_validate", PL_OPT_BOOL, "true", PL_NO_BOUNDS, NULL,
     "ema_decay: validate (and keep as best) the averaged weights instead of the live ones"},
    PL_OPTIONS_END};

/* Where and how to run, not what to train: overrides of these reach the runs
 * `requires` starts. Not `name` (each run keeps its own), `seed` (part of
 * what a run trains: a required run keeps its file's seed) or `requires`. */
static const char *const runwide_keys[] = {"device", "threads", "run_dir", "allow_tf32", "verbose",
                                           NULL};

const char *const *pl_pipeline_runwide_keys(void) { return runwide_keys; }

bool pl_pipeline_key_is_runwide(const char *key) {
    for (int i = 0; key && runwide_keys[i]; i++)
        if (!strcmp(key, runwide_keys[i])) return true;
    return false;
}

const pl_option_spec *pl_core_schema(const char *section) {
    if (!section) return NULL;
    if (strcmp(section, "pipeline") == 0) return pipeline_schema;
    if (strcmp(section, "trainer") == 0) return trainer_schema;
    return NULL;
}

static const struct {
    const char *section;
    pl_plugin_kind kind;
} stage_sections[] = {
    {"data", PL_KIND_LOADER},         {"model", PL_KIND_MODEL},
    {"optimizer", PL_KIND_OPTIMIZER}, {"averager", PL_KIND_AVERAGER},
    {"scheduler", PL_KIND_SCHEDULER}, {"precision", PL_KIND_PRECISION},
    {"strategy", PL_KIND_STRATEGY},
};

int pl_stage_section_kind(const char *section) {
    if (!section) return -1;
    /* a list of schedulers: scheduler, scheduler2, scheduler_plateau, ... */
    if (!strncmp(section, "scheduler", 9) && section[9]) {
        for (const char *p = section + 9; *p; p++)
            if (!isalnum((unsigned char)*p) && *p != '_') return -1;
        return PL_KIND_SCHEDULER;
    }
    for (size_t i = 0; i < sizeof stage_sections / sizeof stage_sections[0]; i++)
        if (strcmp(section, stage_sections[i].section) == 0) return (int)stage_sections[i].kind;
    return -1;
}

const char *const *pl_config_known_sections(void) {
    static const char *const names[] = {"pipeline", "data",      "model",     "optimizer", "averager",
                                        "scheduler", "precision", "strategy", "trainer", NULL};
    return names;
}

const char *const *pl_config_required_sections(void) {
    static const char *const names[] = {"data", "model", NULL};
    return names;
}
