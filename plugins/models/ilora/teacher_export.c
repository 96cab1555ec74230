/* teacher_export.c - the ilora model's teacher outputs (teacher_export.h):
 * every train/val/test batch's top-K logits, named as model outputs
 * (plugin.h pl_outputs, PL_OUTPUTS_EXPORT) that the run writes to its
 * outputs/ directory; the layout below is ilora's, the file writing is the
 * run's (libpipeline_hdf5, pl_h5_outputs_*).
 *
 * Export layout of OUTPUTS/teacher_outputs.h5 (K = export_top_k, L = max_len):
 *   /train/input_ids   i32 [N_rows, L]  the training rows in the order the loader
 *   /train/labels      i32 [N_rows, L]  gave them (copies, so the file stands alone
 *                                       whatever the loader's shuffling)
 *   /train/source_row  i32 [N_rows]     row of the data file's /train/input_ids when the
 *                                       batch has the `row_field` field, else -1
 *   /train/topk_ids    i32 [N_pos, K]   best K item ids per labelled training position
 *   /train/topk_logits f32 [N_pos, K]   their logits / T, descending
 *   /train/lognorm     f32 [N_pos]      log-normalizer over every item 1..N of logits / T:
 *                                       logsumexp_i (z_i / T), so the teacher's softened
 *                                       probability of item k is exp(topk_logit - lognorm)
 *                                       and 1 - sum_k of them is the mass beyond the top K
 *   /train/row         i32 [N_pos]      row of /train/input_ids OF THIS FILE
 *   /train/pos         i32 [N_pos]      position 0..L-1 within the row
 *   /train/label       i32 [N_pos]      the true next item at that position
 *   /val|test/topk_ids, topk_logits     [U, K] for the last position of each user row
 *   /val|test/lognorm  f32 [U]          as /train/lognorm, for that position
 *   /val|test/user     i32 [U]          user index (batch field `user_field`, else the
 *                                       running row number)
 *   /val|test/target   i32 [U]          held-out item (0 if the batch has none)
 * Root attributes: temperature (T), top_k, num_items, num_experts, adapters, model.
 * Every dataset is declared in outputs_begin (so a split without rows still
 * has its datasets, of 0 rows), chunked and extendible (H5S_UNLIMITED rows),
 * and grows per batch. The padding id 0 is never exported; history items are NOT removed
 * (these are the model's raw preferences, for distillation).
 */
#include "teacher_export.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ilora.h"
#include "pl_h5.h"
#include "ranking.h"

static int64_t export_k(const ilora_model *m) {
    return m->o.export_top_k < m->vocab - 1 ? m->o.export_top_k : m->vocab - 1;
}

/* "train/topk_ids" */
static pl_status add(pl_outputs *out, pl_data_split s, const char *name, pl_tensor *t) {
    char full[PL_OUTPUTS_NAME_MAX];
    snprintf(full, sizeof full, "%s/%s", pl_split_name(s), name);
    return pl_outputs_add(out, full, t);
}

/* A dataset of 0 rows: its dtype and width (0: one value per row). */
static pl_status declare(pl_outputs *out, pl_data_split s, const char *name, pl_dtype dt,
                         int64_t width) {
    return add(out, s, name, pl_tensor_empty(dt, width > 0 ? 2 : 1, (int64_t[]){0, width}, PL_CPU));
}

pl_status ilora_teacher_begin(void *self, pl_outputs *out) {
    ilora_model *m = self;
    memset(m->export_rows, 0, sizeof m->export_rows);
    snprintf(out->file, sizeof out->file, "teacher_outputs.h5");
    int64_t K = export_k(m), L = m->o.max_len;
    pl_status st = PL_OK;
    for (int i = 0; i < PL_SPLIT_COUNT && !st; i++) {
        pl_data_split s = (pl_data_split)i;
        st = declare(out, s, "topk_ids", PL_I32, K);
        if (!st) st = declare(out, s, "topk_logits", PL_F32, K);
        if (!st) st = declare(out, s, "lognorm", PL_F32, 0);
        const char *one[] = {"row", "pos", "label", "source_row", "user", "target"};
        for (int k = s == PL_SPLIT_TRAIN ? 0 : 4; k < (s == PL_SPLIT_TRAIN ? 4 : 6) && !st; k++)
            st = declare(out, s, one[k], PL_I32, 0);
        if (!st && s == PL_SPLIT_TRAIN) st = declare(out, s, "input_ids", PL_I32, L);
        if (!st && s == PL_SPLIT_TRAIN) st = declare(out, s, "labels", PL_I32, L);
    }
    static const char *const ad[] = {"none", "lora", "moe_lora"};
    pl_meta *a = out->attrs;
    if (!st) st = pl_meta_set_float(a, "temperature", m->o.export_temperature);
    if (!st) st = pl_meta_set_int(a, "top_k", K);
    if (!st) st = pl_meta_set_int(a, "num_items", m->vocab - 1);
    if (!st) st = pl_meta_set_int(a, "num_experts", m->o.num_experts);
    if (!st) st = pl_meta_set_str(a, "adapters", ad[m->o.adapters]);
    if (!st) st = pl_meta_set_str(a, "model", "ilora");
    if (!st)
        st = pl_meta_set_str(a, "logits",
                             "topk_logits = model logits / temperature, best first; item 0 "
                             "(padding) never exported; history items not removed; lognorm = "
                             "logsumexp over items 1..num_items of logits / temperature");
    return st ? pl_error_prefix(st, "ilora export") : PL_OK;
}

