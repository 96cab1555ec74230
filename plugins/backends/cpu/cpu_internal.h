/* cpu_internal.h - what the CPU backend's sources share (not installed).
 *
 * The CPU backend is the plugin cpu.so (kind backend, README.md here): the
 * core finds and loads it on the first lookup of the CPU device
 * (pl_backend_get(PL_DEVICE_CPU)). Its sources use only the public SDK
 * headers of the core, like the cuda and strict backends; this header holds
 * the declarations its own files share: OpenBLAS, the run-time ISA choice,
 * the packed GEMMs and the kernel files' registration functions.
 */
#ifndef PL_CPU_INTERNAL_H
#define PL_CPU_INTERNAL_H

#include <stdio.h>

#include "pipeline/backend_util.h"
#include "pipeline/pipeline.h"

/* Philox4x32-10 (pl_philox4x32_10, pl_philox_round, pl_philox_u01) is in
 * kernel_math.h. The same generator on PL_PHILOX_LANES independent counters
 * at once, laid out lane-major so the compiler vectorizes the rounds
 * (AVX-512: 16 lanes):
 * lane l uses counter {c0[l], c1[l], c2, c3}; out[j][l] is word j of lane l.
 * Bit-identical to pl_philox4x32_10. */
#define PL_PHILOX_LANES 16
static inline void pl_philox4x32_10_lanes(const uint32_t *c0_in, const uint32_t *c1_in, uint32_t c2,
                                          uint32_t c3, const uint32_t key[2],
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

/* The dropout stream's block `blk`: PL_PHILOX_LANES groups of 4 elements,
 * group g = blk * PL_PHILOX_LANES + l on lane l (counter {g lo, g hi, c2,
 * c3}), so out[j][l] draws element 4 g + j. dropout and lora_add's dropout
 * (kernels_index.c, kernels_matmul.c) share it: the same mask bits. */
static inline void pl_philox_dropout_block(int64_t blk, uint32_t c2, uint32_t c3,
                                           const uint32_t key[2],
                                           uint32_t out[4][PL_PHILOX_LANES]) {
    uint32_t lo[PL_PHILOX_LANES], hi[PL_PHILOX_LANES];
    for (int l = 0; l < PL_PHILOX_LANES; l++) {
        uint64_t g = (uint64_t)blk * PL_PHILOX_LANES + (uint64_t)l;
        lo[l] = (uint32_t)g;
        hi[l] = (uint32_t)(g >> 32);
    }
    pl_philox4x32_10_lanes(lo, hi, c2, c3, key, out);
}

/* OpenBLAS's thread pool size: set (n > 0; `[pipeline] threads` sets it with
 * OpenMP's, so a one-thread run keeps OpenBLAS off the second core) and read
 * (for summary.json). blas.c. */
void pl_blas_set_threads(int n);
int pl_blas_threads(void);
/* How the loaded OpenBLAS runs its threads: "openmp" (its OpenMP build: the
 * pool of the core's loops, what CMake links when installed), "pthreads" (a
 * pool of its own), "serial" (blas.c). */
const char *pl_blas_parallel(void);
const char *pl_blas_core(void);
/* cblas_sgemm, run on one OpenBLAS thread when the product is small: below
 * ~16 MFLOP the hand-off to OpenBLAS's thread pool costs more than it saves
 * (measured: the LSTM's per-step [64 x 64] x [64 x 256] recurrence ran 3x
 * faster single-threaded). Same arguments as cblas_sgemm (blas.c). */
#define PL_SGEMM_SERIAL_FLOPS 16e6
void pl_sgemm(int row_major, int trans_a, int trans_b, int M, int N, int K, float alpha,
              const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc);

/* The CPU kernels chosen at run time (cpu_isa.c), best first; the
 * order is a cap: a CPU with AVX-512 BF16 also runs the AVX2 code. */
typedef enum pl_cpu_isa {
    PL_ISA_SCALAR = 0,     /* portable C (whatever -march the build used) */
    PL_ISA_AVX2 = 1,       /* gemm_mixed.c's AVX2/FMA micro-kernel */
    PL_ISA_AVX512BF16 = 2, /* bf16_gemm_avx512.c's VDPBF16PS GEMM (with AVX512F/BW/VL) */
} pl_cpu_isa;
/* Set by this folder's CMakeLists.txt when the compiler builds bf16_gemm_avx512.c */
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
 * (bf16_gemm.c). Returns false (nothing written) when the build or the
 * CPU lacks AVX-512 BF16, or pl_cpu_isa_active() is below it: the caller
 * then uses pl_gemm_mixed. */
bool pl_bf16_gemm_nt(const uint16_t *A, const uint16_t *B, float *C, int64_t M, int64_t N,
                     int64_t K);
/* The AVX-512 BF16 kernel itself (bf16_gemm_avx512.c, compiled with
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
 * threads (false inside a caller's parallel loop). gemm_mixed.c. */
pl_status pl_gemm_mixed(int64_t M, int64_t N, int64_t K, const pl_gemm_operand *A,
                        const pl_gemm_operand *B, void *C, pl_dtype c_dtype, int64_t ldc,
                        bool accumulate, bool parallel);
/* Tests: run pl_gemm_mixed on its portable micro-kernel instead of AVX2. */
extern bool pl_gemm_mixed_generic;

/* Kernel registration into the CPU backend's table (answered by its kernel
 * lookup), one function per kernel file (cpu_backend.c calls them). */
void pl_cpu_register_dense(
    pl_kernel_table *b); /* kernels_dense.c, kernels_matmul.c, kernels_norm.c */
void pl_cpu_register_index(pl_kernel_table *b); /* kernels_index.c, kernels_lstm.c */
void pl_cpu_register_nf4(pl_kernel_table *b);   /* kernels_nf4.c: PL_OP_NF4_MATMUL */
void pl_cpu_register_optim(pl_kernel_table *b); /* kernels_optim.c: clamp, optimizer steps */
void pl_cpu_register_attention(pl_kernel_table *b); /* kernels_attention.c: PL_OP_ATTENTION */

/* The CPU backend's table (cpu_backend.c), its kernels registered. The
 * plugin's entry (cpu_plugin.c) hands it to the core; the tests of this
 * folder, which link these sources themselves, register it with
 * pl_backend_register() before any CPU tensor exists, so that the kernels
 * they tune (pl_cpu_isa_force, pl_gemm_mixed_generic) are the ones the ops
 * call. */
const pl_backend *pl_cpu_backend_table(void);
/* That table; its kernels are registered by the first pl_cpu_backend_table(). */
extern const pl_backend pl_cpu_backend;

#endif
