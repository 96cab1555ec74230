/* trainer_internal.h - what the trainer's files share (core only).
 *
 * The trainer's files, one job each:
 *   trainer.c     the loop: stages, fit (fetch, forward, backward, step, counters,
 *                 validation when due)
 *   trainer_setup.c  a run's setup: settings, device, stages, init_from, resume
 *   trainer_phases.c a run once it can start: build, fit, test, export,
 *                 summary, exit code
 *   callbacks.c, cb_*.c  what else a fit does, as callbacks (callback.h):
 *                 logging, metrics.csv, checkpoints, early stopping, the NaN
 *                 policy, weight averaging (swa, EMA), signals
 *   checkpoint.c  checkpoints: save, load, resume, the best of an earlier run
 *   report.c      the run report: summary.json and the closing report
 *   chain.c       pl_trainer_run, and stage chaining: requires run first
 *   run_dirs.c    run directories and references between runs: init_from,
 *                 @INI:outputs, runs/<name>/latest, --resume last, orphan
 *                 temporary files
 *   predict.c     `pipeline predict`: a finished run's model on new rows
 *   step_values.c a step's loss, gradient norm and found_inf kept on the
 *                 device until the next read (one process)
 *   device_stats.c host reads, allocations, kernel calls per step
 *                 (summary.json device_stats, from the backend's counters)
 *   run_base.c    the clock, the log, metrics.csv rows, limits, stage
 *                 create/destroy: the bottom, calls nothing else of the run
 *   step.c        one training step: micro-batch, clipping, lr, optimizer step
 * log.txt and metrics.csv rows are written by tr_log / tr_metric_row.
 */
#ifndef PL_TRAINER_INTERNAL_H
#define PL_TRAINER_INTERNAL_H

#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "internal.h"
#include "stage.h"
#include "trainer.h"

#define CKPT_FORMAT "pipeline-checkpoint-1"

typedef struct stage {
    const char *section;
    const pl_plugin_desc *desc;
    const pl_config_section *cfg;
    const void *vt;
    pl_stage_fns fns; /* create, destroy, state (stage.h) */
    void *self;
} stage;

#define PL_MONITOR_MAX 4
#define TR_MAX_CALLBACKS 16

struct tr_callback;

/* A batch limit or validation interval: a count of batches (the value was
 * written as an integer) or a fraction of the split (written as a float). */
typedef struct pl_limit {
    double value;
    bool is_count;
} pl_limit;

typedef struct phase_time {
    double seconds;
    size_t peak_bytes;          /* device allocator: max allocated (max_memory_allocated) */
    size_t peak_reserved_bytes; /* device allocator: max reserved (max_memory_reserved) */
} phase_time;

/* What would stall a GPU, per optimizer step (device_stats.c; issue 32):
 * the device backend's counters (pl_backend.counters, the strict device's)
 * read at the start and end of each step's window, which spans fetching the
 * step's batches, forward, backward, the optimizer step and the progress
 * line, and excludes validation, checkpoints and the epoch's end. Summed
 * over the steps after this process's first epoch and its first 2 steps (the
 * warm-up, counted apart as "first_epoch"), separately for steps that
 * log (step % log_every_n_steps == 0: they read values back by design) and
 * those that do not; the max per step too (the CI bar: 0 host reads and 0
 * allocations in a step that does not log). */
typedef struct tr_devstats_sum {
    int64_t steps;
    uint64_t reads, allocs, kernels;          /* sums */
    uint64_t max_reads, max_allocs, max_kernels; /* the most in one step */
} tr_devstats_sum;

/* The same counters per phase of the run (issue 35: what happens outside
 * the training step): each phase's totals over its passes (a train or
 * validate pass is one epoch's; test and export one each), the most host
 * reads in one pass, and the wall seconds. A phase entered while another
 * runs (a mid-epoch validation) pauses it: every count lands in exactly one
 * phase. Checkpoints, callbacks at the epoch's end and setup are in none. */
enum { TR_PH_NONE, TR_PH_TRAIN, TR_PH_VALIDATE, TR_PH_TEST, TR_PH_EXPORT, TR_PH_COUNT };
typedef struct tr_phase_counts {
    int64_t passes;
    double seconds;
    uint64_t reads, read_bytes, writes, write_bytes, allocs, alloc_bytes, kernels;
    uint64_t max_reads, pass_reads; /* the most in one pass; the pass in progress */
} tr_phase_counts;

