/* rows.c - hdf5_rows: samples along axis 0 of one or more datasets per
 * split.
 *
 * A split's rows are read in chunks of `cap` rows (a multiple of the train
 * batch size) straight into allocator-backed tensors on the device; a batch
 * is a VIEW (pl_tensor_view_rows) of the current chunk, so no batch
 * allocates. When the whole data fits the budget every split stays resident
 * (read once, reused every epoch); otherwise two chunk buffers are used and
 * prefetch.c reads the next chunk while the current one is consumed.
 *
 * Order of an epoch (README "Batch order"): shuffle permutes the chunk order
 * with seed (ctx->seed + epoch) ^ 0xC0FFEE and the rows inside the chunk at
 * position p of that order with a stream keyed by (seed + epoch, p). Both are
 * pure functions of (seed, epoch), so epoch_begin(split, epoch, k) finds
 * batch k by counting the batches of the chunks before it and reads only
 * that chunk and the ones after it. A shuffled batch is gathered into one
 * batch buffer per field allocated once at create, by one index_select per
 * field (lk_gather_rows: memcpy on the CPU; on a device the backend's kernel
 * over the chunk's row order, uploaded once per chunk).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hdf5_rows.h"

/* ---- which datasets a split reads --------------------------------------- */

typedef struct field_ctx {
    const char *key, *spec;
    split_data *s;
} field_ctx;

static pl_status add_field_spec(const char *tok, int index, void *ud) {
    (void)index;
    field_ctx *c = ud;
    split_data *s = c->s;
    if (s->nf >= MAXF - MAX_EXTRA)
        return pl_error_set(PL_ERR_CONFIG, "hdf5_rows: %s: more than %d datasets", c->key,
                            MAXF - MAX_EXTRA);
    field *f = &s->f[s->nf++];
    const char *eq = strchr(tok, '=');
    const char *name = tok, *dset = eq ? eq + 1 : tok;
    size_t nlen = eq ? (size_t)(eq - tok) : strlen(tok);
    if (!eq) { /* the dataset's last path component */
        const char *base = strrchr(tok, '/');
        name = base ? base + 1 : tok;
        nlen = strlen(name);
    }
    while (nlen && name[nlen - 1] == ' ') nlen--;
    while (*dset == ' ') dset++;
    if (nlen >= sizeof f->name || strlen(dset) >= sizeof f->dset)
        return pl_error_set(PL_ERR_CONFIG, "hdf5_rows: %s: field or dataset name too long in '%s' "
                            "(at most %zu / %zu characters)", c->key, tok, sizeof f->name - 1,
                            sizeof f->dset - 1);
    snprintf(f->name, sizeof f->name, "%.*s", (int)nlen, name);
    snprintf(f->dset, sizeof f->dset, "%s", dset);
    if (!f->name[0] || !f->dset[0])
        return pl_error_set(PL_ERR_CONFIG, "hdf5_rows: %s: empty field or dataset in '%s'",
                            c->key, c->spec);
    return PL_OK;
}

/* Parse "a=b,c" into field names / dataset names. */
static pl_status parse_fields(const char *key, const char *spec, split_data *s) {
    s->nf = 0;
    field_ctx c = {key, spec, s};
    char what[128];
    snprintf(what, sizeof what, "hdf5_rows: %s", key);
    pl_status st = pl_cfg_list(spec, what, add_field_spec, &c, NULL);
    if (st) return st;
    if (s->nf == 0)
        return pl_error_set(PL_ERR_CONFIG, "hdf5_rows: %s is empty; list the datasets to load",
                            key);
    return PL_OK;
}

static const char *const k_datasets_key[PL_SPLIT_COUNT] = {"datasets", "val_datasets",
                                                           "test_datasets"};

/* The group and the dataset list of split si (split_fractions: "/" and `datasets`). */
static void split_source(const pl_config_section *cfg, int si, const char **group, const char **key,
                         const char **spec) {
    const char *dspec = pl_cfg_str(cfg, "datasets", "");
    if (pl_cfg_str(cfg, "split_fractions", "")[0]) {
        *group = "/";
        *key = "datasets";
        *spec = dspec;
        return;
    }
    static const char *const gkey[PL_SPLIT_COUNT] = {"train_group", "val_group", "test_group"};
    static const char *const gdef[PL_SPLIT_COUNT] = {"/train", "/val", "/test"};
    *group = pl_cfg_str(cfg, gkey[si], gdef[si]);
    *key = k_datasets_key[si];
    *spec = pl_cfg_str(cfg, *key, "");
    if (!(*spec)[0]) *spec = dspec;
}

