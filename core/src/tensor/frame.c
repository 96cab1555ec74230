/* frame.c - frames (autograd.h): a per-thread stack of the tensors ops
 * create while a frame is open, released when it ends. Tensor ownership, in
 * the tensor + ops layer: pl_op_result hands each op's result to the
 * innermost frame (pl_frame_adopt). */
#include <stdlib.h>

#include "internal.h"

typedef struct tensor_vec {
    pl_tensor **v;
    int64_t n, cap;
} tensor_vec;

#define MAX_FRAMES 32
static _Thread_local tensor_vec tl_frames[MAX_FRAMES];
static _Thread_local int tl_frame_depth;

static pl_status vec_push(tensor_vec *v, pl_tensor *t) {
    if (v->n == v->cap) {
        int64_t nc = v->cap ? v->cap * 2 : 256;
        pl_tensor **nv = realloc(v->v, (size_t)nc * sizeof *nv);
        if (!nv) return pl_error_set(PL_ERR_NOMEM, "out of memory (frame)");
        v->v = nv;
        v->cap = nc;
    }
    v->v[v->n++] = t;
    return PL_OK;
}

/* ---- frames ------------------------------------------------------------------ */

void pl_frame_begin(void) {
    if (tl_frame_depth < MAX_FRAMES) tl_frames[tl_frame_depth].n = 0;
    tl_frame_depth++;
}

void pl_frame_end(void) {
    if (tl_frame_depth == 0) return;
    tl_frame_depth--;
    if (tl_frame_depth >= MAX_FRAMES) return;
    tensor_vec *f = &tl_frames[tl_frame_depth];
    for (int64_t i = f->n - 1; i >= 0; i--) pl_tensor_release(f->v[i]);
    f->n = 0;
}

void pl_frame_adopt(pl_tensor *t) {
    if (!t || tl_frame_depth == 0 || tl_frame_depth > MAX_FRAMES) return;
    vec_push(&tl_frames[tl_frame_depth - 1], t);
}

pl_tensor *pl_frame_keep(pl_tensor *t) { return pl_tensor_retain(t); }

pl_tensor *pl_frame_end_keep(pl_tensor *t) {
    pl_tensor_retain(t);
    pl_frame_end();
    /* the enclosing frame takes our reference; with none, the caller owns it */
    if (t && tl_frame_depth > 0) pl_frame_adopt(t);
    return t;
}

pl_tensor *pl_op_result(pl_tensor *t) {
    if (t) pl_frame_adopt(t);
    return t;
}