typedef struct tr_devstats {
    const pl_backend *be; /* the device's backend when it counts, else NULL */
    tr_phase_counts ph[TR_PH_COUNT]; /* [TR_PH_NONE]: not reported */
    int cur;                         /* the phase counting now (TR_PH_NONE: none) */
    pl_backend_counters at;          /* the counters when `cur` was last charged */
    double at_s;                     /* the clock then */
    bool open;            /* a step's window is open (c0 holds its start) */
    pl_backend_counters c0;
    int64_t first_epoch;  /* the epoch this process's fit began with */
    int64_t steps_seen;   /* steps this process has measured (warm-up: the first 2) */
    tr_devstats_sum quiet, logged; /* steps after the first epoch */
    tr_devstats_sum first;         /* the first epoch's steps (warm-up) */
    /* the device's own view once an epoch (pl_backend_device_stats: NVML on
     * cuda, the strict stand-in): tr_devhealth_epoch */
    bool health;                   /* the device answers */
    uint64_t health_cursor;
    double util_sum, mem_max;
    int64_t util_n;
} tr_devstats;

/* A training step's values kept on the device until the next read
 * (step_values.c; issue 32): what the host knows of each buffered loss. */
typedef struct tr_sv_record {
    int64_t epoch, step, batch; /* when the loss was computed */
    bool step_end;              /* the last micro-batch of an optimizer step: its slot also
                                 * holds the step's gradient norm */
} tr_sv_record;

typedef struct tr_step_values {
    pl_tensor *buf;   /* f32 [2 * cap] on the device: slot i = (loss, grad norm) */
    pl_tensor *found; /* f32 [1]: the current step's found_inf (0, or NaN; 1 after the
                       * precision's device scaler found an inf / NaN gradient) */
    pl_tensor *scale; /* the precision's device loss scale (plugin.h, loss_scale_tensor;
                       * borrowed) or NULL: the host loss_scale() / before_step() */
    pl_tensor *accum; /* f32 [1] = accumulate_grad_batches, with scale when it is > 1 */
    pl_tensor **grads; /* tr_grad_list's array, [grads_cap], kept for the fit */
    int grads_cap;
    pl_tensor *clip;  /* f32 [1]: gradient_clip_val, for norm clipping (else NULL) */
    tr_sv_record *rec; /* [cap] */
    float *host;       /* [2 * cap]: the last read */
    int64_t cap, n;    /* slots, slots filled since the last read */
    bool step_bad;     /* replay: the step being replayed had a non-finite loss */
    bool last_step_skipped; /* the last step the last read completed was skipped */
    double last_loss, last_gnorm; /* the last values read (logged, progress) */
    /* a captured step (graph_step.c) writes its loss and grad norm here, f32
     * [2] on the device, one place for every replay; tr_sv_commit copies
     * them into the next slot after each replay */
    pl_tensor *gvals;
    bool graph; /* tr_sv_loss / tr_sv_grad_norm_and_clip write into gvals */
} tr_step_values;

struct pl_graph;
/* [trainer] cuda_graphs (graph_step.c): the captured training step. */
typedef struct tr_graph_state {
    int mode;          /* 0 off, 1 on (decided at the fit's start) */
    bool explicit_on;  /* cuda_graphs = true (a failed capture fails the run) */
    bool reason_logged, fallback_logged, failed;
    int64_t eager_steps; /* micro-batches run eagerly in graph mode before every graph is captured */
    int64_t learn_micro; /* micro-step of the step whose dropout calls were learned; -1 */
    /* [k] (k = accumulate_grad_batches): g[i] runs micro-batch i of a step, the
     * last one with the optimizer step; NULL until captured (ng of them are) */
    struct pl_graph **g;
    int64_t *cap_micro;  /* [k]: the micro-step each graph was captured at */
    int k, ng;
    int64_t replays, fallbacks;
    int64_t cap_step;
    /* the static batch the graph reads */
    pl_batch in;
    char names[PL_BATCH_MAX_FIELDS][64];
    /* a field the loader hands out at the same address every step (a full
     * graph) is read in place: no copy, and the model's caches keyed on the
     * address stay valid */
    bool shared[PL_BATCH_MAX_FIELDS];
    const void *prev[PL_BATCH_MAX_FIELDS]; /* the last warm-up batch's addresses */
    pl_batch prev_shape; /* the last warm-up batch (its fields' descriptors, borrowed: shapes only) */
    pl_tensor prev_desc[PL_BATCH_MAX_FIELDS];
} tr_graph_state;

