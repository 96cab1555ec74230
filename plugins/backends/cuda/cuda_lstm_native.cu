/* cuda_lstm_native.cu - PL_OP_LSTM's kernels on CUDA: the choice between the
 * cuDNN implementation (cuda_lstm.cu) and the native one (cuda_lstm_native.h:
 * cublasSgemm calls and our own element kernels, PyTorch's non-cuDNN
 * structure, capturable in a CUDA graph), and the native one's device side.
 *
 * Which one runs: the backend option `lstm` (set_option("lstm", v)) or, when
 * set and not empty, the environment variable PL_CUDA_LSTM (it wins), with v
 *   auto    (default) native while the calling thread captures a graph,
 *           cuDNN otherwise;
 *   cudnn   always cuDNN (refuses a capture, as before);
 *   native  always native.
 * Any other value is PL_ERR_INVALID naming it (set_option at once; the
 * environment's at the op's next call). Built without cuDNN (no
 * PL_CUDA_HAVE_CUDNN) the native one always runs, and `cudnn` is refused.
 *
 * The saved workspace: the native forward writes ws [B, T, 6H] as the CPU
 * does and its backward reads it; the cuDNN forward leaves ws unwritten and
 * its backward recomputes the forward, reading nothing from ws. So a cuDNN
 * backward is right after either forward, and a native backward only after a
 * native forward. The rule that keeps a pair consistent whatever happens
 * between the two calls (a capture beginning or ending, an eager step beside
 * a captured one): the forward notes the address of each ws it writes
 * natively (a table of the last 64, see ws_note) and removes it when the
 * cuDNN forward gets that address; under auto the backward is native iff its
 * ws is in the table. A ws that fell out of the table (more than 64 native
 * forwards between a forward and its backward) gets the cuDNN backward:
 * correct eagerly, refused inside a capture (which then falls back to eager
 * under [trainer] cuda_graphs = auto), never a native backward on a ws it
 * did not write. `native` and `cudnn` choose both directions by the mode
 * alone (changing the mode between a forward and its backward is not
 * supported: under `native` the backward would read a ws the cuDNN forward
 * did not write).
 *
 * The native path uses only what a stream capture takes (the rules of
 * cuda_memory.cu): cublasSgemm on the thread's stream with the handle's own
 * workspace (cuda_matmul.cu), our kernels, scratch from the caching
 * allocator, cudaMemsetAsync / cudaMemcpyAsync device-to-device. It was
 * written without a GPU: the host half of it ran in test_lstm_native.c
 * against the CPU kernel; on a GPU it is checked by test_cuda.c
 * (lstm_native_matches_cpu, lstm_native_captures) and the conformance rows
 * with PL_CUDA_LSTM=native (plugins/backends/cuda/README.md).
 */
#include <atomic>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_common.cuh"
#include "cuda_lstm_native.h"

/* ---- the choice ------------------------------------------------------------------------ */

enum { LSTM_AUTO, LSTM_CUDNN, LSTM_NATIVE };
static std::atomic<int> g_lstm_mode{LSTM_AUTO};

static pl_status parse_mode(const char *v, const char *where, int *mode) {
    if (!strcmp(v, "auto")) *mode = LSTM_AUTO;
    else if (!strcmp(v, "native")) *mode = LSTM_NATIVE;
    else if (!strcmp(v, "cudnn")) {
#ifndef PL_CUDA_HAVE_CUDNN
        return pl_error_set(PL_ERR_UNSUPPORTED, "cuda backend: %s = 'cudnn', but this cuda plugin "
                            "was built without cuDNN (use auto or native)", where);
#endif
        *mode = LSTM_CUDNN;
    } else
        return pl_error_set(PL_ERR_INVALID, "cuda backend: %s = '%s' (expected auto, cudnn or "
                            "native)", where, v);
    return PL_OK;
}

