/* bench_loader.c - hdf5_rows throughput vs `cat FILE > /dev/null` vs memcpy.
 *
 * usage: bench_loader FILE.h5 [chunk_gb=0.25] [batch=4096]
 * FILE.h5 holds /train/x f32 [N, 256] (make_file.py). For prefetch on and
 * off the loader runs one epoch over the train split with a "model" that
 * only touches one float per batch, and reports GB/s, chunks and the fraction
 * of the epoch spent waiting on data (pl_loader_stats.wait_seconds / epoch). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "loader_test_util.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s FILE.h5 [chunk_gb] [batch]\n", argv[0]);
        return 2;
    }
    const char *file = argv[1];
    double gb = argc > 2 ? atof(argv[2]) : 0.25;
    int batch = argc > 3 ? atoi(argv[3]) : 4096;
    FILE *f = fopen(file, "rb");
    if (!f) {
        perror(file);
        return 1;
    }
    fseek(f, 0, SEEK_END);
    double bytes = (double)ftell(f);
    fclose(f);

    char cmd[1200];
    snprintf(cmd, sizeof cmd, "cat '%s' > /dev/null", file);
    double t0 = now_s();
    if (system(cmd) != 0) return 1;
    double t_cat = now_s() - t0;

    size_t piece = (size_t)256 << 20;
    char *a = malloc(piece), *b = malloc(piece);
    memset(a, 1, piece);
    memset(b, 0, piece);
    t0 = now_s();
    for (double done = 0; done < bytes; done += (double)piece) memcpy(b, a, piece);
    double t_mem = now_s() - t0;
    volatile char sink = b[123];
    (void)sink;
    free(a);
    free(b);

    printf("file %s: %.2f GiB\n", file, bytes / 1073741824.0);
    printf("cat > /dev/null : %6.2f s  %6.2f GB/s (page cache state as found)\n", t_cat, bytes / t_cat / 1e9);
    printf("memcpy          : %6.2f s  %6.2f GB/s\n", t_mem, bytes / t_mem / 1e9);
    for (int pf = 1; pf >= 0; pf--) {
        char body[1400];
        snprintf(body, sizeof body,
                 "path = %s\ndatasets = x\nbatch_size = %d\nchunk_size_gb = %g\nshuffle = false\nprefetch = %s\n",
                 file, batch, gb, pf ? "true" : "false");
        lt_loader L;
        if (lt_open(&L, "hdf5_rows", body, NULL)) {
            fprintf(stderr, "loader: %s\n", pl_error_message());
            return 1;
        }
        t0 = now_s();
        L.vt->epoch_begin(L.self, PL_SPLIT_TRAIN, 0, 0);
        pl_batch bt;
        double acc = 0;
        long nb = 0;
        while (L.vt->next(L.self, &bt) == 1) {
            acc += pl_tensor_f32(bt.fields[0])[0];
            nb++;
        }
        double t_ep = now_s() - t0;
        pl_loader_stats st = L.vt->stats(L.self);
        printf("loader prefetch=%d: %6.2f s  %6.2f GB/s  %ld batches  %llu chunks  waiting %.1f %% of the epoch (acc %g)\n",
               pf, t_ep, (double)st.bytes_read / t_ep / 1e9, nb, (unsigned long long)st.chunks_loaded,
               100.0 * st.wait_seconds / t_ep, acc);
        lt_close(&L);
    }
    return 0;
}
