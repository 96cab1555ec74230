/* ilora_forward.c - the ilora forward of training (loss, router terms, distillation)
 * and evaluation (ranking metrics, gate statistics, the ranking masks). */
#include "ilora_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "distill.h"
#include "ranking.h"
/* ---- forward ------------------------------------------------------------------------------ */

pl_tensor *ilora_need_field(const pl_batch *b, const char *name, const char *option) {
    pl_tensor *t = pl_batch_find(b, name);
    if (!t) {
        char have[512] = "";
        size_t n = 0;
        for (int i = 0; i < b->n && n < sizeof have - 1; i++)
            n += (size_t)snprintf(have + n, sizeof have - n, "%s%s", i ? ", " : "", b->names[i]);
        pl_error_set(PL_ERR_INVALID, "ilora: batch has no field '%s' (option %s); fields: %s",
                     name, option, have[0] ? have : "(none)");
    }
    return t;
}

/* The mean over rows of X [N, k]: (1/N) sum_n X_n, or with mask [N, 1] and
 * count (device scalar >= 1) sum_n mask_n X_n / count. [k]. */
static pl_tensor *row_mean(pl_tensor *x, pl_tensor *mask, pl_tensor *count) {
    if (!mask) return pl_scale(pl_sum(x, 0, false), 1.0 / (double)x->shape[0]);
    return pl_div(pl_sum(pl_mul(x, mask), 0, false), count);
}

/* The router's auxiliary losses added to `loss`, over the gates of the
 * labelled positions pi (per-position gates) or of the rows (per-row gates),
 * N of them:
 *   load balancing  coef_a * E * sum_k P_k^2,  P_k = (1/N) sum_n g_nk
 *     (Switch Transformer / HF Mixtral load_balancing_loss_func, whose
 *     E * sum_k f_k P_k becomes E * sum_k P_k^2 when every expert is used
 *     with its gate: 1 at uniform usage, E when all use one expert);
 *   entropy         coef_h * (1/N) sum_n H(g_n) / ln E,  H(g) = -sum_k g_k log g_k
 *     with log g = log_softmax(z) (finite where g underflows).
 * On a device (mask non-NULL, pi NULL) the per-position gates are not
 * selected: every position is weighted by mask [B*L, 1] and the sums divided
 * by count = sum(mask) (a device scalar >= 1), the same N-mean. */
static pl_tensor *router_terms(ilora_model *m, pl_tensor *loss, const route *rt, pl_tensor *pi,
                               pl_tensor *mask, pl_tensor *count) {
    double ca = m->o.router_aux_loss_coef, ch = m->o.router_entropy_coef;
    if (ca <= 0 && ch <= 0) return loss;
    int64_t E = m->o.num_experts;
    pl_tensor *g = rt->g, *z = rt->z;
    if (g->ndim == 3) { /* per position: the labelled ones (pi), or all of them weighted */
        g = pl_reshape(g, 2, (int64_t[]){-1, E});
        z = pl_reshape(z, 2, (int64_t[]){-1, E});
        if (!mask) {
            g = pl_index_select(g, 0, pi);
            z = pl_index_select(z, 0, pi);
        }
    } else {
        mask = count = NULL; /* per row: every row counts */
    }
    if (!g || !z) return NULL;
    if (ca > 0) {
        pl_tensor *p = row_mean(g, mask, count); /* [E] */
        loss = pl_add(loss, pl_scale(pl_sum(pl_mul(p, p), PL_ALL_DIMS, false), ca * (double)E));
    }
    if (ch > 0) {
        pl_tensor *rows = pl_sum(pl_mul(g, pl_log_softmax(z)), 1, true); /* [N, 1] */
        pl_tensor *plogp = pl_sum(row_mean(rows, mask, count), PL_ALL_DIMS, false);
        loss = pl_add(loss, pl_scale(plogp, -ch / log((double)E)));
    }
    return loss;
}

