/* cpu_isa.c - which instruction-set extensions this CPU and OS offer, read
 * at run time with cpuid (and xgetbv for the register state the OS saves),
 * and which of the runtime-dispatched CPU kernels therefore run: the bf16
 * GEMM on AVX-512 BF16 (bf16_gemm_avx512.c, compiled with its own
 * target flags), the AVX2/FMA micro-kernel of gemm_mixed.c, or the
 * portable code. A binary built for x86-64-v3 (or plain x86-64) thus uses
 * VDPBF16PS on a CPU that has it and never executes it on one that does not.
 *
 * Sources: Intel SDM vol. 2A, CPUID leaf 1 (ECX bit 12 FMA, 27 OSXSAVE, 28
 * AVX), leaf 7 subleaf 0 (EBX bit 5 AVX2, 16 AVX512F, 30 AVX512BW, 31
 * AVX512VL; EDX bit 22 AMX-BF16, 24 AMX-TILE), leaf 7 subleaf 1 (EAX bit 5
 * AVX512_BF16); vol. 1 13.3: XCR0 bits 1-2 (SSE, AVX state) and 5-7
 * (opmask, ZMM_Hi256, Hi16_ZMM) must be set by the OS before AVX / AVX-512
 * instructions may run, bits 17-18 for AMX tiles.
 *
 * PL_CPU_ISA (environment) caps the choice: "avx512bf16" (the default:
 * whatever the CPU has), "avx2" or "scalar". Read once, at the first query. */
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_internal.h"

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#include <cpuid.h>
#define PL_X86 1
#else
#define PL_X86 0
#endif

enum {
    F_AVX2 = 1u << 0, /* with FMA and the OS's YMM state */
    F_AVX512F = 1u << 1,
    F_AVX512BW = 1u << 2,
    F_AVX512VL = 1u << 3,
    F_AVX512BF16 = 1u << 4,
    F_AMX_BF16 = 1u << 5, /* AMX-BF16 + AMX-TILE, tile state enabled in XCR0 */
};

static const struct {
    unsigned bit;
    const char *name; /* /proc/cpuinfo's spelling */
} feature_names[] = {
    {F_AVX2, "avx2"},         {F_AVX512F, "avx512f"},         {F_AVX512BW, "avx512bw"},
    {F_AVX512VL, "avx512vl"}, {F_AVX512BF16, "avx512_bf16"}, {F_AMX_BF16, "amx_bf16"},
};

#if PL_X86
static uint64_t xgetbv0(void) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (uint64_t)hi << 32 | lo;
}
#endif

static unsigned detect(void) {
    unsigned f = 0;
#if PL_X86
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
    bool fma = c >> 12 & 1, osxsave = c >> 27 & 1, avx = c >> 28 & 1;
    uint64_t xcr0 = osxsave ? xgetbv0() : 0;
    bool ymm = (xcr0 & 0x6) == 0x6, zmm = (xcr0 & 0xe6) == 0xe6, tiles = (xcr0 >> 17 & 3) == 3;
    if (__get_cpuid_max(0, NULL) < 7) return 0;
    __cpuid_count(7, 0, a, b, c, d);
    unsigned subleaves = a;
    if (avx && fma && ymm && (b >> 5 & 1)) f |= F_AVX2;
    if (zmm && (b >> 16 & 1)) f |= F_AVX512F;
    if (zmm && (b >> 30 & 1)) f |= F_AVX512BW;
    if (zmm && (b >> 31 & 1)) f |= F_AVX512VL;
    if (tiles && (d >> 22 & 1) && (d >> 24 & 1)) f |= F_AMX_BF16;
    if (subleaves >= 1) {
        __cpuid_count(7, 1, a, b, c, d);
        if (zmm && (a >> 5 & 1)) f |= F_AVX512BF16;
    }
#endif
    return f;
}

static unsigned features(void) {
    static atomic_int cached = -1; /* racing first calls compute the same value */
    int v = atomic_load_explicit(&cached, memory_order_relaxed);
    if (v < 0) {
        v = (int)detect();
        atomic_store_explicit(&cached, v, memory_order_relaxed);
    }
    return (unsigned)v;
}

pl_cpu_isa pl_cpu_isa_detected(void) {
    unsigned f = features();
    const unsigned bf16 = F_AVX512F | F_AVX512BW | F_AVX512VL | F_AVX512BF16;
    if (PL_HAVE_AVX512BF16_KERNEL && (f & bf16) == bf16) return PL_ISA_AVX512BF16;
    if (PL_X86 && (f & F_AVX2)) return PL_ISA_AVX2;
    return PL_ISA_SCALAR;
}

const char *pl_cpu_isa_name(pl_cpu_isa isa) {
    switch (isa) {
    case PL_ISA_AVX512BF16:
        return "avx512bf16";
    case PL_ISA_AVX2:
        return "avx2";
    default:
        return "scalar";
    }
}

static atomic_int forced = -1; /* pl_cpu_isa_force's cap; -1: none */
static atomic_int env_cached = -2; /* PL_CPU_ISA's cap; -2: not read yet, -1: no cap */

static int env_cap(void) {
    atomic_int *cap = &env_cached;
    int v = atomic_load_explicit(cap, memory_order_relaxed);
    if (v != -2) return v;
    const char *e = getenv("PL_CPU_ISA");
    v = -1;
    if (e && e[0]) {
        for (int i = PL_ISA_SCALAR; i <= PL_ISA_AVX512BF16; i++)
            if (!strcmp(e, pl_cpu_isa_name((pl_cpu_isa)i))) v = i;
        if (v < 0)
            fprintf(stderr,
                    "pipeline: warning: PL_CPU_ISA=%s is not one of avx512bf16, avx2, scalar; "
                    "ignored (the CPU's best kernels run)\n",
                    e);
    }
    atomic_store_explicit(cap, v, memory_order_relaxed);
    return v;
}

pl_cpu_isa pl_cpu_isa_active(void) {
    int best = (int)pl_cpu_isa_detected();
    int cap = atomic_load_explicit(&forced, memory_order_relaxed);
    if (cap < 0) cap = env_cap();
    return (pl_cpu_isa)(cap >= 0 && cap < best ? cap : best);
}

void pl_cpu_isa_force(int cap) {
    atomic_store_explicit(&forced, cap < 0 ? -1 : cap, memory_order_relaxed);
    if (cap < 0) atomic_store_explicit(&env_cached, -2, memory_order_relaxed); /* re-read */
}

const char *pl_cpu_gemm_bf16(void) {
    return pl_cpu_isa_name(pl_cpu_isa_active());
}

const char *pl_cpu_features(char *buf, size_t n) {
    unsigned f = features();
    size_t used = 0;
    if (n == 0) return buf;
    buf[0] = '\0';
    for (size_t i = 0; i < sizeof feature_names / sizeof feature_names[0]; i++)
        if (f & feature_names[i].bit) {
            int w = snprintf(buf + used, n - used, "%s%s", used ? " " : "", feature_names[i].name);
            if (w < 0 || (size_t)w >= n - used) break;
            used += (size_t)w;
        }
    if (!used) snprintf(buf, n, "none");
    return buf;
}
