/* optim_testkit.h - helpers for the optimizer / averager / scheduler /
 * precision plugin tests (test-only; compiled into each test, never into a
 * plugin): a thin layer over the public harness (pipeline/testing.h) that
 * adds the JSON reference files and Check assertions.
 *
 * A test loads a reference file written by tools/gen_optim_reference.py
 * (tests/data/optim/<file>.json) and builds the plugin under test through the
 * real path: registry and option validation of one INI section
 * (pl_harness_new_shared over a run context that outlives every tk_open).
 */
#ifndef PL_OPTIM_TESTKIT_H
#define PL_OPTIM_TESTKIT_H

#include <cjson/cJSON.h>
#include <stdio.h>

#include "pipeline/pipeline.h"
#include "pipeline/testing.h"
#include "pl_test.h"

typedef struct tk_run {
    pl_harness *base;  /* owns the run context */
    pl_harness *stage; /* the section of the last tk_open, sharing base's context */
    const pl_config_section *sec;
    const void *vtable;  /* the plugin's pl_<kind>_vtable */
    pl_run_context *ctx; /* params and meta owned by the kit */
    pl_harness *optim;   /* tk_optimizer's stage, sharing base's context */
    void *optim_self;    /* the optimizer it created (ctx->optimizer_self) */
} tk_run;

/* Parsed tests/data/optim/<file>; "cases" array via tk_cases. */
cJSON *tk_json(const char *file);
const cJSON *tk_cases(const cJSON *root);
const cJSON *tk_case(const cJSON *root, const char *name);

/* Empty run context (params, meta) ready for tk_open. */
void tk_init(tk_run *r);
/* Load the config "[section] plugin = NAME" + `options` (a JSON object of
 * strings) + `extra` ("key = value\n" lines, may be NULL) and find the
 * vtable. Fails the test on error. */
void tk_open(tk_run *r, const char *section, const char *plugin, const cJSON *options,
             const char *extra);
/* Same, returning the load error status instead of failing (for tests of
 * refusals); message in pl_error_message(). */
pl_status tk_try_open(tk_run *r, const char *section, const char *plugin, const char *ini_body);
void tk_close(tk_run *r);
/* The run's optimizer, as the trainer sets it before creating schedulers and
 * averagers (ctx->optimizer / optimizer_self, ABI 2.9): `[optimizer] plugin =
 * PLUGIN` + ini_body ("key = value\n" lines), created over the parameters
 * added so far (a context without any first gets one trainable "tk.w" [1]).
 * Owned by the kit: destroyed by tk_close. Fails the test on error; replaces
 * an optimizer set before. */
void tk_optimizer(tk_run *r, const char *plugin, const char *ini_body);
/* tk_optimizer(r, "sgd", "lr = <lr>"): an optimizer whose base lr is `lr`. */
void tk_optimizer_lr(tk_run *r, double lr);

/* Add an f32 parameter named `name` of `shape` with values `vals` (may be
 * NULL: zeros), requires_grad set. Returns the borrowed tensor. */
pl_tensor *tk_add_param(tk_run *r, const char *name, int ndim, const int64_t *shape,
                        const double *vals, bool trainable);
/* JSON number array -> malloc'd doubles (count in *n). */
double *tk_doubles(const cJSON *a, int *n);
/* |a - b| <= rtol |b| + atol (NaN == NaN). */
bool tk_near(double a, double b, double rtol, double atol);

/* ---- checkpoint state round trip --------------------------------------- */

/* In-memory checkpoint: what a plugin's state(visitor) listed (a harness
 * snapshot; the tk_ wrappers fail the test on error). */
typedef pl_snapshot tk_state;
typedef pl_state_fn tk_state_fn;
/* Save (the visitor copies every tensor / scalar it is shown). */
tk_state *tk_state_save(tk_state_fn fn, void *self);
/* Load into a freshly created plugin; fails the test if a name is missing. */
void tk_state_load(tk_state *st, tk_state_fn fn, void *self);
int tk_state_count(const tk_state *st);
/* Scalar saved under `name`, NAN (and *found false) if absent. */
double tk_state_scalar(const tk_state *st, const char *name, bool *found);
void tk_state_free(tk_state *st);

/* ---- optimizer reference runs (adamw.json / sgd.json cases) -------------- */

/* Run reference case `c` through plugin `plugin` (section [optimizer]):
 * create, then for every step set the recorded gradients (null: no gradient),
 * step, and compare every parameter with torch to rtol 1e-6 (+ atol 1e-7).
 * resume_at > 0: after that many steps save the state, destroy, build a new
 * optimizer over the same parameters, load the state and continue. The
 * CPU run of tk_run_optimizer_case_on (host skips), its result freed. */
void tk_run_optimizer_case(const cJSON *c, const char *plugin, int resume_at);

/* tk_run_optimizer_case on device dev (the parameters and gradients moved
 * there; results compared on the host), with the case's "found_inf" steps
 * (0-based; none: every step runs) skipped
 *   device_skip false: as the trainer's host path: no optimizer step;
 *   device_skip true:  as its device path: the step runs with the found_inf
 *                      flag (pl_optim_set_found_inf) set on every step, 1 at
 *                      the skipped ones, 0 elsewhere.
 * After the run, each parameter's "<plugin>.step.<name>" state must equal
 * the case's "steps_after" (torch's fused state["step"]) when it has one.
 * Returns the final values of every parameter, concatenated (malloc'd; *n
 * their count), for bitwise comparisons between runs. */
float *tk_run_optimizer_case_on(const cJSON *c, const char *plugin, int resume_at, pl_device dev,
                                bool device_skip, int *n);

#endif