/* Top-K of each row of logits [n, V] (host f32) with item 0 removed and / T,
 * and the row's log-normalizer logsumexp_{i >= 1} (z_i / T) (in double). */
static void topk_rows(const float *lg, int64_t n, int64_t V, int64_t K, double T, int32_t *ids,
                      float *vals, float *lognorm) {
#pragma omp parallel
    {
        float *row = malloc((size_t)V * sizeof *row);
#pragma omp for schedule(static)
        for (int64_t i = 0; i < n; i++) {
            if (!row) continue;
            memcpy(row, lg + i * V, (size_t)V * sizeof *row);
            row[0] = -INFINITY;
            ilora_topk(row, V, K, ids + i * K, vals + i * K);
            for (int64_t j = 0; j < K; j++)
                vals[i * K + j] = (float)(vals[i * K + j] / T);
            double mx = -INFINITY, sum = 0;
            for (int64_t v = 1; v < V; v++)
                if (row[v] / T > mx) mx = row[v] / T;
            for (int64_t v = 1; v < V; v++)
                sum += expf((float)(row[v] / T - mx));
            lognorm[i] = (float)(mx + log(sum));
        }
        free(row);
    }
}

/* The same on the logits' device (pl_topk, issue 35): one read of [n, 2K + 1]
 * f32 (the top-K logits, their item ids, exact below 2^24, and the row's
 * sum_{i >= 1} exp((z_i - max) / T)) instead of the [n, V] logits. The ids and
 * logits are the host path's bit for bit (the same order, the same / T in
 * double); lognorm = max / T + log(sum) in double differs from the host's by
 * the f32 rounding of the sum and the backend's exp (strict: at most 1 ulp). */
static pl_status topk_rows_device(pl_tensor *lg, int64_t n, int64_t V, int64_t K, double T,
                                  int32_t *ids, float *vals, float *lognorm) {
    pl_tensor *x = pl_tensor_to(pl_slice(lg, 1, 1, V), PL_F32, lg ? lg->device : PL_CPU), *v, *i;
    if (!x || pl_topk(x, K, &v, &i)) return pl_error_status();
    pl_tensor *d = pl_sub(x, pl_slice(v, 1, 0, 1));
    pl_tensor *s = pl_sum(pl_exp(T == 1.0 ? d : pl_scale(d, 1.0 / T)), 1, true);
    pl_tensor *all[3] = {v, pl_tensor_to(i, PL_F32, i->device), s};
    pl_tensor *h = pl_tensor_to(pl_concat(all, 3, 1), PL_F32, PL_CPU);
    if (!h) return pl_error_status();
    const float *r = pl_tensor_f32(h);
    for (int64_t a = 0; a < n; a++, r += 2 * K + 1) {
        for (int64_t j = 0; j < K; j++) {
            vals[a * K + j] = (float)(r[j] / T);
            ids[a * K + j] = (int32_t)r[K + j] + 1;
        }
        lognorm[a] = (float)(r[0] / T + log((double)r[2 * K]));
    }
    return PL_OK;
}

static pl_tensor *host_i64(pl_tensor *t) {
    return t ? pl_tensor_to(t, PL_I64, PL_CPU) : NULL;
}

/* n host i32 values (width 0: [n], else [n, width]) as a CPU tensor of the frame. */
static pl_tensor *rows_i32(const int32_t *v, int64_t n, int64_t width) {
    return pl_tensor_from_data(PL_I32, width > 0 ? 2 : 1, (int64_t[]){n, width}, v, PL_CPU);
}

