/* trainer_stub.c - weak placeholder for pl_trainer_run until trainer.c
 * exists (the lead deletes this file then). */
#include <stdio.h>

#include "trainer.h"

__attribute__((weak)) int pl_trainer_run(pl_config *cfg, pl_registry *reg,
                                         const pl_run_options *opts) {
    (void)cfg;
    (void)reg;
    (void)opts;
    fprintf(stderr, "error: trainer not built yet\nhint: this build has no trainer.c\n");
    return 1;
}
