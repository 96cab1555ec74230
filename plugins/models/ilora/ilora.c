/* ilora.c - the ilora model plugin: its vtable, `pipeline predict`, the plugin glue. The
 * options: ilora_opts.c; the parameters: ilora_params.c; the layers: ilora_layers.c; the
 * training and evaluation forward: ilora_forward.c (ilora_impl.h).
 *
 * Backbone (Llama conventions, HF LlamaForCausalLM parameter names):
 *   h = embed_tokens[ids]                                   ids [B, L], 0 = padding
 *   per layer:  x = RMSNorm(h) ; q,k,v = proj(x) ; q,k = RoPE(q,k)
 *               h = h + drop(o_proj(causal_softmax(q k^T + pad_bias, 1/sqrt(Dh)) v))
 *               x = RMSNorm(h) ; h = h + drop(down(silu(gate(x)) * up(x)))
 *   h = RMSNorm(h) ; logits = h @ E^T (tied) or h @ lm_head^T
 * MoE-LoRA (iLoRA) on the target projections, gated per sample:
 *   y = W0 x + (alpha / r_e) * sum_k g_k B_k A_k drop(x),  g = softmax(router(mean_t E[ids_t]))
 * computed as one GEMM pair with the experts stacked (see ilora_moe_lora_linear).
 * Details, sources and the option table: README.md.
 */
#include "ilora_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hf_export.h"
#include "ranking.h"
#include "distill.h"
#include "teacher_export.h"

/* ---- pipeline predict ------------------------------------------------------------------------
 * Per input row: the predict_top_k best items after the same exclusions as
 * evaluation (padding id 0 and the items the user has seen: the history
 * field, the history CSR by user index, or the input window), except that
 * a target, when the file has one, is never looked at: the prediction of a
 * row does not depend on its label. OUT.h5 (docs/run-files.md):
 *   top_items  i32 [N, k]  item ids, best first (ties: lower id first)
 *   top_scores f32 [N, k]  their logits
 *   row        i64 [N]     the row's index in the input split
 *   user_index i64 [N]     when the input has the user field
 *   target     i64 [N]     when the input has targets (copied, for scoring) */

pl_status ilora_predict_needs(const pl_config_section *cfg, pl_field_list *out) {
    const char *s[3] = {pl_cfg_str(cfg, "history_field", "history"),
                        pl_cfg_str(cfg, "user_field", "user_index"),
                        pl_cfg_str(cfg, "target_field", "target")};
    pl_status st = pl_fields_add(out, pl_cfg_str(cfg, "input_field", "input_ids"), PL_DTYPE_INDEX,
                                 2, false);
    if (!st) st = pl_fields_add(out, s[0], PL_DTYPE_INDEX, 2, true);
    for (int i = 1; i < 3 && !st; i++) st = pl_fields_add(out, s[i], PL_DTYPE_INDEX, -1, true);
    return st;
}

static pl_status predict_begin(ilora_model *m, pl_outputs *out) {
    if (m->o.predict_top_k > m->vocab - 1)
        return pl_error_set(PL_ERR_CONFIG, "ilora: predict_top_k %lld exceeds the %lld items",
                            (long long)m->o.predict_top_k, (long long)m->vocab - 1);
    m->pred_rows = 0;
    return pl_meta_set_int(out->attrs, "top_k", m->o.predict_top_k);
}

/* A [n] i64 CPU tensor of host values, owned by the caller's frame. */
static pl_tensor *host_rows_i64(const int64_t *v, int64_t n) {
    return pl_tensor_from_data(PL_I64, 1, (int64_t[]){n}, v, PL_CPU);
}

/* An index field as i64 [B] on its device for the writer (one read there),
 * or NULL with the error set when it does not hold B values. */
static pl_tensor *field_rows(pl_tensor *f, const char *name, int64_t B) {
    if (pl_tensor_numel(f) != B) {
        pl_error_set(PL_ERR_SHAPE, "ilora: field '%s' must hold one value per row (%lld)", name,
                     (long long)B);
        return NULL;
    }
    pl_tensor *c = pl_tensor_is_contiguous(f) ? f : pl_contiguous(f);
    return c ? pl_tensor_to(pl_reshape(c, 1, (int64_t[]){B}), PL_I64, f->device) : NULL;
}

/* The batch's outputs (the layout above): items i32 [B, k], scores f32 [B, k],
 * users / targets i64 [B] or NULL, on any device (the writer copies them);
 * rows numbered on from the previous batches'. A NULL tensor keeps the error
 * that made it (pl_outputs_add). */
