/* cpu_plugin.c - the CPU backend's plugin entry: cpu.so, kind backend, its
 * vtable the table of cpu_backend.c. Kept apart from the backend's sources
 * so that the tests of this folder link those without a second entry. */
#include "cpu_internal.h"

/* the kernel table is filled when the core dlopens the plugin, before the
 * registry reads the descriptor */
__attribute__((constructor)) static void cpu_plugin_init(void) {
    (void)pl_cpu_backend_table();
}

static const pl_option_spec g_cpu_opts[] = {PL_OPTIONS_END};

PL_PLUGIN_DEFINE(cpu, PL_KIND_BACKEND, "0.1.0",
                 "CPU backend: host memory and every op's kernel (OpenBLAS; bf16 GEMMs on "
                 "AVX-512 BF16 or AVX2, chosen by cpuid)",
                 g_cpu_opts, &pl_cpu_backend)
