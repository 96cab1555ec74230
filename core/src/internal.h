/* internal.h - helpers shared by the core's own sources (not installed).
 *
 * How an op is written (see ops_*.c):
 *
 *   pl_tensor *pl_silu(pl_tensor *a) {
 *       if (!a) return NULL;                                   // NULL-propagation
 *       if (pl_check_float("silu", a, true)) return NULL;      // dtype gate (refuses nf4)
 *       pl_tensor *x = pl_contiguous_owned(a);                 // +1 ref, copy if strided
 *       pl_tensor *out = pl_tensor_new_owned(a->dtype, x->ndim, x->shape, x->device);
 *       pl_kernel_args k = {.op = PL_OP_SILU, .n_in = 1, .in = {x}, .n_out = 1, .out = {out}};
 *       if (!out || pl_kernel_forward(&k) ||
 *           pl_autograd_record(PL_OP_SILU, &k.p, k.in, 1, NULL, 0, out)) {
 *           pl_tensor_release(x); pl_tensor_release(out); return NULL;
 *       }
 *       pl_tensor_release(x);
 *       return pl_op_result(out);                              // frame adopts it
 *   }
 *
 * Backward kernels: args.in[0] = grad of output (f32, output's shape),
 * args.in[1..1+n_in) = the op's inputs, then the saved tensors (first the
 * output itself where pl_autograd_saves_output: relu, softmax, ...);
 * args.out[i] = grad of input i (f32, input's shape, uninitialized) or NULL.
 * Gradients are always f32 whatever the dtype of the tensor.
 */
#ifndef PL_INTERNAL_H
#define PL_INTERNAL_H

#include <stdio.h>

#include "pipeline/backend_util.h"
#include "pipeline/pipeline.h"

/* New tensor owned by the caller and NOT adopted by the open frame. */
pl_tensor *pl_tensor_new_owned(pl_dtype dt, int ndim, const int64_t *shape, pl_device dev);
pl_tensor *pl_tensor_new_owned_zeros(pl_dtype dt, int ndim, const int64_t *shape, pl_device dev);
/* Hand an owned tensor to the innermost open frame (if any); returns t. */
pl_tensor *pl_op_result(pl_tensor *t);
/* New tensor header sharing t's storage (view); owned by caller. */
pl_tensor *pl_tensor_view_owned(pl_tensor *t);
/* A tape stub of t (pl_tensor_is_stub): t's shape, strides, dtype, device,
 * name, requires_grad and grad_fn, no data, no quantization state. Owned by
 * the caller; NULL with PL_ERR_NOMEM set. */
pl_tensor *pl_tensor_stub_owned(const pl_tensor *t);

/* half_io.c: does kernel call a (an op whose kernels compute on f32 data,
 * with a bf16 / f16 tensor among its inputs or outputs) need its half
 * tensors widened around backend b's kernel (not when b's half_native verb
 * says its kernel reads them itself)? backward: a is a backward call (in[0]
 * the gradient). pl_half_io_call runs fn on f32 copies of a's half inputs
 * and rounds its f32 results into a's half outputs (temporaries freed
 * before it returns); errors as fn's or the cast kernel's. */
bool pl_half_io_needed(const pl_backend *b, const pl_kernel_args *a, bool backward);
pl_status pl_half_io_call(const pl_backend *b, pl_kernel_fn fn, const pl_kernel_args *a);
/* Called by pl_tensor_release for a dying header that has a grad_fn: the
 * node that produced it forgets it (tape.c). */
void pl_autograd_forget_out(pl_tensor *t);

/* The backend registered for `type`, or NULL; unlike pl_backend_get it leaves
 * the error state alone (for callers that only ask). */
const pl_backend *pl_backend_peek(pl_device_type type);
/* Split a device string "NAME" or "NAME:N" (NAME: letters, digits, '_';
 * N: 0..2^31-1) into the backend name and index; "cpu" and "auto" come back
 * as themselves with index 0. PL_ERR_INVALID naming the string otherwise. */
/* op_profile.c: PL_PROFILE_OPS=1 times every dispatched kernel between two
 * synchronizes of its device and prints the table at exit (stderr). */
