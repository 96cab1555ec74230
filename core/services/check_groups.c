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
#include "check_groups.h"
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
    trainer T, *t = &T;
    /* read only: the stages read their sections */
    pl_status st = tr_offline_init(t, (pl_config *)cfg, reg, NULL);
    t->ctx.device = PL_CPU;
    t->ctx.max_epochs = 1;
    t->ctx.steps_per_epoch = 1;
    t->ctx.total_steps = 1;
    if (!st) st = tr_build_model(t, NULL);
    if (!st) st = tr_stage_create(t, &t->optim, "optimizer");
    if (!st) *checked = true;
    tr_destroy_stages(t);
    tr_offline_free(t);
    return st;
}
