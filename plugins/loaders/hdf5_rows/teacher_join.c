/* teacher_join.c - hdf5_rows: a teacher's exported outputs
 * (models/ilora teacher_export.c layout) joined to the training rows, served
 * as knowledge-distillation targets (option `teacher_outputs`).
 *
 * The teacher file holds, per labelled training position, the teacher's
 * top-K items and their logits / T plus the log-normalizer over all items,
 * in the order the teacher's loader gave them, with a copy of every row
 * (/train/input_ids, /train/labels) and its row in the data file
 * (/train/source_row). The join puts position (source_row, pos) of each
 * exported entry into three resident train-split fields:
 *
 *   kd_ids     i32 [N, L, K]  teacher's top-K items (0 where no label)
 *   kd_logits  f32 [N, L, K]  their logits / T, best first
 *   kd_lognorm f32 [N, L]     logsumexp over every item of logits / T
 *
 * (N train rows of the data file, L positions, K = teacher_top_k or the
 * file's K). A shuffled batch gathers them with its rows. The join is
 * refused, naming both files and the first mismatching row, when a teacher
 * row's source_row is outside the data, two teacher rows name the same data
 * row, a data row has no teacher row, a row's input_ids or labels differ from
 * the data file's, or an exported position's label is not the data's.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hdf5_rows.h"

typedef struct teacher_file {
    int64_t rows, L, P, K; /* rows of /train/input_ids, their length, positions, K in the file */
    int32_t *in, *lab, *src, *row, *pos, *label, *ids;
    float *logits, *lognorm;
} teacher_file;

static void teacher_free(teacher_file *t) {
    free(t->in);
    free(t->lab);
    free(t->src);
    free(t->row);
    free(t->pos);
    free(t->label);
    free(t->ids);
    free(t->logits);
    free(t->lognorm);
}

static pl_status read_teacher(const char *tp, hid_t f, teacher_file *t) {
    pl_h5_info a, b;
    pl_status st = pl_h5_read_alloc(tp, f, "/train/input_ids", H5T_NATIVE_INT32, 2, 2, NULL,
                                    (void **)&t->in, &a);
    if (st) return st;
    t->rows = a.dims[0];
    t->L = a.dims[1];
    int64_t rl[2] = {t->rows, t->L}, r1[1] = {t->rows};
    if ((st = pl_h5_read_alloc(tp, f, "/train/labels", H5T_NATIVE_INT32, 2, 2, rl, (void **)&t->lab,
                               NULL)) ||
        (st = pl_h5_read_alloc(tp, f, "/train/source_row", H5T_NATIVE_INT32, 1, 1, r1,
                               (void **)&t->src, NULL)) ||
        (st = pl_h5_read_alloc(tp, f, "/train/topk_ids", H5T_NATIVE_INT32, 2, 2, NULL,
                               (void **)&t->ids, &b)))
        return st;
    t->P = b.dims[0];
    t->K = b.dims[1];
    int64_t pk[2] = {t->P, t->K}, p1[1] = {t->P};
    if ((st = pl_h5_read_alloc(tp, f, "/train/topk_logits", H5T_NATIVE_FLOAT, 2, 2, pk,
                               (void **)&t->logits, NULL)) ||
        (st = pl_h5_read_alloc(tp, f, "/train/row", H5T_NATIVE_INT32, 1, 1, p1, (void **)&t->row,
                               NULL)) ||
        (st = pl_h5_read_alloc(tp, f, "/train/pos", H5T_NATIVE_INT32, 1, 1, p1, (void **)&t->pos,
                               NULL)) ||
        (st = pl_h5_read_alloc(tp, f, "/train/label", H5T_NATIVE_INT32, 1, 1, p1,
                               (void **)&t->label, NULL)))
        return st;
    if (!pl_h5_exists(f, "/train/lognorm")) {
        pl_hint_set("the file predates the log-normalizer export: run the teacher's export again "
                    "(pipeline run configs/teacher.ini with a newer build)");
        return pl_error_set(PL_ERR_INVALID,
                            "%s: no /train/lognorm (the teacher's log-normalizer "
                            "over all items, needed for distillation targets)",
                            tp);
    }
    return pl_h5_read_alloc(tp, f, "/train/lognorm", H5T_NATIVE_FLOAT, 1, 1, p1,
                            (void **)&t->lognorm, NULL);
}