pl_status pl_cu_lstm_option(const char *value) {
    int m = LSTM_AUTO;
    if (parse_mode(value, "lstm", &m)) return pl_error_status();
    g_lstm_mode.store(m);
    return PL_OK;
}

/* The mode of this call: PL_CUDA_LSTM when set, else the option. */
static pl_status lstm_mode(int *mode) {
    const char *e = getenv("PL_CUDA_LSTM");
    if (e && e[0]) return parse_mode(e, "PL_CUDA_LSTM", mode);
    *mode = g_lstm_mode.load();
    return PL_OK;
}

/* The addresses of the last LSTM_WS_SLOTS workspaces a native forward wrote
 * (see the top). */
#define LSTM_WS_SLOTS 64
static const void *g_ws[LSTM_WS_SLOTS];
static int g_ws_next;
static pthread_mutex_t g_ws_mu = PTHREAD_MUTEX_INITIALIZER;

/* native: note p (written natively); else forget it (the cuDNN forward). */
static void ws_note(const void *p, bool native) {
    if (!p) return;
    pthread_mutex_lock(&g_ws_mu);
    for (int i = 0; i < LSTM_WS_SLOTS; i++)
        if (g_ws[i] == p) g_ws[i] = NULL;
    if (native) {
        g_ws[g_ws_next] = p;
        g_ws_next = (g_ws_next + 1) % LSTM_WS_SLOTS;
    }
    pthread_mutex_unlock(&g_ws_mu);
}

static bool ws_native(const void *p) {
    if (!p) return false;
    bool hit = false;
    pthread_mutex_lock(&g_ws_mu);
    for (int i = 0; i < LSTM_WS_SLOTS && !hit; i++) hit = g_ws[i] == p;
    pthread_mutex_unlock(&g_ws_mu);
    return hit;
}

/* ---- the native path's device side ----------------------------------------------------- */

template <int K> __global__ void k_lstm_nat(pl_lstm_nat a, int64_t s, int64_t n) {
    GRID_LOOP(e, n) pl_lstm_nat_elem(K, &a, s, e);
}

typedef struct nat_ctx {
    pl_device dev;
    cublasHandle_t blas;
    pl_cu_scratch sc[5];
} nat_ctx;

static pl_status nat_gemm(void *ctx, bool ta, bool tb, int m, int n, int k, float alpha,
                          const float *A, int lda, const float *B, int ldb, float beta, float *C,
                          int ldc) {
    nat_ctx *c = (nat_ctx *)ctx;
    cublasStatus_t s = cublasSgemm(c->blas, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                                   tb ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k, &alpha, A, lda, B, ldb,
                                   &beta, C, ldc);
    if (s != CUBLAS_STATUS_SUCCESS)
        return pl_error_set(PL_ERR_DEVICE, "cuda lstm (native): cublasSgemm(%c, %c, %d, %d, %d, "
                            "lda %d, ldb %d, ldc %d) failed: %s", ta ? 'T' : 'N', tb ? 'T' : 'N',
                            m, n, k, lda, ldb, ldc, pl_cu_blas_status(s));
    return PL_OK;
}

