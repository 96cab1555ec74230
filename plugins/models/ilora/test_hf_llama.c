/* test_hf_llama.c - the ilora backbone read from a Hugging Face Llama
 * checkpoint directory.
 *
 * References: tests/data/hf_llama/<fixture>/ written by
 * tools/gen_hf_llama_reference.py with transformers' LlamaForCausalLM
 * (grouped-query attention with tied and untied heads, an explicit head_dim,
 * a sharded checkpoint, a bf16 file) and its float32 logits on fixed token
 * ids. Also: a checkpoint written here from the built-in backbone gives the
 * built-in model's logits; GQA gradients against central differences; item
 * inputs in front of a pretrained body; and every kind of bad directory
 * refused naming the file, the tensor or the field.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hf_llama.h"
#include "ilora.h"
#include "pipeline/alloc.h"
#include "pl_test.h"
#include "test_env.h"

/* ---- helpers ---------------------------------------------------------------------------- */

static ilora_opts base_opts(void);

/* A model with token inputs on the checkpoint directory `dir`, in a fresh
 * env; the status of create (the env is set up either way). */
static pl_status token_model(const char *dir, env *e, ilora_model **m) {
    env_init(e, 7, 0);
    ilora_opts o = base_opts();
    snprintf(o.backbone, sizeof o.backbone, "%s", dir);
    o.token_inputs = true;
    *m = NULL;
    return ilora_model_create(&o, &e->ctx, m);
}

static ilora_opts base_opts(void) {
    ilora_opts o;
    ck_assert_int_eq(ilora_opts_read(NULL, &o), PL_OK);
    o.dropout = 0;
    o.lora_dropout = 0;
    o.max_len = 16;
    o.exclude_history = false;
    return o;
}

/* Every floating parameter to f32 (what the trainer does without a
 * precision stage, and the fp32 precision's setup). */
static void params_to_f32(pl_params *ps) {
    for (int i = 0; i < pl_params_count(ps); i++) {
        pl_param *p = pl_params_at(ps, i);
        if (p->t->dtype == PL_F32) continue;
        bool rg = p->t->requires_grad;
        pl_tensor *f = PL_CK_NOTNULL(pl_tensor_to(p->t, PL_F32, PL_CPU));
        pl_tensor_set_requires_grad(f, rg);
        PL_CK_OK(pl_params_replace(ps, i, f));
        pl_tensor_release(f);
    }
}

static pl_tensor *logits_of(ilora_model *m, pl_tensor *ids) {
    pl_frame_begin();
    pl_tensor *lg = pl_frame_keep(ilora_logits(m, ilora_hidden(m, ids, false)));
    pl_frame_end();
    return lg;
}

static pl_batch train_batch(pl_tensor *ids, pl_tensor *labels) {
    pl_batch b = {.n = 2, .size = ids->shape[0]};
    b.names[0] = "input_ids";
    b.names[1] = "labels";
    b.fields[0] = ids;
    b.fields[1] = labels;
    return b;
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
}

/* ---- parity with transformers -------------------------------------------------------------- */

static void check_fixture(const char *name) {
    char dir[1024], ref[1100];
    snprintf(dir, sizeof dir, "%s/tests/data/hf_llama/%s", PL_TEST_SOURCE_DIR, name);
    snprintf(ref, sizeof ref, "%s/reference.safetensors", dir);
    pl_st_file *f = NULL;
    PL_CK_OK(pl_st_open(ref, &f));
    pl_tensor *ids = PL_CK_NOTNULL(pl_st_load(f, "input_ids"));
    pl_tensor *want = PL_CK_NOTNULL(pl_st_load(f, "logits"));
    env e;
    ilora_model *m = NULL;
    PL_CK_OK(token_model(dir, &e, &m));
    /* the backbone is frozen, pretrained, and nothing else was made */
    for (int i = 0; i < pl_params_count(e.ctx.params); i++) {
        pl_param *p = pl_params_at(e.ctx.params, i);
        ck_assert_msg(p->tags & PL_TAG_PRETRAINED, "%s: %s not tagged pretrained", name, p->name);
    }
    params_to_f32(e.ctx.params);
    pl_tensor *lg = PL_CK_NOTNULL(logits_of(m, ids));
    ck_assert_int_eq(pl_tensor_numel(lg), pl_tensor_numel(want));
    double d = pl_test_max_abs_diff(lg, want);
    ck_assert_msg(d <= 1e-4, "%s: max |logit - transformers| = %g > 1e-4", name, d);
    pl_tensor_release(lg);
    pl_tensor_release(ids);
    pl_tensor_release(want);
    ilora_model_destroy(m);
    env_free(&e);
    pl_st_close(f);
}

