/* plugin.h - what a stage plugin exports and the contract of each stage kind.
 *
 * A plugin is a shared object exporting one symbol, PL_PLUGIN_ENTRY_SYMBOL
 * ("pl_plugin_entry"), returning a pointer to a static pl_plugin_desc. The
 * core dlopen()s it with RTLD_NOW | RTLD_LOCAL and refuses it when
 *   - abi_major != PL_ABI_MAJOR, or abi_minor > PL_ABI_MINOR of the core,
 *   - the entry symbol is missing, the name is taken by another plugin, or
 *   - its kind differs from the INI section that names it.
 * Minimal plugin:
 *
 *   static const pl_option_spec opts[] = {
 *       {"lr", PL_OPT_FLOAT, "1e-3", 0, 1e9, NULL, "learning rate"}, PL_OPTIONS_END};
 *   static const pl_optimizer_vtable vt = {.create = my_create, ...};
 *   PL_PLUGIN_DEFINE(my_sgd, PL_KIND_OPTIMIZER, "0.1.0", "plain SGD", opts, &vt)
 *
 * The option schema is the single source for validation, `pipeline plugins
 * NAME` and the plugin README's option table.
 */
#ifndef PIPELINE_PLUGIN_H
#define PIPELINE_PLUGIN_H

#include <stdbool.h>
#include <stdint.h>

#include "pipeline/config.h"
#include "pipeline/safetensors.h"
#include "pipeline/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define PL_ABI_MAJOR 2
/* minor 1: PL_TAG_PRETRAINED, pl_param_convert, pl_params_convert, pl_st_view
 * minor 2: ops clamp, adamw_step, sgd_step (pl_clamp, pl_adamw_step_,
 *          pl_sgd_step_, optim_math.h), kernel_math.h, the "strict" device
 * minor 3: pl_message
 * minor 4: pl_batch_find; pl_model_vtable.export_model (`pipeline export`), then
 *          predict_needs / predict_begin / predict_batch /
 *          predict_end (`pipeline predict`)
 * minor 5: PL_KIND_STRATEGY and pl_strategy_vtable (data-parallel training,
 *          `[strategy] plugin = ddp`); pl_loader_vtable.shard; RMS metrics
 *          (pl_metrics_add_rms, pl_metrics_value_at); pl_cfg_sibling (config.h:
 *          checks across stages at `pipeline check` time)
 * minor 6: pipeline/file.h (pl_file_check_regular, pl_file_open_read,
 *          pl_file_fopen_read), pl_st_check_finite; pl_backend.counters and
 *          pl_backend.device_stats (pl_backend_device_stats); the optimizer
 *          kernels' found_inf flag (pl_optim_set_found_inf)
 * minor 7: pl_params_seal and pl_precision_vtable.convert_param (a precision
 *          converts each parameter as the model finishes it, not the whole
 *          model at once); pl_backend.fill_random (parameter init drawn on
 *          the device, pl_init_draw in kernel_math.h); pl_cfg_list (config.h:
 *          the one tokenizer of comma-list options); pl_tensor_storage_nbytes;
 *          pl_swiglu (PL_OP_SWIGLU); relu, sigmoid, tanh, exp, softmax and
 *          log_softmax save their output, which their backward kernels read
 *          as in[2] (backend.h: an out-of-tree backend must follow)
 * minor 8: pipeline/ops.def, the X-macro table of the built-in ops (inputs,
 *          outputs, what backward reads and saves), which generates pl_op and
 *          pl_op_name; op ids unchanged. segment_softmax answers true to
 *          pl_autograd_saves_output (it always saved its output).
 *          pl_backend.half_native (a kernel that reads bf16 / f16 itself);
 *          the elementwise, reduction, loss and norm ops are recorded with
 *          their half tensors and return the input dtype (the core widens
 *          around f32-only kernels: core/src/tensor/half_io.c);
 *          pl_backend.capture_begin / capture_end / graph_replay /
 *          graph_release and pipeline/graph.h (whole-step graphs, [trainer]
 *          cuda_graphs); adamw_step / sgd_step take their coefficients from a
 *          device tensor in[2] when p.flags bit0 is set; dropout adds
 *          p.start * (device i64 *p.extra) to its counter when p.extra is set
 *          (backend.h: an out-of-tree backend must follow)
 * minor 9: pl_run_context.optimizer / optimizer_self (schedulers and
 *          averagers read the optimizer's groups; the run meta key
 *          "optimizer.lr" is no longer published); pl_st_* and
 *          pl_nf4_load_into are defined in libpipeline_io (pipeline-io.pc,
 *          pipeline::io), no longer in libpipeline_core;
 *          pl_tensor.param_lists (tensor.h: a parameter is marked on the
 *          tensor, in the padding after requires_grad; no field moved);
 *          autocast a property of the run's context (pl_run_context.autocast,
 *          pl_run_context_make_current / pl_run_context_current, scopes
 *          pl_autocast_begin / pl_autocast_end); pl_autocast_set deprecated
 *          (it sets the current context's autocast);
 *          the CPU backend is a plugin (cpu.so, kind backend) that the core
 *          loads on the first CPU lookup; pl_backend.get_option (the read
 *          side of set_option) and pl_backend_info(); pl_backend_register
 *          fills an empty CPU slot (it used to refuse the CPU device);
 *          model outputs named by the model: pl_outputs, pl_outputs_add,
 *          pl_meta_is_float,
 *          pl_model_vtable.outputs_begin / outputs_batch / outputs_end, which
 *          `pipeline predict` and the run's export phase call (the caller
 *          writes the file); export_begin / _batch / _end and predict_begin /
 *          _batch / _end are deprecated: called only for a plugin built
 *          against ABI 2.4 - 2.8, which writes its file itself as before
 * minor 10: op attention (pl_attention, ops.h: fused causal attention that
 *          keeps no T x L probabilities; a backend without it cannot run
 *          ilora's attn_implementation = sdpa, whose default it is); ops
 *          adamw_step_multi, sgd_step_multi (pl_adamw_step_multi_,
 *          pl_sgd_step_multi_, pl_optim_multi in optim_math.h: multi-tensor
 *          optimizer steps; a backend without them gets per-tensor calls)
 * minor 11: ops amp_unscale_multi, amp_update_scale (pl_amp_unscale_multi_,
 *          pl_amp_update_scale_, ops.h: torch's GradScaler kernels);
 *          pl_precision_vtable.loss_scale_tensor / before_step_device (a
 *          loss scale kept on the device; read only from plugins of
 *          abi_minor >= 11, older ones keep loss_scale / before_step);
 *          pl_backend.capture_end_step, pl_step_facts, pl_step_released
 *          (backend.h, "Seeing the step": the backend of a captured step
 *          learns which blocks the step released and may fuse calls;
 *          PL_GRAPH_FUSION=0 turns it off); pl_graph_fused (graph.h);
 *          op lora_add (pl_lora_add, ops.h: the LoRA / MoE-LoRA branch and
 *          its add as one op; with p.flags bit0 its in[0] is a stub
 *          placeholder, no y; a backend without it cannot run ilora's
 *          adapters); ops sum_squares_multi, mul_multi (pl_sum_squares_multi,
 *          pl_mul_multi_, ops.h: torch's _foreach_norm / _foreach_mul_ for
 *          the trainer's gradient norm and clipping; a backend without them
 *          gets the per-tensor calls)
 * minor 12: optimizer step counts on the device (torch's fused AdamW
 *          state_steps): pl_adamw_step_counted_, pl_sgd_step_counted_,
 *          pl_adamw_step_multi_counted_, pl_sgd_step_multi_counted_,
 *          pl_optim_counts_on_device (ops.h); pl_adamw_ccoef,
 *          pl_adamw_coef_at, pl_optim_count_elem, pl_optim_multi_counted
 *          and pl_optim_multi.count[] (appended) in optim_math.h; ops
 *          adamw_step / sgd_step take the counter as out[4] / out[2]; a
 *          backend that keeps it accepts the setting "optimizer_step_count"
 *          (an older one gets no counted call: its optimizer keeps the host
 *          count);
 *          pl_lora_add_dropout (ops.h: PEFT's lora_dropout inside op
 *          lora_add, nothing of x's size saved); lora_add's p.flags bit1
 *          (drop x with p.beta = p, p.seed, p.counter, the dropout stream;
 *          a captured graph's counter offset in p.extra / p.start as
 *          dropout's), which a backend implementing lora_add must honour
 *          (one built for an older minor would ignore it: wrong values);
 *          op topk (ops.def row TOPK, appended) and pl_topk (ops.h:
 *          torch.topk on the tensor's device, no autograd), the order
 *          pl_topk_before in kernel_math.h; a backend without the kernel
 *          answers NULL (PL_ERR_UNSUPPORTED for the op)
 * minor 13: op linear_cross_entropy (ops.def row LINEAR_CROSS_ENTROPY,
 *          appended) and pl_linear_cross_entropy (ops.h: cross_entropy of
 *          x W^T without the [N, V] logits; Liger-Kernel, Wijmans et al.
 *          2024); a backend that implements it answers the setting
 *          ("linear_cross_entropy", "true") through set_option, and one
 *          that does not (CUDA today, any older backend) gets the chain
 *          matmul + cross_entropy recorded instead: the same values */

