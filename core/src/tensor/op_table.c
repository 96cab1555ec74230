/* op_table.c - the table of pipeline/ops.def in the core: pl_op_name, the
 * arity checks of kernel calls, the `reads` rule of the tape. */
#include "op_table.h"

#include <stddef.h>

#include "pipeline/status.h"

static const pl_op_row g_rows[PL_OP_COUNT] = {
#define PL_OP_DEF(id, name, family, inputs, in_min, in_max, out_min, out_max, bwd, reads,          \
                  saves_out, n_saved, saved, params)                                               \
    [PL_OP_##id] = {#id,     name,     #family, inputs,         in_min,  in_max, out_min,          \
                    out_max, bwd != 0, reads,   saves_out != 0, n_saved, saved,  params},
#include "pipeline/ops.def"
};

const pl_op_row *pl_op_row_of(int op) {
    if (op <= PL_OP_NONE || op >= PL_OP_COUNT) return NULL;
    return &g_rows[op];
}

const char *pl_op_name(pl_op op) {
    if (op == PL_OP_NONE) return "none";
    const pl_op_row *r = pl_op_row_of((int)op);
    if (r) return r->name;
    return (int)op >= PL_OP_CUSTOM_BASE ? "custom" : "unknown";
}

/* An input letter (a = input 0, ...) or '*' of a rule; -1 if neither. */
static int rule_input(char c) {
    if (c == '*') return 32;
    return c >= 'a' && c < 'a' + PL_MAX_OP_INPUTS ? c - 'a' : -1;
}

unsigned pl_op_reads_mask(const char *reads, int n_in, unsigned grad_mask) {
    unsigned all = n_in >= 32 ? ~0u : (1u << n_in) - 1u;
    unsigned keep = 0;
    const char *r = reads ? reads : "-";
    while (*r == ' ')
        r++;
    if (*r == '-' && r[1] == 0) return grad_mask ? all : 0u; /* no backward */
    while (*r) {
        /* "x<-y": each character read only after the one before it matched */
        int x = rule_input(r[0]);
        int y = x >= 0 && r[1] == '<' && r[2] == '-' ? rule_input(r[3]) : -1;
        if (y < 0 || (r[4] != ' ' && r[4] != 0))
            return grad_mask ? all : 0u; /* malformed: keep everything */
        bool applies = x == 32 ? grad_mask != 0 : (grad_mask >> x & 1u) != 0;
        if (applies) keep |= y == 32 ? all : 1u << y;
        r += 4;
        while (*r == ' ')
            r++;
    }
    return keep;
}

pl_status pl_op_check_call(int op, int n_in, int n_out) {
    const pl_op_row *r = pl_op_row_of(op);
    if (!r) return PL_OK;
    if (n_in < r->in_min || n_in > r->in_max || n_out < r->out_min || n_out > r->out_max)
        return pl_error_set(PL_ERR_INTERNAL,
                            "op '%s' called with %d inputs and %d outputs; ops.def says %d..%d "
                            "inputs and %d..%d outputs",
                            r->name, n_in, n_out, r->in_min, r->in_max, r->out_min, r->out_max);
    return PL_OK;
}

pl_status pl_op_check_node(int op, int n_in, int n_saved) {
    const pl_op_row *r = pl_op_row_of(op);
    if (!r) return PL_OK;
    int want = (r->saves_out ? 1 : 0) + r->n_saved;
    if (!r->bwd || n_in < r->in_min || n_in > r->in_max || n_saved != want)
        return pl_error_set(PL_ERR_INTERNAL,
                            "op '%s': a tape node with %d inputs and %d saved tensors; ops.def "
                            "says %s%d..%d inputs and %d saved",
                            r->name, n_in, n_saved, r->bwd ? "" : "no backward, ", r->in_min,
                            r->in_max, want);
    return PL_OK;
}
