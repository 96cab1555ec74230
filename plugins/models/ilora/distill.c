/* distill.c - knowledge distillation term of the ilora model (distill.h):
 * the student's temperature-softened distribution against the teacher's
 * exported top-K targets (batch fields kd_ids, kd_logits, kd_lognorm of
 * hdf5_chunk's teacher_outputs join), with the teacher's mass beyond its
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
 * The teacher terms (q log q) are constants computed on the host in double.
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

pl_tensor *ilora_kd_loss(pl_tensor *logits, const int32_t *ids, const float *tlogits,
                         const float *lognorm, int64_t np, int64_t K, double tau, double weight) {
    int64_t V = logits->shape[1];
    int64_t *idx = malloc(sizeof *idx * (size_t)(np * K) + 1);
    float *q = malloc(sizeof *q * (size_t)(np * K) + 1), *qr = malloc(sizeof *qr * (size_t)np + 1);
    if (!idx || !q || !qr) {
        free(idx);
        free(q);
        free(qr);
        pl_error_set(PL_ERR_NOMEM, "ilora: out of memory");
        return NULL;
    }
    double neg_entropy = 0; /* sum over positions of sum q log q (rest included) */
    for (int64_t j = 0; j < np; j++) {
        double s = 0;
        for (int64_t k = 0; k < K; k++) {
            int64_t it = ids[j * K + k];
            if (it < 1 || it >= V) {
                pl_error_set(PL_ERR_INVALID,
                             "ilora: teacher item %lld (position %lld, rank %lld) "
                             "is outside [1, %lld]",
                             (long long)it, (long long)j, (long long)k, (long long)V - 1);
                free(idx);
                free(q);
                free(qr);
                return NULL;
            }
            idx[j * K + k] = it - 1; /* column of the logits without the padding item */
            double lq = (double)tlogits[j * K + k] - (double)lognorm[j];
            double qk = exp(lq);
            q[j * K + k] = (float)qk;
            s += qk;
            neg_entropy += qk * lq;
        }
        double rest = 1.0 - s;
        if (rest < 0) rest = 0;
        qr[j] = (float)rest;
        if (rest > 0) neg_entropy += rest * log(rest);
    }
    pl_device dev = logits->device;
    pl_tensor *ti = pl_tensor_from_data(PL_I64, 2, (int64_t[]){np, K}, idx, dev);
    pl_tensor *tq = pl_tensor_from_data(PL_F32, 2, (int64_t[]){np, K}, q, dev);
    pl_tensor *tr = pl_tensor_from_data(PL_F32, 2, (int64_t[]){np, 1}, qr, dev);
    free(idx);
    free(q);
    free(qr);
    if (!ti || !tq || !tr) return NULL;
    /* student: log p over items 1..N at temperature tau */
    pl_tensor *lp = pl_log_softmax(pl_slice(pl_scale(logits, 1.0 / tau), 1, 1, V));
    pl_tensor *lpk = pl_gather(lp, 1, ti);        /* [np, K] */
    pl_tensor *pk = pl_sum(pl_exp(lpk), 1, true); /* [np, 1] */
    pl_tensor *lpr = pl_log(pl_clamp(pl_add_scalar(pl_scale(pk, -1.0), 1.0), 1e-12, 1.0));
    pl_tensor *cross = pl_add(pl_sum(pl_mul(tq, lpk), PL_ALL_DIMS, false),
                              pl_sum(pl_mul(tr, lpr), PL_ALL_DIMS, false)); /* sum q log p */
    double c = weight * tau * tau / (double)np;
    return pl_add_scalar(pl_scale(cross, -c), c * neg_entropy);
}

pl_tensor *ilora_kd_term(ilora_model *m, const pl_batch *b, pl_tensor *logits, const int64_t *pos,
                         int64_t np) {
    pl_tensor *fid = pl_batch_find(b, "kd_ids"), *flg = pl_batch_find(b, "kd_logits"),
              *fln = pl_batch_find(b, "kd_lognorm");
    if (!fid || !flg || !fln) {
        pl_error_set(PL_ERR_INVALID,
                     "ilora: kd_weight > 0 but the batch lacks %s (the loader's "
                     "teacher_outputs join provides kd_ids, kd_logits, kd_lognorm)",
                     !fid   ? "kd_ids"
                     : !flg ? "kd_logits"
                            : "kd_lognorm");
        return NULL;
    }
    if (fid->ndim != 3 || !pl_tensor_same_shape(fid, flg) || fln->ndim != 2 ||
        fln->shape[0] != fid->shape[0] || fln->shape[1] != fid->shape[1]) {
        char b1[256], b2[256], b3[256];
        pl_error_set(PL_ERR_SHAPE,
                     "ilora: teacher fields kd_ids %s, kd_logits %s must be "
                     "[B, L, K] and kd_lognorm %s [B, L]",
                     pl_tensor_describe(fid, b1, sizeof b1), pl_tensor_describe(flg, b2, sizeof b2),
                     pl_tensor_describe(fln, b3, sizeof b3));
        return NULL;
    }
    int64_t K = fid->shape[2], BL = fid->shape[0] * fid->shape[1];
    pl_tensor *hid = pl_tensor_to(fid, PL_I32, PL_CPU), *hlg = pl_tensor_to(flg, PL_F32, PL_CPU),
              *hln = pl_tensor_to(fln, PL_F32, PL_CPU);
    if (!hid || !hlg || !hln) return NULL;
    const int32_t *aid = pl_tensor_data(hid);
    const float *alg = pl_tensor_f32(hlg), *aln = pl_tensor_f32(hln);
    int32_t *ids = malloc(sizeof *ids * (size_t)(np * K) + 1);
    float *lg = malloc(sizeof *lg * (size_t)(np * K) + 1),
          *ln = malloc(sizeof *ln * (size_t)np + 1);
    pl_tensor *out = NULL;
    if (!ids || !lg || !ln) {
        pl_error_set(PL_ERR_NOMEM, "ilora: out of memory");
    } else {
        bool ok = true;
        for (int64_t j = 0; j < np && ok; j++) {
            if (pos[j] >= BL) {
                pl_error_set(PL_ERR_SHAPE,
                             "ilora: position %lld outside the teacher fields' "
                             "%lld positions",
                             (long long)pos[j], (long long)BL);
                ok = false;
                break;
            }
            memcpy(ids + j * K, aid + pos[j] * K, sizeof *ids * (size_t)K);
            memcpy(lg + j * K, alg + pos[j] * K, sizeof *lg * (size_t)K);
            ln[j] = aln[pos[j]];
        }
        if (ok)
            out = ilora_kd_loss(logits, ids, lg, ln, np, K, m->o.kd_temperature, m->o.kd_weight);
    }
    free(ids);
    free(lg);
    free(ln);
    return out;
}
