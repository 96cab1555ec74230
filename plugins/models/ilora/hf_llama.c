/* hf_llama.c - config.json and the safetensors weights of a Hugging Face
 * Llama checkpoint directory (see hf_llama.h). Field names, defaults and
 * meanings are LlamaConfig's (transformers/models/llama/configuration_llama.py);
 * the shard index is the format save_pretrained writes
 * ({"metadata": {...}, "weight_map": {tensor: file}}). */
#include "hf_llama.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define HF_JSON_MAX (64 << 20) /* a config or index larger than this is not one */

typedef struct hf_entry {
    char *name;
    int file;
} hf_entry;

struct hf_llama {
    char dir[1024];
    hf_llama_config cfg;
    int n_files;
    pl_st_file **files;
    char **file_names; /* paths, for messages */
    int n_entries;     /* weight_map entries (0: one file holds everything) */
    hf_entry *entries;
    bool random;       /* config.json only: weights built by the caller */
};

/* ---- small JSON helpers -------------------------------------------------------------------- */

static char *read_text(const char *path, bool *absent) {
    *absent = false;
    /* checked before reading: a FIFO named config.json or as the index
     * would block forever */
    FILE *fp = pl_file_fopen_read(path, "backbone file");
    if (!fp) {
        *absent = errno == ENOENT;
        return NULL;
    }
    char *buf = NULL;
    long n = -1;
    if (fseek(fp, 0, SEEK_END) == 0) n = ftell(fp);
    if (n < 0 || n > HF_JSON_MAX || fseek(fp, 0, SEEK_SET) != 0) {
        pl_error_set(PL_ERR_IO, "%s: size %ld bytes, expected a JSON file of at most %d bytes",
                     path, n, HF_JSON_MAX);
    } else if (!(buf = malloc((size_t)n + 1))) {
        pl_error_set(PL_ERR_NOMEM, "%s: out of memory", path);
    } else if (fread(buf, 1, (size_t)n, fp) != (size_t)n) {
        pl_error_set(PL_ERR_IO, "%s: short read", path);
        free(buf);
        buf = NULL;
    } else {
        buf[n] = 0;
    }
    fclose(fp);
    return buf;
}

static cJSON *read_json(const char *path, bool *absent) {
    char *txt = read_text(path, absent);
    if (!txt) return NULL;
    cJSON *j = cJSON_Parse(txt);
    free(txt);
    if (!j) pl_error_set(PL_ERR_IO, "%s: not valid JSON", path);
    else if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        j = NULL;
        pl_error_set(PL_ERR_IO, "%s: expected a JSON object at the top level", path);
    }
    return j;
}

/* An integer field in [lo, hi]; absent or null -> dflt (dflt < lo: required). */
static pl_status get_int(const cJSON *o, const char *path, const char *key, int64_t dflt,
                         int64_t lo, int64_t hi, int64_t *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) {
        if (dflt < lo)
            return pl_error_set(PL_ERR_CONFIG, "%s: field '%s' is missing (an integer in [%lld, "
                                "%lld])", path, key, (long long)lo, (long long)hi);
        *out = dflt;
        return PL_OK;
    }
    double d = cJSON_IsNumber(v) ? v->valuedouble : NAN;
    if (!(d == floor(d)) || d < (double)lo || d > (double)hi) {
        char *s = cJSON_PrintUnformatted(v);
        pl_status st = pl_error_set(PL_ERR_CONFIG, "%s: field '%s' = %s, expected an integer in "
                                    "[%lld, %lld]", path, key, s ? s : "?", (long long)lo,
                                    (long long)hi);
        free(s);
        return st;
    }
    *out = (int64_t)d;
    return PL_OK;
}

/* A number in (lo, hi]; absent or null -> dflt. */
static pl_status get_num(const cJSON *o, const char *path, const char *key, double dflt,
                         double lo, double hi, double *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) {
        *out = dflt;
        return PL_OK;
    }
    double d = cJSON_IsNumber(v) ? v->valuedouble : NAN;
    if (!(d > lo && d <= hi)) {
        char *s = cJSON_PrintUnformatted(v);
        pl_status st = pl_error_set(PL_ERR_CONFIG, "%s: field '%s' = %s, expected a number in "
                                    "(%g, %g]", path, key, s ? s : "?", lo, hi);
        free(s);
        return st;
    }
    *out = d;
    return PL_OK;
}

