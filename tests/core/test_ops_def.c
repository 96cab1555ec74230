/* test_ops_def.c - pipeline/ops.def, the one table of the built-in ops.
 *
 * The ids it generates are the ABI 2.7 ones (a reordered or inserted row
 * would renumber every op after it); every row is well-formed (arities a
 * kernel call and its backward can hold, a parseable `reads` rule naming
 * only the op's inputs, a known family); the core's table (op_table.c) and a
 * third party's expansion of the public file agree; and the core refuses a
 * kernel call or a tape node whose arity is not its row's, naming the op.
 * Coverage (a CPU kernel, a conformance case, a saved-bytes case per row) is
 * checked by test_backend_conformance and test_autograd_saved. */
#include <string.h>

#include "internal.h"
#include "op_table.h"
#include "pl_test.h"

/* The ids as ABI 2.7 shipped them: append-only, never renumbered. */
static const struct {
    int id;
    const char *name;
} g_abi_2_7[] = {
    /* clang-format off */
    {1, "copy"},          {2, "matmul"},       {3, "add"},              {4, "sub"},
    {5, "mul"},           {6, "div"},          {7, "scale"},            {8, "add_scalar"},
    {9, "sum"},           {10, "mean"},        {11, "relu"},            {12, "leaky_relu"},
    {13, "elu"},          {14, "gelu"},        {15, "silu"},            {16, "sigmoid"},
    {17, "tanh"},         {18, "exp"},         {19, "log"},             {20, "square"},
    {21, "sqrt"},         {22, "softmax"},     {23, "log_softmax"},     {24, "cross_entropy"},
    {25, "mse_loss"},     {26, "mae_loss"},    {27, "huber_loss"},      {28, "embedding"},
    {29, "index_select"}, {30, "gather"},      {31, "scatter_add"},     {32, "segment_softmax"},
    {33, "layer_norm"},   {34, "rms_norm"},    {35, "dropout"},         {36, "concat"},
    {37, "slice"},        {38, "permute"},     {39, "reshape"},         {40, "rope"},
    {41, "causal_softmax"}, {42, "cast"},      {43, "nf4_matmul"},      {44, "lstm"},
    {45, "clamp"},        {46, "adamw_step"},  {47, "sgd_step"},        {48, "swiglu"},
    /* clang-format on */
};

START_TEST(op_ids_are_the_abi_ones) {
    int n = (int)(sizeof g_abi_2_7 / sizeof g_abi_2_7[0]);
    ck_assert_int_ge(PL_OP_COUNT, n + 1);
    for (int i = 0; i < n; i++)
        ck_assert_msg(strcmp(pl_op_name((pl_op)g_abi_2_7[i].id), g_abi_2_7[i].name) == 0,
                      "op id %d is '%s', ABI 2.7 says '%s' (rows of ops.def are append-only)",
                      g_abi_2_7[i].id, pl_op_name((pl_op)g_abi_2_7[i].id), g_abi_2_7[i].name);
    ck_assert_int_eq(PL_OP_SWIGLU, 48);
    ck_assert_int_eq(PL_OP_COPY, 1);
    ck_assert_str_eq(pl_op_name(PL_OP_NONE), "none");
    ck_assert_str_eq(pl_op_name((pl_op)PL_OP_COUNT), "unknown");
    ck_assert_str_eq(pl_op_name((pl_op)(PL_OP_CUSTOM_BASE + 3)), "custom");
    ck_assert_ptr_null(pl_op_row_of(PL_OP_NONE));
    ck_assert_ptr_null(pl_op_row_of(PL_OP_COUNT));
    ck_assert_ptr_null(pl_op_row_of(-1));
}
END_TEST

/* A rule "x<-y ..." that only names inputs below n (or '*'). */
static bool rule_ok(const char *r, int n) {
    if (!strcmp(r, "-")) return true;
    for (; *r;) {
        if (*r == ' ') {
            r++;
            continue;
        }
        if (strlen(r) < 4 || r[1] != '<' || r[2] != '-' || (r[4] != ' ' && r[4] != 0)) return false;
        for (int k = 0; k < 4; k += 3)
            if (r[k] != '*' && (r[k] < 'a' || r[k] >= 'a' + n)) return false;
        r += 4;
    }
    return true;
}