bool pl_op_profile_on(void);           /* reads PL_PROFILE_OPS once */
void pl_op_profile_enable(bool on);    /* tests: on/off, and the table emptied */
double pl_op_profile_begin(pl_device d);
void pl_op_profile_end(int op, bool backward, const pl_tensor *first, pl_device d, double t0);
void pl_op_profile_report(FILE *f);    /* largest total first; nothing when empty */
/* The precision plugin's convert_param behind pl_params_seal (the trainer
 * sets it between the precision's create and setup; NULL fn: none). */
void pl_params_set_seal(pl_params *ps, pl_status (*fn)(void *ud, pl_params *ps, int i),
                        void *ud);
pl_status pl_device_spec(const char *s, char *name, size_t n, int *index);

/* Run the forward kernel of a->op on the backend of a->in[0]'s device (or
 * a->out[0]'s if there are no inputs). PL_ERR_UNSUPPORTED if missing
 * (dispatch.c, with the gates below). */
pl_status pl_kernel_forward(pl_kernel_args *a);

/* PL_OK when b's struct_size covers the ABI 2.0 layout and it has a kernel
 * lookup; else PL_ERR_ABI naming `where` (a path or the backend's name). */
pl_status pl_backend_check_layout(const pl_backend *b, const char *where);

/* Gates used at op entry; each sets an error naming the op and tensor. */
pl_status pl_check_float(const char *op, const pl_tensor *t, bool allow_half);
pl_status pl_check_index(const char *op, const pl_tensor *t); /* i32 or i64 */
pl_status pl_check_same_device(const char *op, pl_tensor *const *ts, int n);
pl_status pl_check_ndim(const char *op, const pl_tensor *t, int min_ndim, int max_ndim);
/* t retained if contiguous, else a contiguous (non-recorded) copy; caller releases.
 * Autograd: if t is a non-contiguous tensor that requires grad, the copy is
 * recorded via pl_contiguous semantics. */
pl_tensor *pl_contiguous_owned(pl_tensor *t);
bool pl_any_requires_grad(pl_tensor *const *ts, int n);

/* NumPy broadcast of two shapes into (ndim, shape); PL_ERR_SHAPE naming op. */
pl_status pl_broadcast_shapes(const char *op, const pl_tensor *a, const pl_tensor *b, int *ndim,
                              int64_t *shape);

/* Philox4x32-10 (pl_philox4x32_10, pl_philox_round, pl_philox_u01) is in
 * kernel_math.h. The same generator on PL_PHILOX_LANES independent counters
 * at once, laid out lane-major so the compiler vectorizes the rounds
 * (AVX-512: 16 lanes):
 * lane l uses counter {c0[l], c1[l], c2, c3}; out[j][l] is word j of lane l.
 * Bit-identical to pl_philox4x32_10. */
#define PL_PHILOX_LANES 16
static inline void pl_philox4x32_10_lanes(const uint32_t *c0_in, const uint32_t *c1_in,
                                          uint32_t c2, uint32_t c3, const uint32_t key[2],
                                          uint32_t out[4][PL_PHILOX_LANES]) {
    uint32_t a[PL_PHILOX_LANES], b[PL_PHILOX_LANES], c[PL_PHILOX_LANES], d[PL_PHILOX_LANES];
    for (int l = 0; l < PL_PHILOX_LANES; l++) {
        a[l] = c0_in[l];
        b[l] = c1_in[l];
        c[l] = c2;
        d[l] = c3;
    }
    uint32_t k0 = key[0], k1 = key[1];
    for (int r = 0; r < 10; r++) {
#pragma omp simd
        for (int l = 0; l < PL_PHILOX_LANES; l++)
            pl_philox_round(&a[l], &b[l], &c[l], &d[l], k0, k1);
        k0 += PL_PHILOX_W0;
        k1 += PL_PHILOX_W1;
    }
    for (int l = 0; l < PL_PHILOX_LANES; l++) {
        out[0][l] = a[l];
        out[1][l] = b[l];
        out[2][l] = c[l];
        out[3][l] = d[l];
    }
}

/* OpenBLAS's thread pool size: set (n > 0; `[pipeline] threads` sets it with
 * OpenMP's, so a one-thread run keeps OpenBLAS off the second core) and read
 * (for summary.json). cpu/blas.c. */
