/* cuda_fault.cu - the deferred index checks of the CUDA kernels: a kernel that meets an
 * index out of range records it in a mapped host record (pl_cu_fault, cuda_common.cuh),
 * and the next pl_cu_fault_check reports it; pl_cu_check_indices launches the check. */
#include <pthread.h>
#include <string.h>

#include "cuda_common.cuh"

/* ---- index checking (deferred: see pl_cu_fault in cuda_common.cuh) ---------------------------- */

static pl_cu_fault *g_fault_host, *g_fault_dev;
static pthread_mutex_t g_fault_mu = PTHREAD_MUTEX_INITIALIZER;

pl_cu_fault *pl_cu_fault_record(void) {
    pthread_mutex_lock(&g_fault_mu);
    if (!g_fault_dev) {
        void *h = NULL, *d = NULL;
        cudaError_t e = cudaHostAlloc(&h, sizeof(pl_cu_fault),
                                      cudaHostAllocMapped | cudaHostAllocPortable);
        if (e == cudaSuccess) {
            memset(h, 0, sizeof(pl_cu_fault));
            e = cudaHostGetDevicePointer(&d, h, 0);
            if (e != cudaSuccess) cudaFreeHost(h);
        }
        if (e != cudaSuccess) {
            cudaGetLastError();
            pthread_mutex_unlock(&g_fault_mu);
            pl_error_set(PL_ERR_DEVICE, "cuda backend: mapped pinned memory for the kernels' "
                         "error record: %s", cudaGetErrorString(e));
            return NULL;
        }
        g_fault_host = (pl_cu_fault *)h;
        g_fault_dev = (pl_cu_fault *)d;
    }
    pl_cu_fault *d = g_fault_dev;
    pthread_mutex_unlock(&g_fault_mu);
    return d;
}

pl_status pl_cu_fault_check(void) {
    volatile pl_cu_fault *f = g_fault_host;
    if (!f || !f->set) return PL_OK;
    pthread_mutex_lock(&g_fault_mu);
    pl_cu_fault r;
    memcpy(&r, (const void *)g_fault_host, sizeof r);
    memset((void *)g_fault_host, 0, sizeof r);
    pthread_mutex_unlock(&g_fault_mu);
    if (!r.set) return PL_OK; /* another thread reported it */
    if (r.kind == PL_CU_FAULT_TARGET)
        return pl_error_set(PL_ERR_INVALID,
                            "%s: target[%lld] = %lld outside [0, %lld) and != ignore_index %lld "
                            "(found by the kernel on the GPU, reported at the next read of "
                            "device memory: values computed since then are not valid)",
                            pl_op_name((pl_op)r.op), r.pos, r.value, r.bound, r.ignore);
    return pl_error_set(PL_ERR_INVALID,
                        "%s: index %lld at position %lld is out of range [0, %lld) (found by the "
                        "kernel on the GPU, reported at the next read of device memory: values "
                        "computed since then are not valid)",
                        pl_op_name((pl_op)r.op), r.value, r.pos, r.bound);
}

__global__ void k_check_idx(const void *idx, int dt, int64_t m, int64_t n, pl_cu_fault *f,
                            int op) {
    GRID_LOOP(i, m) {
        int64_t v = pl_d_idx(idx, dt, i);
        if (v < 0 || v >= n) pl_d_fault(f, op, PL_CU_FAULT_INDEX, i, v, n, 0);
    }
}

pl_status pl_cu_check_indices(pl_op op, const pl_tensor *idx, int64_t n) {
    int64_t m = pl_tensor_numel(idx);
    if (m == 0) return PL_OK;
    pl_cu_fault *f = pl_cu_fault_record();
    if (!f) return pl_error_status();
    k_check_idx<<<pl_cu_blocks(m), PL_CUDA_THREADS>>>(pl_tensor_data(idx), idx->dtype, m, n, f,
                                                      (int)op);
    CUDA_LAUNCHED(pl_op_name(op));
    return PL_OK;
}
