/* prec_convert.h - the dtype every precision stage keeps each parameter
 * in, whatever dtype the model created it in. Header-only, compiled into
 * each precision plugin.
 *
 * A model may hand over parameters in a checkpoint file's dtype (bf16 or
 * f16 zero-copy views from pl_st_view, "lean loading"); setup() converts
 * each one with pl_param_convert, one tensor at a time, so the old storage
 * (a view's pages) is released before the next is converted and the
 * process never holds the whole model twice:
 *   - trainable parameters -> f32 (our optimizers update f32 master weights);
 *   - frozen non-buffer parameters -> `frozen` (f32, or bf16 for bf16-true);
 *   - buffers (PL_TAG_BUFFER) -> f32;
 * integer and nf4 parameters are left alone (qlora4 quantizes its base
 * weights before calling this).
 */
#ifndef PL_PREC_CONVERT_H
#define PL_PREC_CONVERT_H

#include <stddef.h>

#include <pipeline/pipeline.h>

typedef struct pl_prec_convert_stats {
    int converted;                    /* parameters whose dtype changed */
    size_t bytes_before, bytes_after; /* their storage before and after */
} pl_prec_convert_stats;

/* Convert every floating parameter of `ps` to the dtype kept (above).
 * `who` names the precision in errors; `stats` may be NULL. Errors: those
 * of pl_param_convert, prefixed with `who`. */
static inline pl_status pl_prec_convert_params(pl_params *ps, pl_dtype frozen, const char *who,
                                               pl_prec_convert_stats *stats) {
    for (int i = 0; i < pl_params_count(ps); i++) {
        pl_param *pp = pl_params_at(ps, i);
        pl_tensor *t = pp->t;
        if (!pl_dtype_is_float(t->dtype)) continue;
        bool frozen_weight = !t->requires_grad && !(pp->tags & PL_TAG_BUFFER);
        pl_dtype want = frozen_weight ? frozen : PL_F32;
        if (t->dtype == want) continue;
        size_t before = pl_tensor_nbytes(t);
        pl_status st = pl_param_convert(pp, want);
        if (st) return pl_error_prefix(st, "%s setup", who);
        if (stats) {
            stats->converted++;
            stats->bytes_before += before;
            stats->bytes_after += pl_tensor_nbytes(t);
        }
    }
    return PL_OK;
}

#endif
