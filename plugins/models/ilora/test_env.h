/* test_env.h - the run context the ilora tests build a model in (shared by
 * test_ilora.c and test_hf_llama.c; header-only). */
#ifndef ILORA_TEST_ENV_H
#define ILORA_TEST_ENV_H

#include <string.h>

#include <pipeline/pipeline.h>

typedef struct env {
    pl_run_context ctx;
} env;

/* CPU context with `seed`, fresh params and meta; num_items > 0 is published
 * as the loader's meta "num_items". */
static inline void env_init(env *e, uint64_t seed, int64_t num_items) {
    memset(e, 0, sizeof *e);
    e->ctx.device = PL_CPU;
    e->ctx.seed = seed;
    e->ctx.params = pl_params_new();
    e->ctx.meta = pl_meta_new();
    if (num_items > 0) pl_meta_set_int(e->ctx.meta, "num_items", num_items);
}

static inline void env_free(env *e) {
    pl_params_free(e->ctx.params);
    pl_meta_free(e->ctx.meta);
}

#endif
