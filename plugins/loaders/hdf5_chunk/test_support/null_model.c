/* null_model.c - a do-nothing model plugin used only by the loader tests:
 * the config loader requires a [model] section, and loader tests must not
 * depend on a real model plugin. Built into the test folder, not the plugin dir. */
#include "pipeline/pipeline.h"

static pl_status nm_create(const pl_config_section *cfg, pl_run_context *ctx, void **self) {
    (void)cfg;
    (void)ctx;
    static int dummy;
    *self = &dummy;
    return PL_OK;
}
static void nm_destroy(void *self) { (void)self; }
static pl_status nm_forward(void *self, const pl_batch *b, pl_data_split split, bool training,
                            pl_tensor **loss, pl_metrics *m) {
    (void)self, (void)b, (void)split, (void)training, (void)m;
    *loss = NULL;
    return PL_OK;
}
static pl_status nm_batch_needs(const pl_config_section *cfg, pl_field_list *out) {
    (void)cfg;
    out->n = 0; /* reads nothing */
    return PL_OK;
}
static const pl_option_spec nm_opts[] = {PL_OPTIONS_END};
static const pl_model_vtable nm_vt = {.create = nm_create,
                                      .destroy = nm_destroy,
                                      .forward = nm_forward,
                                      .batch_needs = nm_batch_needs};
PL_PLUGIN_DEFINE(test_null_model, PL_KIND_MODEL, "0.0.1", "test-only model that does nothing", nm_opts, &nm_vt)
