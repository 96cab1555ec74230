/* hf_export.c - the ilora model as a Hugging Face directory (hf_export.h).
 *
 * What is written depends on the model (README.md, "Export to Hugging Face"):
 *   base     config.json (LlamaConfig) + model.safetensors under the model's
 *            own HF LlamaForCausalLM names, when the export holds the base:
 *            the built-in backbone, a backbone that was trained, or merged
 *            adapters. nf4 weights (qlora4) are dequantized (code * absmax,
 *            pl_nf4_dequantize) to the export dtype.
 *   adapters PEFT LoRA adapters in subfolders: adapter/ (plain LoRA) or
 *            expert_0/ .. expert_{E-1}/ (MoE-LoRA, one per expert), each
 *            adapter_config.json + adapter_model.safetensors with PEFT's
 *            key names (base_model.model.<our name>). Our update on a
 *            projection is (alpha / r_e) * B_e A_e x per expert, PEFT's is
 *            (lora_alpha / r) * B A x: r = r_e, lora_alpha = alpha, the same
 *            numbers, no rescaling.
 *   router   router.safetensors + router.json (MoE-LoRA): the per-user gates
 *            g = softmax(W_r u + b_r) and the PEFT recipe of the mixture.
 *            PEFT's add_weighted_adapter(experts, g, combination_type="cat")
 *            builds A = cat_e(g_e * scaling_e * A_e), B = cat_e(B_e) with
 *            r = lora_alpha = sum r_e (scaling 1) - peft 0.21
 *            tuners/lora/model.py - so its update is sum_e g_e * scaling_e
 *            * B_e A_e x: exactly ours.
 *   items    item_head.safetensors (backbone with item inputs): the item
 *            table, item_proj and score_proj around the HF body.
 *   --lora merge: W <- W + (alpha / r) * B A in f32 (plain LoRA only: a
 *            router-gated mixture has a different weight per user).
 */
#define _GNU_SOURCE /* realpath */
#include "hf_export.h"

#include <cjson/cJSON.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ilora.h"

typedef struct ex_opts {
    bool merge;
    pl_dtype dt;
    const char *dtype_name; /* HF's: "float32", "bfloat16", "float16" */
    char dest[PATH_MAX];
    char checkpoint[PATH_MAX];
} ex_opts;

static pl_status parse_options(const char *const *o, ex_opts *x) {
    memset(x, 0, sizeof *x);
    x->dt = PL_F32;
    x->dtype_name = "float32";
    for (int i = 0; o && o[i]; i++) {
        const char *eq = strchr(o[i], '=');
        if (!eq)
            return pl_error_set(PL_ERR_CONFIG, "ilora export: option '%s' is not key=value", o[i]);
        size_t kl = (size_t)(eq - o[i]);
        const char *v = eq + 1;
        if (kl == 4 && !strncmp(o[i], "lora", kl)) {
            if (strcmp(v, "peft") && strcmp(v, "merge"))
                return pl_error_set(PL_ERR_CONFIG,
                                    "ilora export: --lora '%s'; expected peft or "
                                    "merge",
                                    v);
            x->merge = !strcmp(v, "merge");
        } else if (kl == 5 && !strncmp(o[i], "dtype", kl)) {
            if (!strcmp(v, "f32"))
                x->dt = PL_F32, x->dtype_name = "float32";
            else if (!strcmp(v, "bf16"))
                x->dt = PL_BF16, x->dtype_name = "bfloat16";
            else if (!strcmp(v, "f16"))
                x->dt = PL_F16, x->dtype_name = "float16";
            else
                return pl_error_set(PL_ERR_CONFIG,
                                    "ilora export: --dtype '%s'; expected f32, "
                                    "bf16 or f16",
                                    v);
        } else if (kl == 4 && !strncmp(o[i], "dest", kl)) {
            snprintf(x->dest, sizeof x->dest, "%s", v);
        } else if (kl == 10 && !strncmp(o[i], "checkpoint", kl)) {
            snprintf(x->checkpoint, sizeof x->checkpoint, "%s", v);
        } else {
            return pl_error_set(PL_ERR_CONFIG,
                                "ilora export: unknown option '%.*s' (ilora knows "
                                "lora, dtype)",
                                (int)kl, o[i]);
        }
    }
    return PL_OK;
}

