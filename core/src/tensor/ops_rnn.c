/* ops_rnn.c - the recurrent op: pl_lstm (a fused LSTM layer: every time
 * step in one kernel call, the gates kept for backward), the equations of
 * torch.nn.LSTM. Above ops_dense.c (its bias sum is pl_add). */
#include <math.h>
#include <string.h>

#include "graph_internal.h"
#include "internal.h"

/* ---- fused LSTM ------------------------------------------------------------------ */

static pl_status lstm_check_shape(const pl_tensor *t, const char *what, int ndim, int64_t d0,
                                  int64_t d1) {
    char b[256];
    if (!t) return PL_OK;
    if (t->ndim != ndim || t->shape[0] != d0 || (ndim > 1 && t->shape[1] != d1))
        return pl_error_set(PL_ERR_SHAPE, "lstm: %s %s should be [%lld%s%lld]", what,
                            pl_tensor_describe(t, b, sizeof b), (long long)d0, ndim > 1 ? ", " : "",
                            ndim > 1 ? (long long)d1 : 0LL);
    return pl_check_float("lstm", t, false);
}

pl_tensor *pl_lstm(pl_tensor *x, pl_tensor *w_ih, pl_tensor *w_hh, pl_tensor *b_ih, pl_tensor *b_hh,
                   pl_tensor *h0, pl_tensor *c0, bool reverse, pl_tensor **h_n, pl_tensor **c_n) {
    char b1[256];
    if (h_n) *h_n = NULL;
    if (c_n) *c_n = NULL;
    if (!x || !w_ih || !w_hh) return NULL;
    if (pl_check_float("lstm", x, false) || pl_check_ndim("lstm", x, 3, 3) ||
        pl_check_float("lstm", w_hh, false) || pl_check_ndim("lstm", w_hh, 2, 2))
        return NULL;
    int64_t B = x->shape[0], T = x->shape[1], In = x->shape[2], H = w_hh->shape[1];
    if (w_hh->shape[0] != 4 * H) {
        pl_error_set(PL_ERR_SHAPE, "lstm: w_hh %s should be [4H, H]",
                     pl_tensor_describe(w_hh, b1, sizeof b1));
        return NULL;
    }
    if (lstm_check_shape(w_ih, "w_ih", 2, 4 * H, In) ||
        lstm_check_shape(b_ih, "b_ih", 1, 4 * H, 0) ||
        lstm_check_shape(b_hh, "b_hh", 1, 4 * H, 0) || lstm_check_shape(h0, "h0", 2, B, H) ||
        lstm_check_shape(c0, "c0", 2, B, H))
        return NULL;
    pl_tensor *all[7] = {x, w_ih, w_hh, b_ih, b_hh, h0, c0};
    pl_tensor *dev_ts[7];
    int nd = 0;
    for (int i = 0; i < 7; i++)
        if (all[i]) dev_ts[nd++] = all[i];
    if (pl_check_same_device("lstm", dev_ts, nd)) return NULL;

    /* Backward args hold 1 + inputs + saved <= PL_MAX_OP_INPUTS, so the two
     * biases enter as one (b_ih + b_hh through pl_add, which routes the
     * gradient to both) and missing h0/c0/bias become zero tensors. */
    pl_tensor *bias = NULL;
    if (b_ih && b_hh) {
        pl_frame_begin();
        bias = pl_tensor_retain(pl_add(b_ih, b_hh));
        pl_frame_end();
        if (!bias) return NULL;
    } else if (b_ih || b_hh) {
        bias = pl_tensor_retain(b_ih ? b_ih : b_hh);
    } else {
        bias = pl_tensor_new_owned_zeros(PL_F32, 1, (int64_t[]){4 * H}, x->device);
    }
    pl_kernel_args k = {.op = PL_OP_LSTM, .n_in = 6, .n_out = 4, .p.flags = reverse ? 1 : 0};
    k.in[0] = pl_contiguous_owned(x);
    k.in[1] = pl_contiguous_owned(w_ih);
    k.in[2] = pl_contiguous_owned(w_hh);
    k.in[3] = bias ? pl_contiguous_owned(bias) : NULL;
    pl_tensor_release(bias);
    int64_t bh[2] = {B, H};
    k.in[4] = h0 ? pl_contiguous_owned(h0) : pl_tensor_new_owned_zeros(PL_F32, 2, bh, x->device);
    k.in[5] = c0 ? pl_contiguous_owned(c0) : pl_tensor_new_owned_zeros(PL_F32, 2, bh, x->device);
    bool ok = true;
    for (int i = 0; i < 6; i++)
        ok = ok && k.in[i];
    if (!ok) {
        pl_tensors_release(k.in, 6);
        return NULL;
    }
    /* out[1] = workspace saved for backward, [B, T, 6H]: activated gates
     * i, f, g, o (4H), cell state c_t (H), hidden state h_t (H). */
    k.out[0] = pl_tensor_new_owned(PL_F32, 3, (int64_t[]){B, T, H}, x->device);
    k.out[1] = pl_tensor_new_owned(PL_F32, 3, (int64_t[]){B, T, 6 * H}, x->device);
    k.out[2] = pl_tensor_new_owned(PL_F32, 2, bh, x->device);
    k.out[3] = pl_tensor_new_owned(PL_F32, 2, bh, x->device);
    pl_tensor *hn = pl_tensor_retain(k.out[2]), *cn = pl_tensor_retain(k.out[3]);
    pl_tensor *ws = k.out[1];
    pl_tensor *y = pl_op_finish(&k, &ws, 1);
    if (!y) {
        pl_tensor_release(hn);
        pl_tensor_release(cn);
        return NULL;
    }
    if (h_n)
        *h_n = pl_op_result(hn);
    else
        pl_tensor_release(hn);
    if (c_n)
        *c_n = pl_op_result(cn);
    else
        pl_tensor_release(cn);
    return y;
}