/* The train split's field named `name` read whole as i32 [nrows, L]. */
static pl_status read_data_field(loader *L, const char *name, int32_t **out, int64_t *len) {
    split_data *s = &L->sp[PL_SPLIT_TRAIN];
    for (int i = 0; i < s->nf; i++) {
        if (strcmp(s->f[i].name, name)) continue;
        if (s->f[i].ndim != 2)
            return pl_error_set(PL_ERR_SHAPE,
                                "%s: '%s' must be [rows, L] to join teacher "
                                "outputs",
                                L->path, s->f[i].dset);
        *len = s->f[i].dims[1];
        *out = malloc(sizeof **out * (size_t)(s->nrows * *len) + 1);
        if (!*out) return pl_error_set(PL_ERR_NOMEM, "hdf5_rows: out of memory");
        return pl_h5_read_rows(L->path, s->f[i].dset, s->ds[i], H5T_NATIVE_INT32, s->row0, s->nrows,
                               *out);
    }
    return pl_error_set(PL_ERR_CONFIG,
                        "hdf5_rows: teacher_outputs needs a train field '%s' "
                        "(datasets) to match the teacher's rows against",
                        name);
}

/* A CPU tensor as a resident extra field of the train split (on the device). */
static pl_status add_extra(loader *L, const char *name, pl_tensor *host) {
    split_data *s = &L->sp[PL_SPLIT_TRAIN];
    pl_tensor *t = host;
    if (!pl_device_eq(L->dev, PL_CPU)) {
        t = lk_new_tensor(host->dtype, host->ndim, host->shape, L->dev);
        if (!t || pl_tensor_copy_(t, host)) {
            pl_tensor_release(t);
            pl_tensor_release(host);
            return pl_error_status();
        }
        pl_tensor_release(host);
    }
    if (s->nx >= MAX_EXTRA) {
        pl_tensor_release(t);
        return pl_error_set(PL_ERR_CONFIG, "hdf5_rows: more than %d extra fields", MAX_EXTRA);
    }
    snprintf(s->xname[s->nx], sizeof s->xname[0], "%s", name);
    s->xt[s->nx++] = t;
    return PL_OK;
}

