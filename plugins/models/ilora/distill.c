/* distill.c - knowledge distillation term of the ilora model (distill.h):
 * the student's temperature-softened distribution against the teacher's
 * exported top-K targets (batch fields kd_ids, kd_logits, kd_lognorm of
 * hdf5_rows' teacher_outputs join), with the teacher's mass beyond its
 * top K as one explicit "rest" bucket.
 *
 * Per labelled position, with tau the distillation temperature (= the
 * teacher export's, whose topk_logits are already z_t / tau):
 *   teacher  q_k = exp(kd_logit_k - kd_lognorm)            k = 1..K
 *            q_r = 1 - sum_k q_k                           (mass beyond the top K)
 *   student  log p = log_softmax(z_s[1..N] / tau)          over every item (not padding 0)
 *            p_k = p[kd_id_k],  p_r = 1 - sum_k p_k
 *   KL(q || p) = sum_k q_k (log q_k - log p_k) + q_r (log q_r - log p_r)     (0 log 0 = 0)
 *   kd = kd_weight * tau^2 * mean over positions of KL      (Hinton et al. 2015, tau^2 keeps
 *                                                             the gradient scale of the soft term)
 * Everything runs as ops on the logits' device; the teacher terms (q log q)
 * carry no gradient.
 */
#include "distill.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ilora.h"

pl_status ilora_kd_temperature(ilora_model *m) {
    if (m->o.kd_weight <= 0) return PL_OK;
    double T = 0;
    if (!m->ctx || !m->ctx->meta || pl_meta_get_float(m->ctx->meta, "teacher_temperature", &T)) {
        pl_error_clear();
        if (m->o.kd_temperature > 0) return PL_OK; /* tests feed the fields by hand */
        return pl_error_set(PL_ERR_CONFIG, "ilora: kd_weight > 0 needs teacher targets: the "
                                           "loader publishes no 'teacher_temperature' (set [data] "
                                           "teacher_outputs) and kd_temperature is 0");
    }
    if (m->o.kd_temperature > 0 && fabs(m->o.kd_temperature - T) > 1e-9 * T)
        return pl_error_set(PL_ERR_CONFIG,
                            "ilora: kd_temperature = %g but the teacher outputs "
                            "were exported at temperature %g (their logits and log-normalizer "
                            "are at that temperature; export again with export_temperature = %g, "
                            "or set kd_temperature = 0)",
                            m->o.kd_temperature, T, m->o.kd_temperature);
    m->o.kd_temperature = T;
    return PL_OK;
}

/* The term from tensors on the logits' device: ids [np, K] (i32 or i64, items
 * 1..V-1, checked by the caller), tl [np, K] teacher logits / tau, ln [np, 1]
 * its log-normalizer. The student's log p over items 1..V-1 at one position
 * is z/tau - lse with lse the logsumexp over those columns, taken from one
 * log_softmax column: lse = z_1/tau - log_softmax(z[1:]/tau)_0; gathering
 * z/tau by the item ids themselves needs no shifted index. The KL of each
 * position is summed and divided by np; with mask [np, 1] and count (device
 * scalar >= 1) each is weighted by mask and the sum divided by count (a
 * device's every-position path, no host read). */
static pl_tensor *kd_loss_t(pl_tensor *logits, pl_tensor *ids, pl_tensor *tl, pl_tensor *ln,
                            double tau, double weight, pl_tensor *mask, pl_tensor *count) {
    int64_t np = logits->shape[0], V = logits->shape[1];
    /* teacher: q_k = exp(tl_k - ln), rest q_r = 1 - sum q (constants, no gradient) */
    pl_tensor *lq = pl_sub(tl, ln);
    pl_tensor *tq = pl_exp(lq);
    pl_tensor *tr = pl_clamp(pl_add_scalar(pl_scale(pl_sum(tq, 1, true), -1.0), 1.0), 0.0, 1.0);
    pl_tensor *negent = pl_add(pl_sum(pl_mul(tq, lq), 1, true),
                               pl_mul(tr, pl_log(pl_clamp(tr, 1e-30, 1.0)))); /* [np, 1]: sum q log q */
    /* student: log p_k over items 1..V-1 at temperature tau */
    pl_tensor *zs = pl_scale(logits, 1.0 / tau);
    pl_tensor *lp1 = pl_log_softmax(pl_slice(zs, 1, 1, V));
    pl_tensor *lse = pl_sub(pl_slice(zs, 1, 1, 2), pl_slice(lp1, 1, 0, 1)); /* [np, 1] */
    pl_tensor *lpk = pl_sub(pl_gather(zs, 1, ids), lse);                      /* [np, K] */
    pl_tensor *pk = pl_sum(pl_exp(lpk), 1, true);                             /* [np, 1] */
    pl_tensor *lpr = pl_log(pl_clamp(pl_add_scalar(pl_scale(pk, -1.0), 1.0), 1e-12, 1.0));
    pl_tensor *cross = pl_add(pl_sum(pl_mul(tq, lpk), 1, true), pl_mul(tr, lpr)); /* sum q log p */
    pl_tensor *rows = pl_sub(negent, cross); /* [np, 1]: KL(q || p) per position */
    if (!mask) return pl_scale(pl_sum(rows, PL_ALL_DIMS, false), weight * tau * tau / (double)np);
    /* on a device: every position, the unlabelled ones weighted 0 */
    return pl_scale(pl_div(pl_sum(pl_mul(rows, mask), PL_ALL_DIMS, false), count),
                    weight * tau * tau);
}

