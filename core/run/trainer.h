/* trainer.h - the training loop the `pipeline run` command drives (core only).
 *
 * pl_trainer_run builds every stage named in a resolved config, runs the
 * phases fit (train + validation, checkpoints, early stopping), test and
 * export, writes the run directory (config.ini, log.txt, metrics.csv,
 * summary.json, checkpoints/, outputs/) and prints the run report.
 * Stage chaining: every INI in `[pipeline] requires` whose run has no
 * checkpoint yet is run first (recursively), and `@INI:best|last` references
 * in `[trainer] init_from` resolve to that run's checkpoint. Command-line
 * overrides of the run-wide [pipeline] keys (device, threads, run_dir,
 * allow_tf32, verbose) apply to every config of the chain: to the runs it
 * starts and to where it looks for their finished runs.
 */
#ifndef PL_TRAINER_H
#define PL_TRAINER_H

#include "config_internal.h"
#include "registry.h"

typedef struct pl_run_options {
    const char *resume;      /* checkpoint path, "last", or NULL */
    const char *config_path; /* the INI file */
    int argc;                /* overrides as given on the command line */
    char **argv;
    /* NULL: argv is this run's own command line. A run that `requires`
     * started: argv holds the run-wide [pipeline] overrides it inherited
     * (pl_pipeline_key_is_runwide) and this names where they came from
     * ("command line of configs/teacher.ini"), handed on down the chain. */
    const char *inherited_from;
} pl_run_options;

/* Most [scheduler*] sections one config may hold. */
#define PL_MAX_SCHEDULERS 8

/* The typed data contract: the [data] plugin's batch_fields must satisfy
 * the [model] plugin's batch_needs (pl_fields_match). Runs nothing; used by
 * `pipeline check` and before a run builds any stage. PL_ERR_CONFIG naming
 * the field on a mismatch, PL_ERR_ABI when a plugin declares nothing. */
pl_status pl_trainer_check_fields(const pl_config *cfg);
/* [trainer] options that depend on each other, checked before a run and by
 * `pipeline check`: `monitor` (1..4 comma-separated validation metrics) and
 * `mode` (min|max, one for all or one per metric). PL_ERR_CONFIG naming the
 * key and value. */
pl_status pl_trainer_check_options(const pl_config *cfg);

/* The [pipeline] requires graph from `cfg` (each required config loaded
 * and checked in turn): PL_ERR_CONFIG naming the cycle (a.ini -> b.ini ->
 * a.ini) or a chain deeper than 32, or the first required config that does
 * not load. Used by `pipeline check` and before a run runs its requirements. */
pl_status pl_trainer_check_requires(const pl_config *cfg, pl_registry *reg);

/* Returns the CLI exit code: 0 ok, 1 run failed, 2 config error. Errors are
 * printed to stderr with a hint line. */
int pl_trainer_run(pl_config *cfg, pl_registry *reg, const pl_run_options *opts);
/* This process's rank as its launcher set it in the environment
 * (OMPI_COMM_WORLD_RANK, PMI_RANK, PMIX_RANK), 0 without one: who prints what
 * every rank would print alike before a strategy exists (the resolved config,
 * the requirements). (core/run/dist.c) */
int pl_launcher_rank(void);

/* Run directory of the newest run of a config that ended ok:
 * RUN_DIR/NAME/latest (the symlink pl_trainer_run moves when a run ends ok;
 * RUN_DIR/NAME/last_attempt points at the newest run started, whatever its
 * outcome). Writes into buf; returns buf. */
const char *pl_trainer_latest_dir(const pl_config *cfg, char *buf, size_t n);

#endif
