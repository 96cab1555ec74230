/* ilora_params.c - building the ilora model: its parameters (initialized, or views of
 * a checkpoint's tensors), ilora_model_create and ilora_model_destroy. */
#include "ilora_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pl_h5.h"
#include "teacher_export.h"
/* ---- parameters --------------------------------------------------------------------------- */

/* Philox streams of the initializers: fixed per parameter so that the
 * backbone gets the same init whatever adapters are configured. */
enum { STREAM_EMBED = 1, STREAM_LM_HEAD = 2, STREAM_ROUTER_W = 3, STREAM_ROUTER_B = 4,
       STREAM_ITEM_PROJ = 5, STREAM_SCORE_PROJ = 7, STREAM_PROJ = 100, STREAM_LORA_A = 100000 };

/* Remember where parameter t (just added, the last of the list) lives, so
 * refresh_params() can re-read it into *dst. */
static pl_tensor *track(ilora_model *m, pl_tensor **dst, pl_tensor *t, bool trainable) {
    pl_tensor_set_requires_grad(t, trainable);
    if (m->n_slots == ILORA_MAX_PARAMS) {
        pl_error_set(PL_ERR_INVALID, "ilora: more than %d parameters", ILORA_MAX_PARAMS);
        return NULL;
    }
    m->slot[m->n_slots].dst = dst;
    m->slot[m->n_slots++].index = pl_params_count(m->params) - 1;
    return t;
}

/* The last parameter added is final (values drawn or loaded, requires_grad
 * set): seal it, so the run's precision may convert it now (qlora4: a
 * frozen base weight to NF4 at once, never the whole backbone in bf16 on
 * the device). Returns the parameter's tensor after that, or NULL. */
static pl_tensor *sealed(ilora_model *m) {
    int i = pl_params_count(m->params) - 1;
    return pl_params_seal(m->params, i) ? NULL : pl_params_at(m->params, i)->t;
}

/* A zero f32 parameter with PL_TAG_* `tags` and `role` ("lora", "router",
 * "head" - what optimizer groups select with group.NAME.tags - or NULL). */
static pl_tensor *new_param(ilora_model *m, pl_tensor **dst, const char *name, int ndim,
                            const int64_t *shape, unsigned tags, const char *role,
                            bool trainable) {
    /* called inside create's frame: the frame's reference goes at its end,
     * the params list keeps its own */
    pl_tensor *t = pl_tensor_zeros(PL_F32, ndim, shape, m->ctx->device);
    if (!t || pl_params_add(m->params, name, t, tags, role)) return NULL;
    return track(m, dst, t, trainable);
}

/* A backbone weight: a view of the checkpoint's tensor (kept in the file's
 * dtype; the precision stage converts it) or, without a checkpoint, a new f32
 * parameter drawn from N(0, init_std) (fill >= 0: constant `fill`). */
static pl_tensor *base_param(ilora_model *m, hf_llama *hf, pl_tensor **dst, const char *name,
                             int ndim, const int64_t *shape, unsigned tags, const char *role,
                             bool trainable, uint64_t stream, double fill) {
    if (!hf) {
        pl_tensor *t = new_param(m, dst, name, ndim, shape, tags, role, trainable);
        pl_status st = !t        ? pl_error_status()
                       : fill >= 0 ? pl_tensor_fill_(t, fill)
                                 : pl_tensor_normal_(t, 0, m->o.init_std, m->ctx->seed, stream);
        return st ? NULL : sealed(m);
    }
    if (hf_llama_is_random(hf)) { /* backbone_weights = random: on the device, no file */
        pl_tensor *t = pl_tensor_empty_owned(hf_llama_dtype(hf), ndim, shape, m->ctx->device);
        pl_status st = !t ? pl_error_status() : hf_llama_random_init(hf, t, name, m->ctx->seed);
        if (!st) pl_tensor_set_name(t, "%s", name);
        if (!st) st = pl_params_add(m->params, name, t, tags | PL_TAG_PRETRAINED, role);
        pl_tensor_release(t); /* the params list holds it */
        return st || !track(m, dst, t, trainable) ? NULL : sealed(m);
    }
    pl_tensor *v = hf_llama_tensor(hf, name, ndim, shape);
    if (!v) return NULL;
    pl_tensor *t = v;
    if (m->ctx->device.type != PL_DEVICE_CPU) {
        pl_frame_begin(); /* the copy is ours whatever frame the caller has open */
        t = pl_tensor_to(v, v->dtype, m->ctx->device);
        if (t) pl_frame_keep(t);
        pl_frame_end();
        pl_tensor_release(v);
        if (!t) return NULL;
    }
    pl_status st = pl_params_add(m->params, name, t, tags | PL_TAG_PRETRAINED, role);
    pl_tensor_release(t); /* the params list holds it */
    return st || !track(m, dst, t, trainable) ? NULL : sealed(m);
}