pl_tensor *ilora_kd_loss(pl_tensor *logits, const int32_t *ids, const float *tlogits,
                         const float *lognorm, int64_t np, int64_t K, double tau, double weight) {
    int64_t V = logits->shape[1];
    for (int64_t i = 0; i < np * K; i++)
        if (ids[i] < 1 || ids[i] >= V) {
            pl_error_set(PL_ERR_INVALID,
                         "ilora: teacher item %lld (position %lld, rank %lld) is outside [1, %lld]",
                         (long long)ids[i], (long long)(i / K), (long long)(i % K),
                         (long long)V - 1);
            return NULL;
        }
    pl_device dev = logits->device;
    pl_tensor *ti = pl_tensor_from_data(PL_I32, 2, (int64_t[]){np, K}, ids, dev);
    pl_tensor *tl = pl_tensor_from_data(PL_F32, 2, (int64_t[]){np, K}, tlogits, dev);
    pl_tensor *ln = pl_tensor_from_data(PL_F32, 2, (int64_t[]){np, 1}, lognorm, dev);
    return ti && tl && ln ? kd_loss_t(logits, ti, tl, ln, tau, weight, NULL, NULL) : NULL;
}

/* The teacher fields of batch b, checked against the input ids: kd_ids,
 * kd_logits [B, L, K], kd_lognorm [B, L]; PL_OK, or the error status. */
static pl_status kd_fields(ilora_model *m, const pl_batch *b, pl_tensor **id, pl_tensor **lg,
                           pl_tensor **ln) {
    pl_tensor *fid = pl_batch_find(b, "kd_ids"), *flg = pl_batch_find(b, "kd_logits"),
              *fln = pl_batch_find(b, "kd_lognorm"), *ids = pl_batch_find(b, m->o.input_field);
    if (!fid || !flg || !fln) {
        pl_error_set(PL_ERR_INVALID,
                     "ilora: kd_weight > 0 but the batch lacks %s (the loader's "
                     "teacher_outputs join provides kd_ids, kd_logits, kd_lognorm)",
                     !fid   ? "kd_ids"
                     : !flg ? "kd_logits"
                            : "kd_lognorm");
        return pl_error_status();
    }
    /* [B, L] as the input ids: the labelled positions `pos` index both */
    if (fid->ndim != 3 || !pl_tensor_same_shape(fid, flg) || fln->ndim != 2 ||
        fln->shape[0] != fid->shape[0] || fln->shape[1] != fid->shape[1] || !ids ||
        ids->ndim != 2 || ids->shape[0] != fid->shape[0] || ids->shape[1] != fid->shape[1]) {
        char b1[256], b2[256], b3[256];
        pl_error_set(PL_ERR_SHAPE,
                     "ilora: teacher fields kd_ids %s, kd_logits %s must be "
                     "[B, L, K] and kd_lognorm %s [B, L], with B, L those of the input ids",
                     pl_tensor_describe(fid, b1, sizeof b1), pl_tensor_describe(flg, b2, sizeof b2),
                     pl_tensor_describe(fln, b3, sizeof b3));
        return pl_error_status();
    }
    *id = fid, *lg = flg, *ln = fln;
    return PL_OK;
}

pl_tensor *ilora_kd_term(ilora_model *m, const pl_batch *b, pl_tensor *logits, pl_tensor *pos) {
    pl_tensor *fid, *flg, *fln;
    if (kd_fields(m, b, &fid, &flg, &fln)) return NULL;
    int64_t K = fid->shape[2], BL = fid->shape[0] * fid->shape[1];
    /* the labelled positions' rows, on the device where the loader staged them */
    pl_tensor *sid = pl_index_select(pl_reshape(fid, 2, (int64_t[]){BL, K}), 0, pos);
    pl_tensor *slg = pl_index_select(pl_reshape(flg, 2, (int64_t[]){BL, K}), 0, pos);
    pl_tensor *sln = pl_index_select(pl_reshape(fln, 2, (int64_t[]){BL, 1}), 0, pos);
    if (!sid || !slg || !sln) return NULL;
    return kd_loss_t(logits, sid, slg, sln, m->o.kd_temperature, m->o.kd_weight, NULL, NULL);
}

/* kd_loss_t over every position, weighted: the same sums over the rows with
 * mask 1, divided by count (a device scalar >= 1) instead of np. Rows with
 * mask 0 (kd_ids 0, logits and log-normalizer 0: finite terms) add nothing. */
pl_tensor *ilora_kd_term_masked(ilora_model *m, const pl_batch *b, pl_tensor *logits,
                                pl_tensor *mask, pl_tensor *count) {
    pl_tensor *fid, *flg, *fln;
    if (kd_fields(m, b, &fid, &flg, &fln)) return NULL;
    int64_t K = fid->shape[2], BL = fid->shape[0] * fid->shape[1];
    pl_tensor *ids = pl_reshape(fid, 2, (int64_t[]){BL, K});
    pl_tensor *tl = pl_reshape(flg, 2, (int64_t[]){BL, K});
    pl_tensor *ln = pl_reshape(fln, 2, (int64_t[]){BL, 1});
    if (!ids || !tl || !ln) return NULL;
    return kd_loss_t(logits, ids, tl, ln, m->o.kd_temperature, m->o.kd_weight, mask, count);
}
