/* cuda_backend.cu - the CUDA backend plugin: device memory, transfers,
 * cuBLAS matmul, copy/cast/shape kernels, and the pl_backend table exported
 * as plugin "cuda" (kind backend). The other op kernels are in
 * cuda_kernels.cu. See README.md for what is supported.
 */
#include <cublas_v2.h>
#include <dlfcn.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "cuda_common.cuh" /* and pipeline/backend_util.h: matmul geometry */

#define PL_CUDA_MAX_DEVICES 8

/* ---- device, memory, transfers ------------------------------------------------ */

static int cu_device_count(void) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        pl_error_set(PL_ERR_DEVICE, "cudaGetDeviceCount: %s (%s)", cudaGetErrorString(e),
                     cudaGetErrorName(e));
        cudaGetLastError(); /* clear the sticky-free error so later calls start clean */
        return 0;
    }
    if (n == 0) pl_error_set(PL_ERR_DEVICE, "cudaGetDeviceCount reports 0 devices");
    return n;
}

/* ---- graph capture state (the verbs are further down) ----
 * tl_cap_dev: the device this thread is capturing on (-1: none).
 * g_capturing[dev]: some thread captures on dev; read by background copies
 * under g_copy_mu, which then order themselves after g_precap[dev] (an
 * event recorded on the capturing stream just before the capture began)
 * instead of the legacy stream: work on the legacy stream would make an
 * implicit dependency on the capturing stream and invalidate the capture. */
#define PL_CU_MAX_DEVICES 16
static thread_local int tl_cap_dev = -1;
static int g_capturing[PL_CU_MAX_DEVICES];
static cudaEvent_t g_precap[PL_CU_MAX_DEVICES];
static pthread_mutex_t g_copy_mu = PTHREAD_MUTEX_INITIALIZER;

static thread_local pl_status tl_cap_err; /* the capture's first violation */
static thread_local char tl_cap_msg[512];

/* Refused before CUDA sees it; kept as the capture's first error, which
 * capture_end returns (the capture is poisoned, as on the strict device). */
static pl_status capture_violation(const char *what, size_t n) {
    pl_status s = pl_error_set(PL_ERR_DEVICE,
                               "cuda: %s of %zu bytes while capturing a graph (a captured step "
                               "cannot contain one: it would wait for the device or bake a host "
                               "value into the graph)",
                               what, n);
    if (!tl_cap_err) {
        tl_cap_err = s;
        snprintf(tl_cap_msg, sizeof tl_cap_msg, "%s", pl_error_message());
    }
    return s;
}

pl_status pl_cu_refuse_capture(const char *op, const char *why) {
    if (tl_cap_dev < 0) return PL_OK;
    pl_status s = pl_error_set(PL_ERR_UNSUPPORTED, "cuda: op '%s' cannot be captured in a graph "
                               "(%s); with [trainer] cuda_graphs = auto such a step runs eagerly",
                               op, why);
    if (!tl_cap_err) {
        tl_cap_err = s;
        snprintf(tl_cap_msg, sizeof tl_cap_msg, "%s", pl_error_message());
    }
    return s;
}

static void *cu_raw_alloc(int device, size_t n) {
    void *p = NULL;
    if (tl_cap_dev >= 0 && !pl_alloc_in_raw_alloc()) { /* not the graph's pool growing */
        capture_violation("an allocation outside the graph's pool (a raw_alloc not from the "
                          "core's allocator)", n);
        return NULL;
    }
    if (cudaSetDevice(device) != cudaSuccess) return NULL;
    /* while this thread captures, the core's allocator grows the graph's pool:
     * cudaMalloc is not a stream operation, so it is allowed (relaxed mode for
     * the call, as PyTorch's caching allocator does) */
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    if (tl_cap_dev >= 0) cudaThreadExchangeStreamCaptureMode(&mode);
    cudaError_t e = cudaMalloc(&p, n ? n : 1);
    if (tl_cap_dev >= 0) cudaThreadExchangeStreamCaptureMode(&mode);
    if (e != cudaSuccess) {
        cudaGetLastError();
        pl_error_set(PL_ERR_NOMEM, "cudaMalloc of %zu bytes on cuda:%d failed: %s", n, device,
                     cudaGetErrorString(e));
        return NULL;
    }
    return p;
}

static void cu_raw_free(int device, void *p) {
    if (!p) return;
    cudaSetDevice(device);
    cudaFree(p);
}

static pl_status cu_memcpy(void *dst, pl_device dd, const void *src, pl_device sd, size_t n) {
    if (n == 0) return PL_OK;
    cudaMemcpyKind kind;
    if (dd.type == PL_DEVICE_CUDA && sd.type == PL_DEVICE_CUDA)
        kind = cudaMemcpyDeviceToDevice;
    else if (dd.type == PL_DEVICE_CUDA)
        kind = cudaMemcpyHostToDevice;
    else if (sd.type == PL_DEVICE_CUDA)
        kind = cudaMemcpyDeviceToHost;
    else
        kind = cudaMemcpyHostToHost;
    int dev = dd.type == PL_DEVICE_CUDA ? dd.index : sd.index;
    if (tl_cap_dev >= 0 && kind == cudaMemcpyDeviceToHost)
        return capture_violation("a host read (device-to-host copy)", n);
    if (tl_cap_dev >= 0 && kind == cudaMemcpyHostToDevice)
        return capture_violation("a host write (host-to-device copy)", n);
    CUDA_TRY(cudaSetDevice(dev));
    if (kind == cudaMemcpyDeviceToDevice && dd.index != sd.index) {
        CUDA_TRY(cudaMemcpyPeer(dst, dd.index, src, sd.index, n));
        return PL_OK;
    }
    CUDA_TRY(cudaMemcpy(dst, src, n, kind));
    /* a copy to the host waits for the kernels before it: report what they
     * recorded (a bad index, a bad target; pl_cu_fault_check) */
    if (kind == cudaMemcpyDeviceToHost) return pl_cu_fault_check();
    return PL_OK;
}

/* One non-blocking copy stream per device (no implicit synchronization with
 * the compute streams), created on first use. */
static cudaStream_t g_copy_stream[PL_CU_MAX_DEVICES];

static pl_status cu_memcpy_h2d_background(void *dst, pl_device dd, const void *src, size_t n) {
    if (n == 0) return PL_OK;
    if (dd.type != PL_DEVICE_CUDA || dd.index < 0 || dd.index >= PL_CU_MAX_DEVICES)
        return pl_error_set(PL_ERR_DEVICE, "cuda: background copy to a non-CUDA device");
    CUDA_TRY(cudaSetDevice(dd.index));
    if (tl_cap_dev >= 0) return capture_violation("a host write (background host-to-device copy)", n);
    pthread_mutex_lock(&g_copy_mu);
    cudaError_t e = cudaSuccess;
    if (!g_copy_stream[dd.index])
        e = cudaStreamCreateWithFlags(&g_copy_stream[dd.index], cudaStreamNonBlocking);
    cudaStream_t cs = g_copy_stream[dd.index];
    /* after everything already issued on the compute streams: an event on the
     * legacy stream, which waits for all work of the (blocking) per-thread
     * streams issued before it; while a thread captures, the event recorded
     * on its stream just before the capture (work issued since is only
     * recorded, it does not run) */
    cudaEvent_t issued = NULL;
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&issued, cudaEventDisableTiming);
    if (e == cudaSuccess)
        e = g_capturing[dd.index] ? cudaStreamWaitEvent(cs, g_precap[dd.index], 0)
                                  : cudaEventRecord(issued, cudaStreamLegacy);
    if (e == cudaSuccess && !g_capturing[dd.index]) e = cudaStreamWaitEvent(cs, issued, 0);
    pthread_mutex_unlock(&g_copy_mu);
    if (e == cudaSuccess) e = cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, cs);
    if (e == cudaSuccess) e = cudaStreamSynchronize(cs);
    if (issued) cudaEventDestroy(issued);
    CUDA_TRY(e);
    return PL_OK;
}