static pl_tensor *rows_f32(const float *v, int64_t n, int64_t width) {
    return pl_tensor_from_data(PL_F32, width > 0 ? 2 : 1, (int64_t[]){n, width}, v, PL_CPU);
}

pl_status ilora_teacher_batch(void *self, const pl_batch *b, pl_data_split split,
                              pl_outputs *out) {
    ilora_model *m = self;
    pl_tensor *ids = pl_batch_find(b, m->o.input_field);
    if (!ids || ids->ndim != 2)
        return pl_error_set(PL_ERR_INVALID, "ilora export: batch has no [B, L] field '%s'",
                            m->o.input_field);
    int64_t B = ids->shape[0], L = ids->shape[1], V = m->vocab, K = export_k(m);
    pl_status st = PL_OK;
    pl_tensor *h = ilora_hidden(m, ids, false);
    if (!h) return pl_error_status();
    int64_t n = 0, *counter = &m->export_rows[split];
    int32_t *a = NULL, *bb = NULL, *c = NULL;
    pl_tensor *sel = NULL;
    if (split == PL_SPLIT_TRAIN) {
        pl_tensor *lab = host_i64(pl_batch_find(b, m->o.label_field));
        if (!lab || lab->ndim != 2 || lab->shape[0] != B || lab->shape[1] != L)
            return pl_error_set(PL_ERR_INVALID, "ilora export: train batch has no [B, L] field "
                                "'%s'", m->o.label_field);
        if (L != m->o.max_len)
            return pl_error_set(PL_ERR_SHAPE, "ilora export: train rows have %lld positions, "
                                "max_len is %lld (the export stores [rows, max_len])",
                                (long long)L, (long long)m->o.max_len);
        pl_tensor *src = host_i64(pl_batch_find(b, m->o.row_field));
        pl_tensor *idh = host_i64(ids);
        if (!idh) return pl_error_status();
        const int64_t *lv = pl_tensor_data(lab), *iv = pl_tensor_data(idh);
        int64_t *pos = malloc((size_t)(B * L) * sizeof *pos);
        a = malloc((size_t)(B * L) * sizeof *a);
        bb = malloc((size_t)(B * L) * sizeof *bb);
        c = malloc((size_t)(B * L) * sizeof *c);
        int32_t *cin = malloc((size_t)(B * L) * sizeof *cin);
        int32_t *clab = malloc((size_t)(B * L) * sizeof *clab);
        int32_t *csrc = malloc((size_t)B * sizeof *csrc);
        if (!pos || !a || !bb || !c || !cin || !clab || !csrc)
            st = pl_error_set(PL_ERR_NOMEM, "ilora export: out of memory");
        for (int64_t i = 0; !st && i < B * L; i++) {
            cin[i] = (int32_t)iv[i];
            clab[i] = (int32_t)lv[i];
            if (i % L == 0)
                csrc[i / L] = src ? (int32_t)((const int64_t *)pl_tensor_data(src))[i / L] : -1;
            if (lv[i] == 0) continue;
            a[n] = (int32_t)(*counter + i / L);
            bb[n] = (int32_t)(i % L);
            c[n] = (int32_t)lv[i];
            pos[n++] = i;
        }
        if (!st) st = add(out, split, "input_ids", rows_i32(cin, B, L));
        if (!st) st = add(out, split, "labels", rows_i32(clab, B, L));
        if (!st) st = add(out, split, "source_row", rows_i32(csrc, B, 0));
        free(cin);
        free(clab);
        free(csrc);
        *counter += B;
        if (!st && n > 0) {
            pl_tensor *pi = pl_tensor_from_data(PL_I64, 1, (int64_t[]){n}, pos, m->ctx->device);
            sel = pl_index_select(pl_reshape(h, 2, (int64_t[]){-1, m->o.dim}), 0, pi);
            if (!sel) st = pl_error_status();
        }
        free(pos);
    } else {
        n = B;
        pl_tensor *us = host_i64(pl_batch_find(b, m->o.user_field));
        pl_tensor *tg = host_i64(pl_batch_find(b, m->o.target_field));
        a = malloc((size_t)(B ? B : 1) * sizeof *a);
        bb = malloc((size_t)(B ? B : 1) * sizeof *bb);
        if (!a || !bb) st = pl_error_set(PL_ERR_NOMEM, "ilora export: out of memory");
        for (int64_t i = 0; !st && i < B; i++) {
            a[i] = (int32_t)(us ? ((const int64_t *)pl_tensor_data(us))[i] : *counter + i);
            bb[i] = tg ? (int32_t)((const int64_t *)pl_tensor_data(tg))[i] : 0;
        }
        *counter += B;
        if (!st) {
            sel = pl_reshape(pl_slice(h, 1, L - 1, L), 2, (int64_t[]){B, m->o.dim});
            if (!sel) st = pl_error_status();
        }
    }
    int32_t *tids = NULL;
    float *tvals = NULL, *tnorm = NULL;
    if (!st && n > 0) {
        /* on the CPU the host path (no copy, and the lognorm of before); elsewhere the
         * top-K on the device: [n, V] logits no longer cross (issue 35) */
        bool dev = m->ctx->device.type != PL_DEVICE_CPU && !getenv("PL_ILORA_EXPORT_HOST_TOPK");
        pl_tensor *lg = ilora_logits(m, sel);
        if (lg && !dev) lg = pl_tensor_to(lg, PL_F32, PL_CPU);
        tids = malloc((size_t)(n * K) * sizeof *tids);
        tvals = malloc((size_t)(n * K) * sizeof *tvals);
        tnorm = malloc((size_t)n * sizeof *tnorm);
        if (!lg) st = pl_error_status();
        else if (!tids || !tvals || !tnorm)
            st = pl_error_set(PL_ERR_NOMEM, "ilora export: out of memory");
        else if (dev && (st = topk_rows_device(lg, n, V, K, m->o.export_temperature, tids,
                                               tvals, tnorm)) == PL_ERR_UNSUPPORTED) {
            pl_error_clear(); /* a backend without topk (before ABI 2.12): the host path */
            dev = false;
            st = (lg = pl_tensor_to(lg, PL_F32, PL_CPU)) ? PL_OK : pl_error_status();
        }
        if (!st && lg && !dev)
            topk_rows(pl_tensor_f32(lg), n, V, K, m->o.export_temperature, tids, tvals, tnorm);
    }
    bool tr = split == PL_SPLIT_TRAIN;
    if (!st && n > 0) { /* a train batch without labelled positions: no rows */
        st = add(out, split, "topk_ids", rows_i32(tids, n, K));
        if (!st) st = add(out, split, "topk_logits", rows_f32(tvals, n, K));
        if (!st) st = add(out, split, "lognorm", rows_f32(tnorm, n, 0));
        if (!st) st = add(out, split, tr ? "row" : "user", rows_i32(a, n, 0));
        if (!st) st = add(out, split, tr ? "pos" : "target", rows_i32(bb, n, 0));
        if (!st && tr) st = add(out, split, "label", rows_i32(c, n, 0));
    }
    free(a);
    free(bb);
    free(c);
    free(tids);
    free(tvals);
    free(tnorm);
    return st;
}