/* The training loss on a device other than the CPU, without reading the
 * labels back: the head scores every position, the cross-entropy ignores
 * label 0 (its mean is over the labelled positions, as train_forward's
 * selection), the router and distillation terms weight each position by
 * mask = min(label, 1). The same value as the CPU path up to summation
 * order; a batch without a labelled position has a NaN loss here
 * (PyTorch's cross-entropy over nothing) where the CPU path returns 0.
 * *count: the labelled positions, a device scalar (read only to log). */
static pl_status train_forward_device(ilora_model *m, const pl_batch *b, pl_tensor *ids,
                                      pl_tensor *lab, pl_tensor **loss, pl_tensor **count) {
    route rt;
    pl_tensor *h = ilora_hidden_forward(m, ids, true, false, &rt);
    if (!h) return pl_error_status();
    int64_t BL = pl_tensor_numel(lab);
    pl_tensor *tg = pl_reshape(lab, 1, (int64_t[]){BL});
    pl_tensor *logits; /* [BL, V], kept only for distillation (ilora_head_loss) */
    *loss = ilora_head_loss(m, pl_reshape(h, 2, (int64_t[]){-1, m->o.dim}), tg, 0, &logits);
    pl_tensor *mask = NULL;
    if (*loss && (m->o.kd_weight > 0 || (rt.g && rt.g->ndim == 3) || count)) {
        pl_tensor *mf = pl_tensor_to(tg, PL_F32, m->ctx->device);
        mask = mf ? pl_reshape(pl_clamp(mf, 0.0, 1.0), 2, (int64_t[]){BL, 1}) : NULL;
        pl_tensor *n = mask ? pl_sum(mask, PL_ALL_DIMS, false) : NULL;
        if (count) *count = n;
        n = n ? pl_clamp(n, 1.0, INFINITY) : NULL; /* terms of an empty batch stay finite */
        if (!n) *loss = NULL;
        if (*loss && m->o.kd_weight > 0) *loss = pl_add(*loss, ilora_kd_term_masked(m, b, logits, mask, n));
        if (*loss && rt.g && rt.g->ndim == 3) *loss = router_terms(m, *loss, &rt, NULL, mask, n);
    }
    if (*loss && rt.g && rt.g->ndim == 2) *loss = router_terms(m, *loss, &rt, NULL, NULL, NULL);
    return *loss ? PL_OK : pl_error_status();
}

/* *n_terms: the labelled positions the loss averages over (on a device: a
 * read of the count, only when n_terms is asked for) */
