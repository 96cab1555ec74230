/* check_groups.c - `pipeline check`: the optimizer's parameter groups against the
 * parameters the model will have.
 *
 * A group selects parameters by name (group.NAME.match globs) or by tag / role
 * (group.NAME.tags), and names exist only once a model is created: so when
 * [optimizer] has named groups, check builds what a run builds before its first
 * step (the loader, which reads the data, the model and the precision stage, on
 * the CPU, without weights from init_from or a checkpoint) and creates the
 * optimizer, whose group selection warns about a group that selects nothing
 * (plugins/optim/common/param_groups.c). Everything is destroyed again. */
#include "trainer_internal.h"

#include <string.h>

static bool has_named_groups(const pl_config *cfg) {
    const pl_config_section *o = pl_config_section_get(cfg, "optimizer");
    for (int i = 0; o && i < pl_cfg_count(o); i++)
        if (!strncmp(pl_cfg_key_at(o, i), "group.", 6)) return true;
    return false;
}

pl_status pl_trainer_check_param_groups(const pl_config *cfg, pl_registry *reg, bool *checked) {
    *checked = false;
    if (!has_named_groups(cfg)) return PL_OK;
    trainer T = {0}, *t = &T;
    t->cfg = (pl_config *)cfg; /* read only: the stages read their sections */
    t->reg = reg;
    t->pipe = pl_config_section_get(cfg, "pipeline");
    t->tr = pl_config_section_get(cfg, "trainer");
    t->world = 1;
    t->stride = 1;
    t->ctx.device = PL_CPU;
    t->ctx.seed = (uint64_t)pl_cfg_int(t->pipe, "seed", 42);
    t->ctx.meta = pl_meta_new();
    t->ctx.params = pl_params_new();
    t->ctx.max_epochs = 1;
    t->ctx.steps_per_epoch = 1;
    t->ctx.total_steps = 1;
    pl_status st = t->ctx.meta && t->ctx.params ? PL_OK
                                                : pl_error_set(PL_ERR_NOMEM, "check: out of memory");
    if (!st) st = tr_build_model(t, NULL);
    if (!st) st = tr_stage_create(t, &t->optim, "optimizer");
    if (!st) *checked = true;
    tr_destroy_stages(t);
    pl_params_free(t->ctx.params);
    pl_meta_free(t->ctx.meta);
    pl_autocast_set(PL_F32);
    return st;
}