/* Open the datasets of s (parsed by parse_fields) under `group`: dtype, shape,
 * equal row counts. Their handles go to s->ds (closed by the caller). */
static pl_status open_split(const char *path, hid_t file, split_data *s, const char *group,
                            bool to_f32, bool skip_missing) {
    int64_t n = -1;
    const char *first = NULL;
    int listed = s->nf;
    for (int i = 0; i < s->nf; i++) {
        field *f = &s->f[i];
        char full[NAME_LEN];
        lk_join_path(full, sizeof full, group, f->dset);
        snprintf(f->dset, sizeof f->dset, "%s", full);
        if (skip_missing && !pl_h5_exists(file, f->dset)) {
            /* predict: a dataset the new rows lack (their targets) is no field */
            memmove(f, f + 1, sizeof *f * (size_t)(s->nf - i - 1));
            s->nf--;
            i--;
            continue;
        }
        pl_status st = pl_h5_dataset_open(path, file, f->dset, &s->ds[i]);
        if (st) return st;
        pl_h5_info in;
        if ((st = pl_h5_dataset_dtype(path, f->dset, s->ds[i], to_f32, &f->dt, &f->memtype)) ||
            (st = pl_h5_dataset_info(path, f->dset, s->ds[i], pl_dtype_size(f->dt), &in)))
            return st;
        f->ndim = in.rank;
        if (f->ndim < 1 || f->ndim > PL_MAX_DIMS)
            return pl_error_set(
                PL_ERR_SHAPE, "%s: dataset '%s' has rank %d; expected 1..%d with samples on axis 0",
                path, f->dset, f->ndim, PL_MAX_DIMS);
        memcpy(f->dims, in.dims, sizeof f->dims);
        f->row_elems = 1;
        for (int d = 1; d < f->ndim; d++)
            f->row_elems *= f->dims[d];
        f->row_bytes = (size_t)f->row_elems * pl_dtype_size(f->dt);
        if (n < 0) {
            n = f->dims[0];
            first = f->dset;
        } else if (f->dims[0] != n) {
            return pl_error_set(PL_ERR_SHAPE,
                                "%s: datasets '%s' (%lld rows) and '%s' (%lld rows) disagree on "
                                "axis 0",
                                path, first, (long long)n, f->dset, (long long)f->dims[0]);
        }
    }
    if (s->nf == 0)
        return pl_error_set(PL_ERR_IO, "%s: none of the %d datasets the run's config lists is in "
                            "group %s", path, listed, group);
    s->present = true;
    s->row0 = 0;
    s->nrows = n;
    snprintf(s->where, sizeof s->where, "group %s", group);
    return PL_OK;
}

static void close_split(split_data *s) {
    pl_h5_lock();
    for (int i = 0; i < s->nf; i++)
        if (s->ds[i] > 0) H5Dclose(s->ds[i]);
    pl_h5_unlock();
    memset(s->ds, 0, sizeof s->ds);
}

/* Padded [nrows, Hmax] i32 from CSR offsets/items (history of seen items). */
static pl_status load_history(loader *L, int si, const char *group, const char *name) {
    split_data *s = &L->sp[si];
    char po[NAME_LEN], pi[NAME_LEN], g[NAME_LEN];
    lk_join_path(g, sizeof g, group, name);
    snprintf(po, sizeof po, "%s/offsets", g);
    snprintf(pi, sizeof pi, "%s/items", g);
    int64_t *off = NULL;
    int32_t *items = NULL;
    pl_h5_info ii;
    pl_status st = pl_h5_read_alloc(L->path, L->file, po, H5T_NATIVE_INT64, 1, 1,
                                    (int64_t[]){s->nrows + 1}, (void **)&off, NULL);
    if (!st)
        st = pl_h5_read_alloc(L->path, L->file, pi, H5T_NATIVE_INT32, 1, 1, NULL, (void **)&items,
                              &ii);
    if (st) {
        pl_error_prefix(st, "history '%s' (CSR: offsets [rows + 1 = %lld], items [n])", g,
                        (long long)(s->nrows + 1));
        goto done;
    }
    int64_t hmax = 1;
    for (int64_t r = 0; r < s->nrows; r++) {
        if (off[r] < 0 || off[r + 1] < off[r] || off[r + 1] > ii.dims[0]) {
            st =
                pl_error_set(PL_ERR_INVALID, "%s: '%s' is not a valid CSR offset array at row %lld",
                             L->path, po, (long long)r);
            goto done;
        }
        if (off[r + 1] - off[r] > hmax) hmax = off[r + 1] - off[r];
    }
    pl_tensor *host = lk_new_tensor(PL_I32, 2, (int64_t[]){s->nrows, hmax}, PL_CPU);
    if (!host) {
        st = pl_error_status();
        goto done;
    }
    int32_t *h = pl_tensor_data(host);
    memset(h, 0, sizeof *h * (size_t)(s->nrows * hmax));
    for (int64_t r = 0; r < s->nrows; r++)
        memcpy(h + r * hmax, items + off[r], sizeof *h * (size_t)(off[r + 1] - off[r]));
    pl_tensor *pad = host;
    if (!pl_device_eq(L->dev, PL_CPU)) {
        pad = lk_new_tensor(PL_I32, 2, (int64_t[]){s->nrows, hmax}, L->dev);
        if (!pad || pl_tensor_copy_(pad, host)) {
            st = pl_error_status();
            pl_tensor_release(pad);
            pad = NULL;
        }
        pl_tensor_release(host);
        if (!pad) goto done;
    }
    snprintf(s->xname[s->nx], sizeof s->xname[0], "%s", name);
    s->xt[s->nx++] = pad;
done:
    free(off);
    free(items);
    return st;
}

