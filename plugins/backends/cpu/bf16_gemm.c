/* bf16_gemm.c - C = A @ B^T with bf16 inputs and f32 accumulation, the
 * nn.Linear shape (A [M, K], B [N, K] row-major bf16, C [M, N] f32), on the
 * CPU's AVX-512 BF16 dot products (VDPBF16PS) where it has them.
 *
 * The choice is made here, at run time (cpu_isa.c: cpuid and the OS's
 * ZMM state), not by -march: the kernel lives in bf16_gemm_avx512.c,
 * compiled with its own target flags, so a build for x86-64-v3 runs it on a
 * CPU with avx512_bf16 and never calls it on one without. Where it does not
 * run, the caller's packed GEMM (gemm_mixed.c) takes the product. */
#include <stdint.h>

#include "cpu_internal.h"

bool pl_bf16_gemm_nt(const uint16_t *A, const uint16_t *B, float *C, int64_t M, int64_t N,
                     int64_t K) {
    if (M <= 0 || N <= 0 || K <= 0) return false;
#if PL_HAVE_AVX512BF16_KERNEL
    if (pl_cpu_isa_active() >= PL_ISA_AVX512BF16) return pl_bf16_gemm_nt_avx512(A, B, C, M, N, K);
#else
    (void)A, (void)B, (void)C;
#endif
    return false; /* built without the kernel, or the CPU (or PL_CPU_ISA) says no */
}