typedef struct trainer {
    pl_config *cfg;
    pl_registry *reg;
    const pl_run_options *opts;
    const pl_config_section *pipe, *tr;
    pl_run_context ctx;
    pl_run_context *prev_ctx; /* current before tr_offline_init made ctx current */
    char run_dir[PATH_MAX];
    char name[128];
    stage loader, model, optim, avg, prec;
    stage sched[PL_MAX_SCHEDULERS]; /* every [scheduler*] section, file order */
    int n_sched;
    /* data parallel (dist.c): the [strategy] stage, or the auto-selected one
     * under mpirun; rank 0 of world 1 without one. stride > 1: the trainer
     * shards the loader's batches (rank r takes r, r + stride, ...); 1: one
     * process, or a loader that shards itself (pl_loader_vtable.shard). */
    stage strat;
    int rank, world, stride;
    bool pass_start; /* the next tr_next_batch is the first since epoch_begin */
    pl_tensor **dist_grads; /* tr_dist_reduce_grads' list, kept between steps */
    int dist_grads_cap;
    FILE *log, *metrics;
    bool tty;
    bool progress_shown; /* tty: the progress line is on screen (no newline after it) */

    /* settings */
    int64_t max_epochs, max_steps, accum, log_every;
    double clip;
    bool clip_norm, early_stop, mode_max, on_nan_skip, save_last, save_best, do_test, do_export;
    double min_delta;
    int64_t patience, val_every_epochs, ckpt_every, ckpt_every_steps;
    int64_t max_nan_skips; /* on_nan = skip: consecutive skips allowed (0: no limit) */
    pl_limit limit[PL_SPLIT_COUNT]; /* limit_{train,val,test}_batches */
    pl_limit val_interval;          /* val_check_interval */
    const char *monitor; /* the [trainer] monitor string as written ("val_loss,val_accuracy") */
    /* monitored metrics: one (Lightning's ModelCheckpoint / EarlyStopping), or several
     * under the GAT rule (see validate()) */
    int n_monitor;
    char monitors[PL_MONITOR_MAX][64];
    bool mode_maxes[PL_MONITOR_MAX];

    /* state (saved in checkpoints) */
    int64_t epoch, step, micro;
    int64_t batch;         /* next batch of `epoch` (0: at an epoch boundary) */
    int64_t accum_pending; /* micro-batches accumulated since the last step */
    double ep_loss_sum;    /* the epoch's train-loss sum and count so far */
    int64_t ep_loss_n;
    double best;                    /* = bests[0] */
    double bests[PL_MONITOR_MAX];   /* best value of each monitored metric so far */
    double es_best;                 /* one metric: early stopping's best (moves by > min_delta) */
    int64_t bad_vals;
    bool have_best;
    double last_finite_loss;
    int64_t nan_skips; /* on_nan = skip: non-finite losses in a row (reset by a finite one) */

    /* what the resumed checkpoint recorded (-1 / NaN: older checkpoint, or no resume):
     * the fit's planned optimizer steps and the lr factor of its next step */
    int64_t resume_total_steps;
    double resume_lr_factor;

    /* report */
    double t_start, fit_s, test_s, export_s;
    double *epoch_s;
    int64_t n_epoch_s;
    phase_time ph_load, ph_fit, ph_test, ph_export; /* ph_load: peaks only */
    pl_metrics last_val, test_metrics, avg_val_metrics, avg_test_metrics;
    bool have_test, have_avg_test;
    char best_path[PATH_MAX], last_path[PATH_MAX], outputs_path[PATH_MAX];
    double train_samples, train_seconds, data_wait;
    /* cb_throughput.c: the steady-state window (after the warm-up steps) */
    double steady_seconds, steady_samples;
    int64_t steady_steps;
    /* whole-run ETA: when fit started in this process, and the global batch
     * position (epoch * batches per epoch + batch) it started at */
    double fit_t0;
    int64_t fit_batch0;
    size_t frozen_bytes, trainable_bytes; /* parameter storage after precision setup */
    /* model create to the end of weight loading (precision setup, init_from) */
    double load_s;
    size_t load_peak_rss; /* process peak resident bytes at that point */
    bool stopped_early;
    int interrupted; /* SIGINT / SIGTERM received and honoured: the signal number */
    bool epoch_done; /* validating at the end of an epoch: checkpoints record the next one */
    tr_devstats devstats; /* device_stats in summary.json (device_stats.c) */
    /* step_values.c: one process keeps the loss, grad norm and found_inf on the
     * device (dev_loop); data parallel reads them each step (dist.c's reductions) */
    bool dev_loop;
    tr_step_values sv;
    tr_graph_state gs; /* graph_step.c */

    /* callbacks (callback.h): the built-ins, then the extra ones, in call order */
    struct tr_callback *cbs[TR_MAX_CALLBACKS];
    int n_cbs, n_builtin_cbs; /* the first n_builtin_cbs are owned (destroyed with the run) */
    /* the fit's loop state the callbacks read */
    bool should_stop; /* a callback (early stopping) asked the fit to stop after this validation */
    bool val_is_best; /* the last validation is the best so far (cb_monitor -> cb_checkpoint) */
    int peer_signal;  /* DDP: a signal any rank had at the last loss all-reduce (0: none) */
} trainer;

