/* cuda_lstm.cu - PL_OP_LSTM on CUDA through cuDNN's RNN API (v8 calls),
 * the GPU twin of plugins/backends/cpu/kernels_lstm.c. Built only when CMake finds
 * cuDNN (PL_CUDA_HAVE_CUDNN). One of two implementations: cuda_lstm_native.cu
 * registers the op's kernels and chooses, per call, between these two functions
 * (pl_cu_lstm_cudnn_fwd / _bwd) and the native implementation (cuda_lstm_native.h:
 * cublasSgemm + our element kernels, PyTorch's non-cuDNN structure, writes and
 * reads the CPU's ws, capturable in a CUDA graph). The choice: [backend option]
 * lstm = auto | cudnn | native, or PL_CUDA_LSTM; auto (default) is cuDNN
 * eagerly and native while the thread captures a graph (cuDNN's RNN calls
 * invalidated a capture on the H200, so these functions refuse one), and an
 * auto backward is native only for a ws a native forward wrote (a cuDNN
 * backward reads nothing from ws, so it follows either forward). Without cuDNN
 * the native implementation is the only one.
 *
 * The op (ops.h pl_lstm, front end in core/src/tensor/ops_index.c): one layer,
 * PyTorch gate order (i, f, g, o), batch-major x [B, T, In],
 *   a_t = x_t W_ih^T + h_{t-1} W_hh^T + b,  c_t = f c_{t-1} + i g,  h_t = o tanh(c_t)
 * Kernel args: in = {x, w_ih [4H, In], w_hh [4H, H], b [4H] (the front end
 * already summed b_ih + b_hh), h0 [B, H], c0 [B, H]} all f32;
 * out = {y [B, T, H], ws [B, T, 6H], h_n [B, H], c_n [B, H]};
 * p.flags bit0 = reverse (t = T-1 .. 0).
 * Backward: in = {dy, x, w_ih, w_hh, b, h0, c0, ws};
 * out = {dx, dw_ih, dw_hh, db, dh0, dc0}, each NULL when not wanted,
 * overwritten; dh_n / dc_n are not differentiated (zero), as on the CPU.
 *
 * Mapping onto cuDNN:
 *   - CUDNN_LSTM, one layer, unidirectional, CUDNN_LINEAR_INPUT, f32 data and
 *     math, CUDNN_FMA_MATH (no TF32: f32 results as cuBLAS's here and the
 *     CPU's), CUDNN_RNN_ALGO_STANDARD, projSize = H, no dropout.
 *   - Gate order: cuDNN's LSTM linear layers 0..3 are the input matrices of
 *     gates i, f, g(c), o and 4..7 the recurrent ones, the same order as
 *     ours (and PyTorch's, which packs its weights the same way). Each gate's
 *     matrix is a row-major [H, In] / [H, H] block: rows j*H .. (j+1)*H of
 *     w_ih / w_hh are copied into linear layer j / 4+j.
 *   - Biases: CUDNN_RNN_DOUBLE_BIAS (PyTorch's mode), our combined b in the
 *     input-GEMM biases (layers 0..3) and ZERO recurrent biases (4..7), so
 *     the gate pre-activation is x W^T + b + h R^T as ours. db is the
 *     gradient cuDNN reports for the input biases (the recurrent ones get
 *     the same column sums, not used).
 *   - Layout: CUDNN_RNN_DATA_LAYOUT_BATCH_MAJOR_UNPACKED (padded IO enabled),
 *     every sequence of length T: x / y / dy / dx are used in place. h0 / c0
 *     / h_n / c_n are [1, B, H] tensors, the same bytes as our [B, H].
 *   - reverse: cuDNN runs one direction forward in time, so x (and dy) are
 *     flipped along T into scratch, cuDNN runs, and y (dx) are flipped back.
 *     h_n / c_n are then the states after t = 0, as on the CPU.
 *   - Weights: packed into a cuDNN weight space (cudnnGetRNNWeightParams
 *     gives each matrix's and bias's address) on every call; weight
 *     gradients come back from a zeroed gradient space the same way.
 *
 * Saved tensor: the CPU saves ws [B, T, 6H] (gates, c_t, h_t). cuDNN's
 * backward needs its own opaque reserve space plus y, whose size it decides
 * and which need not fit in ws, so the CUDA forward does NOT write ws and
 * runs in inference mode (no reserve), and the backward RECOMPUTES the
 * forward (cudnnRNNForward in training mode with a reserve space) before
 * cudnnRNNBackwardData_v8 and cudnnRNNBackwardWeights_v8. The backward thus
 * costs one more forward; ws is left as allocated (its content is private to
 * the backend that made it).
 *
 * cuDNN handles: one per device, created lazily (on the calling thread's
 * default stream, cudaStreamPerThread, as every other kernel of this plugin:
 * cuda_common.cuh), with a no-dropout descriptor.
 */