static pl_status train_forward(ilora_model *m, const pl_batch *b, pl_tensor **loss,
                               int64_t *n_terms) {
    pl_tensor *ids = ilora_need_field(b, m->o.input_field, "input_field");
    pl_tensor *lab = ilora_need_field(b, m->o.label_field, "label_field");
    if (!ids || !lab) return pl_error_status();
    if (!pl_tensor_same_shape(ids, lab)) {
        char b1[256], b2[256];
        return pl_error_set(PL_ERR_SHAPE, "ilora: labels %s and input ids %s differ in shape",
                            pl_tensor_describe(lab, b1, sizeof b1),
                            pl_tensor_describe(ids, b2, sizeof b2));
    }
    if (m->device_loss) {
        pl_tensor *count = NULL;
        pl_status st = train_forward_device(m, b, ids, lab, loss, n_terms ? &count : NULL);
        if (!st && n_terms) {
            double c = pl_tensor_item(count);
            if (isnan(c)) return pl_error_status();
            *n_terms = (int64_t)c;
        }
        return st;
    }
    int64_t n = pl_tensor_numel(lab);
    int64_t *hl = ilora_host_index(lab, m->o.label_field);
    if (!hl) return pl_error_status();
    int64_t *pos = malloc((size_t)(n ? n : 1) * sizeof *pos);
    int64_t *tgt = malloc((size_t)(n ? n : 1) * sizeof *tgt);
    int64_t np = 0;
    pl_status st = PL_OK;
    if (!pos || !tgt) st = pl_error_set(PL_ERR_NOMEM, "ilora: out of memory");
    for (int64_t i = 0; !st && i < n; i++) {
        if (hl[i] == 0) continue;
        if (hl[i] < 0 || hl[i] >= m->vocab) {
            st = pl_error_set(PL_ERR_INVALID, "ilora: label %lld at flat position %lld is outside "
                              "[0, %lld] (num_items)", (long long)hl[i], (long long)i,
                              (long long)m->vocab - 1);
            break;
        }
        pos[np] = i;
        tgt[np++] = hl[i];
    }
    free(hl);
    route rt;
    pl_tensor *h = st ? NULL : ilora_hidden_forward(m, ids, true, false, &rt);
    if (!st && !h) st = pl_error_status();
    if (!st && np == 0) {
        *loss = pl_scale(pl_sum(h, PL_ALL_DIMS, false), 0.0); /* nothing to predict */
    } else if (!st) {
        pl_device dev = m->ctx->device;
        pl_tensor *pi = pl_tensor_from_data(PL_I64, 1, (int64_t[]){np}, pos, dev);
        pl_tensor *ti = pl_tensor_from_data(PL_I64, 1, (int64_t[]){np}, tgt, dev);
        pl_tensor *hf = pl_reshape(h, 2, (int64_t[]){-1, m->o.dim});
        pl_tensor *logits; /* [np, V], kept only for distillation (ilora_head_loss) */
        *loss = ilora_head_loss(m, pl_index_select(hf, 0, pi), ti, 0, &logits);
        if (*loss && m->o.kd_weight > 0) *loss = pl_add(*loss, ilora_kd_term(m, b, logits, pi));
        if (*loss && rt.g) *loss = router_terms(m, *loss, &rt, pi, NULL, NULL);
    }
    if (!st && !*loss) st = pl_error_status();
    free(pos);
    free(tgt);
    if (n_terms) *n_terms = np;
    return st;
}

/* Logits of the last position [B, V] (f32, host copy in *host), and the
 * forward's router output in *rt (may be NULL). */
pl_tensor *ilora_last_logits(ilora_model *m, pl_tensor *ids, pl_tensor **host, route *rt) {
    pl_tensor *hl = ilora_last_hidden_rt(m, ids, rt);
    if (!hl) return NULL;
    pl_tensor *lg = ilora_logits(m, hl);
    if (lg && host) {
        *host = (lg->device.type == PL_DEVICE_CPU && lg->dtype == PL_F32) ? lg
                                                                          : pl_tensor_to(lg, PL_F32, PL_CPU);
        if (!*host) return NULL;
    }
    return lg;
}

static bool warned_history;


pl_status ilora_seen_open(ilora_model *m, const pl_batch *b, pl_data_split split, pl_tensor *ids,
                          const int64_t *users, seen_items *s) {
    memset(s, 0, sizeof *s);
    if (!m->o.exclude_history) return PL_OK;
    int64_t B = ids->shape[0];
    pl_tensor *hf = pl_batch_find(b, m->o.history_field);
    if (hf) {
        if (hf->ndim != 2 || hf->shape[0] != B)
            return pl_error_set(PL_ERR_SHAPE, "ilora: history field '%s' must be [B, H] with B = %lld",
                                m->o.history_field, (long long)B);
        s->hw = hf->shape[1];
        return (s->hist = ilora_host_index(hf, m->o.history_field)) ? PL_OK : pl_error_status();
    }
    if (m->have_hist && users) {
        s->csr = &m->hist[split];
        s->users = users;
        return PL_OK;
    }
    if (!warned_history) {
        pl_message("ilora: warning: no history for exclusion (no batch field '%s', "
                   "no history_path CSR + '%s' field); excluding the input window only",
                   m->o.history_field, m->o.user_field);
        warned_history = true;
    }
    s->wl = ids->shape[1];
    return (s->win = ilora_host_index(ids, m->o.input_field)) ? PL_OK : pl_error_status();
}

/* Row i's seen items to -inf in row[0..V), except `keep` (the target being
 * ranked in evaluation; 0 in predict). A user index outside the CSR is an
 * error naming it and the row. */
