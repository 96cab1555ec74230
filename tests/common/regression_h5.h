/* regression_h5.h - the synthetic regression split the trainer tests train on
 * (tests/core/test_trainer.c, test_callbacks.c): group g of HDF5 file f gets
 * x f32 [n, nf] uniform in [-1, 1) from an LCG seeded by `seed`, and y f32
 * [n, 1] = sin(t) + t / 2 with t = sum_j (j + 1) x_j. Header-only: only the
 * tests that link HDF5 include it. */
#ifndef PL_TEST_REGRESSION_H5_H
#define PL_TEST_REGRESSION_H5_H

#include <hdf5.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

static inline void pl_test_write_regression_group(hid_t f, const char *g, int n, int nf,
                                                  uint64_t seed) {
    hid_t grp = H5Gcreate2(f, g, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    float *x = malloc(sizeof(float) * n * nf), *y = malloc(sizeof(float) * n);
    uint32_t s = (uint32_t)seed;
    for (int i = 0; i < n; i++) {
        double t = 0;
        for (int j = 0; j < nf; j++) {
            s = s * 1664525u + 1013904223u;
            x[i * nf + j] = (float)((s >> 8) / 16777216.0 * 2 - 1);
            t += (j + 1) * x[i * nf + j];
        }
        y[i] = (float)(sin(t) + 0.5 * t);
    }
    hsize_t dx[2] = {(hsize_t)n, (hsize_t)nf}, dy[2] = {(hsize_t)n, 1};
    hid_t sx = H5Screate_simple(2, dx, NULL), sy = H5Screate_simple(2, dy, NULL);
    hid_t ds = H5Dcreate2(grp, "x", H5T_IEEE_F32LE, sx, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    H5Dwrite(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, x);
    H5Dclose(ds);
    ds = H5Dcreate2(grp, "y", H5T_IEEE_F32LE, sy, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    H5Dwrite(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, y);
    H5Dclose(ds);
    H5Sclose(sx);
    H5Sclose(sy);
    H5Gclose(grp);
    free(x);
    free(y);
}

#endif