/* A field that must be absent, null, false or the string `ok`. */
static pl_status refuse_unless(const cJSON *o, const char *path, const char *key, const char *ok,
                               const char *why) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v) || cJSON_IsFalse(v)) return PL_OK;
    if (ok && cJSON_IsString(v) && !strcmp(v->valuestring, ok)) return PL_OK;
    char *s = cJSON_PrintUnformatted(v);
    pl_status st = pl_error_set(PL_ERR_CONFIG, "%s: field '%s' = %s is not supported (%s)", path,
                                key, s ? s : "?", why);
    free(s);
    return st;
}

static pl_status parse_config(const cJSON *j, const char *path, int64_t max_layers,
                              hf_llama_config *c) {
    memset(c, 0, sizeof *c);
    const cJSON *arch = cJSON_GetObjectItemCaseSensitive(j, "architectures");
    if (arch && !cJSON_IsNull(arch)) {
        bool llama = false;
        const cJSON *a;
        cJSON_ArrayForEach(a, arch) if (cJSON_IsString(a) && !strcmp(a->valuestring,
                                                                     "LlamaForCausalLM")) llama = true;
        if (!llama) {
            char *s = cJSON_PrintUnformatted(arch);
            pl_status st = pl_error_set(PL_ERR_CONFIG, "%s: field 'architectures' = %s, expected "
                                        "[\"LlamaForCausalLM\"] (other architectures are not "
                                        "implemented)", path, s ? s : "?");
            free(s);
            return st;
        }
    } else {
        const cJSON *mt = cJSON_GetObjectItemCaseSensitive(j, "model_type");
        if (!cJSON_IsString(mt) || strcmp(mt->valuestring, "llama"))
            return pl_error_set(PL_ERR_CONFIG, "%s: no 'architectures' and 'model_type' is not "
                                "\"llama\"; expected a LlamaForCausalLM checkpoint", path);
    }
    pl_status st = refuse_unless(j, path, "rope_scaling", NULL,
                                 "rotary scaling (linear, dynamic, yarn, llama3) is not "
                                 "implemented; expected null");
    /* transformers >= 5 writes the rotary settings as
     * "rope_parameters": {"rope_type": "default", "rope_theta": ...} */
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(j, "rope_parameters");
    if (!st && rp && !cJSON_IsNull(rp)) {
        if (!cJSON_IsObject(rp))
            st = pl_error_set(PL_ERR_CONFIG, "%s: field 'rope_parameters' must be an object",
                              path);
        const cJSON *rt = cJSON_GetObjectItemCaseSensitive(rp, "rope_type");
        if (!st && rt && !(cJSON_IsString(rt) && !strcmp(rt->valuestring, "default")))
            st = refuse_unless(rp, path, "rope_type", "default",
                               "in 'rope_parameters': rotary scaling is not implemented; "
                               "expected \"default\"");
    }
    if (!st) st = refuse_unless(j, path, "hidden_act", "silu", "the MLP implements silu only");
    if (!st) st = refuse_unless(j, path, "attention_bias", NULL,
                                "projections with bias are not implemented; expected false");
    if (!st) st = refuse_unless(j, path, "mlp_bias", NULL,
                                "projections with bias are not implemented; expected false");
    if (!st) st = get_int(j, path, "hidden_size", -1, 1, 1 << 20, &c->hidden_size);
    if (!st) st = get_int(j, path, "intermediate_size", -1, 1, 1 << 22, &c->intermediate_size);
    if (!st) st = get_int(j, path, "num_hidden_layers", -1, 1, max_layers, &c->num_hidden_layers);
    if (!st) st = get_int(j, path, "num_attention_heads", -1, 1, 4096, &c->num_attention_heads);
    if (!st) st = get_int(j, path, "num_key_value_heads", c->num_attention_heads, 1,
                          c->num_attention_heads, &c->num_key_value_heads);
    if (!st && c->num_attention_heads % c->num_key_value_heads)
        st = pl_error_set(PL_ERR_CONFIG, "%s: num_attention_heads %lld is not a multiple of "
                          "num_key_value_heads %lld (grouped-query attention shares each kv head "
                          "among a whole number of query heads)", path,
                          (long long)c->num_attention_heads, (long long)c->num_key_value_heads);
    if (!st) {
        int64_t dflt = c->hidden_size % c->num_attention_heads
                           ? -1
                           : c->hidden_size / c->num_attention_heads;
        const cJSON *hd = cJSON_GetObjectItemCaseSensitive(j, "head_dim");
        if (dflt < 0 && (!hd || cJSON_IsNull(hd)))
            st = pl_error_set(PL_ERR_CONFIG, "%s: hidden_size %lld is not a multiple of "
                              "num_attention_heads %lld and no 'head_dim' is given", path,
                              (long long)c->hidden_size, (long long)c->num_attention_heads);
        else
            st = get_int(j, path, "head_dim", dflt, 2, 4096, &c->head_dim);
    }
    if (!st && c->head_dim % 2)
        st = pl_error_set(PL_ERR_CONFIG, "%s: head_dim %lld must be even (rotary embedding "
                          "rotates pairs)", path, (long long)c->head_dim);
    if (!st) st = get_int(j, path, "vocab_size", -1, 1, 1 << 24, &c->vocab_size);
    if (!st) st = get_int(j, path, "max_position_embeddings", 2048, 1, 1 << 24,
                          &c->max_position_embeddings);
    if (!st) st = get_num(j, path, "rms_norm_eps", 1e-6, 0, 1, &c->rms_norm_eps);
    if (!st) st = get_num(j, path, "initializer_range", 0.02, 0, 10, &c->initializer_range);
    if (!st) st = get_num(j, path, "rope_theta", 10000, 0, 1e12, &c->rope_theta);
    if (!st && cJSON_IsObject(rp) && cJSON_GetObjectItemCaseSensitive(rp, "rope_theta"))
        st = get_num(rp, path, "rope_theta", 10000, 0, 1e12, &c->rope_theta);
    if (!st) st = get_int(j, path, "pad_token_id", -1, -1, (int64_t)1 << 24, &c->pad_token_id);
    if (!st && c->pad_token_id >= c->vocab_size)
        st = pl_error_set(PL_ERR_CONFIG, "%s: pad_token_id %lld is not below vocab_size %lld",
                          path, (long long)c->pad_token_id, (long long)c->vocab_size);
    if (!st) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "tie_word_embeddings");
        if (t && !cJSON_IsNull(t) && !cJSON_IsBool(t))
            st = pl_error_set(PL_ERR_CONFIG, "%s: field 'tie_word_embeddings' must be true or "
                              "false", path);
        c->tie_word_embeddings = cJSON_IsTrue(t);
    }
    if (!st) {
        /* newer transformers write "dtype", older "torch_dtype" */
        const cJSON *d = cJSON_GetObjectItemCaseSensitive(j, "torch_dtype");
        if (!d || cJSON_IsNull(d)) d = cJSON_GetObjectItemCaseSensitive(j, "dtype");
        if (cJSON_IsString(d)) {
            if (strcmp(d->valuestring, "float32") && strcmp(d->valuestring, "bfloat16") &&
                strcmp(d->valuestring, "float16"))
                st = pl_error_set(PL_ERR_CONFIG, "%s: field 'torch_dtype' = \"%s\", expected "
                                  "float32, bfloat16 or float16", path, d->valuestring);
            else
                snprintf(c->torch_dtype, sizeof c->torch_dtype, "%s", d->valuestring);
        }
    }
    return st;
}