/* ---- create ------------------------------------------------------------- */

/* Open every split (groups, or split_fractions over one set of datasets). */
static pl_status open_splits(loader *L, const pl_config_section *cfg) {
    bool to_f32 = !strcmp(pl_cfg_str(cfg, "convert", "none"), "f32");
    const char *fr = pl_cfg_str(cfg, "split_fractions", "");
    const char *group, *key, *spec;
    pl_status st;
    if (fr[0]) {
        double f3[3];
        split_source(cfg, 0, &group, &key, &spec);
        if ((st = lk_parse_fractions("hdf5_rows", fr, f3)) || (st = parse_fields(key, spec, &L->sp[0])) ||
            (st = open_split(L->path, L->file, &L->sp[0], group, to_f32, false)))
            return st;
        int64_t N = L->sp[0].nrows;
        int64_t a = (int64_t)floor(f3[0] * (double)N + 0.5);
        int64_t b = a + (int64_t)floor(f3[1] * (double)N + 0.5);
        if (b > N) b = N;
        int64_t r0[3] = {0, a, b}, r1[3] = {a, b,
                                            f3[0] + f3[1] + f3[2] >= 1.0 - 1e-9
                                                ? N
                                                : b + (int64_t)floor(f3[2] * (double)N + 0.5)};
        if (r1[2] > N) r1[2] = N;
        for (int si = 1; si < 3; si++) {
            L->sp[si].nf = L->sp[0].nf;
            memcpy(L->sp[si].f, L->sp[0].f, sizeof L->sp[0].f);
            for (int i = 0; i < L->sp[0].nf; i++)
                if ((st = pl_h5_dataset_open(L->path, L->file, L->sp[0].f[i].dset,
                                             &L->sp[si].ds[i])))
                    return st;
        }
        for (int si = 0; si < 3; si++) {
            split_data *s = &L->sp[si];
            s->row0 = r0[si];
            s->nrows = r1[si] - r0[si];
            s->present = s->nrows > 0;
            snprintf(s->where, sizeof s->where, "rows %lld..%lld of /", (long long)r0[si],
                     (long long)r1[si]);
            if (f3[si] > 0 && s->nrows == 0)
                return pl_error_set(PL_ERR_CONFIG,
                                    "%s: split '%s' is empty (%lld rows x fraction %g)", L->path,
                                    pl_split_name((pl_data_split)si), (long long)N, f3[si]);
        }
        return PL_OK;
    }
    const char *hist = pl_cfg_str(cfg, "history", "");
    int only = lk_predict_split(L->ctx); /* predict: that split alone, targets optional */
    for (int si = 0; si < 3; si++) {
        if (only >= 0 && si != only) continue;
        split_source(cfg, si, &group, &key, &spec);
        if (!pl_h5_exists(L->file, group)) {
            if (si == only)
                return pl_error_set(PL_ERR_IO, "%s: group '%s' of split '%s' not found (set %s)",
                                    L->path, group, pl_split_name((pl_data_split)si),
                                    si == PL_SPLIT_TRAIN ? "data.train_group"
                                    : si == PL_SPLIT_VAL ? "data.val_group"
                                                         : "data.test_group");
            if (si == PL_SPLIT_TRAIN)
                return pl_error_set(PL_ERR_IO,
                                    "%s: train group '%s' not found (set train_group, or "
                                    "split_fractions to split one set of datasets)",
                                    L->path, group);
            snprintf(L->sp[si].where, sizeof L->sp[si].where, "group %s (not in the file)", group);
            continue;
        }
        if ((st = parse_fields(key, spec, &L->sp[si])) ||
            (st = open_split(L->path, L->file, &L->sp[si], group, to_f32, only >= 0)))
            return st;
        if (L->sp[si].nrows == 0)
            return pl_error_set(PL_ERR_CONFIG, "%s: split '%s' (group %s) has 0 rows", L->path,
                                pl_split_name((pl_data_split)si), group);
        if (hist[0] && si != PL_SPLIT_TRAIN) {
            char g[NAME_LEN];
            lk_join_path(g, sizeof g, group, hist);
            if (pl_h5_exists(L->file, g) && (st = load_history(L, si, group, hist))) return st;
        }
    }
    return PL_OK;
}