#define LOADER(t) ((const pl_loader_vtable *)(t)->loader.vt)
#define MODEL(t) ((const pl_model_vtable *)(t)->model.vt)
#define OPTIM(t) ((const pl_optimizer_vtable *)(t)->optim.vt)
#define SCHED(s) ((const pl_scheduler_vtable *)(s)->vt)
#define AVG(t) ((const pl_averager_vtable *)(t)->avg.vt)
#define PREC(t) ((const pl_precision_vtable *)(t)->prec.vt)
#define STRAT(t) ((const pl_strategy_vtable *)(t)->strat.vt)

/* ---- dist.c: data-parallel training through a strategy stage ---- */

/* Create the strategy: the [strategy] section's plugin, or under a launcher
 * that started several processes (mpirun: OMPI_COMM_WORLD_SIZE, PMI_SIZE)
 * with no such section, the `ddp` plugin with its defaults (Lightning's
 * strategy="auto"). Sets t->rank and t->world (0 and 1 without one). */
pl_status tr_dist_create(trainer *t);
/* After the loader exists: shard it (its shard function), or let the trainer
 * stride over its batches (t->stride = world). */
pl_status tr_dist_shard(trainer *t);
/* Rank 0's run directory on every rank (t->run_dir, ctx.run_dir). */
pl_status tr_dist_share_run_dir(trainer *t);
/* Every rank's trainable parameters equal rank 0's (a hash compared), so the
 * ranks start from the same weights; PL_ERR_CONFIG naming the first that
 * differs. */
pl_status tr_dist_check_params(trainer *t);
/* Sum the gradients over ranks: each rank's backward was scaled by its share
 * of the global batch (tr_dist_loss), so the sum is the global batch's
 * gradient (a trainable parameter without a gradient on this rank contributes
 * zeros). No-op in one process. */
pl_status tr_dist_reduce_grads(trainer *t);
/* The training loss of the global batch, *lv in and out: each rank's loss
 * weighted by the terms it averages (the count of the `loss` metric the model
 * reported in `m`, else the batch's samples `size`); *share, the factor this
 * rank's backward is scaled by (its weight / the total weight), so that the
 * summed gradient is the gradient of the global batch's mean loss, as one
 * process would compute it, even when the ranks' batches average over
 * different numbers of terms (tokens with labels, a short last batch); and
 * *any_signal, a signal number when any rank passed a non-zero `signal` (0:
 * none). One all-reduce of 3 doubles. In one process: *share 1, *lv
 * unchanged, *any_signal = signal. */
pl_status tr_dist_loss(trainer *t, double *lv, const pl_metrics *m, int64_t size, double *share,
                       int signal, int *any_signal);
/* Sum every metric's sum and count over ranks (names as rank 0 has them; a
 * name only another rank has is an error). */
pl_status tr_dist_reduce_metrics(trainer *t, pl_metrics *m);
pl_status tr_dist_barrier(trainer *t);
/* A failed rank stops the others (the strategy's abort). Returns only in one
 * process. */
void tr_dist_abort(trainer *t, int code);
/* The next batch of this rank: with stride > 1, skips the other ranks'
 * batches (t->pass_start: the first call since epoch_begin, which starts at
 * a multiple of stride). 1 / 0 / -1 as the loader's next(). */
int tr_next_batch(trainer *t, pl_batch *b);

/* ---- device_stats.c: host reads, allocations, kernel calls per step ---- */
/* At fit's start: find the device backend's counters (none on the CPU, or
 * on a backend without pl_backend.counters: the calls below do nothing). */
void tr_devstats_begin(trainer *t);
/* Open a step's window (before fetching its first micro-batch). */
void tr_devstats_step_begin(trainer *t);
/* Close it after the step (logged: this step logs values). */
void tr_devstats_step_end(trainer *t, bool logged);
/* Drop an open window (a skipped step: no optimizer step follows). */
void tr_devstats_step_abort(trainer *t);
/* Enter phase `ph` (TR_PH_*; a new pass of it when `new_pass`) and return
 * the phase that was counting, which tr_devstats_phase(t, prev, false)
 * resumes. What the counters moved since the last switch is charged to the
 * phase that was counting. Works without counters too (seconds only). */
