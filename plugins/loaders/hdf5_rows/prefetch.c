/* prefetch.c - hdf5_rows' chunk buffers and the thread that fills them.
 *
 * Streaming keeps two buffers of `cap` rows: while batches are
 * served from one, the prefetch thread reads the next chunk of the epoch's
 * order into the other (double buffering). Resident mode has one buffer per
 * split, filled on the caller's thread at its first epoch. A chunk is read
 * field by field under the process-wide HDF5 lock, into host staging first
 * when the device is not the CPU: pinned memory from the backend, copied on
 * the backend's copy stream (memcpy_h2d_background, ordered after the
 * kernels already issued), so on a GPU the next chunk's transfer overlaps the
 * current chunk's compute (the thread is the loader kit's prefetch engine,
 * lk_prefetch). Float data is checked for NaN / Inf once it is in
 * host memory, before it goes to the device.
 */
#include <stdio.h>
#include <string.h>

#include "hdf5_rows.h"

pl_status chunk_buf_alloc(loader *L, chunk_buf *b, const split_data *s, int64_t rows) {
    b->split = -1;
    for (int i = 0; i < s->nf; i++) {
        int64_t shape[PL_MAX_DIMS];
        memcpy(shape, s->f[i].dims, sizeof shape);
        shape[0] = rows;
        b->t[i] = lk_new_tensor(s->f[i].dt, s->f[i].ndim, shape, L->dev);
        if (!b->t[i])
            return pl_error_prefix(pl_error_status(), "%s: chunk buffer for '%s'", L->path,
                                   s->f[i].dset);
        pl_tensor_set_name(b->t[i], "%s", s->f[i].dset);
        if (!pl_device_eq(L->dev, PL_CPU)) {
            b->stage[i] = lk_stage_tensor(L->dev, s->f[i].dt, s->f[i].ndim, shape);
            if (!b->stage[i]) return pl_error_status();
        }
    }
    return PL_OK;
}

void chunk_buf_free(chunk_buf *b) {
    for (int i = 0; i < MAXF; i++) {
        pl_tensor_release(b->t[i]);
        pl_tensor_release(b->stage[i]);
        b->t[i] = b->stage[i] = NULL;
    }
}

/* The first n staged rows of every field to the device buffers: on the
 * backend's copy stream when it has one (this runs on the prefetch thread, so
 * the copy overlaps the compute of the current chunk), else a plain copy. */
static pl_status stage_to_device(loader *L, chunk_buf *b, const split_data *s, int64_t n) {
    const pl_backend *be = pl_backend_get(L->dev.type);
    if (!be) return pl_error_status();
    bool bg = PL_BACKEND_HAS(be, memcpy_h2d_background) && be->memcpy_h2d_background;
    for (int i = 0; i < s->nf; i++) {
        void *dst = pl_tensor_data(b->t[i]);
        const void *src = pl_tensor_data(b->stage[i]);
        size_t nb = (size_t)n * s->f[i].row_bytes;
        pl_status st = bg ? be->memcpy_h2d_background(dst, L->dev, src, nb)
                          : be->memcpy(dst, L->dev, src, PL_CPU, nb);
        if (st)
            return pl_error_prefix(st, "%s: copying dataset '%s' to the device", L->path,
                                   s->f[i].dset);
    }
    return PL_OK;
}

pl_status chunk_fill(loader *L, chunk_buf *b, int si, int64_t chunk) {
    split_data *s = &L->sp[si];
    int64_t r0 = chunk * L->cap, n = s->nrows - r0;
    if (n > L->cap) n = L->cap;
    pl_status st = PL_OK;
    pl_h5_lock();
    for (int i = 0; i < s->nf && !st; i++) {
        pl_tensor *dst = b->stage[i] ? b->stage[i] : b->t[i];
        st = pl_h5_read_rows(L->path, s->f[i].dset, s->ds[i], s->f[i].memtype, s->row0 + r0, n,
                             pl_tensor_data(dst));
    }
    pl_h5_unlock();
    /* NaN / Inf refused where the data is first in host memory (README "Missing values") */
    for (int i = 0; i < s->nf && !st; i++)
        st = pl_h5_check_finite(L->path, s->f[i].dset, s->f[i].dt,
                                pl_tensor_data(b->stage[i] ? b->stage[i] : b->t[i]),
                                s->row0 + r0, n, s->f[i].ndim, s->f[i].dims, NULL, NULL, 0);
    if (!st && b->stage[0]) st = stage_to_device(L, b, s, n);
    if (!st) {
        b->split = si;
        b->chunk = chunk;
        b->rows = n;
        size_t bytes = 0;
        for (int i = 0; i < s->nf; i++)
            bytes += (size_t)n * s->f[i].row_bytes;
        __atomic_add_fetch(&L->st.bytes_read, bytes, __ATOMIC_RELAXED);
        __atomic_add_fetch(&L->st.chunks_loaded, 1, __ATOMIC_RELAXED);
    } else {
        b->split = -1;
    }
    return st;
}

static pl_status fill(void *user, int bi, int si, int64_t chunk) {
    loader *L = user;
    return chunk_fill(L, &L->buf[bi], si, chunk);
}

pl_status prefetch_start(loader *L) {
    lk_prefetch_init(&L->pf, fill, L);
    return lk_prefetch_start(&L->pf, "hdf5_rows");
}

void prefetch_stop(loader *L) {
    lk_prefetch_free(&L->pf);
}

pl_status prefetch_wait(loader *L) {
    return lk_prefetch_wait(&L->pf, &L->st.wait_seconds);
}

void prefetch_request(loader *L, int bi, int si, int64_t chunk) {
    if (!lk_prefetch_running(&L->pf)) return;
    L->buf[bi].split = -1; /* being overwritten */
    lk_prefetch_request(&L->pf, bi, si, chunk);
}