/* The optional fields beside the datasets: row_field (every split) and the
 * teacher targets joined to the train rows (teacher_join.c), with the
 * buffers a batch of them needs, allocated once. */
static pl_status extras_create(loader *L, const pl_config_section *cfg) {
    const char *tp = pl_cfg_str(cfg, "teacher_outputs", "");
    split_data *tr = &L->sp[PL_SPLIT_TRAIN];
    pl_status st;
    if (tp[0]) {
        if (pl_cfg_str(cfg, "split_fractions", "")[0])
            return pl_error_set(PL_ERR_CONFIG, "hdf5_rows: teacher_outputs needs train/val/test "
                                "groups, not split_fractions");
        if ((st = rw_teacher_join(L, tp, pl_cfg_int(cfg, "teacher_top_k", 0)))) return st;
    }
    int64_t maxb = 1;
    for (int si = 0; si < PL_SPLIT_COUNT; si++)
        if (L->sp[si].batch > maxb) maxb = L->sp[si].batch;
    L->xidx = malloc(sizeof *L->xidx * (size_t)maxb);
    if (!L->xidx) return pl_error_set(PL_ERR_NOMEM, "hdf5_rows: out of memory");
    snprintf(L->row_field, sizeof L->row_field, "%s", pl_cfg_str(cfg, "row_field", ""));
    for (int i = 0; tr->shuffle && i < tr->nx; i++) {
        int64_t shape[PL_MAX_DIMS];
        memcpy(shape, tr->xt[i]->shape, sizeof shape);
        shape[0] = tr->batch;
        tr->xg[i] = lk_new_tensor(tr->xt[i]->dtype, tr->xt[i]->ndim, shape, L->dev);
        if (!tr->xg[i]) return pl_error_status();
    }
    return PL_OK;
}

/* The shuffled split's (train) gather buffers, one per field [batch, ...],
 * its row order on the host and, on a device, as the i64 vectors one
 * index_select per field reads (allocated once). */
static pl_status alloc_gather(loader *L) {
    split_data *tr = &L->sp[PL_SPLIT_TRAIN];
    for (int i = 0; i < tr->nf; i++) {
        int64_t shape[PL_MAX_DIMS];
        memcpy(shape, tr->f[i].dims, sizeof shape);
        shape[0] = tr->batch;
        L->gather[i] = lk_new_tensor(tr->f[i].dt, tr->f[i].ndim, shape, L->dev);
        if (!L->gather[i]) return pl_error_status();
    }
    int64_t np = L->resident ? tr->nrows : L->cap;
    L->perm = malloc(sizeof *L->perm * (size_t)np);
    if (!L->perm) return pl_error_set(PL_ERR_NOMEM, "hdf5_rows: out of memory");
    if (pl_device_eq(L->dev, PL_CPU)) return PL_OK;
    L->perm_dev = lk_new_tensor(PL_I64, 1, &np, L->dev);
    if (!L->perm_dev) return pl_error_status();
    if (tr->nx == 0) return PL_OK;
    L->xperm = malloc(sizeof *L->xperm * (size_t)np);
    L->xperm_dev = lk_new_tensor(PL_I64, 1, &np, L->dev);
    if (!L->xperm || !L->xperm_dev)
        return L->xperm ? pl_error_status() : pl_error_set(PL_ERR_NOMEM, "hdf5_rows: out of memory");
    return PL_OK;
}

