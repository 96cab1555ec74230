/* testing.h - a test harness for stage plugins (GStreamer's GstHarness idea):
 * build one stage from an INI snippet, feed it batches, round-trip its
 * checkpoint state, gradient-check a model. Every in-tree plugin test uses
 * it; an out-of-tree plugin's tests can too (it is part of libpipeline_core,
 * nothing else to link).
 *
 *   pl_harness *h = pl_harness_new("optimizer", "adamw", "lr = 0.01\n");
 *   if (!h) ... pl_error_message() says why (PL_ERR_CONFIG for a bad option,
 *                as `pipeline check` would print it)
 *   pl_harness_add_param(h, "w", PL_SHAPE(2, 3), values, 0, NULL, true);
 *   void *opt;  pl_harness_create(h, &opt);  ... step ...
 *   pl_snapshot *s = pl_harness_state_save(h, opt);   // "round-trip its state"
 *   pl_harness_destroy(h, opt);  pl_harness_free(h);
 *
 * What a harness holds (owned by it, freed by pl_harness_free):
 *   - a run context (pl_harness_ctx): CPU device, seed 1, fresh empty
 *     pl_params and pl_meta, every counter 0, run_dir NULL. The test may set
 *     any field before pl_harness_create (seed, run_dir, total_steps,
 *     steps_per_epoch, max_epochs) or between calls (micro_step, ...);
 *     optimizer / optimizer_self are NULL: a scheduler or averager that
 *     reads the optimizer's base lr needs them set to an optimizer built
 *     with pl_harness_new_shared + pl_harness_create (its vtable and self),
 *     as the trainer sets them;
 *   - the plugin, found through the registry in the usual search order
 *     (PIPELINE_PLUGIN_PATH, the build tree's plugin dir, the install dir;
 *     ctest sets PIPELINE_PLUGIN_PATH to the build's plugin dir), its kind
 *     checked against the section;
 *   - the resolved section: `[SECTION] plugin = PLUGIN` + the snippet,
 *     validated against the plugin's option schema by the same code as a
 *     real config (types, bounds, choices, unknown keys, defaults filled).
 *
 * Instances made by pl_harness_create are owned by the caller and destroyed
 * with pl_harness_destroy (or the vtable's destroy) before pl_harness_free.
 *
 * Errors: every function returning pl_status (or NULL) sets the thread's
 * error message (pl_error_message()) naming the plugin, parameter, field or
 * state entry concerned, as the rest of the SDK does. Nothing here calls
 * exit() or a test framework: assertions are the test's business.
 */
#ifndef PIPELINE_TESTING_H
#define PIPELINE_TESTING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pipeline/plugin.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Run objects outside a run: pl_params_new / pl_meta_new and their frees
 * are declared in <pipeline/plugin.h>. */

/* ======================================================================
 * Building a stage
 * ====================================================================== */

typedef struct pl_harness pl_harness;

/* Build a harness for `[section] plugin = plugin` + `ini_body` ("key = value"
 * lines, may be NULL). `section` is a stage section name ("data", "model",
 * "optimizer", "averager", "scheduler" or "scheduler<SUFFIX>", "precision").
 * Returns NULL with the error set when the plugin is missing or refused
 * (PL_ERR_CONFIG / PL_ERR_ABI, message naming the file) or the snippet
 * fails validation (PL_ERR_CONFIG, "test.ini:LINE: ..." as a real config,
 * with the same hint in pl_hint_get()).
 * pl_harness_new(NULL, NULL, NULL) makes a harness with only a run context
 * (for tests that call a plugin's internal functions directly).
 * Its run context is the calling thread's current one (plugin.h, "Autocast",
 * ABI 2.9) from here until pl_harness_free, as a run's is during the run:
 * the ops read its autocast, which a precision plugin's setup sets. Freeing
 * it makes the newest live harness's context current again, or else the
 * context current before the first; build and free on one thread. */
pl_harness *pl_harness_new(const char *section, const char *plugin, const char *ini_body);
/* The same, searching the colon-separated directories `plugin_dirs` first
 * (test-only plugins). */
pl_harness *pl_harness_new_in(const char *plugin_dirs, const char *section, const char *plugin,
                              const char *ini_body);
/* A harness for another stage that shares `base`'s run context (params,
 * meta, counters): an optimizer over a model's parameters. `base` is
 * borrowed and must outlive the new harness. */
pl_harness *pl_harness_new_shared(pl_harness *base, const char *section, const char *plugin,
                                  const char *ini_body);
void pl_harness_free(pl_harness *h); /* NULL-safe */

/* Borrowed views, valid until pl_harness_free. section / vtable / desc are
 * NULL for a context-only harness. The vtable is the plugin's
 * pl_<kind>_vtable. */