int tr_devstats_phase(trainer *t, int ph, bool new_pass);
/* The fit's closing log line. */
void tr_devstats_log(trainer *t);
/* At an epoch's end (Lightning's DeviceStatsMonitor): the device's
 * utilization over the epoch and its memory in use (pl_backend_device_stats),
 * as metrics.csv rows device_utilization, device_idle_fraction (1 -
 * utilization: the share of the epoch the device waited, for the host or
 * anything else) and device_memory_used_bytes; `buf` gets the epoch line's
 * part ("  device 83% busy, 12.3 GiB in use"), or "" when the device says
 * nothing (the CPU; cuda without libnvidia-ml, said once at fit's start). */
void tr_devhealth_epoch(trainer *t, char *buf, size_t n);
/* summary.json's "device_stats" object (null when the device counts nothing);
 * `o` is a cJSON object (void * keeps cJSON out of this header). */
void tr_devstats_json(const trainer *t, void *o);

/* ---- step_values.c: the step's values on the device until the next read ---- */
/* At fit's start: dev_loop (world 1) and the device buffers; PL_ERR_NOMEM. */
pl_status tr_sv_begin(trainer *t);
void tr_sv_end(trainer *t); /* release them (NULL-safe, idempotent) */
/* A micro-batch's loss (one element, on the device) into the next slot and
 * the step's found_inf flag (first_micro: the step's first micro-batch);
 * reads back first when the buffer is full. Not on the tape. */
pl_status tr_sv_loss(trainer *t, pl_tensor *loss, bool first_micro, int64_t b);
/* The gradients of the trainable parameters, in parameter order, into
 * *out (borrowed: the fit's array, grown when parameters are added, freed by
 * tr_sv_end; no allocation in a steady step): their count, or -1 (out of
 * memory, the error set). Between tr_sv_begin and tr_sv_end. */
int tr_grad_list(trainer *t, pl_tensor ***out);
/* The gradient norm into the last slot and clipping (norm: by the device-side
 * coefficient; value: clamp), before the optimizer step. */
pl_status tr_sv_grad_norm_and_clip(trainer *t);
/* Read every buffered value back (one copy) and replay the on_nan policy over
 * them in order: ep_loss_sum/n, last_finite_loss, nan_skips, the warnings and
 * errors; takes skipped steps back from t->step and t->micro. No-op when
 * nothing is buffered or dev_loop is off. */
pl_status tr_sv_flush(trainer *t);
/* The last buffered micro-batch's loss and, when it ended a step, gradient
 * norm, as f32 [1] views of the device buffer (frame-owned in a frame; the
 * caller's to release otherwise); NULL when nothing is buffered or off. */
void tr_sv_last(trainer *t, pl_tensor **loss, pl_tensor **gnorm);
/* After a replay of a captured micro-batch: its loss and grad norm (gvals)
 * into the next slot, recorded as micro-batch b, a step's last one when
 * step_end (only then is the grad norm read; reads back first when the
 * buffer is full). */
pl_status tr_sv_commit(trainer *t, int64_t b, bool step_end);

/* ---- graph_step.c: [trainer] cuda_graphs ---- */
/* At the fit's start: decide (and log why not) from the option, the device
 * and the run's shape (accumulation, data parallel, dev_loop). */
void tr_graph_begin(trainer *t);
/* At the fit's end (and teardown): the graph, its pool and the static batch
 * released; logs the capture and replay counts. Idempotent. */
void tr_graph_end(trainer *t);
/* One training batch when graph mode is on; pending: the micro-batches of
 * this step before it (accumulation). 1 when it ran as a captured graph that
 * ended with the optimizer step (the caller then does what follows an
 * optimizer step), 2 when it ran as a captured micro-batch without it (the
 * caller counts it as a pending micro-batch; a step cut short at the epoch's
 * end then steps eagerly), 0 to run it eagerly, -1 on an error (*st).
 * *lr: the step's group-0 learning rate (set when it stepped). */
int tr_graph_try(trainer *t, const pl_batch *batch, int64_t b, int64_t pending, double *lr,
                 pl_status *st);
/* ---- step.c: the step, which the fit runs eagerly and graph_step.c captures ---- */
/* One micro-batch: forward, the loss (on the device, or read on the host under
 * data parallel), backward; 1 to go on to the step, 0 when on_nan = skip
 * dropped the step's micro-batches, -1 on an error (*st). */
int tr_train_micro_batch(trainer *t, const pl_batch *batch, int64_t b, int64_t *pending,
                         double *lv, pl_status *st);