pl_status rows_create(loader *L, const pl_config_section *cfg) {
    pl_status st = open_splits(L, cfg);
    if (!st) st = extras_create(L, cfg);
    if (st) return st;

    /* per-sample bytes and the chunk budget */
    size_t total = 0, max_row = 0;
    int64_t max_rows = 0;
    for (int si = 0; si < 3; si++) {
        split_data *s = &L->sp[si];
        if (!s->present) continue;
        size_t rb = 0;
        for (int i = 0; i < s->nf; i++)
            rb += s->f[i].row_bytes;
        if (rb > max_row) max_row = rb;
        if (s->nrows > max_rows) max_rows = s->nrows;
        total += rb * (size_t)s->nrows;
    }
    split_data *tr = &L->sp[PL_SPLIT_TRAIN];
    if (tr->present && tr->drop_last && tr->nrows < tr->batch)
        return pl_error_set(
            PL_ERR_CONFIG,
            "%s: train split (%s) has %lld rows < batch_size %lld with drop_last: no batch",
            L->path, tr->where, (long long)tr->nrows, (long long)tr->batch);
    int64_t cs = pl_cfg_int(cfg, "chunk_samples", 0);
    double gb = pl_cfg_float(cfg, "chunk_size_gb", 0);
    size_t budget;
    if (gb > 0) {
        budget = (size_t)(gb * 1073741824.0);
    } else {
        size_t fb = 0, tb = 0;
        const pl_backend *be = pl_backend_get(L->dev.type);
        if (be && be->mem_info && be->mem_info(L->dev.index, &fb, &tb) == PL_OK && fb > 0)
            budget = (size_t)(0.75 * (double)fb);
        else
            budget = (size_t)1 << 30;
    }
    if (cs <= 0 && total <= budget) {
        L->resident = true;
    } else {
        if (cs <= 0)
            cs = (int64_t)(budget / 2 / (max_row ? max_row : 1)); /* two buffers share it */
        if (cs > max_rows) cs = max_rows;
        if (cs >= max_rows) L->resident = true;
    }
    if (L->resident) {
        L->nbuf = 3;
        for (int si = 0; si < 3; si++) {
            if (!L->sp[si].present) continue;
            if ((st = chunk_buf_alloc(L, &L->buf[si], &L->sp[si], L->sp[si].nrows))) return st;
        }
        L->cap = max_rows;
    } else {
        /* chunk = multiple of the train batch; two buffers shaped for the train split's
         * fields (val/test re-shape them at their epoch_begin when their fields differ) */
        int64_t b = tr->batch;
        if (cs < b) cs = b;
        cs -= cs % b;
        L->cap = cs;
        L->nbuf = 2;
        for (int k = 0; k < 2; k++)
            if ((st = chunk_buf_alloc(L, &L->buf[k], tr, L->cap))) return st;
        L->prefetch = pl_cfg_bool(cfg, "prefetch", true);
    }
    if (tr->shuffle && (st = alloc_gather(L))) return st;
    if (L->row_field[0]) { /* a chunk's row numbers (rows_chunk_upload) */
        L->rows_t = lk_new_tensor(PL_I64, 1, (int64_t[]){L->cap}, L->dev);
        if (!L->rows_t) return pl_error_status();
        if (!pl_device_eq(L->dev, PL_CPU)) {
            L->rows_host = lk_new_tensor(PL_I64, 1, (int64_t[]){L->cap}, PL_CPU);
            if (!L->rows_host) return pl_error_status();
        }
    }
    L->order_cap = 1;
    for (int si = 0; si < 3; si++) {
        int64_t nc = L->resident ? 1 : (L->sp[si].nrows + L->cap - 1) / L->cap;
        if (nc > L->order_cap) L->order_cap = nc;
    }
    L->order = malloc(sizeof *L->order * (size_t)L->order_cap);
    if (!L->order) return pl_error_set(PL_ERR_NOMEM, "hdf5_rows: out of memory");
    if (L->prefetch && (st = prefetch_start(L))) return st;
    for (int si = 0; si < 3; si++) {
        char k[64];
        snprintf(k, sizeof k, "num_%s", pl_split_name((pl_data_split)si));
        lk_meta_int(L->ctx, k, L->sp[si].nrows);
    }
    /* dims of the first field of the train split: seq_len for [N, L] inputs */
    if (tr->nf > 0 && tr->f[0].ndim >= 2) lk_meta_int(L->ctx, "seq_len", tr->f[0].dims[1]);
    if (L->ctx && L->ctx->verbose)
        pl_message("hdf5_rows: %s: train %lld / val %lld / test %lld rows, %s, chunk %lld rows",
                   L->path, (long long)tr->nrows, (long long)L->sp[1].nrows,
                   (long long)L->sp[2].nrows, L->resident ? "resident" : "streaming", (long long)L->cap);
    return PL_OK;
}

/* ---- epochs ------------------------------------------------------------- */

static int64_t chunk_count(const loader *L, int si) {
    if (L->resident) return 1;
    return (L->sp[si].nrows + L->cap - 1) / L->cap;
}

