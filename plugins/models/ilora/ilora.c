/* ilora.c - the ilora model plugin: options, parameters, forward, metrics.
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
#include "ilora.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hf_export.h"
#include "hf_llama.h"
#include "ranking.h"
#include "distill.h"
#include "teacher_export.h"
#include "pl_h5.h"

const char *const ilora_proj_names[ILORA_NPROJ] = {"q_proj",    "k_proj",  "v_proj", "o_proj",
                                                   "gate_proj", "up_proj", "down_proj"};
static const char *const proj_short[ILORA_NPROJ] = {"q", "k", "v", "o", "gate", "up", "down"};
#define ALL_TARGETS ((1u << ILORA_NPROJ) - 1)

/* ---- options ---------------------------------------------------------------------------- */

static const pl_option_spec ilora_options[] = {
    {"num_items", PL_OPT_INT, "0", 0, 1e9, NULL,
     "number of items (ids 1..N, 0 = padding); 0: the loader's meta 'num_items'"},
    {"backbone", PL_OPT_STRING, "", PL_NO_BOUNDS, NULL,
     "Hugging Face Llama checkpoint directory (config.json + model.safetensors or shards); "
     "empty: a backbone of the shape options below, randomly initialized"},
    {"backbone_weights", PL_OPT_CHOICE, "file", PL_NO_BOUNDS, "file|random",
     "with a backbone: file = its safetensors weights; random = a seeded random Llama of "
     "its config.json alone (transformers' from_config init: N(0, initializer_range), norms 1), "
     "built tensor by tensor on the device in config.json's dtype: no weights file needed"},
    {"inputs", PL_OPT_CHOICE, "items", PL_NO_BOUNDS, "items|tokens",
     "with a backbone: items = an item table projected to hidden_size (iLoRA/LLaRA); tokens = "
     "the backbone's own token vocabulary and LM head (HF LlamaForCausalLM)"},
    {"item_dim", PL_OPT_INT, "64", 1, 65536, NULL,
     "with a backbone and item inputs: item table width (pretrain.ini's dim, for init_from)"},
    {"gradient_checkpointing", PL_OPT_BOOL, "false", PL_NO_BOUNDS, NULL,
     "recompute each decoder layer's activations during backward (HF gradient_checkpointing)"},
    {"dim", PL_OPT_INT, "64", 2, 65536, NULL, "hidden size (hidden_size)"},
    {"layers", PL_OPT_INT, "2", 1, ILORA_MAX_LAYERS, NULL, "decoder layers (num_hidden_layers)"},
    {"heads", PL_OPT_INT, "2", 1, 1024, NULL, "attention heads (num_attention_heads)"},
    {"kv_heads", PL_OPT_INT, "0", 0, 1024, NULL,
     "key/value heads (num_key_value_heads; grouped-query attention); 0: heads"},
    {"head_dim", PL_OPT_INT, "0", 0, 4096, NULL, "size of one head (even); 0: dim / heads"},
    {"max_len", PL_OPT_INT, "50", 1, 1e6, NULL, "longest input sequence (tokens)"},
    {"ffn_dim", PL_OPT_INT, "0", 0, 1e7, NULL,
     "SwiGLU inner size (intermediate_size); 0: 8/3*dim rounded up to a multiple of 8"},
    {"dropout", PL_OPT_FLOAT, "0.2", 0, 0.99, NULL,
     "dropout on the embeddings and on each residual branch (attention, MLP)"},
    {"rope_theta", PL_OPT_FLOAT, "10000", 1, 1e12, NULL, "RoPE base"},
    {"norm_eps", PL_OPT_FLOAT, "1e-6", 0, 1, NULL, "RMSNorm epsilon (rms_norm_eps)"},
    {"init_std", PL_OPT_FLOAT, "0.02", 0, 10, NULL,
     "std of the normal init of embeddings and projections (initializer_range)"},
    {"tie_embeddings", PL_OPT_BOOL, "true", PL_NO_BOUNDS, NULL,
     "output head = item embedding (tie_word_embeddings); false: separate lm_head.weight"},
    {"adapters", PL_OPT_CHOICE, "none", PL_NO_BOUNDS, "none|lora|moe_lora",
     "none: plain backbone (pretraining); lora: LoRA (1 expert, no router); moe_lora: iLoRA"},
    {"num_experts", PL_OPT_INT, "4", 1, ILORA_MAX_EXPERTS, NULL, "MoE-LoRA experts (moe_lora); 1 = plain LoRA"},
    {"lora_rank", PL_OPT_INT, "8", 1, 4096, NULL,
     "total LoRA rank, split evenly over the experts (r_e = lora_rank / num_experts)"},
    {"lora_alpha", PL_OPT_FLOAT, "32", 0, 1e6, NULL, "LoRA alpha; the update is scaled by alpha/r_e"},
    {"lora_dropout", PL_OPT_FLOAT, "0.1", 0, 0.99, NULL, "dropout on the adapter input"},
    {"lora_targets", PL_OPT_STRING, "q,k,v,o,gate,up,down", PL_NO_BOUNDS, NULL,
     "projections with adapters: comma list of q,k,v,o,gate,up,down (or all)"},
    {"freeze_base", PL_OPT_BOOL, "true", PL_NO_BOUNDS, NULL,
     "with adapters: backbone weights (embeddings, norms, projections, head) get no gradient"},
    {"modules_to_save", PL_OPT_STRING, "", PL_NO_BOUNDS, NULL,
     "with adapters and freeze_base: backbone modules trained in full beside the adapters "
     "(PEFT's modules_to_save); embed_tokens = the item (token) table, which the tied head "
     "shares, so items the backbone never saw can be learned; empty: none"},
    {"router_input", PL_OPT_CHOICE, "last_hidden", PL_NO_BOUNDS, "last_hidden|mean_embedding",
     "moe_lora: what the router reads. last_hidden: the backbone's final hidden state (no "
     "adapters, no dropout, no gradient) at each position, so position t's gate sees items <= t "
     "and the last position's is the user's sequence representation; mean_embedding: the mean "
     "item embedding of the whole row (one gate per row; in training it sees the row's later "
     "items)"},
    {"router_temperature", PL_OPT_FLOAT, "1", 1e-3, 1e3, NULL,
     "moe_lora: gates = softmax(router logits / router_temperature)"},
    {"router_aux_loss_coef", PL_OPT_FLOAT, "0", 0, 1e6, NULL,
     "moe_lora: load balancing, loss += coef * E * sum_k P_k^2 with P_k the mean gate of expert k "
     "over the batch's labelled positions (Switch / HF Mixtral load-balancing loss with dense "
     "gates; 1 at uniform usage); 0: off"},
    {"router_entropy_coef", PL_OPT_FLOAT, "0", 0, 1e6, NULL,
     "moe_lora: loss += coef * mean over labelled positions of the gates' entropy / ln E "
     "(pushes each position's mixture away from uniform); 0: off"},
    {"metric_k", PL_OPT_INT, "10", 1, 1e6, NULL, "K of hit_ratio@K, ndcg@K, recall@K"},
    {"exclude_history", PL_OPT_BOOL, "true", PL_NO_BOUNDS, NULL,
     "rank without the items the user has already seen (and never the padding id 0)"},
    {"input_field", PL_OPT_STRING, "input_ids", PL_NO_BOUNDS, NULL, "batch field: item ids [B, L]"},
    {"label_field", PL_OPT_STRING, "labels", PL_NO_BOUNDS, NULL,
     "batch field (train): next item per position [B, L], 0 = no label"},
    {"target_field", PL_OPT_STRING, "target", PL_NO_BOUNDS, NULL,
     "batch field (val/test): held-out item [B]"},
    {"history_field", PL_OPT_STRING, "history", PL_NO_BOUNDS, NULL,
     "batch field (val/test, optional): seen items [B, H], 0-padded"},
    {"user_field", PL_OPT_STRING, "user_index", PL_NO_BOUNDS, NULL,
     "batch field (val/test): user row into the history CSR of history_path"},
    {"row_field", PL_OPT_STRING, "row", PL_NO_BOUNDS, NULL,
     "batch field (export of train): row index into /train/input_ids"},
    {"history_path", PL_OPT_STRING, "", PL_NO_BOUNDS, NULL,
     "HDF5 file with /val/history and /test/history CSR (empty: the loader's meta 'path')"},
    {"export_top_k", PL_OPT_INT, "100", 1, 1e6, NULL, "items per exported position"},
    {"export_temperature", PL_OPT_FLOAT, "1.0", 1e-6, 1e6, NULL,
     "exported logits are logits / T (T stored as attribute 'temperature')"},
    {"predict_top_k", PL_OPT_INT, "10", 1, 1e6, NULL,
     "pipeline predict: best items written per input row (top_items, top_scores)"},
    {"kd_weight", PL_OPT_FLOAT, "0", 0, 1e6, NULL,
     "knowledge distillation: loss = CE + kd_weight * T^2 * KL(teacher || student) over the "
     "teacher's top-K items + rest (batch fields kd_ids, kd_logits, kd_lognorm); 0: off"},
    {"kd_temperature", PL_OPT_FLOAT, "0", 0, 1e6, NULL,
     "distillation temperature T; 0: the teacher export's (loader meta teacher_temperature), "
     "which any other value must equal"},
    PL_OPTIONS_END};