pl_run_context *pl_harness_ctx(pl_harness *h);
const pl_config_section *pl_harness_section(const pl_harness *h);
const void *pl_harness_vtable(const pl_harness *h);
const pl_plugin_desc *pl_harness_desc(const pl_harness *h);

/* The vtable's create with the harness's section and context; *self is
 * owned by the caller. pl_harness_destroy calls the vtable's destroy
 * (NULL-safe). Backends have no create: PL_ERR_INVALID. */
pl_status pl_harness_create(pl_harness *h, void **self);
void pl_harness_destroy(pl_harness *h, void *self);

/* Find plugin `name` of `kind` (PL_KIND_COUNT: any) in the default search
 * path without building a section (a backend's descriptor). The descriptor
 * is borrowed (plugins stay loaded for the process). */
pl_status pl_harness_find_plugin(const char *name, pl_plugin_kind kind,
                                 const pl_plugin_desc **desc);
/* Load the device backend of `type` as `[pipeline] device = cuda` does
 * (PL_DEVICE_CPU: the cpu plugin, which the first CPU op would load
 * anyway; PL_OK at once when it is registered). PL_ERR_DEVICE with the reason when the
 * plugin loads but sees no device; PL_ERR_CONFIG / PL_ERR_ABI when the
 * plugin is missing or refused. */
pl_status pl_harness_load_backend(pl_device_type type);
/* Same, naming the backend plugin that fills the slot: "cuda" (NULL means
 * it) or "strict" (the GPU-like emulation that runs on the CPU). A slot
 * already held by another backend: PL_ERR_DEVICE naming both. */
pl_status pl_harness_load_backend_named(pl_device_type type, const char *name);

/* ======================================================================
 * Parameters (for optimizers, schedulers, averagers, precision stages)
 * ====================================================================== */

/* Add an f32 CPU parameter `name` of `shape` to the context's params with
 * `values` (numel floats, row-major; NULL: zeros), tags (PL_TAG_*), role
 * (NULL: none) and requires_grad = trainable. Returns the tensor, borrowed
 * from the params list; NULL with PL_ERR_INVALID on a duplicate name or a
 * bad shape. */
pl_tensor *pl_harness_add_param(pl_harness *h, const char *name, int ndim, const int64_t *shape,
                                const float *values, unsigned tags, const char *role,
                                bool trainable);
/* Set the .grad of parameter `name` to `values` (numel floats; NULL: no
 * gradient at all, as for a parameter the loss did not reach). */
pl_status pl_harness_set_grad(pl_harness *h, const char *name, const float *values);

/* ======================================================================
 * Checkpoint state: in-memory snapshots through pl_state_visitor
 * ====================================================================== */

/* A snapshot is an ordered list of named entries, each a tensor (a CPU copy
 * with the dtype, shape and bytes it had) or a scalar (double). nf4 tensors
 * are refused (PL_ERR_DTYPE): save their dequantized form. Owned by the
 * caller (pl_snapshot_free). */
typedef struct pl_snapshot pl_snapshot;

pl_snapshot *pl_snapshot_new(void);
void pl_snapshot_free(pl_snapshot *s); /* NULL-safe */
/* Append what `fn(self, visitor)` lists while saving (visitor.loading
 * false). A name listed twice: PL_ERR_INVALID naming it. */
pl_status pl_snapshot_save_state(pl_snapshot *s, pl_state_fn fn, void *self);
/* Give the entries back through `fn(self, visitor)` while loading
 * (visitor.loading true), copying each into the tensor or scalar the plugin
 * shows (dtype converted among f32/bf16/f16 like a checkpoint load). A name
 * the snapshot lacks: PL_ERR_IO naming it; entries the plugin did not ask
 * for: PL_ERR_INVALID naming the first. */
pl_status pl_snapshot_load_state(const pl_snapshot *s, pl_state_fn fn, void *self);
/* Append every parameter of `ps` under its name / copy them back (same
 * shapes; every snapshot entry must be a parameter of `ps` and the reverse). */
pl_status pl_snapshot_save_params(pl_snapshot *s, pl_params *ps);
pl_status pl_snapshot_load_params(const pl_snapshot *s, pl_params *ps);

int pl_snapshot_count(const pl_snapshot *s);
const char *pl_snapshot_name_at(const pl_snapshot *s, int i);
/* Entry `name`: its tensor (borrowed; NULL for a scalar or when absent) /
 * its scalar (NAN and *found false when absent or a tensor). */
const pl_tensor *pl_snapshot_tensor(const pl_snapshot *s, const char *name);
double pl_snapshot_scalar(const pl_snapshot *s, const char *name, bool *found);
/* Exact equality: same names in the same order, tensors with equal dtype,
 * shape and bytes, scalars bit-identical (NaN equals NaN). When they differ
 * returns false and writes the first difference (entry, element, both
 * values) into msg (may be NULL). */
bool pl_snapshot_equal(const pl_snapshot *a, const pl_snapshot *b, char *msg, size_t msgn);