/* Streaming: buffers whose fields belong to another split's layout must be re-shaped. */
static pl_status ensure_layout(loader *L, int si) {
    if (L->resident) return PL_OK;
    split_data *s = &L->sp[si];
    for (int k = 0; k < 2; k++) {
        chunk_buf *b = &L->buf[k];
        bool ok = true;
        for (int i = 0; i < s->nf && ok; i++)
            ok = b->t[i] && b->t[i]->dtype == s->f[i].dt && b->t[i]->ndim == s->f[i].ndim &&
                 !memcmp(b->t[i]->shape + 1, s->f[i].dims + 1,
                         sizeof(int64_t) * (size_t)(s->f[i].ndim - 1));
        for (int i = s->nf; i < MAXF && ok; i++)
            ok = !b->t[i];
        if (ok) continue;
        chunk_buf_free(b);
        pl_status st = chunk_buf_alloc(L, b, s, L->cap);
        if (st) return st;
    }
    return PL_OK;
}

/* The chunk's row order to the device (once per chunk, not per batch): perm,
 * and for the resident extra fields the rows within the split. */
static pl_status upload_perm(loader *L, const split_data *s, int64_t rows) {
    const pl_backend *be = pl_backend_get(L->dev.type);
    if (!be) return pl_error_status();
    pl_status st = be->memcpy(pl_tensor_data(L->perm_dev), L->dev, L->perm, PL_CPU,
                              (size_t)rows * sizeof *L->perm);
    if (st || !L->xperm_dev || s->nx == 0) return st;
    int64_t base = L->order[L->chunk_pos] * L->cap;
    for (int64_t i = 0; i < rows; i++)
        L->xperm[i] = base + L->perm[i];
    return be->memcpy(pl_tensor_data(L->xperm_dev), L->dev, L->xperm, PL_CPU,
                      (size_t)rows * sizeof *L->xperm);
}

/* row_field: the file row of each of the chunk's rows in serving order,
 * row0 + the chunk's first row + (perm[k] shuffled, else k), to the device
 * in one copy per chunk; a batch's field is a view of it (before, one
 * host-to-device copy per batch: a GPU step waited on it). */
static pl_status rows_chunk_upload(loader *L, const split_data *s, int64_t rows) {
    pl_tensor *h = L->rows_host ? L->rows_host : L->rows_t;
    int64_t *r = pl_tensor_data(h), base = s->row0 + L->order[L->chunk_pos] * L->cap;
    for (int64_t k = 0; k < rows; k++)
        r[k] = base + (s->shuffle ? L->perm[k] : k);
    if (!L->rows_host || rows == 0) return PL_OK;
    const pl_backend *be = pl_backend_get(L->dev.type);
    return be ? be->memcpy(pl_tensor_data(L->rows_t), L->dev, r, PL_CPU,
                           (size_t)rows * sizeof *r)
              : pl_error_status();
}

/* Make chunk order[pos] current (waiting on the prefetch if needed), then prefetch the next. */
static pl_status activate_chunk(loader *L, int64_t pos) {
    int si = L->cur_split;
    int64_t ch = L->order[pos];
    pl_status st;
    if (L->resident) {
        chunk_buf *b = &L->buf[si];
        if (b->split != si) {
            double t0 = lk_now();
            if ((st = chunk_fill(L, b, si, 0))) return st;
            L->st.wait_seconds += lk_now() - t0;
        }
        L->cur_buf = si;
    } else {
        if ((st = prefetch_wait(L))) return st;
        int hit = -1;
        for (int k = 0; k < 2; k++)
            if (L->buf[k].split == si && L->buf[k].chunk == ch) hit = k;
        if (hit < 0) {
            hit = pos > 0 ? 1 - L->cur_buf : 0;
            double t0 = lk_now();
            if ((st = chunk_fill(L, &L->buf[hit], si, ch))) return st;
            L->st.wait_seconds += lk_now() - t0;
        }
        L->cur_buf = hit;
        if (pos + 1 < L->nchunks) {
            int other = 1 - hit;
            int64_t nx = L->order[pos + 1];
            if (!(L->buf[other].split == si && L->buf[other].chunk == nx))
                prefetch_request(L, other, si, nx);
        }
    }
    L->chunk_pos = pos;
    L->row_pos = 0;
    split_data *s = &L->sp[si];
    int64_t rows = L->buf[L->cur_buf].rows;
    if (s->shuffle) {
        for (int64_t i = 0; i < rows; i++)
            L->perm[i] = i;
        uint64_t seed = (L->ctx ? L->ctx->seed : 0) + (uint64_t)L->epoch;
        uint64_t rs = seed * 0x100000001B3ull ^ (uint64_t)(pos + 1) * 0x9E3779B97F4A7C15ull;
        lk_shuffle(L->perm, rows, &rs);
        if (L->perm_dev && (st = upload_perm(L, s, rows))) return st;
    }
    return L->row_field[0] ? rows_chunk_upload(L, s, rows) : PL_OK;
}