static const char *spec_default(const char *name) {
    for (const pl_option_spec *s = ilora_options; s->name; s++)
        if (!strcmp(s->name, name)) return s->default_value;
    return NULL;
}
static int64_t opt_int(const pl_config_section *c, const char *k) {
    return pl_cfg_int(c, k, strtoll(spec_default(k), NULL, 10));
}
static double opt_float(const pl_config_section *c, const char *k) {
    return pl_cfg_float(c, k, strtod(spec_default(k), NULL));
}
static bool opt_bool(const pl_config_section *c, const char *k) {
    return pl_cfg_bool(c, k, !strcmp(spec_default(k), "true"));
}
static void opt_str(const pl_config_section *c, const char *k, char *dst, size_t n) {
    snprintf(dst, n, "%s", pl_cfg_str(c, k, spec_default(k)));
}

static pl_status add_target(const char *tok, int index, void *ud) {
    (void)index;
    unsigned *m = ud;
    if (!strcmp(tok, "all")) {
        *m = ALL_TARGETS;
        return PL_OK;
    }
    int found = -1;
    for (int i = 0; i < ILORA_NPROJ; i++)
        if (!strcmp(tok, proj_short[i]) || !strcmp(tok, ilora_proj_names[i])) found = i;
    if (found < 0)
        return pl_error_set(PL_ERR_CONFIG,
                            "[model] lora_targets: unknown projection '%s' (expected a comma "
                            "list of q,k,v,o,gate,up,down or all)", tok);
    *m |= 1u << found;
    return PL_OK;
}