/* ---- tensors ------------------------------------------------------------------------------ */

/* A new host f32 copy of `t` owned by the caller (nf4: dequantized). */
static pl_tensor *host_f32(const pl_tensor *t) {
    if (t->dtype == PL_NF4) {
        pl_tensor *d = pl_nf4_dequantize(t, PL_F32); /* owned, on t's device */
        if (!d || d->device.type == PL_DEVICE_CPU) return d;
        pl_tensor *h = host_f32(d);
        pl_tensor_release(d);
        return h;
    }
    pl_frame_begin();
    pl_tensor *h = pl_tensor_to(t, PL_F32, PL_CPU);
    if (h) pl_frame_keep(h);
    pl_frame_end();
    return h;
}

/* A new host tensor of dtype dt owned by the caller, from a host f32 one;
 * takes over the caller's reference of `h32` (released). */
static pl_tensor *to_dtype(pl_tensor *h32, pl_dtype dt) {
    if (!h32 || dt == PL_F32) return h32;
    pl_frame_begin();
    pl_tensor *h = pl_tensor_to(h32, dt, PL_CPU);
    if (h) pl_frame_keep(h);
    pl_frame_end();
    pl_tensor_release(h32);
    return h;
}

/* Columns or rows [start, start + len) of `t` along `dim` as a new host f32
 * tensor owned by the caller. */
static pl_tensor *host_slice(pl_tensor *t, int dim, int64_t start, int64_t len) {
    pl_frame_begin();
    pl_tensor *v = pl_tensor_narrow(t, dim, start, len);
    pl_tensor *h = v ? pl_tensor_to(v, PL_F32, PL_CPU) : NULL;
    if (h) pl_frame_keep(h);
    pl_frame_end();
    return h;
}

/* Add `t` (owned by the caller, NULL: the error of whoever made it) to the
 * writer under `name`, then release the caller's reference. */
static pl_status add_owned(pl_st_writer *w, const char *name, pl_tensor *t) {
    if (!t) return pl_error_status() ? pl_error_status() : PL_ERR_INTERNAL;
    pl_status st = pl_st_writer_add(w, name, t);
    pl_tensor_release(t);
    return st;
}

/* W [out, in] += s * B [out, R] A [R, in], all host f32, sums in double. */
static void merge_lora(float *w, const float *a, const float *b, int64_t out, int64_t in, int64_t R,
                       double s) {
#pragma omp parallel for schedule(static)
    for (int64_t o = 0; o < out; o++)
        for (int64_t i = 0; i < in; i++) {
            double acc = 0;
            for (int64_t r = 0; r < R; r++)
                acc += (double)b[o * R + r] * a[r * in + i];
            w[o * in + i] = (float)(w[o * in + i] + s * acc);
        }
}

static bool is_lora_name(const char *n) {
    return strstr(n, ".lora_A.") || strstr(n, ".lora_B.");
}

/* "model.layers.N.<blk>.<proj>.weight" -> its lora_A / lora_B names. */
static void lora_names(const char *w, char *a, char *b, size_t n) {
    size_t l = strlen(w) - strlen(".weight");
    snprintf(a, n, "%.*s.lora_A.weight", (int)l, w);
    snprintf(b, n, "%.*s.lora_B.weight", (int)l, w);
}

/* ---- files -------------------------------------------------------------------------------- */

static pl_status write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    bool ok = f && fputs(text, f) >= 0;
    if (f && fclose(f)) ok = false;
    return ok ? PL_OK : pl_error_set(PL_ERR_IO, "ilora export: cannot write %s", path);
}

/* Print `j` to dir/name and free it. */
static pl_status write_json(const char *dir, const char *name, cJSON *j) {
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    char *text = j ? cJSON_Print(j) : NULL;
    cJSON_Delete(j);
    if (!text) return pl_error_set(PL_ERR_NOMEM, "ilora export: out of memory (%s)", name);
    size_t n = strlen(text);
    char *t2 = realloc(text, n + 2);
    if (t2) {
        text = t2;
        memcpy(text + n, "\n", 2);
    }
    pl_status st = write_text(path, text);
    free(text);
    return st;
}