/* Batches next() serves from the chunk at position `pos` of the epoch's order. */
static int64_t chunk_batches(const loader *L, int si, int64_t pos) {
    const split_data *s = &L->sp[si];
    int64_t rows = s->nrows;
    if (!L->resident) {
        rows = s->nrows - L->order[pos] * L->cap;
        if (rows > L->cap) rows = L->cap;
    }
    return s->drop_last ? rows / s->batch : (rows + s->batch - 1) / s->batch;
}

pl_status rows_epoch_begin(loader *L, int si, int64_t start) {
    split_data *s = &L->sp[si];
    pl_status st = prefetch_wait(L);
    if (st) return st;
    if ((st = ensure_layout(L, si))) return st;
    L->nchunks = chunk_count(L, si);
    for (int64_t i = 0; i < L->nchunks; i++)
        L->order[i] = i;
    if (s->shuffle) {
        uint64_t rs = ((L->ctx ? L->ctx->seed : 0) + (uint64_t)L->epoch) ^ 0xC0FFEEull;
        lk_shuffle(L->order, L->nchunks, &rs);
    }
    /* batch `start`: read the chunk that holds it (and prefetch the one after); the
     * chunks before it in the epoch's order are not read. The within-chunk row order
     * depends on (seed, epoch, position) only, so it is the whole epoch's. */
    int64_t k = start;
    for (int64_t pos = 0; pos < L->nchunks; pos++) {
        int64_t nb = chunk_batches(L, si, pos);
        if (k < nb) {
            if ((st = activate_chunk(L, pos))) return st;
            L->row_pos = k * s->batch;
            return PL_OK;
        }
        k -= nb;
    }
    L->exhausted = true; /* start == the number of batches: nothing left to serve */
    L->chunk_pos = L->nchunks - 1;
    return PL_OK;
}

int rows_next(loader *L, pl_batch *out) {
    split_data *s = &L->sp[L->cur_split];
    for (;;) {
        chunk_buf *b = &L->buf[L->cur_buf];
        int64_t left = b->rows - L->row_pos;
        /* drop_last: only the globally last partial batch is dropped; every chunk but the
         * last in row order is a multiple of the batch size */
        if (left > 0 && !(s->drop_last && left < s->batch)) break;
        if (L->chunk_pos + 1 >= L->nchunks) return 0;
        if (activate_chunk(L, L->chunk_pos + 1)) return -1;
    }
    chunk_buf *b = &L->buf[L->cur_buf];
    int64_t left = b->rows - L->row_pos;
    int64_t n = left < s->batch ? left : s->batch;
    /* global row index of the batch's first row (for resident extra fields) */
    int64_t g0 = L->order[L->chunk_pos] * L->cap + L->row_pos;
    for (int i = 0; i < s->nf; i++) {
        pl_tensor *v;
        if (s->shuffle) {
            if (lk_gather_rows("hdf5_rows", L->dev, L->gather[i], b->t[i], L->perm + L->row_pos,
                               L->perm_dev, L->row_pos, n, s->f[i].row_bytes))
                return -1;
            v = lk_view_rows(L->gather[i], 0, n);
        } else {
            v = lk_view_rows(b->t[i], L->row_pos, n);
        }
        if (lk_emit(&L->views, out, s->f[i].name, v)) return -1;
    }
    /* rows of the batch within the split (gathered extra fields, row_field) */
    int64_t base = L->order[L->chunk_pos] * L->cap;
    for (int64_t i = 0; i < n; i++)
        L->xidx[i] = s->shuffle ? base + L->perm[L->row_pos + i] : g0 + i;
    for (int i = 0; i < s->nx; i++) {
        pl_tensor *v;
        if (s->shuffle) {
            size_t rb = (size_t)(pl_tensor_numel(s->xt[i]) / s->xt[i]->shape[0]) *
                        pl_dtype_size(s->xt[i]->dtype);
            if (lk_gather_rows("hdf5_rows", L->dev, s->xg[i], s->xt[i], L->xidx, L->xperm_dev,
                               L->row_pos, n, rb))
                return -1;
            v = lk_view_rows(s->xg[i], 0, n);
        } else {
            v = lk_view_rows(s->xt[i], g0, n);
        }
        if (lk_emit(&L->views, out, s->xname[i], v)) return -1;
    }
    if (L->row_field[0] && /* rows_chunk_upload put them there */
        lk_emit(&L->views, out, L->row_field, lk_view_rows(L->rows_t, L->row_pos, n)))
        return -1;
    out->size = n;
    out->index = L->batch_index++;
    L->row_pos += n;
    return 1;
}