pl_status ilora_seen_mask(const seen_items *s, int64_t i, int64_t keep, float *row, int64_t V,
                          pl_data_split split) {
    const int64_t *ex = NULL;
    int64_t n = 0;
    if (s->hist) {
        ex = s->hist + i * s->hw;
        n = s->hw;
    } else if (s->win) {
        ex = s->win + i * s->wl;
        n = s->wl;
    } else if (s->csr) {
        int64_t u = s->users[i];
        if (u < 0 || u >= s->csr->n_users)
            return pl_error_set(PL_ERR_INVALID, "ilora: %s user index %lld of row %lld outside the "
                                "history CSR's %lld users", pl_split_name(split), (long long)u,
                                (long long)i, (long long)s->csr->n_users);
        for (int64_t j = s->csr->offsets[u]; j < s->csr->offsets[u + 1]; j++) {
            int64_t it = s->csr->items[j];
            if (it > 0 && it < V && it != keep) row[it] = -INFINITY;
        }
    }
    for (int64_t j = 0; j < n; j++)
        if (ex[j] > 0 && ex[j] < V && ex[j] != keep) row[ex[j]] = -INFINITY;
    return PL_OK;
}

void ilora_seen_free(seen_items *s) {
    free(s->hist);
    free(s->win);
}

/* Gate statistics of the evaluated users (the gates of each row's last
 * position: the user's whole sequence), as (sum, count) metrics:
 *   gate_entropy   mean of H(g) / ln E (1: uniform, 0: one expert);
 *   gate_usage_k   mean gate of expert k (k < 16);
 *   gate_user_tv   mean over users of the total-variation distance
 *                  0.5 * sum_k |g_k - mean g_k| between the user's gates and
 *                  the split's mean gate (0: every user gets the same mixture).
 * gate_user_tv needs the mean over the whole split: the model keeps the rows
 * of the pass in progress (a pass starts at batch index 0) and each batch
 * reports the change of the total, so the sums add up to the exact value
 * over the rows this process evaluated. Cost: O(rows so far x E) per batch,
 * against the batch's O(B x items x D) logits: below 1 % of an evaluation
 * batch until a split has more users than items x D x B / (100 E). */
static pl_status gate_stats(ilora_model *m, const pl_batch *b, pl_data_split split, const float *gv,
                            int64_t B, pl_metrics *mt) {
    int64_t E = m->o.num_experts;
    if (b->index == 0 || m->gs_split != (int)split) {
        m->gs_n = 0;
        m->gs_tv = 0;
        m->gs_split = (int)split;
    }
    if (m->gs_n + B > m->gs_cap) {
        int64_t cap = (m->gs_n + B) * 2;
        float *r = realloc(m->gs_rows, (size_t)(cap * E) * sizeof *r);
        if (!r) return pl_error_set(PL_ERR_NOMEM, "ilora: out of memory");
        m->gs_rows = r;
        m->gs_cap = cap;
    }
    memcpy(m->gs_rows + m->gs_n * E, gv, (size_t)(B * E) * sizeof *gv);
    m->gs_n += B;
    double ent = 0, use[ILORA_MAX_EXPERTS] = {0}, mean[ILORA_MAX_EXPERTS] = {0}, tv = 0;
    for (int64_t i = 0; i < B; i++)
        for (int64_t k = 0; k < E; k++) {
            double p = gv[i * E + k];
            if (p > 0) ent -= p * log(p);
            use[k] += p;
        }
    for (int64_t i = 0; i < m->gs_n; i++)
        for (int64_t k = 0; k < E; k++) mean[k] += m->gs_rows[i * E + k];
    for (int64_t k = 0; k < E; k++) mean[k] /= (double)m->gs_n;
    for (int64_t i = 0; i < m->gs_n; i++)
        for (int64_t k = 0; k < E; k++) tv += 0.5 * fabs(m->gs_rows[i * E + k] - mean[k]);
    pl_metrics_add(mt, "gate_entropy", ent / log((double)E), (double)B);
    pl_metrics_add(mt, "gate_user_tv", tv - m->gs_tv, (double)B);
    m->gs_tv = tv;
    for (int64_t k = 0; k < E && k < 16; k++) {
        char name[48];
        snprintf(name, sizeof name, "gate_usage_%lld", (long long)k);
        pl_metrics_add(mt, name, use[k], (double)B);
    }
    return PL_OK;
}