/* A Linear layer's weight (and bias) with nn.Linear's default init
 * U(-1/sqrt(in), 1/sqrt(in)), trainable. */
static pl_status linear_param(ilora_model *m, pl_tensor **w, pl_tensor **b, const char *name,
                              int64_t out, int64_t in, const char *role, uint64_t stream) {
    char n[PL_NAME_MAX];
    double bound = 1.0 / sqrt((double)in);
    snprintf(n, sizeof n, "%s.weight", name);
    *w = new_param(m, w, n, PL_SHAPE(out, in), 0, role, true);
    if (!*w) return pl_error_status();
    pl_status st = pl_tensor_uniform_(*w, -bound, bound, m->ctx->seed, stream);
    if (st || !b) return st;
    snprintf(n, sizeof n, "%s.bias", name);
    *b = new_param(m, b, n, PL_SHAPE(out), PL_TAG_NO_DECAY, role, true);
    return *b ? pl_tensor_uniform_(*b, -bound, bound, m->ctx->seed, stream + 1)
              : pl_error_status();
}

/* Step 1 of create: the model struct with the options checked, the backbone
 * opened (hf, or NULL without one) and its shape applied, num_items from the
 * loader when the options leave it 0. On error nothing is left open. */
static pl_status create_open(const ilora_opts *o, pl_run_context *ctx, ilora_model **out,
                             hf_llama **out_hf) {
    *out = NULL;
    *out_hf = NULL;
    if (!ctx || !ctx->params)
        return pl_error_set(PL_ERR_INVALID, "ilora: create needs a run context with params");
    pl_status st = ilora_check_opts(o);
    if (st) return st;
    ilora_model *m = calloc(1, sizeof *m);
    if (!m) return pl_error_set(PL_ERR_NOMEM, "ilora: out of memory");
    m->o = *o;
    m->ctx = ctx;
    m->params = ctx->params;
    m->device_loss = ctx->device.type != PL_DEVICE_CPU;
    hf_llama *hf = NULL;
    if (o->backbone[0]) {
        st = o->backbone_random ? hf_llama_open_config(o->backbone, ILORA_MAX_LAYERS, &hf)
                                : hf_llama_open(o->backbone, ILORA_MAX_LAYERS, &hf);
        if (!st) st = ilora_apply_backbone_config(&m->o, hf_llama_cfg(hf), hf_llama_dir(hf));
        if (!st) st = ilora_check_opts(&m->o);
        if (st) {
            hf_llama_close(hf);
            free(m);
            return st;
        }
    }
    bool tokens = m->o.token_inputs;
    if (!tokens && m->o.num_items <= 0) {
        if (!ctx->meta || pl_meta_get_int(ctx->meta, "num_items", &m->o.num_items)) {
            hf_llama_close(hf);
            free(m);
            return pl_error_prefix(PL_ERR_CONFIG, "[model] num_items is 0 and the loader did not "
                                   "publish it");
        }
        if (m->o.num_items <= 0) {
            long long ni = (long long)m->o.num_items;
            hf_llama_close(hf);
            free(m);
            return pl_error_set(PL_ERR_CONFIG, "ilora: loader meta num_items = %lld, expected > 0",
                                ni);
        }
    }
    *out = m;
    *out_hf = hf;
    return PL_OK;
}

/* Step 2: the sizes the options imply (vocabulary, head and FFN widths,
 * experts and their rank, the LoRA scale). */