/* LlamaConfig of the built-in backbone (the fields hf_llama.c reads, with
 * transformers 5's spelling and the older one: rope_theta at the top level
 * and in rope_parameters, dtype and torch_dtype). */
static cJSON *builtin_config(const ilora_model *m, const ex_opts *x) {
    const ilora_opts *o = &m->o;
    cJSON *j = cJSON_CreateObject(), *arch = cJSON_AddArrayToObject(j, "architectures");
    cJSON_AddItemToArray(arch, cJSON_CreateString("LlamaForCausalLM"));
    cJSON_AddStringToObject(j, "model_type", "llama");
    cJSON_AddNumberToObject(j, "vocab_size", (double)m->vocab);
    cJSON_AddNumberToObject(j, "hidden_size", (double)o->dim);
    cJSON_AddNumberToObject(j, "intermediate_size", (double)m->ffn);
    cJSON_AddNumberToObject(j, "num_hidden_layers", (double)o->layers);
    cJSON_AddNumberToObject(j, "num_attention_heads", (double)o->heads);
    cJSON_AddNumberToObject(j, "num_key_value_heads", (double)m->kv_heads);
    cJSON_AddNumberToObject(j, "head_dim", (double)m->head_dim);
    cJSON_AddStringToObject(j, "hidden_act", "silu");
    cJSON_AddNumberToObject(j, "max_position_embeddings", (double)o->max_len);
    cJSON_AddNumberToObject(j, "initializer_range", o->init_std);
    cJSON_AddNumberToObject(j, "rms_norm_eps", o->norm_eps);
    cJSON_AddNumberToObject(j, "rope_theta", o->rope_theta);
    cJSON *rp = cJSON_AddObjectToObject(j, "rope_parameters");
    cJSON_AddNumberToObject(rp, "rope_theta", o->rope_theta);
    cJSON_AddStringToObject(rp, "rope_type", "default");
    cJSON_AddBoolToObject(j, "attention_bias", false);
    cJSON_AddNumberToObject(j, "attention_dropout", 0.0);
    cJSON_AddBoolToObject(j, "mlp_bias", false);
    cJSON_AddBoolToObject(j, "tie_word_embeddings", o->tie_embeddings);
    /* items are the tokens: id 0 is the padding, no bos / eos */
    cJSON_AddNumberToObject(j, "pad_token_id", 0);
    cJSON_AddNullToObject(j, "bos_token_id");
    cJSON_AddNullToObject(j, "eos_token_id");
    cJSON_AddBoolToObject(j, "use_cache", true);
    cJSON_AddStringToObject(j, "dtype", x->dtype_name);
    cJSON_AddStringToObject(j, "torch_dtype", x->dtype_name);
    return j;
}

/* The backbone's own config.json with the export's dtype (token inputs: the
 * architecture is the checkpoint's, only the weights changed). */