/* ---- files ---------------------------------------------------------------------------------- */

static pl_status add_file(hf_llama *h, const char *fname, int *idx) {
    for (int i = 0; i < h->n_files; i++)
        if (!strcmp(strrchr(h->file_names[i], '/') + 1, fname)) {
            *idx = i;
            return PL_OK;
        }
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", h->dir, fname);
    pl_st_file **nf = realloc(h->files, (size_t)(h->n_files + 1) * sizeof *nf);
    if (!nf) return pl_error_set(PL_ERR_NOMEM, "%s: out of memory", h->dir);
    h->files = nf;
    char **nn = realloc(h->file_names, (size_t)(h->n_files + 1) * sizeof *nn);
    if (!nn) return pl_error_set(PL_ERR_NOMEM, "%s: out of memory", h->dir);
    h->file_names = nn;
    h->files[h->n_files] = NULL;
    h->file_names[h->n_files] = strdup(path);
    if (!h->file_names[h->n_files]) return pl_error_set(PL_ERR_NOMEM, "%s: out of memory", h->dir);
    h->n_files++;
    *idx = h->n_files - 1;
    return pl_st_open(path, &h->files[*idx]);
}

static pl_status read_index(hf_llama *h, const cJSON *j, const char *path) {
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(j, "weight_map");
    if (!cJSON_IsObject(wm))
        return pl_error_set(PL_ERR_IO, "%s: no object 'weight_map' (tensor name -> shard file)",
                            path);
    int n = cJSON_GetArraySize(wm);
    if (n <= 0) return pl_error_set(PL_ERR_IO, "%s: 'weight_map' is empty", path);
    h->entries = calloc((size_t)n, sizeof *h->entries);
    if (!h->entries) return pl_error_set(PL_ERR_NOMEM, "%s: out of memory", path);
    const cJSON *e;
    cJSON_ArrayForEach(e, wm) {
        if (!cJSON_IsString(e) || !e->string)
            return pl_error_set(PL_ERR_IO, "%s: weight_map entry '%s' is not a file name", path,
                                e->string ? e->string : "?");
        const char *f = e->valuestring;
        /* untrusted: a shard must be a plain file inside the checkpoint directory */
        if (!f[0] || strchr(f, '/') || f[0] == '.')
            return pl_error_set(PL_ERR_IO, "%s: weight_map maps '%s' to '%s', expected a file "
                                "name inside the directory", path, e->string, f);
        int idx;
        pl_status st = add_file(h, f, &idx);
        if (st) return pl_error_prefix(st, "%s names shard '%s' (for '%s')", path, f, e->string);
        h->entries[h->n_entries].name = strdup(e->string);
        if (!h->entries[h->n_entries].name) return pl_error_set(PL_ERR_NOMEM, "out of memory");
        h->entries[h->n_entries++].file = idx;
    }
    return PL_OK;
}

