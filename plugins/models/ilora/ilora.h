/* ilora.h - internals of the ilora model plugin shared by its sources and
 * its test (not part of the SDK; nothing here is exported from the .so).
 *
 * The model: a Llama-style decoder over item tokens (pre-norm RMSNorm,
 * rotary positions, causal multi-head attention, SwiGLU MLP, tied or separate
 * output head) with optional MoE-LoRA adapters (iLoRA, Kong et al. 2024) on
 * chosen projections, gated per sample by a router over the mean of the
 * frozen item embeddings of the user's input sequence. See README.md.
 */
#ifndef ILORA_H
#define ILORA_H

#include <pipeline/pipeline.h>

#include "history_reader.h"

#define ILORA_MAX_LAYERS 128
#define ILORA_NPROJ 7 /* q k v o gate up down */
#define ILORA_MAX_EXPERTS 64 /* MoE-LoRA experts (num_experts) */
#define ILORA_MAX_PARAMS (8 + ILORA_MAX_LAYERS * (2 + 3 * ILORA_NPROJ))

typedef enum ilora_adapters { ILORA_NONE = 0, ILORA_LORA, ILORA_MOE_LORA } ilora_adapters;

/* What the MoE-LoRA router reads (option router_input). */
typedef enum ilora_router_input {
    ILORA_ROUTER_LAST_HIDDEN = 0, /* the backbone's final hidden state at each position */
    ILORA_ROUTER_MEAN_EMBEDDING   /* the mean item embedding of the whole row */
} ilora_router_input;

typedef struct ilora_opts {
    int64_t num_items; /* 0: from ctx->meta "num_items"; vocabulary = num_items + 1 */
    int64_t dim, layers, heads, max_len, ffn_dim;
    int64_t kv_heads, head_dim; /* 0: heads, dim / heads */
    double dropout, rope_theta, norm_eps, init_std;
    bool tie_embeddings;
    unsigned set_in_config; /* ILORA_SET_*: shape options written in the INI */
    char backbone[1024];    /* Hugging Face Llama checkpoint directory, or "" */
    bool backbone_random;   /* backbone_weights = random: config.json only (issue 31) */
    bool token_inputs;      /* inputs = tokens: the backbone's own vocabulary */
    int64_t item_dim;       /* item table width in front of a backbone */
    bool gradient_checkpointing;
    bool attn_eager; /* attn_implementation = eager: the unfused chain, not pl_attention */
    ilora_adapters adapters;
    int64_t num_experts, lora_rank;
    double lora_alpha, lora_dropout;
    bool lora_recompute; /* the adapter branch recomputed in backward (ilora_moe_lora_linear_ck) */
    unsigned lora_targets; /* bit i = projection i (q k v o gate up down) */
    bool freeze_base;
    bool save_embed; /* modules_to_save = embed_tokens: the item/token table trains */
    ilora_router_input router_input;
    double router_temperature;   /* gates = softmax(router logits / T) */
    double router_aux_loss_coef; /* load balancing: coef * E * sum_k P_k^2 */
    double router_entropy_coef;  /* coef * mean normalized gate entropy */
    int64_t metric_k;
    bool exclude_history;
    char input_field[64], label_field[64], target_field[64], history_field[64], user_field[64],
        row_field[64];
    char history_path[1024];
    int64_t export_top_k;
    double export_temperature;
    int64_t predict_top_k; /* items per row in `pipeline predict`'s OUT.h5 */
    double kd_weight, kd_temperature; /* distillation (distill.h); 0: off / the teacher's T */
} ilora_opts;

/* Shape options that a backbone's config.json decides (ilora_opts.set_in_config). */
enum { ILORA_SET_DIM = 1, ILORA_SET_LAYERS = 2, ILORA_SET_HEADS = 4, ILORA_SET_FFN = 8,
       ILORA_SET_KV = 16, ILORA_SET_HEAD_DIM = 32, ILORA_SET_THETA = 64, ILORA_SET_EPS = 128,
       ILORA_SET_TIE = 256 };

/* Projection names in HF Llama order, and whether they live in self_attn or mlp. */
extern const char *const ilora_proj_names[ILORA_NPROJ];

/* What the adapter branch scale * ((drop(x) A^T) * gexp) B^T of one
 * projection needs to run again: pl_checkpoint's context, set by the
 * forward, read by the step's backward (it lives in the model). */
