/* param_groups.h - parameter groups shared by the optimizer plugins (adamw,
 * sgd). Compiled into each plugin (not part of the core, not exported).
 *
 * Groups come from the optimizer section's pattern options
 *
 *   group.<name>.match        = *bias,*norm*     comma-separated globs (pl_name_matches)
 *   group.<name>.tags         = no_decay,head    generic tags (base|no_decay|buffer) or
 *                                                roles the model gives its parameters
 *                                                (ilora: lora, router, head; gat/lstm: head)
 *   group.<name>.lr_scale     = 0.1              initial_lr = lr * lr_scale (default 1)
 *   group.<name>.weight_decay = 0                default: the optimizer's weight_decay, but
 *                                                0 for a group named "no_decay" or whose
 *                                                tags contain no_decay
 *
 * A trainable parameter (t->requires_grad) goes to the first group, in the
 * order the groups first appear in the section, whose `match` matches its
 * name OR whose `tags` name one of its tags or its role. The others go to the group
 * "default" (lr_scale 1, the optimizer's weight_decay), which may itself be
 * configured with group.default.* keys. The default group is dropped when it
 * is empty and was not configured; named groups are kept even when empty.
 * Group order: "default" first (when present), then the named groups in the
 * order they first appear (the trainer reads the base lr from group 0).
 */
#ifndef PL_OPTIM_PARAM_GROUPS_H
#define PL_OPTIM_PARAM_GROUPS_H

#include "pipeline/pipeline.h"

#define PL_OPTIM_MAX_GROUPS 32

typedef struct pl_optim_groups {
    int n;
    pl_param_group g[PL_OPTIM_MAX_GROUPS];
} pl_optim_groups;

/* Hyper-parameters every group starts from: lr, weight decay, and the
 * optimizer's named hyper-parameters (pl_hparam) that schedulers may drive. */
typedef struct pl_optim_group_defaults {
    double lr, weight_decay;
    int n_hparams;
    const char *hparam_name[PL_HPARAMS_MAX];
    double hparam_value[PL_HPARAMS_MAX];
} pl_optim_group_defaults;

/* Build the groups of `ps` from `cfg` ("group.*" keys). `who` names the
 * plugin in error messages. On error everything allocated is freed. */
pl_status pl_optim_groups_build(const pl_config_section *cfg, pl_params *ps, const char *who,
                                const pl_optim_group_defaults *d, pl_optim_groups *out);
void pl_optim_groups_free(pl_optim_groups *gs);

/* Parse "no_decay,head" (also '|' separated): generic tag names into a
 * PL_TAG_* mask, any other word into `roles` (at most PL_OPTIM_MAX_ROLES). */
#define PL_OPTIM_MAX_ROLES 8
pl_status pl_optim_parse_tags(const char *s, unsigned *mask, char roles[][PL_ROLE_MAX],
                              int *n_roles);

/* A parameter's step count in the state visitor v, as the scalar `name`: on
 * the device (count, f32 [1]: its value *known when given, from
 * pl_optim_counts_read, else read for the visitor, one host read; and
 * written back when the visitor changed it, i.e. a load) or on the host
 * (*host, count NULL). A loaded value must be a count (an integer >= 0) and,
 * on the device, at most 2^24 (exact in f32, as torch's fused step); errors
 * name `who` and `name`. */
#define PL_OPTIM_COUNT_MAX 16777216.0
pl_status pl_optim_count_visit(const pl_state_visitor *v, const char *name, pl_tensor *count,
                               int64_t *host, const char *who, const double *known);

/* The values of n step counts (f32 [1] each on one device; NULL entries
 * give NAN) in ONE host read: concatenated on the device and copied back
 * once, so a checkpoint of a model with hundreds of parameters does not
 * wait for the device once per parameter. *out: malloc'd [n], the caller
 * frees it; NULL when no entry is set. `known` for pl_optim_count_visit. */
pl_status pl_optim_counts_read(pl_tensor *const *counts, int n, double **out);

/* The option-schema entries of the group keys, shared by every optimizer
 * using pl_optim_groups_build (one definition, so `pipeline plugins` and
 * validation agree across optimizers). */
#define PL_PARAM_GROUP_OPTIONS                                                                     \
    {"group.*.match", PL_OPT_STRING, "", PL_NO_BOUNDS, NULL,                                      \
     "comma-separated globs of parameter names in group *"},                                      \
        {"group.*.tags", PL_OPT_STRING, "", PL_NO_BOUNDS, NULL,                                    \
         "parameter tags (base,no_decay,buffer) or model roles (lora,router,head) in group *"},                            \
        {"group.*.lr_scale", PL_OPT_FLOAT, "1", 0, 1e9, NULL, "group lr = lr x lr_scale"},         \
        {"group.*.weight_decay", PL_OPT_FLOAT, "", 0, 1e9, NULL,                                   \
         "group weight decay (unset: weight_decay; 0 for no_decay groups)"}

#endif