static pl_status open_dir(const char *dir, int64_t max_layers, bool config_only,
                          hf_llama **out);

pl_status hf_llama_open(const char *dir, int64_t max_layers, hf_llama **out) {
    return open_dir(dir, max_layers, false, out);
}

pl_status hf_llama_open_config(const char *dir, int64_t max_layers, hf_llama **out) {
    return open_dir(dir, max_layers, true, out);
}

bool hf_llama_is_random(const hf_llama *h) { return h && h->random; }

pl_dtype hf_llama_dtype(const hf_llama *h) {
    return !strcmp(h->cfg.torch_dtype, "bfloat16") ? PL_BF16
           : !strcmp(h->cfg.torch_dtype, "float16") ? PL_F16
                                                    : PL_F32;
}

pl_status hf_llama_random_init(const hf_llama *h, pl_tensor *t, const char *name, uint64_t seed) {
    size_t n = strlen(name);
    if (n >= 11 && !strcmp(name + n - 11, "norm.weight")) return pl_tensor_fill_(t, 1.0);
    uint64_t hs = 1469598103934665603ull; /* FNV-1a */
    for (const char *c = name; *c; c++) hs = (hs ^ (uint8_t)*c) * 1099511628211ull;
    return pl_tensor_normal_(t, 0.0, h->cfg.initializer_range, seed, hs);
}