#include <cudnn.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_common.cuh"

#define PL_CUDA_MAX_DEVICES 8

/* ---- per-device cuDNN handle --------------------------------------------------- */

typedef struct dnn_dev {
    cudnnHandle_t h;
    cudnnDropoutDescriptor_t nodrop; /* dropout 0, no states */
} dnn_dev;

static dnn_dev g_dnn[PL_CUDA_MAX_DEVICES];
static pthread_mutex_t g_dnn_mu = PTHREAD_MUTEX_INITIALIZER;

static pl_status dnn_fail(cudnnStatus_t s, const char *call, int line) {
    return pl_error_set(PL_ERR_DEVICE, "cuda lstm: %s failed: %s (%s:%d)", call,
                        cudnnGetErrorString(s), __FILE__, line);
}

/* Inside a function returning pl_status. */
#define DNN_TRY(expr)                                                                          \
    do {                                                                                       \
        cudnnStatus_t _s = (expr);                                                             \
        if (_s != CUDNN_STATUS_SUCCESS) return dnn_fail(_s, #expr, __LINE__);                  \
    } while (0)

/* The handle of device dev (the current device), created on first use. */
static const dnn_dev *dnn_get(int dev) {
    if (dev < 0 || dev >= PL_CUDA_MAX_DEVICES) {
        pl_error_set(PL_ERR_DEVICE, "cuda lstm: device index %d out of range", dev);
        return NULL;
    }
    pthread_mutex_lock(&g_dnn_mu);
    dnn_dev *d = &g_dnn[dev];
    if (!d->h) {
        cudnnHandle_t h = NULL;
        cudnnDropoutDescriptor_t dd = NULL;
        cudnnStatus_t s = cudnnCreate(&h);
        const char *what = "cudnnCreate";
        if (s == CUDNN_STATUS_SUCCESS) {
            what = "cudnnSetStream";
            s = cudnnSetStream(h, cudaStreamPerThread);
        }
        if (s == CUDNN_STATUS_SUCCESS) {
            what = "cudnnCreateDropoutDescriptor";
            s = cudnnCreateDropoutDescriptor(&dd);
        }
        if (s == CUDNN_STATUS_SUCCESS) {
            what = "cudnnSetDropoutDescriptor";
            s = cudnnSetDropoutDescriptor(dd, h, 0.0f, NULL, 0, 0);
        }
        if (s == CUDNN_STATUS_SUCCESS) {
            d->h = h;
            d->nodrop = dd;
        } else {
            pl_error_set(PL_ERR_DEVICE, "cuda lstm: %s on cuda:%d failed: %s", what, dev,
                         cudnnGetErrorString(s));
            if (dd) cudnnDestroyDropoutDescriptor(dd);
            if (h) cudnnDestroy(h);
        }
    }
    const dnn_dev *r = d->h ? d : NULL;
    pthread_mutex_unlock(&g_dnn_mu);
    return r;
}

/* ---- small kernels ------------------------------------------------------------------ */

/* dst[b, t, :] = src[b, T-1-t, :], rows of C floats. */
__global__ void k_lstm_flip_time(float *dst, const float *src, int64_t B, int64_t T, int64_t C) {
    GRID_LOOP(i, B * T * C) {
        int64_t c = i % C, r = i / C;
        int64_t t = r % T, b = r / T;
        dst[i] = src[(b * T + (T - 1 - t)) * C + c];
    }
}

__global__ void k_lstm_fill_i32(int32_t *p, int64_t n, int32_t v) {
    GRID_LOOP(i, n) p[i] = v;
}

/* ---- one call's cuDNN state ----------------------------------------------------------- */

typedef struct lstm_ctx {
    int64_t B, T, In, H;
    bool rev;
    pl_device dev;
    const dnn_dev *dnn;
    cudnnRNNDescriptor_t rnn;
    cudnnRNNDataDescriptor_t xd, yd;
    cudnnTensorDescriptor_t hd;     /* [1, B, H]: h0, c0, h_n, c_n and their gradients */
    cudnnTensorDescriptor_t md, bd; /* filled by cudnnGetRNNWeightParams */
    size_t wsize, work_size, reserve_size;
    int32_t *seq;                   /* device [B], every entry T */
    void *w, *work, *reserve;
    pl_cu_scratch s_seq, s_w, s_work, s_reserve;
} lstm_ctx;

static void lstm_close(lstm_ctx *c) {
    if (c->md) cudnnDestroyTensorDescriptor(c->md);
    if (c->bd) cudnnDestroyTensorDescriptor(c->bd);
    if (c->hd) cudnnDestroyTensorDescriptor(c->hd);
    if (c->xd) cudnnDestroyRNNDataDescriptor(c->xd);
    if (c->yd) cudnnDestroyRNNDataDescriptor(c->yd);
    if (c->rnn) cudnnDestroyRNNDescriptor(c->rnn);
    pl_cu_scratch_free(&c->s_seq);
    pl_cu_scratch_free(&c->s_w);
    pl_cu_scratch_free(&c->s_work);
    pl_cu_scratch_free(&c->s_reserve);
}

static pl_status lstm_check_dims(int64_t B, int64_t T, int64_t In, int64_t H) {
    if (B > INT_MAX || T > INT_MAX || In > INT_MAX || H > INT_MAX / 4)
        return pl_error_set(PL_ERR_UNSUPPORTED, "cuda lstm: B=%lld T=%lld In=%lld H=%lld exceed "
                            "cuDNN's int range", (long long)B, (long long)T, (long long)In,
                            (long long)H);
    if (In == 0)
        return pl_error_set(PL_ERR_UNSUPPORTED, "cuda lstm: input size 0 is not supported by "
                            "cuDNN (B=%lld T=%lld H=%lld); lstm = auto or native runs it",
                            (long long)B, (long long)T, (long long)H);
    return PL_OK;
}

/* Descriptors, sequence lengths and the weight space for [B, T, In] -> H
 * (B, T, H > 0); the work / reserve sizes of `mode`. */
static pl_status lstm_open(lstm_ctx *c, pl_device dev, int64_t B, int64_t T, int64_t In,
                           int64_t H, bool rev, cudnnForwardMode_t mode) {
    memset(c, 0, sizeof *c);
    c->B = B, c->T = T, c->In = In, c->H = H, c->rev = rev, c->dev = dev;
    CUDA_TRY(cudaSetDevice(dev.index));
    if (!(c->dnn = dnn_get(dev.index))) return pl_error_status();
    cudnnHandle_t h = c->dnn->h;
    DNN_TRY(cudnnCreateRNNDescriptor(&c->rnn));
    DNN_TRY(cudnnSetRNNDescriptor_v8(c->rnn, CUDNN_RNN_ALGO_STANDARD, CUDNN_LSTM,
                                     CUDNN_RNN_DOUBLE_BIAS, CUDNN_UNIDIRECTIONAL,
                                     CUDNN_LINEAR_INPUT, CUDNN_DATA_FLOAT, CUDNN_DATA_FLOAT,
                                     CUDNN_FMA_MATH, (int32_t)In, (int32_t)H, (int32_t)H, 1,
                                     c->dnn->nodrop, CUDNN_RNN_PADDED_IO_ENABLED));

    int *lens = (int *)malloc((size_t)B * sizeof(int));
    if (!lens) return pl_error_set(PL_ERR_NOMEM, "cuda lstm: out of host memory (B=%lld)",
                                   (long long)B);
    for (int64_t b = 0; b < B; b++) lens[b] = (int)T;
    float fill = 0.0f;
    cudnnStatus_t s = cudnnCreateRNNDataDescriptor(&c->xd);
    if (s == CUDNN_STATUS_SUCCESS)
        s = cudnnSetRNNDataDescriptor(c->xd, CUDNN_DATA_FLOAT, CUDNN_RNN_DATA_LAYOUT_BATCH_MAJOR_UNPACKED,
                                      (int)T, (int)B, (int)In, lens, &fill);
    if (s == CUDNN_STATUS_SUCCESS) s = cudnnCreateRNNDataDescriptor(&c->yd);
    if (s == CUDNN_STATUS_SUCCESS)
        s = cudnnSetRNNDataDescriptor(c->yd, CUDNN_DATA_FLOAT, CUDNN_RNN_DATA_LAYOUT_BATCH_MAJOR_UNPACKED,
                                      (int)T, (int)B, (int)H, lens, &fill);
    free(lens);
    if (s != CUDNN_STATUS_SUCCESS) return dnn_fail(s, "cudnnSetRNNDataDescriptor", __LINE__);

    int dims[3] = {1, (int)B, (int)H}, strides[3] = {(int)(B * H), (int)H, 1};
    DNN_TRY(cudnnCreateTensorDescriptor(&c->hd));
    DNN_TRY(cudnnSetTensorNdDescriptor(c->hd, CUDNN_DATA_FLOAT, 3, dims, strides));
    DNN_TRY(cudnnCreateTensorDescriptor(&c->md));
    DNN_TRY(cudnnCreateTensorDescriptor(&c->bd));

    c->seq = (int32_t *)pl_cu_scratch_get(&c->s_seq, dev, (size_t)B * sizeof(int32_t));
    if (!c->seq) return pl_error_status();
    k_lstm_fill_i32<<<pl_cu_blocks(B), PL_CUDA_THREADS>>>(c->seq, B, (int32_t)T);
    CUDA_LAUNCHED("lstm");

    DNN_TRY(cudnnGetRNNWeightSpaceSize(h, c->rnn, &c->wsize));
    DNN_TRY(cudnnGetRNNTempSpaceSizes(h, c->rnn, mode, c->xd, &c->work_size, &c->reserve_size));
    if (!(c->w = pl_cu_scratch_get(&c->s_w, dev, c->wsize))) return pl_error_status();
    if (!(c->work = pl_cu_scratch_get(&c->s_work, dev, c->work_size))) return pl_error_status();
    if (mode == CUDNN_FWD_MODE_TRAINING &&
        !(c->reserve = pl_cu_scratch_get(&c->s_reserve, dev, c->reserve_size)))
        return pl_error_status();
    return PL_OK;
}

/* Elements described by a tensor descriptor cuDNN filled. */
static pl_status desc_numel(cudnnTensorDescriptor_t d, int64_t *n) {
    cudnnDataType_t dt;
    int nd = 0, dims[8], strides[8];
    DNN_TRY(cudnnGetTensorNdDescriptor(d, 8, &dt, &nd, dims, strides));
    int64_t k = 1;
    for (int i = 0; i < nd && i < 8; i++) k *= dims[i];
    *n = nd > 0 ? k : 0;
    return PL_OK;
}

/* Address of linear layer `lin`'s matrix and bias inside weight space `space`
 * (pseudo-layer 0), after checking cuDNN agrees on their sizes. */
static pl_status lstm_param(const lstm_ctx *c, const void *space, int lin, float **mat,
                            float **bias) {
    void *m = NULL, *b = NULL;
    DNN_TRY(cudnnGetRNNWeightParams(c->dnn->h, c->rnn, 0, c->wsize, space, lin, c->md, &m, c->bd,
                                    &b));
    int64_t want = c->H * (lin < 4 ? c->In : c->H), nm = 0, nb = 0;
    if (desc_numel(c->md, &nm) || desc_numel(c->bd, &nb)) return pl_error_status();
    if (!m || !b || nm != want || nb != c->H)
        return pl_error_set(PL_ERR_INTERNAL, "cuda lstm: cuDNN's linear layer %d holds %lld "
                            "weights and %lld biases, expected %lld and %lld", lin,
                            (long long)nm, (long long)nb, (long long)want, (long long)c->H);
    *mat = (float *)m;
    *bias = (float *)b;
    return PL_OK;
}

/* Our w_ih / w_hh / b into the weight space (recurrent biases zero). */
static pl_status lstm_pack(const lstm_ctx *c, const float *wih, const float *whh,
                           const float *bias) {
    int64_t H = c->H, In = c->In;
    CUDA_TRY(cudaMemset(c->w, 0, c->wsize));
    for (int lin = 0; lin < 8; lin++) {
        float *m, *b;
        if (lstm_param(c, c->w, lin, &m, &b)) return pl_error_status();
        int j = lin & 3;
        if (lin < 4) {
            CUDA_TRY(cudaMemcpy(m, wih + j * H * In, (size_t)(H * In) * sizeof(float),
                                cudaMemcpyDeviceToDevice));
            CUDA_TRY(cudaMemcpy(b, bias + j * H, (size_t)H * sizeof(float),
                                cudaMemcpyDeviceToDevice));
        } else {
            CUDA_TRY(cudaMemcpy(m, whh + j * H * H, (size_t)(H * H) * sizeof(float),
                                cudaMemcpyDeviceToDevice));
        }
    }
    return PL_OK;
}

/* Weight gradients from gradient space dw into our dw_ih / dw_hh / db (each
 * may be NULL). */
static pl_status lstm_unpack(const lstm_ctx *c, const void *dw, float *dwih, float *dwhh,
                             float *db) {
    int64_t H = c->H, In = c->In;
    for (int lin = 0; lin < 8; lin++) {
        float *m, *b;
        if (lstm_param(c, dw, lin, &m, &b)) return pl_error_status();
        int j = lin & 3;
        if (lin < 4) {
            if (dwih)
                CUDA_TRY(cudaMemcpy(dwih + j * H * In, m, (size_t)(H * In) * sizeof(float),
                                    cudaMemcpyDeviceToDevice));
            if (db)
                CUDA_TRY(cudaMemcpy(db + j * H, b, (size_t)H * sizeof(float),
                                    cudaMemcpyDeviceToDevice));
        } else if (dwhh) {
            CUDA_TRY(cudaMemcpy(dwhh + j * H * H, m, (size_t)(H * H) * sizeof(float),
                                cudaMemcpyDeviceToDevice));
        }
    }
    return PL_OK;
}

/* dst <- src flipped along T ([B, T, C] f32). */
static pl_status lstm_flip(const lstm_ctx *c, float *dst, const float *src, int64_t C) {
    int64_t n = c->B * c->T * C;
    if (n <= 0) return PL_OK;
    k_lstm_flip_time<<<pl_cu_blocks(n), PL_CUDA_THREADS>>>(dst, src, c->B, c->T, C);
    CUDA_LAUNCHED("lstm");
    return PL_OK;
}

/* A [B, T, C] f32 scratch buffer. */
static float *lstm_buf(const lstm_ctx *c, pl_cu_scratch *s, int64_t C) {
    return (float *)pl_cu_scratch_get(s, c->dev, (size_t)(c->B * c->T * C) * sizeof(float));
}

static pl_status lstm_check_f32(const pl_kernel_args *a, int n_in) {
    for (int i = 0; i < n_in; i++)
        if (a->in[i] && a->in[i]->dtype != PL_F32)
            return pl_error_set(PL_ERR_DTYPE, "cuda lstm: input %d has dtype %s; lstm takes f32",
                                i, pl_dtype_name(a->in[i]->dtype));
    return PL_OK;
}

/* ---- forward (the cuDNN path; called by cuda_lstm_native.cu's choice) ----------------- */

pl_status pl_cu_lstm_cudnn_fwd(const pl_kernel_args *a) {
    /* cuDNN's RNN calls invalidated a stream capture on the H200 (2026-11-27:
     * "operation failed due to a previous error during capture") */
    if (pl_cu_refuse_capture("lstm", "cuDNN's RNN forward / backward is not capturable here"))
        return pl_error_status();
    const pl_tensor *xt = a->in[0], *whh = a->in[2];
    int64_t B = xt->shape[0], T = xt->shape[1], In = xt->shape[2], H = whh->shape[1];
    bool rev = a->p.flags & 1;
    if (lstm_check_f32(a, 6)) return pl_error_status();
    if (pl_cu_set_device(xt)) return pl_error_status();
    float *y = fp(a->out[0]), *hn = fp(a->out[2]), *cn = fp(a->out[3]);
    if (B == 0 || H == 0) return PL_OK;
    if (T == 0) { /* no step: the final states are the initial ones */
        CUDA_TRY(cudaMemcpy(hn, cf(a->in[4]), (size_t)(B * H) * sizeof(float),
                            cudaMemcpyDeviceToDevice));
        CUDA_TRY(cudaMemcpy(cn, cf(a->in[5]), (size_t)(B * H) * sizeof(float),
                            cudaMemcpyDeviceToDevice));
        return PL_OK;
    }
    if (lstm_check_dims(B, T, In, H)) return pl_error_status();
    lstm_ctx c;
    pl_cu_scratch s_x = {0}, s_y = {0};
    pl_status st = lstm_open(&c, xt->device, B, T, In, H, rev, CUDNN_FWD_MODE_INFERENCE);
    if (!st) st = lstm_pack(&c, cf(a->in[1]), cf(whh), cf(a->in[3]));
    const float *x = cf(xt);
    float *yo = y;
    if (!st && rev) {
        float *xr = lstm_buf(&c, &s_x, In);
        yo = lstm_buf(&c, &s_y, H);
        st = !xr || !yo ? pl_error_status() : lstm_flip(&c, xr, x, In);
        x = xr;
    }
    if (!st) {
        cudnnStatus_t s = cudnnRNNForward(c.dnn->h, c.rnn, CUDNN_FWD_MODE_INFERENCE, c.seq, c.xd,
                                          x, c.yd, yo, c.hd, cf(a->in[4]), hn, c.hd, cf(a->in[5]),
                                          cn, c.wsize, c.w, c.work_size, c.work, 0, NULL);
        if (s != CUDNN_STATUS_SUCCESS) st = dnn_fail(s, "cudnnRNNForward", __LINE__);
    }
    if (!st && rev) st = lstm_flip(&c, y, yo, H);
    pl_cu_scratch_free(&s_x);
    pl_cu_scratch_free(&s_y);
    lstm_close(&c);
    return st;
}

/* ---- backward (recomputes the forward, see the top) ------------------------------------ */

static pl_status zero_outputs(const pl_kernel_args *a) {
    for (int i = 0; i < a->n_out && i < 6; i++)
        if (a->out[i]) CUDA_TRY(cudaMemset(pl_tensor_data(a->out[i]), 0, pl_tensor_nbytes(a->out[i])));
    return PL_OK;
}

pl_status pl_cu_lstm_cudnn_bwd(const pl_kernel_args *a) {
    /* cuDNN's RNN calls invalidated a stream capture on the H200 (2026-11-27:
     * "operation failed due to a previous error during capture") */
    if (pl_cu_refuse_capture("lstm", "cuDNN's RNN forward / backward is not capturable here"))
        return pl_error_status();
    const pl_tensor *dyt = a->in[0], *xt = a->in[1], *whh = a->in[3];
    int64_t B = xt->shape[0], T = xt->shape[1], In = xt->shape[2], H = whh->shape[1];
    bool rev = a->p.flags & 1;
    float *dx = a->out[0] ? fp(a->out[0]) : NULL;
    float *dwih = a->out[1] ? fp(a->out[1]) : NULL;
    float *dwhh = a->out[2] ? fp(a->out[2]) : NULL;
    float *db = a->out[3] ? fp(a->out[3]) : NULL;
    float *dh0 = a->out[4] ? fp(a->out[4]) : NULL;
    float *dc0 = a->out[5] ? fp(a->out[5]) : NULL;
    if (!dx && !dwih && !dwhh && !db && !dh0 && !dc0) return PL_OK;
    if (lstm_check_f32(a, 7)) return pl_error_status();
    if (pl_cu_set_device(xt)) return pl_error_status();
    /* no step or no unit: every gradient is zero (the CPU's empty sums) */
    if (B == 0 || T == 0 || H == 0) return zero_outputs(a);
    if (lstm_check_dims(B, T, In, H)) return pl_error_status();

    lstm_ctx c;
    pl_cu_scratch s_x = {0}, s_dy = {0}, s_y = {0}, s_dx = {0}, s_dw = {0};
    const float *h0 = cf(a->in[5]), *c0 = cf(a->in[6]);
    pl_status st = lstm_open(&c, xt->device, B, T, In, H, rev, CUDNN_FWD_MODE_TRAINING);
    if (!st) st = lstm_pack(&c, cf(a->in[2]), cf(whh), cf(a->in[4]));
    const float *x = cf(xt), *dy = cf(dyt);
    float *y = NULL, *dxo = dx;
    if (!st) {
        y = lstm_buf(&c, &s_y, H);
        if (!y) st = pl_error_status();
    }
    if (!st && rev) {
        float *xr = lstm_buf(&c, &s_x, In), *dyr = lstm_buf(&c, &s_dy, H);
        st = !xr || !dyr ? pl_error_status() : lstm_flip(&c, xr, x, In);
        if (!st) st = lstm_flip(&c, dyr, dy, H);
        x = xr;
        dy = dyr;
    }
    if (!st && (rev || !dx)) { /* cuDNN always writes dx */
        dxo = lstm_buf(&c, &s_dx, In);
        if (!dxo) st = pl_error_status();
    }
    cudnnStatus_t s = CUDNN_STATUS_SUCCESS;
    const char *call = "";
    if (!st) {
        call = "cudnnRNNForward";
        s = cudnnRNNForward(c.dnn->h, c.rnn, CUDNN_FWD_MODE_TRAINING, c.seq, c.xd, x, c.yd, y,
                            c.hd, h0, NULL, c.hd, c0, NULL, c.wsize, c.w, c.work_size, c.work,
                            c.reserve_size, c.reserve);
    }
    if (!st && s == CUDNN_STATUS_SUCCESS) { /* dh_n, dc_n: NULL = zero */
        call = "cudnnRNNBackwardData_v8";
        s = cudnnRNNBackwardData_v8(c.dnn->h, c.rnn, c.seq, c.yd, y, dy, c.xd, dxo, c.hd, h0,
                                    NULL, dh0, c.hd, c0, NULL, dc0, c.wsize, c.w, c.work_size,
                                    c.work, c.reserve_size, c.reserve);
    }
    if (!st && s == CUDNN_STATUS_SUCCESS && (dwih || dwhh || db)) {
        void *dw = pl_cu_scratch_get(&s_dw, c.dev, c.wsize);
        if (!dw)
            st = pl_error_status();
        else if (cudaMemset(dw, 0, c.wsize) != cudaSuccess) /* cuDNN only adds (WGRAD_MODE_ADD) */
            st = pl_error_set(PL_ERR_DEVICE, "cuda lstm backward: cudaMemset failed");
        if (!st) {
            call = "cudnnRNNBackwardWeights_v8";
            s = cudnnRNNBackwardWeights_v8(c.dnn->h, c.rnn, CUDNN_WGRAD_MODE_ADD, c.seq, c.xd, x,
                                           c.hd, h0, c.yd, y, c.wsize, dw, c.work_size, c.work,
                                           c.reserve_size, c.reserve);
            if (s == CUDNN_STATUS_SUCCESS) st = lstm_unpack(&c, dw, dwih, dwhh, db);
        }
    }
    if (!st && s != CUDNN_STATUS_SUCCESS) st = dnn_fail(s, call, __LINE__);
    if (!st && dx && rev) st = lstm_flip(&c, dx, dxo, In);
    pl_cu_scratch_free(&s_x);
    pl_cu_scratch_free(&s_dy);
    pl_cu_scratch_free(&s_y);
    pl_cu_scratch_free(&s_dx);
    pl_cu_scratch_free(&s_dw);
    lstm_close(&c);
    return st;
}
