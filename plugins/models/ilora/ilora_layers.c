/* ilora_layers.c - the ilora decoder: adapted projections, the layers, the router,
 * the final hidden states and the logits. */
#include "ilora_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
/* Re-read every parameter tensor from the params list: a precision plugin
 * may have replaced some (qlora4: frozen projections -> nf4 tensors). */
static void refresh_params(ilora_model *m) {
    for (int i = 0; i < m->n_slots; i++) {
        pl_param *p = pl_params_at(m->params, m->slot[i].index);
        if (p) *m->slot[i].dst = p->t;
    }
}

void ilora_refresh_params(ilora_model *m) { refresh_params(m); }

/* The item embedding as a float tensor: itself, or (qlora4: frozen and
 * quantized to nf4) a dequantized f32 copy made once per forward, as QLoRA
 * dequantizes frozen weights on the fly. No gradient flows to it either way. */
static pl_tensor *embed_weight(ilora_model *m) {
    if (m->embed->dtype != PL_NF4) return m->embed;
    if (!m->embed_deq) m->embed_deq = pl_nf4_dequantize(m->embed, PL_F32);
    return m->embed_deq;
}

/* ---- layers ------------------------------------------------------------------------------ */

pl_tensor *ilora_base_linear(pl_tensor *x, pl_tensor *w) {
    if (!x || !w) return NULL;
    /* a frozen base weight quantized by qlora4: x @ dequant(W)^T */
    if (w->dtype == PL_NF4) return pl_nf4_matmul(x, w);
    return pl_linear(x, w, NULL);
}

pl_tensor *ilora_gate_expand(pl_tensor *g, pl_tensor *gate_index) {
    if (!g || !gate_index) return NULL;
    pl_tensor *ge = pl_index_select(g, g->ndim - 1, gate_index); /* [B, (L,) E*r_e] */
    if (!ge || g->ndim == 3) return ge;
    return pl_reshape(ge, 3, (int64_t[]){ge->shape[0], 1, ge->shape[1]});
}

static pl_tensor *moe_lora_linear_body(pl_tensor *x, pl_tensor *w0, pl_tensor *a, pl_tensor *b,
                                       pl_tensor *gexp, double scale, double p_drop,
                                       uint64_t seed, uint64_t counter, bool training,
                                       pl_dtype out, ilora_branch *bc);

pl_tensor *ilora_moe_lora_linear(pl_tensor *x, pl_tensor *w0, pl_tensor *a, pl_tensor *b,
                                 pl_tensor *gexp, double scale, double p_drop, uint64_t seed,
                                 uint64_t counter, bool training) {
    return ilora_moe_lora_linear_ck(x, w0, a, b, gexp, scale, p_drop, seed, counter, training,
                                    PL_F32, NULL);
}

pl_tensor *ilora_moe_lora_linear_ck(pl_tensor *x, pl_tensor *w0, pl_tensor *a, pl_tensor *b,
                                    pl_tensor *gexp, double scale, double p_drop, uint64_t seed,
                                    uint64_t counter, bool training, pl_dtype out,
                                    ilora_branch *bc) {
    /* a frame of its own: the base output before the adapter's add, the
     * adapter's intermediates and the dropped input go when the projection
     * is done, unless the tape keeps them (issue 31: they lived to the end
     * of the layer, seven projections' worth, 1.1 GiB of a 7B layer) */
    pl_frame_begin();
    return pl_frame_end_keep(moe_lora_linear_body(x, w0, a, b, gexp, scale, p_drop, seed, counter,
                                                  training, out, bc));
}

/* scale * ((drop(x) A^T) * gexp) B^T over in = {x, A, B[, gexp]}: the
 * branch alone (pl_lora_add_dropout without y), for the recomputed path;
 * the same mask and bits as pl_dropout then pl_lora_add */
static pl_tensor *adapter_branch(void *ctxp, pl_tensor *const *in, int n_in) {
    const ilora_branch *c = ctxp;
    return pl_lora_add_dropout(NULL, in[0], in[1], in[2], n_in > 3 ? in[3] : NULL, c->scale,
                               c->p_drop, c->seed, c->counter, c->training);
}