/* Check the teacher rows against the data rows and fill the dense targets. */
static pl_status join(loader *L, const char *tp, const teacher_file *t, const int32_t *din,
                      const int32_t *dlab, int64_t Ld, int64_t K, int32_t *kid, float *klg,
                      float *kln) {
    const split_data *s = &L->sp[PL_SPLIT_TRAIN];
    const char *dp = L->path;
    int64_t N = s->nrows;
    if (t->L != Ld)
        return pl_error_set(PL_ERR_SHAPE,
                            "teacher outputs %s: rows of %lld positions, %s: rows "
                            "of %lld",
                            tp, (long long)t->L, dp, (long long)Ld);
    int64_t *of = malloc(sizeof *of * (size_t)N + 1); /* data row -> teacher row */
    unsigned char *got = calloc((size_t)(N * Ld) + 1, 1);
    pl_status st = PL_OK;
    if (!of || !got) st = pl_error_set(PL_ERR_NOMEM, "hdf5_rows: out of memory");
    for (int64_t i = 0; !st && i < N; i++)
        of[i] = -1;
    for (int64_t r = 0; !st && r < t->rows; r++) {
        int64_t sr = t->src[r];
        if (sr < 0 || sr >= N) {
            if (sr < 0)
                pl_hint_set("export the teacher with the loader's row_field = row, so each "
                            "exported row records its row in the data file");
            st = pl_error_set(PL_ERR_INVALID,
                              "teacher outputs %s row %lld: source_row %lld is "
                              "not a train row of %s (%lld rows)",
                              tp, (long long)r, (long long)sr, dp, (long long)N);
            break;
        }
        if (of[sr] >= 0) {
            st = pl_error_set(PL_ERR_INVALID,
                              "teacher outputs %s rows %lld and %lld both claim "
                              "train row %lld of %s",
                              tp, (long long)of[sr], (long long)r, (long long)sr, dp);
            break;
        }
        of[sr] = r;
        for (int64_t p = 0; p < Ld; p++) {
            const char *what = NULL;
            int64_t a = 0, b = 0;
            if (t->in[r * Ld + p] != din[sr * Ld + p]) {
                what = "input_ids";
                a = t->in[r * Ld + p];
                b = din[sr * Ld + p];
            } else if (t->lab[r * Ld + p] != dlab[sr * Ld + p]) {
                what = "labels";
                a = t->lab[r * Ld + p];
                b = dlab[sr * Ld + p];
            }
            if (what) {
                st = pl_error_set(PL_ERR_INVALID,
                                  "teacher outputs %s row %lld (source_row %lld) "
                                  "does not match %s train row %lld: %s position %lld is %lld "
                                  "in the teacher outputs, %lld in the data",
                                  tp, (long long)r, (long long)sr, dp, (long long)sr, what,
                                  (long long)p, (long long)a, (long long)b);
                break;
            }
        }
    }
    for (int64_t i = 0; !st && i < N; i++)
        if (of[i] < 0)
            st = pl_error_set(PL_ERR_INVALID,
                              "teacher outputs %s have no row for train row %lld "
                              "of %s (%lld teacher rows, %lld data rows): the teacher was "
                              "exported from other data",
                              tp, (long long)i, dp, (long long)t->rows, (long long)N);
    for (int64_t q = 0; !st && q < t->P; q++) {
        int64_t r = t->row[q], p = t->pos[q];
        if (r < 0 || r >= t->rows || p < 0 || p >= Ld) {
            st = pl_error_set(PL_ERR_INVALID,
                              "teacher outputs %s position entry %lld: row %lld, "
                              "pos %lld outside [%lld rows, %lld positions]",
                              tp, (long long)q, (long long)r, (long long)p, (long long)t->rows,
                              (long long)Ld);
            break;
        }
        int64_t sr = t->src[r], d = sr * Ld + p;
        if (t->label[q] == 0 || t->label[q] != dlab[d]) {
            st = pl_error_set(PL_ERR_INVALID,
                              "teacher outputs %s position entry %lld (row %lld, "
                              "pos %lld) has label %lld; %s train row %lld position %lld has "
                              "label %lld",
                              tp, (long long)q, (long long)r, (long long)p, (long long)t->label[q],
                              dp, (long long)sr, (long long)p, (long long)dlab[d]);
            break;
        }
        got[d] = 1;
        memcpy(kid + d * K, t->ids + q * t->K, sizeof *kid * (size_t)K);
        memcpy(klg + d * K, t->logits + q * t->K, sizeof *klg * (size_t)K);
        kln[d] = t->lognorm[q];
    }
    for (int64_t d = 0; !st && d < N * Ld; d++)
        if (dlab[d] != 0 && !got[d])
            st = pl_error_set(PL_ERR_INVALID,
                              "teacher outputs %s have no targets for %s train "
                              "row %lld position %lld (label %lld)",
                              tp, dp, (long long)(d / Ld), (long long)(d % Ld), (long long)dlab[d]);
    free(of);
    free(got);
    return st;
}

