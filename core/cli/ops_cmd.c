/* ops_cmd.c - `pipeline ops [--markdown]`: every built-in op as its
 * pipeline/ops.def row says, read from the core's table (op_table.h). */
#include "ops_cmd.h"

#include <stdio.h>
#include <string.h>

#include "op_table.h"

const char *pl_cli_ops_help =
    "usage: pipeline ops [--markdown]\n"
    "\n"
    "Every built-in op (core/include/pipeline/ops.def): id, name, family, inputs, how\n"
    "many inputs and outputs a call has, and what its backward reads and saves (what the\n"
    "autograd tape keeps). --markdown prints the table of docs/ops.md\n"
    "(tools/op_table.py BIN --write regenerates it there; ctest's test_op_table checks it).\n";

/* The name of input i in a row's `inputs` ("x, W (nf4, frozen)": "W" for 1):
 * the i-th comma-separated item outside parentheses, up to its first space. */
static void input_name(const char *inputs, int i, char *buf, size_t n) {
    const char *p = inputs;
    int depth = 0;
    for (int k = 0; k < i && *p; p++) {
        if (*p == '(') depth++;
        if (*p == ')') depth--;
        if (*p == ',' && depth == 0) {
            k++;
            while (p[1] == ' ')
                p++;
        }
    }
    size_t l = 0;
    while (p[l] && p[l] != ',' && p[l] != ' ' && p[l] != '(' && l + 1 < n)
        l++;
    if (l == 0)
        snprintf(buf, n, "input %d", i);
    else
        snprintf(buf, n, "%.*s", (int)l, p);
}

static void rule_side(const pl_op_row *r, char c, bool target, char *buf, size_t n) {
    if (c == '*')
        snprintf(buf, n, "%s", target ? "any input" : "every input");
    else
        input_name(r->inputs, c - 'a', buf, n);
}

/* `reads` in words: "x<-y x<-z w<-y" -> "x ← y, z; w ← y" (arrow "<-" in
 * the terminal table, whose columns are aligned by bytes). */
static void reads_words(const pl_op_row *r, const char *arrow, char *out, size_t n) {
    const char *s = r->reads;
    if (!r->bwd || strcmp(s, "-") == 0) {
        snprintf(out, n, "(no backward)");
        return;
    }
    if (!*s) {
        snprintf(out, n, "nothing");
        return;
    }
    size_t len = 0;
    out[0] = 0;
    char last = 0;
    for (const char *t = s; *t;) {
        if (*t == ' ') {
            t++;
            continue;
        }
        if (strnlen(t, 4) < 4) break; /* malformed (test_ops_def refuses it) */
        char a[48], b[48];
        rule_side(r, t[0], true, a, sizeof a);
        rule_side(r, t[3], false, b, sizeof b);
        if (len + 1 >= n) break; /* full: the text is cut, never overrun */
        size_t room = n - len;
        if (t[0] != last)
            len += (size_t)snprintf(out + len, room, "%s%s %s %s", last ? "; " : "", a, arrow, b);
        else
            len += (size_t)snprintf(out + len, room, ", %s", b);
        last = t[0];
        t += 4;
    }
}

static void saves_words(const pl_op_row *r, char *out, size_t n) {
    if (r->saves_out && r->saved[0])
        snprintf(out, n, "the output; %s", r->saved);
    else if (r->saves_out)
        snprintf(out, n, "the output");
    else
        snprintf(out, n, "%s", r->saved);
}

static void range(int lo, int hi, char *buf, size_t n) {
    if (lo == hi)
        snprintf(buf, n, "%d", lo);
    else
        snprintf(buf, n, "%d..%d", lo, hi);
}

int pl_cli_ops(int argc, char **argv) {
    bool markdown = false;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--markdown"))
            markdown = true;
        else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            fputs(pl_cli_ops_help, stdout);
            return 0;
        } else {
            fprintf(stderr, "error: ops: unknown argument '%s'\nhint: see `pipeline help ops`\n",
                    argv[i]);
            return 2;
        }
    }
    if (markdown) {
        printf("| id | op | family | inputs | n_in | n_out | backward reads | saves | parameters, "
               "notes |\n");
        printf("|---|---|---|---|---|---|---|---|---|\n");
    } else {
        printf("%-3s  %-16s  %-9s  %-5s  %-5s  %-40s  %s\n", "id", "op", "family", "n_in", "n_out",
               "backward reads", "saves");
    }
    for (int op = PL_OP_NONE + 1; op < PL_OP_COUNT; op++) {
        const pl_op_row *r = pl_op_row_of(op);
        char in[16], out[16], rd[256], sv[256];
        range(r->in_min, r->in_max, in, sizeof in);
        range(r->out_min, r->out_max, out, sizeof out);
        reads_words(r, markdown ? "←" : "<-", rd, sizeof rd);
        saves_words(r, sv, sizeof sv);
        if (markdown)
            printf("| %d | `%s` (`PL_OP_%s`) | %s | %s | %s | %s | %s | %s | %s |\n", op, r->name,
                   r->id, r->family, r->inputs, in, out, rd, sv, r->params);
        else if (sv[0])
            printf("%-3d  %-16s  %-9s  %-5s  %-5s  %-40s  %s\n", op, r->name, r->family, in, out,
                   rd, sv);
        else
            printf("%-3d  %-16s  %-9s  %-5s  %-5s  %s\n", op, r->name, r->family, in, out, rd);
    }
    return 0;
}