static pl_tensor *moe_lora_linear_body(pl_tensor *x, pl_tensor *w0, pl_tensor *a, pl_tensor *b,
                                       pl_tensor *gexp, double scale, double p_drop,
                                       uint64_t seed, uint64_t counter, bool training,
                                       pl_dtype out, ilora_branch *bc) {
    pl_tensor *y = ilora_base_linear(x, w0);
    /* under autocast the GEMM returns bf16/f16; the residual stream runs in
     * `out` (f32 under fp32 / bf16-mixed / qlora4, as the precision plugins
     * document; the backbone's bf16 under bf16-true), so convert once here */
    if (y && y->dtype != out) y = pl_cast(y, out);
    if (!a || !y) return y;
    ilora_branch local = {.scale = scale, .p_drop = p_drop, .seed = seed, .counter = counter,
                          .training = training};
    pl_tensor *in[4] = {x, a, b, gexp};
    int n_in = gexp ? 4 : 3;
    if (bc && training && p_drop > 0.0) { /* recomputed in backward (ilora.h) */
        *bc = local;
        return pl_add(y, pl_checkpoint(adapter_branch, bc, in, n_in));
    }
    /* y + scale ((drop(x) A^T) * gexp) B^T as one op (issues 35, 31): two
     * GEMMs, the second accumulating into y, with the dropout inside (PEFT's
     * lora_dropout; y is the base output of x undropped); the tape keeps x
     * itself (one tensor however many projections read it: q, k and v read
     * the same x) and the rank-r t = drop(x) A^T, never a dropped copy of x,
     * its mask, the gated copy, the branch or its scaled copy: the mask is
     * regenerated from (seed, counter) in backward */
    return pl_lora_add_dropout(y, x, a, b, gexp, scale, p_drop, seed, counter, training);
}

/* Host copy of an index tensor as i64 (caller frees). */
int64_t *ilora_host_index(pl_tensor *t, const char *what) {
    char b[256];
    if (!t) return NULL;
    if (t->dtype != PL_I32 && t->dtype != PL_I64) {
        pl_error_set(PL_ERR_DTYPE, "ilora: batch field '%s' %s must be i32 or i64", what,
                     pl_tensor_describe(t, b, sizeof b));
        return NULL;
    }
    int64_t n = pl_tensor_numel(t);
    int64_t *out = malloc((size_t)(n ? n : 1) * sizeof *out);
    if (!out) {
        pl_error_set(PL_ERR_NOMEM, "ilora: out of memory");
        return NULL;
    }
    pl_tensor *h = t;
    if (t->device.type != PL_DEVICE_CPU || !pl_tensor_is_contiguous(t) || t->dtype != PL_I64) {
        pl_frame_begin();
        h = pl_tensor_to(t, PL_I64, PL_CPU);
        if (h) pl_frame_keep(h);
        pl_frame_end();
        if (!h) {
            free(out);
            return NULL;
        }
        memcpy(out, pl_tensor_data(h), (size_t)n * sizeof *out);
        pl_tensor_release(h);
    } else {
        memcpy(out, pl_tensor_data(t), (size_t)n * sizeof *out);
    }
    return out;
}

/* Per-forward constants computed from the ids on their device (nothing is
 * read back: on a GPU that would make every forward wait for the device). */
typedef struct fwd_state {
    int64_t B, L;
    pl_tensor *is_pad;   /* f32 [B, L]: 1 at padding ids, 0 at items */
    pl_tensor *pad_bias; /* f32 [B, 1, 1, L]: 0 for items, -1e9 for padding keys */
} fwd_state;

static pl_status fwd_state_init(fwd_state *s, pl_tensor *ids, int64_t pad_id, pl_device dev) {
    char b[256];
    memset(s, 0, sizeof *s);
    if (ids->ndim != 2)
        return pl_error_set(PL_ERR_SHAPE, "ilora: input ids %s must be [B, L]",
                            pl_tensor_describe(ids, b, sizeof b));
    if (ids->dtype != PL_I32 && ids->dtype != PL_I64)
        return pl_error_set(PL_ERR_DTYPE, "ilora: input ids %s must be i32 or i64",
                            pl_tensor_describe(ids, b, sizeof b));
    s->B = ids->shape[0];
    s->L = ids->shape[1];
    /* for integer ids, d = id - pad_id: relu(1 - d*d) is 1 at padding and 0
     * at every other id (|d| >= 1), exactly in f32 for ids below 2^24 */
    pl_no_grad_begin();
    pl_tensor *d = pl_add_scalar(pl_tensor_to(ids, PL_F32, dev), -(double)pad_id);
    s->is_pad = pl_relu(pl_add_scalar(pl_scale(pl_square(d), -1.0), 1.0));
    s->pad_bias = s->is_pad ? pl_scale(pl_reshape(s->is_pad, 4, (int64_t[]){s->B, 1, 1, s->L}),
                                       -1e9)
                            : NULL;
    pl_no_grad_end();
    return s->pad_bias ? PL_OK : pl_error_prefix(pl_error_status(), "ilora: padding mask");
}