START_TEST(every_row_is_well_formed) {
    static const char *families[] = {"dense", "loss", "norm", "attention", "index",
                                     "shape", "nf4",  "rnn",  "optim"};
    for (int op = PL_OP_NONE + 1; op < PL_OP_COUNT; op++) {
        const pl_op_row *r = pl_op_row_of(op);
        ck_assert_ptr_nonnull(r);
        const char *nm = r->name;
        ck_assert_msg(nm && nm[0], "op %d has no name", op);
        for (int o = PL_OP_NONE + 1; o < op; o++)
            ck_assert_msg(strcmp(pl_op_row_of(o)->name, nm), "ops %d and %d are both '%s'", o, op,
                          nm);
        ck_assert_msg(r->in_min >= 1 && r->in_min <= r->in_max && r->in_max <= PL_MAX_OP_INPUTS,
                      "%s: inputs %d..%d", nm, r->in_min, r->in_max);
        ck_assert_msg(r->out_min >= 1 && r->out_min <= r->out_max &&
                          r->out_max <= PL_MAX_OP_OUTPUTS,
                      "%s: outputs %d..%d", nm, r->out_min, r->out_max);
        ck_assert_msg(rule_ok(r->reads, r->in_max),
                      "%s: reads '%s' is not a rule over inputs a..%c", nm, r->reads,
                      'a' + r->in_max - 1);
        ck_assert_msg(r->bwd == (strcmp(r->reads, "-") != 0),
                      "%s: bwd %d but reads '%s' (\"-\" exactly when there is no backward)", nm,
                      r->bwd, r->reads);
        /* what backward saves comes from the outputs, and the backward call
         * (gradient, inputs, saved) fits in pl_kernel_args.in */
        ck_assert_msg(r->n_saved >= 0 && r->n_saved <= r->out_min - 1,
                      "%s: saves %d extra outputs of %d..%d", nm, r->n_saved, r->out_min,
                      r->out_max);
        ck_assert_msg(!r->bwd || 1 + r->in_max + r->saves_out + r->n_saved <= PL_MAX_OP_INPUTS,
                      "%s: its backward would take %d tensors, at most %d fit", nm,
                      1 + r->in_max + r->saves_out + r->n_saved, PL_MAX_OP_INPUTS);
        ck_assert_msg(r->bwd || (!r->saves_out && r->n_saved == 0),
                      "%s: saves tensors but has no backward", nm);
        ck_assert_msg(r->n_saved == 0 || r->saved[0], "%s: saves %d tensors, says not which", nm,
                      r->n_saved);
        bool known = false;
        for (size_t f = 0; f < sizeof families / sizeof families[0]; f++)
            known = known || !strcmp(r->family, families[f]);
        ck_assert_msg(known, "%s: family '%s' is not one of docs/ops.md's", nm, r->family);
    }
}
END_TEST

/* The public file expanded as a third-party backend would: the same ops,
 * ids and arities as the core's table. */
typedef struct ext_row {
    int id;
    const char *name;
    int in_min, in_max;
} ext_row;

static const ext_row g_ext[] = {
#define PL_OP_DEF(id, name, family, inputs, in_min, in_max, out_min, out_max, bwd, reads,          \
                  saves_out, n_saved, saved, params)                                               \
    {PL_OP_##id, name, in_min, in_max},
#include "pipeline/ops.def"
};

START_TEST(public_expansion_matches_the_core) {
    int n = (int)(sizeof g_ext / sizeof g_ext[0]);
    ck_assert_int_eq(n, PL_OP_COUNT - 1);
    for (int i = 0; i < n; i++) {
        ck_assert_int_eq(g_ext[i].id, i + 1); /* a row's id is its position */
        const pl_op_row *r = pl_op_row_of(g_ext[i].id);
        ck_assert_str_eq(r->name, g_ext[i].name);
        ck_assert_int_eq(r->in_min, g_ext[i].in_min);
        ck_assert_int_eq(r->in_max, g_ext[i].in_max);
    }
#ifdef PL_OP_DEF
    ck_abort_msg("ops.def left PL_OP_DEF defined");
#endif
}
END_TEST

/* pl_kernel_forward checks the call against the row before a kernel runs:
 * an add with one input would read in[1] (NULL) in the kernel. */
START_TEST(kernel_calls_are_checked_against_the_row) {
    pl_tensor *t = pl_tensor_zeros(PL_F32, 1, (int64_t[]){4}, PL_CPU);
    ck_assert_ptr_nonnull(t);
    pl_kernel_args k = {.op = PL_OP_ADD, .n_in = 1, .in = {t}, .n_out = 1, .out = {t}};
    ck_assert_int_eq(pl_kernel_forward(&k), PL_ERR_INTERNAL);
    ck_assert_msg(strstr(pl_error_message(), "'add'") && strstr(pl_error_message(), "ops.def"),
                  "message: %s", pl_error_message());
    k = (pl_kernel_args){.op = PL_OP_RELU, .n_in = 1, .in = {t}, .n_out = 2, .out = {t, t}};
    ck_assert_int_eq(pl_kernel_forward(&k), PL_ERR_INTERNAL);
    k = (pl_kernel_args){.op = PL_OP_ADD, .n_in = 2, .in = {t, t}, .n_out = 1, .out = {t}};
    PL_CK_OK(pl_kernel_forward(&k)); /* the row's arity runs */
    /* a node whose saved tensors are not the row's: relu saves its output */
    pl_tensor *x = pl_tensor_zeros(PL_F32, 1, (int64_t[]){4}, PL_CPU);
    pl_tensor *y = pl_tensor_zeros(PL_F32, 1, (int64_t[]){4}, PL_CPU);
    pl_tensor_set_requires_grad(x, true);
    ck_assert_int_eq(pl_autograd_record(PL_OP_RELU, NULL, &x, 1, NULL, 0, y), PL_ERR_INTERNAL);
    ck_assert_msg(strstr(pl_error_message(), "'relu'"), "message: %s", pl_error_message());
    ck_assert_ptr_null(y->grad_fn);
    /* an op without a backward is never a node */
    ck_assert_int_eq(pl_autograd_record(PL_OP_SGD_STEP, NULL, &x, 1, NULL, 0, y), PL_ERR_INTERNAL);
    PL_CK_OK(pl_autograd_record(PL_OP_RELU, NULL, &x, 1, &y, 1, y));
    ck_assert_ptr_nonnull(y->grad_fn);
    pl_tape_clear();
    pl_tensor_release(x);
    pl_tensor_release(y);
    pl_tensor_release(t);
}
END_TEST

int main(void) {
    Suite *s = suite_create("ops_def");
    TCase *tc = tcase_create("table");
    tcase_add_test(tc, op_ids_are_the_abi_ones);
    tcase_add_test(tc, every_row_is_well_formed);
    tcase_add_test(tc, public_expansion_matches_the_core);
    tcase_add_test(tc, kernel_calls_are_checked_against_the_row);
    suite_add_tcase(s, tc);
    return pl_test_run(s);
}