static cJSON *backbone_config(const ilora_model *m, const ex_opts *x) {
    char path[PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/config.json", m->o.backbone);
    FILE *f = pl_file_fopen_read(path, "backbone file");
    char *text = NULL;
    long n = -1;
    if (f && !fseek(f, 0, SEEK_END) && (n = ftell(f)) >= 0 && !fseek(f, 0, SEEK_SET) &&
        (text = malloc((size_t)n + 1)) && fread(text, 1, (size_t)n, f) == (size_t)n)
        text[n] = 0;
    else {
        free(text);
        text = NULL;
    }
    if (f) fclose(f);
    cJSON *j = text ? cJSON_Parse(text) : NULL;
    free(text);
    if (!j) {
        pl_error_set(PL_ERR_IO, "ilora export: cannot read the backbone's %s", path);
        return NULL;
    }
    cJSON_DeleteItemFromObjectCaseSensitive(j, "dtype");
    cJSON_DeleteItemFromObjectCaseSensitive(j, "torch_dtype");
    cJSON_AddStringToObject(j, "dtype", x->dtype_name);
    cJSON_AddStringToObject(j, "torch_dtype", x->dtype_name);
    return j;
}

/* model.safetensors: every backbone weight under its HF name (embeddings,
 * norms, projections, lm_head), nf4 dequantized, adapters merged when asked. */
static pl_status write_base(ilora_model *m, const char *dir, const ex_opts *x) {
    char path[PATH_MAX + 32], an[PL_NAME_MAX + 16], bn[PL_NAME_MAX + 16];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    pl_st_writer *w = pl_st_writer_new(path);
    if (!w) return pl_error_status();
    pl_status st = pl_st_writer_meta(w, "format", "pt");
    for (int i = 0; i < pl_params_count(m->params) && !st; i++) {
        pl_param *p = pl_params_at(m->params, i);
        if (!(strncmp(p->name, "model.", 6) == 0 || !strcmp(p->name, "lm_head.weight")) ||
            is_lora_name(p->name))
            continue;
        pl_tensor *h = host_f32(p->t);
        if (!h) {
            st = pl_error_prefix(pl_error_status(), "ilora export: %s", p->name);
            break;
        }
        lora_names(p->name, an, bn, sizeof an);
        pl_param *pa = x->merge ? pl_params_find(m->params, an) : NULL;
        pl_param *pb = x->merge ? pl_params_find(m->params, bn) : NULL;
        if (pa && pb) {
            pl_tensor *a = host_f32(pa->t), *b = host_f32(pb->t);
            if (a && b)
                merge_lora(pl_tensor_f32(h), pl_tensor_f32(a), pl_tensor_f32(b), h->shape[0],
                           h->shape[1], a->shape[0], m->lora_scale);
            else
                st = pl_error_status();
            pl_tensor_release(a);
            pl_tensor_release(b);
        }
        if (st) {
            pl_tensor_release(h);
            break;
        }
        st = add_owned(w, p->name, to_dtype(h, x->dt));
    }
    if (!st) st = pl_st_writer_commit(w);
    pl_st_writer_free(w);
    return st;
}

/* One PEFT adapter in dir/sub: rows / columns [k*r, (k+1)*r) of every
 * stacked lora_A / lora_B (expert k; plain LoRA: k = 0, all of them). */
static pl_status write_adapter(ilora_model *m, const char *dir, const char *sub, int64_t k,
                               const char *base_path, const ex_opts *x) {
    char sdir[PATH_MAX + 64], path[PATH_MAX + 96], name[PL_NAME_MAX + 32];
    snprintf(sdir, sizeof sdir, "%s/%s", dir, sub);
    if (mkdir(sdir, 0755)) return pl_error_set(PL_ERR_IO, "ilora export: cannot create %s", sdir);
    int64_t r = m->r_e;
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "peft_type", "LORA");
    cJSON_AddStringToObject(j, "task_type", "CAUSAL_LM");
    cJSON_AddStringToObject(j, "base_model_name_or_path", base_path);
    cJSON_AddNumberToObject(j, "r", (double)r);
    cJSON_AddNumberToObject(j, "lora_alpha", m->o.lora_alpha);
    cJSON_AddNumberToObject(j, "lora_dropout", m->o.lora_dropout);
    cJSON *tm = cJSON_AddArrayToObject(j, "target_modules");
    for (int i = 0; i < ILORA_NPROJ; i++)
        if (m->o.lora_targets & (1u << i))
            cJSON_AddItemToArray(tm, cJSON_CreateString(ilora_proj_names[i]));
    cJSON_AddStringToObject(j, "bias", "none");
    cJSON_AddBoolToObject(j, "fan_in_fan_out", false);
    cJSON_AddBoolToObject(j, "use_rslora", false);
    cJSON_AddBoolToObject(j, "use_dora", false);
    cJSON_AddBoolToObject(j, "inference_mode", true);
    cJSON_AddBoolToObject(j, "init_lora_weights", true);
    cJSON_AddNullToObject(j, "modules_to_save");
    pl_status st = write_json(sdir, "adapter_config.json", j);
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", sdir);
    pl_st_writer *w = st ? NULL : pl_st_writer_new(path);
    if (!st && !w) st = pl_error_status();
    if (!st) st = pl_st_writer_meta(w, "format", "pt");
    for (int i = 0; i < pl_params_count(m->params) && !st; i++) {
        pl_param *p = pl_params_at(m->params, i);
        bool a = strstr(p->name, ".lora_A.") != NULL;
        if (!a && !strstr(p->name, ".lora_B.")) continue;
        snprintf(name, sizeof name, "base_model.model.%s", p->name);
        pl_tensor *h = host_slice(p->t, a ? 0 : 1, k * r, r);
        st = h ? add_owned(w, name, to_dtype(h, x->dt))
               : pl_error_prefix(pl_error_status(), "ilora export: %s", p->name);
    }
    if (!st) st = pl_st_writer_commit(w);
    pl_st_writer_free(w);
    return st;
}

