/* fuzz_hf_config.c - the Hugging Face checkpoint directory reader of the
 * ilora backbone (plugins/models/ilora/hf_llama.c): config.json field by
 * field, model.safetensors.index.json (weight_map, shard names that must
 * stay inside the directory) and the shards it names.
 *
 * Input: parts separated by a line "%%": config.json, then optionally
 * model.safetensors.index.json, model.safetensors and
 * model-00001-of-00002.safetensors (a part not given, or empty, is no file). When the
 * directory opens, the embedding and first-layer tensors are fetched with
 * the shapes the config implies and their bytes read. */
#include <stdint.h>
#include <stdlib.h>

#include "fuzz_util.h"
#include "hf_llama.h"

static const char *const g_files[] = {"config.json", "model.safetensors.index.json",
                                      "model.safetensors", "model-00001-of-00002.safetensors"};
#define N_FILES 4

static void touch_tensor(hf_llama *h, const char *name, int64_t rows, int64_t cols) {
    if (!hf_llama_has(h, name)) return;
    int64_t shape[2] = {rows, cols};
    pl_tensor *t = hf_llama_tensor(h, name, 2, shape);
    if (!t) return;
    const uint8_t *p = pl_tensor_data(t);
    unsigned s = 0;
    for (size_t i = 0; i < pl_tensor_nbytes(t); i++)
        s += p[i];
    volatile unsigned sink = s; /* every byte read: ASan checks the view's extent */
    (void)sink;
    pl_tensor_release(t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *dir = fz_dir("hf_config");
    const uint8_t *parts[N_FILES];
    size_t lens[N_FILES];
    int n = fz_split(data, size, "\n%%\n", N_FILES, parts, lens);
    for (int i = 0; i < N_FILES; i++) {
        if (i < n && lens[i] > 0)
            fz_write(g_files[i], parts[i], lens[i]);
        else
            fz_remove(g_files[i]);
    }
    hf_llama *h = NULL;
    if (hf_llama_open(dir, 64, &h) != PL_OK) return 0;
    const hf_llama_config *c = hf_llama_cfg(h);
    touch_tensor(h, "model.embed_tokens.weight", c->vocab_size, c->hidden_size);
    touch_tensor(h, "model.layers.0.self_attn.q_proj.weight", c->num_attention_heads * c->head_dim,
                 c->hidden_size);
    touch_tensor(h, "lm_head.weight", c->vocab_size, c->hidden_size);
    hf_llama_close(h);
    return 0;
}
