/* pl_test.h - helpers shared by every Check suite: numerical gradient
 * checks, data paths, tensor comparison. */
#ifndef PL_TEST_H
#define PL_TEST_H

#include <check.h>
#include <stdbool.h>

#include "pipeline/pipeline.h"

/* Path of a file under ../shared/data relative to the project root, or NULL
 * when the shared data is not present (tests then skip with a message). */
const char *pl_test_shared(const char *rel, char *buf, size_t n);

/* A differentiable function of `n` input tensors returning one tensor. */
typedef pl_tensor *(*pl_test_fn)(pl_tensor **inputs, int n, void *ctx);

/* Numerical gradient check (central differences). The scalar checked is
 * L = sum(f(inputs) * R) with R a fixed random tensor, so every output
 * element's gradient matters. For every input with requires_grad, every
 * element's analytic dL/dx (pl_backward) is compared with
 * (L(x+eps) - L(x-eps)) / 2eps evaluated in f64 sums of the f32 outputs.
 * Passes when |a - n| <= atol + rtol * |n| for all elements. On failure
 * writes the input index, element, both values to msg and returns false. */
bool pl_gradcheck(pl_test_fn f, pl_tensor **inputs, int n, void *ctx, double eps, double atol,
                  double rtol, char *msg, size_t msgn);

/* New f32 CPU tensor with N(0,1) (or uniform [lo,hi)) values from `seed`. */
pl_tensor *pl_test_randn(int ndim, const int64_t *shape, uint64_t seed);
pl_tensor *pl_test_rand(int ndim, const int64_t *shape, double lo, double hi, uint64_t seed);

/* Max |a-b| over elements (same numel), any float dtype on CPU. */
double pl_test_max_abs_diff(const pl_tensor *a, const pl_tensor *b);

/* Whole-step graphs (graph.h) on device d: a small training step (linear,
 * gelu, dropout p = 0.2 with a per-step counter, cross-entropy, backward,
 * AdamW with a learning rate and a bias correction that change every step,
 * zero_grad) runs `steps` times on fresh batches, eagerly, and again with
 * the step captured at step 2 (after dropout's counters were learned at
 * step 1) and replayed for the rest, each batch copied into the captured
 * input. Fails the test unless every step's loss and the final weights
 * agree within tol (0: bit for bit) and the graph was replayed steps - 3
 * times. */
void pl_test_graph_step(pl_device d, int steps, double tol);
/* On device d: a host read (pl_tensor_item) inside a capture fails naming a
 * host read, and pl_graph_capture_end then fails too; a capture_begin while
 * capturing is refused; a raw_alloc of the backend's own while capturing
 * fails naming an allocation outside the graph's pool, while the core's
 * allocator (a new 4 MiB tensor) is served. Fails the test otherwise. */
void pl_test_graph_violation(pl_device d);

/* ck_assert with the thread's pl error message on failure. */
#define PL_CK_OK(expr)                                                                       \
    do {                                                                                     \
        pl_status _s = (expr);                                                               \
        ck_assert_msg(_s == PL_OK, "%s failed: %s", #expr, pl_error_message());              \
    } while (0)
#define PL_CK_NOTNULL(expr)                                                                  \
    ({                                                                                       \
        __typeof__(expr) _p = (expr);                                                        \
        ck_assert_msg(_p != NULL, "%s returned NULL: %s", #expr, pl_error_message());        \
        _p;                                                                                  \
    })

/* Path of `name` in a scratch directory /tmp/pl_test_<suite>_XXXXXX made on
 * the first call (one per process); written into buf, returned. */
const char *pl_test_tmp_path(const char *suite, const char *name, char *buf, size_t n);

/* Copy the safetensors file `src` to `dst` (may be the same path: the copy is
 * written to a temporary file and renamed) with tensor `name` replaced by
 * `t` (NULL: dropped); metadata is not copied. Fails the test on error. */
void pl_test_st_replace(const char *src, const char *dst, const char *name, pl_tensor *t);

/* The whole file at `path`, NUL-terminated, malloc'd (the caller frees); a
 * file that cannot be read fails the test naming it. */
char *pl_test_read_file(const char *path);
/* Write `text` to `path` (replacing it); fails the test on error. */
void pl_test_write_file(const char *path, const char *text);

/* Run a suite with CK_NORMAL output; returns the process exit code. */
int pl_test_run(Suite *s);

#endif