/* The gates of each row's last position (the user's whole sequence), f32
 * [B * E] on the device. */
static pl_tensor *last_gates(pl_tensor *g) {
    if (g->ndim == 3) g = pl_slice(g, 1, g->shape[1] - 1, g->shape[1]);
    pl_tensor *f = g ? pl_tensor_to(g, PL_F32, g->device) : NULL;
    return f ? pl_reshape(f, 1, (int64_t[]){pl_tensor_numel(f)}) : NULL;
}

/* hit_ratio@K, ndcg@K and recall@K of the batch's ranks (rank(i) of row i),
 * summed in row order in double. */
static void add_rank_metrics(pl_metrics *mt, int64_t K, int64_t B,
                             int64_t (*rank)(const void *, int64_t), const void *arg) {
    double hit = 0, ndcg = 0;
    for (int64_t i = 0; i < B; i++) {
        int64_t r = rank(arg, i);
        hit += ilora_hit_at(r, K);
        ndcg += ilora_ndcg_at(r, K);
    }
    char name[48];
    snprintf(name, sizeof name, "hit_ratio@%lld", (long long)K);
    pl_metrics_add(mt, name, hit, (double)B);
    snprintf(name, sizeof name, "ndcg@%lld", (long long)K);
    pl_metrics_add(mt, name, ndcg, (double)B);
    snprintf(name, sizeof name, "recall@%lld", (long long)K);
    pl_metrics_add(mt, name, hit, (double)B);
}

static int64_t rank_f32(const void *v, int64_t i) {
    return (int64_t)((const float *)v)[i];
}
static int64_t rank_i64(const void *v, int64_t i) {
    return ((const int64_t *)v)[i];
}

/* Targets outside [1, V): the error naming the first one (t: host copy). */
static pl_status bad_target(const ilora_model *m, const int64_t *t, int64_t B,
                            pl_data_split split) {
    for (int64_t i = 0; i < B; i++)
        if (t[i] <= 0 || t[i] >= m->vocab)
            return pl_error_set(PL_ERR_INVALID,
                                "ilora: %s target %lld of row %lld is outside "
                                "[1, %lld]",
                                pl_split_name(split), (long long)t[i], (long long)i,
                                (long long)m->vocab - 1);
    return PL_OK;
}

/* Evaluation with the ranking on the device (ranking.h, ilora_rank_device):
 * the batch's loss, range check, ranks and gates come back in ONE host read
 * of 2 + B (+ B * E) values, where the host ranking read the [B, V] scores,
 * the [B, H] seen items, the targets, the loss and the gates (5 reads). The
 * same numbers: the ranks are exact integers, the metrics summed on the
 * host in the same order. seen: [B, H] item ids or NULL. */
