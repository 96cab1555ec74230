/* stage.c - see stage.h. */
#include "stage.h"

#include <string.h>

/* Name of the first required vtable member that is NULL, or NULL. */
static const char *missing_member(pl_plugin_kind kind, const void *vt) {
#define REQ(type, member)                                                                          \
    if (!((const type *)vt)->member) return #member
    switch (kind) {
    case PL_KIND_LOADER:
        REQ(pl_loader_vtable, epoch_begin);
        REQ(pl_loader_vtable, next);
        REQ(pl_loader_vtable, num_batches);
        REQ(pl_loader_vtable, batch_fields);
        break;
    case PL_KIND_MODEL:
        REQ(pl_model_vtable, forward);
        REQ(pl_model_vtable, batch_needs);
        break;
    case PL_KIND_OPTIMIZER:
        REQ(pl_optimizer_vtable, num_groups);
        REQ(pl_optimizer_vtable, group);
        REQ(pl_optimizer_vtable, step);
        break;
    case PL_KIND_SCHEDULER:
        REQ(pl_scheduler_vtable, lr_factor);
        break;
    case PL_KIND_AVERAGER:
        REQ(pl_averager_vtable, update);
        REQ(pl_averager_vtable, swap);
        REQ(pl_averager_vtable, has_average);
        break;
    case PL_KIND_STRATEGY:
        REQ(pl_strategy_vtable, rank);
        REQ(pl_strategy_vtable, world_size);
        REQ(pl_strategy_vtable, all_reduce_sum);
        REQ(pl_strategy_vtable, all_reduce_f64);
        REQ(pl_strategy_vtable, broadcast_bytes);
        REQ(pl_strategy_vtable, barrier);
        REQ(pl_strategy_vtable, abort);
        break;
    case PL_KIND_PRECISION:
        REQ(pl_precision_vtable, setup);
        REQ(pl_precision_vtable, loss_scale);
        break;
    default:
        break;
    }
#undef REQ
    return NULL;
}

static pl_state_fn state_of(pl_plugin_kind kind, const void *vt) {
    switch (kind) {
    case PL_KIND_OPTIMIZER: return ((const pl_optimizer_vtable *)vt)->state;
    case PL_KIND_SCHEDULER: return ((const pl_scheduler_vtable *)vt)->state;
    case PL_KIND_AVERAGER: return ((const pl_averager_vtable *)vt)->state;
    case PL_KIND_PRECISION: return ((const pl_precision_vtable *)vt)->state;
    default: return NULL;
    }
}

pl_status pl_stage_fns_of(const pl_plugin_desc *d, const char *where, pl_stage_fns *out) {
    memset(out, 0, sizeof *out);
    if (!d) return pl_error_set(PL_ERR_INVALID, "stage: no plugin");
    if (where && !where[0]) where = NULL;
    if (d->kind < 0 || d->kind >= PL_KIND_COUNT || d->kind == PL_KIND_BACKEND)
        return pl_error_set(PL_ERR_INVALID, "plugin '%s' is a %s, not a stage", d->name,
                            pl_plugin_kind_name(d->kind));
    const void *vt = d->vtable;
    /* every kind's vtable starts with create(cfg, ctx, &self) and destroy(self) */
    typedef pl_status (*create_fn)(const pl_config_section *, pl_run_context *, void **);
    typedef void (*destroy_fn)(void *);
    create_fn c = vt ? *(const create_fn *)vt : NULL;
    destroy_fn x = vt ? ((const destroy_fn *)vt)[1] : NULL;
    if (!c || !x)
        return pl_error_set(PL_ERR_ABI, "plugin '%s'%s%s%s has no %s; it cannot run as the %s stage",
                            d->name, where ? " (" : "", where ? where : "", where ? ")" : "",
                            !vt ? "vtable" : "create/destroy function",
                            pl_plugin_kind_name(d->kind));
    const char *missing = missing_member(d->kind, vt);
    if (missing)
        return pl_error_set(PL_ERR_ABI, "plugin '%s'%s%s%s: required function '%s' of the %s vtable "
                            "is NULL", d->name, where ? " (" : "", where ? where : "",
                            where ? ")" : "", missing, pl_plugin_kind_name(d->kind));
    out->create = c;
    out->destroy = x;
    out->state = state_of(d->kind, vt);
    /* create() is called next: a stale message must not pass for its error
     * when it fails without setting one (pl_error_prefix then says so) */
    pl_error_clear();
    return PL_OK;
}

pl_model_export_fn pl_model_export_of(const pl_plugin_desc *d) {
    /* a vtable of ABI minor < 4 is shorter than today's pl_model_vtable:
     * reading export_model there would read past its end */
    if (!d || d->kind != PL_KIND_MODEL || !d->vtable || d->abi_major != PL_ABI_MAJOR ||
        d->abi_minor < 4)
        return NULL;
    return ((const pl_model_vtable *)d->vtable)->export_model;
}