static pl_status cu_memset(void *dst, pl_device dev, int v, size_t n) {
    if (n == 0) return PL_OK;
    CUDA_TRY(cudaSetDevice(dev.index));
    CUDA_TRY(cudaMemset(dst, v, n));
    return PL_OK;
}

static pl_status cu_sync(int device) {
    if (tl_cap_dev >= 0) return capture_violation("synchronize", 0);
    CUDA_TRY(cudaSetDevice(device));
    CUDA_TRY(cudaDeviceSynchronize());
    return pl_cu_fault_check();
}

static pl_status cu_mem_info(int device, size_t *free_b, size_t *total_b) {
    CUDA_TRY(cudaSetDevice(device));
    CUDA_TRY(cudaMemGetInfo(free_b, total_b));
    return PL_OK;
}

static void *cu_host_alloc(size_t n) {
    void *p = NULL;
    if (cudaHostAlloc(&p, n ? n : 1, cudaHostAllocDefault) != cudaSuccess) {
        cudaGetLastError();
        pl_error_set(PL_ERR_NOMEM, "cudaHostAlloc of %zu pinned bytes failed", n);
        return NULL;
    }
    return p;
}

static void cu_host_free(void *p) {
    if (p) cudaFreeHost(p);
}

/* ---- cuBLAS handles (one per device, created on first use) --------------------- */

static cublasHandle_t g_blas[PL_CUDA_MAX_DEVICES];
static pthread_mutex_t g_blas_mu = PTHREAD_MUTEX_INITIALIZER;

static const char *blas_str(cublasStatus_t s) {
    switch (s) {
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "cuBLAS error";
    }
}

static cublasHandle_t blas_handle(int dev) {
    if (dev < 0 || dev >= PL_CUDA_MAX_DEVICES) {
        pl_error_set(PL_ERR_DEVICE, "cuda backend: device index %d out of range", dev);
        return NULL;
    }
    pthread_mutex_lock(&g_blas_mu);
    if (!g_blas[dev]) {
        cublasHandle_t h;
        cublasStatus_t s = cublasCreate(&h);
        if (s != CUBLAS_STATUS_SUCCESS)
            pl_error_set(PL_ERR_DEVICE, "cublasCreate on cuda:%d failed: %s", dev, blas_str(s));
        else {
            /* f32 GEMMs stay true f32 (no TF32): results match the CPU backend */
            cublasSetMathMode(h, CUBLAS_DEFAULT_MATH);
            /* the calling thread's stream (cuda_common.cuh), resolved at each call */
            cublasSetStream(h, cudaStreamPerThread);
            /* a workspace of ours, set after the stream (cublasSetStream resets
             * it): cuBLAS then never allocates inside a captured graph
             * (PyTorch's CUBLAS_WORKSPACE_CONFIG rule); 32 MiB as cuBLAS
             * recommends for Hopper */
            void *ws = NULL;
            if (cudaMalloc(&ws, (size_t)32 << 20) == cudaSuccess)
                cublasSetWorkspace(h, ws, (size_t)32 << 20);
            else
                cudaGetLastError(); /* without it cuBLAS uses its own pool (eager is fine) */
            g_blas[dev] = h;
        }
    }
    cublasHandle_t h = g_blas[dev];
    pthread_mutex_unlock(&g_blas_mu);
    return h;
}

cublasHandle_t pl_cu_blas_handle(int dev) { return blas_handle(dev); }
const char *pl_cu_blas_status(cublasStatus_t s) { return blas_str(s); }

/* ---- strided copy / conversion ------------------------------------------------------ */

static __device__ __forceinline__ bool is_int_dt(int dt) {
    return dt == PL_I32 || dt == PL_I64 || dt == PL_U8;
}

static __device__ __forceinline__ double ld_any(const void *p, int dt, int64_t i) {
    switch (dt) {
    case PL_F32: return ((const float *)p)[i];
    case PL_F64: return ((const double *)p)[i];
    case PL_BF16: return pl_d_bf16_to_f32(((const uint16_t *)p)[i]);
    case PL_F16: return pl_d_f16_to_f32(((const uint16_t *)p)[i]);
    case PL_I32: return ((const int32_t *)p)[i];
    case PL_I64: return (double)((const int64_t *)p)[i];
    case PL_U8: return ((const uint8_t *)p)[i];
    default: return 0.0;
    }
}

static __device__ __forceinline__ void st_any(void *p, int dt, int64_t i, double v) {
    switch (dt) {
    case PL_F32: ((float *)p)[i] = (float)v; break;
    case PL_F64: ((double *)p)[i] = v; break;
    case PL_BF16: ((uint16_t *)p)[i] = pl_d_f32_to_bf16((float)v); break;
    case PL_F16: ((uint16_t *)p)[i] = pl_d_f32_to_f16((float)v); break;
    case PL_I32: ((int32_t *)p)[i] = (int32_t)v; break;
    case PL_I64: ((int64_t *)p)[i] = (int64_t)v; break;
    case PL_U8: ((uint8_t *)p)[i] = (uint8_t)v; break;
    default: break;
    }
}

static __device__ __forceinline__ int64_t ld_int(const void *p, int dt, int64_t i) {
    switch (dt) {
    case PL_I32: return ((const int32_t *)p)[i];
    case PL_I64: return ((const int64_t *)p)[i];
    default: return ((const uint8_t *)p)[i];
    }
}

static __device__ __forceinline__ void st_int(void *p, int dt, int64_t i, int64_t v) {
    switch (dt) {
    case PL_I32: ((int32_t *)p)[i] = (int32_t)v; break;
    case PL_I64: ((int64_t *)p)[i] = v; break;
    default: ((uint8_t *)p)[i] = (uint8_t)v; break;
    }
}

/* element i (row-major over g.shape) -> (src offset, dst offset) */
static __device__ __forceinline__ void geom_offsets(const pl_cu_geom &g, int64_t i, bool dcontig,
                                                    int64_t *so, int64_t *dof) {
    int64_t s = 0, d = 0, r = i;
    for (int k = g.nd - 1; k >= 0; k--) {
        int64_t c = r % g.shape[k];
        r /= g.shape[k];
        s += c * g.sstride[k];
        d += c * g.dstride[k];
    }
    *so = s;
    *dof = dcontig ? i : d;
}