/* Philox counter of dropout site `site` in micro-step `micro` (a resumed or
 * recomputed forward draws the same masks). */
static uint64_t drop_counter(uint64_t micro, uint64_t site) { return (micro << 16) | site; }

/* One decoder layer, as a function of its inputs (the residual stream h
 * [B, L, D] f32 and the expanded gates, or none) so that it can be
 * recomputed during backward (gradient_checkpointing). Deterministic: its
 * dropout masks are Philox streams of (seed, micro-step, site). */
typedef struct ilora_layer_ctx {
    ilora_model *m;
    int64_t l, B, L;
    pl_tensor *pad_bias; /* borrowed: the model keeps it until the next forward */
    uint64_t micro;      /* the micro-step of the forward (dropout counters) */
    bool training;
    bool last_only; /* queries, residual and MLP of position L-1 only (evaluation) */
    bool base_only; /* the backbone alone: no adapters (the router's input pass) */
} ilora_layer_ctx;

/* Self-attention of q [B, T, H, Dh] over k, v [B, L, KV, Dh] (query i at key
 * position L - T + i) with the additive padding bias [B, 1, 1, L] ->
 * [B, H, T, Dh]. sdpa (the default): the fused op, which reads kv head h/rep
 * for query head h in place and keeps q, k, v, its output and a logsumexp
 * per row; eager: HF's eager_attention_forward (repeat_kv, scores, causal
 * softmax, probabilities @ v), which keeps the T x L probabilities and the
 * expanded k, v. The bias is added unscaled in both: eager scales the sum
 * q k^T + bias by 1/sqrt(Dh) inside causal_softmax, which only matters for
 * masked keys (-1e9 either way: probability 0). */
static pl_tensor *attention(ilora_model *m, pl_tensor *q, pl_tensor *k, pl_tensor *v,
                            pl_tensor *pad_bias) {
    double scale = 1.0 / sqrt((double)m->head_dim);
    q = pl_transpose(q, 1, 2); /* [B, H, T, Dh] */
    if (!m->o.attn_eager)
        return pl_attention(q, pl_transpose(k, 1, 2), pl_transpose(v, 1, 2), pad_bias, scale,
                            true);
    if (m->kv_index) { /* grouped-query attention: HF repeat_kv, query head h reads kv head h/rep */
        k = pl_index_select(k, 2, m->kv_index);
        v = pl_index_select(v, 2, m->kv_index);
    }
    k = pl_transpose(k, 1, 2);
    v = pl_transpose(v, 1, 2);
    pl_tensor *sc = pl_add(pl_matmul(q, k, false, true), pad_bias); /* [B, H, T, L] */
    return pl_matmul(pl_causal_softmax(sc, scale), v, false, false);
}

