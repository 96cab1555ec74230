/* ilora_opts.c - the ilora options: the table, reading them from [model], checking
 * them against each other and against a backbone's config.json. */
#include "ilora_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
const char *const ilora_proj_names[ILORA_NPROJ] = {"q_proj",    "k_proj",  "v_proj", "o_proj",
                                                   "gate_proj", "up_proj", "down_proj"};
static const char *const proj_short[ILORA_NPROJ] = {"q", "k", "v", "o", "gate", "up", "down"};
#define ALL_TARGETS ((1u << ILORA_NPROJ) - 1)

/* ---- options ---------------------------------------------------------------------------- */

const pl_option_spec ilora_options[] = {
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
    {"attn_implementation", PL_OPT_CHOICE, "sdpa", PL_NO_BOUNDS, "sdpa|eager",
     "attention as HF's attn_implementation: sdpa = the fused pl_attention (keeps q, k, v, the "
     "output and a logsumexp per row); eager = matmul, causal_softmax, matmul (keeps the T x L "
     "probabilities, k and v expanded per query head)"},
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
    {"lora_recompute", PL_OPT_BOOL, "true", PL_NO_BOUNDS, NULL,
     "with lora_dropout in training: recompute each adapter branch in backward; since the "
     "dropout is inside lora_add (nothing of x's size kept either way) it saves only the rank-r "
     "intermediate, no memory in practice, and costs CPU time (README: Memory of the adapter "
     "branch)"},
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
    o->attn_eager = !strcmp(
        pl_cfg_str(c, "attn_implementation", spec_default("attn_implementation")), "eager");
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
    o->lora_recompute = opt_bool(c, "lora_recompute");
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
pl_status ilora_apply_backbone_config(ilora_opts *o, const hf_llama_config *c,
                                      const char *dir) {
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

pl_status ilora_check_opts(const ilora_opts *o) {
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