static pl_status eval_device(ilora_model *m, const pl_batch *b, pl_data_split split, pl_tensor *ids,
                             pl_tensor *tg, pl_tensor *seen, pl_tensor **loss, pl_metrics *mt) {
    int64_t B = ids->shape[0], V = m->vocab;
    route rt;
    pl_tensor *lg = ilora_last_logits(m, ids, NULL, &rt);
    if (!lg) return pl_error_status();
    pl_device dev = lg->device;
    /* the loss over the logits as they are (the host path's); the ranking on f32 */
    pl_tensor *lf = lg->dtype == PL_F32 ? lg : pl_tensor_to(lg, PL_F32, dev);
    /* targets clamped into [1, V) for the kernels; `bad` > 0 when one was not */
    if (!pl_tensor_is_contiguous(tg)) tg = pl_contiguous(tg);
    pl_tensor *tf = pl_tensor_to(pl_reshape(tg, 2, (int64_t[]){B, 1}), PL_F32, dev);
    pl_tensor *tcf = pl_clamp(tf, 1.0, (double)(V - 1));
    pl_tensor *bad = pl_sum(pl_square(pl_sub(tf, tcf)), PL_ALL_DIMS, false);
    pl_tensor *tc = pl_tensor_to(tcf, PL_I64, dev);
    pl_tensor *ce = tc ? pl_cross_entropy(lg, pl_reshape(tc, 1, (int64_t[]){B}), -100, 0.0) : NULL;
    pl_tensor *rank = ilora_rank_device(lf, tc, seen, &m->rank_off);
    pl_tensor *g = rt.g ? last_gates(rt.g) : NULL;
    if (!ce || !bad || !rank || (rt.g && !g)) return pl_error_status();
    pl_tensor *part[4] = {pl_reshape(pl_tensor_to(ce, PL_F32, dev), 1, (int64_t[]){1}),
                          pl_reshape(bad, 1, (int64_t[]){1}), rank, g};
    pl_tensor *h = pl_tensor_to(pl_concat(part, g ? 4 : 3, 0), PL_F32, PL_CPU); /* the read */
    if (!h) return pl_error_status();
    const float *v = pl_tensor_f32(h);
    if (v[1] > 0) { /* the error names the row: read the targets (only then) */
        int64_t *t = ilora_host_index(tg, m->o.target_field);
        pl_status st = t ? bad_target(m, t, B, split) : pl_error_status();
        free(t);
        return st ? st
                  : pl_error_set(PL_ERR_INVALID, "ilora: %s target outside [1, %lld]",
                                 pl_split_name(split), (long long)V - 1);
    }
    if (loss) *loss = ce;
    pl_metrics_add(mt, "loss", (double)v[0] * (double)B, (double)B);
    add_rank_metrics(mt, m->o.metric_k, B, rank_f32, v + 2);
    return g ? gate_stats(m, b, split, v + 2 + B, B, mt) : PL_OK;
}

/* Whether the device ranking serves this batch, and its seen items: the
 * history field [B, H] (*seen), or none when exclude_history is off (*seen
 * NULL). False (the host ranking): the history is the CSR by user, or the
 * input window (no history at all: the host path warns once), or the field
 * has a bad shape (the host path names it). */
static bool device_seen(ilora_model *m, const pl_batch *b, pl_tensor *ids, pl_tensor **seen) {
    *seen = NULL;
    if (!m->o.exclude_history) return true;
    pl_tensor *hf = pl_batch_find(b, m->o.history_field);
    if (!hf || hf->ndim != 2 || hf->shape[0] != ids->shape[0]) return false;
    *seen = pl_tensor_is_contiguous(hf) ? hf : pl_contiguous(hf);
    return *seen != NULL;
}

