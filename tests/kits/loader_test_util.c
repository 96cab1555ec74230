#include "loader_test_util.h"

#include <hdf5.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

pl_status lt_open(lt_loader *L, const char *plugin, const char *body, const char *run_dir) {
    return lt_open_on(L, plugin, body, run_dir, PL_CPU);
}

pl_status lt_open_on(lt_loader *L, const char *plugin, const char *body, const char *run_dir,
                     pl_device dev) {
    memset(L, 0, sizeof *L);
    L->h = pl_harness_new("data", plugin, body);
    if (!L->h) return pl_error_status();
    L->sec = pl_harness_section(L->h);
    L->vt = pl_harness_vtable(L->h);
    L->ctx = pl_harness_ctx(L->h);
    L->ctx->seed = 42;
    L->ctx->run_dir = run_dir;
    L->ctx->device = dev;
    pl_status st = pl_harness_create(L->h, &L->self);
    if (st) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", pl_error_message());
        L->self = NULL;
        lt_close(L);
        pl_error_set(st, "%s", msg);
    }
    return st;
}

void lt_close(lt_loader *L) {
    pl_harness_destroy(L->h, L->self);
    pl_harness_free(L->h);
    memset(L, 0, sizeof *L);
}

int lt_write(const char *file, const char *name, long type, int ndim, const long long *dims, const void *data) {
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    hid_t f = H5Fopen(file, H5F_ACC_RDWR, H5P_DEFAULT);
    if (f < 0) f = H5Fcreate(file, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    if (f < 0) return -1;
    hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
    H5Pset_create_intermediate_group(lcpl, 1);
    hsize_t d[8];
    for (int i = 0; i < ndim; i++) d[i] = (hsize_t)dims[i];
    hid_t sp = ndim ? H5Screate_simple(ndim, d, NULL) : H5Screate(H5S_SCALAR);
    hid_t ds = H5Dcreate2(f, name, (hid_t)type, sp, lcpl, H5P_DEFAULT, H5P_DEFAULT);
    int rc = ds < 0 ? -1 : (H5Dwrite(ds, (hid_t)type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0 ? -1 : 0);
    if (ds >= 0) H5Dclose(ds);
    H5Sclose(sp);
    H5Pclose(lcpl);
    H5Fclose(f);
    return rc;
}

int lt_read_epoch(lt_loader *L, lt_epoch *e) {
    memset(e, 0, sizeof *e);
    int cap = 0, r;
    pl_batch b;
    while ((r = L->vt->next(L->self, &b)) == 1) {
        if (e->nb == cap) {
            cap = cap ? 2 * cap : 16;
            e->b = realloc(e->b, sizeof *e->b * (size_t)cap);
        }
        lt_batch_copy *c = &e->b[e->nb++];
        memset(c, 0, sizeof *c);
        c->size = b.size;
        c->index = b.index;
        c->n = b.n;
        for (int i = 0; i < b.n; i++) {
            pl_tensor *t = b.fields[i];
            snprintf(c->name[i], sizeof c->name[i], "%s", b.names[i]);
            c->dt[i] = t->dtype;
            c->ndim[i] = t->ndim;
            memcpy(c->shape[i], t->shape, sizeof(int64_t) * (size_t)t->ndim);
            pl_tensor *h = pl_tensor_to(t, t->dtype, PL_CPU); /* contiguous copy */
            if (!h) return -1;
            c->nbytes[i] = pl_tensor_nbytes(h);
            c->data[i] = malloc(c->nbytes[i] ? c->nbytes[i] : 1);
            memcpy(c->data[i], pl_tensor_data(h), c->nbytes[i]);
            pl_tensor_release(h);
        }
    }
    return r < 0 ? -1 : 0;
}

void lt_epoch_free(lt_epoch *e) {
    for (int j = 0; j < e->nb; j++)
        for (int i = 0; i < e->b[j].n; i++) free(e->b[j].data[i]);
    free(e->b);
    memset(e, 0, sizeof *e);
}

const char *lt_epoch_tail_diff(const lt_epoch *full, int k, const lt_epoch *rest, char *buf, size_t n) {
    if (rest->nb != full->nb - k) {
        snprintf(buf, n, "start %d: %d batches served, expected %d", k, rest->nb, full->nb - k);
        return buf;
    }
    for (int j = 0; j < rest->nb; j++) {
        const lt_batch_copy *a = &full->b[k + j], *b = &rest->b[j];
        if (b->index != k + j || b->size != a->size || b->n != a->n) {
            snprintf(buf, n, "start %d, batch %d: index %lld size %lld fields %d; expected index %d "
                     "size %lld fields %d", k, k + j, (long long)b->index, (long long)b->size, b->n,
                     k + j, (long long)a->size, a->n);
            return buf;
        }
        for (int i = 0; i < a->n; i++) {
            if (strcmp(a->name[i], b->name[i]) || a->dt[i] != b->dt[i] || a->ndim[i] != b->ndim[i] ||
                memcmp(a->shape[i], b->shape[i], sizeof(int64_t) * (size_t)a->ndim[i]) ||
                a->nbytes[i] != b->nbytes[i] || memcmp(a->data[i], b->data[i], a->nbytes[i])) {
                snprintf(buf, n, "start %d, batch %d: field '%s' differs from the whole epoch's", k,
                         k + j, a->name[i]);
                return buf;
            }
        }
    }
    return NULL;
}

const char *lt_fields_diff(lt_loader *L, const pl_field_list *fl, pl_data_split split,
                           const pl_batch *b, unsigned *used, char *buf, size_t n) {
    if (pl_harness_check_batch(L->h, b, split)) {
        snprintf(buf, n, "%s", pl_error_message());
        return buf;
    }
    for (int j = 0; used && j < fl->n; j++)
        for (int i = 0; i < b->n; i++)
            if (!strcmp(fl->f[j].name, b->names[i])) *used |= 1u << j;
    return NULL;
}

pl_status lt_test_device(pl_device *dev) {
    const char *be = getenv("PL_TEST_DEVICE_BACKEND");
    *dev = (pl_device){PL_DEVICE_CUDA, 0};
    return pl_harness_load_backend_named(PL_DEVICE_CUDA, be && be[0] ? be : "strict");
}

const char *lt_device_equals_cpu(const char *plugin, const char *body, pl_device dev, int epochs,
                                 int *batches, int *fields, char *buf, size_t n) {
    lt_loader Lc, Ld;
    if (lt_open(&Lc, plugin, body, NULL)) {
        snprintf(buf, n, "cpu loader: %s", pl_error_message());
        return buf;
    }
    if (lt_open_on(&Ld, plugin, body, NULL, dev)) {
        snprintf(buf, n, "device loader: %s", pl_error_message());
        lt_close(&Lc);
        return buf;
    }
    const char *why = NULL;
    for (int e = 0; e < epochs && !why; e++) {
        lt_epoch ec = {0}, ed = {0};
        if (Lc.vt->epoch_begin(Lc.self, PL_SPLIT_TRAIN, e, 0) || lt_read_epoch(&Lc, &ec) ||
            Ld.vt->epoch_begin(Ld.self, PL_SPLIT_TRAIN, e, 0) || lt_read_epoch(&Ld, &ed)) {
            snprintf(buf, n, "epoch %d: %s", e, pl_error_message());
            why = buf;
        } else {
            char d[512];
            const char *diff = lt_epoch_tail_diff(&ec, 0, &ed, d, sizeof d);
            if (diff) {
                snprintf(buf, n, "epoch %d: %s", e, diff);
                why = buf;
            }
            *batches = ed.nb;
            *fields = ed.nb > 0 ? ed.b[0].n : 0;
        }
        lt_epoch_free(&ec);
        lt_epoch_free(&ed);
    }
    lt_close(&Lc);
    lt_close(&Ld);
    return why;
}