#define PL_ABI_MINOR 13
#define PL_PLUGIN_ENTRY_SYMBOL "pl_plugin_entry"

typedef enum pl_plugin_kind {
    PL_KIND_LOADER = 0,
    PL_KIND_MODEL,
    PL_KIND_OPTIMIZER,
    PL_KIND_AVERAGER,
    PL_KIND_SCHEDULER,
    PL_KIND_PRECISION,
    PL_KIND_BACKEND,
    PL_KIND_STRATEGY, /* ABI 2.5: how processes train together (data parallel) */
    PL_KIND_COUNT
} pl_plugin_kind;

/* "loader", "model", ... Static string. */
const char *pl_plugin_kind_name(pl_plugin_kind k);

typedef enum pl_option_type {
    PL_OPT_INT,    /* int64, bounds [min, max] when min <= max */
    PL_OPT_FLOAT,  /* double, bounds [min, max] when min <= max */
    PL_OPT_BOOL,   /* true/false/1/0/yes/no/on/off */
    PL_OPT_STRING, /* free text (paths, lists) */
    PL_OPT_CHOICE, /* one of `choices` ("a|b|c"); a choice "x:N" also admits "x:0", "x:1", ...
                    * (a device and its index: "cuda|cuda:N") */
    PL_OPT_NUMBER_OR_FRACTION /* int count, or float fraction in (0, 1] ("limit_train_batches") */
} pl_option_type;

typedef struct pl_option_spec {
    const char *name;          /* may contain one '*' matching one dotted segment */
    pl_option_type type;
    const char *default_value; /* NULL: required key */
    double min, max;           /* inclusive bounds; ignored when min > max */
    const char *choices;       /* PL_OPT_CHOICE: "cos|linear" */
    const char *doc;           /* one line, with units */
} pl_option_spec;

#define PL_OPTIONS_END {NULL, PL_OPT_INT, NULL, 0, 0, NULL, NULL}
#define PL_NO_BOUNDS 1, 0

typedef struct pl_plugin_desc {
    uint32_t abi_major, abi_minor;
    const char *name;       /* unique; the INI's `plugin = NAME` */
    pl_plugin_kind kind;
    const char *version;    /* plugin's own version, "1.2.0" */
    const char *summary;    /* one line */
    const pl_option_spec *options; /* terminated by PL_OPTIONS_END */
    const void *vtable;     /* pl_<kind>_vtable (backend: pl_backend) */
} pl_plugin_desc;

typedef const pl_plugin_desc *(*pl_plugin_entry_fn)(void);

#define PL_PLUGIN_DEFINE(ident, kind_, version_, summary_, options_, vtable_)            \
    static const pl_plugin_desc ident##_desc = {PL_ABI_MAJOR, PL_ABI_MINOR, #ident, kind_, \
                                                version_, summary_, options_, vtable_};    \
    __attribute__((visibility("default"))) const pl_plugin_desc *pl_plugin_entry(void) {   \
        return &ident##_desc;                                                              \
    }

/* ======================================================================
 * Shared run objects handed to plugins
 * ====================================================================== */

/* Parameter tags (bitmask): generic facts about a parameter that stages of
 * other kinds act on. Anything model-specific goes in the parameter's
 * `role`, a free label the model chooses and optimizer groups select by. */
enum {
    PL_TAG_BASE = 1 << 0,     /* frozen pretrained weight a precision stage may quantize */
    PL_TAG_NO_DECAY = 1 << 3, /* biases, norms, embeddings' usual weight-decay exemption */
    PL_TAG_BUFFER = 1 << 5,   /* non-trainable state saved in checkpoints (not averaged) */
    /* A weight the model reads at create from a pretrained source it names
     * in its config (a Hugging Face checkpoint directory). While frozen
     * (requires_grad false) it is owned by that source: checkpoints neither
     * save nor load it (as PEFT's save_pretrained saves only the adapters),
     * so a 1B backbone is not copied into every checkpoint; a resume or
     * init_from re-reads it from the source through the model's create. A
     * trainable one is saved and loaded like any parameter. (ABI 2.1) */
    PL_TAG_PRETRAINED = 1 << 6
};

#define PL_ROLE_MAX 32
typedef struct pl_param {
    char name[PL_NAME_MAX]; /* "model.layers.0.self_attn.q_proj.weight" */
    pl_tensor *t;           /* owned reference; may be replaced by precision */
    unsigned tags;          /* PL_TAG_* */
    char role[PL_ROLE_MAX]; /* model-defined label ("lora", "router", "head"); "" when none */
} pl_param;

/* Ordered list of named parameters (owned by the core). */
typedef struct pl_params pl_params;
/* Add a parameter (retains t; sets t->name). `role` may be NULL (no role)
 * and is truncated to PL_ROLE_MAX - 1 bytes. Duplicate names: PL_ERR_INVALID. */
pl_status pl_params_add(pl_params *ps, const char *name, pl_tensor *t, unsigned tags,
                        const char *role);
