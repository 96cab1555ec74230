/* bench_infer.c - full-ranking inference time of an ilora model (student or
 * teacher) from a run's best checkpoint, in process. The model is built from
 * the run's [model] section (validated by the plugin's schema through
 * pl_harness) with the plugin's own sources (ilora.h), its weights loaded by
 * name, and the test split's users are ranked over every item, `reps` passes
 * after one warm-up, in eval batches, two ways:
 *
 *   eval     the model's forward on test batches (what `pipeline run` tests:
 *            the last position's hidden state (ilora_last_hidden: keys and
 *            values of every position, the last layer's queries, attention
 *            output and MLP for the last position only), logits over all
 *            items, the cross-entropy reported as val/test loss, seen items
 *            excluded, rank of the target);
 *   serving  what a recommender serves: the same hidden state and logits,
 *            seen items excluded, top 10 (no loss, no target). Its logits
 *            are checked against the full forward's last position
 *            (ilora_hidden, every position through every layer: max |diff|)
 *            and its HR@10 / NDCG@10 (target in the top 10) against the
 *            eval's.
 *
 * Prints one JSON line: parameters, seconds per 1,000 users of each path
 * (median, min, max over the passes), the metrics and the logits check.
 *
 *   bench_infer MODEL_BODY.ini CHECKPOINT DATA.h5 BATCH REPS PLUGIN_DIR
 */
#include <hdf5.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <math.h>

#include <pipeline/pipeline.h>
#include <pipeline/testing.h>

