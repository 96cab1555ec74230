/* graph.c - whole-step graphs (graph.h): capture through the backend's
 * verbs, the graph-private pool, the optimizer coefficient table and the
 * dropout counter offset. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph_internal.h"
#include "internal.h"

#define SLOT_FLOATS 16 /* 64 bytes: a pl_adamw_coef or pl_sgd_coef */
#define CHUNK_SLOTS 64
#define MAX_CHUNKS 1024

typedef struct optim_call {
    pl_op op;
    const pl_tensor *param;
} optim_call;

struct pl_graph {
    pl_device dev;
    const pl_backend *be;
    void *handle;        /* the backend's */
    pl_mempool *pool, *prev_pool;
    pl_tensor *delta;    /* i64 [1] on dev: micro-steps since the capture */
    /* optimizer coefficient table: chunks of CHUNK_SLOTS slots on the device,
     * mirrored on the host */
    pl_tensor *chunk[MAX_CHUNKS];
    float *host;         /* [n_chunks * CHUNK_SLOTS * SLOT_FLOATS] */
    int n_chunks;
    optim_call *calls;   /* [n_calls], capture order */
    int n_calls, cap_calls;
    int n_pad;           /* padding entries (op PL_OP_NONE) among them */
    int refresh_i;       /* refreshing: the next call */
    int refresh_pad;     /* padding entries it has passed */
    int n_drop;          /* dropout calls captured */
    pl_status violation; /* the core's first (dropout mismatch) */
    char violation_msg[512];
    int n_fused;         /* what the backend fused (capture_end_step) */
    char fused[192];
};

static _Thread_local pl_graph *tl_cap;     /* capturing */
static _Thread_local pl_graph *tl_refresh; /* refreshing */
/* dropout counters of the learned step */
static _Thread_local uint64_t *tl_learn;
static _Thread_local int tl_n_learn, tl_cap_learn;
static _Thread_local bool tl_learning;

static const pl_backend *graph_backend(pl_device d) {
    if (d.type == PL_DEVICE_CPU) return NULL;
    const pl_backend *b = pl_backend_peek(d.type);
    if (!b || !PL_BACKEND_HAS(b, graph_release)) return NULL;
    return b->capture_begin && b->capture_end && b->graph_replay && b->graph_release ? b : NULL;
}

bool pl_graph_supported(pl_device d) { return graph_backend(d) != NULL; }

bool pl_graph_capturing(void) { return tl_cap != NULL; }

static void graph_free(pl_graph *g) {
    if (!g) return;
    if (g->handle && g->be) g->be->graph_release(g->handle);
    pl_tensor_release(g->delta);
    for (int i = 0; i < g->n_chunks; i++) pl_tensor_release(g->chunk[i]);
    pl_alloc_pool_release(g->pool);
    free(g->host);
    free(g->calls);
    free(g);
}

pl_status pl_graph_capture_begin(pl_device d) {
    if (tl_cap) return pl_error_set(PL_ERR_INVALID, "graph capture: this thread is already capturing");
    const char *fe = getenv("PL_GRAPH_FUSION"); /* checked before anything is recorded */
    if (fe && strcmp(fe, "0") && strcmp(fe, "1"))
        return pl_error_set(PL_ERR_INVALID, "graph capture: PL_GRAPH_FUSION='%s' (expected 0 or 1)", fe);
    const pl_backend *be = graph_backend(d);
    if (!be) {
        const pl_backend *b = d.type == PL_DEVICE_CPU ? NULL : pl_backend_peek(d.type);
        return pl_error_set(PL_ERR_UNSUPPORTED, "graph capture: backend '%s' cannot capture graphs",
                            d.type == PL_DEVICE_CPU ? "cpu" : b ? b->name : "?");
    }
    pl_graph *g = calloc(1, sizeof *g);
    if (!g) return pl_error_set(PL_ERR_NOMEM, "graph capture");
    *g = (pl_graph){.dev = d, .be = be};
    g->delta = pl_tensor_zeros_owned(PL_I64, 1, (int64_t[]){1}, d);
    g->pool = g->delta ? pl_alloc_pool_new(d) : NULL;
    if (!g->pool) {
        pl_status s = pl_error_status();
        graph_free(g);
        return pl_error_prefix(s ? s : PL_ERR_NOMEM, "graph capture");
    }
    g->prev_pool = pl_alloc_pool_use(g->pool);
    pl_status s = be->capture_begin(d.index);
    if (s) {
        pl_alloc_pool_use(g->prev_pool);
        graph_free(g);
        return pl_error_prefix(s, "graph capture on '%s'", be->name);
    }
    tl_cap = g;
    return PL_OK;
}