static pl_status parse_targets(const char *s, unsigned *out) {
    unsigned m = 0;
    pl_status st = pl_cfg_list(s, "[model] lora_targets", add_target, &m, NULL);
    if (st) return st;
    if (!m)
        return pl_error_set(PL_ERR_CONFIG, "[model] lora_targets '%s' names no projection", s);
    *out = m;
    return PL_OK;
}

/* The shape options a backbone's config.json decides: INI key, LlamaConfig
 * field, and their values in the options and in the config. */
static double opt_shape(const ilora_opts *o, unsigned bit);
static double hf_shape(const hf_llama_config *c, unsigned bit);
static const struct {
    unsigned bit;
    const char *key, *field;
} shape_opts[] = {
    {ILORA_SET_DIM, "dim", "hidden_size"},
    {ILORA_SET_LAYERS, "layers", "num_hidden_layers"},
    {ILORA_SET_HEADS, "heads", "num_attention_heads"},
    {ILORA_SET_FFN, "ffn_dim", "intermediate_size"},
    {ILORA_SET_KV, "kv_heads", "num_key_value_heads"},
    {ILORA_SET_HEAD_DIM, "head_dim", "head_dim"},
    {ILORA_SET_THETA, "rope_theta", "rope_theta"},
    {ILORA_SET_EPS, "norm_eps", "rms_norm_eps"},
    {ILORA_SET_TIE, "tie_embeddings", "tie_word_embeddings"},
};
#define N_SHAPE_OPTS (sizeof shape_opts / sizeof *shape_opts)

pl_status ilora_opts_read(const pl_config_section *c, ilora_opts *o) {
    memset(o, 0, sizeof *o);
    o->num_items = opt_int(c, "num_items");
    for (unsigned i = 0; i < N_SHAPE_OPTS; i++)
        if (c && pl_cfg_is_set(c, shape_opts[i].key)) o->set_in_config |= shape_opts[i].bit;
    opt_str(c, "backbone", o->backbone, sizeof o->backbone);
    o->backbone_random = !strcmp(pl_cfg_str(c, "backbone_weights", "file"), "random");
    o->token_inputs = !strcmp(pl_cfg_str(c, "inputs", spec_default("inputs")), "tokens");
    o->item_dim = opt_int(c, "item_dim");
    o->gradient_checkpointing = opt_bool(c, "gradient_checkpointing");
    o->kv_heads = opt_int(c, "kv_heads");
    o->head_dim = opt_int(c, "head_dim");
    o->dim = opt_int(c, "dim");
    o->layers = opt_int(c, "layers");
    o->heads = opt_int(c, "heads");
    o->max_len = opt_int(c, "max_len");
    o->ffn_dim = opt_int(c, "ffn_dim");
    o->dropout = opt_float(c, "dropout");
    o->rope_theta = opt_float(c, "rope_theta");
    o->norm_eps = opt_float(c, "norm_eps");
    o->init_std = opt_float(c, "init_std");
    o->tie_embeddings = opt_bool(c, "tie_embeddings");
    const char *ad = pl_cfg_str(c, "adapters", spec_default("adapters"));
    o->adapters = !strcmp(ad, "moe_lora") ? ILORA_MOE_LORA
                  : !strcmp(ad, "lora")   ? ILORA_LORA
                                          : ILORA_NONE;
    o->num_experts = opt_int(c, "num_experts");
    o->lora_rank = opt_int(c, "lora_rank");
    o->lora_alpha = opt_float(c, "lora_alpha");
    o->lora_dropout = opt_float(c, "lora_dropout");
    o->freeze_base = opt_bool(c, "freeze_base");
    const char *ms = pl_cfg_str(c, "modules_to_save", spec_default("modules_to_save"));
    if (ms[0] && strcmp(ms, "embed_tokens"))
        return pl_error_set(PL_ERR_CONFIG, "[model] modules_to_save: '%s' is not a module this "
                            "model can train beside its adapters (expected embed_tokens, or "
                            "empty)", ms);
    o->save_embed = ms[0] != 0;
    o->router_input = !strcmp(pl_cfg_str(c, "router_input", spec_default("router_input")),
                              "mean_embedding")
                          ? ILORA_ROUTER_MEAN_EMBEDDING
                          : ILORA_ROUTER_LAST_HIDDEN;
    o->router_temperature = opt_float(c, "router_temperature");
    o->router_aux_loss_coef = opt_float(c, "router_aux_loss_coef");
    o->router_entropy_coef = opt_float(c, "router_entropy_coef");
    o->metric_k = opt_int(c, "metric_k");
    o->exclude_history = opt_bool(c, "exclude_history");
    opt_str(c, "input_field", o->input_field, sizeof o->input_field);
    opt_str(c, "label_field", o->label_field, sizeof o->label_field);
    opt_str(c, "target_field", o->target_field, sizeof o->target_field);
    opt_str(c, "history_field", o->history_field, sizeof o->history_field);
    opt_str(c, "user_field", o->user_field, sizeof o->user_field);
    opt_str(c, "row_field", o->row_field, sizeof o->row_field);
    opt_str(c, "history_path", o->history_path, sizeof o->history_path);
    o->export_top_k = opt_int(c, "export_top_k");
    o->export_temperature = opt_float(c, "export_temperature");
    o->predict_top_k = opt_int(c, "predict_top_k");
    o->kd_weight = opt_float(c, "kd_weight");
    o->kd_temperature = opt_float(c, "kd_temperature");
    return parse_targets(pl_cfg_str(c, "lora_targets", spec_default("lora_targets")),
                         &o->lora_targets);
}

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