int pl_params_count(const pl_params *ps);
pl_param *pl_params_at(pl_params *ps, int i);
pl_param *pl_params_find(pl_params *ps, const char *name);
/* Replace the tensor of a parameter (precision: f32 -> nf4); retains `t`. */
pl_status pl_params_replace(pl_params *ps, int i, pl_tensor *t);
/* Parameter i is final: its values are drawn or loaded and its
 * requires_grad is set. A model calls this for each parameter it adds
 * (ABI 2.7), so that the run's precision plugin can convert it at once
 * (pl_precision_vtable.convert_param; qlora4 quantizes a frozen base weight
 * to NF4): the backbone then never exists whole in its file dtype on the
 * device, and the load's device peak is the converted model plus one
 * tensor. The tensor of parameter i may be replaced (pl_params_replace):
 * read pl_params_at(ps, i)->t again afterwards. With no such plugin (fp32,
 * bf16, unit tests, `pipeline check`) it does nothing, and setup() converts
 * every parameter later as before. Returns the plugin's error (prefixed
 * with the parameter's name), PL_ERR_INVALID for i out of range. */
pl_status pl_params_seal(pl_params *ps, int i);
/* Convert parameter p's values to dtype `dt` (PL_F32, PL_BF16 or PL_F16) in
 * place of its storage: the tensor header p->t stays the same object (a
 * model holding the pointer sees the new dtype and values), its storage is
 * replaced by a new contiguous buffer of dt on the same device (values
 * rounded to nearest even; bf16/f16 -> f32 is exact) and offset 0. The old
 * storage is released at once: an allocator buffer returns to the
 * allocator, an mmap view from pl_st_view drops its resident pages (unless
 * another tensor still shares that storage). This is how precision stages
 * turn the file-dtype views a model creates into the form they keep, one
 * tensor at a time. requires_grad, name and any .grad are left as they are.
 * No-op (PL_OK) when p->t is already dt.
 * Errors: PL_ERR_INVALID (NULL p or tensor; p->t not contiguous; the
 * message names the parameter), PL_ERR_DTYPE (dt or p->t's dtype is not a
 * float dtype, e.g. nf4 or an integer), PL_ERR_NOMEM and device errors
 * from the copy; on error the parameter is unchanged. */
pl_status pl_param_convert(pl_param *p, pl_dtype dt);

/* Counts of a pl_params_convert call. */
typedef struct pl_convert_stats {
    int converted;                    /* parameters whose dtype changed */
    size_t bytes_before, bytes_after; /* their storage before and after, bytes */
} pl_convert_stats;
/* Bring every floating parameter of `ps` to the dtype a precision keeps, one
 * tensor at a time with pl_param_convert (so a converted checkpoint view's
 * pages leave the process before the next is read): trainable parameters
 * and PL_TAG_BUFFERs -> f32 (optimizers update f32 master weights), frozen
 * weights -> `frozen` (f32, bf16 or f16). Integer and nf4 parameters are left
 * alone. The trainer calls it with PL_F32 when a run has no [precision]
 * stage (Lightning's default "32-true"); precision plugins call it from
 * setup(). `stats` may be NULL. Errors: those of pl_param_convert (naming
 * the parameter); parameters before the failing one stay converted. */
pl_status pl_params_convert(pl_params *ps, pl_dtype frozen, pl_convert_stats *stats);
/* fnmatch-style glob, comma-separated alternatives: "*bias,*norm*". */
bool pl_name_matches(const char *name, const char *globs);

struct pl_run_context;
/* Create a parameter in ctx->params: a zero-filled f32 tensor of `shape` on
 * ctx->device, requires_grad = trainable. The params list holds the only
 * reference whatever frame is open (no pl_frame_keep needed); *out is
 * borrowed, valid until the list is freed or the parameter replaced.
 * Errors: PL_ERR_INVALID (duplicate name, bad shape), PL_ERR_NOMEM. */
pl_status pl_param_new(struct pl_run_context *ctx, const char *name, int ndim,
                       const int64_t *shape, unsigned tags, const char *role, bool trainable,
                       pl_tensor **out);

/* Key/value facts a loader publishes for the model ("num_items", ...). */
typedef struct pl_meta pl_meta;

/* Run objects: the trainer makes one parameter list and one meta table per
 * run; tests and tools make their own. Both are owned by the caller and
 * freed with pl_params_free / pl_meta_free (NULL-safe); pl_params holds one
 * reference on each of its tensors, released by pl_params_free. NULL (with
 * PL_ERR_NOMEM set) when out of memory. */
pl_params *pl_params_new(void);
void pl_params_free(pl_params *ps);
pl_meta *pl_meta_new(void);
void pl_meta_free(pl_meta *m);
/* Number of meta entries, and the i-th key in insertion order (borrowed;
 * NULL when i is out of range). */
int pl_meta_count(const pl_meta *m);
const char *pl_meta_key_at(const pl_meta *m, int i);
pl_status pl_meta_set_int(pl_meta *m, const char *key, int64_t v);
pl_status pl_meta_set_float(pl_meta *m, const char *key, double v);
pl_status pl_meta_set_str(pl_meta *m, const char *key, const char *v);
/* Missing key: PL_ERR_CONFIG "'KEY' was not provided by the loader". */
pl_status pl_meta_get_int(const pl_meta *m, const char *key, int64_t *v);
pl_status pl_meta_get_float(const pl_meta *m, const char *key, double *v);
const char *pl_meta_get_str(const pl_meta *m, const char *key); /* NULL if missing */
/* Whether `key` holds a float (set with pl_meta_set_float, even of an
 * integral value), for a writer that keeps the type (an HDF5 attribute:
 * double, not int64). False when missing. (ABI 2.9) */
bool pl_meta_is_float(const pl_meta *m, const char *key);

/* Metric accumulator: named (sum, count) pairs; value = sum / count, or
 * sqrt(sum / count) for a root-mean-square metric (pl_metrics_add_rms). The
 * pairs add over batches and over the ranks of a data-parallel run, so a
 * metric must be expressible as one (RMSE: squared errors and their count,
 * never a running square root). */
#define PL_METRICS_MAX 32
enum { PL_METRIC_MEAN = 0, PL_METRIC_RMS = 1 };
typedef struct pl_metrics {
    int n;
    char name[PL_METRICS_MAX][48];
    double sum[PL_METRICS_MAX];
    double count[PL_METRICS_MAX];
    unsigned char kind[PL_METRICS_MAX]; /* PL_METRIC_MEAN / PL_METRIC_RMS (ABI 2.5) */
} pl_metrics;
void pl_metrics_reset(pl_metrics *m);
void pl_metrics_add(pl_metrics *m, const char *name, double sum, double count);
/* A root-mean-square metric (RMSE): `sum_sq` a sum of squares over `count`
 * values; reported as sqrt(total sum_sq / total count). (ABI 2.5) */