static void create_sizes(ilora_model *m, const hf_llama *hf) {
    const ilora_opts *o = &m->o;
    bool tokens = o->token_inputs;
    int64_t D = o->dim;
    m->vocab = tokens ? hf_llama_cfg(hf)->vocab_size : m->o.num_items + 1;
    m->pad_id = tokens ? hf_llama_cfg(hf)->pad_token_id : 0;
    m->head_dim = o->head_dim ? o->head_dim : D / o->heads;
    m->kv_heads = o->kv_heads ? o->kv_heads : o->heads;
    m->q_dim = o->heads * m->head_dim;
    m->kv_dim = m->kv_heads * m->head_dim;
    m->ffn = o->ffn_dim > 0 ? o->ffn_dim : ((8 * D + 2) / 3 + 7) / 8 * 8;
    bool adapt = o->adapters != ILORA_NONE;
    int64_t E = o->adapters == ILORA_MOE_LORA ? o->num_experts : 1;
    if (!adapt) E = 0;
    m->o.num_experts = E;
    m->r_e = adapt ? o->lora_rank / E : 0;
    m->lora_scale = adapt ? o->lora_alpha / (double)m->r_e : 0;
}

/* Whether the backbone trains (not: adapters over a frozen base). */
static bool base_trains(const ilora_model *m) {
    return !(m->o.adapters != ILORA_NONE && m->o.freeze_base);
}

/* The width of the input table: item_dim for an item table in front of a
 * pretrained body, else dim. */
static int64_t table_width(const ilora_model *m, const hf_llama *hf) {
    bool item_front = hf && !m->o.token_inputs;
    return item_front ? m->o.item_dim : m->o.dim;
}

/* Step 3: the input embedding: the item table (items are the tokens, or an
 * item table in front of a checkpoint's body, then with its projection
 * item_proj), or the checkpoint's own tokens. BASE: qlora4 quantizes it when
 * frozen, and lookups and the tied head then read a dequantized copy
 * (embed_weight(), ilora_layers.c). */
static pl_status create_embedding(ilora_model *m, hf_llama *hf) {
    const ilora_opts *o = &m->o;
    bool tokens = o->token_inputs, item_front = hf && !tokens, base_train = base_trains(m);
    int64_t D = o->dim, V = m->vocab, W = table_width(m, hf);
    pl_status st = PL_OK;
    if (tokens) {
        m->embed = base_param(m, hf, &m->embed, "model.embed_tokens.weight", PL_SHAPE(V, D),
                              PL_TAG_NO_DECAY | PL_TAG_BASE, NULL, base_train || o->save_embed,
                              0, 0);
        if (!m->embed) st = pl_error_status();
    } else {
        m->embed = new_param(m, &m->embed, "model.embed_tokens.weight", PL_SHAPE(V, W),
                             PL_TAG_NO_DECAY | (item_front ? 0 : PL_TAG_BASE), NULL,
                             base_train || o->save_embed);
        if (m->embed) st = pl_tensor_normal_(m->embed, 0, o->init_std, m->ctx->seed, STREAM_EMBED);
        else st = pl_error_status();
        /* padding row 0 starts at zero (HF: padding_idx row zeroed at init) */
        if (!st) {
            pl_tensor *row0 = pl_tensor_view_rows(m->embed, 0, 1); /* the frame owns it */
            st = row0 ? pl_tensor_fill_(row0, 0.0) : pl_error_status();
        }
    }
    if (!st && item_front)
        st = linear_param(m, &m->item_proj_w, &m->item_proj_b, "item_proj", D, W, "projector",
                          STREAM_ITEM_PROJ);
    return st;
}

/* Step 4, per layer l: its two RMSNorm weights, its projections, and the
 * LoRA pair (A, B) of each adapted projection. */