/* router.safetensors (f32 whatever the export dtype: the gates are exact)
 * and router.json, the gate formula and the PEFT recipe of the mixture. */
static pl_status write_router(ilora_model *m, const char *dir, bool item_front, bool base_here) {
    char path[PATH_MAX + 32], buf[64];
    snprintf(path, sizeof path, "%s/router.safetensors", dir);
    pl_st_writer *w = pl_st_writer_new(path);
    if (!w) return pl_error_status();
    pl_status st = pl_st_writer_meta(w, "format", "pt");
    if (!st) st = add_owned(w, "router.weight", host_f32(m->router_w));
    if (!st) st = add_owned(w, "router.bias", host_f32(m->router_b));
    if (!st) st = pl_st_writer_commit(w);
    pl_st_writer_free(w);
    if (st) return st;
    int64_t E = m->o.num_experts;
    cJSON *j = cJSON_CreateObject(), *ex = cJSON_AddArrayToObject(j, "experts");
    for (int64_t e = 0; e < E; e++) {
        snprintf(buf, sizeof buf, "expert_%lld", (long long)e);
        cJSON_AddItemToArray(ex, cJSON_CreateString(buf));
    }
    cJSON_AddStringToObject(j, "format", "ilora-moe-lora-router-1");
    cJSON_AddNumberToObject(j, "num_experts", (double)E);
    cJSON_AddNumberToObject(j, "rank_per_expert", (double)m->r_e);
    cJSON_AddNumberToObject(j, "lora_alpha", m->o.lora_alpha);
    cJSON_AddNumberToObject(j, "scaling_per_expert", m->lora_scale);
    cJSON_AddNumberToObject(j, "pad_id", (double)m->pad_id);
    cJSON_AddStringToObject(j, "embedding",
                            item_front  ? "item_embeddings.weight of item_head.safetensors"
                            : base_here ? "model.embed_tokens.weight of model.safetensors"
                                        : "model.embed_tokens.weight of the base model");
    cJSON_AddStringToObject(j, "router",
                            "router.weight [E, W], router.bias [E] of "
                            "router.safetensors");
    cJSON_AddNumberToObject(j, "temperature", m->o.router_temperature);
    cJSON_AddStringToObject(j, "gates",
                            "g = softmax((router.weight @ u + router.bias) / temperature), u = mean "
                            "of embedding[ids[t]] over the positions t of the input row with "
                            "ids[t] != pad_id (the zero vector for a row of padding only); one "
                            "g per input row (user)");
    cJSON_AddStringToObject(j, "update",
                            "on every target projection: y = W0 x + sum_e g_e * "
                            "scaling_per_expert * B_e A_e x");
    cJSON_AddStringToObject(j, "peft",
                            "model.add_weighted_adapter(experts, [g_0, ..., g_{E-1}], "
                            "NAME, combination_type='cat'); model.set_adapter(NAME)");
    return write_json(dir, "router.json", j);
}