template <typename T>
__global__ void k_strided_same(T *dst, const T *src, pl_cu_geom g, int64_t n, bool dcontig) {
    GRID_LOOP(i, n) {
        int64_t so, dof;
        geom_offsets(g, i, dcontig, &so, &dof);
        dst[dof] = src[so];
    }
}

__global__ void k_strided_conv(void *dst, int ddt, const void *src, int sdt, pl_cu_geom g,
                               int64_t n, bool dcontig) {
    bool ints = is_int_dt(ddt) && is_int_dt(sdt);
    GRID_LOOP(i, n) {
        int64_t so, dof;
        geom_offsets(g, i, dcontig, &so, &dof);
        if (ints)
            st_int(dst, ddt, dof, ld_int(src, sdt, so));
        else if (sdt == PL_F64 && (ddt == PL_BF16 || ddt == PL_F16))
            st_any(dst, ddt, dof, (double)(float)ld_any(src, sdt, so)); /* CPU rounds via f32 too */
        else
            st_any(dst, ddt, dof, ld_any(src, sdt, so));
    }
}

pl_status pl_cu_strided_copy(void *dst, int ddt, const void *src, int sdt, const pl_cu_geom *g,
                             int64_t n, bool dst_contig) {
    if (n <= 0) return PL_OK;
    pl_cu_geom gg = *g;
    if (gg.nd == 0) {
        gg.nd = 1;
        gg.shape[0] = 1;
        gg.sstride[0] = gg.dstride[0] = 1;
    }
    unsigned nb = pl_cu_blocks(n);
    if (ddt == sdt) {
        switch (pl_dtype_size((pl_dtype)sdt)) {
        case 1: k_strided_same<uint8_t><<<nb, PL_CUDA_THREADS>>>((uint8_t *)dst, (const uint8_t *)src, gg, n, dst_contig); break;
        case 2: k_strided_same<uint16_t><<<nb, PL_CUDA_THREADS>>>((uint16_t *)dst, (const uint16_t *)src, gg, n, dst_contig); break;
        case 4: k_strided_same<uint32_t><<<nb, PL_CUDA_THREADS>>>((uint32_t *)dst, (const uint32_t *)src, gg, n, dst_contig); break;
        case 8: k_strided_same<uint64_t><<<nb, PL_CUDA_THREADS>>>((uint64_t *)dst, (const uint64_t *)src, gg, n, dst_contig); break;
        default:
            return pl_error_set(PL_ERR_DTYPE, "cuda copy: dtype %s not supported",
                                pl_dtype_name((pl_dtype)sdt));
        }
    } else {
        k_strided_conv<<<nb, PL_CUDA_THREADS>>>(dst, ddt, src, sdt, gg, n, dst_contig);
    }
    CUDA_LAUNCHED("copy");
    return PL_OK;
}

static void geom_contig(pl_cu_geom *g, int nd, const int64_t *shape) {
    g->nd = nd;
    int64_t s = 1;
    for (int k = nd - 1; k >= 0; k--) {
        g->shape[k] = shape[k];
        g->sstride[k] = g->dstride[k] = s;
        s *= shape[k];
    }
}

const float *pl_cu_as_f32(const pl_tensor *t, pl_cu_scratch *s, pl_status *st) {
    if (t->dtype == PL_F32) return cf(t);
    int64_t n = pl_tensor_numel(t);
    float *p = (float *)pl_cu_scratch_get(s, t->device, (size_t)n * sizeof(float));
    if (!p) {
        *st = PL_ERR_NOMEM;
        return NULL;
    }
    pl_cu_geom g;
    geom_contig(&g, t->ndim, t->shape);
    *st = pl_cu_strided_copy(p, PL_F32, pl_tensor_data(t), t->dtype, &g, n, true);
    return *st ? NULL : p;
}

static bool copyable(pl_dtype dt) { return dt != PL_NF4 && pl_dtype_size(dt) > 0; }

/* PL_OP_COPY: out[0] (contiguous) <- in[0] (any strides, any non-nf4 dtype) */
static pl_status k_copy_fwd(const pl_kernel_args *a) {
    const pl_tensor *x = a->in[0];
    pl_tensor *o = a->out[0];
    if (!copyable(x->dtype) || !copyable(o->dtype))
        return pl_error_set(PL_ERR_DTYPE, "cuda copy: cannot convert %s -> %s",
                            pl_dtype_name(x->dtype), pl_dtype_name(o->dtype));
    if (pl_cu_set_device(x)) return pl_error_status();
    int64_t n = pl_tensor_numel(x);
    if (n == 0) return PL_OK;
    if (x->dtype == o->dtype && pl_tensor_is_contiguous(x)) {
        CUDA_TRY(cudaMemcpy(pl_tensor_data(o), pl_tensor_data(x), pl_tensor_nbytes(x),
                            cudaMemcpyDeviceToDevice));
        return PL_OK;
    }
    pl_cu_geom g;
    geom_contig(&g, x->ndim, x->shape);
    for (int k = 0; k < x->ndim; k++)
        g.sstride[k] = x->stride[k];
    return pl_cu_strided_copy(pl_tensor_data(o), o->dtype, pl_tensor_data(x), x->dtype, &g, n, true);
}

/* The gradient of copy / reshape / cast is the incoming f32 gradient. */
static pl_status k_grad_identity_bwd(const pl_kernel_args *a) {
    if (!a->out[0]) return PL_OK;
    if (pl_cu_set_device(a->in[0])) return pl_error_status();
    CUDA_TRY(cudaMemcpy(pl_tensor_data(a->out[0]), pl_tensor_data(a->in[0]),
                        (size_t)pl_tensor_numel(a->out[0]) * sizeof(float),
                        cudaMemcpyDeviceToDevice));
    return PL_OK;
}

/* PL_OP_RESHAPE forward (when run as a copy): same bytes */
static pl_status k_bytes_fwd(const pl_kernel_args *a) {
    if (pl_cu_set_device(a->in[0])) return pl_error_status();
    size_t n = pl_tensor_nbytes(a->in[0]);
    if (n) CUDA_TRY(cudaMemcpy(pl_tensor_data(a->out[0]), pl_tensor_data(a->in[0]), n,
                               cudaMemcpyDeviceToDevice));
    return PL_OK;
}

/* PL_OP_CAST: contiguous conversion between f32 / bf16 / f16 / f64 */
static pl_status k_cast_fwd(const pl_kernel_args *a) {
    const pl_tensor *x = a->in[0];
    pl_tensor *o = a->out[0];
    if (!pl_dtype_is_float(x->dtype) || !pl_dtype_is_float(o->dtype))
        return pl_error_set(PL_ERR_DTYPE, "cuda cast: %s -> %s is not a float conversion",
                            pl_dtype_name(x->dtype), pl_dtype_name(o->dtype));
    if (pl_cu_set_device(x)) return pl_error_status();
    pl_cu_geom g;
    geom_contig(&g, x->ndim, x->shape);
    return pl_cu_strided_copy(pl_tensor_data(o), o->dtype, pl_tensor_data(x), x->dtype, &g,
                              pl_tensor_numel(x), true);
}