/* The shape of the backbone: the shape options, or a checkpoint's config.json
 * (then a shape option also written in the INI must agree with it). */
static double opt_shape(const ilora_opts *o, unsigned bit) {
    switch (bit) {
    case ILORA_SET_DIM: return (double)o->dim;
    case ILORA_SET_LAYERS: return (double)o->layers;
    case ILORA_SET_HEADS: return (double)o->heads;
    case ILORA_SET_FFN: return (double)o->ffn_dim;
    case ILORA_SET_KV: return (double)o->kv_heads;
    case ILORA_SET_HEAD_DIM: return (double)o->head_dim;
    case ILORA_SET_THETA: return o->rope_theta;
    case ILORA_SET_EPS: return o->norm_eps;
    default: return (double)o->tie_embeddings;
    }
}

static double hf_shape(const hf_llama_config *c, unsigned bit) {
    switch (bit) {
    case ILORA_SET_DIM: return (double)c->hidden_size;
    case ILORA_SET_LAYERS: return (double)c->num_hidden_layers;
    case ILORA_SET_HEADS: return (double)c->num_attention_heads;
    case ILORA_SET_FFN: return (double)c->intermediate_size;
    case ILORA_SET_KV: return (double)c->num_key_value_heads;
    case ILORA_SET_HEAD_DIM: return (double)c->head_dim;
    case ILORA_SET_THETA: return c->rope_theta;
    case ILORA_SET_EPS: return c->rms_norm_eps;
    default: return (double)c->tie_word_embeddings;
    }
}

/* The shape of the backbone: the shape options, or a checkpoint's config.json
 * (then a shape option also written in the INI must agree with it). */
static pl_status apply_backbone_config(ilora_opts *o, const hf_llama_config *c, const char *dir) {
    for (unsigned i = 0; i < N_SHAPE_OPTS; i++) {
        unsigned bit = shape_opts[i].bit;
        double ini = opt_shape(o, bit), json = hf_shape(c, bit);
        if ((o->set_in_config & bit) && ini != json)
            return pl_error_set(PL_ERR_CONFIG, "[model] %s = %g, but backbone %s/config.json has "
                                "%s = %g (drop %s from the INI: the checkpoint decides it)",
                                shape_opts[i].key, ini, dir, shape_opts[i].field, json,
                                shape_opts[i].key);
    }
    o->dim = c->hidden_size;
    o->layers = c->num_hidden_layers;
    o->heads = c->num_attention_heads;
    o->kv_heads = c->num_key_value_heads;
    o->head_dim = c->head_dim;
    o->ffn_dim = c->intermediate_size;
    o->rope_theta = c->rope_theta;
    o->norm_eps = c->rms_norm_eps;
    o->tie_embeddings = c->tie_word_embeddings;
    if (o->max_len > c->max_position_embeddings)
        return pl_error_set(PL_ERR_CONFIG, "[model] max_len %lld exceeds backbone %s/config.json "
                            "max_position_embeddings %lld", (long long)o->max_len, dir,
                            (long long)c->max_position_embeddings);
    return PL_OK;
}