static pl_status predict_add(ilora_model *m, pl_outputs *o, int64_t B, pl_tensor *items,
                             pl_tensor *scores, pl_tensor *users, pl_tensor *tg) {
    int64_t *rows = malloc((size_t)(B ? B : 1) * sizeof *rows);
    if (!rows) return pl_error_set(PL_ERR_NOMEM, "ilora: out of memory");
    for (int64_t i = 0; i < B; i++)
        rows[i] = m->pred_rows + i;
    pl_status st = pl_outputs_add(o, "top_items", items);
    if (!st) st = pl_outputs_add(o, "top_scores", scores);
    if (!st) st = pl_outputs_add(o, "row", host_rows_i64(rows, B));
    if (!st && users) st = pl_outputs_add(o, "user_index", users);
    if (!st && tg) st = pl_outputs_add(o, "target", tg);
    if (!st) m->pred_rows += B;
    free(rows);
    return st;
}

/* predict_batch on a device (issue 35): the top-k after the exclusions is
 * taken there (ilora_topk_device), so [B, k] items and scores come back, not
 * the [B, V] logits; the same outputs as the host path. Taken when the
 * exclusions are the history field [B, H] or none; the history CSR and the
 * input window stay on the host. */
static pl_status predict_batch_device(ilora_model *m, const pl_batch *b, pl_tensor *ids,
                                      pl_tensor *seen, pl_outputs *o) {
    int64_t B = ids->shape[0], K = m->o.predict_top_k;
    pl_tensor *lg = ilora_last_logits(m, ids, NULL, NULL), *v = NULL, *ix = NULL;
    if (!lg) return pl_error_status();
    pl_tensor *lf = lg->dtype == PL_F32 ? lg : pl_tensor_to(lg, PL_F32, lg->device);
    if (seen && !pl_tensor_is_contiguous(seen)) seen = pl_contiguous(seen);
    pl_status st = ilora_topk_device(lf, seen, K, &m->rank_off, &v, &ix);
    if (st) return st;
    pl_tensor *uf = pl_batch_find(b, m->o.user_field), *tf = pl_batch_find(b, m->o.target_field);
    pl_tensor *users = uf ? field_rows(uf, m->o.user_field, B) : NULL;
    pl_tensor *tg = tf ? field_rows(tf, m->o.target_field, B) : NULL;
    if ((uf && !users) || (tf && !tg)) return pl_error_status();
    return predict_add(m, o, B, pl_tensor_to(ix, PL_I32, ix->device), v, users, tg);
}

static pl_status predict_batch(ilora_model *m, const pl_batch *b, pl_data_split split,
                               pl_outputs *o) {
    pl_tensor *ids = ilora_need_field(b, m->o.input_field, "input_field");
    if (!ids) return pl_error_status();
    if (ids->ndim != 2) {
        char d[256];
        return pl_error_set(PL_ERR_SHAPE, "ilora: input ids %s must be [B, L]",
                            pl_tensor_describe(ids, d, sizeof d));
    }
    int64_t B = ids->shape[0], V = m->vocab, K = m->o.predict_top_k;
    pl_tensor *hf = m->o.exclude_history ? pl_batch_find(b, m->o.history_field) : NULL;
    if (m->ctx->device.type != PL_DEVICE_CPU && V <= (1 << 24) &&
        !getenv("PL_ILORA_PREDICT_HOST_TOPK") && (!m->o.exclude_history ||
        (hf && hf->ndim == 2 && hf->shape[0] == B)))
        return predict_batch_device(m, b, ids, hf, o);
    pl_tensor *host = NULL;
    if (!ilora_last_logits(m, ids, &host, NULL)) return pl_error_status();
    pl_tensor *uf = pl_batch_find(b, m->o.user_field), *tf = pl_batch_find(b, m->o.target_field);
    int64_t *users = NULL, *tg = NULL;
    seen_items seen = {0};
    pl_status st = PL_OK;
    if (uf && !(users = ilora_host_index(uf, m->o.user_field))) st = pl_error_status();
    if (!st && uf && pl_tensor_numel(uf) != B)
        st = pl_error_set(PL_ERR_SHAPE, "ilora: field '%s' must hold one user per row (%lld)",
                          m->o.user_field, (long long)B);
    if (!st && tf && !(tg = ilora_host_index(tf, m->o.target_field))) st = pl_error_status();
    if (!st && tf && pl_tensor_numel(tf) != B)
        st = pl_error_set(PL_ERR_SHAPE, "ilora: field '%s' must hold one target per row (%lld)",
                          m->o.target_field, (long long)B);
    /* a target is never read for the prediction: nothing is kept in the ranking */
    if (!st) st = ilora_seen_open(m, b, split, ids, users, &seen);
    const float *lh = st ? NULL : pl_tensor_f32(host);
    float *row = st ? NULL : malloc((size_t)V * sizeof *row);
    int32_t *top = st ? NULL : malloc((size_t)(B * K) * sizeof *top);
    float *val = st ? NULL : malloc((size_t)(B * K) * sizeof *val);
    if (!st && (!lh || !row || !top || !val))
        st = lh ? pl_error_set(PL_ERR_NOMEM, "ilora: out of memory") : pl_error_status();
    for (int64_t i = 0; !st && i < B; i++) {
        memcpy(row, lh + i * V, (size_t)V * sizeof *row);
        row[0] = -INFINITY;
        if ((st = ilora_seen_mask(&seen, i, 0, row, V, split))) break;
        ilora_topk(row, V, K, top + i * K, val + i * K);
    }
    if (!st)
        st = predict_add(m, o, B, pl_tensor_from_data(PL_I32, 2, (int64_t[]){B, K}, top, PL_CPU),
                         pl_tensor_from_data(PL_F32, 2, (int64_t[]){B, K}, val, PL_CPU),
                         users ? host_rows_i64(users, B) : NULL, tg ? host_rows_i64(tg, B) : NULL);
    free(row);
    free(top);
    free(val);
    ilora_seen_free(&seen);
    free(users);
    free(tg);
    return st;
}