static pl_status create_layer(ilora_model *m, hf_llama *hf, int64_t l) {
    const ilora_opts *o = &m->o;
    int64_t D = o->dim, E = o->num_experts;
    bool adapt = o->adapters != ILORA_NONE, base_train = base_trains(m);
    const int64_t in_dim[ILORA_NPROJ] = {D, D, D, m->q_dim, D, D, m->ffn};
    const int64_t out_dim[ILORA_NPROJ] = {m->q_dim, m->kv_dim, m->kv_dim, D, m->ffn, m->ffn, D};
    char name[PL_NAME_MAX];
    pl_status st = PL_OK;
    ilora_layer *ly = &m->layer[l];
    snprintf(name, sizeof name, "model.layers.%lld.input_layernorm.weight", (long long)l);
    ly->input_norm = base_param(m, hf, &ly->input_norm, name, PL_SHAPE(D), PL_TAG_NO_DECAY,
                                NULL, base_train, 0, 1.0);
    snprintf(name, sizeof name, "model.layers.%lld.post_attention_layernorm.weight",
             (long long)l);
    if (ly->input_norm)
        ly->post_norm = base_param(m, hf, &ly->post_norm, name, PL_SHAPE(D), PL_TAG_NO_DECAY,
                                   NULL, base_train, 0, 1.0);
    if (!ly->input_norm || !ly->post_norm) return pl_error_status();
    for (int i = 0; i < ILORA_NPROJ && !st; i++) {
        const char *blk = i < 4 ? "self_attn" : "mlp";
        snprintf(name, sizeof name, "model.layers.%lld.%s.%s.weight", (long long)l, blk,
                 ilora_proj_names[i]);
        ilora_proj *p = &ly->proj[i];
        p->w = base_param(m, hf, &p->w, name, PL_SHAPE(out_dim[i], in_dim[i]), PL_TAG_BASE,
                          NULL, base_train, STREAM_PROJ + (uint64_t)l * 16 + (uint64_t)i, -1);
        if (!p->w) return pl_error_status();
        if (!adapt || !(o->lora_targets & (1u << i))) continue;
        int64_t R = E * m->r_e;
        snprintf(name, sizeof name, "model.layers.%lld.%s.%s.lora_A.weight", (long long)l, blk,
                 ilora_proj_names[i]);
        p->lora_a = new_param(m, &p->lora_a, name, PL_SHAPE(R, in_dim[i]), 0, "lora", true);
        snprintf(name, sizeof name, "model.layers.%lld.%s.%s.lora_B.weight", (long long)l, blk,
                 ilora_proj_names[i]);
        p->lora_b = new_param(m, &p->lora_b, name, PL_SHAPE(out_dim[i], R), 0, "lora", true);
        if (!p->lora_a || !p->lora_b) return pl_error_status();
        /* PEFT: A ~ kaiming_uniform(a=sqrt(5)) = U(-1/sqrt(in), 1/sqrt(in)); B = 0 */
        double bound = 1.0 / sqrt((double)in_dim[i]);
        st = pl_tensor_uniform_(p->lora_a, -bound, bound, m->ctx->seed,
                                STREAM_LORA_A + (uint64_t)l * 16 + (uint64_t)i);
    }
    return st;
}

/* Step 5: the final norm and the output head: score_proj (an item table in
 * front of a pretrained body), lm_head (untied), or none (tied to the table). */
static pl_status create_head(ilora_model *m, hf_llama *hf) {
    const ilora_opts *o = &m->o;
    int64_t D = o->dim, V = m->vocab, W = table_width(m, hf);
    bool item_front = hf && !o->token_inputs;
    m->norm = base_param(m, hf, &m->norm, "model.norm.weight", PL_SHAPE(D), PL_TAG_NO_DECAY,
                         NULL, base_trains(m), 0, 1.0);
    if (!m->norm) return pl_error_status();
    if (item_front)
        return linear_param(m, &m->score_proj, NULL, "score_proj", W, D, "projector",
                            STREAM_SCORE_PROJ);
    if (!o->tie_embeddings) {
        m->lm_head = base_param(m, hf, &m->lm_head, "lm_head.weight", PL_SHAPE(V, D),
                                hf ? PL_TAG_BASE : 0, "head", base_trains(m), STREAM_LM_HEAD, -1);
        if (!m->lm_head) return pl_error_status();
    }
    return PL_OK;
}

/* A [n] i64 index tensor on the run's device, v[j] = j / div, kept past the
 * caller's frame; NULL with the error set. */