static pl_status check_opts(const ilora_opts *o) {
    int64_t kv = o->kv_heads ? o->kv_heads : o->heads;
    if (!o->head_dim && o->dim % o->heads)
        return pl_error_set(PL_ERR_CONFIG, "[model] dim %lld is not a multiple of heads %lld "
                            "(set head_dim, or heads dividing dim)", (long long)o->dim,
                            (long long)o->heads);
    int64_t hd = o->head_dim ? o->head_dim : o->dim / o->heads;
    if (hd % 2)
        return pl_error_set(PL_ERR_CONFIG, "[model] head size %lld must be even (RoPE rotates "
                            "pairs)", (long long)hd);
    if (kv > o->heads || o->heads % kv)
        return pl_error_set(PL_ERR_CONFIG, "[model] heads %lld must be a multiple of kv_heads "
                            "%lld (grouped-query attention)", (long long)o->heads, (long long)kv);
    /* the option table bounds these for an INI; a caller of the C API gets
     * the same refusal instead of a division by zero */
    if (o->adapters == ILORA_MOE_LORA &&
        (o->num_experts < 1 || o->num_experts > ILORA_MAX_EXPERTS))
        return pl_error_set(PL_ERR_CONFIG, "[model] num_experts %lld is outside [1, %d]",
                            (long long)o->num_experts, ILORA_MAX_EXPERTS);
    if (!(o->router_temperature > 0))
        return pl_error_set(PL_ERR_CONFIG, "[model] router_temperature %g must be > 0",
                            o->router_temperature);
    if (o->adapters == ILORA_MOE_LORA && o->lora_rank % o->num_experts)
        return pl_error_set(PL_ERR_CONFIG,
                            "[model] lora_rank %lld must be divisible by num_experts %lld "
                            "(each expert gets lora_rank/num_experts)", (long long)o->lora_rank,
                            (long long)o->num_experts);
    if (o->token_inputs && !o->backbone[0])
        return pl_error_set(PL_ERR_CONFIG, "[model] inputs = tokens needs a backbone (without "
                            "one, the item ids are the tokens)");
    return PL_OK;
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
    pl_status st = check_opts(o);
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
        if (!st) st = apply_backbone_config(&m->o, hf_llama_cfg(hf), hf_llama_dir(hf));
        if (!st) st = check_opts(&m->o);
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

pl_tensor *ilora_moe_lora_linear(pl_tensor *x, pl_tensor *w0, pl_tensor *a, pl_tensor *b,
                                 pl_tensor *gexp, double scale, double p_drop, uint64_t seed,
                                 uint64_t counter, bool training) {
    return ilora_moe_lora_linear_dt(x, w0, a, b, gexp, scale, p_drop, seed, counter, training,
                                    PL_F32);
}

pl_tensor *ilora_moe_lora_linear_dt(pl_tensor *x, pl_tensor *w0, pl_tensor *a, pl_tensor *b,
                                    pl_tensor *gexp, double scale, double p_drop, uint64_t seed,
                                    uint64_t counter, bool training, pl_dtype out) {
    pl_tensor *y = ilora_base_linear(x, w0);
    /* under autocast the GEMM returns bf16/f16; the residual stream runs in
     * `out` (f32 under fp32 / bf16-mixed / qlora4, as the precision plugins
     * document; the backbone's bf16 under bf16-true), so convert once here */
    if (y && y->dtype != out) y = pl_cast(y, out);
    if (!a || !y) return y;
    pl_tensor *xd = pl_dropout(x, p_drop, seed, counter, training);
    pl_tensor *xa = pl_linear(xd, a, NULL); /* [B, T, E*r_e] */
    if (gexp) xa = pl_mul(xa, gexp);        /* expert k's r_e slots times g[b, k] */
    pl_tensor *d = pl_linear(xa, b, NULL);  /* sum over experts inside the GEMM */
    return pl_add(y, pl_scale(d, scale));
}

/* Host copy of an index tensor as i64 (caller frees). */
static int64_t *host_index(pl_tensor *t, const char *what) {
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
    ilora_moe_lora_linear_dt((x), ly->proj[i].w, c->base_only ? NULL : ly->proj[i].lora_a,         \
                             ly->proj[i].lora_b, (g), m->lora_scale, o->lora_dropout, seed,        \
                             drop_counter(c->micro, site + 2 + (i)), training, act)
    pl_tensor *x = pl_rms_norm(h, ly->input_norm, o->norm_eps);
    pl_tensor *xq = T < L ? pl_slice(x, 1, L - T, L) : x;
    pl_tensor *q =
        pl_rope(pl_reshape(PROJ(0, xq, gq), 4, (int64_t[]){B, T, H, Dh}), L - T, o->rope_theta);
    pl_tensor *k =
        pl_rope(pl_reshape(PROJ(1, x, gexp), 4, (int64_t[]){B, L, KV, Dh}), 0, o->rope_theta);
    pl_tensor *v = pl_reshape(PROJ(2, x, gexp), 4, (int64_t[]){B, L, KV, Dh});
    if (m->kv_index) { /* grouped-query attention: HF repeat_kv, query head h reads kv head h/rep */
        k = pl_index_select(k, 2, m->kv_index);
        v = pl_index_select(v, 2, m->kv_index);
    }
    q = pl_transpose(q, 1, 2); /* [B, H, T, Dh] */
    k = pl_transpose(k, 1, 2);
    v = pl_transpose(v, 1, 2);
    pl_tensor *sc = pl_add(pl_matmul(q, k, false, true), c->pad_bias); /* [B, H, T, L] */
    pl_tensor *att = pl_matmul(pl_causal_softmax(sc, 1.0 / sqrt((double)Dh)), v, false, false);
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
        h = pl_frame_end_keep(recompute ? pl_checkpoint(layer_forward, c, in, gexp ? 2 : 1)
                                        : layer_forward(c, in, gexp ? 2 : 1));
    }
    return h ? pl_rms_norm(h, m->norm, o->norm_eps) : NULL;
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

/* The forward's router output: gates g = softmax(z) and logits z, [B, L, E]
 * (per position) or [B, E] (per row); NULL without a router. */
typedef struct route {
    pl_tensor *g, *z;
} route;

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

static pl_tensor *hidden_forward(ilora_model *m, pl_tensor *ids, bool training, bool last_only,
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
    return hidden_forward(m, ids, training, false, NULL);
}

/* The last position's final hidden state [B, D] without dropout, and the
 * forward's router output (rt may be NULL). */
static pl_tensor *last_hidden(ilora_model *m, pl_tensor *ids, route *rt) {
    if (m->o.layers < 1) { /* no layer to cut: the last position of the full forward */
        pl_tensor *h = hidden_forward(m, ids, false, false, rt);
        if (!h) return NULL;
        int64_t L = h->shape[1];
        return pl_reshape(pl_slice(h, 1, L - 1, L), 2, (int64_t[]){h->shape[0], m->o.dim});
    }
    pl_tensor *h = hidden_forward(m, ids, false, true, rt); /* [B, 1, D] */
    return h ? pl_reshape(h, 2, (int64_t[]){h->shape[0], m->o.dim}) : NULL;
}

pl_tensor *ilora_last_hidden(ilora_model *m, pl_tensor *ids) { return last_hidden(m, ids, NULL); }

pl_tensor *ilora_logits(ilora_model *m, pl_tensor *h) {
    /* items in front of a pretrained body: score every item by its table row
     * through the output projection (E4SRec-style item head, see README) */
    if (m->score_proj) return pl_matmul(pl_linear(h, m->score_proj, NULL), embed_weight(m), false,
                                        true);
    if (m->lm_head) return ilora_base_linear(h, m->lm_head);
    return m->embed->dtype == PL_NF4 ? pl_nf4_matmul(h, m->embed)
                                     : pl_matmul(h, m->embed, false, true);
}

/* ---- forward ------------------------------------------------------------------------------ */

static pl_tensor *need_field(const pl_batch *b, const char *name, const char *option) {
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
    pl_tensor *h = hidden_forward(m, ids, true, false, &rt);
    if (!h) return pl_error_status();
    int64_t BL = pl_tensor_numel(lab);
    pl_tensor *tg = pl_reshape(lab, 1, (int64_t[]){BL});
    pl_tensor *logits = ilora_logits(m, pl_reshape(h, 2, (int64_t[]){-1, m->o.dim})); /* [BL, V] */
    *loss = logits && tg ? pl_cross_entropy(logits, tg, 0, 0.0) : NULL;
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
    pl_tensor *ids = need_field(b, m->o.input_field, "input_field");
    pl_tensor *lab = need_field(b, m->o.label_field, "label_field");
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
    int64_t *hl = host_index(lab, m->o.label_field);
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
    pl_tensor *h = st ? NULL : hidden_forward(m, ids, true, false, &rt);
    if (!st && !h) st = pl_error_status();
    if (!st && np == 0) {
        *loss = pl_scale(pl_sum(h, PL_ALL_DIMS, false), 0.0); /* nothing to predict */
    } else if (!st) {
        pl_device dev = m->ctx->device;
        pl_tensor *pi = pl_tensor_from_data(PL_I64, 1, (int64_t[]){np}, pos, dev);
        pl_tensor *ti = pl_tensor_from_data(PL_I64, 1, (int64_t[]){np}, tgt, dev);
        pl_tensor *hf = pl_reshape(h, 2, (int64_t[]){-1, m->o.dim});
        pl_tensor *logits = ilora_logits(m, pl_index_select(hf, 0, pi)); /* [np, V] */
        *loss = pl_cross_entropy(logits, ti, 0, 0.0);
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
static pl_tensor *last_logits(ilora_model *m, pl_tensor *ids, pl_tensor **host, route *rt) {
    pl_tensor *hl = last_hidden(m, ids, rt);
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

/* The items ranking masks for each row (evaluation and predict alike): the
 * batch's history field [B, H], else the history CSR by the row's user index,
 * else the input window [B, L]. Host copies, freed by seen_free. */
typedef struct seen_items {
    int64_t *hist, hw;         /* history field */
    const ilora_hist *csr;     /* CSR by user ... */
    const int64_t *users;      /* ... with the caller's user indices */
    int64_t *win, wl;          /* input window */
} seen_items;

static pl_status seen_open(ilora_model *m, const pl_batch *b, pl_data_split split, pl_tensor *ids,
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
        return (s->hist = host_index(hf, m->o.history_field)) ? PL_OK : pl_error_status();
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
    return (s->win = host_index(ids, m->o.input_field)) ? PL_OK : pl_error_status();
}

/* Row i's seen items to -inf in row[0..V), except `keep` (the target being
 * ranked in evaluation; 0 in predict). A user index outside the CSR is an
 * error naming it and the row. */
static pl_status seen_mask(const seen_items *s, int64_t i, int64_t keep, float *row, int64_t V,
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

static void seen_free(seen_items *s) {
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
static pl_status gate_stats(ilora_model *m, const pl_batch *b, pl_data_split split, pl_tensor *g,
                            pl_metrics *mt) {
    int64_t E = m->o.num_experts, B = g->shape[0];
    if (g->ndim == 3) g = pl_slice(g, 1, g->shape[1] - 1, g->shape[1]);
    pl_tensor *hg = g ? pl_tensor_to(g, PL_F32, PL_CPU) : NULL;
    if (!hg) return pl_error_status();
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
    const float *gv = pl_tensor_f32(hg);
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

static pl_status eval_forward(ilora_model *m, const pl_batch *b, pl_data_split split,
                              pl_tensor **loss, pl_metrics *mt) {
    pl_tensor *ids = need_field(b, m->o.input_field, "input_field");
    pl_tensor *tg = need_field(b, m->o.target_field, "target_field");
    if (!ids || !tg) return pl_error_status();
    int64_t B = ids->ndim == 2 ? ids->shape[0] : -1;
    if (pl_tensor_numel(tg) != B) {
        char b1[256], b2[256];
        return pl_error_set(PL_ERR_SHAPE, "ilora: target %s must hold one item per row of %s",
                            pl_tensor_describe(tg, b1, sizeof b1),
                            pl_tensor_describe(ids, b2, sizeof b2));
    }
    pl_tensor *host = NULL;
    route rt;
    pl_tensor *lg = last_logits(m, ids, &host, &rt);
    if (!lg) return pl_error_status();
    int64_t *t = host_index(tg, m->o.target_field);
    if (!t) return pl_error_status();
    pl_status st = PL_OK;
    for (int64_t i = 0; i < B; i++)
        if (t[i] <= 0 || t[i] >= m->vocab) {
            st = pl_error_set(PL_ERR_INVALID, "ilora: %s target %lld of row %lld is outside "
                              "[1, %lld]", pl_split_name(split), (long long)t[i], (long long)i,
                              (long long)m->vocab - 1);
            break;
        }
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
    seen_items seen = {0};
    if (!st && uf && m->have_hist && !(users = host_index(uf, m->o.user_field))) st = pl_error_status();
    if (!st && users && pl_tensor_numel(uf) != B)
        st = pl_error_set(PL_ERR_SHAPE, "ilora: field '%s' must hold one user per row (%lld)",
                          m->o.user_field, (long long)B);
    if (!st) st = seen_open(m, b, split, ids, users, &seen);
    int64_t V = m->vocab, K = m->o.metric_k;
    double hit = 0, ndcg = 0;
    const float *lh = st ? NULL : pl_tensor_f32(host);
    float *row = st ? NULL : malloc((size_t)V * sizeof *row);
    if (!st && (!row || !lh)) st = row ? pl_error_status() : pl_error_set(PL_ERR_NOMEM, "ilora: oom");
    for (int64_t i = 0; !st && i < B; i++) {
        memcpy(row, lh + i * V, (size_t)V * sizeof *row);
        row[0] = -INFINITY;
        if ((st = seen_mask(&seen, i, t[i], row, V, split))) break;
        int64_t r = ilora_rank_of(row, V, t[i]);
        hit += ilora_hit_at(r, K);
        ndcg += ilora_ndcg_at(r, K);
    }
    if (!st) {
        char name[48];
        snprintf(name, sizeof name, "hit_ratio@%lld", (long long)K);
        pl_metrics_add(mt, name, hit, (double)B);
        snprintf(name, sizeof name, "ndcg@%lld", (long long)K);
        pl_metrics_add(mt, name, ndcg, (double)B);
        snprintf(name, sizeof name, "recall@%lld", (long long)K);
        pl_metrics_add(mt, name, hit, (double)B);
    }
    if (!st && rt.g) st = gate_stats(m, b, split, rt.g, mt);
    free(row);
    seen_free(&seen);
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

static pl_status ilora_predict_needs(const pl_config_section *cfg, pl_field_list *out) {
    const char *s[3] = {pl_cfg_str(cfg, "history_field", "history"),
                        pl_cfg_str(cfg, "user_field", "user_index"),
                        pl_cfg_str(cfg, "target_field", "target")};
    pl_status st = pl_fields_add(out, pl_cfg_str(cfg, "input_field", "input_ids"), PL_DTYPE_INDEX,
                                 2, false);
    if (!st) st = pl_fields_add(out, s[0], PL_DTYPE_INDEX, 2, true);
    for (int i = 1; i < 3 && !st; i++) st = pl_fields_add(out, s[i], PL_DTYPE_INDEX, -1, true);
    return st;
}

static pl_status ilora_predict_begin(void *self, const char *out_path, const pl_meta *attrs) {
    ilora_model *m = self;
    if (m->o.predict_top_k > m->vocab - 1)
        return pl_error_set(PL_ERR_CONFIG, "ilora: predict_top_k %lld exceeds the %lld items",
                            (long long)m->o.predict_top_k, (long long)m->vocab - 1);
    m->pred_rows = 0;
    pl_status st = pl_h5_out_new(out_path, attrs, &m->pred);
    if (!st) st = pl_h5_attr_write_int(out_path, m->pred->file, "top_k", m->o.predict_top_k);
    if (st) pl_h5_out_free(&m->pred);
    return st;
}

/* A [n] i64 CPU tensor of host values, owned by the caller's frame. */
static pl_tensor *host_rows_i64(const int64_t *v, int64_t n) {
    return pl_tensor_from_data(PL_I64, 1, (int64_t[]){n}, v, PL_CPU);
}

static pl_status ilora_predict_batch(void *self, const pl_batch *b, pl_data_split split) {
    ilora_model *m = self;
    if (!m->pred) return pl_error_set(PL_ERR_INVALID, "ilora: predict_batch before predict_begin");
    pl_tensor *ids = need_field(b, m->o.input_field, "input_field");
    if (!ids) return pl_error_status();
    if (ids->ndim != 2) {
        char d[256];
        return pl_error_set(PL_ERR_SHAPE, "ilora: input ids %s must be [B, L]",
                            pl_tensor_describe(ids, d, sizeof d));
    }
    int64_t B = ids->shape[0], V = m->vocab, K = m->o.predict_top_k;
    pl_tensor *host = NULL;
    if (!last_logits(m, ids, &host, NULL)) return pl_error_status();
    pl_tensor *uf = pl_batch_find(b, m->o.user_field), *tf = pl_batch_find(b, m->o.target_field);
    int64_t *users = NULL, *tg = NULL, *rows = NULL;
    seen_items seen = {0};
    pl_status st = PL_OK;
    if (uf && !(users = host_index(uf, m->o.user_field))) st = pl_error_status();
    if (!st && uf && pl_tensor_numel(uf) != B)
        st = pl_error_set(PL_ERR_SHAPE, "ilora: field '%s' must hold one user per row (%lld)",
                          m->o.user_field, (long long)B);
    if (!st && tf && !(tg = host_index(tf, m->o.target_field))) st = pl_error_status();
    if (!st && tf && pl_tensor_numel(tf) != B)
        st = pl_error_set(PL_ERR_SHAPE, "ilora: field '%s' must hold one target per row (%lld)",
                          m->o.target_field, (long long)B);
    /* a target is never read for the prediction: nothing is kept in the ranking */
    if (!st) st = seen_open(m, b, split, ids, users, &seen);
    const float *lh = st ? NULL : pl_tensor_f32(host);
    float *row = st ? NULL : malloc((size_t)V * sizeof *row);
    int32_t *top = st ? NULL : malloc((size_t)(B * K) * sizeof *top);
    float *val = st ? NULL : malloc((size_t)(B * K) * sizeof *val);
    rows = st ? NULL : malloc((size_t)(B ? B : 1) * sizeof *rows);
    if (!st && (!lh || !row || !top || !val || !rows))
        st = lh ? pl_error_set(PL_ERR_NOMEM, "ilora: out of memory") : pl_error_status();
    for (int64_t i = 0; !st && i < B; i++) {
        memcpy(row, lh + i * V, (size_t)V * sizeof *row);
        row[0] = -INFINITY;
        if ((st = seen_mask(&seen, i, 0, row, V, split))) break;
        ilora_topk(row, V, K, top + i * K, val + i * K);
        rows[i] = m->pred_rows + i;
    }
    pl_h5_out *o = m->pred;
    if (!st) st = pl_h5_out_append(o, "top_items",
                                   pl_tensor_from_data(PL_I32, 2, (int64_t[]){B, K}, top, PL_CPU));
    if (!st) st = pl_h5_out_append(o, "top_scores",
                                   pl_tensor_from_data(PL_F32, 2, (int64_t[]){B, K}, val, PL_CPU));
    if (!st) st = pl_h5_out_append(o, "row", host_rows_i64(rows, B));
    if (!st && users) st = pl_h5_out_append(o, "user_index", host_rows_i64(users, B));
    if (!st && tg) st = pl_h5_out_append(o, "target", host_rows_i64(tg, B));
    if (!st) m->pred_rows += B;
    free(row);
    free(top);
    free(val);
    free(rows);
    seen_free(&seen);
    free(users);
    free(tg);
    return st;
}

static pl_status ilora_predict_end(void *self) {
    ilora_model *m = self;
    return pl_h5_out_finish(&m->pred, "ilora");
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
static pl_status ilora_batch_needs(const pl_config_section *cfg, pl_field_list *out) {
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
    .export_begin = ilora_export_begin,
    .export_batch = ilora_export_batch,
    .export_end = ilora_export_end,
    .on_load = NULL,
    .predict_needs = ilora_predict_needs,
    .predict_begin = ilora_predict_begin,
    .predict_batch = ilora_predict_batch,
    .predict_end = ilora_predict_end,
    .export_model = ilora_export_model,
};

PL_PLUGIN_DEFINE(ilora, PL_KIND_MODEL, "0.1.0",
                 "Llama-style item decoder with MoE-LoRA adapters (iLoRA) for next-item "
                 "recommendation", ilora_options, &ilora_vtable)