/* The model's outputs: predictions (above) and the teacher outputs
 * (teacher_export.c). */
static pl_status vt_outputs_begin(void *self, pl_outputs_purpose purpose, pl_outputs *out) {
    return purpose == PL_OUTPUTS_EXPORT ? ilora_teacher_begin(self, out)
                                        : predict_begin(self, out);
}

static pl_status vt_outputs_batch(void *self, pl_outputs_purpose purpose, const pl_batch *b,
                                  pl_data_split split, pl_outputs *out) {
    return purpose == PL_OUTPUTS_EXPORT ? ilora_teacher_batch(self, b, split, out)
                                        : predict_batch(self, b, split, out);
}

/* ---- plugin glue -------------------------------------------------------------------------- */

static pl_status vt_create(const pl_config_section *cfg, pl_run_context *ctx, void **self) {
    ilora_opts o;
    pl_status st = ilora_opts_read(cfg, &o);
    if (st) return st;
    ilora_model *m = NULL;
    st = ilora_model_create(&o, ctx, &m);
    if (!st && (st = ilora_kd_temperature(m))) {
        ilora_model_destroy(m);
        m = NULL;
    }
    *self = m;
    return st;
}

static void vt_destroy(void *self) { ilora_model_destroy(self); }

/* Training reads item ids and next-item labels per position; evaluation
 * reads the ids and the held-out target per user, plus the history to
 * exclude from the ranking (as a field, or looked up by user index) and
 * the row index the export records, when present. */
pl_status ilora_batch_needs(const pl_config_section *cfg, pl_field_list *out) {
    const unsigned train = PL_SPLIT_BIT(PL_SPLIT_TRAIN);
    const unsigned eval = PL_SPLIT_BIT(PL_SPLIT_VAL) | PL_SPLIT_BIT(PL_SPLIT_TEST);
    pl_status st = pl_fields_add(out, pl_cfg_str(cfg, "input_field", "input_ids"), PL_DTYPE_INDEX,
                                 2, false);
    if (!st) st = pl_fields_add_in(out, train, pl_cfg_str(cfg, "label_field", "labels"),
                                   PL_DTYPE_INDEX, 2, false);
    if (!st) st = pl_fields_add_in(out, eval, pl_cfg_str(cfg, "target_field", "target"),
                                   PL_DTYPE_INDEX, -1, false);
    if (!st) st = pl_fields_add_in(out, eval, pl_cfg_str(cfg, "history_field", "history"),
                                   PL_DTYPE_INDEX, 2, true);
    if (!st) st = pl_fields_add_in(out, eval, pl_cfg_str(cfg, "user_field", "user_index"),
                                   PL_DTYPE_INDEX, -1, true);
    if (!st) st = pl_fields_add(out, pl_cfg_str(cfg, "row_field", "row"), PL_DTYPE_INDEX, -1, true);
    if (!st && pl_cfg_float(cfg, "kd_weight", 0) > 0) { /* distill.h */
        st = pl_fields_add_in(out, train, "kd_ids", PL_DTYPE_INDEX, 3, false);
        if (!st) st = pl_fields_add_in(out, train, "kd_logits", PL_F32, 3, false);
        if (!st) st = pl_fields_add_in(out, train, "kd_lognorm", PL_F32, 2, false);
    }
    return st;
}

static const pl_model_vtable ilora_vtable = {
    .create = vt_create,
    .batch_needs = ilora_batch_needs,
    .destroy = vt_destroy,
    .forward = ilora_forward,
    .on_load = NULL,
    .predict_needs = ilora_predict_needs,
    .export_model = ilora_export_model,
    .outputs_begin = vt_outputs_begin,
    .outputs_batch = vt_outputs_batch,
};

PL_PLUGIN_DEFINE(ilora, PL_KIND_MODEL, "0.1.0",
                 "Llama-style item decoder with MoE-LoRA adapters (iLoRA) for next-item "
                 "recommendation", ilora_options, &ilora_vtable)