/* One host-to-device copy per chunk of the coefficient table. */
static pl_status upload_table(pl_graph *g) {
    for (int c = 0; c < g->n_chunks; c++) {
        int used = g->n_calls - c * CHUNK_SLOTS;
        if (used > CHUNK_SLOTS) used = CHUNK_SLOTS;
        size_t nb = (size_t)used * SLOT_FLOATS * sizeof(float);
        pl_status s = g->be->memcpy(pl_tensor_data(g->chunk[c]), g->dev,
                                    g->host + (size_t)c * CHUNK_SLOTS * SLOT_FLOATS, PL_CPU, nb);
        if (s) return pl_error_prefix(s, "graph: the optimizer coefficients to the device");
    }
    return PL_OK;
}

pl_status pl_graph_capture_end(pl_graph **out) {
    *out = NULL;
    pl_graph *g = tl_cap;
    if (!g) return pl_error_set(PL_ERR_INVALID, "graph capture: this thread is not capturing");
    tl_cap = NULL;
    pl_alloc_pool_use(g->prev_pool);
    /* the backend sees which blocks the step released (backend.h, "Seeing the
     * step") and may fuse; PL_GRAPH_FUSION=0: plain capture_end */
    const char *env = getenv("PL_GRAPH_FUSION");
    pl_step_facts f = {.struct_size = sizeof f};
    pl_status s;
    if (PL_BACKEND_HAS(g->be, capture_end_step) && g->be->capture_end_step && !(env && !strcmp(env, "0"))) {
        pl_step_block *rel = pl_alloc_pool_free_blocks(g->pool, &f.n_released);
        f.released = rel;
        s = g->be->capture_end_step(g->dev.index, &f, &g->handle);
        g->n_fused = f.n_fused;
        snprintf(g->fused, sizeof g->fused, "%.*s", (int)sizeof f.fused, f.fused);
        free(rel);
    } else {
        s = g->be->capture_end(g->dev.index, &g->handle);
    }
    if (s) {
        s = pl_error_prefix(s, "graph capture on '%s'", g->be->name);
    } else if (g->violation) {
        s = pl_error_set(g->violation, "%s", g->violation_msg);
    } else if (g->n_drop != tl_n_learn && (g->n_drop || tl_n_learn)) {
        s = pl_error_set(PL_ERR_INVALID, "graph capture: the captured step made %d dropout calls, "
                         "the step before it %d (the step is not the same every time)",
                         g->n_drop, tl_n_learn);
    }
    tl_n_learn = 0; /* the learned step belongs to this capture only */
    if (!s) s = upload_table(g);
    if (s) {
        graph_free(g);
        return s;
    }
    *out = g;
    return PL_OK;
}

pl_status pl_graph_replay(pl_graph *g) {
    if (!g || !g->handle) return pl_error_set(PL_ERR_INVALID, "graph replay: no graph");
    if (tl_cap) return pl_error_set(PL_ERR_INVALID, "graph replay: while capturing");
    pl_status s = g->be->graph_replay(g->handle);
    return s ? pl_error_prefix(s, "graph replay on '%s'", g->be->name) : PL_OK;
}

int pl_graph_fused(const pl_graph *g, const char **patterns) {
    if (patterns) *patterns = g ? g->fused : "";
    return g ? g->n_fused : 0;
}

void pl_graph_release(pl_graph *g) {
    if (!g) return;
    if (tl_refresh == g) tl_refresh = NULL;
    graph_free(g);
}