static pl_status eval_forward(ilora_model *m, const pl_batch *b, pl_data_split split,
                              pl_tensor **loss, pl_metrics *mt) {
    pl_tensor *ids = ilora_need_field(b, m->o.input_field, "input_field");
    pl_tensor *tg = ilora_need_field(b, m->o.target_field, "target_field");
    if (!ids || !tg) return pl_error_status();
    int64_t B = ids->ndim == 2 ? ids->shape[0] : -1;
    if (pl_tensor_numel(tg) != B) {
        char b1[256], b2[256];
        return pl_error_set(PL_ERR_SHAPE, "ilora: target %s must hold one item per row of %s",
                            pl_tensor_describe(tg, b1, sizeof b1),
                            pl_tensor_describe(ids, b2, sizeof b2));
    }
    pl_tensor *seen = NULL;
    if (device_seen(m, b, ids, &seen) && m->vocab <= (1 << 24))
        return eval_device(m, b, split, ids, tg, seen, loss, mt);
    pl_tensor *host = NULL;
    route rt;
    pl_tensor *lg = ilora_last_logits(m, ids, &host, &rt);
    if (!lg) return pl_error_status();
    int64_t *t = ilora_host_index(tg, m->o.target_field);
    if (!t) return pl_error_status();
    pl_status st = bad_target(m, t, B, split);
    pl_tensor *ti = st ? NULL : pl_tensor_from_data(PL_I64, 1, (int64_t[]){B}, t, m->ctx->device);
    pl_tensor *ce = ti ? pl_cross_entropy(lg, ti, -100, 0.0) : NULL;
    if (!st && !ce) st = pl_error_status();
    if (!st) {
        double cev = pl_tensor_item(ce);
        if (loss) *loss = ce;
        pl_metrics_add(mt, "loss", cev * (double)B, (double)B);
    }
    /* the seen items ranking leaves out (the target stays in) */
    pl_tensor *uf = st ? NULL : pl_batch_find(b, m->o.user_field);
    int64_t *users = NULL;
    seen_items seen_h = {0};
    if (!st && uf && m->have_hist && !(users = ilora_host_index(uf, m->o.user_field)))
        st = pl_error_status();
    if (!st && users && pl_tensor_numel(uf) != B)
        st = pl_error_set(PL_ERR_SHAPE, "ilora: field '%s' must hold one user per row (%lld)",
                          m->o.user_field, (long long)B);
    if (!st) st = ilora_seen_open(m, b, split, ids, users, &seen_h);
    int64_t V = m->vocab;
    int64_t *ranks = st ? NULL : malloc((size_t)(B ? B : 1) * sizeof *ranks);
    const float *lh = st ? NULL : pl_tensor_f32(host);
    float *row = st ? NULL : malloc((size_t)V * sizeof *row);
    if (!st && (!row || !lh || !ranks))
        st = row && ranks ? pl_error_status() : pl_error_set(PL_ERR_NOMEM, "ilora: oom");
    for (int64_t i = 0; !st && i < B; i++) {
        memcpy(row, lh + i * V, (size_t)V * sizeof *row);
        row[0] = -INFINITY;
        if ((st = ilora_seen_mask(&seen_h, i, t[i], row, V, split))) break;
        ranks[i] = ilora_rank_of(row, V, t[i]);
    }
    if (!st) add_rank_metrics(mt, m->o.metric_k, B, rank_i64, ranks);
    pl_tensor *g = !st && rt.g ? last_gates(rt.g) : NULL;
    pl_tensor *hg = g ? pl_tensor_to(g, PL_F32, PL_CPU) : NULL;
    if (!st && rt.g && !hg) st = pl_error_status();
    if (!st && hg) st = gate_stats(m, b, split, pl_tensor_f32(hg), B, mt);
    free(ranks);
    free(row);
    ilora_seen_free(&seen_h);
    free(users);
    free(t);
    return st;
}

pl_status ilora_forward(void *self, const pl_batch *b, pl_data_split split, bool training,
                        pl_tensor **loss, pl_metrics *mt) {
    ilora_model *m = self;
    if (loss) *loss = NULL;
    if (training) {
        int64_t np = 0;
        pl_status st = train_forward(m, b, loss, mt ? &np : NULL);
        /* the loss is a mean over the batch's labelled positions: its count tells a
         * data-parallel trainer how to weight this batch against the other ranks' */
        if (!st && mt && loss && *loss && np > 0) /* NULL mt: no metric, no read back */
            pl_metrics_add(mt, "loss", pl_tensor_item(*loss) * (double)np, (double)np);
        return st ? pl_error_prefix(st, "ilora forward (train batch %lld)", (long long)b->index)
                  : PL_OK;
    }
    /* evaluation of the train split (rare): the training loss without dropout */
    if (split == PL_SPLIT_TRAIN) {
        pl_tensor *l = NULL;
        pl_status st = train_forward(m, b, &l, NULL);
        if (!st) {
            if (loss) *loss = l;
            pl_metrics_add(mt, "loss", pl_tensor_item(l) * (double)b->size, (double)b->size);
        }
        return st;
    }
    pl_status st = eval_forward(m, b, split, loss, mt);
    return st ? pl_error_prefix(st, "ilora forward (%s batch %lld)", pl_split_name(split),
                                (long long)b->index)
              : PL_OK;
}
