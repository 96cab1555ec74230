/* prec_load.h - how every precision plugin loads a parameter from a
 * checkpoint (its load_param verb). Header-only, compiled into each
 * precision plugin.
 *
 * A qlora4 checkpoint holds each quantized base weight as packed NF4 codes
 * under the weight's name and its quantization state under
 * "precision.qlora4.v1.<name>.*" (the trainer prefixes a stage's state with
 * its section, [precision]); see plugins/precision/qlora4/qlora4.c.
 * pl_nf4_load_into converts in every direction: float -> float (a plain
 * load with dtype conversion), NF4 -> float (dequantized, a qlora4
 * checkpoint onto an fp32 / bf16 base), float -> NF4 (quantized with the
 * destination's block settings) and NF4 -> NF4 (codes and state copied).
 */
#ifndef PL_PREC_LOAD_H
#define PL_PREC_LOAD_H

#include <string.h>

#include <pipeline/nf4.h>
#include <pipeline/pipeline.h>

#define PL_QLORA4_STATE_PREFIX "precision.qlora4.v1."

static inline pl_status pl_prec_load_param(void *self, const pl_st_file *f, const char *path,
                                           pl_param *p) {
    (void)self;
    pl_status st = pl_nf4_load_into(f, p->name, PL_QLORA4_STATE_PREFIX, p->t);
    if (st && !strstr(pl_error_message(), path)) pl_error_prefix(st, "checkpoint %s", path);
    return st;
}

#endif