/* ---- permute / slice / concat (strided copies) ----------------------------------------- */

/* dst (contiguous, shape = sshape permuted by perm) <- src contiguous [sshape] */
static pl_status permute_copy(void *dst, const void *src, int dt, int nd, const int64_t *sshape,
                              const int64_t *perm) {
    int64_t ss[PL_MAX_DIMS], s = 1, dshape[PL_MAX_DIMS];
    for (int i = nd - 1; i >= 0; i--) {
        ss[i] = s;
        s *= sshape[i];
    }
    pl_cu_geom g;
    for (int i = 0; i < nd; i++)
        dshape[i] = sshape[perm[i]];
    geom_contig(&g, nd, dshape);
    for (int i = 0; i < nd; i++)
        g.sstride[i] = ss[perm[i]];
    return pl_cu_strided_copy(dst, dt, src, dt, &g, s, true);
}

static pl_status k_permute_fwd(const pl_kernel_args *a) {
    const pl_tensor *x = a->in[0];
    if (pl_cu_set_device(x)) return pl_error_status();
    return permute_copy(pl_tensor_data(a->out[0]), pl_tensor_data(x), x->dtype, x->ndim, x->shape,
                        a->p.perm);
}

static pl_status k_permute_bwd(const pl_kernel_args *a) {
    const pl_tensor *g = a->in[0];
    if (!a->out[0]) return PL_OK;
    if (pl_cu_set_device(g)) return pl_error_status();
    int64_t inv[PL_MAX_DIMS];
    for (int i = 0; i < g->ndim; i++)
        inv[a->p.perm[i]] = i;
    return permute_copy(pl_tensor_data(a->out[0]), pl_tensor_data(g), PL_F32, g->ndim, g->shape,
                        inv);
}

#define split3 pl_dim_split /* t as [outer, t.shape[dim], inner] (backend_util.h) */

/* Copy a [O, L, I] block between [O, Ks, I] (at ks0) and [O, Kd, I] (at kd0). */
static pl_status block_copy(void *dst, int64_t Kd, int64_t kd0, const void *src, int64_t Ks,
                            int64_t ks0, int64_t O, int64_t L, int64_t I, int dt) {
    size_t es = pl_dtype_size((pl_dtype)dt);
    if (O * L * I == 0) return PL_OK;
    CUDA_TRY(cudaMemcpy2D((char *)dst + (size_t)(kd0 * I) * es, (size_t)(Kd * I) * es,
                          (const char *)src + (size_t)(ks0 * I) * es, (size_t)(Ks * I) * es,
                          (size_t)(L * I) * es, (size_t)O, cudaMemcpyDeviceToDevice));
    return PL_OK;
}

static pl_status k_slice_fwd(const pl_kernel_args *a) {
    const pl_tensor *x = a->in[0];
    if (pl_cu_set_device(x)) return pl_error_status();
    int64_t O, K, I, L = a->p.end - a->p.start;
    split3(x, (int)a->p.dim, &O, &K, &I);
    return block_copy(pl_tensor_data(a->out[0]), L, 0, pl_tensor_data(x), K, a->p.start, O, L, I,
                      x->dtype);
}

static pl_status k_slice_bwd(const pl_kernel_args *a) {
    if (!a->out[0]) return PL_OK;
    const pl_tensor *x = a->in[1];
    if (pl_cu_set_device(x)) return pl_error_status();
    int64_t O, K, I, L = a->p.end - a->p.start;
    split3(x, (int)a->p.dim, &O, &K, &I);
    CUDA_TRY(cudaMemset(pl_tensor_data(a->out[0]), 0, (size_t)pl_tensor_numel(x) * sizeof(float)));
    return block_copy(pl_tensor_data(a->out[0]), K, a->p.start, pl_tensor_data(a->in[0]), L, 0, O,
                      L, I, PL_F32);
}

static pl_status k_concat_fwd(const pl_kernel_args *a) {
    const pl_tensor *out = a->out[0];
    int d = (int)a->p.dim;
    if (pl_cu_set_device(out)) return pl_error_status();
    int64_t O, Kt, I, koff = 0;
    split3(out, d, &O, &Kt, &I);
    for (int j = 0; j < a->n_in; j++) {
        int64_t Kj = a->in[j]->shape[d];
        if (block_copy(pl_tensor_data(out), Kt, koff, pl_tensor_data(a->in[j]), Kj, 0, O, Kj, I,
                       out->dtype))
            return pl_error_status();
        koff += Kj;
    }
    return PL_OK;
}

static pl_status k_concat_bwd(const pl_kernel_args *a) {
    int d = (int)a->p.dim, n = (int)a->p.start;
    const pl_tensor *g = a->in[0];
    if (pl_cu_set_device(g)) return pl_error_status();
    int64_t O, Kt, I, koff = 0;
    split3(g, d, &O, &Kt, &I);
    for (int j = 0; j < n; j++) {
        int64_t Kj = a->in[1 + j]->shape[d];
        if (a->out[j] && block_copy(pl_tensor_data(a->out[j]), Kj, 0, pl_tensor_data(g), Kt, koff,
                                    O, Kj, I, PL_F32))
            return pl_error_status();
        koff += Kj;
    }
    return PL_OK;
}

/* ---- device stats through NVML (libnvidia-ml.so.1, opened at run time) ---------------------- */

/* The few NVML types and entry points used, as nvml.h declares them (the
 * toolkit here ships no nvml.h, and the library comes with the driver):
 * versioned symbols whose layout NVML keeps. */
typedef int nvml_ret;              /* nvmlReturn_t: 0 = NVML_SUCCESS */
struct nvml_dev_s;
typedef struct nvml_dev_s *nvml_dev; /* nvmlDevice_t */
typedef struct {
    unsigned long long total, free, used;
} nvml_memory; /* nvmlMemory_t */
typedef struct {
    unsigned int gpu, memory;
} nvml_utilization; /* nvmlUtilization_t: percent */
typedef union {
    double d;
    unsigned int ui;
    unsigned long ul;
    unsigned long long ull;
    long long sll;
} nvml_value; /* nvmlValue_t */
typedef struct {
    unsigned long long ts;
    nvml_value v;
} nvml_sample; /* nvmlSample_t */
enum { NVML_GPU_UTILIZATION_SAMPLES_ = 1, NVML_ERROR_NOT_FOUND_ = 6 };
enum { NVML_VT_DOUBLE = 0, NVML_VT_UINT = 1, NVML_VT_ULONG = 2, NVML_VT_ULL = 3, NVML_VT_SLL = 4 };

static struct {
    pthread_once_t once;
    bool ok;
    char why[256];
    nvml_ret (*init)(void);
    nvml_ret (*by_pci)(const char *, nvml_dev *);
    nvml_ret (*mem)(nvml_dev, nvml_memory *);
    nvml_ret (*util)(nvml_dev, nvml_utilization *);
    nvml_ret (*samples)(nvml_dev, int, unsigned long long, int *, unsigned int *, nvml_sample *);
    const char *(*err)(nvml_ret);
    nvml_dev dev[PL_CUDA_MAX_DEVICES];
    bool have[PL_CUDA_MAX_DEVICES];
    pthread_mutex_t mu;
} g_nvml = {PTHREAD_ONCE_INIT, false, "", NULL, NULL, NULL, NULL, NULL, NULL, {}, {},
            PTHREAD_MUTEX_INITIALIZER};