static pl_tensor *layer_forward(void *ctxp, pl_tensor *const *in, int n_in) {
    const ilora_layer_ctx *c = ctxp;
    ilora_model *m = c->m;
    const ilora_opts *o = &m->o;
    pl_tensor *h = in[0], *gexp = n_in > 1 ? in[1] : NULL;
    const pl_dtype act = h->dtype; /* the residual stream's (stream_dtype) */
    int64_t B = c->B, L = c->L, H = o->heads, KV = m->kv_heads, Dh = m->head_dim;
    uint64_t seed = m->ctx->seed, site = 1 + (uint64_t)c->l * 16;
    bool training = c->training;
    /* last_only: keys and values of every position, the rest for position
     * L-1 alone (nothing later in a causal model reads the others) */
    int64_t T = c->last_only ? 1 : L;
    /* gates per position [B, L, E*r_e] follow the positions they gate; per
     * row [B, 1, E*r_e] broadcast */
    pl_tensor *gq = gexp && T < L && gexp->shape[1] == L ? pl_slice(gexp, 1, L - T, L) : gexp;
    ilora_layer *ly = &m->layer[c->l];
#define PROJ(i, x, g)                                                                              \
    ilora_moe_lora_linear_ck((x), ly->proj[i].w, c->base_only ? NULL : ly->proj[i].lora_a,         \
                             ly->proj[i].lora_b, (g), m->lora_scale, o->lora_dropout, seed,        \
                             drop_counter(c->micro, site + 2 + (i)), training, act,                \
                             o->lora_recompute ? &ly->proj[i].branch : NULL)
    pl_tensor *x = pl_rms_norm(h, ly->input_norm, o->norm_eps);
    pl_tensor *xq = T < L ? pl_slice(x, 1, L - T, L) : x;
    pl_tensor *q =
        pl_rope(pl_reshape(PROJ(0, xq, gq), 4, (int64_t[]){B, T, H, Dh}), L - T, o->rope_theta);
    pl_tensor *k =
        pl_rope(pl_reshape(PROJ(1, x, gexp), 4, (int64_t[]){B, L, KV, Dh}), 0, o->rope_theta);
    pl_tensor *v = pl_reshape(PROJ(2, x, gexp), 4, (int64_t[]){B, L, KV, Dh});
    pl_tensor *att = attention(m, q, k, v, c->pad_bias);
    att = pl_reshape(pl_transpose(att, 1, 2), 3, (int64_t[]){B, T, m->q_dim});
    pl_tensor *ao = PROJ(3, att, gq);
    if (T < L) h = pl_slice(h, 1, L - T, L);
    h = pl_add(h, pl_dropout(ao, o->dropout, seed, drop_counter(c->micro, site), training));
    x = pl_rms_norm(h, ly->post_norm, o->norm_eps);
    /* LlamaMLP's act_fn(gate) * up as one op: the tape keeps gate and up, not
     * silu(gate) too (same bits as pl_mul(pl_silu(gate), up)) */
    pl_tensor *mid = pl_swiglu(PROJ(4, x, gq), PROJ(5, x, gq));
    pl_tensor *mo = PROJ(6, mid, gq);
#undef PROJ
    return pl_add(h, pl_dropout(mo, o->dropout, seed, drop_counter(c->micro, site + 1), training));
}

/* The residual stream's dtype: the backbone's when its frozen weights are
 * stored half (bf16-true: the whole model in bf16, as Lightning's
 * "bf16-true" and a model.to(torch.bfloat16) run); the compute dtype when
 * they are NF4 (qlora4: bitsandbytes' compute_dtype, a QLoRA model loaded
 * in bf16); else f32 (fp32 and bf16-mixed, whose elementwise math stays f32
 * as torch.autocast's). */
static pl_dtype stream_dtype(const ilora_model *m) {
    if (m->o.layers < 1) return PL_F32;
    pl_dtype dt = m->layer[0].proj[0].w ? m->layer[0].proj[0].w->dtype : PL_F32;
    if (dt == PL_NF4) dt = pl_autocast_get();
    return dt == PL_BF16 || dt == PL_F16 ? dt : PL_F32;
}

/* Embeddings, decoder layers and final norm over ids [B, L] (fwd_state s),
 * with expanded gates gexp (or NULL) -> [B, L, D], or [B, 1, D] when
 * last_only. base_only runs the backbone without its adapters. */