pl_status tr_optimizer_step_body(trainer *t, double *gnorm, double *lr);
pl_status tr_optimizer_step_tail(trainer *t);
/* body then tail: an eager optimizer step; *gnorm (host norm, NaN when kept on
 * the device), *lr group 0's learning rate. */
pl_status tr_optimizer_step(trainer *t, double *gnorm, double *lr);
double tr_apply_lr(trainer *t);
/* One training loss lv (at epoch / step / batch) read back by the host,
 * handed to every callback's on_loss_read (the NaN policy, cb_nan.c: a
 * finite loss is the last finite one and resets the count; a non-finite
 * one is counted in t->nan_skips: PL_ERR_NUMERIC naming them and the last
 * finite loss under on_nan = stop or past max_consecutive_nan_skips, else
 * the skipped step's warning and PL_OK). Both paths' one decision. */
pl_status tr_loss_read(trainer *t, double lv, int64_t epoch, int64_t step, int64_t batch);

/* ---- trainer.c ---- */
double tr_now(void); /* monotonic seconds */
size_t tr_peak_rss_bytes(void); /* the process's peak resident set so far (ru_maxrss), bytes */
/* printf to stdout and log.txt. On a terminal the progress line is erased
 * first, so what is printed stays on screen; pieces of one line may be
 * printed by several calls (nothing erases them until the next progress
 * refresh, which a piece that ends the line with '\n' puts below). */
