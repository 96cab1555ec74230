/* ilora_impl.h - what the sources of the ilora plugin share beyond ilora.h
 * (private to the plugin's sources). Which file does what:
 *   ilora.c          the vtable, `pipeline predict`, the plugin glue
 *   ilora_opts.c     the option table, reading the options, checking them
 *                    against each other and a backbone's config.json
 *   ilora_params.c   building the model: its parameters (ilora_model_create)
 *   ilora_layers.c   the decoder layers, the router, the hidden states, logits
 *   ilora_forward.c  the training and evaluation forward, metrics, ranking masks
 * Calls go down that list (and to the helper files), never back up. */
#ifndef ILORA_IMPL_H
#define ILORA_IMPL_H

#include "ilora.h"
#include "hf_llama.h"

/* ---- ilora_opts.c ---- */

extern const pl_option_spec ilora_options[];

/* Refuses options that contradict each other (head sizes, experts, ranks). */
pl_status ilora_check_opts(const ilora_opts *o);

/* Takes the backbone's shape from its config.json `c` (in directory `dir`);
 * a shape option also written in the INI must agree with it. */
pl_status ilora_apply_backbone_config(ilora_opts *o, const hf_llama_config *c, const char *dir);

/* ---- ilora_layers.c ---- */

/* The forward's router output: gates g = softmax(z) and logits z, [B, L, E]
 * (per position) or [B, E] (per row); NULL without a router. */
typedef struct route {
    pl_tensor *g, *z;
} route;

/* Host copy of an index tensor as i64 (caller frees). */
int64_t *ilora_host_index(pl_tensor *t, const char *what);

/* The final hidden states [B, L, D] ([B, 1, D]: last_only) of ids [B, L], and
 * the router output in *rt (may be NULL). */
pl_tensor *ilora_hidden_forward(ilora_model *m, pl_tensor *ids, bool training, bool last_only,
                                route *rt);

/* The last position's final hidden state [B, D] without dropout, and the
 * forward's router output (rt may be NULL). */
pl_tensor *ilora_last_hidden_rt(ilora_model *m, pl_tensor *ids, route *rt);

/* ---- ilora_forward.c ---- */

/* Batch field `name` (option `option`), or NULL with an error listing the fields. */
pl_tensor *ilora_need_field(const pl_batch *b, const char *name, const char *option);

/* Logits of the last position [B, V] (f32, host copy in *host), and the
 * forward's router output in *rt (may be NULL). */
pl_tensor *ilora_last_logits(ilora_model *m, pl_tensor *ids, pl_tensor **host, route *rt);

/* The items ranking masks for each row (evaluation and predict alike): the
 * batch's history field [B, H], else the history CSR by the row's user index,
 * else the input window [B, L]. Host copies, freed by ilora_seen_free. */
typedef struct seen_items {
    int64_t *hist, hw;         /* history field */
    const ilora_hist *csr;     /* CSR by user ... */
    const int64_t *users;      /* ... with the caller's user indices */
    int64_t *win, wl;          /* input window */
} seen_items;

pl_status ilora_seen_open(ilora_model *m, const pl_batch *b, pl_data_split split, pl_tensor *ids,
                          const int64_t *users, seen_items *s);
/* Row i's seen items to -inf in row[0..V), except `keep`. */
pl_status ilora_seen_mask(const seen_items *s, int64_t i, int64_t keep, float *row, int64_t V,
                          pl_data_split split);
void ilora_seen_free(seen_items *s);

#endif
