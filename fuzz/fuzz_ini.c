/* fuzz_ini.c - the INI configuration path of `pipeline run`/`check`: the
 * INI parse (the core's own reader of inih's dialect), duplicate checks, command-line
 * overrides (`section.key=value`, `~section.key`, `~section`), plugin
 * resolution through the registry (the real plugin .so files of this build
 * tree) and validation of every key against the core schema and each
 * plugin's option schema, `requires` / `@ref` checks.
 *
 * Input: INI text, then optionally a line "%%" followed by one override per
 * line (as the CLI passes them). When the config loads, it is printed,
 * hashed and written back as INI; that text must load again (no overrides)
 * to the same hash, as a run's config.ini must on resume: otherwise abort(),
 * so the fuzzer records the input. `requires` and `@` references resolve
 * against configs/ (teacher.ini requires pretrain.ini). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config_internal.h"
#include "fuzz_util.h"
#include "registry.h"

#define MAX_OVERRIDES 16

static pl_registry *g_reg;
static FILE *g_null;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    g_reg = pl_registry_new();
    if (!g_reg || pl_registry_add_dir(g_reg, PL_FUZZ_PLUGIN_DIR) != PL_OK) abort();
    g_null = fopen("/dev/null", "w");
    if (!g_null) abort();
    return 0;
}

/* The overrides after the "%%" line: one per line, at most MAX_OVERRIDES. */
static int split_overrides(char *text, char **over) {
    char *mark = strstr(text, "\n%%\n");
    if (!mark) return 0;
    *mark = '\0';
    int n = 0;
    for (char *save = NULL, *t = strtok_r(mark + 4, "\n", &save); t && n < MAX_OVERRIDES;
         t = strtok_r(NULL, "\n", &save))
        over[n++] = t;
    return n;
}

/* A loaded config written back as INI must load to the same config. */
static void check_round_trip(const pl_config *c) {
    char *ini = pl_config_to_ini(c);
    if (!ini) return; /* out of memory: reported by the call */
    pl_config *again = pl_config_load_string(ini, "config.ini", PL_FUZZ_CONFIG_DIR, 0, NULL, g_reg);
    if (!again) {
        fprintf(stderr, "fuzz_ini: the resolved config does not load again: %s\n--- config.ini\n%s",
                pl_error_message(), ini);
        abort();
    }
    if (pl_config_hash(again) != pl_config_hash(c)) {
        char *ini2 = pl_config_to_ini(again);
        fprintf(stderr, "fuzz_ini: config.ini loads to another config\n--- first\n%s--- again\n%s",
                ini, ini2 ? ini2 : "(null)");
        abort();
    }
    pl_config_free(again);
    free(ini);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 1 << 16) return 0; /* long inputs only slow the fuzzer down */
    char *text = fz_strndup(data, size);
    char *over[MAX_OVERRIDES];
    int n = split_overrides(text, over);
    for (int i = 0; i < n; i++)
        (void)pl_is_override(over[i]);
    pl_config *c = pl_config_load_string(text, "fuzz.ini", PL_FUZZ_CONFIG_DIR, n,
                                         (const char *const *)over, g_reg);
    if (c) {
        pl_config_print(c, g_null);
        check_round_trip(c);
        pl_config_free(c);
    } else if (!pl_error_message() || !*pl_error_message()) {
        fprintf(stderr, "fuzz_ini: load failed without a message\n");
        abort();
    }
    free(text);
    return 0;
}
