/* gemm_sweep.c - the GEMMs of the reference workloads through pipeline's op
 * (pl_linear: y = x @ W^T, the nn.Linear shape every model uses) against a
 * direct cblas_sgemm on the same buffers: what the op layer (shape checks,
 * allocation from the caching allocator, kernel lookup, frame bookkeeping)
 * costs on top of OpenBLAS. Forward only, grad off, f32, one frame per call.
 *
 * Prints one line per shape: M N K, GFLOP/s of each (median of `reps` calls
 * after 3 warm-ups) and their ratio (op / cblas; 1.00 = no overhead).
 *
 *   gemm_sweep [REPS]        (bench/run builds and runs it)
 */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <pipeline/pipeline.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int main(int argc, char **argv) {
    int reps = argc > 1 ? atoi(argv[1]) : 20;
    if (reps < 1 || reps > 10000) reps = 20;
    /* M x N x K: rows x out_features x in_features of the workloads' linears */
    static const int64_t shapes[][3] = {
        {800, 64, 64},    /* teacher: batch 16 x 50 positions, dim 64 projections */
        {800, 256, 64},   /* teacher MLP up */
        {800, 9067, 64},  /* teacher / pretrain full-softmax head over the items */
        {2708, 64, 1433}, /* GAT Cora: features -> 8 heads x 8 */
        {1792, 256, 49},  /* LSTM Chicago: 64 windows x 28 steps, input projection */
        {64, 256, 64},    /* LSTM Chicago: recurrent step */
        {480, 128, 32},   /* stock_gat: 16 days x 30 stocks, recurrent step */
        {1024, 1024, 1024},
    };
    int ns = (int)(sizeof shapes / sizeof shapes[0]);
    double *t_op = malloc(sizeof(double) * (size_t)reps), *t_bl = malloc(sizeof(double) * (size_t)reps);
    printf("%6s %6s %6s  %12s %12s  %s\n", "M", "N", "K", "op GFLOP/s", "cblas GFLOP/s", "op/cblas");
    for (int s = 0; s < ns; s++) {
        int64_t M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
        int64_t xs[2] = {M, K}, ws[2] = {N, K};
        pl_tensor *x = pl_tensor_empty_owned(PL_F32, 2, xs, PL_CPU);
        pl_tensor *w = pl_tensor_empty_owned(PL_F32, 2, ws, PL_CPU);
        float *y = malloc(sizeof(float) * (size_t)(M * N));
        if (!x || !w || !y) {
            fprintf(stderr, "gemm_sweep: out of memory at %lld x %lld x %lld\n", (long long)M,
                    (long long)N, (long long)K);
            return 1;
        }
        pl_tensor_uniform_(x, -1, 1, 1, 0);
        pl_tensor_uniform_(w, -1, 1, 2, 0);
        const float *xd = pl_tensor_data(x), *wd = pl_tensor_data(w);
        pl_no_grad_begin();
        for (int r = -3; r < reps; r++) {
            double t0 = now();
            pl_frame_begin();
            pl_tensor *out = pl_linear(x, w, NULL);
            if (!out) {
                fprintf(stderr, "gemm_sweep: pl_linear failed: %s\n", pl_error_message());
                return 1;
            }
            pl_frame_end();
            double t1 = now();
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)M, (int)N, (int)K, 1.0f, xd,
                        (int)K, wd, (int)K, 0.0f, y, (int)N);
            double t2 = now();
            if (r >= 0) {
                t_op[r] = t1 - t0;
                t_bl[r] = t2 - t1;
            }
        }
        pl_no_grad_end();
        double fl = 2.0 * (double)M * (double)N * (double)K;
        double g_op = fl / median(t_op, reps) / 1e9, g_bl = fl / median(t_bl, reps) / 1e9;
        printf("%6lld %6lld %6lld  %12.1f %12.1f  %.2f\n", (long long)M, (long long)N, (long long)K,
               g_op, g_bl, g_op / g_bl);
        free(y);
        pl_tensor_release(x);
        pl_tensor_release(w);
    }
    free(t_op);
    free(t_bl);
    return 0;
}