static void nvml_open(void) {
    void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(g_nvml.why, sizeof g_nvml.why, "libnvidia-ml.so.1 not loaded: %s", dlerror());
        return;
    }
    g_nvml.init = (nvml_ret(*)(void))dlsym(h, "nvmlInit_v2");
    g_nvml.by_pci = (nvml_ret(*)(const char *, nvml_dev *))dlsym(h, "nvmlDeviceGetHandleByPciBusId_v2");
    g_nvml.mem = (nvml_ret(*)(nvml_dev, nvml_memory *))dlsym(h, "nvmlDeviceGetMemoryInfo");
    g_nvml.util = (nvml_ret(*)(nvml_dev, nvml_utilization *))dlsym(h, "nvmlDeviceGetUtilizationRates");
    g_nvml.samples = (nvml_ret(*)(nvml_dev, int, unsigned long long, int *, unsigned int *,
                                  nvml_sample *))dlsym(h, "nvmlDeviceGetSamples");
    g_nvml.err = (const char *(*)(nvml_ret))dlsym(h, "nvmlErrorString");
    if (!g_nvml.init || !g_nvml.by_pci || !g_nvml.mem || !g_nvml.util) {
        snprintf(g_nvml.why, sizeof g_nvml.why, "libnvidia-ml.so.1 lacks nvmlInit_v2 / "
                 "nvmlDeviceGetHandleByPciBusId_v2 / nvmlDeviceGetMemoryInfo / "
                 "nvmlDeviceGetUtilizationRates");
        return; /* the library stays loaded: harmless */
    }
    nvml_ret r = g_nvml.init();
    if (r != 0) {
        snprintf(g_nvml.why, sizeof g_nvml.why, "nvmlInit_v2: %s",
                 g_nvml.err ? g_nvml.err(r) : "failed");
        return;
    }
    g_nvml.ok = true;
}

/* NVML's handle of CUDA device `d` (matched by PCI bus id: NVML and CUDA may
 * number devices differently), NULL with the reason in `why`. */
static nvml_dev nvml_device(int d, char *why, size_t wn) {
    pthread_mutex_lock(&g_nvml.mu);
    nvml_dev h = g_nvml.have[d] ? g_nvml.dev[d] : NULL;
    if (!g_nvml.have[d]) {
        char bus[32];
        cudaError_t e = cudaDeviceGetPCIBusId(bus, (int)sizeof bus, d);
        nvml_ret r = e == cudaSuccess ? g_nvml.by_pci(bus, &h) : -1;
        if (e != cudaSuccess) {
            cudaGetLastError();
            snprintf(why, wn, "cudaDeviceGetPCIBusId(%d): %s", d, cudaGetErrorString(e));
            h = NULL;
        } else if (r != 0) {
            snprintf(why, wn, "nvmlDeviceGetHandleByPciBusId_v2(%s): %s", bus,
                     g_nvml.err ? g_nvml.err(r) : "failed");
            h = NULL;
        } else {
            g_nvml.dev[d] = h;
            g_nvml.have[d] = true;
        }
    }
    pthread_mutex_unlock(&g_nvml.mu);
    return h;
}

static double nvml_sample_value(int type, nvml_value v) {
    switch (type) {
    case NVML_VT_DOUBLE: return v.d;
    case NVML_VT_UINT: return v.ui;
    case NVML_VT_ULONG: return (double)v.ul;
    case NVML_VT_ULL: return (double)v.ull;
    case NVML_VT_SLL: return (double)v.sll;
    default: return NAN;
    }
}

static pl_status cu_device_stats(int device, uint64_t *cursor, pl_device_stats *out) {
    pthread_once(&g_nvml.once, nvml_open);
    if (!g_nvml.ok) return pl_error_set(PL_ERR_UNSUPPORTED, "cuda device stats: %s", g_nvml.why);
    if (device < 0 || device >= PL_CUDA_MAX_DEVICES)
        return pl_error_set(PL_ERR_UNSUPPORTED, "cuda device stats: device %d", device);
    char why[256] = "";
    nvml_dev h = nvml_device(device, why, sizeof why);
    if (!h) return pl_error_set(PL_ERR_UNSUPPORTED, "cuda device stats: %s", why);
    nvml_memory m;
    if (g_nvml.mem(h, &m) == 0) {
        out->memory_used_bytes = (double)m.used;
        out->memory_total_bytes = (double)m.total;
    }
    /* the samples after the cursor (a first call: the latest reading, then the
     * cursor at the newest sample); the driver keeps a few seconds of them */
    out->n_samples = 0;
    if (g_nvml.samples) {
        int type = -1;
        unsigned int n = 0;
        unsigned long long since = *cursor;
        nvml_ret r = g_nvml.samples(h, NVML_GPU_UTILIZATION_SAMPLES_, since, &type, &n, NULL);
        nvml_sample *buf = r == 0 && n ? (nvml_sample *)calloc(n, sizeof *buf) : NULL;
        if (buf && g_nvml.samples(h, NVML_GPU_UTILIZATION_SAMPLES_, since, &type, &n, buf) == 0) {
            double sum = 0;
            int k = 0;
            unsigned long long last = since;
            for (unsigned int i = 0; i < n; i++) {
                if (buf[i].ts > last) last = buf[i].ts;
                double v = nvml_sample_value(type, buf[i].v);
                if (since == 0 || buf[i].ts <= since || !isfinite(v)) continue;
                sum += v;
                k++;
            }
            *cursor = last;
            if (k > 0) {
                out->utilization = sum / k / 100.0;
                out->n_samples = k;
            }
        }
        free(buf);
    }
    if (out->n_samples == 0) {
        nvml_utilization u;
        if (g_nvml.util(h, &u) == 0) out->utilization = u.gpu / 100.0;
    }
    return PL_OK;
}

/* ---- matmul (cuBLAS, row-major via C^T = B^T A^T) ------------------------------------------ */

/* [pipeline] allow_tf32 (set_option): f32 x f32 GEMMs may use TF32 tensor
 * cores. Off by default (torch.backends.cuda.matmul.allow_tf32 = False). */
static bool g_allow_tf32;

static pl_status cu_set_option(const char *key, const char *value) {
    if (!strcmp(key, "allow_tf32")) {
        g_allow_tf32 = !strcmp(value, "true") || !strcmp(value, "1");
        return PL_OK;
    }
    /* the adamw / sgd kernels read the step's found_inf flag on the device
     * (cuda_optim.cu), so the trainer may keep the loss there */
    if (!strcmp(key, "optimizer_found_inf")) return PL_OK;
    return pl_error_set(PL_ERR_UNSUPPORTED, "cuda backend: no setting '%s'", key);
}

static cudaDataType_t cu_type(pl_dtype dt) {
    return dt == PL_BF16 ? CUDA_R_16BF : dt == PL_F16 ? CUDA_R_16F : CUDA_R_32F;
}

