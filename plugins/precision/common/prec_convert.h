/* prec_convert.h - the dtype every precision stage keeps each parameter
 * in, whatever dtype the model created it in. Header-only, compiled into
 * each precision plugin.
 *
 * A model may hand over parameters in a checkpoint file's dtype (bf16 or
 * f16 zero-copy views from pl_st_view, "lean loading"); setup() converts
 * each one (core pl_params_convert), one tensor at a time, so the old storage
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

/* pl_params_convert (plugin.h, the loop the trainer's default f32 uses too),
 * with errors prefixed by the precision's name `who`; `stats` may be NULL. */
static inline pl_status pl_prec_convert_params(pl_params *ps, pl_dtype frozen, const char *who,
                                               pl_convert_stats *stats) {
    pl_status st = pl_params_convert(ps, frozen, stats);
    return st ? pl_error_prefix(st, "%s setup", who) : PL_OK;
}

#endif