pl_status rw_teacher_join(loader *L, const char *tp, int64_t top_k) {
    split_data *s = &L->sp[PL_SPLIT_TRAIN];
    teacher_file t = {0};
    int32_t *din = NULL, *dlab = NULL;
    int64_t Ld = 0, Ll = 0;
    hid_t f = H5I_INVALID_HID;
    pl_tensor *tid = NULL, *tlg = NULL, *tln = NULL;
    pl_status st = pl_h5_open_read(tp, "run the teacher (pipeline run configs/teacher.ini)", &f);
    if (!st) st = read_teacher(tp, f, &t);
    double T = 1;
    int64_t ni = 0, dni = 0;
    bool found = false;
    if (!st) st = pl_h5_attr_read_double(tp, f, "temperature", &T, &found);
    if (!st && !found) st = pl_error_set(PL_ERR_INVALID, "%s: no root attribute 'temperature'", tp);
    if (!st) st = pl_h5_attr_read_int(tp, f, "num_items", &ni, &found);
    if (!st && found && L->ctx && L->ctx->meta) {
        if (pl_meta_get_int(L->ctx->meta, "num_items", &dni))
            pl_error_clear(); /* a data file without the attribute: nothing to compare */
        else if (dni != ni)
            st = pl_error_set(PL_ERR_INVALID,
                              "teacher outputs %s: num_items %lld, %s: num_items "
                              "%lld",
                              tp, (long long)ni, L->path, (long long)dni);
    }
    if (f > 0) {
        pl_status cs = pl_h5_close(tp, f);
        if (!st) st = cs;
    }
    /* the file is untrusted: every teacher item must be an item (1..num_items), checked
     * once here so that the model's distillation term reads them on the device as they are */
    int64_t max_item = found ? ni : INT32_MAX;
    for (int64_t i = 0; !st && i < t.P * t.K; i++)
        if (t.ids[i] < 1 || t.ids[i] > max_item)
            st = pl_error_set(PL_ERR_INVALID,
                              "%s: /train/topk_ids[%lld][%lld] = %d is not an item (expected 1..%lld)",
                              tp, (long long)(i / t.K), (long long)(i % t.K), t.ids[i],
                              (long long)max_item);
    if (!st) st = read_data_field(L, "input_ids", &din, &Ld);
    if (!st) st = read_data_field(L, "labels", &dlab, &Ll);
    int64_t K = top_k > 0 ? top_k : t.K;
    if (!st && K > t.K)
        st = pl_error_set(PL_ERR_CONFIG,
                          "hdf5_rows: teacher_top_k = %lld but %s holds %lld "
                          "items per position",
                          (long long)K, tp, (long long)t.K);
    if (!st) {
        tid = lk_new_tensor(PL_I32, 3, (int64_t[]){s->nrows, Ld, K}, PL_CPU);
        tlg = lk_new_tensor(PL_F32, 3, (int64_t[]){s->nrows, Ld, K}, PL_CPU);
        tln = lk_new_tensor(PL_F32, 2, (int64_t[]){s->nrows, Ld}, PL_CPU);
        if (!tid || !tlg || !tln) st = pl_error_status();
    }
    if (!st) {
        memset(pl_tensor_data(tid), 0, sizeof(int32_t) * (size_t)(s->nrows * Ld * K));
        memset(pl_tensor_data(tlg), 0, sizeof(float) * (size_t)(s->nrows * Ld * K));
        memset(pl_tensor_data(tln), 0, sizeof(float) * (size_t)(s->nrows * Ld));
        st = join(L, tp, &t, din, dlab, Ld, K, pl_tensor_data(tid), pl_tensor_data(tlg),
                  pl_tensor_data(tln));
    }
    if (!st) {
        st = add_extra(L, "kd_ids", tid);
        tid = NULL;
        if (!st) st = add_extra(L, "kd_logits", tlg);
        tlg = NULL;
        if (!st) st = add_extra(L, "kd_lognorm", tln);
        tln = NULL;
    }
    if (!st) {
        lk_meta_float(L->ctx, "teacher_temperature", T);
        lk_meta_int(L->ctx, "teacher_top_k", K);
    }
    pl_tensor_release(tid);
    pl_tensor_release(tlg);
    pl_tensor_release(tln);
    teacher_free(&t);
    free(din);
    free(dlab);
    return st;
}
