/* hf_llama.h - a Hugging Face Llama checkpoint directory, read for the
 * ilora backbone (internal to the plugin).
 *
 * A directory holds config.json (LlamaConfig, read with cJSON) and the
 * weights under HF LlamaForCausalLM names, either in one model.safetensors or
 * in shards named by model.safetensors.index.json ("weight_map": tensor name
 * -> shard file). Everything read is untrusted: every field is range-checked,
 * shard names may not leave the directory, and every tensor is checked for
 * its shape and a float dtype (f32, bf16, f16) before training starts;
 * errors name the file, the field or tensor, what was expected and what was
 * found. Tensors are handed out as zero-copy memory-mapped views in the
 * file's dtype (pl_st_view), which the precision stage converts one at a
 * time into the form it keeps.
 */
#ifndef ILORA_HF_LLAMA_H
#define ILORA_HF_LLAMA_H

#include <pipeline/pipeline.h>

/* The LlamaConfig fields the backbone needs (HF names). */
typedef struct hf_llama_config {
    int64_t hidden_size, intermediate_size, num_hidden_layers, num_attention_heads,
        num_key_value_heads, head_dim, vocab_size, max_position_embeddings;
    double rms_norm_eps, rope_theta;
    bool tie_word_embeddings;
    int64_t pad_token_id; /* -1: none (null or absent) */
    char torch_dtype[16]; /* "float32", "bfloat16", "float16" or "" */
    double initializer_range; /* std of the normal init (0.02 when absent) */
} hf_llama_config;

typedef struct hf_llama hf_llama;

/* Open DIR: parse and check config.json, open model.safetensors or every
 * shard of the index. `max_layers` bounds num_hidden_layers. Errors:
 * PL_ERR_IO (missing/unreadable file, bad JSON, a shard named in the index
 * that is absent), PL_ERR_CONFIG (a field missing, out of range or of a
 * kind we do not implement: architectures other than LlamaForCausalLM,
 * rope_scaling, hidden_act other than silu, attention_bias / mlp_bias). */
pl_status hf_llama_open(const char *dir, int64_t max_layers, hf_llama **out);
/* Open DIR's config.json only (model.backbone_weights = random): no weights
 * file is read or needed; hf_llama_is_random is true and hf_llama_tensor
 * must not be called (the caller builds the weights, hf_llama_random_init).
 * Errors as hf_llama_open's for config.json. */
pl_status hf_llama_open_config(const char *dir, int64_t max_layers, hf_llama **out);
bool hf_llama_is_random(const hf_llama *h);
/* transformers' LlamaPreTrainedModel._init_weights for `name` in `t` (any
 * float dtype, any device): RMSNorm weights ("...norm.weight") = 1, every
 * other weight ~ N(0, initializer_range), from the Philox stream (seed,
 * FNV-1a hash of name), so a tensor's values depend on the seed and its name
 * only (not on the order of creation). Filled on the host one tensor at a
 * time and copied (pl_tensor_normal_). */
pl_status hf_llama_random_init(const hf_llama *h, pl_tensor *t, const char *name, uint64_t seed);
/* The dtype of the checkpoint (config.json torch_dtype / dtype; f32 when absent). */
pl_dtype hf_llama_dtype(const hf_llama *h);
void hf_llama_close(hf_llama *h); /* NULL-safe; views handed out stay valid */
const hf_llama_config *hf_llama_cfg(const hf_llama *h);
const char *hf_llama_dir(const hf_llama *h);
/* Whether the checkpoint holds tensor `name`. */
bool hf_llama_has(const hf_llama *h, const char *name);
/* A CPU view of tensor `name` (caller owns the reference), checked to have
 * exactly `shape`, a float dtype and only finite values (PL_ERR_NUMERIC
 * otherwise: NaN or Inf in a backbone weight, pl_st_check_finite). Errors
 * name the file and the tensor. */
pl_tensor *hf_llama_tensor(hf_llama *h, const char *name, int ndim, const int64_t *shape);

#endif