typedef struct ilora_branch {
    double scale, p_drop;
    uint64_t seed, counter;
    bool training;
} ilora_branch;

typedef struct ilora_proj {
    pl_tensor *w;        /* base weight [out, in] (f32, or nf4 under qlora4) */
    pl_tensor *lora_a;   /* [E*r_e, in] or NULL */
    pl_tensor *lora_b;   /* [out, E*r_e] or NULL */
    ilora_branch branch; /* the adapter branch's recompute state */
} ilora_proj;

typedef struct ilora_layer {
    pl_tensor *input_norm, *post_norm; /* [D] */
    ilora_proj proj[ILORA_NPROJ];
} ilora_layer;

typedef struct ilora_layer_ctx ilora_layer_ctx; /* ilora_layers.c: a layer's recomputation */

typedef struct ilora_model {
    ilora_opts o;
    pl_run_context *ctx; /* borrowed: counters for dropout */
    pl_params *params;   /* borrowed: ctx->params */
    bool device_loss;    /* training loss without host reads (masked, every position):
                          * set when the run's device is not the CPU; tests set it */
    int64_t vocab, head_dim, ffn;
    int64_t pad_id;                  /* input id masked as padding (0: items), -1: none */
    int64_t kv_heads, q_dim, kv_dim; /* GQA: kv heads; heads*head_dim; kv_heads*head_dim */
    int64_t r_e;         /* rank per expert */
    double lora_scale;   /* alpha / r_e */
    pl_tensor *embed;    /* [V, D] (nf4 under qlora4 when frozen) */
    pl_tensor *embed_deq; /* f32 copy of an nf4 embed, rebuilt each forward (owned) */
    pl_tensor *norm;     /* [D] */
    pl_tensor *lm_head;  /* [V, D] or NULL when tied */
    pl_tensor *router_w, *router_b; /* [E, W], [E] or NULL (W: the embedding width) */
    /* backbone with item inputs: item table [V, item_dim] in `embed`, input
     * projection item_dim -> D, output projection D -> item_dim (else NULL) */
    pl_tensor *item_proj_w, *item_proj_b, *score_proj;
    pl_tensor *kv_index; /* i64 [heads]: query head -> kv head (GQA), or NULL */
    ilora_layer_ctx *layer_ctx; /* [layers]: contexts of the last forward's layers (owned) */
    pl_tensor *pad_bias;  /* the last forward's padding bias, for a recomputing backward */
    pl_tensor *gate_index;          /* i64 [E*r_e]: slot -> expert (device) */
    /* gate statistics of the evaluation pass in progress (gate_user_tv needs
     * the split's mean gate: the rows seen so far, host f32 [n, E]) */
    float *gs_rows;
    int64_t gs_n, gs_cap;
    int gs_split;
    double gs_tv; /* gate_user_tv's sum reported so far in this pass */
    pl_tensor *rank_off; /* f32 [R, 1] of i * vocab on the device (ranking.h; owned) */
    /* where each parameter lives: the fields above point at ctx->params'
     * tensors and are re-read before every forward (precision may replace them) */
    int n_slots;
    struct {
        pl_tensor **dst;
        int index;
    } slot[ILORA_MAX_PARAMS];
    ilora_layer layer[ILORA_MAX_LAYERS];
    ilora_hist hist[PL_SPLIT_COUNT]; /* history_reader.h */
    bool have_hist;
    int64_t export_rows[PL_SPLIT_COUNT]; /* teacher outputs: rows named per split */
    struct pl_h5_out *exp_file; /* ilora_export_begin's file, outside a run (owned) */
    int64_t pred_rows;      /* rows predicted so far */
} ilora_model;

/* Options from a config section; `cfg` may be NULL (every default). */
pl_status ilora_opts_read(const pl_config_section *cfg, ilora_opts *o);
/* Build the model and add its parameters to ctx->params. */
pl_status ilora_model_create(const ilora_opts *o, pl_run_context *ctx, ilora_model **out);
void ilora_model_destroy(ilora_model *m);

/* Re-read every parameter tensor from ctx->params into the model's fields
 * (a precision stage may have replaced them: qlora4's nf4 tensors). The
 * forward does it first; so does the HF export (hf_export.h). */
void ilora_refresh_params(ilora_model *m);