pl_status pl_graph_violation(pl_status s) {
    pl_graph *g = tl_cap;
    if (g && !g->violation) {
        g->violation = s;
        snprintf(g->violation_msg, sizeof g->violation_msg, "%s", pl_error_message());
    }
    return s;
}

/* ---- optimizer coefficients ---- */

int pl_graph_optim_mode(void) { return tl_cap ? 1 : tl_refresh ? 2 : 0; }

int pl_graph_optim_calls(const pl_graph *g) { return g ? g->n_calls - g->n_pad : 0; }

/* One more entry in the call list (a padding entry has op PL_OP_NONE). */
static bool push_call(pl_graph *g, pl_op op, const pl_tensor *param) {
    if (g->n_calls == g->cap_calls) {
        int nc = g->cap_calls ? 2 * g->cap_calls : 64;
        optim_call *nb = realloc(g->calls, (size_t)nc * sizeof *nb);
        if (!nb) {
            pl_error_set(PL_ERR_NOMEM, "graph: optimizer call list");
            return false;
        }
        g->calls = nb;
        g->cap_calls = nc;
    }
    g->calls[g->n_calls++] = (optim_call){.op = op, .param = param};
    return true;
}

/* A new chunk of the table, from outside the graph's pool. */
static bool add_chunk(pl_graph *g) {
    if (g->n_chunks == MAX_CHUNKS) {
        pl_error_set(PL_ERR_INVALID, "graph: more than %d optimizer calls in one step",
                     MAX_CHUNKS * CHUNK_SLOTS);
        return false;
    }
    float *nh = realloc(g->host, (size_t)(g->n_chunks + 1) * CHUNK_SLOTS * SLOT_FLOATS *
                                     sizeof(float));
    if (!nh) {
        pl_error_set(PL_ERR_NOMEM, "graph: optimizer coefficient table");
        return false;
    }
    g->host = nh;
    /* NOT from the graph's pool: the host writes the table between
     * replays, so no captured work may reuse its memory */
    pl_mempool *pool = pl_alloc_pool_use(NULL);
    pl_tensor *c = pl_tensor_new_owned(PL_F32, 1, (int64_t[]){CHUNK_SLOTS * SLOT_FLOATS}, g->dev);
    pl_alloc_pool_use(pool);
    if (!c) return false;
    g->chunk[g->n_chunks++] = c;
    return true;
}

pl_tensor *pl_graph_optim_slots(pl_op op, const pl_tensor *const *param, const void *coef,
                                size_t n, size_t stride, int count) {
    pl_graph *g = tl_cap;
    if (!g || n > SLOT_FLOATS * sizeof(float) || count < 1 || count > CHUNK_SLOTS) {
        pl_error_set(PL_ERR_INTERNAL, "graph: optimizer slot outside a capture or too large");
        return NULL;
    }
    /* a call's slots are adjacent, in one chunk: pad to the next chunk when
     * the rest of this one is too short (padding entries take no refresh) */
    if (g->n_calls < g->n_chunks * CHUNK_SLOTS && g->n_calls % CHUNK_SLOTS + count > CHUNK_SLOTS)
        for (; g->n_calls % CHUNK_SLOTS; g->n_pad++)
            if (!push_call(g, PL_OP_NONE, NULL)) return NULL;
    int first = g->n_calls;
    while ((first + count + CHUNK_SLOTS - 1) / CHUNK_SLOTS > g->n_chunks)
        if (!add_chunk(g)) return NULL;
    for (int j = 0; j < count; j++) {
        float *h = g->host + (size_t)(first + j) * SLOT_FLOATS;
        memset(h, 0, SLOT_FLOATS * sizeof(float));
        memcpy(h, (const char *)coef + (size_t)j * stride, n);
        if (!push_call(g, op, param[j])) return NULL;
    }
    pl_tensor *v = pl_tensor_view_owned(g->chunk[first / CHUNK_SLOTS]); /* owned by the caller */
    if (!v) return NULL;
    v->offset += (int64_t)(first % CHUNK_SLOTS) * SLOT_FLOATS;
    v->shape[0] = (int64_t)count * SLOT_FLOATS;
    return v;
}

