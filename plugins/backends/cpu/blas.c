/* blas.c - the one place the CPU backend calls OpenBLAS's sgemm (see
 * pl_sgemm in cpu_internal.h for why small products run single-threaded). */
#include <cblas.h>

#include "cpu_internal.h"

void pl_sgemm(int order, int trans_a, int trans_b, int M, int N, int K, float alpha,
              const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc) {
    double flops = 2.0 * M * N * K;
    int nt = flops < PL_SGEMM_SERIAL_FLOPS ? openblas_get_num_threads() : 1;
    if (nt > 1) openblas_set_num_threads(1);
    cblas_sgemm((enum CBLAS_ORDER)order, (enum CBLAS_TRANSPOSE)trans_a,
                (enum CBLAS_TRANSPOSE)trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    if (nt > 1) openblas_set_num_threads(nt);
}

void pl_blas_set_threads(int n) {
    if (n > 0) openblas_set_num_threads(n);
}

int pl_blas_threads(void) {
    return openblas_get_num_threads();
}

/* The kernels OpenBLAS chose when it loaded ("SkylakeX", "Haswell", "Prescott"
 * ...: its cpuid choice, or OPENBLAS_CORETYPE's; the CLI sets that one from
 * the CPU's features, core/cli/main.c choose_blas_core). */
const char *pl_blas_core(void) {
    const char *c = openblas_get_corename();
    return c && *c ? c : "unknown";
}

const char *pl_blas_parallel(void) {
    switch (openblas_get_parallel()) {
    case 0:
        return "serial";
    case 1:
        return "pthreads";
    case 2:
        return "openmp";
    default:
        return "unknown";
    }
}
