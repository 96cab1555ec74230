/* crash_plugin.c - a loader plugin that crashes on purpose, for
 * tests/cli/test_crash.sh: built with CRASH_IN = 1 (a shared-object
 * constructor), 2 (the entry point), 3 (the stage's create), 4 (the entry
 * returns the bad pointer (void *)16: the core crashes reading the
 * descriptor) or 5 (create fails without setting an error message), each
 * into its own folder, so the fault is where a broken third-party plugin
 * would have it. */
#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "pipeline/plugin.h"

#ifndef CRASH_IN
#error "define CRASH_IN (1 constructor, 2 entry point, 3 create, 4 bad descriptor, 5 silent create)"
#endif

static volatile int *volatile g_null;

static void crash(void) { *g_null = 1; } /* SIGSEGV */

#if CRASH_IN == 1
__attribute__((constructor)) static void at_load(void) { crash(); }
#endif

static pl_status c_create(const pl_config_section *cfg, pl_run_context *ctx, void **self) {
    (void)cfg;
    (void)ctx;
    (void)self;
    if (CRASH_IN == 3) crash();
    return PL_ERR_INTERNAL;
}
static void c_destroy(void *self) { (void)self; }
static pl_status c_begin(void *self, pl_data_split s, int64_t e, int64_t b) {
    (void)self, (void)s, (void)e, (void)b;
    return PL_OK;
}
static int c_next(void *self, pl_batch *out) {
    (void)self, (void)out;
    return 0;
}
static int64_t c_num(void *self, pl_data_split s) {
    (void)self, (void)s;
    return 0;
}
/* what the mlp model reads, so the run gets as far as create */
static pl_status c_fields(const pl_config_section *cfg, pl_field_list *out) {
    (void)cfg;
    pl_status s = pl_fields_add(out, "x", PL_F32, 2, false);
    return s ? s : pl_fields_add(out, "y", PL_F32, 2, false);
}

static const pl_loader_vtable g_vt = {c_create, c_destroy, c_begin, c_next, c_num, NULL, c_fields};
static const pl_option_spec g_opts[] = {PL_OPTIONS_END};
static const pl_plugin_desc g_desc = {PL_ABI_MAJOR, PL_ABI_MINOR, "crashy", PL_KIND_LOADER,
                                      "0.0.1", "crashes on purpose (tests)", g_opts, &g_vt};

__attribute__((visibility("default"))) const pl_plugin_desc *pl_plugin_entry(void) {
    if (CRASH_IN == 2) crash();
    if (CRASH_IN == 4) return (const pl_plugin_desc *)(uintptr_t)16;
    return &g_desc;
}