static pl_tensor *run_layers(ilora_model *m, pl_tensor *ids, const fwd_state *s, pl_tensor *gexp,
                             bool training, bool last_only, bool base_only) {
    const ilora_opts *o = &m->o;
    uint64_t seed = m->ctx->seed, micro = m->ctx ? (uint64_t)m->ctx->micro_step : 0;
    pl_tensor *h = pl_embedding(embed_weight(m), ids);
    if (m->item_proj_w) h = pl_linear(h, m->item_proj_w, m->item_proj_b); /* item -> hidden */
    pl_dtype act = stream_dtype(m);
    if (h && h->dtype != act) h = pl_cast(h, act);
    h = pl_dropout(h, o->dropout, seed, drop_counter(micro, 0), training);
    bool recompute = o->gradient_checkpointing && training && pl_grad_enabled();
    pl_tensor_release(m->pad_bias); /* the previous forward's, kept for its backward */
    m->pad_bias = NULL;
    if (s->pad_bias && s->pad_bias->dtype != act) { /* HF: the mask in the model's dtype */
        pl_no_grad_begin();
        m->pad_bias = pl_frame_keep(pl_cast(s->pad_bias, act));
        pl_no_grad_end();
    } else {
        m->pad_bias = pl_tensor_retain(s->pad_bias);
    }
    /* held: our reference to the last layer's output. Each layer's input
     * goes as soon as the next layer has run (unless the tape or a
     * checkpoint keeps it for backward): were the outputs handed to the
     * caller's frame, every layer's would live until the step ends (issue
     * 31: the router's no-grad pass held 32 of them, 800 MiB at 7B, batch
     * 64). */
    pl_tensor *held = NULL;
    for (int64_t l = 0; l < o->layers && h; l++) {
        /* one frame per layer: its temporaries go as soon as the layer is done
         * (evaluation peak = one layer; backward keeps what it needs) */
        pl_frame_begin();
        /* the context outlives this call: a checkpointed layer reads it
         * again during backward */
        ilora_layer_ctx *c = &m->layer_ctx[l];
        *c = (ilora_layer_ctx){.m = m,
                               .l = l,
                               .B = s->B,
                               .L = s->L,
                               .pad_bias = m->pad_bias,
                               .micro = micro,
                               .training = training,
                               .last_only = last_only && l == o->layers - 1,
                               .base_only = base_only};
        pl_tensor *in[2] = {h, gexp};
        pl_tensor *y = recompute ? pl_checkpoint(layer_forward, c, in, gexp ? 2 : 1)
                                 : layer_forward(c, in, gexp ? 2 : 1);
        pl_tensor_retain(y);
        pl_frame_end();
        pl_tensor_release(held);
        h = held = y;
    }
    pl_tensor *out = h ? pl_rms_norm(h, m->norm, o->norm_eps) : NULL;
    pl_tensor_release(held); /* the norm's tape node keeps it where backward needs it */
    return out;
}

/* The router's logits z / router_temperature (f32): per position [B, L, E]
 * from the backbone's own final hidden states (last_hidden; a forward pass
 * without adapters, dropout or gradient), or per row [B, E] from the mean
 * item embedding of the row's non-pad ids (mean_embedding). The router's
 * input is a fixed, detached representation: gradients reach the router's
 * weight and bias only. */
static pl_tensor *router_logits(ilora_model *m, pl_tensor *ids, const fwd_state *s) {
    int64_t B = s->B, L = s->L;
    pl_tensor *rep = NULL;
    pl_no_grad_begin();
    if (m->o.router_input == ILORA_ROUTER_LAST_HIDDEN) {
        rep = run_layers(m, ids, s, NULL, false, false, true); /* [B, L, D] */
    } else {
        /* item mask 1 - is_pad and 1 / count per row on the device: c / (c*c)
         * rounds as 1 / c does for a count c >= 1, and is 0 for c = 0 */
        pl_tensor *mk = pl_reshape(pl_add_scalar(pl_scale(s->is_pad, -1.0), 1.0), 3,
                                   (int64_t[]){B, L, 1});
        pl_tensor *c = pl_sum(pl_reshape(mk, 2, (int64_t[]){B, L}), 1, true); /* [B, 1] */
        pl_tensor *iv = pl_div(c, pl_add_scalar(pl_square(c), 1e-30));
        pl_tensor *e = pl_embedding(embed_weight(m), ids);
        rep = pl_mul(pl_sum(pl_mul(e, mk), 1, false), iv); /* [B, W] */
    }
    if (rep && rep->dtype != PL_F32) rep = pl_cast(rep, PL_F32);
    pl_no_grad_end();
    pl_tensor *z = rep ? pl_linear(rep, m->router_w, m->router_b) : NULL;
    if (z && z->dtype != PL_F32) z = pl_cast(z, PL_F32);
    if (z && m->o.router_temperature != 1.0) z = pl_scale(z, 1.0 / m->o.router_temperature);
    return z;
}

/* What every forward does first: re-read the parameters (a precision stage
 * may have replaced them; the dequantized table of the last forward is
 * stale), the per-forward constants of ids [B, L] (s: frame-owned tensors),
 * the max_len check, the layer contexts. */