/* ---- batch fields -------------------------------------------------------- */

/* Add split si's field (name, dt, rank) to `out`: a name seen in an earlier
 * split must have the same dtype and rank; a field not carried by every split
 * present is declared for the splits that carry it (pl_field_spec.splits). */
static pl_status add_field(pl_field_list *out, int *seen, int si, const char *name, pl_dtype dt,
                           int rank, const char *path) {
    for (int i = 0; i < out->n; i++) {
        if (strcmp(out->f[i].name, name)) continue;
        if (out->f[i].dtype != dt || out->f[i].rank != rank)
            return pl_error_set(
                PL_ERR_CONFIG,
                "hdf5_rows: %s: batch field '%s' is %s rank %d in one split but %s "
                "rank %d in split '%s'; a field must have one dtype and rank (set "
                "convert = f32, or rewrite the dataset)",
                path, name, pl_dtype_name(out->f[i].dtype), out->f[i].rank, pl_dtype_name(dt), rank,
                pl_split_name((pl_data_split)si));
        seen[i] |= 1 << si;
        return PL_OK;
    }
    pl_status st = pl_fields_add(out, name, dt, rank, false);
    if (!st) seen[out->n - 1] = 1 << si;
    return st;
}

pl_status rows_batch_fields(const pl_config_section *cfg, pl_field_list *out) {
    const char *path = pl_cfg_str(cfg, "path", "");
    if (!path[0]) return pl_error_set(PL_ERR_CONFIG, "hdf5_rows: 'path' is empty");
    hid_t file;
    pl_status st = pl_h5_open_read(path, "run tools/prepare_data.sh", &file);
    if (st) return st;
    bool to_f32 = !strcmp(pl_cfg_str(cfg, "convert", "none"), "f32");
    const char *hist = pl_cfg_str(cfg, "history", "");
    bool fractions = pl_cfg_str(cfg, "split_fractions", "")[0] != 0;
    split_data *s = calloc(1, sizeof *s);
    int seen[PL_FIELDS_MAX] = {0}, present = 0;
    if (!s) st = pl_error_set(PL_ERR_NOMEM, "hdf5_rows: out of memory");
    for (int si = 0; si < PL_SPLIT_COUNT && !st; si++) {
        const char *group, *key, *spec;
        split_source(cfg, si, &group, &key, &spec);
        if (!fractions && !pl_h5_exists(file, group)) {
            if (si == PL_SPLIT_TRAIN)
                st = pl_error_set(PL_ERR_IO, "%s: train group '%s' not found", path, group);
            continue; /* an absent val/test group: an empty split, no batch */
        }
        memset(s, 0, sizeof *s);
        if ((st = parse_fields(key, spec, s)) ||
            (st = open_split(path, file, s, group, to_f32, false))) {
            close_split(s);
            break;
        }
        close_split(s);
        present |= 1 << si;
        for (int i = 0; i < s->nf && !st; i++)
            st = add_field(out, seen, si, s->f[i].name, s->f[i].dt, s->f[i].ndim, path);
        if (!st && hist[0] && si != PL_SPLIT_TRAIN && !fractions) {
            char g[NAME_LEN];
            lk_join_path(g, sizeof g, group, hist);
            if (pl_h5_exists(file, g)) st = add_field(out, seen, si, hist, PL_I32, 2, path);
        }
    }
    const char *rf = pl_cfg_str(cfg, "row_field", "");
    for (int si = 0; si < PL_SPLIT_COUNT && !st && rf[0]; si++)
        if (present & (1 << si)) st = add_field(out, seen, si, rf, PL_I64, 1, path);
    if (!st && pl_cfg_str(cfg, "teacher_outputs", "")[0]) {
        /* the teacher file may not exist yet (its run comes first): ranks are fixed */
        st = add_field(out, seen, PL_SPLIT_TRAIN, "kd_ids", PL_I32, 3, path);
        if (!st) st = add_field(out, seen, PL_SPLIT_TRAIN, "kd_logits", PL_F32, 3, path);
        if (!st) st = add_field(out, seen, PL_SPLIT_TRAIN, "kd_lognorm", PL_F32, 2, path);
    }
    for (int i = 0; i < out->n && !st; i++)
        out->f[i].splits = seen[i] == present ? 0u : (unsigned)seen[i];
    free(s);
    pl_status cst = pl_h5_close(path, file);
    return st ? st : cst;
}
