/* op_table.h - the core's view of pipeline/ops.def (not installed).
 *
 * One pl_op_row per built-in op, generated from ops.def: what the core checks
 * at every kernel call (arity) and what the tape keeps for backward (reads,
 * saves_out, n_saved). The columns are documented in ops.def. */
#ifndef PL_OP_TABLE_H
#define PL_OP_TABLE_H

#include <stdbool.h>

#include "pipeline/backend.h"
#include "pipeline/status.h"

typedef struct pl_op_row {
    const char *id; /* the enum suffix: "SWIGLU" for PL_OP_SWIGLU */
    const char *name, *family, *inputs;
    int in_min, in_max, out_min, out_max;
    bool bwd;
    const char *reads; /* "x<-y ..." ("*" any / every input), "" nothing, "-" no backward */
    bool saves_out;
    int n_saved;
    const char *saved, *params;
} pl_op_row;

/* The row of built-in op `op`, or NULL for PL_OP_NONE, an id past
 * PL_OP_COUNT or a custom op id. */
const pl_op_row *pl_op_row_of(int op);

/* The inputs whose data a backward with the `reads` rule of ops.def reads,
 * as a bit mask (bit j = input j), given which of the n_in inputs require a
 * gradient (grad_mask). "-" (no backward) and a malformed rule answer every
 * input when any requires grad (nothing is freed that might be read). */
unsigned pl_op_reads_mask(const char *reads, int n_in, unsigned grad_mask);

/* PL_ERR_INTERNAL, naming the op, when a forward call of built-in op `op`
 * has n_in inputs or n_out outputs outside its ops.def row; PL_OK for other
 * ops (PL_OP_NONE, custom ids), which carry their own checks. */
pl_status pl_op_check_call(int op, int n_in, int n_out);

/* The same for a tape node about to run its backward: n_in inputs and
 * n_saved saved tensors (saves_out + n_saved of the row). */
pl_status pl_op_check_node(int op, int n_in, int n_saved);

#endif