static pl_status fwd_begin(ilora_model *m, pl_tensor *ids, fwd_state *s) {
    refresh_params(m);
    pl_tensor_release(m->embed_deq);
    m->embed_deq = NULL;
    if (fwd_state_init(s, ids, m->pad_id, m->ctx->device)) return pl_error_status();
    if (s->L > m->o.max_len) {
        char b[256];
        return pl_error_set(PL_ERR_SHAPE, "ilora: input ids %s are longer than max_len %lld",
                            pl_tensor_describe(ids, b, sizeof b), (long long)m->o.max_len);
    }
    if (!m->layer_ctx && !(m->layer_ctx = calloc((size_t)m->o.layers, sizeof *m->layer_ctx)))
        return pl_error_set(PL_ERR_NOMEM, "ilora: out of memory");
    return PL_OK;
}

pl_tensor *ilora_hidden_forward(ilora_model *m, pl_tensor *ids, bool training, bool last_only,
                                route *rt) {
    if (rt) *rt = (route){0};
    if (!ids) return NULL;
    pl_tensor *h = NULL, *gexp = NULL;
    fwd_state s;
    if (fwd_begin(m, ids, &s)) goto done;
    if (m->router_w) {
        pl_tensor *z = router_logits(m, ids, &s);
        pl_tensor *g = z ? pl_softmax(z) : NULL;
        if (!g) goto done;
        if (!(gexp = ilora_gate_expand(g, m->gate_index))) goto done;
        if (rt) *rt = (route){g, z};
    }
    h = run_layers(m, ids, &s, gexp, training, last_only, false);
done:
    return h;
}

pl_tensor *ilora_gates(ilora_model *m, pl_tensor *ids) {
    if (!m->router_w || !ids) return NULL;
    fwd_state s;
    return fwd_begin(m, ids, &s) ? NULL : pl_softmax(router_logits(m, ids, &s));
}

pl_tensor *ilora_hidden(ilora_model *m, pl_tensor *ids, bool training) {
    return ilora_hidden_forward(m, ids, training, false, NULL);
}

/* The last position's final hidden state [B, D] without dropout, and the
 * forward's router output (rt may be NULL). */
pl_tensor *ilora_last_hidden_rt(ilora_model *m, pl_tensor *ids, route *rt) {
    if (m->o.layers < 1) { /* no layer to cut: the last position of the full forward */
        pl_tensor *h = ilora_hidden_forward(m, ids, false, false, rt);
        if (!h) return NULL;
        int64_t L = h->shape[1];
        return pl_reshape(pl_slice(h, 1, L - 1, L), 2, (int64_t[]){h->shape[0], m->o.dim});
    }
    pl_tensor *h = ilora_hidden_forward(m, ids, false, true, rt); /* [B, 1, D] */
    return h ? pl_reshape(h, 2, (int64_t[]){h->shape[0], m->o.dim}) : NULL;
}

pl_tensor *ilora_last_hidden(ilora_model *m, pl_tensor *ids) {
    return ilora_last_hidden_rt(m, ids, NULL);
}

pl_tensor *ilora_logits(ilora_model *m, pl_tensor *h) {
    /* items in front of a pretrained body: score every item by its table row
     * through the output projection (E4SRec-style item head, see README) */
    if (m->score_proj) return pl_matmul(pl_linear(h, m->score_proj, NULL), embed_weight(m), false,
                                        true);
    if (m->lm_head) return ilora_base_linear(h, m->lm_head);
    return m->embed->dtype == PL_NF4 ? pl_nf4_matmul(h, m->embed)
                                     : pl_matmul(h, m->embed, false, true);
}

pl_tensor *ilora_head_loss(ilora_model *m, pl_tensor *h, pl_tensor *tg, int64_t ign,
                           pl_tensor **logits) {
    *logits = NULL;
    if (!h || !tg) return NULL;
    if (!(m->o.kd_weight > 0) && !m->score_proj && !m->lm_head && m->embed->dtype == PL_F32)
        return pl_linear_cross_entropy(h, m->embed, tg, ign, 0.0);
    *logits = ilora_logits(m, h);
    return *logits ? pl_cross_entropy(*logits, tg, ign, 0.0) : NULL;
}