/* The stage's own state function (optimizer, averager, scheduler,
 * precision: vtable->state) into a new snapshot / back from one. A model
 * has no state function: its state is its parameters (ctx->params). A
 * loader has none (ABI 2: its position is the trainer's batch counter):
 * an empty snapshot. NULL / status with the error set. */
pl_snapshot *pl_harness_state_save(pl_harness *h, void *self);
pl_status pl_harness_state_load(pl_harness *h, void *self, const pl_snapshot *s);

/* ======================================================================
 * Batches: loaders and models
 * ====================================================================== */

/* Append field `name` = `t` to a batch (both borrowed: the names and
 * tensors must outlive the batch). PL_ERR_INVALID past PL_BATCH_MAX_FIELDS
 * or on a duplicate name. */
pl_status pl_harness_batch_add(pl_batch *b, const char *name, pl_tensor *t);

/* Check a batch against the plugin's declared contract for `split`:
 *   loader: every field batch_fields declares for the split is present with
 *           exactly the declared dtype and rank (-1: any), and no field is
 *           undeclared;
 *   model:  every required field of batch_needs is present with an
 *           accepted dtype (PL_DTYPE_FLOAT / _INDEX / _ANY) and rank;
 *           optional fields are checked when present.
 * PL_ERR_INVALID naming the field, what was declared and what was found. */
pl_status pl_harness_check_batch(pl_harness *h, const pl_batch *b, pl_data_split split);

/* Loader: start an epoch (vtable epoch_begin), then fetch batches; each
 * batch is checked with pl_harness_check_batch (a mismatch fails like an
 * error). pl_harness_next returns 1 (batch in *out, fields valid until the
 * next call), 0 (epoch done) or -1 (error set). */
pl_status pl_harness_epoch_begin(pl_harness *h, void *self, pl_data_split split, int64_t epoch,
                                 int64_t start_batch);
int pl_harness_next(pl_harness *h, void *self, pl_batch *out);
/* Run a whole epoch of `split` from batch 0, checking every batch and that
 * the count equals num_batches(split) and batch indices run 0, 1, ...;
 * *batches and *samples (either may be NULL) receive the totals. */
pl_status pl_harness_run_epoch(pl_harness *h, void *self, pl_data_split split, int64_t epoch,
                               int64_t *batches, int64_t *samples);

/* Model: one forward of batch `b` in its own frame. training = true: grad
 * mode as the caller has it (the tape is cleared afterwards, nothing is
 * accumulated); training = false: under pl_no_grad. *loss (may be NULL)
 * receives the loss value (NAN when the model set none); metrics (may be
 * NULL) are added to `m`. The context's micro_step is not changed. */
pl_status pl_harness_forward(pl_harness *h, void *self, const pl_batch *b, pl_data_split split,
                             bool training, double *loss, pl_metrics *m);
/* Model: a training forward and pl_backward(loss, 1.0) in one frame: the
 * gradients ACCUMULATE into the parameters' .grad (zero them first with
 * pl_harness_zero_grad for a fresh step). */
pl_status pl_harness_backward(pl_harness *h, void *self, const pl_batch *b, double *loss);
void pl_harness_zero_grad(pl_harness *h);
/* One optimizer step as the trainer takes it with no scheduler: zero the
 * grads, training forward + backward of `b` on `model` (harness `mh`), set
 * each group's lr to its initial_lr, step the optimizer `opt` (harness `oh`,
 * sharing mh's context), then micro_step++ and global_step++. */
pl_status pl_harness_train_step(pl_harness *mh, void *model, pl_harness *oh, void *opt,
                                const pl_batch *b, double *loss);

/* Numerical gradient check of a model's training loss on batch `b` (the
 * context's micro_step fixed, so dropout masks do not move) with respect to
 * every trainable f32 parameter:
 *   analytic:  one training forward + backward (grads zeroed first);
 *   numerical: for each checked element, (L(w + eps) - L(w - eps)) / 2 eps,
 *              the two losses from training forwards with grad off, the
 *              difference taken in f64;
 *   checked elements: all of a parameter with at most `max_per_param`
 *              elements, else `max_per_param` distinct ones drawn by a fixed
 *              generator seeded with the context's seed and the parameter's
 *              index (so a failure reproduces). max_per_param <= 0: all.
 * Passes when |analytic - numerical| <= atol + rtol |numerical| for every
 * element checked. Otherwise PL_ERR_NUMERIC naming the parameter, the
 * element and both values. The parameters are restored bit for bit and the
 * grads left zeroed. A model without trainable parameters: PL_ERR_INVALID. */
pl_status pl_harness_gradcheck(pl_harness *h, void *self, const pl_batch *b, double eps,
                               double atol, double rtol, int max_per_param);

#ifdef __cplusplus
}
#endif
#endif