/* ---- the file on its own (the unit tests: the run writes it in outputs.c) ---- */

pl_status ilora_export_begin(void *self, const char *outputs_dir) {
    ilora_model *m = self;
    ilora_export_abort(m);
    pl_outputs out;
    memset(&out, 0, sizeof out);
    out.attrs = pl_meta_new();
    char path[4096];
    pl_frame_begin();
    pl_status st = out.attrs ? ilora_teacher_begin(m, &out) : pl_error_status();
    if (!st) snprintf(path, sizeof path, "%s/%s", outputs_dir, out.file);
    if (!st) st = pl_h5_outputs_open(path, &out, &m->exp_file);
    pl_frame_end();
    pl_meta_free(out.attrs);
    return st ? pl_error_prefix(st, "ilora export") : PL_OK;
}

pl_status ilora_export_batch(void *self, const pl_batch *b, pl_data_split split) {
    ilora_model *m = self;
    if (!m->exp_file) return pl_error_set(PL_ERR_INVALID, "ilora: export_batch before export_begin");
    pl_outputs out;
    out.n = 0;
    out.attrs = NULL;
    pl_frame_begin();
    pl_status st = ilora_teacher_batch(m, b, split, &out);
    if (!st) st = pl_h5_outputs_write(m->exp_file, &out);
    pl_frame_end();
    return st;
}

pl_status ilora_export_end(void *self) {
    ilora_model *m = self;
    if (!m->exp_file) return PL_OK;
    pl_status st = pl_h5_outputs_commit(&m->exp_file);
    return st ? pl_error_prefix(st, "ilora export") : PL_OK;
}

void ilora_export_abort(void *self) {
    ilora_model *m = self;
    pl_h5_outputs_abandon(&m->exp_file);
}