static pl_status nat_elem(void *ctx, int kind, const pl_lstm_nat *a, int64_t s, int64_t n) {
    (void)ctx;
    if (n <= 0) return PL_OK;
    unsigned g = pl_cu_blocks(n);
    switch (kind) {
    case PL_LSTM_NAT_BIAS: k_lstm_nat<PL_LSTM_NAT_BIAS><<<g, PL_CUDA_THREADS>>>(*a, s, n); break;
    case PL_LSTM_NAT_CELL: k_lstm_nat<PL_LSTM_NAT_CELL><<<g, PL_CUDA_THREADS>>>(*a, s, n); break;
    case PL_LSTM_NAT_FINAL: k_lstm_nat<PL_LSTM_NAT_FINAL><<<g, PL_CUDA_THREADS>>>(*a, s, n); break;
    case PL_LSTM_NAT_ZERO_STATE:
        k_lstm_nat<PL_LSTM_NAT_ZERO_STATE><<<g, PL_CUDA_THREADS>>>(*a, s, n);
        break;
    case PL_LSTM_NAT_CELL_GRAD:
        k_lstm_nat<PL_LSTM_NAT_CELL_GRAD><<<g, PL_CUDA_THREADS>>>(*a, s, n);
        break;
    case PL_LSTM_NAT_STATE_OUT:
        k_lstm_nat<PL_LSTM_NAT_STATE_OUT><<<g, PL_CUDA_THREADS>>>(*a, s, n);
        break;
    case PL_LSTM_NAT_HPREV: k_lstm_nat<PL_LSTM_NAT_HPREV><<<g, PL_CUDA_THREADS>>>(*a, s, n); break;
    case PL_LSTM_NAT_ONES: k_lstm_nat<PL_LSTM_NAT_ONES><<<g, PL_CUDA_THREADS>>>(*a, s, n); break;
    default: return pl_error_set(PL_ERR_INTERNAL, "cuda lstm (native): no element pass %d", kind);
    }
    CUDA_LAUNCHED("lstm");
    return PL_OK;
}

static pl_status nat_zero(void *ctx, float *p, int64_t n) {
    (void)ctx;
    CUDA_TRY(cudaMemset(p, 0, (size_t)n * sizeof(float))); /* cudaMemsetAsync, this stream */
    return PL_OK;
}

static pl_status nat_copy(void *ctx, float *dst, const float *src, int64_t n) {
    (void)ctx;
    CUDA_TRY(cudaMemcpy(dst, src, (size_t)n * sizeof(float), cudaMemcpyDeviceToDevice));
    return PL_OK;
}

static float *nat_scratch(void *ctx, int slot, int64_t n) {
    nat_ctx *c = (nat_ctx *)ctx;
    if (slot < 0 || slot >= 5) {
        pl_error_set(PL_ERR_INTERNAL, "cuda lstm (native): scratch slot %d", slot);
        return NULL;
    }
    return (float *)pl_cu_scratch_get(&c->sc[slot], c->dev, (size_t)n * sizeof(float));
}

static pl_status nat_open(nat_ctx *c, pl_lstm_nat_ops *o, const pl_tensor *t) {
    memset(c, 0, sizeof *c);
    c->dev = t->device;
    if (pl_cu_set_device(t)) return pl_error_status();
    if (!(c->blas = pl_cu_blas_handle(t->device.index))) return pl_error_status();
    o->ctx = c;
    o->gemm = nat_gemm;
    o->elem = nat_elem;
    o->zero = nat_zero;
    o->copy = nat_copy;
    o->scratch = nat_scratch;
    return PL_OK;
}

static void nat_close(nat_ctx *c) {
    for (int i = 0; i < 5; i++) pl_cu_scratch_free(&c->sc[i]);
}

static pl_status check_f32(const pl_kernel_args *a, int n_in) {
    for (int i = 0; i < n_in && i < a->n_in; i++)
        if (a->in[i] && a->in[i]->dtype != PL_F32)
            return pl_error_set(PL_ERR_DTYPE, "cuda lstm: input %d has dtype %s; lstm takes f32",
                                i, pl_dtype_name(a->in[i]->dtype));
    return PL_OK;
}

static float *out_or_null(const pl_kernel_args *a, int i) {
    return i < a->n_out && a->out[i] ? fp(a->out[i]) : NULL;
}

