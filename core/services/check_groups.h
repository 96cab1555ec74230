/* check_groups.h - `pipeline check`: the optimizer's parameter groups against
 * the parameters the model will have (libpipeline_services, check_groups.c). */
#ifndef PL_CHECK_GROUPS_H
#define PL_CHECK_GROUPS_H

#include <stdbool.h>

#include "config_internal.h"
#include "registry.h"

/* `pipeline check`: when [optimizer] names parameter groups, build the loader,
 * the model and the precision stage on the CPU (no weights loaded) and create
 * the optimizer, whose group selection warns (pl_message, stderr) about a group
 * that selects no trainable parameter; then destroy them. *checked: whether the
 * build got that far. An error (data not there yet, a teacher's outputs not
 * exported yet) leaves *checked false with the error set. */
pl_status pl_trainer_check_param_groups(const pl_config *cfg, pl_registry *reg, bool *checked);

#endif
