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

pl_status ilora_model_create(const ilora_opts *o, pl_run_context *ctx, ilora_model **out) {
    *out = NULL;
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
    o = &m->o;
    int64_t D = o->dim, L = o->layers;
    int64_t V = tokens ? hf_llama_cfg(hf)->vocab_size : m->o.num_items + 1;
    m->vocab = V;
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
    bool base_train = !(adapt && o->freeze_base);
    bool item_front = hf && !tokens; /* an item table in front of a pretrained body */
    uint64_t seed = ctx->seed;
    char name[PL_NAME_MAX];

    pl_frame_begin();
    pl_no_grad_begin();
    /* the input embedding: the item table (items are the tokens, or an item
     * table in front of a checkpoint's body), or the checkpoint's own tokens.
     * BASE: qlora4 quantizes it when frozen, and lookups and the tied head
     * then read a dequantized copy (embed_weight()) */
    int64_t W = item_front ? o->item_dim : D;
    if (tokens) {
        m->embed = base_param(m, hf, &m->embed, "model.embed_tokens.weight", PL_SHAPE(V, D),
                              PL_TAG_NO_DECAY | PL_TAG_BASE, NULL, base_train || o->save_embed,
                              0, 0);
        if (!m->embed) st = pl_error_status();
    } else {
        m->embed = new_param(m, &m->embed, "model.embed_tokens.weight", PL_SHAPE(V, W),
                             PL_TAG_NO_DECAY | (item_front ? 0 : PL_TAG_BASE), NULL,
                             base_train || o->save_embed);
        if (m->embed) st = pl_tensor_normal_(m->embed, 0, o->init_std, seed, STREAM_EMBED);
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
    const int64_t in_dim[ILORA_NPROJ] = {D, D, D, m->q_dim, D, D, m->ffn};
    const int64_t out_dim[ILORA_NPROJ] = {m->q_dim, m->kv_dim, m->kv_dim, D, m->ffn, m->ffn, D};
    for (int64_t l = 0; l < L && !st; l++) {
        ilora_layer *ly = &m->layer[l];
        snprintf(name, sizeof name, "model.layers.%lld.input_layernorm.weight", (long long)l);
        ly->input_norm = base_param(m, hf, &ly->input_norm, name, PL_SHAPE(D), PL_TAG_NO_DECAY,
                                    NULL, base_train, 0, 1.0);
        snprintf(name, sizeof name, "model.layers.%lld.post_attention_layernorm.weight",
                 (long long)l);
        if (ly->input_norm)
            ly->post_norm = base_param(m, hf, &ly->post_norm, name, PL_SHAPE(D), PL_TAG_NO_DECAY,
                                       NULL, base_train, 0, 1.0);
        if (!ly->input_norm || !ly->post_norm) {
            st = pl_error_status();
            break;
        }
        for (int i = 0; i < ILORA_NPROJ && !st; i++) {
            const char *blk = i < 4 ? "self_attn" : "mlp";
            snprintf(name, sizeof name, "model.layers.%lld.%s.%s.weight", (long long)l, blk,
                     ilora_proj_names[i]);
            ilora_proj *p = &ly->proj[i];
            p->w = base_param(m, hf, &p->w, name, PL_SHAPE(out_dim[i], in_dim[i]), PL_TAG_BASE,
                              NULL, base_train, STREAM_PROJ + (uint64_t)l * 16 + (uint64_t)i, -1);
            if (!p->w) {
                st = pl_error_status();
                break;
            }
            if (!adapt || !(o->lora_targets & (1u << i))) continue;
            int64_t R = E * m->r_e;
            snprintf(name, sizeof name, "model.layers.%lld.%s.%s.lora_A.weight", (long long)l, blk,
                     ilora_proj_names[i]);
            p->lora_a = new_param(m, &p->lora_a, name, PL_SHAPE(R, in_dim[i]), 0, "lora", true);
            snprintf(name, sizeof name, "model.layers.%lld.%s.%s.lora_B.weight", (long long)l, blk,
                     ilora_proj_names[i]);
            p->lora_b = new_param(m, &p->lora_b, name, PL_SHAPE(out_dim[i], R), 0, "lora", true);
            if (!p->lora_a || !p->lora_b) {
                st = pl_error_status();
                break;
            }
            /* PEFT: A ~ kaiming_uniform(a=sqrt(5)) = U(-1/sqrt(in), 1/sqrt(in)); B = 0 */
            double bound = 1.0 / sqrt((double)in_dim[i]);
            st = pl_tensor_uniform_(p->lora_a, -bound, bound, seed,
                                    STREAM_LORA_A + (uint64_t)l * 16 + (uint64_t)i);
        }
    }
    if (!st) {
        m->norm = base_param(m, hf, &m->norm, "model.norm.weight", PL_SHAPE(D), PL_TAG_NO_DECAY,
                             NULL, base_train, 0, 1.0);
        if (!m->norm) st = pl_error_status();
    }
    if (!st && item_front) {
        st = linear_param(m, &m->score_proj, NULL, "score_proj", W, D, "projector",
                          STREAM_SCORE_PROJ);
    } else if (!st && !o->tie_embeddings) {
        m->lm_head = base_param(m, hf, &m->lm_head, "lm_head.weight", PL_SHAPE(V, D),
                                hf ? PL_TAG_BASE : 0, "head", base_train, STREAM_LM_HEAD, -1);
        if (!m->lm_head) st = pl_error_status();
    }
    if (!st && m->kv_heads < o->heads) {
        int64_t H = o->heads, rep = o->heads / m->kv_heads;
        int64_t *ki = malloc((size_t)H * sizeof *ki);
        if (!ki) st = pl_error_set(PL_ERR_NOMEM, "ilora: out of memory");
        for (int64_t h = 0; ki && h < H; h++) ki[h] = h / rep; /* HF repeat_kv */
        if (!st) {
            m->kv_index = pl_frame_keep(pl_tensor_from_data(PL_I64, 1, (int64_t[]){H}, ki,
                                                            ctx->device));
            if (!m->kv_index) st = pl_error_status();
        }
        free(ki);
    }
    if (!st && o->adapters == ILORA_MOE_LORA && E > 1) {
        /* the router reads the hidden state (width D) or the mean embedding
         * (width W); nn.Linear(RW, E) default init: U(-1/sqrt(RW), 1/sqrt(RW)) */
        int64_t RW = o->router_input == ILORA_ROUTER_LAST_HIDDEN ? D : W;
        double bound = 1.0 / sqrt((double)RW);
        m->router_w = new_param(m, &m->router_w, "router.weight", PL_SHAPE(E, RW), 0, "router", true);
        m->router_b = new_param(m, &m->router_b, "router.bias", PL_SHAPE(E), PL_TAG_NO_DECAY, "router",
                                true);
        if (!m->router_w || !m->router_b) st = pl_error_status();
        if (!st) st = pl_tensor_uniform_(m->router_w, -bound, bound, seed, STREAM_ROUTER_W);
        if (!st) st = pl_tensor_uniform_(m->router_b, -bound, bound, seed, STREAM_ROUTER_B);
        if (!st) {
            int64_t R = E * m->r_e;
            int64_t *gi = malloc((size_t)R * sizeof *gi);
            if (!gi) st = pl_error_set(PL_ERR_NOMEM, "ilora: out of memory");
            for (int64_t j = 0; gi && j < R; j++)
                gi[j] = j / m->r_e;
            if (!st) {
                m->gate_index = pl_frame_keep(
                    pl_tensor_from_data(PL_I64, 1, (int64_t[]){R}, gi, ctx->device));
                if (!m->gate_index) st = pl_error_status();
            }
            free(gi);
        }
    }
    pl_no_grad_end();
    pl_frame_end();
    hf_llama_close(hf); /* the views keep their mappings */
    if (!st && m->o.exclude_history && !tokens) {
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
    pl_tensor_release(m->gate_index);
    pl_tensor_release(m->kv_index);
    pl_tensor_release(m->pad_bias);
    free(m->layer_ctx);
    pl_tensor_release(m->embed_deq);
    ilora_hist_free(m->hist);
    if (m->exp) ilora_export_abort(m); /* destroyed mid-export: no partial file */
    pl_h5_out_free(&m->pred); /* destroyed mid-predict: the core removes the file */
    free(m);
}