static pl_status open_dir(const char *dir, int64_t max_layers, bool config_only,
                          hf_llama **out) {
    *out = NULL;
    hf_llama *h = calloc(1, sizeof *h);
    if (!h) return pl_error_set(PL_ERR_NOMEM, "hf_llama: out of memory");
    snprintf(h->dir, sizeof h->dir, "%s", dir);
    size_t dl = strlen(h->dir);
    while (dl > 1 && h->dir[dl - 1] == '/') h->dir[--dl] = 0;
    char path[1200];
    bool absent;
    struct stat sb;
    pl_status st = PL_OK;
    if (stat(h->dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        st = pl_error_set(PL_ERR_IO, "backbone %s: not a directory (expected a Hugging Face "
                          "checkpoint directory with config.json and model.safetensors)", h->dir);
    if (!st) {
        snprintf(path, sizeof path, "%s/config.json", h->dir);
        cJSON *j = read_json(path, &absent);
        if (!j) st = pl_error_status();
        else st = parse_config(j, path, max_layers, &h->cfg);
        cJSON_Delete(j);
    }
    h->random = config_only;
    if (!st && !config_only) {
        snprintf(path, sizeof path, "%s/model.safetensors.index.json", h->dir);
        cJSON *j = read_json(path, &absent);
        if (j) {
            st = read_index(h, j, path);
            cJSON_Delete(j);
        } else if (!absent) {
            st = pl_error_status();
        } else {
            pl_error_clear();
            snprintf(path, sizeof path, "%s/model.safetensors", h->dir);
            if (stat(path, &sb) != 0)
                st = pl_error_set(PL_ERR_IO, "backbone %s: neither model.safetensors nor "
                                  "model.safetensors.index.json (only safetensors weights are "
                                  "read; convert a pytorch_model.bin with save_pretrained("
                                  "safe_serialization=True))", h->dir);
            int idx;
            if (!st) st = add_file(h, "model.safetensors", &idx);
        }
    }
    if (st) {
        hf_llama_close(h);
        return st;
    }
    *out = h;
    return PL_OK;
}

void hf_llama_close(hf_llama *h) {
    if (!h) return;
    for (int i = 0; i < h->n_files; i++) {
        pl_st_close(h->files[i]);
        free(h->file_names[i]);
    }
    for (int i = 0; i < h->n_entries; i++) free(h->entries[i].name);
    free(h->entries);
    free(h->files);
    free(h->file_names);
    free(h);
}

const hf_llama_config *hf_llama_cfg(const hf_llama *h) { return &h->cfg; }
const char *hf_llama_dir(const hf_llama *h) { return h->dir; }

/* Which file holds `name` (-1: none). With an index, the index decides. */
static int file_of(const hf_llama *h, const char *name) {
    if (h->n_entries) {
        for (int i = 0; i < h->n_entries; i++)
            if (!strcmp(h->entries[i].name, name)) return h->entries[i].file;
        return -1;
    }
    pl_dtype dt;
    int nd;
    int64_t sh[PL_MAX_DIMS];
    if (pl_st_info(h->files[0], name, &dt, &nd, sh)) {
        pl_error_clear();
        return -1;
    }
    return 0;
}

bool hf_llama_has(const hf_llama *h, const char *name) { return file_of(h, name) >= 0; }

static void shape_str(char *b, size_t n, int nd, const int64_t *sh) {
    size_t k = (size_t)snprintf(b, n, "[");
    for (int i = 0; i < nd && k < n; i++)
        k += (size_t)snprintf(b + k, n - k, "%s%lld", i ? ", " : "", (long long)sh[i]);
    if (k < n) snprintf(b + k, n - k, "]");
}

pl_tensor *hf_llama_tensor(hf_llama *h, const char *name, int ndim, const int64_t *shape) {
    int fi = file_of(h, name);
    if (fi < 0) {
        pl_error_set(PL_ERR_IO, "backbone %s: tensor '%s' is missing (%s)", h->dir, name,
                     h->n_entries ? "not in model.safetensors.index.json" : "not in model.safetensors");
        return NULL;
    }
    const char *fname = h->file_names[fi];
    pl_dtype dt;
    int nd;
    int64_t sh[PL_MAX_DIMS];
    if (pl_st_info(h->files[fi], name, &dt, &nd, sh)) {
        pl_error_set(PL_ERR_IO, "%s: tensor '%s' is missing (model.safetensors.index.json maps it "
                     "to this file)", fname, name);
        return NULL;
    }
    bool same = nd == ndim;
    for (int i = 0; same && i < nd; i++) same = sh[i] == shape[i];
    if (!same) {
        char want[96], got[96];
        shape_str(want, sizeof want, ndim, shape);
        shape_str(got, sizeof got, nd, sh);
        pl_error_set(PL_ERR_SHAPE, "%s: tensor '%s' has shape %s, expected %s (from config.json)",
                     fname, name, got, want);
        return NULL;
    }
    if (dt != PL_F32 && dt != PL_BF16 && dt != PL_F16) {
        pl_error_set(PL_ERR_DTYPE, "%s: tensor '%s' has dtype %s, expected F32, BF16 or F16",
                     fname, name, pl_dtype_name(dt));
        return NULL;
    }
    /* before any conversion: a NaN would vanish in NF4 quantization (qlora4)
     * or surface steps later as a non-finite loss (fp32, bf16) */
    if (pl_st_check_finite(h->files[fi], name)) {
        pl_hint_set("the backbone's weights must be finite numbers: the checkpoint is corrupt or "
                    "was saved from a model that diverged");
        return NULL;
    }
    pl_tensor *t = pl_st_view(h->files[fi], name);
    if (!t && !strstr(pl_error_message(), fname))
        pl_error_prefix(pl_error_status(), "%s", fname);
    return t;
}
