/* cuda_memory.cu - the CUDA backend's devices, memory and transfers (pl_backend's
 * device_count ... host_free), and graph capture (capture_begin ... graph_release), which
 * shares its state: while a thread captures, the verbs here refuse what a graph cannot hold
 * (host reads and writes, synchronization). */
#include <cublas_v2.h>
#include <dlfcn.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "cuda_common.cuh"

/* ---- device, memory, transfers ------------------------------------------------ */

int cu_device_count(void) {
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

void *cu_raw_alloc(int device, size_t n) {
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

void cu_raw_free(int device, void *p) {
    if (!p) return;
    cudaSetDevice(device);
    cudaFree(p);
}

pl_status cu_memcpy(void *dst, pl_device dd, const void *src, pl_device sd, size_t n) {
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
    if (tl_cap_dev >= 0 && kind == cudaMemcpyDeviceToDevice) { /* in order with a held-back call */
        pl_status s = pl_cu_fuse_write(dst, src, n);
        if (s) return s;
    }
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

pl_status cu_memcpy_h2d_background(void *dst, pl_device dd, const void *src, size_t n) {
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

pl_status cu_memset(void *dst, pl_device dev, int v, size_t n) {
    if (n == 0) return PL_OK;
    if (tl_cap_dev >= 0) {
        pl_status s = pl_cu_fuse_write(dst, NULL, n);
        if (s) return s;
    }
    CUDA_TRY(cudaSetDevice(dev.index));
    CUDA_TRY(cudaMemset(dst, v, n));
    return PL_OK;
}

pl_status cu_sync(int device) {
    if (tl_cap_dev >= 0) return capture_violation("synchronize", 0);
    CUDA_TRY(cudaSetDevice(device));
    CUDA_TRY(cudaDeviceSynchronize());
    return pl_cu_fault_check();
}

pl_status cu_mem_info(int device, size_t *free_b, size_t *total_b) {
    CUDA_TRY(cudaSetDevice(device));
    CUDA_TRY(cudaMemGetInfo(free_b, total_b));
    return PL_OK;
}

void *cu_host_alloc(size_t n) {
    void *p = NULL;
    if (cudaHostAlloc(&p, n ? n : 1, cudaHostAllocDefault) != cudaSuccess) {
        cudaGetLastError();
        pl_error_set(PL_ERR_NOMEM, "cudaHostAlloc of %zu pinned bytes failed", n);
        return NULL;
    }
    return p;
}

void cu_host_free(void *p) {
    if (p) cudaFreeHost(p);
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

pl_status cu_capture_begin(int device) {
    if (tl_cap_dev >= 0) return pl_error_set(PL_ERR_INVALID, "cuda: this thread is already capturing");
    if (device < 0 || device >= PL_CU_MAX_DEVICES)
        return pl_error_set(PL_ERR_DEVICE, "cuda: capture on device %d", device);
    CUDA_TRY(cudaSetDevice(device));
    /* the device's cuBLAS handle and its workspace (cublasCreate, cudaMalloc) cannot be
     * made inside the capture: made here when the step's first cuBLAS call would be
     * captured (the native lstm's cublasSgemm after eager cuDNN-only steps, a first step
     * captured without an eager one); so is the kernels' mapped error record (cudaHostAlloc) */
    if (!pl_cu_blas_handle(device) || !pl_cu_fault_record()) return pl_error_status();
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
        pl_cu_fuse_begin();
    }
    pthread_mutex_unlock(&g_copy_mu);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return pl_error_set(PL_ERR_DEVICE, "cuda: cudaStreamBeginCapture on cuda:%d failed: %s",
                            device, cudaGetErrorString(e));
    }
    return PL_OK;
}

bool pl_cu_capturing(void) { return tl_cap_dev >= 0; }

/* capture_end; with facts (capture_end_step), the fusion pass edits the
 * graph before it is instantiated (cuda_fuse.cu). */
static pl_status capture_end(pl_step_facts *facts, void **graph) {
    *graph = NULL;
    if (tl_cap_dev < 0) return pl_error_set(PL_ERR_INVALID, "cuda: capture_end without capture_begin");
    int dev = tl_cap_dev;
    if (pl_cu_fuse_flush() && !tl_cap_err) { /* a held-back call that failed to launch */
        tl_cap_err = pl_error_status();
        snprintf(tl_cap_msg, sizeof tl_cap_msg, "%s", pl_error_message());
    }
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
    pl_status fs = pl_cu_fuse_end(g, facts);
    if (fs) {
        cudaGraphDestroy(g);
        return fs;
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

pl_status cu_capture_end(int device, void **graph) {
    (void)device;
    return capture_end(NULL, graph);
}

pl_status cu_capture_end_step(int device, pl_step_facts *facts, void **graph) {
    (void)device;
    return capture_end(facts, graph);
}

pl_status cu_graph_replay(void *graph) {
    cu_graph *cg = (cu_graph *)graph;
    if (!cg) return pl_error_set(PL_ERR_INVALID, "cuda: replay of no graph");
    if (tl_cap_dev >= 0) return capture_violation("a graph replay", 0);
    CUDA_TRY(cudaSetDevice(cg->dev));
    CUDA_TRY(cudaGraphLaunch(cg->ex, cudaStreamPerThread));
    return PL_OK;
}

void cu_graph_release(void *graph) {
    cu_graph *cg = (cu_graph *)graph;
    if (!cg) return;
    cudaSetDevice(cg->dev);
    cudaGraphExecDestroy(cg->ex);
    cudaGraphDestroy(cg->g);
    free(cg);
}

pl_status cu_fill_random(pl_tensor *t, int normal, double a, double b, uint64_t seed,
                         uint64_t stream) {
    if (tl_cap_dev >= 0) return capture_violation("fill_random", pl_tensor_nbytes(t));
    return pl_cu_fill_random(t, normal, a, b, seed, stream);
}
