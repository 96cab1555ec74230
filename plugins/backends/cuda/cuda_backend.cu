/* cuda_backend.cu - the CUDA backend plugin: the kernel lookup, the pl_backend table
 * exported as plugin "cuda" (kind backend) and its descriptor. The verbs of the table are
 * in cuda_memory.cu (devices, memory, transfers, graph capture; the fusion inside a
 * captured step in cuda_fuse.cu), cuda_matmul.cu (the
 * allow_tf32 option) and cuda_stats.cu (device stats); the kernels in cuda_dense.cu,
 * cuda_norm.cu, cuda_index.cu, cuda_attention.cu, cuda_copy.cu, cuda_matmul.cu,
 * cuda_nf4.cu, cuda_optim.cu, cuda_lstm.cu and cuda_lstm_native.cu (cuda_common.cuh). This file calls
 * them; they do not call it. See README.md for what is supported.
 */
#include <pthread.h>

#include "cuda_common.cuh"

/* ---- the kernel lookup, the backend table and the plugin descriptor ------------------------ */

/* Filled once, before the descriptor (and so the table) is handed out. The
 * lookup answers NULL for ids outside this build's PL_OP_COUNT: a newer core
 * asking about an op appended later gets "unsupported", not a stray read. */
static pl_kernel_table g_cuda_kernels;

/* Every kernel is called through these two: while the calling thread
 * captures a graph, through the fusion hook (cuda_fuse.cu); else directly. */
static pl_status cu_forward(const pl_kernel_args *a) {
    pl_kernel_fn f = pl_kernel_table_get(&g_cuda_kernels, a->op, false);
    return pl_cu_capturing() ? pl_cu_fuse_call(f, a, false) : f(a);
}
static pl_status cu_backward(const pl_kernel_args *a) {
    pl_kernel_fn f = pl_kernel_table_get(&g_cuda_kernels, a->op, true);
    return pl_cu_capturing() ? pl_cu_fuse_call(f, a, true) : f(a);
}

static pl_kernel_fn cu_kernel(pl_op op, bool backward) {
    if (!pl_kernel_table_get(&g_cuda_kernels, op, backward)) return NULL;
    return backward ? cu_backward : cu_forward;
}

/* pl_backend.half_native: the kernels (cuda_dense.cu, cuda_norm.cu) that load and store
 * bf16 / f16 themselves (pl_d_ldf / pl_d_stf, f32 math, one rounding): the
 * binary ops, scale / add_scalar, swiglu and rms_norm, forward and backward.
 * Every other f32-only kernel gets f32 copies from the core (half_io.c). */
static bool cu_half_native(const pl_kernel_args *a, bool backward) {
    (void)backward;
    return pl_gpu_half_native_op(a->op); /* pl_d_ldf / pl_d_stf read f64 as well */
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
    NULL, /* get_option */
    cu_capture_end_step,
};

static const pl_backend *cuda_table(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, [] {
        pl_kernel_table *t = &g_cuda_kernels;
        pl_cuda_register_copy(t);
        pl_cuda_register_matmul(t);
        pl_cuda_register_dense(t);
        pl_cuda_register_norm(t);
        pl_cuda_register_index(t);
        pl_cuda_register_attention(t);
        pl_cuda_register_nf4(t);
        pl_cuda_register_optim(t);
        pl_cuda_register_lstm(t); /* cuDNN's or the native one, cuda_lstm_native.cu */
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