static pl_tensor *group_index(ilora_model *m, int64_t n, int64_t div) {
    int64_t *v = malloc((size_t)n * sizeof *v);
    if (!v) {
        pl_error_set(PL_ERR_NOMEM, "ilora: out of memory");
        return NULL;
    }
    for (int64_t j = 0; j < n; j++)
        v[j] = j / div;
    pl_tensor *t = pl_frame_keep(pl_tensor_from_data(PL_I64, 1, (int64_t[]){n}, v,
                                                     m->ctx->device));
    free(v);
    return t;
}

/* Step 6: grouped-query attention's head map (HF repeat_kv: query head h
 * reads kv head h / (heads / kv_heads)), and the MoE-LoRA router with the
 * map from a LoRA rank to its expert. */
static pl_status create_router(ilora_model *m, hf_llama *hf) {
    const ilora_opts *o = &m->o;
    int64_t D = o->dim, E = o->num_experts;
    if (m->kv_heads < o->heads) {
        m->kv_index = group_index(m, o->heads, o->heads / m->kv_heads);
        if (!m->kv_index) return pl_error_status();
    }
    if (o->adapters != ILORA_MOE_LORA || E <= 1) return PL_OK;
    /* the router reads the hidden state (width D) or the mean embedding
     * (width W); nn.Linear(RW, E) default init: U(-1/sqrt(RW), 1/sqrt(RW)) */
    int64_t RW = o->router_input == ILORA_ROUTER_LAST_HIDDEN ? D : table_width(m, hf);
    double bound = 1.0 / sqrt((double)RW);
    uint64_t seed = m->ctx->seed;
    m->router_w = new_param(m, &m->router_w, "router.weight", PL_SHAPE(E, RW), 0, "router", true);
    m->router_b = new_param(m, &m->router_b, "router.bias", PL_SHAPE(E), PL_TAG_NO_DECAY, "router",
                            true);
    if (!m->router_w || !m->router_b) return pl_error_status();
    pl_status st = pl_tensor_uniform_(m->router_w, -bound, bound, seed, STREAM_ROUTER_W);
    if (!st) st = pl_tensor_uniform_(m->router_b, -bound, bound, seed, STREAM_ROUTER_B);
    if (!st) {
        m->gate_index = group_index(m, E * m->r_e, m->r_e);
        if (!m->gate_index) st = pl_error_status();
    }
    return st;
}

pl_status ilora_model_create(const ilora_opts *o, pl_run_context *ctx, ilora_model **out) {
    *out = NULL;
    ilora_model *m;
    hf_llama *hf;
    pl_status st = create_open(o, ctx, &m, &hf);
    if (st) return st;
    create_sizes(m, hf);
    pl_frame_begin();
    pl_no_grad_begin();
    st = create_embedding(m, hf);
    for (int64_t l = 0; l < m->o.layers && !st; l++)
        st = create_layer(m, hf, l);
    if (!st) st = create_head(m, hf);
    if (!st) st = create_router(m, hf);
    pl_no_grad_end();
    pl_frame_end();
    hf_llama_close(hf); /* the views keep their mappings */
    if (!st && m->o.exclude_history && !m->o.token_inputs) {
        const char *hp = m->o.history_path[0] ? m->o.history_path
                         : ctx->meta                ? pl_meta_get_str(ctx->meta, "path")
                                                    : NULL;
        if (hp && hp[0] && !(st = ilora_hist_read(hp, m->hist))) m->have_hist = true;
    }
    if (st) {
        ilora_model_destroy(m);
        return st;
    }
    *out = m;
    return PL_OK;
}

void ilora_model_destroy(ilora_model *m) {
    if (!m) return;
    free(m->gs_rows);
    pl_tensor_release(m->rank_off);
    pl_tensor_release(m->gate_index);
    pl_tensor_release(m->kv_index);
    pl_tensor_release(m->pad_bias);
    free(m->layer_ctx);
    pl_tensor_release(m->embed_deq);
    ilora_hist_free(m->hist);
    ilora_export_abort(m); /* destroyed mid-export (outside a run): no partial file */
    free(m);
}