/* y = W0 x (base_linear: pl_linear, or pl_nf4_matmul for an nf4 W0). */
pl_tensor *ilora_base_linear(pl_tensor *x, pl_tensor *w);
/* Gate expansion: per row g [B, E] -> [B, 1, E*r_e], per position
 * g [B, L, E] -> [B, L, E*r_e], slot j = g[..., j / r_e] (gate_index i64
 * [E*r_e] holds j / r_e). */
pl_tensor *ilora_gate_expand(pl_tensor *g, pl_tensor *gate_index);
/* MoE-LoRA linear: W0 x + scale * ((drop(x) A^T) * gexp) B^T.
 * x [B, T, in]; A [E*r_e, in]; B [out, E*r_e]; gexp [B, 1, E*r_e] or NULL
 * (plain LoRA: every gate 1). A == NULL: base only. */
pl_tensor *ilora_moe_lora_linear(pl_tensor *x, pl_tensor *w0, pl_tensor *a, pl_tensor *b,
                                 pl_tensor *gexp, double scale, double p_drop, uint64_t seed,
                                 uint64_t counter, bool training);
/* The same, its result in dtype `out` (the residual stream's: f32, or the
 * backbone's half dtype under bf16-true and qlora4; ilora_moe_lora_linear
 * is out = f32, bc NULL), with bc (non-NULL: the projection's ilora_branch, which must
 * live until the step's backward): in training with lora_dropout > 0 the
 * adapter branch is recomputed in backward (pl_checkpoint over x, A, B,
 * gexp), so the tape keeps x, shared by the projections that read it, and
 * not each projection's t = drop(x) A^T [.., R]. bc NULL: y and the branch
 * are one pl_lora_add_dropout, whose tape keeps x (shared too) and t; no
 * dropped copy of x or mask either way (before 2026-11-27 the composed form
 * kept both per projection: 943 MiB of the 1.1 B teacher's step). Same
 * values and gradients, bit for bit. */
pl_tensor *ilora_moe_lora_linear_ck(pl_tensor *x, pl_tensor *w0, pl_tensor *a, pl_tensor *b,
                                    pl_tensor *gexp, double scale, double p_drop, uint64_t seed,
                                    uint64_t counter, bool training, pl_dtype out,
                                    ilora_branch *bc);

/* Router gates for ids i32 [B, L], no dropout: router_input = last_hidden:
 * softmax((router(h_t)) / T) per position [B, L, E], h_t the final hidden
 * state of the backbone without adapters; mean_embedding: softmax(router(mean
 * of the embed rows of non-pad ids) / T) per row [B, E]. A model without a
 * router returns NULL without error. */
pl_tensor *ilora_gates(ilora_model *m, pl_tensor *ids);
/* Final hidden states [B, L, D] (after model.norm). Re-reads the parameter
 * tensors from ctx->params first. */
pl_tensor *ilora_hidden(ilora_model *m, pl_tensor *ids, bool training);
/* Final hidden state of the last position [B, D], no dropout: ilora_hidden's
 * [:, L-1] with the last layer computed for that position only (its keys and
 * values for every position), which is all ranking reads (evaluation,
 * predict). */
pl_tensor *ilora_last_hidden(ilora_model *m, pl_tensor *ids);
/* logits = h @ E^T (tied) or h @ lm_head^T; h [..., D] -> [..., V]. */
pl_tensor *ilora_logits(ilora_model *m, pl_tensor *h);
/* The training cross-entropy of rows h [n, D] against tg [n] (ignore_index
 * ign), mean over the kept rows. Where the logits serve nothing else (no
 * distillation term, kd_weight 0) and the head is the tied f32 embedding
 * (no score_proj, no lm_head, no NF4 table), one pl_linear_cross_entropy:
 * the [n, V] logits are never stored (ops.h) and *logits is NULL; otherwise
 * ilora_logits then pl_cross_entropy, with the logits in *logits. */
pl_tensor *ilora_head_loss(ilora_model *m, pl_tensor *h, pl_tensor *tg, int64_t ign,
                           pl_tensor **logits);

/* The vtable's forward (for tests); the export functions are in teacher_export.h. */
pl_status ilora_forward(void *self, const pl_batch *b, pl_data_split split, bool training,
                        pl_tensor **loss, pl_metrics *mt);

#endif