/* Row-major C[M,N] (+batch) = alpha op(A) op(B) + beta C, where A is stored
 * [M,K] (ta: [K,M]) and B [K,N] (tb: [N,K]), f32 accumulation. cuBLAS is
 * column-major: a row-major X is X^T to it, so we ask for
 * C^T[N,M] = op(B)^T op(A)^T, i.e. gemm(opB, opA, N, M, K, B, A). */
static pl_status rm_gemm(cublasHandle_t h, bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                         const void *A, cudaDataType_t at, int64_t sA, const void *B,
                         cudaDataType_t bt, int64_t sB, float beta, void *C, cudaDataType_t ct,
                         int64_t sC, int64_t batch) {
    if (M > INT_MAX || N > INT_MAX || K > INT_MAX || batch > INT_MAX)
        return pl_error_set(PL_ERR_UNSUPPORTED, "cuda matmul: dims %lld x %lld x %lld (batch %lld) "
                            "exceed cuBLAS's int range", (long long)M, (long long)N, (long long)K,
                            (long long)batch);
    float alpha = 1.0f;
    int lda = (int)(ta ? M : K), ldb = (int)(tb ? K : N);
    cublasStatus_t s = cublasGemmStridedBatchedEx(
        h, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, (int)N, (int)M, (int)K,
        &alpha, B, bt, ldb, sB, A, at, lda, sA, &beta, C, ct, (int)N, sC, (int)batch,
        g_allow_tf32 && at == CUDA_R_32F && bt == CUDA_R_32F ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                             : CUBLAS_COMPUTE_32F,
        CUBLAS_GEMM_DEFAULT);
    if (s != CUBLAS_STATUS_SUCCESS)
        return pl_error_set(PL_ERR_DEVICE, "cuda matmul: cublasGemmStridedBatchedEx failed: %s",
                            blas_str(s));
    return PL_OK;
}


/* A batch count is "uniform" when one stride describes it: every matrix (n ==
 * nbatch) or one shared matrix (n == 1, stride 0). */
static bool uniform(int64_t n, int64_t nbatch) { return n == nbatch || n == 1; }

static pl_status k_matmul_fwd(const pl_kernel_args *a) {
    const pl_tensor *A = a->in[0], *B = a->in[1];
    pl_tensor *C = a->out[0];
    if (A->dtype != B->dtype || A->dtype != C->dtype ||
        !(A->dtype == PL_F32 || A->dtype == PL_BF16 || A->dtype == PL_F16))
        return pl_error_set(PL_ERR_DTYPE, "cuda matmul: dtypes %s @ %s -> %s not supported",
                            pl_dtype_name(A->dtype), pl_dtype_name(B->dtype),
                            pl_dtype_name(C->dtype));
    if (pl_cu_set_device(A)) return pl_error_status();
    cublasHandle_t h = blas_handle(A->device.index);
    if (!h) return pl_error_status();
    pl_mm_geo g;
    pl_mm_geo_init(&g, A, B, C, a->p.flags);
    int64_t M = g.M, N = g.N, K = g.K;
    if (M == 0 || N == 0 || g.nbatch == 0) return PL_OK;
    if (K == 0) {
        CUDA_TRY(cudaMemset(pl_tensor_data(C), 0, pl_tensor_nbytes(C)));
        return PL_OK;
    }
    cudaDataType_t t = cu_type(A->dtype);
    size_t es = pl_dtype_size(A->dtype);
    const char *pa = (const char *)pl_tensor_data(A), *pb = (const char *)pl_tensor_data(B);
    char *pc = (char *)pl_tensor_data(C);
    if (!g.ta && g.nb == 1 && g.na == g.nbatch) /* shared B: one GEMM of nbatch*M rows */
        return rm_gemm(h, false, g.tb, g.nbatch * M, N, K, pa, t, 0, pb, t, 0, 0.0f, pc, t, 0, 1);
    if (uniform(g.na, g.nbatch) && uniform(g.nb, g.nbatch))
        return rm_gemm(h, g.ta, g.tb, M, N, K, pa, t, g.na == 1 ? 0 : M * K, pb, t,
                       g.nb == 1 ? 0 : K * N, 0.0f, pc, t, M * N, g.nbatch);
    for (int64_t bi = 0; bi < g.nbatch; bi++) { /* general batch broadcast */
        int64_t ia, ib;
        pl_mm_batch_off(&g, bi, &ia, &ib);
        if (rm_gemm(h, g.ta, g.tb, M, N, K, pa + (size_t)(ia * M * K) * es, t, 0,
                    pb + (size_t)(ib * K * N) * es, t, 0, 0.0f, pc + (size_t)(bi * M * N) * es, t,
                    0, 1))
            return pl_error_status();
    }
    return PL_OK;
}

const void *pl_cu_as_dtype(const pl_tensor *G, pl_dtype dt, pl_cu_scratch *s, pl_status *st) {
    int64_t n = pl_tensor_numel(G);
    void *p = pl_cu_scratch_get(s, G->device, (size_t)n * pl_dtype_size(dt));
    if (!p) {
        *st = PL_ERR_NOMEM;
        return NULL;
    }
    pl_cu_geom gg;
    geom_contig(&gg, G->ndim, G->shape);
    *st = pl_cu_strided_copy(p, dt, pl_tensor_data(G), G->dtype, &gg, n, true);
    return *st ? NULL : p;
}

/* in = {G [.., M, N] f32, A, B}; out = {dA (A's shape), dB (B's shape)} f32.
 * Half (bf16 / f16) operands stay half: G is rounded to their dtype and the
 * GEMMs read half and accumulate and write f32 (CUBLAS_COMPUTE_32F), as
 * PyTorch's autograd does for a bf16 matmul, whose grad_output is bf16 (its
 * mm backward runs in the operands' dtype). Widening the operands to f32
 * instead ran the 7B backward on the f32 (non-tensor-core) path, 7x the
 * forward's time (H200, 2026-11-27 profile). */
