/* old_abi.c - a plugin built for another plugin ABI, for tests/sdk/test_sdk.sh.
 * The descriptor is written by hand (not with PL_PLUGIN_DEFINE) so it can
 * claim ABI OLD_ABI_MAJOR.OLD_ABI_MINOR while compiling against the current
 * headers; the registry must refuse it naming the file and both versions.
 * Compile with -DOLD_ABI_NAME='"<file stem>"' -DOLD_ABI_MAJOR=N -DOLD_ABI_MINOR=M. */
#include <pipeline/pipeline.h>

#ifndef OLD_ABI_MAJOR
#define OLD_ABI_MAJOR 1
#endif
#ifndef OLD_ABI_MINOR
#define OLD_ABI_MINOR 3
#endif
#ifndef OLD_ABI_NAME
#define OLD_ABI_NAME "old_abi"
#endif

static const pl_option_spec old_options[] = {PL_OPTIONS_END};

static const pl_plugin_desc old_desc = {OLD_ABI_MAJOR, OLD_ABI_MINOR,
                                        OLD_ABI_NAME,  PL_KIND_SCHEDULER,
                                        "0.0.1",       "built for another plugin ABI",
                                        old_options,   NULL};

__attribute__((visibility("default"))) const pl_plugin_desc *pl_plugin_entry(void) {
    return &old_desc;
}