#include "ilora.h"
#include "ranking.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void *read_all(hid_t f, const char *name, hid_t type, size_t esz, hsize_t *dims) {
    hid_t d = H5Dopen2(f, name, H5P_DEFAULT);
    if (d < 0) {
        fprintf(stderr, "no dataset %s\n", name);
        exit(1);
    }
    hid_t sp = H5Dget_space(d);
    int nd = H5Sget_simple_extent_ndims(sp);
    hsize_t dd[2] = {1, 1};
    H5Sget_simple_extent_dims(sp, dd, NULL);
    if (dims) memcpy(dims, dd, sizeof dd);
    size_t n = (size_t)dd[0] * (nd > 1 ? (size_t)dd[1] : 1);
    void *buf = malloc(n * esz + 1);
    H5Dread(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf);
    H5Sclose(sp);
    H5Dclose(d);
    return buf;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    if (argc != 7) {
        fprintf(stderr, "usage: bench_infer MODEL_BODY.ini CHECKPOINT DATA.h5 BATCH REPS "
                        "PLUGIN_DIR\n");
        return 2;
    }
    FILE *bf = fopen(argv[1], "r");
    if (!bf) return 2;
    static char body[65536];
    size_t bn = fread(body, 1, sizeof body - 1, bf);
    body[bn] = 0;
    fclose(bf);
    int64_t batch = atoll(argv[4]);
    int reps = atoi(argv[5]);

    hid_t f = H5Fopen(argv[3], H5F_ACC_RDONLY, H5P_DEFAULT);
    if (f < 0) return 2;
    hsize_t di[2], dh[2];
    int32_t *ids = read_all(f, "/test/input_ids", H5T_NATIVE_INT32, 4, di);
    int32_t *tg = read_all(f, "/test/target", H5T_NATIVE_INT32, 4, NULL);
    int64_t *off = read_all(f, "/test/history/offsets", H5T_NATIVE_INT64, 8, NULL);
    int32_t *items = read_all(f, "/test/history/items", H5T_NATIVE_INT32, 4, dh);
    int64_t num_items = 0;
    hid_t a = H5Aopen(f, "num_items", H5P_DEFAULT);
    H5Aread(a, H5T_NATIVE_INT64, &num_items);
    H5Aclose(a);
    H5Fclose(f);
    int64_t U = (int64_t)di[0], L = (int64_t)di[1], H = 1;
    for (int64_t u = 0; u < U; u++)
        if (off[u + 1] - off[u] > H) H = off[u + 1] - off[u];
    int32_t *hist = calloc((size_t)(U * H), sizeof *hist); /* padded as hdf5_rows' `history` */
    for (int64_t u = 0; u < U; u++)
        memcpy(hist + u * H, items + off[u], sizeof *hist * (size_t)(off[u + 1] - off[u]));

    pl_harness *h = pl_harness_new_in(argv[6], "model", "ilora", body);
    if (!h) {
        fprintf(stderr, "model: %s\n", pl_error_message());
        return 1;
    }
    pl_run_context *ctx = pl_harness_ctx(h);
    pl_meta_set_int(ctx->meta, "num_items", num_items);
    ilora_opts o;
    ilora_model *m = NULL;
    if (ilora_opts_read(pl_harness_section(h), &o) || ilora_model_create(&o, ctx, &m)) {
        fprintf(stderr, "create: %s\n", pl_error_message());
        return 1;
    }
    if (o.backbone[0] || o.layers < 1) {
        fprintf(stderr, "bench_infer: built-in backbones only\n");
        return 1;
    }
    pl_st_file *ck = NULL;
    if (pl_st_open(argv[2], &ck)) {
        fprintf(stderr, "%s\n", pl_error_message());
        return 1;
    }
    int64_t params = 0;
    for (int i = 0; i < pl_params_count(ctx->params); i++) {
        pl_param *p = pl_params_at(ctx->params, i);
        if (pl_st_load_into(ck, p->name, p->t)) {
            fprintf(stderr, "%s: %s\n", p->name, pl_error_message());
            return 1;
        }
        params += pl_tensor_numel(p->t);
    }
    pl_st_close(ck);
    double *secs = malloc(sizeof *secs * (size_t)(reps + 1));
    double *ssecs = malloc(sizeof *ssecs * (size_t)(reps + 1));
    double hr = 0, ndcg = 0, shr = 0, sndcg = 0, maxdiff = 0;
    int64_t V = m->vocab;
    float *row = malloc(sizeof *row * (size_t)V);
    int32_t top[10];
    float topv[10];
    for (int r = 0; r <= reps; r++) { /* pass 0: warm-up */
        pl_metrics mt;
        pl_metrics_reset(&mt);
        double t0 = now();
        pl_no_grad_begin();
        for (int64_t b0 = 0; b0 < U; b0 += batch) {
            int64_t B = U - b0 < batch ? U - b0 : batch;
            pl_frame_begin();
            pl_tensor *ti = pl_tensor_from_data(PL_I32, 2, (int64_t[]){B, L}, ids + b0 * L, PL_CPU);
            pl_tensor *tt = pl_tensor_from_data(PL_I32, 1, (int64_t[]){B}, tg + b0, PL_CPU);
            pl_tensor *th =
                pl_tensor_from_data(PL_I32, 2, (int64_t[]){B, H}, hist + b0 * H, PL_CPU);
            pl_batch bt = {.n = 3,
                           .names = {"input_ids", "target", "history"},
                           .fields = {ti, tt, th},
                           .size = B,
                           .index = b0 / batch};
            pl_tensor *loss = NULL;
            if (ilora_forward(m, &bt, PL_SPLIT_TEST, false, &loss, &mt)) {
                fprintf(stderr, "forward: %s\n", pl_error_message());
                return 1;
            }
            pl_frame_end();
        }
        pl_no_grad_end();
        secs[r] = now() - t0;
        for (int i = 0; i < mt.n; i++) {
            if (!strcmp(mt.name[i], "hit_ratio@10")) hr = mt.sum[i] / mt.count[i];
            if (!strcmp(mt.name[i], "ndcg@10")) ndcg = mt.sum[i] / mt.count[i];
        }
        /* serving: last-position logits, seen items out, top 10 */
        double hits = 0, gains = 0;
        t0 = now();
        pl_no_grad_begin();
        for (int64_t b0 = 0; b0 < U; b0 += batch) {
            int64_t B = U - b0 < batch ? U - b0 : batch;
            pl_frame_begin();
            pl_tensor *ti = pl_tensor_from_data(PL_I32, 2, (int64_t[]){B, L}, ids + b0 * L, PL_CPU);
            pl_tensor *lg = ilora_logits(m, ilora_last_hidden(m, ti)); /* [B, V] */
            if (!lg) {
                fprintf(stderr, "serving: %s\n", pl_error_message());
                return 1;
            }
            const float *z = pl_tensor_f32(lg);
            for (int64_t i = 0; i < B; i++) {
                int64_t u = b0 + i;
                memcpy(row, z + i * V, sizeof *row * (size_t)V);
                row[0] = -INFINITY;
                for (int64_t j = off[u]; j < off[u + 1]; j++)
                    if (items[j] != tg[u]) row[items[j]] = -INFINITY;
                ilora_topk(row, V, 10, top, topv);
                for (int k = 0; k < 10; k++)
                    if (top[k] == tg[u]) {
                        hits += 1;
                        gains += 1.0 / log2(k + 2.0);
                    }
            }
            if (r == 0) { /* the serving logits are the full forward's */
                pl_tensor *full = ilora_logits(m, ilora_hidden(m, ti, false)); /* [B, L, V] */
                const float *zf = pl_tensor_f32(full);
                for (int64_t i = 0; i < B; i++)
                    for (int64_t v = 0; v < V; v++)
                        maxdiff = fmax(maxdiff, fabs(zf[(i * L + L - 1) * V + v] - z[i * V + v]));
            }
            pl_frame_end();
        }
        pl_no_grad_end();
        ssecs[r] = now() - t0;
        shr = hits / (double)U;
        sndcg = gains / (double)U;
    }
    double st[2][3];
    for (int w = 0; w < 2; w++) {
        double *per = (w ? ssecs : secs) + 1;
        for (int r = 0; r < reps; r++)
            per[r] = per[r] / (double)U * 1000.0;
        qsort(per, (size_t)reps, sizeof *per, cmp);
        st[w][0] = reps % 2 ? per[reps / 2] : 0.5 * (per[reps / 2 - 1] + per[reps / 2]);
        st[w][1] = per[0];
        st[w][2] = per[reps - 1];
    }
    printf("{\"parameters\": %lld, \"users\": %lld, \"batch\": %lld, \"repeats\": %d, "
           "\"eval\": {\"s_per_1000_users_median\": %.6f, \"s_per_1000_users_min\": %.6f, "
           "\"s_per_1000_users_max\": %.6f, \"hit_ratio@10\": %.6f, \"ndcg@10\": %.6f}, "
           "\"serving\": {\"s_per_1000_users_median\": %.6f, \"s_per_1000_users_min\": %.6f, "
           "\"s_per_1000_users_max\": %.6f, \"hit_ratio@10\": %.6f, \"ndcg@10\": %.6f, "
           "\"max_abs_logit_diff\": %.3g}}\n",
           (long long)params, (long long)U, (long long)batch, reps, st[0][0], st[0][1], st[0][2],
           hr, ndcg, st[1][0], st[1][1], st[1][2], shr, sndcg, maxdiff);
    ilora_model_destroy(m);
    pl_harness_free(h);
    return 0;
}
