/* harness_use.c - a plugin author's test program against the installed
 * harness (pipeline/testing.h, libpipeline_testing), for tests/sdk/test_sdk.sh.
 * argv[1]: the directory holding the out-of-tree example plugins.
 * Builds [scheduler] plugin = linear_warmup from an INI snippet (found in
 * argv[1], validated against its schema), then sees a value outside the
 * schema's bounds refused naming the key. Prints what differs; exit 1 then. */
#include <pipeline/pipeline.h>
#include <pipeline/testing.h>

#include <stdio.h>
#include <string.h>

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s PLUGIN_DIR\n", argv[0]);
        return 2;
    }
    pl_harness *h = pl_harness_new_in(argv[1], "scheduler", "linear_warmup", "total_iters = 8\n");
    if (!h) {
        fprintf(stderr, "harness for linear_warmup: %s\n", pl_error_message());
        return 1;
    }
    const pl_plugin_desc *d = pl_harness_desc(h);
    int bad = !d || strcmp(d->name, "linear_warmup") || d->kind != PL_KIND_SCHEDULER ||
              !pl_harness_vtable(h) || !pl_harness_section(h);
    if (bad) fprintf(stderr, "harness descriptor is not the linear_warmup scheduler's\n");
    pl_harness_free(h);
    pl_harness *refused =
        pl_harness_new_in(argv[1], "scheduler", "linear_warmup", "total_iters = -1\n");
    if (refused || !strstr(pl_error_message(), "total_iters")) {
        fprintf(stderr, "total_iters = -1 was not refused naming the key (%s)\n",
                refused ? "accepted" : pl_error_message());
        bad = 1;
    }
    pl_harness_free(refused);
    if (!bad) printf("installed harness ok\n");
    return bad;
}