static pl_status k_matmul_bwd(const pl_kernel_args *a) {
    const pl_tensor *G = a->in[0];
    pl_tensor *dA = a->out[0], *dB = a->out[1];
    if (!dA && !dB) return PL_OK;
    if (pl_cu_set_device(G)) return pl_error_status();
    cublasHandle_t h = blas_handle(G->device.index);
    if (!h) return pl_error_status();
    pl_mm_geo g;
    pl_mm_geo_init(&g, a->in[1], a->in[2], G, a->p.flags);
    int64_t M = g.M, N = g.N, K = g.K;
    bool ta = g.ta, tb = g.tb;
    pl_status st = PL_OK;
    pl_cu_scratch sa = {0}, sb = {0}, sg = {0};
    pl_dtype odt = a->in[1]->dtype;
    bool half = (odt == PL_BF16 || odt == PL_F16) && a->in[2]->dtype == odt;
    const cudaDataType_t f = CUDA_R_32F, it = half ? cu_type(odt) : f;
    size_t es = half ? 2 : sizeof(float);
    const char *A = NULL, *B = NULL, *Gp = NULL;
    if (half) {
        A = dB ? (const char *)pl_tensor_data(a->in[1]) : NULL;
        B = dA ? (const char *)pl_tensor_data(a->in[2]) : NULL;
        Gp = (const char *)pl_cu_as_dtype(G, odt, &sg, &st);
    } else {
        A = dB ? (const char *)pl_cu_as_f32(a->in[1], &sa, &st) : NULL;
        B = !st && dA ? (const char *)pl_cu_as_f32(a->in[2], &sb, &st) : NULL;
        Gp = (const char *)pl_tensor_data(G);
    }
    float *pdA = dA ? fp(dA) : NULL, *pdB = dB ? fp(dB) : NULL;
    if (st) goto done;
    if (pdA && (g.na != g.nbatch || N == 0 || M * K == 0))
        if (cudaMemset(pdA, 0, (size_t)(g.na * M * K) * sizeof(float)) != cudaSuccess) {
            st = pl_error_set(PL_ERR_DEVICE, "cuda matmul backward: cudaMemset failed");
            goto done;
        }
    if (pdB && (g.nb != g.nbatch || M == 0 || K * N == 0))
        if (cudaMemset(pdB, 0, (size_t)(g.nb * K * N) * sizeof(float)) != cudaSuccess) {
            st = pl_error_set(PL_ERR_DEVICE, "cuda matmul backward: cudaMemset failed");
            goto done;
        }
    if (M == 0 || N == 0 || K == 0 || g.nbatch == 0) goto done;
    if (!ta && g.nb == 1 && g.na == g.nbatch) {
        /* shared B, A rows stacked: dA = G op(B)^T, dB = sum over all rows */
        int64_t Mt = g.nbatch * M;
        if (pdA && (st = rm_gemm(h, false, !tb, Mt, K, N, Gp, it, 0, B, it, 0, 0.0f, pdA, f, 0, 1)))
            goto done;
        if (pdB) {
            if (!tb) /* dB [K,N] = A^T G */
                st = rm_gemm(h, true, false, K, N, Mt, A, it, 0, Gp, it, 0, 0.0f, pdB, f, 0, 1);
            else /* dB [N,K] = G^T A */
                st = rm_gemm(h, true, false, N, K, Mt, Gp, it, 0, A, it, 0, 0.0f, pdB, f, 0, 1);
        }
        goto done;
    }
    /* dA: !ta -> dA[M,K] = G op(B)^T ; ta -> dA[K,M] = op(B) G^T
     * dB: !tb -> dB[K,N] = op(A)^T G ; tb -> dB[N,K] = G^T op(A) */
    if (pdA) {
        if (g.na == g.nbatch && uniform(g.nb, g.nbatch)) {
            int64_t sB = g.nb == 1 ? 0 : K * N;
            st = !ta ? rm_gemm(h, false, !tb, M, K, N, Gp, it, M * N, B, it, sB, 0.0f, pdA, f,
                               M * K, g.nbatch)
                     : rm_gemm(h, tb, true, K, M, N, B, it, sB, Gp, it, M * N, 0.0f, pdA, f,
                               M * K, g.nbatch);
        } else { /* broadcast A: accumulate batch by batch (dA zeroed above) */
            for (int64_t bi = 0; bi < g.nbatch && !st; bi++) {
                int64_t ia, ib;
                pl_mm_batch_off(&g, bi, &ia, &ib);
                const char *gb = Gp + (size_t)(bi * M * N) * es, *bb = B + (size_t)(ib * K * N) * es;
                float *d = pdA + ia * M * K;
                st = !ta ? rm_gemm(h, false, !tb, M, K, N, gb, it, 0, bb, it, 0, 1.0f, d, f, 0, 1)
                         : rm_gemm(h, tb, true, K, M, N, bb, it, 0, gb, it, 0, 1.0f, d, f, 0, 1);
            }
        }
        if (st) goto done;
    }
    if (pdB) {
        if (g.nb == g.nbatch && uniform(g.na, g.nbatch)) {
            int64_t sA = g.na == 1 ? 0 : M * K;
            st = !tb ? rm_gemm(h, !ta, false, K, N, M, A, it, sA, Gp, it, M * N, 0.0f, pdB, f,
                               K * N, g.nbatch)
                     : rm_gemm(h, true, ta, N, K, M, Gp, it, M * N, A, it, sA, 0.0f, pdB, f,
                               K * N, g.nbatch);
        } else {
            for (int64_t bi = 0; bi < g.nbatch && !st; bi++) {
                int64_t ia, ib;
                pl_mm_batch_off(&g, bi, &ia, &ib);
                const char *gb = Gp + (size_t)(bi * M * N) * es, *ab = A + (size_t)(ia * M * K) * es;
                float *d = pdB + ib * K * N;
                st = !tb ? rm_gemm(h, !ta, false, K, N, M, ab, it, 0, gb, it, 0, 1.0f, d, f, 0, 1)
                         : rm_gemm(h, true, ta, N, K, M, gb, it, 0, ab, it, 0, 1.0f, d, f, 0, 1);
            }
        }
    }
done:
    pl_cu_scratch_free(&sa);
    pl_cu_scratch_free(&sb);
    pl_cu_scratch_free(&sg);
    return st;
}

/* ---- the kernel lookup, the backend table and the plugin descriptor ------------------------ */

/* Filled once, before the descriptor (and so the table) is handed out. The
 * lookup answers NULL for ids outside this build's PL_OP_COUNT: a newer core
 * asking about an op appended later gets "unsupported", not a stray read. */
static pl_kernel_table g_cuda_kernels;

static pl_kernel_fn cu_kernel(pl_op op, bool backward) {
    return pl_kernel_table_get(&g_cuda_kernels, op, backward);
}

/* pl_backend.half_native: the kernels of cuda_kernels.cu that load and store
 * bf16 / f16 themselves (pl_d_ldf / pl_d_stf, f32 math, one rounding): the
 * binary ops, scale / add_scalar, swiglu and rms_norm, forward and backward.
 * Every other f32-only kernel gets f32 copies from the core (half_io.c). */
static bool cu_half_native(const pl_kernel_args *a, bool backward) {
    (void)backward;
    switch (a->op) {
    case PL_OP_ADD:
    case PL_OP_SUB:
    case PL_OP_MUL:
    case PL_OP_DIV:
    case PL_OP_SCALE:
    case PL_OP_ADD_SCALAR:
    case PL_OP_SWIGLU:
    case PL_OP_RMS_NORM: return true; /* pl_d_ldf / pl_d_stf read f64 as well */
    default: return false;
    }
}

/* ---- graph capture (pl_backend.capture_begin ...; graph.h) -------------------------
 * Capture on the calling thread's default stream (cudaStreamPerThread), mode
 * thread-local: unsafe calls from this thread invalidate it, a loader
 * thread's work goes on. The verbs below refuse host reads / writes and
 * synchronize up front with a message naming them (capture_violation);
 * anything else CUDA refuses (an op the driver cannot capture) fails with
 * CUDA's own error, and cudaStreamEndCapture then reports the invalidated
 * capture. */