void tr_log(trainer *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* erase the progress line from the terminal, if it is shown */
void tr_progress_clear(trainer *t);
int tr_mkdir_p(const char *path); /* mkdir -p; 0 or -1 with errno */
void tr_metric_row(trainer *t, const char *key, double v); /* one metrics.csv row */
/* log one line "<heading>  <prefix>_<name> value ..." (every metric) and add
 * metrics.csv rows */
void tr_print_metrics(trainer *t, const char *heading, const char *prefix, const pl_metrics *m);
/* Evaluate `split` (at most `lim` of its batches) into *m, reduced over
 * ranks; grad off, the tape cleared. */
pl_status tr_evaluate(trainer *t, pl_data_split split, pl_metrics *m, pl_limit lim);
/* PL_ERR_NUMERIC naming the split and the first non-finite metric. */
pl_status tr_check_finite(const char *split, const pl_metrics *m);
/* Training batches the fit plans from epoch 0 batch 0 (nb per epoch); -1: unbounded. */
int64_t tr_planned_batches(const trainer *t, int64_t nb);
/* The learning-rate factor of the next optimizer step (t->step): every
 * scheduler's product, or the averager's override. */
double tr_lr_factor(trainer *t);
/* Every batch of `split` from the loader's fixed order (epoch 0, from batch
 * 0; at most max_batches, -1: all), grad off, each inside its own pl_frame,
 * handed to fn with `arg`. Stops at the first error, the loader's or fn's,
 * and returns it. The tape is the caller's to clear. Evaluation, export and
 * predict all walk a split this way. */
typedef pl_status (*tr_batch_fn)(trainer *t, const pl_batch *b, pl_data_split split, void *arg);
pl_status tr_each_batch(trainer *t, pl_data_split split, int64_t max_batches, tr_batch_fn fn,
                        void *arg);
/* ---- outputs.c: a model's outputs into a file (plugin.h pl_outputs) ----
 * The model's outputs_* verbs for `purpose`, written with libpipeline_hdf5
 * (pl_h5_outputs_*: a temporary name, renamed when complete).
 * tr_outputs_supported: whether the model has the verbs (read only from a
 * plugin of ABI minor >= 9). tr_outputs_begin: outputs_begin, then the file:
 * PL_OUTPUTS_PREDICT at `dest`, PL_OUTPUTS_EXPORT at dest/<the file the
 * model named> (PL_ERR_INVALID when it named none or one with '/');
 * `attrs` (borrowed; the model adds to it) becomes the root attributes; the
 * final path is copied to path_out (size n) when not NULL. A model's
 * PL_ERR_UNSUPPORTED passes through with no file made. tr_outputs_batch:
 * outputs_batch on b, its tensors appended (call it from a tr_each_batch
 * callback: the tensors live in that frame). tr_outputs_finish: on `st` ==
 * PL_OK commit the file and call outputs_end, else remove the temporary
 * file; returns the first error. */
struct pl_h5_out;
bool tr_outputs_supported(const trainer *t);
pl_status tr_outputs_begin(trainer *t, pl_outputs_purpose purpose, const char *dest,
                           pl_meta *attrs, struct pl_h5_out **file, char *path_out, size_t n);
pl_status tr_outputs_batch(trainer *t, pl_outputs_purpose purpose, struct pl_h5_out *file,
                           const pl_batch *b, pl_data_split split);
pl_status tr_outputs_finish(trainer *t, pl_outputs_purpose purpose, struct pl_h5_out **file,
                            pl_status st);
/* Create the stage of INI section `section` (PL_OK with s->self NULL when
 * the config has no such section); errors name the section and plugin. */
pl_status tr_stage_create(trainer *t, stage *s, const char *section);
void tr_stage_destroy(stage *s);
/* A `limit_*_batches` / `val_check_interval` value: an integer is a count of
 * batches, a float a fraction of the split (Lightning's reading). */
pl_limit tr_cfg_limit(const pl_config_section *s, const char *key);
/* The batches of a split of n that `lim` leaves. */
int64_t tr_limit_batches(pl_limit lim, int64_t n);
/* The run whose terminal and log.txt pl_message writes to (its sink, message.h;
 * NULL: stderr only). */
void tr_set_message_run(trainer *t);
/* The fit: epochs until max_epochs, max_steps, early stopping or a signal. */
pl_status tr_fit(trainer *t);

/* ---- trainer_setup.c ---- */
/* Build the stages a model needs, as a run does: create [data] (its meta:
 * num_items, ...; its data line logged), [model], [precision] and run the
 * precision's setup (without a [precision] section: every float parameter
 * to f32). The batch-field contract is the caller's to check first
 * (pl_trainer_check_fields; predict checks predict_needs instead). t->cfg,
 * t->ctx (device, seed, meta, params) must be set. *load_start (may be NULL)
 * gets the time model create began. Errors: the first stage's, prefixed
 * with its section and plugin. Used by pl_trainer_run, `pipeline export`
 * (export.c) and `pipeline predict` (predict.c). */
pl_status tr_build_model(trainer *t, double *load_start);
/* Destroy every created stage, in reverse order of creation (NULL-safe per
 * stage). The params and meta stay (the caller frees them). */
void tr_destroy_stages(trainer *t);
/* A trainer that builds stages outside a run (`pipeline export`, `predict`,
 * the optimizer-group check of `pipeline check`): zeroes *t and sets the
 * config, registry, its [pipeline] / [trainer] sections, seed, verbose, one
 * process (world 1), run_dir (NULL or "": none; the stages read what a run
 * saved there, never write) and a new meta table and parameter list. The
 * device (ctx.device) is the caller's to set. PL_ERR_NOMEM; free with
 * tr_offline_free either way. */
pl_status tr_offline_init(trainer *t, pl_config *cfg, pl_registry *reg, const char *run_dir);
/* Free what tr_offline_init made (the stages must have been destroyed) and
 * put autocast back to f32. */
void tr_offline_free(trainer *t);

/* [pipeline] device (loading its backend plugin), threads and the backend
 * settings into t->ctx.device; errors set the thread's error. */
pl_status tr_setup_device(trainer *t);
/* No [precision] section: parameters as fp32 keeps them (pl_params_convert). */
pl_status tr_default_precision(trainer *t);
/* Print the thread's error (and a hint) to stderr and log.txt; returns code. */
int tr_fail(trainer *t, int code);
/* ---- run_dirs.c: the configs of a chain as its runs see them ---- */
/* The command-line overrides of this run that the runs it requires inherit:
 * settings of the run-wide [pipeline] keys (pl_pipeline_key_is_runwide),
 * borrowed from t->opts, and the origin their values carry there. */
#define RW_MAX 16
typedef struct tr_runwide {
    int n;
    char *v[RW_MAX];
    char origin[PATH_MAX + 32];
    char kept[1024]; /* this run's own overrides that stay with it ("" when none) */
} tr_runwide;
/* *rw for this run (borrows t->opts' strings). */
void tr_runwide_of(const trainer *t, tr_runwide *rw);
/* A config of this run's chain (a requirement, an @INI reference) loaded with
 * the run-wide overrides, so that `pipeline.run_dir=X` finds and makes the
 * required runs under X; NULL with the error set. Caller frees. */
pl_config *tr_load_in_chain(const trainer *t, const char *ini);

/* pl_trainer_run's steps (chain.c runs tr_run_settings, the requirements,
 * tr_run_open and tr_run_main; tr_run_main runs the rest in this order).
 * tr_run_settings: the settings and option checks; tr_run_open: the output
 * references, the device, the strategy, the run directory and its files; both
 * return the exit code of a run that cannot start (0: go on; the error is
 * printed). tr_run_build: the batch-field contract, the stages, the planned
 * steps, the callbacks; *load_start as tr_build_model. tr_run_load:
 * init_from, the load time, a resume, the ranks' parameter check and the
 * parameter storage line. tr_run_main: build, load, the fit and the phases,
 * summary.json; frees t and returns the run's exit code. */
int tr_run_settings(trainer *t, pl_config *cfg, pl_registry *reg, const pl_run_options *opts);
int tr_run_open(trainer *t);
int tr_run_main(trainer *t);
pl_status tr_run_build(trainer *t, double *load_start);
pl_status tr_run_load(trainer *t, double load_start);

/* ---- predict.c ---- (in core/services; the entry point, pl_predict_run, is in predict.h) */

/* ---- checkpoint.c ---- */
/* Weights, every stage's state and the loop counters to `path` (temp file,
 * fsync, rename). */
pl_status tr_save_checkpoint(trainer *t, const char *path);
/* Parameters (all must be present unless weights_only) and, for a resume,
 * every stage's state and the loop counters; errors name the file and key. */
pl_status tr_load_checkpoint(trainer *t, const char *path, bool weights_only);
/* Every parameter the checkpoint holds (all must be present: PL_ERR_IO
 * naming the first missing one; frozen pretrained weights excepted) through
 * the precision's load_param, then the model's on_load; no stage state, no
 * loop counters: what `pipeline predict` and `pipeline export` load. A
 * checkpoint written by another model plugin is refused naming both. */
pl_status tr_load_weights(trainer *t, const char *path);
/* After a resume: adopt the earlier run's best.safetensors as this run's best
 * checkpoint when the restored best value came from it. */
void tr_adopt_earlier_best(trainer *t, const char *resumed);

/* ---- report.c ---- */
/* summary.json (status "ok" or "failed") and, for a successful run, the report. */
void tr_write_summary(trainer *t, int status);
/* ---- device memory peaks (report.c) ----
 * Fold the device allocator's peaks since its last reset into *p (max), then,
 * if `reset`, restart the allocator's peaks at the current values. */
void tr_peak_fold(trainer *t, phase_time *p, bool reset);
/* metrics.csv rows peak_memory_allocated_bytes / peak_memory_reserved_bytes:
 * the allocator's peaks since the last reset (the epoch's, at an epoch's end). */
void tr_peak_metric_rows(trainer *t);

/* ---- chain.c ---- */
/* Run every `requires` config without a finished run; CLI exit code. */
int tr_run_requirements(trainer *t);

/* ---- run_dirs.c ---- */
/* init_from value (a path or @INI:best|last) to a checkpoint path. */
pl_status tr_resolve_init_from(trainer *t, const char *v, char *out, size_t n);
/* Replace every @INI:outputs/FILE value by the file in that config's latest run. */
pl_status tr_resolve_output_refs(trainer *t);
/* Newest run directory under `base` other than `self` with a last checkpoint. */
int tr_newest_last_checkpoint(const char *base, const char *self, char *out, size_t n);
/* A new timestamped run directory; runs/<name>/last_attempt points at it. */
pl_status tr_make_run_dir(trainer *t);
/* runs/<name>/latest -> this run: called when the run ended ok, so
 * requirements and @INI:best|last never see a failed or interrupted run. */
void tr_mark_latest(trainer *t);
/* Remove the NAME.tmp.<pid> files (checkpoints, summary.json, exports, links:
 * written under a temporary name, then renamed) in `dir` whose process no
 * longer runs (kill(pid, 0) fails with ESRCH) and that were not modified for
 * min_age_s seconds (a process of another host sharing the directory may be
 * writing it); report(ud, path, pid) for each. Returns how many. */
int tr_remove_orphan_tmp(const char *dir, double min_age_s,
                         void (*report)(void *ud, const char *path, long pid), void *ud);
#define TR_ORPHAN_MIN_AGE_S 60.0
/* tr_remove_orphan_tmp over this config's run tree (RUN_DIR/NAME, every run
 * directory in it, their checkpoints/ and outputs/), each removal logged. */
void tr_sweep_orphan_tmp(trainer *t);

/* One validation's monitored values v[0..n_monitor-1] against the bests so far:
 * updates bad_vals (patience), bests[] and best, and returns whether this is
 * the new best checkpoint. One metric: Lightning's EarlyStopping (an
 * improvement by more than min_delta resets patience) and ModelCheckpoint
 * (any strict improvement is the best). Several: the GAT rule (Velickovic et
 * al. 2018, execute_cora.py) - patience resets while any metric reaches its
 * best so far (ties count), the best checkpoint is where all are at their best
 * together. Sets have_best. */
bool tr_monitor_step(trainer *t, const double *v);

#endif