/* item_head.safetensors: the item table and the projections around the body. */
static pl_status write_item_head(ilora_model *m, const char *dir, const ex_opts *x) {
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/item_head.safetensors", dir);
    pl_st_writer *w = pl_st_writer_new(path);
    if (!w) return pl_error_status();
    pl_status st = pl_st_writer_meta(w, "format", "pt");
    if (!st) st = add_owned(w, "item_embeddings.weight", to_dtype(host_f32(m->embed), x->dt));
    if (!st) st = add_owned(w, "item_proj.weight", to_dtype(host_f32(m->item_proj_w), x->dt));
    if (!st) st = add_owned(w, "item_proj.bias", to_dtype(host_f32(m->item_proj_b), x->dt));
    if (!st) st = add_owned(w, "score_proj.weight", to_dtype(host_f32(m->score_proj), x->dt));
    if (!st) st = pl_st_writer_commit(w);
    pl_st_writer_free(w);
    return st;
}

/* README.md: what the directory holds and how to load it. */
static pl_status write_readme(ilora_model *m, const char *dir, const ex_opts *x, bool base_here,
                              bool adapters, const char *base_path, bool item_front) {
    char path[PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/README.md", dir);
    FILE *f = fopen(path, "w");
    if (!f) return pl_error_set(PL_ERR_IO, "ilora export: cannot write %s", path);
    bool router = m->router_w != NULL;
    bool nf4 = false;
    for (int i = 0; i < pl_params_count(m->params); i++)
        if (pl_params_at(m->params, i)->t->dtype == PL_NF4) nf4 = true;
    fprintf(f, "# ilora model exported by `pipeline export --format hf`\n\n");
    fprintf(f, "Checkpoint: `%s`. Weights dtype: %s.%s\n\n", x->checkpoint, x->dtype_name,
            nf4 ? " The run kept its frozen weights in 4-bit NF4 (qlora4): they are written "
                  "dequantized (code * block absmax), the values the run computed with."
                : "");
    if (base_here)
        fprintf(f, "- `config.json`, `model.safetensors`: a `LlamaForCausalLM`%s%s.\n",
                m->o.backbone[0] ? ""
                                 : " whose vocabulary is the item ids (0 = padding; logits "
                                   "over items 0..num_items)",
                x->merge && adapters ? ", LoRA merged into the weights" : "");
    else
        fprintf(f, "- base model: `%s` (not copied; the adapters apply to it)\n", base_path);
    if (adapters && !router)
        fprintf(f,
                "- `adapter/`: a PEFT LoRA adapter (`PeftModel.from_pretrained(base, "
                "\"%s/adapter\")`)\n",
                x->dest);
    if (router)
        fprintf(f,
                "- `expert_0/` .. `expert_%lld/`: one PEFT LoRA adapter per expert; "
                "`router.safetensors`, `router.json`: the per-user gates. For one input row u: "
                "g = softmax((router.weight @ mean(embedding[ids != %lld]) + router.bias) / %.9g), then "
                "`model.add_weighted_adapter([\"expert_0\", ...], g, \"u\", "
                "combination_type=\"cat\")` and `model.set_adapter(\"u\")` give exactly this "
                "model's outputs for that row.\n",
                (long long)m->o.num_experts - 1, (long long)m->pad_id, m->o.router_temperature);
    if (item_front)
        fprintf(f, "- `item_head.safetensors`: item inputs and scores around the base model's "
                   "body: `inputs_embeds = item_proj(item_embeddings[ids])`, `h = "
                   "base.model(inputs_embeds=..., attention_mask=ids != 0).last_hidden_state`, "
                   "`logits = score_proj(h) @ item_embeddings.T` (every item; 0 = padding).\n");
    fprintf(f,
            "\nInputs are left-padded rows (`attention_mask = ids != %lld`); positions are "
            "0..L-1 of the padded row. Details: plugins/models/ilora/README.md, \"Export to "
            "Hugging Face\".\n",
            (long long)(m->pad_id < 0 ? 0 : m->pad_id));
    return fclose(f) ? pl_error_set(PL_ERR_IO, "ilora export: cannot write %s", path) : PL_OK;
}

pl_status ilora_export_model(void *self, const char *format, const char *dir,
                             const char *const *options) {
    ilora_model *m = self;
    ex_opts x;
    if (strcmp(format, "hf"))
        return pl_error_set(PL_ERR_UNSUPPORTED,
                            "ilora export: format '%s' is not written by "
                            "ilora (it writes: hf)",
                            format);
    pl_status st = parse_options(options, &x);
    if (st) return st;
    ilora_refresh_params(m); /* the precision stage may have replaced tensors */
    bool adapters = m->o.adapters != ILORA_NONE;
    bool router = m->router_w != NULL, item_front = m->item_proj_w != NULL;
    /* modules_to_save = embed_tokens trains the backbone's token table (the
     * base is written); in front of a backbone with item inputs it trains
     * the item table, which item_head.safetensors holds either way */
    bool base_trained = !(adapters && m->o.freeze_base) || (m->o.save_embed && !item_front);
    if (x.merge && router)
        return pl_error_set(PL_ERR_UNSUPPORTED,
                            "ilora export: --lora merge of a MoE-LoRA with a "
                            "router (%lld experts): the mixture is gated per user (input row), so "
                            "there is no single merged weight; export with --lora peft (one PEFT "
                            "adapter per expert + router.json: add_weighted_adapter(..., "
                            "combination_type=\"cat\") with a user's gates gives that user's "
                            "model exactly)",
                            (long long)m->o.num_experts);
    if (router && m->o.router_input == ILORA_ROUTER_LAST_HIDDEN)
        return pl_error_set(PL_ERR_UNSUPPORTED,
                            "ilora export: the router reads the backbone's hidden state at each "
                            "position (model.router_input = last_hidden), so every token has its "
                            "own mixture of the %lld experts; PEFT's add_weighted_adapter takes "
                            "one weight per adapter for a whole input. Only a row-gated router "
                            "(model.router_input = mean_embedding) exports to PEFT",
                            (long long)m->o.num_experts);
    if (item_front && (x.merge || base_trained))
        return pl_error_set(PL_ERR_UNSUPPORTED,
                            "ilora export: a backbone with item inputs is "
                            "exported as PEFT adapters on the unchanged backbone %s; %s is not "
                            "supported (use --lora peft with freeze_base = true)",
                            m->o.backbone,
                            x.merge ? "--lora merge" : "a trained backbone (freeze_base = false)");
    bool base_here = !m->o.backbone[0] || base_trained || x.merge;
    char base_path[PATH_MAX];
    if (base_here)
        snprintf(base_path, sizeof base_path, "%s", x.dest[0] ? x.dest : dir);
    else if (!realpath(m->o.backbone, base_path))
        snprintf(base_path, sizeof base_path, "%s", m->o.backbone);
    if (base_here) {
        cJSON *cfg = m->o.backbone[0] ? backbone_config(m, &x) : builtin_config(m, &x);
        st = cfg ? write_json(dir, "config.json", cfg) : pl_error_status();
        if (!st) st = write_base(m, dir, &x);
    }
    if (!st && adapters && !x.merge) {
        if (router) {
            char sub[32];
            for (int64_t e = 0; e < m->o.num_experts && !st; e++) {
                snprintf(sub, sizeof sub, "expert_%lld", (long long)e);
                st = write_adapter(m, dir, sub, e, base_path, &x);
            }
            if (!st) st = write_router(m, dir, item_front, base_here);
        } else {
            st = write_adapter(m, dir, "adapter", 0, base_path, &x);
        }
    }
    if (!st && item_front) st = write_item_head(m, dir, &x);
    if (!st) st = write_readme(m, dir, &x, base_here, adapters, base_path, item_front);
    if (!st)
        pl_message("ilora export: %s%s%s%s",
                   base_here ? "config.json + model.safetensors"
                             : "base "
                               "not copied",
                   adapters && !x.merge ? (router ? ", one PEFT adapter per expert "
                                                    "+ router"
                                                  : ", PEFT adapter")
                                        : "",
                   x.merge && adapters ? " (LoRA merged)" : "",
                   item_front ? ", item_head.safetensors" : "");
    return st;
}