pl_tensor *pl_graph_optim_slot(pl_op op, const pl_tensor *param, const void *coef, size_t n) {
    return pl_graph_optim_slots(op, &param, coef, n, n, 1);
}

pl_status pl_graph_refresh_begin(pl_graph *g) {
    if (!g) return pl_error_set(PL_ERR_INVALID, "graph refresh: no graph");
    if (tl_cap || tl_refresh)
        return pl_error_set(PL_ERR_INVALID, "graph refresh: while capturing or refreshing");
    g->refresh_i = g->refresh_pad = 0;
    tl_refresh = g;
    return PL_OK;
}

pl_status pl_graph_optim_refresh(pl_op op, const pl_tensor *param, const void *coef, size_t n) {
    pl_graph *g = tl_refresh;
    if (!g) return pl_error_set(PL_ERR_INTERNAL, "graph: refresh outside pl_graph_refresh_begin");
    for (; g->refresh_i < g->n_calls && g->calls[g->refresh_i].op == PL_OP_NONE; g->refresh_pad++)
        g->refresh_i++; /* padding before a multi-tensor call's slots */
    int i = g->refresh_i;
    if (i >= g->n_calls || g->calls[i].op != op || g->calls[i].param != param ||
        n > SLOT_FLOATS * sizeof(float))
        return pl_error_set(PL_ERR_INVALID, "graph replay: optimizer call %d (%s of parameter '%s') "
                            "is not the captured step's (%s), so the step is not the same every "
                            "time", i, pl_op_name(op), param->name,
                            i < g->n_calls ? g->calls[i].param->name : "no more calls");
    float *h = g->host + (size_t)i * SLOT_FLOATS;
    memcpy(h, coef, n);
    g->refresh_i++;
    return PL_OK;
}

pl_status pl_graph_refresh_end(pl_graph *g) {
    if (!g || tl_refresh != g) return pl_error_set(PL_ERR_INVALID, "graph refresh: not refreshing");
    tl_refresh = NULL;
    if (g->refresh_i != g->n_calls)
        return pl_error_set(PL_ERR_INVALID, "graph replay: the optimizer made %d calls, the "
                            "captured step %d", g->refresh_i - g->refresh_pad,
                            g->n_calls - g->n_pad);
    return upload_table(g);
}

/* ---- dropout ---- */

void pl_graph_dropout_learn(bool on) {
    if (on) tl_n_learn = 0;
    tl_learning = on;
}

bool pl_graph_dropout_active(void) { return tl_learning || tl_cap; }

int pl_graph_dropout_calls(const pl_graph *g) { return g ? g->n_drop : 0; }

pl_tensor *pl_graph_dropout_offset(uint64_t counter, int64_t *stride) {
    *stride = 0;
    if (tl_learning && !tl_cap) {
        if (tl_n_learn == tl_cap_learn) {
            int nc = tl_cap_learn ? 2 * tl_cap_learn : 64;
            uint64_t *nb = realloc(tl_learn, (size_t)nc * sizeof *nb);
            if (!nb) return NULL; /* fewer learned calls: the capture then fails */
            tl_learn = nb;
            tl_cap_learn = nc;
        }
        tl_learn[tl_n_learn++] = counter;
        return NULL;
    }
    pl_graph *g = tl_cap;
    if (!g) return NULL;
    int i = g->n_drop++;
    if (i >= tl_n_learn) {
        pl_error_set(PL_ERR_INVALID, "graph capture: dropout call %d has no counterpart in the step "
                     "before the capture (%d calls); the step is not the same every time",
                     i, tl_n_learn);
        pl_graph_violation(PL_ERR_INVALID);
        return NULL;
    }
    *stride = (int64_t)(counter - tl_learn[i]);
    return g->delta;
}

pl_status pl_graph_set_micro_delta(pl_graph *g, int64_t delta) {
    if (!g) return pl_error_set(PL_ERR_INVALID, "graph: no graph");
    pl_status s = g->be->memcpy(pl_tensor_data(g->delta), g->dev, &delta, PL_CPU, sizeof delta);
    return s ? pl_error_prefix(s, "graph: the dropout offset to the device") : PL_OK;
}