void pl_metrics_add_rms(pl_metrics *m, const char *name, double sum_sq, double count);
/* NaN if absent. */
double pl_metrics_get(const pl_metrics *m, const char *name);
/* Value of the i-th metric (0 <= i < m->n, insertion order): sum / count or,
 * for an RMS metric, its square root; NaN for count 0 or i out of range.
 * (ABI 2.5) */
double pl_metrics_value_at(const pl_metrics *m, int i);

/* Checkpoint state visitor: a stateful plugin lists its state once; the same
 * function serves saving (the visitor reads) and loading (the visitor writes
 * into the given tensor / scalar). Names are stable and versioned by the
 * plugin ("adamw.exp_avg.<param>"). */
typedef struct pl_state_visitor {
    void *ctx;
    pl_status (*tensor)(void *ctx, const char *name, pl_tensor *t);
    pl_status (*scalar)(void *ctx, const char *name, double *v);
    /* true: loading (the visitor writes the values), false: saving (it reads
     * them). Most plugins need not look; one whose state has an effect
     * beyond the values acts only when loading. */
    bool loading;
} pl_state_visitor;
/* A stage's state function (the `state` member of its vtable). */
typedef pl_status (*pl_state_fn)(void *self, const pl_state_visitor *v);

typedef enum pl_data_split { PL_SPLIT_TRAIN = 0, PL_SPLIT_VAL, PL_SPLIT_TEST, PL_SPLIT_COUNT } pl_data_split;
const char *pl_split_name(pl_data_split s); /* "train", "val", "test" */

/* Everything a plugin may need from the run. Borrowed by plugins. */
typedef struct pl_run_context {
    pl_device device;
    uint64_t seed;
    const char *run_dir;     /* NULL in unit tests */
    pl_meta *meta;
    pl_params *params;
    int64_t steps_per_epoch; /* optimizer steps per epoch (set before scheduler create) */
    int64_t max_epochs;
    int64_t total_steps;     /* optimizer steps of the whole fit */
    /* live counters, updated by the trainer before every forward: models
     * derive dropout RNG counters from them so a resumed run draws the same
     * masks as an uninterrupted one */
    int64_t epoch;           /* 0-based epoch being trained */
    int64_t global_step;     /* optimizer steps done so far */
    int64_t micro_step;      /* training forwards done so far */
    int verbose;
    /* ABI 2.9: the run's optimizer, for the stages that scale its learning
     * rate (schedulers, averagers): set by the trainer once the optimizer is
     * created and its groups' learning rates are final (a strategy's lr
     * scaling applied), before any scheduler or averager is created; reset
     * to NULL before the optimizer is destroyed. NULL outside a training run
     * and in a fresh harness context (a test sets both fields). Borrowed:
     * read its groups through the vtable (optimizer->group(optimizer_self,
     * i): lr, initial_lr, lr_scale, named hyper-parameters); the base lr,
     * which options given as absolute learning rates are divided by, is
     * group 0's initial_lr / lr_scale (initial_lr when lr_scale <= 0). Only
     * read from a context of a core of ABI >= 2.9: a plugin that reads it
     * declares abi_minor 9 (PL_PLUGIN_DEFINE does), which an older core
     * refuses. */
    const struct pl_optimizer_vtable *optimizer;
    void *optimizer_self;
    /* ABI 2.9: this run's autocast dtype (torch.autocast's dtype), the
     * dtype pl_matmul / pl_linear / pl_nf4_matmul compute in while this
     * context is current on a thread ("Autocast" below). PL_F32 (0, what a
     * zeroed context holds): off. The run's precision plugin sets it in
     * setup (bf16: PL_BF16, fp16: PL_F16, qlora4: its compute dtype, fp32:
     * PL_F32); other plugins read it. New at the end
     * with the optimizer fields: plugins built against 2.8 see the same
     * layout before them. */
    pl_dtype autocast;
} pl_run_context;

/* A message for the user, printf-style, one line (a trailing newline is
 * added when missing; at most 2047 bytes). During a run it goes where the
 * trainer's own messages go: the terminal (stdout, above the progress line,
 * which a plain write to stdout or stderr would garble) and the run's
 * log.txt; outside a run (unit tests, the harness) to stderr. Call it from
 * the thread that called the plugin. What a plugin writes to stdout or
 * stderr itself reaches the terminal only, never log.txt. (ABI 2.3) */