typedef struct cu_graph {
    cudaGraph_t g;
    cudaGraphExec_t ex;
    int dev;
} cu_graph;

static pl_status cu_capture_begin(int device) {
    if (tl_cap_dev >= 0) return pl_error_set(PL_ERR_INVALID, "cuda: this thread is already capturing");
    if (device < 0 || device >= PL_CU_MAX_DEVICES)
        return pl_error_set(PL_ERR_DEVICE, "cuda: capture on device %d", device);
    CUDA_TRY(cudaSetDevice(device));
    pthread_mutex_lock(&g_copy_mu);
    cudaError_t e = cudaSuccess;
    if (!g_precap[device]) e = cudaEventCreateWithFlags(&g_precap[device], cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventRecord(g_precap[device], cudaStreamPerThread);
    if (e == cudaSuccess) e = cudaStreamBeginCapture(cudaStreamPerThread, cudaStreamCaptureModeThreadLocal);
    if (e == cudaSuccess) {
        g_capturing[device]++;
        tl_cap_dev = device;
        tl_cap_err = PL_OK;
        tl_cap_msg[0] = 0;
    }
    pthread_mutex_unlock(&g_copy_mu);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return pl_error_set(PL_ERR_DEVICE, "cuda: cudaStreamBeginCapture on cuda:%d failed: %s",
                            device, cudaGetErrorString(e));
    }
    return PL_OK;
}

static pl_status cu_capture_end(int device, void **graph) {
    *graph = NULL;
    if (tl_cap_dev < 0) return pl_error_set(PL_ERR_INVALID, "cuda: capture_end without capture_begin");
    (void)device;
    int dev = tl_cap_dev;
    cudaGraph_t g = NULL;
    cudaError_t e = cudaStreamEndCapture(cudaStreamPerThread, &g);
    pthread_mutex_lock(&g_copy_mu);
    g_capturing[dev]--;
    tl_cap_dev = -1;
    pthread_mutex_unlock(&g_copy_mu);
    if (e == cudaSuccess && tl_cap_err) { /* poisoned: the first violation */
        if (g) cudaGraphDestroy(g);
        pl_status s = pl_error_set(tl_cap_err, "%s", tl_cap_msg);
        tl_cap_err = PL_OK;
        return s;
    }
    if (e != cudaSuccess) {
        cudaGetLastError();
        if (g) cudaGraphDestroy(g);
        if (tl_cap_err) {
            pl_status s = pl_error_set(tl_cap_err, "%s", tl_cap_msg);
            tl_cap_err = PL_OK;
            return s;
        }
        return pl_error_set(PL_ERR_DEVICE, "cuda: cudaStreamEndCapture failed: %s (a call inside "
                            "the captured step that CUDA cannot capture invalidated it)",
                            cudaGetErrorString(e));
    }
    cu_graph *cg = (cu_graph *)calloc(1, sizeof *cg);
    if (!cg) {
        cudaGraphDestroy(g);
        return pl_error_set(PL_ERR_NOMEM, "cuda: capture_end");
    }
    cg->g = g;
    cg->dev = dev;
    e = cudaGraphInstantiateWithFlags(&cg->ex, g, 0);
    if (e != cudaSuccess) {
        cudaGetLastError();
        cudaGraphDestroy(g);
        free(cg);
        return pl_error_set(PL_ERR_DEVICE, "cuda: cudaGraphInstantiate failed: %s",
                            cudaGetErrorString(e));
    }
    *graph = cg;
    return PL_OK;
}

static pl_status cu_graph_replay(void *graph) {
    cu_graph *cg = (cu_graph *)graph;
    if (!cg) return pl_error_set(PL_ERR_INVALID, "cuda: replay of no graph");
    if (tl_cap_dev >= 0) return capture_violation("a graph replay", 0);
    CUDA_TRY(cudaSetDevice(cg->dev));
    CUDA_TRY(cudaGraphLaunch(cg->ex, cudaStreamPerThread));
    return PL_OK;
}

static void cu_graph_release(void *graph) {
    cu_graph *cg = (cu_graph *)graph;
    if (!cg) return;
    cudaSetDevice(cg->dev);
    cudaGraphExecDestroy(cg->ex);
    cudaGraphDestroy(cg->g);
    free(cg);
}

static pl_status cu_fill_random(pl_tensor *t, int normal, double a, double b, uint64_t seed,
                                uint64_t stream) {
    if (tl_cap_dev >= 0) return capture_violation("fill_random", pl_tensor_nbytes(t));
    return pl_cu_fill_random(t, normal, a, b, seed, stream);
}

static const pl_backend g_cuda = {
    PL_BACKEND_STRUCT_SIZE,
    "cuda",
    PL_DEVICE_CUDA,
    cu_device_count,
    cu_raw_alloc,
    cu_raw_free,
    cu_memcpy,
    cu_memset,
    cu_sync,
    cu_mem_info,
    cu_host_alloc,
    cu_host_free,
    cu_kernel,
    cu_memcpy_h2d_background,
    cu_set_option,
    NULL, /* counters: the cuda backend counts nothing yet */
    cu_device_stats,
    cu_fill_random,
    cu_capture_begin,
    cu_capture_end,
    cu_graph_replay,
    cu_graph_release,
    cu_half_native,
};

static const pl_backend *cuda_table(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, [] {
        pl_kernel_table *t = &g_cuda_kernels;
        pl_kernel_table_set(t, PL_OP_COPY, k_copy_fwd, k_grad_identity_bwd);
        pl_kernel_table_set(t, PL_OP_RESHAPE, k_bytes_fwd, k_grad_identity_bwd);
        pl_kernel_table_set(t, PL_OP_CAST, k_cast_fwd, k_grad_identity_bwd);
        pl_kernel_table_set(t, PL_OP_PERMUTE, k_permute_fwd, k_permute_bwd);
        pl_kernel_table_set(t, PL_OP_SLICE, k_slice_fwd, k_slice_bwd);
        pl_kernel_table_set(t, PL_OP_CONCAT, k_concat_fwd, k_concat_bwd);
        pl_kernel_table_set(t, PL_OP_MATMUL, k_matmul_fwd, k_matmul_bwd);
        pl_cuda_register_kernels(t);
        pl_cuda_register_nf4(t);
        pl_cuda_register_optim(t);
#ifdef PL_CUDA_HAVE_CUDNN
        pl_cuda_register_lstm(t);
#endif
    });
    return &g_cuda;
}

static const pl_option_spec g_cuda_opts[] = {PL_OPTIONS_END};

/* PL_PLUGIN_DEFINE expanded by hand: the entry point needs C linkage and the
 * kernel table must be filled before the core asks the lookup. */
static pl_plugin_desc g_cuda_desc = {PL_ABI_MAJOR, PL_ABI_MINOR,
                                     "cuda",       PL_KIND_BACKEND,
                                     "0.2.0",      "CUDA backend: cuBLAS matmul and device kernels",
                                     g_cuda_opts,  NULL};

extern "C" __attribute__((visibility("default"))) const pl_plugin_desc *pl_plugin_entry(void) {
    g_cuda_desc.vtable = cuda_table();
    return &g_cuda_desc;
}
