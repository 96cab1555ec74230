/* fuzz_safetensors.c - the safetensors reader (core/io/safetensors.c) on
 * arbitrary bytes: the input is the whole file. Open it; when it opens,
 * every tensor's info, a zero-copy view whose every byte is read, a copy
 * (pl_st_load) and a conversion into an f32 tensor of its shape
 * (pl_st_load_into), the non-finite scan of its stored bytes
 * (pl_st_check_finite, as on a backbone), and a metadata lookup. Any
 * outcome but a clean pl_status is a finding (ASan/UBSan report, crash,
 * leak). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "fuzz_util.h"
#include "pipeline/pipeline.h"
#include "pipeline/safetensors.h"

/* Read every byte of a view (ASan catches a view reaching past the mapping). */
static unsigned touch(const pl_tensor *t) {
    const uint8_t *p = pl_tensor_data(t);
    size_t n = pl_tensor_nbytes(t);
    unsigned s = 0;
    for (size_t i = 0; i < n; i++)
        s += p[i];
    return s;
}

static void read_tensor(pl_st_file *f, const char *name) {
    pl_dtype dt;
    int ndim = 0;
    int64_t shape[PL_MAX_DIMS];
    if (pl_st_info(f, name, &dt, &ndim, shape) != PL_OK) return;
    pl_tensor *v = pl_st_view(f, name);
    volatile unsigned sink = v ? touch(v) : 0;
    (void)sink;
    pl_tensor_release(v);
    (void)pl_st_check_finite(f, name);
    pl_tensor_release(pl_st_load(f, name));
    int64_t numel = 1;
    for (int d = 0; d < ndim; d++)
        numel *= shape[d] > 0 ? shape[d] : 1;
    if (numel <= (1 << 16)) {
        pl_tensor *dst = pl_tensor_zeros_owned(PL_F32, ndim, shape, PL_CPU);
        if (dst) (void)pl_st_load_into(f, name, dst);
        pl_tensor_release(dst);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_dir("safetensors");
    const char *path = fz_write("in.safetensors", data, size);
    pl_st_file *f = NULL;
    if (pl_st_open(path, &f) != PL_OK) return 0;
    for (int i = 0; i < pl_st_count(f); i++)
        read_tensor(f, pl_st_name_at(f, i));
    (void)pl_st_meta(f, "format");
    (void)pl_st_view(f, "no such tensor"); /* NULL: absent */
    pl_st_close(f);
    return 0;
}