/* in = {x, w_ih, w_hh, b, h0, c0}; out = {y, ws, h_n, c_n} */
static pl_status native_fwd(const pl_kernel_args *a) {
    if (check_f32(a, 6)) return pl_error_status();
    const pl_tensor *xt = a->in[0];
    pl_lstm_nat n;
    memset(&n, 0, sizeof n);
    n.B = xt->shape[0], n.T = xt->shape[1], n.In = xt->shape[2], n.H = a->in[2]->shape[1];
    n.rev = a->p.flags & 1;
    n.x = cf(xt), n.wih = cf(a->in[1]), n.whh = cf(a->in[2]), n.bias = cf(a->in[3]);
    n.h0 = cf(a->in[4]), n.c0 = cf(a->in[5]);
    n.y = out_or_null(a, 0), n.ws = out_or_null(a, 1);
    n.hn = out_or_null(a, 2), n.cn = out_or_null(a, 3);
    nat_ctx c;
    pl_lstm_nat_ops o;
    pl_status st = nat_open(&c, &o, xt);
    if (!st) st = pl_lstm_nat_forward(&o, &n);
    nat_close(&c);
    return st;
}

/* in = {dy, x, w_ih, w_hh, b, h0, c0, ws}; out = {dx, dw_ih, dw_hh, db, dh0, dc0} */
static pl_status native_bwd(const pl_kernel_args *a) {
    if (check_f32(a, 8)) return pl_error_status();
    const pl_tensor *xt = a->in[1];
    pl_lstm_nat n;
    memset(&n, 0, sizeof n);
    n.B = xt->shape[0], n.T = xt->shape[1], n.In = xt->shape[2], n.H = a->in[3]->shape[1];
    n.rev = a->p.flags & 1;
    n.dy = cf(a->in[0]), n.x = cf(xt), n.wih = cf(a->in[2]), n.whh = cf(a->in[3]);
    n.bias = cf(a->in[4]), n.h0 = cf(a->in[5]), n.c0 = cf(a->in[6]);
    n.ws = (float *)cf(a->in[7]); /* read only */
    n.dx = out_or_null(a, 0), n.dwih = out_or_null(a, 1), n.dwhh = out_or_null(a, 2);
    n.db = out_or_null(a, 3), n.dh0 = out_or_null(a, 4), n.dc0 = out_or_null(a, 5);
    if (!n.dx && !n.dwih && !n.dwhh && !n.db && !n.dh0 && !n.dc0) return PL_OK;
    nat_ctx c;
    pl_lstm_nat_ops o;
    pl_status st = nat_open(&c, &o, xt);
    if (!st) st = pl_lstm_nat_backward(&o, &n);
    nat_close(&c);
    return st;
}

/* ---- the op's kernels -------------------------------------------------------------------- */

static pl_status k_lstm_fwd(const pl_kernel_args *a) {
    int mode;
    if (lstm_mode(&mode)) return pl_error_status();
    const void *ws = a->n_out > 1 && a->out[1] && pl_tensor_nbytes(a->out[1])
                         ? pl_tensor_data(a->out[1])
                         : NULL;
#ifdef PL_CUDA_HAVE_CUDNN
    /* auto: native while capturing, and for input size 0 (which cuDNN refuses) */
    bool native = mode == LSTM_NATIVE ||
                  (mode == LSTM_AUTO && (pl_cu_capturing() || a->in[0]->shape[2] == 0));
    if (!native) {
        ws_note(ws, false);
        return pl_cu_lstm_cudnn_fwd(a);
    }
#endif
    pl_status st = native_fwd(a);
    if (!st) ws_note(ws, true);
    return st;
}

static pl_status k_lstm_bwd(const pl_kernel_args *a) {
    int mode;
    if (lstm_mode(&mode)) return pl_error_status();
#ifdef PL_CUDA_HAVE_CUDNN
    const void *ws = a->n_in > 7 && a->in[7] ? pl_tensor_data(a->in[7]) : NULL;
    bool native = mode == LSTM_NATIVE ||
                  (mode == LSTM_AUTO && (ws_native(ws) || a->in[1]->shape[2] == 0));
    if (!native) return pl_cu_lstm_cudnn_bwd(a);
#else
    (void)ws_native;
#endif
    return native_bwd(a);
}

void pl_cuda_register_lstm(pl_kernel_table *t) {
    pl_kernel_table_set(t, PL_OP_LSTM, k_lstm_fwd, k_lstm_bwd);
}