START_TEST(logits_match_transformers_gqa_tied) { check_fixture("gqa_tied"); }
END_TEST
START_TEST(logits_match_transformers_untied_sharded_head_dim) {
    check_fixture("gqa_untied_sharded");
}
END_TEST
START_TEST(logits_match_transformers_bf16_file) { check_fixture("bf16"); }
END_TEST
START_TEST(logits_match_transformers_legacy_config) { check_fixture("legacy_config"); }
END_TEST

/* ---- a checkpoint written from the built-in backbone ------------------------------------------ */

#define NI 19 /* items; vocab 20 */
static const char *const tiny_config =
    "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", "
    "\"hidden_size\": 16, \"intermediate_size\": 24, \"num_hidden_layers\": 2, "
    "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"rms_norm_eps\": 1e-6, "
    "\"rope_theta\": 10000.0, \"vocab_size\": 20, \"tie_word_embeddings\": %s, "
    "\"max_position_embeddings\": 32, \"hidden_act\": \"silu\", \"torch_dtype\": \"float32\", "
    "\"rope_scaling\": null, \"pad_token_id\": 0%s}";

static ilora_opts tiny_builtin(bool tie) {
    ilora_opts o = base_opts();
    o.num_items = NI;
    o.dim = 16;
    o.layers = 2;
    o.heads = 4;
    o.kv_heads = 2;
    o.ffn_dim = 24;
    o.tie_embeddings = tie;
    o.init_std = 0.3;
    return o;
}

/* Write DIR/config.json (`extra` appended inside the object) and
 * DIR/model.safetensors from a built-in model's parameters. */
