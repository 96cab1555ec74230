/* ops_cmd.h - `pipeline ops [--markdown]`: the op table of pipeline/ops.def. */
#ifndef PL_CLI_OPS_CMD_H
#define PL_CLI_OPS_CMD_H

/* Usage text of `pipeline ops` (for `pipeline help ops`). */
extern const char *pl_cli_ops_help;

/* `pipeline ops [--markdown]` with argv after "ops": prints every built-in op
 * (id, name, family, inputs, outputs, what backward reads and saves) as an
 * aligned table, or as the markdown table of docs/ops.md (tools/op_table.py
 * checks that the file holds exactly this). Returns the exit code: 0, or 2
 * on an unknown argument. */
int pl_cli_ops(int argc, char **argv);

#endif