void pl_blas_set_threads(int n);
int pl_blas_threads(void);
/* How the loaded OpenBLAS runs its threads: "openmp" (its OpenMP build: the
 * pool of the core's loops, what CMake links when installed), "pthreads" (a
 * pool of its own), "serial" (cpu/blas.c). */
const char *pl_blas_parallel(void);
/* cblas_sgemm, run on one OpenBLAS thread when the product is small: below
 * ~16 MFLOP the hand-off to OpenBLAS's thread pool costs more than it saves
 * (measured: the LSTM's per-step [64 x 64] x [64 x 256] recurrence ran 3x
 * faster single-threaded). Same arguments as cblas_sgemm (cpu/blas.c). */
#define PL_SGEMM_SERIAL_FLOPS 16e6
void pl_sgemm(int row_major, int trans_a, int trans_b, int M, int N, int K, float alpha,
              const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc);

/* True while some pl_params list holds t: t->param_lists > 0 (tensor.c). */
bool pl_tensor_is_param(const pl_tensor *t);
/* For the node the next recorded op pushes (tape.c): its input `dst`,
 * slot 0 or 1, is src cast to the autocast dtype. Where src is a frozen,
 * contiguous parameter (not requiring grad, held by a pl_params list, so
 * nothing rewrites it during the step) and backward needs dst, the tape
 * keeps a stub of dst and casts src again when backward runs, instead of
 * keeping the half copy beside the f32 parameter. NULL dst clears the slot;
 * pl_matmul's autocast path sets both slots around its inner matmul and
 * clears them after. */
void pl_autocast_recast_hint(int slot, const pl_tensor *dst, pl_tensor *src);

/* torch.autocast's cast cache (autocast_cache.c). Between begin and end
 * (nestable; the trainer brackets each model forward), pl_autocast_operand
 * casts a trainable f32 leaf parameter to dt once and hands the same tensor
 * to every later use; an entry made with grad mode off is not reused with
 * grad mode on (it would cut the gradient). end releases the cache's
 * references (the tape keeps what backward reads). Outside a scope, and for
 * any other tensor (activations, frozen weights), it is pl_cast. */
void pl_autocast_cache_begin(void);
void pl_autocast_cache_end(void);
pl_tensor *pl_autocast_operand(pl_tensor *a, pl_dtype dt);
/* This thread's counts since the last reset: operand casts asked of
 * pl_autocast_operand (dtype changes only), casts made, cache hits. */
typedef struct pl_autocast_cache_stats {
    uint64_t casts_requested, casts, hits;
} pl_autocast_cache_stats;
pl_autocast_cache_stats pl_autocast_cache_stats_get(void);
void pl_autocast_cache_stats_reset(void);

/* The CPU kernels chosen at run time (cpu/cpu_isa.c), best first; the
 * order is a cap: a CPU with AVX-512 BF16 also runs the AVX2 code. */
typedef enum pl_cpu_isa {
    PL_ISA_SCALAR = 0,     /* portable C (whatever -march the build used) */
    PL_ISA_AVX2 = 1,       /* gemm_mixed.c's AVX2/FMA micro-kernel */
    PL_ISA_AVX512BF16 = 2, /* bf16_gemm_avx512.c's VDPBF16PS GEMM (with AVX512F/BW/VL) */
} pl_cpu_isa;
/* Set by core/CMakeLists.txt when the compiler builds bf16_gemm_avx512.c */
#ifndef PL_HAVE_AVX512BF16_KERNEL
#define PL_HAVE_AVX512BF16_KERNEL 0
#endif
/* The best level this CPU, its OS (XCR0 register state, via xgetbv) and this
 * build support, from cpuid, detected once. */
pl_cpu_isa pl_cpu_isa_detected(void);
/* The level the kernels use now: pl_cpu_isa_detected(), capped by
 * pl_cpu_isa_force() or else by the environment's PL_CPU_ISA ("avx512bf16",
 * "avx2", "scalar"; read at the first call; anything else is ignored with a
 * warning on stderr). */