void pl_message(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* ======================================================================
 * Stage vtables
 * ====================================================================== */

#define PL_BATCH_MAX_FIELDS 16
typedef struct pl_batch {
    int n;
    const char *names[PL_BATCH_MAX_FIELDS];
    pl_tensor *fields[PL_BATCH_MAX_FIELDS]; /* borrowed views owned by the loader */
    int64_t size;       /* samples in the batch */
    int64_t index;      /* batch index within the epoch */
} pl_batch;
/* Field by name, NULL (with PL_ERR_INVALID naming the field) if absent. */
pl_tensor *pl_batch_get(const pl_batch *b, const char *name);
/* Field by name, or NULL when the batch has none of that name (an optional
 * field: targets of new rows, `mask`), leaving the error state alone. NULL b
 * or name: NULL. The tensor is borrowed, valid as the batch. (ABI 2.4) */
pl_tensor *pl_batch_find(const pl_batch *b, const char *name);

/* ---- typed data contract ------------------------------------------------
 * A loader declares the fields its batches carry; a model declares the
 * fields it reads. `pipeline check` (and the trainer, before anything is
 * built) matches the two: every field a model requires must be declared by
 * the loader with a compatible dtype and rank. Both declarations are pure
 * functions of the config section (a loader may read file metadata, never
 * data), so a mismatch is reported before a run. */
/* dtype classes a model may ask for: values past PL_DTYPE_COUNT, inside the
 * enum's range */
#define PL_DTYPE_ANY ((pl_dtype)(PL_DTYPE_COUNT + 1))   /* any dtype accepted */
#define PL_DTYPE_FLOAT ((pl_dtype)(PL_DTYPE_COUNT + 2)) /* f32, bf16 or f16 */
#define PL_DTYPE_INDEX ((pl_dtype)(PL_DTYPE_COUNT + 3)) /* i32 or i64 */
#define PL_SPLIT_BIT(s) (1u << (s)) /* pl_data_split -> pl_field_spec.splits bit */
typedef struct pl_field_spec {
    char name[48];   /* batch field name, as pl_batch_get() takes it */
    pl_dtype dtype;  /* loader: the exact dtype; model: exact or PL_DTYPE_ANY/FLOAT/INDEX */
    int rank;        /* number of dims including the batch dim; -1: any */
    bool optional;   /* model side: read when present */
    unsigned splits; /* PL_SPLIT_BIT()s of the splits whose batches carry / need it; 0: all */
} pl_field_spec;
#define PL_FIELDS_MAX PL_BATCH_MAX_FIELDS
typedef struct pl_field_list {
    int n;
    pl_field_spec f[PL_FIELDS_MAX];
} pl_field_list;
/* Append a field carried / needed in every split; PL_ERR_INVALID past
 * PL_FIELDS_MAX, on a name longer than 47 bytes, or on a duplicate name
 * whose splits overlap. */
pl_status pl_fields_add(pl_field_list *l, const char *name, pl_dtype dtype, int rank,
                        bool optional);
/* The same for the splits in `splits` (PL_SPLIT_BIT()s; 0: all). */
pl_status pl_fields_add_in(pl_field_list *l, unsigned splits, const char *name, pl_dtype dtype,
                           int rank, bool optional);
/* Check that `have` (a loader's) satisfies `need` (a model's), split by
 * split: each required field a model needs in split s is carried in s. On a
 * mismatch: PL_ERR_CONFIG naming the field, what the model needs and what
 * the loader yields (or that it yields no such field, listing those it has).
 * `loader` / `model` name the plugins in the message. */
pl_status pl_fields_match(const pl_field_list *have, const char *loader,
                          const pl_field_list *need, const char *model);
/* Whether a field declared with dtype `need` (exact, or PL_DTYPE_ANY /
 * FLOAT / INDEX) accepts a tensor or loader field of dtype `have`. */
bool pl_field_dtype_accepts(pl_dtype need, pl_dtype have);
/* "f32", or a class's description ("a float dtype (f32, bf16 or f16)").
 * Static string. */
const char *pl_field_dtype_name(pl_dtype dt);
/* Whether field `f` is carried / needed in split `s` (splits 0: every split). */
bool pl_field_in_split(const pl_field_spec *f, pl_data_split s);

typedef struct pl_loader_stats {
    uint64_t bytes_read;
    double wait_seconds; /* time next() spent waiting on I/O */
    uint64_t chunks_loaded;
} pl_loader_stats;

/* Loader contract (ABI 2): a split's batch order is a pure function of
 * (ctx->seed, epoch): the same config serves the same batches in the same
 * order in every process, so the trainer's batch counter is the only record
 * of the position in an epoch and a loader has no position state. */
typedef struct pl_loader_vtable {
    pl_status (*create)(const pl_config_section *cfg, pl_run_context *ctx, void **self);
    void (*destroy)(void *self);
    /* Start an epoch over `split` at batch `start_batch` (0 <= start_batch <=
     * num_batches) of that epoch's order; `epoch` seeds shuffling with
     * ctx->seed. Batches before start_batch are not read; the next batch's
     * index is start_batch. Val/test ignore `epoch` (fixed order).
     * start_batch out of range: PL_ERR_INVALID. */
    pl_status (*epoch_begin)(void *self, pl_data_split split, int64_t epoch, int64_t start_batch);
    /* Next batch: 1 = batch filled, 0 = epoch done, -1 = error. Fields are
     * views valid until the next call. */
    int (*next)(void *self, pl_batch *out);
    /* Batches per epoch of a split (after drop_last). */
    int64_t (*num_batches)(void *self, pl_data_split split);
    pl_loader_stats (*stats)(void *self); /* optional */
    /* The fields every batch carries under this config (required; called
     * without create, by `pipeline check` too). */
    pl_status (*batch_fields)(const pl_config_section *cfg, pl_field_list *out);
    /* Optional (ABI 2.5; read only from plugins of abi_minor >= 5): shard
     * the data over `world_size` processes of a data-parallel run, this one
     * being `rank` (0 <= rank < world_size), before any epoch_begin. After
     * it, every split's batch k is this rank's part of the batch k a single
     * process would serve (same seed, same order), num_batches is unchanged
     * and equal on every rank, and the ranks' parts of a batch together are
     * that batch: each sample in exactly one part. The training loss of a
     * part is its mean, so the ranks' averaged gradient is the single
     * process's when the parts have equal sizes (PyTorch DDP's semantics;
     * hdf5_graph's node mode splits the labelled nodes this way). shard(self,
     * 0, 1) restores the unsharded batches (the export runs on rank 0 over
     * whole splits). PL_ERR_CONFIG when a batch cannot be split `world_size`
     * ways (naming the split and the count); PL_ERR_UNSUPPORTED when this
     * configuration does not shard itself (the trainer then strides, below,
     * as for a loader without it). A loader without it is sharded
     * by the trainer: rank r takes batches r, r + world_size, ... of the
     * single-process order (DistributedSampler's interleaving, by batch),
     * reading and skipping the others. */
    pl_status (*shard)(void *self, int rank, int world_size);
} pl_loader_vtable;

/* ---- model outputs (ABI 2.9) ----------------------------------------------
 * What a model writes for other tools: `pipeline predict`'s OUT.h5 and the
 * run's export phase (ilora's teacher outputs). The model names the tensors;
 * the caller (the CLI's predict service, the run) writes them, as HDF5
 * through libpipeline_hdf5 (plugins/common/hdf5, pl_h5_outputs_*): one
 * dataset per name, created from the first tensor given under that name
 * (its dtype and its dims after the first), growing by rows along axis 0 as
 * later tensors of the same name are appended. A name may hold '/' ("train/
 * topk_ids": dataset topk_ids in group /train, groups made as needed). */
typedef enum pl_outputs_purpose {
    PL_OUTPUTS_PREDICT = 0, /* `pipeline predict RUN_DIR INPUT.h5 OUT.h5`: one split */
    PL_OUTPUTS_EXPORT = 1   /* the run's export phase: every batch of train, val, test */
} pl_outputs_purpose;

#define PL_OUTPUTS_MAX 32     /* tensors in one pl_outputs, and datasets in one file */
#define PL_OUTPUTS_NAME_MAX 64 /* bytes of a name, with its terminating NUL */
typedef struct pl_outputs {
    /* outputs_begin, PL_OUTPUTS_EXPORT: the file's name in the run's
     * outputs/ directory ("teacher_outputs.h5"; no '/'), set by the model.
     * PL_OUTPUTS_PREDICT: ignored (the user named OUT.h5). */
    char file[PL_OUTPUTS_NAME_MAX];
    /* outputs_begin: the file's root attributes, in insertion order
     * (strings, int64 and double as pl_meta holds them). The caller fills
     * its own first (predict: "run_dir", "checkpoint", "config_hash",
     * "model", "model_version", "input", "split", "pipeline_version"); the
     * model adds its own ("top_k"). Borrowed from the caller. NULL in
     * outputs_batch. */
    pl_meta *attrs;
    /* the named tensors, filled with pl_outputs_add (the caller empties the
     * list before each call) */
    int n;
    char name[PL_OUTPUTS_MAX][PL_OUTPUTS_NAME_MAX];
    pl_tensor *t[PL_OUTPUTS_MAX];
} pl_outputs;

/* Name `t` as output `name`: rows along axis 0 (rank >= 1; any dtype the
 * writer takes: f32, f64, i32, i64, u8; any device and strides, the writer
 * copies to the host). `t` is borrowed: it must live until the verb that
 * adds it returns to its caller, which writes it before the caller's frame
 * ends (a tensor the model makes in the call, owned by that frame, is the
 * usual case). In outputs_begin a tensor of 0 rows declares the dataset
 * (dtype and trailing dims), so a file holds it even when no row comes.
 * Errors (PL_ERR_INVALID, naming the name): NULL `o` or `t` (a NULL `t`
 * keeps the error that made it, prefixed), rank 0, a name empty, of
 * PL_OUTPUTS_NAME_MAX bytes or more, starting or ending with '/' or with
 * "//", a name already in `o`, more than PL_OUTPUTS_MAX tensors. */
pl_status pl_outputs_add(pl_outputs *o, const char *name, pl_tensor *t);

typedef struct pl_model_vtable {
    /* Create parameters into ctx->params (initialized from ctx->seed); read
     * dataset facts from ctx->meta. */
    pl_status (*create)(const pl_config_section *cfg, pl_run_context *ctx, void **self);
    void (*destroy)(void *self);
    /* Forward one batch. training: dropout on, *loss = scalar recorded on the
     * tape. Evaluation (training false, grad off): *loss may be set and
     * metrics are added to `m` (e.g. "loss", "accuracy", "hit_ratio@10").
     * `m` may be NULL: no metric is wanted, and a model then reads nothing
     * back from the device for one (the trainer's training forward in one
     * process, which keeps the loss on the device until it logs; in data
     * parallel it passes `m` for the loss's count, which weights the ranks). */
    pl_status (*forward)(void *self, const pl_batch *b, pl_data_split split, bool training,
                         pl_tensor **loss, pl_metrics *m);
    /* Deprecated (ABI 2.9): the run's export phase calls outputs_begin /
     * outputs_batch / outputs_end (PL_OUTPUTS_EXPORT). Called only for a
     * plugin built against ABI 2.0 - 2.8 (desc->abi_minor < 9), which writes
     * its files into outputs_dir itself, as then; a plugin of 2.9 leaves them
     * NULL. */
    pl_status (*export_begin)(void *self, const char *outputs_dir);
    pl_status (*export_batch)(void *self, const pl_batch *b, pl_data_split split);
    pl_status (*export_end)(void *self);
    /* Optional: after the model's parameters were loaded from a checkpoint. */
    pl_status (*on_load)(void *self);
    /* The batch fields forward() reads under this config (required; called
     * without create, by `pipeline check` too). */
    pl_status (*batch_needs)(const pl_config_section *cfg, pl_field_list *out);
    /* ---- ABI 2.4: export for other tools (`pipeline export`) ----
     * Optional. Present only in the vtables of plugins built with
     * abi_minor >= 4: an older plugin's vtable ends before this member, so
     * the core reads it only through a check of desc->abi_minor (core
     * stage.h, pl_model_export_of), never directly.
     *
     * Write the model's current weights (those of the checkpoint the core
     * loaded, after the precision stage's setup: nf4, bf16 or f32 as it
     * keeps them) as a checkpoint another tool reads, into the directory
     * `dir`. The core calls it after create + precision setup + the
     * checkpoint load, outside any autograd frame, with grad off.
     *   format   what to write: "hf" (a Hugging Face directory:
     *            config.json + weights, adapters as PEFT adapters) or
     *            another name the model documents. A format the model does
     *            not write: PL_ERR_UNSUPPORTED naming it and those it does.
     *   dir      an existing, empty directory (borrowed string). The core
     *            made it under a temporary name next to the user's OUT_DIR
     *            and renames it to OUT_DIR when this returns PL_OK; on an
     *            error it removes it with whatever was written, so a
     *            plugin need not clean up after itself.
     *   options  NULL-terminated array of "key=value" strings (borrowed,
     *            never NULL; may be empty). The core always passes
     *            "dest=ABS_PATH" (where `dir` will be renamed to, for
     *            files that must name their final place) and
     *            "checkpoint=PATH" (the file the weights came from); the
     *            user's `--lora X` and `--dtype X` arrive as "lora=X" and
     *            "dtype=X" (only when given: defaults are the model's). A key or
     *            value the model does not know: PL_ERR_CONFIG naming it and
     *            what it accepts (never ignored); a combination it cannot
     *            write (a router-gated mixture merged into one weight):
     *            PL_ERR_UNSUPPORTED saying why and what to use instead.
     * The parameters must be left as they were (export copies, converts
     * and dequantizes into new tensors). Other errors: PL_ERR_IO naming the
     * file, PL_ERR_NOMEM. */
    pl_status (*export_model)(void *self, const char *format, const char *dir,
                              const char *const *options);
    /* ---- ABI 2.4: prediction (`pipeline predict RUN_DIR INPUT.h5 OUT.h5`) ----
     * predict_needs: the batch fields outputs_batch(PL_OUTPUTS_PREDICT)
     * reads (called without create; read only from a plugin whose
     * desc->abi_minor >= 4). Unlike batch_needs, prediction is for new rows,
     * so targets should be optional here (read when present, e.g. to write
     * them next to the predictions). The core checks the required ones
     * against the first batch and refuses the input file naming the missing
     * field.
     *
     * predict_begin / predict_batch / predict_end: deprecated (ABI 2.9: the
     * model names tensors in outputs_batch and the core writes them). Called
     * only for a plugin built against ABI 2.4 - 2.8, which writes OUT.h5
     * itself (to the temporary name out_path, renamed by the core), as then;
     * a plugin of 2.9 leaves them NULL.
     *
     * Loaders: during predict, meta "predict_split" (a string: "train",
     * "val" or "test") is set before the loader's create. A loader that
     * honours it serves that split only, needs no other split in the file,
     * treats a configured input absent from the file as an absent batch field
     * (targets of new rows), and reuses what the run saved in ctx->run_dir
     * (the trained run's directory: read it, never write it) instead of
     * statistics of the new file (standardization). */
    pl_status (*predict_needs)(const pl_config_section *cfg, pl_field_list *out);
    pl_status (*predict_begin)(void *self, const char *out_path, const pl_meta *attrs);
    pl_status (*predict_batch)(void *self, const pl_batch *b, pl_data_split split);
    pl_status (*predict_end)(void *self);
    /* ---- ABI 2.9: outputs (pl_outputs above) ----
     * Optional; outputs_begin and outputs_batch both or neither, outputs_end
     * optional. Read only from a plugin whose desc->abi_minor >= 9 (an older
     * plugin's vtable ends before them: its predict and export go through
     * the deprecated members above, or are refused / skipped, naming it). `purpose` says who asks:
     *   PL_OUTPUTS_PREDICT  `pipeline predict`: the core builds the run's
     *     loader (its `path` pointed at INPUT.h5, meta "predict_split" set),
     *     model and precision, loads the checkpoint's weights, calls
     *     outputs_begin once, outputs_batch for every batch of the one split
     *     in order, outputs_end once; needs predict_needs too.
     *   PL_OUTPUTS_EXPORT  the run's export phase ([trainer] export, after
     *     test; rank 0 of a data-parallel run, over whole splits):
     *     outputs_begin once, outputs_batch for every batch of train, then
     *     val, then test, outputs_end once; the file goes to the run's
     *     outputs/ under the name the model set in out->file.
     * Batches come in eval mode with grad off, each inside a pl_frame.
     *
     * outputs_begin: reset the model's per-file state (row counters), set
     * out->file (EXPORT), add root attributes to out->attrs, and optionally
     * declare datasets with 0-row tensors (pl_outputs_add). PL_ERR_UNSUPPORTED
     * when the model writes nothing for `purpose` (a model without an
     * export: the run logs that it skipped the export; predict refuses the
     * model, naming it); other errors stop the command.
     * outputs_batch: name this batch's output rows in `out` (pl_outputs_add;
     * each name's rows are appended to its dataset in call order; a name may
     * be absent from a batch). `split` is the split of b. PREDICT: one row per
     * sample of b in batch order, in the data's original units, is the
     * convention (docs/run-files.md describes each model's file).
     * outputs_end: release what outputs_begin made (NULL: nothing to do).
     *
     * The caller writes the file under a temporary name in the destination's
     * directory and renames it to the final name only when every call
     * returned PL_OK and the file closed; on any error (the model's or the
     * writer's: a name whose later tensor has another dtype or trailing dims
     * is PL_ERR_SHAPE naming the dataset, more than PL_OUTPUTS_MAX datasets,
     * a full disk) it removes the temporary file, so no partial file is ever
     * left under the final name, and outputs_end is not called (destroy
     * follows, or a later outputs_begin, which must then start afresh). */
    pl_status (*outputs_begin)(void *self, pl_outputs_purpose purpose, pl_outputs *out);
    pl_status (*outputs_batch)(void *self, pl_outputs_purpose purpose, const pl_batch *b,
                               pl_data_split split, pl_outputs *out);
    pl_status (*outputs_end)(void *self, pl_outputs_purpose purpose);
} pl_model_vtable;

/* A named optimizer hyper-parameter that schedulers may drive (adamw:
 * "beta1", "beta2"; sgd: "momentum"). The optimizer reads `value` at every
 * step; `initial` is its configured value. */
#define PL_HPARAMS_MAX 8
typedef struct pl_hparam {
    char name[32];
    double value, initial;
} pl_hparam;

typedef struct pl_param_group {
    char name[64];
    double lr;          /* current learning rate (set by the trainer from the schedulers) */
    double initial_lr;  /* optimizer's configured lr x lr_scale */
    double lr_scale;
    double weight_decay;
    int n_hparams;
    pl_hparam hparams[PL_HPARAMS_MAX];
    int n_params;
    int *param_index;    /* indices into ctx->params */
} pl_param_group;
/* The group's hyper-parameter `name`, or NULL when this optimizer has none
 * of that name. */
pl_hparam *pl_group_hparam(pl_param_group *g, const char *name);
/* Add (or reset) hyper-parameter `name` = value (value and initial).
 * PL_ERR_INVALID past PL_HPARAMS_MAX. */
pl_status pl_group_hparam_set(pl_param_group *g, const char *name, double value);

typedef struct pl_optimizer_vtable {
    /* Build groups over ctx->params (trainable ones only). */
    pl_status (*create)(const pl_config_section *cfg, pl_run_context *ctx, void **self);
    void (*destroy)(void *self);
    int (*num_groups)(void *self);
    pl_param_group *(*group)(void *self, int i);
    /* One update from the accumulated .grad of each parameter, with each
     * group's current lr and hyper-parameter values. */
    pl_status (*step)(void *self);
    pl_status (*state)(void *self, const pl_state_visitor *v);
} pl_optimizer_vtable;

/* Schedulers compose: every section named `scheduler` or `scheduler<SUFFIX>`
 * (`scheduler2`, `scheduler_plateau`) is one scheduler, and
 *   lr(group, step) = group.initial_lr x prod over schedulers of lr_factor(step)
 * in the order the sections appear in the file. */
typedef struct pl_scheduler_vtable {
    pl_status (*create)(const pl_config_section *cfg, pl_run_context *ctx, void **self);
    void (*destroy)(void *self);
    /* Multiplier of each group's initial_lr for optimizer step `step`
     * (0-based). Per-step schedulers are pure functions of step. */
    double (*lr_factor)(void *self, int64_t step);
    /* Optional: set the optimizer hyper-parameters this scheduler drives on
     * group `g` for step `step` (onecycle: "momentum", else "beta1"), by
     * name through pl_group_hparam(); a group without them is left alone. */
    void (*drive)(void *self, int64_t step, pl_param_group *g);
    /* Optional (plateau): a validation metric arrived; epoch-level. */
    void (*on_validation)(void *self, double metric);
    /* Optional (NULL: stateless, a pure function of the step): resume state. */
    pl_status (*state)(void *self, const pl_state_visitor *v);
    /* Optional: the metric it needs (plateau: `monitor`), or NULL. */
    const char *(*monitor)(void *self);
} pl_scheduler_vtable;

/* Weight averaging (SWA, EMA). When has_average() is true after fit, the
 * trainer tests the averaged weights too and reports them under the
 * plugin's own name: metrics "<plugin>_test_<metric>", summary.json key
 * "<plugin>_test_metrics", checkpoint checkpoints/<plugin>.safetensors. */
typedef struct pl_averager_vtable {
    pl_status (*create)(const pl_config_section *cfg, pl_run_context *ctx, void **self);
    void (*destroy)(void *self);
    /* Called after every optimizer step and at each epoch end (step = -1). */
    pl_status (*update)(void *self, int64_t epoch, int64_t step);
    /* Optional: lr multiplier that replaces the schedulers' product for
     * this epoch/step (SWALR), or NAN for none. */
    double (*lr_factor)(void *self, int64_t epoch, int64_t step, double current_factor);
    /* Exchange averaged and live weights (call twice to swap back). */
    pl_status (*swap)(void *self);
    bool (*has_average)(void *self);
    pl_status (*state)(void *self, const pl_state_visitor *v);
} pl_averager_vtable;

typedef struct pl_precision_vtable {
    pl_status (*create)(const pl_config_section *cfg, pl_run_context *ctx, void **self);
    void (*destroy)(void *self);
    /* After model create / checkpoint load: convert or quantize parameters,
     * set the autocast compute dtype. */
    pl_status (*setup)(void *self, pl_params *ps);
    /* Seed for backward (loss scale); 1.0 except fp16. */
    double (*loss_scale)(void *self);
    /* Before the optimizer step: unscale grads, return true if the step
     * should run (false: inf/nan found, step skipped, scale backed off). */
    bool (*before_step)(void *self, pl_params *ps);
    /* After the optimizer step (bf16-true: refresh low-precision copies). */
    pl_status (*after_step)(void *self, pl_params *ps);
    pl_status (*state)(void *self, const pl_state_visitor *v);
    /* Optional: load parameter p from checkpoint f (`path` names it in
     * errors), converting to the form this precision keeps (qlora4: f32 ->
     * NF4, or NF4 with its quantization state). NULL: pl_st_load_into. */
    pl_status (*load_param)(void *self, const pl_st_file *f, const char *path, pl_param *p);
    /* Optional (ABI 2.7; read only from plugins of abi_minor >= 7): convert
     * parameter i of ps now, as the model seals it (pl_params_seal), into
     * the form setup() would give it; setup() then finds it converted and
     * leaves it. Called after create and before setup. */
    pl_status (*convert_param)(void *self, pl_params *ps, int i);
    /* Optional (ABI 2.11; read only from plugins of abi_minor >= 11, and
     * only both together): a loss scale that lives on the device, as
     * torch.cuda.amp.GradScaler keeps it, so a step decides nothing on the
     * host and can be captured as a graph (graph.h).
     * loss_scale_tensor: the scale as an f32 [1] tensor on `dev`, owned by
     * the plugin, the same tensor for the rest of the run (updated in place
     * by before_step_device; state() reads and writes it), or NULL to keep
     * the host path (loss_scale / before_step): e.g. where dev's backend
     * lacks the ops amp_unscale_multi / amp_update_scale. The
     * trainer asks once per fit before its first step, in one process only
     * (data parallel, or a backend whose optimizer kernels take no found_inf
     * flag, keeps the host path and never asks); on NULL with an error set,
     * the fit fails with it. When it answers a tensor the trainer seeds
     * each backward with it on the device (the loss times scale /
     * accumulate_grad_batches, that quotient rounded to f32 as
     * loss_scale()'s seed is) and calls before_step_device instead of
     * before_step; loss_scale() is then not called by the trainer. */
    pl_tensor *(*loss_scale_tensor)(void *self, pl_device dev);
    /* Before the optimizer step, in place of before_step when
     * loss_scale_tensor answered a tensor: unscale every gradient, set
     * found_inf (the step's flag: f32 [1] on the device, 0 or NaN as the
     * trainer's loss check left it; the optimizer kernels skip the update
     * when it is non-zero, pl_optim_set_found_inf) to a non-zero value when
     * a gradient is not finite, never clearing it, and update the scale
     * from it; everything on the device, with no host read (the step may be
     * a captured graph). Borrowed found_inf. Errors: the ops' (the trainer
     * stops the fit). */
    pl_status (*before_step_device)(void *self, pl_params *ps, pl_tensor *found_inf);
} pl_precision_vtable;

/* Strategy contract (ABI 2.5): how the processes of one run train together.
 * A data-parallel strategy (`[strategy] plugin = ddp`, PyTorch DDP / Horovod
 * semantics) is created once per run before the run directory; every
 * process runs the same config with the same seed, reads its shard of the
 * data, and the trainer calls the collectives below at the same points in
 * the same order on every rank: after backward (gradients, averaged), after
 * each training forward (the loss, so every rank takes the same non-finite
 * decision), after validation and test (the metrics' sums and counts).
 * Only rank 0 writes the run directory. Collectives are blocking for the
 * caller; a strategy bounds the wait (its own timeout) and, when a peer has
 * died or the wait ran out, returns PL_ERR_IO naming the collective, the
 * peer if known, and the time waited. */
typedef struct pl_strategy_vtable {
    pl_status (*create)(const pl_config_section *cfg, pl_run_context *ctx, void **self);
    void (*destroy)(void *self);
    int (*rank)(void *self);       /* 0 .. world_size-1 */
    int (*world_size)(void *self); /* >= 1 */
    /* In-place sum over ranks of `n` tensors, the same list (names, shapes,
     * dtypes, order) on every rank; f32 (host or device memory, the run's
     * device). The trainer scaled each rank's gradients by its share of the
     * global batch, so the sum is the global batch's gradient. PL_ERR_INVALID
     * on another dtype, PL_ERR_IO on a failed or timed-out exchange. */
    pl_status (*all_reduce_sum)(void *self, pl_tensor *const *ts, int n);
    /* In-place sum over ranks of n host doubles (losses, metric sums and
     * counts); exact order-independent results are not promised. */
    pl_status (*all_reduce_f64)(void *self, double *v, int64_t n);
    /* Copy `n` bytes of rank `root`'s buffer into every rank's (run
     * directory name, parameters' bytes at the start). */
    pl_status (*broadcast_bytes)(void *self, void *buf, size_t n, int root);
    /* Every rank reaches this point before any leaves it. */
    pl_status (*barrier)(void *self);
    /* This rank failed with exit `code` and a message already printed:
     * make every rank stop now (MPI_Abort). Does not return. */
    void (*abort)(void *self, int code);
} pl_strategy_vtable;

/* ======================================================================
 * Autocast (ABI 2.9)
 * ======================================================================
 * As torch.autocast (https://pytorch.org/docs/stable/amp.html, "Autocasting";
 * its state is per thread): the dtype in which pl_matmul, pl_linear and
 * pl_nf4_matmul compute (operands cast to it, f32 accumulation, result in
 * it; ops.h). Every other op is unaffected. It belongs to the run, not to
 * the process:
 *   - the run's context holds it (pl_run_context.autocast, which the
 *     precision plugin sets in setup);
 *   - the ops find that context through the calling thread's current-context
 *     pointer: the trainer makes its context current for the whole run,
 *     `pipeline predict`, `export` and `check` for theirs, the test harness
 *     (testing.h) for the life of a harness from pl_harness_new;
 *   - a scope (pl_autocast_begin / pl_autocast_end, nestable) overrides it
 *     on the calling thread until its end, like
 *     `with torch.autocast(device_type, dtype=...)`; PL_F32 turns it off
 *     inside, like `torch.autocast(..., enabled=False)`. For tests and tools.
 * Threads: all of it is per thread. A thread that makes no context current
 * and opens no scope computes in f32 (pl_autocast_get() == PL_F32), whatever
 * another thread does; worker threads that run ops for a run make its
 * context current themselves. Nothing here allocates or locks. */

/* Make ctx the calling thread's current run context (NULL: none) and return
 * the previous one, which the caller makes current again when done (stack
 * discipline). ctx is borrowed and must outlive its being current. */
pl_run_context *pl_run_context_make_current(pl_run_context *ctx);
/* The calling thread's current run context, or NULL. */
pl_run_context *pl_run_context_current(void);

/* Open an autocast scope on the calling thread: until the matching
 * pl_autocast_end, pl_autocast_get() answers dt, whatever the current
 * context holds. dt: PL_F32 (autocast off inside), PL_BF16 or PL_F16.
 * Scopes nest, at most 32 open per thread. Errors: PL_ERR_DTYPE for another
 * dtype, PL_ERR_INVALID when 32 are open; then no scope is opened and the
 * caller must not call pl_autocast_end for it. */
pl_status pl_autocast_begin(pl_dtype dt);
/* Close the calling thread's innermost scope (none open: nothing). */
void pl_autocast_end(void);
/* The dtype in effect on the calling thread now: the innermost open
 * scope's, else the current run context's autocast, else PL_F32 (or what a
 * deprecated pl_autocast_set gave this thread with no context current). */
pl_dtype pl_autocast_get(void);
/* Deprecated since ABI 2.9, kept for plugins built against 2.0 .. 2.8 (a
 * missing symbol would refuse them at load): sets the autocast of the
 * calling thread's current run context, or, with none current, a per-thread
 * fallback that pl_autocast_get answers when no context is current and no
 * scope open (before 2.9, one value for the whole process). Precision
 * plugins set ctx->autocast; tests and tools use pl_autocast_begin / end. */
void pl_autocast_set(pl_dtype dt)
    __attribute__((deprecated("set pl_run_context.autocast, or use pl_autocast_begin/end")));

#ifdef __cplusplus
}
#endif
#endif