static void write_tiny_checkpoint(const char *dir, bool tie, const char *extra, ilora_model **ref,
                                  env *e) {
    mkdir(dir, 0755);
    char path[1200], cfg[2048];
    snprintf(cfg, sizeof cfg, tiny_config, tie ? "true" : "false", extra ? extra : "");
    snprintf(path, sizeof path, "%s/config.json", dir);
    write_text(path, cfg);
    env_init(e, 7, 0);
    ilora_opts o = tiny_builtin(tie);
    PL_CK_OK(ilora_model_create(&o, &e->ctx, ref));
    /* norms away from 1 so a norm that is not read shows */
    for (int i = 0; i < pl_params_count(e->ctx.params); i++) {
        pl_param *p = pl_params_at(e->ctx.params, i);
        if (p->t->ndim == 1) PL_CK_OK(pl_tensor_uniform_(p->t, 0.5, 1.5, 3, (uint64_t)i));
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    pl_st_writer *w = PL_CK_NOTNULL(pl_st_writer_new(path));
    for (int i = 0; i < pl_params_count(e->ctx.params); i++) {
        pl_param *p = pl_params_at(e->ctx.params, i);
        PL_CK_OK(pl_st_writer_add(w, p->name, p->t));
    }
    PL_CK_OK(pl_st_writer_commit(w));
    pl_st_writer_free(w);
}

static pl_tensor *tiny_ids(void) {
    const int32_t v[10] = {3, 17, 1, 0, 9, 19, 4, 4, 12, 2};
    return pl_tensor_from_data(PL_I32, 2, (int64_t[]){2, 5}, v, PL_CPU);
}

/* backbone_weights = random (issue 31): config.json alone; transformers'
 * init (norms 1, other weights N(0, initializer_range)), a function of the
 * seed and the tensor's name only. */
START_TEST(random_backbone_from_config_json_alone) {
    char tmp[] = "/tmp/pl_hf_random_XXXXXX", path[1100];
    ck_assert_ptr_nonnull(mkdtemp(tmp));
    snprintf(path, sizeof path, "%s/config.json", tmp);
    write_text(path, "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 64, "
                     "\"intermediate_size\": 128, \"num_hidden_layers\": 2, "
                     "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, "
                     "\"vocab_size\": 96, \"initializer_range\": 0.05, "
                     "\"torch_dtype\": \"bfloat16\"}");
    hf_llama *h = NULL;
    ck_assert_int_ne(hf_llama_open(tmp, 64, &h), PL_OK); /* no weights file */
    pl_error_clear();
    PL_CK_OK(hf_llama_open_config(tmp, 64, &h));
    ck_assert(hf_llama_is_random(h));
    ck_assert_int_eq(hf_llama_dtype(h), PL_BF16);
    ck_assert(fabs(hf_llama_cfg(h)->initializer_range - 0.05) < 1e-12);
    pl_tensor *n = pl_tensor_empty_owned(PL_F32, PL_SHAPE(64), PL_CPU);
    PL_CK_OK(hf_llama_random_init(h, n, "model.layers.0.input_layernorm.weight", 7));
    for (int i = 0; i < 64; i++) ck_assert_float_eq(pl_tensor_get(n, i), 1.0f);
    pl_tensor *a = pl_tensor_empty_owned(PL_F32, PL_SHAPE(128, 64), PL_CPU);
    pl_tensor *b = pl_tensor_empty_owned(PL_F32, PL_SHAPE(128, 64), PL_CPU);
    pl_tensor *c = pl_tensor_empty_owned(PL_F32, PL_SHAPE(128, 64), PL_CPU);
    PL_CK_OK(hf_llama_random_init(h, a, "model.layers.0.mlp.up_proj.weight", 7));
    PL_CK_OK(hf_llama_random_init(h, b, "model.layers.0.mlp.up_proj.weight", 7));
    PL_CK_OK(hf_llama_random_init(h, c, "model.layers.0.mlp.gate_proj.weight", 7));
    ck_assert(memcmp(pl_tensor_data(a), pl_tensor_data(b), 128 * 64 * 4) == 0);
    ck_assert(memcmp(pl_tensor_data(a), pl_tensor_data(c), 128 * 64 * 4) != 0);
    double m = 0, v = 0;
    for (int i = 0; i < 128 * 64; i++) m += pl_tensor_get(a, i);
    m /= 128 * 64;
    for (int i = 0; i < 128 * 64; i++) v += pow(pl_tensor_get(a, i) - m, 2);
    double sd = sqrt(v / (128 * 64));
    ck_assert_msg(fabs(m) < 0.003 && fabs(sd - 0.05) < 0.003, "mean %g std %g", m, sd);
    pl_tensor_release(n);
    pl_tensor_release(a);
    pl_tensor_release(b);
    pl_tensor_release(c);
    hf_llama_close(h);
    unlink(path);
    rmdir(tmp);
}
END_TEST

START_TEST(checkpoint_of_the_builtin_backbone_gives_its_logits) {
    for (int tie = 0; tie < 2; tie++) {
        char dir[512];
        pl_test_tmp_path("hf_llama", tie ? "tied" : "untied", dir, sizeof dir);
        env e0, e1;
        ilora_model *ref = NULL, *m = NULL;
        write_tiny_checkpoint(dir, tie, NULL, &ref, &e0);
        PL_CK_OK(token_model(dir, &e1, &m));
        ck_assert_int_eq(pl_params_count(e1.ctx.params), pl_params_count(e0.ctx.params));
        ck_assert_int_eq(m->kv_heads, 2);
        ck_assert_int_eq(m->vocab, NI + 1);
        pl_tensor *ids = tiny_ids();
        pl_tensor *a = PL_CK_NOTNULL(logits_of(ref, ids));
        pl_tensor *b = PL_CK_NOTNULL(logits_of(m, ids));
        ck_assert_double_le(pl_test_max_abs_diff(a, b), 1e-6);
        ck_assert_double_gt(fabs(pl_tensor_get(b, 7)), 1e-3);
        pl_tensor_release(a);
        pl_tensor_release(b);
        pl_tensor_release(ids);
        ilora_model_destroy(ref);
        ilora_model_destroy(m);
        env_free(&e0);
        env_free(&e1);
    }
}
END_TEST

/* ---- grouped-query attention gradients -------------------------------------------------------- */

typedef struct gq_ctx {
    ilora_model *m;
    pl_batch b;
} gq_ctx;

static pl_tensor *f_loss(pl_tensor **in, int n, void *vctx) {
    (void)in;
    (void)n;
    gq_ctx *c = vctx;
    pl_tensor *loss = NULL;
    pl_metrics *mt = NULL;
    if (ilora_forward(c->m, &c->b, PL_SPLIT_TRAIN, true, &loss, mt)) return NULL;
    return loss;
}

START_TEST(gqa_gradients_match_central_differences) {
    env e;
    env_init(&e, 7, 0);
    ilora_opts o = tiny_builtin(true);
    o.dim = 8;
    o.heads = 4;
    o.kv_heads = 1; /* four query heads share one kv head */
    o.head_dim = 2;
    o.ffn_dim = 8;
    o.layers = 1;
    o.num_items = 9;
    o.init_std = 0.5;
    ilora_model *m = NULL;
    PL_CK_OK(ilora_model_create(&o, &e.ctx, &m));
    ck_assert_ptr_nonnull(m->kv_index);
    pl_param *k = PL_CK_NOTNULL(pl_params_find(e.ctx.params, "model.layers.0.self_attn.k_proj.weight"));
    pl_param *v = PL_CK_NOTNULL(pl_params_find(e.ctx.params, "model.layers.0.self_attn.v_proj.weight"));
    pl_param *q = PL_CK_NOTNULL(pl_params_find(e.ctx.params, "model.layers.0.self_attn.q_proj.weight"));
    ck_assert_int_eq(k->t->shape[0], 2); /* kv_heads * head_dim */
    ck_assert_int_eq(q->t->shape[0], 8);
    const int32_t idv[8] = {0, 3, 1, 7, 2, 9, 4, 5}, lab[8] = {0, 1, 7, 2, 9, 4, 5, 6};
    pl_tensor *ids = pl_tensor_from_data(PL_I32, 2, (int64_t[]){2, 4}, idv, PL_CPU);
    pl_tensor *labels = pl_tensor_from_data(PL_I32, 2, (int64_t[]){2, 4}, lab, PL_CPU);
    gq_ctx c = {m, train_batch(ids, labels)};
    pl_tensor *in[3] = {k->t, v->t, q->t};
    char msg[512];
    ck_assert_msg(pl_gradcheck(f_loss, in, 3, &c, 1e-2, 2e-3, 5e-3, msg, sizeof msg), "%s", msg);
    pl_tape_clear();
    pl_tensor_release(ids);
    pl_tensor_release(labels);
    ilora_model_destroy(m);
    env_free(&e);
}
END_TEST

/* ---- item inputs in front of a pretrained body ------------------------------------------------ */

START_TEST(item_inputs_train_projections_and_adapters_only) {
    char dir[512];
    pl_test_tmp_path("hf_llama", "items", dir, sizeof dir);
    env e0, e;
    ilora_model *ref = NULL, *m = NULL;
    write_tiny_checkpoint(dir, true, NULL, &ref, &e0);
    ilora_model_destroy(ref);
    env_free(&e0);
    env_init(&e, 7, 30); /* 30 items: not the checkpoint's 20 tokens */
    ilora_opts o = base_opts();
    snprintf(o.backbone, sizeof o.backbone, "%s", dir);
    o.item_dim = 6;
    o.adapters = ILORA_MOE_LORA;
    o.num_experts = 2;
    o.lora_rank = 4;
    PL_CK_OK(ilora_model_create(&o, &e.ctx, &m));
    pl_param *it = PL_CK_NOTNULL(pl_params_find(e.ctx.params, "model.embed_tokens.weight"));
    ck_assert_int_eq(it->t->shape[0], 31);
    ck_assert_int_eq(it->t->shape[1], 6);
    ck_assert(!(it->tags & PL_TAG_PRETRAINED));
    pl_param *ip = PL_CK_NOTNULL(pl_params_find(e.ctx.params, "item_proj.weight"));
    ck_assert_int_eq(ip->t->shape[0], 16);
    ck_assert_int_eq(ip->t->shape[1], 6);
    ck_assert_ptr_nonnull(pl_params_find(e.ctx.params, "score_proj.weight"));
    ck_assert_ptr_null(pl_params_find(e.ctx.params, "lm_head.weight"));
    pl_param *rw = PL_CK_NOTNULL(pl_params_find(e.ctx.params, "router.weight"));
    ck_assert_int_eq(rw->t->shape[1], 16); /* gated by the backbone's hidden state (hidden_size) */
    const int32_t idv[8] = {0, 3, 21, 7, 2, 29, 4, 5}, lab[8] = {0, 21, 7, 2, 29, 4, 5, 30};
    pl_tensor *ids = pl_tensor_from_data(PL_I32, 2, (int64_t[]){2, 4}, idv, PL_CPU);
    pl_tensor *labels = pl_tensor_from_data(PL_I32, 2, (int64_t[]){2, 4}, lab, PL_CPU);
    pl_batch b = train_batch(ids, labels);
    pl_frame_begin();
    pl_tensor *loss = NULL;
    PL_CK_OK(ilora_forward(m, &b, PL_SPLIT_TRAIN, true, &loss, NULL));
    ck_assert(fabs(pl_tensor_item(loss) - log(31.0)) < 1.0); /* near uniform at init */
    PL_CK_OK(pl_backward(loss, 1.0));
    pl_frame_end();
    for (int i = 0; i < pl_params_count(e.ctx.params); i++) {
        pl_param *p = pl_params_at(e.ctx.params, i);
        bool trains = !strncmp(p->name, "item_proj", 9) || !strncmp(p->name, "score_proj", 10) ||
                      strstr(p->name, "lora_") || !strncmp(p->name, "router", 6);
        ck_assert_msg(p->t->requires_grad == trains, "%s requires_grad %d", p->name,
                      p->t->requires_grad);
        if (trains && !strstr(p->name, "lora_B"))
            ck_assert_msg(p->t->grad != NULL, "%s got no gradient", p->name);
        if (!trains) ck_assert_msg(p->t->grad == NULL, "%s (frozen) got a gradient", p->name);
    }
    pl_tensor_release(ids);
    pl_tensor_release(labels);
    ilora_model_destroy(m);
    env_free(&e);
}
END_TEST

/* ---- activation checkpointing ------------------------------------------------------------------ */

/* Loss, every gradient and the bytes held after forward (before backward) of
 * one training step of a 4-layer model with dropout, adapters and a router. */
static double ckpt_step(bool gc, bool eager, int64_t kv_heads, pl_params **grads_out,
                        size_t *held) {
    env e;
    env_init(&e, 7, 0);
    ilora_opts o = tiny_builtin(true);
    o.attn_eager = eager;
    o.kv_heads = kv_heads;
    o.layers = 4;
    o.num_items = 30;
    o.max_len = 12;
    o.dropout = 0.1;
    o.lora_dropout = 0.2;
    o.adapters = ILORA_MOE_LORA;
    o.num_experts = 2;
    o.lora_rank = 4;
    o.freeze_base = false; /* backbone gradients too */
    o.gradient_checkpointing = gc;
    ilora_model *m = NULL;
    PL_CK_OK(ilora_model_create(&o, &e.ctx, &m));
    /* non-zero B so that the adapters' gradients are all non-trivial */
    for (int i = 0; i < pl_params_count(e.ctx.params); i++) {
        pl_param *p = pl_params_at(e.ctx.params, i);
        if (strstr(p->name, "lora_B")) PL_CK_OK(pl_tensor_uniform_(p->t, -0.1, 0.1, 5, (uint64_t)i));
    }
    int32_t idv[24], lab[24];
    for (int i = 0; i < 24; i++) {
        idv[i] = i % 12 < 2 ? 0 : 1 + (i * 7) % 30;
        lab[i] = i % 12 < 1 ? 0 : 1 + (i * 7 + 7) % 30;
    }
    pl_tensor *ids = pl_tensor_from_data(PL_I32, 2, (int64_t[]){2, 12}, idv, PL_CPU);
    pl_tensor *labels = pl_tensor_from_data(PL_I32, 2, (int64_t[]){2, 12}, lab, PL_CPU);
    pl_batch b = train_batch(ids, labels);
    size_t before = pl_alloc_get_stats(PL_CPU).bytes_in_use;
    pl_frame_begin();
    pl_tensor *loss = NULL;
    PL_CK_OK(ilora_forward(m, &b, PL_SPLIT_TRAIN, true, &loss, NULL));
    *held = pl_alloc_get_stats(PL_CPU).bytes_in_use - before;
    double lv = pl_tensor_item(loss);
    PL_CK_OK(pl_backward(loss, 1.0));
    pl_frame_end();
    /* hand the gradients over as a params list (names -> grad) */
    pl_params *g = pl_params_new();
    for (int i = 0; i < pl_params_count(e.ctx.params); i++) {
        pl_param *p = pl_params_at(e.ctx.params, i);
        if (p->t->grad) PL_CK_OK(pl_params_add(g, p->name, p->t->grad, 0, NULL));
    }
    *grads_out = g;
    pl_tensor_release(ids);
    pl_tensor_release(labels);
    ilora_model_destroy(m);
    env_free(&e);
    return lv;
}

/* Same loss (|l0 - l1| <= 1e-6) and gradients of every parameter, within f32
 * rounding: g1 within 1e-6 + 1e-5 max |g0| of g0. */
static void same_step(double l0, double l1, pl_params *g0, pl_params *g1) {
    ck_assert_double_eq_tol(l0, l1, 1e-6);
    ck_assert_int_eq(pl_params_count(g0), pl_params_count(g1));
    ck_assert_int_gt(pl_params_count(g0), 40); /* backbone, adapters, router */
    for (int i = 0; i < pl_params_count(g0); i++) {
        pl_param *a = pl_params_at(g0, i), *b = PL_CK_NOTNULL(pl_params_find(g1, a->name));
        double scale = 0;
        const float *x = pl_tensor_f32(a->t);
        for (int64_t j = 0; j < pl_tensor_numel(a->t); j++) scale = fmax(scale, fabs(x[j]));
        double d = pl_test_max_abs_diff(a->t, b->t);
        ck_assert_msg(d <= 1e-6 + 1e-5 * scale, "%s: gradients differ by %g (max |g| %g)",
                      a->name, d, scale);
    }
}

START_TEST(gradient_checkpointing_gives_the_same_gradients_with_less_held) {
    pl_params *g0 = NULL, *g1 = NULL;
    size_t held0 = 0, held1 = 0;
    double l0 = ckpt_step(false, false, 2, &g0, &held0), l1 = ckpt_step(true, false, 2, &g1, &held1);
    same_step(l0, l1, g0, g1);
    ck_assert_msg(held1 * 2 < held0, "activations held after forward: %zu with checkpointing, "
                  "%zu without", held1, held0);
    pl_params_free(g0);
    pl_params_free(g1);
}
END_TEST

/* attn_implementation: the fused op (sdpa) and the unfused chain (eager) give
 * the same training step, with grouped-query heads and left padding (whole
 * rows of padding queries), and the fused op's tape holds less (no T x L
 * probabilities, no k, v expanded per query head). */
START_TEST(sdpa_and_eager_attention_give_the_same_step_with_less_held) {
    pl_params *g0 = NULL, *g1 = NULL;
    size_t held0 = 0, held1 = 0;
    double l0 = ckpt_step(false, true, 1, &g0, &held0), l1 = ckpt_step(false, false, 1, &g1, &held1);
    same_step(l0, l1, g0, g1);
    ck_assert_msg(held1 < held0, "activations held after forward: %zu with sdpa, %zu with eager",
                  held1, held0);
    pl_params_free(g0);
    pl_params_free(g1);
}
END_TEST

/* ---- bad checkpoints ------------------------------------------------------------------------ */

/* Create a model on `dir`; expect failure whose message holds every
 * non-NULL needle. */
static void expect_refused(const char *dir, const char *n1, const char *n2, const char *what) {
    env e;
    ilora_model *m = NULL;
    pl_status st = token_model(dir, &e, &m);
    ck_assert_msg(st != PL_OK, "%s: accepted", what);
    const char *msg = pl_error_message();
    ck_assert_msg(!n1 || strstr(msg, n1), "%s: message lacks '%s': %s", what, n1, msg);
    ck_assert_msg(!n2 || strstr(msg, n2), "%s: message lacks '%s': %s", what, n2, msg);
    pl_error_clear();
    env_free(&e);
}

static void fresh_dir(const char *name, const char *extra, char *dir, size_t n) {
    pl_test_tmp_path("hf_llama", name, dir, n);
    env e;
    ilora_model *ref = NULL;
    write_tiny_checkpoint(dir, true, extra, &ref, &e);
    ilora_model_destroy(ref);
    env_free(&e);
}

static void set_config(const char *dir, const char *json) {
    char p[1200];
    snprintf(p, sizeof p, "%s/config.json", dir);
    write_text(p, json);
}

START_TEST(bad_config_fields_are_refused_naming_the_field) {
    char dir[512];
    fresh_dir("badcfg", NULL, dir, sizeof dir);
    char cfg[2048];
    struct {
        const char *extra, *needle;
    } cases[] = {
        {", \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0}", "rope_scaling"},
        {", \"hidden_act\": \"gelu\"", "hidden_act"},
        {", \"attention_bias\": true", "attention_bias"},
        {", \"architectures\": [\"MistralForCausalLM\"]", "MistralForCausalLM"},
    };
    for (unsigned i = 0; i < sizeof cases / sizeof *cases; i++) {
        /* duplicate keys: cJSON reads the first one, so put the case first */
        snprintf(cfg, sizeof cfg, "{%s, %s", cases[i].extra + 2, tiny_config + 1);
        char full[2048];
        snprintf(full, sizeof full, cfg, "true", "");
        set_config(dir, full);
        expect_refused(dir, "config.json", cases[i].needle, cases[i].needle);
    }
    /* out of range: heads not a multiple of kv heads, negative sizes, eps */
    const char *subs[][2] = {{"\"num_key_value_heads\": 2", "\"num_key_value_heads\": 3"},
                             {"\"hidden_size\": 16", "\"hidden_size\": -16"},
                             {"\"rms_norm_eps\": 1e-6", "\"rms_norm_eps\": 0"},
                             {"\"vocab_size\": 20", "\"vocab_size\": 2.5"},
                             {"\"num_hidden_layers\": 2", "\"num_hidden_layers\": 100000"}};
    const char *fields[] = {"num_key_value_heads", "hidden_size", "rms_norm_eps", "vocab_size",
                            "num_hidden_layers"};
    for (unsigned i = 0; i < 5; i++) {
        char base[2048], bad[2048];
        snprintf(base, sizeof base, tiny_config, "true", "");
        char *at = strstr(base, subs[i][0]);
        ck_assert_ptr_nonnull(at);
        snprintf(bad, sizeof bad, "%.*s%s%s", (int)(at - base), base, subs[i][1],
                 at + strlen(subs[i][0]));
        set_config(dir, bad);
        expect_refused(dir, "config.json", fields[i], fields[i]);
    }
    set_config(dir, "{\"hidden_size\": 16,");
    expect_refused(dir, "config.json", "JSON", "truncated JSON");
    char p[1200];
    snprintf(p, sizeof p, "%s/config.json", dir);
    unlink(p);
    expect_refused(dir, "config.json", NULL, "no config.json");
    expect_refused("/nonexistent/llama", "/nonexistent/llama", NULL, "no directory");
}
END_TEST

/* Rewrite DIR/model.safetensors with tensor `name` replaced by `t` (NULL: dropped). */
static void replace_tensor(const char *dir, const char *name, pl_tensor *t) {
    char path[1200];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    pl_test_st_replace(path, path, name, t);
}

START_TEST(bad_tensors_are_refused_naming_the_tensor) {
    char dir[512];
    const char *q = "model.layers.1.self_attn.k_proj.weight";
    fresh_dir("badshape", NULL, dir, sizeof dir);
    pl_tensor *wrong = pl_tensor_zeros(PL_F32, 2, (int64_t[]){16, 16}, PL_CPU); /* kv: [8, 16] */
    replace_tensor(dir, q, wrong);
    expect_refused(dir, q, "[16, 16]", "wrong shape");
    pl_tensor_release(wrong);
    fresh_dir("baddtype", NULL, dir, sizeof dir);
    pl_tensor *ints = pl_tensor_zeros(PL_I32, 2, (int64_t[]){8, 16}, PL_CPU);
    replace_tensor(dir, q, ints);
    expect_refused(dir, q, "dtype", "integer weights");
    pl_tensor_release(ints);
    fresh_dir("missing", NULL, dir, sizeof dir);
    replace_tensor(dir, "model.norm.weight", NULL);
    expect_refused(dir, "model.norm.weight", "missing", "missing tensor");
}
END_TEST

START_TEST(bad_shard_indexes_are_refused_naming_the_file) {
    char dir[512], p[1200], q[1200];
    fresh_dir("shards", NULL, dir, sizeof dir);
    /* split into two shards: everything in shard 1 except model.norm.weight */
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    snprintf(q, sizeof q, "%s/model-00001-of-00002.safetensors", dir);
    ck_assert_int_eq(rename(p, q), 0);
    pl_st_file *f = NULL;
    PL_CK_OK(pl_st_open(q, &f));
    char idx[16384];
    size_t k = (size_t)snprintf(idx, sizeof idx, "{\"metadata\": {\"total_size\": 0}, \"weight_map\": {");
    for (int i = 0; i < pl_st_count(f); i++) {
        const char *n = pl_st_name_at(f, i);
        k += (size_t)snprintf(idx + k, sizeof idx - k, "%s\"%s\": \"%s\"", i ? ", " : "", n,
                              strcmp(n, "model.norm.weight") ? "model-00001-of-00002.safetensors"
                                                             : "model-00002-of-00002.safetensors");
    }
    snprintf(idx + k, sizeof idx - k, "}}");
    pl_tensor *norm = PL_CK_NOTNULL(pl_st_load(f, "model.norm.weight"));
    pl_st_close(f);
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    write_text(p, idx);
    /* shard 2 is missing */
    expect_refused(dir, "model-00002-of-00002.safetensors", "model.safetensors.index.json",
                   "missing shard");
    /* with shard 2 present the sharded checkpoint loads (norm from shard 2) */
    snprintf(q, sizeof q, "%s/model-00002-of-00002.safetensors", dir);
    pl_st_writer *w = PL_CK_NOTNULL(pl_st_writer_new(q));
    PL_CK_OK(pl_st_writer_add(w, "model.norm.weight", norm));
    PL_CK_OK(pl_st_writer_commit(w));
    pl_st_writer_free(w);
    env e;
    ilora_model *m = NULL;
    PL_CK_OK(token_model(dir, &e, &m));
    pl_param *pn = PL_CK_NOTNULL(pl_params_find(e.ctx.params, "model.norm.weight"));
    ck_assert_double_le(pl_test_max_abs_diff(pn->t, norm), 0.0);
    ilora_model_destroy(m);
    env_free(&e);
    /* the index maps a tensor to a shard that does not hold it */
    w = PL_CK_NOTNULL(pl_st_writer_new(q));
    PL_CK_OK(pl_st_writer_add(w, "something.else", norm));
    PL_CK_OK(pl_st_writer_commit(w));
    pl_st_writer_free(w);
    expect_refused(dir, "model-00002-of-00002.safetensors", "model.norm.weight",
                   "index names a shard without the tensor");
    /* a shard name leaving the directory */
    write_text(p, "{\"weight_map\": {\"model.norm.weight\": \"../model.safetensors\"}}");
    expect_refused(dir, "../model.safetensors", "inside the directory", "path traversal");
    pl_tensor_release(norm);
}
END_TEST

START_TEST(ini_shape_options_must_agree_with_config_json) {
    char dir[512];
    fresh_dir("agree", NULL, dir, sizeof dir);
    env e;
    env_init(&e, 7, 0);
    ilora_opts o = base_opts();
    snprintf(o.backbone, sizeof o.backbone, "%s", dir);
    o.token_inputs = true;
    o.dim = 32;
    o.set_in_config = ILORA_SET_DIM;
    ilora_model *m = NULL;
    ck_assert_int_ne(ilora_model_create(&o, &e.ctx, &m), PL_OK);
    ck_assert_ptr_nonnull(strstr(pl_error_message(), "hidden_size = 16"));
    o.dim = 16; /* agreeing is fine */
    PL_CK_OK(ilora_model_create(&o, &e.ctx, &m));
    ilora_model_destroy(m);
    env_free(&e);
    env_init(&e, 7, 0);
    o.max_len = 64; /* > max_position_embeddings 32 */
    ck_assert_int_ne(ilora_model_create(&o, &e.ctx, &m), PL_OK);
    ck_assert_ptr_nonnull(strstr(pl_error_message(), "max_position_embeddings"));
    pl_error_clear();
    env_free(&e);
}
END_TEST

int main(void) {
    Suite *s = suite_create("hf_llama");
    TCase *t = tcase_create("hf_llama");
    tcase_set_timeout(t, 120);
    tcase_add_test(t, logits_match_transformers_gqa_tied);
    tcase_add_test(t, logits_match_transformers_untied_sharded_head_dim);
    tcase_add_test(t, logits_match_transformers_bf16_file);
    tcase_add_test(t, random_backbone_from_config_json_alone);
    tcase_add_test(t, checkpoint_of_the_builtin_backbone_gives_its_logits);
    tcase_add_test(t, gqa_gradients_match_central_differences);
    tcase_add_test(t, sdpa_and_eager_attention_give_the_same_step_with_less_held);
    tcase_add_test(t, item_inputs_train_projections_and_adapters_only);
    tcase_add_test(t, gradient_checkpointing_gives_the_same_gradients_with_less_held);
    tcase_add_test(t, logits_match_transformers_legacy_config);
    tcase_add_test(t, bad_config_fields_are_refused_naming_the_field);
    tcase_add_test(t, bad_tensors_are_refused_naming_the_tensor);
    tcase_add_test(t, bad_shard_indexes_are_refused_naming_the_file);
    tcase_add_test(t, ini_shape_options_must_agree_with_config_json);
    suite_add_tcase(s, t);
    return pl_test_run(s);
}
