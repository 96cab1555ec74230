/* cuda_stats.cu - pl_backend.device_stats of the CUDA backend, through NVML
 * (libnvidia-ml.so.1, opened at run time). */
#include <cublas_v2.h>
#include <dlfcn.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "cuda_common.cuh"

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

pl_status cu_device_stats(int device, uint64_t *cursor, pl_device_stats *out) {
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