pl_cpu_isa pl_cpu_isa_active(void);
/* Tests: cap the level at `cap` (a pl_cpu_isa); -1 returns to PL_CPU_ISA's
 * cap, read again at the next query. */
void pl_cpu_isa_force(int cap);
/* "avx512bf16", "avx2" or "scalar" (static strings) */
const char *pl_cpu_isa_name(pl_cpu_isa isa);
/* The kernel a bf16 x bf16 -> `x @ W^T` matmul runs on now (summary.json's
 * "cpu_gemm_bf16", the run log): pl_cpu_isa_name(pl_cpu_isa_active()). */
const char *pl_cpu_gemm_bf16(void);
/* The detected features, space separated in /proc/cpuinfo's spelling
 * ("avx2 avx512f avx512bw avx512vl avx512_bf16 amx_bf16"; "avx2" means
 * AVX2 + FMA; "none"), written into buf (n bytes) and returned. AMX-BF16 is
 * reported only: no kernel uses its tiles. */
const char *pl_cpu_features(char *buf, size_t n);

/* C[M, N] f32 = A[M, K] @ B[N, K]^T with bf16 A and B, on AVX-512 BF16
 * (cpu/bf16_gemm.c). Returns false (nothing written) when the build or the
 * CPU lacks AVX-512 BF16, or pl_cpu_isa_active() is below it: the caller
 * then uses pl_gemm_mixed. */
bool pl_bf16_gemm_nt(const uint16_t *A, const uint16_t *B, float *C, int64_t M, int64_t N,
                     int64_t K);
/* The AVX-512 BF16 kernel itself (cpu/bf16_gemm_avx512.c, compiled with
 * -mavx512bf16 and friends): call only when pl_cpu_isa_active() allows it.
 * M, N, K > 0. false: out of memory for the packed B. */
bool pl_bf16_gemm_nt_avx512(const uint16_t *A, const uint16_t *B, float *C, int64_t M, int64_t N,
                            int64_t K);

/* One operand of pl_gemm_mixed: op(X) is X ([rows, cols] row-major with
 * leading dimension ld) or, with trans, X^T of the stored [cols, rows]. */
typedef struct pl_gemm_operand {
    const void *data; /* borrowed */
    pl_dtype dtype;   /* PL_F32, PL_BF16 or PL_F16 */
    int64_t ld;
    bool trans;
} pl_gemm_operand;

/* C[M, N] (+)= op(A)[M, K] @ op(B)[K, N] with f32 accumulation; A and B
 * each f32 / bf16 / f16 (widened exactly while packing), C f32 or bf16
 * (rounded to nearest even once), leading dimension ldc. accumulate (f32 C
 * only) adds to C instead of overwriting it; parallel lets it use the OpenMP
 * threads (false inside a caller's parallel loop). cpu/gemm_mixed.c. */
pl_status pl_gemm_mixed(int64_t M, int64_t N, int64_t K, const pl_gemm_operand *A,
                        const pl_gemm_operand *B, void *C, pl_dtype c_dtype, int64_t ldc,
                        bool accumulate, bool parallel);
/* Tests: run pl_gemm_mixed on its portable micro-kernel instead of AVX2. */
extern bool pl_gemm_mixed_generic;

/* Per-thread frame stack (frame.c). */
void pl_frame_adopt(pl_tensor *t);

/* CPU kernel registration into the CPU backend's table (answered by its
 * kernel lookup), one function per kernel file (cpu_backend.c calls them). */
void pl_cpu_register_dense(pl_kernel_table *b); /* kernels_dense.c */
void pl_cpu_register_index(pl_kernel_table *b); /* kernels_index.c */
void pl_cpu_register_copy(pl_kernel_table *b);  /* tensor.c: PL_OP_COPY */
/* pl_nf4_block_absmax for a kernel: the quantization state read straight
 * from memory the kernel may address (ops_nf4.c). */
pl_status pl_nf4_block_absmax_direct(const pl_tensor *q, float *out);
void pl_cpu_register_nf4(pl_kernel_table *b);   /* cpu/kernels_nf4.c: PL_OP_NF4_MATMUL */
void pl_cpu_register_optim(pl_kernel_table *b); /* cpu/kernels_optim.c: clamp, optimizer steps */

#endif
